"""The speed ladder: checks before timing, limits, one broken notebook or variant never stops the rest."""

import csv
import json
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from labkit import bench
from labkit import check as check_module
from labkit.ladder import bench_baselines, bench_files, bench_table
from labkit.ledger import Ledger

REPO = Path(__file__).resolve().parent.parent

KERNELS = '''
import numpy as np
import labkit as lk

def relu_ok(x, out):
    out[...] = np.maximum(x, 0)

def relu_wrong(x, out):
    out[...] = x  # forgets the max: the check must fail and the variant must not be timed

def relu_breaks_on_real_data(x, out):
    if x.shape[0] in (5, 9):  # passes the check's batches (1 3 8 17), then fails on the timed workloads
        raise RuntimeError("boom at batch " + str(x.shape[0]))
    out[...] = np.maximum(x, 0)

VARIANTS = {
    "ok": lk.Variant({"relu": relu_ok}, target="cpu", nets=("cifar10",)),
    "wrong": lk.Variant({"relu": relu_wrong}, target="cpu", nets=("cifar10",)),
    "crashes": lk.Variant({"relu": relu_breaks_on_real_data}, target="cpu", nets=("cifar10",)),
    "per_image": lk.Variant({"relu": relu_ok}, target="cpu", per_image=True, nets=("cifar10",)),
    "left_out": lk.Variant({"relu": relu_wrong}, target="cpu", nets=("cifar10",)),
}
'''


def _notebook(path, source):
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["kernel"]
    nbformat.write(new_notebook(cells=[new_markdown_cell("# x"), cell]), path)


layer_checks: list[tuple[str, str]] = []  # (function, layer) of every layer check the bench below made


@pytest.fixture(scope="module")
def benched(tmp_path_factory, cifar_data):
    root = tmp_path_factory.mktemp("bench")
    books = root / "notebooks"
    books.mkdir()
    _notebook(books / "05_shared_memory.ipynb", KERNELS)
    _notebook(books / "06_constant_memory.ipynb", "raise ValueError('a broken kernel cell')")
    _notebook(books / "07_unroll_matmul.ipynb", "x = 1  # no VARIANTS: not a timed stage")
    out = root / "out"
    layer_checks.clear()
    with pytest.MonkeyPatch.context() as mp:  # a device with no known ceilings (the simulator; on a GPU, made so)
        mp.setattr(bench_files.ceilings, "for_device", lambda name: None)
        real = check_module.check_layer

        def spy(fn, net, layer, **kw):
            layer_checks.append((fn.__name__, layer))
            return real(fn, net, layer, **kw)

        mp.setattr(check_module, "check_layer", spy)
        rows = bench.bench(None, None, (5, 9), books, out, repeat=2, limits=bench.Limits(per_image=5, cpu=100),
                           command="pytest bench", progress=False, skip=["05 left_*"])
    return rows, out


def _row(rows, stage, images):
    (row,) = [r for r in rows if r["stage"] == stage and r["images"] == images]
    return row


def test_good_variant_is_timed_and_agrees_with_the_reference(benched):
    rows, _ = benched
    for n in (5, 9):
        row = _row(rows, "05 ok", n)
        assert row["checks"] == "PASS" and row["predictions_equal"] is True
        assert row["accuracy"] == row["reference_accuracy"]
        assert row["total_s"] > 0 and set(row["layer_seconds"]) >= {"conv1", "relu1", "fc"}


def test_failed_check_skips_timing_and_says_why(benched):
    row = _row(benched[0], "05 wrong", 5)
    assert row["checks"] == "FAIL" and row["skipped"] == "checks failed" and "total_s" not in row
    assert any("relu1: FAIL" in line for line in row["check_failures"])


def test_a_variant_raising_at_run_time_is_recorded_and_the_rest_go_on(benched):
    row = _row(benched[0], "05 crashes", 5)
    assert "RuntimeError: boom at batch 5" in row["error"] and "total_s" not in row
    assert "total_s" in _row(benched[0], "05 ok", 9)


def test_a_function_several_variants_share_is_checked_once(benched):
    # "ok" and "per_image" both run relu_ok: its layer check ran once; each variant's chain is still checked
    assert layer_checks.count(("relu_ok", "relu1")) == 1
    assert len(layer_checks) == len(set(layer_checks))
    assert _row(benched[0], "05 per_image", 5)["checks"] == "PASS"


def test_skip_patterns_leave_a_variant_out_unchecked(benched):
    row = _row(benched[0], "05 left_out", 5)
    assert row["skipped"] == "left out by --skip" and row["checks"] == "-" and "total_s" not in row


def test_limits_skip_large_per_image_runs(benched):
    assert "total_s" in _row(benched[0], "05 per_image", 5)
    assert "per-image variants run up to 5 images" in _row(benched[0], "05 per_image", 9)["skipped"]


def test_a_stage_of_capped_variants_only_still_gets_its_smallest_size(tmp_path):
    """Stage 01 has only per-image code: capped below a net's smallest size, a stage keeps one row there (its first
    variant left in); a stage with a row at that size gets none more."""
    books = tmp_path / "notebooks"
    books.mkdir()
    _notebook(books / "05_shared_memory.ipynb", KERNELS)
    leave = ["05 left_*", "05 wrong", "05 crashes"]
    rows = bench.bench(None, ["cifar10"], (5, 9), books, tmp_path / "out", repeat=1, baselines=False,
                       limits=bench.Limits(per_image=2, cpu=2), progress=False, skip=leave)
    assert "total_s" in _row(rows, "05 ok", 5) and _row(rows, "05 ok", 5)["predictions_equal"]
    assert _row(rows, "05 per_image", 5)["skipped"] == "per-image variants run up to 2 images"
    assert _row(rows, "05 ok", 9)["skipped"] == "CPU variants run up to 2 images"
    rows = bench.bench(None, ["cifar10"], (5, 9), books, tmp_path / "out2", repeat=1, baselines=False,
                       limits=bench.Limits(per_image=2, cpu=5), progress=False, skip=leave + ["05 ok"])
    assert "total_s" in _row(rows, "05 per_image", 5)
    rows = bench.bench(None, ["cifar10"], (5, 9), books, tmp_path / "out3", repeat=1, baselines=False,
                       limits=bench.Limits(per_image=2, cpu=5), progress=False, skip=leave)
    assert "total_s" in _row(rows, "05 ok", 5) and "skipped" in _row(rows, "05 per_image", 5)


def test_slow_variants_stop_at_a_work_limit_and_say_it(tmp_path, cifar_data):
    books = tmp_path / "notebooks"
    books.mkdir()
    _notebook(books / "05_shared_memory.ipynb", KERNELS)
    between = (bench._gflop("cifar10", 5) + bench._gflop("cifar10", 9)) / 2
    rows = bench.bench(None, ["cifar10"], (5, 9), books, tmp_path / "out", repeat=1, baselines=False,
                       limits=bench.Limits(per_image=100, cpu=100, slow_gflop=between), progress=False,
                       skip=["05 left_*", "05 wrong", "05 crashes"])
    assert "total_s" in _row(rows, "05 ok", 5) and "total_s" in _row(rows, "05 per_image", 5)
    for stage, kind in (("05 ok", "CPU"), ("05 per_image", "per-image")):
        assert _row(rows, stage, 9)["skipped"] == (f"{kind} variants run on workloads up to {between:g} GFLOP "
                                                   f"(this one: {bench._gflop('cifar10', 9):.1f})")
    assert bench._gflop("cifar10", 1200) < 10 < bench._gflop("fashion", 1000)  # the default keeps CIFAR's 1200


def test_baseline_rows_and_files(benched):
    rows, out = benched
    ref = _row(rows, bench_baselines.REFERENCE_STAGE, 9)
    assert ref["predictions_equal"] is True and 0 <= ref["accuracy"] <= 1
    ledger = Ledger(out / "ledger.jsonl")
    stages = {r.stage for r in ledger.reports()}
    cudnn = {r["stage"] for r in rows if r["variant"] == "cudnn"}  # on a GPU with PyTorch: the cuDNN baseline
    assert stages == {"05 ok", "05 per_image", bench_baselines.REFERENCE_STAGE} | cudnn
    assert all(r["command"] == "pytest bench" for r in ledger.read())
    with open(out / "bench.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    meta = json.loads((out / "bench.json").read_text())["meta"]
    assert meta["command"] == "pytest bench" and "device" in meta
    assert "05 wrong" in (out / "summary.md").read_text()
    assert (out / "ladder_cifar10_9.png").read_bytes()[:4] == b"\x89PNG"


def test_table_speedups_are_over_the_first_timed_row_without_a_reference():
    rows = [{"stage": "a", "net": "cifar10", "images": 10, "checks": "PASS", "total_s": 2.0, "conv_s": 1.0,
             "accuracy": 0.5, "predictions_equal": True, "runs": 3},
            {"stage": "b", "net": "cifar10", "images": 10, "checks": "FAIL", "skipped": "checks failed"},
            {"stage": "c", "net": "cifar10", "images": 10, "checks": "PASS", "total_s": 0.5, "conv_s": 0.25,
             "accuracy": 0.5, "predictions_equal": False, "runs": 1}]
    lines = bench_table.table(rows).splitlines()
    assert lines[0].split()[-2:] == ["=ref", "runs"] and lines[1].split()[-2:] == ["yes", "3"]
    assert "1.0x" in lines[1] and "checks failed" in lines[2] and "4.0x" in lines[3]
    assert lines[3].split()[-2:] == ["NO", "1"]  # predictions differ; the median of one run
    assert np.isclose(float(lines[3].split()[4]), 0.5)


def test_cli_bench_on_a_shipped_stage(tmp_path, cifar_root):
    from click.testing import CliRunner

    from labkit.cli import main

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["bench", "--stages", "01", "--nets", "cifar10", "--images", "3", "--out",
                                       str(out), "--repeat", "1", "--no-baselines", "--skip", "nothing_matches"])
    assert result.exit_code == 0, result.output
    assert "01 serial" in result.output and "PASS" in result.output
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [(r["stage"], r["images"], r["predictions_equal"]) for r in rows] == [("01 serial", 3, True)]
    # solutions/ runs each stage from its source (01_serial_baseline.py); rows keep the notebook's name
    assert bench._stage_paths(REPO / "solutions", ["01"]) == [REPO / "solutions" / "01_serial_baseline.py"]
    assert rows[0]["notebook"] == "01_serial_baseline.ipynb"
    result = CliRunner().invoke(main, ["bench", "--images", "3,x"])
    assert result.exit_code != 0 and "whole numbers" in result.output


# ------------------------------------------------------------------ bench.json meta, per-layer plots, roofline


def test_bench_json_has_meta_versions_and_conv_rates(benched):
    from labkit.nets import get_net, layer_cost

    rows, out = benched
    bench_json = json.loads((out / "bench.json").read_text())
    meta = bench_json["meta"]
    assert {"device", "date", "command", "versions", "ceilings"} <= set(meta)
    assert {"python", "numpy", "numba", "numba-cuda"} <= set(meta["versions"])
    assert meta["ceilings"] is None  # no ceilings known for the device: no roofline, one line says so
    assert any(n.startswith("roofline skipped") and meta["device"] in n for n in meta["notes"])
    net = get_net("cifar10")
    timed = [r for r in bench_json["rows"] if "total_s" in r]
    assert len(timed) == len([r for r in rows if "total_s" in r]) >= 4
    for r in timed:
        assert isinstance(r["conv_gflops"], float) and isinstance(r["conv_gbs"], float) and r["conv_gbs"] > 0
        convs = [n for n in r["layer_seconds"] if n.startswith("conv")]
        flops = sum(layer_cost(net, n, r["images"]).flops for n in convs)
        data = sum(layer_cost(net, n, r["images"]).bytes for n in convs)
        assert r["conv_gbs"] == pytest.approx(data / r["conv_s"] / 1e9)
        assert r["conv_gflops"] / r["conv_gbs"] == pytest.approx(flops / data)
    for n in (5, 9):
        assert (out / f"layers_cifar10_{n}.png").read_bytes()[:4] == b"\x89PNG"
        assert not (out / f"roofline_cifar10_{n}.png").exists()
    assert "conv GB/s" in (out / "summary.md").read_text()


def _fake_out(tmp_path, monkeypatch, ref_scale=100.0):
    """A bench folder from made-up reports (a CPU reference, two GPU stages, cuDNN) on a device with ceilings."""
    from labkit import ceilings, device
    from labkit.nets import get_net
    from labkit.report import RunReport

    label = device.label()
    monkeypatch.setattr(ceilings, "for_device", lambda name: ceilings.Ceilings(name, 60e12, 3e12, "datasheet"))
    out = tmp_path / "fake"
    ledger = Ledger(out / "ledger.jsonl")
    layers = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3", "flatten", "fc",
              "softmax"]
    rows = []
    for stage, target, scale in [("04 a", "gpu", 1.0), ("05 b", "gpu", 0.5),
                                 (bench_baselines.REFERENCE_STAGE, "cpu", ref_scale), ("cuDNN (PyTorch x)", "gpu", 0.1)]:
        secs = {n: scale * (1e-3 if n.startswith("conv") else 1e-5) for n in layers}
        rep = RunReport("cifar10", 1200, secs, accuracy=0.5, device=label, simulated=False, stage=stage)
        ledger.record(rep, command="fake")
        rows.append({"stage": stage, "net": "cifar10", "images": 1200, "target": target, "checks": "-",
                     **bench_table.row_numbers(rep, get_net("cifar10")), "accuracy": 0.5, "predictions_equal": True})
    rows.insert(1, {"stage": "04 c", "net": "cifar10", "images": 1200, "checks": "FAIL", "skipped": "checks failed"})
    return out, rows


def test_write_draws_layers_and_a_roofline_of_the_gpu_runs_under_known_ceilings(tmp_path, monkeypatch):
    from labkit import plots

    out, rows = _fake_out(tmp_path, monkeypatch)
    drawn = {}
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.name, fig) and save(fig, path))
    bench_files.write(out, rows, "fake bench")
    meta = json.loads((out / "bench.json").read_text())["meta"]
    assert meta["ceilings"]["flops"] == 60e12 and meta["ceilings"]["source"] == "datasheet" and not meta["notes"]
    assert set(drawn) == {"ladder_cifar10_1200.png", "layers_cifar10_1200.png", "roofline_cifar10_1200.png"}
    layers = drawn["layers_cifar10_1200.png"].axes[0]
    assert [t.get_text() for t in layers.get_legend().get_texts()] == ["04 a", "05 b", bench_baselines.REFERENCE_STAGE,
                                                                      "cuDNN (PyTorch x)"]
    assert layers.get_yscale() == "log"  # the reference is 1000x cuDNN: linear bars would hide the GPU runs
    roof = drawn["roofline_cifar10_1200.png"].axes[0]
    assert [t.get_text() for t in roof.get_legend().get_texts()] == ["04 a", "05 b", "cuDNN (PyTorch x)"]
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in drawn)


def test_the_roofline_keeps_the_fastest_run_of_each_stage_and_every_baseline():
    from labkit.report import RunReport

    def rep(stage, conv_s):
        return RunReport("cifar10", 10, {"conv1": conv_s, "fc": 1e-4}, device="d", stage=stage)

    runs = [rep("05 a", 3e-3), rep("05 b", 2e-3), rep("06 c", 5e-3), rep("cuDNN (x)", 1e-3), rep("numpy reference", 1)]
    assert [r.stage for r in bench_files._fastest_per_stage(runs)] == ["05 b", "06 c", "cuDNN (x)", "numpy reference"]


def test_a_run_above_the_ceiling_is_noted_and_refreshed_ceilings_redraw_the_plots(tmp_path, monkeypatch):
    from labkit import ceilings

    out, rows = _fake_out(tmp_path, monkeypatch)
    fastest = max(r.get("conv_gflops") or 0 for r in rows)
    low = ceilings.Ceilings("x", 0.5 * fastest * 1e9, 3e12, "measured by labkit, 2026-01-01")
    monkeypatch.setattr(ceilings, "for_device", lambda name: low)
    bench_files.write(out, rows, "fake bench")
    meta = json.loads((out / "bench.json").read_text())["meta"]
    above = [n for n in meta["notes"] if "that ceiling is too low" in n]
    assert len(above) == sum(1 for r in rows if (r.get("conv_gflops") or 0) * 1e9 > low.flops) >= 1
    assert "cuDNN (PyTorch x) (cifar10, 1200 images)" in above[0]
    (out / "roofline_cifar10_1200.png").unlink()
    right = ceilings.Ceilings("x", 10 * fastest * 1e9, 3e12, "datasheet")
    monkeypatch.setattr(ceilings, "for_device", lambda name: right)
    meta = bench_files.refresh_ceilings(out)
    assert meta == json.loads((out / "bench.json").read_text())["meta"]
    assert meta["ceilings"]["flops"] == right.flops and meta["ceilings"]["source"] == "datasheet"
    assert not [n for n in meta["notes"] if "too low" in n]
    assert any(n.startswith("ceilings replaced on ") and "(measured by labkit, 2026-01-01)" in n for n in meta["notes"])
    assert (out / "roofline_cifar10_1200.png").read_bytes()[:4] == b"\x89PNG"  # drawn again
    assert bench_files.refresh_ceilings(out) == meta  # nothing more to replace


def test_a_stage_above_the_fma_ceiling_with_tensor_core_layers_is_noted_as_such(tmp_path, monkeypatch):
    """Above the FMA units' ceiling: the kit's stage whose workload has tensor-core choices is not bound by it,
    cuDNN (fp32, TF32 off) is; a refresh keeps one note each, not two."""
    from labkit import ceilings, tensor_cores

    out, rows = _fake_out(tmp_path, monkeypatch)
    low = ceilings.Ceilings("x", 1.0, 3e12, "datasheet")
    monkeypatch.setattr(ceilings, "for_device", lambda name: low)
    monkeypatch.setattr(tensor_cores, "stored", lambda net, n: {"choice": {"conv1": None, "conv2": "w8 mt2 i1 f16"}})
    bench_files.write(out, rows, "fake bench")
    notes = json.loads((out / "bench.json").read_text())["meta"]["notes"]
    mine = [n for n in notes if n.startswith("05 b ")]
    assert len(mine) == 1 and "its conv2 ran on the tensor cores" in mine[0] and "too low" not in mine[0]
    assert "that ceiling is too low" in next(n for n in notes if n.startswith("cuDNN"))
    assert bench_files.refresh_ceilings(out)["notes"] == notes


def test_write_keeps_linear_bars_when_runs_are_close_and_survives_a_failing_plot(tmp_path, monkeypatch):
    from labkit import plots

    out, rows = _fake_out(tmp_path, monkeypatch, ref_scale=2.0)
    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.setdefault(path.name, fig))
    bench_files.write(out, rows, "fake bench")
    assert drawn["layers_cifar10_1200.png"].axes[0].get_yscale() == "linear"

    def broken(*args, **kwargs):
        raise RuntimeError("no plot today")

    monkeypatch.setattr(plots, "roofline_runs", broken)
    (out / "bench.json").unlink()
    drawn.clear()
    bench_files.write(out, rows, "fake bench")
    assert json.loads((out / "bench.json").read_text())["rows"] == json.loads(json.dumps(rows, default=str))
    assert set(drawn) == {"ladder_cifar10_1200.png", "layers_cifar10_1200.png"}


# ---------------------------------------------------------------------------------- the benchmarks page


def _links(text):
    import re

    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)


def _no_outside_paths(text, *roots):
    import re

    for root in roots:
        assert str(root) not in text
    assert not re.search(r"(?<![\w.~$/-])/(tmp|home|work|root|usr|var|private|Users)/", text)
    assert all(not link.startswith("/") for link in _links(text))


def test_benchdoc_renders_the_ladder_of_a_bench_folder(benched, tmp_path):
    from labkit import benchdoc

    rows, out = benched
    doc = tmp_path / "repo" / "docs" / "BENCHMARKS.md"
    text = benchdoc.render([out], doc, doc.parent / "img" / "bench")
    assert doc.read_text() == text
    meta = json.loads((out / "bench.json").read_text())["meta"]
    assert f"## {meta['device']}: `out`" in text and f"- date: {meta['date']}" in text
    assert "- command: `pytest bench`" in text and f"numba-cuda {meta['versions']['numba-cuda']}" in text
    assert "roofline skipped" in text and "none recorded for this device" in text
    ref = {n: _row(rows, bench_baselines.REFERENCE_STAGE, n)["total_s"] for n in (5, 9)}
    for n in (5, 9):
        section = text.split(f"### cifar10, {n} images")[1].split("###")[0]
        table = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
        timed = [r for r in rows if "total_s" in r and r["images"] == n]
        assert [line.split(" | ")[0][2:] for line in table] == [r["stage"] for r in timed]
        for line, r in zip(table, timed):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert float(cells[2]) == pytest.approx(r["total_s"], rel=1e-3)
            assert float(cells[5]) == pytest.approx(r["conv_gbs"], abs=0.051)
            assert cells[7] == f"{benchdoc._ratio(ref[n] / r['total_s'])}x" and cells[10] == "yes"
        assert "`05 wrong` (checks failed)" in section and "RuntimeError: boom at batch" in section
    links = _links(text)
    assert sorted(p.rsplit("/", 1)[1] for p in links) == sorted(
        f"{k}_cifar10_{n}.png" for k in ("ladder", "layers") for n in (5, 9))
    for link in links:
        copied = doc.parent / link
        assert copied.is_file() and copied.read_bytes() == (out / copied.name).read_bytes()
    fastest = min((r for r in rows if r["images"] == 9 and r["stage"].startswith("05 ") and "total_s" in r),
                  key=lambda r: r["total_s"])
    (line,) = [x for x in text.splitlines() if x.startswith("- cifar10, 9 images, **05**")]
    top = max(fastest["layer_seconds"], key=fastest["layer_seconds"].get)
    assert f"`{fastest['stage']}`" in line and f"`{top}` takes the most time" in line
    assert "no roofline verdict" in line
    _no_outside_paths(text, out, tmp_path)
    assert benchdoc.render([out], doc, doc.parent / "img" / "bench") == text
    assert doc.read_text() == text  # idempotent: the page is made again byte for byte


def test_benchdoc_roofline_verdict_and_peak_from_recorded_ceilings(tmp_path, monkeypatch):
    from labkit import benchdoc

    out, rows = _fake_out(tmp_path, monkeypatch)
    bench_files.write(out, rows, f"labkit bench --out {out} --notebooks {bench.repo_root() / 'solutions'}")
    doc = tmp_path / "docs" / "B.md"
    text = benchdoc.render([out, out], doc, tmp_path / "docs" / "img")
    assert "60.0 TFLOP/s fp32, 3.00 TB/s, ridge at 20.0 FLOP/byte (datasheet)" in text
    assert "--notebooks solutions`" in text and "--out …/fake " in text  # paths cut to repo-relative or a name
    assert "img/fake/roofline_cifar10_1200.png" in text and "img/fake-2/roofline_cifar10_1200.png" in text
    gpu = _row(rows, "05 b", 1200)
    line = next(x for x in text.splitlines() if x.startswith("| 05 b |"))
    assert f"| {benchdoc._pct(100 * gpu['conv_gflops'] * 1e9 / 60e12)} |" in line
    intensity = gpu["conv_gflops"] / gpu["conv_gbs"]
    verdict = "compute-bound" if intensity > 20 else "memory-bound"
    line = next(x for x in text.splitlines() if x.startswith("- cifar10, 1200 images, **05**"))
    assert verdict in line and f"ridge at {20:.3g}" in line
    reference = bench_baselines.REFERENCE_STAGE
    line = next(x for x in text.splitlines() if x.startswith(f"- cifar10, 1200 images, **{reference}**"))
    assert "on the CPU" in line and "bound" not in line.split("does not")[0]
    line = next(x for x in text.splitlines() if x.startswith("| cuDNN (PyTorch x) |"))
    assert line.split(" | ")[8] == "1"  # time over cuDNN's own
    _no_outside_paths(text, tmp_path)


def test_cli_bench_doc(benched, tmp_path):
    from click.testing import CliRunner

    from labkit.cli import main

    _, out = benched
    doc = tmp_path / "docs" / "BENCHMARKS.md"
    result = CliRunner().invoke(main, ["bench-doc", str(out), "--doc", str(doc)])
    assert result.exit_code == 0, result.output
    assert doc.is_file() and (doc.parent / "img" / "bench" / "out" / "ladder_cifar10_9.png").is_file()
    bad = tmp_path / "bad"
    bad.mkdir()
    for folder, why in [(tmp_path / "missing", "no such folder"), (bad, "no bench.json")]:
        result = CliRunner().invoke(main, ["bench-doc", str(folder), "--doc", str(doc)])
        assert result.exit_code != 0 and why in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    (bad / "bench.json").write_text("[1, 2]")
    result = CliRunner().invoke(main, ["bench-doc", str(out), str(bad), "--doc", str(tmp_path / "other.md")])
    assert result.exit_code != 0 and "expected" in result.output and not (tmp_path / "other.md").exists()


def test_scrubbing_recorded_paths_is_idempotent():
    from labkit.benchdoc import _scrub

    once = _scrub("labkit bench --out /somewhere/else/bench --skip x")
    assert once == "labkit bench --out …/bench --skip x"
    assert _scrub(once) == once  # a results file already scrubbed is shown as it is


def test_cudnn_precision_is_one_of_the_three_paths_or_the_peer():
    from labkit import cudnn

    assert cudnn.PRECISIONS == ("fp32", "tf32", "fp16") and cudnn.PEER == "fp16-channels-last"
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32, fp16, fp16-channels-last, not 'bf16'"):
        cudnn.time_forward(None, precision="bf16")  # refused before PyTorch or a GPU is needed


def test_append_keeps_earlier_rows_and_a_failing_folder_loses_nothing(tmp_path, monkeypatch, capsys):
    out, rows = _fake_out(tmp_path, monkeypatch)
    monkeypatch.setattr(bench_files, "_plots", lambda *args: None)  # the tables are what is checked here
    assert bench_files.write(out, rows, "first bench") == out
    again = [dict(rows[2], total_s=rows[2]["total_s"] / 2)]  # "05 b" measured again, faster
    bench_files.write(out, again, "second bench", append=True)
    data = json.loads((out / "bench.json").read_text())
    assert [r["stage"] for r in data["rows"]] == ["04 a", "04 c", bench_baselines.REFERENCE_STAGE, "cuDNN (PyTorch x)",
                                                  "05 b"]
    assert data["rows"][-1]["total_s"] == rows[2]["total_s"] / 2
    assert data["meta"]["command"] == "second bench" and data["meta"]["earlier"][0]["command"] == "first bench"
    assert "05 b" in (out / "summary.md").read_text() and "04 a" in (out / "summary.md").read_text()

    (out / "bench.json").unlink()
    (out / "bench.json").mkdir()  # the write now fails, as on a full disk or a folder gone read-only
    where = bench_files.write(out, rows, "third bench")
    assert where != out and json.loads((where / "bench.json").read_text())["meta"]["command"] == "third bench"
    assert (where / "ledger.jsonl").read_text() == (out / "ledger.jsonl").read_text()
    assert f"wrote them to {where} instead" in capsys.readouterr().err
