# %% [markdown]
# # 05 — Shared memory: load once, use many times
#
# **Learning goals**
# - Tile the convolution: a block computes a tile of outputs of one map, after staging the input tile with its halo and
#   the map's weights in shared memory, one input channel at a time.
# - Predict, then count, the global loads per output element with and without tiling, and see the reuse factor.
# - Measure, per layer, what the saved loads are worth on the GPU, against stage 04's best.
#
# **Context** ([reference figures](../docs/reference_figures.md), section B: ECE408, Fashion-MNIST, op time in seconds,
# conv1 / conv2):
#
# | version | 100 images | 1000 images | 10000 images |
# |---|---|---|---|
# | basic GPU kernel (global memory only) | 0.000295 / 0.000998 | 0.003069 / 0.010254 | 0.031567 / 0.098181 |
# | shared-memory input + constant-memory weights | 0.002797 / 0.003546 | 0.008630 / 0.026650 | 0.086491 / 0.258496 |

# %%
import numpy as np
import labkit as lk

lk.hello("05")
net = lk.get_net("cifar10")

# %% [markdown]
# ## Why shared memory
#
# In stage 04 every thread reads its own `C·K·K` inputs and weights from global memory: conv2 of `cifar10` reads each
# input pixel `K·K = 25` times, once for every output whose window covers it, and each weight once per output pixel.
# A block of `T×T` threads computing a `T×T` tile of one output map needs only a `(T+K−1)×(T+K−1)` patch of each input
# channel (the tile plus its halo) and that map's `K×K` weights per channel: load them into shared memory once, with
# every thread helping, wait at a barrier, then every thread reads its `K·K` taps from shared memory.
#
# ## Given: stage 04's convolution and the kit's layers

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk

s04 = lk.from_stage("04")
conv_padded = s04.conv_padded  # stage 04's pad-once convolution: one thread per output, all reads from global


# %% [markdown]
# ## Task 1 — the tiled kernel
#
# Block `(tile, m, n)` has `T×T` threads; thread `(ty, tx)` computes `out[n, m, row0 + ty, col0 + tx]`. For each input
# channel `c`: all threads together load the `IN×IN` patch (`IN = T + K − 1`) starting at input row `row0 − pad`,
# column `col0 − pad` into `tile` (zero outside the image; thread `(ty, tx)` loads elements `e = ty·T + tx, e + T·T,
# …` of the patch), threads with `ty, tx < K` load `w[m, c, ty, tx]` into `wts`; `cuda.syncthreads()`; each thread adds
# its `K·K` products from shared memory; `cuda.syncthreads()` again before the next channel overwrites the tile. At
# the end, threads inside the output write `acc + b[m]`. Roughly {{lines:tiled_kernel}}. Budget per block and channel: `IN² + K²`
# global loads (fewer at the image border), `K²` shared loads per thread.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/05_task1.png)

# %% tags=["kernel"]
def make_tiled_kernel(T, K):
    """The tiled kernel for one tile size and one filter size: shared arrays need their sizes when it compiles."""
    IN = T + K - 1

    @cuda.jit
    def conv_tiled_kernel(x, w, b, out, pad):
        tile = cuda.shared.array((IN, IN), float32)
        wts = cuda.shared.array((K, K), float32)
        N, C, H, W = x.shape
        Ho, Wo = out.shape[2], out.shape[3]
        tiles_across = (Wo + T - 1) // T
        row0, col0 = (cuda.blockIdx.x // tiles_across) * T, (cuda.blockIdx.x % tiles_across) * T
        m, n = cuda.blockIdx.y, cuda.blockIdx.z
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        i, j = row0 + ty, col0 + tx
        acc = float32(0.0)
        ### BEGIN SOLUTION tiled_kernel
        for c in range(C):
            for e in range(ty * T + tx, IN * IN, T * T):
                r, q = row0 + e // IN - pad, col0 + e % IN - pad
                tile[e // IN, e % IN] = x[n, c, r, q] if 0 <= r < H and 0 <= q < W else float32(0.0)
            if ty < K and tx < K:
                wts[ty, tx] = w[m, c, ty, tx]
            cuda.syncthreads()
            if i < Ho and j < Wo:
                for p in range(K):
                    for q in range(K):
                        acc += tile[ty + p, tx + q] * wts[p, q]
            cuda.syncthreads()
        if i < Ho and j < Wo:
            out[n, m, i, j] = acc + b[m]
        ### END SOLUTION

    return conv_tiled_kernel


# %%
# What one thread of your tiled kernel reads and writes: yours beside the spec's
lk.show.task("05", "tiled_kernel")

# %% [markdown]
# ## Task 2 — the launch
#
# `conv_tiled(T)` returns the layer function of tile size `T`: it takes the kernel for `(T, K)` from `KERNELS` (making
# it on first use) and launches a grid of `(tiles, M, N)` blocks of `(T, T)` threads, where `tiles` covers `Ho × Wo`
# with `T × T` tiles (round up both ways). Our networks all have stride 1. Roughly {{lines:tiled_launch}}.
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/05_task2.png)

# %% tags=["kernel"]
KERNELS = {}  # (T, K) -> compiled kernel


def conv_tiled(T):
    def tiled_conv(x, w, b, out, pad, stride):
        N, M, Ho, Wo = out.shape
        K = w.shape[2]
        assert stride == 1, "the tiled kernel assumes stride 1"
        ### BEGIN SOLUTION tiled_launch
        if (T, K) not in KERNELS:
            KERNELS[(T, K)] = make_tiled_kernel(T, K)
        tiles = math.ceil(Ho / T) * math.ceil(Wo / T)
        lk.gpu.launch_grid(KERNELS[(T, K)], (tiles, M, N), (T, T), x, w, b, out, pad)
        ### END SOLUTION

    tiled_conv.__name__ = f"conv_tiled_{T}"
    return tiled_conv


conv_tiled_8, conv_tiled_16 = conv_tiled(8), conv_tiled(16)

VARIANTS = lk.variants("05", {
    "tiled_8": lk.Variant({**lk.kernels.GIVEN, "conv": conv_tiled_8}, arrays="device",
                          note="8x8 output tiles, input tile + halo and weights in shared memory"),
    "tiled_16": lk.Variant({**lk.kernels.GIVEN, "conv": conv_tiled_16}, arrays="device",
                           note="16x16 output tiles, input tile + halo and weights in shared memory"),
})

# %%
# What one block of your launch reads and writes: yours beside the spec's
lk.show.task("05", "tiled_launch")

# %% [markdown]
# ## Check
#
# Each function against the float64 reference on fresh inputs (real sizes and batches 1, 3, 8, 17 on a GPU; shrunk
# and 1, 3, 5 on the simulator, where every launch is also watched for races and missing barriers: drop one of the
# two `syncthreads` and see), each variant's whole forward pass, and whether the kernel really uses shared memory.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)
for conv in (conv_tiled_8, conv_tiled_16):
    lk.check.check_technique(conv, "cifar10", "conv2", "shared")


# %% [markdown]
# ## Task 3 — predict the global loads, then count them
#
# Write `predicted_loads(C, K, T, outputs, tiles)`: the global loads per output element of the tiled kernel, ignoring
# the image border: `tiles` blocks per map each load `C·(IN² + K²)` values, plus one bias load per output. For stage 04
# the prediction is `2·C·K·K + 1` (given). Roughly {{lines:predicted}}. The table counts every load and store on the simulator
# (`lk.counts`), on a shrunk conv2 of one image: compare, then explain the difference.

# %%
def predicted_loads(C, K, T, outputs, tiles):
    ### BEGIN SOLUTION predicted
    IN = T + K - 1
    return tiles * C * (IN * IN + K * K) / outputs + 1
    ### END SOLUTION


# %%
case = lk.check.layer_case("cifar10", "conv2", 1, np.random.default_rng(0), target="gpu")
_, C, Ho, Wo = case.x.shape[0], case.x.shape[1], case.expected.shape[2], case.expected.shape[3]
M, K = case.weights["conv2.weight"].shape[0], 5
try:
    predicted = {"04 padded": 2 * C * K * K + 1,
                 **{f"05 tiled {T}": predicted_loads(C, K, T, Ho * Wo, math.ceil(Ho / T) * math.ceil(Wo / T))
                    for T in (8, 16)}}
except NotImplementedError:
    predicted = {"04 padded": 2 * C * K * K + 1}
    print("predicted_loads is not implemented yet: only stage 04's prediction is shown")
if checked.passed("tiled_8"):
    lk.counts.show("05", {"04 padded": conv_padded, "05 tiled 8": conv_tiled_8, "05 tiled 16": conv_tiled_16},
                   layer="conv2", predicted=predicted)
else:
    print("not counted yet: tiled_8 does not pass its check; make the self-check pass first")

# %% [markdown]
# ## Measure
#
# The whole network with each tile size on the first 1200 CIFAR-10 images and (on a GPU) all 50000, then the same for
# Fashion-MNIST's 10000 test images. Under the report of each: the throughput of every layer.

# %%
runs = lk.notebook.measure(VARIANTS, checked)

# %% [markdown]
# ## Plot
#
# This stage against the earlier ones, and its conv layers on the device's roofline (this GPU, or the kit's committed
# GPU results on a machine without one).

# %%
lk.notebook.ladder_and_roofline("05", runs)

# %% [markdown]
# ## Reflect
#
# 1. Your table: how many times fewer global loads per output element does tiling make for conv2, and how close is it
#    to your prediction? Which loads does the prediction leave out, and which does it count that the kernel never
#    makes (think of the border)?
# 2. A block of `T×T` threads holds `(IN² + K²)·4` bytes of shared memory. For `T = 8` and `16`, how many blocks fit on
#    one multiprocessor (228 KB of shared memory, 2048 threads, on an H100)? Which limit binds first?
# 3. conv3 of `cifar10` has 8×8 outputs per map: what fraction of a 16×16 tile's threads compute nothing there? What
#    would you pick per layer (stage 09 does this for you)?
# 4. Thread `(ty, tx)` reads `tile[ty + p, tx + q]`: do the 32 threads of a warp hit 32 different shared-memory banks?
# 5. Fewer loads did not make every layer faster in the study's table (section B): name two costs the tiled kernel pays
#    that the stage-04 kernel does not.
#
# ### What the kit measured

# %%
lk.measured.show("05", compare=(("05 tiled_8", "05 tiled_16"),));

# %% [markdown]
# The saved loads matter where a layer waits on memory; the two barriers per channel, the threads that only load (the
# halo) and the partial tiles at the border cost time of their own. Stage 06 moves the weights out of the block's
# shared memory and into constant memory, where every thread reading the same weight gets it broadcast.
