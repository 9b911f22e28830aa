"""A bench that is cut off leaves its folder marked UNFINISHED (labkit.unfinished): the bench writes the marker at
its start and removes it only once bench.json is written, --force clears it, and the page of benchmarks refuses a
marked folder (labkit.measured's side: tests/test_measured.py). On the simulator, with host-arithmetic CPU
variants: a run takes well under a second."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from labkit import bench, benchdoc, unfinished
from labkit.ladder import bench_files

KERNELS = '''
import labkit as lk

def conv(x, w, b, out, *rest):
    out[...] = lk.conv2d(x, w, b, *rest)

def relu(x, out):
    out[...] = lk.relu(x)

def pool(x, out, *rest):
    out[...] = lk.maxpool2d(x, *rest)

def fc(x, w, b, out):
    out[...] = lk.fc(x, w, b)

def softmax(x, out):
    out[...] = lk.softmax(x)

IMPLS = {"conv": conv, "relu": relu, "pool": pool, "fc": fc, "softmax": softmax}
VARIANTS = {"first": lk.Variant(IMPLS, target="cpu", nets=("cifar10",)),
            "second": lk.Variant(IMPLS, target="cpu", nets=("cifar10",))}
'''


@pytest.fixture
def books(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    cell = new_code_cell(KERNELS)
    cell.metadata["tags"] = ["kernel"]
    nbformat.write(new_notebook(cells=[cell]), folder / "09_per_layer_tuning.ipynb")
    return folder


def _bench(books, out):
    return bench.bench(None, ["cifar10"], (2,), books, out, repeat=1, baselines=False, command="pytest cut off",
                       progress=False)


def test_the_marker_is_there_while_the_bench_runs_and_gone_once_bench_json_is_written(books, tmp_path, monkeypatch):
    out = tmp_path / "out"
    seen = []
    write = bench_files.write

    def watched(folder, *args, **kw):
        seen.append((folder / unfinished.MARKER).read_text())
        return write(folder, *args, **kw)

    monkeypatch.setattr(bench_files, "write", watched)
    rows = _bench(books, out)
    assert [r["variant"] for r in rows] == ["first", "second"] and all("total_s" in r for r in rows)
    assert len(seen) == 1 and seen[0].startswith("`pytest cut off`, started ") and unfinished.WHY in seen[0]
    assert seen[0].count("\n") == 1  # one line
    assert (out / "bench.json").is_file() and not (out / unfinished.MARKER).exists()
    benchdoc.load(out)  # a finished folder: the page takes it


def test_a_bench_cut_off_midway_leaves_its_marker_beside_the_rows_it_measured(books, tmp_path, monkeypatch):
    out = tmp_path / "out"
    run = bench.run

    def interrupted(wl, variant=None, **kw):
        if kw.get("label") == "09 second":
            raise KeyboardInterrupt  # a step limit, Ctrl-C: nothing after this line of the bench runs
        return run(wl, variant, **kw)

    monkeypatch.setattr(bench, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _bench(books, out)
    stages = {json.loads(line)["stage"] for line in (out / "ledger.jsonl").read_text().splitlines()}
    assert stages == {"09 first"}  # the row measured before it stopped
    assert not (out / "bench.json").exists()
    assert unfinished.WHY in (out / unfinished.MARKER).read_text()
    assert unfinished.under(tmp_path) == [out] and unfinished.marked(out / "plots", tmp_path) == out / "UNFINISHED"


def test_the_page_refuses_a_marked_folder_and_force_clears_the_marker(books, tmp_path):
    out = tmp_path / "out"
    _bench(books, out)
    unfinished.mark(out, "labkit bench --append")  # an appended run cut off: bench.json is the earlier run's
    with pytest.raises(benchdoc.BenchDocError, match="UNFINISHED: `labkit bench --append`, started .* did not finish"):
        benchdoc.load(out)
    bench.prepare_out(out, force=True)
    assert not (out / unfinished.MARKER).exists() and not (out / "ledger.jsonl").exists()


def test_a_bench_cut_off_while_plotting_is_finished_and_its_plots_can_be_redrawn(books, tmp_path, monkeypatch):
    out = tmp_path / "out"
    drawn = []
    plots = bench_files._plots

    def cut(*a, **kw):
        raise KeyboardInterrupt  # the step limit, while the plots are drawn: every row is in bench.json already

    monkeypatch.setattr(bench_files, "_plots", cut)
    with pytest.raises(KeyboardInterrupt):
        _bench(books, out)
    assert (out / "bench.json").is_file() and not (out / unfinished.MARKER).exists()
    assert [r["variant"] for r in json.loads((out / "bench.json").read_text())["rows"]] == ["first", "second"]
    monkeypatch.setattr(bench_files, "_plots", lambda *a: (drawn.append(a), plots(*a)))
    bench_files.refresh_plots(out)
    assert len(drawn) == 1 and drawn[0][0] == out
