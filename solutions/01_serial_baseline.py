# %% [markdown]
# # 01 — Serial baseline: the loop nest, compiled
#
# **Learning goals**
# - Write the layers of both networks as plain loop nests, with the arithmetic of one convolution output in a
#   function of its own that every later stage reuses.
# - Compile them with numba (`@njit`, no parallelism) and check them against the numpy reference.
# - Measure where the time goes, layer by layer, in the original study's report format and in GFLOP/s.
#
# **Context.** The OpenACC study started from serial C on one CPU core ([reference figures](../docs/reference_figures.md),
# section A; first 1200 CIFAR-10 training images, seconds):
#
# | conv1 | conv2 | conv3 | ReLU | pool | fc | softmax | total |
# |---|---|---|---|---|---|---|---|
# | 12.31 | 19.75 | 5.75 | 0.142 | 0.208 | 0.013 | 0.0006 | 38.17 |
#
# Other hardware and other code: compare shares and ratios with yours, not seconds.

# %%
import numpy as np
import labkit as lk

lk.hello("01")
net = lk.get_net("cifar10")
print(net.describe())

# %% [markdown]
# ## Task 1 — one output element of the convolution
#
# `out[n, m, i, j] = b[m] + Σ_c Σ_p Σ_q x[n, c, i·s + p − pad, j·s + q − pad] · w[m, c, p, q]`, with zeros outside the
# image. Write `conv_point`: that sum for one output element, **without** the bias, in a local `float32`; skip the
# taps whose row or column falls outside the input. Every later stage calls this function from its own loops and
# kernels, so you write this arithmetic once in the course. Roughly {{lines:conv_point}}; it reads 2·C·K·K values.

# %% tags=["kernel"]
import math

import numpy as np
from numba import float32, njit

import labkit as lk


@njit
def conv_point(x, w, n, m, i, j, pad, stride):
    """Σ over c, p, q of x[n, c, i*stride + p - pad, j*stride + q - pad] * w[m, c, p, q], zero padding."""
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    K = w.shape[2]
    acc = float32(0.0)
    ### BEGIN SOLUTION conv_point
    for c in range(C):
        for p in range(K):
            r = i * stride + p - pad
            if 0 <= r < H:
                for q in range(K):
                    col = j * stride + q - pad
                    if 0 <= col < W:
                        acc += x[n, c, r, col] * w[m, c, p, q]
    ### END SOLUTION
    return acc


# %% [markdown]
# ## Task 2 — the loop nest
#
# `conv_forward` visits every output element in the original C code's order (image, output map, row, column) and
# writes `b[m] + conv_point(...)` into `out`. Read every size from the arrays: the self-check calls it on fresh
# random inputs of several batch sizes, with `out` filled with NaN, so an element you never write is caught.
# Write into `out`; return nothing. Roughly {{lines:conv_forward}}.

# %% tags=["kernel"]
@njit
def conv_forward(x, w, b, out, pad, stride):
    N, M, Ho, Wo = out.shape
    ### BEGIN SOLUTION conv_forward
    for n in range(N):
        for m in range(M):
            for i in range(Ho):
                for j in range(Wo):
                    out[n, m, i, j] = b[m] + conv_point(x, w, n, m, i, j, pad, stride)
    ### END SOLUTION


# %% [markdown]
# ## Task 3 — the cheap layers
#
# ReLU `max(x, 0)` and tanh element by element (on flat views); max-pool over `kernel × kernel` windows moved by
# `stride` (windows that would cross the edge are dropped, as in the original); fc `out[n, o] = b[o] + Σ_k x[n, k] ·
# w[o, k]`; softmax over each image's classes, subtracting the row maximum before `math.exp` so large scores do not
# overflow. You write these once: from stage 02 on, the kit's own GPU versions run them (`labkit/ops/kernels.py`), and
# the stages spend their effort on the convolution. Roughly {{lines:relu+tanh+maxpool+fc+softmax}} in all.

# %% tags=["kernel"]
@njit
def relu_forward(x, out):
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    ### BEGIN SOLUTION relu
    for k in range(flat_in.size):
        flat_out[k] = max(flat_in[k], 0.0)
    ### END SOLUTION


@njit
def tanh_forward(x, out):
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    ### BEGIN SOLUTION tanh
    for k in range(flat_in.size):
        flat_out[k] = math.tanh(flat_in[k])
    ### END SOLUTION


@njit
def maxpool_forward(x, out, kernel, stride):
    N, C, Ho, Wo = out.shape
    ### BEGIN SOLUTION maxpool
    for n in range(N):
        for c in range(C):
            for i in range(Ho):
                for j in range(Wo):
                    best = x[n, c, i * stride, j * stride]
                    for p in range(kernel):
                        for q in range(kernel):
                            best = max(best, x[n, c, i * stride + p, j * stride + q])
                    out[n, c, i, j] = best
    ### END SOLUTION


@njit
def fc_forward(x, w, b, out):
    N, IN = x.shape
    OUT = w.shape[0]
    ### BEGIN SOLUTION fc
    for n in range(N):
        for o in range(OUT):
            acc = b[o]
            for k in range(IN):
                acc += x[n, k] * w[o, k]
            out[n, o] = acc
    ### END SOLUTION


@njit
def softmax_forward(x, out):
    N, K = x.shape
    ### BEGIN SOLUTION softmax
    for n in range(N):
        top = x[n, 0]
        for k in range(1, K):
            top = max(top, x[n, k])
        total = 0.0
        for k in range(K):
            out[n, k] = math.exp(x[n, k] - top)
            total += out[n, k]
        for k in range(K):
            out[n, k] /= total
    ### END SOLUTION


# %% tags=["kernel"]
CPU_LAYERS = {"conv": conv_forward, "relu": relu_forward, "tanh": tanh_forward, "pool": maxpool_forward,
              "fc": fc_forward, "softmax": softmax_forward}

VARIANTS = lk.variants("01", {
    "serial": lk.Variant(CPU_LAYERS, target="cpu", per_image=True,
                         note="numba @njit loop nests, one image at a time, as the original C code"),
})

# %% [markdown]
# ## Check
#
# Each line compares one of your functions with the float64 reference on fresh random inputs at batch sizes 1, 3, 8
# and 17, then the whole forward pass of each network on fresh random weights. A pass has a relative error near 1e-7
# (float32 rounding); a wrong index gives errors near 1. A failure says where the first wrong element is, and the
# seed that reproduces it.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)

# %% [markdown]
# ## Measure
#
# The whole network on the first 1200 CIFAR-10 training images, as the study ran it: one image at a time, with your
# layers. The first call of a numba function compiles it, so the run warms up on one image before it times. Under the
# report, the throughput: the spec's FLOPs and minimum bytes of each layer over your seconds.

# %%
wl = lk.workload(net, 1200, target="cpu")
runs = lk.notebook.run_variants(VARIANTS, wl, checked)
if runs:
    print(runs["serial"])

# %% [markdown]
# ## Plot: where the time goes

# %%
lk.plots.layer_bars(runs["serial"].report, share=True) if runs else print("not measured yet")

# %% [markdown]
# ## Reflect
#
# 1. Which layer takes the most time, and why that one? The throughput table lists each conv layer's GFLOP (two per
#    multiply-add, `M · Ho · Wo · C · K · K` multiply-adds per image); compare their ratios with your times.
# 2. Your conv layers run at some GFLOP/s. One CPU core can retire a few fused multiply-adds per cycle at a few GHz:
#    how far below that are you, and what in `conv_point` keeps you there? (Count the tests in its inner loops.)
# 3. The study's ReLU and pool lines were larger than fc and softmax. Is it the same here? What limits a layer that
#    does one operation per element it reads?
#
# ### What the kit measured
#
# The same notebook's solution on the host CPU of the kit's GPU machine:

# %%
lk.measured.show("01");

# %% [markdown]
# Compare the convolutions' share with yours and with the study's 99 %, and the seconds per conv layer with the GFLOP
# ratios of question 1.
