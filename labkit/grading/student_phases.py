"""The student's part of a job in the grader's child, one method per phase (``StudentPhases``): load, checks, tasks,
accuracy, timing, technique, each over the child's one context (``worker.GradingChild``) and returning whether the
next one runs.

Imported by ``labkit.grading.worker`` before any student code exists, so it is in the snapshot of labkit's modules.
"""

from __future__ import annotations

import traceback
from contextlib import nullcontext

import numpy as np

from ..core import engine
from ..core.check import check_technique, weighted
from ..course import nbcells
from ..course.stages import Variant
from ..launch import freed, gpu, simcheck, simulator
from ..model.layers import impl_for
from ..model.nets import Layer, get_net
from . import ownership, timed
from . import protocol as P
from .student_calls import (
    TamperedError,
    describe_exception,
    nan_counts,
    pass_arrays,
    task_call,
    technique_budget,
    trace_summary,
    variant_fields,
    variants_of,
)


class StudentPhases:
    """The student's part of a job, one method per phase; each returns whether the next one runs."""

    def __init__(self, job):  # the child's context: worker.GradingChild
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
            found = variants_of(self.ns, "your notebook")
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
                declared[name] = variant_fields(found[name])
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
        except TamperedError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the student's raise is a FAIL with its line, not a crash
            result.error = describe_exception(exc, case.what)
        ctx.compare(f"during {when}")
        result.launches = counts.launches
        result.trace = trace_summary(ctx.records)
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

    # --- technique: how much of a variant's conv work (the timed one's, unless the rubric names another) uses the
    # stage's memory (values passed above)
    def technique(self) -> bool:
        ctx, tech = self.ctx, self.ctx.job.technique
        name = (tech.variant or self.ctx.job.timed) if tech else None
        if tech and name in self.student:
            ctx.restore()
            v = self.student[name]
            conv = impl_for(v.impls, get_net(tech.net).layer(tech.layer))
            ctx.send(P.Start(f"the technique check ({tech.memory} memory) of variant {name!r}"))
            if simulator.active():
                result = technique_budget(conv, tech, v.arrays)
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
            except TamperedError:
                raise
            except BaseException as exc:  # noqa: BLE001
                result.error = describe_exception(exc, f"the {net.name} forward pass")
            ctx.compare(f"during {when}")
            result.trace = trace_summary(ctx.records)
            ctx.send(result, {"probs": np.ascontiguousarray(probs)} if probs is not None else None)
        ctx.send(P.AccuracyDone())
        answer = ctx.answer()  # continue: time it; skip: no timing, the technique still; stop: nothing more
        self.timing_allowed = answer is P.Answer.CONTINUE and ctx.job.timing is not None
        return answer is not P.Answer.STOP

    # --- op time: the student's timed variant, the same way as the reference's, traced as in the checks
    def timing(self) -> bool:
        """One attempt a turn; the parent answers each with another attempt (its core was slow) or with enough."""
        ctx, t = self.ctx, self.ctx.job.timing
        if not self.timing_allowed:
            return True
        for attempt in range(t.attempts):
            ctx.restore()
            answer = self._attempt(attempt)
            if answer is not P.Answer.CONTINUE or attempt + 1 == t.attempts:
                return answer is not P.Answer.STOP
        return True

    def _images(self, attempt: int):
        """Pass k's images, asked of the parent when the pass is about to run (nothing before can reach them)."""
        ctx, t = self.ctx, self.ctx.job.timing

        def images(k: int):
            ctx.send(P.PassImages(attempt=attempt, k=k))
            if ctx.answer() is not P.Answer.CONTINUE:
                raise RuntimeError(f"the grader handed no images for timed pass {k}")
            return np.load(t.pass_inputs.format(attempt=attempt, k=k), allow_pickle=False)

        return images

    def _attempt(self, attempt: int) -> P.Answer:
        ctx, t = self.ctx, self.ctx.job.timing
        when = f"timing variant {t.variant!r} on {ctx.workloads[t.workload][1].shape[0]} images" + (
            f" (attempt {attempt + 1})" if attempt else "")
        gpu = ctx.info.kind == "gpu"
        timed.settle(gpu)  # the earlier phases' garbage and frees, not the turn's
        ctx.send(P.Turn(when))  # wait until every other job is stopped (labkit.grading.turns)
        if ctx.answer() is not P.Answer.CONTINUE:
            return P.Answer.STOP
        quiet, probe = timed.wait_quiet(gpu)
        ctx.send(P.Start(when))
        ctx.records.clear()
        try:
            with timed.uncollected():
                runs, preds = ctx.timed_passes(self.checked[t.variant], self.tracer, self._images(attempt))
        except TamperedError:
            raise
        except BaseException as exc:  # noqa: BLE001
            ctx.compare(f"during {when}")
            ctx.send(P.Timing(error=describe_exception(exc, "the timed run"), attempt=attempt))
            return ctx.answer()
        ctx.compare(f"during {when}")
        probe["after"] = timed.quiet_samples(gpu)
        ctx.send(P.Timing(runs=runs, method=ctx.clock_factory(t.variant)[1], trace=trace_summary(ctx.records),
                          quiet_s=quiet, probe=probe, attempt=attempt), pass_arrays(preds))
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
                except TamperedError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - the student's raise is the task's FAIL line
                    result.error = describe_exception(exc, spec.function)
                ctx.compare(f"during {when}")
            ctx.send(result, {"out": out} if out is not None and result.error is None else None)
            if ctx.answer() is not P.Answer.CONTINUE:
                failed.add(spec.task)
        return True
