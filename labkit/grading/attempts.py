"""A job's timing attempted again, the parent's side: each attempt's probe read as the speed of its core
(``probe_speed_us``), another attempt asked for while that core ran slower than the fastest the run saw on the
device (``timing.slow_core``), its fresh images written and the reference's answers on them computed only then, and
its turn taken no sooner than ``RETRY_AFTER_S`` later (docs/grading.md, "Grades at any load").
"""

from __future__ import annotations

import time

import numpy as np

from .ahead import Ahead
from .inputs import fresh_passes
from .verdicts import expected_passes


#: a later timing attempt waits this long for its turn (not counted against its limit): on the GPU machines a core's
#: speed changed between samples 50 ms apart, and stayed slow for longer (results/h100-2026-11-27c)
RETRY_AFTER_S = 1.0


def probe_speed_us(probe: dict) -> float | None:
    """How slow the child's core ran around an attempt's passes (lower is faster): the median of the launch bursts
    before and after them on a GPU (host-bound: they follow the core), else of the core's loop; None if the probe
    holds no such samples (a child's numbers: only ever finite positive ones count)."""
    sides = [side for side in (probe.get("before"), probe.get("after")) if isinstance(side, dict)]
    key = "burst_us" if any("burst_us" in side for side in sides) else "core_us"
    values = sorted(v for side in sides for v in (side.get(key) if isinstance(side.get(key), list) else [])
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"))
    return float(values[len(values) // 2]) if values else None


class TimedAttempts:
    """``GradingJob``'s timing attempts: the reference's answers for the current one, another one or enough, the
    turn given back (its state is the job's, made in ``GradingJob.__init__``)."""

    def _pass_answer(self, k: int):
        """The float64 reference's answer for pass ``k`` of the current attempt."""
        return (self._ahead if self._attempt == 0 else self._retry).get(("pass", k))

    def _no_timing(self) -> None:
        """The job will not be timed: the parent's answers for its passes are not needed."""
        for k in range(len(self._pass_images)) if self._ahead is not None else ():
            self._ahead.skip(("pass", k))

    def _again(self, speed: float | None, fastest: float | None) -> bool:
        """Time another attempt, later, on fresh images: this one's core ran slower than ``timing.slow_core`` above
        the fastest probe the run saw on this device, an attempt is left, and the job's limit leaves room for two
        more like it. Never where a partner timed the reference in the same turn (its ratio does not follow the
        core), nor for a reference job that is only its students' fallback (``retime``)."""
        t = self.plan.rubric["timing"]
        if self.partner is not None and self._paired[0] is not None:
            return False  # its partner ran on the same core in the same turn: a slow spell slowed both alike
        if not self.retime:
            return False  # a reference job whose op time every student's partner stands in for (reference_job)
        if speed is None or self._attempt + 1 >= t.get("attempts", 1) or speed <= (1 + t.get("slow_core", 0.15)) \
                * fastest:
            return False
        used = time.monotonic() - self._started - (self.running.paused_s() if self.running is not None else 0.0)
        return used + 2 * (time.monotonic() - self._turn_at) < self.time_limit

    def _next_attempt(self) -> None:
        """The next attempt's images, fresh (each written when its pass asks: ``_hand_pass``), and the reference's
        answers on them computed while it waits for its turn."""
        self._attempt += 1
        self._retry_at = time.monotonic() + RETRY_AFTER_S
        self._pass_images = fresh_passes(self._timed_x, self._rng, len(self._pass_images))
        self._handed = set()
        self._retry = Ahead({("pass", k): piece for k, piece in
                             enumerate(expected_passes(self.refs, self.plan, self._pass_images))},
                            self.turns, self.running)

    def _hand_pass(self, attempt: int, k: int) -> str | None:
        """Pass ``k``'s images written where the child reads them, now that the pass asks; why not, for a request
        that is not the next pass of the current attempt."""
        if attempt != self._attempt or not 0 <= k < len(self._pass_images) or k != len(self._handed):
            return (f"images asked for pass {k} of attempt {attempt}, where pass {len(self._handed)} of attempt "
                    f"{self._attempt} was next")
        self._handed.add(k)
        np.save(self._pass_inputs.format(attempt=attempt, k=k), self._pass_images[k])
        return None

    def _release_turn(self) -> None:
        if self.turns is not None and self.running is not None and not self.alone:
            self.turns.release(self.running)
