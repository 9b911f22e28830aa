"""The run's outputs: ``grades.csv`` (one row per student and stage, for a spreadsheet), ``grades.json`` (the same
rows with every detail, and how the run was made), Gradescope's ``results.json`` (one per student; at the top of
the output folder for a single submission, where Gradescope's autograder looks for it) and the summary table the
command prints. A re-grade of some students or stages merges into the report already there.

Written by the parent alone, at the end of the run, so nothing a child does can reach them. The CSV and JSON are the
staff's (seeds included); the Gradescope files are the students' (the seeds of the inputs taken out).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np

from ..outputs import write_or_fallback
from .environment import one_line

CSV_FIELDS = ["student", "stage", "status", "passed", "score", "max_score", "correctness_points", "accuracy_points",
              "op_time_points", "technique_points", "task_points", "error", "accuracy", "reference_accuracy", "op_time_s",
              "reference_op_time_s", "ratio", "message", "notebook", "seed", "seconds"]


def _op_time_how(row: dict) -> str:
    """How the row's op times were taken, in the student's words (labkit.grading.scoring._op_time)."""
    paired = bool(((row.get("details") or {}).get("op_time_reference") or {}).get("pairs"))
    return ("median pass; the ratio is the median of your passes over the reference's, timed in turn"
            if paired else "best of the timed passes")


def _csv_value(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def write_reports(out: Path, report: dict, gradescope: bool = True) -> Path:
    """Write the reports under ``out``; returns the folder written. Where ``out`` fails at the end of a run (removed,
    full, its permissions changed), they go to a fallback folder instead, named on stderr and in
    ``meta["written_to"]``: a graded class is never lost to a write error."""
    def write(folder: Path) -> None:
        if folder != Path(out):
            report["meta"]["written_to"] = str(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "grades.json").write_text(json.dumps(report, indent=1, default=_json_default))
        with open(folder / "grades.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for row in report["rows"]:
                w.writerow({k: _csv_value(row.get(k)) for k in CSV_FIELDS})
        if gradescope:
            write_gradescope(folder, report)

    return write_or_fallback(Path(out), write, "grades")


# ------------------------------------------------------------------------------------------- Gradescope

_SEED = re.compile(r"\s*\[seed \d+\]")


def student_text(message: str) -> str:
    """A message as a student may see it: without the secret seed of the inputs."""
    return _SEED.sub("", message or "")


def gradescope_results(rows: list[dict], meta: dict) -> dict:
    """Gradescope's autograder ``results.json`` for one student: a test per scored part of every stage (score,
    max_score, output), the total, and the op time of every stage that measured one on the leaderboard."""
    tests, board = [], []
    for r in rows:
        most = r.get("max_points") or {}
        stage = f"stage {r['stage']}"
        msg = student_text(r["message"])
        parts = [("correctness", r["correctness_points"], f"{r['status']}: {msg}")]
        if most.get("accuracy"):
            acc = r.get("accuracy")
            ref = r.get("reference_accuracy")
            parts.append(("accuracy", r["accuracy_points"],
                          f"accuracy {acc:.4f}, the reference's {ref:.4f}" if isinstance(acc, float)
                          and isinstance(ref, float) else f"accuracy: {acc if acc is not None else 'not run'}"))
        if most.get("op_time"):
            t, ref_t, ratio = r.get("op_time_s"), r.get("reference_op_time_s"), r.get("ratio")
            parts.append(("op time", r["op_time_points"],
                          f"op time {t:.6g} s ({_op_time_how(r)}), the reference's {ref_t:.6g} s: "
                          f"{ratio:.2f}x" if isinstance(t, float) and isinstance(ratio, float)
                          else f"op time: {t if t is not None else 'not timed (the checks or accuracy did not pass)'}"))
        if most.get("technique"):
            parts.append(("technique", r.get("technique_points", 0.0),
                          (r.get("details") or {}).get("technique", "not checked")))
        for name, task in ((r.get("details") or {}).get("tasks") or {}).items():
            parts.append((f"task {name}", task["points"] if task["passed"] and r.get("task_points") else 0.0,
                          task["line"], task["points"]))
        for part, score, output, *top in parts:
            best = top[0] if top else most.get(part.replace(" ", "_"), 0)
            tests.append({"name": f"{stage}: {part}", "score": float(score), "max_score": float(best or 0),
                          "output": output, "visibility": "visible",
                          "status": "passed" if r["status"] == "pass" else "failed"})
        if isinstance(r.get("op_time_s"), float) and r["status"] == "pass":
            board.append({"name": f"{stage} op time (s)", "value": round(r["op_time_s"], 6), "order": "asc"})
    total = sum(float(r["score"]) for r in rows)
    most = sum(float(r["max_score"]) for r in rows)
    env = meta.get("environment") or {}
    return {"score": round(total, 2), "execution_time": int(round(sum(float(r.get("seconds") or 0) for r in rows))),
            "output": f"{total:.1f} of {most:g} points; graded on {env.get('device', meta.get('device', ''))} "
                      f"({meta.get('date', '')})",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests, "leaderboard": board}


def write_gradescope(out: Path, report: dict) -> list[Path]:
    """``results.json`` at the top of ``out`` for a single submission (as Gradescope's autograder expects it),
    else ``out/gradescope/<student>/results.json`` for every student."""
    by: dict[str, list[dict]] = {}
    for row in report["rows"]:
        by.setdefault(row["student"], []).append(row)
    written = []
    single = report["meta"].get("single_submission") and len(by) == 1
    for student, rows in by.items():
        path = out / "results.json" if single else out / "gradescope" / _safe(student) / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(gradescope_results(rows, report["meta"]), indent=1, default=_json_default))
        written.append(path)
    return written


def _safe(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z._@-]+", "_", name).strip(".") or "student"


# --------------------------------------------------------------------------------------------- merging


def merge_reports(path: Path, new: dict) -> dict:
    """The report at ``path`` with the rows of ``new`` in place of its rows for the same (student, stage), others
    kept; ``meta.merge`` says what was replaced, added and kept, and ``meta.runs`` lists every run's seed."""
    old = json.loads(Path(path).read_text())
    fresh = {(r["student"], r["stage"]): r for r in new["rows"]}
    rows, replaced = [], []
    for r in old.get("rows", []):
        key = (r["student"], r["stage"])
        if key in fresh:
            rows.append(fresh.pop(key))
            replaced.append(key)
        else:
            rows.append(r)
    added = list(fresh)
    rows += list(fresh.values())
    om, nm = old.get("meta", {}), new["meta"]
    runs = om.get("runs") or [{k: om.get(k) for k in ("date", "command", "seed", "stages", "students", "device")}]
    runs = runs + [{k: nm.get(k) for k in ("date", "command", "seed", "stages", "students", "device")}]
    meta = {**om, **{k: v for k, v in nm.items() if k not in ("stages", "students")}}
    for key in ("timed_variants", "skipped_variants", "batches", "op_time", "accuracy"):
        meta[key] = {**om.get(key, {}), **nm.get(key, {})}
    meta["stages"] = list(dict.fromkeys([*om.get("stages", []), *nm.get("stages", [])]))
    meta["students"] = len({r["student"] for r in rows})
    meta["single_submission"] = False if len({r["student"] for r in rows}) > 1 else nm.get("single_submission")
    meta["runs"] = runs
    meta["merge"] = {"into": str(path), "replaced": len(replaced), "added": len(added),
                     "kept": len(rows) - len(replaced) - len(added),
                     "students": sorted({s for s, _ in [*replaced, *added]}),
                     "stages": sorted({st for _, st in [*replaced, *added]})}
    return {"meta": meta, "rows": rows}


def merge_line(report: dict) -> str:
    m = report["meta"].get("merge")
    if not m:
        return ""
    return (f"merged into the existing {Path(m['into']).name}: replaced {m['replaced']} row"
            f"{'s' * (m['replaced'] != 1)} and added {m['added']} (students {', '.join(m['students'])}; stages "
            f"{', '.join(m['stages'])}); kept the other {m['kept']} as they were")


def summary_table(report: dict) -> str:
    """Students x stages: score/max and status, totals; then one line per problem."""
    rows = report["rows"]
    stages = report["meta"]["stages"]
    students = list(dict.fromkeys(r["student"] for r in rows))
    by = {(r["student"], r["stage"]): r for r in rows}
    w = max([7, *map(len, students)])
    head = f"{'student':<{w}}  " + "  ".join(f"{'stage ' + s:<20}" for s in stages) + f"  {'total':>13}"
    lines = [head, "-" * len(head)]
    for st in students:
        cells, total, most = [], 0.0, 0.0
        for s in stages:
            r = by[(st, s)]
            total += r["score"]
            most += r["max_score"]
            cells.append(f"{r['score']:>6.1f}/{r['max_score']:<4g} {r['status']:<8}")
        lines.append(f"{st:<{w}}  " + "  ".join(f"{c:>20}" for c in cells) + f"  {f'{total:.1f}/{most:g}':>13}")
    problems = [r for r in rows if r["status"] != "pass"]
    if problems:
        lines += ["", "problems:"]
        lines += [f"  {r['student']} {r['stage']}: {r['message']}" for r in problems]
    m = report["meta"]
    lines += ["", f"device: {m['device']}; op time: "
              + ", ".join(f"stage {k} {v}" for k, v in m["op_time"].items())
              + "".join(f"; accuracy of stage {k} {v}" for k, v in m.get("accuracy", {}).items() if v != "scored")
              + "".join(f"; stage {k} did not grade {', '.join(v)} ({'; '.join(sorted(set(v.values())))})"
                        for k, v in m.get("skipped_variants", {}).items())
              + f"; memory guard: {m['memory_guard']}; seed {m['seed']}"]
    if m.get("environment"):
        lines.append(f"environment: {one_line(m['environment'])}")
    if m.get("merge"):
        lines.append(merge_line(report))
    return "\n".join(lines)


def regrade_command(report: dict, submissions: str, out: str) -> str | None:
    """The command that grades again only the rows that are the grader's own errors (``grader-error``), into the
    same report; None when there are none."""
    import shlex

    bad = [r for r in report["rows"] if r["status"] == "grader-error"]
    if not bad:
        return None
    m = report["meta"]
    students = ",".join(dict.fromkeys(r["student"] for r in bad))
    stages = ",".join(sorted({r["stage"] for r in bad}))
    cmd = ["labkit", "grade", str(submissions), "--students", students, "--stages", stages, "--out", str(out),
           "--merge", "--seed", str(m["seed"])]
    sources = (m.get("rubric") or {}).get("sources") or []
    if len(sources) > 1:
        cmd += ["--rubric", sources[-1]]
    return " ".join(shlex.quote(c) for c in cmd)


# ------------------------------------------------------------------------------------------- comparing

#: what two runs of the same class with the same seed must agree on (op time is measured again: noise)
SAME = ("status", "passed", "correctness_points", "accuracy_points", "technique_points", "task_points", "max_score",
        "accuracy", "reference_accuracy", "seed")
_VERDICT = re.compile(r"^(\[[^\]]*\] [^:]+): (PASS|FAIL)")


def _verdicts(row: dict) -> list[str]:
    """Each check's name and verdict (the numbers in a line may differ in the last digit: a float64 reference
    summed by another number of BLAS threads)."""
    return [m.group(0) for m in map(_VERDICT.match, (row.get("details") or {}).get("checks") or []) if m]


def compare_reports(a: dict, b: dict) -> dict:
    """Two reports of the same class and seed (say, a cluster run and a single machine's): every row's status,
    points (but op time's), errors and accuracy must be equal; each op time is set against the other run's spread
    (min..max of its timed passes). ``differences`` lists what is not equal."""
    rows_a = {(r["student"], r["stage"]): r for r in a["rows"]}
    rows_b = {(r["student"], r["stage"]): r for r in b["rows"]}
    diffs = [f"{k[0]} {k[1]}: only in the first" for k in rows_a if k not in rows_b]
    diffs += [f"{k[0]} {k[1]}: only in the second" for k in rows_b if k not in rows_a]
    times = []
    for key in [k for k in rows_a if k in rows_b]:
        ra, rb = rows_a[key], rows_b[key]
        for field in SAME:
            if ra.get(field) != rb.get(field):
                diffs.append(f"{key[0]} {key[1]}: {field} {ra.get(field)!r} != {rb.get(field)!r}")
        ea, eb = ra.get("error"), rb.get("error")
        if (ea is None) != (eb is None) or (ea is not None and not np.isclose(ea, eb, rtol=1e-6, atol=0)):
            diffs.append(f"{key[0]} {key[1]}: error {ea!r} != {eb!r}")
        if _verdicts(ra) != _verdicts(rb):
            diffs.append(f"{key[0]} {key[1]}: the checks' verdicts differ")
        ta, tb = ra.get("op_time_s"), rb.get("op_time_s")
        if isinstance(ta, float) and isinstance(tb, float):
            sa = ra["details"]["op_time_spread"]["student"]
            sb = rb["details"]["op_time_spread"]["student"]
            times.append({"student": key[0], "stage": key[1], "first": ta, "second": tb,
                          "first_spread": [sa["min"], sa["max"]], "second_spread": [sb["min"], sb["max"]],
                          "ratio": ta / tb if tb else None,
                          "within": sb["min"] <= ta <= sb["max"] or sa["min"] <= tb <= sa["max"],
                          "ratios": [ra.get("ratio"), rb.get("ratio")]})
    return {"rows": len(rows_a), "differences": diffs, "op_times": times}
