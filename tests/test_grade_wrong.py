"""A class of wrong submissions of stages 04, 05 and 08 (tests/wrong_submissions.py, its kinds marked ``ci``), graded
in one run on the simulator: each gets the status it should, with a message that names its mistake; and each kind's
self-check line (``check_variant``) FAILs where a self-check can see the mistake. (The kinds that only a GPU run can
judge, op time being measured there, are in the table of docs/grading.md.)

The self-checks run in a process of their own (one kind patches the clock) while the class is graded. The table
in docs/grading.md is this run's, made by ``python tests/wrong_submissions.py --table``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit import device, grading
from labkit.course import nbcells

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import wrong_submissions as ws  # noqa: E402

pytestmark = pytest.mark.skipif(not device.is_simulated(), reason="the class is graded on the CUDA simulator")

# the self-check lines asserted here: every kind a self-check can catch, and the library cheats it cannot (the
# full-cost passing ones, correct and timer, are in the table of docs/grading.md)
CI = [name for name, kind in ws.KINDS.items() if kind.ci]
SELF_CHECKED = [name for name in CI if ws.KINDS[name].selfcheck_fails or name.startswith("library")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("wrong")
    ws.write(root / "class", CI)
    selfchecks = root / "selfchecks.json"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.Popen([sys.executable, str(HERE / "wrong_submissions.py"), "--selfcheck", *SELF_CHECKED,
                             "--json", str(selfchecks)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        report = ws.grade_class(root, root / "out", seed=2024, jobs=2, kinds=CI)
    finally:
        out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-2000:]
    return {"rows": {r["student"]: r for r in report["rows"] if r["status"] != "missing"},
            "report_rows": report["rows"], "meta": report["meta"],
            "selfchecks": json.loads(selfchecks.read_text()), "out": root / "out"}


def test_every_kind_is_graded_in_one_run(graded):
    assert set(graded["rows"]) == set(CI)  # one graded row each (the other stages: missing)
    assert all(r["stage"] == ws.KINDS[name].stage for name, r in graded["rows"].items())
    assert graded["meta"]["timed_variants"]["04"] == "04 batched_padded"


def _row(graded, name):
    return graded["rows"][name]


@pytest.mark.parametrize("name", CI)
def test_each_kind_gets_its_status_and_a_message_that_names_it(graded, name):
    kind, r = ws.KINDS[name], _row(graded, name)
    assert r["status"] == kind.status, f"{name}: {r['message']}"
    for words in kind.words:
        assert words in r["message"], f"{name}: {words!r} not in {r['message']}"
    if kind.status == "pass" and kind.stage == "05" and name != "correct":  # right values, no technique points
        assert r["technique_points"] == 0 and r["score"] == r["max_score"] - r["max_points"]["technique"]
    elif kind.status == "pass":
        assert r["score"] == r["max_score"] > 0 and r["passed"]
    else:
        assert r["score"] == 0 and not r["passed"]


@pytest.mark.parametrize("name", SELF_CHECKED)
def test_each_kind_self_check_line(graded, name):
    line = graded["selfchecks"][name]
    if ws.KINDS[name].selfcheck_fails:
        assert ": FAIL" in line, f"{name}: {line}"
    else:  # computing with a library gives the right values: only the grader's own-kernels rule catches it
        assert line.startswith("PASS"), f"{name}: {line}"


def test_the_library_cheats_are_caught_statically_and_at_run_time(graded):
    rows = graded["rows"]
    static = rows["library"]["details"]["forbidden"]
    # the cell that defines conv_padded in the notebook the class was made from (tasks' cells move between releases)
    cell, = (i for i, src in nbcells.tagged_cells(nbformat.read(ws.SOLUTION, as_version=4))
             if nbcells.defines(src, ("conv_padded",)))
    assert any(f"conv_padded, {ws.NB} cell {cell}," in f for f in static), (cell, static)
    # built at run time, the names are invisible to a scan: the trace of the conv calls records them
    hidden = rows["library_hidden"]["details"]["forbidden"]
    assert any("calls numpy.einsum" in f for f in hidden) and not any(f"cell {cell}, line" in f for f in hidden), hidden
    assert any("without launching a kernel of your notebook" in f for f in hidden), hidden


def test_the_race_is_named_with_both_threads_and_the_line(graded):
    msg = graded["rows"]["channel_race"]["message"]
    assert "thread 0 of block 0" in msg and "thread 1 of block 0" in msg and "out[n, m, i, j] += acc" in msg
