"""End to end from the host: the stored uint8 CIFAR images uploaded and turned into the network's input on the GPU,
against uploading the float32 input the CPU prepared. At 50000 images the float32 input is 614 MB and the bytes
154 MB: on a fast GPU the upload takes longer than the whole forward pass, so what crosses the bus matters."""

from __future__ import annotations

from statistics import median

import numpy as np

from ..course.stages import Variant
from ..launch import gpu
from ..measuring.timing import Clock
from ..model import data, reference
from ..model.nets import get_net
from ..model.weights_io import load_weights
from . import engine
from .whole import Job, bytes_to_input  # noqa: F401 - upload.bytes_to_input, as before: the whole job's kernel


def stored_bytes(images: int) -> np.ndarray:
    """``images`` stored CIFAR-10 images (uint8, N x 3 x 32 x 32), the available ones repeated as the workloads
    tile them; synthetic bytes where no data is found."""
    try:
        have = data.load_cifar10().images
    except data.DataError as exc:
        print(f"timing on synthetic bytes: {exc}")
        have = np.random.default_rng(0).integers(0, 256, (min(images, 1000), 3, 32, 32), dtype=np.uint8)
    return np.resize(have, (images, *have.shape[1:]))


def end_to_end(variant: Variant, images: int = 50000, repeat: int = 5) -> dict:
    """Median seconds (``Clock("auto")``: CUDA events on a GPU) of upload + forward + download, from float32 input
    prepared on the CPU (the class probabilities come back) and from the stored bytes converted on the GPU
    (``whole.Job.serial``: the classes come back; the same values: ``data.to_input``'s table of byte/255 - 0.5),
    with the range and the bytes each path uploads; both paths' predictions must agree, and the bytes path's input
    must equal the float path's, element for element (``inputs_equal``)."""
    net = get_net("cifar10")
    raw = stored_bytes(images)
    x = data.to_input(net, raw)
    host_weights = load_weights(net)
    weights = engine.prepare(net, variant, x[:1], host_weights).weights
    job = Job(net, variant, host_weights)

    def from_float():
        return reference.predict(engine.forward(net, variant, engine.Prepared(gpu.to_device(x, name="input"),
                                                                              weights)))

    def from_bytes():
        return job.serial(raw)

    out = {"images": images, "float32_bytes": int(x.nbytes), "uint8_bytes": int(raw.nbytes)}
    preds = {}
    for name, fn in (("float32", from_float), ("uint8", from_bytes)):
        preds[name] = fn()  # warm-up: compiles, allocates the engine's buffers
        seconds = []
        for _ in range(repeat):
            clock = Clock("auto")  # CUDA events on a GPU
            with clock.section("pass"):
                fn()
            seconds.append(clock.seconds()["pass"])
        out[f"{name}_upload_s"] = median(seconds)
        out[f"{name}_upload_range"] = (min(seconds), max(seconds))
    out["predictions_equal"] = bool(np.array_equal(preds["float32"], preds["uint8"]))
    out["inputs_equal"] = bool(np.array_equal(job.inputs(raw), x))  # the predictions alone can agree by chance
    return out
