"""The grader's own (parent) work for one job at a GPU's sizes, measured on any machine: no child, no device.

    python3 tools/parent_costs.py OUT [--stages 04,05,06,07,08,09,10] [--seed N]

On the simulator GPU code is checked on shrunk layers, so a job's ``inputs`` phase there says nothing of a GPU's;
this tool builds one job of each stage as the grader does on a GPU (the rubric's batch sizes and the boundary
shapes, the real nets, 1200 timed images: the simulator's shrinking is switched off in this process, where nothing
runs on a device) and times each part of the parent's work: drawing the inputs, writing inputs.npz, the float64
answers of the checks and tasks, and those of the timed passes (each the best of ``--repeat``). Before issue 33
the answers were computed before the child started and the passes' after its timing, all on the job's path; now
only the drawing and the writing are (``labkit.grading.ahead`` computes the answers while the child runs). Writes
OUT/parent_costs.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def measure(stage: str, seed: int, repeat: int) -> dict:
    from labkit.grading.job import GradingJob
    from labkit.grading.plan import References, plan_stage
    from labkit.grading.rubric import load_rubric
    from labkit.stages import STAGES

    plan = plan_stage(STAGES[stage], REPO / "solutions", load_rubric(), True, False)
    plan.measured = True  # as on a GPU: timed
    refs = References()
    t = time.perf_counter()
    refs.prepare(plan)
    prepare = time.perf_counter() - t
    import labkit.grading.inputs as inputs_mod  # GradingJob.build's Ahead

    real = inputs_mod.Ahead

    class Kept(real):  # the answers are timed below, one after the other, not in a thread beside the drawing
        def __init__(self, pieces, turns=None, owner=None):
            self.pieces = dict(pieces)

    inputs_mod.Ahead = Kept
    builds = []
    try:
        for _ in range(repeat):  # the best of `repeat` (a shared machine's noise only ever adds)
            job = GradingJob(plan, refs, "(parent costs)", plan.solution, seed, True)
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                job.build(Path(tmp))
                builds.append(time.perf_counter() - t)
                size = (Path(tmp) / "inputs.npz").stat().st_size
    finally:
        inputs_mod.Ahead = real
    build = min(builds)
    spent = {"case": 0.0, "task": 0.0, "pass": 0.0}
    for (kind, _), piece in job._ahead.pieces.items():
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            piece()
            times.append(time.perf_counter() - t)
        spent[kind] += min(times)
    return {"stage": stage, "cases": len(job.cases), "tasks": len(job._task_expected), "passes": len(job._pass_images),
            "inputs_mb": round(size / 1e6, 1), "draw_and_write_s": round(build, 2),
            "answers_s": round(spent["case"] + spent["task"], 2), "passes_s": round(spent["pass"], 2),
            "before_on_path_s": round(build + spent["case"] + spent["task"] + spent["pass"], 2),
            "after_on_path_s": round(build, 2), "references_prepare_s": round(prepare, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--stages", default="04,05,06,07,08,09,10")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--repeat", type=int, default=3, help="each part timed this many times, the best kept (default 3)")
    args = ap.parse_args(argv)
    from labkit import device, simulator

    simulator.active = lambda: False  # the GPU's sizes (this process runs nothing on a device)
    rows = [measure(s.strip().zfill(2), args.seed, max(1, args.repeat)) for s in args.stages.split(",") if s.strip()]
    meta = {"command": "python3 tools/parent_costs.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": device.info().cpu,
            "device": device.label(), "cores": __import__("os").cpu_count()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parent_costs.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["| stage | checks | tasks | inputs.npz (MB) | draw + write (s) | answers of checks and tasks (s) | "
             "answers of the timed passes (s) | on the job's path before (s) | now (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['cases']} | {r['tasks']} | {r['inputs_mb']} | {r['draw_and_write_s']} | "
              f"{r['answers_s']} | {r['passes_s']} | {r['before_on_path_s']} | {r['after_on_path_s']} |" for r in rows]
    lines += ["", f"(computed by `{meta['command']}`: {meta['date']}, on {meta['machine']} ({meta['cores']} cores), "
                  f"the GPU's sizes, one job of each stage, each part timed alone, the best of {args.repeat})"]
    (args.out / "parent_costs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
