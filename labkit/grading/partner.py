"""The reference timed in each student's own turn, pass by pass with the student (docs/grading.md, "Grades at any
load").

On the GPU machines a core's speed changes within seconds, and a launch-bound timed pass follows it. A reference
timed once, at the start of a run, then stood for every student of its stage on that device: on two H100s a
correct copy of the solution scored ratios from 0.69 to 1.11 (results/h100x2-2026-11-27c). So the stage's solution
stays loaded in a child of its own, a *partner* (one per stage and device, in the run's sandbox, never holding
student code), and each time a student's timing holds its turn the two take their timed passes in turn on the same
kept core (``Relay``): both op times come from the same moments, and their ratio no longer follows the core. (The
partner's whole attempt before the student's let a spell that began in between give copies of stage 07's solution
0.72 and 1.58, results/h100x2-2026-11-28b.) The reference job (``job.reference_job``) still grades the solution and
sets the limits.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import numpy as np

from . import protocol as P
from .inputs import Inputs, spec_limits
from .job import GradingJob
from .turns import Running

#: a partner no student asked for this long ends (a cluster worker's run has no end of its own); asked again, it
#: starts again
IDLE_S = 300.0
#: the most a student's turn waits for its partner to load and warm up (not counted against its limit); then the
#: student is timed against the reference job's passes, and its row says why
READY_S = 600.0
#: the most one attempt of the partner may take inside a student's turn
ATTEMPT_S = 120.0
#: attempts a partner's child is told it may be asked for (its timing phase ends when the parent says enough)
ATTEMPTS = 1_000_000


def paired(plan) -> bool:
    """Whether the stage's students are timed against a partner: ``timing.paired`` is "always", or "gpu" (the
    default) and the timed variant runs on a real GPU."""
    mode = plan.rubric["timing"].get("paired", "gpu")
    if not plan.measured or mode == "never":
        return False
    return mode == "always" or plan.variants[plan.timed].target == "gpu"  # (measured: on a real GPU)


class Partner:
    """One stage's partner on one device: started when its stage's first student job starts, asked for an attempt
    inside a student's turn (``attempt``), ended by ``close`` or after ``IDLE_S`` without a request."""

    def __init__(self, plan, refs, gpu: bool, seed: int, env_extra: dict, iso, turns):
        self.plan, self.refs, self.gpu, self.seed = plan, refs, gpu, seed
        self.env_extra, self.sandbox, self.turns = dict(env_extra), iso, turns
        self.ready = threading.Event()
        self.error = ""  # why it cannot time (then every student of its stage here is timed as before)
        self.starts = 0
        self.served = 0
        self.failed = False
        self.warmup_s: float | None = None  # its load and first attempt, seconds
        self._requests: queue.Queue = queue.Queue()
        self._start_lock = threading.Lock()
        self._job: PartnerJob | None = None
        self._thread: threading.Thread | None = None

    def ensure(self) -> None:
        """Started, unless it runs already (or ended idle: then again)."""
        with self._start_lock:
            if self._thread is not None and (self._thread.is_alive() or self.failed):
                return  # (one that failed is not started again: its students are timed as before)
            self.ready.clear()
            self.error, self.starts = "", self.starts + 1
            self._requests = queue.Queue()
            self._job = PartnerJob(self)
            self._thread = threading.Thread(target=self._run, args=(self._job,), daemon=True,
                                            name=f"labkit-grade-partner-{self.plan.stage.number}")
            self._thread.start()

    def _run(self, job: "PartnerJob") -> None:
        began = time.monotonic()
        try:
            o = job.run()
            self.failed = not job.ended_idle
            if not job.warm:
                why = o.load_error or o.timing_error or o.grader_error or o.protocol_error or \
                    ("it ran out of time" if o.timed_out else (o.stderr_tail or "").strip()[-300:]) or "it ended"
                self.error = f"the reference partner did not start: {why.splitlines()[0][:300]}"
        except Exception as exc:  # noqa: BLE001 - the grader's own failure: its students are timed as before
            self.failed = True
            self.error = f"the reference partner failed: {type(exc).__name__}: {exc}"
        finally:
            if self.warmup_s is None:
                self.warmup_s = round(time.monotonic() - began, 2)
            self.error = self.error or "the reference partner ended"  # (started again when next asked)
            self.ready.set()  # (a student waiting for it reads the error)
            for relay in [job._relay] + _drained(self._requests):  # an attempt asked for that will not come
                if relay is not None:
                    relay.abort(self.error)

    def wait_ready(self, running: Running | None) -> None:
        """Wait, outside any turn, until it can time (its wait is the grader's, not counted against the job)."""
        self.ensure()
        if running is not None:
            with running.waiting():
                self.ready.wait(READY_S)
        else:
            self.ready.wait(READY_S)

    def pair(self, holder: Running | None, passes: int) -> "Relay":
        """The reference's attempt inside ``holder``'s turn, its passes taken in turn with the student's (``Relay``):
        started now (the partner's first pass runs while the holder is stopped); a relay already ended, with why,
        where the partner cannot time."""
        if not self.ready.is_set():
            return Relay.ended(f"the reference partner was not ready within {READY_S:.0f} s")
        if self.error:
            return Relay.ended(self.error)
        job = self._job
        relay = Relay(self.turns if holder is not None and job.running is not None else None, holder, job.running,
                      passes)
        relay.start()
        self._requests.put(relay)  # (its thread answers it, also when its child ended)
        self.served += 1
        return relay

    def close(self) -> None:
        """End it now (the run is over)."""
        if self._thread is not None and self._thread.is_alive():
            self._requests.put(None)
            self._thread.join(timeout=30)

    def report(self) -> dict:
        return {"starts": self.starts, "attempts_served": self.served, "warmup_s": self.warmup_s,
                **({"error": self.error} if self.failed else {})}


class Relay:
    """One paired attempt: the partner's timed pass k, then the student's pass k, then the partner's pass k + 1...
    Each runs while the other child is stopped, on the holder's kept core. A slow spell of the core that begins
    inside the attempt then slows passes of both: with the partner's whole attempt before the student's, a copy of
    the stage-07 solution scored 0.72 and another 1.58 on one H100 (results/h100x2-2026-11-28b). The partner's
    side calls ``done``/``wait`` as its child asks for each pass's images and ``finish`` with its passes; the
    student's side the same (``GradingJob``), and ``result`` once its own passes are in."""

    PARTNER, STUDENT = 0, 1

    def __init__(self, turns, holder: Running | None, partner: Running | None, passes: int):
        self.turns, self.holder, self.partner, self.passes = turns, holder, partner, passes
        self._cond = threading.Condition()
        self._step = 0  # 2k: the partner's pass k may run; 2k + 1: the student's
        self._asked = [-1, -1]  # the last pass each side's child asked for
        self._lent = False
        self._finished = threading.Event()
        self.runs: list | None = None
        self.why = ""

    @classmethod
    def ended(cls, why: str) -> "Relay":
        relay = cls(None, None, None, 0)
        relay.finish(None, why)  # (ended: nobody waits on it)
        return relay

    def _lend(self, on: bool) -> None:
        if self.turns is None or on == self._lent:
            return
        (self.turns.lend_to if on else self.turns.lend_back)(self.holder, self.partner)
        self._lent = on

    def start(self) -> None:
        with self._cond:
            self._lend(True)

    def wait(self, who: int, k: int) -> None:
        """Until ``who``'s pass ``k`` may run (or the relay ended: then at once)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._step >= 2 * k + who, timeout=ATTEMPT_S):
                self._abort(f"the reference partner took more than {ATTEMPT_S:.0f} s for one pass")

    def before_pass(self, who: int, k: int) -> None:
        """``who``'s child asks for pass ``k``'s images: its pass ``k - 1`` has run; wait for pass ``k``'s turn. A
        request out of order (a pass skipped or asked again) ends the relay at once: waiting for a turn that
        cannot come would hold every other job's turn for ``ATTEMPT_S``."""
        with self._cond:
            if k != self._asked[who] + 1:
                self._abort(f"the {'student' if who == self.STUDENT else 'partner'}'s child asked for pass {k}'s "
                            f"images where pass {self._asked[who] + 1} was next")
                return
            self._asked[who] = k
        if k:
            self.done(who, k - 1)
        self.wait(who, k)

    def done(self, who: int, k: int) -> None:
        """``who``'s pass ``k`` has run: the other's next one may."""
        with self._cond:
            if self._step != 2 * k + who:
                return
            self._step += 1
            self._lend(self._step % 2 == 0 and self._step < 2 * self.passes)
            self._cond.notify_all()

    def finish(self, runs: list | None, why: str) -> None:
        """The partner's attempt is over (its passes, or why none): the student's last pass may run."""
        with self._cond:
            self.runs, self.why = runs, (why if runs is None else "")
            self._finished.set()
            if runs is None:
                self._abort(why)
            else:
                self.done(self.PARTNER, self.passes - 1)

    def abort(self, why: str) -> None:
        """Ended early (the partner's child, or the student's, ended): nobody waits for the other any more."""
        with self._cond:
            self._abort(why)

    def _abort(self, why: str) -> None:
        if not self._finished.is_set():
            self.runs, self.why = None, why or "the reference partner ended"
            self._finished.set()
        self._step = 1 << 30
        self._lend(False)
        self._cond.notify_all()

    def result(self) -> tuple[list | None, str]:
        """The partner's passes of this attempt, or None and why (asked once the student's passes are in)."""
        if not self._finished.wait(ATTEMPT_S):
            self.abort(f"the reference partner took more than {ATTEMPT_S:.0f} s for one attempt")
        return self.runs, self.why


def _drained(q: queue.Queue) -> list:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


class PartnerJob(GradingJob):
    """The partner's parent side: the stage's solution loaded in a child that runs no check, then answers one timing
    attempt each time a student's turn asks (its first, the warm-up, untimed and outside any turn: stopped, as any
    job's untimed work, while another job holds one)."""

    def __init__(self, partner: Partner):
        super().__init__(partner.plan, partner.refs, "(reference partner)", partner.plan.solution, partner.seed,
                         partner.gpu)
        self.partner = partner
        self.env_extra, self.sandbox, self.turns = dict(partner.env_extra), partner.sandbox, partner.turns
        self.time_limit = 7 * 24 * 3600.0  # it lives as long as the run (or IDLE_S without a request)
        self.warm = False  # its warm-up attempt is done: from now on it times only when asked
        self.ended_idle = False  # told to end: the run is over, or nobody asked for IDLE_S
        self._relay: Relay | None = None  # the attempt being timed, in a student's turn

    def build(self, folder: Path) -> P.JobSpec:
        inputs = Inputs(self.refs)
        timing, self._pass_images, _ = inputs.timing(self.plan, np.random.default_rng(self.seed), folder)
        timing.attempts = ATTEMPTS
        self._pass_inputs = timing.pass_inputs
        return P.JobSpec(stage=self.plan.stage.number, notebook="", inputs=inputs.save(folder),
                         variants=dict(self.plan.variants), nets=inputs.nets, workloads=inputs.workloads,
                         timed=self.plan.timed, cases=[], accuracy=[], timing=timing, tasks=[], technique=None,
                         **spec_limits(self.plan, self.gpu))

    def _on_checks_done(self, msg, payload, answer) -> None:
        self.outcome.checks_done = True
        answer(P.Answer.STOP if self.outcome.forbidden else P.Answer.CONTINUE)

    def _on_accuracy_done(self, msg, payload, answer) -> None:
        answer(P.Answer.CONTINUE)

    def _on_turn(self, msg, payload, answer) -> None:
        if not self.warm:  # the warm-up attempt (its compiling and first passes): untimed, so it takes no turn
            answer(P.Answer.CONTINUE)  # (a turn of its own stopped every other job for 6-12 s, seven times a run)
            return
        try:
            relay = self.partner._requests.get(timeout=IDLE_S)
        except queue.Empty:
            relay = None
        self._relay = relay
        self.ended_idle = relay is None
        answer(P.Answer.STOP if relay is None else P.Answer.CONTINUE)

    def _on_pass(self, msg: P.PassImages, payload, answer) -> None:
        """The same images every attempt (the solution keeps no memo): written once, linked after. In a student's
        turn, pass k waits for the student's pass k - 1 (``Relay``)."""
        if not 0 <= msg.k < len(self._pass_images):
            self.outcome.protocol_error = f"images asked for pass {msg.k}"
            answer(P.Answer.STOP)
            return
        if self.warm and self._relay is not None:
            self._relay.before_pass(Relay.PARTNER, msg.k)
        first, path = self._pass_inputs.format(attempt=0, k=msg.k), self._pass_inputs.format(attempt=msg.attempt,
                                                                                             k=msg.k)
        if msg.attempt == 0:
            np.save(first, self._pass_images[msg.k])
        elif not os.path.exists(path):
            os.link(first, path)
        answer(P.Answer.CONTINUE)

    def _on_timing(self, msg: P.Timing, payload, answer) -> None:
        runs = None if msg.error else self._runs(msg.runs)
        why = "" if runs is not None else f"the reference partner's attempt failed: {(msg.error or 'no runs')[:300]}"
        if not self.warm:
            self.warm = runs is not None
            self.outcome.timing_error = why or None
            if runs is not None:
                self.partner.warmup_s = round(time.monotonic() - self._started, 2)
                self.partner.ready.set()
        elif self._relay is not None:
            self._relay.finish(runs, why)
            self._relay = None
        answer(P.Answer.CONTINUE if runs is not None else P.Answer.SKIP)

    HANDLERS = {**GradingJob.HANDLERS, P.ChecksDone: _on_checks_done, P.AccuracyDone: _on_accuracy_done,
                P.Turn: _on_turn, P.PassImages: _on_pass, P.Timing: _on_timing}
