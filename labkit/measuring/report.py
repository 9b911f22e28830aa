"""Run reports: seconds per layer of one forward pass, printed in the original studies' layouts, with the
throughput (GFLOP/s and GB/s from the spec's FLOPs and minimum bytes) beside them.

The layouts are fixed, so students can put their numbers beside the published ones: the OpenACC study's per-layer
report for ``cifar10`` and the ECE408 ``Op Time`` / ``Correctness`` lines for ``fashion``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from ..launch import device
from ..launch.simulator import net as shrunk
from ..model.nets import SCALED_SUFFIX, Net, base_name, get_net, layer_cost
from .timing import resolve_method

#: Labels of the kind totals in the cifar report, in the original study's order (tanh added for other specs).
KIND_LABELS = {"conv": "Conv", "relu": "ReLU", "tanh": "Tanh", "pool": "Pool", "fc": "FC", "softmax": "Softmax",
               "other": "Other"}


def spec_of(net):
    """The spec a report was made with: a registered net, or the simulator's shrunk copy ("cifar10-mini")."""
    if isinstance(net, Net):
        return net
    if net.endswith(SCALED_SUFFIX):
        return shrunk(base_name(net))
    return get_net(net)


@dataclass
class RunReport:
    """One timed forward pass: seconds per layer (in the net's order) and how they were obtained.

    ``accuracy`` is a fraction (0.7825), printed as a percentage in the cifar format. ``stage`` is the run's label
    (``labkit.stages.label``: "04 batched_padded", "numpy reference"). A report of several timed passes holds the
    per-layer medians; ``runs`` says how many and ``total_range`` the fastest and slowest pass.
    """

    net: str
    images: int
    layer_seconds: dict[str, float]
    accuracy: float | None = None
    device: str = field(default_factory=lambda: device.label())
    simulated: bool = field(default_factory=lambda: device.info().kind != "gpu")
    synthetic: bool = False
    stage: str | None = None
    method: str = field(default_factory=lambda: resolve_method("auto"))
    runs: int = 1
    total_range: tuple[float, float] | None = None

    def __post_init__(self):
        if not isinstance(self.net, str):  # a Net object: keep its name, reports are plain data
            self.net = self.net.name
        self.layer_seconds = {str(k): float(v) for k, v in dict(self.layer_seconds).items()}
        if self.total_range is not None:
            self.total_range = (float(self.total_range[0]), float(self.total_range[1]))

    @property
    def total(self) -> float:
        return float(sum(self.layer_seconds.values()))

    def layers(self, net=None) -> dict[str, tuple[str, float]]:
        """Reported layers -> (kind, seconds): the net's order; flatten's time (a reshape) folded into the layer
        after it, so reported lines and kind totals both add up to ``total``; names the net lacks are "other"."""
        net = spec_of(net if net is not None else self.net)
        known = {layer.name: layer.kind for layer in net.layers}
        order = [layer.name for layer in net.layers if layer.name in self.layer_seconds]
        order += [name for name in self.layer_seconds if name not in known]
        out: dict[str, tuple[str, float]] = {}
        carry = 0.0
        for name in order:
            kind = known.get(name, "other")
            if kind == "flatten":
                carry += self.layer_seconds[name]
                continue
            out[name] = (kind, self.layer_seconds[name] + carry)
            carry = 0.0
        if carry and out:  # flatten was last: give it to the layer before
            name, (kind, secs) = list(out.items())[-1]
            out[name] = (kind, secs + carry)
        elif carry:
            out["flatten"] = ("other", carry)
        return out

    def by_kind(self, net=None) -> dict[str, float]:
        """Seconds per layer kind (conv, relu, ...), kinds in the order of the original report."""
        totals: dict[str, float] = {}
        for kind, secs in self.layers(net).values():
            totals[kind] = totals.get(kind, 0.0) + secs
        return {k: totals[k] for k in KIND_LABELS if k in totals}

    def to_dict(self) -> dict:
        return asdict(self)

    def throughput(self, net=None) -> dict[str, dict]:
        """Per layer: seconds, FLOPs, minimum bytes, GFLOP/s and GB/s (FLOPs and bytes from the spec)."""
        spec = spec_of(net if net is not None else self.net)
        rows = {}
        for name, (kind, secs) in self.layers(spec).items():
            if kind == "other":
                continue
            cost = layer_cost(spec, name, self.images)
            rate = (lambda amount: amount / secs / 1e9 if secs > 0 else float("nan"))
            rows[name] = {"kind": kind, "seconds": secs, "flops": cost.flops, "bytes": cost.bytes,
                          "gflops": rate(cost.flops), "gbps": rate(cost.bytes), "intensity": cost.intensity}
        return rows


def _simulated_line(report: RunReport) -> list[str]:
    if report.simulated:
        return ["(times from the CUDA simulator, not a GPU: not meaningful as performance)"]
    return []


def format_cifar(report: RunReport, net=None) -> str:
    """The original OpenACC study's report: total, one line per layer, totals per kind, accuracy."""
    layers = report.layers(net)
    lines = [f"CNN for {report.images} images", "",
             f"Net Forward total time:{report.total:.6f} seconds"]
    lines += [f"    Time for {name}: {secs:.6f} seconds" for name, (_, secs) in layers.items()]
    lines.append("")
    lines += [f"  {KIND_LABELS[kind] + ':':<5} {secs:.6f} seconds" for kind, secs in report.by_kind(net).items()]
    lines.append("")
    if report.synthetic:
        lines.append("Net Accuracy: n/a (synthetic inputs)")
    elif report.accuracy is None:
        lines.append("Net Accuracy: n/a")
    else:
        lines.append(f"Net Accuracy: {100 * report.accuracy:.2f} %")
    return "\n".join(lines + _simulated_line(report))


def format_ece408(report: RunReport, conv_layers: Iterable[str] | None = None, net=None) -> str:
    """The ECE408 project's lines: ``Op Time`` of each conv layer alone, then ``Correctness`` (a fraction)."""
    net = spec_of(net if net is not None else report.net)
    names = list(conv_layers) if conv_layers is not None else net.conv_layers
    missing = [n for n in names if n not in report.layer_seconds]
    if missing:
        raise ValueError(f"format_ece408: the report has no time for {', '.join(missing)}; "
                         f"it holds {', '.join(report.layer_seconds) or 'nothing'}")
    lines = [f"Op Time: {report.layer_seconds[n]:.6f}" for n in names]
    ok = None if report.synthetic or report.accuracy is None else f"{report.accuracy:.4f}"
    lines.append(f"Correctness: {ok or 'n/a'} Model: {net.name}")
    return "\n".join(lines + _simulated_line(report))


def format_report(report: RunReport, net=None) -> str:
    """The format the net's spec asks for (``Net.report``: "cifar" or "ece408")."""
    spec = spec_of(net if net is not None else report.net)
    if spec.report == "ece408":
        return format_ece408(report, net=spec)
    if spec.report == "cifar":
        return format_cifar(report, net=spec)
    raise ValueError(f"network {spec.name!r} asks for report format {spec.report!r}; known: cifar, ece408")


def format_throughput(report: RunReport, net=None) -> str:
    """GFLOP/s and GB/s of every layer: the spec's FLOPs and minimum bytes (each input, weight and output element
    moved once) over the measured seconds. Far below the device's ceilings means time goes elsewhere."""
    rows = report.throughput(net)
    lines = [f"{'layer':<9}{'seconds':>11}{'GFLOP':>10}{'MB':>10}{'GFLOP/s':>10}{'GB/s':>9}{'FLOP/B':>8}"]
    for name, r in rows.items():
        lines.append(f"{name:<9}{r['seconds']:>11.6f}{r['flops'] / 1e9:>10.3f}{r['bytes'] / 1e6:>10.2f}"
                     f"{r['gflops']:>10.1f}{r['gbps']:>9.1f}{r['intensity']:>8.2f}")
    flops = sum(r["flops"] for r in rows.values())
    data = sum(r["bytes"] for r in rows.values())
    total = report.total
    lines.append(f"{'total':<9}{total:>11.6f}{flops / 1e9:>10.3f}{data / 1e6:>10.2f}"
                 f"{(flops / total / 1e9 if total > 0 else float('nan')):>10.1f}"
                 f"{(data / total / 1e9 if total > 0 else float('nan')):>9.1f}{'':>8}")
    return "\n".join(lines + _simulated_line(report))

