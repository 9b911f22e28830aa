"""The parent's answers for a job, computed ahead: while the child runs, not when its outputs come back.

Every check compares the child's output with the float64 reference's answer on the same inputs, and every timed
pass's predictions with the reference's on that pass's images. Computing them all before the child started held it
back (at the GPU's sizes, 8 to 50 s of a job's inputs on the 2-core machine), and computing the timed passes' when
the timing came back held up every timed job. The inputs are drawn first (they are all the child needs); a thread
of the parent then computes the answers in the order the child will ask for them, one piece at a time, each outside
every other job's turn (``Turns.parent_work``: no parent thread runs beside another job's timed passes). A piece
the child's verdicts make useless (a layer that already failed) is left out; one asked for before the thread got
to it waits for it, or is computed there and then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from contextlib import nullcontext


class Ahead:
    """``pieces`` ({key: function}, in the order they will be asked for) run in a thread of their own; ``get(key)``
    gives one's value (waiting for it, or computing it here if the thread left it out), ``result()`` all of them in
    order; ``skip(key)`` leaves one out, ``cancel()`` the rest."""

    def __init__(self, pieces: dict[Hashable, Callable[[], object]] | list, turns=None, owner=None):
        self._pieces = dict(enumerate(pieces)) if isinstance(pieces, list) else dict(pieces)
        self._done: dict = {}
        self._left_out: set = set()
        self._error: BaseException | None = None
        self._stopped = False  # cancelled, or every piece done or left out
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(turns, owner), daemon=True, name="labkit-grade-ahead")
        self._thread.start()

    def _run(self, turns, owner) -> None:
        try:
            for key, piece in self._pieces.items():
                with self._cond:
                    if self._stopped:
                        return
                    if key in self._left_out:
                        continue
                with turns.parent_work(owner) if turns is not None else nullcontext():
                    value = piece()
                with self._cond:
                    self._done[key] = value
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for a value
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()

    def get(self, key):
        with self._cond:
            while key not in self._done and not self._stopped and key not in self._left_out:
                self._cond.wait()
            if key in self._done:
                return self._done[key]
            if self._error is not None:
                raise self._error
        value = self._pieces[key]()  # left out, or the thread stopped before it: computed here
        with self._cond:
            self._done[key] = value
        return value

    def skip(self, key) -> None:
        """Not needed (unless asked for after all)."""
        with self._cond:
            self._left_out.add(key)
            self._cond.notify_all()

    def cancel(self) -> None:
        """Nothing more is needed: the pieces not begun are left out."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def result(self) -> list:
        return [self.get(key) for key in self._pieces]
