"""Whose turn it is: grades that do not change with the load (docs/grading.md, "Grades at any load").

Several jobs run at once (``--jobs N``, ``--gpus``), and each job's op time is measured inside its own child. So
that a timing never shares the device or the cores with another job's work, a job's timed phase runs in a *turn*:
the child asks for it and waits; once it holds it, every other running child is stopped (SIGSTOP on every process
of its sandbox, or ``docker pause``) until the turn ends, so no other job's kernels run on the device and no other
job's threads take a core. Turns on different GPUs may overlap (each has its device and a core); a reference job
(the stage's solution, whose wall time sets the students' time limit) holds a turn on the whole machine for its
whole run, so its time is measured alone.

Time a job spends stopped, or waiting for its turn, never counts against its limit: each ``Running`` keeps it, and
the sandbox's deadline moves by it. Turns coordinate the jobs of one process (the parent, or one cluster worker).
With ``cores`` (``labkit.grading.cores``), the holder runs its turn on a core the grader keeps free of everything
else, its own threads included.
The parent's own work for a job that may run beside other jobs (``parent_work``: the float64 answers of its timed
passes, computed ahead) never runs beside another job's turn either: it waits while one is held, and a turn once
taken waits for the piece in progress to end.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from . import isolation
from .cores import Cores

#: the device name of a turn on the whole machine (a reference job)
WHOLE = None


class Running:
    """One child as the turns see it: its sandbox (to stop and continue its processes), the device its job runs on,
    and the seconds it was stopped or waited for a turn (``paused_s``: never counted against its limit)."""

    def __init__(self, sandbox: isolation.Isolation, device: str):
        self.sandbox, self.device = sandbox, device
        self.child: isolation.Child | None = None
        self.frozen = False
        self.kept_core = False  # its timing is a GPU's: its turn runs on a kept core (Turns.cores)
        self._paused = 0.0
        self._since: float | None = None  # the current pause's start (stopped, or waiting for a turn, or both)
        self._depth = 0

    def paused_s(self) -> float:
        """Seconds stopped or waiting so far, the current pause included."""
        return self._paused + (time.monotonic() - self._since if self._since is not None else 0.0)

    def _begin(self) -> None:
        if self._depth == 0:
            self._since = time.monotonic()
        self._depth += 1

    def _end(self) -> None:
        self._depth -= 1
        if self._depth == 0 and self._since is not None:
            self._paused += time.monotonic() - self._since
            self._since = None

    @contextmanager
    def waiting(self):
        """A wait of the grader's making (a later timing attempt's pause): never counted against the job's limit."""
        self._begin()
        try:
            yield
        finally:
            self._end()

    def freeze(self) -> None:
        if not self.frozen and self.child is not None:
            self.sandbox.pause(self.child, True)
            self.frozen = True
            self._begin()

    def thaw(self) -> None:
        if self.frozen:
            self.sandbox.pause(self.child, False)
            self.frozen = False
            self._end()

    def gone(self) -> None:
        """Its processes ended: nothing to continue any more."""
        self.frozen = False
        self._depth = 0
        if self._since is not None:
            self._paused += time.monotonic() - self._since
            self._since = None


class Turns:
    """The turns of one grading process: ``started``/``ended`` register every child, ``acquire``/``release`` a timed
    phase's turn (``hold`` for a whole job)."""

    def __init__(self, cores: Cores | None = None):
        self._cond = threading.Condition()
        self._live: set[Running] = set()
        self._holders: dict[Running, str | None] = {}
        self.cores = cores
        self._core: dict[Running, int | None] = {}  # the kept core each holder runs its turn on
        self._working: dict[int, int] = {}  # id(owner) -> pieces of the parent's work for that job in progress
        self.log: list[dict] = []  # one entry a turn: who, which device, how long it waited and held, who it stopped
        self._fastest: dict[str | None, float] = {}  # device -> the fastest timing probe seen (``fastest``)
        self._lent: dict[Running, int | None] = {}  # a partner running in another's turn -> the core it was lent

    def started(self, r: Running) -> None:
        """A child was started: stopped at once if a turn is on (it must not run beside a timing)."""
        with self._cond:
            self._live.add(r)
            if self._holders and r not in self._holders:
                r.freeze()
            elif r in self._holders:  # a reference job's turn is taken before its child starts
                self._pin(r, {self._core[r]} if self._core.get(r) is not None else None)

    def ended(self, r: Running) -> None:
        """A child's processes are gone: nothing to stop or continue any more, and a turn it held is over."""
        with self._cond:
            self._live.discard(r)
            r.gone()
            if r in self._holders:
                self._release(r)

    def _free(self, device: str | None) -> bool:
        if not self._holders:
            return True
        if device is WHOLE or WHOLE in self._holders.values():
            return False
        return device not in self._holders.values()

    def acquire(self, r: Running, device: str | None) -> float:
        """Wait for the turn on ``device`` (``WHOLE``: the machine), then stop every other child; the seconds waited
        (part of ``r``'s pause)."""
        start = time.monotonic()
        with self._cond:
            if r in self._holders:
                return 0.0
            r._begin()  # waiting: not counted against its limit
            try:
                while not self._free(device):
                    self._cond.wait()
            finally:
                r._end()
            self._holders[r] = device
            r.thaw()  # stopped by another turn while its request was on its way: a holder runs
            stopped = [o for o in self._live if o not in self._holders and not o.frozen]
            for other in stopped:
                other.freeze()
            if any(owner != id(r) for owner in self._working):  # the parent's work for other jobs: let it end
                r._begin()  # waiting: not counted against its limit
                while any(owner != id(r) for owner in self._working):
                    self._cond.wait()
                r._end()
            self._core[r] = self.cores.take() if self.cores is not None and r.kept_core else None
            self._pin(r, {self._core[r]} if self._core[r] is not None else None)
            waited = time.monotonic() - start
            self.log.append({"device": device if device is not WHOLE else "whole machine", "waited_s": waited,
                             "stopped": len(stopped), "start": time.monotonic(), "holder": id(r)})
        return waited

    def release(self, r: Running) -> None:
        with self._cond:
            self._release(r)

    def _release(self, r: Running) -> None:
        if self._holders.pop(r, "absent") == "absent":
            return
        core = self._core.pop(r, None)
        if core is not None:
            self._pin(r, self.cores.others)
            self.cores.give(core)
        for entry in reversed(self.log):
            if entry["holder"] == id(r) and "held_s" not in entry:
                entry["held_s"] = time.monotonic() - entry["start"]
                break
        if not self._holders:
            for other in self._live:
                other.thaw()
        self._cond.notify_all()

    def _pin(self, r: Running, cores: set[int] | None) -> None:
        if cores and r.child is not None:
            r.sandbox.pin(r.child, cores)

    @contextmanager
    def parent_work(self, owner: Running | None):
        """A piece of the parent's work for ``owner``'s job, kept out of every other job's turn: it starts once no
        other job holds a turn, and a turn taken meanwhile waits until it ends."""
        with self._cond:
            while any(holder is not owner for holder in self._holders):
                self._cond.wait()
            self._working[id(owner)] = self._working.get(id(owner), 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._working[id(owner)] -= 1
                if not self._working[id(owner)]:
                    del self._working[id(owner)]
                self._cond.notify_all()

    @contextmanager
    def hold(self, r: Running, device: str | None = WHOLE):
        """A turn for a whole block (a reference job: ``device`` WHOLE)."""
        self.acquire(r, device)
        try:
            yield
        finally:
            self.release(r)

    def lend_to(self, holder: Running, other: Running) -> None:
        """``other`` (a reference partner, ``labkit.grading.partner``) runs inside ``holder``'s turn, on its kept
        core, while the holder is stopped (no thread of the student's reaches the reference's passes)."""
        with self._cond:
            core = self._lent[other] = self._core.get(holder)
            holder.freeze()
            other.thaw()
            self._pin(other, {core} if core is not None else None)

    def lend_back(self, holder: Running, other: Running) -> None:
        """``other`` stopped again while ``holder`` holds its turn, and off its core; ``holder`` running."""
        with self._cond:
            if self._lent.pop(other, None) is not None:
                self._pin(other, self.cores.others)
            if other not in self._holders and holder in self._holders:
                other.freeze()
            holder.thaw()

    def fastest(self, device: str | None, speed: float) -> float:
        """The fastest timing probe (``attempts.probe_speed_us``) seen on ``device`` in this run, ``speed`` included:
        what an attempt's core is compared with before it is timed again (``GradingJob._again``)."""
        with self._cond:
            self._fastest[device] = min(self._fastest.get(device, speed), speed)
            return self._fastest[device]

    def summary(self) -> dict:
        """What the report's meta says of the turns: how many, how long they waited and held, at most."""
        done = [e for e in self.log if "held_s" in e]
        return {"turns": len(done), "longest_wait_s": round(max((e["waited_s"] for e in done), default=0.0), 2),
                "longest_turn_s": round(max((e["held_s"] for e in done), default=0.0), 2),
                "children_stopped": sum(e["stopped"] for e in done)}


def merged(summaries: list[dict]) -> dict:
    """The turns of several grading processes (a cluster's workers) as one ``Turns.summary``."""
    return {"turns": sum(s["turns"] for s in summaries),
            "longest_wait_s": max((s["longest_wait_s"] for s in summaries), default=0.0),
            "longest_turn_s": max((s["longest_turn_s"] for s in summaries), default=0.0),
            "children_stopped": sum(s["children_stopped"] for s in summaries)}
