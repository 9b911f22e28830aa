"""The floor that is the real limit of a forward call: per layer, the arithmetic its method issues at the measured rate
of the unit it runs on, or its compulsory bytes at the device's measured copy bandwidth, whichever takes longer.

The fp32 floor (``bench_whole.floor``: the net's FLOPs at the FMA units' peak) stopped bounding the kit once stage 10
moved convolutions onto the tensor cores. This one is per layer (a fused conv group counts as one: its activation and
pool add no multiply-adds and no traffic of their own):

- **compute**: the layer's *useful* multiply-adds (a conv's taps that land on the zero padding are not counted, nor
  the zero k slots a tensor-core kernel pads its reduction with) times the passes its method issues (three for the
  split products of ``labkit.tensor_cores``, fp16 or TF32; one for FMA), over the measured multiply-add rate of that
  unit (``tools/mma_rates.py``: ``mma.sync`` fp16 m16n8k16, TF32 m16n8k8, fp32 FMA);
- **memory**: its compulsory bytes (its input read once, its weights and biases, its fused group's output written
  once; the next layer's read of that output is counted as that layer's input) over the device's measured copy
  bandwidth (a device-to-device copy's read and written bytes over its time).

The floor of a call is the sum over its layers (launches and gaps cost nothing here). Rates come from
``results/unit_rates.json`` (written by ``tools/mma_rates.py --save`` on the device, by device name, with date and
command), else from the newest committed ``results/*/mma_rates.json`` of that device with the bandwidth of
``labkit.ceilings`` (measured, or the datasheet's, labelled so). Nothing here is typed in.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..measuring.ledger import repo_root
from ..model import layers
from ..model.nets import Layer, Net, get_net
from . import ceilings
from .tune import size_for

STORE = repo_root() / "results" / "unit_rates.json"
#: the units a layer's multiply-adds can run on, as ``tools/mma_rates.py`` names its kernels
UNITS = ("fma", "tf32", "f16")
UNIT_WORDS = {"fma": "fp32 FMA", "tf32": "mma.sync TF32", "f16": "mma.sync fp16"}
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Rates:
    """Multiply-adds a second of each unit (``macs``: fma, tf32, f16) and the copy bandwidth (bytes a second, read
    plus written) of one device; ``source`` says where each came from."""

    device: str
    macs: dict
    bandwidth: float
    source: str


@dataclass(frozen=True)
class Method:
    """How a layer's multiply-adds are issued: on ``unit``, ``passes`` times each (3 for a split product)."""

    unit: str = "fma"
    passes: int = 1
    name: str = ""

    def __str__(self) -> str:
        return f"{UNIT_WORDS[self.unit]} x{self.passes}"


FMA = Method("fma", 1)


@dataclass(frozen=True)
class GroupFloor:
    name: str  # the group's first layer
    layers: tuple[str, ...]
    method: Method
    macs: int  # useful multiply-adds of the whole batch
    bytes: int  # compulsory bytes of the whole batch
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class Floor:
    net: str
    images: int
    groups: tuple[GroupFloor, ...]
    rates: Rates
    notes: tuple[str, ...] = field(default=())

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.groups)

    def bounds(self) -> str:
        """Each group with work, in a clause: its bound, method and share of the floor."""
        total = self.seconds or 1.0
        return "; ".join(f"{g.name} {g.bound} ({g.method}, {1e3 * g.seconds:.4g} ms, {100 * g.seconds / total:.0f} %)"
                         for g in self.groups if g.seconds > 0)

    def table(self) -> str:
        lines = [f"{'group':<22} {'method':<18} {'useful MACs':>14} {'bytes':>13} {'compute ms':>11} "
                 f"{'memory ms':>10} {'floor ms':>9} bound"]
        for g in self.groups:
            lines.append(f"{'+'.join(g.layers):<22} {str(g.method):<18} {g.macs:>14,} {g.bytes:>13,} "
                         f"{1e3 * g.compute_s:>11.4f} {1e3 * g.memory_s:>10.4f} {1e3 * g.seconds:>9.4f} {g.bound}")
        lines.append(f"{self.net} x {self.images}: floor {1e3 * self.seconds:.4f} ms ({self.rates.source})")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the arithmetic


def _taps(size: int, kernel: int, pad: int, stride: int) -> int:
    """Sum over a kernel's offsets of the output positions whose input under that offset is inside [0, size)."""
    out = (size + 2 * pad - kernel) // stride + 1
    total = 0
    for p in range(kernel):
        # output i reads input i * stride + p - pad
        lo = max(0, -(-(pad - p) // stride))
        hi = min(out - 1, (size - 1 + pad - p) // stride)
        total += max(0, hi - lo + 1)
    return total


def useful_macs(layer: Layer, in_shape: tuple[int, ...], out_features: int | None = None) -> int:
    """Multiply-adds of one image through ``layer`` that touch real input (a conv's taps on the padding left out);
    0 for layers without weights. ``in_shape`` without the batch axis; ``out_features``: the maps or features
    (the layer's own where None)."""
    out = layer.out if out_features is None else out_features
    if layer.kind == "conv":
        c, h, w = in_shape
        return out * c * _taps(h, layer.kernel, layer.pad, layer.stride) * _taps(w, layer.kernel, layer.pad,
                                                                                  layer.stride)
    if layer.kind == "fc":
        return out * int(math.prod(in_shape))
    return 0


def net_floor(net: Net | str, images: int, rates: Rates, methods: dict | None = None,
              fuse: tuple[str, ...] = ("relu", "tanh", "pool")) -> Floor:
    """The floor of a call of ``net`` on ``images`` images: per group of ``layers.groups(net, fuse)`` the larger of
    its compute and memory times, summed. ``methods``: layer name -> ``Method`` (FMA where not named)."""
    net = get_net(net)
    methods = methods or {}
    shapes = net.shapes()
    weights = net.weight_shapes()
    rows = []
    for group in layers.groups([ly for ly in net.layers], fuse):
        first, last = group[0], group[-1]
        if first.kind == "flatten":
            continue
        in_shape = net.input_shape_of(first.name)
        method = methods.get(first.name, FMA)
        macs = images * useful_macs(first, in_shape)
        params = sum(math.prod(s) for k, s in weights.items() if k.split(".")[0] == first.name)
        nbytes = FLOAT_BYTES * (images * (math.prod(in_shape) + math.prod(shapes[last.name])) + params)
        rate = rates.macs[method.unit]
        rows.append(GroupFloor(first.name, tuple(ly.name for ly in group), method, macs, nbytes,
                               macs * method.passes / rate, nbytes / rates.bandwidth))
    return Floor(net.name, images, tuple(rows), rates)


# ------------------------------------------------------------------------------------------------ the methods


def method_of(fn, images: int) -> Method:
    """The method a layer function issues at ``images`` images: a function tuned per size (``lk.tune.by_images``)
    resolved to the size it would call, then a tensor-core conv (``labkit.tensor_cores``: its ``config``) as three
    passes on fp16 or TF32, anything else as FMA."""
    tuned = getattr(fn, "tuned", None)
    if isinstance(tuned, dict) and tuned:
        fn = tuned[size_for(tuned, images)]
    config = getattr(fn, "tensor_core_config", None)
    if config is not None:
        return Method("f16" if config.f16 else "tf32", 3, config.name)
    return Method("fma", 1, getattr(fn, "__name__", ""))


def variant_methods(net: Net | str, variant, images: int) -> dict[str, Method]:
    """``method_of`` for every conv and fc layer of ``variant`` on ``net`` (FMA where it has no function)."""
    net = get_net(net)
    out = {}
    for layer in net.layers:
        if layer.kind in ("conv", "fc"):
            fn = layers.impl_for(variant.impls, layer) if variant is not None else None
            out[layer.name] = FMA if fn is None else method_of(fn, images)
    return out


# ------------------------------------------------------------------------------------------------ the rates


def _stored() -> dict:
    try:
        return json.loads(STORE.read_text()) if STORE.exists() else {}
    except (OSError, ValueError):
        return {}


def rates_from_measurement(measured: dict, bandwidth: float | None = None, source: str = "") -> Rates:
    """``Rates`` from ``tools/mma_rates.py``'s JSON (its ``rows``: ffma, tf32, f16 in T multiply-adds a second; its
    ``copy`` row: the device-to-device bandwidth), or ``bandwidth`` where it has none."""
    rows = measured["rows"]
    macs = {"fma": rows["ffma"]["tmacs"] * 1e12, "tf32": rows["tf32"]["tmacs"] * 1e12,
            "f16": rows["f16"]["tmacs"] * 1e12}
    bw = measured.get("copy", {}).get("bandwidth") or bandwidth
    if not bw:
        raise ValueError("no copy bandwidth: the measurement has no copy row and none was given")
    return Rates(measured["device"], macs, float(bw), source or f"measured {measured.get('date', '')}".strip())


def save(measured: dict, path: Path | None = None) -> dict:
    """Keep ``tools/mma_rates.py``'s measurement (with its copy row) as its device's rates in the store."""
    path = Path(path or STORE)
    rates = rates_from_measurement(measured)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[rates.device] = {"macs_per_s": rates.macs, "copy_bandwidth": rates.bandwidth,
                          "date": measured.get("date") or dt.date.today().isoformat(),
                          "command": measured.get("command", ""), "sms": measured.get("sms")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def _committed(device: str) -> tuple[dict, Path] | None:
    """The newest committed ``results/*/mma_rates.json`` of ``device`` (folders named by date sort by date)."""
    found = []
    for path in sorted((repo_root() / "results").glob("*/mma_rates.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("device") == device and isinstance(data.get("rows"), dict):
            found.append((data, path))
    return found[-1] if found else None


def rates_for(device: str) -> Rates | None:
    """The rates of ``device``: the store's (``tools/mma_rates.py --save``), else a committed measurement's units
    with ``labkit.ceilings``'s bandwidth (measured or datasheet, said in ``source``); None without either."""
    kept = _stored().get(device)
    if kept:
        return Rates(device, dict(kept["macs_per_s"]), float(kept["copy_bandwidth"]),
                     f"unit rates and copy bandwidth measured by tools/mma_rates.py, {kept.get('date', '?')}")
    committed = _committed(device)
    if committed is None:
        return None
    data, path = committed
    rel = path.relative_to(repo_root()).as_posix()
    if data.get("copy", {}).get("bandwidth"):
        return rates_from_measurement(data, source=f"unit rates and copy bandwidth from {rel}")
    roof = ceilings.for_device(device)
    if roof is None:
        return None
    return rates_from_measurement(data, roof.bandwidth,
                                  f"unit rates from {rel}; bandwidth {roof.bandwidth / 1e12:.2f} TB/s ({roof.source})")
