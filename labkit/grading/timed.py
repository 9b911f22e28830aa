"""The child's side of op time: its clock, how quiet the device is, how fast its core runs now.

Imported by the worker before any student code exists, so every function here is bound then: a cell that patches
``time`` or numba's event functions does not reach a clock made later. The parent reads the probes' samples
(``attempts.probe_speed_us``) to decide whether an attempt ran on a slow core and is timed again in a later turn
(``timing.attempts``, ``timing.slow_core``; docs/grading.md, "Grades at any load").
"""

from __future__ import annotations

import functools
import gc
import time
from contextlib import contextmanager

_perf_counter = time.perf_counter
_contextmanager = contextmanager
_gc_collect, _gc_disable, _gc_enable, _gc_isenabled = gc.collect, gc.disable, gc.enable, gc.isenabled

from numba import cuda as _cuda  # noqa: E402  (labkit's package import set the simulator's mode first)

# the CUDA event functions (the simulator has no event_elapsed_time; it never times with events)
_cuda_event, _cuda_synchronize, _cuda_context = _cuda.event, _cuda.synchronize, _cuda.current_context
_cuda_elapsed = getattr(_cuda, "event_elapsed_time", None)

#: the quiet device's probe (``wait_quiet``): its sleep, how many of the last must agree, how closely, how long
QUIET_PROBE_US, QUIET_RUNS, QUIET_SPREAD, QUIET_LIMIT_S = 500, 3, 0.10, 10.0
#: the core's probe: iterations of a pure-Python loop (about a millisecond on a server core)
CORE_LOOP = 20_000


def settle(gpu: bool) -> None:
    """Before a timing turn is asked for, outside it (no other job waits meanwhile): the garbage of the earlier
    phases collected, and on a GPU the device frees numba deferred (``deallocations``) made now. A student's child
    has run checks and accuracy runs, its reference partner nothing: left for the timed passes, that work fell into
    the student's passes only (launch-bound stages 07, 09 and 10 timed up to 13 % slower than the same solution in
    the partner, results/h100x2-2026-11-28). Inside the turn it cost far more (a collection before every pass)."""
    _gc_collect()
    if gpu:
        _cuda_context().deallocations.clear()


@_contextmanager
def uncollected():
    """The timed passes with Python's cyclic collector off: a collection's length follows how much the child made
    before (a student's child far more than its partner), not the pass. Reference counting still frees what a pass
    drops; the collector is back on after, as it was."""
    was = _gc_isenabled()
    _gc_disable()
    try:
        yield
    finally:
        if was:
            _gc_enable()


def core_samples(n: int = 8) -> list[float]:
    """A pure-Python loop's microseconds, ``n`` times: on these machines a core's speed changes within seconds, and
    a pass that launches many small kernels follows it (results/h100-2026-11-27c)."""
    out = []
    for _ in range(n):
        t, s = _perf_counter(), 0
        for i in range(CORE_LOOP):
            s += i
        out.append(round((_perf_counter() - t) * 1e6, 1))
    return out


def quiet_samples(gpu: bool, n: int = 8, burst: int = 32) -> dict:
    """How the machine answers now: the core's loop; on a GPU also an empty kernel's round trip timed on the host
    (it waits for another context's time slice) and ``burst`` empty kernels between two events (host-bound launches:
    they follow the core's speed); microseconds, ``n`` of each."""
    if not gpu:
        return {"core_us": core_samples(n)}
    empty = _empty_kernel()
    empty[1, 1]()
    _cuda_synchronize()
    trips, bursts = [], []
    for _ in range(n):
        t = _perf_counter()
        empty[1, 1]()
        _cuda_synchronize()
        trips.append(round((_perf_counter() - t) * 1e6, 1))
        start, end = _cuda_event(timing=True), _cuda_event(timing=True)
        start.record()
        for _ in range(burst):
            empty[1, 1]()
        end.record()
        end.synchronize()
        bursts.append(round(_cuda_elapsed(start, end) * 1e3, 1))
    return {"trip_us": trips, "burst_us": bursts, "core_us": core_samples(n)}


@functools.cache
def _empty_kernel():
    @_cuda.jit
    def empty():
        pass

    return empty


def _probe_kernel():
    """One thread sleeping ``us`` microseconds: on a device another context keeps busy it takes longer (the device
    time-slices between contexts), so it tells when the device runs nothing but this child's work."""
    from numba import uint32

    @_cuda.jit
    def probe(us):
        for _ in range(us):
            _cuda.nanosleep(uint32(1000))

    return probe


def wait_quiet(gpu: bool, limit_s: float = QUIET_LIMIT_S) -> tuple[float, dict]:
    """Once the turn is held, on a GPU: wait until the device runs nothing else. The other jobs are stopped, but the
    work they had queued still runs to its end, the device time-slicing between contexts (on an H100 that stretched
    the timed passes up to 3x, for about a tenth of a second). A probe that sleeps a fixed time is timed until the
    last ``QUIET_RUNS`` take within ``QUIET_SPREAD`` of the shortest seen; at most ``limit_s``. The seconds waited,
    and the probes' samples, ``before`` the passes (``after`` is added once they ran)."""
    if not gpu:
        return 0.0, {"before": quiet_samples(False)}
    probe, t0, seen = _probe_kernel(), _perf_counter(), []
    while _perf_counter() - t0 < limit_s:
        start, end = _cuda_event(timing=True), _cuda_event(timing=True)
        start.record()
        probe[1, 1](QUIET_PROBE_US)
        end.record()
        end.synchronize()
        seen.append(_cuda_elapsed(start, end))
        last = seen[-QUIET_RUNS:]
        if len(seen) > QUIET_RUNS and max(last) <= (1 + QUIET_SPREAD) * min(seen):
            break
    waited = _perf_counter() - t0
    return waited, {"sleep_ms": [round(v, 3) for v in seen[-12:]], "before": quiet_samples(True)}


def gpu_syncs(gpu_here: bool) -> tuple:
    """What a perf_counter section waits for on a GPU: numba's queue, and cupy's (CUDA C variants) if present."""
    if not gpu_here:
        return ()
    syncs = [_cuda_synchronize]
    try:
        import cupy

        syncs.append(cupy.cuda.Device().synchronize)
    except Exception:  # noqa: BLE001 - no cupy: nothing of its to wait for
        pass
    return tuple(syncs)


class ChildClock:
    """The engine's clock in the child (``section(name)``, ``seconds()``, as ``labkit.timing.Clock``): CUDA events
    for GPU code on a GPU, else ``perf_counter`` between synchronizations. Each clock takes the functions bound at
    import when it is made, and binds its own methods, so a patch made while a pass runs does not reach it."""

    def __init__(self, events: bool, syncs: tuple):
        self._perf, self._event, self._elapsed, self._syncs = _perf_counter, _cuda_event, _cuda_elapsed, syncs
        self._marks: list = []
        self._totals: dict[str, float] = {}
        self.section = self._event_section if events else self._perf_section
        self.whole = self._event_whole if events else self._perf_section
        self.seconds = self._read

    def _sync(self) -> None:
        for fn in self._syncs:
            fn()

    @_contextmanager
    def _event_section(self, name: str):
        start, end = self._event(timing=True), self._event(timing=True)
        start.record()
        yield
        end.record()
        self._marks.append((name, start, end))

    @_contextmanager
    def _event_whole(self, name: str):
        """A section that ends only once the device is idle: work left queued on any stream counts."""
        start, end = self._event(timing=True), self._event(timing=True)
        self._sync()
        start.record()
        yield
        self._sync()
        end.record()
        self._marks.append((name, start, end))

    @_contextmanager
    def _perf_section(self, name: str):
        self._sync()
        t0 = self._perf()
        yield
        self._sync()
        self._totals[name] = self._totals.get(name, 0.0) + self._perf() - t0

    def _read(self) -> dict[str, float]:
        if self._marks:
            self._marks[-1][2].synchronize()
            for name, start, end in self._marks:
                self._totals[name] = self._totals.get(name, 0.0) + self._elapsed(start, end) / 1e3
            self._marks.clear()
        return dict(self._totals)
