# %% [markdown]
# # 09 — Per-layer tuning: a kernel and a tile size for each layer
#
# **Learning goals**
# - Declare a search space of kernels and tile sizes per layer and let an autotuner (`lk.tune`) check, then time,
#   every candidate; read which candidate it keeps for each layer and explain that choice from the layer's shape.
# - Write a kernel specialized per layer (compile-time sizes, weights in constant memory, one thread per pooled output
#   computing its whole 2×2 window for every map), in numba and in CUDA C, and measure what `__restrict__`,
#   `#pragma unroll` and compile-time constants change; then build a register-tile kernel in CUDA C in four small
#   steps, each checked on its own.
# - Put the whole course on one leaderboard, beside cuDNN.
#
# **Context** ([reference figures](../docs/reference_figures.md), section B: ECE408, Fashion-MNIST, 10000 images, op time
# in seconds, conv1 / conv2):
#
# | version | conv1 | conv2 |
# |---|---|---|
# | fused unroll + matmul | 0.021169 | 0.068800 |
# | per-layer kernels (tile 16 for 12 maps, 24 for 24 maps) | 0.021170 | 0.051712 |
# | + `__restrict__` and `#pragma unroll` | 0.028881 | 0.078382 |

# %%
import numpy as np
import labkit as lk

lk.hello("09")
net = lk.get_net("cifar10")

# %% [markdown]
# ## Given: the earlier stages' convolutions, in one calling convention
#
# Every candidate takes the fused convention (`fn(x, w, b, out, pad, stride, act, pool)`): stage 08's fused kernel
# natively, the others through `lk.kernels.as_fused` (the conv, then the kit's activation and pool kernels).

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk

s05, s06, s08 = lk.from_stage("05"), lk.from_stage("06"), lk.from_stage("08")
FUSE = ("relu", "tanh", "pool")


# %% [markdown]
# ## Task 1 — one thread per pooled output, every map at once
#
# `make_pooled_kernel(W, ACT, POOL)`: a kernel for one layer, with its weights `W` (`M, C, K, K`, host) in constant
# memory and `M, C, K` fixed when it compiles. Thread `t` owns output position `(n, pi, pj)` of the group (a pooled
# pixel, or a conv pixel when `POOL` is 1) and keeps `M·POOL²` sums in a local array: for every input channel it walks
# the `(K + POOL − 1)²` input values its window needs, loading each **once**, and adds it into every sum it belongs to
# (`wc[m, c, p − di, q − dj]` for window position `(di, dj)`). Then per map: the window's maximum, plus the bias, the
# activation, one write. Roughly {{lines:pooled}}. Budget per thread: `C·(K + POOL − 1)²` global loads for `M·POOL²` outputs.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/09_task1.png)

# %% tags=["kernel"]
@cuda.jit(device=True)
def activate(v, act):
    if act == 1:
        return max(v, float32(0.0))
    if act == 2:
        return math.tanh(v)
    return v


def make_pooled_kernel(W, ACT, POOL):
    M, C, K, _ = W.shape
    P = max(POOL, 1)
    SPAN = K + P - 1
    PP = P * P  # a local array's shape must be compile-time constants: plain ints, not an expression of them

    @cuda.jit
    def conv_pooled_kernel(x, b, out, pad):
        wc = cuda.const.array_like(W)
        acc = cuda.local.array((M, PP), float32)
        N, _, H, Wd = x.shape
        Ho, Wo = out.shape[2], out.shape[3]
        t = cuda.grid(1)
        if t < N * Ho * Wo:
            pj, pi, n = t % Wo, (t // Wo) % Ho, t // (Wo * Ho)
            ### BEGIN SOLUTION pooled
            for m in range(M):
                for e in range(P * P):
                    acc[m, e] = float32(0.0)
            for c in range(C):
                for p in range(SPAN):
                    r = pi * P + p - pad
                    for q in range(SPAN):
                        s = pj * P + q - pad
                        v = x[n, c, r, s] if 0 <= r < H and 0 <= s < Wd else float32(0.0)
                        for di in range(P):
                            for dj in range(P):
                                kp, kq = p - di, q - dj
                                if 0 <= kp < K and 0 <= kq < K:
                                    for m in range(M):
                                        acc[m, di * P + dj] += v * wc[m, c, kp, kq]
            for m in range(M):
                best = acc[m, 0]
                for e in range(1, P * P):
                    best = max(best, acc[m, e])
                out[n, m, pi, pj] = activate(best + b[m], ACT)
            ### END SOLUTION

    return conv_pooled_kernel


# %% [markdown]
# The host function, like stage 06's, keeps one compiled kernel per weight array (a run's weights stay the same
# device array; a check's fresh weights compile a new one) and launches one thread per output position.

# %% tags=["kernel"]
POOLED = lk.const_kernels.PerWeights(make_pooled_kernel)  # one compile per weights, activation and pool


def conv_pooled(x, w, b, out, pad, stride, act=0, pool=0):
    assert stride == 1, "the pooled kernel assumes stride 1"
    N, M, Ho, Wo = out.shape
    lk.gpu.launch(POOLED(w, act, pool), N * Ho * Wo, x, b, out, pad)


# %%
# What one thread of your pooled kernel reads and writes: yours beside the spec's
lk.show.task("09", "pooled")

# %% [markdown]
# ## Task 2 — the same kernel in CUDA C, with and without `__restrict__` and `#pragma unroll`
#
# `CUDA_SOURCE` compiles once per layer with the sizes as macros (`-DC=… -DM=… -DK=… -DP=… -DACT=…`) and the weights in
# a `__constant__` array. Write the body of `conv_pooled_c` (the numba kernel above, on flat pointers; `RESTRICT` and
# `UNROLL` are macros that expand to `__restrict__` and `#pragma unroll`, or to nothing). Roughly {{lines:pooled_c}}. On a
# machine without a GPU it is compiled for the CPU and checked there (its check lines say "CPU emulation of CUDA C").
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/09_task2.png)

# %% tags=["kernel"]
CUDA_SOURCE = r"""
extern "C" {
__constant__ float c_w[M * C * K * K];

__device__ float activate(float v) { return ACT == 1 ? fmaxf(v, 0.0f) : ACT == 2 ? tanhf(v) : v; }

__global__ void conv_pooled_c(const float* RESTRICT x, const float* RESTRICT b, float* RESTRICT out,
                              int N, int H, int W, int Ho, int Wo, int pad) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * Ho * Wo) return;
    int pj = t % Wo, pi = (t / Wo) % Ho, n = t / (Wo * Ho);
    /// BEGIN SOLUTION pooled_c
    float acc[M][P * P];
    UNROLL
    for (int m = 0; m < M; ++m)
        UNROLL
        for (int e = 0; e < P * P; ++e) acc[m][e] = 0.0f;
    for (int c = 0; c < C; ++c)
        UNROLL
        for (int p = 0; p < K + P - 1; ++p) {
            int r = pi * P + p - pad;
            UNROLL
            for (int q = 0; q < K + P - 1; ++q) {
                int s = pj * P + q - pad;
                float v = (r >= 0 && r < H && s >= 0 && s < W) ? x[((n * C + c) * H + r) * W + s] : 0.0f;
                UNROLL
                for (int di = 0; di < P; ++di)
                    UNROLL
                    for (int dj = 0; dj < P; ++dj) {
                        int kp = p - di, kq = q - dj;
                        if (kp >= 0 && kp < K && kq >= 0 && kq < K)
                            UNROLL
                            for (int m = 0; m < M; ++m)
                                acc[m][di * P + dj] += v * c_w[((m * C + c) * K + kp) * K + kq];
                    }
            }
        }
    for (int m = 0; m < M; ++m) {
        float best = acc[m][0];
        for (int e = 1; e < P * P; ++e) best = fmaxf(best, acc[m][e]);
        out[((n * M + m) * Ho + pi) * Wo + pj] = activate(best + b[m]);
    }
    /// END SOLUTION
}
}
"""
MODULES = {}


def conv_pooled_cuda(restrict_unroll):
    def pooled_c(x, w, b, out, pad, stride, act=0, pool=0):
        M, C, K, _ = w.shape
        P = max(pool, 1)
        key = (M, C, K, P, act, restrict_unroll)
        if key not in MODULES:
            macros = [f"-DM={M}", f"-DC={C}", f"-DK={K}", f"-DP={P}", f"-DACT={act}",
                      "-DRESTRICT=__restrict__" if restrict_unroll else "-DRESTRICT=",
                      "-DUNROLL=_Pragma(\"unroll\")" if restrict_unroll else "-DUNROLL="]
            MODULES[key] = lk.gpu.raw_module(CUDA_SOURCE, macros)
        module = MODULES[key]
        lk.gpu.upload_constant(module, "c_w", w)
        N, _, H, W = x.shape
        Ho, Wo = out.shape[2], out.shape[3]
        args = (x, b, out, *(np.int32(v) for v in (N, H, W, Ho, Wo, pad)))
        lk.gpu.launch_raw(module.get_function("conv_pooled_c"), lk.gpu.blocks(N * Ho * Wo), lk.gpu.TPB, args)

    pooled_c.__name__ = "conv_pooled_c_restrict_unroll" if restrict_unroll else "conv_pooled_c"
    return pooled_c


# %%
# What one thread of your CUDA C kernel reads and writes: yours beside the spec's
lk.show.task("09", "pooled_c")

# %% [markdown]
# ## Task 3 — register tiles, in four steps
#
# Each thread computes a tile of `TR × TC` outputs for the block's `MG` maps (`m0 … m0 + MG − 1`, `m0 = blockIdx.y·MG`)
# and keeps the sums in registers, `acc[MG][TR][TC]`. A pooled layer's tile is its 2×2 pooling window (`P = 2`); an
# unpooled layer's tiles cover the map, and the last one may overhang it. Given: the macros (the layer's sizes,
# `TILE_ROWS`, `TILE_COLS`, `INSIDE`, `VEC`), `activate`, `weights_at`, and the kernel `conv_tiles`, which declares every
# register array and calls your four steps. Write them in order; the cell after the code checks each one on its own.
#
# - **a. `load_window`**: the `WR × WC` input values (`WR = TR + K − 1`, `WC = TC + K − 1`) of one channel `xc` that a
#   tile's multiply-adds read, from row `r0`, column `c0` (negative in the padding), into `v`; 0 outside the image.
#   Test the edges only where a window can cross one (`INSIDE` is true when none can). Roughly {{lines:load_window}}.
# - **b. `add_channel`**: channel `c`'s multiply-adds, `acc[m][i][j] += v[i + p][j + q] · w[m0 + m, c, p, q]` for every
#   `p, q < K`. `wv = weights_at(ws, c, p, q, mv)` (given) fetches the weights of the `VEC` maps `mv·VEC …
#   mv·VEC + VEC − 1` at once, from shared or from constant memory. Roughly {{lines:add_channel}}.
# - **c. `stage_weights`, `sum_channels`**: with `WSHARED=1`, the block's threads together copy the weights of its
#   `MG` maps from `w` (`[M][C][K][K]`) into the shared array `ws`, laid out `[c][p][q][m]` (maps fastest:
#   `ws[i / VEC].v[i % VEC]` is element `i` of that order). `sum_channels` runs the input channels: `load_window`,
#   then `add_channel`. With `PREFETCH=1` it keeps a second window, `next`: channel 0 goes into it before the loop,
#   and each iteration copies `next` into `v` and starts loading channel `c + 1` into `next` before channel `c`'s
#   multiply-adds. The channel loop is unrolled when the weights are constants (`WSHARED=0`: every `c_w` index is then
#   a compile-time constant) and stays a loop otherwise (`#pragma unroll 1`). Roughly
#   {{lines:stage_weights+sum_channels}}.
# - **d. `store_tile`**: per map of the group, bias, activation and one store: for `P = 2` the maximum of the tile's
#   four sums, to `out[n, m, tr, tc]`; otherwise each sum whose output lies inside the map, to
#   `out[n, m, tr·TR + i, tc·TC + j]`. Roughly {{lines:store_tile}}.
#
# Every loop whose trip count is a compile-time constant gets `#pragma unroll`: registers have no addresses, so an
# array indexed by a value known only at run time would live in local memory. The host function `conv_tiles(...)` is
# given: it compiles one module per layer shape and launch configuration, and is the candidate the tuner sees as
# `09 tiles …`.
#
# ![Task 3: what the threads read and write, drawn from the kit's solution](figures/09_task3.png)

# %% tags=["kernel"]
TILES_SOURCE = r"""extern "C" {
#if !WSHARED
__constant__ float c_w[M * C * K * K];
#endif
#define VEC (MG % 4 == 0 ? 4 : MG % 2 == 0 ? 2 : 1)
struct __align__(4 * VEC) wvec { float v[VEC]; };

#define WR (TR + K - 1)  // the input window of a TR x TC tile
#define WC (TC + K - 1)

__device__ __forceinline__ float activate(float v) { return ACT == 1 ? fmaxf(v, 0.0f) : ACT == 2 ? tanhf(v) : v; }

// tiles per map: a pooled layer's tile is its 2 x 2 window, an unpooled layer's TR x TC outputs (the last may overhang)
#define TILE_ROWS (P == 2 ? HO / 2 : (HO + TR - 1) / TR)
#define TILE_COLS (P == 2 ? WO / 2 : (WO + TC - 1) / TC)
// no padding, and the last tile's window ends inside the image: no window crosses an edge, so no load needs a check
#define INSIDE (PAD == 0 && (TILE_ROWS - 1) * TR + WR <= H && (TILE_COLS - 1) * TC + WC <= W)

// step a: the window of one input channel at (r0, c0) into registers, zeros outside the image (the padding)
__device__ __forceinline__ void load_window(const float* __restrict__ xc, int r0, int c0, float (&v)[WR][WC]) {
    /// BEGIN SOLUTION load_window
#pragma unroll
    for (int p = 0; p < WR; ++p)
#pragma unroll
        for (int q = 0; q < WC; ++q) {
            int r = r0 + p, s = c0 + q;
            v[p][q] = (INSIDE || (r >= 0 && r < H && s >= 0 && s < W)) ? __ldg(xc + r * W + s) : 0.0f;
        }
    /// END SOLUTION
}

// given: the weights of maps m0 + mv * VEC ... m0 + mv * VEC + VEC - 1 at (c, p, q), from shared or constant memory
__device__ __forceinline__ wvec weights_at(const wvec* ws, int c, int p, int q, int mv) {
#if WSHARED
    return ws[((c * K + p) * K + q) * (MG / VEC) + mv];
#else
    wvec wv;
#pragma unroll
    for (int e = 0; e < VEC; ++e) wv.v[e] = c_w[(((mv * VEC + e) * C + c) * K + p) * K + q];
    return wv;
#endif
}

// step b: channel c's multiply-adds into the tile's sums, acc[m][i][j] += v[i + p][j + q] * w[m][c][p][q]
__device__ __forceinline__ void add_channel(const float (&v)[WR][WC], const wvec* ws, int c, wvec& wv,
                                            float (&acc)[MG][TR][TC]) {
    /// BEGIN SOLUTION add_channel
#pragma unroll
    for (int p = 0; p < K; ++p)
#pragma unroll
        for (int q = 0; q < K; ++q)
#pragma unroll
            for (int mv = 0; mv < MG / VEC; ++mv) {
                wv = weights_at(ws, c, p, q, mv);
#pragma unroll
                for (int e = 0; e < VEC; ++e)
#pragma unroll
                    for (int i = 0; i < TR; ++i)
#pragma unroll
                        for (int j = 0; j < TC; ++j) acc[mv * VEC + e][i][j] += v[i + p][j + q] * wv.v[e];
            }
    /// END SOLUTION
}

// step c: the block's maps' weights into shared memory, laid out [c][p][q][m] (maps fastest); w is [M][C][K][K]
__device__ __forceinline__ void stage_weights(const float* __restrict__ w, int m0, wvec* ws) {
    /// BEGIN SOLUTION stage_weights
    for (int i = threadIdx.x; i < C * K * K * MG; i += blockDim.x)
        ws[i / VEC].v[i % VEC] = w[(m0 + i % MG) * C * K * K + i / MG];
    /// END SOLUTION
}

// step c: every input channel's window and multiply-adds; with PREFETCH, channel c + 1 loads during channel c's
__device__ __forceinline__ void sum_channels(const float* __restrict__ xn, int r0, int c0, const wvec* ws,
                                             float (&v)[WR][WC], float (&next)[WR][WC], wvec& wv,
                                             float (&acc)[MG][TR][TC]) {
    /// BEGIN SOLUTION sum_channels
#if PREFETCH
    load_window(xn, r0, c0, next);
#endif
#if WSHARED
#pragma unroll 1
#else
#pragma unroll
#endif
    for (int c = 0; c < C; ++c) {
#if PREFETCH
#pragma unroll
        for (int p = 0; p < WR; ++p)
#pragma unroll
            for (int q = 0; q < WC; ++q) v[p][q] = next[p][q];
        if (c + 1 < C) load_window(xn + (c + 1) * H * W, r0, c0, next);
#else
        load_window(xn + c * H * W, r0, c0, v);
#endif
        add_channel(v, ws, c, wv, acc);
    }
    /// END SOLUTION
}

// step d: bias, activation, the 2 x 2 pool (P = 2: the tile is the window) or each output inside the map; one store
__device__ __forceinline__ void store_tile(const float (&acc)[MG][TR][TC], const float* __restrict__ b,
                                           float* __restrict__ out, int n, int m0, int tr, int tc) {
    /// BEGIN SOLUTION store_tile
#pragma unroll
    for (int mm = 0; mm < MG; ++mm) {
        int m = m0 + mm;
        if (P == 2) {
            float best = fmaxf(fmaxf(acc[mm][0][0], acc[mm][0][TC - 1]), fmaxf(acc[mm][TR - 1][0], acc[mm][TR - 1][TC - 1]));
            out[((size_t)(n * M + m) * TILE_ROWS + tr) * TILE_COLS + tc] = activate(best + b[m]);
        } else {
#pragma unroll
            for (int i = 0; i < TR; ++i)
#pragma unroll
                for (int j = 0; j < TC; ++j) {
                    int row = tr * TR + i, col = tc * TC + j;
                    if (row < HO && col < WO) out[((size_t)(n * M + m) * HO + row) * WO + col] = activate(acc[mm][i][j] + b[m]);
                }
        }
    }
    /// END SOLUTION
}

// given: the kernel. Block (x, y): threads over tiles of all images, y picks the block's MG maps
__global__ void __launch_bounds__(TPB, MINB) conv_tiles(const float* __restrict__ x, const float* __restrict__ w,
                                                  const float* __restrict__ b, float* __restrict__ out, int N) {
    const int m0 = blockIdx.y * MG;  // this block's maps: m0 .. m0 + MG - 1
#if WSHARED
    __shared__ wvec ws[C * K * K * MG / VEC];  // [c][p][q][m], maps fastest
    stage_weights(w, m0, ws);
    __syncthreads();
#else
    const wvec* ws = nullptr;  // the weights are c_w's
#endif
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * TILE_ROWS * TILE_COLS) return;
    int tc = t % TILE_COLS, tr = (t / TILE_COLS) % TILE_ROWS, n = t / (TILE_COLS * TILE_ROWS);
    int r0 = tr * TR - PAD, c0 = tc * TC - PAD;  // the tile's window starts here (negative: in the padding)
    const float* xn = x + (size_t)n * C * H * W;
    float acc[MG][TR][TC];
#pragma unroll
    for (int m = 0; m < MG; ++m)
#pragma unroll
        for (int i = 0; i < TR; ++i)
#pragma unroll
            for (int j = 0; j < TC; ++j) acc[m][i][j] = 0.0f;
    float v[WR][WC], next[WR][WC];  // a channel's window; with PREFETCH, the next channel's, loading meanwhile
    wvec wv;  // VEC maps' weights at one (c, p, q)
    sum_channels(xn, r0, c0, ws, v, next, wv, acc);
    store_tile(acc, b, out, n, m0, tr, tc);
}
}
"""
TILE_MODULES = {}  # compile options -> module: one per layer shape and launch configuration
TILE_WEIGHTS = {}  # module -> the weights array its constant memory holds (kept, so its id stays unique)


def conv_tiles(weights_in="shared", tpb=128, split=1, rows=2, prefetch=0, minb=1):
    """The register-tile kernel as a fused conv: ``weights_in`` "constant" or "shared"; ``tpb`` threads per block;
    ``split`` blocks share a tile's maps (MG = M / split; shared only); ``rows`` x 2 outputs per thread (pooled
    layers: always the 2 x 2 window); ``prefetch`` the next channel's window while computing (shared only: the
    constant kernel's unrolled channel loop is scheduled whole); ``minb`` blocks per SM the compiler must fit."""
    launches = {}  # (shapes, pad, act, pool) -> (module, kernel, grid): a pass's launch does no more than launch

    def prepare(x_shape, w_shape, pad, act, pool):
        N, C, H, W = x_shape
        M, _, K, _ = w_shape
        P = 2 if pool == 2 else 1
        HO, WO = H + 2 * pad - K + 1, W + 2 * pad - K + 1
        TR, TC = (2, 2) if P == 2 else (rows, 2)
        ws = weights_in == "shared"
        MG = M // split if ws and M % split == 0 else M
        macros = dict(C=C, M=M, K=K, H=H, W=W, PAD=pad, HO=HO, WO=WO, P=P, ACT=act, TR=TR, TC=TC, WSHARED=int(ws),
                      MG=MG, TPB=tpb, PREFETCH=int(prefetch and ws), MINB=minb)
        key = tuple(macros.items())
        if key not in TILE_MODULES:
            TILE_MODULES[key] = lk.gpu.raw_module(TILES_SOURCE, [f"-D{k}={v}" for k, v in key])
        module = TILE_MODULES[key]
        tiles_ = (HO // 2) * (WO // 2) if P == 2 else -(-HO // TR) * -(-WO // TC)
        return (None if ws else module), module.get_function("conv_tiles"), (lk.gpu.blocks(N * tiles_, tpb), M // MG)

    def tiles(x, w, b, out, pad, stride, act=0, pool=0):
        assert stride == 1, "the tile kernel assumes stride 1"
        key = (x.shape, w.shape, pad, act, pool)
        if key not in launches:
            launches[key] = prepare(x.shape, w.shape, pad, act, pool)
        constant, kernel, grid = launches[key]
        if constant is not None and TILE_WEIGHTS.get(constant) is not w:  # a run's weights stay one array
            lk.gpu.upload_constant(constant, "c_w", w)
            TILE_WEIGHTS[constant] = w
        lk.gpu.launch_raw(kernel, grid, (tpb,), (x, w, b, out, np.int32(x.shape[0])))

    tiles.__name__ = f"conv_tiles_{weights_in}_{tpb}_{split}_{rows}_{prefetch}_{minb}"
    return tiles


def tile_candidates(every=False):
    """The register-tile shapes the tuner tries (CUDA C). On the CPU emulation of CUDA C, where each is compiled
    once per layer shape, two (ON_CPU: constant weights; shared weights, split maps and the prefetch) unless
    ``every``: the steps' checks and the tuned variants' cover the rest."""
    if lk.stages.unavailable(("cuda_c",)):
        return []
    found = [*lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["constant"], tpb=[128]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[128, 256], split=[1, 2]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[256], rows=[1]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[128, 256], split=[1, 2],
                            prefetch=[1]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[256], rows=[1], prefetch=[1]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[256], minb=[2]),
            # unpooled layers only (a pooled layer's tile is its 2 x 2 window): taller tiles, fewer maps per block
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[128, 256], split=[2],
                            rows=[3]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[128], split=[3], rows=[3]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[256], split=[2], rows=[1]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[64], split=[2], rows=[3]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["shared"], tpb=[128], split=[2, 3],
                            rows=[4, 5]),
             *lk.tune.space("09 tiles", conv_tiles, fused=True, weights_in=["constant"], tpb=[64, 256])]
    return [c for c in found if c.name in ON_CPU] if lk.gpu.cuda_c_on_cpu() and not every else found


ON_CPU = {"09 tiles weights_in=constant tpb=128", "09 tiles weights_in=shared tpb=128 split=2 prefetch=1"}

# %%
# What one thread of your register-tile kernel reads and writes: yours beside the spec's
lk.show.task("09", "tiles")

# %%
# NBVAL_CHECK_OUTPUT
from labkit import tile_steps

steps = tile_steps.check(TILES_SOURCE)


# %% [markdown]
# ## Task 4 — the search space
#
# `candidates(layer)` lists what the tuner tries for one conv layer: stage 05's tiled kernel for tile sizes 8 and 16,
# stage 06's constant-memory kernel, stage 08's fused implicit GEMM, your pooled kernel and your register tiles (`tile_candidates()`, given), each through
# `lk.tune.space(name, make, fused=True, **axes)` (`make(**params)` returns the conv function; use
# `lk.kernels.as_fused` for the unfused ones). Roughly {{lines:candidates}}.

# %% tags=["kernel"]
def candidates(layer):
    ### BEGIN SOLUTION candidates
    return [
        *lk.tune.space("05 tiled", lambda T: lk.kernels.as_fused(s05.conv_tiled(T)), fused=True, T=[8, 16]),
        *lk.tune.space("06 constant", lambda: lk.kernels.as_fused(s06.conv_const_uniform), fused=True),
        *lk.tune.space("08 implicit GEMM", lambda: s08.conv_fused, fused=True),
        *lk.tune.space("09 pooled", lambda: conv_pooled, fused=True),
        *tile_candidates(),
    ]
    ### END SOLUTION


# %% [markdown]
# ## Tune
#
# Every candidate is checked on the layer (with its activation and pooling) before it is timed; on a GPU each is timed
# on the layer's real input at the workload's batch size and the fastest is kept (`save=True` records the choice for
# this device in `results/tuning.json`). The simulator can only check: there the choice comes from the kit's committed
# tuning, labelled as such, and the candidates from earlier stages' given code say "given" (the kit's own tests check
# them; yours are checked here).

# %%
tunings = {}
for name, images in (("cifar10", 50000), ("fashion", 10000)):
    spec = lk.get_net(name)
    try:
        tunings[name] = lk.tune.tune({ly: candidates(ly) for ly in spec.conv_layers}, name, images, quiet=True)
    except NotImplementedError:
        print("not tuned yet: candidates or a kernel is still the TODO stub")
        break
    print(f"== {name}, {images} images")
    print(tunings[name].table())


# %% [markdown]
# ## Given: the tuned network
#
# `tuned_impls(choice)`: the variant's functions, one per conv layer by name (`{"conv1": fn, ...}`), each the candidate
# the tuner chose for that layer (or `conv_pooled` where it chose nothing), plus the kit's other layers.

# %% tags=["kernel"]
def tuned_impls(choice, net_name):
    by_name = {c.name: c.fn for c in tile_candidates(every=True)}  # the committed choice may be any of them
    by_name.update({c.name: c.fn for layer in lk.get_net(net_name).conv_layers for c in candidates(layer)})
    impls = dict(lk.kernels.GIVEN)
    for layer in lk.get_net(net_name).conv_layers:
        impls[layer] = by_name.get(choice.get(layer), conv_pooled)
    return impls


# %% tags=["kernel"]
def tuned(net_name, images):
    """The tuned variant's functions: the committed choice for this workload (the pooled kernel where none)."""
    kept = lk.tune.stored(net_name, images)
    try:
        return tuned_impls(kept["choice"] if kept else {}, net_name)
    except NotImplementedError:  # a TODO above: the variant says so when it is checked, not here
        return {**lk.kernels.GIVEN, "conv": lk.stages.pending("tuned_impls")}


VARIANTS = lk.variants("09", {
    "pooled": lk.Variant({**lk.kernels.GIVEN, "conv": conv_pooled}, arrays="device", fuse=FUSE,
                         note="one thread per pooled output, all maps, weights in constant memory, fused epilogue"),
    "pooled_cuda_c": lk.Variant({**lk.kernels.GIVEN, "conv": conv_pooled_cuda(False)}, arrays="device", fuse=FUSE,
                                requires=("cuda_c",), note="the pooled kernel in CUDA C"),
    "pooled_cuda_c_restrict_unroll": lk.Variant({**lk.kernels.GIVEN, "conv": conv_pooled_cuda(True)},
                                                arrays="device", fuse=FUSE, requires=("cuda_c",),
                                                note="the pooled kernel in CUDA C, __restrict__ and #pragma unroll"),
    "tuned_cifar10": lk.Variant(tuned("cifar10", 50000), arrays="device",
                                fuse=FUSE, nets=("cifar10",), note="per-layer kernels chosen by lk.tune"),
    "tuned_fashion": lk.Variant(tuned("fashion", 10000), arrays="device",
                                fuse=FUSE, nets=("fashion",), note="per-layer kernels chosen by lk.tune"),
})

# %% [markdown]
# ## Check

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)

# %% [markdown]
# ## Measure: the final leaderboard
#
# The whole network with each variant, both networks at their largest workloads (on the simulator: the shrunk net).

# %%
runs = lk.notebook.measure(VARIANTS, checked, repeat=5)

# %%
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), layout="constrained")
plt.close(fig)
lk.tune.plot(tunings.get("cifar10") or lk.tune.Tuning("cifar10", 50000, "-", [], {}, "not tuned"), ax=left)
lk.notebook.ladder("09", runs=lk.notebook.smallest(runs), ax=right)
fig

# %% [markdown]
# ## Reflect
#
# 1. Which kernel won each layer, and why that one for that layer? Use the layers' shapes: conv1 has 3 input channels
#    and a 32×32 output, conv3 20 input channels and an 8×8 output.
# 2. The pooled kernel loads each input value once per thread for `M·POOL²` sums: what is its arithmetic intensity for
#    conv2, and where does that put it on the roofline against stage 04's kernel?
# 3. Did `__restrict__` and `#pragma unroll` help, as the compiler's guides promise, or hurt, as in the study's table?
#    Look at the registers per thread (`kernel.attributes["num_regs"]` for a cupy kernel, or numba's
#    `get_regs_per_thread()`) and at spills.
# 4. A tuning is only as good as its measurement: how large was the spread of your timings, and would a second run pick
#    the same kernels?
#
# ### What the kit measured

# %%
lk.measured.show("09", compare=(("09 pooled", "09 pooled_cuda_c"),
                               ("09 pooled_cuda_c_restrict_unroll", "09 pooled_cuda_c")));

# %% [markdown]
# No single kernel wins every layer: the layers differ in channels, maps and output size, and a kernel that keeps a
# large layer busy starves a small one. A course's best is a choice per layer, measured on the device it will run on.
