"""``labkit grade``: score students' stage notebooks for correctness, accuracy and op time, safely.

The grader (the parent) never executes student code. For every (student, stage) it draws fresh random inputs and
keeps the answers (``job``, ``inputs``), starts a child (``worker``, ``student_phases``) under a time and a memory
limit with private copies of labkit and the solutions (``sandbox``, ``child_start``), hears the child's raw outputs
on a framed pipe (``protocol``), compares them itself (``verdicts``; a timing on a slow core is attempted again:
``attempts``), scores them with the rubric (``rubric``, ``scoring``) and writes the reports (``reports``). What a
stage grades, and the reference data, are decided once per run (``plan``, ``run``). In the child, ``snapshot``
puts labkit back before, and compares it after, every call into student code (``tampered``), and ``ownership``
scans and traces the timed conv functions (``forbidden``); ``hints`` names the likely mistake of a failing check;
``environment`` records the versions; ``cluster`` grades a class on Dask (several GPUs: dask-cuda); ``refcache`` keeps each stage's
reference job across runs, ``phases`` times every job's phases and ``ahead`` computes the parent's answers for the
timed passes while the child checks. See docs/grading.md.
"""

from .reports import compare_reports, gradescope_results, merge_reports, regrade_command, summary_table, write_reports
from .rubric import GradeError, Rubric, RubricError, load_rubric, op_time_fraction
from .run import grade, job_seed, parse_gpus, run_local, simulator_if_no_driver
from .submissions import Submission, find_submissions, select_stages

__all__ = ["GradeError", "compare_reports", "Rubric", "RubricError", "Submission", "find_submissions", "grade",
           "gradescope_results", "job_seed", "load_rubric", "merge_reports", "op_time_fraction", "parse_gpus", "regrade_command",
           "run_local", "select_stages", "simulator_if_no_driver", "summary_table", "write_reports"]
