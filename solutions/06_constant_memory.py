# %% [markdown]
# # 06 — Constant memory: weights every thread reads at once
#
# **Learning goals**
# - Put a layer's weights in constant memory, in numba (a kernel specialized per layer, `cuda.const.array_like`) and in
#   CUDA C (a `__constant__` array filled at run time through `cupy.RawModule`).
# - Measure what constant memory changes for a warp whose threads read the same weight at each step, and for one
#   whose threads read different weights.
# - Count the constant loads a design makes, and read the compiler's resource report.
#
# **Context** ([reference figures](../docs/reference_figures.md), section B: ECE408, Fashion-MNIST, op time in seconds,
# conv1 / conv2):
#
# | version | 100 images | 1000 images | 10000 images |
# |---|---|---|---|
# | basic GPU kernel | 0.000295 / 0.000998 | 0.003069 / 0.010254 | 0.031567 / 0.098181 |
# | shared-memory input + constant-memory weights | 0.002797 / 0.003546 | 0.008630 / 0.026650 | 0.086491 / 0.258496 |

# %%
import numpy as np
import labkit as lk

lk.hello("06")
net = lk.get_net("cifar10")

# %% [markdown]
# ## Constant memory
#
# 64 KB of device memory, read-only for kernels, cached per multiprocessor, with one property that matters here: when
# the threads of a warp read the *same* address, one read serves them all (a broadcast); different addresses are served
# one after the other. The weights of one layer fit (cifar10's conv3: 20·20·5·5·4 = 40 KB). In numba, constant arrays
# are fixed when a kernel compiles: `cuda.const.array_like(W)` copies a host array `W` into the kernel, so each layer
# gets a kernel of its own. In CUDA C, a `__constant__` array can be filled at run time (`cudaMemcpyToSymbol`; in cupy,
# `module.get_global("name")` gives its address, and `lk.gpu.upload_constant(module, "name", w)` copies into it).
#
# ## Given: stage 04's pad kernel

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk

s04 = lk.from_stage("04")


def padded(x, pad):
    """Stage 04's pad-once copy of x (or x itself when pad is 0)."""
    if not pad:
        return x
    N, C, H, W = x.shape
    xp = lk.gpu.buffer("padded", (N, C, H + 2 * pad, W + 2 * pad))
    lk.gpu.launch(s04.pad_kernel, xp.size, x, xp, pad)
    return xp


# %% [markdown]
# ## Task 1 — a kernel with the weights in constant memory
#
# `make_const_kernel(W, maps_fastest)` returns a thread-per-output kernel for one layer whose weights `W` (a host array
# `M, C, K, K`) live in constant memory: `wc = cuda.const.array_like(W)`. Thread `t` finds its output element two ways,
# chosen when the kernel compiles:
#
# - `maps_fastest=False`: `j = t % Wo`, then `i`, `m`, `n` (stage 04's order): the 32 threads of a warp are neighbouring
#   pixels of *one* map and read the same `wc[m, c, p, q]` at every step: a broadcast.
# - `maps_fastest=True`: `m = t % M`, then `j`, `i`, `n`: neighbouring threads compute different maps and read
#   *different* weights at every step.
#
# Then `acc = b[m] + Σ xp[n, c, i·s + p, j·s + q] · wc[m, c, p, q]` over the padded input. Roughly {{lines:const_kernel}}. Budget:
# `C·K·K` global loads and `C·K·K` constant loads per output element.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/06_task1.png)

# %% tags=["kernel"]
def make_const_kernel(W, maps_fastest):
    M, C, K, _ = W.shape

    @cuda.jit
    def conv_const_kernel(xp, b, out, stride):
        wc = cuda.const.array_like(W)
        N, _, Ho, Wo = out.shape
        t = cuda.grid(1)
        if t < N * M * Ho * Wo:
            ### BEGIN SOLUTION const_kernel
            if maps_fastest:
                m = t % M
                j = (t // M) % Wo
                i = (t // (M * Wo)) % Ho
                n = t // (M * Wo * Ho)
            else:
                j = t % Wo
                i = (t // Wo) % Ho
                m = (t // (Wo * Ho)) % M
                n = t // (Wo * Ho * M)
            acc = b[m]
            for c in range(C):
                for p in range(K):
                    for q in range(K):
                        acc += xp[n, c, i * stride + p, j * stride + q] * wc[m, c, p, q]
            out[n, m, i, j] = acc
            ### END SOLUTION

    return conv_const_kernel


# %% [markdown]
# The host function keeps one compiled kernel per weight array it has seen (the engine hands every pass the same device
# array, so a run compiles each layer once; a check's fresh weights compile a new one), copies the weights to the host
# to compile them in, pads the input with stage 04's kernel, and launches one thread per output element.

# %% tags=["kernel"]
KERNELS = lk.const_kernels.PerWeights(make_const_kernel)  # one compile per weights (and order), found on every call


def conv_const(maps_fastest):
    def const_conv(x, w, b, out, pad, stride):
        lk.gpu.launch(KERNELS(w, maps_fastest), out.size, padded(x, pad), b, out, stride)

    const_conv.__name__ = "conv_const_maps_fastest" if maps_fastest else "conv_const"
    return const_conv


conv_const_uniform, conv_const_divergent = conv_const(False), conv_const(True)

# %%
# What warp 0 reads, in both orders: yours beside the spec's
lk.show.task("06", "const_kernel")

# %% [markdown]
# ## Task 2 — the same kernel in CUDA C, with a `__constant__` array
#
# Write the kernel body in `CUDA_SOURCE`: the uniform mapping (`j` fastest) on flat pointers, reading the weights from
# `c_w` (indices `((m·C + c)·K + p)·K + q`) and the padded input from `xp` (`((n·C + c)·Hp + i·s + p)·Wp + j·s + q`).
# Roughly {{lines:const_c}}. `conv_const_c` (given) copies the weights into `c_w` with one device-to-device copy and launches it
# through `lk.gpu.launch_raw`. On a GPU it runs through cupy; elsewhere it is compiled for the CPU and checked there
# (its check lines say "CPU emulation of CUDA C"), or skipped with a line saying what to install.
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/06_task2.png)

# %% tags=["kernel"]
CUDA_SOURCE = r"""
extern "C" {
__constant__ float c_w[16384];  // 64 KB: the most constant memory a kernel may use

__global__ void conv_const_c(const float* xp, const float* b, float* out, int N, int C, int Hp, int Wp,
                             int M, int K, int Ho, int Wo, int stride) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * M * Ho * Wo) return;
    /// BEGIN SOLUTION const_c
    int j = t % Wo, i = (t / Wo) % Ho, m = (t / (Wo * Ho)) % M, n = t / (Wo * Ho * M);
    float acc = b[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q)
                acc += xp[((n * C + c) * Hp + i * stride + p) * Wp + j * stride + q] * c_w[((m * C + c) * K + p) * K + q];
    out[((n * M + m) * Ho + i) * Wo + j] = acc;
    /// END SOLUTION
}
}
"""
MODULE = []  # compiled on first use: through cupy on a GPU, for the CPU elsewhere


def conv_const_c(x, w, b, out, pad, stride):
    if not MODULE:
        MODULE.append(lk.gpu.raw_module(CUDA_SOURCE))
    module = MODULE[0]
    xp = padded(x, pad)
    N, C, Hp, Wp = xp.shape
    M, _, K, _ = w.shape
    _, _, Ho, Wo = out.shape
    if w.size > 16384:
        raise ValueError(f"{w.size} weights do not fit in 64 KB of constant memory")
    lk.gpu.upload_constant(module, "c_w", w)
    args = (xp, b, out, *(np.int32(v) for v in (N, C, Hp, Wp, M, K, Ho, Wo, stride)))
    lk.gpu.launch_raw(module.get_function("conv_const_c"), lk.gpu.blocks(out.size), lk.gpu.TPB, args)


# %%
# What one thread of your CUDA C kernel reads and writes: yours beside the spec's
lk.show.task("06", "const_c")


# %% tags=["kernel"]
def variant(conv, note, **kw):
    return lk.Variant({**lk.kernels.GIVEN, "conv": conv}, arrays="device", note=note, **kw)


VARIANTS = lk.variants("06", {
    "const_uniform": variant(conv_const_uniform, "weights in constant memory, a warp reads one weight at a time"),
    "const_divergent": variant(conv_const_divergent, "weights in constant memory, a warp reads different weights"),
    "const_cuda_c": variant(conv_const_c, "CUDA C through cupy.RawModule, __constant__ weights", requires=("cuda_c",)),
})

# %% [markdown]
# ## Check
#
# Each function against the float64 reference (on the simulator: shrunk, and watched for races), each variant's whole
# forward pass, and whether the kernels really read constant memory (on a GPU: the compiled kernel's constant-memory
# size; on the simulator: its constant loads).

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)
for conv in (conv_const_uniform, conv_const_divergent):
    lk.check.check_technique(conv, "cifar10", "conv2", "constant")

# %% [markdown]
# ## Count
#
# Global and constant loads per output element of stage 04's kernel and of the constant-memory one, on a shrunk conv2:
# the weights moved from global to constant memory; the input loads stayed.

# %%
if checked.passed("const_uniform"):
    lk.counts.show("06", {"04 padded": s04.conv_padded, "06 const": conv_const_uniform}, layer="conv2")
else:
    print("not counted yet: const_uniform does not pass its check; make the self-check pass first")

# %% [markdown]
# ## Measure
#
# The whole network with each variant on the first 1200 CIFAR-10 images and (on a GPU) all 50000, and Fashion-MNIST's
# 10000 test images.

# %%
runs = lk.notebook.measure(VARIANTS, checked)

# %% [markdown]
# ## Plot

# %%
lk.notebook.ladder_and_roofline("06", runs)

# %% [markdown]
# ## Reflect
#
# 1. `const_divergent` and `const_uniform` do the same arithmetic and the same loads. From your measurements, what does
#    a divergent constant read cost? A warp of `const_divergent` covers how many different maps of conv2 (`M = 20`)?
# 2. The study's "shared-memory input + constant-memory weights" was slower than its basic kernel (section B). Which
#    of its costs does your table show, and which could it not show?
# 3. Each numba kernel here is compiled for one layer's weights. What does that cost the first pass, and why does it not
#    show in the timed passes? When would compiling per layer be a bad idea?
# 4. The CUDA C variant fills `c_w` with one copy per call. Where does that copy sit on the GPU's timeline relative to
#    the kernels before it, and why can it not overlap a kernel still reading `c_w`?
#
# ### What the kit measured

# %%
lk.measured.show("06", compare=(("06 const_divergent", "06 const_uniform"),));

# %% [markdown]
# Constant memory pays when a warp's threads read the same address at the same step, and it costs when they do not:
# the same weights, read in another order, can take several times longer. Stage 07 turns the convolution into a matrix
# multiplication, where each weight is reused across a whole tile of outputs from shared memory.
