"""The shipped rubric on the shipped notebooks: every stage's solution passes and every student copy fails
with "not implemented", within the rubric's limits. This is the run an instructor makes on day one; it caught a
stage whose accuracy part could not finish in its time limit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labkit import grade

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # about 3 minutes on 2 cores: the simulator runs stage 02's three GPU mappings


@pytest.fixture(scope="module")
def graded(tmp_path_factory, cifar_data):
    root = tmp_path_factory.mktemp("class")
    for student, folder in (("solution", "solutions"), ("student_copy", "notebooks")):
        shutil.copytree(REPO / folder, root / "submissions" / student / "notebooks")
    # the shipped rubric, but op time on a few images: timing is the slow part and is not asserted here
    # (a [stage."NN"] timing table of the shipped rubric would still win; 01 asks for 200 images)
    fast = root / "fast_timing.toml"
    fast.write_text("[timing]\nimages = 4\nrepeat = 1\n[stage.\"01\"]\ntiming = { images = 4 }\n")
    report = grade.grade(root / "submissions", rubric=fast, out=root / "grades", progress=False, seed=7)
    return {(r["student"], r["stage"]): r for r in report["rows"]}


def test_every_stage_is_graded(graded):
    stages = {stage for _, stage in graded}
    assert {"01", "02", "03", "04"} <= stages
    assert len(graded) == 2 * len(stages)


def test_solutions_earn_full_correctness_and_accuracy_marks(graded):
    for (student, stage), row in graded.items():
        if student == "solution":
            assert row["status"] == "pass", f"stage {stage}: {row['message']}"
            # op time compares the same code timed twice: its points depend on noise, so they are not asserted
            assert (row["correctness_points"], row["accuracy_points"]) == (50, 20)
            assert row["score"] > 0


def test_student_copies_fail_as_not_implemented(graded):
    for (student, stage), row in graded.items():
        if student == "student_copy":
            assert row["status"] == "fail" and row["score"] == 0
            assert "not implemented" in row["message"], f"stage {stage}: {row['message']}"
