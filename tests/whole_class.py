"""A whole class through the cluster path, compared with a single machine's run of the same class and seed.

    python tests/whole_class.py DIR [--students 40] [--workers 2] [--seed 2024]

writes a synthetic class of ``--students`` submissions under DIR/class (stages 01 to 04: correct ones, the kit's
student copies, the wrong kinds of tests/test_grade.py and tests/wrong_submissions.py, a slow conv and one that
never ends), grades it with ``labkit grade --cluster local:N`` (a Dask LocalCluster) into DIR/cluster and with
``--jobs N`` on this machine into DIR/single, both with the same seed, and prints both runs' times, the progress
bar's last lines and the comparison (``labkit.grading.compare_reports``): statuses, points but op time's, errors,
accuracy and the checks' verdicts must be equal; each op time is set against the other run's spread.
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
time_s = 90
sim_time_s = 240
memory_mb = 6144

[checks]
batches = [1, 3]

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


def write_class(root: Path, students: int) -> list[str]:
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


def _grade(args: list[str], log: Path) -> tuple[float, str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": os.environ.get("NUMBA_ENABLE_CUDASIM", "1")}
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
    args = ap.parse_args(argv)
    root = args.folder
    if (root / "class").exists():
        shutil.rmtree(root / "class")
    names = write_class(root / "class", args.students)
    (root / "rubric.toml").write_text(RUBRIC)
    common = [str(root / "class"), "--stages", "01,02,03,04", "--rubric", str(root / "rubric.toml"),
              "--seed", str(args.seed), "--no-merge"]
    runs = {}
    for label, extra in (("cluster", ["--cluster", f"local:{args.workers}"]), ("single", ["--jobs", str(args.workers)])):
        out = root / label
        shutil.rmtree(out, ignore_errors=True)
        seconds, excerpt = _grade([*common, "--out", str(out), *extra], root / f"{label}.log")
        runs[label] = {"seconds": round(seconds, 1), "progress": excerpt,
                       "report": json.loads((out / "grades.json").read_text())}
    from labkit.grading import compare_reports

    cmp = compare_reports(runs["cluster"]["report"], runs["single"]["report"])
    statuses: dict[str, int] = {}
    for r in runs["cluster"]["report"]["rows"]:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    summary = {
        "students": len(names), "rows": cmp["rows"], "statuses": statuses, "seed": args.seed,
        "cluster": {k: runs["cluster"][k] for k in ("seconds", "progress")} | {
            "graded_on": runs["cluster"]["report"]["meta"]["graded_on"]},
        "single": {k: runs["single"][k] for k in ("seconds", "progress")} | {
            "graded_on": runs["single"]["report"]["meta"]["graded_on"]},
        "differences": cmp["differences"],
        "op_times": cmp["op_times"],
        "op_times_within_spread": sum(t["within"] for t in cmp["op_times"]),
        "device": runs["single"]["report"]["meta"]["device"],
        "date": runs["single"]["report"]["meta"]["date"],
    }
    (root / "comparison.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "op_times"}, indent=1))
    for t in cmp["op_times"]:
        print(f"  op time {t['student']} {t['stage']}: cluster {t['first']:.4g} s, single {t['second']:.4g} s "
              f"(spreads {t['first_spread'][0]:.4g}..{t['first_spread'][1]:.4g} and {t['second_spread'][0]:.4g}.."
              f"{t['second_spread'][1]:.4g}); within: {t['within']}")
    return 0 if not cmp["differences"] else 1


if __name__ == "__main__":
    sys.exit(main())
