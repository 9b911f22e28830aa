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
from labkit.ladder import bench_table

FUNCTIONS = '''
import numpy as np
import labkit as lk

def put(out, value):
    if hasattr(out, "copy_to_device"):
        out.copy_to_device(value)
    else:
        out[...] = value

def on_device(compute):
    def fn(*args):
        return compute(args, [lk.gpu.as_host(a) if hasattr(a, "copy_to_host") else a for a in args])
    return fn

def through_managed(compute):
    def fn(*args):
        lk.gpu.managed_buffer("test managed page", (1,))  # as stage 03's with_managed takes its buffers
        return compute(args, list(args))
    return fn

def conv(args, h):
    put(args[3], lk.conv2d(h[0], h[1], h[2], h[4], h[5]).astype(np.float32))

def unary(f):
    return lambda args, h: put(args[1], np.ascontiguousarray(f(h[0]), np.float32))

def pool(args, h):
    put(args[1], lk.maxpool2d(h[0], h[2], h[3]).astype(np.float32))

def fc(args, h):
    put(args[3], lk.fc(h[0], h[1], h[2]).astype(np.float32))

COMPUTE = {"conv": conv, "relu": unary(lk.relu), "pool": pool, "fc": fc, "softmax": unary(lk.softmax)}
IMPLS = {kind: on_device(f) for kind, f in COMPUTE.items()}
MANAGED = {kind: through_managed(f) for kind, f in COMPUTE.items()}
'''

KERNELS = FUNCTIONS + '''
from pipelines import forgets_to_synchronize as no_sync, pipeline  # tests/pipelines.py

VARIANTS = {
    "plain": lk.Variant(IMPLS, arrays="device", nets=("cifar10",)),
    "graphed": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), graph=True, pipeline=pipeline),
    "unsynced": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), pipeline=no_sync),
}
'''

#: every row slow (a budget of 0 s): the plain variant's whole call is warmed by its per-layer passes alone, the
#: graph and the managed variant's get an untimed call of their own all the same
SLOW_KERNELS = FUNCTIONS + '''
VARIANTS = {
    "plain": lk.Variant(IMPLS, arrays="device", nets=("cifar10",)),
    "graphed": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), graph=True),
    "managed": lk.Variant(MANAGED, arrays="host", nets=("cifar10",)),
}
'''


def _notebook(folder, source):
    folder.mkdir()
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["kernel"]
    nbformat.write(new_notebook(cells=[cell]), folder / "09_per_layer_tuning.ipynb")
    return folder


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    if not device.info().simulated:
        pytest.skip("the simulator's bench (on a GPU the rows take the real sizes)")
    root = tmp_path_factory.mktemp("bench_whole")
    books = _notebook(root / "notebooks", KERNELS)
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
    text = bench_table.table(rows)
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


def _variants(source):
    namespace: dict = {}
    exec(source, namespace)  # the notebook's kernel cell, as lk.stages.load_variants runs it
    return namespace["VARIANTS"]


@pytest.fixture
def counted(monkeypatch):
    """engine.forward wrapped: how many forward calls (the graph's captured function included) were made."""
    from labkit import engine

    calls = []
    forward = engine.forward

    def counting(*args, **kw):
        calls.append(kw.get("tag", "engine"))
        return forward(*args, **kw)

    monkeypatch.setattr(engine, "forward", counting)
    return calls


@pytest.mark.parametrize("pass_s, budget_s, untimed", [(None, 1.0, 1), (0.5, 1.0, 1), (2.0, None, 1),
                                                         (1.0, 1.0, 0), (2.0, 1.0, 0)])
def test_a_slow_rows_whole_call_is_warmed_by_its_per_layer_passes_alone(counted, pass_s, budget_s, untimed):
    """One untimed call before the timed ones, but where the per-layer run just before had a pass of the row's
    whole budget or more: then none, and the row's label says why."""
    from labkit.workloads import workload

    if not device.info().simulated:
        pytest.skip("the simulator's layer functions")
    plain = _variants(SLOW_KERNELS)["plain"]
    wl = workload("cifar10", 2, target="gpu", quiet=True)
    got = bench_whole.whole_call(wl, plain, 1, budget_s, per_layer_pass_s=pass_s)
    assert got["whole_call_runs"] == 1 and len(counted) == untimed + 1
    assert got["whole_call_how"] == (bench_whole.WHOLE_CALL_ENGINE if untimed else bench_whole.WHOLE_CALL_WARMED)


@pytest.mark.parametrize("name", ["graphed", "managed"])
def test_graph_and_managed_rows_keep_their_untimed_call_when_slow(counted, name):
    """A graph's capture and first replay, and a first touch of managed pages, are the whole call's own: a slow
    row makes exactly the calls a fast one makes, labelled as a fast one's."""
    from labkit.workloads import workload

    if not device.info().simulated:
        pytest.skip("the simulator's layer functions")
    variant = _variants(SLOW_KERNELS)[name]
    wl = workload("cifar10", 2, target="gpu", quiet=True)
    managed = name == "managed"
    fast = bench_whole.whole_call(wl, variant, 1, 1.0, per_layer_pass_s=0.1, managed=managed)
    fast_calls = len(counted)
    slow = bench_whole.whole_call(wl, variant, 1, 1.0, per_layer_pass_s=5.0, managed=managed)
    assert len(counted) - fast_calls == fast_calls == (3 if variant.graph else 2)  # (capture,) untimed, timed
    assert slow["whole_call_how"] == fast["whole_call_how"] != bench_whole.WHOLE_CALL_WARMED


def test_the_bench_passes_its_per_layer_pass_and_managed_memory_to_the_whole_call(tmp_path):
    """With a budget of 0 s every row is slow: the plain variant's whole call makes no untimed call of its own;
    the graph variant and the one whose functions take lk.gpu.managed_buffer (found by the bench, not declared)
    keep theirs."""
    if not device.info().simulated:
        pytest.skip("the simulator's bench")
    books = _notebook(tmp_path / "notebooks", SLOW_KERNELS)
    rows = bench.bench(None, ["cifar10"], (2,), books, tmp_path / "out", repeat=2, limits=bench.Limits(budget_s=0.0),
                       baselines=False, command="pytest slow rows", progress=False)
    how = {r["variant"]: r.get("whole_call_how", r.get("error")) for r in rows}
    assert how["plain"] == bench_whole.WHOLE_CALL_WARMED
    assert how["managed"] == bench_whole.WHOLE_CALL_ENGINE
    assert how["graphed"].startswith("simulator: no CUDA graph") and "warmed by" not in how["graphed"]
    assert all(r["runs"] == 1 and r["whole_call_runs"] == 1 for r in rows)  # the budget stops after one of each
