"""A core kept free for each timed phase (docs/grading.md, "Grades at any load").

Stopping every other job (``labkit.grading.turns``) leaves the grader itself running: its threads read the other
jobs' frames and compare their arrays, and start and reap children. On an H100 at ``--jobs 14`` a timed child lost
its core for one scheduler tick (4 ms) every few tens of milliseconds, even with every other job stopped: its
passes of 5.5 ms took up to 14 ms (an op time 2.3x the same code's at ``--jobs 1``). So the grader keeps one core
per device out of its own reach (its threads, and every child it starts, run on the others) and moves the turn's
holder onto it for the turn: the timing has a core to itself, the same for the reference job and every student.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _allowed() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def siblings(core: int) -> set[int]:
    """The logical processors sharing ``core``'s physical core (simultaneous multithreading), itself included: work
    on a sibling slows it, so a kept core's siblings are kept idle too."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {core}
    found: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        found |= set(range(int(lo), int(hi or lo) + 1))
    return found | {core}


def set_affinity(pids, cores: set[int]) -> None:
    """Every thread of each of ``pids`` (affinity is a thread's: a process's later threads take their creator's)."""
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:  # gone, or not ours to move
                pass


class Cores:
    """The cores a run keeps free (``reserved``: one per device a turn can be on at once; ``idle``: their
    multithreading siblings, which nothing uses) and the ones everything else runs on (``others``). Too few cores
    to keep one per device and still have one for the rest: nothing is reserved (``why`` says so)."""

    def __init__(self, devices: int = 1, allowed: list[int] | None = None, siblings=siblings):
        allowed = _allowed() if allowed is None else sorted(allowed)
        self.why, self.reserved, self.idle = "", [], set()
        left = list(allowed)
        while len(self.reserved) < devices and left:  # from the last core down, each with its siblings kept idle
            core = left.pop()
            self.reserved.append(core)
            self.idle |= (siblings(core) & set(left)) - {core}
            left = [c for c in left if c not in self.idle]
        if len(self.reserved) < devices or not left:
            self.reserved, self.idle, left = [], set(), list(allowed)
            self.why = (f"no core kept free for the timed phases: {len(allowed)} core(s) for {devices} device(s)"
                        if allowed else "no core kept free: this system does not set processors' affinity")
        self.reserved.sort()
        self.others = set(left)
        self._free = list(self.reserved)
        self.mine: int | None = None  # the kept core this process times on, where several share them (share)
        self._lock = threading.Lock()
        self._before: dict[int, set[int]] = {}

    def describe(self) -> dict:
        return {"reserved": self.reserved, "idle_siblings": sorted(self.idle), "others": sorted(self.others),
                **({"mine": self.mine} if self.mine is not None else {}), **({"why": self.why} if self.why else {})}

    def start(self) -> None:
        """The grader's own threads (and so every child it starts) onto the other cores."""
        if not self.reserved:
            return
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            try:
                self._before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, self.others)
            except OSError:
                pass

    def stop(self) -> None:
        """The grader's threads back where they were."""
        for tid, cores in self._before.items():
            try:
                os.sched_setaffinity(tid, cores)
            except OSError:
                pass
        self._before.clear()

    def share(self, index: int) -> "Cores":
        """One of several processes that reckoned the same cores (one per device: dask-cuda's workers, one per GPU)
        takes the ``index``-th kept core as its own: each keeps every one of them free of its threads and children,
        and times on its own."""
        with self._lock:
            self.mine = self.reserved[index] if index < len(self.reserved) else None
            self._free = [self.mine] if self.mine is not None else []
        return self

    def take(self) -> int | None:
        with self._lock:
            return self._free.pop(0) if self._free else None

    def give(self, core: int | None) -> None:
        if core is not None:
            with self._lock:
                self._free.append(core)

