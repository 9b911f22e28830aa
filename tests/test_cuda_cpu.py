"""CUDA C without a GPU (labkit.cudacpu): the kit's CUDA C kernels pass their checks on the CPU emulation, five wrong
kernels fail with a line naming what went wrong, and the emulation's own rules hold (a real barrier, an order of
threads that exposes a missing one, NaN shared memory, 1-3 dimensional launches, clear one-line errors).

Through ``lk.gpu.raw_module`` these run on a GPU too (cupy); the tests of ``cudacpu`` itself skip there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import labkit as lk
from labkit import cudacpu, gpu, stages, tile_steps
from labkit.cudacpu import compiler

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import cuda_c_wrong_kernels as wrong  # noqa: E402

WHY = stages.unavailable(("cuda_c",))
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"CUDA C cannot run here: {WHY}")
on_cpu = pytest.mark.skipif(not gpu.cuda_c_on_cpu() or bool(cudacpu.available()),
                            reason="the CPU emulation itself (this machine runs CUDA C on a GPU)")
LABEL = f"[{cudacpu.LABEL}]" if gpu.cuda_c_on_cpu() else ""


# ------------------------------------------------------------------ the kit's kernels, through the normal checks

def test_stage_06_cuda_c_kernel_passes_its_check():
    s06 = lk.from_stage("06")
    result = lk.check.check_layer(s06.conv_const_c, "cifar10", "conv1", arrays="device", quiet=True)
    assert result.passed, str(result)
    assert str(result).endswith(LABEL)


def test_stage_09_pooled_cuda_c_passes_its_check_fused():
    s09 = lk.from_stage("09")
    net = lk.get_net("fashion")
    group = next(g for g in lk.layers.groups(lk.layers.kernel_layers(net), ("relu", "tanh", "pool"))
                 if g[0].name == "conv1")
    result = lk.check.check_group(s09.conv_pooled_cuda(True), net, group, arrays="device", quiet=True)
    assert result.passed and len(group) == 3, str(result)


def test_stage_09_register_tile_steps_and_a_tuner_candidate_pass():
    s09 = lk.from_stage("09")
    results = tile_steps.check(s09.TILES_SOURCE, quiet=True)
    assert [r.passed for r in results] == [True] * len(tile_steps.STEPS), "\n".join(map(str, results))
    assert all(str(r).endswith(LABEL) for r in results)
    names = {c.name for c in s09.tile_candidates()}
    assert names and "09 tiles weights_in=shared tpb=128 split=2 prefetch=1" in names
    net = lk.get_net("cifar10")
    group = next(g for g in lk.layers.groups(lk.layers.kernel_layers(net), ("relu", "tanh", "pool"))
                 if g[0].name == "conv2")
    fn = s09.conv_tiles(weights_in="shared", split=2, prefetch=1)
    result = lk.check.check_group(fn, net, group, arrays="device", quiet=True)
    assert result.passed, str(result)


def test_a_wrong_register_tile_step_fails_on_its_own():
    s09 = lk.from_stage("09")
    body = tile_steps.function_body(s09.TILES_SOURCE, "stage_weights")
    broken = s09.TILES_SOURCE.replace(body, body.replace("w[(m0 + i % MG)", "w[(i % MG)"))  # ignores the group
    results = {r.name: r for r in tile_steps.check(broken, quiet=True)}
    assert results["step a, load_window"].passed and not results["step c, stage_weights"].passed
    assert "elements off" in str(results["step c, stage_weights"]) or "wrong" in str(results["step c, stage_weights"])


@pytest.mark.parametrize("name", list(wrong.KERNELS))
def test_wrong_kernels_fail_naming_the_mistake_and_right_ones_pass(name):
    kernel = wrong.KERNELS[name]
    result = wrong.check(kernel, seed=7)
    good, line = wrong.verdict(kernel, result)
    assert good, f"{kernel.mistake or 'a right kernel'}: {line}"
    if gpu.cuda_c_on_cpu():  # the emulation's own words: NaN shared memory, wrong values, past the end of out
        want = {"missing_barrier": "read data that was never written", "halo_error": "never staged (the halo)",
                "off_by_one_bound": "elements off", "wrong_constant_index": "elements off",
                "missing_guard": "past the end of out"}.get(name, "PASS")
        assert want in line and line.endswith(LABEL), line
        assert ("shared memory starts as NaN" in line) == (name in ("missing_barrier", "halo_error")), line


def test_the_wrong_kernels_tool_writes_one_line_each_and_its_json(tmp_path, capsys):
    assert wrong.main(["--out", str(tmp_path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert len(lines) == len(wrong.KERNELS) and all(ln.startswith("ok ") for ln in lines), lines
    import json

    data = json.loads((tmp_path / "cuda_c_wrong_kernels.json").read_text())
    assert data["all_as_expected"] and len(data["kernels"]) == len(wrong.KERNELS)


# ------------------------------------------------------------------------------------ the emulation's own rules

NEIGHBOURS = r"""
extern "C" {
__global__ void neighbours(float* out, int barrier) {
    __shared__ float s[256];
    int t = threadIdx.x, n = blockDim.x, base = blockIdx.x * 2 * n;
    s[t] = (float)(blockIdx.x * 1000 + t);
    if (barrier) __syncthreads();
    out[base + t] = s[(t + 1) % n];       // written by the next thread
    out[base + n + t] = s[(t + n - 1) % n];  // written by the previous one
}

__global__ void early_exit(float* out, int keep) {
    __shared__ float s[256];
    int t = threadIdx.x;
    if (t >= keep) return;  // these count as arrived at the barrier below
    s[t] = (float)t;
    __syncthreads();
    out[t] = s[keep - 1 - t];
}

__global__ void indices(int* out) {
    int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    int n = blockDim.x * blockDim.y * blockDim.z;
    out[block * n + thread] = block * 1000 + (threadIdx.z * 100 + threadIdx.y * 10 + threadIdx.x);
}

__constant__ float c_w[8];
__global__ void scaled(const float* x, float* out, float s, long n) {
    long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t < n) out[t] = s * x[t] + c_w[t % 8];
}

__global__ void store_at(float* p) { p[threadIdx.x] = 1.0f; }
}
"""


@pytest.fixture(scope="module")
def module():
    if not gpu.cuda_c_on_cpu() or cudacpu.available():
        pytest.skip("the CPU emulation itself")
    return cudacpu.Module(NEIGHBOURS)


@on_cpu
def test_a_barrier_is_real_and_a_missing_one_reads_nan_whichever_neighbour_writes_later(module):
    n = 64
    out = np.zeros(4 * 2 * n, np.float32)
    module.get_function("neighbours")((4,), (n,), (out, np.int32(1)))
    t = np.arange(n)
    for b in range(4):
        np.testing.assert_array_equal(out[b * 2 * n:b * 2 * n + n], b * 1000 + (t + 1) % n)
        np.testing.assert_array_equal(out[b * 2 * n + n:(b + 1) * 2 * n], b * 1000 + (t + n - 1) % n)
    module.get_function("neighbours")((4,), (n,), (out, np.int32(0)))
    halves = np.isnan(out.reshape(4, 2, n)).any(axis=2)  # [block, next / previous]
    assert halves[:, 0].any() and halves[:, 1].any(), "both directions of a missing barrier read NaN somewhere"


@on_cpu
def test_threads_that_return_early_count_as_arrived(module):
    out = np.full(128, -1, np.float32)
    module.get_function("early_exit")((1,), (128,), (out, np.int32(40)))
    np.testing.assert_array_equal(out[:40], np.arange(40)[::-1])
    assert (out[40:] == -1).all()


@on_cpu
@pytest.mark.parametrize("grid,block", [((3,), (5,)), ((2, 3), (4, 2)), ((2, 1, 3), (3, 2, 2))])
def test_grids_and_blocks_of_one_to_three_dimensions(module, grid, block):
    blocks, threads = int(np.prod(grid)), int(np.prod(block))
    out = np.full(blocks * threads, -1, np.int32)
    module.get_function("indices")(grid, block, (out,))
    bz, by, bx = np.unravel_index(np.arange(threads), tuple(reversed((*block, 1, 1)[:3])))
    per_thread = bz * 100 + by * 10 + bx
    expected = (np.arange(blocks)[:, None] * 1000 + per_thread[None, :]).ravel()
    np.testing.assert_array_equal(out, expected)


@on_cpu
def test_constant_memory_scalars_by_type_and_one_line_refusals(module):
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    w = np.arange(8, dtype=np.float32)
    gpu.upload_constant(module, "c_w", w)
    assert module.get_global("c_w").size == 32
    out = np.full(300, np.nan, np.float32)
    dx, dout = gpu.to_device(x), gpu.to_device(out)  # numba's simulator arrays go in as their data
    gpu.launch_raw(module.get_function("scaled"), (3,), (128,), (dx, dout, np.float32(2.0), np.int64(300)))
    np.testing.assert_allclose(gpu.to_host(dout), 2 * x + w[np.arange(300) % 8], rtol=1e-6)
    kernel = module.get_function("scaled")
    for args, words in [((x, out, np.float32(2)), "takes 4 arguments, got 3"),
                        ((x, out, np.int32(2), np.int64(300)), "parameter of type float: pass an np.float32"),
                        ((x, 1.5, np.float32(2), np.int64(300)), "argument 1 is a pointer parameter")]:
        with pytest.raises(cudacpu.LaunchError, match=words) as err:
            kernel((3,), (128,), args)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="do not fit"):
        gpu.upload_constant(module, "c_w", np.zeros(9, np.float32))
    with pytest.raises(cudacpu.LaunchError, match="no __global__ kernel 'nope'"):
        module.get_function("nope")


@on_cpu
def test_an_illegal_address_is_an_error_line_not_a_crash(module):
    with pytest.raises(cudacpu.LaunchError, match=r"illegal memory access .*in block \(0, 0, 0\), thread \(3, 0, 0\)"):
        module.get_function("store_at")((1,), (4,), (np.uint64(8),))
    out = np.zeros(4, np.float32)  # the module still works afterwards
    module.get_function("store_at")((1,), (4,), (out,))
    assert (out == 1).all()


@on_cpu
def test_a_compile_error_is_the_compilers_first_error_in_one_line():
    with pytest.raises(cudacpu.CompileError) as err:
        gpu.raw_module('extern "C" {\n__global__ void k(float* x) {\n    x[0] = undefined_name;\n}\n}\n')
    line = str(err.value)
    assert "\n" not in line and line.startswith("line 3") and "undefined_name" in line, line


@on_cpu
def test_without_a_compiler_one_line_says_what_to_install(monkeypatch):
    monkeypatch.setattr(compiler, "find_compiler", lambda: None)
    monkeypatch.delenv(compiler.ENV, raising=False)
    why = cudacpu.available()
    assert why == "no C++ compiler for the CPU emulation of CUDA C: pip install ziglang (or set LABKIT_CXX)"
    assert stages.unavailable(("cuda_c",)) == why
    with pytest.raises(cudacpu.NoCompiler, match="pip install ziglang"):
        gpu.raw_module('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', ("-DX=1",))
    s06 = lk.from_stage("06")
    line = str(lk.check.check_variant(s06.VARIANTS["const_cuda_c"], quiet=True)[0])
    assert line == f"06 const_cuda_c: FAIL (skipped: {why})", line


@on_cpu
def test_a_named_compiler_that_is_not_there_says_so(monkeypatch):
    monkeypatch.setenv(compiler.ENV, "/nonexistent/c++")
    compiler.find_compiler.cache_clear()
    try:
        assert cudacpu.available().startswith("LABKIT_CXX=/nonexistent/c++ names no compiler")
    finally:
        monkeypatch.delenv(compiler.ENV)
        compiler.find_compiler.cache_clear()


def _mappings() -> int:
    return len(Path("/proc/self/maps").read_text().splitlines())


@on_cpu
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts the process's mappings in /proc/self/maps")
def test_a_launch_gives_its_thread_stacks_back():
    """Every thread's stack has a guard page, a mapping of its own; a process that loads many kernels' libraries
    (a timing tool's configurations) hit the kernel's mapping limit when each library kept its stacks."""
    kept = []
    before = _mappings()
    for k in range(3):  # three libraries of their own, each launched with 1024 threads
        m = cudacpu.Module(NEIGHBOURS, (f"-DTHE_COPY={k}", ))
        out = np.zeros(1024, np.float32)
        m.get_function("store_at")((1,), (1024,), (out,))
        assert (out == 1.0).all()
        kept.append(m)
    assert _mappings() - before < 300, "the stacks of finished launches are still mapped"


def test_the_kits_own_sources_compile_once_per_source_and_options_and_students_each_call():
    """``gpu.kit_module`` (Winograd, the SGEMM, the tensor cores) caches by source and options; ``raw_module`` (a
    student's source, whose ``__constant__`` memory is theirs) compiles each call."""
    src = 'extern "C" __global__ void k(float* x) { x[0] = X; }'
    one = gpu.kit_module(src, ("-DX=1",))
    assert gpu.kit_module(src, ("-DX=1",)) is one and gpu.kit_module(src, ["-DX=1"]) is one
    assert gpu.kit_module(src, ("-DX=2",)) is not one and gpu.kit_module(src + " ", ("-DX=1",)) is not one
    assert gpu.raw_module(src, ("-DX=1",)) is not gpu.raw_module(src, ("-DX=1",))
