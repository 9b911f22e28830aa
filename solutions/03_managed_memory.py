# %% [markdown]
# # 03 — Managed memory: what page migration costs
#
# **Learning goals**
# - Run the GPU layers on **managed (unified) memory**: one address valid on the host and on the GPU, with pages the
#   driver moves on demand. You write one wrapper that does it for every layer.
# - Compare managed memory with explicit copies, one image per launch and for the whole batch, and from 1200 images
#   to 50000.
# - Never ask the GPU for more managed memory than it has free.
#
# **Context** ([reference figures](../docs/reference_figures.md), section A: the OpenACC study's `parallel loop` version
# on managed memory, Tesla V100):
#
# | images | total s | conv s | unified memory moved | page-fault groups |
# |---|---|---|---|---|
# | 1200 | 7.48 | 6.98 | — | — |
# | 50000 | 302.5 | 268.5 | 26.2 GB host→device, 25.6 GB device→host | 237763 (56.5 s), 566127 thrashes |
#
# With explicit copies instead, the same study reached 3.81 s for 1200 images.

# %%
import numpy as np
import labkit as lk

lk.hello("03")
net = lk.get_net("cifar10")

# %% [markdown]
# ## What moves, and when
#
# With explicit copies you say what moves: `copy_to_device` sends exactly the bytes of one array. With managed memory
# the driver decides: on Linux with a Pascal or newer GPU a page lives in one place at a time; a GPU thread that touches
# a page held in host memory faults, the driver migrates the page (and, when it guesses a pattern, its neighbours), and
# the threads continue. A host access to a page last used by the GPU moves it back. Every group of faults costs a fixed
# latency before any byte moves. In this stage every layer gets numpy arrays and returns numpy arrays, as in the
# study. What one image needs, per layer (each input, weight and output element once):

# %%
# NBVAL_CHECK_OUTPUT
for name, cost in lk.net_cost(net, batch=1).items():
    print(f"{name:<8} {cost.bytes:>9,d} bytes")
print(f"{'total':<8} {sum(c.bytes for c in lk.net_cost(net).values()):>9,d} bytes per image")

# %% [markdown]
# ## Given: the GPU layers, and explicit copies
#
# The convolution is stage 02's `conv_thread_per_output`; the other layers are the kit's (`lk.kernels.GIVEN`). They
# take device arrays: a kernel does not know whether its pointer is managed. `lk.gpu.with_copies` wraps one for numpy
# arrays the explicit way (copy every input in, allocate the output, copy it back). Managed buffers come from
# `lk.gpu.managed_buffer(role, shape)`: allocated once per role and shape and reused, so a call pays for moving pages,
# not for allocating them; the pool never holds more than half of the GPU's free memory (a program that asks for
# more managed memory than the card has can hang the GPU) and refuses one clear way (`MemoryError`). The simulator has
# no managed memory: there the buffers are numpy arrays, which it copies in and out at every launch.

# %% tags=["kernel"]
import numpy as np
from numba import cuda

import labkit as lk

s02 = lk.from_stage("02")
GPU_LAYERS = {**lk.kernels.GIVEN, "conv": s02.conv_thread_per_output}


# %% [markdown]
# ## Task — one managed-memory wrapper for every layer
#
# `with_managed(fn, kind)` turns a layer function for device arrays into one for numpy arrays that works through
# managed memory: for each array argument take `lk.gpu.managed_buffer(f"{kind}.{k}", a.shape)` (`k` its position) and
# copy the input into it by plain numpy assignment (`m[...] = a`; not the output, at position
# `lk.layers.OUT_AT[kind]`), call `fn` on the managed buffers, `cuda.synchronize()` (a launch returns at once: the host
# may touch managed memory only after the kernel), and read the result with `args[out_at][...] = ...`. No copy call
# anywhere: host writes, GPU reads and writes, host reads, and the pages move. Roughly {{lines:with_managed}}.
#
# ![Task 1: what the code queues, on which stream, drawn from the kit's solution](figures/03_task1.png)

# %% tags=["kernel"]
def with_managed(fn, kind):
    out_at = lk.layers.OUT_AT[kind]

    def on_managed_memory(*args):
        ### BEGIN SOLUTION with_managed
        managed = list(args)
        for k, a in enumerate(args):
            if isinstance(a, np.ndarray):
                managed[k] = lk.gpu.managed_buffer(f"{kind}.{k}", a.shape)
                if k != out_at:
                    managed[k][...] = a  # the host writes: these pages are now in host memory
        fn(*managed)  # the GPU faults them in
        cuda.synchronize()
        args[out_at][...] = managed[out_at]  # the host reads: the output's pages migrate back
        ### END SOLUTION

    return on_managed_memory


# %%
# What one call of your wrapper queues, and what the host touches: yours beside the spec's
lk.show.task("03", "with_managed")


# %% tags=["kernel"]
def wrapped(wrap, per_image, note):
    return lk.Variant({kind: wrap(fn, kind) for kind, fn in GPU_LAYERS.items()}, target="gpu", per_image=per_image,
                      note=note)


VARIANTS = lk.variants("03", {
    "explicit_per_image": wrapped(lk.gpu.with_copies, True, "explicit copies around every call, one image at a time"),
    "managed_per_image": wrapped(with_managed, True, "managed buffers, one image at a time"),
    "explicit_batched": wrapped(lk.gpu.with_copies, False, "explicit copies, the whole batch per call"),
    "managed_batched": wrapped(with_managed, False, "managed buffers, the whole batch per call"),
})

# %% [markdown]
# ## Check
#
# Every function of every variant against the float64 reference on fresh random inputs at several batch sizes, then
# each whole forward pass. Under the simulator the managed variants run through numpy buffers: your code is the same,
# only the buffers differ.

# %%
# NBVAL_CHECK_OUTPUT
checked = lk.notebook.check(VARIANTS, "cifar10")

# %% [markdown]
# ## Measure: 1200 images, then 50000
#
# Each variant on the first 1200 CIFAR-10 images; then the batched variants on all 50000 (repeated from the images
# present, if this data folder holds fewer): a per-image run costs the same per image at any count. Each layer's time
# includes its wrapper's data movement. Every run makes three timed passes after a warm-up and keeps the medians: the
# first pass also pays for allocating and first touching the buffers. Under the simulator every size shrinks to the
# same two images, so each variant runs once.

# %%
runs = []
for images in (1200, 50000):
    wl = lk.workload(net, images, target="gpu", tile=True)
    names = [name for name, v in VARIANTS.items() if images == 1200 or not v.per_image]
    for name, run in lk.notebook.run_variants(VARIANTS, wl, checked, names, repeat=3).items():
        runs.append(run)
    lk.gpu.release_buffers()
    if wl.simulated:
        break

# %%
print(f"{'run':<24}{'images':>7}{'conv s':>11}{'total s':>11}{'ms/image':>10}{'managed/explicit':>18}")
by = {(r.report.stage, r.report.images): r.report for r in runs}
for (label, images), rep in by.items():
    twin = by.get((label.replace("managed", "explicit"), images))
    ratio = f"{rep.total / twin.total:.2f}x" if "managed" in label and twin and twin.total > 0 else ""
    print(f"{label:<24}{images:>7}{rep.by_kind()['conv']:>11.4f}{rep.total:>11.4f}{1e3 * rep.total / images:>10.3f}"
          f"{ratio:>18}")

# %% [markdown]
# ## Plot
#
# Milliseconds per image against the number of images (this GPU, or the kit's committed GPU results on a machine
# without one).

# %%
lk.notebook.scaling("03", runs)

# %% [markdown]
# ## Reflect
#
# 1. Follow one image through `with_managed` for conv1: which buffers does the host write, which does the GPU read and
#    write, which does the host read? How many times does each page of the output cross the bus per call?
# 2. From your per-image runs, compute (managed − explicit) / (images × 11 layer calls): the extra cost of one managed
#    call. Compare it with the study's 238 µs per fault group (56.5 s / 237763).
# 3. The study moved 26.2 GB host→device for 50000 images, about 0.52 MB per image; the table above says what one image
#    needs. What explains the difference? (Think of weights written by the host on every call, outputs that migrate to
#    the GPU before the kernel overwrites them, and whole pages.)
# 4. What would prefetching (`cudaMemPrefetchAsync`) change in a per-image run, and what would it not change?
# 5. When is managed memory the right choice anyway?
#
# ### What the kit measured

# %%
lk.measured.show("03", compare=(("03 managed_batched", "03 explicit_batched"),
                               ("03 managed_per_image", "03 explicit_per_image")));

# %% [markdown]
# On GPUs with *concurrent managed access* (Pascal and newer on Linux) the host and the GPU may both touch managed
# memory and pages move page group by page group; newer systems can also let the GPU read host memory over the bus
# (HMM or ATS) and decide by access counters whether a page moves. These change *when* pages move, not the fact that a
# host–GPU–host pattern moves them twice per call. Stage 04 removes the migrations the way the study did: explicit
# transfers, weights uploaded once and kept on the device, and batched launches.
