# %% [markdown]
# # 10 — The whole job: every layer, every launch, every copy
#
# **Learning goals**
# - Write a matrix product that splits its long reduction over a third grid dimension (split-K: partial sums per
#   split, then a reduction kernel), and decide from a layer's shape and the GPU's multiprocessor count how many
#   splits to launch.
# - Capture a whole forward pass into a CUDA graph and replay it with one call; measure what the launches themselves
#   cost a small batch.
# - Classify host bytes into host classes in chunks over several streams from pinned memory, so that copies overlap
#   kernels; measure the whole job end to end against doing it all at once.
#
# **Context** ([reference figures](../docs/reference_figures.md), sections A and C: the `cifar10` network's whole
# forward pass):
#
# | version | 1200 images | 50000 images |
# |---|---|---|
# | OpenACC, whole network on the device (V100, 21602 launches for 1200 images) | 2.77 s | 576.3 s |
# | cuDNN through PyTorch (H200, fp32, on the device) | 0.89 ms | 31.7 ms |
#
# Stages 02 to 09 made the convolutions fast, one layer at a time. A user of the network does not call a layer: they
# hand over images and want classes back. This stage looks at the whole call: the fully connected layers, the
# launches, and the copies in and out.

# %%
import numpy as np
import labkit as lk

lk.hello("10")

# %% [markdown]
# ## Where the work is: every layer's multiply-adds
#
# From the specs alone (`lk.layer_cost`): each layer's share of a forward pass, and how many 16 × 16 output tiles
# `fashion`'s fc1 (`images × 20184` times `20184 × 160`) has at each workload.

# %%
# NBVAL_CHECK_OUTPUT
for name in ("cifar10", "fashion"):
    spec = lk.get_net(name)
    costs = lk.net_cost(spec)
    total = sum(c.flops for c in costs.values())
    shares = ", ".join(f"{n} {100 * c.flops / total:.1f}" for n, c in costs.items() if spec.layer(n).kind in ("conv", "fc"))
    print(f"{name}: {total / 1e6:.2f} MFLOP per image; share of each conv and fc layer (per cent): {shares}")
for images in (100, 1000, 10000):
    print(f"fashion fc1 at {images} images: {-(-images // 16) * -(-160 // 16)} output tiles of 16 x 16, "
          f"each a reduction over 20184 inputs")

# %% [markdown]
# ## Given: stage 09's tuned convolutions
#
# The convolutions are stage 09's, as the tuner chose them for each network (`tuned`: the committed choice for the
# workload, `results/tuning.json`). Everything else in the job is this stage's.

# %% tags=["kernel"]
import math

import numpy as np
from numba import cuda, float32

import labkit as lk

s09 = lk.from_stage("09")
FUSE = s09.FUSE

# %% [markdown]
# ## Task 1 — fc1 as a split-K matrix product
#
# `out = x · wᵀ + b` with `x` of `N × K` (images × inputs) and `w` of `OUT × K`. A block of `T × T` threads owns a
# tile of `T` images (`n0 = blockIdx.y·T`) by `T` outputs (`o0 = blockIdx.x·T`), but only a **range of the inputs**:
# block `z = blockIdx.z` adds up inputs `k` from `z·kchunk` to `min((z + 1)·kchunk, K)`, and thread `(ty, tx)` writes
# its sum `Σ x[n0 + ty, k]·w[o0 + tx, k]` over that range into its own plane of partial sums,
# `part[z, n0 + ty, o0 + tx]`. No bias here: the given reduction adds the planes and the bias.
#
# Write `fc_splitk_kernel(x, w, part, kchunk)`: march over the block's range in steps of `T`. Per step every thread
# loads one element of the `x` tile (`xs[ty, tx]` from image `n0 + ty`, input `k0 + tx`) and one of the `w` tile
# (`ws[ty, tx]` from output `o0 + ty`, input `k0 + tx`), or 0 past any edge: the images, the outputs, and the end of
# the block's range (not only the end of `K`: a range may end inside a step); `syncthreads`; `T` multiply-adds,
# `xs[ty, j]·ws[tx, j]`; `syncthreads`. Threads inside the output write their plane. Roughly {{lines:splitk}}.
# Budget: `2·K/T` global loads per output element over all the splits (each tile element is read once per block).
#
# The `w` tile has `T + 1` columns (`TP`): in the multiply-adds the threads of a warp read down a column of `ws`, and
# the extra column puts those reads in different memory banks.
#
# ![Task 1: what the threads read and write, drawn from the kit's solution](figures/10_task1.png)

# %% tags=["kernel"]
T = lk.simulator.threads(16, 8)  # 16 x 16 threads on a GPU; 8 x 8 on the simulator, whose threads are Python threads
TP = T + 1  # a shared array's shape must be plain ints, not an expression of them


@cuda.jit
def fc_splitk_kernel(x, w, part, kchunk):
    xs = cuda.shared.array((T, T), float32)  # [image][input]
    ws = cuda.shared.array((T, TP), float32)  # [output][input], padded: a column read misses no bank
    N, K = x.shape
    OUT = w.shape[0]
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    n0, o0, z = cuda.blockIdx.y * T, cuda.blockIdx.x * T, cuda.blockIdx.z
    ### BEGIN SOLUTION splitk
    k_end = min((z + 1) * kchunk, K)
    n, o = n0 + ty, o0 + tx
    acc = float32(0.0)
    for k0 in range(z * kchunk, k_end, T):
        k = k0 + tx
        xs[ty, tx] = x[n, k] if n < N and k < k_end else float32(0.0)
        ws[ty, tx] = w[o0 + ty, k] if o0 + ty < OUT and k < k_end else float32(0.0)
        cuda.syncthreads()
        for j in range(T):
            acc += xs[ty, j] * ws[tx, j]
        cuda.syncthreads()
    if n < N and o < OUT:
        part[z, n, o] = acc
    ### END SOLUTION


# %% [markdown]
# ## Given: the reduction and the host function
#
# `sum_splits` adds the planes and the bias, one thread per output element. `fc_splitk(x, w, b, out, splits=0)` is
# the layer function (the fc convention of `labkit.layers`, with an optional split count): it picks the split count
# from the layer's shape when none is given (`split_count`: enough blocks for two full waves of the GPU, as many as
# fit on its multiprocessors at once, with every split at least `MIN_CHUNK` inputs long), takes the partial sums'
# planes from the buffer pool, and launches both kernels.

# %% tags=["kernel"]
@cuda.jit
def sum_splits(part, b, out):
    S, N, OUT = part.shape
    t = cuda.grid(1)
    if t < N * OUT:
        n, o = t // OUT, t % OUT
        total = b[o]
        for z in range(S):
            total += part[z, n, o]
        out[n, o] = total


#: the shortest K range a split gets: writing and adding a plane costs one store and one load per output, against
#: MIN_CHUNK multiply-adds. On the simulator short, so that its small checks split K too.
MIN_CHUNK = 2 * T if lk.simulator.active() else 16 * T


def multiprocessors() -> int:
    # the simulator has no multiprocessors: a stand-in of one
    return 1 if lk.simulator.active() else cuda.get_current_device().MULTIPROCESSOR_COUNT


def split_count(N, K, OUT) -> int:
    tiles = math.ceil(N / T) * math.ceil(OUT / T)
    wanted = 2 * multiprocessors() * (2048 // (T * T))  # two waves: 2048 resident threads per multiprocessor
    return max(1, min(math.ceil(wanted / tiles), K // MIN_CHUNK))


def fc_splitk(x, w, b, out, splits=0):
    N, K = x.shape
    OUT = w.shape[0]
    kchunk = math.ceil(K / (splits or split_count(N, K, OUT)))
    S = math.ceil(K / kchunk)
    part = lk.gpu.buffer("fc split-K partial sums", (S, N, OUT))
    lk.gpu.launch_grid(fc_splitk_kernel, (math.ceil(OUT / T), math.ceil(N / T), S), (T, T), x, w, part, kchunk)
    lk.gpu.launch(sum_splits, N * OUT, part, b, out)


# %%
# What one thread of your split-K kernel reads and writes: yours beside the spec's
lk.show.task("10", "splitk")


# %% [markdown]
# ## Task 2 — the whole call as one CUDA graph
#
# A forward pass of `cifar10` is a dozen launches. Each launch goes through Python, numba or cupy, and the driver
# before the GPU sees it; at 1200 images some of the kernels take only a few microseconds. A CUDA graph records the
# launches once and replays all of them with one call (`lk.graphs`).
#
# Write the body of `graph_call(variant, wl, lane)`: it returns a function `call()` that replays a graph of the whole
# call and returns the class probabilities on the host. Capture (`graph = lk.graphs.capture(fn, lane)`) a function
# `fn` that runs the forward pass on the device (`lk.engine.forward(wl.net, variant, prepared, download=False,
# tag=lane.name)`, which returns the last layer's device array) and copies it into the pinned host array `probs`
# (`lk.gpu.to_host(dev, out=probs)`: inside the lane an asynchronous copy, which the graph records too). `call()`
# replays the graph, waits for the lane (`lane.synchronize()`) and returns `probs`. Each call of
# `graph_call` captures a graph of its own: the check calls it again for other images and another variant. Roughly
# {{lines:graph}}.
#
# ![Task 2: what the code queues, on which stream, drawn from the kit's solution](figures/10_task2.png)

# %% tags=["kernel"]
def graph_call(variant, wl, lane):
    prepared = lk.engine.prepare(wl.net, variant, wl.x, wl.weights)
    probs = lk.streams.pinned((wl.images, len(wl.net.classes)), np.float32)
    ### BEGIN SOLUTION graph
    def forward_and_copy():
        dev = lk.engine.forward(wl.net, variant, prepared, download=False, tag=lane.name)
        return lk.gpu.to_host(dev, out=probs)

    graph = lk.graphs.capture(forward_and_copy, lane)

    def call():
        graph.replay()
        lane.synchronize()
        return probs
    ### END SOLUTION
    return call


# %%
# What your graph call queues (the capture, then a replay): yours beside the spec's
lk.show.task("10", "graph")


# %% [markdown]
# ## Task 3 — host bytes to host classes, over streams
#
# The whole job starts with `uint8` images on the host and ends with one class per image on the host. Done at once,
# the upload, the forward pass and the download follow each other. In chunks over several streams, chunk `i + 1`'s
# upload can run while chunk `i`'s kernels do. `lk.whole.Job(net, variant, weights)` holds the weights on the device
# and gives three steps, each only *queued* on a lane (`lk.streams.Lane`, one CUDA stream):
#
# - `job.upload(lane, raw_chunk)`: the chunk's bytes into the lane's own device buffer (returned);
# - `job.classes(lane, bytes_dev, n)`: normalise, forward pass, argmax: the `n` classes' device buffer;
# - `job.download(lane, classes_dev, host_out)`: the classes into `host_out`, a slice of the host array.
#
# Write `classify_streamed(job, raw, classes, chunk, streams)`: `raw` (pinned, `N × C × H × W` bytes) in chunks of
# `chunk` images (the last one may be smaller), chunk `i` on lane `i % streams` of `job.lanes(streams)`, each chunk's
# three steps on its lane; then synchronize every lane before returning, so that `classes` (pinned, `int32`) holds
# every image's class. Roughly {{lines:streamed}}.
#
# ![Task 3: what the code queues, on which stream, drawn from the kit's solution](figures/10_task3.png)

# %% tags=["kernel"]
def classify_streamed(job, raw, classes, chunk, streams):
    ### BEGIN SOLUTION streamed
    lanes = job.lanes(streams)
    for i, first in enumerate(range(0, raw.shape[0], chunk)):
        lane, last = lanes[i % streams], min(first + chunk, raw.shape[0])
        on_device = job.upload(lane, raw[first:last])
        found = job.classes(lane, on_device, last - first)
        job.download(lane, found, classes[first:last])
    for lane in lanes:
        lane.synchronize()
    ### END SOLUTION


# %%
# What your pipeline queues on which stream: yours beside the spec's
lk.show.task("10", "streamed")

# %% [markdown]
# ## The kit's register tiles
#
# The kit has its own fc one step beyond task 1, `lk.gemm.fc_tiles(x, w, b, out)` (`labkit/ops/gemm.py` in the kit's
# repository; not in your copy of the kit, as it answers task 1). In task 1 a thread owns one output and reads two
# values from shared memory for every multiply-add. In the kit's kernel each thread owns a `TM × TN` tile of sums
# kept in registers (8 × 10 in a block tile of 128 images × 160 outputs, for fc1 on a GPU): per input it reads `TM`
# values of `x` and `TN` of `w` from shared memory into registers and does `TM·TN` multiply-adds with them,
# `(TM + TN)/(TM·TN)` loads per multiply-add (0.225 for 8 × 10). It splits K as yours does, into planes that a second
# kernel adds up with the bias. Measure 1 sets its times on the kit's GPU, from the kit's committed results, beside
# your `fc_splitk`.

# %% [markdown]
# ## The kit's CUDA C SGEMM
#
# `lk.gemm_cuda.fc_cuda(x, w, b, out)` is the same product in CUDA C (`labkit/ops/gemm_cuda.py` in the kit's repository,
# not in your copy either), written the way fp32 GEMMs reach most of cuBLAS. Beyond the register tiles above it adds
# three things: **float4 loads** (both operands are contiguous along K, so one load brings four inputs, where K is a
# multiple of 4 and the arrays start on 16 bytes; scalar loads otherwise), **double buffering** (the next step's tiles
# travel from global memory into registers while this step's multiply-adds run, then into a second shared buffer: one
# `__syncthreads` a step instead of two), and **8 × 8 sums a thread** read from the k-major shared rows as float4s
# (tiles of 128 images × 80 outputs for fc1, with split-K into deterministic planes that a second kernel adds up with
# the bias). Measure 1 sets its committed times beside the others too.

# %% [markdown]
# ## Given: convolutions on the tensor cores at fp32's accuracy
#
# `lk.tensor_cores.conv_split3(x, w, b, out, pad, stride, act, pool)` (given code: `labkit/ops/tensor_cores.py`, CUDA C)
# computes a conv layer with the tensor cores' matrix instruction `mma.sync`, which multiplies short floats: TF32 (fp32
# with 10 mantissa bits) or fp16 (10 bits, and numbers only up to 65504), far shorter than fp32's 23. The kernel
# splits each fp32 value into a big part and the rounding of what is left, and adds three products (big·big,
# big·small, small·big; fp16's small parts kept 2^11 times larger so that they stay in its range) into fp32 sums
# ("The split, up close" below measures what that keeps). The conv is an implicit
# GEMM: a warp multiplies tiles of 16 output pixels × 8 or 16 k's (channel, filter row and column, read straight from
# the images staged in shared memory) by the weights' k × 8-map tiles; the bias, activation and pool are fused, and a
# shuffle between neighbouring lanes pools. An input beyond fp16's range becomes NaN outputs, which every check
# reports. `tools/conv_timing.py` timed its configurations beside stage 09's kernels on an H100 and recorded for each
# layer the quickest, or none where stage 09's kernel was quicker (`results/tensor_cores.json`);
# `lk.tensor_cores.tuned(net, images)` gives the layers it has one for. Without a GPU it runs on the CPU emulation of
# CUDA C. Measure 1 and the leaderboard time the variants that use it.

# %% [markdown]
# ## The stage's variants
#
# `whole_cifar10` and `whole_fashion`: stage 09's tuned convolutions, your split-K fc for every fully connected layer,
# the kit's other layers, and a whole call replayed from a CUDA graph (`graph=True`: what the bench times as the
# whole call). `whole_cifar10`'s convolutions are tuned per size: `lk.tune.by_images` calls, for each batch, the
# choice stage 09's tuner kept at the smallest size it tuned at or above the batch (1200 or 50000 images: at 1200 the
# small layers do not fill the GPU, and the tuner's choice for conv2 and conv3 there splits their maps over two
# blocks).
# `whole_cifar10` also names your pipeline (`pipeline=classify_streamed`: the bench's end-to-end rows);
# `fashion`'s inputs are resized images, not bytes looked up one by one, so its job starts from floats.
# `whole_fashion` is the variant the grader times. `whole_cifar10` takes the tensor cores' conv (above) for the layers
# `lk.tensor_cores.tuned` has a choice for. In the kit's repository three more variants put the kit's own fc1 kernels
# into `whole_fashion` (`whole_fashion_tiles`, `whole_fashion_cuda`, and `whole_fashion_tc`, whose fc1 multiplies on
# the tensor cores with the split of "The split, up close" below): the bench times them, and "What the kit
# measured" below shows their rows.

# %% tags=["kernel"]
VARIANTS = lk.variants("10", {
    "whole_cifar10": lk.Variant({**lk.tune.by_images({n: {**s09.tuned("cifar10", n), **lk.tensor_cores.tuned("cifar10", n)}
                                                      for n in (1200, 50000)}),
                                 "fc": fc_splitk}, arrays="device", fuse=FUSE,
                                nets=("cifar10",), graph=True, pipeline=classify_streamed,
                                note="convs per size (stage 09's, or the tensor cores' where recorded), split-K fc, "
                                     "a CUDA graph, streams end to end"),
    "whole_fashion": lk.Variant({**s09.tuned("fashion", 10000), "fc": fc_splitk}, arrays="device", fuse=FUSE,
                                nets=("fashion",), graph=True,
                                note="stage 09's tuned convs, split-K fc1 and fc2, a CUDA graph"),
})

# %% tags=["kernel", "kit-only"]
# The kit's own fc1 kernels in whole_fashion, for the bench. Only in the kit's repository: a student copy has no
# kit-only cell (tools/make_student.py), and a release has neither kernel (they answer task 1: docs/releases.md).
VARIANTS.update(lk.variants("10", {
    "whole_fashion_tiles": lk.Variant({**s09.tuned("fashion", 10000), "fc": fc_splitk, "fc1": lk.gemm.fc_tiles},
                                      arrays="device", fuse=FUSE, nets=("fashion",), graph=True,
                                      note="whole_fashion with the kit's register-tiled split-K fc1 (lk.gemm)"),
    "whole_fashion_cuda": lk.Variant({**s09.tuned("fashion", 10000), **lk.tensor_cores.tuned("fashion", 10000),
                                      "fc": fc_splitk, "fc1": lk.gemm_cuda.fc_cuda},
                                     arrays="device", fuse=FUSE, nets=("fashion",), graph=True, requires=("cuda_c",),
                                     note="whole_fashion with the kit's CUDA C SGEMM as fc1 (lk.gemm_cuda) and the "
                                          "tensor cores' convs where recorded"),
    "whole_fashion_tc": lk.Variant({**s09.tuned("fashion", 10000), **lk.tensor_cores.tuned("fashion", 10000),
                                    "fc": fc_splitk, "fc1": lk.fc_tensor_cores.fc_split3},
                                   arrays="device", fuse=FUSE, nets=("fashion",), graph=True, requires=("cuda_c",),
                                   note="whole_fashion with fc1 on the tensor cores at fp32's accuracy "
                                        "(lk.fc_tensor_cores) and the tensor cores' convs where recorded"),
}))

# %% [markdown]
# ## Check
#
# Your fc in every variant, on each network; then your graph and your pipeline, on stage 09's tuned `cifar10` variant
# (given code, so that each task's check stands on its own): the graph's predictions against the engine's on
# every call, as `graph_call` is called again for other images and for stage 09's `pooled` variant
# (`lk.graphs.check_replay`), and the pipeline's classes against `job.serial`'s on odd image counts, a smaller last
# chunk, and more streams than chunks.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS)
given = s09.VARIANTS["tuned_cifar10"]
wl = lk.workload("cifar10", 1200, target="gpu", tile=True, quiet=True)
replay = lk.graphs.check_replay(graph_call, given, wl, other=s09.VARIANTS["pooled"])
print(replay)
pipeline = lk.whole.check_pipeline(classify_streamed, lk.whole.Job(wl.net, given, wl.weights))
print(pipeline)

# %% [markdown]
# ## Measure 1: fc1 alone, split by split
#
# `fashion`'s fc1 at 100, 1000 and 10000 images: the kit's given fc (`lk.kernels.fc`) and `fc_splitk` at several
# split counts (the first, 1, is no split at all) and at the count `split_count` picks (on the simulator: a small
# layer, and times that measure the simulator). The kit's register tiles and its CUDA C SGEMM are not in your copy of
# the kit: their times come from the kit's committed GPU results (`lk.measured.fc_times()`, measured by
# `tools/fc_gemm_timing.py`), set beside yours on a GPU.

# %%
REPEAT = 2 if lk.simulator.active() else 10  # the simulator's times mean nothing: few repeats
if lk.simulator.active():
    sizes, counts = [(3, 37, 16)], [1, 2]
else:
    sizes, counts = [(100, 20184, 160), (1000, 20184, 160), (10000, 20184, 160)], [1, 2, 4, 8, 16, 32, 64]
fc_times = {}  # (images, splits, "kit", "tiles", "cuda" or "picked") -> median seconds
kit_fc = lk.measured.fc_times()  # the kit's register tiles and CUDA C SGEMM, as the kit measured them on a GPU
print(kit_fc or "no committed GPU times of the kit's fc kernels")
rng = np.random.default_rng(0)
for N, K, OUT in sizes:
    x, w = lk.gpu.to_device(rng.standard_normal((N, K), np.float32)), lk.gpu.to_device(rng.standard_normal((OUT, K), np.float32) / 100)
    b, out = lk.gpu.to_device(np.zeros(OUT, np.float32)), lk.gpu.buffer("measure fc1 out", (N, OUT))
    fc_times[N, "kit"] = lk.measure(lk.kernels.fc, x, w, b, out, repeat=REPEAT).median
    print(f"fc1 at {N} images: kit {1e3 * fc_times[N, 'kit']:.3f} ms")
    for kind in ("tiles", "cuda"):
        if kit_fc and not lk.simulator.active() and kit_fc.seconds(kind, N):
            fc_times[N, kind] = kit_fc.seconds(kind, N)  # on the kit's GPU (above), beside yours on this one
    if not checked.passed("whole_fashion"):
        print(f"fc_splitk at {N} images: not measured yet: {checked.why('whole_fashion')}; make the self-check pass first")
        continue
    for s in counts + ["picked"]:
        fc_times[N, s] = lk.measure(fc_splitk, x, w, b, out, 0 if s == "picked" else s, repeat=REPEAT).median
    print(f"fc1 at {N} images: split-K " + ", ".join(
        f"{s}: {1e3 * fc_times[N, s]:.3f} ms" for s in counts) + f"; picked ({split_count(N, K, OUT)} splits): "
        f"{1e3 * fc_times[N, 'picked']:.3f} ms")

# %% [markdown]
# ## Measure 2: the whole call, engine against graph replay
#
# `cifar10` at 1200 images with `whole_cifar10`: the engine's call (every launch from Python, the probabilities
# downloaded) against the replay of your graph, both timed around the whole call with CUDA events (`lk.measure`).

# %%
final = VARIANTS["whole_cifar10"]
call_times = {}
if not (replay.passed and checked.passed("whole_cifar10")):
    print("graph replay: not measured yet: graph_call or whole_cifar10 does not pass its check; make the self-check "
          "pass first")
else:
    prepared = lk.engine.prepare(wl.net, final, wl.x, wl.weights)
    call_times["engine call"] = lk.measure(lk.engine.forward, wl.net, final, prepared, repeat=2 * REPEAT)
    call_times["graph replay"] = lk.measure(graph_call(final, wl, lk.streams.lanes(1)[0]), repeat=2 * REPEAT)
    for what, m in call_times.items():
        print(f"{what}: {wl.images} images, median {1e3 * m.median:.3f} ms (range {1e3 * m.min:.3f}-{1e3 * m.max:.3f} ms)")
    if lk.simulator.active():
        print("(simulated: these times measure the CUDA simulator, not a GPU)")

# %% [markdown]
# ## Measure 3: the whole job, host bytes to host classes
#
# `cifar10`'s 50000 training images as bytes: `job.serial` (everything at once, pageable memory) against your
# `classify_streamed` from pinned memory, over chunk sizes and stream counts.

# %%
big = lk.workload("cifar10", 50000, target="gpu", tile=True, quiet=True)
raw = lk.notebook.raw_images(big)
chunks = [1, 2] if lk.simulator.active() else [50000, 25000, 10000, 5000, 2000]
stream_counts = [1, 2] if lk.simulator.active() else [1, 2, 4, 8]
serial, streamed = None, {}
if not checked.passed("whole_cifar10") or not pipeline.passed:
    print("the whole job: not measured yet: whole_cifar10 or classify_streamed does not pass its check; make the "
          "self-check pass first")
else:
    job = lk.whole.Job(big.net, final, big.weights)
    serial = lk.measure(job.serial, raw, repeat=REPEAT)
    print(f"serial: {big.images} images, median {1e3 * serial.median:.3f} ms")
    raw_pinned, classes = lk.streams.pinned(raw.shape, np.uint8), lk.streams.pinned((big.images,), np.int32)
    raw_pinned[...] = raw
    for chunk in chunks:
        for count in stream_counts:
            streamed[chunk, count] = lk.measure(classify_streamed, job, raw_pinned, classes, chunk, count,
                                                repeat=REPEAT).median
        print(f"chunks of {chunk}: " + ", ".join(f"{n} stream{'s' * (n > 1)} {1e3 * streamed[chunk, n]:.3f} ms"
                                                 for n in stream_counts))
    print(f"classes differing from job.serial's: {int(np.count_nonzero(classes != serial.result))} of {big.images}")
    if lk.simulator.active():
        print("(simulated: these times measure the CUDA simulator, not a GPU)")

# %% [markdown]
# ## Measure 4: the final leaderboard
#
# Both networks at their largest workloads through the engine, layer by layer, beside stage 09's tuned variants
# (on the simulator: the shrunk nets).

# %%
runs = {}
for name, n in (("cifar10", 1200), ("cifar10", 50000), ("fashion", 10000)):
    wl_n = lk.workload(name, n, target="gpu", tile=True)
    names = [v for v, var in VARIANTS.items() if name in var.nets]
    runs[name, wl_n.images] = {f"09 tuned_{name}": lk.run(wl_n, s09.VARIANTS[f"tuned_{name}"], repeat=5, quiet=True),
                               **lk.notebook.run_variants(VARIANTS, wl_n, checked, names, repeat=5)}
    if wl_n.simulated:
        break
print()
for (name, images), found in runs.items():
    for label, run in found.items():
        kinds = run.report.by_kind()
        rest = run.report.total - kinds.get("conv", 0.0) - kinds.get("fc", 0.0)
        print(f"{name} {images:>5} {label:<19} total {1e3 * run.report.total:8.3f} ms: conv {1e3 * kinds.get('conv', 0.0):8.3f}, "
              f"fc {1e3 * kinds.get('fc', 0.0):8.3f}, the rest {1e3 * rest:7.3f}")

# %% [markdown]
# ## Plot

# %%
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter, ScalarFormatter

fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2), layout="constrained")
plt.close(fig)
for i, (N, *_) in enumerate(sizes):
    split = [s for s in counts if (N, s) in fc_times]
    if split:
        left.plot(split, [1e3 * fc_times[N, s] for s in split], "o-", color=f"C{i}", label=f"split-K, {N} images")
    left.axhline(1e3 * fc_times[N, "kit"], ls=":", color=f"C{i}")
    for kind, style in (("tiles", "--"), ("cuda", "-.")):
        if (N, kind) in fc_times:
            left.axhline(1e3 * fc_times[N, kind], ls=style, color=f"C{i}")
left.set_xscale("log", base=2)
left.set(yscale="log", xlabel="splits of K", ylabel="ms", title="fc1: split-K (dotted: the kit's fc; on a GPU, from the kit's\n"
         "committed results: dashed its tiles, dash-dot its CUDA C SGEMM)")
middle.bar(list(call_times), [1e3 * m.median for m in call_times.values()])
middle.set(ylabel="ms", title=f"cifar10, {wl.images} images: the whole call")
for count in stream_counts:
    done = [c for c in chunks if (c, count) in streamed]
    if done:
        right.plot(done, [1e3 * streamed[c, count] for c in done], "o-", label=f"{count} stream{'s' * (count > 1)}")
if serial is not None:
    right.axhline(1e3 * serial.median, ls=":", color="k", label="serial")
right.set(xscale="log", xlabel="images per chunk", ylabel="ms", title=f"cifar10, {big.images} images: bytes to classes")
for ax, ticks in ((left, counts), (right, chunks)):
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
if lk.simulator.active():
    fig.suptitle("simulated: these times measure the CUDA simulator, not a GPU", fontsize=9)
yours = call_times or streamed or any((N, s) in fc_times for N, *_ in sizes for s in counts)
fig if yours else print("Nothing of yours measured yet, so no plot: make the self-checks pass first (the kit's own "
                        "GPU results are under \"What the kit measured\" below).")

# %% [markdown]
# ## The split, up close
#
# How can numbers with 11 significant bits give fp32's answer? Take one fp32 value `a`. Its big part is `a` rounded
# to fp16; its small part is what is left, `a − big`, scaled by 2^11 and rounded to fp16 again. The figure places
# each part's significant bits at the powers of two they stand for.

# %%
fig, (a, big_part, small_part) = lk.precision.draw_split(1 / 3)
plt.close(fig)
print(f"a = {a!r}\nbig = {big_part!r}\nsmall = {small_part!r}\nbig + small − a = {big_part + small_part - a:.3e}")
fig

# %% [markdown]
# A product of two split values, `(a_big + a_small)·(b_big + b_small)`, has four parts; the kernel computes three
# with `mma.sync` and drops `a_small·b_small`. Before you run the next cell, write down your prediction: for
# `cifar10`'s conv2 (with its activation and pool) at 1200 images, which of the three ways below is fastest, and
# how large will each one's error against the float64 reference be (about 1e-3, 1e-5, 1e-7)? The FMA way is stage
# 09's direct kernel (`s09.conv_pooled`: one fp32 fused multiply-add per product); the other two are the tensor
# cores' conv with TF32 parts and with fp16 parts. Each runs on an output poisoned with NaN, so a way that writes
# nothing shows an infinite error.

# %%
IMAGES = 2 if lk.simulator.active() else 1200  # the simulator's shrunk layer, or the real one
ways = lk.precision.three_ways(s09.conv_pooled, "cifar10", "conv2", images=IMAGES, repeat=REPEAT)
print(lk.precision.table(ways))
if lk.simulator.active():
    print("(simulated: these times measure the CUDA simulator and the CPU emulation of CUDA C, not a GPU)")
fig, (t_ax, e_ax) = plt.subplots(1, 2, figsize=(10, 3), layout="constrained")
plt.close(fig)
t_ax.bar([w.name for w in ways], [1e3 * w.seconds for w in ways], yerr=[[1e3 * (w.seconds - w.low) for w in ways],
                                                                       [1e3 * (w.high - w.seconds) for w in ways]])
t_ax.set(ylabel="ms (median, range)", title=f"cifar10 conv2 + relu + pool, {IMAGES} images")
e_ax.bar([w.name for w in ways], [w.error for w in ways])
for level, what in ((2.0 ** -24, "fp32's rounding, 2^-24"), (2.0 ** -11, "fp16's rounding, 2^-11")):
    e_ax.axhline(level, ls=":", color="k")
    e_ax.text(2.45, level * 1.4, what, ha="right", fontsize=8)
e_ax.set(yscale="log", ylim=(1e-8, 1e-2), ylabel="largest error / largest output", title="against float64")
fig

# %% [markdown]
# ## Reflect
#
# 1. At which image counts did splitting K pay for its second launch and its partial planes, and how many splits
#    did `split_count` pick there? Count fc1's blocks at 100 images without a split, and compare with what the GPU
#    holds at once (its multiprocessors × 2048 threads).
# 2. fc1 is a third of `fashion`'s multiply-adds. After this stage, how does its time compare with the
#    convolutions'? How much faster than your `fc_splitk` were the kit's register tiles and its CUDA C SGEMM at
#    each image count, and how many shared-memory loads per multiply-add does each kernel do? And `cifar10`'s fc
#    (320 inputs, 10 outputs): how did your kernel do there against stage 09's variant, which uses the kit's fc, and what share
#    of a 16 × 16 tile's threads have an output to write?
# 3. What did the graph save per call at 1200 images, and how does that compare with the number of launches in a
#    pass (`lk.Profiler`)? Would it matter at 50000 images?
# 4. Which chunk size and stream count were fastest end to end, and why do very small chunks lose again? What share
#    of the serial job was the upload of 153.6 MB from pageable memory?
# 5. How close was your prediction for the three ways? From the figure of the split: how many of fp32's 24
#    significant bits do the two fp16 parts hold, and what does the dropped `a_small·b_small` weigh against a
#    product? Each split needs three `mma.sync` products for one fp32 product: with the rates of an H100
#    (`tools/mma_rates.py`: fp16 about ten times the FMA units' multiply-adds, TF32 about five), how much faster
#    than FMA could each way be at best, and what kept the measured layer from it?
#
# ### What the kit measured

# %%
lk.measured.show("10", compare=(("10 whole_cifar10", "09 tuned_cifar10"), ("10 whole_fashion", "09 tuned_fashion")));

# %% [markdown]
# The last stage is about everything that is not the convolution: a fully connected layer as large as a
# convolution, launches that cost more than small kernels, and copies that can hide behind compute. Whether each
# of them matters depends on the batch: measure it on the device the network will run on.
