"""labkit.fc_tensor_cores, the fc on the tensor cores at fp32's accuracy: x @ w.T + b against float64 on odd shapes
in every configuration (float4 and scalar loads, one split and several), an error of fp32's size, a value fp16
cannot hold shown as NaN, the kit's layer check passing it and catching a launch one split short, and the plans for
an H100. On a machine without a GPU every test runs on the CPU emulation of CUDA C, whose MMA is the instruction's
fragment layout by hand (labkit.ops.mma_source)."""

import math

import numpy as np
import pytest

from labkit import check, floors, gpu, stages
from labkit.ops import fc_tensor_cores as ft

import fc_cases  # noqa: E402  (tests/ is on the path)

pytestmark = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")

#: one warp, a tile of 16 images by up to two of 8 outputs: the emulation's small shapes cross several blocks
TINY = ft.Config("tiny", wm=1, wn=1, mt=1, max_nt=2)
#: the shortest pipeline: one step on its way while one is multiplied
TWO_STAGES = ft.Config("two-stages", wm=2, wn=1, mt=1, max_nt=1, stages=2)
CONFIGS = [*ft.CONFIGS.values(), TINY, TWO_STAGES]

#: (images, inputs, outputs): K a multiple of 4 (float4 loads), of a step of 16 or of nothing, and long enough that
#: a split's steps go round the stages more than once; outputs 10, 140 and odd; images one, odd and more than a
#: block of 128
SHAPES = [(1, 1, 1), (3, 37, 10), (19, 52, 13), (130, 44, 140), (2, 9, 7), (5, 301, 21), (6, 300, 9)]


_run, _close = fc_cases.run, fc_cases.close


@pytest.fixture
def plans(monkeypatch):
    """The plans launched, as the layer function chose them."""
    return fc_cases.record_plans(monkeypatch, ft)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_configuration_is_the_float64_product_on_odd_shapes(config, shape, plans):
    """Every output written (the output starts as NaN) and right, whatever the block, the pipeline's depth and the
    loads."""
    x, w, b, want = fc_cases.layer(*shape)
    _close(_run(lambda *a: ft.fc_split3(*a, config=config), x, w, b), want)
    assert plans[-1].vec == (shape[1] % 4 == 0)  # float4 loads wherever K allows them (the buffers start aligned)


@pytest.mark.parametrize("splits", [1, 3, 50])
def test_any_split_count_gives_the_product_with_float4_and_scalar_loads(splits):
    """One split (the bias in the store), three (the last one short), more splits than steps (fewer planes)."""
    x, w, b, want = fc_cases.layer(21, 76, 19, seed=splits)
    for vec in (True, False):
        p = ft.Plan(TINY, ft.nt_for(TINY, 19), splits, vec)
        assert p.planes(76) <= splits and p.span(76) * p.planes(76) >= 76 > p.span(76) * (p.planes(76) - 1)
        _close(_run(lambda *a: ft.launch(p, *a), x, w, b), want)


def test_misaligned_inputs_take_scalar_loads_and_stay_right(plans):
    """x one float past 16 bytes, K a multiple of 4: float4 loads would read across rows (or fault)."""
    x, w, b, want = fc_cases.layer(17, 48, 20, seed=3)
    _close(_run(lambda *a: ft.fc_split3(*a, config=TINY), x, w, b, offset=1), want)
    assert plans and not plans[-1].vec
    with pytest.raises(ValueError, match="16-byte aligned"):
        _run(lambda *a: ft.launch(ft.Plan(TINY, 2, 1, vec=True), *a), x, w, b, offset=1)


def test_the_split_keeps_fp32s_accuracy_where_one_fp16_product_would_not():
    """Inputs with more bits than fp16 holds: the error against float64 stays near fp32's (a plain fp16 product's
    would be about 2^-11 of the sum's terms), and the same inputs rounded to fp16 first land far from the answer."""
    x, w, b, want = fc_cases.layer(33, 300, 24, seed=5)
    got = _run(lambda *a: ft.fc_split3(*a, config=TINY), x, w, b)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)  # what the products add up to
    err = np.abs(got - want) / scale
    half = (x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T + b)
    assert err.max() < 2e-6, err.max()
    assert (np.abs(half - want) / scale).max() > 20 * err.max()


@pytest.mark.parametrize("where", ["x", "w"])
def test_a_value_fp16_cannot_hold_becomes_nan_in_every_output_it_reaches(where):
    """70000 is past fp16's 65504: its row (an image) or its output's column is NaN, every other output right."""
    x, w, b, want = fc_cases.layer(20, 40, 11, seed=7)
    (x if where == "x" else w)[3, 5] = 70000.0
    got = _run(lambda *a: ft.fc_split3(*a, config=TINY), x, w, b)
    bad = np.zeros(got.shape, bool)
    if where == "x":
        bad[3, :] = True
    else:
        bad[:, 3] = True
    assert np.isnan(got[bad]).all()
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    _close(got[~bad], want[~bad])


@pytest.mark.parametrize("config", [ft.CONFIGS[ft.DEFAULT], TINY], ids=lambda c: c.name)
def test_the_kits_layer_check_passes_it(config):
    """lk.check_layer: fresh inputs at the emulation's batch sizes, NaN output, NaN margins around x, w and b, the
    planes poisoned by the pool; fashion's fc1 (160 outputs) and cifar10's fc (10)."""
    for net, layer in (("fashion", "fc1"), ("cifar10", "fc")):
        r = check.check_layer(lambda *a: ft.fc_split3(*a, config=config), net, layer, arrays="device", quiet=True)
        assert r.passed, str(r)


def one_split_short(x, w, b, out):
    """The plan's launch with the grid one split short: the last plane keeps what the pool left there (NaN)."""
    N, K = x.shape
    OUT = w.shape[0]
    p = ft.plan(N, K, OUT, TINY)
    m = ft.module(p.macros())
    wsp, tiles = ft.split_weights(m, w, K, OUT)
    planes = p.planes(K)
    part = gpu.buffer("fc_split3: partial sums", (planes, N, OUT))
    ints = tuple(np.int32(v) for v in (N, K, OUT, tiles, p.span(K)))
    grid = (gpu.blocks(N, p.bm), -(-tiles // p.tiles), planes - 1)
    gpu.launch_raw(m.get_function("fc_split3"), grid, p.threads, (x, wsp, b, part, *ints, np.int32(0)))
    gpu.launch_raw(m.get_function("fc_cuda_sum"), gpu.blocks(N * OUT, 256), 256,
                   (part, b, out, np.int32(N), np.int32(OUT), np.int32(planes)))


def test_the_check_catches_a_launch_one_split_short():
    if not gpu.cuda_c_on_cpu():
        pytest.skip("the emulation's plan splits K in two; a GPU's may not split the shrunk layer")
    r = check.check_layer(one_split_short, "fashion", "fc1", arrays="device", quiet=True)
    assert not r.passed, str(r)


def test_the_floor_counts_it_as_three_fp16_passes():
    """labkit.floors reads the method off the function: fc1 on the tensor cores, three fp16 passes."""
    method = floors.method_of(ft.fc_split3, 10000)
    assert (method.unit, method.passes) == ("f16", 3)


# ------------------------------------------------------------------------------------------------ an H100's plans


def test_fashions_fc1_on_an_h100_reads_x_once_and_fills_three_waves():
    """10000 x 20184 by 160: 128-image blocks over all 160 outputs (x read once), 79 blocks in 5 splits: 395 blocks,
    three waves of 132 multiprocessors holding one block of 256 threads each."""
    p = ft.plan(10000, 20184, 160, sms=132, vec=True)
    assert (p.bm, 8 * p.tiles, p.threads, p.min_blocks, p.splits) == (128, 160, 256, 1, 5)
    assert "m128" in str(p) and "float4" in str(p)


@pytest.mark.parametrize("OUT, nt", [(160, 10), (140, 9), (10, 1), (500, 8), (3, 1)])
def test_a_warps_output_tiles_cover_the_outputs_with_the_fewest_blocks(OUT, nt):
    c = ft.CONFIGS["mt1"]
    assert ft.nt_for(c, OUT) == nt
    assert c.wn * nt * 8 * math.ceil(OUT / (c.wn * nt * 8)) >= OUT


@pytest.mark.parametrize("name", list(ft.CONFIGS))
@pytest.mark.parametrize("K, OUT", [(20184, 160), (5184, 140), (160, 10), (4096, 500)])
def test_an_h100s_plans_split_whole_steps(name, K, OUT):
    for n in (1, 100, 1000, 10000, 50000):
        p = ft.plan(n, K, OUT, name, sms=132)
        assert p.planes(K) == p.splits and p.span(K) % 16 == 0
        assert p.splits == 1 or K // p.splits >= ft.MIN_SPAN, (n, str(p))
        assert p.threads * p.min_blocks <= 2048 and p.nt <= p.config.max_nt
