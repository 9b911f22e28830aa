"""Timers, the two fixed report formats, and the results ledger.

GPU launches return before the work is done, so a timer that does not synchronize measures the launch, not the
kernel. On a real GPU the kit times with CUDA events recorded on the default stream; elsewhere with
``perf_counter`` after a synchronize (a no-op without a GPU). Runs are warmed up first (the first call compiles),
then the median of several is kept. Reports print in the layouts of the original studies, so students can put
their numbers beside the published ones, and every result is appended to a JSON-lines ledger with the device,
date and command that produced it.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import device

METHODS = ("auto", "cuda-events", "perf_counter")

#: Labels of the kind totals in the cifar report, in the original study's order (tanh added for other specs).
KIND_LABELS = {"conv": "Conv", "relu": "ReLU", "tanh": "Tanh", "pool": "Pool", "fc": "FC", "softmax": "Softmax",
               "other": "Other"}


# -------------------------------------------------------------------------------------------------- timers


def sync() -> None:
    """Wait for all queued GPU work (numba.cuda, and cupy if the notebook imported it); no-op without a GPU."""
    if device.info().kind != "gpu":
        return
    from numba import cuda

    cuda.synchronize()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.cuda.Device().synchronize()
        except Exception:
            pass


def resolve_method(method: str = "auto") -> str:
    """The method actually used: CUDA events only exist on a real GPU, so asking for them elsewhere falls back."""
    if method not in METHODS:
        raise ValueError(f"timing method must be one of {', '.join(METHODS)}, not {method!r}")
    if method == "perf_counter":
        return method
    return "cuda-events" if device.info().kind == "gpu" else "perf_counter"


class Timer:
    """``with Timer() as t: ...`` then ``t.seconds``. Synchronizes, so it measures finished GPU work."""

    def __init__(self, method: str = "auto"):
        self.method = resolve_method(method)
        self.seconds: float | None = None
        self._start: Any = None

    def __enter__(self) -> Timer:
        if self.method == "cuda-events":
            from numba import cuda

            self._start, self._end = cuda.event(timing=True), cuda.event(timing=True)
            self._start.record()
        else:
            sync()
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.method == "cuda-events":
            from numba import cuda

            self._end.record()
            self._end.synchronize()
            self.seconds = cuda.event_elapsed_time(self._start, self._end) / 1e3
        else:
            sync()
            self.seconds = time.perf_counter() - self._start


@dataclass(frozen=True)
class Measurement:
    """Times of the timed calls (warm-up excluded) and their median, which ignores the odd slow run."""

    median: float
    times: list[float]
    method: str
    simulated: bool
    result: Any = field(default=None, repr=False, compare=False)  # what the last timed call returned

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)


def measure(fn: Callable, *args, warmup: int = 1, repeat: int = 5, method: str = "auto", **kwargs) -> Measurement:
    """Call ``fn(*args, **kwargs)`` ``warmup`` times untimed (compilation, caches), then ``repeat`` times timed."""
    if repeat < 1:
        raise ValueError(f"measure: repeat must be at least 1, got {repeat}")
    if warmup < 0:
        raise ValueError(f"measure: warmup cannot be negative, got {warmup}")
    method = resolve_method(method)
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    result = None
    for _ in range(repeat):
        with Timer(method) as t:
            result = fn(*args, **kwargs)
        times.append(t.seconds)
    return Measurement(statistics.median(times), times, method, device.info().kind != "gpu", result)


# ------------------------------------------------------------------------------------------------- reports


def _net(net):
    """The spec a report's layer names belong to; a simulator-sized copy ("cifar10-mini") shares them."""
    from .nets import Net, base_name, get_net

    return net if isinstance(net, Net) else get_net(base_name(net))


@dataclass
class RunReport:
    """One timed forward pass: seconds per layer (in the net's order) and how they were obtained.

    ``accuracy`` is a fraction (0.7825), printed as a percentage in the cifar format.
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

    def __post_init__(self):
        if not isinstance(self.net, str):  # a Net object: keep its name, reports are plain data
            self.net = self.net.name
        self.layer_seconds = {str(k): float(v) for k, v in dict(self.layer_seconds).items()}

    @property
    def total(self) -> float:
        return float(sum(self.layer_seconds.values()))

    def layers(self, net=None) -> dict[str, tuple[str, float]]:
        """Reported layers -> (kind, seconds): the net's order; flatten's time (a reshape) folded into the layer
        after it, so reported lines and kind totals both add up to ``total``; names the net lacks are "other"."""
        net = _net(net if net is not None else self.net)
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
    net = _net(net if net is not None else report.net)
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
    spec = _net(net if net is not None else report.net)
    if spec.report == "ece408":
        return format_ece408(report, net=spec)
    if spec.report == "cifar":
        return format_cifar(report, net=spec)
    raise ValueError(f"network {spec.name!r} asks for report format {spec.report!r}; known: cifar, ece408")


# -------------------------------------------------------------------------------------------------- ledger


def repo_root() -> Path:
    """The checkout labkit runs from (where pyproject.toml is), else the current folder."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def default_ledger_path() -> Path:
    """``$LABKIT_RESULTS`` (a .jsonl file, or a folder that gets ledger.jsonl), else results/ledger.jsonl."""
    env = os.environ.get("LABKIT_RESULTS")
    if env:
        path = Path(env).expanduser()
        return path / "ledger.jsonl" if path.is_dir() or not path.suffix else path
    return repo_root() / "results" / "ledger.jsonl"


def _default_command() -> str:
    argv = sys.argv or [""]
    if "ipykernel" in argv[0] or "ipykernel" in " ".join(argv[1:2]):
        return "notebook"
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def _labkit_version() -> str:
    try:
        from importlib.metadata import version

        return version("labkit")
    except Exception:
        from . import __version__

        return __version__


class Recorded(list):
    """The ledger lines one ``record`` wrote; a notebook shows one line about them, not the whole list."""

    def __init__(self, rows: list[dict], path: Path):
        super().__init__(rows)
        self.path = path

    def __repr__(self) -> str:
        first = self[0] if self else {}
        return (f"recorded {first.get('stage') or 'run'} ({first.get('net')}, {first.get('images')} images): "
                f"{len(self)} lines in {self.path}")


class Ledger:
    """Append-only JSON lines, one per layer plus a ``total`` line per run: results come from RunReports,
    never typed in, and keep the device, date and command that produced them."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_ledger_path()

    def record(self, report: RunReport, command: str | None = None) -> Recorded:
        """Append ``report``; returns the lines written. Lines of one run share ``run`` and ``date``."""
        try:
            layers = report.layers()
        except ValueError:  # a spec the registry does not know: keep the layers as given
            layers = {name: ("other", secs) for name, secs in report.layer_seconds.items()}
        common = {
            "run": uuid.uuid4().hex[:12], "stage": report.stage, "net": report.net, "images": report.images,
            "device": report.device, "simulated": report.simulated, "synthetic": report.synthetic,
            "method": report.method, "accuracy": report.accuracy,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": command if command is not None else _default_command(), "labkit": _labkit_version(),
        }
        rows = [{**common, "layer": name, "kind": kind, "seconds": secs} for name, (kind, secs) in layers.items()]
        rows.append({**common, "layer": "total", "kind": "total", "seconds": report.total})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(row) + "\n" for row in rows))  # one write: runs do not interleave
        return Recorded(rows, self.path)

    def read(self, **filters) -> list[dict]:
        """Lines matching every filter: ``read(net="cifar10", layer="total", stage=["01_serial", "05_shared"])``
        (a list, tuple or set means any of; a callable is a predicate)."""
        if not self.path.exists():
            return []
        out = []
        with self.path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    warnings.warn(f"{self.path}:{number}: not a JSON line (an interrupted write?); skipped",
                                  stacklevel=2)
                    continue
                if all(_matches(row.get(key), want) for key, want in filters.items()):
                    out.append(row)
        return out

    def reports(self, **filters) -> list[RunReport]:
        """Rebuild one RunReport per recorded run (the lines matching ``filters``), oldest first."""
        runs: dict[str, list[dict]] = {}
        for row in self.read(**filters):
            runs.setdefault(row.get("run") or row["date"], []).append(row)
        out = []
        for rows in runs.values():
            first = rows[0]
            out.append(RunReport(
                net=first["net"], images=first["images"],
                layer_seconds={r["layer"]: r["seconds"] for r in rows if r["layer"] != "total"},
                accuracy=first.get("accuracy"), device=first["device"], simulated=first["simulated"],
                synthetic=first["synthetic"], stage=first.get("stage"), method=first["method"]))
        return out


def _matches(value, want) -> bool:
    if callable(want):
        return bool(want(value))
    if isinstance(want, (list, tuple, set, frozenset)):
        return value in want
    return value == want
