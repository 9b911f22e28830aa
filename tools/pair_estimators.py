"""How far apart two runs' op-time ratios of the same submissions would be under other rules, from the passes the
rows keep (``details.op_time_reference.pairs``: every pass of each paired turn, the student's and the partner's).

    python tools/pair_estimators.py ONE/grades.json TWO/grades.json [--json OUT]

For each rule, over the submissions timed in both runs against a partner: the largest and the 90th-percentile
gap (max/min - 1), how many are within 5 %, and the range the copies of the solution (students named ``*correct``)
scored. The rule that scores rows is ``labkit.grading.scoring.paired_op_time`` (the median of the pairs); the
others are what it was compared with (docs/grading.md, "Grades at any load").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.grading.scoring import paired_op_time  # noqa: E402


def _turns(row: dict) -> list[tuple[list[float], list[float]]]:
    pairs = ((row.get("details") or {}).get("op_time_reference") or {}).get("pairs") or []
    return [(p["student_passes_s"], p["reference_passes_s"]) for p in pairs
            if p.get("student_passes_s") and p.get("reference_passes_s")]


def _low(values: list[float], k: int = 3) -> float:
    return sum(sorted(values)[:k])


def _scored(s: list[float], r: list[float]) -> float:
    """The rule that scores rows, run on these passes as one turn."""
    return paired_op_time([{"student": [{"pass": a} for a in s], "reference": [{"pass": b} for b in r]}])[2]


RULES = {
    "median of pairs": _scored,
    "best / best": lambda s, r: min(s) / min(r),
    "median / median": lambda s, r: median(s) / median(r),
    "mean / mean": lambda s, r: sum(s) / sum(r),
    "three best / three best": lambda s, r: _low(s) / _low(r),
    "geometric mean of pairs": lambda s, r: math.exp(sum(math.log(a / b) for a, b in zip(s, r)) / len(s)),
}


def ratios(report: dict) -> dict[tuple[str, str], dict[str, float]]:
    """{(student, stage): {rule: ratio}} for every row timed against a partner (every turn's passes together)."""
    out = {}
    for row in report["rows"]:
        turns = _turns(row)
        if turns:  # each turn's pairs (a turn cut short keeps the passes both sides took)
            s = [x for a, b in turns for x in a[:len(b)]]
            r = [x for a, b in turns for x in b[:len(a)]]
            out[(row["student"], row["stage"])] = {name: rule(s, r) for name, rule in RULES.items()}
    return out


def compare(one: dict, two: dict) -> dict:
    """Each rule's gaps between the two runs, over the rows both timed against a partner."""
    a, b = ratios(one), ratios(two)
    keys = sorted(set(a) & set(b))
    summary = {}
    for name in RULES:
        gaps = sorted(max(a[k][name], b[k][name]) / min(a[k][name], b[k][name]) - 1 for k in keys)
        copies = [x[k][name] for k in keys if k[0].endswith("correct") for x in (a, b)]
        summary[name] = {"rows": len(keys), "largest_gap": gaps[-1] if gaps else None,
                         "p90_gap": gaps[int(0.9 * len(gaps))] if gaps else None,
                         "within_5_percent": sum(g <= 0.05 for g in gaps),
                         "copies_of_the_solution": [min(copies), max(copies)] if copies else None}
    return summary


def table(summary: dict) -> str:
    lines = ["| rule | rows | within 5 % | largest gap | 90th percentile | copies of the solution |",
             "|---|---|---|---|---|---|"]
    for name, s in summary.items():
        copies = "-" if not s["copies_of_the_solution"] else "%.3f-%.3f" % tuple(s["copies_of_the_solution"])
        gap = (lambda g: "-" if g is None else f"{100 * g:.1f} %")
        lines.append(f"| {name} | {s['rows']} | {s['within_5_percent']} | {gap(s['largest_gap'])} | "
                     f"{gap(s['p90_gap'])} | {copies} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("one", type=Path)
    ap.add_argument("two", type=Path)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    args = ap.parse_args(argv)
    try:
        one, two = (json.loads(p.read_text()) for p in (args.one, args.two))
    except (OSError, ValueError) as exc:
        print(f"pair_estimators: cannot read a report: {exc} (give two grades.json files)", file=sys.stderr)
        return 2
    summary = compare(one, two)
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
