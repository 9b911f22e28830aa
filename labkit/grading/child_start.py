"""A job's child set up as every child is: a fresh folder with private copies of labkit and of the solutions it may
load (and of the tuning choices the grader reads), its environment, the kernel it launched last, and the check
that it imports labkit and its libraries as the grader does; the probe child, started that way before any job
(``probe``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..ladder import tune
from . import environment, isolation, sandbox
from . import protocol as P
from .plan import StagePlan


def private_folder(plan: StagePlan) -> tuple[Path, Path, Path, sandbox.Guard]:
    """A fresh job folder with private copies of labkit and of the solutions (checksummed): (folder, lib,
    solutions, guard)."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    (folder / "student").mkdir()
    (folder / "work").mkdir()
    lib, solutions = folder / "lib", folder / "solutions"
    guarded = {str(p.relative_to(lib / "labkit")): p for p in sandbox.private_labkit(lib)}
    guarded.update({f"solutions/{p.name}": p for p in sandbox.private_solutions(plan.solution.parent, solutions,
                                                                                plan.stage.number)})  # earlier only
    return folder, lib, solutions, sandbox.Guard(guarded)


def tuning_copy(folder: Path) -> str:
    """A copy of the tuning choices this grader reads (``results/tuning.json``), for the child to read the same:
    a tuned variant then runs the kernels the student's notebook picks, not a fallback ("" when there are none)."""
    if not tune.STORE.is_file():
        return ""
    shutil.copyfile(tune.STORE, folder / "tuning.json")
    return str(folder / "tuning.json")


def job_env(folder: Path, lib: Path, solutions: Path, extra: dict) -> dict:
    return sandbox.child_env({"NUMBA_CACHE_DIR": str(folder / "work" / "numba-cache"),
                              "LABKIT_SOLUTIONS": str(solutions), **extra}, lib=lib)


def last_kernel(folder: Path) -> str:
    """The kernel the child launched last on a GPU (the worker writes its name), for a hung job's row."""
    try:
        return (folder / "work" / P.LAST_LAUNCH).read_text(errors="replace").split("\n")[0].strip()[:120]
    except OSError:
        return ""


def _imported_from(lib: Path, msg: P.Hello) -> str | None:
    """A grader error unless the child imported labkit from its private copy."""
    if not Path(msg.labkit).resolve().is_relative_to(lib.resolve()):
        return f"the grading process imported labkit from {msg.labkit}, not from its private copy in {lib}"
    return None


def not_as_the_grader(lib: Path, msg: P.Hello, iso: isolation.Isolation) -> str | None:
    """Why a child cannot grade as the grader does (labkit not its private copy, or another version of a library
    than the grader's), in one line; None when it can."""
    return _imported_from(lib, msg) or environment.mismatch(msg.versions, msg.origins, iso.advice)


#: how long a probe child may take to start and say what it imports (a container's first start can be slow)
PROBE_S = 300.0


def probe(iso: isolation.Isolation, memory_mb: int = 0, env_extra: dict | None = None,
          time_limit: float = PROBE_S) -> str | None:
    """Start one child in the run's sandbox as a job's is started (its private labkit, its view, its environment)
    that only says what it imports (``worker``: ``{"probe": true}``), before any job: why no job could be graded
    there (the sandbox does not start, or its Python imports other versions than the grader's), in one line; None
    when it can."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-probe-"))
    heard: list = []

    def on_frame(kind: P.Kind, meta: dict, payload: bytes, answer) -> bool:
        try:
            heard.append(P.decode(kind, meta))
        except P.ProtocolError as exc:
            heard.append(exc)
            return True
        return isinstance(heard[-1], (P.Done, P.GraderError))

    try:
        (folder / "work").mkdir()
        lib = folder / "lib"
        sandbox.private_labkit(lib)
        env = job_env(folder, lib, folder / "solutions", env_extra or {})
        end = sandbox.run_child({"probe": True, "stage": "00"}, folder, env, time_limit, memory_mb, False, on_frame,
                                iso)
        hello = next((m for m in heard if isinstance(m, P.Hello)), None)
        if hello is not None:
            return not_as_the_grader(lib, hello, iso)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = next((m for m in heard if isinstance(m, (P.GraderError, P.ProtocolError))), None)
    tail = [line.strip() for line in end.stderr_tail.splitlines() if line.strip()][-2:]  # docker: its error, a hint
    said = (getattr(failed, "message", None) or str(failed) if failed is not None else
            " / ".join(tail) or f"exit status {end.returncode}")
    return (f"the {iso.mode} sandbox did not start a grading child"
            + (f" within {time_limit:.0f} s" if end.timed_out else "") + f": {' '.join(said.split())[:300]}")
