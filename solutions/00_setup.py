# %% [markdown]
# # 00 — Setup: your machine, the data, the reference run
#
# **Learning goals**
# - Know what this machine offers (a GPU, or numba's CUDA simulator) and what that changes in the course.
# - Find the two datasets and run the numpy reference forward pass of both networks, in the two report formats every
#   later stage prints.
# - Read a layer's cost (FLOPs, bytes) and the device's ceilings: the two numbers every timing is compared with.
#
# **Context.** The course follows two published efforts and one modern baseline
# ([reference figures](../docs/reference_figures.md)):
#
# | | workload | time |
# |---|---|---|
# | OpenACC study, serial C (section A) | `cifar10`, 1200 images | 38.17 s |
# | OpenACC study, best version on a V100 (A) | `cifar10`, 1200 images | 0.351 s |
# | ECE408 project, fused kernel, conv1 / conv2 (B) | `fashion`, 10000 images | 0.0212 / 0.0688 s |
# | cuDNN on an H200 (C) | `cifar10`, 50000 images | 0.0317 s |

# %%
import numpy as np
import labkit as lk

lk.hello("00")

# %% [markdown]
# ## Your machine
#
# `labkit info` prints the same from a shell. Without a GPU, numba runs CUDA kernels on the **CUDA simulator**
# (`NUMBA_ENABLE_CUDASIM=1`): every GPU thread becomes a Python thread. Kernels give the same results, so every
# self-check works, but they run about a million times slower; labkit then shrinks the problems and labels every time
# as simulated.

# %%
print(lk.device.describe())

# %% [markdown]
# ## The networks
#
# Both are declarative specs: the reference, the checks, the timing report and the grader read them. Layout is NCHW
# float32 everywhere; conv weights are `[M, C, K, K]`.

# %%
# NBVAL_CHECK_OUTPUT
for name in ("cifar10", "fashion"):
    print(lk.get_net(name).describe())
    print()

# %% [markdown]
# ## The reference run, in the studies' formats
#
# The numpy reference (im2col and a matrix multiply, in `labkit/model/reference.py`) runs each layer over the whole batch
# with the kit's own trained weights (`labkit/weights/`, recipe and accuracies recorded beside them). Every student
# kernel is checked against it. Under each report: every layer's FLOPs and minimum bytes (each input, weight and
# output element moved once), and what they make per second.

# %%
cifar = lk.workload("cifar10", 1200, target="cpu")
print(lk.run(cifar, record=True, quiet=True))

# %%
fashion = lk.workload("fashion", 10000, target="cpu")
print(lk.run(fashion, record=True, quiet=True))

# %% [markdown]
# The original C study shipped its own trained weights in a text format; labkit imports them (`labkit run --weights
# FOLDER` does the same). They were trained by ConvNetJS, so they classify CIFAR-10 with their own accuracy.

# %%
study = lk.data.find_folder("cnn-cifar10-weights")
if study is not None and not cifar.synthetic:
    acc = lk.accuracy(lk.forward("cifar10", lk.load_weights("cifar10", study), cifar.x), cifar.labels)
    print(f"C-study weights on the same {cifar.images} images: {100 * acc:.2f} %")
else:
    print("The C study's weight files (cnn-cifar10-weights/) are not in any data folder; skipping them.")

# %% [markdown]
# ## Two numbers: what a layer must do, and what the device can do
#
# A layer's FLOPs over the device's FLOP/s, and its bytes over the memory bandwidth, give two times; the larger is the
# floor no kernel beats. Their ratio, FLOP per byte, says which one a layer is up against: a *roofline*. labkit
# measures the ceilings on a GPU (`lk.ceilings.measure()`); elsewhere it shows the kit's committed measurement of its
# GPU, or the datasheet.

# %%
# NBVAL_CHECK_OUTPUT
for name, cost in lk.net_cost(lk.get_net("cifar10"), batch=50000).items():
    print(f"{name:<8} {cost.flops / 1e9:9.2f} GFLOP {cost.bytes / 1e9:8.3f} GB  {cost.intensity:7.2f} FLOP/byte")

# %%
print(lk.ceilings.describe(lk.ceilings.current()))

# %% [markdown]
# ## One kernel launch, seen from inside
#
# A kernel runs once per thread; each thread finds its place from `blockIdx`, `blockDim` and `threadIdx`. Below, a grid
# of 3 blocks of 4 threads writes each thread's global index into an array of 10 elements. The bounds test keeps the
# last two threads from writing past the end: every kernel in this course has one.

# %%
from numba import cuda


@cuda.jit
def who_wrote(out, block_of, thread_of):
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < out.size:
        out[i] = i
        block_of[i] = cuda.blockIdx.x
        thread_of[i] = cuda.threadIdx.x


n = 10
out, block_of, thread_of = (cuda.to_device(np.full(n, -1, np.int32)) for _ in range(3))
lk.gpu.launch_grid(who_wrote, 3, 4, out, block_of, thread_of)

# %%
# NBVAL_CHECK_OUTPUT
print("element:", np.arange(n))
print("block:  ", block_of.copy_to_host())
print("thread: ", thread_of.copy_to_host())
print("value:  ", out.copy_to_host())

# %% [markdown]
# ## Reflect
#
# 1. In the `cifar10` report, which layers take the time in the numpy reference, and how do their GFLOP/s differ? Why
#    might im2col and a matrix multiply (what the reference does) favour the conv layers?
# 2. The C study's weights and the kit's weights give different accuracies on the same images. Which numbers in the
#    later stages must stay equal to the reference's, and which may change?
# 3. From the table of costs: at 50000 images, what is the shortest time conv1 could take on the device above, if
#    limited by arithmetic? If limited by memory? Which limit is it against?
# 4. Under the simulator, how many Python threads did the launch above start? What would 50000 images × 16 maps ×
#    32 × 32 output pixels mean there?
