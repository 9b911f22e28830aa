"""THE forward engine: the one place that runs a network layer by layer from a ``Variant``.

It puts the inputs and weights where the variant wants them (host, or the GPU once per run), allocates every
layer's output outside the timed region (device outputs come from a pool, so a timing never includes
``cudaMalloc``), fills outputs *and intermediates* with NaN when checking, times each layer with a ``Clock``
(CUDA events for GPU code on a GPU, ``perf_counter`` otherwise), runs layers without a function on the numpy
reference, launches per image when the variant says so, and records to the ledger when asked. The self-checks,
``lk.run``, the bench and the grader's child all call it; nothing else walks the layers.
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from . import gpu, layers, reference
from .ledger import Ledger
from .nets import Layer, Net
from .report import RunReport, format_report, format_throughput
from .stages import REFERENCE_LABEL, Variant
from .timing import Clock
from .workloads import Workload


@dataclass
class NetRun:
    """One timed forward pass (or the medians of several): the report, the class probabilities, the predictions."""

    report: RunReport
    probs: np.ndarray
    predictions: np.ndarray

    def __str__(self) -> str:
        return format_report(self.report) + "\n\n" + format_throughput(self.report)

    def __repr__(self) -> str:
        return str(self)


class _NoClock:
    def section(self, name):
        return nullcontext()


def as_variant(impls) -> Variant:
    """A Variant from a Variant, a dict (layer name or kind -> host function) or None (the numpy reference)."""
    if isinstance(impls, Variant):
        return impls
    if impls is None:
        return Variant(impls={}, target="cpu", name=REFERENCE_LABEL)
    if isinstance(impls, dict):
        return Variant(impls=dict(impls), target="cpu", name="functions")
    raise TypeError(f"expected a labkit.Variant, a dict of layer functions or None, not {type(impls).__name__}")


@dataclass
class Prepared:
    """Inputs and weights where a variant's functions expect them (numpy, or device arrays)."""

    x: object
    weights: dict

    def first(self, n: int) -> Prepared:
        return Prepared(self.x[:n], self.weights)


def _missing(net: Net, variant: Variant) -> list[str]:
    return [ly.name for ly in layers.kernel_layers(net) if layers.impl_for(variant.impls, ly) is None]


def prepare(net: Net, variant: Variant, x: np.ndarray, weights: dict) -> Prepared:
    """Copy the inputs and the weights to the GPU once for a device variant (zero biases added where the spec
    has none); host variants get them as they are."""
    weights = layers.with_biases(layers.kernel_layers(net), weights)
    if variant.arrays == "host":
        return Prepared(x, weights)
    missing = _missing(net, variant)
    if missing:
        raise ValueError(f"arrays='device' keeps the data on the GPU, so every layer needs a function; missing: "
                         f"{', '.join(missing)}")
    return Prepared(gpu.to_device(x, name="input"), {k: gpu.to_device(v, name=k) for k, v in weights.items()})


def _output(variant: Variant, group: tuple[Layer, ...], y, weights: dict, check: bool):
    shape = layers.group_output_shape(group, y.shape, weights)
    if variant.arrays == "device":
        return gpu.DEVICE.get(f"engine {group[-1].name}", shape)  # poisoned by the pool while checking
    return np.full(shape, np.nan, np.float32) if check else np.empty(shape, np.float32)


def _layers(net: Net, variant: Variant, x, weights: dict, clock, check: bool):
    y = x
    for group in layers.groups(list(net.layers), variant.fuse):
        layer = group[0]
        if layer.kind == "flatten":
            y = y.reshape(y.shape[0], int(np.prod(y.shape[1:])))
            continue
        fn = layers.impl_for(variant.impls, layer)
        if fn is None:  # host arrays only (prepare refuses device variants with gaps)
            with clock.section(layer.name):
                y = reference.layer_forward(layer, y, weights).astype(np.float32, copy=False)
            continue
        out = _output(variant, group, y, weights, check)
        call_args = layers.fused_args(group, y, weights, out) if len(group) > 1 else layers.args(layer, y, weights, out)
        with clock.section(layer.name):  # a fused group's time is its conv's; the layers it absorbed take none
            fn(*call_args)
        for absorbed in group[1:]:
            with clock.section(absorbed.name):
                pass
        y = out
    return y


def forward(net: Net, variant: Variant, prepared: Prepared, *, clock=None, check: bool = False) -> np.ndarray:
    """One pass over the whole batch (or image by image for a per-image variant); the output on the host.

    ``check=True`` poisons every output and intermediate with NaN first (and every pooled buffer the functions
    take), so a layer that skips elements, or an image, cannot pass on what an earlier run left behind."""
    clock = clock or _NoClock()
    with gpu.poisoned() if check else nullcontext():
        if variant.per_image:  # each image's output is downloaded before the next reuses the pooled buffers
            return np.concatenate([_download(_layers(net, variant, prepared.x[i:i + 1], prepared.weights, clock,
                                                     check)) for i in range(prepared.x.shape[0])])
        return _download(_layers(net, variant, prepared.x, prepared.weights, clock, check))


def _download(y) -> np.ndarray:
    return y if isinstance(y, np.ndarray) else gpu.to_host(y, name="output")


#: NaN elements after a checked layer's output on the device, looked at after the call
OUT_GUARD = 1024


def call_layer(fn, layer: Layer | tuple[Layer, ...], x: np.ndarray, weights: dict,
               arrays: str = "host") -> np.ndarray:
    """Call one layer function (or a fused conv group's) the way the engine does, on a NaN-poisoned output; the
    output on the host. Whatever the function raises comes through."""
    group = layer if isinstance(layer, tuple) else (layer,)
    weights = layers.with_biases(group, weights)
    out = np.full(layers.group_output_shape(group, x.shape, weights), np.nan, np.float32)

    def arguments(x, w, o):
        return layers.fused_args(group, x, w, o) if len(group) > 1 else layers.args(group[0], x, w, o)

    with gpu.poisoned():
        if arrays == "device":
            xd, wd = gpu.to_device(x), {k: gpu.to_device(v) for k, v in weights.items()}
            # out is the front of a longer NaN buffer: a GPU does not check bounds, so a thread without a guard
            # writes past the end unseen unless something there is looked at afterwards
            whole = gpu.to_device(np.full(out.size + OUT_GUARD, np.nan, np.float32))
            outd = whole[:out.size].reshape(out.shape)
            fn(*arguments(xd, wd, outd))
            past = np.count_nonzero(~np.isnan(gpu.as_host(whole)[out.size:]))
            if past:
                raise IndexError(f"{past} value(s) written out of bounds, past the end of out ({out.size} elements): "
                                 f"a thread without a guard (if t < out.size)?")
            return gpu.as_host(outd)
        fn(*arguments(x.copy(), {k: v.copy() for k, v in weights.items()}, out))
    return out


def clock_method(variant: Variant) -> str:
    """CPU code (and the numpy reference) is timed with perf_counter even on a GPU machine: wall time, not events."""
    return "perf_counter" if variant.target == "cpu" or not variant.impls else "auto"


def time_passes(net: Net, variant: Variant, prepared: Prepared, repeat: int, warmup: bool = True,
                clock_factory=None, budget_s: float | None = None) -> tuple[np.ndarray, list[dict[str, float]]]:
    """Warm up on one image (compiles every function), then ``repeat`` timed passes; per-layer seconds of each.

    ``budget_s``: no further pass starts once the timed passes so far add up to this many seconds (at least one
    runs), so a pass of minutes is timed once or twice rather than ``repeat`` times; the caller reports how many ran.
    """
    make_clock = clock_factory or (lambda: Clock(clock_method(variant)))
    if warmup:
        forward(net, variant, prepared.first(1))
    passes, probs = [], None
    for _ in range(repeat):
        if budget_s is not None and passes and sum(sum(p.values()) for p in passes) >= budget_s:
            break
        clock = make_clock()
        probs = forward(net, variant, prepared, clock=clock)
        passes.append(clock.seconds())
    return probs, passes


def median_seconds(passes: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(p[name] for p in passes) for name in passes[0]}


def run(wl: Workload, variant=None, *, per_image: bool | None = None, arrays: str | None = None,
        label: str | None = None, warmup: bool = True, repeat: int = 1, quiet: bool = False,
        record: bool | Ledger = False, command: str | None = None, budget_s: float | None = None) -> NetRun:
    """Time the forward pass of ``wl`` with ``variant`` (a ``labkit.Variant``, a dict of layer functions, or None
    for the numpy reference) and print the report in the network's format with its throughput.

    ``repeat`` timed passes after a warm-up on one image: the report holds the per-layer medians and the range of
    the totals. ``per_image`` and ``arrays`` override the variant's. ``record=True`` appends the report to the
    results ledger (or to the ``Ledger`` given). ``budget_s`` ends the repeats early (``time_passes``); the report's
    ``runs`` says how many ran."""
    v = as_variant(variant)
    if per_image is not None or arrays is not None:
        v = replace(v, per_image=v.per_image if per_image is None else per_image, arrays=arrays or v.arrays)
    if repeat < 1:
        raise ValueError(f"run: repeat must be at least 1, got {repeat}")
    prepared = prepare(wl.net, v, wl.x, wl.weights)
    probs, passes = time_passes(wl.net, v, prepared, repeat, warmup, budget_s=budget_s)
    totals = [sum(p.values()) for p in passes]
    predictions = reference.predict(probs)
    acc = None if wl.labels is None else reference.accuracy(predictions, wl.labels)
    from .device import label as device_label
    from .timing import resolve_method

    report = RunReport(net=wl.net.name, images=wl.images, layer_seconds=median_seconds(passes),
                       accuracy=acc, device=device_label(), simulated=wl.simulated, synthetic=wl.synthetic,
                       stage=label or v.label, method=resolve_method(clock_method(v)), runs=len(passes),
                       total_range=(min(totals), max(totals)))
    result = NetRun(report, probs, predictions)
    if record:
        (record if isinstance(record, Ledger) else Ledger()).record(report, command=command)
    if not quiet:
        print(result)
    return result
