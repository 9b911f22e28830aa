"""An attempt timed on a slow core is timed again, later, on fresh images (docs/grading.md, "Grades at any load").

On the GPU machines a core's speed changes within seconds (results/h100-2026-11-27c), and a launch-bound pass
follows it. Each timing attempt carries its probe (``labkit.grading.timed``); the parent compares it with the fastest
the run saw on the device and answers with another attempt while it is ``timing.slow_core`` slower. Op time is the
best pass of all attempts; every pass of every attempt is checked against the reference on its own images.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from labkit import grading
from labkit.course.stages import STAGES, solutions_folder
from labkit.grading import protocol as P
from labkit.grading import sandbox
from labkit.grading.attempts import RETRY_AFTER_S, probe_speed_us
from labkit.grading.job import GradingJob
from labkit.grading.plan import References, StagePlan
from labkit.grading.protocol import VariantSpec
from labkit.grading.rubric import RubricError, load_rubric
from labkit.grading.turns import Running, Turns


def _probe(us: float, key: str = "core_us") -> dict:
    return {"before": {key: [us] * 8}, "after": {key: [us * 1.01] * 8}}


def test_the_probe_reads_launch_bursts_on_a_gpu_and_the_core_loop_elsewhere():
    assert probe_speed_us(_probe(200.0)) == 202.0  # the upper median of 16
    gpu = {"before": {"burst_us": [400.0, 500.0], "core_us": [1.0, 1.0]}, "after": {"burst_us": [450.0]}}
    assert probe_speed_us(gpu) == 450.0
    # a child's numbers: only finite positive ones count, and nothing readable is no speed
    assert probe_speed_us({"before": {"core_us": ["x", -1, float("nan"), True, 7.0]}, "after": [3]}) == 7.0
    assert probe_speed_us({}) is None and probe_speed_us({"before": {"core_us": "fast"}}) is None


def test_the_fastest_probe_is_kept_per_device():
    turns = Turns()
    assert turns.fastest("gpu0", 300.0) == 300.0 and turns.fastest("gpu0", 500.0) == 300.0
    assert turns.fastest("gpu1", 450.0) == 450.0 and turns.fastest("gpu0", 250.0) == 250.0


def test_the_rubric_bounds_the_attempts(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[timing]\nattempts = 0\n")
    with pytest.raises(RubricError, match="timing.attempts must be >= 1"):
        load_rubric(path)
    path.write_text("[timing]\nslow_core = -1\n")
    with pytest.raises(RubricError, match="slow_core more than -1"):
        load_rubric(path)
    shipped = load_rubric().for_stage("07")["timing"]
    assert shipped["attempts"] >= 2 and 0 < shipped["slow_core"] < 0.5


@pytest.fixture
def job(tmp_path):
    """A stage-01 job (CPU code: timed here too) built as the grader builds it, three timed passes of 4 images."""
    rubric = load_rubric().for_stage("01")
    rubric["timing"].update(images=4, repeat=3, attempts=3, slow_core=0.15)
    spec = VariantSpec(name="serial", target="cpu", arrays="host", per_image=True, nets=("cifar10",),
                       layers={"cifar10": ["conv1"]})
    solution = solutions_folder() / STAGES["01"].notebook
    plan = StagePlan(STAGES["01"], solution, rubric, {"serial": spec}, "serial", True, "", 600.0)
    j = GradingJob(plan, References(), "s", solution, 11, gpu=False)
    j.turns, j.running = Turns(), Running(None, "cpu")
    j.spec = j.build(tmp_path)
    return j


def _passes(job: GradingJob, attempt: int, answers: list) -> list[np.ndarray]:
    """The child's side of an attempt's passes: each asks for its images, which the parent writes only then."""
    images = []
    for k in range(job.plan.rubric["timing"]["repeat"]):
        path = Path(job.spec.timing.pass_inputs.format(attempt=attempt, k=k))
        assert not path.exists(), f"pass {k} of attempt {attempt}: its images were there before it asked"
        job._on_pass(P.PassImages(attempt=attempt, k=k), b"", answers.append)
        images.append(np.load(path))
    return images


def _attempt(job: GradingJob, attempt: int, us: float, seconds: float) -> tuple[list, dict]:
    """The child's side of one attempt: its turn, its passes' images, then the passes (right answers, ``seconds``
    each) and the probe."""
    answers: list = []
    job._on_turn(P.Turn(), b"", answers.append)
    job.images = _passes(job, attempt, answers)
    probs = {f"prob{k}": job._pass_answer(k).astype(np.float32) for k in range(job.plan.rubric["timing"]["repeat"])}
    buf = io.BytesIO()
    np.savez(buf, **probs)
    runs = [{"pass": seconds + 0.001 * k, "conv1": seconds / 2} for k in range(len(probs))]
    job._on_timing(P.Timing(runs=runs, method="perf_counter", probe=_probe(us), attempt=attempt), buf.getvalue(),
                   answers.append)
    return answers, probs


def test_no_pass_images_reach_the_child_before_their_pass(job, tmp_path):
    """The child's inputs hold the workload (the warm-up's) and the checks', never a timed pass's images: each is
    written when its pass asks, so no call into the student's code before the pass could compute its answer."""
    with np.load(job.spec.inputs) as data:
        held = {k: data[k] for k in data.files}
    x = job._pass_images[0]
    assert not any(k.startswith("pass") for k in held)
    assert not any(a.shape == x.shape and np.array_equal(a, p) for a in held.values() for p in job._pass_images)
    assert not any(Path(job.spec.timing.pass_inputs).parent.iterdir())
    answers: list = []
    job._on_turn(P.Turn(), b"", answers.append)
    job._on_pass(P.PassImages(attempt=0, k=0), b"", answers.append)  # pass 0 asks: only its images are written
    assert [p.name for p in Path(job.spec.timing.pass_inputs).parent.iterdir()] == ["attempt0_pass0.npy"]
    assert np.array_equal(np.load(job.spec.timing.pass_inputs.format(attempt=0, k=0)), job._pass_images[0])
    for bad in (P.PassImages(attempt=0, k=0), P.PassImages(attempt=1, k=1), P.PassImages(attempt=0, k=2),
                P.PassImages(attempt=0, k=3)):
        job.outcome.protocol_error = None
        job._on_pass(bad, b"", answers.append)  # asked again, of another attempt, a pass skipped, past the last
        assert answers[-1] is P.Answer.STOP and "images asked for pass" in job.outcome.protocol_error
    assert [p.name for p in Path(job.spec.timing.pass_inputs).parent.iterdir()] == ["attempt0_pass0.npy"]
    assert answers[:2] == [P.Answer.CONTINUE, P.Answer.CONTINUE]


def test_a_slow_core_is_timed_again_on_fresh_images_and_the_best_pass_counts(job, tmp_path):
    job.turns.fastest(job.device, 100.0)  # an earlier job's probe on this device
    decided = time.monotonic()
    answers, _ = _attempt(job, 0, 180.0, 0.20)  # 80 % slower than the fastest: again
    first = job.images
    assert answers == [P.Answer.CONTINUE] * 5 and job.spec.timing.attempts == 3
    assert "timing" not in job.outcome.finished
    answers, _ = _attempt(job, 1, 108.0, 0.10)  # within 15 % of the fastest: enough
    fresh = job.images
    assert all(x.shape == first[0].shape and x.dtype == np.float32 for x in fresh)
    assert Path(job.spec.timing.pass_inputs).parent == tmp_path / "timing"
    # new noise for the new attempt: no memo of the first attempt's passes (or of the accuracy run) holds them
    assert all(not np.allclose(x, y) for x in fresh for y in first)
    # its turn came no sooner than RETRY_AFTER_S after the decision (a slow spell given time to pass), and the wait
    # is not against its limit
    assert job._retry_at >= decided + RETRY_AFTER_S and job._turn_at >= job._retry_at
    assert job.running.paused_s() > 0
    assert answers == [P.Answer.CONTINUE] * 4 + [P.Answer.SKIP] and "timing" in job.outcome.finished
    o = job.outcome
    assert [a["attempt"] for a in o.timing_attempts] == [0, 1]
    assert [a["speed_us"] for a in o.timing_attempts] == [181.8, 109.08]
    assert all(a["fastest_us"] == 100.0 for a in o.timing_attempts)
    assert len(o.timing_runs) == 6 and min(r["pass"] for r in o.timing_runs) == 0.10
    assert o.timing_mismatches == [0] * 6  # every pass of both attempts against the reference on its own images


def test_a_job_told_not_to_retime_keeps_its_slow_attempt(job):
    """A reference job whose students all have partners (``reference_job(retime=False)``): one attempt however slow
    its core, so every student of the stage waiting for it waits less."""
    job.retime = False
    job.turns.fastest(job.device, 100.0)
    answers, _ = _attempt(job, 0, 500.0, 0.2)  # five times the fastest: would be timed again
    assert answers[-1] is P.Answer.SKIP and "timing" in job.outcome.finished
    assert [a["attempt"] for a in job.outcome.timing_attempts] == [0]


def test_the_childs_sandbox_sees_the_folder_later_attempts_appear_in(job, tmp_path):
    """The sandbox binds files and folders that exist when the child starts: a pass's file, written after, is
    visible only inside a folder bound then (an H100 run without it: FileNotFoundError in every retimed job)."""
    view = sandbox.job_view(job.spec.to_json(), tmp_path, {})
    folder = str(Path(job.spec.timing.pass_inputs).parent)
    assert folder in view.read and Path(folder).is_dir() and not any(Path(folder).iterdir())
    assert view.scratch != folder and not view.scratch.startswith(folder)  # bound read-only, never the child's


def test_no_attempt_past_the_rubrics_or_the_limits_room(job):
    job.plan.rubric["timing"]["attempts"] = 1
    job.turns.fastest(job.device, 100.0)
    assert _attempt(job, 0, 500.0, 0.2)[0][-1] is P.Answer.SKIP
    job.outcome.finished.discard("timing")
    job.plan.rubric["timing"]["attempts"] = 3
    job.time_limit = 0.001  # no room for two more attempts like it
    job._attempt, job.outcome.timing_runs, job._handed = 0, None, set()
    for f in Path(job.spec.timing.pass_inputs).parent.iterdir():
        f.unlink()
    assert _attempt(job, 0, 500.0, 0.2)[0][-1] is P.Answer.SKIP


def test_a_wrong_attempt_number_or_wrong_answers_in_a_later_attempt_are_caught(job):
    job.turns.fastest(job.device, 100.0)
    _attempt(job, 0, 300.0, 0.2)
    answers: list = []
    job._on_turn(P.Turn(), b"", answers.append)
    _passes(job, 1, answers)
    job._on_timing(P.Timing(runs=[{"pass": 0.1}] * 3, method="perf_counter", probe=_probe(100), attempt=2), b"",
                   answers.append)
    assert answers[-1] is P.Answer.SKIP and "attempt 2 where 1 was asked for" in job.outcome.protocol_error


def test_a_kept_result_in_a_later_attempt_is_a_mismatch(job):
    job.turns.fastest(job.device, 100.0)
    _, probs = _attempt(job, 0, 300.0, 0.2)
    answers: list = []
    job._on_turn(P.Turn(), b"", answers.append)
    _passes(job, 1, answers)
    buf = io.BytesIO()
    np.savez(buf, **probs)  # the first attempt's answers handed back on the new images
    job._on_timing(P.Timing(runs=[{"pass": 0.01}] * 3, method="perf_counter", probe=_probe(100), attempt=1),
                   buf.getvalue(), answers.append)
    assert job.outcome.timing_mismatches[:3] == [0, 0, 0] and min(job.outcome.timing_mismatches[3:]) > 0


def test_the_child_times_each_attempt_the_parent_asks_for(tmp_path):
    """The whole path: every attempt slow (slow_core -0.99), so the solution is timed in three turns, each on its
    own images, and passes with the best pass of the nine."""
    subs = tmp_path / "subs" / "ada" / "notebooks"
    subs.mkdir(parents=True)
    nb = nbformat.read(solutions_folder() / STAGES["01"].notebook, as_version=4)
    nbformat.write(nb, subs / STAGES["01"].notebook)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text("[checks]\nbatches = [1]\n[accuracy]\nimages = 4\n"
                      "[timing]\nimages = 4\nrepeat = 3\nattempts = 3\nslow_core = -0.99\n")
    report = grading.grade(tmp_path / "subs", stages=["01"], rubric=rubric, out=tmp_path / "out", jobs=1,
                           progress=False, cache=False)  # in the sandbox: the attempts' folder is bound
    row, = report["rows"]
    assert row["status"] == "pass", row["message"]
    turn = row["details"]["turn"]
    assert [a["attempt"] for a in turn["attempts"]] == [0, 1, 2]
    assert all(a["speed_us"] > 0 and a["probe"]["before"]["core_us"] for a in turn["attempts"])
    runs = row["details"]["op_time_runs"]["student"]
    assert len(runs) == 9 and row["op_time_s"] == min(r["pass"] for r in runs)
    assert row["details"]["timed_predictions"]["student_mismatches"] == [0] * 9
    assert json.loads((tmp_path / "out" / "grades.json").read_text())["rows"][0]["details"]["turn"] == turn
