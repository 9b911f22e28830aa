"""The speed ladder: checks before timing, limits, one broken notebook or variant never stops the rest."""

import csv
import json

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from labkit import bench
from labkit.ledger import Ledger

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


@pytest.fixture(scope="module")
def benched(tmp_path_factory, cifar_data):
    root = tmp_path_factory.mktemp("bench")
    books = root / "notebooks"
    books.mkdir()
    _notebook(books / "05_shared_memory.ipynb", KERNELS)
    _notebook(books / "06_constant_memory.ipynb", "raise ValueError('a broken kernel cell')")
    _notebook(books / "07_unroll_matmul.ipynb", "x = 1  # no VARIANTS: not a timed stage")
    out = root / "out"
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


def test_skip_patterns_leave_a_variant_out_unchecked(benched):
    row = _row(benched[0], "05 left_out", 5)
    assert row["skipped"] == "left out by --skip" and row["checks"] == "-" and "total_s" not in row


def test_limits_skip_large_per_image_runs(benched):
    assert "total_s" in _row(benched[0], "05 per_image", 5)
    assert "per-image variants run up to 5 images" in _row(benched[0], "05 per_image", 9)["skipped"]


def test_baseline_rows_and_files(benched):
    rows, out = benched
    ref = _row(rows, bench.REFERENCE_STAGE, 9)
    assert ref["predictions_equal"] is True and 0 <= ref["accuracy"] <= 1
    ledger = Ledger(out / "ledger.jsonl")
    stages = {r.stage for r in ledger.reports()}
    cudnn = {r["stage"] for r in rows if r["variant"] == "cudnn"}  # on a GPU with PyTorch: the cuDNN baseline
    assert stages == {"05 ok", "05 per_image", bench.REFERENCE_STAGE} | cudnn
    assert all(r["command"] == "pytest bench" for r in ledger.read())
    with open(out / "bench.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    meta = json.loads((out / "bench.json").read_text())["meta"]
    assert meta["command"] == "pytest bench" and "device" in meta
    assert "05 wrong" in (out / "summary.md").read_text()
    assert (out / "ladder_cifar10_9.png").read_bytes()[:4] == b"\x89PNG"


def test_table_speedups_are_over_the_first_timed_row_without_a_reference():
    rows = [{"stage": "a", "net": "cifar10", "images": 10, "checks": "PASS", "total_s": 2.0, "conv_s": 1.0,
             "accuracy": 0.5, "predictions_equal": True},
            {"stage": "b", "net": "cifar10", "images": 10, "checks": "FAIL", "skipped": "checks failed"},
            {"stage": "c", "net": "cifar10", "images": 10, "checks": "PASS", "total_s": 0.5, "conv_s": 0.25,
             "accuracy": 0.5, "predictions_equal": False}]
    lines = bench.table(rows).splitlines()
    assert "1.0x" in lines[1] and "checks failed" in lines[2] and "4.0x" in lines[3] and lines[3].endswith("NO")
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
    result = CliRunner().invoke(main, ["bench", "--images", "3,x"])
    assert result.exit_code != 0 and "whole numbers" in result.output
