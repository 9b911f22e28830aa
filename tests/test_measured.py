"""labkit.measured: the committed GPU results, and the README block that takes each stage from the newest folder
that holds it."""

import json

import pytest

from labkit import measured
from labkit.ledger import Ledger
from labkit.nets import CIFAR10
from labkit.report import RunReport


def _folder(root, name, date, runs):
    folder = root / name
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"device": "Test GPU", "date": date}))
    ledger = Ledger(folder / "ledger.jsonl")
    for stage, seconds in runs:
        layers = {ly.name: seconds / len(CIFAR10.layers) for ly in CIFAR10.layers}
        ledger.record(RunReport("cifar10", CIFAR10.default_images, layers, accuracy=0.5, device="Test GPU",
                                simulated=False, stage=stage, method="cuda-events"))


def test_each_stage_comes_from_the_newest_folder_that_holds_it(tmp_path):
    _folder(tmp_path, "old", "2026-01-01", [("01 serial", 10.0), ("04 batched", 1.0), ("05 tiled", 0.9),
                                            ("numpy reference (CPU)", 2.0)])
    _folder(tmp_path, "new", "2026-02-01", [("05 tiled", 0.5), ("05 tiled_16", 0.4), ("numpy reference", 1.5)])
    block = measured.readme_block(tmp_path)
    assert block.startswith(measured.README_BEGIN) and block.endswith(measured.README_END)
    assert "`old/` (stages 01, 04)" in block and "`new/` (stages 05, baselines)" in block
    rows = {line.split()[0] + " " + line.split()[1]: line for line in block.splitlines()
            if line[:2].isdigit() or line.startswith("numpy")}
    assert set(rows) == {"01 serial", "04 batched", "05 tiled_16", "numpy reference"}  # the fastest run of 05
    assert "0.400000" in rows["05 tiled_16"]  # from the newer folder, never the older 05
    assert "numpy reference (CPU)" not in block  # baselines from one folder: the newest


def test_no_results_says_how_to_make_them(tmp_path):
    assert "No GPU results are committed yet" in measured.readme_block(tmp_path)


def test_two_folders_of_one_day_are_ordered_by_their_time(tmp_path):
    # "b" sorts after "a" by name, but its runs are the earlier ones: the later time wins, not the name
    _folder(tmp_path, "day-a", "2026-03-01T22:00:00+00:00", [("05 tiled", 0.5)])
    _folder(tmp_path, "day-b", "2026-03-01T09:00:00+00:00", [("05 tiled", 0.9)])
    assert [r.where for r in measured.all_results(tmp_path)] == ["day-a", "day-b"]
    assert "`day-a/` (stages 05)" in measured.readme_block(tmp_path)


def test_show_prints_the_whole_call_beside_the_runs_that_have_one(tmp_path, capsys):
    """A folder's bench.json whole-call column is shown under its workload's table, only for the runs it has, with
    how each was timed; a run without one gets no line."""
    _folder(tmp_path, "run", "2026-04-01", [("10 whole", 0.002), ("10 plain", 0.003), ("numpy reference", 1.0)])
    rows = [{"stage": "10 whole", "net": "cifar10", "images": CIFAR10.default_images, "whole_call_s": 0.00123,
             "whole_call_how": "CUDA graph replay + output download"},
            {"stage": "10 whole", "net": "cifar10", "images": 50000, "whole_call_s": 0.5}]  # another workload
    (tmp_path / "run" / "bench.json").write_text(json.dumps({"rows": rows}))
    measured.show("10", root=tmp_path)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  10 ")]
    assert len(lines) == 1 and "1.230 ms" in lines[0] and "(CUDA graph replay + output download)" in lines[0]
    assert "10 plain" not in "".join(lines) and "500.000 ms" not in out
    assert "whole call (CUDA events around the whole forward call" in out


def test_a_bench_that_did_not_finish_is_left_out_and_named(tmp_path, capsys):
    """A subfolder holding UNFINISHED (a bench cut off: labkit.unfinished) is not read, its bench.json neither, and
    the README block and show name it; the same subfolder without the marker is read; a folder marked at its top
    is left out whole."""
    from labkit import unfinished

    _folder(tmp_path, "day", "2026-05-01", [("05 tiled", 0.5), ("numpy reference", 1.0)])
    _folder(tmp_path / "day", "cut_off", "2026-05-01", [("01 serial", 9.0), ("05 tiled", 0.1)])
    (tmp_path / "day" / "cut_off" / "bench.json").write_text(json.dumps({"rows": [
        {"stage": "05 tiled", "net": "cifar10", "images": CIFAR10.default_images, "whole_call_s": 0.2}]}))
    _folder(tmp_path, "gone", "2026-06-01", [("05 tiled", 0.05)])
    unfinished.mark(tmp_path / "day" / "cut_off", "labkit bench --out cut_off")
    unfinished.mark(tmp_path / "gone", "labkit bench --out gone")

    assert [r.where for r in measured.all_results(tmp_path)] == ["day"]
    day = measured.load(tmp_path / "day")
    assert {r.stage: r.total for r in day.runs()} == pytest.approx({"05 tiled": 0.5, "numpy reference": 1.0})
    assert day.left_out == [tmp_path / "day" / "cut_off"]
    assert measured.whole_calls(day, "cifar10", CIFAR10.default_images) == {}
    block = measured.readme_block(tmp_path)
    assert "Left out, as benches that did not finish (an `UNFINISHED` file says so): `cut_off/`, `gone/`." in block
    assert "01 serial" not in block and "0.100000" not in block and "0.050000" not in block
    measured.show("05", root=tmp_path)
    assert "(left out: cut_off/, a bench that did not finish: its UNFINISHED file says why)" in capsys.readouterr().out

    (tmp_path / "day" / "cut_off" / unfinished.MARKER).unlink()  # finished after all: read like any other
    day = measured.load(tmp_path / "day")
    assert "01 serial" in {r.stage for r in day.runs()} and day.left_out == []
    assert "Left out" in measured.readme_block(tmp_path) and "`cut_off/`" not in measured.readme_block(tmp_path)
