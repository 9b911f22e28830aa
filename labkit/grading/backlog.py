"""Which job a free grading slot takes next (docs/grading.md, "Throughput").

On two H100s a class of 60 jobs ran 1.55x as fast as on one, not 1.8x: its slots stood idle at the end while the
last stage-06 and stage-09 jobs (40-77 s each, where most jobs take 10-25 s) ran alone (results/h100x2-2026-11-27c).
So the longest jobs go first (longest processing time first: what is left at the end is short): a stage's cost is
the mean wall time of its jobs done so far in this run; a stage none of whose jobs has been seen yet comes before
any (its reference job starts early, and its cost is then known); ties keep the tasks' order (a stage's reference
task, ``context.reference_tasks``, comes before its students'). A task that would only
wait for its stage's reference job, running in another slot, is passed over while another is left.
"""

from __future__ import annotations

import threading
from typing import Callable


class Backlog:
    """The tasks not yet taken, and what each stage's jobs cost so far."""

    def __init__(self, tasks: list[dict], waits: Callable[[dict], bool] | None = None):
        self.tasks, self.waits = tasks, waits
        self.pending = list(range(len(tasks)))
        self._seconds: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def cost(self, stage: str) -> float:
        """The mean seconds of the stage's jobs so far (infinite: none seen yet)."""
        seen = self._seconds.get(stage)
        return sum(seen) / len(seen) if seen else float("inf")

    def take(self) -> int | None:
        """The next task's index (None: none left): the costliest stage's first, unless it would only wait."""
        with self._lock:
            if not self.pending:
                return None
            order = sorted(self.pending, key=lambda i: (self.tasks[i]["notebook"] is None,
                                                         -self.cost(self.tasks[i]["stage"]), i))
            i = next((i for i in order if self.waits is None or not self.waits(self.tasks[i])), order[0])
            self.pending.remove(i)
            return i

    def done(self, i: int, row: dict) -> None:
        """Task ``i`` gave ``row``: its wall time, without its stage's reference job, counts for its stage (a
        reference task's, ``context.reference_tasks``, is the stage's first measure of what its jobs cost)."""
        ran = (row.get("details") or {}).get("ran")
        if self.tasks[i]["notebook"] is None or not isinstance(ran, dict):
            return
        seconds = ran["to"] - ran["from"] - ran.get("reference_s", 0.0)
        with self._lock:
            self._seconds.setdefault(self.tasks[i]["stage"], []).append(max(0.0, seconds))
