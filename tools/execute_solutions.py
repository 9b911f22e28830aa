"""Execute the solution notebooks in place, so their stored outputs are what nbval compares against.

Runs under the same conditions as the test suite: CUDA simulator, LABKIT_QUICK=1, data from LABKIT_DATA
(or ../shared/datasets). Afterwards regenerate the student copies with ``python tools/make_student.py``.

    python tools/execute_solutions.py                 # all solutions
    python tools/execute_solutions.py 01 04           # the notebooks whose names start with 01 or 04
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
    env = {"NUMBA_ENABLE_CUDASIM": "1", "LABKIT_QUICK": "1"}
    shared = REPO.parent / "shared" / "datasets"
    if not os.environ.get("LABKIT_DATA") and shared.is_dir():
        env["LABKIT_DATA"] = str(shared)
    return env


def execute(path: Path, timeout: int = 900) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="only notebooks whose names start with these")
    args = parser.parse_args(argv)
    os.environ.update(test_environment())
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        if args.prefixes and not path.name.startswith(tuple(args.prefixes)):
            continue
        print(f"{path.name}: executing ...", flush=True)
        print(f"{path.name}: done in {execute(path):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
