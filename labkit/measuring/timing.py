"""Timers: CUDA events on a real GPU, ``perf_counter`` elsewhere; warm-up, then the median of several runs.

GPU launches return before the work is done, so a timer that does not synchronize measures the launch, not the
kernel. On a real GPU the kit times GPU code with CUDA events recorded on the default stream and reads them once,
at the end (``Clock``), so timing a pass adds no synchronization between its layers; elsewhere, and for CPU code,
it uses ``perf_counter`` after a synchronize. The first call of a function compiles it, so every measurement warms
up first and keeps the median, which ignores the odd slow run, together with the spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..launch import device
from ..launch.gpu import synchronize as sync

METHODS = ("auto", "cuda-events", "perf_counter")


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


class Clock:
    """Seconds per named section of one pass (a layer, say), summed when a name repeats (one image at a time).

    With CUDA events the sections are bracketed by events and read once in ``seconds()``, after one wait for
    the last of them; with ``perf_counter`` each section synchronizes before and after."""

    def __init__(self, method: str = "auto"):
        self.method = resolve_method(method)
        self._events: list = []
        self._seconds: dict[str, float] = {}

    @contextmanager
    def section(self, name: str):
        if self.method == "cuda-events":
            from numba import cuda

            start, end = cuda.event(timing=True), cuda.event(timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            sync()
            t0 = time.perf_counter()
            yield
            sync()
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - t0

    def seconds(self) -> dict[str, float]:
        if self._events:
            from numba import cuda

            self._events[-1][2].synchronize()
            for name, start, end in self._events:
                self._seconds[name] = self._seconds.get(name, 0.0) + cuda.event_elapsed_time(start, end) / 1e3
            self._events.clear()
        return dict(self._seconds)


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
    def max(self) -> float:
        return max(self.times)

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
