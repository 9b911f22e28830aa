"""Every graded variant runs the student's own code, CUDA C included (issue 25): a stage-09 submission that differs
from the solution only inside its register-tile CUDA C source (``#define INSIDE 1``: windows read across the image's
edge, the padding ignored) gets that kernel's FAIL from the grader, as from its self-check.

CUDA C runs through cupy on a GPU, and on the CPU emulation of CUDA C (``labkit.cudacpu``) elsewhere, in the
grader's sandbox too; where ``labkit.stages.unavailable(("cuda_c",))`` says neither can, this test skips with the
reason. Run on a GPU with:

    LABKIT_TEST_GPU=1 .venv/bin/pytest -q tests/test_grade_cuda_c.py -p no:cacheprovider

(The code path that picks the source, the tuning choices the child reads, is tested everywhere:
tests/test_grade_parts.py::test_the_child_reads_the_tuning_choices_the_grader_reads.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labkit import stages

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import wrong_submissions as ws  # noqa: E402

WHY = stages.unavailable(("cuda_c",))
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"CUDA C cannot run here: {WHY}")
KIND = "cuda_c_wrong_source"


def test_a_wrong_cuda_c_kernel_fails_in_the_grader_as_in_its_self_check(tmp_path):
    ws.write(tmp_path / "class", [KIND])
    line = ws.selfcheck_all(tmp_path / "class", [KIND])[KIND]
    report = ws.grade_class(tmp_path, tmp_path / "out", jobs=1, kinds=[KIND])
    row = {r["student"]: r for r in report["rows"]}[KIND]
    assert ": FAIL" in line, line
    # the self-check's first failing layer: "conv1", or its fused group "conv1+relu1+pool1" (the grader checks the
    # group's conv layer by layer, so it names "conv1")
    layer = line.split(":", 1)[0].split("+")[0]
    assert row["status"] == "fail" and row["score"] == 0, row["message"]
    assert f"{layer}: FAIL" in row["message"], (line, row["message"])
    from labkit import device

    if not device.is_gpu():  # the row says where its CUDA C ran, as the self-check's lines do
        assert "CPU emulation of CUDA C" in row["message"], row["message"]
        assert "CPU emulation of CUDA C" in line, line
