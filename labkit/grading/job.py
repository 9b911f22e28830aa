"""One (student, stage) job in the parent: draw the inputs, run the child on them, judge every answer.

The parent keeps the expected answers and never sends them: the child gets inputs only, sends raw outputs back,
and every comparison happens here (``labkit.check.compare``), where the student's cells cannot reach. ``GradingJob``
reads one message at a time (``HANDLERS``: a small handler each); its inputs (``inputs``), the judging of what a
message carries (``verdicts``) and its timing's later attempts (``attempts``) are its parts in modules of their own,
and its child is set up as every child is (``child_start``). The reference solution's own job (``reference_job``)
times the stage apart from student code, alone, and sets the time limit.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from ..launch.cudacpu import LABEL as CUDA_C_LABEL
from . import isolation, sandbox, scoring
from . import protocol as P
from .ahead import Ahead
from .attempts import TimedAttempts, probe_speed_us
from .child_start import job_env, last_kernel, not_as_the_grader, private_folder, tuning_copy
from .inputs import Inputs, JobInputs, spec_limits
from .phases import PhaseClock, rounded
from .plan import References, StagePlan
from .protocol import read_array
from .scoring import JobOutcome
from .turns import WHOLE, Running, Turns
from .verdicts import JobVerdicts, mismatches, task_mismatch


@dataclasses.dataclass
class ReferenceTiming:
    """What the stage's solution did as a job of its own (``reference_job``): its timed passes (the op time's
    denominator) and how long the whole job took (the scale of the students' time limit)."""

    runs: list | None = None
    method: str = ""
    mismatches: list | None = None
    error: str | None = None
    device: str = ""
    seconds: float = 0.0
    phases_s: dict = dataclasses.field(default_factory=dict)  # where its wall time went (labkit.grading.phases)
    attempts: list = dataclasses.field(default_factory=list)  # each timing turn's core speed (labkit.grading.attempts)


def reference_job(plan: StagePlan, refs: References, gpu: bool, seed: int, env_extra: dict | None = None,
                  sandbox=None, turns: Turns | None = None, passes_seed: int | None = None,
                  retime: bool = True) -> ReferenceTiming:
    """The stage's solution graded as a student is, in a child of its own that never holds student code (once per
    stage and device in a run): the same engine, clock and tracing time it, and the job's wall time, measured alone
    (the whole machine's turn: every other job stopped), scales the students' time limit. Where it scales nothing
    (``limits.time_factor = 0``) only its timed phase takes the device's turn, as a student's does, and the other
    jobs run beside the rest of it. Where every student of the stage is timed against a partner (``retime``
    False: ``Context.defers_reference``), its op time is only their fallback, and a slow core does not earn it
    more turns: on two H200s stage 06's and 09's took three each, 16 s of timing in a 68 s job that every student
    of those stages waited for at its end (results/h200x2-2026-11-28c). A solution that does not pass is the
    grader's error."""
    job = GradingJob(plan, refs, "(reference solution)", plan.solution, seed, gpu)
    job.env_extra, job.sandbox, job.turns, job.passes_seed = dict(env_extra or {}), sandbox, turns, passes_seed
    job.alone, job.retime = bool(plan.rubric["limits"]["time_factor"]), retime
    job.time_limit = 2 * plan.time_limit  # the kit's own code: a busy machine must not make it the grader's error
    o = job.run()
    row = job.row()
    result = ReferenceTiming(runs=o.timing_runs, method=o.timing_method, mismatches=o.timing_mismatches,
                             device=o.device, seconds=o.seconds, phases_s=rounded(o.phases),
                             attempts=[{k: a[k] for k in ("attempt", "speed_us", "fastest_us")}
                                       for a in o.timing_attempts])
    # its timed passes' own mismatches (float32 near-ties) only widen the students' allowance: not a failure
    passed = row["status"] == "pass" or (o.checks_done and scoring.checks_passed(o) and scoring.accuracy_passed(o)
                                          and not o.forbidden and not o.tampered_code and not o.grader_error)
    if not passed or (plan.measured and not o.timing_runs):
        result.error = (f"the reference solution {plan.solution.name} does not pass its own grading "
                        f"({row['status']}): {row['message'][:400]}")
    return result


class GradingJob(JobInputs, JobVerdicts, TimedAttempts):
    """One (student, stage) graded, the parent's side: build inputs, run the child, judge what comes back (the
    child's side is ``worker.GradingChild``). Its inputs, its judging of a frame's outputs and its timing's later
    attempts are methods of its parts (``inputs.JobInputs``, ``verdicts.JobVerdicts``, ``attempts.TimedAttempts``)
    over the state made here."""

    def __init__(self, plan: StagePlan, refs: References, student: str, notebook: Path, seed: int, gpu: bool):
        self.plan, self.refs, self.student, self.notebook = plan, refs, student, notebook
        self.seed, self.gpu = seed, gpu
        self.passes_seed: int | None = None  # the run's seed for timed passes (inputs.passes_seed); None: the job's
        self.cases: dict[int, dict] = {}
        self.acc_items: dict[str, dict] = {}
        self.outcome = JobOutcome()
        self.lib = Path()
        self._outputs: dict = {}  # (variant, net, layer, batch) -> fingerprints of the outputs seen
        self._hinted = False
        self.time_limit = plan.time_limit  # the rubric's, or the one that follows from the reference's job
        self._pass_images: list = []  # each timed pass's images (fresh): the reference's answers are computed here
        self._answers: dict = {}  # ("case" | "task" | "pass", id) -> the float64 reference's answer, to compute
        self._ahead: Ahead | None = None  # ... computed while the child runs (labkit.grading.ahead)
        self._attempt, self._retry = 0, None  # the timing's attempt now, and a later attempt's answers (Ahead)
        self._handed: set = set()  # the current attempt's passes whose images were written (``_hand_pass``)
        self._turn_at = self._started = time.monotonic()
        self._retry_at = 0.0  # a later attempt's turn is not taken before then (RETRY_AFTER_S)
        self.env_extra: dict = {}  # e.g. CUDA_VISIBLE_DEVICES for a worker pinned to one GPU
        self.sandbox = None  # the run's labkit.grading.isolation (run.grade_task sets it; None: the best here)
        self.turns: Turns | None = None  # the run's turns (labkit.grading.turns): None, no other job to stop
        self.alone = False  # a reference job: the whole machine's turn for its whole run
        self.retime = True  # a slow core's attempt is timed again (timing.attempts, timing.slow_core)
        self.running: Running | None = None
        self._task_expected: dict[int, dict] = {}  # task call id -> what the grader expects of it
        self.clock = PhaseClock(lambda: self.running.paused_s() if self.running is not None else 0.0)
        self._counting: tuple | None = None  # on a GPU: the technique's simulator child, started beside this one
        self.partner = None  # the stage's reference timed in this job's turns (labkit.grading.partner), or None
        self._paired: tuple = (None, "")  # the partner's passes in the current attempt's turn, or why none
        self._relay = None  # the current attempt's passes taken in turn with the partner's (partner.Relay)

    # ---- one handler per message (HANDLERS below): each judges its message and answers where the child waits
    def _phase(self, phase: str) -> None:
        """The job's ``phase`` begins now, on the parent's clock (a job a test made without one has none)."""
        clock = getattr(self, "clock", None)
        if clock is not None:
            clock.switch(phase)

    def _on_hello(self, msg: P.Hello, payload, answer) -> None:
        self._phase("load")  # started: its interpreter, imports, snapshot and inputs are behind it
        self.outcome.device = msg.device
        iso = self.running.sandbox if self.running is not None else isolation.Isolation()
        refused = not_as_the_grader(self.lib, msg, iso)
        self.outcome.grader_error = f"not graded: {refused}" if refused else self.outcome.grader_error

    def _on_phase(self, msg: P.Phase | P.Start, payload, answer) -> None:
        self.outcome.phase = msg.what[:200]
        if isinstance(msg, P.Phase) and msg.step in scoring.PHASES:  # the child's own phases only
            self._phase(msg.step)

    def _on_load_error(self, msg: P.LoadError, payload, answer) -> None:
        self.outcome.load_error = msg.message[:2000]
        self.outcome.forbidden += msg.forbidden

    def _on_loaded(self, msg: P.Loaded, payload, answer) -> None:
        o = self.outcome
        o.finished.add("load")
        o.problems = dict(msg.problems)
        o.forbidden += msg.forbidden
        answer(P.Answer.STOP if o.forbidden else P.Answer.CONTINUE)
        for name, declared in msg.variants.items():
            spec = self.plan.variants.get(name)
            differ = spec.differences(declared) if spec is not None else []
            if differ:
                o.notes.append(f"variant {name!r} graded as the stage declares it: {', '.join(differ)}")

    def _on_case(self, msg: P.CaseResult, payload, answer) -> None:
        self._case(msg, payload)
        if not msg.skipped:  # the child waits for the verdict: stop repeating a failing layer
            res = self.outcome.checks.get(msg.id)
            answer(P.Answer.CONTINUE if res is not None and res.passed else P.Answer.STOP)

    def _on_checks_done(self, msg: P.ChecksDone, payload, answer) -> None:
        o = self.outcome
        o.checks_done = True
        o.finished.add("checks")
        if msg.emulated:
            o.notes.append(f"its CUDA C ran on the {CUDA_C_LABEL} (labkit.cudacpu): the checks a GPU runs, no timing")
        go = scoring.checks_passed(o) and not o.forbidden
        if not go:
            self._no_timing()
        elif self.gpu and not self.alone and self.plan.technique() and self._counting is None:
            self._start_counting()  # (once: a second ChecksDone frame starts nothing)
        answer(P.Answer.CONTINUE if go else P.Answer.STOP)

    def _on_task(self, msg: P.TaskResult, payload, answer) -> None:
        want = self._task_expected.get(msg.id)
        if want is None:
            self.outcome.protocol_error = f"a task result for an unknown call {msg.id!r}"
            return
        rec = self.outcome.tasks.setdefault(want["task"], {"passed": True, "line": "", "calls": 0})
        if msg.skipped:
            if self._ahead is not None:
                self._ahead.skip(("task", msg.id))
            return
        if "probs" not in want:  # its answer, computed ahead
            want["probs"] = self._ahead.get(("task", msg.id))
        rec["calls"] += 1
        why = msg.error or task_mismatch(want, read_array(payload, "out"))
        if why and rec["passed"]:
            rec.update(passed=False, line=f"{want['function']}: FAIL ({want['what']}: {why})")
        answer(P.Answer.STOP if why else P.Answer.CONTINUE)

    def _on_turn(self, msg: P.Turn, payload, answer) -> None:
        """The timed phase waits for its turn: every other job stopped (``labkit.grading.turns``), and the parent's
        answers for the attempt's passes computed (nothing of the parent's runs beside its timing)."""
        for k in range(len(self._pass_images)):
            self._pass_answer(k)
        pause = self._retry_at - time.monotonic()
        if pause > 0:  # a later attempt: the core's slow spell given time to pass
            with self.running.waiting() if self.running is not None else nullcontext():
                time.sleep(pause)
        if self.partner is not None:  # loaded and warm before the turn is taken (a wait of the grader's)
            self.partner.wait_ready(self.running)
        if self.turns is not None and self.running is not None:
            self.turns.acquire(self.running, WHOLE if self.alone else self.device)
        if self.partner is not None:  # the reference, timed in this turn on its core, pass by pass with the student
            self._relay = self.partner.pair(self.running, len(self._pass_images))
        self._turn_at = time.monotonic()
        answer(P.Answer.CONTINUE)

    def _on_technique(self, msg: P.Technique, payload, answer) -> None:
        self.outcome.technique = {"passed": msg.passed, "line": msg.line}
        self.outcome.finished.add("technique")

    def _on_accuracy(self, msg: P.AccuracyResult, payload, answer) -> None:
        self._accuracy(msg, payload)

    def _on_accuracy_done(self, msg, payload, answer) -> None:
        o = self.outcome
        o.accuracy_done = True
        o.finished.update(("tasks", "accuracy"))
        req = self.plan.rubric["op_time"]["requires_accuracy"]
        go = self.plan.measured and (scoring.accuracy_passed(o) or not req)
        if not go:
            o.finished.add("timing")  # nothing to time
            self._no_timing()
        answer(P.Answer.STOP if o.forbidden else P.Answer.CONTINUE if go else P.Answer.SKIP)

    def _on_pass(self, msg: P.PassImages, payload, answer) -> None:
        if self._relay is not None:  # pass k once the partner's pass k has run
            self._relay.before_pass(self._relay.STUDENT, msg.k)
        why = self._hand_pass(msg.attempt, msg.k)
        if why:
            self.outcome.protocol_error = why
        answer(P.Answer.STOP if why else P.Answer.CONTINUE)

    def _on_timing(self, msg: P.Timing, payload, answer) -> None:
        """One attempt's passes: kept beside the earlier attempts' (op time is the best pass of them all), and
        answered with another attempt when its core ran slow (``_again``), else with enough."""
        o = self.outcome
        if self._relay is not None:
            if msg.error:
                self._relay.abort("the student's timed passes failed")
            else:
                self._relay.done(self._relay.STUDENT, len(self._pass_images) - 1)
            self._paired, self._relay = self._relay.result(), None
        if msg.error or msg.attempt != self._attempt:
            self._release_turn()
            o.finished.add("timing")
            o.timing_error = msg.error or None
            if not msg.error:
                o.protocol_error = f"timing results of attempt {msg.attempt} where {self._attempt} was asked for"
            answer(P.Answer.SKIP)
            return
        runs = self._runs(msg.runs)
        self._release_turn()
        speed = probe_speed_us(msg.probe)
        fastest = self.turns.fastest(self.device, speed) if self.turns is not None and speed else speed
        o.timing_attempts.append({"attempt": msg.attempt, "speed_us": speed, "fastest_us": fastest,
                                  "quiet_s": round(msg.quiet_s, 3), "probe": msg.probe})
        preds = self._predictions(payload, runs)
        expected = [self._pass_answer(k) for k in range(len(self._pass_images))] if preds else []
        again = runs is not None and self._again(speed, fastest)
        if again:
            self._next_attempt()
        else:
            o.finished.add("timing")
        answer(P.Answer.CONTINUE if again else P.Answer.SKIP)
        o.timing_method, o.quiet_s = msg.method, o.quiet_s + msg.quiet_s
        o.timing_runs = (o.timing_runs or []) + runs if runs is not None else None
        if self.partner is not None and runs is not None:
            o.paired.append({"attempt": msg.attempt, "student": runs, "reference": self._paired[0],
                             **({"why": self._paired[1]} if self._paired[1] else {})})
        o.timing_mismatches = (o.timing_mismatches or []) + mismatches(expected, preds) if preds else None
        self._trace(msg.trace, self.plan.timed, True)  # a library call made only in the timed passes

    def _on_tampered(self, msg: P.Tampered, payload, answer) -> None:
        self.outcome.tampered_code = {"what": msg.what[:20], "count": msg.count, "when": msg.when[:300]}

    def _on_grader_error(self, msg: P.GraderError, payload, answer) -> None:
        self.outcome.grader_error = msg.message
        self.outcome.resource_error = msg.resource

    def _on_done(self, msg, payload, answer) -> None:
        self.outcome.done = True
        self._phase("end")

    HANDLERS = {P.Hello: _on_hello, P.Phase: _on_phase, P.Start: _on_phase,
                P.LoadError: _on_load_error, P.Loaded: _on_loaded, P.CaseResult: _on_case,
                P.ChecksDone: _on_checks_done, P.Technique: _on_technique, P.AccuracyResult: _on_accuracy,
                P.AccuracyDone: _on_accuracy_done, P.TaskResult: _on_task, P.Turn: _on_turn,
                P.PassImages: _on_pass,
                P.Timing: _on_timing, P.Tampered: _on_tampered,
                P.GraderError: _on_grader_error, P.Done: _on_done}

    def handle(self, kind: P.Kind, meta: dict, payload: bytes, answer) -> bool:
        """Judge one frame; True once nothing more needs to be heard (done, or a broken protocol)."""
        try:
            message = P.decode(kind, meta)
        except P.ProtocolError as exc:
            self.outcome.protocol_error = f"a malformed {kind.value!r} message on the result channel ({exc})"[:300]
            return True
        self.HANDLERS[type(message)](self, message, payload, answer)
        if isinstance(message, P.Hello) and self.outcome.grader_error:  # a child that cannot grade as the grader
            return True
        return self.outcome.done or self.outcome.protocol_error is not None

    # ---- running
    def use_reference(self, ref: ReferenceTiming | None, time_limit: float | None = None) -> None:
        """The reference solution's job (``reference_job``): its timing, this job's op time is compared with,
        and the time limit that follows from its duration."""
        o = self.outcome
        if time_limit:
            self.time_limit = time_limit
        if ref is None:
            return
        if ref.error:
            o.grader_error = ref.error
        else:
            o.reference_runs, o.reference_mismatches, o.reference_method = ref.runs, ref.mismatches, ref.method

    def run(self) -> JobOutcome:
        """Private copies in a fresh folder, the child under its limits, then the checksums; the folder goes."""
        o = self.outcome
        if o.grader_error:  # the reference could not be timed: the grader's problem, said in this job's row
            return o
        start = self._started = time.monotonic()
        self.clock.switch("start")
        folder, self.lib, solutions, guard = private_folder(self.plan)
        iso = self.sandbox if self.sandbox is not None else isolation.choose()
        self.running = Running(iso, self.device)
        self.running.kept_core = self.gpu and self.plan.variants[self.plan.timed].target == "gpu"
        try:
            student_nb = folder / "student" / self.notebook.name
            shutil.copyfile(self.notebook, student_nb)
            self.clock.switch("inputs")
            job = self.build(folder)
            job.notebook, job.tuning = str(student_nb), tuning_copy(folder)
            self.clock.switch("start")
            limits = self.plan.rubric["limits"]
            with self.turns.hold(self.running) if self.alone and self.turns is not None else nullcontext():
                end = sandbox.run_child(job.to_json(), folder,
                                        job_env(folder, self.lib, solutions, self.env_extra), self.time_limit,
                                        limits["memory_mb"], job.memory_guard == "rss", self.handle, iso,
                                        self.running, self.turns)
            if self.clock.current != "end":  # no last frame (ended at its limit, crashed): its phase ends here
                self.clock.switch("end")
            o.time_limit = self.time_limit
            o.timed_out, o.memory_exceeded, o.returncode, o.stderr_tail, o.survivors = \
                end.timed_out, end.memory_exceeded, end.returncode, end.stderr_tail, end.survivors
            o.protocol_error = o.protocol_error or end.protocol_error
            o.tampered = guard.changed()
            o.last_kernel = last_kernel(folder)
        finally:
            if self._relay is not None:  # ended inside a paired attempt: its partner goes on alone
                self._relay.abort("the student's job ended")
                self._relay = None
            shutil.rmtree(folder, ignore_errors=True)
            o.phases = self.clock.stop()
            for ahead in (self._ahead, self._retry):  # (a job that ended early: nothing more is needed)
                if ahead is not None:
                    ahead.cancel()
        if not self.plan.technique():
            o.finished.add("technique")
        if self.gpu and o.technique is not None:
            self._technique_counted()
        elif self._counting is not None:  # started, and not needed: waited for all the same (no child outlives its
            try:                          # job's row); what it found or raised is not used, as before
                self._counted()
            except Exception:  # noqa: BLE001
                pass
        o.paused_s += self.running.paused_s()  # (the technique's second child adds its own)
        o.seconds = time.monotonic() - start - o.paused_s
        return o

    @property
    def device(self) -> str:
        """What a timing here shares: the GPU the job is pinned to, or this machine's processors."""
        if not self.gpu:
            return "cpu"
        return f"gpu{self.env_extra.get('CUDA_VISIBLE_DEVICES', '')}"

    def _counting_job(self) -> "TechniqueJob":
        counted = TechniqueJob(self.plan, self.refs, self.student, self.notebook, self.seed, gpu=False)
        counted.env_extra, counted.sandbox, counted.time_limit, counted.turns = \
            {**self.env_extra, "NUMBA_ENABLE_CUDASIM": "1"}, self.sandbox, self.time_limit, self.turns
        return counted

    def _start_counting(self) -> None:
        """A student's GPU job whose checks pass starts the technique's simulator child now, beside its own child's
        accuracy and timing, instead of after them: a child of the same run as any other, so it is stopped while a
        timing holds its turn (this job's own included). Its line is used only as before: once this job's child
        reached its technique phase. (A reference job counts after its child: its wall time is its work alone.)"""
        counted, box = self._counting_job(), {}

        def count() -> None:
            try:
                box["outcome"] = counted.run()
            except BaseException as exc:  # noqa: BLE001 - the grader's error, raised where the job waits for it
                box["error"] = exc

        thread = threading.Thread(target=count, daemon=True, name="labkit-grade-technique")
        self._counting = (counted, thread, box)
        thread.start()

    def _counted(self) -> JobOutcome:
        """The technique child's outcome: the one started beside this job (waited for; the wait is this job's
        technique phase, the part of it that child spent stopped is waiting), or one run now."""
        if self._counting is None:
            c = self._counting_job().run()
            self.outcome.paused_s += c.paused_s
            self.clock.add(c.phases, "technique")  # the second child exists for the technique only
            return c
        counted, thread, box = self._counting

        def paused() -> float:
            return counted.running.paused_s() if counted.running is not None else 0.0

        t0, p0 = time.monotonic(), paused()
        thread.join()
        waited, stopped = time.monotonic() - t0, max(0.0, paused() - p0)
        self.outcome.paused_s += stopped
        self.clock.add({"technique": waited - stopped, "waiting": stopped}, "technique")
        if "error" in box:
            raise box["error"]
        self.outcome.technique_child = rounded(box["outcome"].phases)  # its own phases, beside this job's
        return box["outcome"]

    def _technique_counted(self) -> None:
        """On a GPU the conv's loads cannot be counted, and "its kernels have shared memory" earns the points for a
        token use: the technique is measured again, as on a CPU machine, by a second child of the same job under
        the CUDA simulator (its load fractions against the stage's budget); that line replaces the GPU's."""
        c = self._counted()
        o = self.outcome
        t = c.technique or {"passed": False, "line": f"{self.plan.technique()['layer']} uses "
                                                     f"{self.plan.technique()['memory']} memory: not counted on the "
                                                     f"simulator ({TechniqueJob.failure(c)})"}
        o.technique = {**t, "gpu": o.technique.get("line", "")}
        o.tampered = o.tampered or c.tampered
        if c.tampered_code and not o.tampered_code:
            o.tampered_code = c.tampered_code
        o.forbidden += [f for f in c.forbidden if f not in o.forbidden]

    def row(self) -> dict:
        return scoring.row(self.plan, self.student, self.notebook, self.seed, self.outcome)


class TechniqueJob(GradingJob):
    """A job's technique part alone, in a child under the CUDA simulator (``GradingJob._technique_counted``): the
    submission loaded as in any job, no checks, then the technique's load fractions."""

    def build(self, folder: Path) -> P.JobSpec:
        tech = self.plan.technique()
        return P.JobSpec(stage=self.plan.stage.number, notebook="", inputs=Inputs(self.refs).save(folder),
                         variants=dict(self.plan.variants), nets={}, workloads={}, timed=self.plan.timed, cases=[],
                         accuracy=[], timing=None, technique=P.TechniqueSpec(**tech),
                         **spec_limits(self.plan, False))

    def _on_checks_done(self, msg, payload, answer) -> None:
        self.outcome.checks_done = True
        answer(P.Answer.STOP if self.outcome.forbidden else P.Answer.CONTINUE)

    def _on_accuracy_done(self, msg, payload, answer) -> None:
        answer(P.Answer.SKIP)  # no timing: the technique's count, which comes after it

    HANDLERS = {**GradingJob.HANDLERS, P.ChecksDone: _on_checks_done, P.AccuracyDone: _on_accuracy_done}

    @staticmethod
    def failure(o: JobOutcome) -> str:
        """Why the simulator child gave no technique line, in a few words."""
        if o.timed_out:
            return "it ran out of time"
        if o.memory_exceeded:
            return "it ran out of memory"
        if o.load_error:
            return f"the notebook did not load there: {o.load_error.splitlines()[0][:200]}"
        return o.protocol_error or o.grader_error or (o.stderr_tail or "").strip()[-200:] or "no result came back"
