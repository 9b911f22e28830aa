"""labkit.gemm, the kit's register-tiled split-K fc: x @ w.T + b on odd shapes in every store, the kit's own layer
check (poisoned output and planes, NaN margins) passes it and catches a launch one split short, and the plan for a
GPU is the probe's for fashion's fc1 and sane for every other shape."""

import math

import numpy as np
import pytest

import labkit as lk
from labkit import check, gemm, gpu, simulator

import fc_cases  # noqa: E402  (tests/ is on the path, as for buggy_kernels)

#: (images, inputs, outputs): one of each; K a multiple of nothing; outputs 10, 160, 500 and odd; images odd, one,
#: and more than one image tile
SHAPES = [(1, 1, 1), (3, 37, 10), (35, 37, 160), (19, 50, 13), (2, 33, 500), (17, 129, 7)]


_layer = fc_cases.layer


def _run(fn, x, w, b):
    out = gpu.to_device(np.full((x.shape[0], w.shape[0]), np.nan, np.float32))  # poisoned: unwritten stays NaN
    fn(gpu.to_device(x), gpu.to_device(w), gpu.to_device(b), out)
    return gpu.as_host(out)


def _close(got, want):
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} outputs unwritten"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fc_tiles_is_the_float64_product_on_odd_shapes(shape):
    x, w, b, want = _layer(*shape)
    _close(_run(gemm.fc_tiles, x, w, b), want)


#: small tiles whose loads need a second, partial pass (6 x 12 tiles of 8 threads load 4 rows a pass), tiles of one
#: thread, and a plan with more splits than the inputs have steps
PLANS = [gemm.Plan(gemm.Tiles(6, 12, 3, 3, 2), 4), gemm.Plan(gemm.Tiles(4, 4, 4, 4, 1), 3),
         gemm.Plan(gemm.Tiles(8, 10, 2, 5, 8), 40)]


@pytest.mark.parametrize("store", gemm.STORES)
@pytest.mark.parametrize("p", PLANS, ids=str)
def test_every_store_of_any_plan_gives_the_product(p, store):
    x, w, b, want = _layer(19, 50, 13, seed=1)
    plan = gemm.Plan(p.tiles, 1) if store == "bias" else p
    _close(_run(lambda *a: gemm.launch(plan, *a, store=store), x, w, b), want)


@pytest.mark.parametrize("inputs, splits, bk", [(37, 2, 8), (50, 7, 8), (17, 4, 8), (20184, 16, 16), (5, 9, 1)])
def test_splits_are_whole_steps_cover_the_inputs_and_none_is_empty(inputs, splits, bk):
    p = gemm.Plan(gemm.Tiles(16, 16, 1, 1, bk), splits)
    span, planes = p.span(inputs), p.planes(inputs)
    assert span % bk == 0 and planes <= splits
    assert span * planes >= inputs > span * (planes - 1)  # the last split holds at least one input


def test_the_kits_layer_check_passes_it_and_reaches_every_boundary(monkeypatch):
    """lk.check_layer: fresh inputs at every batch size of the simulator's (or the GPU's) cases, a NaN output and
    NaN margins around every input (engine.call_layer), the planes poisoned by the pool. On the simulator its cases
    reach every boundary: two blocks or more along the images, the outputs and the splits, a ragged last tile of
    each, and a last split shorter than the others."""
    seen = []
    real = gpu.launch_grid

    def record(kernel, grid, block, *a, **kw):
        if gpu.kernel_name(kernel) == "fc_register_tiles":
            seen.append((grid, a[0].shape, a[1].shape[0], a[4]))
        return real(kernel, grid, block, *a, **kw)

    monkeypatch.setattr(gpu, "launch_grid", record)
    for net, layer in (("fashion", "fc1"), ("cifar10", "fc")):
        r = check.check_layer(gemm.fc_tiles, net, layer, arrays="device", quiet=True)
        assert r.passed, str(r)
    if simulator.active():
        t = gemm.SIMULATOR_TILES
        assert all(max(grid[d] for grid, *_ in seen) >= 2 for d in range(3))
        assert any(N % t.bm for _, (N, _), _, _ in seen) and any(OUT % t.bn and OUT > t.bn for _, _, OUT, _ in seen)
        assert any(K % span for _, (_, K), _, span in seen)


def one_split_short(x, w, b, out):
    """The plan's launch with the grid one split short: the last plane keeps what the pool left there."""
    N, K = x.shape
    p = gemm.plan(N, K, w.shape[0])
    part = gpu.buffer("test one split short", (p.planes(K), N, w.shape[0]))
    grid = (gpu.blocks(N, p.tiles.bm), gpu.blocks(w.shape[0], p.tiles.bn), p.planes(K) - 1)
    gpu.launch_grid(gemm.kernel(p.tiles), grid, p.tiles.threads, x, w, b, part, p.span(K))
    gpu.launch(gemm.add_planes, (w.shape[0], N), part, b, out, block=gemm.ELEMENTWISE_BLOCK)


def test_the_check_catches_a_launch_one_split_short():
    r = check.check_layer(one_split_short, "fashion", "fc1", arrays="device", quiet=True)
    assert not r.passed and "not finite" in r.detail, str(r)


# ------------------------------------------------------------------------------------------------ a GPU's plan


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(simulator, "active", lambda: False)


def test_on_an_h100_fashions_fc1_gets_the_probes_fastest_plan(on_a_gpu):
    """tools/whole_job_probe.py on an H100 (132 multiprocessors): 128 x 160 tiles of 8 x 10 and 16 splits, 4.33 ms."""
    assert gemm.plan(10000, 20184, 160, sms=132) == gemm.Plan(gemm.Tiles(128, 160, 8, 10, 16), 16)


@pytest.mark.parametrize("K, OUT", [(20184, 160), (5184, 140), (320, 10), (4096, 500), (33, 3)])
def test_a_gpus_plan_fills_it_without_short_splits(on_a_gpu, K, OUT):
    images = (1, 10, 100, 1000, 10000, 50000)
    plans = [gemm.plan(n, K, OUT, sms=132) for n in images]
    for n, p in zip(images, plans):
        t = p.tiles
        assert t.threads == 256 and t.bk == 16
        blocks = math.ceil(n / t.bm) * math.ceil(OUT / t.bn)
        assert p.splits == 1 or K // p.splits >= gemm.MIN_SPAN, (n, p)
        assert p.splits & (p.splits - 1) == 0  # a power of two
        fills = blocks * p.splits >= gemm.WAVES * gemm.RESIDENT * 132
        assert fills or p.splits * 2 > K // gemm.MIN_SPAN, (n, p)  # else a split more would be shorter than the least
    splits = [p.splits for p in plans]
    assert splits == sorted(splits, reverse=True), splits  # more images never mean more splits


def test_narrow_layers_get_narrow_tiles(on_a_gpu):
    assert gemm.tiles_for(50000, 10).bn == 16
    assert gemm.tiles_for(10000, 500).bn == 128  # 4 tiles of 128 pad less than 4 of 160


# ------------------------------------------------------------------------------------------------ refusals


def test_refusals_say_why():
    with pytest.raises(ValueError, match="whole number"):
        gemm.Tiles(10, 16, 4, 4)
    with pytest.raises(ValueError, match="whole rows"):
        gemm.Tiles(4, 4, 2, 2, 16)
    with pytest.raises(ValueError, match="store must be"):
        gemm.kernel(gemm.SIMULATOR_TILES, "sum")
    x, w, b, _ = _layer(3, 20, 5)
    with pytest.raises(ValueError, match="single split"):
        _run(lambda *a: gemm.launch(gemm.Plan(gemm.SIMULATOR_TILES, 2), *a, store="bias"), x, w, b)


def test_labkit_exports_it():
    assert lk.gemm is gemm and lk.gemm.fc_tiles is gemm.fc_tiles
