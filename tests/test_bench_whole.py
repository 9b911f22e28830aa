"""The bench's whole-job columns (labkit.bench_whole): a whole-call time on every GPU row (a graph replay for a
graph variant), the fraction of the fp32 floor only on a GPU, and end-to-end rows for a variant with a pipeline,
classes compared with the numpy reference's on every image. On the simulator, with layer functions that do their
arithmetic on the host (a simulated kernel costs seconds)."""

import json

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from labkit import bench, bench_whole, benchdoc, device, gpu, weights_io

KERNELS = '''
import numpy as np
import labkit as lk

def on_device(compute):
    def fn(*args):
        return compute(args, [lk.gpu.as_host(a) if hasattr(a, "copy_to_host") else a for a in args])
    return fn

def conv(args, h):
    args[3].copy_to_device(lk.conv2d(h[0], h[1], h[2], h[4], h[5]).astype(np.float32))

def unary(f):
    return lambda args, h: args[1].copy_to_device(np.ascontiguousarray(f(h[0]), np.float32))

def pool(args, h):
    args[1].copy_to_device(lk.maxpool2d(h[0], h[2], h[3]).astype(np.float32))

def fc(args, h):
    args[3].copy_to_device(lk.fc(h[0], h[1], h[2]).astype(np.float32))

IMPLS = {"conv": on_device(conv), "relu": on_device(unary(lk.relu)), "pool": on_device(pool),
         "fc": on_device(fc), "softmax": on_device(unary(lk.softmax))}

from pipelines import forgets_to_synchronize as no_sync, pipeline  # tests/pipelines.py

VARIANTS = {
    "plain": lk.Variant(IMPLS, arrays="device", nets=("cifar10",)),
    "graphed": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), graph=True, pipeline=pipeline),
    "unsynced": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), pipeline=no_sync),
}
'''


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    if not device.info().simulated:
        pytest.skip("the simulator's bench (on a GPU the rows take the real sizes)")
    root = tmp_path_factory.mktemp("bench_whole")
    books = root / "notebooks"
    books.mkdir()
    cell = new_code_cell(KERNELS)
    cell.metadata["tags"] = ["kernel"]
    nbformat.write(new_notebook(cells=[cell]), books / "09_per_layer_tuning.ipynb")
    out = root / "out"
    rows = bench.bench(None, ["cifar10"], (2,), books, out, repeat=2, command="pytest bench whole", progress=False)
    return rows, out


def _rows(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def test_every_gpu_row_has_a_whole_call_and_no_floor_on_the_simulator(benched):
    rows, _ = benched
    ladder = [r for r in rows if r.get("kind") != "end_to_end"]
    gpu_rows = [r for r in ladder if r.get("target") == "gpu"]
    assert {r["variant"] for r in gpu_rows} == {"plain", "graphed", "unsynced"}
    for r in gpu_rows:
        assert "total_s" in r, r.get("error")
        assert r["whole_call_s"] >= 0 and r["whole_call_runs"] == 2
        lo, hi = r["whole_call_range"]
        assert lo <= r["whole_call_s"] <= hi
        assert "floor_fraction" not in r and "floor_s" not in r  # no fp32 peak to speak of on the simulator
    (plain,) = _rows(gpu_rows, variant="plain")
    (graphed,) = _rows(gpu_rows, variant="graphed")
    assert plain["whole_call_how"] == bench_whole.WHOLE_CALL_ENGINE
    assert graphed["whole_call_how"].startswith("simulator: no CUDA graph, replay calls the function")
    (ref,) = _rows(ladder, variant="reference")
    assert "whole_call_s" not in ref and "floor_fraction" not in ref  # a CPU row


def test_end_to_end_rows_for_a_pipeline_compare_every_image(benched):
    rows, _ = benched
    e2e = _rows(rows, kind="end_to_end")
    assert {r["variant"] for r in e2e} == {"graphed", "unsynced"}  # the variants with a pipeline only
    graphed = _rows(e2e, variant="graphed")
    assert [r["stage"] for r in graphed] == ["09 graphed: Job.serial (one stream, pageable)",
                                             "09 graphed: pipeline, chunks of 2 over 2 streams (pinned)"]
    for r in graphed:
        assert r["images"] == bench_whole.E2E_IMAGES_SIMULATOR and r["net"] == "cifar10"
        assert r["e2e_s"] >= 0 and r["e2e_runs"] == 2 and r["classes_equal"] is True
        assert r["classes_differing"] == 0
    unsynced = _rows(e2e, variant="unsynced", streams=2)[0]
    assert unsynced["classes_equal"] is False and unsynced["classes_differing"] == 3  # read before synchronize


def test_floor_is_the_nets_flops_at_the_fp32_peak(monkeypatch):
    from labkit import ceilings
    from labkit.nets import get_net, net_cost

    net = get_net("cifar10")
    if device.info().kind != "gpu":
        assert bench_whole.floor(net, 1200, 0.01) == {}
    monkeypatch.setattr(bench_whole.device, "info", lambda: type("I", (), {"kind": "gpu"})())
    monkeypatch.setattr(bench_whole.device, "label", lambda: "X")
    monkeypatch.setattr(ceilings, "for_device", lambda name: ceilings.Ceilings(name, 50e12, 1e12, "datasheet"))
    got = bench_whole.floor(net, 1200, 0.01)
    flops = sum(c.flops for c in net_cost(net, 1200).values())
    assert got["floor_s"] == pytest.approx(flops / 50e12)
    assert got["floor_fraction"] == pytest.approx(flops / 50e12 / 0.01)
    assert bench_whole.floor(net, 1200, None) == {}


def test_table_summary_and_page_show_the_new_columns(benched, tmp_path):
    rows, out = benched
    text = bench.table(rows)
    header = text.splitlines()[0].split()
    assert header[:9] == ["stage", "net", "images", "check", "total", "s", "whole", "s", "conv"]
    assert "end to end: uint8 images on the host to classes on the host" in text
    line = next(x for x in text.splitlines() if x.startswith("09 unsynced: pipeline"))
    assert line.split()[-1] == "(3)" and "NO" in line
    saved = json.loads((out / "bench.json").read_text())["rows"]
    assert len(_rows(saved, kind="end_to_end")) == 4
    assert "end to end" in (out / "summary.md").read_text()
    page = benchdoc.render([out], tmp_path / "docs" / "B.md", tmp_path / "docs" / "img")
    assert "| whole call s | % of floor |" in page
    table = page.split("### cifar10, 2 images")[1]
    line = next(x for x in table.splitlines() if x.startswith("| 09 plain |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    (plain,) = _rows(rows, variant="plain", target="gpu")
    assert cells[11].startswith(benchdoc._f(plain["whole_call_s"])) and cells[12] == "-"
    assert "End to end, " in page and "| 09 graphed: pipeline, chunks of 2 over 2 streams (pinned) | 2 | 2 |" in page
    assert "Not timed" not in table.split("### Where")[0]  # end-to-end rows are timed rows of their own table


def test_a_whole_call_that_fails_keeps_the_per_layer_row(monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("capture failed: a launch on the legacy default stream\nmore")

    monkeypatch.setattr(bench_whole, "whole_call", broken)
    got = bench._whole_call(None, None, 1, None)
    assert got == {"whole_call_error": "RuntimeError: capture failed: a launch on the legacy default stream"}
    gpu.synchronize()


def test_a_net_without_weights_is_refused_unless_random_weights_stand_in(monkeypatch):
    """ece408's weights are not shipped: without them the bench refuses in one line naming --random-weights; with
    the flag the net gets seeded random weights of its shapes, and a shipped net keeps its own."""
    monkeypatch.setattr(bench, "course_weights", lambda net: None)
    with pytest.raises(bench.BenchError, match="--random-weights"):
        bench.validate(None, ["ece408"], None, bench.stages.solutions_folder())
    assert bench.validate(None, ["ece408"], None, bench.stages.solutions_folder(), random_weights=True) is None
    stand_in = bench.stand_in_weights("ece408")
    assert stand_in and all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in stand_in.values())
    assert {k: v.shape for k, v in stand_in.items()} == {k: v.shape for k, v in
                                                         weights_io.random_weights("ece408", seed=1).items()}
    assert bench.stand_in_weights("cifar10") is None
