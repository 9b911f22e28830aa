"""Where a job's wall time went: seconds per phase, read off the parent's clock (docs/grading.md, "Where the time
goes").

The parent reads its clock at every boundary it sees: around its own work (the private copies, the inputs), at the
child's hello, at each phase frame the child sends (``protocol.Phase.step``), at its last frame and once its
processes are gone. Time a job spends stopped while another job times, or waiting for its own turn, is
``waiting``, never the phase's, so the other phases add up to at most the row's ``seconds``. A child only says when
its own phases begin: lying moves its own row's figures, never its grade or another row's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

#: the phases of one job, in the order they run (``waiting``: stopped or waiting for a turn, at any point)
PHASES = ("start", "inputs", "load", "checks", "tasks", "accuracy", "timing", "technique", "end", "waiting")

#: what each phase is, for the report's table (docs/grading.md)
MEANING = {
    "start": "private copies of labkit and the solutions, the sandbox, the child's interpreter, its imports and "
             "snapshot, reading its inputs: until its hello",
    "inputs": "the parent draws the job's inputs and writes inputs.npz (their float64 answers are computed while "
              "the child runs: labkit.grading.ahead)",
    "load": "the student's kernel cells executed, VARIANTS read, the own-kernels scan",
    "checks": "every layer at every batch size and the whole network, each compared in the parent while the child "
              "waits for its verdict",
    "tasks": "the stage's tasks with checks of their own (stage 10)",
    "accuracy": "the whole network on the accuracy images",
    "timing": "the timed passes (warm-up, then repeat) and their predictions compared; on a GPU the wait for "
              "the device to be quiet",
    "technique": "the stage's memory technique counted on the simulator (on a GPU: a second child)",
    "end": "after the last frame: every process gone, the private copies checksummed, the folder removed",
    "waiting": "stopped while another job timed, or waiting for its own turn (not in the row's seconds)",
}


#: each phase in a few words (the tables' "where the time went")
SHORT = {"start": "sandbox start and the child's hello", "inputs": "drawing the inputs", "load": "loading the cells",
         "checks": "the checks", "tasks": "the tasks", "accuracy": "the accuracy runs", "timing": "the timed passes",
         "technique": "the technique's count", "end": "ending the child", "waiting": "stopped or waiting"}


class PhaseClock:
    """Seconds per phase of one job. ``switch(phase)`` closes the current phase and opens ``phase``; the seconds
    ``paused()`` grew by meanwhile go to ``waiting``."""

    def __init__(self, paused: Callable[[], float] = lambda: 0.0, clock: Callable[[], float] = time.monotonic):
        self._paused, self._clock = paused, clock
        self.seconds: dict[str, float] = {}
        self.current: str | None = None
        self._since = 0.0
        self._paused_then = 0.0

    def _add(self, phase: str, s: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, s)

    def switch(self, phase: str | None) -> None:
        now, paused = self._clock(), self._paused()
        if self.current is not None:
            waited = max(0.0, paused - self._paused_then)
            self._add(self.current, now - self._since - waited)
            if waited:
                self._add("waiting", waited)
        self.current, self._since, self._paused_then = phase, now, paused

    def stop(self) -> dict[str, float]:
        self.switch(None)
        return self.seconds

    def add(self, phases: dict[str, float], into: str) -> None:
        """Another child's phases (a GPU job's technique child), all counted as ``into`` but its waiting."""
        for name, s in phases.items():
            self._add("waiting" if name == "waiting" else into, s)


def rounded(phases: dict[str, float]) -> dict[str, float]:
    """In the order of ``PHASES``, to the millisecond."""
    return {p: round(phases[p], 3) for p in PHASES if p in phases}


def own_seconds(phases: dict[str, float]) -> float:
    """A job's own time (its phases but ``waiting``): at most the row's ``seconds``."""
    return sum(s for p, s in phases.items() if p != "waiting")


def totals(rows: Iterable[dict]) -> dict[str, dict]:
    """Per stage: how many rows had phase times, and each phase's sum over them (the report's ``meta.phases_s``)."""
    out: dict[str, dict] = {}
    for row in rows:
        phases = (row.get("details") or {}).get("phases_s")
        if not phases:
            continue
        stage = out.setdefault(row["stage"], {"rows": 0, "seconds": 0.0, "phases_s": {}})
        stage["rows"] += 1
        stage["seconds"] = round(stage["seconds"] + float(row.get("seconds") or 0.0), 3)
        for p, s in phases.items():
            stage["phases_s"][p] = round(stage["phases_s"].get(p, 0.0) + s, 3)
        stage["phases_s"] = rounded(stage["phases_s"])
    return out
