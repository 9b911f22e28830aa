"""Around each call into the student's code in the grader's child: the student's ``VARIANTS`` read, the call itself
(a conv traced while it runs, a task's call), and how the child words what it did for the parent, which decides: a
raise in one line (``describe_exception``; a thread the simulator could not start is the grader's,
``OutOfResources``), a changed snapshot (``TamperedError``), the traced calls summed up, the NaN counts, the technique's
share of loads against the stage's budget.

Imported by ``labkit.grading.worker`` before any student code exists, so it is in the snapshot of labkit's modules.
"""

from __future__ import annotations

import traceback

import numpy as np

from ..core import counts, engine, whole
from ..core.workloads import Workload
from ..course import nbcells, stages
from ..course.stages import Variant
from ..launch import simulator, streams
from . import ownership
from . import protocol as P


class TamperedError(Exception):
    """The snapshot differs after a call into the student's code."""

    def __init__(self, changes: list[str], when: str):
        super().__init__(", ".join(changes))
        self.changes, self.when = changes, when


class OutOfResources(Exception):
    """The simulator's own machinery could not start a thread: the grader's resource ran out, not the student's
    code; the parent retries the job, and says it was the grader's if that fails too."""


#: where the simulator starts its threads (a block's threads are started there, not by the student's code)
_MACHINERY = ("numba/cuda/simulator/", "labkit/launch/simulator.py")


def _machinery_ran_out(exc: BaseException) -> bool:
    if not (isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)):
        return False
    callers = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith("threading.py")]
    return bool(callers) and any(m in callers[-1].filename.replace("\\", "/") for m in _MACHINERY)


def describe_exception(exc: BaseException, what: str) -> str:
    """One line: what raised, the exception, and the line of the student's cell it came from. A thread the
    simulator could not start is not the student's: ``OutOfResources`` instead."""
    if _machinery_ran_out(exc):
        raise OutOfResources(f"the CUDA simulator could not start a thread while running {what} ({exc}): the "
                              f"grading machine ran out of threads or address space") from exc
    if isinstance(exc, SyntaxError) and exc.filename and " cell " in str(exc.filename):
        text = (exc.text or "").strip()
        return (f"SyntaxError in {exc.filename.strip('<>')}, line {exc.lineno}: {exc.msg}"
                + (f" ({text[:80]})" if text else ""))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<") and " cell " in
              f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" ({f.filename.strip('<>')}, line {f.lineno}" + (f": {f.line.strip()[:80]})" if f.line else ")")
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    if isinstance(exc, NotImplementedError):
        return f"not implemented: {what} raised NotImplementedError{where}"
    if isinstance(exc, SystemExit):
        return f"{what} called exit({exc.code!r}){where}"
    if isinstance(exc, MemoryError):
        return f"{what} ran out of memory (MemoryError; the grader's memory limit applies){where}"
    return f"{what} raised {type(exc).__name__}: {text}{where}"


def variants_of(ns: dict, where: str) -> dict:
    variants = ns.get("VARIANTS")
    if not isinstance(variants, dict) or not variants:
        raise nbcells.NotebookError(f"{where}: the kernel cells define no VARIANTS dict (name -> labkit.Variant); "
                                    f"the last kernel cell of each stage defines it")
    return variants


def variant_fields(v) -> dict:
    impls = getattr(v, "impls", None)
    if not isinstance(impls, dict):
        raise TypeError(f"is a {type(v).__name__}, not a labkit.Variant (no impls dict)")
    bad = [k for k, fn in impls.items() if not callable(fn)]
    if bad:
        raise TypeError(f"has functions that are not callable: {', '.join(map(str, bad))}")
    return {"impls": dict(impls), "target": getattr(v, "target", None), "arrays": getattr(v, "arrays", None),
            "per_image": getattr(v, "per_image", None)}


def pass_arrays(probabilities: list) -> dict:
    """Each timed pass's class probabilities: their argmax are its predictions, and a result kept from another
    pass shows in them even where the predictions happen to agree (synthetic images all of one class)."""
    return {f"prob{k}": p for k, p in enumerate(probabilities)}


def traced_call(tracer: ownership.Tracer, fn, layer_name: str, records: list):
    def call(*args):
        rec = tracer.call(fn, args)
        rec["layer"] = layer_name
        records.append(rec)

    call.__name__ = getattr(fn, "__name__", "conv")
    return call


def technique_budget(conv, tech: P.TechniqueSpec, arrays: str) -> P.Technique:
    """The share of the conv's loads served from the stage's memory (``labkit.counts`` on the simulator), against
    the stage's budget (``technique.min_fraction``): a token load from that memory earns nothing."""
    name = f"{tech.layer} uses {tech.memory} memory"
    try:
        c = counts.count_layer(conv, tech.net, tech.layer, arrays)
    except BaseException as exc:  # noqa: BLE001 - a raise is the value checks' business: one line here
        return P.Technique(passed=False, line=f"{name}: FAIL ({describe_exception(exc, tech.layer)})")
    mem, glob = c.per_output(f"{tech.memory} load"), c.per_output("global load")
    fraction = mem / (mem + glob) if mem + glob > 0 else 0.0
    passed = mem > 0 and fraction >= tech.min_fraction
    line = (f"{name}: {'PASS' if passed else 'FAIL'} ({100 * fraction:.0f} % of its loads from {tech.memory} memory: "
            f"{mem:.1f} {tech.memory} and {glob:.1f} global loads per output element, counted on the simulator; "
            f"the stage asks for at least {100 * tech.min_fraction:.0f} %)")
    return P.Technique(passed=passed, line=line, fraction=fraction)


def nan_counts(result: P.CaseResult, nan: engine.NanCauses | None) -> None:
    """The engine's diagnosis of NaN in a layer's output, sent as raw counts: the parent words it
    (``labkit.check.compare``, through ``job.nan_causes``), as the self-check does."""
    if nan is not None:
        result.nan_unwritten, result.nan_added, result.nan_read = nan.unwritten, nan.added, nan.read


def trace_summary(records: list[dict]) -> P.Trace | None:
    """What the traced conv calls of one check did: library routines, launches, calls that launched none of the
    student's (or given) kernels."""
    if not records:
        return None
    launches: dict[str, int] = {}
    for rec in records:
        for kind, n in rec["launches"].items():
            launches[kind] = launches.get(kind, 0) + n
    library = list(dict.fromkeys((rec["layer"], name) for rec in records for name in rec["library"]))
    without = [rec["layer"] for rec in records if not rec["launches"].get("own") and not rec["launches"].get("given")]
    given = [rec["layer"] for rec in records if rec["launches"].get("given") and not rec["launches"].get("own")]
    return P.Trace(calls=len(records), library=[list(pair) for pair in library[:4]],
                   without_own_launch=list(dict.fromkeys(without)), launches=launches,
                   given_only=list(dict.fromkeys(given)))


def _given(name: str) -> Variant:
    """A given variant by its label, "09 tuned_cifar10": the kit's solution of an earlier stage."""
    stage, variant = name.split()
    return stages.from_stage(stage).VARIANTS[variant]


def task_call(spec: P.TaskCallSpec, fn, ctx, made: dict):
    """One call of a task with a check of its own; its raw result for the grader to compare (``labkit.tasks``).
    graph: ``fn(variant, wl, lane)`` makes a call (a fresh one, or the task's last one replayed again), whose
    probabilities on the host come back; pipeline: ``fn`` classifies the bytes over lanes (``labkit.whole``), and
    the classes come back as it left them when it returned."""
    net, w, variant = ctx.nets[spec.net], ctx.weights(spec.weights), _given(spec.variant)
    if spec.check == "graph":
        if spec.fresh_call or spec.task not in made:
            x = ctx.arrays[spec.x]
            wl = Workload(net, w, x, None, simulator.active(), True, f"the grader's {len(x)} images")
            made[spec.task] = fn(variant, wl, streams.lanes(1)[0])
        return np.array(made[spec.task](), copy=True)  # the replay refills the same host array
    if spec.check == "pipeline":
        case, rng = (spec.images, spec.chunk, spec.streams), np.random.default_rng(spec.seed)
        return np.array(whole.run_pipeline(fn, whole.Job(net, variant, w), case, rng)[1], copy=True)
    raise ValueError(f"no such task check: {spec.check!r}")
