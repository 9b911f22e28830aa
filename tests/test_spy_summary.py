"""tools/spy_summary.py: a profile's shares, by itself and with what each function called."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import spy_summary  # noqa: E402


def test_shares_count_a_function_once_a_stack(tmp_path, capsys):
    raw = tmp_path / "raw.txt.gz"
    with gzip.open(raw, "wt") as fh:
        fh.write("thread (1): main;run (labkit/grading/job.py:10);forward (labkit/model/reference.py:5) 3\n"
                 "thread (1): main;run (labkit/grading/job.py:10);run (labkit/grading/job.py:12) 1\n"
                 "thread (2): other;select (selectors.py:468) 4\n")
    total, alone, inclusive = spy_summary.read(raw)
    assert total == 8 and alone["select (selectors.py:468)"] == 4
    assert inclusive["run (labkit/grading/job.py)"] == 4  # recursion counted once a stack
    assert inclusive["forward (labkit/model/reference.py)"] == 3
    assert spy_summary.main([str(raw), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "8 samples" in out and " 50.0 %  run (labkit/grading/job.py)" in out
    assert spy_summary.main([str(tmp_path / "none.txt")]) == 2
