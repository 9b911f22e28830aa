"""The bench's figures of the whole job, beside the per-layer sums: what a caller waits for.

- **whole call**: CUDA events (``timing.Clock``) around the whole ``engine.forward`` call: every launch, the gaps
  between them and the small download of the class probabilities. For a ``Variant(graph=True)`` the call is a
  replay of its forward captured in a CUDA graph (``lk.graphs``), then the download; labelled so. The timed calls
  follow one untimed call, except in a slow row (``own_warmup``): there the per-layer passes just before, whose one
  pass took the row's whole time budget, already compiled the kernels and filled the buffer pool, and a further
  untimed call of seconds would only cost the ladder time; its label says so.
- **floor fraction**: the net's FLOPs (``nets.net_cost``) at the device's fp32 peak (``labkit.ceilings``) over
  the whole call: how close the call comes to the time the arithmetic alone would take. Only for GPU timings.
- **limit fraction**: the floor of the units the call runs on (``labkit.floors``: per layer, its useful
  multiply-adds times its method's passes at the measured rate of its unit, or its compulsory bytes at the measured
  copy bandwidth, whichever is longer) over the whole call. Only for GPU timings on a device with measured rates.
- **end to end**: for a ``Variant(pipeline=...)``, stored CIFAR-10 bytes on the host to classes on the host
  (``lk.whole.Job``): the variant's pipeline from pinned memory in chunks over streams, and ``Job.serial`` (one
  stream, pageable), every image's class compared with the numpy reference's prediction.
"""

from __future__ import annotations

import statistics

import numpy as np

from ..core import engine, graphs, upload, whole
from ..launch import device, gpu, simulator, streams
from ..measuring.timing import Clock
from ..model import data, reference
from ..model.nets import net_cost
from . import ceilings, floors

WHOLE_CALL_ENGINE = "engine.forward (launches + output download)"
WHOLE_CALL_GRAPH = "CUDA graph replay + output download"
#: a slow row's whole call: no untimed call of its own (``own_warmup``)
WHOLE_CALL_WARMED = f"{WHOLE_CALL_ENGINE}, warmed by the per-layer passes before it (no untimed call of its own)"
#: (chunk, streams) of a pipeline's end-to-end rows on a GPU (the probe's best were chunks of 5000 over 4 streams;
#: chunks of 2500 over 4 were issue 35's cliff, 29 ms where the best took 7; ``tools/end_to_end_grid.py`` times
#: the whole grid)
E2E_CONFIGS = ((50000, 1), (10000, 2), (5000, 4), (2500, 4))
#: on the simulator: a few images, a last chunk smaller than the others
E2E_IMAGES_SIMULATOR = 3
E2E_CONFIGS_SIMULATOR = ((2, 2),)


def timed(call, repeat: int, budget_s: float | None = None) -> list[float]:
    """Seconds of up to ``repeat`` calls (``Clock("auto")``: CUDA events on a GPU, perf_counter with a
    synchronization elsewhere); no further call once they add up to ``budget_s`` (at least one runs)."""
    seconds: list[float] = []
    for _ in range(max(1, repeat)):
        if budget_s is not None and seconds and sum(seconds) >= budget_s:
            break
        clock = Clock("auto")
        with clock.section("whole"):
            call()
        seconds.append(clock.seconds()["whole"])
    return seconds


def _spread(prefix: str, seconds: list[float]) -> dict:
    return {f"{prefix}_s": statistics.median(seconds), f"{prefix}_range": (min(seconds), max(seconds)),
            f"{prefix}_runs": len(seconds)}


def own_warmup(variant, budget_s: float | None, per_layer_pass_s: float | None, managed: bool = False) -> bool:
    """Whether the whole call makes one untimed call before its timed ones. Yes, but in a slow row: one where the
    per-layer run of the same variant on the same workload, just before, had a timed pass of ``budget_s`` or more
    (``per_layer_pass_s``: its slowest); that run compiled the kernels and filled the engine's buffer pool, and
    another untimed pass of seconds (per-image launches, say) would only cost the ladder time. A graph variant
    keeps its untimed call even then (capture, then a first replay, which the per-layer passes never made), and so
    does one that took managed memory (``managed``: first-touch page migration makes a first call slower)."""
    slow = budget_s is not None and per_layer_pass_s is not None and per_layer_pass_s >= budget_s
    return not slow or variant.graph or managed


def whole_call(wl, variant, repeat: int, budget_s: float | None = None, *, per_layer_pass_s: float | None = None,
               managed: bool = False) -> dict:
    """The whole-call columns of one GPU row (``whole_call_s``, ``_range``, ``_runs``, ``_how``), after one
    untimed call unless the row's per-layer run warmed it (``own_warmup``: ``per_layer_pass_s`` and ``managed``
    describe that run; ``whole_call_how`` says when no untimed call was made)."""
    prepared = engine.prepare(wl.net, variant, wl.x, wl.weights)
    warm = own_warmup(variant, budget_s, per_layer_pass_s, managed)
    if variant.graph:
        lane = streams.lanes(1)[0]
        graph = graphs.capture(lambda: engine.forward(wl.net, variant, prepared, download=False,
                                                      tag="bench graph"), lane)

        def call():
            return gpu.to_host(graph.replay(), name="output")  # the default stream waits for the (blocking) lane

        how = WHOLE_CALL_GRAPH if graph.captured else f"{graph.note} (+ output download)"
    else:
        def call():
            return engine.forward(wl.net, variant, prepared)

        how = WHOLE_CALL_ENGINE if warm else WHOLE_CALL_WARMED
    if warm:
        call()
    return {**_spread("whole_call", timed(call, repeat, budget_s)), "whole_call_how": how}


def floor(net, images: int, whole_s: float | None, variant=None, methods: dict | None = None) -> dict:
    """On a GPU: ``floor_s`` (the net's FLOPs at the device's fp32 peak) and ``floor_fraction`` (floor_s /
    whole_s) where its ceilings are known; ``limit_s``, ``limit_fraction``, ``limit_bounds`` and
    ``limit_source`` (``labkit.floors``: per layer the larger of its method's passes at its unit's measured rate and
    its compulsory bytes at the copy bandwidth, summed) where the device's unit rates are known, the methods
    those of ``variant``'s layer functions at ``images`` and its groups those of its ``fuse`` (``methods``: given
    instead; without a variant every layer alone, FMA where ``methods`` names none). Nothing elsewhere (simulator,
    CPU rows)."""
    if device.info().kind != "gpu" or not whole_s:
        return {}
    out = {}
    roof = ceilings.for_device(device.label())
    if roof is not None:
        floor_s = sum(c.flops for c in net_cost(net, images).values()) / roof.flops
        out.update(floor_s=floor_s, floor_fraction=floor_s / whole_s)
    rates = floors.rates_for(device.label())
    if rates is not None:
        if methods is None:
            methods = floors.variant_methods(net, variant, images) if variant is not None else {}
        limit = floors.net_floor(net, images, rates, methods, variant.fuse if variant is not None else ())
        out.update(limit_s=limit.seconds, limit_fraction=limit.seconds / whole_s, limit_bounds=limit.bounds(),
                   limit_source=rates.source)
    return out


def _bytes_and_truth(wl, ref_predictions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, str]:
    """The uint8 images of the end-to-end rows and the numpy reference's classes for them. On a GPU the stored
    bytes of the workload's own images (``upload.stored_bytes``: the reference's predictions of the workload are
    reused when the bytes are those images); on the simulator a few random images of the shrunk net."""
    net = wl.net
    if simulator.active():
        raw = np.random.default_rng(24).integers(0, 256, (E2E_IMAGES_SIMULATOR, *net.input_shape), dtype=np.uint8)
        note = f"simulated: {net.name}, {len(raw)} random images (the workload's random weights)"
    else:
        raw = upload.stored_bytes(wl.images)
        note = wl.note
    x = data.to_input(net, raw)
    if ref_predictions is not None and x.shape == wl.x.shape and np.array_equal(x, wl.x):
        return raw, ref_predictions, note
    return raw, reference.predict(reference.forward(net, wl.weights, x)), note + "; reference run on these bytes"


def end_to_end(label: str, name: str, variant, wl, ref_predictions, repeat: int,
               budget_s: float | None = None) -> list[dict]:
    """End-to-end rows of a variant with a pipeline: ``Job.serial`` and the pipeline at each (chunk, streams),
    host bytes to host classes, each timed after one untimed call whose classes (poisoned with -1 first) are
    compared with the reference's on every image."""
    raw, truth, note = _bytes_and_truth(wl, ref_predictions)
    images = len(raw)
    job = whole.Job(wl.net, variant, wl.weights)
    base = {"variant": name, "net": "cifar10", "images": images, "target": "gpu", "kind": "end_to_end",
            "simulated": simulator.active(), "device": device.label(), "workload": note}
    rows = []
    got: dict = {}

    def serial():
        got["serial"] = job.serial(raw)

    serial()
    rows.append({**base, "stage": f"{label}: Job.serial (one stream, pageable)", "chunk": images, "streams": 1,
                 **_spread("e2e", timed(serial, repeat, budget_s)), **_compared(got["serial"], truth)})
    raw_pinned = streams.pinned(raw.shape, np.uint8)
    raw_pinned[...] = raw
    classes = streams.pinned((images,), np.int32)
    configs = E2E_CONFIGS_SIMULATOR if simulator.active() else E2E_CONFIGS
    for chunk, count in configs:
        chunk = min(chunk, images)

        def pipeline():
            variant.pipeline(job, raw_pinned, classes, chunk, count)

        row = {**base, "stage": f"{label}: pipeline, chunks of {chunk} over {count} streams (pinned)",
               "chunk": chunk, "streams": count}
        try:
            classes[...] = -1
            pipeline()
            first = _compared(np.array(classes), truth)  # as the pipeline left them: no synchronization of ours
            gpu.synchronize()
            row.update(_spread("e2e", timed(pipeline, repeat, budget_s)), **first,
                       job_graphs=job.replays(job.lanes(1)[0]))  # Job.classes replayed CUDA graphs (lk.whole)
            if job.graph_note:
                row["job_graph_note"] = job.graph_note
        except Exception as exc:  # noqa: BLE001 - a broken pipeline must not stop the ladder
            gpu.synchronize()
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
    return rows


def _compared(classes: np.ndarray, truth: np.ndarray) -> dict:
    differing = int(np.count_nonzero(classes != truth))
    return {"classes_differing": differing, "classes_equal": differing == 0}
