"""The careless user's bad inputs (issue 22), each run as a person runs it: ``python -m labkit ...`` in a fresh
temporary folder, no data unless the case makes some. Prints a Markdown table: each case, its exit code and the
line it printed, for this checkout and, with ``--before``, for another one (say, an older commit unpacked with
``git archive``), so the table in a closing note is computed, not typed.

    python tools/bad_inputs.py                                   # this checkout
    python tools/bad_inputs.py --before /tmp/old                 # and a column for the checkout in /tmp/old
    python tools/bad_inputs.py --only weights_text,ladder_text   # some cases

A command still running after ``--timeout`` seconds (JupyterLab, started when nothing refused it) is stopped; its
cell says so. "(traceback)" marks an output with a Python traceback, "(warning)" one with a Python warning.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
CIFAR_RECORD = 3073
GPU_DEVICE = "NVIDIA H100 80GB HBM3"


def _gpu_ledger(path: Path, lines: int = 3) -> None:
    """A ledger of GPU runs, as a GPU bench folder holds."""
    row = {"run": "0123456789ab", "stage": "reference (numpy)", "net": "cifar10", "images": 1200,
           "device": GPU_DEVICE, "simulated": False, "synthetic": False, "method": "perf_counter",
           "accuracy": 0.8, "runs": 1, "total_range": None, "date": "2026-11-25T00:00:00+00:00",
           "command": "labkit bench", "labkit": "0.2.0", "kind": "conv", "seconds": 0.1}
    path.write_text("".join(json.dumps({**row, "layer": f"conv{i + 1}"}) + "\n" for i in range(lines)))


def _gpu_results(folder: Path) -> Path:
    """A bench folder of GPU results: ledger, bench.json, bench.csv, summary.md, a plot."""
    folder.mkdir(parents=True)
    _gpu_ledger(folder / "ledger.jsonl")
    (folder / "bench.json").write_text(json.dumps({"meta": {"device": GPU_DEVICE}, "rows": []}))
    (folder / "bench.csv").write_text("stage,net\n")
    (folder / "summary.md").write_text(f"# Bench: {GPU_DEVICE}\n")
    (folder / "ladder_fashion_100.png").write_bytes(b"\x89PNG old plot")
    return folder


def _cifar(root: Path, records: int, stray: int = 0, name: str = "data_batch_1.bin") -> Path:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    raw = bytearray(os.urandom(records * CIFAR_RECORD + stray))
    for i in range(records):
        raw[i * CIFAR_RECORD] = i % 10
    (folder / name).write_bytes(bytes(raw))
    return root


def _blocker(tmp: Path) -> Path:
    (tmp / "blocker").write_text("a regular file where a folder is needed\n")
    return tmp / "blocker"


def _readme_check(checkout: Path) -> list[str]:
    text = (checkout / "README.md").read_text()
    tests = text.split("## Tests", 1)[-1].split("\n## ", 1)[0]
    says = [w for w, ok in (("how long", re.search(r"\d+ minutes", tests)), ("-rs", "-rs" in tests)) if ok]
    return [sys.executable, "-c", f"print('README Tests section says: {', '.join(says) or 'neither'}')"]


def _version_check(checkout: Path) -> list[str]:
    code = ("import json, subprocess, sys, tempfile, pathlib; "
            "v = subprocess.run([sys.executable, '-m', 'labkit', '--version'], capture_output=True, text=True)"
            ".stdout.split()[-1]; "
            "p = pathlib.Path(tempfile.mkdtemp()) / 'l.jsonl'; "
            "subprocess.run([sys.executable, '-m', 'labkit', 'run', '--images', '2', '--synthetic', '--record', "
            "str(p)], capture_output=True); "
            "from labkit.grading import environment; "
            "print(f'--version says {v}; a ledger records ' + json.loads(p.read_text().splitlines()[0])['labkit'] "
            "+ '; a grading report ' + str(environment.describe()['labkit']))")
    return [sys.executable, "-c", code]


@dataclass
class Case:
    name: str
    what: str  # the case as the issue states it
    args: Callable[[Path, Path], list[str]]  # (temp folder, checkout) -> labkit arguments, or a whole command
    env: Callable[[Path], dict] = field(default=lambda tmp: {})
    pick: str | None = None  # a regex: show the last line matching it (default: the last line)
    whole: bool = False  # args is a whole command, not labkit's arguments
    timeout: float | None = None  # seconds before it is stopped (default: --timeout)


def _sub(tmp: Path, checkout: Path) -> Path:
    """One student's untouched stage-01 notebook: a submission graded in seconds."""
    (tmp / "sub").mkdir(exist_ok=True)
    return Path(shutil.copy(checkout / "notebooks" / "01_serial_baseline.ipynb", tmp / "sub"))


def _grades(tmp: Path) -> Path:
    (tmp / "grades").mkdir()
    (tmp / "grades" / "grades.json").write_text('{"meta": {}, "rows": []}')
    return tmp / "grades"


def _text(tmp: Path, name: str = "notes.txt", body: str = "my notes\n") -> Path:
    (tmp / name).write_text(body)
    return tmp / name


def _symbol(tmp: Path) -> Path:
    nodes = [{"op": "null", "name": "data", "inputs": []}, {"op": "null", "name": "new0_weight", "inputs": []}]
    return _text(tmp, "ece408-sp19-symbol.json", json.dumps({"nodes": nodes, "arg_nodes": [0, 1], "heads": [[1, 0, 0]]}))


def _params_folder(tmp: Path) -> Path:
    (tmp / "model").mkdir()
    (tmp / "model" / "ece408-sp19-0002.params").write_bytes(b"\x12\x01" + bytes(30))
    return tmp / "model"


def _empty(tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _release_10(tmp: Path) -> Path:
    """A folder as milestone 10's release leaves it: its manifest and its notebooks."""
    folder = tmp / "course"
    (folder / "labkit" / "given").mkdir(parents=True)
    (folder / "labkit" / "given" / "manifest.json").write_text(json.dumps(
        {"milestone": "10", "released": [f"{n:02d}" for n in range(10)],
         "files": {f"{n:02d}": f"{n:02d}.py" for n in range(1, 10)}}))
    (folder / "notebooks").mkdir()
    (folder / "notebooks" / "10_whole_job.ipynb").write_text("{}")
    return folder


def _show(call: str) -> list[str]:
    return [sys.executable, "-c", f"import matplotlib; matplotlib.use('Agg'); import labkit as lk; {call}"]


BENCH = ["bench", "--stages", "01", "--nets", "cifar10", "--images", "2", "--repeat", "1", "--no-baselines"]

CASES = [
    Case("grade_out_unwritable", "`grade --out` that cannot be written (under a regular file)",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(_blocker(t) / "grades"),
                       "--no-progress"]),
    Case("grade_out_has_report", "`grade --out` holding an earlier report (no --merge, no --force)",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(_grades(t)),
                       "--no-progress"], pick=r"\S"),
    Case("run_record_unwritable", "`run --record` into a folder that cannot be made",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--record", str(_blocker(t) / "l.jsonl")]),
    Case("run_record_text_file", "`run --record` onto a text file",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--record", str(_text(t))]),
    Case("run_record_gpu_ledger", "`run --record` (simulator machine) onto a GPU's ledger",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--record", str(_gpu_results(t / "gpu") /
                                                                              "ledger.jsonl")]),
    Case("bench_out_existing", "`bench --out` on an existing GPU results folder",
         lambda t, c: [*BENCH, "--out", str(_gpu_results(t / "gpu"))]),
    Case("bench_append_other_device", "`bench --append` onto a GPU results folder",
         lambda t, c: [*BENCH, "--append", "--out", str(_gpu_results(t / "gpu"))]),
    Case("bench_force", "`bench --force` on a GPU results folder (old plots?)",
         lambda t, c: [sys.executable, "-c", "import subprocess, sys, pathlib; out = sys.argv[1]; "
                       "r = subprocess.run([sys.executable, '-m', 'labkit', *sys.argv[2:], '--force', '--out', out], "
                       "capture_output=True, text=True); print(r.stdout + r.stderr); "
                       "old = (pathlib.Path(out) / 'ladder_fashion_100.png').exists(); "
                       "print(f'exit {r.returncode}; the old plot ' + ('is still there' if old else 'is gone')); "
                       "sys.exit(r.returncode)", str(_gpu_results(t / "gpu")), *BENCH], whole=True),
    Case("fetch_root_uncreatable", "`data fetch --root` that cannot be created",
         lambda t, c: ["data", "fetch", "cifar10", "--root", str(_blocker(t) / "data")]),
    Case("bench_out_uncreatable", "`bench --out` that cannot be created",
         lambda t, c: [*BENCH, "--out", str(_blocker(t) / "out")]),
    Case("weights_text", "`--weights` a text file",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--weights", str(_text(t))]),
    Case("weights_json", "`--weights` a JSON file",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--weights", str(_text(t, "w.json", '{"a": 1}'))]),
    Case("weights_symbol_json", "`--weights` the ECE408 symbol `.json`",
         lambda t, c: ["run", "--net", "ece408", "--images", "2", "--synthetic", "--weights", str(_symbol(t))]),
    Case("weights_params_folder", "`--weights` a folder holding the ECE408 `.params`",
         lambda t, c: ["run", "--net", "ece408", "--images", "2", "--synthetic", "--weights", str(_params_folder(t))]),
    Case("cifar_train_partial", "a partial CIFAR *training* batch, more images asked for",
         lambda t, c: ["run", "--images", "10", "--no-download"], env=lambda t: {"LABKIT_DATA": str(_cifar(t / "d", 5))}),
    Case("cifar_mid_record", "a batch truncated mid-record, more images asked for (then the count suggested)",
         lambda t, c: ["run", "--images", "10", "--no-download"],
         env=lambda t: {"LABKIT_DATA": str(_cifar(t / "d", 5, stray=100))}),
    Case("cifar_shorter_than_record", "a batch file shorter than one record",
         lambda t, c: ["run", "--images", "1", "--no-download"],
         env=lambda t: {"LABKIT_DATA": str(_cifar(t / "d", 0, stray=100))}),
    Case("labkit_data_is_a_file", "`LABKIT_DATA` naming a regular file (`data fetch`)",
         lambda t, c: ["data", "fetch", "cifar10"], env=lambda t: {"LABKIT_DATA": str(_text(t))}),
    Case("labkit_data_is_a_file_where", "`LABKIT_DATA` naming a regular file (`data where`)",
         lambda t, c: ["data", "where"], env=lambda t: {"LABKIT_DATA": str(_text(t))}, pick=r"LABKIT_DATA"),
    Case("bench_notebooks_empty", "`bench --notebooks` an empty folder",
         lambda t, c: ["bench", "--notebooks", str(_empty(t)), "--nets", "cifar10", "--images", "2", "--out",
                       str(t / "out")]),
    Case("ladder_text_file", "`ladder` on a text file",
         lambda t, c: ["ladder", str(_text(t)), "--out", str(t / "lad")], pick=r"\S"),
    Case("lab_notebooks_empty", "`lab --notebooks` an empty folder",
         lambda t, c: ["lab", "--notebooks", str(_empty(t)), "--no-browser", "--port", "18931"],
         pick=r"^Starting JupyterLab|^Error", timeout=60),
    Case("lab_as_root", "`lab` as root (no --allow-root)",
         lambda t, c: ["lab", "--notebooks", str(c / "notebooks"), "--no-browser", "--port", "18932"],
         pick=r"allow-root|^Error", timeout=60),
    Case("grade_out_proc", "`grade --out /proc/nope` (nothing can be made there, even as root)",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", "/proc/nope", "--no-progress"]),
    Case("grade_cache_proc", "`grade --cache /proc/nope` (no reference job can be kept there)",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(t / "grades"), "--cache", "/proc/nope",
                       "--no-progress"]),
    Case("grade_cache_file", "`grade --cache` a regular file",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(t / "grades"), "--cache", str(_sub(t, c)),
                       "--no-progress"]),
    Case("grade_cache_and_no_cache", "`grade --cache DIR --no-cache`",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(t / "grades"), "--cache", str(t / "cache"),
                       "--no-cache", "--no-progress"]),
    Case("run_record_proc", "`run --record /proc/nope.jsonl`",
         lambda t, c: ["run", "--images", "2", "--synthetic", "--record", "/proc/nope.jsonl"]),
    Case("bench_out_proc", "`bench --out /proc/nope`", lambda t, c: [*BENCH, "--out", "/proc/nope"]),
    Case("fetch_root_proc", "`data fetch --root /proc/nope`",
         lambda t, c: ["data", "fetch", "cifar10", "--root", "/proc/nope"]),
    Case("release_out_proc", "`release /proc/nope`", lambda t, c: ["release", "/proc/nope", "--upto", "01"]),
    Case("release_below_milestone", "`release --upto 06` onto milestone 10's release",
         lambda t, c: ["release", str(_release_10(t)), "--upto", "06"]),
    Case("release_verify_empty", "`release --verify` of an empty folder",
         lambda t, c: ["release", "--verify", str(_empty(t)), "--upto", "05"]),
    Case("grade_docker_no_daemon", "`grade --sandbox docker` where docker has no daemon",
         lambda t, c: ["grade", str(_sub(t, c)), "--sandbox", "docker", "--out", str(t / "grades"), "--no-progress"],
         env=lambda t: {"LABKIT_SANDBOX_IMAGE": "course/labkit:1"}),
    Case("grade_gpus_here_none", "`grade --gpus all` on a machine without a GPU",
         lambda t, c: ["grade", str(_sub(t, c)), "--gpus", "all", "--out", str(t / "grades"), "--no-progress"]),
    Case("grade_cluster_cuda_no_gpus", "`grade --cluster cuda:` naming no GPU",
         lambda t, c: ["grade", str(_sub(t, c)), "--cluster", "cuda:", "--out", str(t / "grades"), "--no-progress"]),
    Case("grade_pythonpath_holds_submissions", "`grade` with a PYTHONPATH entry holding the submissions",
         lambda t, c: ["grade", str(_sub(t, c)), "--out", str(t / "grades"), "--no-progress"],
         env=lambda t: {"PYTHONPATH": str(t)}),
    Case("show_block_out_of_range", "`lk.show` of a block the launch does not have",
         lambda t, c: _show("lk.show(lk.from_stage('05').conv_tiled_8, block=(5, 5))"), whole=True,
         env=lambda t: {"NUMBA_ENABLE_CUDASIM": "1"}),
    Case("show_element_out_of_range", "`lk.show` of an element outside the output",
         lambda t, c: _show("lk.show(lk.from_stage('05').conv_tiled_8, element=(0, 0, 40, 40))"), whole=True,
         env=lambda t: {"NUMBA_ENABLE_CUDASIM": "1"}),
    Case("info_cuda_c", "`info`: where CUDA C runs without a GPU", lambda t, c: ["info"], pick=r"^CUDA C:"),
    Case("info_ece408", "`info`: the ece408 model", lambda t, c: ["info"], pick=r"^model ece408"),
    Case("info_labkit_data_file", "`info` with `LABKIT_DATA` naming a file", lambda t, c: ["info"],
         env=lambda t: {"LABKIT_DATA": str(_text(t))}, pick=r"^data: LABKIT_DATA"),
    Case("version", "`--version` and the version reports record",
         lambda t, c: _version_check(c), whole=True),
    Case("readme_tests", "README: how long the tests take, how to see skip reasons",
         lambda t, c: _readme_check(c), whole=True),
]


def run_case(case: Case, checkout: Path, timeout: float) -> tuple[str, str]:
    """(exit code, the line) of one case on one checkout, in a fresh temporary folder."""
    timeout = case.timeout or timeout
    with tempfile.TemporaryDirectory(prefix=f"bad-{case.name}-") as tmp:
        tmp = Path(tmp)
        (tmp / "nodata").mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("LABKIT_DATA", "LABKIT_RESULTS")}
        env.update(PYTHONPATH=str(checkout), LABKIT_DATA=str(tmp / "nodata"), PYTHONWARNINGS="default",
                   LABKIT_RESULTS=str(tmp / "results"))
        extra = case.env(tmp)
        if "PYTHONPATH" in extra:  # the case's entries after the checkout's
            extra["PYTHONPATH"] = os.pathsep.join([str(checkout), extra["PYTHONPATH"]])
        env.update(extra)
        args = case.args(tmp, checkout)
        cmd = args if case.whole else [sys.executable, "-m", "labkit", *args]
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            code = str(proc.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                out, _ = proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
            code = f"still running after {timeout:g} s"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    picked = [ln for ln in lines if re.search(case.pick, ln)] if case.pick else lines
    line = (picked or lines or ["(nothing)"])[-1]
    if case.pick == r"\S" and picked:  # the first line: what the command says before any table
        line = picked[0]
    line = line.replace(str(tmp), "TMP").replace(str(checkout), "CHECKOUT")
    marks = [m for m, hit in (("traceback", "Traceback (most recent call last)" in out),
                              ("warning", re.search(r"^\S+\.py:\d+: \w+Warning: ", out, re.M))) if hit]
    return code, line + "".join(f" ({m})" for m in marks)


def _cell(code: str, line: str) -> str:
    line = line if len(line) <= 220 else line[:217] + "..."
    return f"{code}: `{line.replace('`', '')}`".replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=None, help="another checkout, shown in a 'before' column")
    ap.add_argument("--only", default=None, help="case names, comma-separated")
    ap.add_argument("--timeout", type=float, default=240, help="seconds before a command is stopped")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    unknown = set(args.only.split(",")) - {c.name for c in CASES} if args.only else set()
    if unknown:
        ap.error(f"--only: no case {sorted(unknown)[0]!r}; the cases are {', '.join(c.name for c in CASES)}")
    heads = (["before", "after"] if args.before else ["now"])
    print(f"| case | {' | '.join(heads)} |")
    print(f"|---|{'---|' * len(heads)}")
    for case in cases:
        cells = []
        for checkout in ([args.before.resolve()] if args.before else []) + [ROOT]:
            cells.append(_cell(*run_case(case, checkout, args.timeout)))
        print(f"| {case.what} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
