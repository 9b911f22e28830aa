"""Grading a class on a cluster, through Dask: ``--cluster local[:N]``, ``slurm:N`` (dask-jobqueue), or the address of
a Dask scheduler that is already running (docs/grading.md, "A class on a cluster").

Every (student, stage) is one task. A worker makes the run's context once (the stage plans and the reference data,
as the parent does) and grades tasks exactly as a single machine does: the same child, limits and checks, and the
same inputs, because a job's seed comes from the run seed and the names (``run.job_seed``). Rows come back to the
parent as they finish (the progress bar follows them) and are put in the single machine's order: the merged report
is the single machine's, up to the measured times.

The submissions, the solutions and the rubric must be readable by the workers at the same paths (a shared file
system, as on any Slurm cluster; a LocalCluster shares this machine's).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from .rubric import GradeError

#: dask-jobqueue's cluster classes, by the name --cluster takes
JOBQUEUE = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster",
            "htcondor": "HTCondorCluster", "oar": "OARCluster", "moab": "MoabCluster"}

_contexts: dict = {}
_lock = threading.Lock()


def parse(spec: str) -> tuple[str, int | None, str | None]:
    """``local``, ``local:4``, ``slurm:20``, ``tcp://host:8786`` -> (kind, workers, address)."""
    spec = (spec or "").strip()
    if "://" in spec:
        return "address", None, spec
    kind, _, count = spec.partition(":")
    kind = kind.lower()
    if kind != "local" and kind not in JOBQUEUE:
        raise GradeError(f"--cluster takes local[:N], {'|'.join(JOBQUEUE)}:N or a scheduler address "
                         f"(tcp://host:8786), not {spec!r}")
    workers = None
    if count:
        if not count.isdigit() or int(count) < 1:
            raise GradeError(f"--cluster {spec}: the number of workers must be a whole number of at least 1")
        workers = int(count)
    if kind in JOBQUEUE and workers is None:
        raise GradeError(f"--cluster {kind} needs the number of jobs to start, e.g. --cluster {kind}:20")
    return kind, workers, None


def connect(spec: str):
    """(client, cluster or None, description)."""
    kind, workers, address = parse(spec)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise GradeError("--cluster needs Dask: pip install 'labkit[cluster]' (distributed, dask-jobqueue)") from None
    if kind == "address":
        try:
            client = Client(address, timeout="30s")
        except OSError as exc:
            raise GradeError(f"--cluster {address}: no Dask scheduler answers there ({exc})") from None
        n = len(client.scheduler_info().get("workers", {}))
        return client, None, f"the Dask scheduler at {address} ({n} workers)"
    if kind == "local":
        n = workers or os.cpu_count() or 1
        # one thread per worker process: a worker grades one submission at a time, like --jobs 1 does
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=40)
        return Client(cluster), cluster, f"a Dask LocalCluster of {n} worker process{'es' * (n > 1)}"
    try:
        import dask_jobqueue
    except ImportError:
        raise GradeError(f"--cluster {kind} needs dask-jobqueue: pip install 'labkit[cluster]'") from None
    cls = getattr(dask_jobqueue, JOBQUEUE[kind])
    try:
        cluster = cls()  # queue, cores, memory, walltime, GPUs: from Dask's jobqueue configuration
    except Exception as exc:  # noqa: BLE001 - a missing or wrong jobqueue configuration, said in one line
        raise GradeError(f"--cluster {kind}: dask-jobqueue could not make a {JOBQUEUE[kind]} ({type(exc).__name__}: "
                         f"{exc}); configure it in ~/.config/dask/jobqueue.yaml (see docs/grading.md)") from None
    cluster.scale(jobs=workers)
    return Client(cluster), cluster, f"{workers} {kind} job{'s' * (workers > 1)} through dask-jobqueue"


def _context(spec: dict):
    """The run's context in this worker process, made once."""
    key = (tuple(spec["stages"]), spec["rubric"], spec["solutions"])
    with _lock:
        if key not in _contexts:
            from .. import device
            from .isolation import by_mode  # the run's sandbox, on this worker's machine too
            from .run import Context, simulator_if_no_driver
            from .rubric import load_rubric

            from .run import sandbox_refusal

            simulator_if_no_driver()
            info = device.info()
            rubric, iso = load_rubric(spec["rubric"]), by_mode(spec.get("sandbox"))
            refused = sandbox_refusal(iso, spec.get("private") or {}, rubric.base["limits"]["memory_mb"])
            if refused:  # every task of this worker fails with it: its rows say why
                raise GradeError(f"this worker ({os.uname().nodename}) cannot grade: {refused}")
            _contexts[key] = Context(list(spec["stages"]), rubric, Path(spec["solutions"]), info.kind == "gpu",
                                     info.simulated, iso)
        return _contexts[key]


def grade_remote(spec: dict, task: dict) -> dict:
    """One (student, stage) on a cluster worker (a Dask task)."""
    from .run import grade_task

    row = grade_task(_context(spec), task)
    row["details"]["worker"] = f"{os.uname().nodename}:{os.getpid()}"
    return row


def run_on_cluster(spec_str: str, spec: dict, tasks: list[dict], on_row: Callable[[dict, dict], None],
                   local: Callable[[dict], dict], failed: Callable[[dict, str], dict]) -> tuple[list[dict], str]:
    """Rows for ``tasks`` in their order; a task without a notebook (missing stage) is answered by ``local``, a
    task whose worker was lost by ``failed(task, why)``."""
    from distributed import as_completed

    spec = {**spec, "rubric": str(Path(spec["rubric"]).resolve()) if spec["rubric"] else None,
            "solutions": str(Path(spec["solutions"]).resolve())}
    client, cluster, where = connect(spec_str)
    rows: list = [None] * len(tasks)
    try:
        futures = {}
        for i, task in enumerate(tasks):
            if task["notebook"] is None:
                rows[i] = local(task)
                on_row(task, rows[i])
                continue
            remote = {**task, "path": str(Path(task["notebook"]).resolve())}
            futures[client.submit(grade_remote, spec, remote, pure=False,
                                  key=f"grade-{i}-{task['stage']}-{abs(hash(task['student'])) % 10 ** 8}")] = i
        for future in as_completed(list(futures)):
            i = futures[future]
            try:
                rows[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker lost (killed, out of memory): the row says so
                rows[i] = failed(tasks[i], f"the cluster worker failed: {type(exc).__name__}: {exc}")
            on_row(tasks[i], rows[i])
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return rows, where
