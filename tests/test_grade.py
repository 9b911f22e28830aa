"""The grader on synthetic submissions made from the stage-01 solution: each is graded as it should be, in one run;
then the same class re-graded in part (one student), on a Dask LocalCluster (the cluster path), on two stand-in GPUs
(the --gpus path through dask-cuda, tests/fake_dask_cuda.py), and as a single submission (Gradescope's layout).

Stage 01 is CPU code (numba ``@njit``), so it is fully checked and timed even under the CUDA simulator.
A small test rubric keeps the run short: batch sizes 1 and 3, 12 images for accuracy, 4 for timing. It holds with
the real data (``LABKIT_DATA``) and without it (accuracy is then not scored). The stage-04 class of wrong
submissions is tests/test_grade_wrong.py.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from click.testing import CliRunner

from labkit import check, data, device, grading, simulator
from labkit.cli import main
from labkit.grading import protocol, sandbox
from labkit.stages import STAGES

REPO = Path(__file__).resolve().parent.parent
SOLUTION = REPO / "solutions" / "01_serial_baseline.ipynb"
NB = SOLUTION.name
HALO = "r = i * stride + p - pad"
LOOP_NEST = "N, M, Ho, Wo = out.shape"
TIME_LIMIT = 120
# kernel cells of the stage-01 solution, in order
CONV_POINT, CONV_FORWARD, CHEAP_LAYERS, VARIANTS_CELL = range(4)

TEST_RUBRIC = f"""
[limits]
time_s = {TIME_LIMIT}
sim_time_s = {TIME_LIMIT}
min_time_s = 45       # the limit follows from the reference solution's job (time_factor), at most TIME_LIMIT
memory_mb = 6144

[checks]
batches = [1, 3]

[accuracy]
images = 12

[timing]
images = 4
warmup = 1
repeat = 3

[op_time]
# timings on a shared 2-core test machine are noisy: any ratio up to 10 earns the op-time points here
full_at_ratio = 10.0
zero_at_ratio = 20.0

[stage."01"]
timing = {{ images = 4 }}
"""

# Every monkeypatch that could hide a wrong conv or fake the clock: labkit.check, the engine (computing the
# reference's answer instead of the student's, in no time), the timer, time.perf_counter, the worker's own clock.
PATCHER = r'''
import time
import numpy as np
import labkit
import labkit.check
import labkit.engine
import labkit.layers
import labkit.reference
import labkit.timing

_conv2d, _layer_forward = labkit.reference.conv2d, labkit.reference.layer_forward


def _right_answer(fn, layer, x, w, arrays="host"):  # the reference's output, whatever the student's function does
    w = labkit.layers.with_biases([layer], w)
    if layer.kind == "conv":
        y = _conv2d(x, w[layer.name + ".weight"], w[layer.name + ".bias"], layer.pad, layer.stride, "float64")
    else:
        y = _layer_forward(layer, x, w, "float64")
    return y.astype(np.float32)


def _fast_forward(net, variant, prepared, *, clock=None, check=False):  # the right answer, in no time
    y = np.asarray(prepared.x)
    for layer in net.layers:
        if clock is not None:
            with clock.section(layer.name):
                pass
        y = y.reshape(len(y), -1) if layer.kind == "flatten" else _right_answer(None, layer, y, prepared.weights)
    return y


def _tamper():
    import __main__  # the grade worker itself
    _ok = lambda name, *a, **k: labkit.check.CheckResult(name, True, 0.0)
    labkit.check.compare = _ok
    labkit.check.check_layer = lambda fn, net, layer, **k: _ok(layer)
    labkit.engine.call_layer = _right_answer
    labkit.engine.forward = _fast_forward
    labkit.engine.time_passes = lambda net, variant, prepared, repeat, **k: (
        None, [{n: 0.0 for n in net.layer_names} for _ in range(repeat)])
    labkit.reference.conv2d = lambda *a, **k: None
    time.perf_counter = lambda: 0.0
    labkit.timing.Timer = None
    labkit.timing.Clock = None
    labkit.timing.measure = lambda *a, **k: None
    __main__._perf_counter = lambda: 0.0
    import labkit.grading.timed as _timed  # the child's clock, bound before any student code
    _timed._perf_counter = lambda: 0.0
    for _obj in [*vars(__main__).values(), *vars(_timed).values()]:  # any class of the worker with a clock's methods
        if isinstance(_obj, type):
            _obj.section = lambda self, name: __import__("contextlib").nullcontext()
            _obj.seconds = lambda self: {}


_tamper()
'''

# ... and again from inside the student's conv function, while a pass runs
PATCH_WHILE_RUNNING = r'''

_conv_impl = VARIANTS["serial"].impls["conv"]


def _conv_and_tamper(x, w, b, out, pad, stride):
    _conv_impl(x, w, b, out, pad, stride)
    _tamper()


VARIANTS["serial"].impls["conv"] = _conv_and_tamper
'''


def _kernel_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]


def _submission(root: Path, student: str, edit=None) -> Path:
    """``root/student/notebooks/01_serial_baseline.ipynb``, its kernel cells changed by ``edit(cells)``."""
    folder = root / student / "notebooks"
    folder.mkdir(parents=True)
    nb = nbformat.read(SOLUTION, as_version=4)
    if edit is not None:
        edit(_kernel_cells(nb))
    nbformat.write(nb, folder / NB)
    return folder / NB


def _replace(cells, index, old, new):
    assert old in cells[index].source, f"the solution's kernel cell {index} no longer contains {old!r}"
    cells[index].source = cells[index].source.replace(old, new, 1)


def halo_off_by_one(cells):
    _replace(cells, CONV_POINT, HALO, HALO + " + 1")


def unwritten(cells):  # the last output row of every map is never written
    _replace(cells, CONV_FORWARD, "for i in range(Ho):", "for i in range(Ho - 1):")


def raises(cells):
    _replace(cells, CONV_FORWARD, LOOP_NEST, LOOP_NEST + "\n    if N > 0:\n        raise ValueError('index out of range')")


def loops_forever(cells):
    _replace(cells, CONV_FORWARD, LOOP_NEST, LOOP_NEST + "\n    k = 1\n    while k > 0:\n        k = (k * 3) % 7 + 1")


def patcher(cells):  # a wrong conv, every monkeypatch that could hide it or fake the clock, and a write to labkit
    halo_off_by_one(cells)
    cells[VARIANTS_CELL].source = (PATCHER + "\n" + cells[VARIANTS_CELL].source + PATCH_WHILE_RUNNING
                                   + "\ntry:  # the job's private copy: read-only in a sandbox\n"
                                     "    with open(labkit.check.__file__, 'a') as _fh:\n"
                                     "        _fh.write('\\ncompare = lambda *a, **k: CheckResult(a[0], True, 0.0)\\n')\n"
                                     "except OSError:\n"
                                     "    pass\n")


def fast_clock(cells):  # a right conv that tries to make itself look fast (patches at load time and while timed)
    cells[VARIANTS_CELL].source = PATCHER + "\n" + cells[VARIANTS_CELL].source + PATCH_WHILE_RUNNING


def syntax_error(cells):
    _replace(cells, CHEAP_LAYERS, "def fc_forward(x, w, b, out):", "def fc_forward(x, w, b, out:")


def patches_mid_pass(cells):  # a right conv that, once running, makes the engine skip every later layer of a pass
    cells[VARIANTS_CELL].source += """

import labkit.layers

_conv_right = VARIANTS["serial"].impls["conv"]


def conv_then_skip(x, w, b, out, pad, stride):
    _conv_right(x, w, b, out, pad, stride)
    labkit.layers.impl_for = lambda impls, layer: (lambda *args: None)


VARIANTS["serial"].impls["conv"] = conv_then_skip
"""


def caches_when_timed(cells):  # right everywhere, except in the timed passes: there it hands back its first result
    cells[VARIANTS_CELL].source += """

import sys as _sys

_conv_right = VARIANTS["serial"].impls["conv"]
_first = {}


def _timed():
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("time_passes", "timed_passes"):
            return True
        frame = frame.f_back
    return False


def conv_cached_when_timed(x, w, b, out, pad, stride):
    if _timed() and out.shape in _first:
        out[...] = _first[out.shape]
        return
    _conv_right(x, w, b, out, pad, stride)
    if _timed():
        _first[out.shape] = out.copy()


VARIANTS["serial"].impls["conv"] = conv_cached_when_timed
"""


def crashes(cells):  # the process dies under the grader (a segfault would read the same)
    cells[VARIANTS_CELL].source += "\n\nimport os as _os\n\n" \
                                   "def conv_forward(x, w, b, out, pad, stride):\n    _os.abort()\n\n" \
                                   "VARIANTS['serial'].impls['conv'] = conv_forward\n"


SUBMISSIONS = {
    "correct": None,
    "halo": halo_off_by_one,
    "unwritten": unwritten,
    "raises": raises,
    "loops": loops_forever,
    "patcher": patcher,
    "fastclock": fast_clock,
    "syntax": syntax_error,
    "crash": crashes,
    "midpass": patches_mid_pass,
    "timedcache": caches_when_timed,
}


def _labelled() -> bool:
    """Real images with labels are there (LABKIT_DATA, data/ or the user cache): accuracy can be scored."""
    return data.available("cifar10") or data.available("fashion")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One `labkit grade` run over every synthetic submission (and a student without the stage)."""
    root = tmp_path_factory.mktemp("grade")
    subs = root / "submissions"
    for name, edit in SUBMISSIONS.items():
        _submission(subs, name, edit)
    (subs / "nostage" / "notebooks").mkdir(parents=True)
    (subs / "nostage" / "notebooks" / "README.md").write_text("forgot to hand in\n")
    rubric = root / "rubric.toml"
    rubric.write_text(TEST_RUBRIC)
    out = root / "out"
    result = CliRunner().invoke(main, ["grade", str(subs), "--stages", "01", "--rubric", str(rubric), "--out",
                                       str(out), "--jobs", "2", "--seed", "408"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads((out / "grades.json").read_text())
    return {"rows": {r["student"]: r for r in report["rows"]}, "report": report, "out": out,
            "output": result.output, "submissions": subs, "rubric": rubric}


def test_run_completes_with_one_row_per_student_and_stage(graded):
    rows = graded["rows"]
    assert set(rows) == {*SUBMISSIONS, "nostage"}
    with open(graded["out"] / "grades.csv") as fh:
        table = list(csv.DictReader(fh))
    assert sorted((r["student"], r["stage"]) for r in table) == sorted((s, "01") for s in rows)
    assert {"status", "passed", "error", "accuracy", "op_time_s", "ratio", "score", "message"} <= set(table[0])
    out = graded["output"]
    assert "stage 01" in out and "total" in out and "problems:" in out
    meta = graded["report"]["meta"]
    assert meta["seed"] == 408 and meta["stages"] == ["01"] and meta["op_time"]["01"] == "measured"
    assert meta["timed_variants"] == {"01": "01 serial"}  # labkit.stages.label
    assert meta["batches"]["01"]["serial"] == {"layers": [1, 3], "repeat": 1, "network": list(check.NETWORK_BATCHES)}
    # the seed of each (student, stage) comes from the run's seed and the names alone (any machine, any order)
    assert all(r["seed"] == grading.job_seed(408, r["student"], "01") for r in graded["rows"].values())
    env = meta["environment"]  # what it was graded with, in every report
    assert env["numpy"] == np.__version__ and env["numba"] and env["numba-cuda"] and env["python"]
    assert env["labkit"] and "cupy" in env and env["device"] == meta["device"]
    if env["simulated"]:
        assert env["gpu"] is None and "simulator" in env["note"]
    assert "environment: " in graded["output"]
    assert meta["accuracy"]["01"] == ("scored" if _labelled() else "not scored (no labelled images)")


def test_correct_submission_gets_full_marks(graded):
    r = graded["rows"]["correct"]
    assert r["status"] == "pass" and r["passed"], r["message"]
    assert r["correctness_points"] == 50
    assert r["error"] < 1e-5
    assert r["op_time_s"] > 0 and r["reference_op_time_s"] > 0
    assert r["ratio"] == pytest.approx(r["op_time_s"] / r["reference_op_time_s"])
    assert r["op_time_points"] == 30
    # op time: the best (minimum) of the timed passes, the spread kept; every pass predicted what the reference does
    spread = r["details"]["op_time_spread"]
    assert r["op_time_s"] == spread["student"]["min"] <= spread["student"]["median"] <= spread["student"]["max"]
    # three passes an attempt; a core that ran slow was timed again, up to three attempts (tests/test_retime.py)
    attempts = len(r["details"]["turn"]["attempts"])
    assert 1 <= attempts <= 3 and [a["attempt"] for a in r["details"]["turn"]["attempts"]] == list(range(attempts))
    assert r["reference_op_time_s"] == spread["reference"]["min"] and spread["student"]["runs"] == 3 * attempts
    # op time is the whole pass (every layer, and whatever the pass left running), each layer's time kept beside it
    runs = r["details"]["op_time_runs"]["student"]
    assert r["op_time_s"] == pytest.approx(min(run["pass"] for run in runs))
    assert all(run["pass"] >= sum(run[c] for c in ("conv1", "conv2", "conv3", "fc")) for run in runs)
    assert r["details"]["timed_predictions"]["student_mismatches"] == [0] * (3 * attempts)
    assert "all checks pass" in r["message"]
    checks = r["details"]["checks"]  # every layer of both nets at both batch sizes, and each whole forward pass
    assert sum("cifar10 forward: PASS" in c for c in checks) == len(check.NETWORK_BATCHES)
    assert sum("fashion forward: PASS" in c for c in checks) == len(check.NETWORK_BATCHES)
    assert all(c.startswith("[01 serial] ") for c in checks)
    if _labelled():
        assert r["accuracy_points"] == 20 and r["score"] == r["max_score"] == 100
        assert r["accuracy"] == r["reference_accuracy"] and 0 < r["accuracy"] <= 1
        assert "accuracy equals the reference's" in r["message"]
    else:  # synthetic inputs have no labels: no accuracy points, and none in the maximum either
        assert r["accuracy_points"] == 0 and r["score"] == r["max_score"] == 80
        assert r["accuracy"] == "n/a (synthetic inputs)" and r["reference_accuracy"] is None
        assert "accuracy not scored" in r["message"]


@pytest.mark.parametrize("student, words", [
    ("halo", ["conv1: FAIL", "first wrong element", "[seed"]),
    ("unwritten", ["conv1: FAIL", "unwritten (still NaN)"]),
    ("raises", ["conv1: FAIL", "raised ValueError: index out of range"]),
])
def test_wrong_submissions_fail_their_checks(graded, student, words):
    r = graded["rows"][student]
    assert r["status"] == "fail" and not r["passed"]
    assert r["score"] == 0 and r["correctness_points"] == 0 and r["op_time_points"] == 0
    for w in words:
        assert w in r["message"], r["message"]
    assert r["op_time_s"] is None  # a failing submission is not timed
    assert r["max_score"] == graded["rows"]["correct"]["max_score"]


def test_patching_labkit_and_the_clock_is_reported_as_tampering(graded):
    r = graded["rows"]["patcher"]
    # every patch made by its cells is named (compared with the snapshot taken before any student code existed)
    assert r["status"] == "tampered" and r["score"] == 0 and not r["passed"] and r["op_time_s"] is None
    for name in ("labkit.check.compare", "labkit.engine.forward", "labkit.engine.time_passes",
                 "while loading the kernel cells"):
        assert name in r["message"], r["message"]
    changed = r["details"]["tampered"]["what"]
    assert {"time.perf_counter", "labkit.timing.Clock", "labkit.reference.conv2d",
            "labkit.grading.timed._perf_counter"} <= set(changed), changed
    # its write to labkit/core/check.py: refused in a sandbox (tests/test_grade_isolation.py); unsandboxed it hits the
    # job's private copy only, and is reported
    if graded["report"]["meta"]["sandbox"]["mode"] == "none":
        assert "check.py" in r["message"] and "on disk" in r["message"]
    assert "compare = lambda" not in (REPO / "labkit" / "core" / "check.py").read_text()


def test_patching_the_clock_is_tampering_even_with_a_right_conv(graded):
    r = graded["rows"]["fastclock"]
    assert r["status"] == "tampered" and r["score"] == 0 and r["op_time_s"] is None, r["message"]
    assert "labkit.grading.timed._perf_counter" in r["details"]["tampered"]["what"], r["details"]["tampered"]
    assert "time.perf_counter" in r["details"]["tampered"]["what"]


def test_patching_the_layer_lookup_in_the_middle_of_a_pass_is_seen(graded):
    r = graded["rows"]["midpass"]
    # labkit was put back before each call, so the patch could only act within one pass: it is caught right after
    # the call that made it, named, with the call
    assert r["status"] == "tampered" and r["score"] == 0, r["message"]
    assert "labkit.layers.impl_for" in r["message"] and "during conv1 (batch size 1)" in r["message"]


def test_timed_passes_must_predict_what_the_reference_does(graded):
    r = graded["rows"]["timedcache"]
    # right in every check and on the real images; in the timed passes it hands back a kept result: the parent
    # compares each timed pass's predictions with the reference's (pass k on the images rotated by k)
    assert r["status"] == "fail" and not r["passed"] and r["op_time_points"] == 0, r["message"]
    assert r["correctness_points"] == 50
    assert "timed pass 1" in r["message"] and "predicted differently" in r["message"]
    assert max(r["details"]["timed_predictions"]["student_mismatches"]) > \
        r["details"]["timed_predictions"]["allowed"]


def test_infinite_loop_is_killed_at_the_time_limit(graded):
    r = graded["rows"]["loops"]
    assert r["status"] == "timeout" and r["score"] == 0
    # the limit follows from the stage's reference: 5 (time_factor) times its job's wall time, within [45, 120] s
    limits = graded["report"]["meta"]["time_limits"]["01"]
    assert abs(limits["time_limit_s"] - min(TIME_LIMIT, max(45, 5 * limits["reference_job_s"]))) <= 1, limits
    assert f"time limit ({limits['time_limit_s']} s)" in r["message"] and "conv1" in r["message"], r["message"]
    assert r["seconds"] < limits["time_limit_s"] + 30


def test_syntax_error_crash_and_missing_stage(graded):
    rows = graded["rows"]
    assert rows["syntax"]["status"] == "error" and rows["syntax"]["score"] == 0
    assert "SyntaxError" in rows["syntax"]["message"] and "cell" in rows["syntax"]["message"]
    assert rows["crash"]["status"] == "error" and rows["crash"]["score"] == 0
    assert "ended unexpectedly" in rows["crash"]["message"] and "SIGABRT" in rows["crash"]["message"]
    assert rows["nostage"]["status"] == "missing" and rows["nostage"]["score"] == 0
    assert "missing stage" in rows["nostage"]["message"]


def test_gradescope_results_for_every_student(graded):
    for student, r in graded["rows"].items():
        res = json.loads((graded["out"] / "gradescope" / student / "results.json").read_text())
        assert res["score"] == r["score"] and {"tests", "leaderboard", "output", "execution_time"} <= set(res)
        names = [t["name"] for t in res["tests"]]
        assert names[0] == "stage 01: correctness" and "stage 01: op time" in names
        assert sum(t["score"] for t in res["tests"]) == pytest.approx(r["score"])
        assert sum(t["max_score"] for t in res["tests"]) == pytest.approx(r["max_score"])
        assert all(t["visibility"] == "visible" and isinstance(t["output"], str) for t in res["tests"])
        assert "[seed" not in json.dumps(res)  # the inputs' seed is the staff's
    good = json.loads((graded["out"] / "gradescope" / "correct" / "results.json").read_text())
    assert good["leaderboard"] == [{"name": "stage 01 op time (s)", "value": round(graded["rows"]["correct"]
                                                                                    ["op_time_s"], 6), "order": "asc"}]
    halo = json.loads((graded["out"] / "gradescope" / "halo" / "results.json").read_text())
    assert halo["leaderboard"] == [] and "conv1: FAIL" in halo["tests"][0]["output"]


def test_regrading_one_student_replaces_only_that_row(graded, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(graded["out"], out)
    before = json.loads((out / "grades.json").read_text())
    result = CliRunner().invoke(main, ["grade", str(graded["submissions"]), "--students", "syntax", "--stages", "01",
                                       "--rubric", str(graded["rubric"]), "--out", str(out), "--seed", "409",
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "merged into the existing grades.json: replaced 1 row and added 0 (students syntax; stages 01); kept the " \
           f"other {len(before['rows']) - 1}" in result.output
    after = json.loads((out / "grades.json").read_text())
    assert [(r["student"], r["stage"]) for r in after["rows"]] == [(r["student"], r["stage"]) for r in before["rows"]]
    for old, new in zip(before["rows"], after["rows"]):
        if old["student"] == "syntax":
            assert new["seed"] == grading.job_seed(409, "syntax", "01") != old["seed"]
            assert new["status"] == "error"
        else:
            assert new == old
    assert [run["seed"] for run in after["meta"]["runs"]] == [408, 409]
    with open(out / "grades.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(before["rows"])
    bad = CliRunner().invoke(main, ["grade", str(graded["submissions"]), "--students", "nobody", "--out", str(out)])
    assert bad.exit_code != 0 and "no student folder 'nobody'" in bad.output


def test_a_single_submission_writes_results_json_where_gradescope_reads_it(graded, tmp_path):
    one = graded["submissions"] / "syntax"
    result = CliRunner().invoke(main, ["grade", str(one), "--stages", "01", "--rubric", str(graded["rubric"]),
                                       "--out", str(tmp_path / "results"), "--no-progress"])
    assert result.exit_code == 0, result.output
    res = json.loads((tmp_path / "results" / "results.json").read_text())
    assert res["score"] == 0 and res["tests"][0]["status"] == "failed" and "SyntaxError" in res["tests"][0]["output"]
    assert not (tmp_path / "results" / "gradescope").exists()
    meta = json.loads((tmp_path / "results" / "grades.json").read_text())["meta"]
    assert meta["seed"] != 408 and meta["seed"] >= 0  # fresh when not given, and recorded


def test_the_cluster_path_gives_the_single_machine_report(graded, tmp_path):
    """A Dask LocalCluster (two worker processes) grades part of the class with the run's seed: the same inputs,
    so the same statuses, checks and accuracy as the single-machine run; op times are measured again."""
    pytest.importorskip("distributed")
    picked = ["correct", "halo", "syntax", "nostage"]
    report = grading.grade(graded["submissions"], stages=["01"], rubric=graded["rubric"], out=tmp_path / "cluster",
                           seed=408, progress=False, students=picked, cluster="local:2")
    assert "LocalCluster of 2 worker processes" in report["meta"]["graded_on"]
    rows = {r["student"]: r for r in report["rows"]}
    assert list(rows) == [s for s in graded["rows"] if s in picked]  # the single machine's order
    for student in picked:
        mine, theirs = rows[student], graded["rows"][student]
        for key in ("status", "score" if student != "correct" else "correctness_points", "seed", "accuracy",
                    "reference_accuracy", "correctness_points", "accuracy_points"):
            assert mine[key] == theirs[key], (student, key, mine[key], theirs[key])
        assert len(mine["details"].get("checks", [])) == len(theirs["details"].get("checks", []))
    assert rows["correct"]["op_time_s"] > 0 and rows["correct"]["details"]["worker"]
    assert grading.compare_reports({"rows": list(rows.values())},
                                   {"rows": [graded["rows"][s] for s in picked]})["differences"] == []


def test_the_gpu_path_gives_the_single_machine_report(graded, tmp_path, monkeypatch):
    """--gpus all on two GPUs (tests/fake_dask_cuda.py stands in for dask-cuda: its worker processes, each with its
    GPU first in CUDA_VISIBLE_DEVICES): one worker per GPU, each job's child pinned to its worker's GPU, each worker
    its own reference job and turns; the same statuses, checks and accuracy as the single-machine run."""
    pytest.importorskip("distributed")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fake_dask_cuda

    from labkit.grading import run

    made = fake_dask_cuda.install(monkeypatch)
    monkeypatch.setattr(run, "available_gpus", lambda: [0, 1])
    picked = ["correct", "halo", "syntax", "nostage"]
    report = grading.grade(graded["submissions"], stages=["01"], rubric=graded["rubric"], out=tmp_path / "gpus",
                           seed=408, progress=False, students=picked, gpus="all", jobs=2)
    assert [(m["CUDA_VISIBLE_DEVICES"], m["n_workers"], m["threads_per_worker"]) for m in made] == [([0, 1], 2, 1)]
    meta = report["meta"]
    assert "GPUs 0, 1 through dask-cuda" in meta["graded_on"] and meta["jobs"]["gpus"] == [0, 1]
    rows = {r["student"]: r for r in report["rows"]}
    assert list(rows) == [s for s in graded["rows"] if s in picked]
    assert grading.compare_reports({"rows": list(rows.values())},
                                   {"rows": [graded["rows"][s] for s in picked]})["differences"] == []
    workers = {f"{w['host']}:{w['pid']}": w for w in meta["turns"]["by_worker"].values()}
    assert sorted(w["gpu"] for w in workers.values()) == ["0", "1"]
    graded_rows = [rows[s] for s in picked if s != "nostage"]
    for row in graded_rows:  # each child on its worker's GPU
        assert row["details"]["gpu"] == workers[row["details"]["worker"]]["gpu"], row["details"]
    assert {row["details"]["gpu"] for row in graded_rows} == {"0", "1"}  # both GPUs graded
    assert all(w["turns"] >= 1 for w in workers.values())  # each GPU's own reference job, in its worker's turn
    assert meta["turns"]["turns"] == sum(w["turns"] for w in workers.values())


@pytest.mark.skipif(device._driver_version() is not None, reason="a CUDA driver is here")
@pytest.mark.parametrize("args, words", [
    (["--gpus", "all"], "there is no GPU here"),
    (["--stages", "99"], "unknown stage '99'"),
    (["--stages", "00"], "defines no VARIANTS"),
    (["--stages", ","], "takes stage numbers"),
    (["--cluster", "moon:3"], "--cluster takes local[:N]"),
    (["--cluster", "slurm"], "needs the number of jobs"),
    (["--jobs", "0"], "0 is not in the range"),
])
def test_bad_grade_arguments_are_refused_in_one_line(tmp_path, args, words):
    (tmp_path / "subs" / "ann" / "notebooks").mkdir(parents=True)
    result = CliRunner().invoke(main, ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code != 0 and words in result.output, result.output
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------- the parts


def test_op_time_ramp():
    assert grading.op_time_fraction(0.5, 1.25, 4.0) == 1.0
    assert grading.op_time_fraction(1.25, 1.25, 4.0) == 1.0
    assert grading.op_time_fraction(4.0, 1.25, 4.0) == 0.0
    assert grading.op_time_fraction(2.625, 1.25, 4.0) == pytest.approx(0.5)


def test_shipped_rubric_and_stage_overrides(tmp_path):
    r = grading.load_rubric()
    assert r.base["points"]["correctness"] > 0
    assert "batches" not in r.base["checks"]  # one source: labkit.check.BATCHES
    assert r.for_stage("02")["checks"]["batches"] == [1, 3, 5]  # the shipped stage override
    custom = tmp_path / "r.toml"
    custom.write_text('[points]\nop_time = 10\n[stage."04".points]\nop_time = 40\n')
    r = grading.load_rubric(custom)
    assert r.for_stage("01")["points"]["op_time"] == 10
    assert r.for_stage("04")["points"]["op_time"] == 40
    assert r.for_stage("04")["points"]["correctness"] == r.base["points"]["correctness"]


def test_batch_sizes_come_from_one_place(tmp_path):
    from labkit.grading.plan import StagePlan

    spec = {"target": "cpu", "arrays": "host", "per_image": True, "nets": ["cifar10"], "layers": {"cifar10": []}}

    def plan(text=""):
        path = tmp_path / "r.toml"
        path.write_text(text)
        rubric = grading.load_rubric(path).for_stage("01")
        return StagePlan(STAGES["01"], SOLUTION, rubric, {"serial": spec}, "serial", True, "", 60.0)

    assert plan().layer_batches("cpu") == check.BATCHES
    assert plan("[checks]\nbatches = [2, 7]\n").layer_batches("cpu") == (2, 7)
    assert plan().network_batches("cpu") == check.NETWORK_BATCHES
    if simulator.shrinks("gpu"):  # GPU code on the simulator is checked at the simulator's sizes, whatever is asked
        assert plan("[checks]\nbatches = [2, 7]\n").layer_batches("gpu") == simulator.BATCHES
        assert plan().network_batches("gpu") == simulator.NETWORK_BATCHES
    else:
        assert plan("[checks]\nbatches = [2, 7]\n").layer_batches("gpu") == (2, 7, *simulator.BATCHES)
        assert plan().network_batches("gpu") == check.NETWORK_BATCHES


@pytest.mark.parametrize("text, words", [
    ("[points\n", "not valid TOML"),
    ("[points]\nbonus = 3\n", "unknown key points.bonus"),
    ("[checks]\nsim_batches = [1]\n", "unknown key checks.sim_batches"),
    ("[accuracy]\nsim_images = 2\n", "unknown key accuracy.sim_images"),
    ("[checks]\nbatches = []\n", "checks.batches must be a list of batch sizes"),
    ('[checks]\nown_layers = ["pool"]\n', "checks.own_layers must list layer kinds"),
    ("[op_time]\nfull_at_ratio = 5.0\nzero_at_ratio = 2.0\n", "full_at_ratio < op_time.zero_at_ratio"),
    ('[stage."42"]\n', "names no stage"),
])
def test_bad_rubric_is_the_graders_error(tmp_path, text, words):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(grading.RubricError, match=words.replace("(", r"\(").replace(".", r"\.")):
        grading.load_rubric(bad)
    result = CliRunner().invoke(main, ["grade", str(tmp_path), "--rubric", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and words in result.output


def test_guard_names_changed_files(tmp_path):
    copied = sandbox.private_labkit(tmp_path / "lib")
    names = {str(p.relative_to(tmp_path / "lib" / "labkit")) for p in copied}
    assert names >= {"__init__.py", "core/check.py", "core/engine.py", "rubric.toml", "grading/worker.py",
                     "grading/protocol.py", "launch/cudacpu/compiler.py"}  # subpackages at any depth
    guard = sandbox.Guard({str(p.relative_to(tmp_path / "lib" / "labkit")): p for p in copied})
    assert guard.changed() == []
    (tmp_path / "lib" / "labkit" / "core" / "check.py").write_text("compare = lambda *a: True")
    (tmp_path / "lib" / "labkit" / "grading" / "worker.py").unlink()
    assert sorted(guard.changed()) == ["core/check.py", "grading/worker.py"]


def test_private_solutions_are_copied_for_from_stage(tmp_path):
    copied = sandbox.private_solutions(REPO / "solutions", tmp_path / "solutions")
    assert {p.name for p in copied} >= {s.notebook for s in STAGES.values() if (REPO / "solutions" / s.notebook).exists()}
    assert (tmp_path / "solutions" / NB).read_bytes() == SOLUTION.read_bytes()


def test_result_frames_are_validated():
    frame = protocol.encode(protocol.CaseResult(3), {"out": np.arange(4, dtype=np.float32)})
    buf = bytearray(frame + protocol.encode(protocol.Done()) + b"junk that a student printed" * 2)
    frames, bad = protocol.parse(buf)
    assert [k for k, _, _ in frames] == [protocol.Kind.CASE, protocol.Kind.DONE] and bad is not None
    assert frames[0][1]["id"] == 3 and frames[0][1]["type"] == "case"
    assert protocol.decode(*frames[0][:2]) == protocol.CaseResult(3)
    assert np.array_equal(protocol.read_array(frames[0][2], "out"), np.arange(4, dtype=np.float32))
    head = json.dumps({"type": "cheer"}).encode()  # a kind neither side defines
    frames, bad = protocol.parse(bytearray(protocol.HEADER.pack(protocol.MAGIC, len(head), 0) + head))
    assert frames == [] and "unknown message 'cheer'" in bad
    with pytest.raises(protocol.ProtocolError, match="CaseResult.id: expected int"):  # a field of the wrong type
        protocol.decode(protocol.Kind.CASE, {"type": "case", "id": "3"})


def test_message_kinds_are_defined_once():
    assert {k.value for k in protocol.Kind} == {"hello", "phase", "start", "load_error", "loaded", "case",
                                                "checks_done", "task", "technique", "accuracy", "accuracy_done",
                                                "turn", "pass", "timing", "tampered", "grader_error", "done"}
    assert set(protocol.MESSAGES) == set(protocol.Kind)  # one message class per kind
    assert {a.value for a in protocol.Answer} == {"continue", "stop", "skip"}
    assert str(protocol.Kind.DONE) == "done" and protocol.Kind("done") is protocol.Kind.DONE


def test_a_job_crosses_the_pipe_as_one_typed_object():
    """The job and its variants: to_json and back gives the same objects (shared by parent and child)."""
    spec = protocol.VariantSpec("v", "gpu", "device", False, ("cifar10",), {"cifar10": ["conv1"]}, fuse=("pool",))
    job = protocol.JobSpec(stage="04", notebook="nb", inputs="in.npz", variants={"v": spec}, nets={},
                           workloads={"w": protocol.WorkloadSpec("cifar10", "w.x", {"conv1.weight": "w.w0"})},
                           cases=[protocol.CaseSpec(0, "v", 3, "conv1", "cifar10", "c0.x", {"conv1.weight": "c0.w0"})],
                           timing=protocol.TimingSpec("v", "w", 1, 3))
    back = protocol.JobSpec.from_json(json.loads(json.dumps(job.to_json())))
    assert back == job and back.variants["v"].nets == ("cifar10",) and isinstance(back.cases[0], protocol.CaseSpec)


def test_submission_layouts(tmp_path):
    stages = [STAGES["01"]]
    _submission(tmp_path / "class", "ann")
    nested = tmp_path / "class" / "ben" / "lab-main" / "notebooks"
    nested.mkdir(parents=True)
    shutil.copy(SOLUTION, nested / NB)
    (tmp_path / "class" / "cat").mkdir()
    subs = {s.student: s for s in grading.find_submissions(tmp_path / "class", stages)}
    assert set(subs) == {"ann", "ben", "cat"}
    assert subs["ben"].notebooks["01"] == nested / NB and "01" not in subs["cat"].notebooks
    one = grading.find_submissions(tmp_path / "class" / "ann" / "notebooks" / NB, stages)
    assert one[0].student == "ann" and list(one[0].notebooks) == ["01"]
    with pytest.raises(grading.GradeError, match="which stage"):
        bad = tmp_path / "x.ipynb"
        bad.write_text("{}")
        grading.find_submissions(bad, stages)


@pytest.mark.skipif(device._driver_version() is not None, reason="a CUDA driver is here: no simulator to switch on")
def test_no_cuda_driver_means_the_simulator(tmp_path):
    """docs/grading.md: without a CUDA driver, `labkit grade` runs on the CUDA simulator (switched on before numba is
    imported); NUMBA_ENABLE_CUDASIM=0 keeps it off; where numba.cuda came first, it says so in one line."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    (tmp_path / "submissions" / "nobody" / "notebooks").mkdir(parents=True)
    (tmp_path / "rubric.toml").write_text(TEST_RUBRIC)

    def grade(out: str, *python: str, **extra: str) -> subprocess.CompletedProcess:
        args = ["grade", str(tmp_path / "submissions"), "--stages", "01", "--rubric", str(tmp_path / "rubric.toml"),
                "--out", str(tmp_path / out), "--no-progress"]
        return subprocess.run([sys.executable, *python, *args], env={**env, **extra}, capture_output=True, text=True,
                              timeout=300)

    def meta(out: str) -> dict:
        return json.loads((tmp_path / out / "grades.json").read_text())["meta"]

    late = grade("late", "-c", "import numba.cuda, sys; from labkit.cli import main; main(sys.argv[1:])")
    errors = [line for line in late.stderr.splitlines() if line.startswith("Error")]
    assert late.returncode != 0 and len(errors) == 1 and "NUMBA_ENABLE_CUDASIM=1" in errors[0], late.stderr
    assert not (tmp_path / "late").exists()
    command = grade("sim", "-m", "labkit")
    assert command.returncode == 0, command.stdout + command.stderr
    assert meta("sim")["simulated"] and meta("sim")["device"] == "CUDA simulator (CPU)"
    off = grade("cpu", "-m", "labkit", NUMBA_ENABLE_CUDASIM="0")  # stage 01 is CPU code: gradable without it
    assert off.returncode == 0, off.stdout + off.stderr
    assert not meta("cpu")["simulated"] and meta("cpu")["device"].startswith("CPU: ")
