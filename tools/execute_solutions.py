"""Execute the solution notebooks in place, so their stored outputs are what nbval compares against.

Runs under the same conditions as the test suite: CUDA simulator, LABKIT_QUICK=1, data from LABKIT_DATA.
Afterwards regenerate the student copies with ``python tools/make_student.py``. A notebook whose source
(``NN_topic.py``, where code and prose are edited) holds other cells is refused before anything runs: run
``jupytext --sync solutions/NN_topic.py`` first.

    python tools/execute_solutions.py                 # all solutions
    python tools/execute_solutions.py 01 04           # the notebooks whose names start with 01 or 04

On a GPU machine, ``--gpu --out DIR`` runs them at full size on the real device (no simulator, no LABKIT_QUICK)
and writes the executed copies to DIR, leaving solutions/ alone; a failing cell is recorded and the rest go on.

A kernel that dies (a time limit's SIGTERM, which GNU ``timeout`` sends to the whole process group, the kernel
included; the out-of-memory killer) is said in one line naming the cell it was running, and with ``--out`` the cells
run so far are kept in NAME.partial.ipynb; the exit status is then 1. nbclient itself reports such a death as a bare
``AssertionError`` from its cleanup (``assert self.km is not None``): that was notebook 09's "flaky" failure on an
H100 (issue 32), both times its run was cut by the step's time limit.
"""

from __future__ import annotations

import argparse
import os
import asyncio
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

REPO = Path(__file__).resolve().parent.parent


class KernelDied(RuntimeError):
    """The kernel stopped during a cell: the cell's own code did not raise."""

    def __init__(self, line: str, signalled: bool):
        super().__init__(line)
        self.signalled = signalled


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
    running: dict = {}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_start=lambda cell, cell_index: running.update(index=cell_index, cell=cell))
    try:
        client.execute()
    except (DeadKernelError, AssertionError, asyncio.CancelledError) as exc:
        # nbclient answers this process's SIGTERM or SIGINT by shutting the kernel down itself; the cell then sees a
        # dead kernel and nbclient's second cleanup fails its `assert self.km is not None` (a kernel that died on its
        # own is a plain DeadKernelError; during the kernel's start, the signal cancels it)
        if isinstance(exc, AssertionError) and not isinstance(exc.__context__, DeadKernelError):
            raise
        signalled = not isinstance(exc, DeadKernelError)
        if out:
            _write(nb, out / f"{Path(name or path.name).stem}.partial.ipynb")
        raise KernelDied(_death(running, time.perf_counter() - start, signalled), signalled) from None
    for i, cell in enumerate(nb.cells):
        for e in (o for o in cell.get("outputs", []) if o.output_type == "error"):
            print(f"{path.name}: cell {i} raised {e.ename}: {e.evalue}", flush=True)
            print(_plain("\n".join(e.traceback)), flush=True)
    _write(nb, (out / (name or path.name)) if out else path)
    return time.perf_counter() - start


def _write(nb, where: Path) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, where)


def _death(running: dict, seconds: float, signalled: bool) -> str:
    """One line: which cell the kernel was running, and the likeliest cause."""
    cell = running.get("cell")
    first = next((line for line in (cell.source.splitlines() if cell else []) if line.strip()), "")
    why = ("this process was sent SIGTERM or SIGINT, and nbclient shut the kernel down: a time limit (GNU timeout "
           "signals the whole process group) or Ctrl-C" if signalled else
           "killed from outside (the out-of-memory killer, a signal) or crashed in native code")
    return (f"the kernel died during cell {running.get('index', '?')} ({first[:60]!r}) after {seconds:.0f} s: {why}; "
            f"no cell raised")


def _out_of_step(path: Path) -> str:
    """Why a solution notebook and its source do not hold the same cells ("" when they do)."""
    kit = str(Path(__file__).resolve().parent.parent)
    if kit not in sys.path:
        sys.path.insert(0, kit)
    from labkit import nbcells

    return nbcells.out_of_step(path)


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
    paths = [p for p in sorted((REPO / "solutions").glob("*.ipynb"))
             if not args.prefixes or p.name.startswith(tuple(args.prefixes))]
    stale = [(p, why) for p in paths if (why := _out_of_step(p))]
    for path, why in stale:
        print(f"{path.name}: not executed: {why}; run `jupytext --sync {path.with_suffix('.py')}` first")
    if stale:
        return 2
    died = 0
    for path in paths:
        for k in range(args.runs):
            name = f"{path.stem}.run{k + 1}.ipynb" if args.runs > 1 else None
            print(f"{name or path.name}: executing ...", flush=True)
            try:
                seconds = execute(path, args.timeout, args.out, allow_errors=args.gpu, name=name)
            except KernelDied as exc:
                died += 1
                print(f"{name or path.name}: {exc}", flush=True)
                if exc.signalled:  # stopped from outside: no more runs
                    return 1
                continue
            print(f"{name or path.name}: done in {seconds:.1f} s", flush=True)
    return 1 if died else 0


if __name__ == "__main__":
    sys.exit(main())
