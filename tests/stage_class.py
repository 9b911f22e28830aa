"""The shipped notebooks graded by the shipped rubric, a group of stages at a time: every stage's solution passes
and every student copy fails with "not implemented", within the rubric's limits. This is the run an instructor
makes on day one; it caught a stage whose accuracy part could not finish in its time limit.

The class is graded in groups of stages, one test module each (``test_grade_stages_*.py``), so that the test
workers grade them side by side, and on each stage's timed variant only (the variant the rubric times, and the one
its technique is counted on): the other variants run their self-checks in the solution notebooks under nbval, and
the grader's path for each kind of variant (CPU, GPU, CUDA C) in tests/test_grade*.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from labkit import device, grading
from labkit.grading.plan import describe_stage
from labkit.grading.rubric import load_rubric
from labkit.stages import STAGES

REPO = Path(__file__).resolve().parent.parent
TECHNIQUE_STAGES = ("05", "06", "07", "09")  # the shipped rubric's technique points

# a right stage-05 conv of the student's own that stages nothing in shared memory: correct, but not the technique
PLAIN_CONV = """

from numba import cuda


@cuda.jit
def plain_conv_kernel(x, w, b, out, pad, stride):
    t = cuda.grid(1)
    N, M, Ho, Wo = out.shape
    if t < N * M * Ho * Wo:
        j, i, m, n = t % Wo, (t // Wo) % Ho, (t // (Wo * Ho)) % M, t // (Wo * Ho * M)
        acc = b[m]
        for c in range(w.shape[1]):
            for p in range(w.shape[2]):
                r = i * stride + p - pad
                for q in range(w.shape[3]):
                    s = j * stride + q - pad
                    if 0 <= r < x.shape[2] and 0 <= s < x.shape[3]:
                        acc += x[n, c, r, s] * w[m, c, p, q]
        out[n, m, i, j] = acc


def conv_plain(x, w, b, out, pad, stride):
    lk.gpu.launch(plain_conv_kernel, out.size, x, w, b, out, pad, stride)


VARIANTS = lk.variants("05", {name: lk.Variant({**lk.kernels.GIVEN, "conv": conv_plain}, arrays="device")
                              for name in VARIANTS})
"""


def rubric_text(stages) -> str:
    """The shipped rubric with each stage's timed variant only, the time limit as given (no extra job per stage to
    scale it: tests/test_grade.py runs that) and op time on a few images (timing is not asserted here)."""
    shipped = load_rubric()
    lines = ["[limits]\ntime_factor = 0\n[timing]\nimages = 4\nrepeat = 1\n"]
    for n in stages:
        declared, order = describe_stage(REPO / "solutions" / STAGES[n].notebook)
        r = shipped.for_stage(n)
        timed = r.get("timed_variant") or [v for v in r.get("variants") or order if not declared[v].unavailable][-1]
        lines.append(f'[stage."{n}"]\nvariants = ["{timed}"]\n' + ("timing = { images = 4 }\n" if n == "01" else ""))
    return "\n".join(lines)


def grade(root: Path, stages) -> dict:
    """The solutions, the student copies and (with stage 05) a right conv without the technique, graded."""
    for student, folder in (("solution", "solutions"), ("student_copy", "notebooks")):
        for n in stages:
            (root / "submissions" / student / "notebooks").mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / folder / STAGES[n].notebook, root / "submissions" / student / "notebooks")
    if "05" in stages:
        nb = nbformat.read(REPO / "solutions" / STAGES["05"].notebook, as_version=4)
        [c for c in nb.cells if "kernel" in c.metadata.get("tags", [])][-1].source += PLAIN_CONV
        (root / "submissions" / "no_technique" / "notebooks").mkdir(parents=True)
        nbformat.write(nb, root / "submissions" / "no_technique" / "notebooks" / STAGES["05"].notebook)
    (root / "rubric.toml").write_text(rubric_text(stages))
    # one job at a time: the test workers grade the groups side by side
    report = grading.grade(root / "submissions", stages=list(stages), rubric=root / "rubric.toml",
                           out=root / "grades", progress=False, seed=7, jobs=1)
    return {"rows": {(r["student"], r["stage"]): r for r in report["rows"]}, "meta": report["meta"],
            "stages": tuple(stages)}


def graded_fixture(stages, data: bool = False):
    """The module's graded class (``data``: its CPU stages score accuracy on real images, so it needs them)."""
    @pytest.fixture(scope="module")
    def graded(tmp_path_factory, request):
        if data:
            request.getfixturevalue("cifar_data")
        return grade(tmp_path_factory.mktemp("class"), stages)

    return graded


def test_every_stage_is_graded(graded):
    stages = graded["stages"]
    students = {student for student, _ in graded["rows"]}
    assert {stage for _, stage in graded["rows"]} == set(stages)
    assert len(graded["rows"]) == len(students) * len(stages)  # no_technique handed in stage 05 only
    assert {stage for (student, stage), r in graded["rows"].items()
            if student == "no_technique" and r["status"] != "missing"} <= {"05"}


def test_solutions_earn_full_correctness_and_accuracy_marks(graded):
    meta = graded["meta"]
    if "01" in graded["stages"]:
        assert meta["accuracy"]["01"] == "scored"  # CPU code on real, labelled images
    for (student, stage), row in graded["rows"].items():
        if student == "solution":
            assert row["status"] == "pass", f"stage {stage}: {row['message']}"
            accuracy = 20 if meta["accuracy"][stage] == "scored" else 0
            if device.is_simulated() and stage in ("03", "04"):  # shrunk nets on synthetic images: nothing to score
                assert meta["accuracy"][stage] == "not scored (no labelled images)"
            # op time compares the same code timed twice: its points depend on noise, so they are not asserted
            assert (row["correctness_points"], row["accuracy_points"]) == (50, accuracy), f"stage {stage}"
            technique = 10 if stage in TECHNIQUE_STAGES else 0
            assert row["max_points"]["technique"] == row["technique_points"] == technique, \
                f"stage {stage}: {row['details'].get('technique')}"
            assert row["task_points"] == row["max_points"]["tasks"], f"stage {stage}: {row['details'].get('tasks')}"


def test_student_copies_fail_as_not_implemented(graded):
    for (student, stage), row in graded["rows"].items():
        if student == "student_copy":  # (untouched copies: every stage)
            assert row["status"] == "fail" and row["score"] == 0
            assert "not implemented" in row["message"], f"stage {stage}: {row['message']}"


def test_a_right_conv_without_the_technique_loses_only_its_points(graded):
    if "05" not in graded["stages"]:
        pytest.skip("the right conv without shared memory is a stage-05 submission")
    row = graded["rows"][("no_technique", "05")]
    assert row["status"] == "pass" and row["correctness_points"] == 50, row["message"]
    assert row["technique_points"] == 0 and row["max_points"]["technique"] == 10
    assert "no technique points: conv2 uses shared memory: FAIL" in row["message"], row["message"]


#: the tests every group's module runs (``globals().update(TESTS)`` there)
TESTS = {name: fn for name, fn in dict(globals()).items() if name.startswith("test_")}
