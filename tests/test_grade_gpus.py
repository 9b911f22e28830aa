"""Several GPUs through Dask (docs/grading.md, "Several GPUs"): ``--gpus 0,1|all`` is ``--cluster cuda[:0,1]``, a
dask-cuda ``LocalCUDACluster`` of one worker per GPU, ``--jobs N // G`` jobs at a time in each; every child of a
worker is pinned to the worker's GPU, and the worker's context (reference jobs, turns) is made once.

The CPU-side tests run everywhere: without a GPU, ``tests/fake_dask_cuda.py`` stands in for dask-cuda (its arguments,
its worker processes and their CUDA_VISIBLE_DEVICES). The class graded on every GPU through the real dask-cuda needs
``LABKIT_TEST_GPU=1``, a GPU and dask-cuda (``pip install 'labkit[cluster]'``); CI has none of them.
``tests/test_grade.py::test_the_gpu_path_gives_the_single_machine_report`` grades part of its class on two fake GPUs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("distributed")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_dask_cuda  # noqa: E402 - after the skip: it is a distributed.LocalCluster

from labkit import device, grading  # noqa: E402
from labkit.cli import main  # noqa: E402
from labkit.grading import cluster, context, environment, run  # noqa: E402
from labkit.grading.rubric import GradeError  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ON_GPU = os.environ.get("LABKIT_TEST_GPU") == "1"


# ------------------------------------------------------------------------------------------- arguments


def test_gpus_and_cuda_clusters_are_read_before_any_job():
    assert cluster.parse("cuda") == cluster.Spec("cuda", gpus="all")
    assert cluster.parse("CUDA:0,1") == cluster.Spec("cuda", gpus="0,1")
    assert cluster.parse("local:3") == cluster.Spec("local", 3)
    assert cluster.parse("slurm:20") == cluster.Spec("slurm", 20)
    assert cluster.parse("tcp://host:8786") == cluster.Spec("address", address="tcp://host:8786")
    with pytest.raises(GradeError, match=r"--cluster cuda: names no GPU: give them \(cuda:0,1\), or write cuda alone"):
        cluster.parse("cuda:")
    with pytest.raises(GradeError, match=r"--cluster takes local\[:N\], cuda\[:0,1\]"):
        cluster.parse("gpu:0")
    assert grading.parse_gpus("all", [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert grading.parse_gpus("0,2", [0, 1, 2, 3]) == [0, 2]
    for spec, words in (("5", "--gpus: no GPU 5 here"), ("0,0", "--gpus names a GPU twice"),
                        ("x", "--gpus takes 'all' or GPU indices")):
        with pytest.raises(GradeError, match=words):
            grading.parse_gpus(spec, [0, 1, 2, 3])
    with pytest.raises(GradeError, match="--cluster cuda: no GPU 7 here"):
        grading.parse_gpus("7", [0, 1], "--cluster cuda")
    with pytest.raises(GradeError, match="there is no GPU here"):
        grading.parse_gpus("all", [])


def test_jobs_are_spread_over_the_gpus_never_more_than_asked():
    assert run.jobs_per_gpu(8, [0, 1]) == 4
    assert run.jobs_per_gpu(5, [0, 1]) == 2  # 4 at a time: a worker's threads are all alike
    assert run.jobs_per_gpu(1, [0, 1, 2]) == 1  # --gpus all: one job per GPU at least


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    """This machine as the grader sees it with two GPUs (none is touched), and one student's folder."""
    monkeypatch.setattr(run, "available_gpus", lambda: [0, 1])
    started = []
    monkeypatch.setattr(run, "Context", lambda *a, **k: started.append(a) or pytest.fail("a job's context was made"))
    (tmp_path / "subs" / "ann" / "notebooks").mkdir(parents=True)
    return started


@pytest.mark.parametrize("args, flag", [(["--gpus", "all"], "--gpus"), (["--gpus", "1"], "--gpus"),
                                        (["--cluster", "cuda:0,1"], "--cluster cuda")])
def test_without_dask_cuda_gpus_are_refused_in_one_line_before_any_job(two_gpus, tmp_path, monkeypatch, args, flag):
    monkeypatch.setitem(sys.modules, "dask_cuda", None)  # `import dask_cuda` fails as where it is not installed
    result = CliRunner().invoke(main, ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "o"), *args,
                                       "--unsandboxed"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith(f"Error: {flag} grades through dask-cuda (one Dask worker per GPU), which cannot be "
                               f"imported here"), lines[0]
    assert "pip install 'labkit[cluster]'" in lines[0]
    assert not two_gpus and not (tmp_path / "o").exists()


def test_gpus_that_are_not_here_are_refused_before_dask_cuda_is_asked(two_gpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_cuda", None)
    for args, words in ((["--gpus", "2"], "--gpus: no GPU 2 here; this machine has GPU 0, 1"),
                        (["--cluster", "cuda:0,5"], "--cluster cuda: no GPU 5 here"),
                        (["--gpus", "0", "--cluster", "local:2"], "--gpus 0,1 is --cluster cuda:0,1")):
        result = CliRunner().invoke(main, ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "o"), *args,
                                           "--unsandboxed"])
        assert result.exit_code == 1 and words in result.output and "dask-cuda" not in result.output, result.output


def test_the_refusal_names_the_extra_that_installs_dask_cuda():
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "'labkit[cluster]'" in cluster.DASK_CUDA
    cuda = [r for r in extra["cluster"] if r.startswith("dask-cuda")]
    assert cuda and "sys_platform == 'linux'" in cuda[0], extra["cluster"]  # dask-cuda is Linux only
    assert not any(r.startswith("dask-cuda") for r in extra["dev"]), "CI installs dev: no GPU stack there"


# ------------------------------------------------------------------------------- workers and their GPUs


def test_one_dask_cuda_worker_per_gpu_with_the_jobs_per_gpu_as_its_threads(monkeypatch):
    made = fake_dask_cuda.install(monkeypatch)
    client, dask_cluster, where = cluster.connect("cuda:0,1", [0, 1], 3)
    try:
        assert [{k: m[k] for k in ("CUDA_VISIBLE_DEVICES", "n_workers", "threads_per_worker")} for m in made] == \
            [{"CUDA_VISIBLE_DEVICES": [0, 1], "n_workers": 2, "threads_per_worker": 3}]
        assert sorted(client.run(cluster.worker_gpu).values()) == ["0", "1"]  # each worker its own GPU first
        assert sorted(client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"]).values()) == ["0,1", "1,0"]
        assert set(client.nthreads().values()) == {3}
        assert where == ("this machine's GPUs 0, 1 through dask-cuda (a LocalCUDACluster: one worker per GPU, 3 jobs "
                         "at a time on each)")
    finally:
        client.close()
        dask_cluster.close()


def test_a_dask_cuda_worker_pins_every_child_to_its_own_gpu(monkeypatch):
    seen = []
    monkeypatch.setattr(cluster, "_context", lambda spec: "this worker's context")
    monkeypatch.setattr(context, "grade_task", lambda ctx, task, env=None: seen.append((ctx, env)) or {"details": {}})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0,1,2")  # dask-cuda's worker for GPU 3
    row = cluster.grade_remote({"gpus": [0, 1, 2, 3]}, {"student": "ann"})
    assert seen == [("this worker's context", {"CUDA_VISIBLE_DEVICES": "3"})]
    assert row["details"]["worker"] == f"{os.uname().nodename}:{os.getpid()}"
    cluster.grade_remote({"gpus": None}, {"student": "ann"})  # a LocalCluster's worker: the machine's GPU as it is
    assert seen[-1] == ("this worker's context", {})


def test_a_workers_context_and_its_turns_are_made_once_for_all_its_jobs(monkeypatch):
    """Jobs of one worker (one GPU) share its context: its reference jobs, and its turns, so a timed phase stops
    every other job on that GPU."""
    made = []

    class Context:
        def __init__(self, *args, **kw):
            made.append((args, kw))
            self.turns, self.limits, self.reference_jobs, self.shared = run.Turns(), {}, {"01 gpu1": {"seconds": 1}}, None

        def partners(self):
            return {"01 gpu1": {"starts": 1}}

    monkeypatch.setattr(context, "Context", Context)  # a worker's context is made in labkit.grading.context
    monkeypatch.setattr(context, "sandbox_refusal", lambda *a: "")
    monkeypatch.setattr(cluster, "_contexts", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    spec = {"stages": ["01"], "rubric": None, "solutions": str(REPO / "solutions"), "sandbox": {"mode": "none"},
            "gpus": [0, 1], "described": {"01": {"variants": {}, "order": []}}}
    got = []
    threads = [threading.Thread(target=lambda: got.append(cluster._context(spec))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 1 and len(got) == 4 and all(c is got[0] for c in got)
    assert made[0][1]["described"] is spec["described"]  # planned from the parent's: no child of its own asked
    here = cluster.worker_summary()
    assert here["gpu"] == "1" and here["turns"] == 0 and here["pid"] == os.getpid() and here["time_limits"] == {}
    assert here["reference_partners"] == {"01 gpu1": {"starts": 1}}  # the report says what each worker's did
    assert here["reference_jobs"] == {"01 gpu1": {"seconds": 1}}
    # a run's key for its shared reference jobs, this run's even where the worker outlives a run (a long-lived
    # scheduler): the context is not made again
    for run_id in ("run-a", "run-b"):
        ctx = cluster._context({**spec, "run": run_id})
        assert ctx is got[0] and ctx.shared.run == run_id and ctx.shared.label == "gpu1"
    assert len(made) == 1


def test_each_dask_cuda_worker_times_on_a_kept_core_of_its_own(monkeypatch):
    """Two workers on one machine reckon the same kept cores (one per GPU), keep both free of their threads and
    children, and each times on the one at its GPU's place: their timed phases, which may overlap, never share one."""
    from labkit.grading import cores

    monkeypatch.setattr(cores, "_allowed", lambda: list(range(8)))
    monkeypatch.setattr(cores.Cores, "start", lambda self: None)  # (moving this test's threads is not the point)
    kept = {}
    for visible in ("0,1", "1,0"):  # dask-cuda's two workers
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        kept[visible[0]] = cluster.kept_core([0, 1])
    first, second = kept["0"], kept["1"]
    assert first.reserved == second.reserved and len(first.reserved) == 2
    assert {first.mine, second.mine} == set(first.reserved)
    assert first.take() == first.mine and first.take() is None  # only its own
    assert not set(first.reserved) & (first.others | second.others)  # no worker's threads on either kept core
    assert second.describe()["mine"] == second.mine


def test_a_cluster_whose_workers_do_not_start_is_refused_in_one_line(monkeypatch):
    from distributed import LocalCluster

    monkeypatch.setattr(cluster, "START_S", 0.5)
    with pytest.raises(GradeError, match=r"^dask-cuda could not start a worker on each of GPUs 0, 1 "
                                         r"\(\w*Timeout\w*: Only 0/2"):
        cluster._started(lambda: LocalCluster(n_workers=0, processes=False, dashboard_address=None), 2,
                         "dask-cuda could not start a worker on each of GPUs 0, 1")

    class Refusing(fake_dask_cuda.LocalCUDACluster):
        def __init__(self, **kw):
            raise ValueError("Can not scale beyond visible devices")

    fake_dask_cuda.install(monkeypatch).clear()
    monkeypatch.setattr(sys.modules["dask_cuda"], "LocalCUDACluster", Refusing)
    with pytest.raises(GradeError, match=r"could not start a worker on each of GPUs 0, 1 \(ValueError: Can not scale"):
        cluster.connect("cuda:0,1", [0, 1], 1)


def _watched_cluster(monkeypatch) -> list:
    """dask-cuda's stand-in, counting the clusters closed."""
    closed = []

    class Watched(fake_dask_cuda.LocalCUDACluster):
        def close(self, *args, **kwargs):
            closed.append(self)
            return super().close(*args, **kwargs)

    fake_dask_cuda.install(monkeypatch)
    monkeypatch.setattr(sys.modules["dask_cuda"], "LocalCUDACluster", Watched)
    return closed


def test_the_cluster_starts_beside_the_parents_own_work_and_is_closed_if_the_run_never_takes_it(monkeypatch):
    """The parent's checks and plans (7.5 s of a class's wall on an H200 pair), then the cluster's start and its
    workers' contexts (8 s), ran one after the other: ``cluster.Starting`` starts the cluster in a thread of its own.
    A start nobody took is closed; one the run took is the run's to close; a failed start is raised where the run
    takes it."""
    import time

    closed = _watched_cluster(monkeypatch)
    began = time.monotonic()
    starting = cluster.Starting("cuda:0,1", [0, 1], 2)
    assert time.monotonic() - began < 1  # the start goes on beside what follows
    starting.close()
    assert len(closed) == 1
    starting = cluster.Starting("cuda:0,1", [0, 1], 2)
    client, made, where = starting.result()
    try:
        starting.close()
        assert len(closed) == 1 and set(client.nthreads().values()) == {2} and "GPUs 0, 1" in where
    finally:
        client.close()
        made.close()

    class Refusing(fake_dask_cuda.LocalCUDACluster):
        def __init__(self, **kw):
            raise ValueError("Can not scale beyond visible devices")

    monkeypatch.setattr(sys.modules["dask_cuda"], "LocalCUDACluster", Refusing)
    starting = cluster.Starting("cuda:0,1", [0, 1], 1)
    with pytest.raises(GradeError, match=r"could not start a worker on each of GPUs 0, 1 \(ValueError"):
        starting.result()
    starting.close()


def test_a_run_refused_while_its_cluster_starts_closes_the_cluster(two_gpus, tmp_path, monkeypatch):
    closed = _watched_cluster(monkeypatch)

    def refused(*args, **kwargs):
        raise GradeError("the reference solutions do not load")

    monkeypatch.setattr(run, "Context", refused)
    with pytest.raises(GradeError, match="do not load"):
        run.grade(tmp_path / "subs", stages=["01"], out=tmp_path / "o", gpus="0,1", jobs=2, unsandboxed=True,
                  progress=False)
    assert len(closed) == 1 and len(fake_dask_cuda.made) == 1


_RETRY = {"running": 0, "log": [], "lock": threading.Lock()}


def _fake_grade_remote(spec, task):
    """A task that runs out of the grader's threads the first time (task 1), each noting how many ran at once."""
    import time

    with _RETRY["lock"]:
        _RETRY["running"] += 1
        _RETRY["log"].append((task["n"], _RETRY["running"]))
        first = task["n"] == 1 and sum(1 for n, _ in _RETRY["log"] if n == 1) == 1
    time.sleep(0.2)
    with _RETRY["lock"]:
        _RETRY["running"] -= 1
    if first:
        return {"message": "the CUDA simulator could not start a thread", "details": {"resource_error": True}}
    return {"n": task["n"], "message": "ok", "details": {}}


def test_a_row_that_ran_out_of_the_graders_threads_is_graded_again_alone_at_the_end(monkeypatch):
    """As on one machine (run.run_local): on a cluster too, a resource error is the grader's, tried once more when
    nothing else runs, and the rows keep the tasks' order."""
    from distributed import LocalCluster

    _RETRY["log"].clear()
    monkeypatch.setattr(cluster, "grade_remote", _fake_grade_remote)  # in-process workers look it up here
    seen = []
    with LocalCluster(n_workers=1, threads_per_worker=3, processes=False, dashboard_address=None) as local:
        tasks = [{"n": i, "student": f"s{i}", "stage": "05", "notebook": f"s{i}.ipynb"} for i in range(6)]
        spec = {"rubric": None, "solutions": str(REPO / "solutions")}
        rows, where, by_worker = cluster.run_on_cluster(local.scheduler_address, spec, tasks,
                                                        lambda task, row: seen.append(task["n"]), None, None)
    assert [r["n"] for r in rows] == list(range(6)) and seen.count(1) == 1 and seen[-1] == 1
    assert "the first try: the CUDA simulator could not start a thread" in rows[1]["details"]["retried"]
    log = _RETRY["log"]
    assert log[-1] == (1, 1)  # alone
    assert max(n for _, n in log) > 1 and len(by_worker) == 1


# ------------------------------------------------------------------------------------------- reports


SMI = ("0, NVIDIA H100 80GB HBM3, GPU-8a1c0e4e-0000-0000-0000-000000000000, 81559, 580.159.04\n"
       "1, NVIDIA H100 80GB HBM3, GPU-5f3e9b21-0000-0000-0000-000000000001, 81559, 580.159.04\n")


def test_the_report_names_each_gpu_with_its_uuid(monkeypatch):
    asked = []

    def fake_run(cmd, **kw):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, SMI, "")

    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(environment.subprocess, "run", fake_run)
    gpu = device.DeviceInfo(kind="gpu", name="NVIDIA H100 80GB HBM3", simulated=False, numba_version="0",
                            numba_cuda=True, numba_cuda_version="0", cupy=False, cupy_version=None,
                            compute_capability=(9, 0))
    env = environment.describe(gpu)
    assert "--query-gpu=index,name,uuid,memory.total,driver_version" in asked[0]
    assert env["gpus"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-8a1c0e4e-0000-0000-0000-000000000000",
         "memory_mib": 81559},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-5f3e9b21-0000-0000-0000-000000000001",
         "memory_mib": 81559}]
    assert env["nvidia_driver"] == "580.159.04"
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)  # no nvidia-smi: the device numba sees
    assert environment.describe(gpu)["gpus"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": None,
                                                   "memory_mib": None}]


# ------------------------------------------------------------------------------------ on the real GPUs


def _dask_cuda() -> bool:
    try:
        return importlib.util.find_spec("dask_cuda") is not None
    except ValueError:
        return False


@pytest.mark.skipif(not ON_GPU, reason="grades on this machine's GPUs: LABKIT_TEST_GPU=1 on a GPU machine")
@pytest.mark.skipif(not _dask_cuda(), reason="needs dask-cuda: pip install 'labkit[cluster]'")
def test_a_class_on_every_gpu_through_dask_cuda(tmp_path):
    """Stage 05's solution twice per GPU and a right conv without shared memory, graded on every GPU, two jobs at a
    time on each: the same statuses and points for the copies, each row on its worker's GPU, each GPU its own
    reference job and turns, and the report naming every GPU."""
    import nbformat
    import stage_class

    gpus = run.available_gpus()
    assert gpus, "LABKIT_TEST_GPU=1 but no GPU here"
    nb_name = "05_shared_memory.ipynb"
    names = [f"s05_{k}" for k in range(2 * len(gpus))]
    for name in [*names, "s05_plain"]:
        nb = nbformat.read(REPO / "solutions" / nb_name, as_version=4)
        if name == "s05_plain":
            [c for c in nb.cells if "kernel" in c.metadata.get("tags", [])][-1].source += stage_class.PLAIN_CONV
        (tmp_path / "class" / name / "notebooks").mkdir(parents=True)
        nbformat.write(nb, tmp_path / "class" / name / "notebooks" / nb_name)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('[limits]\ntime_s = 300\n[stage."05"]\nvariants = ["tiled_16"]\ntimed_variant = "tiled_16"\n')
    report = grading.grade(tmp_path / "class", stages=["05"], rubric=rubric, out=tmp_path / "out", seed=33,
                           progress=False, gpus="all", jobs=2 * len(gpus))
    meta, rows = report["meta"], {r["student"]: r for r in report["rows"]}
    assert "through dask-cuda" in meta["graded_on"] and meta["jobs"]["per_gpu"] == 2
    assert set(gpus) <= {g["index"] for g in meta["environment"]["gpus"]}
    assert all(g["uuid"] for g in meta["environment"]["gpus"])
    for name in names:
        assert rows[name]["status"] == "pass", rows[name]["message"]
        for part in ("correctness_points", "accuracy_points", "technique_points"):
            assert rows[name][part] == rows[names[0]][part], (name, part)
    assert rows["s05_plain"]["status"] == "pass" and "no technique points" in rows["s05_plain"]["message"]
    workers = {f"{w['host']}:{w['pid']}": w for w in meta["turns"]["by_worker"].values()}
    assert sorted(w["gpu"] for w in workers.values()) == sorted(map(str, gpus))
    for row in rows.values():  # the child ran on its worker's GPU
        assert row["details"]["gpu"] == workers[row["details"]["worker"]]["gpu"]
    assert all(w["turns"] >= 1 for w in workers.values())  # each GPU's reference job, alone on its GPU
