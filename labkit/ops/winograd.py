"""A 5 x 5 conv with Winograd's F(2, 5) along each row, in CUDA C: the kit's given conv one step beyond direct.

Stage 09's register tiles run cifar10's convs at about 60 per cent of an H100's fp32 peak; issue 24's 7.5 ms for
50000 images asks for more than a direct conv can reach (its 392 GFLOP in 7.5 ms is 78 per cent of the datasheet's
peak, above what the card sustains). Winograd's minimal filtering (Lavin and Gray, 2016) gives two outputs of a row
from six inputs with six multiplies a filter row instead of ten:

    y = A^T [ (G g) * (B^T d) ]        g a filter row (5), d six inputs of a row, * elementwise

and a 5 x 5 conv is five such row filters summed (one per filter row, each over its own input row). A thread keeps
the six transformed sums of two output rows by two columns (a 2 x 2 pool window) for ``mg`` output channels in
registers; for every input channel it transforms the six input rows it needs (two at a time, as the filter rows
walk down), reads the filter rows' transforms ``G g`` from shared memory as warp-uniform float4s, and after the last
channel applies A^T, the bias, the activation and the pool. 60 multiply-adds a channel and output channel where a
direct conv makes 100: 1.67 times fewer. The matrices (``matrices``) come from the Toom-Cook points 0, 1, -1, 2, -2
and infinity; B^T's entries are small integers. The results differ from a direct conv's by rounding only
(``tests/test_winograd.py`` bounds it).

A 2-D F(2 x 2, 5 x 5) kernel (36 multiplies for a 2 x 2 block instead of 100) was built first and measured on an
H100 (``results/h100-2026-11-26c/winograd_2d_explore.json``): it needs 36 sums a tile and output channel, so a
block's sums go through shared memory, and the best configuration of each layer ran at 0.88 to 1.06 times the
direct kernel's speed; the row form keeps its 6 sums in registers. Measured the same way
(``winograd_rows_explore.json``), the row form's best configuration ran at 0.48 (the one-channel first layers) to
0.93 times the speed of stage 09's direct register tiles on cifar10's and fashion's convs and 1.09 times on ece408's
conv2: 6 sums for two columns cost the registers a direct tile spends on more outputs, so each filter value
read from shared memory feeds 8 multiply-adds here against 16 there. Stage 10 keeps the direct kernels; this module
stays as the measured record of that step and the place to take it further (a batched-GEMM form with larger tiles).

The filter rows' transform is a small kernel of its own (a thread per filter) launched before each conv, so the layer
function takes the weights as every conv function does and nothing is cached between calls. Shapes are compile-time
constants (one module per layer shape and configuration, cached). On a machine without a GPU it runs on the CPU
emulation of CUDA C (``labkit.cudacpu``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..launch import gpu
from ..model import layers

#: the output tile's side (m) and the filter's (r): F(m x m, r x r) reads tiles of m + r - 1
M_OUT, R = 2, 5
N_IN = M_OUT + R - 1
#: Toom-Cook points (and infinity)
POINTS = (0, 1, -1, 2, -2)


def matrices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A^T (2 x 6), G (6 x 5) and B^T (6 x 6) of F(2, 5), exact: A^T and G from the points (Vandermonde rows, G's
    scaled by each point's product of differences), B^T solved from the identity y = A^T [(G g) * (B^T d)] for every
    g and d (it has one solution: integers)."""
    pts = [Fraction(p) for p in POINTS]
    at = [[p ** i for p in pts] + [Fraction(int(i == M_OUT - 1))] for i in range(M_OUT)]
    scale = [np.prod([p - q for q in pts if q != p]) for p in pts]
    g = [[p ** k / s for k in range(R)] for p, s in zip(pts, scale)] + [[Fraction(int(k == R - 1)) for k in range(R)]]
    # y_i = sum_k d_{i+k} g_k: for each (i, k, l) sum_j AT[i][j] G[j][k] BT[j][l] = [l == i + k]
    eq = np.zeros((M_OUT * R * N_IN, N_IN * N_IN))
    rhs = np.zeros(M_OUT * R * N_IN)
    for i in range(M_OUT):
        for k in range(R):
            for col in range(N_IN):
                row = (i * R + k) * N_IN + col
                rhs[row] = float(col == i + k)
                for j in range(N_IN):
                    eq[row, j * N_IN + col] = float(at[i][j] * g[j][k])
    bt = np.linalg.lstsq(eq, rhs, rcond=None)[0].reshape(N_IN, N_IN)
    return (np.array(at, dtype=np.float64), np.array(g, dtype=np.float64), np.round(bt, 9))


def conv_numpy(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """The conv (no bias) the way the kernel computes it, in float64 on the host, for tests: every input row and
    filter row transformed (B^T d, G g), their products summed over the channels and the filter's rows, A^T of the
    sums (a map whose width is odd is padded by one more column, then cut)."""
    at, g, bt = matrices()
    n, c, h, wd = x.shape
    ho, wo = h + 2 * pad - R + 1, wd + 2 * pad - R + 1
    tw = -(-wo // M_OUT)
    xp = np.zeros((n, c, h + 2 * pad, tw * M_OUT + R - 1))
    xp[:, :, pad:pad + h, pad:pad + wd] = x
    u = np.einsum("jk,mcyk->mcyj", g, w.astype(np.float64))  # filter rows: (M, C, 5, 6)
    out = np.zeros((n, w.shape[0], ho, tw * M_OUT))
    for tx in range(tw):
        d = xp[..., tx * M_OUT:tx * M_OUT + N_IN]  # (n, c, rows, 6)
        v = np.einsum("jk,ncyk->ncyj", bt, d)
        for oy in range(ho):
            sums = np.einsum("ncyj,mcyj->nmj", v[:, :, oy:oy + R], u)
            out[:, :, oy, tx * M_OUT:(tx + 1) * M_OUT] = np.einsum("aj,nmj->nma", at, sums)
    return out[..., :wo]


SOURCE = r"""
#ifndef __CUDACC__
// the CPU emulation (labkit.cudacpu) has no vector types: CUDA's float4, 16-byte aligned as on a GPU
struct __align__(16) float4 { float x, y, z, w; };
#endif

extern "C" {
#define GROUPS ((M + MG - 1) / MG)  // groups of MG output channels (the last padded with zero filters)
#define TILES_Y (POOL ? HO / 2 : (HO + 1) / 2)  // a pooled map keeps whole windows only (the pool's floor)
#define TILES_X (POOL ? WO / 2 : (WO + 1) / 2)
#define SLAB (C * 5 * 6 * MG)  // a group's transformed filter rows: [c][ky][xi][m]

// the 1-D transforms of F(2, 5): B^T d (6 -> 6), G g (5 -> 6), A^T m (6 -> 2)
__device__ __forceinline__ void bt6(const float* d, float* o) {
    o[0] = 4.0f * d[0] - 5.0f * d[2] + d[4];
    o[1] = d[3] + d[4] - 4.0f * (d[1] + d[2]);
    o[2] = 4.0f * (d[1] - d[2]) - d[3] + d[4];
    o[3] = 2.0f * (d[3] - d[1]) - d[2] + d[4];
    o[4] = 2.0f * (d[1] - d[3]) - d[2] + d[4];
    o[5] = 4.0f * d[1] - 5.0f * d[3] + d[5];
}

__device__ __forceinline__ void g6(const float* g, float* o) {
    const float even = g[0] + g[2] + g[4], odd = g[1] + g[3];
    o[0] = 0.25f * g[0];
    o[1] = -(even + odd) / 6.0f;
    o[2] = -(even - odd) / 6.0f;
    const float e2 = g[0] / 24.0f + g[2] / 6.0f + g[4] * (2.0f / 3.0f), o2 = g[1] / 12.0f + g[3] / 3.0f;
    o[3] = e2 + o2;
    o[4] = e2 - o2;
    o[5] = g[4];
}

__device__ __forceinline__ float activate(float v) {
#if ACT == 1
    return v > 0.0f ? v : 0.0f;
#elif ACT == 2
    return tanhf(v);
#else
    return v;
#endif
}

// U[group][c][ky][xi][m % MG] = G w[m][c][ky][:], zeros for the padding outputs m >= M: a thread a (m, c) filter
__global__ void wino_weights(const float* __restrict__ w, float* __restrict__ U) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= GROUPS * MG * C) return;
    const int m = k / C, c = k % C;
    float* u = U + (size_t)(m / MG) * SLAB + (size_t)c * 30 * MG + m % MG;
    for (int ky = 0; ky < 5; ++ky) {
        float row[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (m < M) g6(w + (((size_t)m * C + c) * 5 + ky) * 5, row);
        for (int xi = 0; xi < 6; ++xi) u[(ky * 6 + xi) * MG] = row[xi];
    }
}

// input row y of channel plane xc at columns x0 .. x0 + 5 (zeros outside the map), transformed
__device__ __forceinline__ void row_in(const float* __restrict__ xc, int y, int x0, float* v) {
    float d[6];
#pragma unroll
    for (int j = 0; j < 6; ++j) {
        const int xx = x0 + j;
        d[j] = (y >= 0 && y < H && xx >= 0 && xx < W) ? __ldg(xc + y * W + xx) : 0.0f;
    }
    bt6(d, v);
}

// Grid (tiles / THREADS, GROUPS): a thread two output rows by one F(2, 5) tile of two columns (a pool window when
// pooled), for MG output channels; the block's group of transformed filter rows in shared memory
__global__ void __launch_bounds__(THREADS, MINB) wino_conv(const float* __restrict__ x, const float* __restrict__ U,
                                                          const float* __restrict__ bias, float* __restrict__ out,
                                                          int N) {
    __shared__ __align__(16) float Us[SLAB];
    const int group = blockIdx.y;
    for (int k = threadIdx.x; k < SLAB / 4; k += THREADS)
        reinterpret_cast<float4*>(Us)[k] = __ldg(reinterpret_cast<const float4*>(U + (size_t)group * SLAB) + k);
    __syncthreads();
    const int g = blockIdx.x * THREADS + threadIdx.x;
    if (g >= N * TILES_Y * TILES_X) return;
    const int n = g / (TILES_Y * TILES_X), r = g % (TILES_Y * TILES_X), ty = r / TILES_X, tx = r % TILES_X;
    const int y0 = 2 * ty - PAD, x0 = 2 * tx - PAD;

    float acc[2][6][MG];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int xi = 0; xi < 6; ++xi)
#pragma unroll
            for (int m = 0; m < MG; ++m) acc[i][xi][m] = 0.0f;

    const float* xn = x + (size_t)n * C * (H * W);
    for (int c = 0; c < C; ++c) {
        const float* xc = xn + c * (H * W);
        float top[6], bottom[6];  // transformed input rows y0 + ky and y0 + ky + 1
        row_in(xc, y0, x0, top);
#pragma unroll
        for (int ky = 0; ky < 5; ++ky) {
            row_in(xc, y0 + ky + 1, x0, bottom);
            const float4* u4 = reinterpret_cast<const float4*>(Us + (c * 5 + ky) * 6 * MG);
#pragma unroll
            for (int xi = 0; xi < 6; ++xi)
#pragma unroll
                for (int m4 = 0; m4 < MG / 4; ++m4) {
                    const float4 u = u4[xi * (MG / 4) + m4];
                    acc[0][xi][4 * m4 + 0] += top[xi] * u.x;
                    acc[0][xi][4 * m4 + 1] += top[xi] * u.y;
                    acc[0][xi][4 * m4 + 2] += top[xi] * u.z;
                    acc[0][xi][4 * m4 + 3] += top[xi] * u.w;
                    acc[1][xi][4 * m4 + 0] += bottom[xi] * u.x;
                    acc[1][xi][4 * m4 + 1] += bottom[xi] * u.y;
                    acc[1][xi][4 * m4 + 2] += bottom[xi] * u.z;
                    acc[1][xi][4 * m4 + 3] += bottom[xi] * u.w;
                }
#pragma unroll
            for (int xi = 0; xi < 6; ++xi) top[xi] = bottom[xi];
        }
    }

#pragma unroll
    for (int ml = 0; ml < MG; ++ml) {
        const int m = group * MG + ml;
        if (m >= M) break;
        const float b = bias[m];
        float y[2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {  // A^T: outputs 2 tx and 2 tx + 1 of row 2 ty + i
            const float* a = acc[i][0] + ml;
            y[i][0] = activate(a[0] + a[MG] + a[2 * MG] + a[3 * MG] + a[4 * MG] + b);
            y[i][1] = activate(a[MG] - a[2 * MG] + 2.0f * (a[3 * MG] - a[4 * MG]) + a[5 * MG] + b);
        }
#if POOL
        out[(((size_t)n * M + m) * TILES_Y + ty) * TILES_X + tx] = fmaxf(fmaxf(y[0][0], y[0][1]), fmaxf(y[1][0], y[1][1]));
#else
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int oy = 2 * ty + i, ox = 2 * tx + j;
                if (oy < HO && ox < WO) out[(((size_t)n * M + m) * HO + oy) * WO + ox] = y[i][j];
            }
#endif
    }
}
}
"""


@dataclass(frozen=True)
class Config:
    """``mg`` output channels a thread (a multiple of 4: float4 reads of the filter rows), ``threads`` a block,
    ``min_blocks`` for ``__launch_bounds__``."""

    name: str
    mg: int = 8
    threads: int = 128
    min_blocks: int = 1

    def __post_init__(self):
        if self.mg % 4 or self.mg < 4 or self.threads % 32 or self.min_blocks < 1:
            raise ValueError(f"Config {self.name}: mg a positive multiple of 4, threads of 32, min_blocks at least 1")


#: the configurations a GPU run compares (``tools/conv_timing.py --kernels winograd``); ``DEFAULT`` where a call names none
CONFIGS = {
    "mg8": Config("mg8", mg=8, threads=128),
    "mg4": Config("mg4", mg=4, threads=128),
    "mg8t256": Config("mg8t256", mg=8, threads=256),
}
DEFAULT = "mg8"


@dataclass(frozen=True)
class Plan(layers.Conv5x5):
    """One layer's compile-time shape under a configuration."""

    config: Config

    @property
    def groups(self) -> int:
        return -(-self.M // self.config.mg)

    @property
    def ho(self) -> int:
        return self.H + 2 * self.pad - R + 1

    @property
    def wo(self) -> int:
        return self.W + 2 * self.pad - R + 1

    def tiles(self, n: int) -> int:
        ty = self.ho // 2 if self.pool else -(-self.ho // 2)
        tx = self.wo // 2 if self.pool else -(-self.wo // 2)
        return n * ty * tx

    @property
    def slab(self) -> int:
        """Floats of one group's transformed filter rows (the block's shared memory)."""
        return self.C * 5 * 6 * self.config.mg

    def macros(self) -> tuple[str, ...]:
        c = self.config
        values = dict(C=self.C, M=self.M, H=self.H, W=self.W, PAD=self.pad, HO=self.ho, WO=self.wo, ACT=self.act,
                      POOL=int(bool(self.pool)), MG=c.mg, THREADS=c.threads, MINB=c.min_blocks)
        return tuple(f"-D{k}={v}" for k, v in values.items())


def module(macros: tuple[str, ...]):
    """The compiled source for one plan (a cupy RawModule on a GPU, else the CPU emulation's)."""
    return gpu.kit_module(SOURCE, macros)


WEIGHTS_BLOCK = 128
#: shared memory a block may hold statically (one group's filter rows must fit)
SHARED_LIMIT = 48 * 1024


def plan_for(x, w, pad: int, stride: int, act: int, pool: int, config: str | Config = DEFAULT) -> Plan:
    """The plan of a call, or a one-line refusal of what the kernel does not do."""
    c = CONFIGS[config] if isinstance(config, str) else config
    p = Plan(**vars(layers.conv5x5("conv_winograd", x, w, pad, stride, act, pool)), config=c)
    if 4 * p.slab > SHARED_LIMIT:
        raise ValueError(f"conv_winograd: {p.C} input channels x {c.mg} outputs a thread need {4 * p.slab} bytes of "
                         f"filter rows a block, over {SHARED_LIMIT}: use a configuration with a smaller mg")
    return p


def conv_winograd(x, w, b, out, pad: int, stride: int = 1, act: int = 0, pool: int = 0,
                  config: str | Config = DEFAULT) -> None:
    """A conv layer function (``labkit.layers``' conv, or fused conv convention: device arrays x (N, C, H, W),
    w (M, C, 5, 5), b (M,), out) by F(2, 5) along the rows: the filter rows' transform, then the conv."""
    p = plan_for(x, w, pad, stride, act, pool, config)
    m = module(p.macros())
    u = gpu.buffer("winograd: transformed filter rows", (p.groups, p.slab))
    gpu.launch_raw(m.get_function("wino_weights"), gpu.blocks(p.groups * p.config.mg * p.C, WEIGHTS_BLOCK),
                   WEIGHTS_BLOCK, (w, u))
    n = x.shape[0]
    gpu.launch_raw(m.get_function("wino_conv"), (gpu.blocks(p.tiles(n), p.config.threads), p.groups),
                   p.config.threads, (x, u, b, out, np.int32(n)))
