"""The grader's child: runs ONE student's stage notebook through the engine, and decides nothing.

Started as ``python -m labkit.grading.worker`` in a fresh folder, importing its private copy of labkit, it reads
the job (``protocol.JobSpec``, JSON) on stdin and the inputs from the ``.npz`` the grader wrote. Before any student
code exists it binds its clock's functions (``time.perf_counter``, the CUDA event functions: ``timed``) and its result pipe
(``os.write``), and takes a snapshot of labkit's modules and classes (and numpy's, and its own). Then the job's
phases run in order, each a method of ``StudentJob`` over the one context it holds:

    load -> checks -> technique -> accuracy -> timing

``load`` executes only the student's ``kernel``-tagged cells; the other phases call the student's functions the
way every run calls them (``labkit.engine``): each layer on a NaN-poisoned output, the whole network with every
intermediate poisoned, the real images, the timed passes. Before each of those calls the snapshot is put back, so
a cell that patches labkit (the engine, the layer convention, ``labkit.check``, ``labkit.timing``), numpy, the time
module or this worker changes nothing the grader measures; each clock takes its functions when it is made. After
each of them (and after every timed pass) the snapshot is compared: a difference is reported (``tampered``) and the
job ends. On the simulator every launch of a layer check is watched for races (``labkit.simcheck``). The timed
variant's conv functions are scanned (``ownership.scan``) and traced while they run (``ownership.Tracer``): library
routines and whose kernels ran are reported, for the grader to judge.

Outputs go back RAW through the pipe (``labkit.grading.protocol``); the grader compares them with the float64
reference in its own process. Student prints go to this process's stdout/stderr, which the grader keeps apart.

``python -m labkit.grading.worker --describe NOTEBOOK --json OUT`` (trusted solution notebooks only) writes what
the notebook's VARIANTS declare (``protocol.VariantSpec`` each). A probe (``{"probe": true, "fd": N}`` on stdin, in
the run's sandbox before any job: ``labkit.grading.job.probe``) sends its ``Hello`` (device, the versions it
imports) and ends.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import traceback
import types
from contextlib import nullcontext
from dataclasses import replace

import numpy as np

# Bound at import, before any student code exists (the clock's functions: labkit.grading.timed).
_os_write = os.write
_threads = threading.enumerate

import labkit as _labkit  # noqa: E402  (labkit first: its runtime settings precede numba's)

from ..core import counts, engine, whole  # noqa: E402
from ..course import nbcells, stages  # noqa: E402,F401
from ..launch import device, freed, gpu, simcheck, simulator, streams  # noqa: E402,F401
from ..ladder import tune  # noqa: E402,F401
# (counts and tune imported now, before the snapshot: a class of a module first imported by a student's cell would
# be outside it, and its patch unseen)

from ..core.check import check_technique, origin, weighted  # noqa: E402
from ..core.workloads import Workload  # noqa: E402
from ..course.stages import STAGES, Variant  # noqa: E402
from ..model.layers import impl_for, kernel_layers  # noqa: E402
from ..model.nets import Layer, Net, get_net  # noqa: E402
from . import environment, ownership, timed  # noqa: E402
from . import protocol as P  # noqa: E402
from .snapshot import Snapshot  # noqa: E402

STAGES_BY_NOTEBOOK = {s.notebook: n for n, s in STAGES.items()}


class _Channel:
    """Frames on the pipe the grader opened for results (never stdout)."""

    def __init__(self, fd: int):
        self.fd, self._write, self._encode = fd, _os_write, P.encode
        self.send = self._send  # bound now: a later patch of the class does not reach this channel

    def _send(self, message: P.Message, arrays: dict[str, np.ndarray] | None = None) -> None:
        data = memoryview(self._encode(message, arrays))
        while data:
            data = data[self._write(self.fd, data):]


def _namespaces(hooked: list) -> list[tuple[object, bool]]:
    """labkit's modules, this worker, numpy, time, every class a labkit module defines (the tracer, the technique
    counter, the checks' results: a patched class attribute reaches every instance), and the kernel classes the
    launch hook sits on."""
    found = {id(m): m for n, m in sorted(sys.modules.items())  # once each: a moved module has its old name too
             if isinstance(m, types.ModuleType) and (n == "labkit" or n.startswith("labkit.") or n == "__main__")}
    mods = [(m, not hasattr(m, "__path__")) for m in found.values()]
    classes = {id(v): v for m, _ in mods for v in list(vars(m).values())
               if isinstance(v, type) and getattr(v, "__module__", None) in (m.__name__, "__main__")}
    return [*mods, (np, False), (time, False), *((c, True) for c in classes.values()),
            *((cls, False) for cls in dict.fromkeys(hooked))]


class _Tampered(Exception):
    """The snapshot differs after a call into the student's code."""

    def __init__(self, changes: list[str], when: str):
        super().__init__(", ".join(changes))
        self.changes, self.when = changes, when


def _guard_from_stage(stage: str, log: list[str]) -> None:
    """``lk.from_stage`` gives the kit's solutions of EARLIER stages only: the graded stage's own solution (or a
    later one) is refused, and the attempt recorded."""
    original = stages.from_stage

    @functools.wraps(original)
    def from_stage(number: str):
        n = str(number).zfill(2)
        if n in STAGES and n >= stage:
            log.append(f"loads the kit's solution of stage {n} (lk.from_stage({number!r})): only earlier stages' "
                       f"solutions are given code")
            raise nbcells.NotebookError(f"lk.from_stage({number!r}) in stage {stage}: only the solutions of earlier "
                                        f"stages are given code")
        return original(number)

    stages.from_stage = from_stage
    _labkit.from_stage = from_stage


# ------------------------------------------------------------------------------------------------ helpers


def net_from_dict(d: dict) -> Net:
    return Net(d["name"], tuple(d["input_shape"]), tuple(Layer(**ly) for ly in d["layers"]), d["dataset"],
               d["report"], tuple(d.get("workloads", ())), tuple(d.get("classes", ())), d.get("default_images", 0))


class _OutOfResources(Exception):
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
    simulator could not start is not the student's: ``_OutOfResources`` instead."""
    if _machinery_ran_out(exc):
        raise _OutOfResources(f"the CUDA simulator could not start a thread while running {what} ({exc}): the "
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


def _set_limits(job: P.JobSpec) -> None:
    import resource

    if job.memory_mb > 0 and job.memory_guard == "rlimit":
        resource.setrlimit(resource.RLIMIT_AS, (job.memory_mb << 20, job.memory_mb << 20))
    if job.max_file_mb > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (job.max_file_mb << 20, job.max_file_mb << 20))


def _use_tuning(job: P.JobSpec) -> None:
    """Read the tuning choices the grader read (``results/tuning.json`` of the kit that grades): the child imports
    a private copy of labkit outside the checkout, where ``labkit.tune`` would find none and a tuned variant would
    silently fall back to another kernel than the one the student's notebook picks."""
    if job.tuning:
        from pathlib import Path

        tune.STORE = Path(job.tuning)


def _variants_of(ns: dict, where: str) -> dict:
    variants = ns.get("VARIANTS")
    if not isinstance(variants, dict) or not variants:
        raise nbcells.NotebookError(f"{where}: the kernel cells define no VARIANTS dict (name -> labkit.Variant); "
                                    f"the last kernel cell of each stage defines it")
    return variants


def _variant_fields(v) -> dict:
    impls = getattr(v, "impls", None)
    if not isinstance(impls, dict):
        raise TypeError(f"is a {type(v).__name__}, not a labkit.Variant (no impls dict)")
    bad = [k for k, fn in impls.items() if not callable(fn)]
    if bad:
        raise TypeError(f"has functions that are not callable: {', '.join(map(str, bad))}")
    return {"impls": dict(impls), "target": getattr(v, "target", None), "arrays": getattr(v, "arrays", None),
            "per_image": getattr(v, "per_image", None)}


def _pass_arrays(probabilities: list) -> dict:
    """Each timed pass's class probabilities: their argmax are its predictions, and a result kept from another
    pass shows in them even where the predictions happen to agree (synthetic images all of one class)."""
    return {f"prob{k}": p for k, p in enumerate(probabilities)}


def _traced_call(tracer: ownership.Tracer, fn, layer_name: str, records: list):
    def call(*args):
        rec = tracer.call(fn, args)
        rec["layer"] = layer_name
        records.append(rec)

    call.__name__ = getattr(fn, "__name__", "conv")
    return call


def _technique_budget(conv, tech: P.TechniqueSpec, arrays: str) -> P.Technique:
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


def _summary(records: list[dict]) -> P.Trace | None:
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


#: each phase's words in a timeout's message ("while loading ...", "while running the checks")
PHASE_WORDS = {"load": "loading the notebook's kernel cells", "checks": "the checks", "tasks": "the tasks",
               "accuracy": "the accuracy runs", "timing": "timing", "technique": "the technique check"}

# ------------------------------------------------------------------------------------------------- the job


class GradingChild:
    """One graded job, the child's side (the parent's is ``job.GradingJob``): what every phase reads, the job, its
    inputs, the channel, the snapshot, the tracer."""

    def __init__(self, job: P.JobSpec, chan: _Channel, answers, info, snap: Snapshot, tracer_ref: list,
                 given_log: list):
        self.job, self.chan, self.answers, self.info, self.snap = job, chan, answers, info, snap
        self.tracer_ref, self.given_log = tracer_ref, given_log
        self.syncs = timed.gpu_syncs(info.kind == "gpu")
        with np.load(job.inputs, allow_pickle=False) as data:
            self.arrays = {k: data[k] for k in data.files}
        self.nets = {k: net_from_dict(d) for k, d in job.nets.items()}
        self.workloads = {k: (self.nets[w.net], self.arrays[w.x], self.weights(w.weights))
                          for k, w in job.workloads.items()}
        self.code = ownership.Code(job.stage, {n: s.notebook for n, s in STAGES.items()})
        self.lib = ownership.Library()
        self.student_code = False  # once the student's cells ran, every clock compares the snapshot first
        self.records: list[dict] = []  # the traced conv calls of the current call into the student's code

    # ---- small tools every phase uses
    def send(self, message: P.Message, arrays: dict | None = None) -> None:
        self.chan.send(message, arrays)

    def answer(self) -> P.Answer:
        return P.read_answer(self.answers)

    def weights(self, names: dict[str, str]) -> dict:
        return {n: self.arrays[a] for n, a in names.items()}

    def variant(self, name: str, impls: dict) -> Variant:
        """The graded variant ``name`` with these functions, called as the stage declares it."""
        spec = self.job.variants[name]
        return Variant(impls=dict(impls), target=spec.target, arrays=spec.arrays, per_image=spec.per_image,
                       nets=tuple(spec.nets), name=name, stage=self.job.stage, fuse=tuple(spec.fuse),
                       requires=tuple(spec.requires))

    def restore(self) -> None:
        self.snap.restore()

    def compare(self, when: str) -> None:
        """After a call into the student's code: anything the snapshot holds changed -> the job ends."""
        changes = self.snap.changes()
        if changes:
            raise _Tampered(changes, when)

    def clock_factory(self, name: str, what: str = ""):
        """A clock per timed pass (the last pass compared, labkit put back first), and the clock's method."""
        events = self.info.kind == "gpu" and self.job.variants[name].target == "gpu"

        def make_clock() -> timed.Clock:
            if self.student_code:
                self.compare(what)
            self.restore()
            return timed.Clock(events, self.syncs)

        return make_clock, "cuda-events" if events else "perf_counter"

    def timed_passes(self, variant: Variant, tracer: ownership.Tracer | None, images: list) -> tuple[list, list]:
        """``warmup`` untimed passes on one image, then one timed pass on each of ``images`` (fresh images each: no
        memo of an earlier pass, or attempt, or of the accuracy run, can anticipate them), under the same
        tracing as the checks. A pass's time (``"pass"``) runs from its first launch until the device is idle and
        every thread it started has ended; each layer's time is kept beside it. The probabilities of every pass
        come back for the grader to compare with the reference's on the same images."""
        t = self.job.timing
        net, x, w = self.workloads[t.workload]
        make_clock, _ = self.clock_factory(t.variant, f"during a pass of timing variant {t.variant!r} on "
                                                      f"{x.shape[0]} images")
        prepared = engine.prepare(net, variant, x, w)
        for _ in range(t.warmup):
            self.restore()
            engine.forward(net, variant, prepared.first(1))
        runs, predictions = [], []
        for x_pass in images:
            fresh = engine.prepare(net, variant, x_pass, w)
            clock = make_clock()
            with tracer.installed() if tracer is not None else nullcontext():
                before = set(_threads())
                with clock.whole("pass"):
                    probs = engine.forward(net, variant, fresh, clock=clock)
                    for th in [th for th in _threads() if th not in before]:
                        th.join()  # work the pass left running on the host is the pass's work
            runs.append(clock.seconds())
            predictions.append(np.asarray(probs, np.float32))
        return runs, predictions

    def traced(self, v: Variant, tracer: ownership.Tracer) -> Variant:
        """``v`` with each conv function (each function of the job's ``own_layers`` kinds) recorded by ``tracer``
        while it runs."""
        impls = dict(v.impls)
        records = self.records
        for net_name in v.nets:
            for layer in kernel_layers(get_net(net_name)):
                fn = impl_for(v.impls, layer) if layer.kind in self.job.own_layers else None
                if fn is not None:
                    impls[layer.name] = _traced_call(tracer, fn, layer.name, records)
        return replace(v, impls=impls)

    def run(self) -> None:
        job = self.job
        self.send(hello(self.info))
        self.student_code = True
        student = StudentPhases(self)
        # the phases that settle the status (what the code computes, with what, and whether it patches the grader)
        # first; the technique's count, which only adds its points, last
        # each phase with its frame, made before any student code runs (nothing it patches reaches them)
        steps = [(phase, P.Phase(PHASE_WORDS[phase.__name__], step=phase.__name__))
                 for phase in (student.load, student.checks, student.tasks, student.accuracy, student.timing,
                               student.technique)]
        try:
            for phase, frame in steps:
                self.send(frame)  # the parent's clock: its seconds begin now
                if not phase():
                    break
        except _Tampered as t:
            self.restore()
            self.send(P.Tampered(what=t.changes[:20], count=len(t.changes), when=t.when))
        except _OutOfResources as exc:
            self.restore()
            self.send(P.GraderError(str(exc), traceback.format_exc(limit=6), resource=True))


class StudentPhases:
    """The student's part of a job, one method per phase; each returns whether the next one runs."""

    def __init__(self, job: GradingChild):
        self.ctx = job
        self.ns: dict = {}
        self.student: dict[str, Variant] = {}  # graded variant -> the student's functions, as the stage declares
        self.checked: dict[str, Variant] = {}  # ... with the timed variant's conv functions traced
        self.tracer: ownership.Tracer | None = None
        self.timing_allowed = False  # the parent's answer after the accuracy runs
        self.held: dict = {}  # (variant, net, what) -> the arrays of a case that a later one lands on (labkit.freed)

    # --- the student's kernel cells, and nothing else of the notebook
    def load(self) -> bool:
        ctx, job = self.ctx, self.ctx.job
        ctx.restore()
        try:
            self.ns = ownership.load_cells(job.notebook, ctx.code.own, ctx.code.trees,
                                           define=tuple(dict.fromkeys(t.function for t in job.tasks)))
            found = _variants_of(self.ns, "your notebook")
        except BaseException as exc:  # noqa: BLE001 - every way a notebook can fail to load becomes one message
            ctx.compare("while loading the kernel cells")
            msg = str(exc) if isinstance(exc, nbcells.NotebookError) else \
                "loading the kernel cells failed: " + describe_exception(exc, "a kernel cell")
            ctx.send(P.LoadError(msg, list(ctx.given_log)))
            return False
        ctx.compare("while loading the kernel cells")
        declared, problems = self._declared(found)
        ctx.compare("while reading VARIANTS")
        ctx.restore()
        self.student = {name: ctx.variant(name, f["impls"]) for name, f in declared.items()}
        forbidden = list(ctx.given_log)
        if job.timed in self.student:  # own kernels only: the timed variant's conv functions, scanned now
            try:
                forbidden += ownership.scan(ownership.conv_roots(self.student[job.timed], tuple(job.own_layers)),
                                            ctx.code, ctx.lib)
            except Exception as exc:  # noqa: BLE001 - the scan is the grader's: a crash in it is reported
                ctx.send(P.GraderError(f"the own-kernels scan failed: {type(exc).__name__}: {exc}",
                                       traceback.format_exc(limit=6)))
                return False
        ctx.send(P.Loaded(variants={n: {k: v for k, v in f.items() if k != "impls"} | {"impls": sorted(f["impls"])}
                                    for n, f in declared.items()},
                          problems=problems, forbidden=list(dict.fromkeys(forbidden))))
        if ctx.answer() is not P.Answer.CONTINUE:
            return False
        self.tracer = ownership.Tracer(ctx.code, ctx.lib, [self.ns])
        ctx.tracer_ref[0] = self.tracer
        self.checked = {name: (ctx.traced(v, self.tracer) if name == job.timed else v)
                        for name, v in self.student.items()}
        return True

    def _declared(self, found: dict) -> tuple[dict, dict]:
        """The graded variants' fields as the student's VARIANTS has them, and what is wrong with the others."""
        names = list(self.ctx.job.variants)
        declared: dict[str, dict] = {}
        problems: dict[str, str] = {}
        for name in names:
            if name not in found:
                problems[name] = (f"VARIANTS has no {name!r} (it has {', '.join(map(repr, found)) or 'nothing'}); "
                                  f"this stage grades {', '.join(map(repr, names))}")
                continue
            try:
                declared[name] = _variant_fields(found[name])
            except TypeError as exc:
                problems[name] = f"VARIANTS[{name!r}] {exc}"
        return declared, problems

    # --- checks: raw outputs back to the grader, which compares them
    def checks(self) -> bool:
        ctx = self.ctx
        failed: set = set()  # (variant, net, what) that raised or was judged wrong: its other batch sizes skip
        broken: set = set()  # (variant, net) with a layer that failed: its whole-network check is skipped
        for case in ctx.job.cases:
            ctx.restore()
            key = (case.variant, case.net_name, case.what)
            if case.variant not in self.checked or key in failed or (case.layer is None and key[:2] in broken):
                ctx.send(P.CaseResult(case.id, skipped=True))
                continue
            if not self._check(case):
                failed.add(key)
                broken.add(key[:2])
        ctx.send(P.ChecksDone(emulated=gpu.emulated_launches()))
        return ctx.answer() is P.Answer.CONTINUE

    def _check(self, case: P.CaseSpec) -> bool:
        """One check: the call, the launches, races and the trace back to the grader; True if judged right."""
        ctx = self.ctx
        v = self.checked[case.variant]
        layer = Layer(**case.layer) if case.layer else None
        x, w = ctx.arrays[case.x], ctx.weights(case.weights)
        fn = impl_for(v.impls, layer) if layer is not None else None
        if layer is not None and fn is None:
            ctx.send(P.CaseResult(case.id, error=f"VARIANTS[{case.variant!r}] has no function for {case.what} "
                                                 f"(give impls a {layer.name!r} or {layer.kind!r} entry)"))
            ctx.answer()  # the verdict every judged case gets (here: stop)
            return False
        when = f"{case.what} (batch size {case.batch}) of variant {case.variant!r}"
        ctx.send(P.Start(when))
        watch_races = layer is not None and v.target == "gpu" and simulator.active()
        ctx.records.clear()
        result = P.CaseResult(case.id)
        got = None
        try:
            with gpu.counting() as counts, simcheck.watching() if watch_races else nullcontext() as watch:
                if layer is not None:
                    called = engine.checked_call(self._paired(case, fn, layer), layer, x, w, v.arrays)
                    got = called.out
                    nan_counts(result, called.nan)
                else:
                    net = ctx.nets[case.net]
                    got = engine.forward(net, v, self._landed(case, engine.prepare(net, v, x, w)), check=True)
        except _Tampered:
            raise
        except BaseException as exc:  # noqa: BLE001 - the student's raise is a FAIL with its line, not a crash
            result.error = describe_exception(exc, case.what)
        ctx.compare(f"during {when}")
        result.launches = counts.launches
        result.trace = _summary(ctx.records)
        if watch is not None and watch.conflicts:
            result.race = f"data race at batch size {case.batch}: {watch.conflicts[0].describe()}"
        ctx.send(result, {"out": np.ascontiguousarray(got)} if got is not None and result.error is None else None)
        # judged wrong: the rest of this layer (its other batch sizes) and its net's forward pass would only repeat it
        verdict = ctx.answer()
        return result.error is None and verdict is P.Answer.CONTINUE

    def _paired(self, case: P.CaseSpec, fn, layer: Layer):
        """A layer with weights: ``fn`` through one ``freed.Pair`` for all of its cases, which keeps the arrays of a
        case that a later one ``lands_on`` and hands that one its own where they were, freed just before."""
        if not weighted(layer):
            return fn
        key = (case.variant, case.net_name, case.what)
        if key not in self.held:
            self.held[key] = freed.Pair(fn)
        if case.lands_on is not None:
            self.held[key].land(case.lands_on)
        elif any(c.lands_on == case.id for c in self.ctx.job.cases):
            self.held[key].keep(case.id)
        return self.held[key]

    def _landed(self, case: P.CaseSpec, prepared: engine.Prepared) -> engine.Prepared:
        """A net's weights: kept, or (``lands_on``) put where the kept ones, freed just before, were."""
        held = self.held.setdefault((case.variant, case.net_name, case.what), freed.Held())
        arrays = list(prepared.weights.values())
        arrays = held.keep(arrays) if case.lands_on is None else held.swap(arrays)
        prepared.weights = dict(zip(prepared.weights, arrays))
        return prepared

    # --- technique: how much of the timed variant's conv work uses the stage's memory (values passed above)
    def technique(self) -> bool:
        ctx, tech, timed = self.ctx, self.ctx.job.technique, self.ctx.job.timed
        if tech and timed in self.student:
            ctx.restore()
            v = self.student[timed]
            conv = impl_for(v.impls, get_net(tech.net).layer(tech.layer))
            ctx.send(P.Start(f"the technique check ({tech.memory} memory) of variant {timed!r}"))
            if simulator.active():
                result = _technique_budget(conv, tech, v.arrays)
            else:  # a GPU runs no counts: a kernel it launched must have that memory in its compiled resources
                r = check_technique(conv, tech.net, tech.layer, tech.memory, arrays=v.arrays, quiet=True)
                result = P.Technique(passed=r.passed, line=str(r))
            ctx.compare("during the technique check")
            ctx.send(result)
        return True

    # --- accuracy: the whole network with the student's functions on the grader's images
    def accuracy(self) -> bool:
        ctx = self.ctx
        for a in ctx.job.accuracy:
            ctx.restore()
            v = self.checked[a.variant]
            net, x, w = ctx.workloads[a.workload]
            when = f"the {net.name} forward pass ({x.shape[0]} images) of variant {v.name!r}"
            ctx.send(P.Start(when))
            ctx.records.clear()
            result = P.AccuracyResult(a.id)
            probs = None
            try:
                probs = engine.forward(net, v, engine.prepare(net, v, x, w), check=True)
            except _Tampered:
                raise
            except BaseException as exc:  # noqa: BLE001
                result.error = describe_exception(exc, f"the {net.name} forward pass")
            ctx.compare(f"during {when}")
            result.trace = _summary(ctx.records)
            ctx.send(result, {"probs": np.ascontiguousarray(probs)} if probs is not None else None)
        ctx.send(P.AccuracyDone())
        answer = ctx.answer()  # continue: time it; skip: no timing, the technique still; stop: nothing more
        self.timing_allowed = answer is P.Answer.CONTINUE and ctx.job.timing is not None
        return answer is not P.Answer.STOP

    # --- op time: the student's timed variant, the same way as the reference's, traced as in the checks
    def timing(self) -> bool:
        """One attempt a turn; the parent answers each with another attempt (its core was slow: the images of the
        next are in ``retry_inputs``, written only now), or with enough."""
        ctx, t = self.ctx, self.ctx.job.timing
        if not self.timing_allowed:
            return True
        images = [ctx.arrays[key] for key in t.passes]
        for attempt in range(t.attempts):
            ctx.restore()
            answer = self._attempt(attempt, images)
            if answer is not P.Answer.CONTINUE or attempt + 1 == t.attempts:
                return answer is not P.Answer.STOP
            with np.load(t.retry_inputs.format(attempt=attempt + 1), allow_pickle=False) as data:
                images = [data[f"pass{k}.x"] for k in range(len(data.files))]
        return True

    def _attempt(self, attempt: int, images: list) -> P.Answer:
        ctx, t = self.ctx, self.ctx.job.timing
        when = f"timing variant {t.variant!r} on {images[0].shape[0]} images" + (f" (attempt {attempt + 1})"
                                                                                  if attempt else "")
        ctx.send(P.Turn(when))  # wait until every other job is stopped (labkit.grading.turns)
        if ctx.answer() is not P.Answer.CONTINUE:
            return P.Answer.STOP
        gpu = ctx.info.kind == "gpu"
        quiet, probe = timed.wait_quiet(gpu)
        ctx.send(P.Start(when))
        ctx.records.clear()
        try:
            runs, preds = ctx.timed_passes(self.checked[t.variant], self.tracer, images)
        except _Tampered:
            raise
        except BaseException as exc:  # noqa: BLE001
            ctx.compare(f"during {when}")
            ctx.send(P.Timing(error=describe_exception(exc, "the timed run"), attempt=attempt))
            return ctx.answer()
        ctx.compare(f"during {when}")
        probe["after"] = timed.quiet_samples(gpu)
        ctx.send(P.Timing(runs=runs, method=ctx.clock_factory(t.variant)[1], trace=_summary(ctx.records),
                          quiet_s=quiet, probe=probe, attempt=attempt), _pass_arrays(preds))
        return ctx.answer()

    # --- the stage's tasks with checks of their own (labkit.tasks: stage 10's graph replay and pipeline)
    def tasks(self) -> bool:
        ctx = self.ctx
        made: dict = {}  # task -> the call its function last made (a graph's replay)
        failed: set = set()
        for spec in ctx.job.tasks:
            ctx.restore()
            fn = self.ns.get(spec.function)
            if spec.task in failed:
                ctx.send(P.TaskResult(spec.id, skipped=True))
                continue
            result, out = P.TaskResult(spec.id), None
            if not callable(fn):
                result.error = (f"your notebook defines no {spec.function}(): the task's function keeps its name "
                                f"(the cell that defines it, in the notebook you hand in)")
            else:
                when = f"{spec.function} (task {spec.task!r}, call {spec.id})"
                ctx.send(P.Start(when))
                try:
                    out = task_call(spec, fn, ctx, made)
                except _Tampered:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the student's raise is the task's FAIL line
                    result.error = describe_exception(exc, spec.function)
                ctx.compare(f"during {when}")
            ctx.send(result, {"out": out} if out is not None and result.error is None else None)
            if ctx.answer() is not P.Answer.CONTINUE:
                failed.add(spec.task)
        return True


def describe(notebook: str, out: str) -> None:
    """What a (trusted) solution notebook's VARIANTS declare, as JSON for the grader (a ``VariantSpec`` each)."""
    variants = _variants_of(nbcells.load(notebook), notebook)
    desc = {}
    for name, v in variants.items():
        f = _variant_fields(v)
        nets = tuple(getattr(v, "nets", ("cifar10",)))
        layers = {n: [ly.name for ly in kernel_layers(get_net(n)) if impl_for(f["impls"], ly)] for n in nets}
        stage = STAGES_BY_NOTEBOOK.get(os.path.basename(notebook))
        own = {n: [ly for ly in names if origin(impl_for(f["impls"], get_net(n).layer(ly)), stage) is None]
               for n, names in layers.items()}
        desc[name] = P.VariantSpec(name=name, target=f["target"], arrays=f["arrays"], per_image=bool(f["per_image"]),
                                   nets=nets, layers=layers, own=own, note=getattr(v, "note", ""),
                                   fuse=tuple(getattr(v, "fuse", ())), requires=tuple(getattr(v, "requires", ())),
                                   unavailable=v.unavailable() if hasattr(v, "unavailable") else "").to_json()
    with open(out, "w") as fh:
        json.dump({"variants": desc, "order": list(variants)}, fh)


def hello(info) -> P.Hello:
    """The first frame: this child's device, where it imported labkit from and the versions it imports."""
    versions, origins = environment.imported()
    return P.Hello(device=device.label(info), kind=info.kind, simulated=info.simulated, pid=os.getpid(),
                   labkit=os.path.dirname(os.path.abspath(_labkit.__file__)), versions=versions, origins=origins)


def _last_launch_note():
    """A function that writes a launched kernel's name over the last (one system call a launch, on a GPU only)."""
    try:
        fd = os.open(P.LAST_LAUNCH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return None
    pwrite = os.pwrite

    def note(name: str) -> None:
        pwrite(fd, (str(name)[:120] + "\n").ljust(128).encode(), 0)

    return note


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--describe"]:
        describe(argv[1], argv[3] if len(argv) > 3 and argv[2] == "--json" else "describe.json")
        return 0
    raw = json.loads(sys.stdin.readline())
    # the grader's answers come on stdin: keep it for them, and give the student's code an empty stdin instead
    answers = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - for the process's lifetime
    chan = _Channel(int(raw["fd"]))
    try:
        if raw.get("probe"):  # labkit.grading.job.probe: the sandbox starts a child, and what it imports; no job
            chan.send(hello(device.info()))
            chan.send(P.Done())
            os._exit(0)
        job = P.JobSpec.from_json(raw)
        _set_limits(job)
        _use_tuning(job)
        info = device.info()  # detected once, before the snapshot, so putting labkit back keeps it
        tracer_ref: list = [None]
        hooked = [cls for cls, _, _ in ownership.install_launch_hook(tracer_ref, _last_launch_note())]
        given_log: list[str] = []
        _guard_from_stage(job.stage, given_log)
        GradingChild(job, chan, answers, info, Snapshot(_namespaces(hooked)), tracer_ref, given_log).run()
        chan.send(P.Done())
    except BaseException as exc:  # noqa: BLE001 - the grader must hear about its worker's own failures
        try:
            chan.send(P.GraderError(f"grade worker failed: {type(exc).__name__}: {exc}",
                                    traceback.format_exc(limit=8)))
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit hooks: a student's cannot write after the last frame


if __name__ == "__main__":
    sys.exit(main())
