"""Throughput (issue 33): every row says where its time went (``details.phases_s``), and a stage's reference job is
kept across runs (``labkit.grading.refcache``): a hit skips the job, a changed solution or version misses, an entry
that cannot be trusted is ignored with a warning, ``--no-cache`` runs every reference job.

The cache's rules are tested on a plan made here (no child); one stage-01 student (CPU code: checked and timed on the
simulator too, at the test rubric's smallest sizes) is graded twice: into the cache, and from it.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from labkit.cli import main
from labkit.grading import context, phases, refcache, run
from labkit.grading.ahead import Ahead
from labkit.grading.job import ReferenceTiming
from labkit.grading.plan import StagePlan
from labkit.grading.protocol import VariantSpec
from labkit.grading.rubric import GradeError, load_rubric
from labkit.grading.turns import Running, Turns
from labkit.stages import STAGES

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ the phase clock


def test_the_phase_clock_keeps_time_stopped_apart_from_the_phases():
    now, paused = [0.0], [0.0]
    clock = phases.PhaseClock(lambda: paused[0], lambda: now[0])
    clock.switch("start")
    now[0] = 2.0
    clock.switch("load")
    now[0], paused[0] = 10.0, 3.0  # 8 s of load, of which 3 stopped while another job timed
    clock.switch("checks")
    now[0] = 11.0
    clock.add({"start": 1.0, "technique": 2.0, "waiting": 0.5}, "technique")  # a second child's phases
    got = clock.stop()
    assert got == {"start": 2.0, "load": 5.0, "waiting": 3.5, "checks": 1.0, "technique": 3.0}
    assert phases.own_seconds(got) == 11.0  # wall 11 s + the second child's 3 s, less the 3 s stopped
    assert list(phases.rounded(got)) == ["start", "load", "checks", "technique", "waiting"]


# ------------------------------------------------------------------------------------- the parent's work ahead


class _Box:
    def pause(self, child, stop):
        pass


def _running(n):
    r = Running(_Box(), "cpu")
    r.child = n
    return r


def test_the_parents_work_ahead_never_runs_beside_another_jobs_turn():
    turns, mine, other = Turns(), _running(1), _running(2)
    for r in (mine, other):
        turns.started(r)
    turns.acquire(other, "cpu")  # another job times: no piece of mine may start
    log = []

    def piece(k):
        def run():
            log.append(("start", k, time.monotonic()))
            time.sleep(0.2)
            log.append(("end", k, time.monotonic()))
            return k
        return run

    ahead = Ahead([piece(0), piece(1)], turns, mine)
    time.sleep(0.3)
    assert log == [], "a piece ran beside another job's turn"
    turns.release(other)
    time.sleep(0.05)  # piece 0 runs now; a turn taken meanwhile waits for it to end
    turns.acquire(other, "cpu")
    taken = time.monotonic()
    assert log[0][0] == "start" and any(e[0] == "end" and e[1] == 0 and e[2] <= taken for e in log), log
    time.sleep(0.3)
    assert [e for e in log if e[1] == 1] == [], "piece 1 started during the turn"
    turns.release(other)
    assert ahead.result() == [0, 1]
    # the job's own turn (a reference job holds the machine's for its whole run) does not hold its own pieces back
    turns.acquire(mine, "cpu")
    assert Ahead([lambda: 7], turns, mine).result() == [7]
    turns.release(mine)


def test_work_ahead_that_is_not_needed_is_left_out_and_asked_for_is_computed_there():
    gate, done = threading.Event(), []
    ahead = Ahead({"a": gate.wait, "b": lambda: done.append("b") or "b", "c": lambda: done.append("c") or "c"})
    ahead.skip("b")
    ahead.cancel()
    gate.set()
    assert ahead.get("a") is True
    time.sleep(0.1)
    assert done == [], "a piece left out ran"
    assert ahead.get("c") == "c" and done == ["c"]  # asked for after all: computed by the one who asks


# ------------------------------------------------------------------------------------------ the cache's rules


@pytest.fixture
def plan(tmp_path, monkeypatch):
    """A stage-05 plan whose solution is a file here; the inputs' hashes left out (they need the workloads)."""
    monkeypatch.setattr(refcache, "_inputs", lambda plan, refs: {"cifar10/1200/gpu": "same images"})
    solution = tmp_path / "solutions" / STAGES["05"].notebook
    solution.parent.mkdir()
    solution.write_text('{"cells": []}')
    spec = VariantSpec(name="v", target="gpu", arrays="device", per_image=False, nets=("cifar10",),
                       layers={"cifar10": ["conv1"]})
    return StagePlan(STAGES["05"], solution, load_rubric().for_stage("05"), {"v": spec}, "v", True, "", 900.0)


def _timing(plan, seconds=12.5) -> ReferenceTiming:
    runs = [{"pass": 0.01 * (k + 1), "conv1": 0.001} for k in range(plan.rubric["timing"]["repeat"])]
    return ReferenceTiming(runs=runs, method="perf_counter", mismatches=[0] * len(runs), device="dev",
                           seconds=seconds, phases_s={"start": 1.0, "checks": 10.0})


class Measure:
    """A reference job that counts how often it ran."""

    def __init__(self, timing):
        self.timing, self.calls = timing, 0

    def __call__(self):
        self.calls += 1
        return self.timing


def test_a_stored_reference_job_is_read_back_and_not_run_again(tmp_path, plan):
    measure = Measure(_timing(plan))
    first = refcache.ReferenceCache(tmp_path / "cache")
    assert first.reference(plan, None, {}, measure) is measure.timing and measure.calls == 1
    assert first.stages["05"]["from_cache"] is False
    again = refcache.ReferenceCache(tmp_path / "cache")  # a later run
    got = again.reference(plan, None, {}, measure)
    assert measure.calls == 1, "a hit must not run the reference job"
    want = measure.timing
    assert (got.runs, got.seconds, got.mismatches, got.phases_s) == (want.runs, 12.5, want.mismatches, want.phases_s)
    hit = again.report()["stages"]["05"]
    assert hit["from_cache"] is True and hit["key"] == first.stages["05"]["key"]
    assert hit["measured"] == first.stages["05"]["measured"]  # when it was measured, not when it was read
    entry = json.loads(Path(hit["file"]).read_text())
    assert entry["ingredients"]["solution"]["sha256"] and entry["ingredients"]["versions"]["numba"]


def test_a_changed_solution_version_device_or_rubric_value_misses(tmp_path, plan, monkeypatch):
    measure = Measure(_timing(plan))
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    plan.solution.write_text('{"cells": [], "edited": 1}')
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 2, "an edited solution notebook is another key"
    (plan.solution.parent / "04_data_transfer_padding.py").write_text("# %% tags=['kernel']\n")
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 3, "an earlier stage's source, given code the job loads, is part of the key"
    (plan.solution.parent / "06_constant_memory.py").write_text("# a later stage's: not read by the job\n")
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 3
    real = refcache.versions
    monkeypatch.setattr(refcache, "versions", lambda: {**real(), "numba": "0.0.1"})
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 4, "another numba is another key"
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {"CUDA_VISIBLE_DEVICES": "1"}, measure)
    assert measure.calls == 5, "another GPU is another key"
    plan.rubric["timing"]["images"] = 7
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 6, "another timing workload is another key"
    plan.rubric["op_time"]["full_at_ratio"] = 2.0  # scores only: the same job
    refcache.ReferenceCache(tmp_path / "cache").reference(plan, None, {}, measure)
    assert measure.calls == 6
    assert len(list((tmp_path / "cache").glob("reference-05-*.json"))) == 6


def _corruptions(entry: dict):
    yield "not JSON", "{not json"
    yield "a list", "[1, 2]"
    yield "another schema", json.dumps({**entry, "schema": 99})
    yield "negative seconds", json.dumps({**entry, "timing": {**entry["timing"], "seconds": -1}})
    yield "seconds as text", json.dumps({**entry, "timing": {**entry["timing"], "seconds": "12"}})
    yield "a pass without its time", json.dumps({**entry, "timing": {**entry["timing"], "runs": [{"conv1": 1.0}]}})
    yield "fewer passes", json.dumps({**entry, "timing": {**entry["timing"], "runs": entry["timing"]["runs"][:1]}})
    yield "NaN", json.dumps({**entry, "timing": {**entry["timing"], "runs": [{"pass": float("nan")}] * 5}})
    yield "edited ingredients", json.dumps({**entry, "ingredients": {**entry["ingredients"], "stage": "06"}})
    yield "no date", json.dumps({k: v for k, v in entry.items() if k != "measured"})


def test_an_entry_that_cannot_be_trusted_is_ignored_with_a_warning_and_measured_again(tmp_path, plan):
    measure = Measure(_timing(plan))
    cache = refcache.ReferenceCache(tmp_path / "cache")
    cache.reference(plan, None, {}, measure)
    path = Path(cache.stages["05"]["file"])
    good = json.loads(path.read_text())
    for why, text in _corruptions(good):
        path.write_text(text)
        lines = []
        again = refcache.ReferenceCache(tmp_path / "cache", warn=lines.append)
        got = again.reference(plan, None, {}, Measure(_timing(plan, seconds=3.0)))
        assert got.seconds == 3.0, f"{why}: the entry was trusted"
        assert len(lines) == 1 and "ignoring the reference cache entry" in lines[0] and "\n" not in lines[0], why
        assert again.report()["ignored"] == lines and not again.stages["05"]["from_cache"]
        assert json.loads(path.read_text())["timing"]["seconds"] == 3.0, f"{why}: not written over"
        path.write_text(json.dumps(good))


def test_a_failed_reference_job_is_not_stored(tmp_path, plan):
    failed = ReferenceTiming(error="the reference solution does not pass its own grading")
    cache = refcache.ReferenceCache(tmp_path / "cache")
    assert cache.reference(plan, None, {}, Measure(failed)).error
    assert not list((tmp_path / "cache").glob("*.json"))


def test_where_the_cache_is_and_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "default"))
    keep = {"the submissions": tmp_path / "class", "--out": tmp_path / "out"}
    assert refcache.choose(False, False, keep) == (None, "--no-cache")
    cache, _ = refcache.choose(True, False, keep)
    assert cache.folder == tmp_path / "default"
    assert refcache.choose(True, True, keep)[0] is None  # --unsandboxed: a submission could write the default one
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "out" / "cache"))
    cache, why = refcache.choose(True, False, keep)
    assert cache is None and "inside --out" in why
    assert refcache.choose(tmp_path / "out" / "cache", False, keep)[0] is not None  # asked for: used
    (tmp_path / "a_file").write_text("")
    for bad in (tmp_path / "a_file", Path("/proc/nope")):
        with pytest.raises(GradeError) as err:
            refcache.choose(bad, False, keep)
        assert str(err.value).startswith("--cache ") and "\n" not in str(err.value)


def test_the_cli_refuses_a_cache_it_cannot_write_and_both_cache_options(tmp_path):
    (tmp_path / "class").mkdir()
    for args, words in ((["--cache", "/proc/nope"], "--cache /proc/nope cannot be"),
                        (["--cache", str(tmp_path), "--no-cache"], "--cache and --no-cache")):
        result = CliRunner().invoke(main, ["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out"), *args])
        assert result.exit_code != 0 and words in result.output, result.output
        assert "Traceback" not in result.output and not (tmp_path / "out" / "grades.json").exists()


def test_the_answers_computed_ahead_are_the_references_on_the_inputs_drawn(plan, tmp_path):
    """Drawn first, answered later (check.layer_case/network_case answers=False, check.answer): the values the
    eager cases had; a stage whose op time is not measured has no timed passes to answer."""
    import numpy as np

    from labkit import check, reference
    from labkit.grading.job import GradingJob
    from labkit.grading.plan import References

    plan.measured = False
    job = GradingJob(plan, References(), "s", plan.solution, 11, gpu=False)
    job.build(tmp_path)
    assert job._ahead is not None and not [k for k in job._answers if k[0] == "pass"]
    layers = nets = 0
    for cid, c in job.cases.items():
        case = job._ahead.get(("case", cid))
        if c["layer"] is not None:
            layers += 1
            want = reference.layer_forward(c["layer"], c["x"], c["weights"], accumulate="float64").astype(np.float32)
            assert np.array_equal(case.expected, want)
            assert np.array_equal(case.scale, check.magnitude(c["layer"], c["x"], c["weights"]))
        else:
            nets += 1
            assert np.array_equal(case.expected, reference.forward(c["net"], c["weights"], c["x"],
                                                                   accumulate="float64"))
    assert layers and nets


# ------------------------------------------------------------------------------- the technique's second child


def test_on_a_gpu_the_technique_child_starts_beside_the_job_once_its_checks_pass(plan, monkeypatch):
    from labkit.grading import job as grading_job
    from labkit.grading import protocol as P
    from labkit.grading.scoring import JobOutcome

    started = threading.Event()
    counted = JobOutcome(technique={"passed": True, "line": "conv2 uses shared memory: PASS (counted)"},
                         phases={"start": 1.0, "technique": 2.0})

    def slow(self):
        started.set()
        time.sleep(0.5)
        return counted

    monkeypatch.setattr(grading_job.TechniqueJob, "run", slow)
    reference = grading_job.GradingJob(plan, None, "(reference solution)", plan.solution, 7, gpu=True)
    reference.alone = True
    answers = []
    reference._on_checks_done(P.ChecksDone(), b"", answers.append)
    assert answers == [P.Answer.CONTINUE] and reference._counting is None  # a reference job counts after its child

    job = grading_job.GradingJob(plan, None, "s", plan.solution, 7, gpu=True)
    job._on_checks_done(P.ChecksDone(), b"", answers.append)
    assert started.wait(5), "the technique child did not start once the checks passed"
    time.sleep(0.6)  # the job's own child goes on meanwhile (accuracy, timing, its technique phase)
    job.outcome.technique = {"passed": True, "line": "conv2 uses shared memory: PASS (kernel: 1024 bytes)"}
    t = time.monotonic()
    job._technique_counted()
    assert time.monotonic() - t < 0.3, "it was not running beside the job"
    assert job.outcome.technique["line"].endswith("(counted)") and job.outcome.technique["gpu"].endswith("bytes)")
    assert job.outcome.technique_child == {"start": 1.0, "technique": 2.0}
    assert job.clock.stop()["technique"] < 0.3  # only the wait is this job's phase


# ------------------------------------------------------------------------------------------ a graded class

RUBRIC = """
[limits]
time_s = 300
sim_time_s = 300
min_time_s = 60
[checks]
batches = [1]
[accuracy]
images = 2
[timing]
images = 2
warmup = 1
repeat = 2
[stage."01"]
timing = { images = 2 }
"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A stage-01 student copy (it fails at its first check: a quick job) graded into the cache and from it, with
    the reference jobs counted (the second run must run none)."""
    from labkit import grading

    root = tmp_path_factory.mktemp("throughput")
    (root / "class" / "ada" / "notebooks").mkdir(parents=True)
    shutil.copy(REPO / "notebooks" / STAGES["01"].notebook, root / "class" / "ada" / "notebooks")
    (root / "rubric.toml").write_text(RUBRIC)
    reports, ran = {}, []
    real = context.reference_job  # what a run's context calls for each stage's reference job

    def counted(*args, **kw):
        ran.append(args[0].stage.number)
        return real(*args, **kw)

    context.reference_job = counted
    try:
        for name in ("into", "from"):
            before = len(ran)
            reports[name] = grading.grade(root / "class", stages=["01"], rubric=root / "rubric.toml",
                                          out=root / name, progress=False, seed=5, jobs=1, cache=root / "cache")
            reports[name]["reference_jobs_run"] = len(ran) - before
    finally:
        context.reference_job = real
    return reports


def test_a_hit_skips_the_reference_job_and_the_report_says_so(two_runs):
    into, hit = two_runs["into"], two_runs["from"]
    assert into["reference_jobs_run"] == 1 and hit["reference_jobs_run"] == 0
    stored, read = into["meta"]["reference_cache"]["stages"]["01"], hit["meta"]["reference_cache"]["stages"]["01"]
    assert stored["from_cache"] is False and read["from_cache"] is True
    assert read["key"] == stored["key"] and read["measured"] == stored["measured"]
    assert hit["meta"]["reference_jobs"]["01"]["from_cache"] is True
    # no reference job held the machine's turn in the second run (the student copy is never timed)
    assert into["meta"]["turns"]["turns"] == 1 and hit["meta"]["turns"]["turns"] == 0
    # the student's limit is the stored job's, and so are its timing attempts (a slow one moves every ratio)
    assert hit["meta"]["time_limits"] == into["meta"]["time_limits"]
    attempts = into["meta"]["time_limits"]["01"]["reference_attempts"]
    assert attempts and attempts[0]["attempt"] == 0 and attempts[0]["speed_us"] > 0, attempts
    assert hit["meta"]["reference_jobs"]["01"]["attempts"] == attempts
    assert hit["meta"]["reference_jobs"]["01"]["seconds"] == into["meta"]["reference_jobs"]["01"]["seconds"]
    for report in (into, hit):
        row = report["rows"][0]
        assert row["status"] == "fail" and "not implemented" in row["message"], row["message"]


def test_every_row_and_reference_job_says_where_its_time_went(two_runs):
    for name, report in two_runs.items():
        row = report["rows"][0]
        got = row["details"]["phases_s"]
        assert {"start", "inputs", "load", "checks", "end"} <= set(got), got
        assert all(s >= 0 for s in got.values()) and got["start"] > 0 and got["checks"] > 0
        assert phases.own_seconds(got) <= row["seconds"] + 0.02, (name, got, row["seconds"])
        assert phases.own_seconds(got) >= 0.9 * row["seconds"], "a phase went unmeasured"
        stage = report["meta"]["phases_s"]["01"]
        assert stage["rows"] == 1 and stage["phases_s"] == phases.rounded(got)
        ran = row["details"]["ran"]  # on the wall clock: the job, and the part of its slot its reference took
        assert ran["from"] <= ran["to"] and ran["to"] - ran["from"] >= row["seconds"] - 0.5, (ran, row["seconds"])
        assert 0 <= ran["reference_s"] <= ran["to"] - ran["from"]
    measured, read = (two_runs[n]["rows"][0]["details"]["ran"]["reference_s"] for n in ("into", "from"))
    ref_job = two_runs["into"]["meta"]["reference_jobs"]["01"]
    assert measured >= 0.9 * ref_job["seconds"] and read < 0.5 * ref_job["seconds"], (measured, read)
    assert ref_job["ran"][1] - ref_job["ran"][0] >= ref_job["seconds"] - 0.5
    ref = two_runs["into"]["meta"]["reference_jobs"]["01"]["phases_s"]  # the solution: every phase ran
    assert all(ref[p] > 0 for p in ("start", "inputs", "load", "checks", "accuracy", "timing")), ref
    assert phases.own_seconds(ref) <= two_runs["into"]["meta"]["reference_jobs"]["01"]["seconds"] + 0.1


def test_a_per_image_variant_not_timed_runs_on_fewer_accuracy_images(tmp_path):
    """Stage 04's per-image variants run the batched variants' kernels image by image: accuracy.per_image of the
    images (the timed variant, per image or not, keeps them all; 0 or absent: all of them)."""
    import random

    from labkit.grading.rubric import RubricError

    def read_rubric_text(text):
        path = tmp_path / f"r{random.random()}.toml"
        path.write_text(text)
        return load_rubric(path)

    per_image = random.randint(2, 50)
    images = per_image + random.randint(1, 500)
    rub = read_rubric_text(f"[accuracy]\nimages = {images}\nper_image = {per_image}\n").for_stage("04")

    def spec(name, one_by_one):
        return VariantSpec(name=name, target="gpu", arrays="device", per_image=one_by_one, nets=("cifar10", "fashion"),
                           layers={"cifar10": ["conv1"], "fashion": ["conv1"]})

    variants = {"host": spec("host", True), "device": spec("device", True), "batched": spec("batched", False)}
    for timed in ("batched", "device"):
        runs = StagePlan(STAGES["04"], Path("s.ipynb"), rub, variants, timed, True, "", 60.0).accuracy_runs()
        want = {(v, n): images if (v == timed or not variants[v].per_image) else per_image
                for v in variants for n in ("cifar10", "fashion")}
        assert {(v, n): k for v, n, k, _ in runs} == want
    whole = read_rubric_text(f"[accuracy]\nimages = {images}\nper_image = 0\n").for_stage("04")
    assert {k for _, _, k, _ in StagePlan(STAGES["04"], Path("s.ipynb"), whole, variants, "batched", True, "",
                                          60.0).accuracy_runs()} == {images}
    assert load_rubric().for_stage("04")["accuracy"]["per_image"] == 100  # the shipped rubric's
    with pytest.raises(RubricError, match="per_image"):
        read_rubric_text("[accuracy]\nper_image = -1\n")


def test_a_layers_batch_sizes_share_weight_values_where_shapes_agree(plan, tmp_path, monkeypatch):
    """A constant-memory kernel compiles once per weights (stage 06: 60 s of checks a job on an H100 with new
    weights for every batch size): the cases of a layer share weight values where their shapes agree, each with
    arrays of its own; the first batch size's last case gets new values (a kernel kept by shape or by id() of a
    freed array is wrong there). The whole network's two batches have values of their own, and the layer's cases
    take theirs: the real sizes the first's, the last case the second's, so the network's check compiles nothing
    new (stage 06: about 80 kernels a job before)."""
    import numpy as np

    from labkit.grading.job import GradingJob
    from labkit.grading.plan import References
    from labkit.launch import simulator

    monkeypatch.setattr(simulator, "active", lambda: False)  # a GPU's cases: real sizes, then the shrunk shapes
    plan.measured = False
    job = GradingJob(plan, References(), "s", plan.solution, 11, gpu=True)
    job.build(tmp_path)
    job._ahead.cancel()
    layer = [c for c in job.cases.values() if c["layer"] is not None]
    real = [c for c in layer[:-1] if not isinstance(c["batch"], simulator.Shrunk)]
    shrunk = {int(c["batch"]): c for c in layer[:-1] if isinstance(c["batch"], simulator.Shrunk)}
    assert len(real) >= 3 and set(shrunk) == set(simulator.BATCHES)

    def same(a, b):
        return all(np.array_equal(a["weights"][k], b["weights"][k]) for k in a["weights"])

    assert all(same(c, real[0]) and c["weights"]["conv1.weight"] is not real[0]["weights"]["conv1.weight"]
               for c in real[1:])
    assert same(shrunk[67], shrunk[2]) and not same(shrunk[1], shrunk[3])  # (2 and 67 shrink to one shape)
    again = layer[-1]
    assert again["batch"] == real[0]["batch"] and not same(again, real[0])
    nets = [c for c in job.cases.values() if c["layer"] is None]
    assert len(nets) >= 2 and not same(nets[0], nets[1])
    assert same(real[0], nets[0]) and same(again, nets[1])  # each layer's weights, compared by its names
    assert again["weights"]["conv1.weight"] is not nets[1]["weights"]["conv1.weight"]


def test_a_runs_jobs_time_the_same_passes_and_their_answers_are_computed_once(plan, tmp_path, monkeypatch):
    """On an H200 the float64 reference's answers on each job's own timed passes (9 x 1200 images a job) were most
    of a grading worker's processor time, beside the jobs: the jobs of a run now draw their timed passes
    from the run's seed (new images every run, the same for every job), and each pass's answer is computed once
    for them all. A job without the run's seed (a partner, one job alone) draws its own; so does a run with
    another seed."""
    import copy

    import numpy as np

    from labkit.grading import inputs, verdicts
    from labkit.grading.job import GradingJob
    from labkit.grading.plan import References
    from labkit.launch import simulator

    monkeypatch.setattr(simulator, "active", lambda: False)
    plan.rubric = copy.deepcopy(plan.rubric)
    plan.rubric["timing"].update(images=6, repeat=3)
    inputs_seen = []  # each float64 forward's images
    real = verdicts.reference.forward
    monkeypatch.setattr(verdicts.reference, "forward", lambda net, w, x, **kw: inputs_seen.append(x) or
                        real(net, w, x, **kw))
    refs = References()

    def job(student_seed, passes):
        j = GradingJob(plan, refs, f"s{student_seed}", plan.solution, student_seed, gpu=True)
        j.passes_seed = passes
        (tmp_path / f"j{student_seed}").mkdir()
        j.build(tmp_path / f"j{student_seed}")
        return j

    assert inputs.passes_seed(2033) == inputs.passes_seed(2033) != inputs.passes_seed(2034)
    a, b, own, other = job(1, 7), job(2, 7), job(3, None), job(4, 8)
    assert len(a._pass_images) == 3 and all(np.array_equal(x, y) for x, y in zip(a._pass_images, b._pass_images))
    assert not any(np.array_equal(x, y) for x, y in zip(a._pass_images, own._pass_images))
    assert not any(np.array_equal(x, y) for x, y in zip(a._pass_images, other._pass_images))
    answers = {j: [j._pass_answer(k) for k in range(3)] for j in (a, b, own, other)}
    for j in answers:
        j._ahead.cancel()
    assert all(np.array_equal(x, y) for x, y in zip(answers[a], answers[b]))

    def computed(j):  # forwards run on a job's pass images
        return sum(any(x is y or (x.shape == y.shape and np.array_equal(x, y)) for y in j._pass_images)
                   for x in inputs_seen)

    assert computed(a) == 3 and computed(own) == 3 and computed(other) == 3  # a and b: once for both


def test_a_shared_value_is_computed_once_and_a_failure_by_the_next_caller():
    from labkit.grading.plan import References

    refs, calls = References(), []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return len(calls)

    got = []
    threads = [threading.Thread(target=lambda: got.append(refs.shared("k", slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [1, 1, 1, 1] and len(calls) == 1

    def broken():
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        refs.shared("b", broken)
    assert refs.shared("b", lambda: 5) == 5


@pytest.mark.parametrize("pass_over", [True, False])
def test_a_free_slot_passes_over_a_task_that_would_wait_for_its_reference(pass_over):
    """``run.run_local``: the first job of a stage runs its reference job in its slot; another job of that stage
    would wait in a second slot meanwhile, so that slot takes a job of another stage first (on an H100 the slots of
    a class stood idle for the stage-06 and -09 references, `results/h100x2-2026-11-27c/`)."""
    from labkit.grading import run

    tasks = [{"student": s, "stage": st, "notebook": "nb"} for s, st in (("a", "06"), ("b", "06"), ("c", "04"))]
    started, finished, lock = [], set(), threading.Lock()

    def runner(task, env):
        with lock:
            started.append(task["student"])
        time.sleep(0.3 if task["student"] == "a" else 0.05)  # a runs stage 06's reference, then its own job
        finished.add(task["student"])
        return {"student": task["student"], "details": {}}

    def waits(task):  # b's stage has its reference running (in a's slot) until a is done
        return task["stage"] == "06" and task["student"] != "a" and "a" not in finished

    rows = run.run_local(tasks, 2, runner, waits=waits if pass_over else None)
    assert [r["student"] for r in rows] == ["a", "b", "c"]  # the rows stay in the tasks' order
    assert started[:2] == (["a", "c"] if pass_over else ["a", "b"]), started
    assert sorted(started) == ["a", "b", "c"]


def test_a_job_waits_for_its_reference_only_while_another_slot_runs_it(plan):
    import copy
    import dataclasses

    ctx = object.__new__(context.Context)
    ctx._lock, ctx._locks, ctx._timings, ctx.plans = threading.Lock(), {}, {}, {"05": plan}
    task = {"stage": "05", "notebook": "nb"}
    assert not ctx.waits_for_reference(task)  # not started: this slot would run it
    ctx._locks[("05", None)] = threading.Lock()
    with ctx._locks[("05", None)]:
        assert ctx.waits_for_reference(task) and not ctx.waits_for_reference({**task, "notebook": None})
        assert not ctx.waits_for_reference(task, {"CUDA_VISIBLE_DEVICES": "1"})  # another GPU's reference
        # the limit as given and a partner timing the reference in its turns: it starts now, reads it after
        rubric = copy.deepcopy(plan.rubric)
        rubric["limits"]["time_factor"], rubric["timing"]["paired"] = 0, "always"
        ctx.plans["05"] = dataclasses.replace(plan, rubric=rubric, measured=True)
        assert ctx.defers_reference(ctx.plans["05"]) and not ctx.waits_for_reference(task)
        ctx.plans["05"] = plan
    assert not ctx.waits_for_reference(task)


def test_a_free_slot_takes_the_costliest_stages_next_job_and_an_unseen_stage_first():
    """``backlog.Backlog``: longest jobs first, so that short ones end the run (on two H100s the slots stood idle
    while the last stage-06 and -09 jobs ran alone, `results/h100x2-2026-11-27c/`); a stage not seen yet first."""
    from labkit.grading.backlog import Backlog

    tasks = [{"student": s, "stage": st, "notebook": "nb"} for s, st in
             (("a", "04"), ("b", "06"), ("c", "04"), ("d", "06"), ("e", "05"), ("f", "04"))]
    tasks.append({"student": "g", "stage": "06", "notebook": None})  # missing: nothing to grade, last
    backlog = Backlog(tasks)
    first = [backlog.take() for _ in range(2)]
    assert first == [0, 1]  # nothing known yet: the tasks' order
    backlog.done(0, {"details": {"ran": {"from": 0.0, "to": 12.0, "reference_s": 10.0}}})  # 04: 2 s a job
    backlog.done(1, {"details": {"ran": {"from": 0.0, "to": 70.0, "reference_s": 0.0}}})  # 06: 70 s
    assert backlog.cost("04") == 2.0 and backlog.cost("06") == 70.0 and backlog.cost("05") == float("inf")
    assert [backlog.take() for _ in range(6)] == [4, 3, 2, 5, 6, None]  # 05 unseen, then 06, then 04; g last
