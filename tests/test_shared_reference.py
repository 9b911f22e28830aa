"""A stage's reference job once for a whole cluster run (labkit.grading.shared_reference): the first worker that
needs it measures it, the others read its result through the scheduler, and only where no score hangs on the GPU it
ran on (a partner times the reference in every student's turn, and the limit is the rubric's)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

from labkit.grading import context  # noqa: E402
from labkit.grading.job import ReferenceTiming  # noqa: E402
from labkit.grading.rubric import load_rubric  # noqa: E402
from labkit.grading.shared_reference import SharedReferences, run_key  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def client():
    """A scheduler and one worker in this process: what the workers of a run share (its locks and metadata)."""
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc, \
            distributed.Client(lc) as c:
        yield c


def _timing(seconds: float) -> ReferenceTiming:
    return ReferenceTiming(runs=[{"pass": 0.0123, "conv1": 0.004}], method="cuda events", mismatches=[0, 2],
                           device="NVIDIA H100 80GB HBM3", seconds=seconds, phases_s={"checks": 3.5},
                           attempts=[{"attempt": 1, "speed_us": 41.0, "fastest_us": None}])


def test_the_first_worker_measures_and_the_others_read_its_result(client):
    a, b = SharedReferences("run1", "gpu0", client), SharedReferences("run1", "gpu1", client)
    started, release, calls = threading.Event(), threading.Event(), []

    def slow_measure():
        calls.append("gpu0")
        started.set()
        release.wait(30)
        return _timing(61.5)

    got = {}
    first = threading.Thread(target=lambda: got.setdefault("a", a.get("06", "H100", slow_measure)))
    first.start()
    assert started.wait(30)
    # while gpu0 measures: gpu1 waits for its result and does not measure it again
    second = threading.Thread(target=lambda: got.setdefault("b", b.get("06", "H100", lambda: calls.append("gpu1")
                                                                       or _timing(1.0))))
    second.start()
    second.join(1.0)
    assert second.is_alive() and "b" not in got
    release.set()
    first.join(30)
    second.join(30)
    assert calls == ["gpu0"]
    assert got["a"] == (_timing(61.5), "gpu0") and got["b"] == (_timing(61.5), "gpu0")  # every field, as measured
    # a later read is at once, by anyone
    assert b.get("06", "H100", lambda: calls.append("again") or _timing(1.0)) == (_timing(61.5), "gpu0")
    assert calls == ["gpu0"]


def test_other_stages_devices_and_runs_measure_their_own(client):
    calls = []

    def measure(who):
        return lambda: calls.append(who) or _timing(len(calls))

    a = SharedReferences("run2", "gpu0", client)
    a.get("06", "H100", measure("06 H100"))
    a.get("09", "H100", measure("09 H100"))
    SharedReferences("run2", "gpu1", client).get("06", "H200", measure("06 H200"))  # another model measures again
    SharedReferences("run3", "gpu1", client).get("06", "H100", measure("06 H100 run3"))  # another run too
    assert calls == ["06 H100", "09 H100", "06 H200", "06 H100 run3"]


def test_a_finished_run_leaves_nothing_on_the_scheduler(client):
    """What the parent does at a run's end (``cluster.run_on_cluster``) empties every entry of that run only."""
    SharedReferences("run4", "gpu0", client).get("05", "H100", lambda: _timing(2.0))
    SharedReferences("run5", "gpu0", client).get("05", "H100", lambda: _timing(2.0))
    client.set_metadata(run_key("run4"), {})
    calls = []
    SharedReferences("run4", "gpu1", client).get("05", "H100", lambda: calls.append(4) or _timing(3.0))
    SharedReferences("run5", "gpu1", client).get("05", "H100", lambda: calls.append(5) or _timing(3.0))
    assert calls == [4]  # run4's measured again, run5's still there


def _rubric(tmp_path: Path, time_factor: float) -> Path:
    text = (REPO / "tests" / "test_grade.py").read_text()
    body = re.search(r'TEST_RUBRIC = f"""(.*?)"""', text, re.S).group(1)
    body = body.replace("{TIME_LIMIT}", "120").replace("{{", "{").replace("}}", "}")
    body = body.replace("[limits]\n", f"[limits]\ntime_factor = {time_factor}\n")
    path = tmp_path / f"rubric_{time_factor}.toml"
    path.write_text(body.replace("repeat = 3\n", 'repeat = 3\npaired = "always"\n'))
    return path


@pytest.mark.parametrize("time_factor, measured", [(0, 1), (3, 2)])
def test_two_workers_contexts_share_a_deferred_reference_job_only(client, tmp_path, monkeypatch, time_factor,
                                                                   measured):
    """Two workers (GPUs 0 and 1) grading stage 01: with its limit the rubric's and a partner timing every student,
    the reference job runs once and the second worker's report says who measured it; with the limit scaled from
    the reference job's wall time, each GPU measures its own."""
    ran = []

    def reference_job(plan, refs, gpu, seed, env, *args, **kwargs):
        ran.append(env.get("CUDA_VISIBLE_DEVICES"))
        return _timing(12.0)

    monkeypatch.setattr(context, "reference_job", reference_job)
    rubric = load_rubric(_rubric(tmp_path, time_factor))
    run = f"run-ctx-{time_factor}"
    workers = []
    for gpu in ("0", "1"):
        ctx = context.Context(["01"], rubric, REPO / "solutions", False, True)
        ctx.shared = SharedReferences(run, f"gpu{gpu}", client)
        workers.append(ctx)
    plan = workers[0].plans["01"]
    assert workers[0].defers_reference(plan) == (time_factor == 0)
    for gpu, ctx in zip(("0", "1"), workers):
        timing, limit = ctx.reference(ctx.plans["01"], {"CUDA_VISIBLE_DEVICES": gpu})
        assert timing == _timing(12.0) and limit > 0
    assert ran == ["0", "1"][:measured]
    second = workers[1].reference_jobs["01 gpu1"]
    assert second.get("measured_by") == ("gpu0" if measured == 1 else None)


@pytest.mark.parametrize("time_factor", [0, 3])
def test_a_stage_whose_students_do_not_wait_gets_a_reference_task_of_its_own(tmp_path, time_factor):
    """``context.reference_tasks``: one per stage whose students start before its reference job (the limit the
    rubric's, a partner timing every student), only where a student handed the stage in; none where the reference
    job's wall time sets the limit (its students wait for it, and the first of them runs it)."""
    ctx = context.Context(["01"], load_rubric(_rubric(tmp_path, time_factor)), REPO / "solutions", False, True)
    tasks = [{"student": "ann", "stage": "01", "notebook": "ann.ipynb"}]
    made = context.reference_tasks(ctx, tasks)
    if time_factor:
        assert made == []
        return
    assert len(made) == 1 and context.is_reference(made[0]) and made[0]["stage"] == "01"
    assert made[0]["notebook"] == str(ctx.plans["01"].solution) and not context.is_reference(tasks[0])
    assert context.reference_tasks(ctx, [{**tasks[0], "notebook": None}]) == []  # nobody handed it in


def test_a_reference_task_gives_no_row_and_a_failure_does_not_end_the_run(tmp_path, monkeypatch):
    ctx = context.Context(["01"], load_rubric(_rubric(tmp_path, 0)), REPO / "solutions", False, True)
    task = context.reference_tasks(ctx, [{"student": "ann", "stage": "01", "notebook": "ann.ipynb"}])[0]
    monkeypatch.setattr(context, "reference_job", lambda *a, **k: _timing(4.0))
    done = context.grade_task(ctx, task)
    assert done["reference"] == "01" and "error" not in done["details"] and "status" not in done
    assert ctx.reference_jobs["01"]["seconds"] == 4.0

    def broken(*args, **kwargs):
        raise RuntimeError("the grader's own machinery failed")

    ctx = context.Context(["01"], load_rubric(_rubric(tmp_path, 0)), REPO / "solutions", False, True)
    monkeypatch.setattr(context, "reference_job", broken)
    done = context.grade_task(ctx, task)  # said, not raised: each student's job tries again, its row says why
    assert done["details"]["error"] == "RuntimeError: the grader's own machinery failed"
    assert done["details"]["ran"]["to"] >= done["details"]["ran"]["from"]
