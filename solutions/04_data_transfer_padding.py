# %% [markdown]
# # 04 — Data transfer and padding: keep the data on the device, launch once per layer
#
# **Learning goals**
# - Keep the weights and every activation on the device, and launch every layer once for the whole batch instead of
#   once per image: count the launches and copies, and time both.
# - Pad each layer's input once with a kernel of its own, so the convolution needs no bounds tests; measure whether
#   that pays.
# - Upload the images as `uint8` and normalize them on the device, and read an nvprof-like profile of the whole job.
#
# **Context** ([reference figures](../docs/reference_figures.md), section A: OpenACC on a V100, images one at a time):
#
# | version | 1200 images | 50000 images |
# |---|---|---|
# | managed memory (stage 03) | 7.48 s | 302.5 s |
# | explicit data, pad-once kernel | 3.81 s | — |
# | + loop mapping `gang collapse(2)`, `worker(4)`, `vector(32)` | 0.351 s | 14.0–15.1 s |
# | whole network on the device, per image | 2.77 s (profiled) | 576.3 s |
#
# At 50000 images its profile counted 150000 conv launches of 25.8 µs, 150000 pad launches, 150030 host→device
# copies and 750012 stream synchronizations taking 6.2 s. Section C: cuDNN's conv1, launched per image for 1200 images,
# 25.2 ms; launched once for the batch, 0.39 ms.

# %%
import numpy as np
import labkit as lk

lk.hello("04")
net = lk.get_net("cifar10")

# %% [markdown]
# ## Given: the thread-per-output convolution and the other layers
#
# Stage 02's `conv_thread_per_output` (bounds tests in `conv_point`) and the kit's GPU layers, all on device arrays.
# From here on the engine keeps data on the device for a variant with `arrays="device"`: it uploads the inputs and the
# weights once, takes every activation from a buffer pool, and downloads the probabilities once.

# %% tags=["kernel"]
import numpy as np
from numba import cuda

import labkit as lk

s02 = lk.from_stage("02")
conv_bounds = s02.conv_thread_per_output


# %% [markdown]
# ## Task 1 — pad once
#
# `pad_kernel(x, xp, pad)`: one thread per element of the padded copy `xp` (shape `N, C, H + 2·pad, W + 2·pad`). Thread
# `t` finds its `(n, c, r, col)` from its flat index and writes `x[n, c, r − pad, col − pad]` inside the image and `0`
# in the border: every element is written, so a reused buffer needs no clearing. One read and one write per element.
# Roughly {{lines:pad}}.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/04_task1.png)

# %% tags=["kernel"]
@cuda.jit
def pad_kernel(x, xp, pad):
    N, C, H, W = x.shape
    Hp, Wp = xp.shape[2], xp.shape[3]
    t = cuda.grid(1)
    if t < N * C * Hp * Wp:
        ### BEGIN SOLUTION pad
        col = t % Wp
        r = (t // Wp) % Hp
        c = (t // (Wp * Hp)) % C
        n = t // (Wp * Hp * C)
        src_r, src_c = r - pad, col - pad
        if 0 <= src_r < H and 0 <= src_c < W:
            xp[n, c, r, col] = x[n, c, src_r, src_c]
        else:
            xp[n, c, r, col] = 0.0
        ### END SOLUTION


# %%
# What one thread of your pad kernel reads and writes: yours beside the spec's
lk.show.task("04", "pad")


# %% [markdown]
# ## Task 2 — a convolution without bounds tests
#
# - `conv_padded_kernel(xp, w, b, out, stride)`: one thread per output element, as stage 02, reading
#   `xp[n, c, i·s + p, j·s + q]` with no test at all; 2·C·K·K global reads and one write per output. Roughly
#   {{lines:padded_kernel}}.
# - `conv_padded(x, w, b, out, pad, stride)`: take the padded copy from `lk.gpu.buffer("padded", shape)` (allocated once
#   per shape, reused), launch `pad_kernel`, then the convolution; with `pad == 0` read `x` directly. Roughly {{lines:padded_launch}}.
#
# ![Task 2: what the threads read and write, drawn from the kit's solution](figures/04_task2.png)

# %% tags=["kernel"]
@cuda.jit
def conv_padded_kernel(xp, w, b, out, stride):
    C = xp.shape[1]
    M, _, K, _ = w.shape
    N, _, Ho, Wo = out.shape
    t = cuda.grid(1)
    if t < N * M * Ho * Wo:
        ### BEGIN SOLUTION padded_kernel
        j = t % Wo
        i = (t // Wo) % Ho
        m = (t // (Wo * Ho)) % M
        n = t // (Wo * Ho * M)
        acc = b[m]
        for c in range(C):
            for p in range(K):
                for q in range(K):
                    acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]
        out[n, m, i, j] = acc
        ### END SOLUTION


def conv_padded(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
    ### BEGIN SOLUTION padded_launch
    xp = x
    if pad:
        xp = lk.gpu.buffer("padded", (N, C, H + 2 * pad, W + 2 * pad))
        lk.gpu.launch(pad_kernel, xp.size, x, xp, pad)
    lk.gpu.launch(conv_padded_kernel, out.size, xp, w, b, out, stride)
    ### END SOLUTION


# %%
# What one thread of your convolution reads and writes: yours beside the spec's
lk.show.task("04", "padded")

# %% tags=["kernel"]
BOUNDS = {**lk.kernels.GIVEN, "conv": conv_bounds}
PADDED = {**lk.kernels.GIVEN, "conv": conv_padded}

VARIANTS = lk.variants("04", {
    "per_image_host": lk.Variant({kind: lk.gpu.with_copies(fn, kind) for kind, fn in PADDED.items()},
                                 per_image=True, note="per image, every layer copies its inputs in, its output out"),
    "per_image_device": lk.Variant(PADDED, arrays="device", per_image=True,
                                   note="weights uploaded once, activations on the device, launched per image"),
    "batched_bounds": lk.Variant(BOUNDS, arrays="device", note="one launch per layer for the batch; bounds tests"),
    "batched_padded": lk.Variant(PADDED, arrays="device", note="one launch per layer for the batch; pad once"),
})

# %% [markdown]
# ## Task 3 — `uint8` in, probabilities out
#
# A CIFAR-10 pixel is one byte and the network wants `byte/255 − 0.5` as `float32`: converting on the host uploads 4
# bytes per pixel, converting on the device a quarter of that.
#
# - `normalize_kernel(raw, out)` on flat views: divide in float64 (`raw[t] / 255.0`) and round once when storing, which
#   matches `lk.to_input` bit for bit. Roughly {{lines:normalize}}.
# - `classify(raw, weights, variant, per_image=False)`, the whole job: for each chunk of `step` images (all of them, or
#   one at a time as the study did) upload the bytes (`lk.gpu.to_device`), normalize them into
#   `lk.gpu.buffer("input", shape)`, and run the network on them with
#   `lk.engine.forward(NET, variant, lk.engine.Prepared(x, weights))`, which returns the probabilities on the host.
#   Roughly {{lines:classify}}.
#
# ![Task 3: what the threads read and write, drawn from the kit's solution](figures/04_task3.png)
#
# ![Task 3: what the code queues, on which stream, drawn from the kit's solution](figures/04_task3b.png)

# %% tags=["kernel"]
NET = lk.get_net("cifar10")


@cuda.jit
def normalize_kernel(raw, out):
    t = cuda.grid(1)
    if t < out.size:
        ### BEGIN SOLUTION normalize
        out[t] = raw[t] / 255.0 - 0.5
        ### END SOLUTION


def normalize(raw, out):
    """uint8 images (device) -> network input (device): byte/255 - 0.5."""
    lk.gpu.launch(normalize_kernel, out.size, lk.gpu.flat(raw), lk.gpu.flat(out))


def classify(raw, weights, variant, per_image=False):
    """uint8 images (N, C, H, W) on the host -> class probabilities on the host; ``weights`` already on the device."""
    n = len(raw)
    probs = np.empty((n, NET.layers[-2].out), np.float32)
    step = 1 if per_image else n
    for i in range(0, n, step):
        ### BEGIN SOLUTION classify
        d_raw = lk.gpu.to_device(raw[i:i + step], name="images")
        x = lk.gpu.buffer("input", d_raw.shape)
        normalize(d_raw, x)
        probs[i:i + step] = lk.engine.forward(NET, variant, lk.engine.Prepared(x, weights))
        ### END SOLUTION
    return probs


# %%
# One thread of your normalize kernel, then what classify queues: yours beside the spec's
lk.show.task("04", "classify")

# %% [markdown]
# ## Check
#
# Each function against the float64 reference on fresh random inputs (batches 1, 3, 8 and 17 on a GPU; shrunk sizes
# and batches 1, 3 and 5 under the simulator), then each variant's whole forward pass with every intermediate
# poisoned. Then `normalize` bit for bit and `classify` against the reference on real images.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS, "cifar10")

# %%
# NBVAL_CHECK_OUTPUT
wl = lk.workload(net, 1200, target="gpu")
raw = lk.notebook.raw_images(wl)
x32 = lk.to_input("cifar10", raw)
weights_dev = lk.engine.prepare(wl.net, VARIANTS["batched_padded"], x32[:1], wl.weights).weights
job_ok = False
try:
    with lk.gpu.poisoned():
        d_x = lk.gpu.buffer("check", raw.shape)
    normalize(lk.gpu.to_device(raw), d_x)
    same = np.array_equal(d_x.copy_to_host(), x32)
    print("normalize equals lk.to_input bit for bit:", same)
    if same and checked.passed("batched_padded"):
        probs = classify(raw, weights_dev, VARIANTS["batched_padded"])
        job_ok = bool(np.abs(probs - lk.forward(wl.net, wl.weights, x32)).max() < 1e-5)
        print("classify matches the reference forward (max abs. difference < 1e-5):", job_ok)
except NotImplementedError:
    print("not implemented yet: normalize_kernel or classify is still the TODO stub")

# %% [markdown]
# ## Measure: per image vs batched
#
# The first 1200 images of `data_batch_1` (under the simulator: two images of a shrunk net). Every variant warms up on
# one image, then one timed pass, layer by layer (the engine reads a CUDA event before and after every layer, without
# stopping the GPU between them). Then one more pass with `lk.gpu.counting()` around it, for its launches and copies.

# %%
runs = lk.notebook.run_variants(VARIANTS, wl, checked)
counts = {name: lk.notebook.counts(VARIANTS[name], wl) for name in runs}
lk.notebook.table(runs, counts=counts)

# %% [markdown]
# ## `uint8` upload and normalize vs `float32` upload, and the whole job
#
# Both uploads into device arrays allocated beforehand, so the times are the copies (and the kernel), not `cudaMalloc`;
# `lk.measure` warms up and keeps the median. Then `classify` end to end, and a profile of it one image at a time and
# batched.

# %%
if not job_ok:
    print("not measured yet: normalize or classify does not pass its check above; make it pass first")
else:
    d_x32, d_raw, d_x = lk.gpu.buffer("x32", x32.shape), lk.gpu.buffer("raw", raw.shape, np.uint8), lk.gpu.buffer("x", raw.shape)
    t32 = lk.measure(lk.gpu.to_device, x32, d_x32, repeat=3).median
    t8 = lk.measure(lambda: normalize(lk.gpu.to_device(raw, d_raw), d_x), repeat=3).median
    print(f"{len(raw)} images: float32 upload {x32.nbytes:,d} bytes in {1e3 * t32:.3f} ms; uint8 upload + normalize "
          f"{raw.nbytes:,d} bytes in {1e3 * t8:.3f} ms")
    e2e = lk.measure(classify, raw, weights_dev, VARIANTS["batched_padded"], repeat=3)
    print(f"classify, batched, end to end: {e2e.median:.6f} s (the batched_padded layers alone: "
          f"{runs['batched_padded'].report.total:.6f} s)")
    for per_image in (True, False):
        with lk.Profiler() as prof:
            classify(raw, weights_dev, VARIANTS["batched_padded"], per_image=per_image)
        print(f"\n== classify {'one image at a time' if per_image else 'batched'}, {len(raw)} images")
        print(prof.table())

# %% [markdown]
# ## 50000 images (GPU only)
#
# All five training batches (repeated from the ones present if this folder holds fewer); only the batched variants.

# %%
if lk.device.requires_gpu("the 50000-image runs"):
    big = lk.workload(net, 50000, target="gpu", tile=True)
    big_runs = lk.notebook.run_variants(VARIANTS, big, checked, ["batched_bounds", "batched_padded"])
    lk.notebook.table(big_runs)

# %% [markdown]
# ## Plot
#
# This stage against the earlier ones (this GPU's ledger, or the kit's committed GPU results on a machine without
# one), and the conv layers of the batched runs on the device's roofline.

# %%
import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), layout="constrained")
plt.close(fig)
lk.notebook.ladder("04", runs=runs, ax=left)
lk.notebook.roofline("04", {k: r for k, r in runs.items() if k.startswith("batched")}, ax=right)
fig

# %% [markdown]
# ## Reflect
#
# 1. **Where does a per-image run's time go?** Divide `per_image_device`'s total by its launches: time per launch. Take
#    the batched run's time as the compute and call the rest launch, allocation and copy overhead. What share is it?
# 2. **What does batching change?** Launches go from `images × launches per image` to `launches per image`, and each
#    launch gets `images ×` more threads. One image's conv1 has 16 × 32 × 32 = 16384 outputs; how many threads can an
#    H100 keep resident (132 multiprocessors × 2048)?
# 3. **Does pad-once help here?** Compare the conv layers of `batched_bounds` and `batched_padded`, pad launches
#    included. The pad kernel reads and writes each input once more; the tests cost a few integer compares per tap
#    that the GPU hides behind memory loads. When would removing them pay more?
# 4. **`uint8` uploads.** For 50000 images, how many megabytes does each way move? When the forward pass takes
#    milliseconds, which matters more: the upload or the kernels?
# 5. On the roofline, where are the conv layers: against memory bandwidth or arithmetic? What does that say about the
#    next stage?
#
# ### What the kit measured

# %%
lk.measured.show("04", compare=(("04 batched_padded", "04 batched_bounds"), ("04 per_image_device", "04 batched_padded")));

# %% [markdown]
# The ratio of `batched_padded` to `batched_bounds` can fall on either side of 1, and move with the image count: the
# pad kernel is a fixed extra pass over each input, the saved tests a cost per multiply-add. The later stages go after
# the gap to cuDNN in the table: reuse of loaded values (05), weights in constant memory (06), matrix multiplication
# (07) and fusion (08).
