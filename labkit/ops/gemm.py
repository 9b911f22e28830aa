"""fc as a register-tiled matrix product, split over K: the kit's given step beyond stage 10's task 1.

Stage 10's task 1 gives each thread one output and reads both of its operands from shared memory for every
multiply-add. Here a block of threads owns a ``bm x bn`` tile of the output (``bm`` images by ``bn`` outputs) and
each thread a ``tm x tn`` part of it, whose sums stay in registers. Per input of a step a thread reads ``tm`` values
of ``x`` and ``tn`` of ``w`` from shared memory into registers and does ``tm * tn`` multiply-adds with them:
``(tm + tn) / (tm * tn)`` shared loads per multiply-add, 0.225 for 8 x 10 against task 1's 2. The blocks also split
the inputs (grid z, split-K): each split sums its own range of ``K`` into a plane of partial sums and ``add_planes``
adds the planes and the bias (no atomics: the same sum in the same order every run).

``fc_tiles(x, w, b, out)`` is a layer function in the fc convention of ``labkit.layers``; ``plan(N, K, OUT)`` picks
its tiles and split count from the layer's shape and the device (``Plan``). ``launch(plan, ...)`` runs any plan, and
two stores the kit's layer does not use (one split with the bias added in place; atomics into an output holding the
bias), which ``tools/whole_job_probe.py`` measures beside it.

Measured by that probe on an H100 (results/h100-2026-11-25c): fashion's fc1 (10000 x 20184 times 20184 x 160) in
4.33 ms with 128 x 160 tiles of 8 x 10 per thread and 16 splits, the plan ``plan`` makes there; 10.5 ms for
``lk.kernels.fc``; 1.69 ms for cuBLAS (fp32, TF32 off). Without splits the same tiles took 12.3 ms: 79 blocks of 256
threads leave most of 132 multiprocessors idle.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from ..launch import gpu, simulator

#: unsigned indices in the tiles' loops: numba then leaves out its negative-index wraparound, which took a third of
#: the registers (ptxas, sm_90: 166 -> 128 for the 8 x 10 tile, no spills)
U = np.uint64
#: how a split's sums reach ``dst``: "planes" (each split its own plane of ``dst`` (splits, N, OUT), no bias); "bias"
#: (one split, the bias added; ``dst`` (1, N, OUT)); "atomic" (each split adds its sums into ``dst`` (1, N, OUT)
#: holding the bias: ``fill_bias`` first)
STORES = ("planes", "bias", "atomic")


@dataclass(frozen=True)
class Tiles:
    """A block's output tile (``bm`` images x ``bn`` outputs), each thread's part of it (``tm`` x ``tn`` sums in
    registers) and the inputs staged in shared memory per step (``bk``)."""

    bm: int
    bn: int
    tm: int
    tn: int
    bk: int = 16

    def __post_init__(self):
        if min(self.bm, self.bn, self.tm, self.tn, self.bk) < 1:
            raise ValueError(f"Tiles: every size must be at least 1, got {self}")
        if self.bm % self.tm or self.bn % self.tn:
            raise ValueError(f"Tiles: a {self.bm} x {self.bn} tile is not a whole number of {self.tm} x {self.tn} parts")
        if self.threads % self.bk:
            raise ValueError(f"Tiles: {self.threads} threads do not load whole rows of {self.bk} inputs")

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def layout(self) -> tuple[int, int, int, int, int]:
        """(threads along the outputs, along the images; rows of a step's slice loaded at once, as each thread keeps
        one input column; rounds to load the x slice, the w slice: constant trip counts, so unrolled with no
        division per element)."""
        rows = self.threads // self.bk
        return self.bn // self.tn, self.bm // self.tm, rows, -(-self.bm // rows), -(-self.bn // rows)

    def __str__(self) -> str:
        return f"{self.bm} x {self.bn} tiles, {self.tm} x {self.tn} per thread, {self.bk} inputs a step"


@dataclass(frozen=True)
class Plan:
    """Tiles and how many ranges of the inputs the blocks split (``splits``; 1: no split)."""

    tiles: Tiles
    splits: int = 1

    def span(self, inputs: int) -> int:
        """Inputs per split: a whole number of steps; the last split takes what is left."""
        per = -(-inputs // max(1, self.splits))
        return -(-per // self.tiles.bk) * self.tiles.bk

    def planes(self, inputs: int) -> int:
        """The splits that hold inputs once ``span`` has rounded up (never an empty one)."""
        return -(-inputs // self.span(inputs))

    def __str__(self) -> str:
        return f"{self.tiles}, {self.splits} split{'s' * (self.splits != 1)}"


# ------------------------------------------------------------------------------------------------------ kernels


def _compiling(store: str, registers: int):
    """(whether ``store`` writes planes, adds atomically; the jit decorator with the register cap, if any)."""
    if store not in STORES:
        raise ValueError(f"kernel: store must be one of {', '.join(STORES)}, not {store!r}")
    jit = cuda.jit(max_registers=registers) if registers and not simulator.active() else cuda.jit
    return store == "planes", store == "atomic", jit


@functools.cache
def kernel(tiles: Tiles, store: str = "planes", registers: int = 0):
    """The kernel for ``tiles``, ``store`` (``STORES``) and a register cap per thread (numba's ``max_registers``; 0:
    none). Grid: (image tiles, output tiles, splits), ``tiles.threads`` threads a block; ``(x, w, b, dst, span)``."""
    PLANES, ATOMIC, jit = _compiling(store, registers)
    BM, BN, TM, TN, BK = tiles.bm, tiles.bn, tiles.tm, tiles.tn, tiles.bk
    ACROSS, DOWN, ROWS, X_ROUNDS, W_ROUNDS = tiles.layout()
    XPAD, WPAD = BM + 1, BN + 1  # padded rows: the transposing stores into shared memory miss no bank

    @jit
    def fc_register_tiles(x, w, b, dst, span):
        N, K, OUT = x.shape[0], x.shape[1], w.shape[0]
        xt = cuda.shared.array((BK, XPAD), float32)  # [input][image]: the step's slice of x, transposed
        wt = cuda.shared.array((BK, WPAD), float32)  # [input][output]
        sums = cuda.local.array((TM, TN), float32)
        xr = cuda.local.array(TM, float32)
        wr = cuda.local.array(TN, float32)
        me = cuda.threadIdx.x
        across, down = me % ACROSS, me // ACROSS
        column, row0 = me % BK, me // BK
        img0, out0, split = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN, cuda.blockIdx.z
        start, stop = split * span, min(K, split * span + span)
        for i in range(TM):
            for j in range(TN):
                sums[i, j] = float32(0.0)
        for step in range(start, stop, BK):
            src = step + column
            for q in range(X_ROUNDS):
                r = row0 + q * ROWS
                if r < BM:
                    xt[U(column), U(r)] = x[U(img0 + r), U(src)] if img0 + r < N and src < stop else float32(0.0)
            for q in range(W_ROUNDS):
                r = row0 + q * ROWS
                if r < BN:
                    wt[U(column), U(r)] = w[U(out0 + r), U(src)] if out0 + r < OUT and src < stop else float32(0.0)
            cuda.syncthreads()
            for c in range(BK):
                for i in range(TM):
                    xr[i] = xt[U(c), U(down + i * DOWN)]
                for j in range(TN):
                    wr[j] = wt[U(c), U(across + j * ACROSS)]
                for i in range(TM):
                    for j in range(TN):
                        sums[i, j] += xr[i] * wr[j]
            cuda.syncthreads()
        for i in range(TM):
            img = img0 + down + i * DOWN
            if img >= N:
                break  # the rows of a thread only grow
            for j in range(TN):
                feature = out0 + across + j * ACROSS
                if feature >= OUT:
                    break
                if PLANES:
                    dst[split, img, feature] = sums[i, j]
                elif ATOMIC:
                    cuda.atomic.add(dst, (0, img, feature), sums[i, j])
                else:
                    dst[0, img, feature] = sums[i, j] + b[feature]

    return fc_register_tiles


@cuda.jit
def add_planes(part, b, out):
    """out[n, o] = b[o] + the sum over the planes of part[:, n, o]; a thread per output, 2-D grid (outputs, images)."""
    feature, img = cuda.grid(2)
    if img < out.shape[0] and feature < out.shape[1]:
        total = b[feature]
        for plane in range(part.shape[0]):
            total += part[plane, img, feature]
        out[img, feature] = total


@cuda.jit
def fill_bias(b, out):
    """out[n, o] = b[o]: the starting value of an atomic split-K's output."""
    feature, img = cuda.grid(2)
    if img < out.shape[0] and feature < out.shape[1]:
        out[img, feature] = b[feature]


ELEMENTWISE_BLOCK = (32, 8)  # add_planes and fill_bias: 32 outputs of a row by 8 images


# ------------------------------------------------------------------------------------------------------ choosing

#: the GPU's tiles: 16 x 16 threads, each 1 to 8 images (tm) by 1 to 10 outputs (tn): bm = 16 tm, bn = 16 tn
GPU_TM = (8, 4, 2, 1)
GPU_TN = (10, 8, 4, 2, 1)
GPU_SIDE = 16
#: the simulator's tiles: 16 threads (4 x 4), each 4 x 3 (its threads are Python threads: few, with work each). Its
#: checks then cross a ragged image tile (35 images), a ragged output tile (fashion's 160 outputs, cifar10's 10) and
#: a split, the last one shorter (37 inputs: 24 + 13)
SIMULATOR_TILES = Tiles(16, 12, 4, 3, 8)
SIMULATOR_SPLITS = 2
#: a shared-memory load against a multiply-add, in ``tiles_for``'s cost
LOAD_COST = 2.0
#: blocks of 256 threads resident on a multiprocessor at once (8 x 10 sums: 128 registers a thread, two blocks)
RESIDENT = 2
#: the blocks ``split_count`` aims at, in waves of every multiprocessor's resident blocks
WAVES = 4
#: the fewest inputs a GPU split gets: a plane costs one store and one load per output against that many
#: multiply-adds
MIN_SPAN = 256


def tiles_for(N: int, OUT: int) -> Tiles:
    """The tiles for N images by OUT outputs. On a GPU the cheapest of GPU_TM x GPU_TN by the multiply-adds the
    padded tiles do, each with its shared loads (``(tm + tn) / (tm tn)`` a multiply-add, at ``LOAD_COST``): 128 x 160
    (8 x 10) for fashion's fc1 at 100 images and more, 128 x 128 for 500 outputs, 16 x 16 (1 x 1) for 10 outputs at
    one image. On the simulator ``SIMULATOR_TILES``."""
    if simulator.active():
        return SIMULATOR_TILES

    def cost(tm: int, tn: int) -> float:
        rows, cols = GPU_SIDE * tm, GPU_SIDE * tn
        padded = math.ceil(N / rows) * rows * math.ceil(OUT / cols) * cols
        return padded * (1 + LOAD_COST * (tm + tn) / (tm * tn))

    tm, tn = min(((tm, tn) for tm in GPU_TM for tn in GPU_TN), key=lambda p: (cost(*p), -p[0] * p[1]))
    return Tiles(GPU_SIDE * tm, GPU_SIDE * tn, tm, tn, 16)


def split_count(N: int, K: int, OUT: int, tiles: Tiles, sms: int | None = None) -> int:
    """How many splits of K: on a GPU the power of two that brings the blocks to ``WAVES`` waves of ``RESIDENT``
    blocks on each of ``sms`` multiprocessors (the device's by default), at most ``K // MIN_SPAN`` (16 for fashion's
    fc1 at 10000 images on an H100's 132: 79 tiles). On the simulator ``SIMULATOR_SPLITS`` where K holds that many
    steps, so that its small checks split too."""
    most = K // tiles.bk if simulator.active() else K // MIN_SPAN
    if simulator.active():
        return max(1, min(SIMULATOR_SPLITS, most))
    blocks = math.ceil(N / tiles.bm) * math.ceil(OUT / tiles.bn)
    wanted = WAVES * RESIDENT * (sms or gpu.multiprocessors()) / blocks
    splits = 1 << max(0, math.ceil(math.log2(wanted))) if wanted > 1 else 1
    while splits > max(1, most):
        splits //= 2
    return splits


def plan(N: int, K: int, OUT: int, sms: int | None = None) -> Plan:
    """Tiles and split count for N images, K inputs and OUT outputs (``tiles_for``, ``split_count``)."""
    tiles = tiles_for(N, OUT)
    return Plan(tiles, split_count(N, K, OUT, tiles, sms))


# ------------------------------------------------------------------------------------------------------ running


def launch(p: Plan, x, w, b, out, store: str | None = None, registers: int = 0) -> None:
    """out = x @ w.T + b by plan ``p``. ``store``: "planes" (the default with splits: partial sums in pooled planes,
    then ``add_planes``), "bias" (the default without: one split, the bias added in place; refused with splits),
    "atomic" (``fill_bias``, then every split adds into ``out``). ``registers``: see ``kernel``."""
    N, K = x.shape
    OUT = w.shape[0]
    store = store or ("planes" if p.splits > 1 else "bias")
    if store == "bias" and p.splits > 1:
        raise ValueError(f"launch: store='bias' adds the bias once, in a single split; this plan has {p.splits}")
    span, planes = p.span(K), p.planes(K)
    grid = (gpu.blocks(N, p.tiles.bm), gpu.blocks(OUT, p.tiles.bn), planes)
    elementwise = ((OUT, N), ELEMENTWISE_BLOCK)
    k = kernel(p.tiles, store, registers)
    if store == "planes":
        part = gpu.buffer("fc register tiles: partial sums", (planes, N, OUT))
        gpu.launch_grid(k, grid, p.tiles.threads, x, w, b, part, span)
        gpu.launch(add_planes, elementwise[0], part, b, out, block=elementwise[1])
        return
    if store == "atomic":
        gpu.launch(fill_bias, elementwise[0], b, out, block=elementwise[1])
    gpu.launch_grid(k, grid, p.tiles.threads, x, w, b, out.reshape(1, N, OUT), span)


def fc_tiles(x, w, b, out) -> None:
    """The fc layer (``labkit.layers``: x (N, K), w (OUT, K), b (OUT,), out (N, OUT), device arrays) as register
    tiles split over K, by the plan for its shape (``plan``)."""
    N, K = x.shape
    launch(plan(N, K, w.shape[0]), x, w, b, out)
