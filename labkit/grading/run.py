"""One ``labkit grade`` run: every submission for every selected stage, a row each, then the reports.

Everything the jobs share (the stage plans, the reference data) is made before the first child starts; a job
that fails in the grader itself becomes a ``grader-error`` row and the run goes on to the next one.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .. import device
from ..stages import STAGES, label, solutions_folder
from . import scoring
from .job import Job
from .plan import References, plan_stage
from .reports import write_reports
from .rubric import GradeError, load_rubric
from .sandbox import memory_guard_text
from .submissions import find_submissions, select_stages


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


def _missing_row(sub, stage, plan, seed: int, where: Path) -> dict:
    row = scoring.empty_row(sub.student, stage, plan)
    row.update(status="missing", seed=seed, message=f"missing stage: no {stage.notebook} in {where}"
               + (" (looked in notebooks/ and every folder below)" if sub.root else ""))
    return row


def grade(submissions: str | Path, stages: list[str] | None = None, rubric: str | Path | None = None,
          solutions: str | Path | None = None, out: str | Path = "grades", jobs: int = 1, seed: int | None = None,
          progress: bool = True, command: str | None = None) -> dict:
    """Grade every submission for every selected stage; write ``grades.csv`` and ``grades.json`` under ``out``.

    Returns ``{"meta": ..., "rows": [...]}``. Raises ``GradeError`` only for the grader's own problems.
    """
    from tqdm import tqdm  # plain text bar: works in a terminal and in a notebook without ipywidgets

    simulator_if_no_driver()
    dinfo = device.info()
    gpu, simulated = dinfo.kind == "gpu", dinfo.simulated
    rub = load_rubric(rubric)
    solutions = Path(solutions) if solutions else solutions_folder()
    if not solutions.is_dir():
        raise GradeError(f"no solutions folder at {solutions}")
    submissions = Path(submissions)
    if submissions.is_file() and not stages:
        stages = list(find_submissions(submissions, list(STAGES.values()))[0].notebooks)
    chosen = select_stages(stages, solutions)
    subs = find_submissions(submissions, chosen)
    if jobs < 1:
        raise GradeError("--jobs must be at least 1")
    plans = {s.number: plan_stage(s, solutions, rub, gpu, simulated) for s in chosen}
    if dinfo.kind == "cpu":
        needs_gpu = [n for n, p in plans.items() if any(c["target"] == "gpu" for c in p.contract.values())]
        if needs_gpu:
            raise GradeError(f"stages {', '.join(needs_gpu)} have GPU code, and there is no GPU here and the CUDA "
                             f"simulator is off: run with NUMBA_ENABLE_CUDASIM=1, or grade on a GPU machine")
    refs = References()
    for plan in plans.values():  # the reference data every job shares, prepared before any child starts
        refs.prepare(plan)
    run_seed = int(np.random.SeedSequence(seed).entropy % (2 ** 63)) if seed is None else int(seed)
    seeds = np.random.SeedSequence(run_seed).generate_state(len(subs) * len(chosen) + 1, dtype=np.uint32)
    tasks = [(i, sub, stage, int(seeds[i * len(chosen) + j]))
             for i, sub in enumerate(subs) for j, stage in enumerate(chosen)]
    rows: dict[tuple[int, str], dict] = {}
    left = {i: len(chosen) for i in range(len(subs))}
    bar = tqdm(total=len(subs), desc="grading", unit="submission", disable=not progress, file=sys.stderr)
    lock = threading.Lock()

    def one(task) -> None:
        i, sub, stage, job_seed = task
        plan = plans[stage.number]
        nb = sub.notebooks.get(stage.number)
        if nb is None:
            row = _missing_row(sub, stage, plan, job_seed, sub.root or submissions)
        else:
            job = Job(plan, refs, sub.student, nb, job_seed, gpu)
            try:
                job.run()
                row = job.row()
            except Exception as exc:  # noqa: BLE001 - the grader's own failure for one job: record it, go on
                row = scoring.empty_row(sub.student, stage, plan)
                row.update(status="grader-error", notebook=str(nb), seed=job_seed,
                           message=f"grader error: {type(exc).__name__}: {exc}",
                           details={"traceback": traceback.format_exc(limit=8)})
            if sub.notes.get(stage.number):
                row["message"] += f" [{sub.notes[stage.number]}]"
        with lock:
            rows[(i, stage.number)] = row
            left[i] -= 1
            if left[i] == 0:
                bar.update()
                bar.set_postfix_str(sub.student[:20])

    started = time.monotonic()
    if jobs == 1:
        for task in tasks:
            one(task)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, tasks))
    bar.close()
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(["labkit", *sys.argv[1:]]),
        "device": device.label(dinfo), "simulated": simulated, "gpu": gpu,
        "memory_guard": memory_guard_text(rub.base["limits"]["memory_mb"], gpu),
        "stages": [s.number for s in chosen], "students": len(subs), "seed": run_seed,
        "rubric": rub.to_dict(), "weights": refs.weight_sources, "solutions": str(solutions),
        "python": platform.python_version(), "seconds": round(time.monotonic() - started, 1),
        "timed_variants": {n: label(n, p.timed) for n, p in plans.items()},
        "batches": {n: {v: {"layers": p.layer_batches(c["target"]), "network": p.network_batches(c["target"])}
                        for v, c in p.contract.items()} for n, p in plans.items()},
        "op_time": {n: ("measured" if p.measured else f"not measured ({p.not_measured_why})")
                    for n, p in plans.items()},
        "accuracy": {n: ("scored" if p.accuracy_scored else "not scored (no labelled images)")
                     for n, p in plans.items()},
    }
    report = {"meta": meta, "rows": [rows[(i, s.number)] for i in range(len(subs)) for s in chosen]}
    write_reports(Path(out), report)
    return report
