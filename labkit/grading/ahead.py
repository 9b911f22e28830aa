"""The parent's answers for a job, computed ahead: while the child loads and runs its checks, not after its timing.

The float64 reference's class probabilities on each timed pass's images cost the parent a whole reference forward
pass each (seconds for 1200 images); computed when the child's timing came back they held up every job, the
reference jobs included, once per pass. The images are drawn with the job's inputs, so a thread of the parent
computes them from then on, one pass at a time, each piece outside every other job's turn
(``Turns.parent_work``): no parent thread runs beside another job's timed passes. The job waits for them before
its own turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext


class Ahead:
    """``pieces`` run in order in a thread of their own; ``result()`` waits for them and gives their values (or
    raises what one of them raised)."""

    def __init__(self, pieces: list[Callable[[], object]], turns=None, owner=None):
        self._values: list = []
        self._error: BaseException | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, args=(pieces, turns, owner), daemon=True,
                                        name="labkit-grade-ahead")
        self._thread.start()

    def _run(self, pieces, turns, owner) -> None:
        try:
            for piece in pieces:
                if self._cancelled:
                    return
                with turns.parent_work(owner) if turns is not None else nullcontext():
                    self._values.append(piece())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the result
            self._error = exc

    def cancel(self) -> None:
        """Nothing more is needed (the job ended, or will not be timed): the pieces not begun are left out."""
        self._cancelled = True

    def result(self) -> list:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._values
