"""``labkit grade``: score students' stage notebooks for correctness, accuracy and op time, safely.

The grader (the parent) never executes student code. For every (student, stage) it draws fresh random inputs and
keeps the answers (``job``), starts a child (``worker``) under a time and a memory limit with private copies of
labkit and the solutions (``sandbox``), hears the child's raw outputs on a framed pipe (``protocol``), compares
them itself, scores them with the rubric (``rubric``, ``scoring``) and writes the reports (``reports``). What a
stage grades, and the reference data, are decided once per run (``plan``, ``run``). See docs/grading.md.
"""

from .reports import summary_table, write_reports
from .rubric import GradeError, Rubric, RubricError, load_rubric, op_time_fraction
from .run import grade, simulator_if_no_driver
from .submissions import Submission, find_submissions, select_stages

__all__ = ["GradeError", "Rubric", "RubricError", "Submission", "find_submissions", "grade", "load_rubric",
           "op_time_fraction", "select_stages", "simulator_if_no_driver", "summary_table", "write_reports"]
