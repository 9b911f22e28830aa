"""The same class graded at --jobs 1 and at --jobs N, compared: grades must not change with the load.

    python tools/load_grading.py OUT [--jobs 14] [--runs 3] [--stages 05,10] [--only jobs1|loaded]

writes a class of stage-05, -08 and -10 submissions (identical solutions under several names, a right stage-05
conv without shared memory, stage-08 kernels with a barrier missing or in a branch, stage-10 pipelines and graphs of
the kinds tests/test_grade_tasks.py knows; ``--stages`` picks) under
OUT/class, grades it with the shipped rubric (time limits raised to 600 s) once at ``--jobs 1`` into
OUT/jobs1 and ``--runs`` times at ``--jobs N`` into OUT/loadedK, each run's wall time kept in OUT/<run>.json, so
that the runs can come from separate calls (``--only``). Once all are there it writes OUT/comparison.json and
OUT/comparison.md: per row, the status and every part's points in every run (equal, or the difference is listed),
and the op-time ratio (student / reference) in every run with max/min - 1 (the goal: within 5 %).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

RUBRIC = "[limits]\ntime_s = 600\nsim_time_s = 600\n"
# stage 08's fused kernel (make_fused_kernel) with a barrier missing (wrong values) or in a branch not every thread
# takes (a hang on a GPU): (old, new) of its source
MISSING_BARRIER = ("                acc += Wt[ty, kk] * Xt[kk, tx]\n            cuda.syncthreads()\n",
                   "                acc += Wt[ty, kk] * Xt[kk, tx]\n")
BARRIER_IN_A_BRANCH = ("            Ot[ty, tx] = v\n            cuda.syncthreads()\n",
                       "            Ot[ty, tx] = v\n            if m < M:\n                cuda.syncthreads()\n")
PARTS = ("status", "correctness_points", "accuracy_points", "technique_points", "task_points", "max_score")


def write_class(root: Path, stages: list[str]) -> None:
    import stage_class
    import test_grade_tasks as t10

    def put(student: str, notebook: str, edit=None) -> None:
        nb = nbformat.read(REPO / "solutions" / notebook, as_version=4)
        if edit:
            edit(nb)
        (root / student / "notebooks").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, root / student / "notebooks" / notebook)

    if "05" in stages:
        for name in ("s05_a", "s05_b", "s05_c"):
            put(name, "05_shared_memory.ipynb")

        def plain(nb):
            [c for c in nb.cells if "kernel" in c.metadata.get("tags", [])][-1].source += stage_class.PLAIN_CONV

        put("s05_no_technique", "05_shared_memory.ipynb", plain)
    if "08" in stages:  # a missing barrier (wrong values) and one not every thread reaches (a hang on a GPU)
        put("s08_a", "08_fusion.ipynb")

        def edit_kernel(old: str, new: str):
            def edit(nb):
                cell = next(c for c in nb.cells if "def make_fused_kernel" in c.source)
                assert old in cell.source, old
                cell.source = cell.source.replace(old, new, 1)
            return edit

        put("s08_missing_barrier", "08_fusion.ipynb", edit_kernel(*MISSING_BARRIER))
        put("s08_barrier_in_a_branch", "08_fusion.ipynb", edit_kernel(*BARRIER_IN_A_BRANCH))
    if "10" in stages:
        for name in ("s10_a", "s10_b"):
            put(name, "10_whole_job.ipynb")
        for name, (graph, pipeline, _) in t10.CLASS.items():
            if name == "old_release":
                continue

            def edit(nb, graph=graph, pipeline=pipeline):
                t10._defining(nb, "graph_call").source += graph
                t10._defining(nb, "classify_streamed").source += pipeline

            put(f"s10_{name}", "10_whole_job.ipynb", edit)


def add_load(root: Path, stages: list[str], copies: int) -> None:
    """``copies`` more solutions (``load_NN``), graded only in the loaded runs: the load the compared rows meet."""
    for k in range(copies):
        stage = stages[k % len(stages)]
        notebook = next((REPO / "solutions").glob(f"{stage}_*.ipynb"))
        (root / f"load_{k:02d}" / "notebooks").mkdir(parents=True, exist_ok=True)
        shutil.copy(notebook, root / f"load_{k:02d}" / "notebooks")


def grade_run(out: Path, name: str, jobs: int, stages: list[str], seed: int) -> dict:
    from labkit import grading

    start = time.monotonic()
    students = None if jobs > 1 else sorted(p.name for p in (out / "class").iterdir() if not p.name.startswith("load_"))
    report = grading.grade(out / "class", stages=stages, rubric=out / "rubric.toml", out=out / name, jobs=jobs,
                           seed=seed, progress=True, students=students,
                           command=f"labkit grade class --stages {','.join(stages)} --rubric rubric.toml --jobs {jobs} "
                                   f"--seed {seed}" + (f" --students {','.join(students)}" if students else ""))
    wall = round(time.monotonic() - start, 1)
    (out / f"{name}.json").write_text(json.dumps({"jobs": jobs, "wall_s": wall, "turns": report["meta"]["turns"]}))
    print(f"{name}: --jobs {jobs}, {wall} s", flush=True)
    return report


def compare(out: Path, runs: list[str]) -> dict:
    reports = {name: json.loads((out / name / "grades.json").read_text()) for name in runs}
    rows = {}
    for name, rep in reports.items():
        for r in rep["rows"]:
            if r["status"] != "missing":
                rows.setdefault((r["student"], r["stage"]), {})[name] = r
    table, differences, spreads = [], [], []
    for (student, stage), by_run in sorted(rows.items()):
        first = next(iter(by_run.values()))
        for name, r in by_run.items():
            for part in PARTS:
                if r.get(part) != first.get(part):
                    differences.append(f"{student} {stage}: {part} {first.get(part)!r} in {runs[0]}, {r.get(part)!r} "
                                       f"in {name}")
        ratios = [r.get("ratio") for r in by_run.values()]
        spread = (max(ratios) / min(ratios) - 1) if all(isinstance(v, float) and v > 0 for v in ratios) else None
        if spread is not None:
            spreads.append(spread)
        table.append({"student": student, "stage": stage, "status": first["status"],
                      "points": {p: first.get(p) for p in PARTS[1:]}, "score": first["score"], "ratios": ratios,
                      "ratio_spread": spread, "message": first["message"][:160]})
    walls = {name: json.loads((out / f"{name}.json").read_text()) for name in runs}
    result = {"runs": walls, "differences": differences, "rows": table,
              "largest_ratio_spread": max(spreads) if spreads else None,
              "device": reports[runs[0]]["meta"]["device"], "date": reports[runs[0]]["meta"]["date"]}
    (out / "comparison.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Grades at any load ({result['device']}, {result['date']})", "",
             "| run | --jobs | wall (s) | turns | longest wait for a turn (s) |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {w['jobs']} | {w['wall_s']} | {w['turns']['turns']} | {w['turns']['longest_wait_s']} |"
              for n, w in walls.items()]
    lines += ["", f"Differences in status or points between runs: {len(differences)}"
              + "".join(f"\n- {d}" for d in differences), "",
              "| student | stage | status | score | op-time ratio in each run | max/min - 1 |", "|---|---|---|---|---|---|"]
    for t in table:
        ratios = ", ".join(f"{v:.3f}" if isinstance(v, float) else "-" for v in t["ratios"])
        spread = f"{100 * t['ratio_spread']:.1f} %" if t["ratio_spread"] is not None else "-"
        lines.append(f"| {t['student']} | {t['stage']} | {t['status']} | {t['score']} | {ratios} | {spread} |")
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=14)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stages", default="05,10")
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--only", choices=("jobs1", "loaded"), help="grade only these runs (the rest in another call)")
    parser.add_argument("--load", type=int, default=0, help="this many more solutions, graded in the loaded runs only")
    parser.add_argument("--students", default="", help="write only these of the class (names, comma-separated)")
    args = parser.parse_args(argv)
    stages = args.stages.split(",")
    out = args.out
    if not (out / "class").is_dir():
        write_class(out / "class", stages)
        if args.students:
            for folder in (out / "class").iterdir():
                if folder.name not in args.students.split(","):
                    shutil.rmtree(folder)
        add_load(out / "class", stages, args.load)
        (out / "rubric.toml").write_text(RUBRIC)
    names = ["jobs1"] + [f"loaded{k + 1}" for k in range(args.runs)]
    for name in names:
        if (out / name / "grades.json").is_file() or (args.only and not name.startswith(args.only[:4])):
            continue
        shutil.rmtree(out / name, ignore_errors=True)
        grade_run(out, name, 1 if name == "jobs1" else args.jobs, stages, args.seed)
    done = [n for n in names if (out / n / "grades.json").is_file()]
    if len(done) > 1:
        result = compare(out, done)
        print((out / "comparison.md").read_text())
        return 1 if result["differences"] else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
