"""Reference jobs kept across runs: a stage's solution graded alone once per solution, rubric, device and kit
(docs/grading.md, "The reference cache").

A reference job (``job.reference_job``) grades the stage's solution in a child of its own, alone on the machine;
its timed passes are every student's op-time denominator and its wall time scales their time limit. Nothing in it
depends on the run but what goes into its key: the solution notebook's bytes and those of the earlier stages'
solutions it loads as given code, the stage's rubric values, the inputs
it is judged on (workloads, weights), the device (name, compute capability, driver, simulated or not, the CPU), the
sandbox, and the versions of Python, numpy, numba, numba-cuda, cupy and labkit with the hash of the kit's own
sources and tuning choices. A later run that computes the same key reads the result instead of running the job;
any change is another key, a miss, and the job runs again. The limit that follows from a cached entry is as honest
as a fresh one: the entry keeps the wall time of a job measured alone, on that device, with that code.

An entry is the grader's own file, but it is not trusted blindly: one that does not parse, has another schema or
key than its name's, or values of the wrong type or range, is ignored with one warning line (stderr, and the
report's ``meta.reference_cache.ignored``) and the job is measured again, its entry written over.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..ladder import tune
from ..launch import device
from ..outputs import OutputError, writable_folder
from . import environment
from .job import ReferenceTiming
from .plan import References, StagePlan
from .rubric import GradeError
from .sandbox import COPIED, PACKAGE, package_folders

#: the layout of an entry; an entry of another schema is ignored (and measured again)
SCHEMA = 1
#: rubric sections that only score what was measured: changing them changes no reference job
SCORING_ONLY = ("op_time",)


def default_folder() -> Path:
    """``$LABKIT_CACHE``, else the user's cache folder (platformdirs), ``reference-jobs`` in it."""
    if os.environ.get("LABKIT_CACHE"):
        return Path(os.environ["LABKIT_CACHE"]).expanduser()
    try:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("labkit"))
    except ImportError:  # pooch brings it; without it, the XDG place
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "labkit"
    return base / "reference-jobs"


# ------------------------------------------------------------------------------------------------ the key

_kit: str | None = None


def kit_hash() -> str:
    """sha256 over the kit's sources as a child gets them (``sandbox.private_labkit``: every .py, .toml, .cfg of
    labkit and its subpackages): a checkout's uncommitted edit is another kit."""
    global _kit
    if _kit is None:
        h = hashlib.sha256()
        for folder in package_folders():
            for f in sorted(folder.iterdir()):
                if f.is_file() and f.suffix in COPIED:
                    h.update(str(f.relative_to(PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
        _kit = h.hexdigest()
    return _kit


def _sha(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _file_sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def given_code(plan: StagePlan) -> dict[str, str | None]:
    """The earlier stages' solutions (notebooks and their sources) a job's child may load as given code
    (``lk.from_stage``; ``sandbox.private_solutions``), hashed: a reference job runs them too."""
    folder = plan.solution.parent
    return {f.name: _file_sha(f) for f in sorted(folder.glob("*")) if f.suffix in (".ipynb", ".py")
            and f.name[:2].isdigit() and f.name[:2] < plan.stage.number}


def versions() -> dict:
    """Python and the packages the grader and its children import (``environment.PACKAGES``)."""
    import platform

    return {"python": platform.python_version(), **{p: environment._version(p) for p in environment.PACKAGES}}


def device_identity(env_extra: dict | None = None) -> dict:
    """What a reference job's times depend on here: the device (name, compute capability, CUDA driver and runtime,
    simulated or not, the NVIDIA driver), the CPU and its cores, and the GPU a job is pinned to."""
    d = device.info()
    ident = {"kind": d.kind, "name": d.name, "simulated": d.simulated, "cpu": d.cpu, "cores": os.cpu_count(),
             "compute_capability": list(d.compute_capability) if d.compute_capability else None,
             "driver": list(d.driver) if d.driver else None, "runtime": list(d.runtime) if d.runtime else None,
             "pinned": (env_extra or {}).get("CUDA_VISIBLE_DEVICES")}
    if d.kind == "gpu":
        ident["nvidia_driver"] = environment._nvidia_smi().get("nvidia_driver")
    return ident


def _inputs(plan: StagePlan, refs: References) -> dict:
    """The data the reference job is judged on (each accuracy workload, the timing workload: images, labels,
    weights), hashed."""
    runs = [(net, n, target) for _, net, n, target in plan.accuracy_runs()]
    if plan.timing_run():
        runs.append(plan.timing_run())
    out = {}
    for net, n, target in dict.fromkeys(runs):
        wl = refs.get(net, n, target)[0]
        out[f"{net}/{n}/{target}"] = _sha(wl.x, wl.labels, *(wl.weights[k] for k in sorted(wl.weights)))
    return out


def ingredients(plan: StagePlan, refs: References, env_extra: dict | None, sandbox_mode: str) -> dict:
    """Everything the key is the hash of (kept in the entry, for a person to read)."""
    return {
        "schema": SCHEMA, "stage": plan.stage.number,
        "solution": {"name": plan.solution.name, "sha256": _file_sha(plan.solution)}, "given": given_code(plan),
        "rubric": {k: v for k, v in sorted(plan.rubric.items()) if k not in SCORING_ONLY},
        "plan": {"variants": {n: v.to_json() for n, v in plan.variants.items()}, "timed": plan.timed,
                 "measured": plan.measured, "time_limit": plan.time_limit},
        "inputs": _inputs(plan, refs),
        "device": device_identity(env_extra), "sandbox": sandbox_mode,
        "versions": versions(), "kit_sha256": kit_hash(), "tuning_sha256": _file_sha(tune.STORE),
    }


def key_of(ingr: dict) -> str:
    return hashlib.sha256(json.dumps(ingr, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- an entry


class Invalid(ValueError):
    """An entry that cannot be trusted: the message says why, in a few words."""


def _number(v, what: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and
                                                                                                  v == 0):
        raise Invalid(f"{what} is {v!r:.40}, not a {'positive' if positive else 'non-negative'} number")
    return float(v)


def _timing(d, plan: StagePlan) -> ReferenceTiming:
    """The entry's ``timing`` as a ``ReferenceTiming``, every field checked."""
    if not isinstance(d, dict):
        raise Invalid("no timing object")
    runs = d.get("runs")
    if runs is not None:
        if not isinstance(runs, list) or not all(isinstance(r, dict) and "pass" in r for r in runs):
            raise Invalid("timing.runs is not a list of passes, each with its 'pass' time")
        runs = [{str(k): _number(v, f"a pass's {k!r}") for k, v in r.items()} for r in runs]
    if plan.measured and (not runs or len(runs) != plan.rubric["timing"]["repeat"]):
        raise Invalid(f"{len(runs or [])} timed passes where the rubric times {plan.rubric['timing']['repeat']}")
    mism = d.get("mismatches")
    if mism is not None and (not isinstance(mism, list) or not all(isinstance(m, int) and not isinstance(m, bool)
                                                                   and m >= 0 for m in mism)):
        raise Invalid("timing.mismatches is not a list of counts")
    if not isinstance(d.get("method", ""), str) or not isinstance(d.get("device", ""), str):
        raise Invalid("timing.method or timing.device is not text")
    phases = d.get("phases_s") or {}
    if not isinstance(phases, dict):
        raise Invalid("timing.phases_s is not an object")
    attempts = d.get("attempts") or []
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        raise Invalid("timing.attempts is not a list of attempts")
    return ReferenceTiming(runs=runs, method=d.get("method", ""), mismatches=mism, device=d.get("device", ""),
                           seconds=_number(d.get("seconds"), "timing.seconds", positive=True),
                           phases_s={str(k): _number(v, f"phase {k!r}") for k, v in phases.items()},
                           attempts=[{str(k): None if v is None else _number(v, f"attempt's {k!r}")
                                      for k, v in a.items()} for a in attempts])


def read_entry(path: Path, key: str, plan: StagePlan) -> tuple[ReferenceTiming, str]:
    """(the timing, when it was measured) of the entry at ``path``; ``Invalid`` when it cannot be trusted."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"unreadable ({type(exc).__name__})") from None
    if not isinstance(d, dict):
        raise Invalid("not a JSON object")
    if d.get("schema") != SCHEMA:
        raise Invalid(f"schema {d.get('schema')!r:.20}, this grader reads {SCHEMA}")
    if d.get("key") != key or d.get("stage") != plan.stage.number:
        raise Invalid("its key or stage is not the one its name says")
    if not isinstance(d.get("ingredients"), dict) or key_of(d["ingredients"]) != key:
        raise Invalid("its ingredients do not hash to its key")
    measured = d.get("measured")
    try:
        dt.datetime.fromisoformat(measured)
    except (TypeError, ValueError):
        raise Invalid(f"its date {measured!r:.40} is not a date") from None
    return _timing(d.get("timing"), plan), measured


class ReferenceCache:
    """The cache folder of one run: ``reference(plan, refs, env_extra, measure)`` gives the stored result for the
    key, or runs ``measure()`` and stores what it gives (a reference that failed is never stored). ``report()``:
    what the report's meta says of it."""

    def __init__(self, folder: str | Path, sandbox_mode: str = "none", warn: Callable[[str], None] | None = None):
        self.folder = Path(folder).expanduser()
        self.sandbox_mode = sandbox_mode
        self.warn = warn or (lambda line: print(line, file=sys.stderr))
        self.stages: dict[str, dict] = {}  # "04" (or "04 gpu1") -> from_cache, key, measured, file
        self.ignored: list[str] = []
        self.unwritten: list[str] = []
        self._lock = threading.Lock()

    def path(self, stage: str, key: str) -> Path:
        return self.folder / f"reference-{stage}-{key}.json"

    def reference(self, plan: StagePlan, refs: References, env_extra: dict | None,
                  measure: Callable[[], ReferenceTiming]) -> ReferenceTiming:
        ingr = ingredients(plan, refs, env_extra, self.sandbox_mode)
        key = key_of(ingr)
        label = plan.stage.number + (f" gpu{env_extra['CUDA_VISIBLE_DEVICES']}"
                                     if (env_extra or {}).get("CUDA_VISIBLE_DEVICES") is not None else "")
        path = self.path(plan.stage.number, key)
        if path.exists():
            try:
                timing, measured = read_entry(path, key, plan)
                self._note(label, True, key, measured, path)
                return timing
            except Invalid as exc:
                line = (f"labkit grade: ignoring the reference cache entry {path} ({exc}); measuring stage "
                        f"{plan.stage.number}'s reference job again")
                with self._lock:
                    self.ignored.append(line)
                self.warn(line)
        timing = measure()
        measured = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self._note(label, False, key, measured, path)
        if not timing.error:
            self._store(path, key, plan, ingr, timing, measured)
        return timing

    def _note(self, label: str, hit: bool, key: str, measured: str, path: Path) -> None:
        with self._lock:
            self.stages[label] = {"from_cache": hit, "key": key, "measured": measured, "file": str(path)}

    def _store(self, path: Path, key: str, plan: StagePlan, ingr: dict, timing: ReferenceTiming,
               measured: str) -> None:
        entry = {"schema": SCHEMA, "key": key, "stage": plan.stage.number, "measured": measured,
                 "ingredients": ingr,
                 "timing": {"runs": timing.runs, "method": timing.method, "mismatches": timing.mismatches,
                            "device": timing.device, "seconds": timing.seconds, "phases_s": timing.phases_s,
                            "attempts": timing.attempts}}
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=".entry-", dir=self.folder)
            with os.fdopen(fd, "w") as fh:
                json.dump(entry, fh, indent=1, default=float)
            os.replace(tmp, path)  # whole or not at all: a run beside this one reads the old entry or the new
        except OSError as exc:
            line = f"labkit grade: could not store stage {plan.stage.number}'s reference job in {self.folder} " \
                   f"({exc.strerror or exc}); the next run measures it again"
            with self._lock:
                self.unwritten.append(line)
            self.warn(line)

    def report(self) -> dict:
        return {"used": True, "folder": str(self.folder), "stages": dict(sorted(self.stages.items())),
                "ignored": list(self.ignored), "not_stored": list(self.unwritten),
                "rule": "a stage's reference job is read from the cache when its key (the solution's bytes, the "
                        "stage's rubric, its inputs, the device, the sandbox, the versions and the kit's sources) "
                        "equals a stored one's; else it runs alone and is stored"}


def not_used(why: str) -> dict:
    """The report's ``meta.reference_cache`` when no cache was used."""
    return {"used": False, "why": why}


def choose(cache: str | Path | bool | None, unsandboxed: bool, keep_out: dict[str, Path]) -> \
        tuple[ReferenceCache | None, str]:
    """The run's cache (or None, and why not), before any job: ``cache`` True is the default folder, a path the
    folder named (``--cache``: one that cannot be written is refused, ``GradeError``), False or None none
    (``--no-cache``). The default folder is not used under ``--unsandboxed`` (a submission's code could write it),
    inside ``keep_out`` (the submissions, ``--out``) or where it cannot be written (one warning line)."""
    if cache is None or cache is False:
        return None, "--no-cache"
    if cache is not True:
        try:
            return ReferenceCache(writable_folder(cache, "--cache")), ""
        except OutputError as exc:
            raise GradeError(str(exc)) from None
    if unsandboxed:
        return None, ("--unsandboxed: a submission's code could write the grader's default cache (name one with "
                      "--cache to use it anyway)")
    folder = default_folder()
    where = next((what for what, p in keep_out.items() if folder.resolve().is_relative_to(Path(p).resolve())), None)
    why = f"the default cache folder {folder} is inside {where}" if where else ""
    if not why:
        try:
            writable_folder(folder, "the reference cache")
        except OutputError as exc:
            why = str(exc)
    if why:
        print(f"labkit grade: not using the reference cache ({why}); every reference job runs", file=sys.stderr)
        return None, why
    return ReferenceCache(folder), ""
