"""fc as a CUDA C SGEMM in the style that reaches most of cuBLAS in fp32: the kit's given fc beyond ``labkit.gemm``.

``labkit.gemm`` (numba) keeps a ``tm x tn`` tile of sums in registers a thread; on an H100 fashion's fc1 took 4.04
ms with it against cuBLAS's 1.69 ms. This kernel adds what numba does not let one write plainly:

- both operands staged in shared memory k-major (``As[BK][BM]``, ``Bs[BK][BN]``) from **float4 global loads** along
  K (x and w are both K-contiguous), where K % 4 == 0 and both arrays start on 16 bytes (checked on the host at
  every call; else a second compiled variant loads scalars);
- **double-buffered** shared memory: tile k + 1 goes from global memory into registers before tile k's
  multiply-adds and into the other buffer after them, one ``__syncthreads`` a step;
- **8 x 8 sums a thread** from float4 reads of the shared rows; a thread's 8 rows (and 8 columns) are two groups of
  4, half a tile apart, so that a warp's float4 reads of a row are contiguous (no bank conflict);
- split-K over ``blockIdx.z`` into deterministic planes of partial sums, then ``fc_cuda_sum`` adds the planes and
  the bias (one split: the bias is added in the store, no second kernel).

Every edge is guarded: images, outputs and inputs a multiple of nothing. A configuration (``CONFIGS``; ``DEFAULT``)
fixes the threads along the images (``down``), the inputs a step (``bk``) and the most threads along the outputs;
``plan`` picks the output tile's width from the layer's outputs (160 -> two tiles of 80, 140 -> two of 72, 10 ->
one of 16) and the split count from a cost model of an H100's waves. ``fc_cuda(x, w, b, out, config=...)`` is a
layer function in the fc convention of ``labkit.layers``. One module is compiled per tile shape and load kind
(macros), cached. On a machine without a GPU it runs on the CPU emulation of CUDA C (``labkit.cudacpu``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..launch import gpu

SOURCE = r"""
#ifndef __CUDACC__
// the CPU emulation (labkit.cudacpu) has no vector types: CUDA's float4, 16-byte aligned as on a GPU
struct __align__(16) float4 { float x, y, z, w; };
#endif

extern "C" {
#define THREADS (DOWN * ACROSS)
#define BM (TM * DOWN)  // images a block
#define BN (TN * ACROSS)  // outputs a block
#define ASTRIDE (BM + 4)  // padded rows of the k-major tiles: a multiple of 4 (float4 reads stay aligned)
#define BSTRIDE (BN + 4)
#define A_SLOTS (BM * BK / 4)  // float4 slots of a step's x tile, of its w tile
#define B_SLOTS (BN * BK / 4)
#define A_ROUNDS ((A_SLOTS + THREADS - 1) / THREADS)
#define B_ROUNDS ((B_SLOTS + THREADS - 1) / THREADS)

// four consecutive inputs k .. k + 3 of one row (row < rows), zeros past the row count or the split's end
__device__ __forceinline__ float4 load4(const float* __restrict__ a, int row, int rows, int K, int k, int stop) {
    float4 v;
    v.x = v.y = v.z = v.w = 0.0f;
    if (row >= rows) return v;
    const float* p = a + (size_t)row * K + k;
#if VEC
    if (k < stop) v = __ldg(reinterpret_cast<const float4*>(p));  // k and stop are multiples of 4 here
#else
    if (k < stop) v.x = __ldg(p);
    if (k + 1 < stop) v.y = __ldg(p + 1);
    if (k + 2 < stop) v.z = __ldg(p + 2);
    if (k + 3 < stop) v.w = __ldg(p + 3);
#endif
    return v;
}

// a slot's four inputs into the k-major tile: column `row`, rows kq * 4 .. kq * 4 + 3
__device__ __forceinline__ void stage4(float* s, int stride, int slot, float4 v) {
    int row = slot / (BK / 4), k = (slot % (BK / 4)) * 4;
    s[(k + 0) * stride + row] = v.x;
    s[(k + 1) * stride + row] = v.y;
    s[(k + 2) * stride + row] = v.z;
    s[(k + 3) * stride + row] = v.w;
}

// Grid (output tiles, image tiles, splits), THREADS a block. Split z sums inputs z * span .. min(K, (z + 1) * span)
// into dst + z * N * OUT (planes: add_bias 0), or, with one split, into out with the bias (add_bias 1).
__global__ void __launch_bounds__(THREADS, MINB) fc_cuda_tiles(const float* __restrict__ x,
                                                             const float* __restrict__ w,
                                                             const float* __restrict__ b, float* __restrict__ dst,
                                                             int N, int K, int OUT, int span, int add_bias) {
    __shared__ __align__(16) float As[2][BK * ASTRIDE];  // [buffer][input][image]
    __shared__ __align__(16) float Bs[2][BK * BSTRIDE];  // [buffer][input][output]
    const int tid = threadIdx.x, tx = tid % ACROSS, ty = tid / ACROSS;
    const int o0 = blockIdx.x * BN, n0 = blockIdx.y * BM;
    const int start = blockIdx.z * span, stop = min(K, start + span);
    const float* xb = x + (size_t)n0 * K;
    const float* wb = w + (size_t)o0 * K;
    const int rows = min(BM, N - n0), cols = min(BN, OUT - o0);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    float4 pa[A_ROUNDS], pb[B_ROUNDS];  // the next step's tiles on their way from global memory
#pragma unroll
    for (int r = 0; r < A_ROUNDS; ++r) {
        int slot = tid + r * THREADS;
        if (slot < A_SLOTS) pa[r] = load4(xb, slot / (BK / 4), rows, K, start + (slot % (BK / 4)) * 4, stop);
    }
#pragma unroll
    for (int r = 0; r < B_ROUNDS; ++r) {
        int slot = tid + r * THREADS;
        if (slot < B_SLOTS) pb[r] = load4(wb, slot / (BK / 4), cols, K, start + (slot % (BK / 4)) * 4, stop);
    }
#pragma unroll
    for (int r = 0; r < A_ROUNDS; ++r)
        if (tid + r * THREADS < A_SLOTS) stage4(As[0], ASTRIDE, tid + r * THREADS, pa[r]);
#pragma unroll
    for (int r = 0; r < B_ROUNDS; ++r)
        if (tid + r * THREADS < B_SLOTS) stage4(Bs[0], BSTRIDE, tid + r * THREADS, pb[r]);
    __syncthreads();

    int buf = 0;
    for (int k0 = start; k0 < stop; k0 += BK) {
        const bool more = k0 + BK < stop;
        if (more) {  // step k + 1 into registers: its loads are in flight during step k's multiply-adds
#pragma unroll
            for (int r = 0; r < A_ROUNDS; ++r) {
                int slot = tid + r * THREADS;
                if (slot < A_SLOTS) pa[r] = load4(xb, slot / (BK / 4), rows, K, k0 + BK + (slot % (BK / 4)) * 4, stop);
            }
#pragma unroll
            for (int r = 0; r < B_ROUNDS; ++r) {
                int slot = tid + r * THREADS;
                if (slot < B_SLOTS) pb[r] = load4(wb, slot / (BK / 4), cols, K, k0 + BK + (slot % (BK / 4)) * 4, stop);
            }
        }
        const float* as = As[buf];
        const float* bs = Bs[buf];
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], bv[TN];
#pragma unroll
            for (int c = 0; c < TM / 4; ++c) {  // rows c * 4 * DOWN + ty * 4 .. + 3
                float4 v = *reinterpret_cast<const float4*>(as + k * ASTRIDE + c * 4 * DOWN + ty * 4);
                a[4 * c] = v.x, a[4 * c + 1] = v.y, a[4 * c + 2] = v.z, a[4 * c + 3] = v.w;
            }
#pragma unroll
            for (int c = 0; c < TN / 4; ++c) {
                float4 v = *reinterpret_cast<const float4*>(bs + k * BSTRIDE + c * 4 * ACROSS + tx * 4);
                bv[4 * c] = v.x, bv[4 * c + 1] = v.y, bv[4 * c + 2] = v.z, bv[4 * c + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * bv[j];
        }
        if (more) {  // into the other buffer, last read a step ago, before the barrier that ended that step
#pragma unroll
            for (int r = 0; r < A_ROUNDS; ++r)
                if (tid + r * THREADS < A_SLOTS) stage4(As[buf ^ 1], ASTRIDE, tid + r * THREADS, pa[r]);
#pragma unroll
            for (int r = 0; r < B_ROUNDS; ++r)
                if (tid + r * THREADS < B_SLOTS) stage4(Bs[buf ^ 1], BSTRIDE, tid + r * THREADS, pb[r]);
        }
        __syncthreads();
        buf ^= 1;
    }

    float* d = dst + (size_t)blockIdx.z * N * OUT;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int n = (i / 4) * 4 * DOWN + ty * 4 + i % 4;
        if (n >= rows) continue;
        float* row = d + (size_t)(n0 + n) * OUT + o0;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int o = (j / 4) * 4 * ACROSS + tx * 4 + j % 4;
            if (o < cols) row[o] = add_bias ? acc[i][j] + b[o0 + o] : acc[i][j];
        }
    }
}

"""

#: the planes' sum, a kernel of every split-K fc's module (``labkit.ops.fc_tensor_cores`` takes it too)
SUM_SOURCE = r"""
// out[n, o] = b[o] + the planes' sum at (n, o), in plane order: a thread an output
__global__ void fc_cuda_sum(const float* __restrict__ part, const float* __restrict__ b, float* __restrict__ out,
                            int N, int OUT, int planes) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, size = (size_t)N * OUT;
    if (t >= size) return;
    float total = b[t % OUT];
    for (int z = 0; z < planes; ++z) total += part[z * size + t];
    out[t] = total;
}
"""

SOURCE += SUM_SOURCE + "}\n"


@dataclass(frozen=True)
class Config:
    """A family of tiles: ``down`` threads along the images (``bm = tm * down``), ``bk`` inputs a step, at most
    ``max_across`` threads along the outputs (``bn = tn * across``, ``across`` picked from the layer's outputs).
    ``tm`` and ``tn`` are multiples of 4 (float4 reads of the shared rows). ``registers``: a thread's budget, which
    sets the blocks a multiprocessor must hold (``Plan.min_blocks``, ``__launch_bounds__``)."""

    name: str
    down: int
    bk: int
    max_across: int
    tm: int = 8
    tn: int = 8
    registers: int = 128

    def __post_init__(self):
        if self.tm % 4 or self.tn % 4 or min(self.tm, self.tn, self.down, self.max_across) < 1:
            raise ValueError(f"Config {self.name}: tm and tn must be positive multiples of 4, down and max_across "
                             f"at least 1")
        if self.bk % 4 or self.bk < 4:
            raise ValueError(f"Config {self.name}: bk must be a positive multiple of 4 (float4 slots), not {self.bk}")


#: the configurations a GPU run compares (``tools/fc_gemm_timing.py``): 128 images a block with 8 or 16 inputs a
#: step, and 64 images by up to 256 outputs (fashion's fc1: 64 x 160 tiles, one across the outputs). ptxas (NVRTC
#: 12.9, sm_90) for fc1's tiles of 160 threads: k8 and wide fit 128 registers without a spill, three blocks a
#: multiprocessor; k16's four rounds of x loads in flight spill at 128 (196 bytes), so it gets 168 and two blocks
CONFIGS = {
    "k8": Config("k8", down=16, bk=8, max_across=16),
    "k16": Config("k16", down=16, bk=16, max_across=16, registers=168),
    "wide": Config("wide", down=8, bk=16, max_across=32),
}
DEFAULT = "k8"


@dataclass(frozen=True)
class Plan:
    """A configuration's tile for one layer (``across`` threads along the outputs), its split count, and whether
    the loads are float4 (``vec``)."""

    config: Config
    across: int
    splits: int = 1
    vec: bool = False

    @property
    def bm(self) -> int:
        return self.config.tm * self.config.down

    @property
    def bn(self) -> int:
        return self.config.tn * self.across

    @property
    def threads(self) -> int:
        return self.config.down * self.across

    @property
    def min_blocks(self) -> int:
        """Blocks a multiprocessor should hold (``__launch_bounds__``): as many as the configuration's registers a
        thread allow, at most ``MOST_BLOCKS`` (narrow tiles: more would cap a thread's registers below its sums)."""
        warps = -(-self.threads // 32)
        return max(1, min(REGISTERS // (warps * 32 * self.config.registers), 2048 // (warps * 32), MOST_BLOCKS))

    def span(self, inputs: int) -> int:
        """Inputs per split: a whole number of steps (so of float4 slots); the last split takes what is left."""
        per = -(-inputs // max(1, self.splits))
        return max(self.config.bk, -(-per // self.config.bk) * self.config.bk)

    def planes(self, inputs: int) -> int:
        """Splits that hold inputs once ``span`` has rounded up (never an empty one)."""
        return max(1, -(-inputs // self.span(inputs)))

    def macros(self) -> tuple[str, ...]:
        c = self.config
        return (f"-DTM={c.tm}", f"-DTN={c.tn}", f"-DDOWN={c.down}", f"-DACROSS={self.across}", f"-DBK={c.bk}",
                f"-DMINB={self.min_blocks}", f"-DVEC={int(self.vec)}")

    def __str__(self) -> str:
        c = self.config
        return (f"{c.name}: {self.bm} x {self.bn} tiles, {c.tm} x {c.tn} a thread, {c.bk} inputs a step, "
                f"{self.splits} split{'s' * (self.splits != 1)}{', float4 loads' if self.vec else ''}")


# ------------------------------------------------------------------------------------------------------ choosing

#: registers of a multiprocessor (every GPU since sm_50)
REGISTERS = 65536
#: the most blocks ``__launch_bounds__`` asks a multiprocessor to hold
MOST_BLOCKS = 8
#: the cost model's fp32 rate of a multiprocessor (128 FMA a cycle at 1.75 GHz, at 70 per cent) and the memory's
#: bytes a second a plane's store and reload cost
SM_FLOPS = 2 * 128 * 1.75e9 * 0.7
BANDWIDTH = 2.5e12
#: a launch of the planes' sum, in seconds
LAUNCH = 4e-6
#: the fewest inputs a split gets on a GPU
MIN_SPAN = 256
#: splits on the CPU emulation, where K allows: its small checks then cross a split
EMULATION_SPLITS = 2


def across_for(config: Config, OUT: int) -> int:
    """Threads along the outputs: the fewest tiles of at most ``max_across`` threads that cover OUT, then the
    narrowest tile of that count (160 outputs, 16 at most: two tiles of 10 x 8 = 80; 140: two of 72; 10: one of 16)."""
    groups = -(-OUT // config.tn)
    tiles = -(-groups // config.max_across)
    return -(-groups // tiles)


def cost(p: Plan, N: int, K: int, OUT: int, sms: int) -> float:
    """Seconds by the model: waves of blocks (``min_blocks`` resident a multiprocessor) times a block's steps, plus
    the planes' stores and reloads and the sum's launch when K is split."""
    tiles = math.ceil(N / p.bm) * math.ceil(OUT / p.bn)
    waves = math.ceil(tiles * p.planes(K) / (sms * p.min_blocks))
    block = 2 * p.bm * p.bn * p.span(K) / (SM_FLOPS / p.min_blocks)
    planes = 0.0 if p.planes(K) == 1 else (2 * p.planes(K) + 1) * N * OUT * 4 / BANDWIDTH + LAUNCH
    return waves * block + planes


def plan(N: int, K: int, OUT: int, config: str | Config = DEFAULT, sms: int | None = None,
         vec: bool = False) -> Plan:
    """The plan of ``config`` for N images, K inputs, OUT outputs: its tile width (``across_for``) and the split
    count of least ``cost`` (at most K // MIN_SPAN) on ``sms`` multiprocessors (the device's; an H100's where there
    is none). On the CPU emulation ``EMULATION_SPLITS`` where K holds that many steps."""
    c = CONFIGS[config] if isinstance(config, str) else config
    base = Plan(c, across_for(c, OUT), 1, vec)
    if gpu.cuda_c_on_cpu() and sms is None:
        return Plan(c, base.across, max(1, min(EMULATION_SPLITS, K // c.bk)), vec)
    sms = sms or gpu.multiprocessors()
    options = [Plan(c, base.across, s, vec) for s in range(1, max(1, K // MIN_SPAN) + 1)]
    options = [p for p in options if p.planes(K) == p.splits]  # a split count that rounding leaves empty: no
    return min(options, key=lambda p: (cost(p, N, K, OUT, sms), p.splits))


# ------------------------------------------------------------------------------------------------------ running


def module(macros: tuple[str, ...]):
    """The compiled source for one plan's macros (a cupy RawModule on a GPU, else the CPU emulation's)."""
    return gpu.kit_module(SOURCE, macros)


def address(a) -> int:
    """The device address of an array's first element (cupy, numba, PyTorch, the simulator's)."""
    if type(a).__module__.startswith("cupy"):
        return int(a.data.ptr)
    return int(gpu._raw_arg(a, 0))


def float4_ok(x, w) -> bool:
    """Whether float4 loads along K are safe: K a multiple of 4 and both arrays starting on 16 bytes (then every
    row does). The kit's checks hand inputs at any offset inside NaN-margined buffers: tested every call."""
    return x.shape[1] % 4 == 0 and address(x) % 16 == 0 and address(w) % 16 == 0


SUM_BLOCK = 256


def launch(p: Plan, x, w, b, out) -> None:
    """out = x @ w.T + b by plan ``p``: one launch with the bias in the store without a split, else the planes
    (pooled buffer) and ``fc_cuda_sum``. A plan whose ``vec`` the inputs do not allow is refused."""
    N, K = x.shape
    OUT = w.shape[0]
    if p.vec and not float4_ok(x, w):
        raise ValueError(f"launch: float4 loads need K % 4 == 0 and 16-byte aligned x and w (K = {K})")
    m = module(p.macros())
    span, planes = p.span(K), p.planes(K)
    grid = (gpu.blocks(OUT, p.bn), gpu.blocks(N, p.bm), planes)
    ints = tuple(np.int32(v) for v in (N, K, OUT, span))
    launch_split_k(m, "fc_cuda_tiles", grid, p.threads, (x, w), b, out, ints, planes, "fc_cuda: partial sums")


def launch_split_k(m, name: str, grid, threads: int, head: tuple, b, out, ints: tuple, planes: int, role: str,
                   shared_bytes: int = 0) -> None:
    """Module ``m``'s split-K kernel ``name`` (arguments ``*head, b, dst, *ints, add_bias``): with one split into
    ``out`` with the bias, else into ``planes`` pooled planes (``role``) that ``fc_cuda_sum`` (``SUM_SOURCE``, in
    ``m``) adds with the bias. The kit's every split-K fc in CUDA C launches through here."""
    N, OUT = out.shape
    kernel = m.get_function(name)
    if planes == 1:
        gpu.launch_raw(kernel, grid, threads, (*head, b, out, *ints, np.int32(1)), shared_bytes=shared_bytes)
        return
    part = gpu.buffer(role, (planes, N, OUT))
    gpu.launch_raw(kernel, grid, threads, (*head, b, part, *ints, np.int32(0)), shared_bytes=shared_bytes)
    gpu.launch_raw(m.get_function("fc_cuda_sum"), gpu.blocks(N * OUT, SUM_BLOCK), SUM_BLOCK,
                   (part, b, out, np.int32(N), np.int32(OUT), np.int32(planes)))


def fc_cuda(x, w, b, out, config: str | Config = DEFAULT) -> None:
    """The fc layer (``labkit.layers``: x (N, K), w (OUT, K), b (OUT,), out (N, OUT), device arrays) as the CUDA C
    SGEMM, by ``plan`` for its shape in ``config`` (a name of ``CONFIGS`` or a ``Config``), float4 loads where the
    inputs allow them."""
    N, K = x.shape
    launch(plan(N, K, w.shape[0], config, vec=float4_ok(x, w)), x, w, b, out)
