"""The simulator's check shapes cross every boundary of the stages' kernels: a second tile, a second block, the
M-tile offset, the K remainder, a grid capped at a few dozen images. Each wrong kernel here is the stage's own
solution with one line changed (tests/buggy_kernels.py: BOUNDARY_BUGS); it passes the base case, where a map fits
one tile and a batch one block row, and fails the case of ``labkit.simulator.CASES`` that crosses its boundary.
And reads or writes outside a layer's inputs: the checks hand them inside NaN margins (``labkit.engine.IN_GUARD``)."""

import re

import numpy as np
import pytest

from labkit import check, device, engine, gpu, kernels, simulator, stages
from labkit.layers import args, fused_args, group_output_shape, groups, impl_for, kernel_layers, with_biases
from labkit.nets import get_net

from buggy_kernels import BOUNDARY_BUGS, patched_stage
from numba import cuda  # noqa: E402  (after labkit, which makes a late NUMBA_ENABLE_CUDASIM count)

simulated = pytest.mark.skipif(device.is_gpu(), reason="the simulator's shapes; a GPU checks the real layers")

#: bugs the base case sees too (its reduction C * K * K = 100 is 12 tiles of 8 and a remainder of 4)
SEEN_IN_BASE = {"07 matmul without the K remainder"}


def batch_of(case_name: str) -> int:
    return next(b for b, shape in simulator.CASES.items() if shape.name == case_name)


def conv_check(variant, batches):
    """The check the self-check and the grader run on cifar10's conv2 (with its activation and pool when the variant
    fuses them), at ``batches``."""
    net = get_net("cifar10")
    group = next(g for g in groups(kernel_layers(net), variant.fuse) if g[0].name == "conv2")
    fn = impl_for(variant.impls, group[0])
    if len(group) > 1:
        return check.check_group(fn, net, group, arrays=variant.arrays, batches=batches, quiet=True)
    return check.check_layer(fn, net, "conv2", arrays=variant.arrays, batches=batches, quiet=True)


@simulated
@pytest.mark.parametrize("bug", list(BOUNDARY_BUGS))
def test_a_kernel_wrong_only_past_a_boundary_fails_the_case_that_crosses_it(bug):
    stage, name, old, new, what, case_name = BOUNDARY_BUGS[bug]
    variant = patched_stage(stage, old, new)["VARIANTS"][name]
    if bug not in SEEN_IN_BASE:
        base = conv_check(variant, (1,))
        assert base.passed, f"{bug}: meant to be wrong only past a boundary, but the base case fails: {base}"
    batch = batch_of(case_name)
    r = conv_check(variant, (batch,))
    assert not r.passed, f"{bug} ({what}) passed the {case_name!r} case at batch {batch}"
    cap = re.search(r"at (?:most )?(\d+) images", what)
    if cap:  # the first wrong element is in an image past the cap (a block may cover a few more)
        first = re.search(r"out\[(\d+), ", r.detail)
        assert first and int(first.group(1)) >= int(cap.group(1)), r.detail


@simulated
def test_each_case_crosses_its_boundary():
    """The shapes themselves: maps wider and taller than TILE with remainders, more output maps than TILE, more
    images than a grid row, and a reduction of a tile and a remainder."""
    net, t = get_net("cifar10"), simulator.TILE
    conv2 = net.layer("conv2")
    rng = np.random.default_rng(0)
    by_name = {shape.name: batch for batch, shape in simulator.CASES.items()}
    tiles = check.layer_case(net, "conv2", by_name["tiles"], rng)
    _, _, ho, wo = tiles.expected.shape
    assert ho > t and wo > t and ho % t and wo % t and ho % 8 and wo % 8 and ho != wo
    maps = check.layer_case(net, "conv2", by_name["output maps"], rng)
    m, c, k, _ = maps.weights["conv2.weight"].shape
    assert m > t and m % 8 and (c * k * k) > t and (c * k * k) % t and (c * k * k) % 8
    images = check.layer_case(net, "conv2", by_name["images"], rng)
    n = images.x.shape[0]
    assert n > simulator.GRID_CAP >= kernels.FC_TILED_FROM and n % 2 and all(n % k for k in (4, 8, 16, 32, 64))
    assert by_name["base"] == 1 and simulator.layer_input_shape(net, conv2) == (4, 7, 6), \
        "the base case is batch 1 (the counts tables and the notebooks' worked example use it)"
    assert set(simulator.BATCHES) == set(simulator.CASES)


def _launch_configs(monkeypatch, fn, group, arrays: str, batches=simulator.BATCHES) -> dict:
    """kernel name -> every (grid, block) it was launched with over the check's cases (``batches``), in order; the
    kernels do not run (the launch is recorded, not made), so this costs what the host code costs."""
    seen: dict = {}

    def record(kernel, grid, block, *args, shared_bytes=0):
        gpu.refuse_stub(kernel)
        dims = (gpu._dims(grid), gpu._dims(block))
        seen.setdefault(gpu.kernel_name(kernel), []).append(dims)

    def record_raw(kernel, grid, block, args, shared_bytes=0):  # CUDA C (on the CPU emulation without a GPU)
        seen.setdefault(getattr(kernel, "name", "raw_kernel"), []).append((gpu._dims(grid), gpu._dims(block)))

    monkeypatch.setattr(gpu, "launch_grid", record)
    monkeypatch.setattr(gpu, "launch_raw", record_raw)
    net = get_net("cifar10")
    rng = np.random.default_rng(0)
    for batch in batches:
        case = check.group_case(net, group, batch, rng) if len(group) > 1 else \
            check.layer_case(net, group[0].name, batch, rng)
        weights = with_biases(group, case.weights)
        out = np.zeros(group_output_shape(group, case.x.shape, weights), np.float32)
        if arrays == "device":
            x, weights, out = gpu.to_device(case.x), {k: gpu.to_device(v) for k, v in weights.items()}, \
                gpu.to_device(out)
        else:
            x = case.x
        fn(*(fused_args(group, x, weights, out) if len(group) > 1 else args(group[0], x, weights, out)))
    return seen


#: CUDA C kernels (run on the CPU emulation here) that the cases never give two blocks: a thread of the register-tile
#: kernel is a tile, 128 to 256 of them a block; its edges are checked by labkit.tile_steps' harnesses instead
FEW_BLOCKS = {"conv_tiles"}


@simulated
@pytest.mark.parametrize("stage", ["02", "04", "05", "06", "07", "08", "09"])
def test_every_kernel_of_every_stage_runs_more_than_one_block_in_every_grid_dimension(monkeypatch, stage):
    """Derived from the launches themselves: over the check's cases, each conv kernel of each stage's variants is
    launched with at least two blocks along every dimension of its grid, and no edge of a 2-D or 3-D block is wider
    than ``simulator.TILE`` (a wider tile needs a larger TILE first, or its second tile is never reached)."""
    net = get_net("cifar10")
    found = stages.load_variants(stages.solutions_folder() / stages.STAGES[stage].notebook)
    checked = 0
    for name, variant in found.items():
        if variant.target != "gpu" or variant.unavailable() or "cifar10" not in variant.nets:
            continue
        group = next(g for g in groups(kernel_layers(net), variant.fuse) if g[0].name == "conv2")
        seen = _launch_configs(monkeypatch, impl_for(variant.impls, group[0]), group, variant.arrays)
        assert seen, f"{stage} {name}: its conv launched no kernel"
        for kernel, configs in seen.items():
            if kernel in FEW_BLOCKS:
                continue
            rank = max(len(grid) for grid, _ in configs)
            most = [max((grid + (1,) * rank)[d] for grid, _ in configs) for d in range(rank)]
            assert all(n >= 2 for n in most), f"{stage} {name}: {kernel} never has two blocks along a grid " \
                                              f"dimension: the most blocks per dimension were {most}"
            for _, block in configs:
                if len(block) > 1:
                    assert max(block) <= simulator.TILE, f"{kernel}: block {block} is wider than simulator.TILE"
        checked += 1
    assert checked, f"stage {stage} has no simulated GPU variant to look at"


@simulated
def test_stage_07s_unroll_cuts_the_images_case_into_chunks_the_last_one_smaller(monkeypatch):
    """Derived from the launches, as above: on the simulator the unroll buffer holds a few KB
    (``simulator.buffer_bytes``), so one case's call unrolls its batch in several launches, the last with fewer
    threads (a smaller chunk), and the others' fit one chunk or take an image a chunk."""
    net = get_net("cifar10")
    variant = stages.load_variants(stages.solutions_folder() / stages.STAGES["07"].notebook)["unroll_tiled"]
    conv2 = (net.layer("conv2"),)
    chunks = {b: [grid for grid, _ in _launch_configs(monkeypatch, variant.impls["conv"], conv2, "device", (b,))
                  ["unroll_kernel"]] for b in simulator.BATCHES}
    images = chunks[simulator.BATCHES[-1]]
    assert len(images) > 2 and images[-1] < images[0] and len(set(images[:-1])) == 1, chunks
    assert all(len(set(grids)) == 1 for b, grids in chunks.items() if b != simulator.BATCHES[-1]), chunks


# ---------------------------------------------------------------------------- reads outside a layer's input

def test_inputs_are_views_into_nan_margins(rng):
    """What a checked layer is handed: contiguous arrays of the expected shape, NaN on either side of each."""
    seen = {}

    def spy(x, w, b, out, pad, stride):
        seen.update(x=x, w=w, b=b)
        out[...] = lk_conv(x, w, b, pad, stride)

    case = check.layer_case("cifar10", "conv2", 3, rng, target="cpu")
    got = engine.call_layer(spy, case.layer, case.x, case.weights, "host")
    np.testing.assert_allclose(got, case.expected, rtol=1e-4, atol=1e-4)
    for name, a in seen.items():
        assert a.flags.c_contiguous and a.base is not None, name
        flat = a.base.reshape(-1)
        start = engine.IN_GUARD
        assert np.isnan(flat[:start]).all() and np.isnan(flat[start + a.size:]).all(), name
        assert np.isfinite(flat[start:start + a.size]).all(), name


def lk_conv(x, w, b, pad, stride):
    from labkit import reference

    return reference.conv2d(x, w, b, pad, stride, accumulate="float64")


def _no_bounds_test():
    """A CPU conv whose windows ignore the padding: rows past the image's last are read as if they were there."""
    from numba import njit

    @njit
    def conv(x, w, b, out, pad, stride):
        N, M, Ho, Wo = out.shape
        C, K = x.shape[1], w.shape[2]
        for n in range(N):
            for m in range(M):
                for i in range(Ho):
                    for j in range(Wo):
                        acc = b[m]
                        for c in range(C):
                            for p in range(K):
                                for q in range(K):
                                    r, s = i * stride + p - pad, j * stride + q - pad
                                    if 0 <= s < x.shape[3]:  # columns tested, rows not: the last rows read on
                                        acc += x[n, c, r, s] * w[m, c, p, q]
                        out[n, m, i, j] = acc

    return conv


def test_a_window_read_past_the_input_fails_saying_it_read_outside_its_input():
    """The last image's last rows read past the end of x: into the NaN margin, so the output is NaN there, and the
    check says the kernel read outside its input rather than that it left elements unwritten."""
    r = check.check_layer(_no_bounds_test(), "cifar10", "conv1", target="cpu", batches=(1,), quiet=True)
    assert not r.passed and "read outside its input" in r.detail, r


def test_a_write_outside_an_input_fails():
    """A CPU relu that also writes one row past its input's last (numba does not test bounds): the margin after x
    changes, and the check says so."""
    from numba import njit

    @njit
    def relu_writing_past_x(x, out):
        N, C, H, W = x.shape
        for n in range(N):
            for c in range(C):
                for i in range(H):
                    for j in range(W):
                        out[n, c, i, j] = max(x[n, c, i, j], 0.0)
        x[N - 1, C - 1, H, 0] = 0.0  # the element after x's last

    r = check.check_layer(relu_writing_past_x, "cifar10", "relu1", target="cpu", batches=(1,), quiet=True)
    assert not r.passed and "written outside its input (x)" in r.detail, r


@cuda.jit
def _relu_of_the_next_element(x, out):
    t = cuda.grid(1)
    if t < out.size:
        k = t + 1 if t == out.size - 1 else t  # the last thread reads x[x.size], one past the last element
        out[t] = max(x[k], 0.0) + (x[k] - x[k])  # NaN stays NaN (a GPU's max(NaN, 0) is 0)


def test_a_device_kernel_reading_one_past_its_input_fails():
    """One element past the end of x: on a GPU it lies in the NaN margin (no bounds test there), and the check says
    the kernel read outside its input; on the simulator numpy's bounds test raises first. Either way: FAIL."""

    def relu(x, out):
        gpu.launch(_relu_of_the_next_element, out.size, gpu.flat(x), gpu.flat(out))

    r = check.check_layer(relu, "cifar10", "relu1", arrays="device", batches=(1,), quiet=True)
    assert not r.passed
    assert ("read outside its input" if device.is_gpu() else "IndexError") in r.detail, r


def test_a_gpu_checks_these_shapes_after_the_real_sizes(monkeypatch):
    """On a real GPU the real layers' sizes fill whole blocks (cifar10's conv1: 32 maps of 32 x 32), so a kernel
    without a guard passed there (issue 25, results/h100-2026-11-25b: out_of_bounds). After the real sizes a GPU
    check runs these shapes too: the same batch sizes, marked ``simulator.Shrunk``, shrunk whatever the device."""
    monkeypatch.setattr(simulator, "active", lambda: False)  # as on a GPU
    net, rng = get_net("cifar10"), np.random.default_rng(3)
    batches = check.default_batches("gpu")
    assert batches[:len(check.BATCHES)] == check.BATCHES
    assert list(batches[len(check.BATCHES):]) == list(simulator.BATCHES)
    assert check.default_batches("cpu") == check.BATCHES  # CPU code has no blocks to cross
    assert check.layer_case(net, "conv2", 3, rng, "gpu").x.shape == (3, *net.input_shape_of("conv2"))
    for b in batches[len(check.BATCHES):]:
        c = check.layer_case(net, "conv2", b, rng, "gpu")
        assert c.x.shape == (b, *simulator.layer_input_shape(net, net.layer("conv2"), b))
        assert c.expected.shape[1] == simulator.layer_outputs(net.layer("conv2"), b)
        assert str(b).startswith(f"{int(b)} (the shape {simulator.case(b).name!r}")
        detail = check.compare("conv2", np.zeros_like(c.expected), c.expected, batch=b).detail
        assert f"at batch size {int(b)} (the shape" in detail, detail
