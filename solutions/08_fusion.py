# %% [markdown]
# # 08 — Fusion: no unroll buffer, no extra passes
#
# **Learning goals**
# - Gather each tile of the unrolled matrix from the input as the product needs it (implicit GEMM): stage 07's
#   product without its buffer.
# - Fuse the epilogue: bias, activation and, for `cifar10`, the 2×2 max-pool, written once from the block's registers
#   and shared memory instead of three more passes over global memory.
# - Parallelize the reduction the other way, over input channels with atomics, and measure it against the implicit
#   GEMM: its time, its atomic additions per output element, and the pass that zeroes `out`.
#
# **Context** ([reference figures](../docs/reference_figures.md), section B: ECE408, Fashion-MNIST, op time in seconds,
# conv1 / conv2):
#
# | version | 100 images | 1000 images | 10000 images |
# |---|---|---|---|
# | unroll + shared-memory matmul | 0.002020 / 0.003060 | 0.016756 / 0.026879 | 0.119580 / 0.267594 |
# | fused unroll + matmul | 0.000241 / 0.000743 | 0.002141 / 0.007097 | 0.021169 / 0.068800 |
# | input-channel reduction with atomics | 0.003491 / 0.004188 | 0.003720 / 0.011611 | 0.038003 / 0.126577 |

# %%
import numpy as np
import labkit as lk

lk.hello("08")
net = lk.get_net("cifar10")

# %% [markdown]
# ## Fusing a layer group
#
# A variant with `fuse=("relu", "tanh", "pool")` hands its conv function the activation and the pooling that follow the
# convolution: the engine calls it once per group, as `fn(x, w, b, out, pad, stride, act, pool)` (`act` 0, 1 for ReLU,
# 2 for tanh; `pool` the window, 0 for none), with `out` shaped like the pooled output. The checks compare it with the
# reference through the whole group.
#
# ## Task 1 — implicit GEMM with a fused epilogue
#
# `make_fused_kernel(T, K, ACT, POOL)` is stage 07's tiled product `W · X + b` per image, with two changes:
#
# - **Gather.** Thread `(ty, tx)` loads `Xt[ty, tx] = X[k0 + ty, col]` straight from `x`: row `k = k0 + ty` is
#   `(c, p, q)`, its column `col` is the output pixel `(i, j)` this thread computes (decoded once, before the loop),
#   and the value is `x[n, c, i·s + p − pad, j·s + q − pad]`, or 0 in the padding or past the edge. Roughly {{lines:gather}}.
# - **Epilogue.** With `POOL`, the columns are ordered so that `POOL²` neighbouring columns are one pooling window
#   (given: the decode of `col`). Every thread puts `acc + b[m]` into `Ot[ty, tx]`; `syncthreads`; the first thread of
#   each window takes the window's maximum, applies the activation (`max(v, 0)` or `math.tanh`: both keep the order, so
#   after the maximum is right) and writes one pooled output. Without `POOL`, each thread applies the activation and
#   writes its own output. Roughly {{lines:epilogue}}.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/08_task1.png)

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk


def make_fused_kernel(T, K, ACT, POOL):
    WIN = POOL * POOL if POOL else 1

    @cuda.jit
    def conv_fused_kernel(x, w, b, out, pad, stride):
        Wt = cuda.shared.array((T, T), float32)
        Xt = cuda.shared.array((T, T), float32)
        Ot = cuda.shared.array((T, T), float32)
        N, C, H, W = x.shape
        M = w.shape[0]
        Ho, Wo = out.shape[2], out.shape[3]
        KK = C * K * K
        cols = Ho * Wo * WIN
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        m, col, n = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx, cuda.blockIdx.z
        cell, pos = col // WIN, col % WIN  # with POOL: the pooled output and the place in its window
        if POOL:
            i, j = (cell // Wo) * POOL + pos // POOL, (cell % Wo) * POOL + pos % POOL
        else:
            i, j = col // Wo, col % Wo
        acc = float32(0.0)
        for k0 in range(0, KK, T):
            kw = k0 + tx
            Wt[ty, tx] = w[m, kw // (K * K), (kw // K) % K, kw % K] if m < M and kw < KK else float32(0.0)
            ### BEGIN SOLUTION gather
            k = k0 + ty
            c, p, q = k // (K * K), (k // K) % K, k % K
            r, s = i * stride + p - pad, j * stride + q - pad
            inside = k < KK and col < cols and 0 <= r < H and 0 <= s < W
            Xt[ty, tx] = x[n, c, r, s] if inside else float32(0.0)
            ### END SOLUTION
            cuda.syncthreads()
            for kk in range(T):
                acc += Wt[ty, kk] * Xt[kk, tx]
            cuda.syncthreads()
        ### BEGIN SOLUTION epilogue
        v = acc + b[m] if m < M else float32(0.0)
        if POOL:
            Ot[ty, tx] = v
            cuda.syncthreads()
            if pos == 0 and m < M and col < cols:
                for e in range(1, WIN):
                    v = max(v, Ot[ty, tx + e])
                if ACT == 1:
                    v = max(v, float32(0.0))
                elif ACT == 2:
                    v = math.tanh(v)
                out[n, m, cell // Wo, cell % Wo] = v
        elif m < M and col < cols:
            if ACT == 1:
                v = max(v, float32(0.0))
            elif ACT == 2:
                v = math.tanh(v)
            out[n, m, i, j] = v
        ### END SOLUTION

    return conv_fused_kernel


T = lk.simulator.threads(16, 8)  # a multiple of 4, so whole 2x2 windows sit in one block row
KERNELS = {}


def conv_fused(x, w, b, out, pad, stride, act=0, pool=0):
    N, M, Ho, Wo = out.shape
    K = w.shape[2]
    key = (K, act, pool)
    if key not in KERNELS:
        KERNELS[key] = make_fused_kernel(T, K, act, pool)
    cols = Ho * Wo * (pool * pool if pool else 1)
    lk.gpu.launch_grid(KERNELS[key], (math.ceil(cols / T), math.ceil(M / T), N), (T, T), x, w, b, out, pad, stride)


# %%
# What one thread of your fused kernel reads and writes: yours beside the spec's
lk.show.task("08", "fused")


# %% [markdown]
# ## Task 2 — the reduction over input channels, with atomics
#
# `conv_atomic_kernel`: one thread per (output element, input channel) — the input channel `c = t % C` fastest — sums
# its channel's `K·K` products and adds them into `out` with `cuda.atomic.add(out, (n, m, i, j), acc)`; the thread of
# channel 0 also adds the bias. `out` must start at zero (`zero_kernel`, given). Roughly {{lines:atomic}}.
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/08_task2.png)

# %% tags=["kernel"]
@cuda.jit
def zero_kernel(out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = 0.0


@cuda.jit
def conv_atomic_kernel(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    t = cuda.grid(1)
    if t < N * M * Ho * Wo * C:
        ### BEGIN SOLUTION atomic
        c, e = t % C, t // C
        j, i, m, n = e % Wo, (e // Wo) % Ho, (e // (Wo * Ho)) % M, e // (Wo * Ho * M)
        acc = b[m] if c == 0 else float32(0.0)
        for p in range(K):
            for q in range(K):
                r, s = i * stride + p - pad, j * stride + q - pad
                if 0 <= r < H and 0 <= s < W:
                    acc += x[n, c, r, s] * w[m, c, p, q]
        cuda.atomic.add(out, (n, m, i, j), acc)
        ### END SOLUTION


def conv_atomic(x, w, b, out, pad, stride):
    lk.gpu.launch(zero_kernel, out.size, lk.gpu.flat(out))
    lk.gpu.launch(conv_atomic_kernel, out.size * x.shape[1], x, w, b, out, pad, stride)


# %%
# What one thread of your atomic kernel reads and adds: yours beside the spec's
lk.show.task("08", "atomic")


# %% tags=["kernel"]
def variant(conv, note, **kw):
    return lk.Variant({**lk.kernels.GIVEN, "conv": conv}, arrays="device", note=note, **kw)


VARIANTS = lk.variants("08", {
    "implicit_gemm": variant(conv_fused, "tiles of the unrolled matrix gathered from x in the product"),
    "fused": variant(conv_fused, "implicit GEMM with bias, activation and max-pool in the epilogue",
                     fuse=("relu", "tanh", "pool")),
    "atomic_channels": variant(conv_atomic, "one thread per (output, input channel), atomicAdd into out"),
})

# %% [markdown]
# ## Check
#
# The fused variant is checked group by group (`conv1+relu1+pool1` against the reference through all three). On the
# simulator every launch is watched: atomics are allowed to meet in one element, plain writes are not.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)

# %% [markdown]
# ## Count
#
# Global loads and stores per output element of conv2: stage 07 (unroll, then product: the buffer is written and read
# back), the implicit GEMM, and the atomics (one atomic store per input channel and output element).

# %%
s07 = lk.from_stage("07")
if checked.passed("implicit_gemm") and checked.passed("atomic_channels"):
    lk.counts.show("08", {"07 unroll + tiled": s07.conv_unroll_tiled, "08 implicit GEMM": conv_fused,
                          "08 atomics": conv_atomic}, layer="conv2")
else:
    print("not counted yet: implicit_gemm or atomic_channels does not pass its check; make the self-check pass first")

# %% [markdown]
# ## Measure

# %%
runs = lk.notebook.measure(VARIANTS, checked)

# %% [markdown]
# ## Plot

# %%
lk.notebook.ladder_and_roofline("08", runs)

# %% [markdown]
# ## Reflect
#
# 1. The implicit GEMM loads each input value once per `X` tile that needs it, from global memory (through the cache):
#    compare its global loads per output element with stage 07's unroll + product. Which traffic disappeared?
# 2. In the fused run, the ReLU and pool lines take no time of their own: how much did the conv layer's time grow, and
#    how much did the three layers' sum shrink? Where did the pooled layers' memory traffic go?
# 3. Why do atomics lose here, even though every thread does only `K·K` multiply-adds? Count, for conv2, how many
#    atomic additions land on one output element, and what `zero_kernel` and the atomics add in memory traffic.
# 4. The epilogue needs a `syncthreads` that every thread of the block must reach: what goes wrong if it sits inside
#    `if m < M and col < cols`? (Try it: the simulator's race check tells you where.)
#
# ### What the kit measured

# %%
lk.measured.show("08", compare=(("08 fused", "08 implicit_gemm"), ("08 atomic_channels", "08 implicit_gemm"),
                                ("08 fused", "07 unroll_cublas"), ("08 fused", "06 const_uniform")));

# %% [markdown]
# Fusing removes whole passes over memory: no unroll buffer, no separate activation and pooling kernels; the lines
# above show what that won over stage 07, and that stage 06's direct kernel is still faster. What remains is the
# product itself, and how well its tiles fit each layer's shape (12, 20 or 24 maps leave rows of a 16-row tile idle): stage 09 chooses kernels and tile sizes per
# layer, measured.
