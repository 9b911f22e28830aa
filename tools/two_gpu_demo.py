"""Issue 33, point 3: a class of 60 (student, stage) jobs of stages 04-10 graded on one GPU and on two, compared.

    python3 tools/two_gpu_demo.py OUT [--jobs-per-gpu 6] [--only one_gpu|two_gpus] [--part K/N] [--seed 2033]
                                      [--class-dir DIR] [--simulate [--students NAME,...]] [--compare]

writes the class (made from the kit's own solutions: right ones, the kit's student copies, wrong kinds of
tests/wrong_submissions.py, tests/test_grade_tasks.py and tools/load_grading.py, a right stage-05 conv without shared
memory, and slow ones whose conv does its work three times) under --class-dir (default OUT/class) and the rubric
OUT/rubric.toml, then grades it twice with the same seed: ``labkit grade --gpus 0 --jobs P`` into OUT/one_gpu and
``--gpus 0,1 --jobs 2P`` into OUT/two_gpus (P: --jobs-per-gpu), each through dask-cuda, one worker per GPU. Each
run's wall time is kept in OUT/<run>.json, so the runs, or parts of them, can come from separate calls: ``--only``
grades one run, ``--part K/N`` every N-th student from the K-th into that run's report (``--merge``; its wall adds
to the run's). Once both runs are whole it writes OUT/comparison.json and OUT/comparison.md: per (student, stage)
the status and every part's points in both runs (equal, or the difference listed), the op-time ratio (student /
reference) in both with max/min - 1, and the walls; and OUT/<run>_slots.png, each run's jobs on its GPUs' slots
over time (each row's ``details.ran``), with each GPU's busy share: where a run lost its speed to idle slots. Exit
status 1 when a goal is missed: a difference, a ratio apart by more than 5 %, or two GPUs less than 1.8 times
faster.

``--simulate`` is the dry run where there is no GPU: the CUDA simulator grades, and tests/fake_dask_cuda.py stands in
for dask-cuda (its worker processes, one per "GPU", each with that GPU first in CUDA_VISIBLE_DEVICES); op time is not
measured there, so only statuses and points are compared. Run it from the repository's root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(HERE)]

STAGES = ("04", "05", "06", "07", "08", "09", "10")
RUNS = {"one_gpu": "0", "two_gpus": "0,1"}  # the run's --gpus
PARTS = ("status", "correctness_points", "accuracy_points", "op_time_points", "technique_points", "task_points",
         "max_score")
GOALS = {"ratio_spread": 0.05, "speedup": 1.8}

# each stage's timed variant, the one its wrong kinds change (tests/wrong_submissions.py; stage 10: the graded one of
# tests/test_grade_tasks.py); the time limit fixed (no reference job's wall time scales it: the reference jobs then
# take turns for their timed phase only, beside the other jobs), op time the best of 9 passes
RUBRIC_HEAD = """[limits]
time_factor = 0
time_s = 300
sim_time_s = 900
memory_mb = 8192

[timing]
repeat = 9
"""

SLOW = '''

def _three_times(conv):
    def conv_slow(*args, **kwargs):  # right, and three times the work
        for _ in range(3):
            conv(*args, **kwargs)
    return conv_slow


for _variant in VARIANTS.values():
    for _name in [k for k in _variant.impls if k.startswith("conv")]:
        _variant.impls[_name] = _three_times(_variant.impls[_name])
'''


def timed_variants() -> dict[str, str]:
    import wrong_submissions

    return {**{n: v for n, (_, v) in wrong_submissions.STAGES.items()}, "10": "whole_fashion"}


#: stages graded on more than their timed variant: 08's fused kernel too (its barrier kind is there); 09's pooled,
#: the student's kernel, on which the shipped rubric counts the technique (tuned_cifar10 may run given code there)
ALSO = {"08": ["implicit_gemm"], "09": ["pooled"]}


def rubric_text() -> str:
    return RUBRIC_HEAD + "".join(f'\n[stage."{n}"]\nvariants = {json.dumps([*ALSO.get(n, []), v])}\n'
                                 f'timed_variant = "{v}"\n' for n, v in timed_variants().items())


# ------------------------------------------------------------------------------------------- the class


def class_plan() -> dict[str, list[tuple[str, object]]]:
    """stage -> [(kind, edit)]: 60 jobs. An edit takes the notebook (nbformat) and changes it; "copy" is the kit's
    student copy (every function still the TODO stub)."""
    import stage_class
    import test_grade_tasks as t10
    import wrong_submissions as w

    from load_grading import MISSING_BARRIER

    def kernel_cells(nb):
        return [c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]

    def kind(name):
        return lambda nb: w.KINDS[name].edit(kernel_cells(nb))

    def slow(nb):
        kernel_cells(nb)[-1].source += SLOW

    def plain(nb):
        kernel_cells(nb)[-1].source += stage_class.PLAIN_CONV

    def replace(old, new):
        def edit(nb):
            cell = next(c for c in kernel_cells(nb) if old in c.source)
            cell.source = cell.source.replace(old, new, 1)
        return edit

    def stage10(graph, pipeline, tagged):
        def edit(nb):
            from labkit import nbcells

            cell = t10._defining(nb, "graph_call")
            cell.source += graph
            tags = [t for t in cell.metadata.get("tags", []) if t != nbcells.KERNEL_TAG]
            cell.metadata["tags"] = [*tags, nbcells.KERNEL_TAG] if tagged else tags
            t10._defining(nb, "classify_streamed").source += pipeline
        return edit

    right = [("correct", None)] * 4
    return {
        "04": [*right[:2], ("slow", slow), *[(k, kind(k)) for k in (
            "halo", "unwritten", "batch0", "transposed", "channel_race", "grid", "nhwc", "library_numpy", "timer",
            "memo_content", "stream_deferred", "untimed_layer")]],
        "05": [*right, ("slow", slow), ("no_technique", plain), ("token_shared", kind("token_shared")),
               ("copy", "copy")],
        "06": [*right, ("slow", slow), ("id_cache", kind("id_cache")), ("counter_patch", kind("counter_patch")),
               ("copy", "copy")],
        "07": [*right, ("slow", slow), ("copy", "copy")],
        "08": [*right[:3], ("slow", slow), ("given_as_own", kind("given_as_own")),
               ("given_wrapped", kind("given_wrapped")), ("missing_barrier", replace(*MISSING_BARRIER)),
               ("copy", "copy")],
        "09": [*right, ("slow", slow), ("cuda_c_wrong_source", kind("cuda_c_wrong_source")), ("copy", "copy")],
        "10": [*right[:3], *[(k, stage10(*v)) for k, v in t10.CLASS.items()], ("copy", "copy")],
    }


def write_class(root: Path) -> list[str]:
    """One folder per (student, stage), named so that sorted they take the stages in turn (the first jobs graded
    are every stage's first, and so each stage's reference job starts early): r00_s04_correct, r00_s05_correct..."""
    import nbformat

    from labkit.stages import STAGES as ALL

    names = []
    for stage, jobs in class_plan().items():
        notebook = ALL[stage].notebook
        for r, (kind, edit) in enumerate(jobs):
            name = f"r{r:02d}_s{stage}_{kind}"
            src = REPO / ("notebooks" if edit == "copy" else "solutions") / notebook
            nb = nbformat.read(src, as_version=4)
            if callable(edit):
                edit(nb)
            (root / name / "notebooks").mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, root / name / "notebooks" / notebook)
            names.append(name)
    return sorted(names)


def keep_only(klass: Path, names: list[str], students: list[str] | None, stages: tuple[str, ...]) -> str | None:
    """A smaller class: only ``students`` (all when None) of ``stages``; the first name not in the class, if any."""
    unknown = sorted(set(students or ()) - set(names))
    if unknown:
        return unknown[0]
    for name in names:
        if (students is not None and name not in students) or name.split("_")[1][1:] not in stages:
            shutil.rmtree(klass / name)
    return None


# ------------------------------------------------------------------------------------------- the runs


def grade_run(out: Path, klass: Path, run: str, jobs_per_gpu: int, seed: int, part: tuple[int, int] | None,
              simulate: bool, stages: tuple[str, ...] = STAGES) -> float:
    from labkit import grading

    students = sorted(p.name for p in klass.iterdir() if p.is_dir())
    if part:
        k, n = part
        students = students[k - 1::n]
    gpus = RUNS[run]
    jobs = jobs_per_gpu * len(gpus.split(","))
    command = (f"labkit grade class --stages {','.join(stages)} --rubric rubric.toml --gpus {gpus} --jobs {jobs} "
               f"--seed {seed}" + (f" --students {','.join(students)} --merge" if part else ""))
    print(f"{run}{f' part {part[0]}/{part[1]}' if part else ''}: {command}", flush=True)
    start = time.monotonic()
    grading.grade(klass, stages=list(stages), rubric=out / "rubric.toml", out=out / run, jobs=jobs, seed=seed,
                  progress=True, command=command, students=students if part else None, gpus=gpus,
                  merge=bool(part), gradescope=False)
    wall = round(time.monotonic() - start, 1)
    record = out / f"{run}.json"
    walls = json.loads(record.read_text()) if record.is_file() and part else {"parts": {}}
    walls["parts"][f"{part[0]}/{part[1]}" if part else "whole"] = wall
    walls.update(gpus=gpus, jobs=jobs, jobs_per_gpu=jobs_per_gpu, simulated=simulate,
                 wall_s=round(sum(walls["parts"].values()), 1),
                 whole=not part or len(walls["parts"]) == part[1])
    record.write_text(json.dumps(walls, indent=1))
    print(f"{run}: {wall} s", flush=True)
    return wall


def _gpu_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        gpu = (r.get("details") or {}).get("gpu")
        if r["status"] != "missing" and gpu is not None:
            counts[gpu] = counts.get(gpu, 0) + 1
    return dict(sorted(counts.items()))


def work(report: dict) -> dict:
    """Where one run's time went, beside its wall: the jobs' own phases summed (``details.phases_s``: the same work
    takes longer on a busier host), how many reference jobs ran (a worker that read another's did not run one), and
    the core-speed probe of every timed attempt (``details.turn.attempts``: the same loop on the kept core, slower
    when the host's cores are)."""
    rows = [r for r in report["rows"] if r["status"] != "missing"]
    phases: dict[str, float] = {}
    for r in rows:
        for k, v in ((r.get("details") or {}).get("phases_s") or {}).items():
            if k != "waiting":
                phases[k] = phases.get(k, 0.0) + v
    probes = sorted(a["speed_us"] for r in rows for a in ((r.get("details") or {}).get("turn") or {}).get("attempts", [])
                    if isinstance(a.get("speed_us"), (int, float)))
    workers = (report["meta"].get("turns") or {}).get("by_worker") or {}
    ran = {(k.split()[0], v.get("measured_by", w)) for w, s in workers.items()
           for k, v in (s.get("reference_jobs") or {}).items()}
    return {"jobs_s": round(sum(phases.values()), 1), "phases_s": {k: round(v, 1) for k, v in phases.items()},
            "reference_jobs_run": len(ran),
            "probe_us": {"attempts": len(probes), "median": probes[len(probes) // 2] if probes else None,
                         "fastest": probes[0] if probes else None}}


def longest_first(report: dict, slots: int) -> dict:
    """How well the run's slots were packed: the span from its first job's start to its last one's end, beside the
    same jobs' measured times laid longest first on ``slots`` slots (``heapq``), each reference job run inside a
    student's slot taken apart as a job of its own, and beside their sum over the slots (no packing does better)."""
    import heapq

    laid = lanes(report["rows"], report.get("meta"))
    spans = [s for ls in laid.values() for lane in ls for s in lane]
    if not spans:
        return {}
    times = []
    for s in spans:
        whole, ref = s["to"] - s["from"], s["reference_s"] if not s.get("read") else 0.0
        times += [ref, whole - ref] if 0.5 < ref < whole - 0.5 else [whole]
    ends = [0.0] * slots
    for t in sorted(times, reverse=True):
        heapq.heappush(ends, heapq.heappop(ends) + t)
    return {"span_s": round(max(s["to"] for s in spans) - min(s["from"] for s in spans), 1),
            "longest_first_s": round(max(ends), 1), "sum_over_slots_s": round(sum(times) / slots, 1)}


def compare(out: Path) -> dict:
    reports = {run: json.loads((out / run / "grades.json").read_text()) for run in RUNS}
    walls = {run: json.loads((out / f"{run}.json").read_text()) for run in RUNS}
    rows: dict = {}
    for run, rep in reports.items():
        for r in rep["rows"]:
            if r["status"] != "missing":
                rows.setdefault((r["student"], r["stage"]), {})[run] = r
    table, differences, spreads = [], [], []
    for (student, stage), by_run in sorted(rows.items()):
        if set(by_run) != set(RUNS):
            differences.append(f"{student} {stage}: graded in {', '.join(by_run)} only")
            continue
        one, two = by_run["one_gpu"], by_run["two_gpus"]
        for part in PARTS:
            if one.get(part) != two.get(part):
                differences.append(f"{student} {stage}: {part} {one.get(part)!r} on one GPU, {two.get(part)!r} on two")
        ratios = [one.get("ratio"), two.get("ratio")]
        spread = max(ratios) / min(ratios) - 1 if all(isinstance(v, float) and v > 0 for v in ratios) else None
        if spread is not None:
            spreads.append(spread)
        table.append({"student": student, "stage": stage, "status": one["status"], "score": one["score"],
                      "scores": [one["score"], two["score"]], "max_score": one["max_score"], "ratios": ratios,
                      "ratio_spread": spread, "gpu_on_two": (two.get("details") or {}).get("gpu"),
                      "message": one["message"][:160]})
    wall_one, wall_two = walls["one_gpu"]["wall_s"], walls["two_gpus"]["wall_s"]
    speedup = round(wall_one / wall_two, 2) if wall_two else None
    simulated = any(w.get("simulated") for w in walls.values())
    largest = max(spreads) if spreads else None
    missed = [f"{len(differences)} difference(s) in status or points"] if differences else []
    if largest is not None and largest > GOALS["ratio_spread"]:
        missed.append(f"an op-time ratio {100 * largest:.1f} % apart (goal: within "
                      f"{100 * GOALS['ratio_spread']:.0f} %)")
    if not simulated and (speedup is None or speedup < GOALS["speedup"]):
        missed.append(f"two GPUs {speedup}x as fast as one (goal: at least {GOALS['speedup']}x)")
    meta = {run: rep["meta"] for run, rep in reports.items()}
    statuses: dict[str, int] = {}
    for t in table:
        statuses[t["status"]] = statuses.get(t["status"], 0) + 1
    result = {
        "jobs": len(table), "statuses": statuses, "differences": differences,
        "largest_ratio_spread": largest, "ratios_compared": len(spreads),
        "walls": {run: {"wall_s": w["wall_s"], "parts": w["parts"], "gpus": w["gpus"], "jobs": w["jobs"],
                        "graded_on": meta[run]["graded_on"], "turns": {k: v for k, v in meta[run]["turns"].items()
                                                                       if k != "rule"}}
                  for run, w in walls.items()},
        "speedup": speedup, "goals": GOALS, "missed": missed, "simulated": simulated,
        "work": {run: work(rep) for run, rep in reports.items()},
        "packing": {run: longest_first(rep, walls[run]["jobs"]) for run, rep in reports.items()},
        "rows_per_gpu": {run: _gpu_counts(rep["rows"]) for run, rep in reports.items()},
        "device": meta["two_gpus"]["device"], "gpus": meta["two_gpus"]["environment"].get("gpus"),
        "seed": meta["two_gpus"]["seed"], "dates": {run: m["date"] for run, m in meta.items()},
        "rows": table,
    }
    (out / "comparison.json").write_text(json.dumps(result, indent=1))
    (out / "comparison.md").write_text(markdown(result))
    return result


def reference_spans(meta: dict) -> list[tuple[str, dict]]:
    """The reference jobs that ran in slots of their own (``context.reference_tasks``), as (GPU, span): each
    worker's ``reference_jobs`` that it measured itself (``measured_by`` its own GPU)."""
    found = []
    for worker in ((meta.get("turns") or {}).get("by_worker") or {}).values():
        gpu = str(worker.get("gpu"))
        for key, job in (worker.get("reference_jobs") or {}).items():
            if job.get("measured_by") == f"gpu{gpu}" and job.get("ran"):
                found.append((gpu, {"from": job["ran"][0], "to": job["ran"][1], "reference_s": job["ran"][1] -
                                    job["ran"][0], "stage": key.split()[0], "what": "(reference solution)"}))
    return found


def lanes(rows: list[dict], meta: dict | None = None) -> dict[str, list[list[dict]]]:
    """Each GPU's jobs (their ``details.ran``, on the wall clock) laid out on as few lanes as hold them without
    overlap: {gpu: [lane, ...]}, each lane a list of spans. The lanes are the run's job slots as they were used: a
    gap in a lane is a slot that stood idle. With ``meta``, the reference jobs that ran in slots of their own too
    (one run inside a student's slot is part of that student's span already)."""
    spans: dict[str, list[dict]] = {}
    for r in rows:
        ran = (r.get("details") or {}).get("ran")
        if r["status"] != "missing" and ran:
            spans.setdefault(str(r["details"].get("gpu")), []).append(
                {"from": ran["from"], "to": ran["to"], "reference_s": ran.get("reference_s", 0.0), "stage": r["stage"],
                 "what": r["student"], "read": "reference_read" in ran})
    for gpu, ref in reference_spans(meta or {}):
        inside = any(s["from"] <= ref["from"] + 0.5 and s["to"] >= ref["to"] - 0.5 and s["reference_s"] > 0.5
                     and s["stage"] == ref["stage"] for s in spans.get(gpu, []))
        if not inside:
            spans.setdefault(gpu, []).append(ref)
    laid: dict[str, list[list[dict]]] = {}
    for gpu, todo in sorted(spans.items()):
        ends: list[float] = []
        laid[gpu] = []
        for span in sorted(todo, key=lambda s: s["from"]):
            free = next((i for i, end in enumerate(ends) if end <= span["from"]), None)
            if free is None:
                ends.append(span["to"])
                laid[gpu].append([span])
            else:
                ends[free] = span["to"]
                laid[gpu][free].append(span)
    return laid


def draw_slots(out: Path, run: str) -> dict:
    """OUT/<run>_slots.png: every job of the run as a bar on its GPU's slots (its stage's colour; the hatched part
    is its stage's reference job, run or waited for; a reference job in a slot of its own is hatched whole), and
    each GPU's busy share: the jobs' seconds over its slots
    times the span from the first job to the last. Returns {gpu: {"slots", "span_s", "busy"}}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads((out / run / "grades.json").read_text())
    laid = lanes(report["rows"], report.get("meta"))
    if not laid:
        return {}
    start = min(s["from"] for ls in laid.values() for lane in ls for s in lane)
    colours = {st: plt.cm.tab10(i) for i, st in enumerate(STAGES)}
    fig, ax = plt.subplots(figsize=(11, 0.35 * sum(len(ls) for ls in laid.values()) + 1.5), layout="constrained")
    plt.close(fig)
    y, ticks, busy = 0, [], {}
    for gpu, ls in laid.items():
        spans = [s for lane in ls for s in lane]
        span_s = max(s["to"] for s in spans) - min(s["from"] for s in spans)
        busy[gpu] = {"slots": len(ls), "span_s": round(span_s, 1),
                     "busy": round(sum(s["to"] - s["from"] for s in spans) / (len(ls) * span_s), 3) if span_s else None}
        for k, lane in enumerate(ls):
            for s in lane:
                ax.barh(y, s["to"] - s["from"], left=s["from"] - start, color=colours.get(s["stage"], "grey"),
                        edgecolor="k", linewidth=0.3)
                if s["reference_s"] > 0.5:
                    ax.barh(y, s["reference_s"], left=s["from"] - start, color="none", hatch="///", edgecolor="k",
                            linewidth=0.3)
            ticks.append((y, f"GPU {gpu} slot {k + 1}"))
            y += 1
        y += 0.5
    ax.set_yticks([t for t, _ in ticks], [name for _, name in ticks], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="seconds from the first job's start", title=f"{run}: every job on its GPU's slots (hatched: its "
           f"stage's reference job, run or waited for); busy " + ", ".join(f"GPU {g} {100 * b['busy']:.0f} %"
                                                                          for g, b in busy.items() if b["busy"]))
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()],
              labels=[f"stage {st}" for st in colours], fontsize=7, ncol=len(colours), loc="lower right")
    fig.savefig(out / f"{run}_slots.png", dpi=110)
    return busy


def markdown(result: dict) -> str:
    gpus = ", ".join(f"{g.get('index')}: {g.get('name')} ({g.get('uuid')})" for g in result["gpus"] or []) or "none"
    lines = [f"# {result['jobs']} (student, stage) jobs on one GPU and on two ({result['device']})", "",
             f"GPUs: {gpus}. Seed {result['seed']}; graded {result['dates']['one_gpu']} and "
             f"{result['dates']['two_gpus']}." + (" CUDA simulator (dry run): op time not measured."
                                                  if result["simulated"] else ""), "",
             "| run | --gpus | --jobs | wall (s) | parts | turns | longest wait for a turn (s) | rows per GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for run, w in result["walls"].items():
        lines.append(f"| {run} | {w['gpus']} | {w['jobs']} | {w['wall_s']} | {len(w['parts'])} | "
                     f"{w['turns'].get('turns')} | {w['turns'].get('longest_wait_s')} | "
                     f"{result['rows_per_gpu'][run]} |")
    lines += ["", "Where the time went: the jobs' own phases summed (waiting aside), the reference jobs that ran, the "
              "timing's core-speed probe (the same loop on the kept core; slower when the host is busier).", "",
              "| run | jobs' phases (s) | reference jobs run | probe median (µs) | probe fastest (µs) | attempts |",
              "|---|---|---|---|---|---|"]
    for run, w in result["work"].items():
        lines.append(f"| {run} | {w['jobs_s']} | {w['reference_jobs_run']} | {w['probe_us']['median']} | "
                     f"{w['probe_us']['fastest']} | {w['probe_us']['attempts']} |")
    lines += ["", "How well the slots were packed: the span from the first job's start to the last one's end; the same "
              "jobs laid longest first on the run's slots, a reference job run inside a student's slot taken apart; "
              "their sum over the slots.", "",
              "| run | span (s) | longest first (s) | sum over the slots (s) |", "|---|---|---|---|"]
    for run, k in result["packing"].items():
        lines.append(f"| {run} | {k.get('span_s')} | {k.get('longest_first_s')} | {k.get('sum_over_slots_s')} |")
    spread = result["largest_ratio_spread"]
    lines += ["", f"Two GPUs: {result['speedup']}x as fast as one (goal: at least {GOALS['speedup']}x).",
              f"Op-time ratios compared: {result['ratios_compared']}; the largest max/min - 1: "
              + (f"{100 * spread:.1f} %" if spread is not None else "-")
              + f" (goal: within {100 * GOALS['ratio_spread']:.0f} %).",
              f"Statuses: {result['statuses']}.",
              f"Differences in status or points between the runs: {len(result['differences'])}"
              + "".join(f"\n- {d}" for d in result["differences"]),
              "", "Goals missed: " + ("; ".join(result["missed"]) if result["missed"] else "none"), "",
              "| student | stage | status | score (one, two) | op-time ratio (one, two) | max/min - 1 | GPU (two) |",
              "|---|---|---|---|---|---|---|"]
    for t in result["rows"]:
        ratios = ", ".join(f"{v:.3f}" if isinstance(v, float) else "-" for v in t["ratios"])
        spread = f"{100 * t['ratio_spread']:.1f} %" if t["ratio_spread"] is not None else "-"
        lines.append(f"| {t['student']} | {t['stage']} | {t['status']} | {t['scores'][0]:g}, {t['scores'][1]:g} / "
                     f"{t['max_score']:g} | {ratios} | {spread} | {t['gpu_on_two']} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- main


def _simulated_gpus() -> None:
    """No GPU here: the simulator, and the stand-in for dask-cuda with two "GPUs"."""
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    import fake_dask_cuda
    from labkit.grading import run

    class Patch:
        def setitem(self, mapping, key, value):
            mapping[key] = value

    fake_dask_cuda.install(Patch())
    run.available_gpus = lambda: [0, 1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs-per-gpu", type=int, default=6)
    ap.add_argument("--only", choices=list(RUNS), help="grade this run only (the other in another call)")
    ap.add_argument("--part", help="K/N: grade every N-th student from the K-th, merged into the run's report")
    ap.add_argument("--seed", type=int, default=2033)
    ap.add_argument("--class-dir", type=Path, help="where the class is written (default OUT/class)")
    ap.add_argument("--simulate", action="store_true", help="no GPU: the simulator and a stand-in for dask-cuda")
    ap.add_argument("--compare", action="store_true", help="only compare the runs already in OUT")
    ap.add_argument("--students", help="write only these of the class (names, comma-separated)")
    ap.add_argument("--stages", default=",".join(STAGES),
                    help="a smaller class: only these stages' jobs, and only these stages graded (comma-separated)")
    args = ap.parse_args(argv)
    part = None
    if args.part:
        try:
            part = tuple(int(v) for v in args.part.split("/"))
            assert len(part) == 2 and 1 <= part[0] <= part[1]
        except (ValueError, AssertionError):
            ap.error(f"--part takes K/N with 1 <= K <= N, not {args.part!r}")
    stages = tuple(args.stages.split(","))
    if set(stages) - set(STAGES):
        ap.error(f"--stages: {sorted(set(stages) - set(STAGES))[0]} is not one of the class's ({', '.join(STAGES)})")
    if args.simulate:
        _simulated_gpus()
    out = args.out
    klass = args.class_dir or out / "class"
    out.mkdir(parents=True, exist_ok=True)
    if not args.compare:
        if not klass.is_dir():
            names = write_class(klass)
            unknown = keep_only(klass, names, args.students.split(",") if args.students else None, stages)
            if unknown:
                shutil.rmtree(klass)
                ap.error(f"--students: no {unknown} in the class (its names: {', '.join(names)})")
        (out / "rubric.toml").write_text(rubric_text())
        for run in [args.only] if args.only else list(RUNS):
            grade_run(out, klass, run, args.jobs_per_gpu, args.seed, part, args.simulate, stages)
    done = all((out / f"{run}.json").is_file() and json.loads((out / f"{run}.json").read_text())["whole"]
               and (out / run / "grades.json").is_file() for run in RUNS)
    if not done:
        print("comparison: not yet (both runs whole are needed)")
        return 0
    result = compare(out)
    for run in RUNS:
        busy = draw_slots(out, run)
        if busy:
            print(f"{run}: {out / (run + '_slots.png')}; busy share of the slots: "
                  + ", ".join(f"GPU {g} {b['busy']}" for g, b in busy.items()))
    print((out / "comparison.md").read_text())
    return 1 if result["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
