# %% [markdown]
# # 07 — Unroll and multiply: the convolution as a matrix product
#
# **Learning goals**
# - Unroll the input ("im2col"): one column of `C·K·K` values per output pixel, so the convolution becomes one matrix
#   product `W (M × CKK) · X (CKK × HoWo)` per image.
# - Write a shared-memory tiled matrix multiply, and compare it with cuBLAS (`cupy.matmul`) on the same unrolled
#   matrices.
# - Measure what the unroll buffer costs in memory and in time, and why it has to be cut into chunks of images.
#
# **Context** ([reference figures](../docs/reference_figures.md), section B: ECE408, Fashion-MNIST, op time in seconds,
# conv1 / conv2):
#
# | version | 100 images | 1000 images | 10000 images |
# |---|---|---|---|
# | basic GPU kernel | 0.000295 / 0.000998 | 0.003069 / 0.010254 | 0.031567 / 0.098181 |
# | unroll + shared-memory matmul | 0.002020 / 0.003060 | 0.016756 / 0.026879 | 0.119580 / 0.267594 |

# %%
import numpy as np
import labkit as lk

lk.hello("07")
net = lk.get_net("cifar10")

# %% [markdown]
# ## The unrolled matrices
#
# For image `n`, column `i·Wo + j` of `X` holds the `C·K·K` inputs that output pixel `(i, j)` multiplies, in the order
# of the flattened weights: row `c·K·K + p·K + q` is `x[n, c, i·s + p − pad, j·s + q − pad]` (zero outside the image).
# Then `out[n, m, :, :]`, flattened, is row `m` of `W · X + b[m]`, with `W = w.reshape(M, C·K·K)`. Each input value
# appears in up to `K·K` columns: the buffer is `K·K` times larger than the input. Per image and layer (`cifar10`):

# %%
# NBVAL_CHECK_OUTPUT
for layer in (ly for ly in net.layers if ly.kind == "conv"):
    C = net.input_shape_of(layer.name)[0]
    _, Ho, Wo = net.shapes()[layer.name]
    rows, cols = C * layer.kernel ** 2, Ho * Wo
    print(f"{layer.name}: X is {rows} x {cols} = {4 * rows * cols / 1e3:.0f} KB per image, "
          f"{4 * rows * cols * 50000 / 1e9:.1f} GB for 50000 images")

# %% [markdown]
# ## Task 1 — the unroll kernel
#
# `unroll_kernel(x, X, pad, stride, K)`: one thread per element of `X` (shape `N, C·K·K, Ho·Wo`): thread `t` finds
# `(n, row, col)`, then `c, p, q` from `row` and `i, j` from `col`, and writes the input value or 0. One global read
# and one write per element. Roughly {{lines:unroll}}.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/07_task1.png)

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk


@cuda.jit
def unroll_kernel(x, X, pad, stride, K):
    N, C, H, W = x.shape
    _, rows, cols = X.shape
    t = cuda.grid(1)
    if t < N * rows * cols:
        ### BEGIN SOLUTION unroll
        col = t % cols
        row = (t // cols) % rows
        n = t // (cols * rows)
        c, p, q = row // (K * K), (row // K) % K, row % K
        Wo = (W + 2 * pad - K) // stride + 1
        i, j = col // Wo, col % Wo
        r, s = i * stride + p - pad, j * stride + q - pad
        X[n, row, col] = x[n, c, r, s] if 0 <= r < H and 0 <= s < W else float32(0.0)
        ### END SOLUTION


# %%
# What one thread of your unroll kernel reads and writes: yours beside the spec's
lk.show.task("07", "unroll")


# %% [markdown]
# ## Task 2 — the tiled matrix multiply
#
# `make_matmul_kernel(T)`: block `(col tile, row tile, n)` of `T × T` threads computes `out[n, m0 + ty, c0 + tx]` of
# `out = W · X[n] + b` (`out` seen as `N, M, Ho·Wo`). March over the shared dimension `k` in steps of `T`: every thread
# loads one element of the `W` tile (`W[m0 + ty, k0 + tx]`) and one of the `X` tile (`X[n, k0 + ty, c0 + tx]`) into
# shared memory, or 0 past an edge; `syncthreads`; `T` multiply-adds from shared memory; `syncthreads`. Threads inside
# `out` write `acc + b[m]`. Roughly {{lines:matmul}}. Budget: `2·CKK/T` global loads per output element.
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/07_task2.png)

# %% tags=["kernel"]
def make_matmul_kernel(T):
    @cuda.jit
    def matmul_kernel(Wm, X, b, out):
        Wt = cuda.shared.array((T, T), float32)
        Xt = cuda.shared.array((T, T), float32)
        M, KK = Wm.shape
        cols = X.shape[2]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        m, col, n = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx, cuda.blockIdx.z
        acc = float32(0.0)
        ### BEGIN SOLUTION matmul
        for k0 in range(0, KK, T):
            Wt[ty, tx] = Wm[m, k0 + tx] if m < M and k0 + tx < KK else float32(0.0)
            Xt[ty, tx] = X[n, k0 + ty, col] if k0 + ty < KK and col < cols else float32(0.0)
            cuda.syncthreads()
            for k in range(T):
                acc += Wt[ty, k] * Xt[k, tx]
            cuda.syncthreads()
        if m < M and col < cols:
            out[n, m, col] = acc + b[m]
        ### END SOLUTION

    return matmul_kernel


# %% [markdown]
# ## Given: the layer functions
#
# `conv_unrolled(matmul)` cuts the batch into chunks whose unroll buffer stays under `BUFFER_BYTES` (one buffer from
# `lk.gpu.buffer`, reused), unrolls each chunk and multiplies it: with the kit's tiled kernel, or with cuBLAS through
# `cupy.matmul` (the baseline: it needs a real GPU with cupy). Every image's `W · X[n]` is one independent matrix
# product.

# %% tags=["kernel"]
T = lk.simulator.threads(16, 8)  # 16x16 tiles on a GPU; 8x8 on the simulator, whose threads are Python threads
BUFFER_BYTES = lk.simulator.buffer_bytes(256 << 20)  # the unroll buffer: at most 256 MB (16 KB on the simulator)
MATMUL = make_matmul_kernel(T)


def tiled_matmul(Wm, X, b, out3):
    N, M, cols = out3.shape
    lk.gpu.launch_grid(MATMUL, (math.ceil(cols / T), math.ceil(M / T), N), (T, T), Wm, X, b, out3)


def cublas_matmul(Wm, X, b, out3):
    import cupy

    cupy.matmul(cupy.asarray(Wm), cupy.asarray(X), out=cupy.asarray(out3))
    cupy.asarray(out3)[...] += cupy.asarray(b)[None, :, None]


def conv_unrolled(matmul):
    def unrolled_conv(x, w, b, out, pad, stride):
        N, C, H, W = x.shape
        M, _, K, _ = w.shape
        _, _, Ho, Wo = out.shape
        rows, cols = C * K * K, Ho * Wo
        chunk = max(1, min(N, BUFFER_BYTES // (4 * rows * cols)))
        X = lk.gpu.buffer("unrolled", (chunk, rows, cols))
        Wm, out3 = w.reshape(M, rows), out.reshape(N, M, cols)
        for n0 in range(0, N, chunk):
            n = min(chunk, N - n0)
            lk.gpu.launch(unroll_kernel, n * rows * cols, x[n0:n0 + n], X[:n], pad, stride, K)
            matmul(Wm, X[:n], b, out3[n0:n0 + n])

    unrolled_conv.__name__ = f"conv_unrolled_{matmul.__name__}"
    return unrolled_conv


conv_unroll_tiled, conv_unroll_cublas = conv_unrolled(tiled_matmul), conv_unrolled(cublas_matmul)

VARIANTS = lk.variants("07", {
    "unroll_tiled": lk.Variant({**lk.kernels.GIVEN, "conv": conv_unroll_tiled}, arrays="device",
                               note="im2col, then a shared-memory tiled matrix multiply per image"),
    "unroll_cublas": lk.Variant({**lk.kernels.GIVEN, "conv": conv_unroll_cublas}, arrays="device",
                                requires=("cupy",), note="im2col, then cuBLAS (cupy.matmul): the library baseline"),
})

# %%
# What one thread of your matrix multiply reads and writes: yours beside the spec's
lk.show.task("07", "matmul")

# %% [markdown]
# ## Check

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)
technique = lk.check.check_technique(conv_unroll_tiled, "cifar10", "conv2", "shared")


# %% [markdown]
# ## Task 3 — predict, then count
#
# Write `predicted_loads(C, K, T, M, cols)`: global loads per output element of the tiled matmul alone (the `W` and `X`
# tiles each block loads over the whole `k` march, over the `T × T` outputs of the block, plus the bias), ignoring
# partial tiles. Roughly {{lines:predicted}}. The count below is the whole conv layer: unroll and matmul.

# %%
def predicted_loads(C, K, T, M, cols):
    ### BEGIN SOLUTION predicted
    k_steps = math.ceil(C * K * K / T)
    return 2 * k_steps * T * T / (T * T) + 1
    ### END SOLUTION


# %%
case = lk.check.layer_case("cifar10", "conv2", 1, np.random.default_rng(0), target="gpu")
C, (M, Ho, Wo) = case.x.shape[1], case.expected.shape[1:]
try:
    predicted = {"07 unroll + tiled": predicted_loads(C, 5, T, M, Ho * Wo) + C * 25}  # + the unroll's reads
except NotImplementedError:
    predicted = None
    print("predicted_loads is not implemented yet")
if checked.passed("unroll_tiled"):
    lk.counts.show("07", {"07 unroll + tiled": conv_unroll_tiled}, layer="conv2", predicted=predicted)
else:
    print("not counted yet: unroll_tiled does not pass its check; make the self-check pass first")

# %% [markdown]
# ## Measure

# %%
runs = lk.notebook.measure(VARIANTS, checked)

# %% [markdown]
# ## Plot

# %%
lk.notebook.ladder_and_roofline("07", runs)

# %% [markdown]
# ## Reflect
#
# 1. How many bytes does the unroll write for conv1 of 50000 images, and how many would the convolution itself need to
#    read? With a 256 MB buffer, how many chunks (launch pairs) does conv1 take?
# 2. Compare `unroll_tiled` with `unroll_cublas`: how much of each layer's time is the unroll, how much the product?
#    (The profile of one pass, `lk.Profiler`, separates the two kernels.)
# 3. cuBLAS is far faster at the product, yet the whole layer may not be: why? What would remove the unroll buffer
#    altogether (stage 08)?
# 4. Each image is its own small product (`M` = 16 or 20 rows). How well does that fill a GPU, compared with one
#    product over all images' columns at once?
#
# ### What the kit measured

# %%
lk.measured.show("07", compare=(("07 unroll_tiled", "07 unroll_cublas"), ("07 unroll_cublas", "06 const_uniform")));

# %% [markdown]
# Unrolling turns the convolution into the operation GPUs are best at, but it writes and reads a buffer `K·K` times
# the input's size: for small layers that traffic, not the product, is the time. That is why this step of the ladder
# goes up, not down: the last line above compares the best unrolled variant with stage 06's constant-memory kernel,
# which reads each input once from the cache and never writes an intermediate. Stage 08 builds the unrolled tiles in
# shared memory as the product needs them (implicit GEMM), and fuses bias, activation and pooling into its epilogue.
