"""labkit.gemm_cuda, the kit's CUDA C SGEMM for the fc: x @ w.T + b on odd shapes in every configuration (float4
and scalar loads, one split and several), misaligned inputs take the scalar loads and stay right, the kit's layer
check (NaN output and margins) passes it and catches a launch one split short, and the plans for an H100 fill it."""

import math

import numpy as np
import pytest

import labkit as lk
from labkit import check, gemm_cuda, gpu, stages

import fc_cases  # noqa: E402  (tests/ is on the path, as for buggy_kernels)

pytestmark = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")

#: 16 x 16 tiles of 4 threads: the emulation's small shapes cross several tiles along the images and the outputs
TINY = gemm_cuda.Config("tiny", down=2, bk=8, max_across=2)
CONFIGS = [*gemm_cuda.CONFIGS.values(), TINY]

#: (images, inputs, outputs): K a multiple of 4 (float4 loads) or of nothing, of a step or not; outputs 10, 140,
#: 160 and odd; images one, odd and more than a tile of 128
SHAPES = [(1, 1, 1), (3, 37, 10), (35, 40, 160), (19, 52, 13), (130, 44, 140), (2, 9, 7)]


_layer = fc_cases.layer


_run, _close = fc_cases.run, fc_cases.close


@pytest.fixture
def plans(monkeypatch):
    """The plans launched, as the layer function chose them."""
    return fc_cases.record_plans(monkeypatch, gemm_cuda)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_configuration_is_the_float64_product_on_odd_shapes(config, shape, plans):
    x, w, b, want = _layer(*shape)
    _close(_run(lambda *a: gemm_cuda.fc_cuda(*a, config=config), x, w, b), want)
    assert plans[-1].vec == (shape[1] % 4 == 0)  # float4 loads wherever K allows them (the buffers start aligned)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("splits", [1, 3, 50])
def test_any_split_count_gives_the_product_with_float4_and_scalar_loads(config, splits):
    """One split (the bias in the store), three (the last one short), more splits than steps (fewer planes)."""
    x, w, b, want = _layer(21, 76, 19, seed=splits)
    for vec in (True, False):
        p = gemm_cuda.Plan(config, gemm_cuda.across_for(config, 19), splits, vec)
        assert p.planes(76) <= splits and p.span(76) * p.planes(76) >= 76 > p.span(76) * (p.planes(76) - 1)
        _close(_run(lambda *a: gemm_cuda.launch(p, *a), x, w, b), want)


@pytest.mark.parametrize("config", [gemm_cuda.CONFIGS[gemm_cuda.DEFAULT], TINY], ids=lambda c: c.name)
def test_misaligned_inputs_take_scalar_loads_and_stay_right(config, plans):
    """x and w one float past 16 bytes, K a multiple of 4: float4 loads would read across rows (or fault)."""
    x, w, b, want = _layer(17, 48, 20, seed=3)
    _close(_run(lambda *a: gemm_cuda.fc_cuda(*a, config=config), x, w, b, offset=1), want)
    assert plans and not plans[-1].vec
    with pytest.raises(ValueError, match="16-byte aligned"):
        _run(lambda *a: gemm_cuda.launch(gemm_cuda.Plan(config, 2, 1, vec=True), *a), x, w, b, offset=1)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_the_kits_layer_check_passes_every_configuration(config):
    """lk.check_layer: fresh inputs at the emulation's batch sizes, NaN output, NaN margins around x, w and b
    (engine.call_layer), the planes poisoned by the pool; fashion's fc1 (160 outputs) and cifar10's fc (10)."""
    for net, layer in (("fashion", "fc1"), ("cifar10", "fc")):
        r = check.check_layer(lambda *a: gemm_cuda.fc_cuda(*a, config=config), net, layer, arrays="device",
                              quiet=True)
        assert r.passed, str(r)


def one_split_short(x, w, b, out):
    """The plan's launch with the grid one split short: the last plane keeps what the pool left there (NaN)."""
    N, K = x.shape
    OUT = w.shape[0]
    p = gemm_cuda.plan(N, K, OUT, TINY)
    planes = p.planes(K)
    part = gpu.buffer("fc_cuda: partial sums", (planes, N, OUT))
    m = gemm_cuda.module(p.macros())
    ints = tuple(np.int32(v) for v in (N, K, OUT, p.span(K)))
    grid = (gpu.blocks(OUT, p.bn), gpu.blocks(N, p.bm), planes - 1)
    gpu.launch_raw(m.get_function("fc_cuda_tiles"), grid, p.threads, (x, w, b, part, *ints, np.int32(0)))
    gpu.launch_raw(m.get_function("fc_cuda_sum"), gpu.blocks(N * OUT, 256), 256,
                   (part, b, out, np.int32(N), np.int32(OUT), np.int32(planes)))


def test_the_check_catches_a_launch_one_split_short():
    if not gpu.cuda_c_on_cpu():
        pytest.skip("the emulation's plan splits K in two; a GPU's may not split the shrunk layer")
    r = check.check_layer(one_split_short, "fashion", "fc1", arrays="device", quiet=True)
    assert not r.passed, str(r)


# ------------------------------------------------------------------------------------------------ an H100's plans


def test_fashions_fc1_on_an_h100_gets_exact_tiles_and_two_waves():
    """10000 x 20184 by 160: 128 x 80 tiles (two across 160 outputs, none padded), 79 x 2 tiles in 5 splits are 790
    blocks, two waves of 132 multiprocessors holding 3 blocks of 160 threads each."""
    p = gemm_cuda.plan(10000, 20184, 160, sms=132, vec=True)
    assert (p.bm, p.bn, p.threads, p.min_blocks, p.splits) == (128, 80, 160, 3, 5)
    assert "k8" in str(p) and "float4" in str(p)


@pytest.mark.parametrize("OUT, bn", [(160, 80), (140, 72), (10, 16), (500, 128), (3, 8)])
def test_tile_width_covers_the_outputs_with_the_fewest_tiles_and_little_padding(OUT, bn):
    c = gemm_cuda.CONFIGS["k8"]
    assert c.tn * gemm_cuda.across_for(c, OUT) == bn
    assert gemm_cuda.across_for(gemm_cuda.CONFIGS["wide"], 160) == 20  # one 160-wide tile


@pytest.mark.parametrize("name", list(gemm_cuda.CONFIGS))
@pytest.mark.parametrize("K, OUT", [(20184, 160), (5184, 140), (160, 10), (4096, 500)])
def test_an_h100s_plans_fill_it_with_whole_splits(name, K, OUT):
    for n in (1, 100, 1000, 10000, 50000):
        p = gemm_cuda.plan(n, K, OUT, name, sms=132)
        tiles = math.ceil(n / p.bm) * math.ceil(OUT / p.bn)
        assert p.planes(K) == p.splits and p.span(K) % p.config.bk == 0
        assert p.splits == 1 or K // p.splits >= gemm_cuda.MIN_SPAN, (n, str(p))
        assert p.threads <= 1024 and p.threads * p.min_blocks <= 2048
        waves = math.ceil(tiles * p.splits / (132 * p.min_blocks))
        busy = tiles * K / (waves * 132 * p.min_blocks * p.span(K))  # of the waves' block slots, by the splits' work
        assert busy >= 0.75 or n < 1000 or K < 4096, (n, str(p), busy)  # a long K fills the GPU at 1000 images


def test_refusals_say_why():
    with pytest.raises(ValueError, match="multiples of 4"):
        gemm_cuda.Config("bad", down=16, bk=8, max_across=16, tm=6)
    with pytest.raises(ValueError, match="bk must be"):
        gemm_cuda.Config("bad", down=16, bk=6, max_across=16)


def test_labkit_exports_it():
    assert lk.gemm_cuda is gemm_cuda and lk.gemm_cuda.fc_cuda is gemm_cuda.fc_cuda
