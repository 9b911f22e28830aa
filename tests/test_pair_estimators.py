"""tools/pair_estimators.py: two runs' op-time ratios of the same submissions under each rule, from the kept passes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import pair_estimators  # noqa: E402


def _row(student: str, passes: list[float], partner: list[float]) -> dict:
    return {"student": student, "stage": "09", "details": {"op_time_reference": {"pairs": [
        {"attempt": 0, "student_passes_s": passes, "reference_passes_s": partner}]}}}


def test_a_lone_fast_pass_moves_the_best_passes_rule_not_the_median_of_pairs(tmp_path, capsys):
    steady = [1.0, 1.1, 1.2, 1.0, 1.1]
    one = {"rows": [_row("ann_correct", steady, steady), _row("ben", [2.0] * 5, [1.0] * 5),
                    {"student": "cat", "stage": "09", "details": {}}]}  # not timed against a partner: left out
    two = {"rows": [_row("ann_correct", [1.0, 1.1, 0.6, 1.0, 1.1], steady), _row("ben", [2.0] * 5, [1.0] * 5)]}
    summary = pair_estimators.compare(one, two)
    assert summary["median of pairs"]["rows"] == 2 and summary["median of pairs"]["largest_gap"] == pytest.approx(0)
    assert summary["median of pairs"]["within_5_percent"] == 2
    assert summary["best / best"]["largest_gap"] == pytest.approx(1 / 0.6 - 1)
    assert summary["best / best"]["copies_of_the_solution"] == pytest.approx([0.6, 1.0])
    for i, report in enumerate((one, two)):
        (tmp_path / f"{i}.json").write_text(json.dumps(report))
    assert pair_estimators.main([str(tmp_path / "0.json"), str(tmp_path / "1.json"), "--json",
                                 str(tmp_path / "s.json")]) == 0
    assert "| median of pairs | 2 | 2 | 0.0 % |" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["best / best"]["within_5_percent"] == 1
    assert pair_estimators.main([str(tmp_path / "0.json"), str(tmp_path / "none.json")]) == 2
