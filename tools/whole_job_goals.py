"""Issue 24's goals against a bench run: the final stage's fastest whole call per workload beside cuDNN's whole call
in the same process, the fraction of the fp32 floor, and the end-to-end rows; a markdown table from bench.json.

    python tools/whole_job_goals.py results/h100-2026-11-26c/bench_all/bench.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: (net, images) -> the issue's goal: a whole-call time in seconds, or a ratio to cuDNN's whole call
GOALS = {("cifar10", 50000): ("ms", 7.5e-3), ("fashion", 10000): ("ms", 5.5e-3), ("cifar10", 1200): ("ms", 0.35e-3),
         ("ece408", 10000): ("ratio", 2.5)}
END_TO_END_GOAL_S = 15e-3


def table(rows: list[dict], stage: str = "10") -> str:
    out = ["| workload | kit (stage " + stage + "), whole call: median (range, runs) | variant, how | per-layer sum | "
           "cuDNN whole call | cuDNN / kit | % of fp32 floor | goal | predictions = reference |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (net, n), (kind, goal) in GOALS.items():
        ours = [r for r in rows if r["stage"].startswith(stage + " ") and ":" not in r["stage"] and r["net"] == net
                and r["images"] == n and r.get("whole_call_s")]
        base = [r for r in rows if r["stage"].startswith("cuDNN") and r["net"] == net and r["images"] == n
                and r.get("whole_call_s")]
        if not ours or not base:
            out.append(f"| {net} {n} | not in this run | | | | | | | |")
            continue
        best, c = min(ours, key=lambda r: r["whole_call_s"]), base[0]
        ratio = c["whole_call_s"] / best["whole_call_s"]
        lo, hi = best["whole_call_range"]
        met = best["whole_call_s"] <= goal if kind == "ms" else ratio >= goal
        said = f"≤ {goal * 1e3:g} ms" if kind == "ms" else f"≥ {goal:g}× cuDNN"
        floor = best.get("floor_fraction")
        out.append(f"| {net} {n} | {best['whole_call_s'] * 1e3:.3f} ms ({lo * 1e3:.3f}–{hi * 1e3:.3f}, "
                   f"{best['whole_call_runs']}) | {best['stage']}, {best.get('whole_call_how', '')} | "
                   f"{best['total_s'] * 1e3:.3f} ms | {c['whole_call_s'] * 1e3:.3f} ms | {ratio:.2f}× | "
                   f"{'-' if floor is None else f'{100 * floor:.1f}'} | {said}: **{'met' if met else 'not met'}** | "
                   f"{'yes' if best.get('predictions_equal') else 'NO'} |")
    e2e = [r for r in rows if ":" in r["stage"] and r.get("e2e_s")]
    if e2e:
        out += ["", f"| end to end (host uint8 to host classes) | images | median | range (runs) | classes differing "
                    f"from the reference | goal ≤ {END_TO_END_GOAL_S * 1e3:g} ms |", "|---|---|---|---|---|---|"]
        for r in e2e:
            lo, hi = r["e2e_range"]
            out.append(f"| {r['stage']} | {r['images']} | {r['e2e_s'] * 1e3:.3f} ms | {lo * 1e3:.3f}–{hi * 1e3:.3f} "
                       f"({r['e2e_runs']}) | {r.get('classes_differing')} | "
                       f"{'met' if r['e2e_s'] <= END_TO_END_GOAL_S else 'not met'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: python tools/whole_job_goals.py BENCH_JSON (a labkit bench folder's bench.json)", file=sys.stderr)
        return 2
    data = json.loads(Path(args[0]).read_text())
    print(table(data["rows"] if isinstance(data, dict) else data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
