"""Grades that do not change with the load (docs/grading.md, "Grades at any load"): timed phases take turns while
every other job is stopped, time stopped or waiting never counts against a limit, the grader's own resources are
sized for the simulator's threads, a job that runs out of them is the grader's row (retried), and a job that ends
early earns nothing that depends on the phases it did not run."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labkit.grading import isolation, sandbox, scoring
from labkit.grading.cores import Cores
from labkit.grading.turns import WHOLE, Running, Turns


class FakeSandbox:
    """Records every pause/continue instead of signalling processes."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []

    def pause(self, child, stop):
        self.calls.append((child, stop))


def _running(box, device, child):
    r = Running(box, device)
    r.child = child
    return r


def test_a_turn_stops_every_other_child_and_continues_them_after():
    box, turns = FakeSandbox(), Turns()
    a, b, c = (_running(box, "gpu0", n) for n in (1, 2, 3))
    for r in (a, b, c):
        turns.started(r)
    turns.acquire(a, "gpu0")
    assert sorted(box.calls) == [(2, True), (3, True)] and b.frozen and c.frozen and not a.frozen
    late = _running(box, "gpu0", 4)
    turns.started(late)  # started during a turn: stopped at once
    assert late.frozen
    turns.release(a)
    assert not any(r.frozen for r in (b, c, late))
    assert sorted(call for call in box.calls if not call[1]) == [(2, False), (3, False), (4, False)]


def test_time_stopped_or_waiting_for_a_turn_is_kept_apart_from_the_limit():
    box, turns = FakeSandbox(), Turns()
    a, b = _running(box, "cpu", 1), _running(box, "cpu", 2)
    turns.started(a)
    turns.started(b)
    turns.acquire(a, "cpu")
    waited = []
    thread = threading.Thread(target=lambda: waited.append(turns.acquire(b, "cpu")))  # b waits for a's turn
    thread.start()
    time.sleep(0.3)
    assert b.paused_s() >= 0.25  # stopped (and waiting) all along: neither counts against its limit
    turns.release(a)
    thread.join(5)
    assert waited and waited[0] >= 0.25 and not b.frozen and a.frozen  # now a is stopped while b times
    paused = b.paused_s()
    assert 0.25 <= paused < 1.0  # the overlap of stopped and waiting counted once
    turns.release(b)
    assert a.paused_s() < 0.2 + 0.1 and not a.frozen


def test_turns_on_two_gpus_overlap_but_the_whole_machine_waits_for_both():
    box, turns = FakeSandbox(), Turns()
    a, b, ref = _running(box, "gpu0", 1), _running(box, "gpu1", 2), _running(box, None, 3)
    for r in (a, b, ref):
        turns.started(r)
    turns.acquire(a, "gpu0")
    turns.acquire(b, "gpu1")  # another device: no waiting, and the holders are never stopped
    assert not a.frozen and not b.frozen and ref.frozen
    got = []
    thread = threading.Thread(target=lambda: got.append(turns.acquire(ref, WHOLE)))
    thread.start()
    time.sleep(0.1)
    assert not got  # a reference job measures alone: it waits for every turn to end
    turns.release(a)
    time.sleep(0.1)
    assert not got
    turns.release(b)
    thread.join(5)
    assert got and a.frozen and b.frozen and not ref.frozen
    turns.release(ref)
    assert turns.summary()["turns"] == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="stopping a sandbox's processes reads /proc (Linux)")
def test_a_paused_sandbox_is_stopped_whole_and_continued(tmp_path):
    try:
        box = isolation.choose()
    except Exception as exc:  # noqa: BLE001 - a machine without a sandbox runs the unsandboxed form only
        pytest.skip(f"no sandbox here: {exc}")
    code = "import os, time\npid = os.fork()\ntime.sleep(60)\n"  # the job and a process of its own
    for iso in (box, isolation.Isolation()):
        view = isolation.View((), str(tmp_path), isolation.child_env(dict(os.environ), str(tmp_path), None))
        child = iso.spawn([sys.executable, "-c", code], view, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            want = 2 + (iso.mode == "bwrap")  # the job, its fork (and bubblewrap's first process of the namespace)
            deadline = time.monotonic() + 10
            while len(iso.processes(child)) < want and time.monotonic() < deadline:
                time.sleep(0.05)
            pids = iso.processes(child)
            assert len(pids) >= want, iso.mode
            iso.pause(child, True)
            assert {_state(p) for p in pids} == {"T"}, iso.mode
            iso.pause(child, False)
            assert "T" not in {_state(p) for p in pids}, iso.mode
        finally:
            iso.stop(child)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_processes_that_outlive_their_job_are_its_row_not_a_grader_error(tmp_path, monkeypatch):
    """A process stuck in a GPU kernel ends only once the driver lets it: the child's end reports it as survivors
    (the row says so, and the run gives that device no other job), where it used to raise a grader error."""
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    class Stubborn(isolation.Isolation):
        def stop(self, child):
            super().stop(child)
            return [lingering.pid]

    monkeypatch.setattr(sandbox, "LINGER_S", 0.5)
    (tmp_path / "work").mkdir()
    try:
        end = sandbox.run_child({"stage": "01"}, tmp_path, dict(os.environ), 30, 0, False,
                                lambda *a: True, Stubborn())
        assert end.survivors == [lingering.pid]
    finally:
        lingering.kill()
        lingering.wait()


def _outcome(**kw) -> scoring.JobOutcome:
    return scoring.JobOutcome(**{"done": True, "checks_done": True, "accuracy_done": True, **kw})


def test_a_timeout_names_what_did_not_run_and_scores_nothing_that_depends_on_it(shipped_plan):
    plan = shipped_plan("05")
    o = _outcome(timed_out=True, done=False, phase="the accuracy run", finished={"load", "checks", "tasks"},
                 time_limit=60, last_kernel="tiled_conv_kernel")
    row = scoring.row(plan, "s", Path("x.ipynb"), 1, o)
    assert row["status"] == "timeout" and row["score"] == 0
    assert "not run: accuracy, timing, technique (nothing that depends on them is scored)" in row["message"]
    assert "the last kernel it launched: tiled_conv_kernel" in row["message"]
    # ended in the technique's count only: what the settled phases earned is kept, the technique's points are not
    o = _outcome(timed_out=True, done=False, phase="the technique check", finished={*scoring.PHASES} - {"technique"},
                 time_limit=60)
    row = scoring.row(plan, "s", Path("x.ipynb"), 1, o)
    assert row["status"] == "timeout" and row["correctness_points"] == 50 and row["technique_points"] == 0
    assert "not run: technique" in row["message"]


def test_a_reference_job_runs_alone_only_where_its_wall_time_sets_the_limits(shipped_plan, monkeypatch):
    """With limits.time_factor the reference job's wall time scales the students' limit: it holds the whole turn of
    its process (one GPU's dask-cuda worker) for its whole run. Without it, only its timed phase takes the device's
    turn, as a student's does, so the other jobs of that GPU run beside the rest of it."""
    import dataclasses

    from labkit.grading import job

    alone = []
    monkeypatch.setattr(job.GradingJob, "run", lambda self: alone.append(self.alone) or self.outcome)
    monkeypatch.setattr(job.GradingJob, "row", lambda self: {"status": "pass", "message": ""})
    plan = shipped_plan("05")
    assert plan.rubric["limits"]["time_factor"] > 0
    job.reference_job(plan, None, True, 1)
    fixed = dataclasses.replace(plan, rubric={**plan.rubric, "limits": {**plan.rubric["limits"], "time_factor": 0}})
    job.reference_job(fixed, None, True, 1)
    assert alone == [True, False]


def test_survivors_are_said_in_the_students_row(shipped_plan):
    o = _outcome(timed_out=True, done=False, phase="conv1 (batch size 1) of variant 'implicit_gemm'",
                 survivors=[123], finished={"load"})
    row = scoring.row(shipped_plan("08"), "s", Path("x.ipynb"), 1, o)
    assert row["status"] == "timeout", row["message"]
    assert "still running" in row["message"] and "barrier" in row["message"]


def test_a_resource_error_is_the_graders_and_marked_for_a_retry(shipped_plan):
    o = _outcome(grader_error="the CUDA simulator could not start a thread", resource_error=True)
    row = scoring.row(shipped_plan("05"), "s", Path("x.ipynb"), 1, o)
    assert row["status"] == "grader-error" and row["details"]["resource_error"]


@pytest.fixture(scope="module")
def shipped_plan():
    """A stage's plan under the shipped rubric, without asking a child (the variants as the solution names them)."""
    from labkit.grading.plan import StagePlan
    from labkit.grading.protocol import VariantSpec
    from labkit.grading.rubric import load_rubric
    from labkit.stages import STAGES

    rub = load_rubric()

    def make(stage: str) -> StagePlan:
        spec = VariantSpec(name="v", target="gpu", arrays="device", per_image=False, nets=("cifar10",),
                           layers={"cifar10": ["conv1"]})
        return StagePlan(STAGES[stage], Path("solution.ipynb"), rub.for_stage(stage), {"v": spec}, "v", False,
                         "simulated", 60.0)

    return make


BIG_BLOCKS = (("lk.gpu.launch(conv_padded_kernel, out.size, xp, w, b, out, stride)",
               "lk.gpu.launch(conv_padded_kernel, out.size, xp, w, b, out, stride, block=1024)"),
              ("    t = cuda.grid(1)\n", "    t = cuda.grid(1)\n    cuda.syncthreads()  # every thread of the block alive at once\n"))


@pytest.fixture(scope="module")
def big_blocks(tmp_path_factory):
    """Stage 04's solution with blocks of 1024 threads that meet at a barrier (right on a GPU; on the simulator 1024
    Python threads of a block alive at once), graded under two address-space limits."""
    import nbformat

    from labkit import grading

    root = tmp_path_factory.mktemp("blocks")
    nb = nbformat.read(REPO / "solutions" / "04_data_transfer_padding.ipynb", as_version=4)
    cell = next(c for c in nb.cells if BIG_BLOCKS[0][0] in c.source)
    for old, new in BIG_BLOCKS:
        assert old in cell.source, old
        cell.source = cell.source.replace(old, new, 1)
    (root / "class" / "big_blocks").mkdir(parents=True)
    nbformat.write(nb, root / "class" / "big_blocks" / "04_data_transfer_padding.ipynb")
    rows = {}
    for memory_mb in (4096, 1200):
        rubric = root / f"rubric_{memory_mb}.toml"
        rubric.write_text(f'[limits]\ntime_factor = 0\nmemory_mb = {memory_mb}\n[stage."04"]\nvariants = '
                          f'["batched_padded"]\n')
        report = grading.grade(root / "class", stages=["04"], rubric=rubric, out=root / f"grades_{memory_mb}",
                               progress=False, seed=3, jobs=1)
        rows[memory_mb] = report["rows"][0]
    return rows


REPO = Path(__file__).resolve().parent.parent
needs_simulator = pytest.mark.skipif(os.environ.get("LABKIT_TEST_GPU") == "1",
                                     reason="the simulator's threads: a GPU starts none")


@needs_simulator
def test_the_simulators_threads_fit_the_limit_its_phases_need(big_blocks):
    """1024 simulated threads at the system's 8 MB of stack reserved 8 GB: under a 4 GB limit the student's right
    kernel failed with "can't start new thread". Sized (2 MB stacks, two malloc arenas) they fit."""
    row = big_blocks[4096]
    assert row["status"] == "pass", row["message"]


@needs_simulator
def test_threads_the_grader_cannot_start_are_the_graders_error_never_the_students(big_blocks):
    row = big_blocks[1200]  # too little for any block of 1024: the grader's machinery runs out, not the student's code
    assert row["status"] == "grader-error", row["message"]
    assert "could not start a thread" in row["message"] and row["details"]["resource_error"]
    assert "graded again alone at the end of the run" in row["details"]["retried"]
    assert row["score"] == 0 and "can't start new thread" not in (row["details"].get("checks") or [""])[0]


def test_more_jobs_than_cores_are_refused_in_one_line(tmp_path):
    from labkit import grading

    cores = os.cpu_count() or 1
    with pytest.raises(grading.GradeError, match=rf"--jobs {cores + 1}: this machine has {cores} processor core"):
        grading.grade(tmp_path, stages=["01"], jobs=cores + 1, out=tmp_path / "out", progress=False)


def test_rows_that_are_the_graders_error_make_the_run_fail_with_the_command_that_regrades_them(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from labkit import cli, grading

    def fake_grade(submissions, stages, rubric, solutions, out, jobs, seed, **kw):
        rows = [{"student": s, "stage": "05", "status": status, "score": 0.0, "max_score": 90.0,
                 "message": "grader error: the CUDA simulator could not start a thread" if status != "pass" else "ok"}
                for s, status in (("ada", "pass"), ("ben", "grader-error"), ("cho", "grader-error"))]
        meta = {"stages": ["05"], "seed": 77, "device": "CUDA simulator (CPU)", "op_time": {"05": "measured"},
                "memory_guard": "none", "students": 3, "rubric": {"sources": ["shipped.toml", "class.toml"]}}
        return {"meta": meta, "rows": rows}

    monkeypatch.setattr(grading, "grade", fake_grade)
    (tmp_path / "class").mkdir()
    result = CliRunner().invoke(cli.main, ["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out"),
                                           "--unsandboxed"])
    assert result.exit_code == 3, result.output
    assert "2 rows are the grader's own error, not the student's; grade them again with:" in result.output
    assert (f"labkit grade {tmp_path / 'class'} --students ben,cho --stages 05 --out {tmp_path / 'out'} --merge "
            f"--seed 77 --rubric class.toml") in result.output


class PinningSandbox(FakeSandbox):
    """Records where each child's processes are moved as well."""

    def __init__(self):
        super().__init__()
        self.pins: list[tuple[int, set]] = []

    def pin(self, child, cores):
        self.pins.append((child, set(cores)))


def test_a_gpu_timing_runs_its_turn_on_a_core_kept_free_and_goes_back_after():
    box = PinningSandbox()
    turns = Turns(Cores(2, allowed=[0, 1, 2, 3], siblings=lambda c: {c}))
    assert turns.cores.reserved == [2, 3] and turns.cores.others == {0, 1}
    a, b, cpu = _running(box, "gpu0", 1), _running(box, "gpu1", 2), _running(box, "gpu0", 3)
    a.kept_core = b.kept_core = True  # cpu: a timed variant of CPU code is left on the shared cores
    for r in (a, b, cpu):
        turns.started(r)
    turns.acquire(a, "gpu0")
    turns.acquire(b, "gpu1")  # turns on two GPUs at once: a kept core each
    assert box.pins == [(1, {2}), (2, {3})]
    turns.release(a)
    assert box.pins[-1] == (1, {0, 1})  # back with everything else
    turns.acquire(cpu, "gpu0")
    assert len(box.pins) == 3  # not moved
    turns.release(cpu)
    turns.release(b)
    assert box.pins[-1] == (2, {0, 1}) and turns.cores.take() in (2, 3)  # every kept core given back


def test_a_reference_jobs_turn_is_taken_before_its_child_starts_and_pins_it_when_it_does():
    box = PinningSandbox()
    turns = Turns(Cores(1, allowed=[0, 1], siblings=lambda c: {c}))
    ref = Running(box, "gpu0")
    ref.kept_core = True
    turns.acquire(ref, WHOLE)  # hold(): no child yet
    assert box.pins == []
    ref.child = 7
    turns.started(ref)
    assert box.pins == [(7, {1})]
    turns.release(ref)
    assert box.pins[-1] == (7, {0})


def test_too_few_cores_keep_none_and_say_why():
    cores = Cores(2, allowed=[0, 1], siblings=lambda c: {c})
    assert cores.reserved == [] and "2 core(s) for 2 device(s)" in cores.why and cores.take() is None


def test_a_kept_cores_multithreading_siblings_are_kept_idle():
    pairs = {c: {c % 8, c % 8 + 8} for c in range(16)}  # 8 cores, 2 threads each: 0 and 8 share a core
    cores = Cores(2, allowed=list(range(16)), siblings=pairs.__getitem__)
    assert cores.reserved == [14, 15] and cores.idle == {6, 7} and cores.others == set(range(6)) | {8, 9, 10, 11, 12, 13}
    assert Cores(1, allowed=[0, 8], siblings=pairs.__getitem__).reserved == []  # one core: none kept, the rest would have none


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="keeping a core free needs two cores and Linux's processor affinity")
def test_the_kept_core_holds_the_whole_child_and_the_grader_stays_off_it(tmp_path):
    original = set(os.sched_getaffinity(0))
    cores = Cores(1, allowed=sorted(original))
    if not cores.reserved:
        pytest.skip(f"this machine keeps no core free: {cores.why}")
    kept = cores.reserved[0]
    allowed = sorted(cores.others | {kept})  # a sibling kept idle is on neither side
    iso = isolation.Isolation()
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)\n"
    cores.start()
    try:
        assert os.sched_getaffinity(os.getpid()) == set(allowed) - {kept}  # the grader's threads (and children) off the kept core
        view = isolation.View((), str(tmp_path), isolation.child_env(dict(os.environ), str(tmp_path), None))
        child = iso.spawn([sys.executable, "-c", code], view, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while len(os.listdir(f"/proc/{child.proc.pid}/task")) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            turns = Turns(cores)
            r = Running(iso, "gpu0")
            r.child, r.kept_core = child, True
            turns.started(r)
            assert _threads_affinity(child.proc.pid) == [set(allowed) - {kept}] * 2  # inherited from the grader
            turns.acquire(r, "gpu0")
            assert _threads_affinity(child.proc.pid) == [{kept}] * 2  # every thread of it
            turns.release(r)
            assert _threads_affinity(child.proc.pid) == [set(allowed) - {kept}] * 2
        finally:
            iso.stop(child)
    finally:
        cores.stop()
    assert os.sched_getaffinity(os.getpid()) == original


def _threads_affinity(pid: int) -> list[set]:
    return [os.sched_getaffinity(int(t)) for t in sorted(os.listdir(f"/proc/{pid}/task"))]
