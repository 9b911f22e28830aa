"""Grading a class on a cluster, through Dask: ``--cluster local[:N]``, ``cuda[:0,1]`` (this machine's GPUs, one
dask-cuda worker each; ``--gpus`` is its shortcut), ``slurm:N`` (dask-jobqueue), or the address of a Dask scheduler
that is already running (docs/grading.md, "A class on a cluster", "Several GPUs").

Every (student, stage) is one task. A worker makes the run's context once (the stage plans and the reference data,
as the parent does) and grades tasks exactly as a single machine does: the same child, limits and checks, and the
same inputs, because a job's seed comes from the run seed and the names (``run.job_seed``). Rows come back to the
parent as they finish (the progress bar follows them) and are put in the single machine's order: the merged report
is the single machine's, up to the measured times.

On a dask-cuda worker (``LocalCUDACluster``: one worker process per GPU, its ``CUDA_VISIBLE_DEVICES`` starting with
its own GPU) every job's child is pinned to that GPU, and the worker's context, made once, holds that GPU's partners
and its turns (``labkit.grading.turns``): a timed phase stops every other job of the worker, so no other job's work
runs on its device; the workers of other GPUs run on. A stage's reference job runs once for all the workers where a
partner times the reference on each GPU (``labkit.grading.shared_reference``), else once on each GPU.

The submissions, the solutions and the rubric must be readable by the workers at the same paths (a shared file
system, as on any Slurm cluster; a LocalCluster shares this machine's).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..launch import device
from . import context
from .backlog import Backlog
from .cores import Cores
from .isolation import by_mode
from .rubric import GradeError, load_rubric
from .shared_reference import SharedReferences, run_key
from .turns import merged

#: dask-jobqueue's cluster classes, by the name --cluster takes
JOBQUEUE = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster",
            "htcondor": "HTCondorCluster", "oar": "OARCluster", "moab": "MoabCluster"}

START_S = 120  # seconds a local cluster's workers may take to start

_contexts: dict = {}
_lock = threading.Lock()


#: what ``--gpus`` and ``--cluster cuda`` need, in the words of the refusal when it is not there
DASK_CUDA = ("pip install 'labkit[cluster]' (dask-cuda, on Linux with Python 3.11 or later; it brings the dask and "
             "distributed it was made with)")


class Spec(NamedTuple):
    """What ``--cluster`` asked for: ``kind`` (local, cuda, address, or a dask-jobqueue name), the number of
    ``workers`` (local, jobqueue), the scheduler's ``address``, the ``gpus`` of a cuda cluster ("all" or "0,2")."""
    kind: str
    workers: int | None = None
    address: str | None = None
    gpus: str | None = None


def parse(spec: str) -> Spec:
    """``local``, ``local:4``, ``cuda``, ``cuda:0,1``, ``slurm:20``, ``tcp://host:8786``."""
    spec = (spec or "").strip()
    if "://" in spec:
        return Spec("address", address=spec)
    kind, colon, count = spec.partition(":")
    kind = kind.lower()
    if kind == "cuda":
        if colon and not count.strip():
            raise GradeError(f"--cluster {spec} names no GPU: give them (cuda:0,1), or write cuda alone for every GPU")
        return Spec("cuda", gpus=count.strip() or "all")
    if kind != "local" and kind not in JOBQUEUE:
        raise GradeError(f"--cluster takes local[:N], cuda[:0,1], {'|'.join(JOBQUEUE)}:N or a scheduler address "
                         f"(tcp://host:8786), not {spec!r}")
    workers = None
    if count:
        if not count.isdigit() or int(count) < 1:
            raise GradeError(f"--cluster {spec}: the number of workers must be a whole number of at least 1")
        workers = int(count)
    if kind in JOBQUEUE and workers is None:
        raise GradeError(f"--cluster {kind} needs the number of jobs to start, e.g. --cluster {kind}:20")
    return Spec(kind, workers)


def cuda_cluster_class(flag: str = "--gpus"):
    """dask-cuda's ``LocalCUDACluster``, or the grader's one-line refusal where it cannot be imported (checked
    before any job: ``--gpus`` has no other way to run)."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as exc:
        raise GradeError(f"{flag} grades through dask-cuda (one Dask worker per GPU), which cannot be imported here "
                         f"({exc}): {DASK_CUDA}") from None
    return LocalCUDACluster


def worker_gpu() -> str | None:
    """This dask-cuda worker's GPU: the first of the CUDA_VISIBLE_DEVICES it was started with (dask-cuda rotates the
    list so that each worker's own GPU comes first); None where it has none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or None


def _close(*made) -> None:
    """Close each of a run's Dask client and cluster that exists, one already broken or not."""
    for thing in made:
        if thing is not None:
            try:
                thing.close()
            except Exception:  # noqa: BLE001 - already broken
                pass


def _started(make: Callable, workers: int, failure: str):
    """(client, cluster) once ``workers`` workers of the cluster ``make()`` makes are up; a cluster whose workers do
    not start (within ``START_S``) is closed and refused in one line, where the run would wait for them forever."""
    from distributed import Client

    cluster = client = None
    try:
        cluster = make()
        client = Client(cluster)
        client.wait_for_workers(workers, timeout=START_S)
        return client, cluster
    except Exception as exc:  # noqa: BLE001 - NVML, a worker that failed its start, a timeout: one line
        _close(client, cluster)
        raise GradeError(f"{failure} ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from None


def connect(spec: str, gpus: list[int] | None = None, per_gpu: int = 1):
    """(client, cluster or None, description); ``gpus`` and ``per_gpu`` (jobs at a time on each) for ``cuda``."""
    kind, workers, address, _ = parse(spec)
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise GradeError("--cluster needs Dask: pip install 'labkit[cluster]' (distributed, dask-jobqueue)") from None
    if kind == "cuda":
        LocalCUDACluster = cuda_cluster_class("--cluster cuda")
        where = f"GPU{'s' * (len(gpus) > 1)} {', '.join(map(str, gpus))}"
        # one worker process per GPU (its children see that GPU alone), per_gpu jobs at a time in it
        client, cluster = _started(lambda: LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(gpus), n_workers=len(gpus),
                                                            threads_per_worker=per_gpu, dashboard_address=None,
                                                            silence_logs=40),
                                   len(gpus), f"dask-cuda could not start a worker on each of {where}")
        return client, cluster, (f"this machine's {where} through dask-cuda (a LocalCUDACluster: one worker per GPU, "
                                 f"{per_gpu} job{'s' * (per_gpu > 1)} at a time on each)")
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
        client, cluster = _started(lambda: LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                        dashboard_address=None, silence_logs=40),
                                   n, f"--cluster local:{n}: Dask could not start {n} worker processes")
        return client, cluster, f"a Dask LocalCluster of {n} worker process{'es' * (n > 1)}"
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


class Starting:
    """``connect(spec, gpus, per_gpu)`` in a thread of its own, begun before the parent's own checks and plans (its
    probe child, the child that describes the stages, the reference data: 7.5 s of a class's wall on an H200 pair,
    then the cluster's start and its workers' contexts, 8 s more, one after the other). ``result()`` waits for it
    (its failure is raised there); ``close()`` ends a cluster the run never used (the run was refused meanwhile)."""

    def __init__(self, spec: str, gpus: list[int] | None = None, per_gpu: int = 1):
        self._box: dict = {}
        self._taken = False
        self._thread = threading.Thread(target=self._start, args=(spec, gpus, per_gpu), daemon=True,
                                        name="labkit-cluster-start")
        self._thread.start()

    def _start(self, spec: str, gpus, per_gpu: int) -> None:
        try:
            self._box["made"] = connect(spec, gpus, per_gpu)
        except BaseException as exc:  # noqa: BLE001 - raised in result()
            self._box["error"] = exc

    def result(self):
        """(client, cluster or None, description), as ``connect`` gives them; the caller now closes them."""
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        self._taken = True
        return self._box["made"]

    def close(self) -> None:
        """End the cluster if nobody took it (waits for its start first)."""
        self._thread.join()
        if self._taken or "made" not in self._box:
            return
        client, cluster, _ = self._box["made"]
        _close(client, cluster)


def _env(spec: dict) -> dict:
    """What every child of this worker gets: its GPU, on a dask-cuda worker."""
    gpu = worker_gpu() if spec.get("gpus") else None
    return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}


def _context(spec: dict):
    """The run's context in this worker process, made once: the plans, the reference data, and (on a GPU) this
    worker's reference jobs and turns."""
    key = (tuple(spec["stages"]), spec["rubric"], spec["solutions"])
    with _lock:
        if key not in _contexts:
            context.simulator_if_no_driver()
            info = device.info()
            rubric, iso = load_rubric(spec["rubric"]), by_mode(spec.get("sandbox"))  # the run's sandbox, here too
            refused = context.sandbox_refusal(iso, spec.get("private") or {}, rubric.base["limits"]["memory_mb"],
                                      _env(spec) or None)
            if refused:  # every task of this worker fails with it: its rows say why
                raise GradeError(f"this worker ({os.uname().nodename}) cannot grade: {refused}")
            ctx = context.Context(list(spec["stages"]), rubric, Path(spec["solutions"]), info.kind == "gpu", info.simulated,
                          iso, described=spec.get("described"))
            if info.kind == "gpu" and worker_gpu() is not None and spec.get("gpus"):
                ctx.turns.cores = kept_core(spec["gpus"])
            _contexts[key] = ctx
        ctx = _contexts[key]
        if spec.get("run") and (ctx.shared is None or ctx.shared.run != spec["run"]):
            # a stage's reference job once for this run's workers, where no score hangs on its GPU (a worker of a
            # long-lived scheduler keeps its context from run to run; the run's key is this run's)
            gpu = worker_gpu() if spec.get("gpus") else None
            ctx.shared = SharedReferences(spec["run"], f"gpu{gpu}" if gpu is not None else
                                          f"{os.uname().nodename}:{os.getpid()}")
        return ctx


def kept_core(gpus: list) -> "Cores":
    """This dask-cuda worker's share of the cores kept free for timed phases (``labkit.grading.cores``): every worker
    reckons the same ones, one per GPU of the run, from the cores it may use (dask-cuda gives each the cores nearest
    its GPU), keeps them all free of its threads and children, and times on the one at its GPU's place."""
    names = [str(g) for g in gpus]
    cores = Cores(len(names)).share(names.index(worker_gpu()) if worker_gpu() in names else len(names))
    cores.start()  # for the worker's life: it ends with the run
    return cores


def worker_summary() -> dict:
    """This worker for the report's ``meta.turns.by_worker``: where it ran (host, pid, GPU, the cores it may use),
    its turns and the time limits its reference jobs set, over every context it made."""
    with _lock:
        summary = merged([ctx.turns.summary() for ctx in _contexts.values()])
        limits = {stage: lim for ctx in _contexts.values() for stage, lim in ctx.limits.items()}
        kept = next((ctx.turns.cores for ctx in _contexts.values() if getattr(ctx.turns, "cores", None)), None)
        partners = {k: v for ctx in _contexts.values() for k, v in ctx.partners().items()}
        references = {k: v for ctx in _contexts.values() for k, v in ctx.reference_jobs.items()}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": os.uname().nodename, "pid": os.getpid(), "gpu": worker_gpu(), "cpus": cpus, **summary,
            "time_limits": limits, "reference_jobs": references, **({"cores": kept.describe()} if kept else {}),
            **({"reference_partners": partners} if partners else {})}


def close_partners() -> None:
    """The run is over: this worker's reference partners end (``labkit.grading.partner``)."""
    with _lock:
        contexts = list(_contexts.values())
    for ctx in contexts:
        ctx.close()


def grade_remote(spec: dict, task: dict) -> dict:
    """One (student, stage) on a cluster worker (a Dask task)."""
    row = context.grade_task(_context(spec), task, _env(spec))
    row["details"]["worker"] = f"{os.uname().nodename}:{os.getpid()}"
    return row


def in_slots(tasks: list[dict], slots: int, submit: Callable, finished: Callable[[int, object], dict]) -> None:
    """Every task on the cluster, as many at a time as its workers have slots, each freed slot given the costliest
    stage's next task (``backlog.Backlog``): ``submit(k)`` is task k's future, ``finished(k, future)`` its row."""
    from distributed import as_completed

    backlog = Backlog(tasks)
    futures, done = {}, as_completed()

    def more() -> None:
        k = backlog.take()
        if k is not None:
            future = submit(k)
            futures[future] = k
            done.add(future)

    for _ in range(slots):
        more()
    for future in done:
        k = futures.pop(future)
        backlog.done(k, finished(k, future))
        more()


def run_on_cluster(spec_str: str, spec: dict, tasks: list[dict], on_row: Callable[[dict, dict], None],
                   local: Callable[[dict], dict], failed: Callable[[dict, str], dict],
                   starting: Starting | None = None) -> tuple[list[dict], str, dict]:
    """Rows for ``tasks`` in their order; a task without a notebook (missing stage) is answered by ``local``, a
    task whose worker was lost by ``failed(task, why)``. A row the grader's machinery could not finish for want of
    a resource (threads) is graded again at the end, alone on the cluster, as ``run.run_local`` does. Also returns
    the description of the cluster and each worker's turns (``worker_summary``: {worker address: summary})."""
    spec = {**spec, "rubric": str(Path(spec["rubric"]).resolve()) if spec["rubric"] else None,
            "solutions": str(Path(spec["solutions"]).resolve()), "run": uuid.uuid4().hex}
    client, cluster, where = starting.result() if starting is not None else \
        connect(spec_str, spec.get("gpus"), spec.get("per_gpu", 1))
    rows: list = [None] * len(tasks)

    def submit(i: int, attempt: int = 0):
        remote = {**tasks[i], "path": str(Path(tasks[i]["notebook"]).resolve())}
        return client.submit(grade_remote, spec, remote, pure=False,
                             key=f"grade-{i}-{tasks[i]['stage']}-{abs(hash(tasks[i]['student'])) % 10 ** 8}-{attempt}")

    def result(i: int, future) -> dict:
        try:
            return future.result()
        except Exception as exc:  # noqa: BLE001 - a worker lost (killed, out of memory): the row says so
            return failed(tasks[i], f"the cluster worker failed: {type(exc).__name__}: {exc}")

    try:
        for i, task in enumerate(tasks):
            if task["notebook"] is None:
                rows[i] = local(task)
                on_row(task, rows[i])
        index = [i for i, t in enumerate(tasks) if t["notebook"] is not None]

        def finished(k: int, future) -> dict:
            i = index[k]
            rows[i] = result(i, future)
            if not rows[i].get("details", {}).get("resource_error"):
                on_row(tasks[i], rows[i])
            return rows[i]

        in_slots([tasks[i] for i in index], max(1, sum(client.nthreads().values())),
                 lambda k: submit(index[k]), finished)
        for i, row in enumerate(rows):  # nothing else runs now: what ran out of threads under load may pass alone
            if row is not None and row.get("details", {}).get("resource_error"):
                rows[i] = result(i, submit(i, 1))
                rows[i]["details"]["retried"] = f"graded again alone at the end of the run; the first try: " \
                                                f"{row['message']}"
                on_row(tasks[i], rows[i])
        try:
            client.run(close_partners)
            by_worker = client.run(worker_summary)
            client.set_metadata(run_key(spec["run"]), {})  # the run's shared reference jobs
        except Exception:  # noqa: BLE001 - a worker gone by now: its turns are not known, its rows are there
            by_worker = {}
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return rows, where, by_worker
