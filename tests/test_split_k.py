"""Stage 10's split-K fc: the simulator's checks reach every boundary of its grid (a second output tile, a second
image tile, a second split, a split whose range ends inside a step of T inputs), a kernel wrong at one of them fails
the kit's check, and the split count the host picks fills the GPU without making a split shorter than MIN_CHUNK."""

import math
from pathlib import Path

import numpy as np
import pytest

from labkit import check, device, gpu, nbcells, simulator, stages
from labkit.layers import args, with_biases

from numba import cuda  # noqa: E402,F401  (after labkit, which makes a late NUMBA_ENABLE_CUDASIM count)

simulated = pytest.mark.skipif(device.is_gpu(), reason="the simulator's shapes; a GPU checks the real layers")
SOLUTION = Path(stages.solutions_folder()) / stages.STAGES["10"].notebook


def _kernel_cells(replacements=()) -> dict:
    """The solution's kernel cells, each (old, new) of ``replacements`` applied where ``old`` occurs exactly once."""
    cells = nbcells.tagged_cells(nbcells.read(SOLUTION))
    for old, _ in replacements:
        assert sum(src.count(old) for _, src in cells) == 1, f"{old!r} is not in the solution exactly once"
    ns = {"__name__": "stage10_under_test"}
    for index, src in cells:
        for old, new in replacements:
            src = src.replace(old, new)
        nbcells.run_cell(src, f"<10_whole_job.ipynb cell {index}>", ns)
    return ns


@pytest.fixture(scope="module")
def solution():
    return _kernel_cells()


@simulated
def test_the_checks_reach_every_boundary_of_the_split_k_grid(monkeypatch, solution):
    """Derived from the launches over the check's cases (recorded, not run): two blocks or more along the outputs,
    the images and the splits, a block no wider than simulator.TILE, a split range that ends inside a step of T
    inputs, and a last split shorter than the others."""
    seen = []

    def record(kernel, grid, block, *a, shared_bytes=0):
        if gpu.kernel_name(kernel) == "fc_splitk_kernel":
            x, kchunk = a[0], a[3]
            seen.append((gpu._dims(grid), gpu._dims(block), x.shape[1], kchunk))

    monkeypatch.setattr(gpu, "launch_grid", record)
    rng = np.random.default_rng(0)
    for net, layer in (("fashion", "fc1"), ("cifar10", "fc")):
        for batch in simulator.BATCHES:
            case = check.layer_case(net, layer, batch, rng)
            weights = {k: gpu.to_device(v) for k, v in with_biases((case.layer,), case.weights).items()}
            out = gpu.to_device(np.zeros(case.expected.shape, np.float32))
            solution["fc_splitk"](*args(case.layer, gpu.to_device(case.x), weights, out))
    T = solution["T"]
    most = [max(grid[d] for grid, *_ in seen) for d in range(3)]
    assert all(n >= 2 for n in most), f"blocks per grid dimension (outputs, images, splits) at most {most}"
    assert all(max(block) <= simulator.TILE for _, block, *_ in seen)
    split = [(K, kchunk) for grid, _, K, kchunk in seen if grid[2] > 1]
    assert any(kchunk % T for _, kchunk in split), "no split range ends inside a step of T inputs"
    assert any(K % kchunk for K, kchunk in split), "no last split shorter than the others"


#: one line wrong, each a plausible student's mistake; the kit's check must FAIL it. On the simulator cifar10's fc
#: (37 inputs in two splits of 19 and 18, 10 outputs in two tiles of 8); on a GPU fashion's fc1, the layer that
#: splits there (cifar10's 320 inputs are one split of MIN_CHUNK = 256 or more). The last two read or write outside
#: an array: the simulator's bounds checks fail them; a GPU has none (the stray read lands in lanes whose output is
#: never stored, the stray write may land anywhere), so they are checked on the simulator only.
BUGS = {
    "the end of K instead of the end of the split's range": [
        ("if n < N and k < k_end else", "if n < N and k < K else"),
        ("if o0 + ty < OUT and k < k_end else", "if o0 + ty < OUT and k < K else")],
    "every split starts at input 0": [("range(z * kchunk, k_end, T)", "range(0, k_end, T)")],
    "no image guard on the store": [("if n < N and o < OUT:", "if o < OUT:")],
    "the w tile not guarded past the last output": [("if o0 + ty < OUT and k < k_end else", "if k < k_end else")],
}
OUT_OF_BOUNDS = {"no image guard on the store", "the w tile not guarded past the last output"}
NET, LAYER = ("cifar10", "fc") if simulator.active() else ("fashion", "fc1")


@pytest.mark.parametrize("bug", [pytest.param(b, marks=simulated) if b in OUT_OF_BOUNDS else b for b in BUGS])
def test_a_split_k_kernel_wrong_at_one_boundary_fails_the_check(bug):
    ns = _kernel_cells(BUGS[bug])
    result = check.check_layer(ns["fc_splitk"], NET, LAYER, arrays="device", quiet=True)
    assert not result.passed, f"{bug}: {result}"


def test_the_solution_passes_the_same_check(solution):
    result = check.check_layer(solution["fc_splitk"], NET, LAYER, arrays="device", quiet=True)
    assert result.passed, str(result)


@pytest.mark.parametrize("explicit", [1, 2, 5, 37, 100])
def test_any_split_count_gives_the_same_answer(solution, explicit):
    """fc_splitk(..., splits=S): a fixed count, as the notebook's measure cell sweeps it (more splits than inputs
    is at most one input per split)."""
    rng = np.random.default_rng(explicit)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    w = rng.standard_normal((10, 37)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    out = gpu.to_device(np.full((3, 10), np.nan, np.float32))
    solution["fc_splitk"](gpu.to_device(x), gpu.to_device(w), gpu.to_device(b), out, explicit)
    np.testing.assert_allclose(gpu.as_host(out), x.astype(np.float64) @ w.T.astype(np.float64) + b, rtol=1e-5,
                               atol=1e-5)


def test_the_split_count_fills_the_gpu_and_keeps_splits_long(solution, monkeypatch):
    """On an H100-sized GPU (132 multiprocessors), fashion's fc1: more images never mean more splits; each split
    is at least MIN_CHUNK inputs; and the blocks fill two waves unless the splits would get shorter than that."""
    monkeypatch.setitem(solution, "multiprocessors", lambda: 132)
    T, K, OUT, shortest = solution["T"], 20184, 160, solution["MIN_CHUNK"]
    wanted = 2 * 132 * (2048 // (T * T))
    picked = [solution["split_count"](n, K, OUT) for n in (10, 100, 1000, 10000, 50000)]
    assert picked == sorted(picked, reverse=True) and picked[-1] == 1 and picked[0] > 1, picked
    for n, s in zip((10, 100, 1000, 10000, 50000), picked):
        tiles = math.ceil(n / T) * math.ceil(OUT / T)
        assert K // s >= shortest
        assert s * tiles >= wanted or s == K // shortest or s == 1 and tiles >= wanted, (n, s)
