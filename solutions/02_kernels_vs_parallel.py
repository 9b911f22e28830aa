# %% [markdown]
# # 02 — Kernels vs parallel: who finds the parallelism?
#
# **Learning goals**
# - Ask numba to parallelize your stage-01 loop nest by itself (`parallel=True`), then say yourself which loop is
#   parallel (`prange`): the images, the output maps, or only the inner reduction.
# - Map the same loop nest onto a CUDA grid three ways: the reduction in parallel (one block per output element),
#   one block per output map, one thread per output element.
# - Time the three mappings, count what each launches, and explain the differences from the counts.
#
# **Context** ([reference figures](../docs/reference_figures.md), section A: OpenACC on a V100, 1200 images,
# managed memory):
#
# | version | what the compiler made parallel | total s | conv1 s |
# |---|---|---|---|
# | serial C | nothing | 38.17 | 12.31 |
# | `kernels` | only the inner reduction: `vector(128) collapse(3)` | 54.50 | 29.93 |
# | `kernels` + `loop independent` | the outer loop: `gang, vector(128)` | 13.94 | — |
# | `parallel loop` | the outer loops | 7.48 | — |
#
# For the outer loops the compiler said "Loop carried dependence due to exposed use of Y prevents parallelization".

# %%
import numba
import numpy as np

import labkit as lk

lk.hello("02")
net = lk.get_net("cifar10")
print(f"numba {numba.__version__}: {numba.get_num_threads()} CPU threads for parallel regions")

# %% [markdown]
# # Part 1 — the CPU
#
# ## Given: stage 01, and what `parallel=True` finds in it
#
# `lk.from_stage("01")` loads the kit's solution of stage 01: `conv_point`, `conv_forward` and the cheap layers.
# `conv_parallel_auto` is `conv_forward` compiled again with `parallel=True`: numba decides what may run in parallel.
# All CPU variants here get the whole batch in one call (a parallel image loop needs more than one image).

# %% tags=["kernel"]
from numba import cuda, float32, njit, prange

import labkit as lk

s01 = lk.from_stage("01")
conv_point = s01.conv_point
conv_parallel_auto = njit(parallel=True)(s01.conv_forward.py_func)

# %%
lk.notebook.parallel_diagnostics(conv_parallel_auto, level=4)


# %% [markdown]
# ## Task 1 — `prange` over the images, over the output maps
#
# Write `conv_prange_n` (the image loop is a `prange`) and `conv_prange_m` (a serial image loop; inside it, the map
# loop is a `prange`: one parallel region per image). Both write `b[m] + conv_point(...)` for every output element,
# as stage 01 did. `conv_prange_n` takes roughly {{lines:prange_n}}, `conv_prange_m` roughly {{lines:prange_m}}. A `prange` is your promise that no two iterations write the same element:
# numba does not check it.
#
# ![Task 1: which CPU thread does what, drawn from the kit's solution](figures/02_task1.png)

# %% tags=["kernel"]
@njit(parallel=True)
def conv_prange_n(x, w, b, out, pad, stride):
    N, M, Ho, Wo = out.shape
    ### BEGIN SOLUTION prange_n
    for n in prange(N):
        for m in range(M):
            for i in range(Ho):
                for j in range(Wo):
                    out[n, m, i, j] = b[m] + conv_point(x, w, n, m, i, j, pad, stride)
    ### END SOLUTION


@njit(parallel=True)
def conv_prange_m(x, w, b, out, pad, stride):
    N, M, Ho, Wo = out.shape
    ### BEGIN SOLUTION prange_m
    for n in range(N):
        for m in prange(M):
            for i in range(Ho):
                for j in range(Wo):
                    out[n, m, i, j] = b[m] + conv_point(x, w, n, m, i, j, pad, stride)
    ### END SOLUTION


# %%
# Which CPU thread writes which outputs: yours beside the spec's
lk.show.task("02", "prange")


# %% [markdown]
# ## Task 2 — only the reduction in parallel
#
# `conv_prange_reduction`: serial loops over `n, m, i, j`; for each output element one `prange(C·K·K)` over the
# flattened reduction, like OpenACC's `collapse(3)`: recover `c = t // (K·K)`, `p = (t // K) % K`, `q = t % K`, skip
# the taps in the padding, and add into a scalar with `+=`. numba turns that scalar into a reduction (each thread sums
# its share; the shares are added when the loop ends: OpenACC's `reduction(+:sum)`). Roughly {{lines:prange_reduction}}.
#
# ![Task 2: which CPU thread does what, drawn from the kit's solution](figures/02_task2.png)

# %% tags=["kernel"]
@njit(parallel=True)
def conv_prange_reduction(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    ### BEGIN SOLUTION prange_reduction
    KK = K * K
    for n in range(N):
        for m in range(M):
            for i in range(Ho):
                for j in range(Wo):
                    acc = b[m]
                    for t in prange(C * KK):
                        c, p, q = t // KK, (t // K) % K, t % K
                        r, col = i * stride + p - pad, j * stride + q - pad
                        if 0 <= r < H and 0 <= col < W:
                            acc += x[n, c, r, col] * w[m, c, p, q]
                    out[n, m, i, j] = acc
    ### END SOLUTION


# %%
# Which CPU thread sums which terms of one output: yours beside the spec's
lk.show.task("02", "prange_reduction")

# %%
for fn in (conv_prange_n, conv_prange_reduction):
    lk.notebook.parallel_diagnostics(fn, level=1)

# %% [markdown]
# # Part 2 — the GPU: three ways to map the loop nest onto a grid
#
# The loop nest has four independent loops (`n, m, i, j`: every output element is its own sum) and one reduction
# (`c, p, q`: 75 terms for conv1, 400 for conv2 and conv3). A launch is a grid of blocks of threads; a mapping says
# which loops become blocks, which become threads, and which stay loops inside a thread. `conv_point_gpu` is your
# stage-01 `conv_point`, compiled as a CUDA device function (`lk.gpu.device_function`): the same arithmetic, called
# from a kernel. Kernels take device arrays; `lk.gpu.launch(kernel, threads, *args)` starts enough blocks of
# `lk.gpu.TPB` threads, `lk.gpu.launch_grid(kernel, grid, block, *args)` exactly the grid you give.
#
# | variant | blocks | threads of a block | loops left inside a thread |
# |---|---|---|---|
# | `gpu_reduction` (the `kernels` mapping) | one per output element | share its `C·K·K` terms, then a tree sum | a strided share of the terms |
# | `gpu_block_per_map` (`gang` on `m`) | one per (map, image) | stride over the `Ho·Wo` pixels | the whole reduction, pixel after pixel |
# | `gpu_thread_per_output` (`parallel loop`) | enough to cover all outputs | one output element each | the whole reduction |

# %% tags=["kernel"]
conv_point_gpu = lk.gpu.device_function(conv_point)
RED_MAX = 128  # shared-memory slots of the reduction kernel: the study's vector(128)
RED_THREADS = lk.simulator.threads(RED_MAX)  # 128 on a GPU; the simulator waits on every thread at each barrier


# %% [markdown]
# ## Task 3 — one thread per output element; one block per output map
#
# - `conv_thread_per_output_kernel`: thread `e = cuda.grid(1)` finds its `(n, m, i, j)` from its flat index in `out`
#   (`j = e % Wo`, then `i`, `m`, `n`) and writes `b[m] + conv_point_gpu(...)`; the spare threads of the last block
#   write nothing. The host function launches one thread per element of `out`. Roughly {{lines:thread_kernel+thread_launch}}.
# - `conv_block_per_map_kernel`: block `(m, n)` (`blockIdx.x`, `blockIdx.y`) computes the map `out[n, m]`; its
#   threads stride over the pixels (`e = threadIdx.x, threadIdx.x + blockDim.x, …`). The host function launches the
#   grid `(M, N)` of `lk.gpu.TPB` threads. Roughly {{lines:map_kernel+map_launch}}.
#
# Both read 2·C·K·K values from global memory per output element (no value is reused across threads yet: stage 05).
#
# ![Task 3: what the threads read and write, drawn from the kit's solution](figures/02_task3.png)

# %% tags=["kernel"]
@cuda.jit
def conv_thread_per_output_kernel(x, w, b, out, pad, stride):
    N, M, Ho, Wo = out.shape
    e = cuda.grid(1)
    ### BEGIN SOLUTION thread_kernel
    if e < N * M * Ho * Wo:
        j = e % Wo
        i = (e // Wo) % Ho
        m = (e // (Wo * Ho)) % M
        n = e // (Wo * Ho * M)
        out[n, m, i, j] = b[m] + conv_point_gpu(x, w, n, m, i, j, pad, stride)
    ### END SOLUTION


def conv_thread_per_output(x, w, b, out, pad, stride):
    ### BEGIN SOLUTION thread_launch
    lk.gpu.launch(conv_thread_per_output_kernel, out.size, x, w, b, out, pad, stride)
    ### END SOLUTION


@cuda.jit
def conv_block_per_map_kernel(x, w, b, out, pad, stride):
    N, M, Ho, Wo = out.shape
    m, n = cuda.blockIdx.x, cuda.blockIdx.y
    ### BEGIN SOLUTION map_kernel
    for e in range(cuda.threadIdx.x, Ho * Wo, cuda.blockDim.x):
        i, j = e // Wo, e % Wo
        out[n, m, i, j] = b[m] + conv_point_gpu(x, w, n, m, i, j, pad, stride)
    ### END SOLUTION


def conv_block_per_map(x, w, b, out, pad, stride):
    N, M = out.shape[0], out.shape[1]
    ### BEGIN SOLUTION map_launch
    lk.gpu.launch_grid(conv_block_per_map_kernel, (M, N), lk.gpu.TPB, x, w, b, out, pad, stride)
    ### END SOLUTION


# %%
# What one thread of each mapping reads and writes: yours beside the spec's
lk.show.task("02", "gpu_mappings")


# %% [markdown]
# ## Task 4 — only the reduction in parallel, on the GPU
#
# One block of `RED_THREADS` threads per output element: block `e` computes `out[n, m, i, j]` (the same decoding as
# Task 3). Thread `t` sums the terms `s = t, t + blockDim, …` of the flattened `C·K·K` reduction (skipping the
# padding) into `partial[t]`. Then halve: for `step = blockDim/2, blockDim/4, …, 1`, threads `t < step` add
# `partial[t + step]` into `partial[t]`, with a `cuda.syncthreads()` before the first step and after each one (every
# thread of the block must reach it, so keep it outside any `if`). Thread 0 writes `b[m] + partial[0]`. Roughly
# {{lines:tree}}.
#
# ![Task 4: what the threads read and write, drawn from the kit's solution](figures/02_task4.png)

# %% tags=["kernel"]
@cuda.jit
def conv_reduction_kernel(x, w, b, out, pad, stride):
    partial = cuda.shared.array(RED_MAX, float32)  # its size is fixed when the kernel compiles
    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    e, t = cuda.blockIdx.x, cuda.threadIdx.x
    ### BEGIN SOLUTION tree
    j = e % Wo
    i = (e // Wo) % Ho
    m = (e // (Wo * Ho)) % M
    n = e // (Wo * Ho * M)
    KK = K * K
    acc = float32(0.0)
    for s in range(t, C * KK, cuda.blockDim.x):
        c, p, q = s // KK, (s // K) % K, s % K
        r, col = i * stride + p - pad, j * stride + q - pad
        if 0 <= r < H and 0 <= col < W:
            acc += x[n, c, r, col] * w[m, c, p, q]
    partial[t] = acc
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            partial[t] += partial[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        out[n, m, i, j] = b[m] + partial[0]
    ### END SOLUTION


def conv_reduction(x, w, b, out, pad, stride):
    lk.gpu.launch_grid(conv_reduction_kernel, out.size, RED_THREADS, x, w, b, out, pad, stride)


# %%
# What one block's threads read and write, barrier by barrier: yours beside the spec's
lk.show.task("02", "tree")


# %% [markdown]
# ## The variants
#
# The CPU variants use stage 01's cheap layers; the GPU variants use the kit's GPU kernels for them
# (`lk.kernels.GIVEN`). As in the study, the GPU variants launch every layer once per image and copy in and out
# around every call (`lk.gpu.with_copies`: numpy arrays in, numpy arrays out): stage 04 removes those copies.

# %% tags=["kernel"]
def on_cpu(conv, note):
    return lk.Variant({**s01.CPU_LAYERS, "conv": conv}, target="cpu", note=note)


def on_gpu(conv, note):
    layers = {**lk.kernels.GIVEN, "conv": conv}
    return lk.Variant({kind: lk.gpu.with_copies(fn, kind) for kind, fn in layers.items()}, target="gpu",
                      per_image=True, note=note)


VARIANTS = lk.variants("02", {
    "serial": on_cpu(s01.conv_forward, "stage 01's loop nest, the whole batch per call"),
    "cpu_parallel_auto": on_cpu(conv_parallel_auto, "@njit(parallel=True) on stage 01's loop nest"),
    "cpu_prange_n": on_cpu(conv_prange_n, "prange over images"),
    "cpu_prange_m": on_cpu(conv_prange_m, "prange over output maps, one parallel region per image"),
    "cpu_prange_reduction": on_cpu(conv_prange_reduction, "prange over the C*K*K reduction, one region per output"),
    "gpu_reduction": on_gpu(conv_reduction, "one block per output element, threads share the reduction"),
    "gpu_block_per_map": on_gpu(conv_block_per_map, "one block per (map, image), threads over pixels"),
    "gpu_thread_per_output": on_gpu(conv_thread_per_output, "one thread per output element"),
})

# %% [markdown]
# ## Check
#
# Each line compares a function with the float64 reference on fresh random inputs (`PASS`: relative error near
# 1e-7), then each variant's whole forward pass. CPU variants run at the real layer sizes, batches 1, 3, 8 and 17;
# GPU variants too on a GPU, and on shrunk layers (at most 5 maps, 7×6 images, batches 1, 3 and 5) under the
# simulator. A function shared by several variants is checked once. A reduction that misses a barrier or a padding
# test fails here, sometimes at one batch size only.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS, "cifar10")

# %% [markdown]
# ## Measure: the CPU variants
#
# The first 1200 images of `data_batch_1` for every variant, the whole batch per call; `cpu_prange_reduction` opens
# and closes a parallel region per output element (22784 per image), so it runs on the first 4 images only. The table
# is therefore in milliseconds per image.

# %%
wl = lk.workload(net, 1200, target="cpu")
CPU = [name for name, v in VARIANTS.items() if v.target == "cpu"]
cpu_runs = lk.notebook.run_variants(VARIANTS, wl, checked, [n for n in CPU if n != "cpu_prange_reduction"])
cpu_runs |= lk.notebook.run_variants(VARIANTS, wl.first(4), checked, ["cpu_prange_reduction"])
lk.notebook.table(cpu_runs, per_image=True)

# %% [markdown]
# ## Measure: the GPU mappings
#
# The whole network with each mapping, one image per launch as the study ran it (under the simulator: two images of
# a shrunk net). Then the launches of each mapping for conv1 of one image, counted by `lk.gpu` as they happen.

# %%
wl_gpu = lk.workload(net, 1200, target="gpu")
GPU = [name for name, v in VARIANTS.items() if v.target == "gpu"]
gpu_runs = lk.notebook.run_variants(VARIANTS, wl_gpu, checked, GPU)
lk.notebook.table(gpu_runs, per_image=True)

# %%
# NBVAL_CHECK_OUTPUT
case = lk.check.layer_case("cifar10", "conv1", 1, np.random.default_rng(0), target="cpu")  # the real conv1, 1 image
print(f"{'conv1, one image':<24}{'launches':>9}{'blocks':>9}{'threads':>10}   ({case.expected.size} outputs, "
      f"{case.x.shape[1] * 25} terms each)")
for name, conv in (("gpu_reduction", conv_reduction), ("gpu_block_per_map", conv_block_per_map),
                   ("gpu_thread_per_output", conv_thread_per_output)):
    with lk.gpu.counting() as counts:
        try:
            lk.engine.call_layer(lk.gpu.with_copies(conv, "conv"), net.layer("conv1"), case.x, case.weights)
        except NotImplementedError:
            print(f"{name:<24}not implemented yet")
            continue
    print(f"{name:<24}{counts.launches:>9}{counts.blocks:>9}{counts.threads:>10}")
if lk.simulator.active():
    print(f"(simulated: gpu_reduction runs RED_THREADS = {RED_THREADS} threads per block here, {RED_MAX} on a GPU)")

# %% [markdown]
# ## Plot
#
# Left: the CPU variants on this machine. Right: the GPU mappings against the earlier stages, on this GPU, or (on a
# machine without one) the kit's committed GPU results.

# %%
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), layout="constrained")
plt.close(fig)
lk.plots.per_image_bars(cpu_runs, ax=left, title=f"CPU variants ({numba.get_num_threads()} threads)")
lk.notebook.ladder("02", runs=gpu_runs, ax=right)
fig

# %% [markdown]
# ## Reflect
#
# 1. Why does `gpu_reduction` lose? Use the counts: for conv1 of one image it starts a block of 128 threads per output
#    element, but conv1 has only 75 terms: how many threads add nothing? Then a tree of 7 levels, a barrier each, in
#    which half of the remaining threads drop out at every level. The study's `vector(128) collapse(3)` made the
#    same choice.
# 2. `gpu_block_per_map` launches only 16 blocks for conv1 of one image (20 for conv2 and conv3). An H100 has 132
#    multiprocessors: how many sit idle? What changes when a launch covers many images (stage 04)?
# 3. Why does `cpu_prange_m` gain less than `cpu_prange_n`, and what would happen with 32 cores? Why does
#    `cpu_prange_reduction` get slower, not faster, as you add threads?
# 4. numba never parallelized a `range` loop, and the OpenACC compiler refused the outer loops because it could not
#    rule out aliasing. Which is the safer default, and what does `prange` (or `loop independent`) ask you to
#    guarantee?
#
# ### What the kit measured

# %%
lk.measured.show("02", compare=(("02 cpu_prange_reduction", "02 serial"), ("02 gpu_reduction", "02 gpu_thread_per_output")));

# %% [markdown]
# With one image per launch and every call copying its inputs in and its output back, a conv layer of one image is a
# few microseconds of GPU arithmetic behind a launch and several copies, which cost about the same for every mapping:
# that is why the mappings end up closer together than their kernels are, and why stage 04 goes after launches and
# copies.
