"""An nvprof-like summary a student can produce without nvprof (which no longer supports recent GPUs).

The original studies read their profiles for two things: where the GPU time goes (kernels vs copies) and how
many times each thing happened (3600 conv launches for 1200 images, 150030 host-to-device copies ...).
``with Profiler() as prof:`` records both for every launch and copy made through ``labkit.gpu`` (the launch layer
every stage uses). On a real GPU each activity is bracketed by CUDA events on the default stream and the elapsed
times are read only when a table is asked for, so recording adds no synchronization per launch; elsewhere
``perf_counter`` is used and the table says it is simulated. An activity's time runs from an event recorded before
the Python call to one recorded after it: for a small kernel that includes the time Python takes to launch it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..launch import device, gpu
from .timing import resolve_method, sync

ACTIVITY_KINDS = ("kernel", "HtoD", "DtoH", "other")
COPY_NAMES = {"HtoD": "[CUDA memcpy HtoD]", "DtoH": "[CUDA memcpy DtoH]"}
HEADER = "            Type  Time(%)      Time     Calls       Avg       Min       Max  Name"


def format_time(seconds: float) -> str:
    """nvprof's units: 5 significant digits in s, ms, us or ns (``3.7402ms``, ``25.824us``, ``960ns``)."""
    if seconds >= 1:
        value, unit = seconds, "s"
    elif seconds >= 1e-3:
        value, unit = seconds * 1e3, "ms"
    elif seconds >= 1e-6:
        value, unit = seconds * 1e6, "us"
    else:
        return f"{seconds * 1e9:.0f}ns"
    if value >= 100:
        text = f"{value:.2f}"
    elif value >= 10:
        text = f"{value:.3f}"
    else:
        text = f"{value:.4f}"
    if float(text) >= 1000 and unit != "s":  # rounding crossed into the next unit
        return format_time(float(text) * {"ms": 1e-3, "us": 1e-6}[unit] * 1.0000001)
    return text + unit


@dataclass
class _Entry:
    name: str
    kind: str
    bytes: int = 0
    seconds: float | None = None
    events: Any = None  # (start, end) CUDA events, read lazily


@dataclass
class Profiler:
    """``with Profiler() as prof: ...`` then ``print(prof.table())``; ``prof.activity(name, kind)`` records any
    other block (host work as ``kind="other"``)."""

    method: str = "auto"
    entries: list[_Entry] = field(default_factory=list)

    def __post_init__(self):
        self.method = resolve_method(self.method)
        self.simulated = device.info().kind != "gpu"

    # -- recording

    @contextmanager
    def activity(self, name: str, kind: str = "kernel", nbytes: int = 0, **launch):
        """Time the body as one call of ``name``; ``kind`` is kernel, HtoD, DtoH or other."""
        if kind not in ACTIVITY_KINDS:
            raise ValueError(f"activity kind must be one of {', '.join(ACTIVITY_KINDS)}, not {kind!r}")
        entry = _Entry(name, kind, int(nbytes))
        if self.method == "cuda-events":
            from numba import cuda

            start, end = cuda.event(timing=True), cuda.event(timing=True)
            start.record()
            try:
                yield entry
            finally:
                end.record()
                entry.events = (start, end)
                self.entries.append(entry)
        else:
            sync()
            t0 = time.perf_counter()
            try:
                yield entry
            finally:
                sync()
                entry.seconds = time.perf_counter() - t0
                self.entries.append(entry)

    def __enter__(self) -> Profiler:
        """Record every launch and copy made through ``labkit.gpu`` inside the ``with`` block."""
        self._recording = gpu.recording(self)
        self._recording.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._recording.__exit__(*exc)

    def reset(self) -> None:
        self.entries.clear()

    # -- reading

    def _resolve(self) -> None:
        pending = [e for e in self.entries if e.seconds is None and e.events is not None]
        if not pending:
            return
        from numba import cuda

        pending[-1].events[1].synchronize()
        for e in pending:
            e.seconds = cuda.event_elapsed_time(*e.events) / 1e3
            e.events = None

    def rows(self) -> list[dict]:
        """One dict per (kind, name): calls, total/avg/min/max seconds, bytes, percent of its section; by total."""
        self._resolve()
        groups: dict[tuple[str, str], list[_Entry]] = {}
        for e in self.entries:
            groups.setdefault((e.kind, e.name), []).append(e)
        rows = []
        for (kind, name), es in groups.items():
            secs = [e.seconds or 0.0 for e in es]
            rows.append({"name": name, "kind": kind, "calls": len(es), "total": sum(secs),
                         "avg": sum(secs) / len(es), "min": min(secs), "max": max(secs),
                         "bytes": sum(e.bytes for e in es)})
        for section in (("kernel", "HtoD", "DtoH"), ("other",)):
            total = sum(r["total"] for r in rows if r["kind"] in section)
            for r in rows:
                if r["kind"] in section:
                    r["percent"] = 100.0 * r["total"] / total if total > 0 else 0.0
        rows.sort(key=lambda r: (r["kind"] == "other", -r["total"], r["name"]))
        return rows

    def calls(self, name: str | None = None, kind: str | None = None) -> int:
        """How many recorded calls match (all by default): launch counts are the point of stage 04."""
        return sum(1 for e in self.entries if (name is None or e.name == name) and (kind is None or e.kind == kind))

    def table(self) -> str:
        """nvprof's summary layout; ``other`` activities (host work) get their own section."""
        rows = self.rows()
        lines = ["==labkit== Profiling result:" + (" (CUDA simulator: host times, not GPU times)"
                                                  if self.simulated else ""), HEADER]
        if not rows:
            lines.append("No activities recorded.")
        for title, kinds in ((" GPU activities:", ("kernel", "HtoD", "DtoH")), ("  Other:", ("other",))):
            first = True
            for r in rows:
                if r["kind"] not in kinds:
                    continue
                lines.append(f"{title if first else '':>16} {r['percent']:7.2f}%  {format_time(r['total']):>8}  "
                             f"{r['calls']:>8}  {format_time(r['avg']):>8}  {format_time(r['min']):>8}  "
                             f"{format_time(r['max']):>8}  {r['name']}")
                first = False
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
