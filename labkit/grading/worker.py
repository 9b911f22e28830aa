"""The grader's child: runs ONE student's stage notebook through the engine, and decides nothing.

Started as ``python -m labkit.grading.worker`` in a fresh folder, importing its private copy of labkit, it reads
the job (JSON) on stdin and the inputs from the ``.npz`` the grader wrote. Before any student code exists it binds
its clock's functions (``time.perf_counter``, the CUDA event functions) and its result pipe (``os.write``), takes a
snapshot of labkit's modules (and numpy's, and its own), and, when op time is measured, times the reference
solution. Then it executes only the student's ``kernel``-tagged cells and calls the student's functions the way
every run calls them (``labkit.engine``): each layer on a NaN-poisoned output, the whole network with every
intermediate poisoned, the real images, the timed passes. Before each of those calls the snapshot is put back, so a
cell that patches labkit (the engine, the layer convention, ``labkit.check``, ``labkit.timing``), numpy, the time
module or this worker changes nothing the grader measures; each clock takes its functions when it is made. After
each of them (and after every timed pass) the snapshot is compared: a difference is reported (``tampered``) and the
job ends. On the simulator every launch of a layer check is watched for races (``labkit.simcheck``). The timed
variant's conv functions are scanned (``ownership.scan``) and traced while they run (``ownership.Tracer``): library
routines and whose kernels ran are reported, for the grader to judge.

Outputs go back RAW through the pipe (``labkit.grading.protocol``); the grader compares them with the float64
reference in its own process. Student prints go to this process's stdout/stderr, which the grader keeps apart.

``python -m labkit.grading.worker --describe NOTEBOOK --json OUT`` (trusted solution notebooks only) writes what
the notebook's VARIANTS declare: target, arrays, per_image, nets and the layers each variant implements.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
import types
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

# Bound at import, before any student code exists.
_perf_counter = time.perf_counter
_os_write = os.write
_contextmanager = contextmanager

import labkit as _labkit  # noqa: E402  (labkit first: its runtime settings precede numba's)

from .. import device, engine, gpu, nbcells, simcheck, simulator, stages  # noqa: E402

from numba import cuda as _cuda  # noqa: E402

# the CUDA event functions (the simulator has no event_elapsed_time; it never times with events)
_cuda_event, _cuda_synchronize = _cuda.event, _cuda.synchronize
_cuda_elapsed = getattr(_cuda, "event_elapsed_time", None)

from ..check import check_technique  # noqa: E402
from ..layers import impl_for, kernel_layers  # noqa: E402
from ..nets import Layer, Net, get_net  # noqa: E402
from ..stages import STAGES, Variant  # noqa: E402
from . import ownership  # noqa: E402
from .protocol import Answer, Kind, encode, read_answer  # noqa: E402
from .snapshot import Snapshot  # noqa: E402


class _Channel:
    """Frames on the pipe the grader opened for results (never stdout)."""

    def __init__(self, fd: int):
        self.fd, self._write, self._encode = fd, _os_write, encode
        self.send = self._send  # bound now: a later patch of the class does not reach this channel

    def _send(self, kind: Kind, meta: dict | None = None, arrays: dict[str, np.ndarray] | None = None) -> None:
        data = memoryview(self._encode(kind, meta, arrays))
        while data:
            data = data[self._write(self.fd, data):]


class _Clock:
    """The engine's clock here (``section(name)``, ``seconds()``, as ``labkit.timing.Clock``): CUDA events for GPU
    code on a GPU, else ``perf_counter`` between synchronizations. Each clock takes the functions bound at import
    when it is made, and binds its own methods, so a patch made while a pass runs does not reach it."""

    def __init__(self, events: bool, syncs: tuple):
        self._perf, self._event, self._elapsed, self._syncs = _perf_counter, _cuda_event, _cuda_elapsed, syncs
        self._marks: list = []
        self._totals: dict[str, float] = {}
        self.section = self._event_section if events else self._perf_section
        self.seconds = self._read

    def _sync(self) -> None:
        for fn in self._syncs:
            fn()

    @_contextmanager
    def _event_section(self, name: str):
        start, end = self._event(timing=True), self._event(timing=True)
        start.record()
        yield
        end.record()
        self._marks.append((name, start, end))

    @_contextmanager
    def _perf_section(self, name: str):
        self._sync()
        t0 = self._perf()
        yield
        self._sync()
        self._totals[name] = self._totals.get(name, 0.0) + self._perf() - t0

    def _read(self) -> dict[str, float]:
        if self._marks:
            self._marks[-1][2].synchronize()
            for name, start, end in self._marks:
                self._totals[name] = self._totals.get(name, 0.0) + self._elapsed(start, end) / 1e3
            self._marks.clear()
        return dict(self._totals)


def _namespaces(hooked: list) -> list[tuple[object, bool]]:
    """labkit's modules, this worker, numpy, time, the classes whose methods the grader relies on, and the kernel
    classes the launch hook sits on."""
    mods = [(m, not hasattr(m, "__path__")) for n, m in sorted(sys.modules.items())
            if isinstance(m, types.ModuleType) and (n == "labkit" or n.startswith("labkit.") or n == "__main__")]
    classes = [(c, True) for c in (_Channel, _Clock, engine.Prepared, Variant)]
    return [*mods, (np, False), (time, False), *classes, *((cls, False) for cls in dict.fromkeys(hooked))]


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


def describe_exception(exc: BaseException, what: str) -> str:
    """One line: what raised, the exception, and the line of the student's cell it came from."""
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


def _set_limits(job: dict) -> None:
    import resource

    mb = int(job.get("memory_mb") or 0)
    if mb > 0 and job.get("memory_guard") == "rlimit":
        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    fsize = int(job.get("max_file_mb") or 0)
    if fsize > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize << 20, fsize << 20))


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


def _gpu_syncs(gpu: bool) -> tuple:
    """What a perf_counter section waits for on a GPU: numba's queue, and cupy's (CUDA C variants) if present."""
    if not gpu:
        return ()
    syncs = [_cuda_synchronize]
    try:
        import cupy

        syncs.append(cupy.cuda.Device().synchronize)
    except Exception:  # noqa: BLE001 - no cupy: nothing of its to wait for
        pass
    return tuple(syncs)


def _timed_passes(net, variant, x, w, timing: dict, make_clock, restore) -> tuple[list, list]:
    """``timing["warmup"]`` untimed passes on one image, then ``timing["repeat"]`` timed ones (per-layer seconds),
    pass k on the images rotated by k (``np.roll(x, -k)``): a result cached across passes gives the wrong
    predictions, which come back with the times (one array per pass) for the grader to compare."""
    prepared = engine.prepare(net, variant, x, w)
    for _ in range(timing["warmup"]):
        restore()
        engine.forward(net, variant, prepared.first(1))
    runs, predictions = [], []
    for k in range(timing["repeat"]):
        shifted = prepared if k == 0 else engine.prepare(net, variant, np.roll(x, -k, axis=0), w)
        restore()
        probs, seconds = engine.time_passes(net, variant, shifted, 1, warmup=False, clock_factory=make_clock)
        runs += seconds
        predictions.append(np.asarray(probs, np.float32))
    return runs, predictions


def _pass_arrays(probabilities: list) -> dict:
    """Each timed pass's class probabilities: their argmax are its predictions, and a result kept from another
    pass shows in them even where the predictions happen to agree (synthetic images all of one class)."""
    return {f"prob{k}": p for k, p in enumerate(probabilities)}


# ------------------------------------------------------------------------------------------------- the job


def _summary(records: list[dict]) -> dict | None:
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
    return {"calls": len(records), "library": [list(pair) for pair in library[:4]],
            "without_own_launch": list(dict.fromkeys(without)), "launches": launches}


def run_job(job: dict, chan: _Channel, stdin, info, snap: Snapshot, tracer_ref: list, given_log: list) -> None:
    gpu_here = info.kind == "gpu"
    syncs = _gpu_syncs(gpu_here)
    restore = snap.restore
    with np.load(job["inputs"], allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    nets = {k: net_from_dict(d) for k, d in job["nets"].items()}
    contract = job["contract"]  # variant name -> {target, arrays, per_image, nets}
    workloads = {k: (nets[w["net"]], arrays[w["x"]], {n: arrays[a] for n, a in w["weights"].items()})
                 for k, w in job["workloads"].items()}
    chan.send(Kind.HELLO, {"device": device.label(info), "kind": info.kind, "simulated": info.simulated,
                           "pid": os.getpid(), "labkit": os.path.dirname(os.path.abspath(engine.__file__))})
    timing = job.get("timing")
    timed_name = job.get("timed")
    code = ownership.Code(job["stage"], {n: s.notebook for n, s in STAGES.items()})
    lib = ownership.Library()
    student_phase = [False]

    def variant(name: str, impls: dict) -> Variant:  # graded as the stage declares it, with these functions
        spec = contract[name]
        return Variant(impls=dict(impls), target=spec["target"], arrays=spec["arrays"],
                       per_image=bool(spec["per_image"]), nets=tuple(spec["nets"]), name=name, stage=job["stage"],
                       fuse=tuple(spec.get("fuse", ())), requires=tuple(spec.get("requires", ())))

    def check(when: str) -> None:
        """After a call into the student's code: anything the snapshot holds changed -> the job ends."""
        changes = snap.changes()
        if changes:
            raise _Tampered(changes, when)

    def clock_factory(name: str, what: str = ""):
        events = gpu_here and contract[name]["target"] == "gpu"

        def make_clock() -> _Clock:  # before each timed pass: the last one compared, labkit put back, a fresh clock
            if student_phase[0]:
                check(what)
            restore()
            return _Clock(events, syncs)

        return make_clock, "cuda-events" if events else "perf_counter"

    # --- the reference solution, timed before any student code exists
    if timing:
        chan.send(Kind.PHASE, {"what": "loading and timing the reference solution"})
        try:
            ref = _variant_fields(_variants_of(ownership.load_cells(job["reference_notebook"], code.solution),
                                               "reference solution")[timing["variant"]])
            net, x, w = workloads[timing["workload"]]
            make_clock, method = clock_factory(timing["variant"])
            runs, preds = _timed_passes(net, variant(timing["variant"], ref["impls"]), x, w, timing, make_clock,
                                        restore)
        except BaseException as exc:  # noqa: BLE001 - reported as the grader's own problem
            chan.send(Kind.GRADER_ERROR, {"message": "the reference solution failed: "
                                          + describe_exception(exc, "the reference solution"),
                                          "traceback": traceback.format_exc(limit=6)})
            return
        chan.send(Kind.REFERENCE, {"runs": runs, "method": method}, _pass_arrays(preds))

    try:
        student_phase[0] = True
        _student_part(job, chan, stdin, info, snap, tracer_ref, given_log, arrays, nets, contract, workloads, timing,
                      timed_name, code, lib, variant, check, clock_factory, syncs)
    except _Tampered as t:
        restore()
        chan.send(Kind.TAMPERED, {"what": t.changes[:20], "count": len(t.changes), "when": t.when})


def _student_part(job, chan, stdin, info, snap, tracer_ref, given_log, arrays, nets, contract, workloads, timing,
                  timed_name, code, lib, variant, check, clock_factory, syncs) -> None:
    restore = snap.restore
    # --- the student's kernel cells, and nothing else of the notebook
    restore()
    chan.send(Kind.PHASE, {"what": "loading the notebook's kernel cells"})
    ns: dict = {}
    try:
        ns = ownership.load_cells(job["student_notebook"], code.own, code.trees)
        found = _variants_of(ns, "your notebook")
    except BaseException as exc:  # noqa: BLE001 - every way a notebook can fail to load becomes one message
        check("while loading the kernel cells")
        msg = str(exc) if isinstance(exc, nbcells.NotebookError) else \
            "loading the kernel cells failed: " + describe_exception(exc, "a kernel cell")
        chan.send(Kind.LOAD_ERROR, {"message": msg, "forbidden": list(given_log)})
        return
    check("while loading the kernel cells")
    declared: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for name in contract:
        if name not in found:
            problems[name] = (f"VARIANTS has no {name!r} (it has {', '.join(map(repr, found)) or 'nothing'}); "
                              f"this stage grades {', '.join(map(repr, contract))}")
            continue
        try:
            declared[name] = _variant_fields(found[name])
        except TypeError as exc:
            problems[name] = f"VARIANTS[{name!r}] {exc}"
    check("while reading VARIANTS")
    restore()
    student = {name: variant(name, f["impls"]) for name, f in declared.items()}

    # --- own kernels only: the timed variant's conv functions, scanned now and traced while they run
    forbidden = list(given_log)
    if timed_name in student:
        try:
            forbidden += ownership.scan(ownership.conv_roots(student[timed_name]), code, lib)
        except Exception as exc:  # noqa: BLE001 - the scan is the grader's: a crash in it is reported, not hidden
            chan.send(Kind.GRADER_ERROR, {"message": f"the own-kernels scan failed: {type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc(limit=6)})
            return
    chan.send(Kind.LOADED, {"variants": {n: {k: v for k, v in f.items() if k != "impls"} | {"impls": sorted(f["impls"])}
                                         for n, f in declared.items()}, "problems": problems,
                            "forbidden": list(dict.fromkeys(forbidden))})
    if read_answer(stdin) is not Answer.CONTINUE:
        return
    tracer = ownership.Tracer(code, lib, [ns])
    tracer_ref[0] = tracer
    records: list[dict] = []

    def traced(fn, layer_name: str):
        def call(*args):
            rec = tracer.call(fn, args)
            rec["layer"] = layer_name
            records.append(rec)

        call.__name__ = getattr(fn, "__name__", "conv")
        return call

    def traced_variant(v: Variant) -> Variant:
        impls = dict(v.impls)
        for net_name in v.nets:
            for layer in kernel_layers(get_net(net_name)):
                fn = impl_for(v.impls, layer) if layer.kind == "conv" else None
                if fn is not None:
                    impls[layer.name] = traced(fn, layer.name)
        return replace(v, impls=impls)

    checked = {name: (traced_variant(v) if name == timed_name else v) for name, v in student.items()}

    # --- checks: raw outputs back to the grader, which compares them
    failed: set = set()  # (variant, net, what) that raised: its other batch sizes are skipped
    broken: set = set()  # (variant, net) with a layer that raised: its whole-network check is skipped
    for c in job["cases"]:
        restore()
        name, what, layer = c["variant"], c["what"], Layer(**c["layer"]) if c["layer"] else None
        key = (name, c["net_name"], what)
        if name not in checked or key in failed or (layer is None and key[:2] in broken):
            chan.send(Kind.CASE, {"id": c["id"], "skipped": True})
            continue
        v = checked[name]
        x, w = arrays[c["x"]], {n: arrays[a] for n, a in c["weights"].items()}
        fn = impl_for(v.impls, layer) if layer is not None else None
        if layer is not None and fn is None:
            failed.add(key)
            broken.add(key[:2])
            chan.send(Kind.CASE, {"id": c["id"], "error": f"VARIANTS[{name!r}] has no function for {what} "
                                                          f"(give impls a {layer.name!r} or {layer.kind!r} entry)"})
            read_answer(stdin)  # the verdict every judged case gets (here: stop)
            continue
        when = f"{what} (batch size {c['batch']}) of variant {name!r}"
        chan.send(Kind.START, {"what": when})
        watch_races = layer is not None and contract[name]["target"] == "gpu" and simulator.active()
        records.clear()
        meta: dict = {"id": c["id"]}
        got = None
        try:
            with gpu.counting() as counts, simcheck.watching() if watch_races else _nothing() as watch:
                if layer is not None:
                    got = engine.call_layer(fn, layer, x, w, v.arrays)
                else:
                    net = nets[c["net"]]
                    got = engine.forward(net, v, engine.prepare(net, v, x, w), check=True)
        except _Tampered:
            raise
        except BaseException as exc:  # noqa: BLE001 - the student's raise is a FAIL with its line, not a crash
            failed.add(key)
            broken.add(key[:2])
            meta["error"] = describe_exception(exc, what)
        check(f"during {when}")
        meta["launches"] = counts.launches
        trace = _summary(records)
        if trace:
            meta["trace"] = trace
        if watch is not None and watch.conflicts:
            meta["race"] = f"data race at batch size {c['batch']}: {watch.conflicts[0].describe()}"
        chan.send(Kind.CASE, meta, {"out": np.ascontiguousarray(got)} if got is not None and "error" not in meta
                  else None)
        if read_answer(stdin) is not Answer.CONTINUE:  # the grader judged it wrong: the rest of this layer (its
            failed.add(key)  # other batch sizes) and its net's forward pass would only repeat that
            broken.add(key[:2])
    chan.send(Kind.CHECKS_DONE)
    if read_answer(stdin) is not Answer.CONTINUE:
        return

    # --- technique: does the timed variant's conv use the stage's memory (its values passed the checks above)
    tech = job.get("technique")
    if tech and timed_name in student:
        restore()
        v = student[timed_name]
        conv = impl_for(v.impls, get_net(tech["net"]).layer(tech["layer"]))
        chan.send(Kind.START, {"what": f"the technique check ({tech['memory']} memory) of variant {timed_name!r}"})
        r = check_technique(conv, tech["net"], tech["layer"], tech["memory"], arrays=v.arrays, quiet=True)
        check("during the technique check")
        chan.send(Kind.TECHNIQUE, {"passed": r.passed, "line": str(r)})

    # --- accuracy: the whole network with the student's functions on the grader's images
    for a in job["accuracy"]:
        restore()
        v = checked[a["variant"]]
        net, x, w = workloads[a["workload"]]
        when = f"the {net.name} forward pass ({x.shape[0]} images) of variant {v.name!r}"
        chan.send(Kind.START, {"what": when})
        records.clear()
        meta = {"id": a["id"]}
        probs = None
        try:
            probs = engine.forward(net, v, engine.prepare(net, v, x, w), check=True)
        except _Tampered:
            raise
        except BaseException as exc:  # noqa: BLE001
            meta["error"] = describe_exception(exc, f"the {net.name} forward pass")
        check(f"during {when}")
        trace = _summary(records)
        if trace:
            meta["trace"] = trace
        chan.send(Kind.ACCURACY, meta, {"probs": np.ascontiguousarray(probs)} if probs is not None else None)
    tracer_ref[0] = None
    chan.send(Kind.ACCURACY_DONE)
    if not timing or read_answer(stdin) is not Answer.CONTINUE:
        return

    # --- op time: the student's timed variant, the same way as the reference's above
    restore()
    name = timing["variant"]
    net, x, w = workloads[timing["workload"]]
    when = f"timing variant {name!r} on {x.shape[0]} images"
    chan.send(Kind.START, {"what": when})
    make_clock, method = clock_factory(name, f"during a pass of {when}")
    try:
        runs, preds = _timed_passes(net, student[name], x, w, timing, make_clock, restore)
    except _Tampered:
        raise
    except BaseException as exc:  # noqa: BLE001
        check(f"during {when}")
        chan.send(Kind.TIMING, {"error": describe_exception(exc, "the timed run")})
        return
    check(f"during {when}")
    chan.send(Kind.TIMING, {"runs": runs, "method": method}, _pass_arrays(preds))


@contextmanager
def _nothing():
    yield None


def describe(notebook: str, out: str) -> None:
    """What a (trusted) solution notebook's VARIANTS declare, as JSON for the grader."""
    variants = _variants_of(nbcells.load(notebook), notebook)
    desc = {}
    for name, v in variants.items():
        f = _variant_fields(v)
        nets = list(getattr(v, "nets", ("cifar10",)))
        layers = {n: [ly.name for ly in kernel_layers(get_net(n)) if impl_for(f["impls"], ly)] for n in nets}
        desc[name] = {"target": f["target"], "arrays": f["arrays"], "per_image": bool(f["per_image"]),
                      "nets": nets, "layers": layers, "note": getattr(v, "note", ""),
                      "fuse": list(getattr(v, "fuse", ())), "requires": list(getattr(v, "requires", ())),
                      "unavailable": v.unavailable() if hasattr(v, "unavailable") else ""}
    with open(out, "w") as fh:
        json.dump({"variants": desc, "order": list(variants)}, fh)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--describe"]:
        describe(argv[1], argv[3] if len(argv) > 3 and argv[2] == "--json" else "describe.json")
        return 0
    job = json.loads(sys.stdin.readline())
    # the grader's answers come on stdin: keep it for them, and give the student's code an empty stdin instead
    stdin = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - for the process's lifetime
    chan = _Channel(int(job["fd"]))
    try:
        _set_limits(job)
        info = device.info()  # detected once, before the snapshot, so putting labkit back keeps it
        tracer_ref: list = [None]
        hooked = [cls for cls, _, _ in ownership.install_launch_hook(tracer_ref)]
        given_log: list[str] = []
        _guard_from_stage(job["stage"], given_log)
        run_job(job, chan, stdin, info, Snapshot(_namespaces(hooked)), tracer_ref, given_log)
        chan.send(Kind.DONE)
    except BaseException as exc:  # noqa: BLE001 - the grader must hear about its worker's own failures
        try:
            chan.send(Kind.GRADER_ERROR, {"message": f"grade worker failed: {type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc(limit=8)})
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit hooks: a student's cannot write after the last frame


if __name__ == "__main__":
    sys.exit(main())
