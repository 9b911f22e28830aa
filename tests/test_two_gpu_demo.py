"""tools/two_gpu_demo.py, the class of issue 33's point 3 and its comparison (the grading itself needs two GPUs, or its
--simulate dry run: minutes on the simulator, not run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tool_modules  # noqa: E402  (tests/ is on the path)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

demo = tool_modules.load("two_gpu_demo")


def test_the_class_is_60_jobs_of_stages_04_to_10_taking_turns(tmp_path):
    names = demo.write_class(tmp_path / "class")
    assert len(names) == 60 and names == sorted(names)
    stages = [n.split("_")[1][1:] for n in names]
    assert set(stages) == set(demo.STAGES)
    assert sorted(stages[:len(demo.STAGES)]) == list(demo.STAGES)  # the first jobs graded: one of each stage
    for stage in demo.STAGES:
        kinds = {n.split("_", 2)[2] for n in names if n.split("_")[1] == f"s{stage}"}
        assert "correct" in kinds and len(kinds) >= 3, (stage, kinds)  # right ones, and ones that are not
        assert "slow" in kinds or stage == "10", stage
    for name in names:  # one notebook each, the stage's
        assert len(list((tmp_path / "class" / name / "notebooks").glob("*.ipynb"))) == 1
    rubric = tomllib.loads(demo.rubric_text())
    assert rubric["limits"]["time_factor"] == 0  # fixed limits: reference jobs take turns for their timing only
    for stage, timed in demo.timed_variants().items():
        assert rubric["stage"][stage]["timed_variant"] == timed and timed in rubric["stage"][stage]["variants"]


def test_a_smaller_class_keeps_the_stages_and_students_asked_for(tmp_path):
    names = demo.write_class(tmp_path / "class")
    assert demo.keep_only(tmp_path / "class", names, None, ("05", "07")) is None
    kept = sorted(p.name for p in (tmp_path / "class").iterdir())
    assert kept == [n for n in names if n.split("_")[1] in ("s05", "s07")] and len(kept) >= 10
    assert demo.keep_only(tmp_path / "class", kept, [kept[0], "nobody"], ("05",)) == "nobody"  # nothing removed
    assert demo.keep_only(tmp_path / "class", kept, [kept[0]], ("05", "07")) is None
    assert [p.name for p in (tmp_path / "class").iterdir()] == [kept[0]]
    with pytest.raises(SystemExit):
        demo.main([str(tmp_path / "out"), "--stages", "05,99", "--simulate"])


def _report(rows, gpus=None):
    return {"meta": {"graded_on": "here", "turns": {"turns": len(rows), "rule": "..."}, "device": "NVIDIA H100",
                     "environment": {"gpus": gpus or []}, "seed": 7, "date": "2026-11-27"},
            "rows": [{"status": "pass", "correctness_points": 50.0, "accuracy_points": 0.0, "op_time_points": 30.0,
                      "technique_points": 0.0, "task_points": 0.0, "max_score": 80.0, "score": 80.0, "message": "ok",
                      "stage": "05", **r} for r in rows]}


def _runs(out: Path, one: list, two: list, walls=(100.0, 50.0)) -> None:
    for (run, rows), wall in zip((("one_gpu", one), ("two_gpus", two)), walls):
        (out / run).mkdir(parents=True, exist_ok=True)
        (out / run / "grades.json").write_text(json.dumps(_report(rows)))
        (out / f"{run}.json").write_text(json.dumps({"parts": {"whole": wall}, "gpus": demo.RUNS[run], "jobs": 2,
                                                     "wall_s": wall, "whole": True, "simulated": False}))


def test_the_comparison_holds_the_runs_to_the_goals(tmp_path):
    one = [{"student": "a", "ratio": 1.00, "details": {"gpu": "0"}}, {"student": "b", "ratio": 3.0}]
    two = [{"student": "a", "ratio": 1.03, "details": {"gpu": "1"}}, {"student": "b", "ratio": 2.9}]
    _runs(tmp_path, one, two)
    assert demo.main([str(tmp_path), "--compare"]) == 0
    result = json.loads((tmp_path / "comparison.json").read_text())
    assert result["differences"] == [] and result["speedup"] == 2.0 and result["missed"] == []
    assert abs(result["largest_ratio_spread"] - 0.0345) < 1e-3 and result["rows_per_gpu"]["two_gpus"] == {"1": 1}
    assert "| a | 05 | pass |" in (tmp_path / "comparison.md").read_text()

    two[1] = {"student": "b", "ratio": 2.0, "status": "fail", "score": 0.0}  # a status, and a ratio 50 % apart
    _runs(tmp_path, one, two, walls=(100.0, 60.0))
    assert demo.main([str(tmp_path), "--compare"]) == 1
    missed = json.loads((tmp_path / "comparison.json").read_text())["missed"]
    assert any("difference" in m for m in missed) and any("op-time ratio 50.0 % apart" in m for m in missed)
    assert any("1.67x as fast" in m for m in missed)


def test_the_comparison_says_where_each_runs_time_went(tmp_path):
    """Each run's jobs' own phases summed, its reference jobs run (a worker that read another's ran none) and its
    core-speed probes: what made two GPUs slower than twice one on two H200s (results/h200x2-2026-11-28/)."""
    def row(student, phases, probes):
        return {"student": student, "ratio": 1.0, "details": {"phases_s": phases, "turn": {"attempts": [
            {"attempt": k, "speed_us": p} for k, p in enumerate(probes)]}}}

    one = [row("a", {"start": 2.0, "checks": 10.0, "waiting": 5.0}, [400.0]),
           row("b", {"start": 2.0, "checks": 6.0}, [420.0, 440.0])]
    two = [row("a", {"start": 2.5, "checks": 12.0, "waiting": 1.0}, [500.0]),
           row("b", {"start": 2.5, "checks": 8.0}, [700.0, 520.0])]
    _runs(tmp_path, one, two)
    reports = {run: json.loads((tmp_path / run / "grades.json").read_text()) for run in demo.RUNS}
    reports["one_gpu"]["meta"]["turns"]["by_worker"] = {"w0": {"reference_jobs": {"05 gpu0": {"measured_by": "gpu0"},
                                                                                  "06 gpu0": {}}}}
    reports["two_gpus"]["meta"]["turns"]["by_worker"] = {
        "w0": {"reference_jobs": {"05 gpu0": {"measured_by": "gpu1"}, "06 gpu0": {"measured_by": "gpu0"}}},
        "w1": {"reference_jobs": {"05 gpu1": {"measured_by": "gpu1"}, "06 gpu1": {"measured_by": "gpu0"}}}}
    for run, rep in reports.items():
        (tmp_path / run / "grades.json").write_text(json.dumps(rep))
    demo.main([str(tmp_path), "--compare"])
    work = json.loads((tmp_path / "comparison.json").read_text())["work"]
    assert work["one_gpu"]["jobs_s"] == 20.0 and work["two_gpus"]["jobs_s"] == 25.0  # waiting is not work
    assert work["two_gpus"]["phases_s"] == {"start": 5.0, "checks": 20.0}
    assert work["one_gpu"]["reference_jobs_run"] == 2 and work["two_gpus"]["reference_jobs_run"] == 2
    assert work["one_gpu"]["probe_us"] == {"attempts": 3, "median": 420.0, "fastest": 400.0}
    assert work["two_gpus"]["probe_us"] == {"attempts": 3, "median": 520.0, "fastest": 500.0}
    assert "| two_gpus | 25.0 | 2 | 520.0 | 500.0 | 3 |" in (tmp_path / "comparison.md").read_text()


def test_the_packing_lays_the_same_jobs_longest_first_with_their_reference_jobs_apart():
    """On two H200s one slot ran stage 06's reference job (105 s) and then its own student (85 s): the run's end.
    Laid longest first with the reference job apart, the same jobs fit in less (results/h200x2-2026-11-28/)."""
    rows = [_row("a", "06", "0", 0.0, 190.0, reference_s=105.0), _row("b", "06", "0", 0.0, 80.0),
            _row("c", "04", "0", 80.0, 100.0), {**_row("d", "06", "0", 100.0, 190.0, reference_s=90.0)}]
    rows[3]["details"]["ran"]["reference_read"] = "after the job"  # waited for, not run: not taken apart
    packed = demo.longest_first({"rows": rows}, slots=3)
    # jobs 105, 85, 80, 20 and 90 on 3 slots, longest first: 105 | 90 + 20 | 85 + 80
    assert packed == {"span_s": 190.0, "longest_first_s": 165.0, "sum_over_slots_s": round(380 / 3, 1)}
    assert demo.longest_first({"rows": []}, slots=3) == {}


def test_a_run_in_parts_is_compared_only_once_whole(tmp_path):
    _runs(tmp_path, [{"student": "a", "ratio": 1.0}], [{"student": "a", "ratio": 1.0}])
    record = json.loads((tmp_path / "two_gpus.json").read_text())
    (tmp_path / "two_gpus.json").write_text(json.dumps({**record, "parts": {"1/2": 20.0}, "whole": False}))
    assert demo.main([str(tmp_path), "--compare"]) == 0 and not (tmp_path / "comparison.json").exists()


def _row(student, stage, gpu, start, end, reference_s=0.0):
    return {"student": student, "stage": stage, "status": "pass",
            "details": {"gpu": gpu, "ran": {"from": start, "to": end, "reference_s": reference_s}}}


def test_the_slots_plot_lays_each_gpus_jobs_on_as_few_lanes_as_hold_them(tmp_path):
    """tools/two_gpu_demo.py draws where each GPU's slots stood idle (the two-GPU run's 1.55x came from idle slots,
    not from an unequal split): jobs that overlap go on different lanes, one that starts after another ends may
    share its lane, and a GPU's busy share is its jobs' seconds over its lanes times its span."""
    rows = [_row("a", "06", "0", 100.0, 160.0, reference_s=40.0), _row("b", "06", "0", 101.0, 161.0),
            _row("c", "04", "0", 160.0, 170.0), _row("d", "05", "1", 100.0, 110.0),
            {"student": "e", "stage": "07", "status": "missing", "details": {}}]
    laid = demo.lanes(rows)
    assert sorted(laid) == ["0", "1"] and len(laid["0"]) == 2 and len(laid["1"]) == 1
    assert [s["what"] for s in laid["0"][0]] == ["a", "c"]  # c starts where a ended: the same slot
    for lane in laid["0"]:
        assert all(x["to"] <= y["from"] for x, y in zip(lane, lane[1:]))
    (tmp_path / "two_gpus").mkdir()
    (tmp_path / "two_gpus" / "grades.json").write_text(json.dumps({"rows": rows}))
    busy = demo.draw_slots(tmp_path, "two_gpus")
    assert (tmp_path / "two_gpus_slots.png").stat().st_size > 10_000
    assert busy["0"] == {"slots": 2, "span_s": 70.0, "busy": round((60 + 60 + 10) / (2 * 70), 3)}
    assert busy["1"]["busy"] == 1.0


def test_a_reference_job_in_a_slot_of_its_own_is_laid_once(tmp_path):
    """A reference job run as a task of its own (labkit.grading.context.reference_tasks) has no row: its slot comes
    from the worker that measured it (``measured_by``); one run inside a student's slot is in that row already, and
    one another worker measured is that worker's."""
    rows = [_row("a", "06", "0", 100.0, 160.0, reference_s=40.0), _row("b", "09", "0", 100.0, 130.0)]
    meta = {"turns": {"by_worker": {
        "w0": {"gpu": "0", "reference_jobs": {"06 gpu0": {"measured_by": "gpu0", "ran": [100.2, 140.0]},
                                              "09 gpu0": {"measured_by": "gpu0", "ran": [100.0, 150.0]},
                                              "05 gpu0": {"measured_by": "gpu1", "ran": [100.0, 101.0]}}},
        "w1": {"gpu": "1", "reference_jobs": {"05 gpu1": {"measured_by": "gpu1", "ran": [100.0, 120.0]}}}}}}
    laid = demo.lanes(rows, meta)
    whats = {gpu: sorted(s["what"] + " " + s["stage"] for lane in ls for s in lane) for gpu, ls in laid.items()}
    assert whats == {"0": ["(reference solution) 09", "a 06", "b 09"], "1": ["(reference solution) 05"]}
    ref = next(s for lane in laid["0"] for s in lane if s["what"].startswith("(reference"))
    assert ref["reference_s"] == 50.0 and len(laid["0"]) == 3  # hatched whole, in a slot of its own
