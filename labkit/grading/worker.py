"""The grader's child: runs ONE student's stage notebook through the engine, and decides nothing.

Started as ``python -m labkit.grading.worker`` in a fresh folder, importing its private copy of labkit, it reads
the job (``protocol.JobSpec``, JSON) on stdin and the inputs from the ``.npz`` the grader wrote. Before any student
code exists it binds its clock's functions (``time.perf_counter``, the CUDA event functions: ``timed``) and its result pipe
(``os.write``), and takes a snapshot of labkit's modules and classes (and numpy's, and its own). Then the job's
phases run in order, each a method of ``StudentPhases`` (``student_phases``; what each call into the student's
code needs: ``student_calls``) over the one context it holds:

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

``python -m labkit.grading.worker --describe NOTEBOOK [NOTEBOOK ...] --json OUT`` (trusted solution notebooks
only) writes what each notebook's VARIANTS declare (``protocol.VariantSpec`` each), or why it did not load. A probe (``{"probe": true, "fd": N}`` on stdin, in
the run's sandbox before any job: ``labkit.grading.child_start.probe``) sends its ``Hello`` (device, the versions it
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

from ..core import counts, engine, whole  # noqa: E402,F401
from ..course import nbcells, stages  # noqa: E402,F401
from ..launch import device, freed, gpu, simcheck, simulator, streams  # noqa: E402,F401
from ..ladder import tune  # noqa: E402,F401
# (counts and tune imported now, before the snapshot: a class of a module first imported by a student's cell would
# be outside it, and its patch unseen)

from ..core.check import origin  # noqa: E402
from ..course.stages import STAGES, Variant  # noqa: E402
from ..model.layers import impl_for, kernel_layers  # noqa: E402
from ..model.nets import Layer, Net, get_net  # noqa: E402
from . import environment, ownership, timed  # noqa: E402
from . import protocol as P  # noqa: E402
from .snapshot import Snapshot  # noqa: E402
from .student_calls import OutOfResources, TamperedError, traced_call, variant_fields, variants_of  # noqa: E402
from .student_phases import StudentPhases  # noqa: E402
# (the child's parts, imported now: their functions and classes are in the snapshot too)

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
            raise TamperedError(changes, when)

    def clock_factory(self, name: str, what: str = ""):
        """A clock per timed pass (the last pass compared, labkit put back first), and the clock's method."""
        events = self.info.kind == "gpu" and self.job.variants[name].target == "gpu"

        def make_clock() -> timed.ChildClock:
            if self.student_code:
                self.compare(what)
            self.restore()
            return timed.ChildClock(events, self.syncs)

        return make_clock, "cuda-events" if events else "perf_counter"

    def timed_passes(self, variant: Variant, tracer: ownership.Tracer | None, images) -> tuple[list, list]:
        """``warmup`` untimed passes on one image, then ``repeat`` timed passes, pass k on ``images(k)``, which the
        parent hands over only then (fresh images each: no memo of an earlier pass, or attempt, or of the accuracy
        run, can anticipate them, and no call before the pass can reach them), under the same
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
        for k in range(t.repeat):
            fresh = engine.prepare(net, variant, images(k), w)
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
                    impls[layer.name] = traced_call(tracer, fn, layer.name, records)
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
        except TamperedError as t:
            self.restore()
            self.send(P.Tampered(what=t.changes[:20], count=len(t.changes), when=t.when))
        except OutOfResources as exc:
            self.restore()
            self.send(P.GraderError(str(exc), traceback.format_exc(limit=6), resource=True))


def describe(notebooks: list[str], out: str) -> None:
    """What each (trusted) solution notebook's VARIANTS declare, as JSON for the grader (a ``VariantSpec`` each),
    or the end of its traceback where it did not load: one child for a run's stages, the kit imported once."""
    found = {}
    for notebook in notebooks:
        try:
            found[notebook] = _declared(notebook)
        except Exception:  # noqa: BLE001 - said for that notebook; the others are still described
            found[notebook] = {"error": "\n".join(traceback.format_exc().strip().splitlines()[-6:])}
    with open(out, "w") as fh:
        json.dump(found, fh)


def _declared(notebook: str) -> dict:
    variants = variants_of(nbcells.load(notebook), notebook)
    desc = {}
    for name, v in variants.items():
        f = variant_fields(v)
        nets = tuple(getattr(v, "nets", ("cifar10",)))
        layers = {n: [ly.name for ly in kernel_layers(get_net(n)) if impl_for(f["impls"], ly)] for n in nets}
        stage = STAGES_BY_NOTEBOOK.get(os.path.basename(notebook))
        own = {n: [ly for ly in names if origin(impl_for(f["impls"], get_net(n).layer(ly)), stage) is None]
               for n, names in layers.items()}
        desc[name] = P.VariantSpec(name=name, target=f["target"], arrays=f["arrays"], per_image=bool(f["per_image"]),
                                   nets=nets, layers=layers, own=own, note=getattr(v, "note", ""),
                                   fuse=tuple(getattr(v, "fuse", ())), requires=tuple(getattr(v, "requires", ())),
                                   unavailable=v.unavailable() if hasattr(v, "unavailable") else "").to_json()
    return {"variants": desc, "order": list(variants)}


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
        at = argv.index("--json") if "--json" in argv else len(argv)
        describe(argv[1:at], argv[at + 1] if at + 1 < len(argv) else "describe.json")
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
        if raw.get("probe"):  # child_start.probe: the sandbox starts a child, and what it imports; no job
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
