"""Execute the solution notebooks in place, so their stored outputs are what nbval compares against.

Runs under the same conditions as the test suite: CUDA simulator, LABKIT_QUICK=1, data from LABKIT_DATA.
Afterwards regenerate the student copies with ``python tools/make_student.py``.

    python tools/execute_solutions.py                 # all solutions
    python tools/execute_solutions.py 01 04           # the notebooks whose names start with 01 or 04

On a GPU machine, ``--gpu --out DIR`` runs them at full size on the real device (no simulator, no LABKIT_QUICK)
and writes the executed copies to DIR, leaving solutions/ alone; a failing cell is recorded and the rest go on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent


def test_environment() -> dict[str, str]:
    import atexit
    import shutil
    import tempfile

    # a fresh ledger, as in the tests: plots in the stored outputs show only the notebook's own runs
    results = tempfile.mkdtemp(prefix="labkit-solutions-")
    atexit.register(shutil.rmtree, results, ignore_errors=True)
    if not os.environ.get("LABKIT_DATA"):
        print("LABKIT_DATA is unset: the stored outputs will show synthetic inputs. Point it at the data first.")
    return {"NUMBA_ENABLE_CUDASIM": "1", "LABKIT_QUICK": "1", "LABKIT_RESULTS": str(Path(results) / "ledger.jsonl")}


def execute(path: Path, timeout: int = 900, out: Path | None = None, allow_errors: bool = False,
            name: str | None = None) -> float:
    """Execute one notebook; a cell's error is printed with its whole traceback (a flaky failure is kept)."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for i, cell in enumerate(nb.cells):
        for e in (o for o in cell.get("outputs", []) if o.output_type == "error"):
            print(f"{path.name}: cell {i} raised {e.ename}: {e.evalue}", flush=True)
            print(_plain("\n".join(e.traceback)), flush=True)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, (out / (name or path.name)) if out else path)
    return time.perf_counter() - start


def _plain(text: str) -> str:
    """A traceback without its terminal colours."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="only notebooks whose names start with these")
    parser.add_argument("--gpu", action="store_true", help="run on the real GPU at full size (not the simulator)")
    parser.add_argument("--out", type=Path, help="write executed copies here instead of in place")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--runs", type=int, default=1, help="execute each notebook this many times (with --out: "
                                                             "NAME.runK.ipynb each, every error's traceback printed)")
    args = parser.parse_args(argv)
    if args.gpu:
        for name in ("NUMBA_ENABLE_CUDASIM", "LABKIT_QUICK"):
            os.environ.pop(name, None)
    else:
        os.environ.update(test_environment())
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        if args.prefixes and not path.name.startswith(tuple(args.prefixes)):
            continue
        for k in range(args.runs):
            name = f"{path.stem}.run{k + 1}.ipynb" if args.runs > 1 else None
            print(f"{name or path.name}: executing ...", flush=True)
            seconds = execute(path, args.timeout, args.out, allow_errors=args.gpu, name=name)
            print(f"{name or path.name}: done in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
