"""tools/phase_costs.py's --join: parts of one mix graded apart (two GPUs at once, two calls) written as one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tool_modules  # noqa: E402  (tests/ is on the path)

costs = tool_modules.load("phase_costs")


def _part(folder: Path, stages: dict[str, float], seconds: dict[str, float]) -> Path:
    """A part as phase_costs writes it: {stage: checks seconds of each job}, {stage: its reference job's seconds}."""
    made = {s: [f"s{s}_correct0", f"s{s}_student_copy"] for s in stages}
    rows = [{"student": st, "stage": s, "status": "pass", "seconds": 2 * c,
             "details": {"phases_s": {"start": 1.0, "checks": c}}} for s, c in stages.items() for st in made[s]]
    runs = {s: {"wall_s": 10.0 + seconds[s], "jobs_s": 4 * c + seconds[s],
                "reference_jobs": {s: {"seconds": seconds[s], "phases_s": {"checks": seconds[s]}}},
                "reference_cache": {}} for s, c in stages.items()}
    meta = {"date": "2026-11-27T00:00:00+00:00", "device": "a GPU", "seed": 2026, "sandbox": {"mode": "bwrap"}}
    (folder / "grades").mkdir(parents=True)
    (folder / "grades" / "grades.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (folder / "phase_costs.json").write_text(json.dumps({"meta": {
        "class": made, "runs": runs, "left_out": [], "command": f"python3 tools/phase_costs.py {folder.name}",
        "date": meta["date"], "rubric": None, "correct": 1, "wrong": 1, "cache": False}}))
    return folder


def test_parts_of_different_stages_join_into_one_table(tmp_path, capsys):
    a = _part(tmp_path / "a", {"04": 3.0, "05": 5.0}, {"04": 7.0, "05": 11.0})
    b = _part(tmp_path / "b", {"09": 13.0}, {"09": 17.0})
    meta = json.loads((a / "phase_costs.json").read_text())  # a's budget left out 09, which b graded
    meta["meta"]["class"]["09"], meta["meta"]["left_out"] = ["s09_a"], ["09"]
    (a / "phase_costs.json").write_text(json.dumps(meta))
    assert costs.main([str(tmp_path / "all"), "--join", str(a), str(b)]) == 0
    joined = json.loads((tmp_path / "all" / "phase_costs.json").read_text())
    assert list(joined["stages"]) == ["04", "05", "09"] and joined["jobs"] == 6
    assert joined["phases_s"]["checks"] == 2 * (3 + 5 + 13)
    assert joined["reference_wall_s"] == 7 + 11 + 17
    assert joined["wall_s"] == (12 + 7) + (20 + 11) + (52 + 17)  # each stage's first job to its last
    assert "tools/phase_costs.py a and python3 tools/phase_costs.py b, joined" in joined["meta"]["command"]
    assert "| 09 | 2 |" in (tmp_path / "all" / "phase_costs.md").read_text()
    assert joined["meta"]["left_out"] == [] and joined["meta"]["class"]["09"] == ["s09_correct0", "s09_student_copy"]


def test_a_stage_in_two_parts_or_a_folder_without_a_run_is_refused(tmp_path, capsys):
    a = _part(tmp_path / "a", {"04": 3.0}, {"04": 7.0})
    b = _part(tmp_path / "b", {"04": 5.0}, {"04": 9.0})
    assert costs.main([str(tmp_path / "all"), "--join", str(a), str(b)]) == 2
    assert "stage 04 is in two parts" in capsys.readouterr().err
    assert costs.main([str(tmp_path / "all"), "--join", str(a), str(tmp_path)]) == 2
    assert "holds no phase_costs run" in capsys.readouterr().err
    assert not (tmp_path / "all" / "phase_costs.json").exists()
