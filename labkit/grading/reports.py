"""The run's outputs: ``grades.csv`` (one row per student and stage, for a spreadsheet), ``grades.json`` (the same
rows with every detail, and how the run was made) and the summary table the command prints.

Written by the parent alone, at the end of the run, so nothing a child does can reach them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

CSV_FIELDS = ["student", "stage", "status", "passed", "score", "max_score", "correctness_points", "accuracy_points",
              "op_time_points", "error", "accuracy", "reference_accuracy", "op_time_s", "reference_op_time_s",
              "ratio", "message", "notebook", "seed", "seconds"]


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


def write_reports(out: Path, report: dict) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grades.json").write_text(json.dumps(report, indent=1, default=_json_default))
    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in report["rows"]:
            w.writerow({k: _csv_value(row.get(k)) for k in CSV_FIELDS})


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
              + f"; memory guard: {m['memory_guard']}; seed {m['seed']}"]
    return "\n".join(lines)
