"""THE forward engine: the one place that runs a network layer by layer from a ``Variant``.

It puts the inputs and weights where the variant wants them (host, or the GPU once per run), allocates every
layer's output outside the timed region (device outputs come from a pool, so a timing never includes
``cudaMalloc``), fills outputs *and intermediates* with NaN when checking (and hands a checked layer its inputs
inside NaN margins, and says why its output holds NaN: ``checked_call``), times each layer with a ``Clock``
(CUDA events for GPU code on a GPU, ``perf_counter`` otherwise), runs layers without a function on the numpy
reference, launches per image when the variant says so, and records to the ledger when asked. The self-checks,
``lk.run``, the bench and the grader's child all call it; nothing else walks the layers.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

import numpy as np

from ..course.stages import REFERENCE_LABEL, Variant
from ..launch import gpu, simcheck
from ..launch.device import label as device_label
from ..measuring.ledger import Ledger
from ..measuring.report import RunReport, format_report, format_throughput
from ..measuring.timing import Clock, resolve_method
from ..model import layers, reference
from ..model.nets import Layer, Net
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


def _output(variant: Variant, group: tuple[Layer, ...], y, weights: dict, check: bool, tag: str = "engine"):
    shape = layers.group_output_shape(group, y.shape, weights)
    if variant.arrays == "device":
        return gpu.DEVICE.get(f"{tag} {group[-1].name}", shape)  # poisoned by the pool while checking
    return np.full(shape, np.nan, np.float32) if check else np.empty(shape, np.float32)


def _layers(net: Net, variant: Variant, x, weights: dict, clock, check: bool, tag: str = "engine"):
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
        out = _output(variant, group, y, weights, check, tag)
        call_args = layers.fused_args(group, y, weights, out) if len(group) > 1 else layers.args(layer, y, weights, out)
        with clock.section(layer.name):  # a fused group's time is its conv's; the layers it absorbed take none
            fn(*call_args)
        for absorbed in group[1:]:
            with clock.section(absorbed.name):
                pass
        y = out
    return y


def forward(net: Net, variant: Variant, prepared: Prepared, *, clock=None, check: bool = False,
            download: bool = True, tag: str = "engine"):
    """One pass over the whole batch (or image by image for a per-image variant); the output on the host.

    ``check=True`` poisons every output and intermediate with NaN first (and every pooled buffer the functions
    take), so a layer that skips elements, or an image, cannot pass on what an earlier run left behind.

    ``download=False`` leaves the last layer's output on the device and returns that device array (a pooled
    buffer: the next call with the same ``tag`` and shape overwrites it), so the call queues launches only and can
    run on a stream (``with lane:``, ``lk.streams``) or be captured in a CUDA graph (``lk.graphs``); only for
    device variants launched on the whole batch. ``tag`` names the pooled buffers (``f"{tag} {layer}"``): calls
    that may be in flight at the same time (one per lane) need tags of their own."""
    clock = clock or _NoClock()
    if not download and (variant.per_image or variant.arrays != "device"):
        why = "launches per image (each image's output is downloaded before the next reuses the buffers)" \
            if variant.per_image else "keeps its arrays on the host"
        raise ValueError(f"forward(download=False): {variant.label} {why}; only an arrays='device' variant on "
                         f"the whole batch leaves its output on the device")
    with gpu.poisoned() if check else nullcontext():
        if variant.per_image:  # each image's output is downloaded before the next reuses the pooled buffers
            return np.concatenate([_download(_layers(net, variant, prepared.x[i:i + 1], prepared.weights, clock,
                                                     check, tag)) for i in range(prepared.x.shape[0])])
        y = _layers(net, variant, prepared.x, prepared.weights, clock, check, tag)
        return _download(y) if download else y


def _download(y) -> np.ndarray:
    return y if isinstance(y, np.ndarray) else gpu.to_host(y, name="output")


#: NaN elements after a checked layer's output on the device, looked at after the call
OUT_GUARD = 1024
#: the guard's bits: a NaN of its own. A spare thread that read the NaN margins of its inputs writes NaN past the end
#: of out, so "anything not NaN there" would miss it; any write changes these bits (arithmetic gives other NaN)
GUARD_BITS = np.uint32(0x7FC0BEEF)
#: NaN elements before and after every input a checked layer is handed (x, its weights, its bias), on the host and
#: on the device: each input is a contiguous view into the middle of a longer NaN buffer, so a kernel that reads
#: past either end of an input (a window across the image's edge, an index before the first element) reads NaN
IN_GUARD = 1024


def _poison_value(dtype):
    return np.nan if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max


def _with_margins(a: np.ndarray, device: bool, poison: bool = True):
    """(the whole buffer, the contiguous view of ``a`` inside it): ``a``'s values with IN_GUARD elements either side,
    poisoned (NaN), or zeros when ``poison`` is false."""
    a = np.ascontiguousarray(a)
    whole = np.full(a.size + 2 * IN_GUARD, _poison_value(a.dtype) if poison else 0, a.dtype)
    whole[IN_GUARD:IN_GUARD + a.size] = a.ravel()
    if device:
        whole = gpu.to_device(whole)
    return whole, whole[IN_GUARD:IN_GUARD + a.size].reshape(a.shape)


def _margins_changed(whole, size: int) -> bool:
    host = gpu.as_host(whole)
    margins = np.concatenate([host[:IN_GUARD], host[IN_GUARD + size:]])
    value = _poison_value(host.dtype)
    return not (np.isnan(margins).all() if np.isnan(value) else (margins == value).all())


@contextmanager
def _unrecorded():
    """Launches and copies that are not the call's own (a diagnosis's re-runs): not counted, and on the simulator
    neither judged for races nor logged (``simcheck.paused``), the call itself having been."""
    saved = list(gpu._recorders)
    gpu._recorders.clear()
    try:
        with simcheck.paused():
            yield
    finally:
        gpu._recorders[:] = saved


#: the finite values the diagnosis fills ``out`` with, one per re-run: exact, and small enough that a sum added onto
#: them moves them (a huge fill such as -3e38 swallows any sum added onto it and looks never written)
FILLS = (np.float32(0.3125), np.float32(-1.75))


@dataclass(frozen=True)
class NanCauses:
    """Why a checked layer's NaN outputs are NaN, counted per element from two re-runs on finite fills of ``out``
    (``FILLS``): ``unwritten``, never written (both fills come back); ``added``, added onto out's initial contents
    (finite with finite fills, but not the fills: ``+=`` onto the poison); ``read``, computed from data never
    written (NaN although out was finite: the kit's NaN-poisoned buffers, a pad border, a plane of partial sums)."""

    unwritten: int = 0
    added: int = 0
    read: int = 0

    @property
    def written(self) -> int:
        """NaN elements the kernel did write."""
        return self.added + self.read


@dataclass
class LayerCall:
    """A checked layer call: its output on the host and, when that holds NaN, why (None: no NaN, or no claim)."""

    out: np.ndarray
    nan: NanCauses | None = None


def _same_elsewhere(got: np.ndarray, again: np.ndarray) -> bool:
    """The elements finite in ``got`` came out the same in ``again``: a call that leaves elements unwritten in
    memory of its own (or races) gives other values each time, and a diagnosis from its re-runs claims nothing."""
    kept = np.isfinite(got)
    return bool(np.isfinite(again[kept]).all() and np.allclose(got[kept], again[kept], rtol=1e-5, atol=1e-6))


def call_layer(fn, layer: Layer | tuple[Layer, ...], x: np.ndarray, weights: dict,
               arrays: str = "host") -> np.ndarray:
    """Call one layer function (or a fused conv group's) the way the engine does, on a NaN-poisoned output and on
    inputs with NaN margins either side (``IN_GUARD``); the output on the host. Whatever the function raises comes
    through; a write past the end of ``out``, and a read or a write outside an input, raise IndexError saying so."""
    return checked_call(fn, layer, x, weights, arrays).out


def checked_call(fn, layer: Layer | tuple[Layer, ...], x: np.ndarray, weights: dict,
                 arrays: str = "host") -> LayerCall:
    """``call_layer``, and where its output holds NaN the one diagnosis of why (``NanCauses``), which the
    self-check and the grader both word (``labkit.check.compare``): the call runs twice more, out filled with
    ``FILLS[0]`` (inputs' margins NaN) and with ``FILLS[1]`` (margins zero). An element NaN only with NaN margins
    read outside its input: that raises IndexError, as before any other cause."""
    group = layer if isinstance(layer, tuple) else (layer,)
    weights = layers.with_biases(group, weights)
    shape = layers.group_output_shape(group, x.shape, weights)
    inputs = {"x": x, **weights}
    device = arrays == "device"

    def arguments(x, w, o):
        return layers.fused_args(group, x, w, o) if len(group) > 1 else layers.args(group[0], x, w, o)

    def call(poison_margins: bool, fill=np.float32(np.nan)) -> np.ndarray:
        guarded = {k: _with_margins(v, device, poison_margins) for k, v in inputs.items()}
        views = {k: view for k, (_, view) in guarded.items()}
        xv = views.pop("x")
        if device:
            got = _guarded_device_call(lambda out: fn(*arguments(xv, views, out)), shape, fill)
        else:
            got = np.full(shape, fill, np.float32)
            fn(*arguments(xv, views, got))
        hit = [k for k, (whole, _) in guarded.items() if poison_margins and _margins_changed(whole, inputs[k].size)]
        if hit:
            raise IndexError(f"written outside its input ({', '.join(hit)}): the NaN margins around it changed; an "
                             f"index before the first element or past the last?")
        return got

    with gpu.poisoned():
        got = call(poison_margins=True)
        if not np.isnan(got).any():
            return LayerCall(got)
        try:
            with _unrecorded():  # a diagnosis, not part of the call: its launches and copies are not counted
                filled = call(poison_margins=True, fill=FILLS[0])
                zeroed = call(poison_margins=False, fill=FILLS[1])
        except Exception:  # noqa: BLE001 - the call itself ran and its output is judged; the diagnosis claims nothing
            return LayerCall(got)
    if not (_same_elsewhere(got, filled) and _same_elsewhere(got, zeroed)):
        return LayerCall(got)
    return LayerCall(got, _nan_causes(got, filled, zeroed))


def _guarded_device_call(call, shape: tuple, fill) -> np.ndarray:
    """``call(out)`` on a device ``out`` filled with ``fill``: the front of a longer buffer, whose tail is checked
    afterwards (a GPU does not check bounds, so a thread without a guard writes past the end unseen unless something
    there is looked at); ``out`` back on the host."""
    size = int(np.prod(shape))
    host = np.full(size + OUT_GUARD, fill, np.float32)
    host[size:].view(np.uint32)[:] = GUARD_BITS
    whole = gpu.to_device(host)
    outd = whole[:size].reshape(shape)
    call(outd)
    past = np.count_nonzero(gpu.as_host(whole)[size:].view(np.uint32) != GUARD_BITS)
    if past:
        raise IndexError(f"{past} value(s) written out of bounds, past the end of out ({size} elements): "
                         f"a thread without a guard (if t < out.size)?")
    return gpu.as_host(outd)


def _nan_causes(got: np.ndarray, filled: np.ndarray, zeroed: np.ndarray) -> NanCauses:
    """Why ``got`` holds NaN, from the runs with out filled (``filled``, ``zeroed``): margins read (raises),
    elements never written, added onto out's contents, read from data never written."""
    nan = np.isnan(got)
    margins = int(np.count_nonzero(nan & ~np.isfinite(filled) & np.isfinite(zeroed)))
    if margins:
        raise IndexError(f"read outside its input: {margins} of {got.size} output elements are NaN because "
                         f"the kernel read the NaN margins before or after x, w or b (with zeros there they "
                         f"are numbers): a window or an index past an input's first or last element "
                         f"(the padding ignored, a bounds test missing?)")
    unwritten = nan & (filled == FILLS[0]) & (zeroed == FILLS[1])
    read = nan & ~(np.isfinite(filled) & np.isfinite(zeroed))
    added = nan & ~unwritten & ~read
    return NanCauses(unwritten=int(unwritten.sum()), added=int(added.sum()), read=int(read.sum()))


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
