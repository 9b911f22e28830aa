"""One ``labkit grade`` run: every submission for every selected stage, a row each, then the reports.

Everything the jobs share (the stage plans, the reference data) is made before the first child starts; a job
that fails in the grader itself becomes a ``grader-error`` row and the run goes on to the next one. Jobs run here
(``--jobs N`` threads) or on a Dask cluster (``--cluster``, ``labkit.grading.cluster``; ``--gpus`` is one dask-cuda
worker per GPU of this machine, each child pinned to its worker's GPU); either way each (student, stage) gets the
same inputs for the same run seed, so the merged report of a cluster run equals a single machine's.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import outputs
from ..course.stages import STAGES, label, solutions_folder
from ..launch import device
from . import cluster as dask_cluster
from . import environment, isolation, phases, refcache
from .context import (  # noqa: F401
    Context,
    fresh_seed,
    grade_task,
    grader_error_row,
    is_reference,
    job_seed,
    missing_row,
    reference_tasks,
    sandbox_refusal,
    simulator_if_no_driver,
)
from .backlog import Backlog
from .child_start import probe  # noqa: F401 - run.probe, as before
from .cores import Cores
from .inputs import passes_seed
from .job import GradingJob, ReferenceTiming, reference_job  # noqa: F401 - run.reference_job, as before
from .reports import merge_reports, write_reports
from .rubric import GradeError, load_rubric
from .sandbox import memory_guard_text
from .submissions import Submission, find_submissions, select_stages
from .turns import Turns  # noqa: F401 - run.Turns, as before
from .turns import merged as merged_turns

# ------------------------------------------------------------------------------------------------ GPUs


def available_gpus() -> list[int]:
    """Indices of this machine's GPUs (``nvidia-smi``; CUDA_VISIBLE_DEVICES, if set, narrows them), [] if none."""
    import shutil
    import subprocess

    if device.info().simulated or device._driver_version() is None:
        return []
    found: list[int] = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout
            found = [int(v) for v in out.split() if v.strip().isdigit()]
        except (OSError, subprocess.SubprocessError, ValueError):
            found = []
    if not found and device.info().kind == "gpu":
        found = [0]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        keep = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        found = [g for g in found if g in keep] if found else keep
    return found


def parse_gpus(spec: str, available: list[int], flag: str = "--gpus") -> list[int]:
    """``--gpus all`` or ``--gpus 0,2`` (``--cluster cuda:0,2``): the GPU indices to use, checked against those
    ``available``."""
    spec = (spec or "").strip()
    if not available:
        raise GradeError(f"{flag} {spec}: there is no GPU here (the CUDA simulator runs GPU code on the CPU: use "
                         f"--jobs N instead)")
    if spec == "all":
        return list(available)
    try:
        chosen = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise GradeError(f"{flag} takes 'all' or GPU indices separated by commas (e.g. 0,2), not {spec!r}") from None
    if not chosen:
        raise GradeError(f"{flag} takes 'all' or GPU indices separated by commas (e.g. 0,2)")
    unknown = [g for g in chosen if g not in available]
    if unknown:
        raise GradeError(f"{flag}: no GPU {unknown[0]} here; this machine has GPU "
                         f"{', '.join(map(str, available))}")
    if len(set(chosen)) != len(chosen):
        raise GradeError(f"{flag} names a GPU twice: {spec}")
    return chosen


def jobs_per_gpu(jobs: int, gpus: list[int]) -> int:
    """``--jobs N`` over G GPUs: N // G jobs at a time on each (never more than N in all), at least one."""
    return max(1, jobs // len(gpus))


def make_tasks(subs: list[Submission], stages: list[str], run_seed: int, root: Path) -> list[dict]:
    tasks, passes = [], passes_seed(run_seed)  # every job's timed passes: the same images (inputs.passes_seed)
    for sub in subs:
        for number in stages:
            nb = sub.notebooks.get(number)
            tasks.append({"student": sub.student, "stage": number, "notebook": str(nb) if nb else None,
                          "seed": job_seed(run_seed, sub.student, number), "passes_seed": passes,
                          "note": sub.notes.get(number, ""),
                          "where": str(sub.root or root), "searched": sub.root is not None})
    return tasks


def run_local(tasks: list[dict], workers: int, runner: Callable[[dict, dict], dict],
              on_row: Callable[[dict, dict], None] | None = None,
              waits: Callable[[dict], bool] | None = None) -> list[dict]:
    """Rows for ``tasks`` (in their order), ``workers`` at a time (several GPUs: ``--gpus``, through
    ``labkit.grading.cluster``), each free slot taking the costliest stage's next task (``backlog.Backlog``),
    passing over a task that would only wait (``waits``: its stage's reference job is running in another slot). A
    row the grader's own machinery could not finish for want of a resource (threads) is graded again at the end,
    alone."""
    rows: list = [None] * len(tasks)
    backlog = Backlog(tasks, waits)

    def one(i: int) -> None:
        rows[i] = runner(tasks[i], {})
        backlog.done(i, rows[i])
        if on_row:
            on_row(tasks[i], rows[i])

    failed: list = []

    def slot() -> None:
        while not failed:
            i = backlog.take()
            if i is None:
                return
            try:
                one(i)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller, as pool.map did
                failed.append(exc)

    if workers == 1:
        slot()  # (here, in this thread)
    else:
        threads = [threading.Thread(target=slot, name=f"labkit-grade-slot-{k}") for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    for i, row in enumerate(rows):  # nothing else runs now: what ran out of threads under load may pass alone
        if row is not None and row.get("details", {}).get("resource_error"):
            first = row["message"]
            rows[i] = runner(tasks[i], {})
            rows[i]["details"]["retried"] = f"graded again alone at the end of the run; the first try: {first}"
    return rows


# -------------------------------------------------------------------------------------------- the run


def grade(submissions: str | Path, stages: list[str] | None = None, rubric: str | Path | None = None,
          solutions: str | Path | None = None, out: str | Path = "grades", jobs: int = 1, seed: int | None = None,
          progress: bool = True, command: str | None = None, students: list[str] | None = None,
          gpus: str | None = None, cluster: str | None = None, merge: bool | None = None,
          gradescope: bool = True, sandbox: str = "auto", unsandboxed: bool = False,
          cache: str | Path | bool = True) -> dict:
    """Grade every submission for every selected stage; write ``grades.csv``, ``grades.json`` and the Gradescope
    ``results.json`` files under ``out``.

    ``students`` grades only those student folders; with it (or ``stages``) an existing report in ``out`` is
    updated: only the graded (student, stage) rows are replaced (``merge``, default: then). ``gpus`` ("all" or
    "0,2"): the shortcut to ``cluster="cuda:..."``, one dask-cuda worker per GPU, ``jobs // len(gpus)`` jobs at a
    time on each, each child pinned to its worker's GPU. ``cluster``: a Dask cluster (see
    ``labkit.grading.cluster``). ``sandbox`` (auto, bwrap, apptainer, docker): where every child runs
    (``labkit.grading.isolation``); ``unsandboxed``: none, only for code you trust. ``cache``: where the reference
    jobs of earlier runs are kept (True: the user's cache folder; a path; False: none; ``labkit.grading.refcache``).
    Returns ``{"meta": ..., "rows": [...]}``. Raises ``GradeError`` only for the grader's own problems (no sandbox
    here among them).
    """
    _check_resources(jobs, out, cache)
    simulator_if_no_driver()
    dinfo = device.info()
    rub = load_rubric(rubric)
    solutions = Path(solutions) if solutions else solutions_folder()
    if not solutions.is_dir():
        raise GradeError(f"no solutions folder at {solutions}")
    submissions = Path(submissions)
    chosen, subs, single = _submissions(submissions, stages, solutions, students)
    cluster, gpu_list, per_gpu = _gpus(cluster, gpus, jobs)
    # the cluster starts while this process makes its own checks and plans; a run refused meanwhile closes it
    starting = dask_cluster.Starting(cluster, gpu_list, per_gpu) if cluster else None
    try:
        private = {"the submissions": submissions.resolve(), "--out": Path(out).resolve(),
                   "the solutions": solutions.resolve()}
        iso, ref_cache, no_cache = _sandbox(sandbox, unsandboxed, cache, cluster, gpus, private, rub, gpu_list)
        numbers = [s.number for s in chosen]
        ctx = Context(numbers, rub, solutions, dinfo.kind == "gpu", dinfo.simulated, iso, ref_cache)
        _gpu_code_here(ctx, dinfo)
        run_seed = fresh_seed() if seed is None else int(seed)
        tasks = make_tasks(subs, numbers, run_seed, submissions)
        started = time.monotonic()
        spec = {"stages": numbers, "rubric": str(rubric) if rubric else None, "solutions": str(solutions),
                "sandbox": iso.describe(), "private": {k: str(v) for k, v in private.items()},
                "gpus": gpu_list, "per_gpu": per_gpu,
                "described": ctx.described_json()} if cluster else None  # each worker makes its context of it
        rows, where, turns = _run_tasks(ctx, tasks, subs, numbers, jobs, cluster, spec, progress, starting)
    finally:
        if starting is not None:
            starting.close()  # (nothing, where the run took it)
    run = {"dinfo": dinfo, "rub": rub, "iso": iso, "numbers": numbers, "subs": subs, "run_seed": run_seed,
           "where": where, "ctx": ctx, "solutions": solutions, "started": started, "single": single, "turns": turns,
           "jobs": jobs, "gpu_list": gpu_list, "per_gpu": per_gpu, "ref_cache": ref_cache, "no_cache": no_cache}
    report = {"meta": _meta(run, command, rows), "rows": rows}
    out = Path(out)
    if merge is None:
        merge = bool(students) or bool(stages)
    if merge and (out / "grades.json").is_file():
        report = merge_reports(out / "grades.json", report)
    write_reports(out, report, gradescope=gradescope)
    return report


def _gpu_code_here(ctx: Context, dinfo) -> None:
    """Refused in one line: stages with GPU code on a machine with neither a GPU nor the CUDA simulator."""
    if dinfo.kind != "cpu":
        return
    needs_gpu = [n for n, p in ctx.plans.items() if any(v.target == "gpu" for v in p.variants.values())]
    if needs_gpu:
        raise GradeError(f"stages {', '.join(needs_gpu)} have GPU code, and there is no GPU here and the CUDA "
                         f"simulator is off: run with NUMBA_ENABLE_CUDASIM=1, or grade on a GPU machine")


def _check_resources(jobs: int, out, cache) -> None:
    """``--jobs``, ``--out`` and ``--cache`` refused now, in one line, not after grading the class."""
    if jobs < 1:
        raise GradeError("--jobs must be at least 1")
    try:  # a folder the reports cannot go to is found now, not after grading the class
        outputs.writable_folder(out, "--out")
        if cache not in (True, False, None):
            outputs.writable_folder(cache, "--cache")
    except outputs.OutputError as exc:
        raise GradeError(str(exc)) from None
    cores = os.cpu_count() or 1
    if jobs > cores:
        raise GradeError(f"--jobs {jobs}: this machine has {cores} processor core{'s' * (cores > 1)}; more jobs than "
                         f"cores make every job slower and its time limit a matter of load: use --jobs {cores} or "
                         f"fewer (with --gpus, the jobs are spread over the GPUs)")


def _submissions(submissions: Path, stages, solutions: Path, students) -> tuple[list, list, bool]:
    """The stages chosen, the submissions (only ``students``' where named), and whether this is one submission."""
    if submissions.is_file() and not stages:
        stages = list(find_submissions(submissions, list(STAGES.values()))[0].notebooks)
    chosen = select_stages(stages, solutions)
    subs = find_submissions(submissions, chosen)
    single = submissions.is_file() or (len(subs) == 1 and subs[0].root == submissions)
    if students:
        names = {s.student for s in subs}
        unknown = [n for n in students if n not in names]
        if unknown:
            raise GradeError(f"--students: no student folder {unknown[0]!r} in {submissions}"
                             + (f" (there are {len(names)}: {', '.join(sorted(names)[:8])}"
                                f"{', ...' if len(names) > 8 else ''})" if names else ""))
        subs = [s for s in subs if s.student in students]
    return chosen, subs, single


def _gpus(cluster: str | None, gpus: str | None, jobs: int) -> tuple[str | None, list[int] | None, int]:
    """The cluster (``--gpus``: its dask-cuda form), the GPUs it uses and the jobs at a time on each, all refused
    in one line before anything runs."""
    if cluster and gpus:
        raise GradeError("--gpus and --cluster do not go together: --gpus 0,1 is --cluster cuda:0,1 (a cluster's "
                         "workers each have their own GPU)")
    gpu_list, per_gpu = None, 1
    if cluster or gpus:
        flag = "--gpus" if gpus else "--cluster cuda"
        cluster = cluster or f"cuda:{gpus.strip()}"  # --gpus: one dask-cuda worker per GPU of this machine
        asked = dask_cluster.parse(cluster)  # a typo is refused before anything runs
        if asked.kind == "cuda":
            gpu_list = parse_gpus(asked.gpus, available_gpus(), flag)
            per_gpu = jobs_per_gpu(jobs, gpu_list)
            dask_cluster.cuda_cluster_class(flag)  # no dask-cuda: one line, before any job
    return cluster, gpu_list, per_gpu


def _sandbox(sandbox: str, unsandboxed: bool, cache, cluster, gpus, private: dict, rub,
             gpu_list) -> tuple[isolation.Isolation, refcache.ReferenceCache | None, str]:
    """The sandbox every child runs in, the reference cache (or why none), each refused in one line before any
    job; ``private`` gains the cache's folder."""
    iso = isolation.choose(sandbox, unsandboxed)  # refused in one line where there is no sandbox
    ref_cache, no_cache = (None, f"{'--gpus' if gpus else '--cluster'}: each worker runs its stages' reference "
                                 f"jobs") if cluster else \
        refcache.choose(cache, unsandboxed, {k: private[k] for k in ("the submissions", "--out")})
    if ref_cache is not None:
        ref_cache.sandbox_mode = iso.mode
        private["the reference cache"] = ref_cache.folder.resolve()
    refused = sandbox_refusal(iso, private, rub.base["limits"]["memory_mb"],
                              {"CUDA_VISIBLE_DEVICES": str(gpu_list[0])} if gpu_list else None)
    if refused:
        raise GradeError(f"nothing was graded: {refused}")
    return iso, ref_cache, no_cache


def _run_tasks(ctx: Context, tasks: list[dict], subs: list, numbers: list[str], jobs: int, cluster: str | None,
               spec: dict | None, progress: bool,
               starting: "dask_cluster.Starting | None" = None) -> tuple[list[dict], str, dict]:
    """The rows of every task (here, ``jobs`` at a time, or on the cluster), where they ran and the turns."""
    from tqdm import tqdm  # plain text bar: works in a terminal and in a notebook without ipywidgets

    bar = tqdm(total=len(subs), desc="grading", unit="submission", disable=not progress, file=sys.stderr)
    left = {s.student: len(numbers) for s in subs}
    lock = threading.Lock()

    def on_row(task: dict, row: dict) -> None:
        if is_reference(task):  # a stage's reference job, in a slot of its own: no student's row
            return
        with lock:
            left[task["student"]] -= 1
            if left[task["student"]] == 0:
                bar.update()
                bar.set_postfix_str(task["student"][:20])

    tasks = reference_tasks(ctx, tasks) + tasks  # each in a slot of its own, first; they give no row
    if cluster:
        rows, where, by_worker = dask_cluster.run_on_cluster(cluster, spec, tasks, on_row,
                                                             lambda task: grade_task(ctx, task),
                                                             lambda task, why: grader_error_row(ctx, task, why),
                                                             starting)
        turns = {**merged_turns(list(by_worker.values())), "by_worker": by_worker}  # each worker's own turns
    else:
        # on a GPU, the device's timed phases get a core the grader keeps free (labkit.grading.cores)
        ctx.turns.cores = Cores(1) if ctx.gpu else None
        if ctx.turns.cores is not None:
            ctx.turns.cores.start()
        try:
            rows = run_local(tasks, jobs, lambda task, env: grade_task(ctx, task, env), on_row,
                             waits=ctx.waits_for_reference)
        finally:
            ctx.close()  # its reference partners end
            if ctx.turns.cores is not None:
                ctx.turns.cores.stop()
        where = f"this machine, {jobs} job{'s' * (jobs > 1)} at a time"
        turns = {**ctx.turns.summary(),
                 **({"cores": ctx.turns.cores.describe()} if ctx.turns.cores is not None else {})}
    bar.close()
    return [row for task, row in zip(tasks, rows) if not is_reference(task)], where, turns


def _meta(run: dict, command: str | None, rows: list[dict]) -> dict:
    """The report's ``meta``: what was graded, where, with what, and by which rules."""
    dinfo, rub, ctx, gpu_list = run["dinfo"], run["rub"], run["ctx"], run["gpu_list"]
    plans, gpu = ctx.plans, dinfo.kind == "gpu"
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(["labkit", *sys.argv[1:]]),
        "device": device.label(dinfo), "simulated": dinfo.simulated, "gpu": gpu,
        "environment": environment.describe(dinfo),
        "memory_guard": memory_guard_text(rub.base["limits"]["memory_mb"], gpu), "sandbox": run["iso"].describe(),
        "stages": run["numbers"], "students": len(run["subs"]), "seed": run["run_seed"], "graded_on": run["where"],
        "rubric": rub.to_dict(), "weights": ctx.refs.weight_sources, "solutions": str(run["solutions"]),
        "python": environment.describe(dinfo)["python"], "seconds": round(time.monotonic() - run["started"], 1),
        "timed_variants": {n: label(n, p.timed) for n, p in plans.items()},
        "time_limits": {n: ctx.limits.get(n, {"time_limit_s": round(p.time_limit)}) for n, p in plans.items()},
        "skipped_variants": {n: p.skipped for n, p in plans.items() if p.skipped},
        "batches": {n: {v: {"layers": p.layer_batches(c.target), "repeat": p.layer_batches(c.target)[0],
                            "network": p.network_batches(c.target)}
                        for v, c in p.variants.items()} for n, p in plans.items()},
        "op_time": {n: ("measured" if p.measured else f"not measured ({p.not_measured_why})")
                    for n, p in plans.items()},
        "op_time_rule": "the whole pass (every layer, until the device is idle and the pass's threads ended), "
                        "timing.repeat passes on fresh images after timing.warmup; with a partner (the stage's "
                        "solution timed pass by pass in the student's turn) the ratio is the median of the student's "
                        "pass over the partner's pass before it and each op time its median pass, otherwise the best "
                        "(minimum) pass of the student's over the reference job's; every pass in each row's details",
        "accuracy": {n: ("scored" if p.accuracy_scored else "not scored (no labelled images)")
                     for n, p in plans.items()},
        "single_submission": run["single"],
        "turns": {**run["turns"], "rule": "each timed phase ran while every other job (of its worker, on a cluster) "
                  "was stopped, and each reference job alone; time stopped or waiting never counted against a "
                  "job's limit"},
        "jobs": {"requested": run["jobs"], "cores": os.cpu_count() or 1,
                 **({"gpus": gpu_list, "per_gpu": run["per_gpu"]} if gpu_list else {})},
        "reference_jobs": dict(sorted(ctx.reference_jobs.items())),
        "reference_partners": ctx.partners(),  # (a cluster's: in turns.by_worker)
        "reference_cache": run["ref_cache"].report() if run["ref_cache"] is not None else
        refcache.not_used(run["no_cache"]),
        "phases_s": phases.totals(rows),
    }
