"""The kit's GPU kernels for the layers the course never asks you to write on the GPU: ReLU, tanh, max-pool,
fully connected and softmax. Stage 01 has you write them once, as CPU loop nests; from stage 02 on the GPU variants
use these, so every stage spends its effort on the convolution, where the time goes.

Each is a thread-per-output kernel with a host function in the layer calling convention (``labkit.layers``),
on device arrays, launched through ``labkit.gpu`` (so it is counted and profiled like a student's kernel).
"""

from __future__ import annotations

import math

from numba import cuda, float32

from . import gpu


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


def relu(x, out):
    gpu.launch(_relu, out.size, gpu.flat(x), gpu.flat(out))  # flat views: one index, any rank


def tanh(x, out):
    gpu.launch(_tanh, out.size, gpu.flat(x), gpu.flat(out))


def maxpool(x, out, kernel, stride):
    gpu.launch(_maxpool, out.size, x, out, kernel, stride)


def fc(x, w, b, out):
    gpu.launch(_fc, out.size, x, w, b, out)


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
