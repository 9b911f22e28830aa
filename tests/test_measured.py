"""labkit.measured: the committed GPU results, and the README block that takes each stage from the newest folder
that holds it."""

import json

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
