"""What each phase of a graded job costs, and how many jobs an hour that makes: a mix of stages graded at --jobs 1.

    python3 tools/phase_costs.py OUT [--stages 04,05,06,07,08,09,10] [--correct 1] [--wrong 1] [--budget 450]
                                     [--cache] [--rubric PATH] [--seed N] [--unsandboxed]
    python3 tools/phase_costs.py OUT --tables                   # the tables again, from OUT's reports
    python3 tools/phase_costs.py OUT --compare OUT2 [OUT3 ...]  # the runs' means side by side
    python3 tools/phase_costs.py OUT --join PART1 PART2 [...]   # parts of one mix (run beside each other) as one

writes a class under OUT/class: for every stage, ``--correct`` copies of the kit's solution and ``--wrong`` wrong
submissions (the untouched student copy first, then the stage's kinds of tests/wrong_submissions.py), and grades it
with ``labkit.grading.grade`` at ``--jobs 1`` with the shipped rubric (``--rubric``: read on top), one stage at a
time into OUT/grades (merged), so that a stage that would start after ``--budget`` seconds is left out, named, and
what ran is kept. The reference jobs run, timed alone, unless ``--cache`` lets the reference cache answer.

From the rows' measured phase times (``details.phases_s``: the parent's clock, ``labkit.grading.phases``) and each
stage's reference job (``meta.reference_jobs``) it writes OUT/phase_costs.json and OUT/phase_costs.md: per stage,
the mean seconds per job of each phase, the reference job's, where the time went, and the jobs per hour of the whole
run with and without the reference jobs (the time from each run's first job to its last, the reference jobs in it;
each run's setup, paid once a run, beside it). Nothing is typed in: every figure is computed here from the reports,
and the command, device and date are written beside them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

MIX = ("04", "05", "06", "07", "08", "09", "10")  # the mix (the default); 01-03 may be named too
ALL_STAGES = ("01", "02", "03", *MIX)


def wrong_kinds(stage: str) -> list[str]:
    """The wrong submissions of ``stage``, most common first: the untouched student copy, then the stage's kinds of
    tests/wrong_submissions.py (those its CI grades first)."""
    import wrong_submissions as ws

    kinds = [k for k, v in ws.KINDS.items() if v.stage == stage and v.edit is not None]
    return ["student_copy", *sorted(kinds, key=lambda k: (not ws.KINDS[k].ci, k))]


def write_class(root: Path, stages: list[str], correct: int, wrong: int) -> dict[str, list[str]]:
    """OUT/class/<student>/notebooks/<notebook> for every stage; {stage: [student, ...]}."""
    import nbformat
    import wrong_submissions as ws

    from labkit.stages import STAGES

    made: dict[str, list[str]] = {}
    for stage in stages:
        notebook = STAGES[stage].notebook
        names = []
        for k in range(correct):
            names.append(f"s{stage}_correct{k}")
            (root / names[-1] / "notebooks").mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / "solutions" / notebook, root / names[-1] / "notebooks")
        kinds = wrong_kinds(stage)
        for k in range(wrong):
            kind = kinds[k % len(kinds)]
            names.append(f"s{stage}_{kind}" + (f"_{k // len(kinds)}" if k >= len(kinds) else ""))
            folder = root / names[-1] / "notebooks"
            folder.mkdir(parents=True, exist_ok=True)
            if kind == "student_copy":
                shutil.copy(REPO / "notebooks" / notebook, folder)
                continue
            nb = nbformat.read(REPO / "solutions" / notebook, as_version=4)
            cells = [c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]
            ws.KINDS[kind].edit(cells)
            nbformat.write(nb, folder / notebook)
        made[stage] = names
    return made


def grade_stages(out: Path, made: dict, args) -> tuple[dict, list[str], dict]:
    """Grade stage by stage (one ``grade`` call each, merged into OUT/grades); ({stage: wall seconds}, the stages
    left out by the budget, the merged report)."""
    from labkit import grading

    walls, left_out, report = {}, [], None
    began = time.monotonic()
    for stage, students in made.items():
        if time.monotonic() - began > args.budget:
            left_out.append(stage)
            continue
        start = time.monotonic()
        report = grading.grade(out / "class", stages=[stage], rubric=args.rubric, out=out / "grades", jobs=1,
                               seed=args.seed, progress=False, students=students, merge=True,
                               unsandboxed=args.unsandboxed, cache=True if args.cache else False,
                               command=f"labkit grade class --stages {stage} --students {','.join(students)} --jobs 1 "
                                       f"--seed {args.seed}" + ("" if args.cache else " --no-cache")
                                       + (f" --rubric {args.rubric}" if args.rubric else ""))
        walls[stage] = {"wall_s": round(time.monotonic() - start, 2), "jobs_s": report["meta"]["seconds"],
                        "reference_jobs": report["meta"].get("reference_jobs", {}),
                        "reference_cache": report["meta"].get("reference_cache", {})}
        print(f"stage {stage}: {len(students)} jobs in {walls[stage]['wall_s']} s", flush=True)
        write_tables(out, made, walls, left_out, report, args)  # what ran so far, should a later stage not end
    return walls, left_out, report


def _mean(total: float, n: int) -> float:
    return round(total / n, 2) if n else 0.0


def costs(made: dict, walls: dict, report: dict) -> dict:
    """Per stage and for the whole mix: jobs, statuses, the sum and mean of each phase, the reference jobs."""
    from labkit.grading.phases import PHASES

    rows = [r for r in report["rows"] if r["stage"] in walls and r["student"] in made[r["stage"]]]
    stages = {}
    for stage in walls:
        mine = [r for r in rows if r["stage"] == stage]
        sums = {p: 0.0 for p in PHASES}
        for r in mine:
            for p, s in (r["details"].get("phases_s") or {}).items():
                sums[p] += s
        refs = walls[stage]["reference_jobs"]
        ref = next(iter(refs.values()), None)
        stages[stage] = {"jobs": len(mine), "statuses": {s: sum(r["status"] == s for r in mine)
                                                         for s in sorted({r["status"] for r in mine})},
                         "seconds": round(sum(r["seconds"] for r in mine), 2),
                         "phases_s": {p: round(v, 2) for p, v in sums.items()},
                         "mean_phases_s": {p: _mean(v, len(mine)) for p, v in sums.items()},
                         "reference": ref, "wall_s": walls[stage]["wall_s"], "jobs_s": walls[stage]["jobs_s"]}
    jobs = sum(s["jobs"] for s in stages.values())
    wall = sum(s["jobs_s"] for s in stages.values())  # from the first job to the last, the reference jobs included
    setup = sum(s["wall_s"] - s["jobs_s"] for s in stages.values())  # each grade call's plans, probe, references
    ref_wall = sum((s["reference"] or {}).get("seconds", 0.0) + ((s["reference"] or {}).get("phases_s") or {})
                   .get("waiting", 0.0) for s in stages.values() if not (s["reference"] or {}).get("from_cache"))
    totals = {p: round(sum(s["phases_s"][p] for s in stages.values()), 2) for p in PHASES}
    ref_totals = {p: round(sum(((s["reference"] or {}).get("phases_s") or {}).get(p, 0.0) for s in stages.values()
                               if not (s["reference"] or {}).get("from_cache")), 2) for p in PHASES}
    return {"stages": stages, "jobs": jobs, "wall_s": round(wall, 2), "reference_wall_s": round(ref_wall, 2),
            "setup_s": round(setup, 2), "phases_s": totals, "reference_phases_s": ref_totals,
            "jobs_per_hour": {"with_reference_jobs": round(3600 * jobs / wall, 1) if wall else None,
                              "without_reference_jobs": round(3600 * jobs / (wall - ref_wall), 1)
                              if wall > ref_wall else None,
                              "with_reference_jobs_and_setup": round(3600 * jobs / (wall + setup), 1)
                              if wall + setup else None}}


def markdown(c: dict, meta: dict) -> str:
    from labkit.grading.phases import PHASES, SHORT

    shown = [p for p in PHASES if c["phases_s"][p] or c["reference_phases_s"][p]]
    head = "| stage | jobs | statuses | s/job | " + " | ".join(shown) + " | reference job (s) |"
    lines = [head, "|" + "---|" * (len(shown) + 5)]
    for stage, s in c["stages"].items():
        ref = s["reference"] or {}
        ref_text = (f"{ref.get('seconds', 0):.1f}" + (" (cache)" if ref.get("from_cache") else "")) if ref else "-"
        statuses = ", ".join(f"{k} {v}" for k, v in s["statuses"].items())
        lines.append(f"| {stage} | {s['jobs']} | {statuses} | {_mean(s['seconds'], s['jobs']):.1f} | "
                     + " | ".join(f"{s['mean_phases_s'][p]:.2f}" for p in shown) + f" | {ref_text} |")
    n = c["jobs"]
    lines.append(f"| all | {n} | | {_mean(sum(s['seconds'] for s in c['stages'].values()), n):.1f} | "
                 + " | ".join(f"{_mean(c['phases_s'][p], n):.2f}" for p in shown)
                 + f" | {c['reference_wall_s']:.1f} in all |")
    lines += ["", "The reference jobs' phases (seconds, summed over the stages whose job ran here):", "",
              "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown),
              "| " + " | ".join(f"{c['reference_phases_s'][p]:.1f}" for p in shown) + " |"]
    spent = {p: c["phases_s"][p] + c["reference_phases_s"][p] for p in shown if p != "waiting"}
    whole = sum(spent.values()) or 1.0
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:4]
    lines += ["", "Where the time went (students' and reference jobs' phases, waiting aside): "
              + "; ".join(f"{p} {100 * v / whole:.0f} % ({SHORT[p]})" for p, v in top)
              + ".", "",
              f"Jobs per hour: **{c['jobs_per_hour']['with_reference_jobs']}** with the reference jobs in the wall "
              f"time ({n} job{'s' * (n != 1)} and their stages' reference jobs in {c['wall_s']:.0f} s), "
              f"**{c['jobs_per_hour']['without_reference_jobs']}** without them ({c['reference_wall_s']:.0f} s of "
              f"reference jobs); {c['jobs_per_hour']['with_reference_jobs_and_setup']} counting each grade call's "
              f"setup too ({c['setup_s']:.0f} s: the plans, the probe child and the reference data, once a run: one "
              f"run a stage here)."]
    if meta.get("left_out"):
        lines.append(f"Not graded (the --budget ran out first): stages {', '.join(meta['left_out'])}.")
    lines += ["", f"(computed by `{meta['command']}`: {meta['date']}, {meta['device']}, seed {meta['seed']}, "
                  f"--jobs 1, {meta['sandbox']})"]
    return "\n".join(lines) + "\n"


def write_tables(out: Path, made: dict, walls: dict, left_out: list, report: dict, args) -> dict:
    c = costs(made, walls, report)
    m = report["meta"]
    meta = {"command": "python3 tools/phase_costs.py " + " ".join(sys.argv[1:]) if args.command is None
            else args.command, "date": m["date"], "device": m["device"], "environment": m.get("environment"),
            "seed": m["seed"], "sandbox": (m.get("sandbox") or {}).get("mode", "?") + " sandbox",
            "rubric": args.rubric, "correct": args.correct, "wrong": args.wrong, "left_out": left_out,
            "cache": bool(args.cache), "class": made, "runs": walls}
    (out / "phase_costs.json").write_text(json.dumps({"meta": meta, **c}, indent=1, default=str))
    (out / "phase_costs.md").write_text(markdown(c, meta))
    return c


def compare(outs: list[Path]) -> str:
    """One line per earlier OUT (its phase_costs.json): the mix's mean seconds per job of each phase, its reference
    jobs' seconds and the jobs per hour, side by side (before and after a change, on the same machine)."""
    from labkit.grading.phases import PHASES

    runs = [json.loads((out / "phase_costs.json").read_text()) for out in outs]
    shown = [p for p in PHASES if any(r["phases_s"].get(p) for r in runs)]
    lines = ["| run | jobs | s/job | " + " | ".join(shown) + " | reference jobs (s) | jobs/h | jobs/h without the "
             "reference jobs |", "|" + "---|" * (len(shown) + 6)]
    for out, r in zip(outs, runs):
        n = r["jobs"]
        own = sum(s["seconds"] for s in r["stages"].values())
        label = r["meta"]["command"].rsplit("(", 1)[-1].rstrip(")") if "(" in r["meta"]["command"] else out.name
        lines.append(f"| {label} | {n} | {_mean(own, n):.1f} | " + " | ".join(f"{_mean(r['phases_s'][p], n):.2f}"
                                                                          for p in shown)
                     + f" | {r['reference_wall_s']:.1f} | {r['jobs_per_hour']['with_reference_jobs']} | "
                     + f"{r['jobs_per_hour']['without_reference_jobs']} |")
    return "\n".join(lines) + "\n"


def tables_again(args) -> int:
    """The tables of OUT written again from its grades.json and phase_costs.json (the command and date kept)."""
    old = json.loads((args.out / "phase_costs.json").read_text())
    report = json.loads((args.out / "grades" / "grades.json").read_text())
    walls = old["meta"].get("runs") or {
        stage: {"wall_s": s["wall_s"], "jobs_s": s["jobs_s"], "reference_cache": {},
                "reference_jobs": {stage: s["reference"]} if s["reference"] else {}}
        for stage, s in old["stages"].items()}
    for key in ("rubric", "correct", "wrong", "cache"):
        setattr(args, key, old["meta"].get(key, getattr(args, key)))
    args.command = old["meta"]["command"]
    report["meta"]["date"] = old["meta"]["date"]
    write_tables(args.out, old["meta"]["class"], walls, old["meta"].get("left_out", []), report, args)
    print((args.out / "phase_costs.md").read_text())
    return 0


def join(args) -> int:
    """Parts of one mix graded apart (their stages on two GPUs at once, or in two calls) written as one run into
    OUT: the stages, reference jobs and rows of each, in the order the parts are named; a stage in two parts is
    refused. The command names the parts' commands; the date and device are the first part's."""
    made, walls, left_out, rows, commands, report = {}, {}, [], [], [], None
    for part in args.join:
        try:
            old = json.loads((part / "phase_costs.json").read_text())
            grades = json.loads((part / "grades" / "grades.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"--join: {part} holds no phase_costs run ({exc})", file=sys.stderr)
            return 2
        ran = old["meta"]["runs"]  # the stages graded (a stage its budget left out is in the class, not here)
        twice = sorted(set(ran) & set(walls))
        if twice:
            print(f"--join: stage {twice[0]} is in two parts; join parts of different stages", file=sys.stderr)
            return 2
        made.update({stage: old["meta"]["class"][stage] for stage in ran})
        walls.update(ran)
        left_out += old["meta"].get("left_out", [])
        rows += grades["rows"]
        commands.append(old["meta"]["command"])
        if report is None:
            report = grades
            report["meta"]["date"] = old["meta"]["date"]
            for key in ("rubric", "correct", "wrong", "cache"):
                setattr(args, key, old["meta"].get(key, getattr(args, key)))
    report["rows"] = rows
    left_out = sorted(set(left_out) - set(walls))  # left out by one part, graded by another
    args.command = " and ".join(commands) + ", joined"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grades").mkdir(exist_ok=True)
    (args.out / "grades" / "grades.json").write_text(json.dumps(report, indent=1, default=str))
    write_tables(args.out, made, walls, left_out, report, args)
    print((args.out / "phase_costs.md").read_text())
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--stages", default=",".join(MIX))
    ap.add_argument("--correct", type=int, default=1, help="copies of the solution per stage (default 1)")
    ap.add_argument("--wrong", type=int, default=1, help="wrong submissions per stage (default 1)")
    ap.add_argument("--budget", type=float, default=450.0,
                    help="no stage starts after this many seconds (default 450: one GPU call under 8 minutes)")
    ap.add_argument("--cache", action="store_true", help="let the reference cache answer (default: every reference "
                                                         "job runs, and its cost is measured)")
    ap.add_argument("--rubric", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--unsandboxed", action="store_true", help="no sandbox (only where there is none: trusted code)")
    ap.add_argument("--tables", action="store_true",
                    help="only write the tables again from OUT's reports (a run that was cut, or a newer table)")
    ap.add_argument("--compare", nargs="+", type=Path, default=None,
                    help="print one line per earlier OUT named here (with OUT itself first), side by side")
    ap.add_argument("--join", nargs="+", type=Path, default=None,
                    help="write the runs named here (parts of one mix, of different stages) into OUT as one")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.join:
        return join(args)
    if args.tables:
        return tables_again(args)
    if args.compare:
        print(compare([args.out, *args.compare]), end="")
        return 0
    stages = [s.strip().zfill(2) for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in ALL_STAGES]
    if bad or not stages:
        ap.error(f"--stages takes stages among {', '.join(ALL_STAGES)}, not {args.stages!r}")
    if args.correct < 0 or args.wrong < 0 or args.correct + args.wrong == 0:
        ap.error("--correct and --wrong take counts of at least 0, not both 0")
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"{args.out} is not empty: name a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    made = write_class(args.out / "class", stages, args.correct, args.wrong)
    walls, left_out, report = grade_stages(args.out, made, args)
    if report is None:
        print("nothing was graded: the budget ran out before the first stage", file=sys.stderr)
        return 1
    write_tables(args.out, made, walls, left_out, report, args)
    print((args.out / "phase_costs.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
