"""The shipped rubric on the shipped notebooks of stage 05, and a right conv without its technique (tests/stage_class.py
says what is graded, and why in groups of stages)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stage_class  # noqa: E402

pytestmark = pytest.mark.slow  # minutes on 2 cores: the simulator runs the GPU stages
graded = stage_class.graded_fixture(("05",), data=False)
globals().update(stage_class.TESTS)
