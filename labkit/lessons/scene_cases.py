"""The small cases of the scenes that are not a conv layer function (``labkit.scenes``): what each runs, on which
small arrays of its own, and what a right answer is. A kernel scene's runner takes what the scene found in the
namespace (the student's kernel) and the case, and returns (a call that launches it and returns its output, the
case's sizes and the roles of its arrays for ``labkit.access``, the right output); a timeline scene's returns the
function ``labkit.timeline.record`` runs, everything it needs made beforehand.
"""

from __future__ import annotations

import numpy as np

from . import access, timeline
from . import notebook
from ..core import engine
from ..core.workloads import workload
from ..course.stages import Variant, from_stage
from ..launch import gpu, streams
from ..model.data import to_input


def conv_case(case: dict):
    return access.small_case(**{**case, "fuse": tuple(case["fuse"]), "size": None if case.get("size") is None
                                 else tuple(case["size"])})


def device(*arrays):
    from numba import cuda

    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def pad(kernel, case):
    """Stage 04's pad kernel, one thread per element of the padded copy (NaN before: every element is written)."""

    c = conv_case(case)
    pad = c.layer.pad
    n, ch, h, w = c.x.shape
    shape = (n, ch, h + 2 * pad, w + 2 * pad)

    def call():
        x, padded = device(c.x, np.full(shape, np.nan, np.float32))
        gpu.launch(kernel, padded.size, x, padded, pad)
        return padded.copy_to_host()

    want = np.pad(c.x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    return call, {"out": list(shape), "shapes": {"input": c.x.shape, "output": shape},
                  "what": f"x of {n}×{ch}×{h}×{w}, pad {pad}"}, want


def normalize(kernel, case):
    """Stage 04's normalize kernel on flat views: one thread per byte."""

    raw = np.random.default_rng(case["seed"]).integers(0, 256, (1, 3, 4, 6)).astype(np.uint8)

    def call():
        d_raw, out = device(raw.ravel(), np.full(raw.size, np.nan, np.float32))
        gpu.launch(kernel, out.size, d_raw, out)
        return out.copy_to_host()

    return call, {"out": [raw.size], "roles": {"raw": "input", "out": "output"},
                  "what": f"{raw.size} bytes (one 3×4×6 image)"}, raw.ravel() / 255.0 - 0.5


def unroll(kernel, case):
    """Stage 07's unroll kernel: one thread per element of the unrolled matrix X."""

    c = conv_case(case)
    n, ch, h, w = c.x.shape
    k, pad = c.layer.kernel, c.layer.pad
    ho, wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    shape = (n, ch * k * k, ho * wo)

    def call():
        x, unrolled = device(c.x, np.full(shape, np.nan, np.float32))
        gpu.launch(kernel, unrolled.size, x, unrolled, pad, 1, k)
        return unrolled.copy_to_host()

    xp = np.pad(c.x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    want = np.stack([xp[:, :, p:p + ho, q:q + wo] for p in range(k) for q in range(k)], 2).reshape(
        n, ch, k * k, ho * wo).reshape(shape)
    return call, {"out": list(shape), "shapes": {"input": c.x.shape, "output": shape},
                  "what": f"x of {n}×{ch}×{h}×{w}, K {k}, pad {pad}"}, want


def tiled(make, case):
    """Stage 05's tiled kernel for T = 8, launched on the case's grid of 2×2 tiles (12×12 outputs, one map)."""

    c = conv_case(case)
    w, b = c.weights["conv2.weight"], c.weights["conv2.bias"]
    kernel = make(8, w.shape[2])

    def call():
        x, dw, db, out = device(c.x, w, b, np.full(c.expected.shape, np.nan, np.float32))
        gpu.launch_grid(kernel, (4, w.shape[0], c.x.shape[0]), (8, 8), x, dw, db, out, c.layer.pad)
        return out.copy_to_host()

    return call, access._sizes(c), c.expected


def splitk(fc, case):
    """Stage 10's split-K fc on 5 images × 40 inputs → 6 outputs, in 3 splits of 14 inputs."""
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((5, 40)).astype(np.float32)
    w = (rng.standard_normal((6, 40)) / 6).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)

    def call():
        dx, dw, db, out = device(x, w, b, np.full((5, 6), np.nan, np.float32))
        fc(dx, dw, db, out, 3)
        return out.copy_to_host()

    return call, {"out": [5, 6], "shapes": {"input": (5, 40), "weights": (6, 40), "bias": (6,), "output": (5, 6)},
                  "what": "x of 5 images × 40 inputs, 6 outputs, 3 splits"}, x.astype(np.float64) @ w.T + b


def managed(wrapper, case):
    """Stage 03: the wrapper around the thread-per-output conv, one call on a small case."""
    c = conv_case(case)
    w, b = c.weights["conv2.weight"], c.weights["conv2.bias"]

    def go(rec):
        out = timeline.watched(np.full(c.expected.shape, np.nan, np.float32), rec, "host read", "your out")
        wrapper(c.x, w, b, out, c.layer.pad, 1)
    return go


def classify(ns, case):
    """Stage 04's classify, one image at a time, on two images with the given layers (stage 02's conv)."""

    wl = workload(case["net"], 2, target="gpu", quiet=True)
    raw = notebook.raw_images(wl)
    variant = Variant(ns.BOUNDS, arrays="device")
    weights = engine.prepare(wl.net, variant, to_input(wl.net, raw)[:1], wl.weights).weights

    def go(rec):
        ns.classify(raw, weights, variant, per_image=True)
    return go


def graph(graph_call, case):
    """Stage 10: graph_call on stage 09's tuned variant and two images, then one call."""

    wl = workload(case["net"], 2, target="gpu", quiet=True)
    variant = from_stage("09").VARIANTS["tuned_cifar10"]
    lane = streams.lanes(1)[0]

    def go(rec):
        graph_call(variant, wl, lane)()
    return go


def streamed(pipeline, case):
    """Stage 10: the pipeline on four images in chunks of one over two streams."""

    wl = workload(case["net"], 4, target="gpu", quiet=True)
    # no graphs of the job's own (a GPU's Job would replay each chunk's launches from one): the picture is the
    # pipeline's, and the spec's was recorded on the simulator, which has none
    from ..core import whole  # a release up to milestone 04 leaves it out

    job = whole.Job(wl.net, from_stage("09").VARIANTS["tuned_cifar10"], wl.weights, graphs=False)
    raw = streams.pinned((4, *job.net.input_shape), np.uint8)
    raw[...] = whole.case_bytes(job.net, 4, np.random.default_rng(case["seed"]))
    classes = streams.pinned((4,), np.int32)
    job.lanes(2)

    def go(rec):
        pipeline(job, raw, classes, 1, 2)
    return go
