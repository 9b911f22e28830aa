"""fc on the tensor cores at fp32's accuracy: the kit's fc one step past ``labkit.gemm_cuda``'s FMA SGEMM.

fashion's fc1 (10000 images x 20184 inputs x 160 outputs) is a third of the net's multiply-adds, and the CUDA C
SGEMM ran it at under half of an H100's FMA rate (2.27 ms; on an H200 2.69 ms, this kernel 1.04: ``CONFIGS``).
``mma.sync`` multiplies fp16 about ten times faster than the FMA units (``tools/mma_rates.py``); the split of
``labkit.tensor_cores``' conv keeps fp32's accuracy with
three of its products (``labkit.ops.mma_source``: ``a = big + small / 2^11``; big·big into one sum, big·small and
small·big into a second, 2^11 times larger, the dropped small·small about 2^-22 of a product).

- The weights are split once a call by a small kernel (``fc_split_weights``) into the order of the MMA's B fragment:
  a lane's two k pairs of one output, big and small, in one 16-byte word, zero past K and past the outputs.
- A block takes ``BM`` images and ``BN`` outputs (every output of a narrow layer: x is then read once). Its warps are
  ``WM`` along the images by ``WN`` along the outputs; a warp owns ``MT`` tiles of 16 images by ``NT`` of 8 outputs.
- A step is 16 inputs. ``stages`` steps' x tiles and weight words are in shared memory at once: ``cp.async`` copies
  the next ``stages - 1`` steps (16 bytes a copy where K allows, else 4) while this step's MMAs run, with no
  registers held for them; one barrier a step.
- A lane splits the x values of its A fragments as it reads them from shared memory (rows padded so that a warp's
  reads hit 32 banks); a value fp16 cannot hold becomes a NaN, which every check reports.
- Split-K over ``blockIdx.z`` into deterministic planes, added with the bias by ``gemm_cuda``'s ``fc_cuda_sum``
  (one split: the bias in the store).

``fc_split3(x, w, b, out)`` is a layer function in the fc convention of ``labkit.layers``; ``plan`` picks the split
count from a model of a device's waves. On a machine without a GPU it runs on the CPU emulation of CUDA C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..launch import gpu
from . import gemm_cuda, mma_source

HEAD = r"""
#define THREADS (WM * WN * 32)
#define BM (WM * MT * 16)  // images a block
#define NTILES (WN * NT)  // tiles of 8 outputs a block
#define BK 16  // inputs a step: one m16n8k16 MMA's
#define AS_STRIDE (BK + 8)  // a staged row of x, in floats: a warp's 8-byte reads of rows g, k 2t hit 32 banks
#define A_SLOTS (BM * BK / 4)  // 16-byte slots of a step's x tile
#define B_SLOTS (NTILES * 32)  // 16-byte weight words of a step
#define A_BYTES (BM * AS_STRIDE * 4)
#define STAGE_BYTES (A_BYTES + B_SLOTS * 16)
#define SMEM_BYTES (STAGES * STAGE_BYTES)

extern "C" {
"""

BODY = r"""
// the B fragments of w (OUT x K) for every step and tile of 8 outputs: word (step, tile, lane (g, t)) holds output
// tile * 8 + g at k = step * 16 + 2t, 2t + 1 (x) and + 8, + 9 (y) as big fp16 halves, then their small halves (z, w)
__global__ void fc_split_weights(const float* __restrict__ w, uint4* __restrict__ wsp, int K, int OUT, int steps,
                                 int tiles) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= steps * tiles * 32) return;
    const int l = i & 31, m = (i >> 5) % tiles * 8 + (l >> 2), k = i / (tiles * 32) * 16 + 2 * (l & 3);
    float v[4];
    for (int e = 0; e < 4; ++e) {
        const int ke = k + (e & 1) + 8 * (e >> 1);
        v[e] = (m < OUT && ke < K) ? half_range(w[(size_t)m * K + ke]) : 0.0f;
    }
    uint4 q;
    split_h2(v[0], v[1], q.x, q.z);
    split_h2(v[2], v[3], q.y, q.w);
    wsp[i] = q;
}

#ifdef __CUDACC__
extern __shared__ __align__(16) unsigned char dsmem[];
// copies of 16 or 4 bytes from global into shared memory that run while the warp goes on; `bytes` 0: zeros
__device__ __forceinline__ void copy16(void* to, const void* from, int bytes) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(to);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(from), "r"(bytes));
}
__device__ __forceinline__ void copy4(void* to, const void* from, int bytes) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(to);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(at), "l"(from), "r"(bytes));
}
// the copies issued since the last one as a group; wait until at most STAGES - 2 groups are on their way
__device__ __forceinline__ void copies_issued() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copies_landed() { asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2)); }
#else
// the CPU emulation: a copy lands at once
__shared__ __align__(16) unsigned char dsmem[SMEM_BYTES];
static inline void copy16(void* to, const void* from, int bytes) {
    memset(to, 0, 16);
    if (bytes) memcpy(to, from, bytes);
}
static inline void copy4(void* to, const void* from, int bytes) {
    memset(to, 0, 4);
    if (bytes) memcpy(to, from, bytes);
}
static inline void copies_issued() {}
static inline void copies_landed() {}
#endif

// step k0's x tile (BM images x 16 inputs; zeros past the images or the split's end) and weight words into stage st
__device__ __forceinline__ void fetch(unsigned char* st, const float* __restrict__ xb, const uint4* __restrict__ wsp,
                                      int rows, int K, int k0, int stop, int tile0, int tiles, int tid) {
    float* as = reinterpret_cast<float*>(st);
    uint4* bs = reinterpret_cast<uint4*>(st + A_BYTES);
    for (int slot = tid; slot < A_SLOTS; slot += THREADS) {
        const int row = slot / (BK / 4), k = k0 + slot % (BK / 4) * 4;
        float* to = as + row * AS_STRIDE + slot % (BK / 4) * 4;
        const float* from = xb + (size_t)row * K + k;
#if VEC
        const bool ok = row < rows && k < stop;  // k and stop are multiples of 4 here
        copy16(to, ok ? from : xb, ok ? 16 : 0);
#else
        for (int j = 0; j < 4; ++j) {
            const bool ok = row < rows && k + j < stop;
            copy4(to + j, ok ? from + j : xb, ok ? 4 : 0);
        }
#endif
    }
    for (int slot = tid; slot < B_SLOTS; slot += THREADS) {
        const int tile = tile0 + slot / 32;
        const bool ok = tile < tiles;
        copy16(bs + slot, ok ? wsp + ((size_t)(k0 / 16) * tiles + tile) * 32 + slot % 32 : wsp, ok ? 16 : 0);
    }
}

// Grid (image tiles, output tiles, splits), THREADS a block, SMEM_BYTES of dynamic shared memory. Split z sums the
// steps of inputs z * span .. min(K, (z + 1) * span) (span a multiple of 16) into dst + z * N * OUT, or with one
// split into out with the bias. STAGES steps' tiles are in shared memory at once: STAGES - 1 on their way while
// one is multiplied.
__global__ void __launch_bounds__(THREADS, MINB)
fc_split3(const float* __restrict__ x, const uint4* __restrict__ wsp, const float* __restrict__ b,
          float* __restrict__ dst, int N, int K, int OUT, int tiles, int span, int add_bias) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int n0 = blockIdx.x * BM, tile0 = blockIdx.y * NTILES;
    const int start = blockIdx.z * span, stop = min(K, start + span), steps = (stop - start + BK - 1) / BK;
    const int rows = min(BM, N - n0);
    const float* xb = x + (size_t)n0 * K;

    float acc[MT][NT][4], lo[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[mt][nt][r] = lo[mt][nt][r] = 0.0f;

    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) fetch(dsmem + s * STAGE_BYTES, xb, wsp, rows, K, start + s * BK, stop, tile0, tiles, tid);
        copies_issued();  // a group each stage, empty or not: the wait counts groups
    }
    for (int it = 0; it < steps; ++it) {
        copies_landed();  // this thread's copies of step it are in
        __syncthreads();  // and every thread's; every thread is also done with step it - 1's stage
        const int next = it + STAGES - 1;
        if (next < steps)
            fetch(dsmem + next % STAGES * STAGE_BYTES, xb, wsp, rows, K, start + next * BK, stop, tile0, tiles, tid);
        copies_issued();
        const float* as = reinterpret_cast<const float*>(dsmem + it % STAGES * STAGE_BYTES);
        const uint4* bs = reinterpret_cast<const uint4*>(dsmem + it % STAGES * STAGE_BYTES + A_BYTES);
        // lane (g, t)'s A fragments: rows g and g + 8 of each of its tiles, inputs 2t, 2t + 1 and 2t + 8, 2t + 9,
        // each in fp16's range or a NaN
        unsigned hi[MT][4], sm[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float* r0 = as + ((wm * MT + mt) * 16 + g) * AS_STRIDE + 2 * t;
            const float* r1 = r0 + 8 * AS_STRIDE;
            const float2 a[4] = {*reinterpret_cast<const float2*>(r0), *reinterpret_cast<const float2*>(r1),
                                 *reinterpret_cast<const float2*>(r0 + 8), *reinterpret_cast<const float2*>(r1 + 8)};
#pragma unroll
            for (int e = 0; e < 4; ++e) split_h2(half_range(a[e].x), half_range(a[e].y), hi[mt][e], sm[mt][e]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint4 bq = bs[(wn * NT + nt) * 32 + lane];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {  // the small terms into sums of their own, LO_SCALE larger
                mma16(lo[mt][nt], sm[mt], bq.x, bq.y);
                mma16(lo[mt][nt], hi[mt], bq.z, bq.w);
                mma16(acc[mt][nt], hi[mt], bq.x, bq.y);
            }
        }
    }

    // lane (g, t) holds rows g and g + 8 of each tile, outputs 2t and 2t + 1 of each tile of 8
    float* d = dst + (size_t)blockIdx.z * N * OUT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int n = n0 + (wm * MT + mt) * 16 + g + 8 * (r >> 1);
                const int o = (tile0 + wn * NT + nt) * 8 + 2 * t + (r & 1);
                if (n < N && o < OUT) {
                    const float v = acc[mt][nt][r] + lo[mt][nt][r] * (1.0f / LO_SCALE);
                    d[(size_t)n * OUT + o] = add_bias ? v + b[o] : v;
                }
            }
}
"""

SOURCE = HEAD + mma_source.DEVICE + BODY + gemm_cuda.SUM_SOURCE + "}\n"


@dataclass(frozen=True)
class Config:
    """A block's shape: ``wm`` x ``wn`` warps, a warp ``mt`` tiles of 16 images by at most ``max_nt`` tiles of 8
    outputs (``nt`` is picked from the layer's outputs: the fewest output tiles a block, then the narrowest).
    ``registers``: a thread's budget, which sets the blocks a multiprocessor must hold (``__launch_bounds__``)."""

    name: str
    wm: int
    wn: int
    mt: int
    max_nt: int
    registers: int = 255
    stages: int = 4
    f16: bool = True  # what labkit.floors reads: three fp16 passes a multiply-add

    def __post_init__(self):
        if min(self.wm, self.wn, self.mt, self.max_nt) < 1 or self.stages < 2:
            raise ValueError(f"Config {self.name}: wm, wn, mt and max_nt must be at least 1, stages at least 2")


#: the configurations a GPU run compares (``tools/fc_gemm_timing.py``, ``results/h200-2026-11-28``, an H200, medians
#: of 30): with ``cp.async`` four steps ahead, fashion's fc1 at 10000 images took 1.04 ms in ``m128`` (8 warps, a
#: warp 32 x 80, 250 registers) and 1.13-1.21 ms in the others, against cuBLAS's fp32 SGEMM 1.65 and
#: ``gemm_cuda.fc_cuda`` 2.69; with the next step's tiles in registers instead, 1.79 ms (``m128``). At 1000 images
#: and on ece408's fc1 every shape was within 5 per cent of the others; ``mt1s6`` and ``w4s6`` (six stages)
#: bought nothing over four
CONFIGS = {
    "m128": Config("m128", wm=4, wn=2, mt=2, max_nt=10),
    "n160": Config("n160", wm=2, wn=4, mt=2, max_nt=5, registers=128),
    "mt1": Config("mt1", wm=8, wn=2, mt=1, max_nt=10, registers=128),
    "mt1s3": Config("mt1s3", wm=8, wn=2, mt=1, max_nt=10, registers=128, stages=3),
    "mt1s6": Config("mt1s6", wm=8, wn=2, mt=1, max_nt=10, registers=128, stages=6),
    "w4s6": Config("w4s6", wm=4, wn=2, mt=1, max_nt=10, registers=128, stages=6),
}
DEFAULT = "m128"


@dataclass(frozen=True)
class Plan:
    """A configuration's block for one layer (``nt`` output tiles a warp), its split count and whether x's loads are
    float4 (``vec``)."""

    config: Config
    nt: int
    splits: int = 1
    vec: bool = False

    @property
    def bm(self) -> int:
        return self.config.wm * self.config.mt * 16

    @property
    def tiles(self) -> int:
        """Tiles of 8 outputs a block."""
        return self.config.wn * self.nt

    @property
    def threads(self) -> int:
        return self.config.wm * self.config.wn * 32

    @property
    def min_blocks(self) -> int:
        warps = self.threads // 32
        return max(1, min(gemm_cuda.REGISTERS // (warps * 32 * self.config.registers), 2048 // (warps * 32)))

    def span(self, inputs: int) -> int:
        """Inputs per split: whole steps of 16; the last split takes what is left."""
        per = -(-inputs // max(1, self.splits))
        return max(16, -(-per // 16) * 16)

    def planes(self, inputs: int) -> int:
        return max(1, -(-inputs // self.span(inputs)))

    def macros(self) -> tuple[str, ...]:
        c = self.config
        return (f"-DWM={c.wm}", f"-DWN={c.wn}", f"-DMT={c.mt}", f"-DNT={self.nt}", f"-DMINB={self.min_blocks}",
                f"-DVEC={int(self.vec)}", f"-DSTAGES={c.stages}")

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory a block takes: ``stages`` steps' x tiles (rows padded to 24 floats) and weights."""
        return self.config.stages * (self.bm * 24 * 4 + self.tiles * 32 * 16)

    def __str__(self) -> str:
        return (f"{self.config.name}: {self.bm} x {8 * self.tiles} blocks, {self.splits} "
                f"split{'s' * (self.splits != 1)}{', float4 loads' if self.vec else ''}")


#: the cost model: a multiprocessor's split products (fp16 m16n8k16 MMAs, multiply-adds a second, at 50 per cent of
#: an H100's measured 323 T over 132 multiprocessors) and the bytes a second a plane's store and reload cost
SM_MACS = 0.5 * 323e12 / 132
#: the fewest inputs a split gets on a GPU
MIN_SPAN = 512


def nt_for(config: Config, OUT: int) -> int:
    """Output tiles a warp: the fewest blocks along the outputs, then the narrowest warp that covers them."""
    groups = -(-OUT // 8)
    blocks = -(-groups // (config.wn * config.max_nt))
    return -(-groups // (blocks * config.wn))


def cost(p: Plan, N: int, K: int, OUT: int, sms: int) -> float:
    """Seconds by the model: waves of blocks times a block's three products a multiply-add, plus the planes."""
    blocks = math.ceil(N / p.bm) * math.ceil(OUT / (8 * p.tiles))
    waves = math.ceil(blocks * p.planes(K) / (sms * p.min_blocks))
    block = 3 * p.bm * 8 * p.tiles * p.span(K) / (SM_MACS / p.min_blocks)
    planes = 0.0 if p.planes(K) == 1 else (2 * p.planes(K) + 1) * N * OUT * 4 / gemm_cuda.BANDWIDTH + gemm_cuda.LAUNCH
    return waves * block + planes


def plan(N: int, K: int, OUT: int, config: str | Config = DEFAULT, sms: int | None = None,
         vec: bool = False) -> Plan:
    """The plan of ``config`` for N images, K inputs and OUT outputs: its warps' output tiles (``nt_for``) and the
    split count of least ``cost`` on ``sms`` multiprocessors (the device's). On the CPU emulation two splits where K
    holds two steps, so that its checks cross a split."""
    c = CONFIGS[config] if isinstance(config, str) else config
    nt = nt_for(c, OUT)
    if gpu.cuda_c_on_cpu() and sms is None:
        return Plan(c, nt, max(1, min(gemm_cuda.EMULATION_SPLITS, K // 16)), vec)
    sms = sms or gpu.multiprocessors()
    options = [Plan(c, nt, s, vec) for s in range(1, max(1, K // MIN_SPAN) + 1)]
    options = [p for p in options if p.planes(K) == p.splits]
    return min(options, key=lambda p: (cost(p, N, K, OUT, sms), p.splits))


def module(macros: tuple[str, ...]):
    """The compiled source for one plan's macros (a cupy RawModule on a GPU, else the CPU emulation's)."""
    return gpu.kit_module(SOURCE, macros)


SPLIT_BLOCK = 256


def split_weights(m, w, K: int, OUT: int):
    """w's B fragments, split (``fc_split_weights``), in a pooled buffer: steps x output tiles x 32 words of 16
    bytes, zero past K and past the outputs."""
    steps, tiles = -(-K // 16), -(-OUT // 8)
    wsp = gpu.buffer("fc_split3: split weights", (steps * tiles * 32 * 4,), np.uint32)
    gpu.launch_raw(m.get_function("fc_split_weights"), gpu.blocks(steps * tiles * 32, SPLIT_BLOCK), SPLIT_BLOCK,
                   (w, wsp, np.int32(K), np.int32(OUT), np.int32(steps), np.int32(tiles)))
    return wsp, tiles


def launch(p: Plan, x, w, b, out) -> None:
    """out = x @ w.T + b by plan ``p``: the weights split, then one launch with the bias in the store without a
    split, else the planes (pooled buffer) and ``fc_cuda_sum``. A plan whose ``vec`` the inputs do not allow is
    refused."""
    N, K = x.shape
    OUT = w.shape[0]
    if p.vec and not (K % 4 == 0 and gemm_cuda.address(x) % 16 == 0):
        raise ValueError(f"launch: float4 loads need K % 4 == 0 and a 16-byte aligned x (K = {K})")
    m = module(p.macros())
    wsp, tiles = split_weights(m, w, K, OUT)
    span, planes = p.span(K), p.planes(K)
    grid = (gpu.blocks(N, p.bm), -(-tiles // p.tiles), planes)
    ints = tuple(np.int32(v) for v in (N, K, OUT, tiles, span))
    shared = 0 if gpu.cuda_c_on_cpu() else p.shared_bytes  # the emulation's shared array has its size in the source
    gemm_cuda.launch_split_k(m, "fc_split3", grid, p.threads, (x, wsp), b, out, ints, planes,
                             "fc_split3: partial sums", shared_bytes=shared)


def fc_split3(x, w, b, out, config: str | Config = DEFAULT) -> None:
    """The fc layer (``labkit.layers``: x (N, K), w (OUT, K), b (OUT,), out (N, OUT), device arrays) on the tensor
    cores at fp32's accuracy, by ``plan`` for its shape in ``config``; float4 loads where x allows them."""
    N, K = x.shape
    vec = K % 4 == 0 and gemm_cuda.address(x) % 16 == 0
    launch(plan(N, K, w.shape[0], config, vec=vec), x, w, b, out)


#: what ``labkit.floors`` reads off a layer function: three fp16 passes a multiply-add
fc_split3.tensor_core_config = CONFIGS[DEFAULT]
