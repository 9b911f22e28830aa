"""A whole class graded two ways, compared: the cluster path against one machine, or all GPUs against one.

    python tests/whole_class.py DIR [--students 40] [--workers 2] [--seed 2024] [--upto 4]
    python tests/whole_class.py DIR --gpus [--upto 8] [--runs one_gpu,all_gpus]

writes a synthetic class of ``--students`` submissions under DIR/class (stages 01 to ``--upto``: correct ones, the
kit's student copies, the wrong kinds of tests/test_grade.py and tests/wrong_submissions.py, a right stage-05 kernel
without shared memory, a slow conv and one that never ends) and grades it twice with the same seed: with
``labkit grade --cluster local:N`` (a Dask LocalCluster) into DIR/cluster and ``--jobs N`` on this machine into
DIR/single (on the CUDA simulator), or with ``--gpus`` on a GPU machine (dask-cuda: the cluster extra): ``--gpus 0``
into DIR/one_gpu and ``--gpus all`` (one worker per GPU) into DIR/all_gpus. ``--runs`` grades only some of the two
(each run's wall time is kept in DIR/<run>.json, so the two can come from separate calls); once both are there it
prints both runs' times, the speedup, the progress bar's lines and the comparison
(``labkit.grading.compare_reports``): statuses, points but op time's, errors, accuracy and the checks' verdicts must
be equal; each op time is set against the other run's spread. The result is DIR/comparison.json.
``tests/test_grade.py::test_the_cluster_path_gives_the_single_machine_report`` is the small automated version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

RUBRIC = """
[limits]
time_s = 60
sim_time_s = 240
memory_mb = 6144

[accuracy]
images = 12

[timing]
images = 4
warmup = 1
repeat = 3

[stage."01"]
timing = { images = 4 }

[stage."02"]
variants = ["serial", "gpu_thread_per_output"]
accuracy = { images = 12 }

[stage."03"]
variants = ["managed_batched"]

[stage."04"]
variants = ["batched_padded"]
"""

SLOW_CONV = '''

_conv_fast = VARIANTS["serial"].impls["conv"]


def conv_slow(x, w, b, out, pad, stride):  # right, and three times the work
    for _ in range(3):
        _conv_fast(x, w, b, out, pad, stride)


VARIANTS["serial"].impls["conv"] = conv_slow
'''


def _edited(src: Path, dest: Path, edit=None) -> None:
    nb = nbformat.read(src, as_version=4)
    if edit is not None:
        edit([c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])])
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


def _replace(old: str, new: str, index: int):
    def edit(cells):
        assert old in cells[index].source, old
        cells[index].source = cells[index].source.replace(old, new, 1)
    return edit


def write_class(root: Path, students: int, upto: int = 4) -> list[str]:
    """The class: one folder per student, in the order of this list (cycled to ``students``)."""
    import test_grade as t01
    import wrong_submissions as w04

    sol = {n: REPO / "solutions" / nb for n, nb in (("01", "01_serial_baseline.ipynb"),
                                                   ("02", "02_kernels_vs_parallel.ipynb"),
                                                   ("03", "03_managed_memory.ipynb"),
                                                   ("04", "04_data_transfer_padding.ipynb"))}
    copy = {n: REPO / "notebooks" / p.name for n, p in sol.items()}

    def slow(cells):
        cells[t01.VARIANTS_CELL].source += SLOW_CONV

    def no_technique(cells):
        import stage_class

        cells[-1].source += stage_class.PLAIN_CONV

    later = {n: REPO / "solutions" / nb for n, nb in (("05", "05_shared_memory.ipynb"), ("06", "06_constant_memory.ipynb"),
                                                      ("07", "07_unroll_matmul.ipynb"), ("08", "08_fusion.ipynb"))}
    later = {n: p for n, p in later.items() if int(n) <= upto}

    plan: list[tuple[str, dict]] = [
        ("s01_correct", {"01": (sol["01"], None)}),
        ("s01_halo", {"01": (sol["01"], t01.halo_off_by_one)}),
        ("s01_unwritten", {"01": (sol["01"], t01.unwritten)}),
        ("s01_raises", {"01": (sol["01"], t01.raises)}),
        ("s01_patcher", {"01": (sol["01"], t01.patcher)}),
        ("s01_midpass", {"01": (sol["01"], t01.patches_mid_pass)}),
        ("s01_timedcache", {"01": (sol["01"], t01.caches_when_timed)}),
        ("s01_slow", {"01": (sol["01"], slow)}),
        ("s01_loops", {"01": (sol["01"], t01.loops_forever)}),
        ("s01_syntax", {"01": (sol["01"], t01.syntax_error)}),
        ("s02_correct", {"02": (sol["02"], None)}),
        ("s02_nobias", {"02": (sol["02"], _replace("out[n, m, i, j] = b[m] + conv_point_gpu(",
                                                   "out[n, m, i, j] = conv_point_gpu(", 4))}),
        ("s02_copy", {"02": (copy["02"], None)}),
        ("s03_correct", {"03": (sol["03"], None)}),
        ("s03_nocopyback", {"03": (sol["03"], _replace("        args[out_at][...] = managed[out_at]",
                                                       "        pass", 1))}),
        ("s03_copy", {"03": (copy["03"], None)}),
        *[(f"s04_{name}", {"04": (sol["04"], kind.edit)}) for name, kind in w04.KINDS.items()],
        ("s0104_correct", {"01": (sol["01"], None), "04": (sol["04"], None)}),
        ("s0104_mixed", {"01": (sol["01"], t01.halo_off_by_one), "04": (sol["04"], None)}),
        ("s0203_correct", {"02": (sol["02"], None), "03": (sol["03"], None)}),
        ("s01_correct_b", {"01": (sol["01"], None)}),
        ("s04_correct_b", {"04": (sol["04"], None)}),
        ("s_empty", {}),
        *[(f"s{n}_correct", {n: (p, None)}) for n, p in later.items()],
        *[(f"s{n}_copy", {n: (REPO / "notebooks" / p.name, None)}) for n, p in later.items()],
        *([("s05_no_technique", {"05": (later["05"], no_technique)})] if "05" in later else []),
        *([("s0508_correct", {"05": (later["05"], None), "08": (later["08"], None)})] if "08" in later else []),
    ]
    names = []
    for i in range(students):
        base, stages = plan[i % len(plan)]
        name = base if i < len(plan) else f"{base}_{i // len(plan)}"
        folder = root / name / "notebooks"
        folder.mkdir(parents=True, exist_ok=True)
        for number, (src, edit) in stages.items():
            _edited(src, folder / src.name, edit)
        names.append(name)
    return names


def _grade(args: list[str], log: Path, simulator: bool = True) -> tuple[float, str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": os.environ.get("NUMBA_ENABLE_CUDASIM", "1")} if simulator else None
    start = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "labkit", "grade", *args], stdout=fh, stderr=subprocess.STDOUT,
                              env=env)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"labkit grade {' '.join(args)} failed; see {log}")
    text = log.read_text()
    bars = [part for part in text.replace("\r", "\n").splitlines() if part.startswith("grading:")]
    excerpt = "\n".join(dict.fromkeys(bars[i] for i in sorted({1, len(bars) // 2, len(bars) - 1}) if 0 <= i < len(bars)))
    return seconds, excerpt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--students", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--upto", type=int, default=4, choices=range(4, 9), help="the class's last stage (4 to 8)")
    ap.add_argument("--gpus", action="store_true", help="one GPU against all of them, instead of cluster vs single")
    ap.add_argument("--runs", default=None, help="grade only these runs (comma-separated); compare once both exist")
    args = ap.parse_args(argv)
    root = args.folder
    stages = ",".join(f"{n:02d}" for n in range(1, args.upto + 1))
    if args.gpus:
        plan = {"one_gpu": ["--gpus", "0"], "all_gpus": ["--gpus", "all"]}
    else:
        plan = {"cluster": ["--cluster", f"local:{args.workers}"], "single": ["--jobs", str(args.workers)]}
    wanted = args.runs.split(",") if args.runs else list(plan)
    unknown = [r for r in wanted if r not in plan]
    if unknown:
        ap.error(f"--runs: no run {unknown[0]!r}; this mode's runs are {', '.join(plan)}")
    if not (root / "class").exists() or not any((root / f"{r}.json").exists() for r in plan):
        shutil.rmtree(root / "class", ignore_errors=True)
        write_class(root / "class", args.students, args.upto)
    (root / "rubric.toml").write_text(RUBRIC)
    common = [str(root / "class"), "--stages", stages, "--rubric", str(root / "rubric.toml"),
              "--seed", str(args.seed), "--no-merge"]
    for label in wanted:
        out = root / label
        shutil.rmtree(out, ignore_errors=True)
        print(f"grading the class: {label} ({' '.join(plan[label])})", flush=True)
        seconds, excerpt = _grade([*common, "--out", str(out), *plan[label]], root / f"{label}.log",
                                  simulator=not args.gpus)
        (root / f"{label}.json").write_text(json.dumps({"seconds": round(seconds, 1), "progress": excerpt}))
    first, second = plan
    if not all((root / f"{label}.json").exists() for label in plan):
        print(f"graded {', '.join(wanted)}; the comparison needs both runs ({first}, {second})")
        return 0
    runs = {label: {**json.loads((root / f"{label}.json").read_text()),
                    "report": json.loads((root / label / "grades.json").read_text())} for label in plan}
    from labkit.grading import compare_reports

    cmp = compare_reports(runs[first]["report"], runs[second]["report"])
    statuses: dict[str, int] = {}
    for r in runs[first]["report"]["rows"]:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    meta = runs[second]["report"]["meta"]
    summary = {
        "students": len({r["student"] for r in runs[first]["report"]["rows"]}), "stages": stages, "rows": cmp["rows"],
        "statuses": statuses, "seed": args.seed,
        **{label: {k: runs[label][k] for k in ("seconds", "progress")} | {
            "graded_on": runs[label]["report"]["meta"]["graded_on"]} for label in plan},
        "speedup": round(runs[first]["seconds"] / runs[second]["seconds"], 2) if args.gpus else None,
        "differences": cmp["differences"],
        "op_times": cmp["op_times"],
        "op_times_within_spread": sum(t["within"] for t in cmp["op_times"]),
        "device": meta["device"], "date": meta["date"], "environment": meta.get("environment"),
    }
    (root / "comparison.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "op_times"}, indent=1))
    for t in cmp["op_times"]:
        print(f"  op time {t['student']} {t['stage']}: {first} {t['first']:.4g} s, {second} {t['second']:.4g} s "
              f"(spreads {t['first_spread'][0]:.4g}..{t['first_spread'][1]:.4g} and {t['second_spread'][0]:.4g}.."
              f"{t['second_spread'][1]:.4g}); within: {t['within']}")
    return 0 if not cmp["differences"] else 1


if __name__ == "__main__":
    sys.exit(main())
