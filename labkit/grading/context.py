"""What every job of a run needs, made once per process (the parent, or a cluster worker): the simulator where there
is no driver, the seeds, the run's ``Context`` (the stage plans, the reference data, the reference jobs and the
students' time limits, the turns), and ``grade_task``, one (student, stage) graded in it. ``labkit.grading.run``
hands tasks to it here or through ``labkit.grading.cluster`` on Dask workers.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from ..course.stages import STAGES
from ..launch import device
from . import isolation, refcache, scoring
from .child_start import probe
from .job import GradingJob, ReferenceTiming, reference_job
from .partner import Partner, paired
from .plan import References, StagePlan, declared_from_json, declared_json, describe_stages, in_step, plan_stage
from .rubric import Rubric
from .sandbox import linger_long as sandbox_linger
from .shared_reference import SharedReferences
from .turns import Turns


def simulator_if_no_driver() -> str:
    """Make sure GPU code can be graded where there is no CUDA driver: on the CUDA simulator (docs/grading.md).

    ``import labkit`` switches it on before numba is imported (``labkit.runtime``); this does it for a process
    where that did not happen yet. "ready": a driver is here, the simulator is on, or NUMBA_ENABLE_CUDASIM=0 was
    set by hand; "switched": turned on now; "too-late": no driver, and numba.cuda was imported without the
    simulator (its mode is fixed then), so only a fresh process can have it."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip() == "0" or device._driver_version() is not None:
        return "ready"
    if "numba.cuda" in sys.modules:
        return "ready" if device.info().simulated else "too-late"
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    device.honour_simulator_env()  # numba's core may be imported already: make it read the variable again
    device.info(refresh=True)
    return "switched"


# ---------------------------------------------------------------------------------------------- seeds


def fresh_seed() -> int:
    """A run seed from the operating system's entropy: nothing a student sees (names, dates, files) gives it."""
    return int(np.random.SeedSequence().entropy % (2 ** 63))


def job_seed(run_seed: int, student: str, stage: str) -> int:
    """The seed of one (student, stage)'s inputs: a function of the secret run seed and the names, so a job gets
    the same inputs whatever machine, shard or order grades it, and nobody without the run seed can tell them."""
    key = int.from_bytes(hashlib.sha256(f"{student}\0{stage}".encode()).digest()[:8], "little")
    return int(np.random.SeedSequence(int(run_seed), spawn_key=(key,)).generate_state(1, dtype=np.uint32)[0])


# ------------------------------------------------------------------------------------ what every job needs


def _reference_key(stage: str, env_extra: dict | None) -> tuple:
    """One reference job per stage and device in a run: the key of its timing and of its lock."""
    return stage, (env_extra or {}).get("CUDA_VISIBLE_DEVICES")


class Context:
    """The plans and the reference data of one run, made once per process (the parent, or a cluster worker)."""

    def __init__(self, stages: list[str], rubric: Rubric, solutions: Path, gpu: bool, simulated: bool,
                 sandbox: isolation.Isolation | None = None, cache: refcache.ReferenceCache | None = None,
                 described: dict[str, dict] | None = None):
        """``described``: what each stage's solution declares (``described_json`` of the parent's context; a
        cluster's workers plan from it instead of asking a child of their own)."""
        chosen = [STAGES[s] for s in stages]
        if described is None:
            for s in chosen:  # a solution out of step with its source is refused before any child loads one
                in_step(s, solutions)
            asked = describe_stages([solutions / s.notebook for s in chosen])
            declared = {s.number: asked[solutions / s.notebook] for s in chosen}
        else:
            declared = {n: declared_from_json(d) for n, d in described.items()}
        self._declared = declared
        self.plans: dict[str, StagePlan] = {s.number: plan_stage(s, solutions, rubric, gpu, simulated,
                                                                 declared[s.number]) for s in chosen}
        self.refs = References()
        for plan in self.plans.values():  # the reference data every job shares, prepared before any child starts
            self.refs.prepare(plan)
        self.gpu = gpu
        self.sandbox = sandbox  # every job's child runs in it (labkit.grading.isolation)
        self._timings: dict = {}
        self._lock = threading.Lock()
        self._locks: dict = {}
        self.limits: dict = {}  # stage -> the students' time limit and the reference job's seconds it came from
        self.turns = Turns()  # timed phases and reference jobs run while every other job is stopped
        self.stuck: dict[str, str] = {}  # device -> the job whose processes never went (a kernel that never ended)
        self.cache = cache  # reference jobs of earlier runs (labkit.grading.refcache); None: each runs here
        self.reference_jobs: dict[str, dict] = {}  # "04" (or "04 gpu1") -> its seconds, phases, whether cached
        self._partners: dict[tuple, Partner] = {}  # (stage, device) -> the reference timed in students' turns
        self.shared: SharedReferences | None = None  # a cluster's: each deferred reference job once for all workers

    def described_json(self) -> dict[str, dict]:
        """What each stage's solution declares, for a cluster's workers (``Context(described=...)``)."""
        return {n: declared_json(d) for n, d in self._declared.items()}

    def partner(self, plan: StagePlan, env_extra: dict | None = None) -> Partner | None:
        """The stage's partner on this device (``labkit.grading.partner``), started now if it is not running; None
        where the stage's students are timed against the reference job alone (``timing.paired``)."""
        if not paired(plan):
            return None
        key = _reference_key(plan.stage.number, env_extra)
        with self._lock:
            if key not in self._partners:
                self._partners[key] = Partner(plan, self.refs, self.gpu, fresh_seed(), dict(env_extra or {}),
                                              self.sandbox, self.turns)
        self._partners[key].ensure()
        return self._partners[key]

    def partners(self) -> dict:
        """Each partner of the run, for the report: how often it started and timed, and any error."""
        return {k[0] + (f" gpu{k[1]}" if k[1] is not None else ""): p.report()
                for k, p in sorted(self._partners.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))}

    def close(self) -> None:
        """The run is over: every partner ends."""
        for p in list(self._partners.values()):
            p.close()

    def waits_for_reference(self, task: dict, env_extra: dict | None = None) -> bool:
        """Whether ``task`` would wait for its stage's reference job, running now in another slot: a free slot takes
        another task meanwhile (``run.run_local``), as the one slot per stage that runs it keeps the others busy."""
        key = _reference_key(task["stage"], env_extra)
        with self._lock:
            lock = self._locks.get(key)
        return task["notebook"] is not None and key not in self._timings and lock is not None and lock.locked() \
            and not self.defers_reference(self.plans[task["stage"]])

    def defers_reference(self, plan: StagePlan) -> bool:
        """Whether a student of the stage starts before its reference job has ended: its limit is the rubric's
        (``time_factor = 0``: the reference's wall time scales nothing) and a partner times the reference in its
        turns (``partner.paired``), so the job needs the reference's result only once it has run (a run on two
        H100s left three of six slots waiting 55-90 s for stage 06's reference job, results/h100x2-2026-11-28)."""
        return not plan.rubric["limits"]["time_factor"] and plan.measured and paired(plan)


    def reference(self, plan: StagePlan, env_extra: dict | None = None,
                  passes_seed: int | None = None) -> tuple[ReferenceTiming | None, float]:
        """The stage's solution graded as a job of its own (``job.reference_job``), once per stage and device
        (``CUDA_VISIBLE_DEVICES``) in a run, and the students' time limit that follows from it: ``limits.time_factor``
        times its wall time, at least ``limits.min_time_s``, at most the rubric's limit (``time_factor = 0``: the
        rubric's limit as it is, and no reference job where op time is not measured). The timing is None where op
        time is not measured. A stage whose students do not wait for it (``defers_reference``) on a cluster
        (``shared``): once for every worker with this device's model (``labkit.grading.shared_reference``). Another
        slot (or worker) measuring it now: its result, once it has."""
        lim = plan.rubric["limits"]
        if not plan.measured and not lim["time_factor"]:
            return None, plan.time_limit
        env = dict(env_extra or {})
        key = _reference_key(plan.stage.number, env)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._timings:
                def measure() -> ReferenceTiming:
                    return reference_job(plan, self.refs, self.gpu, fresh_seed(), env, self.sandbox, self.turns,
                                         passes_seed, retime=not self.defers_reference(plan))

                began, by = time.time(), None
                if self.shared is not None and self.defers_reference(plan):  # once for the cluster's workers
                    self._timings[key], by = self.shared.get(plan.stage.number, device.info().name, measure)
                else:
                    self._timings[key] = self.cache.reference(plan, self.refs, env, measure) if self.cache else \
                        measure()
                where = key[0] + (f" gpu{key[1]}" if key[1] is not None else "")
                self.reference_jobs[where] = {"seconds": round(self._timings[key].seconds, 1),
                                              "ran": [round(began, 2), round(time.time(), 2)],  # wall clock
                                              "phases_s": self._timings[key].phases_s,
                                              "attempts": self._timings[key].attempts,
                                              **(self.cache.stages.get(where, {}) if self.cache else {}),
                                              **({"measured_by": by} if by is not None else {})}
        ref = self._timings[key]
        limit = plan.time_limit
        if lim["time_factor"] and not ref.error:
            limit = min(plan.time_limit, max(float(lim["min_time_s"]), lim["time_factor"] * ref.seconds))
        self.limits[plan.stage.number] = {"time_limit_s": round(limit), "reference_job_s": round(ref.seconds, 1),
                                          "reference_attempts": ref.attempts}  # a slow one moves every ratio
        return (ref if plan.measured or ref.error else None), round(limit)


def sandbox_refusal(iso: isolation.Isolation, private: dict, memory_mb: int = 0,
                    env_extra: dict | None = None) -> str:
    """Why no job could be graded in ``iso`` here, in one line ("" when they can), found before any job: the
    sandbox cannot start (docker without its daemon), the grader's PYTHONPATH holds what a student must not read
    (``private``: {what: path}), or a probe child in it imports other versions than the grader
    (``child_start.probe``)."""
    why = iso.unusable()
    if not why and iso.python_path():
        why = isolation.python_path_refusal(private)
    return why or probe(iso, memory_mb, env_extra) or ""


def missing_row(student: str, plan: StagePlan, seed: int, where: str, searched: bool) -> dict:
    row = scoring.empty_row(student, plan.stage, plan)
    row.update(status="missing", seed=seed, message=f"missing stage: no {plan.stage.notebook} in {where}"
               + (" (looked in notebooks/ and every folder below)" if searched else ""))
    return row


def grader_error_row(ctx: Context, task: dict, message: str, trace: str = "") -> dict:
    plan = ctx.plans[task["stage"]]
    row = scoring.empty_row(task["student"], plan.stage, plan)
    row.update(status="grader-error", notebook=task["notebook"], seed=task["seed"], message=message,
               details={"traceback": trace} if trace else {})
    return row


def reference_tasks(ctx: Context, tasks: list[dict]) -> list[dict]:
    """A task of its own for each stage whose students do not wait for its reference job (``defers_reference``),
    put before the students' (``backlog.Backlog`` then starts it first): the job gets a slot of its own instead of
    running ahead of a student's job in that student's slot, where the two made the longest chain of a class on two
    H200s (105 s of stage 06's reference job, then 85 s of the student's; results/h200x2-2026-11-28). It gives no
    row (``is_reference``)."""
    return [{"reference": True, "student": "(reference solution)", "stage": n, "notebook": str(ctx.plans[n].solution),
             "seed": 0, "passes_seed": next((t.get("passes_seed") for t in tasks), None)}
            for n in ctx.plans if ctx.defers_reference(ctx.plans[n])
            and any(t["stage"] == n and t["notebook"] is not None for t in tasks)]


def is_reference(task: dict) -> bool:
    return bool(task.get("reference"))


def grade_task(ctx: Context, task: dict, env_extra: dict | None = None) -> dict:
    """One (student, stage): a child under its limits, or the row saying why there was none. A reference task
    (``reference_tasks``) measures its stage's reference job (or reads it, where another worker did) and gives no
    row, only what its slot did (``details.ran``)."""
    plan = ctx.plans[task["stage"]]
    if is_reference(task):
        began, details = time.time(), {}
        try:
            ctx.reference(plan, env_extra, task.get("passes_seed"))
        except Exception as exc:  # noqa: BLE001 - the grader's own failure: each student's job tries it again, and
            details["error"] = f"{type(exc).__name__}: {exc}"  # a failure there is that row's grader error
        details["ran"] = {"from": round(began, 2), "to": round(time.time(), 2)}
        return {"reference": task["stage"], "details": details}
    if task["notebook"] is None:
        return missing_row(task["student"], plan, task["seed"], task["where"], task["searched"])
    job = GradingJob(plan, ctx.refs, task["student"], Path(task.get("path") or task["notebook"]), task["seed"], ctx.gpu)
    job.env_extra, job.passes_seed = dict(env_extra or {}), task.get("passes_seed")
    job.sandbox, job.turns = ctx.sandbox, ctx.turns
    if job.device in ctx.stuck:
        return grader_error_row(ctx, task, f"not graded: {job.device} is still held by the processes of "
                                           f"{ctx.stuck[job.device]}, which never ended (a GPU kernel that never "
                                           f"returns): regrade this row on a machine whose GPU is free")
    began, reference_s = time.time(), None  # the job's span on the wall clock; the part of it its reference took
    # a stage whose students do not wait for it: measured by its own task (``reference_tasks``), read once this
    # job has run
    deferred = ctx.defers_reference(plan)
    try:
        if deferred:
            job.use_reference(None, plan.time_limit)
        else:
            job.use_reference(*ctx.reference(plan, env_extra, job.passes_seed))
            reference_s = time.time() - began  # the first job of a stage runs it; the others wait for it meanwhile
        job.partner = ctx.partner(plan, env_extra) if job.outcome.grader_error is None else None
        job.run()
        if deferred:
            waited = time.time()
            job.use_reference(ctx.reference(plan, env_extra, job.passes_seed)[0])
            reference_s = time.time() - waited
        row = job.row()
        row["notebook"] = task["notebook"]
        if job.outcome.survivors:  # nobody else gets this device while they are there
            left = sandbox_linger(job.outcome.survivors)
            if left:
                ctx.stuck[job.device] = f"{task['student']}'s stage {task['stage']} job (pids {left[:5]})"
    except Exception as exc:  # noqa: BLE001 - the grader's own failure for one job: record it, go on
        row = grader_error_row(ctx, task, f"grader error: {type(exc).__name__}: {exc}",
                               traceback.format_exc(limit=8))
    row["details"]["ran"] = {"from": round(began, 2), "to": round(time.time(), 2),
                             "reference_s": round(time.time() - began if reference_s is None else reference_s, 2),
                             **({"reference_read": "after the job"} if deferred else {})}
    if task.get("note"):
        row["message"] += f" [{task['note']}]"
    if env_extra and env_extra.get("CUDA_VISIBLE_DEVICES") is not None:
        row["details"]["gpu"] = env_extra["CUDA_VISIBLE_DEVICES"]
    return row
