"""Run a network layer by layer with student implementations, time every layer, and report.

Layers without a student function run on the numpy reference, so a stage can replace one layer at a time.
Functions follow the calling convention in ``labkit.check`` (they write into a NaN-poisoned ``out``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import reference, timing
from .check import call_layer, impl_for, to_host
from .device import label
from .nets import base_name
from .workloads import Workload


@dataclass
class NetRun:
    """One timed forward pass: the report (times, accuracy), the class probabilities and predictions."""

    report: timing.RunReport
    probs: np.ndarray
    predictions: np.ndarray

    def __str__(self) -> str:
        return timing.format_report(self.report)


def _forward_once(wl: Workload, x, weights, impls, arrays: str, seconds: dict[str, float] | None,
                  method: str = "auto"):
    """One pass over the layers on the batch ``x``; adds each layer's time into ``seconds`` if given."""
    alloc = _host_empty if arrays == "host" else _device_empty
    y = x
    for layer in wl.net.layers:
        fn = impl_for(impls, layer)
        with timing.Timer(method) as t:
            if layer.kind == "flatten":
                y = y.reshape(y.shape[0], -1)
            elif fn is None:
                y = reference.layer_forward(layer, y, weights).astype(np.float32, copy=False)
            else:
                out = alloc((y.shape[0], *wl.net.shapes()[layer.name]))
                call_layer(fn, layer, y, weights, out)
                y = out
        if seconds is not None:
            seconds[layer.name] = seconds.get(layer.name, 0.0) + t.seconds
    return y


def _host_empty(shape):
    return np.empty(shape, np.float32)


def _device_empty(shape):
    from numba import cuda

    return cuda.device_array(shape, np.float32)


def run(wl: Workload, impls=None, *, arrays: str | None = None, per_image: bool | None = None,
        stage: str | None = None, warmup: bool = True, quiet: bool = False, ledger: timing.Ledger | None = None,
        command: str | None = None) -> NetRun:
    """Time the forward pass of ``wl`` with ``impls``: a ``labkit.Variant`` or a dict (layer name or
    kind -> function).

    ``arrays="device"``: upload the inputs and weights once, keep every activation on the GPU, download the
    probabilities once (transfers are outside the layer times). ``per_image=True`` launches every layer once
    per image, as the original C study did. Both default to the variant's settings.
    """
    from .stages import Variant

    method = "auto"
    if isinstance(impls, Variant):
        method = "perf_counter" if impls.target == "cpu" else "auto"  # CPU code: wall time, not GPU events
        arrays = impls.arrays if arrays is None else arrays
        per_image = impls.per_image if per_image is None else per_image
        impls = impls.impls
    arrays = arrays or "host"
    impls = dict(impls or {})
    if not impls:
        method = "perf_counter"  # the numpy reference runs on the CPU
    if arrays not in ("host", "device"):
        raise ValueError(f"arrays must be 'host' or 'device', not {arrays!r}")
    if arrays == "device":
        missing = [ly.name for ly in wl.net.layers if ly.kind != "flatten" and impl_for(impls, ly) is None]
        if missing:
            raise ValueError(f"arrays='device' keeps data on the GPU, so every layer needs a function; missing: "
                             f"{', '.join(missing)}")
        from numba import cuda

        weights = {k: cuda.to_device(v) for k, v in wl.weights.items()}
        x = cuda.to_device(wl.x)
    else:
        weights, x = wl.weights, wl.x
    if warmup:  # compile and load every kernel outside the timed pass
        _forward_once(wl, x[:1], weights, impls, arrays, None, method)
    seconds: dict[str, float] = {}
    if per_image:
        parts = [_forward_once(wl, x[i:i + 1], weights, impls, arrays, seconds, method) for i in range(len(wl.x))]
        probs = np.concatenate([to_host(p) for p in parts])
    else:
        probs = to_host(_forward_once(wl, x, weights, impls, arrays, seconds, method))
    seconds.pop("flatten", None)
    predictions = reference.predict(probs)
    acc = None if wl.labels is None else reference.accuracy(predictions, wl.labels)
    report = timing.RunReport(net=base_name(wl.net), images=wl.images, layer_seconds=seconds, accuracy=acc,
                              device=label(), simulated=wl.simulated, synthetic=wl.synthetic, stage=stage,
                              method=timing.resolve_method(method))
    result = NetRun(report, probs, predictions)
    if ledger is not None:
        ledger.record(report, command=command)
    if not quiet:
        print(result)
    return result
