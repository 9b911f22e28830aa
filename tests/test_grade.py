"""The grader on synthetic submissions made from the stage-01 solution: each is graded as it should be, in one run.

Stage 01 is CPU code (numba ``@njit``), so it is fully checked and timed even under the CUDA simulator.
A small test rubric keeps the run short: batch sizes 1 and 3, 12 images for accuracy, 4 for timing.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from labkit import grade
from labkit.cli import main
from labkit.grade_worker import HEADER, MAGIC

REPO = Path(__file__).resolve().parent.parent
SOLUTION = REPO / "solutions" / "01_serial_baseline.ipynb"
NB = SOLUTION.name
HALO = "r = i * stride + p - pad"
TIME_LIMIT = 60

TEST_RUBRIC = f"""
[limits]
time_s = {TIME_LIMIT}
sim_time_s = {TIME_LIMIT}
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

PATCHER = r'''
import time
import labkit
import labkit.check
import labkit.reference
import labkit.runner
import labkit.timing

_ok = lambda name, *a, **k: labkit.check.CheckResult(name, True, 0.0)
labkit.check.compare = _ok
labkit.check.check_layer = lambda fn, net, layer, **k: _ok(layer)
labkit.reference.conv2d = lambda *a, **k: None
time.perf_counter = lambda: 0.0
labkit.timing.Timer = None
labkit.timing.measure = lambda *a, **k: None
import __main__  # the grade worker itself
__main__._perf_counter = lambda: 0.0
with open(labkit.check.__file__, "a") as _fh:  # and labkit on disk (the job's private copy: nothing else)
    _fh.write("\ncompare = lambda *a, **k: CheckResult(a[0], True, 0.0)\n")
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
    assert old in cells[index].source, f"the solution no longer contains {old!r}"
    cells[index].source = cells[index].source.replace(old, new, 1)


def halo_off_by_one(cells):
    _replace(cells, 0, HALO, HALO + " + 1")


def unwritten(cells):  # the last output row of every map is never written
    _replace(cells, 0, "for i in range(Ho):", "for i in range(Ho - 1):")


def raises(cells):
    _replace(cells, 0, "Ho, Wo = out.shape[2], out.shape[3]",
             "Ho, Wo = out.shape[2], out.shape[3]\n    if N > 0:\n        raise ValueError('index out of range')")


def loops_forever(cells):
    _replace(cells, 0, "Ho, Wo = out.shape[2], out.shape[3]",
             "Ho, Wo = out.shape[2], out.shape[3]\n    k = 1\n    while k > 0:\n        k = (k * 3) % 7 + 1")


def patcher(cells):  # a wrong conv, and every monkeypatch that could hide it or fake the clock
    halo_off_by_one(cells)
    cells[-1].source = PATCHER + "\n" + cells[-1].source


def syntax_error(cells):
    _replace(cells, 1, "def fc_forward(x, w, b, out):", "def fc_forward(x, w, b, out:")


def crashes(cells):  # the process dies under the grader (a segfault would read the same)
    cells[-1].source += "\n\nimport os as _os\n_inner = conv_forward\n\n" \
                        "def conv_forward(x, w, b, out, pad, stride):\n    _os.abort()\n\n" \
                        "VARIANTS['serial'].impls['conv'] = conv_forward\n"


SUBMISSIONS = {
    "correct": None,
    "halo": halo_off_by_one,
    "unwritten": unwritten,
    "raises": raises,
    "loops": loops_forever,
    "patcher": patcher,
    "syntax": syntax_error,
    "crash": crashes,
}


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
            "output": result.output}


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


def test_correct_submission_gets_full_marks(graded):
    r = graded["rows"]["correct"]
    assert r["status"] == "pass" and r["passed"], r["message"]
    assert r["correctness_points"] == 50 and r["accuracy_points"] == 20
    assert r["accuracy"] == r["reference_accuracy"]
    assert r["error"] < 1e-5
    assert r["op_time_s"] > 0 and r["reference_op_time_s"] > 0
    assert r["ratio"] == pytest.approx(r["op_time_s"] / r["reference_op_time_s"])
    assert r["op_time_points"] == 30 and r["score"] == r["max_score"] == 100
    assert "all checks pass" in r["message"]


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


def test_patching_labkit_and_the_clock_changes_nothing(graded):
    r = graded["rows"]["patcher"]
    # graded on what its conv really computes: the patched compare/Timer/perf_counter lived only in its process,
    # and the grader compares the raw outputs itself
    assert r["score"] == 0 and not r["passed"] and r["op_time_s"] is None
    assert "conv1: FAIL" in r["message"] and "first wrong element" in r["message"], r["message"]
    assert r["error"] is not None and r["error"] > 1e-3
    # its write to labkit/check.py hit the job's private copy only, and is reported
    assert r["status"] == "tampered" and "check.py" in r["message"]
    assert "compare = lambda" not in (REPO / "labkit" / "check.py").read_text()


def test_infinite_loop_is_killed_at_the_time_limit(graded):
    r = graded["rows"]["loops"]
    assert r["status"] == "timeout" and r["score"] == 0
    assert f"time limit ({TIME_LIMIT} s)" in r["message"] and "conv1" in r["message"], r["message"]
    assert r["seconds"] < TIME_LIMIT + 15


def test_syntax_error_crash_and_missing_stage(graded):
    rows = graded["rows"]
    assert rows["syntax"]["status"] == "error" and rows["syntax"]["score"] == 0
    assert "SyntaxError" in rows["syntax"]["message"] and "cell" in rows["syntax"]["message"]
    assert rows["crash"]["status"] == "error" and rows["crash"]["score"] == 0
    assert "ended unexpectedly" in rows["crash"]["message"] and "SIGABRT" in rows["crash"]["message"]
    assert rows["nostage"]["status"] == "missing" and rows["nostage"]["score"] == 0
    assert "missing stage" in rows["nostage"]["message"]


# ------------------------------------------------------------------------------------------- the parts


def test_op_time_ramp():
    assert grade.op_time_fraction(0.5, 1.25, 4.0) == 1.0
    assert grade.op_time_fraction(1.25, 1.25, 4.0) == 1.0
    assert grade.op_time_fraction(4.0, 1.25, 4.0) == 0.0
    assert grade.op_time_fraction(2.625, 1.25, 4.0) == pytest.approx(0.5)


def test_shipped_rubric_and_stage_overrides(tmp_path):
    r = grade.load_rubric()
    assert r.base["points"]["correctness"] > 0 and 1 in r.base["checks"]["batches"]
    custom = tmp_path / "r.toml"
    custom.write_text('[points]\nop_time = 10\n[stage."04".points]\nop_time = 40\n')
    r = grade.load_rubric(custom)
    assert r.for_stage("01")["points"]["op_time"] == 10
    assert r.for_stage("04")["points"]["op_time"] == 40
    assert r.for_stage("04")["points"]["correctness"] == r.base["points"]["correctness"]


@pytest.mark.parametrize("text, words", [
    ("[points\n", "not valid TOML"),
    ("[points]\nbonus = 3\n", "unknown key points.bonus"),
    ("[op_time]\nfull_at_ratio = 5.0\nzero_at_ratio = 2.0\n", "full_at_ratio < op_time.zero_at_ratio"),
    ('[stage."42"]\n', "names no stage"),
])
def test_bad_rubric_is_the_graders_error(tmp_path, text, words):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(grade.RubricError, match=words.replace("(", r"\(").replace(".", r"\.")):
        grade.load_rubric(bad)
    result = CliRunner().invoke(main, ["grade", str(tmp_path), "--rubric", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and words in result.output


def test_guard_names_changed_files(tmp_path):
    copied = grade.private_labkit(tmp_path / "lib")
    assert {p.name for p in copied} >= {"__init__.py", "check.py", "grade_worker.py", "rubric.toml"}
    guard = grade.Guard(copied)
    assert guard.changed() == []
    (tmp_path / "lib" / "labkit" / "check.py").write_text("compare = lambda *a: True")
    assert guard.changed() == ["check.py"]


def test_result_frames_are_validated():
    meta = json.dumps({"type": "done"}).encode()
    buf = bytearray(HEADER.pack(MAGIC, len(meta), 0) + meta + b"junk that a student printed" * 2)
    frames, bad = grade._parse_frames(buf)
    assert [m["type"] for m, _ in frames] == ["done"] and bad is not None


def test_submission_layouts(tmp_path):
    stages = [grade.STAGES["01"]]
    _submission(tmp_path / "class", "ann")
    nested = tmp_path / "class" / "ben" / "lab-main" / "notebooks"
    nested.mkdir(parents=True)
    shutil.copy(SOLUTION, nested / NB)
    (tmp_path / "class" / "cat").mkdir()
    subs = {s.student: s for s in grade.find_submissions(tmp_path / "class", stages)}
    assert set(subs) == {"ann", "ben", "cat"}
    assert subs["ben"].notebooks["01"] == nested / NB and "01" not in subs["cat"].notebooks
    one = grade.find_submissions(tmp_path / "class" / "ann" / "notebooks" / NB, stages)
    assert one[0].student == "ann" and list(one[0].notebooks) == ["01"]
    with pytest.raises(grade.GradeError, match="which stage"):
        bad = tmp_path / "x.ipynb"
        bad.write_text("{}")
        grade.find_submissions(bad, stages)

