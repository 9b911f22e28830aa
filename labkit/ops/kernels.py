"""The kit's GPU kernels for the layers the course never asks you to write on the GPU: ReLU, tanh, max-pool,
fully connected and softmax. Stage 01 has you write them once, as CPU loop nests; from stage 02 on the GPU variants
use these, so every stage spends its effort on the convolution, where the time goes.

Each is a thread-per-output kernel (fc on many images: tiles in shared memory) with a host function in the layer calling convention (``labkit.layers``),
on device arrays, launched through ``labkit.gpu`` (so it is counted and profiled like a student's kernel).
"""

from __future__ import annotations

import math

from numba import cuda, float32

from ..launch import gpu


@cuda.jit
def _relu(x, out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = max(x[t], float32(0.0))


@cuda.jit
def _tanh(x, out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = math.tanh(x[t])


@cuda.jit
def _maxpool(x, out, kernel, stride):
    N, C, Ho, Wo = out.shape
    t = cuda.grid(1)
    if t < N * C * Ho * Wo:
        j = t % Wo
        i = (t // Wo) % Ho
        c = (t // (Wo * Ho)) % C
        n = t // (Wo * Ho * C)
        best = x[n, c, i * stride, j * stride]
        for p in range(kernel):
            for q in range(kernel):
                best = max(best, x[n, c, i * stride + p, j * stride + q])
        out[n, c, i, j] = best


def _make_fc(BM: int, BN: int, TM: int, TN: int, BK: int = 16):
    """out = x @ w.T + b in tiles: a block computes BM images x BN features; per step of BK inputs it stages both
    tiles in shared memory (each element read from global memory once per block, coalesced along the inputs) and
    every thread accumulates a TM x TN tile in registers. A thread per output element reads its whole input row
    and weight row from global memory instead: 10x slower on CIFAR's fc, 20x on Fashion's fc1."""
    TX, TY = BN // TN, BM // TM  # threads along features, along images
    NT = TX * TY
    XCOLS, WCOLS = BM + 1, BN + 1  # padded rows: the transposing stores miss no bank (shapes must be plain ints)

    @cuda.jit
    def fc_tiled(x, w, b, out):
        N, IN = x.shape
        OUT = w.shape[0]
        xs = cuda.shared.array((BK, XCOLS), float32)  # [k][image]
        ws = cuda.shared.array((BK, WCOLS), float32)  # [k][feature]
        acc = cuda.local.array((TM, TN), float32)
        t = cuda.threadIdx.x
        tx, ty = t % TX, t // TX
        n0, o0 = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)
        for k0 in range(0, IN, BK):
            for e in range(t, BM * BK, NT):
                r, c = e // BK, e % BK
                xs[c, r] = x[n0 + r, k0 + c] if n0 + r < N and k0 + c < IN else float32(0.0)
            for e in range(t, BN * BK, NT):
                r, c = e // BK, e % BK
                ws[c, r] = w[o0 + r, k0 + c] if o0 + r < OUT and k0 + c < IN else float32(0.0)
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    a = xs[kk, ty + i * TY]
                    for j in range(TN):
                        acc[i, j] += a * ws[kk, tx + j * TX]
            cuda.syncthreads()
        for i in range(TM):
            n = n0 + ty + i * TY
            for j in range(TN):
                o = o0 + tx + j * TX
                if n < N and o < OUT:
                    out[n, o] = acc[i, j] + b[o]

    fc_tiled.tile = (BM, BN, NT)
    return fc_tiled


#: (images, features, per-thread images, per-thread features): square tiles for a wide layer (Fashion's fc1 has 160
#: features); a few features go to ``_fc_warp``
_FC_WIDE = _make_fc(64, 64, 4, 4)
FC_TILED_FROM = 64  # images: fewer fill one tile's rows poorly, and a thread per output is then as fast


FC_WARP_MAX = 16  # outputs: up to this many, a warp per image (each lane keeps one sum per output)
FC_WARP_BLOCK = 128  # threads per block of the warp-per-image kernel: four images
_FC_WARP: dict = {}


def _fc_warp(outputs: int):
    """out = x @ w.T + b with a warp per image, for many images and few outputs (every net's last layer, CIFAR's
    only fc): the lanes read the image's inputs side by side (coalesced), each keeps a partial sum per output, and
    lane ``o`` then adds up output ``o``'s 32 partial sums from shared memory. The input is read once, at full
    bandwidth; the tile kernel's 64-feature tiles would leave most of their work idle on ten outputs."""
    if outputs not in _FC_WARP:
        warps = FC_WARP_BLOCK // 32

        @cuda.jit
        def fc_warp(x, w, b, out):
            N, IN = x.shape
            part = cuda.shared.array((warps, outputs, 33), float32)  # 33: lane o's reads of row o miss no bank
            lane, wi = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
            n = cuda.blockIdx.x * warps + wi
            acc = cuda.local.array(outputs, float32)
            for o in range(outputs):
                acc[o] = float32(0.0)
            if n < N:
                for k in range(lane, IN, 32):
                    v = x[n, k]
                    for o in range(outputs):
                        acc[o] += v * w[o, k]
            for o in range(outputs):
                part[wi, o, lane] = acc[o]
            cuda.syncthreads()
            if n < N and lane < outputs:
                s = float32(0.0)
                for j in range(32):
                    s += part[wi, lane, j]
                out[n, lane] = s + b[lane]

        _FC_WARP[outputs] = fc_warp
    return _FC_WARP[outputs]


@cuda.jit
def _fc(x, w, b, out):
    N, IN = x.shape
    OUT = w.shape[0]
    t = cuda.grid(1)
    if t < N * OUT:
        o = t % OUT
        n = t // OUT
        acc = b[o]
        for k in range(IN):
            acc += x[n, k] * w[o, k]
        out[n, o] = acc


@cuda.jit
def _softmax(x, out):
    # one thread per image: ten classes are too few to share out
    N, K = x.shape
    n = cuda.grid(1)
    if n < N:
        top = x[n, 0]
        for k in range(1, K):
            top = max(top, x[n, k])
        total = float32(0.0)
        for k in range(K):
            e = math.exp(x[n, k] - top)
            out[n, k] = e
            total += e
        for k in range(K):
            out[n, k] = out[n, k] / total


@cuda.jit
def _argmax_rows(p, classes):
    n = cuda.grid(1)
    if n < p.shape[0]:
        best, k = p[n, 0], 0
        for j in range(1, p.shape[1]):
            if p[n, j] > best:  # strict: the first of equal maxima, as numpy's argmax
                best, k = p[n, j], j
        classes[n] = k


def argmax_rows(p, classes):
    """``classes[n] = argmax(p[n])`` on the device (the first of equal maxima, as ``np.argmax``): the whole job
    downloads one int32 per image instead of its class probabilities."""
    if classes.shape[0] != p.shape[0]:
        raise ValueError(f"argmax_rows: classes has {classes.shape[0]} rows, p {p.shape[0]}")
    gpu.launch(_argmax_rows, p.shape[0], p, classes)


def relu(x, out):
    gpu.launch(_relu, out.size, gpu.flat(x), gpu.flat(out))  # flat views: one index, any rank


def tanh(x, out):
    gpu.launch(_tanh, out.size, gpu.flat(x), gpu.flat(out))


def maxpool(x, out, kernel, stride):
    gpu.launch(_maxpool, out.size, x, out, kernel, stride)


def fc(x, w, b, out):
    if x.shape[0] < FC_TILED_FROM:
        return gpu.launch(_fc, out.size, x, w, b, out)
    if w.shape[0] <= FC_WARP_MAX:
        images_per_block = FC_WARP_BLOCK // 32
        return gpu.launch_grid(_fc_warp(w.shape[0]), gpu.blocks(x.shape[0], images_per_block), FC_WARP_BLOCK,
                               x, w, b, out)
    kernel = _FC_WIDE
    bm, bn, threads = kernel.tile
    gpu.launch_grid(kernel, (gpu.blocks(x.shape[0], bm), gpu.blocks(w.shape[0], bn)), threads, x, w, b, out)


def softmax(x, out):
    gpu.launch(_softmax, x.shape[0], x, out)


#: layer kind -> the kit's GPU function, for a Variant's ``impls``: ``{"conv": my_conv, **lk.kernels.GIVEN}``
GIVEN = {"relu": relu, "tanh": tanh, "pool": maxpool, "fc": fc, "softmax": softmax}


def as_fused(conv):
    """A plain conv function in the fused convention (``labkit.layers``): the conv into a pooled buffer, then the
    kit's activation and max-pool kernels. For comparing fused and unfused kernels in one tuning sweep."""

    def fused(x, w, b, out, pad, stride, act=0, pool=0):
        if not act and not pool:
            return conv(x, w, b, out, pad, stride)
        N, M, H, W = x.shape[0], w.shape[0], x.shape[2], x.shape[3]
        K = w.shape[2]
        Ho, Wo = (H + 2 * pad - K) // stride + 1, (W + 2 * pad - K) // stride + 1
        y = gpu.buffer(f"as_fused {getattr(conv, '__name__', 'conv')}", (N, M, Ho, Wo)) if pool else out
        conv(x, w, b, y, pad, stride)
        if act:
            (relu if act == 1 else tanh)(y, y)
        if pool:
            maxpool(y, out, pool, pool)

    fused.__name__ = f"{getattr(conv, '__name__', 'conv')}_as_fused"
    fused.device_fn = getattr(conv, "device_fn", conv)
    return fused
