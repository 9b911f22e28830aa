"""The grader's child: runs ONE student's stage notebook through the engine, and decides nothing.

Started as ``python -m labkit.grading.worker`` in a fresh folder, importing its private copy of labkit, it reads
the job (JSON) on stdin and the inputs from the ``.npz`` the grader wrote. Before any student code exists it binds
its clock's functions (``time.perf_counter``, the CUDA event functions) and its result pipe (``os.write``), takes a
snapshot of labkit's modules (and numpy's, and its own), and, when op time is measured, times the reference
solution. Then it executes only the student's ``kernel``-tagged cells and calls the student's functions the way
every run calls them (``labkit.engine``): each layer on a NaN-poisoned output, the whole network with every
intermediate poisoned, the real images, the timed passes. Before each of those calls the snapshot is put back, so a
cell that patches labkit (the engine, the layer convention, ``labkit.check``, ``labkit.timing``), numpy, the time
module or this worker changes nothing the grader measures; each clock takes its functions when it is made.

Outputs go back RAW through the pipe (``labkit.grading.protocol``); the grader compares them with the float64
reference in its own process. Student prints go to this process's stdout/stderr, which the grader keeps apart.

``python -m labkit.grading.worker --describe NOTEBOOK --json OUT`` (trusted solution notebooks only) writes what
the notebook's VARIANTS declare: target, arrays, per_image, nets and the layers each variant implements.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import types
from contextlib import contextmanager

import numpy as np

# Bound at import, before any student code exists.
_perf_counter = time.perf_counter
_os_write = os.write
_contextmanager = contextmanager

from .. import device, engine, nbcells  # noqa: E402  (labkit first: its runtime settings precede numba's)

from numba import cuda as _cuda  # noqa: E402

# the CUDA event functions (the simulator has no event_elapsed_time; it never times with events)
_cuda_event, _cuda_synchronize = _cuda.event, _cuda.synchronize
_cuda_elapsed = getattr(_cuda, "event_elapsed_time", None)

from ..layers import impl_for, kernel_layers  # noqa: E402
from ..nets import Layer, Net, get_net  # noqa: E402
from ..stages import Variant  # noqa: E402
from .protocol import Answer, Kind, encode, read_answer  # noqa: E402


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


def _snapshot(namespaces: list[tuple[object, bool]]):
    """A function that puts every attribute of the given modules and classes back as it is now (and, where
    asked, removes the ones added since: a module global can shadow a builtin)."""
    missing = object()
    saved = [(obj, dict(vars(obj)), prune) for obj, prune in namespaces]

    def restore() -> None:
        for obj, attrs, prune in saved:
            now = vars(obj)
            for name, value in attrs.items():
                if now.get(name, missing) is not value:
                    setattr(obj, name, value)
            if prune:
                for name in [n for n in now if n not in attrs]:
                    delattr(obj, name)

    return restore


def _namespaces() -> list[tuple[object, bool]]:
    """labkit's modules, this worker, numpy, time, and the classes whose methods the grader relies on."""
    mods = [(m, not hasattr(m, "__path__")) for n, m in sorted(sys.modules.items())
            if isinstance(m, types.ModuleType) and (n == "labkit" or n.startswith("labkit.") or n == "__main__")]
    classes = [(c, True) for c in (_Channel, _Clock, engine.Prepared, Variant)]
    return [*mods, (np, False), (time, False), *classes]


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


def _timed_passes(net, variant, x, w, timing: dict, make_clock, restore) -> list[dict[str, float]]:
    """``timing["warmup"]`` untimed passes on one image, then ``timing["repeat"]`` timed ones (per-layer seconds)."""
    prepared = engine.prepare(net, variant, x, w)
    for _ in range(timing["warmup"]):
        restore()
        engine.forward(net, variant, prepared.first(1))
    restore()
    return engine.time_passes(net, variant, prepared, timing["repeat"], warmup=False, clock_factory=make_clock)[1]


# ------------------------------------------------------------------------------------------------- the job


def run_job(job: dict, chan: _Channel, stdin, info, restore) -> None:
    gpu = info.kind == "gpu"
    syncs = _gpu_syncs(gpu)
    with np.load(job["inputs"], allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    nets = {k: net_from_dict(d) for k, d in job["nets"].items()}
    contract = job["contract"]  # variant name -> {target, arrays, per_image, nets}
    workloads = {k: (nets[w["net"]], arrays[w["x"]], {n: arrays[a] for n, a in w["weights"].items()})
                 for k, w in job["workloads"].items()}
    chan.send(Kind.HELLO, {"device": device.label(info), "kind": info.kind, "simulated": info.simulated,
                           "pid": os.getpid(), "labkit": os.path.dirname(os.path.abspath(engine.__file__))})
    timing = job.get("timing")

    def variant(name: str, impls: dict) -> Variant:  # graded as the stage declares it, with these functions
        spec = contract[name]
        return Variant(impls=dict(impls), target=spec["target"], arrays=spec["arrays"],
                       per_image=bool(spec["per_image"]), nets=tuple(spec["nets"]), name=name, stage=job["stage"])

    def clock_factory(name: str):
        events = gpu and contract[name]["target"] == "gpu"

        def make_clock() -> _Clock:  # before each timed pass: labkit put back, then a fresh clock
            restore()
            return _Clock(events, syncs)

        return make_clock, "cuda-events" if events else "perf_counter"

    # --- the reference solution, timed before any student code exists
    if timing:
        chan.send(Kind.PHASE, {"what": "loading and timing the reference solution"})
        try:
            ref = _variant_fields(_variants_of(nbcells.load(job["reference_notebook"]), "reference solution")
                                  [timing["variant"]])
            net, x, w = workloads[timing["workload"]]
            make_clock, method = clock_factory(timing["variant"])
            runs = _timed_passes(net, variant(timing["variant"], ref["impls"]), x, w, timing, make_clock, restore)
        except BaseException as exc:  # noqa: BLE001 - reported as the grader's own problem
            chan.send(Kind.GRADER_ERROR, {"message": "the reference solution failed: "
                                          + describe_exception(exc, "the reference solution"),
                                          "traceback": traceback.format_exc(limit=6)})
            return
        chan.send(Kind.REFERENCE, {"runs": runs, "method": method})

    # --- the student's kernel cells, and nothing else of the notebook
    restore()
    chan.send(Kind.PHASE, {"what": "loading the notebook's kernel cells"})
    try:
        found = _variants_of(nbcells.load(job["student_notebook"]), "your notebook")
    except BaseException as exc:  # noqa: BLE001 - every way a notebook can fail to load becomes one message
        msg = str(exc) if isinstance(exc, nbcells.NotebookError) else \
            "loading the kernel cells failed: " + describe_exception(exc, "a kernel cell")
        chan.send(Kind.LOAD_ERROR, {"message": msg})
        return
    restore()
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
    student = {name: variant(name, f["impls"]) for name, f in declared.items()}
    chan.send(Kind.LOADED, {"variants": {n: {k: v for k, v in f.items() if k != "impls"} | {"impls": sorted(f["impls"])}
                                         for n, f in declared.items()}, "problems": problems})

    # --- checks: raw outputs back to the grader, which compares them
    failed: set = set()  # (variant, net, what) that raised: its other batch sizes are skipped
    broken: set = set()  # (variant, net) with a layer that raised: its whole-network check is skipped
    for c in job["cases"]:
        restore()
        name, what, layer = c["variant"], c["what"], Layer(**c["layer"]) if c["layer"] else None
        key = (name, c["net_name"], what)
        if name not in student or key in failed or (layer is None and key[:2] in broken):
            chan.send(Kind.CASE, {"id": c["id"], "skipped": True})
            continue
        v = student[name]
        x, w = arrays[c["x"]], {n: arrays[a] for n, a in c["weights"].items()}
        fn = impl_for(v.impls, layer) if layer is not None else None
        if layer is not None and fn is None:
            failed.add(key)
            broken.add(key[:2])
            chan.send(Kind.CASE, {"id": c["id"], "error": f"VARIANTS[{name!r}] has no function for {what} "
                                                          f"(give impls a {layer.name!r} or {layer.kind!r} entry)"})
            continue
        chan.send(Kind.START, {"what": f"{what} (batch size {c['batch']}) of variant {name!r}"})
        try:
            if layer is not None:
                got = engine.call_layer(fn, layer, x, w, v.arrays)
            else:
                net = nets[c["net"]]
                got = engine.forward(net, v, engine.prepare(net, v, x, w), check=True)
        except BaseException as exc:  # noqa: BLE001 - the student's raise is a FAIL with its line, not a crash
            failed.add(key)
            broken.add(key[:2])
            chan.send(Kind.CASE, {"id": c["id"], "error": describe_exception(exc, what)})
            continue
        chan.send(Kind.CASE, {"id": c["id"]}, {"out": np.ascontiguousarray(got)})
    chan.send(Kind.CHECKS_DONE)
    if read_answer(stdin) is not Answer.CONTINUE:
        return

    # --- accuracy: the whole network with the student's functions on the grader's images
    for a in job["accuracy"]:
        restore()
        v = student[a["variant"]]
        net, x, w = workloads[a["workload"]]
        chan.send(Kind.START, {"what": f"the {net.name} forward pass ({x.shape[0]} images) of variant {v.name!r}"})
        try:
            probs = engine.forward(net, v, engine.prepare(net, v, x, w), check=True)
        except BaseException as exc:  # noqa: BLE001
            chan.send(Kind.ACCURACY, {"id": a["id"], "error": describe_exception(exc, f"the {net.name} forward pass")})
            continue
        chan.send(Kind.ACCURACY, {"id": a["id"]}, {"probs": np.ascontiguousarray(probs)})
    chan.send(Kind.ACCURACY_DONE)
    if not timing or read_answer(stdin) is not Answer.CONTINUE:
        return

    # --- op time: the student's timed variant, the same way as the reference's above
    restore()
    name = timing["variant"]
    net, x, w = workloads[timing["workload"]]
    chan.send(Kind.START, {"what": f"timing variant {name!r} on {x.shape[0]} images"})
    make_clock, method = clock_factory(name)
    try:
        runs = _timed_passes(net, student[name], x, w, timing, make_clock, restore)
    except BaseException as exc:  # noqa: BLE001
        chan.send(Kind.TIMING, {"error": describe_exception(exc, "the timed run")})
        return
    chan.send(Kind.TIMING, {"runs": runs, "method": method})


def describe(notebook: str, out: str) -> None:
    """What a (trusted) solution notebook's VARIANTS declare, as JSON for the grader."""
    variants = _variants_of(nbcells.load(notebook), notebook)
    desc = {}
    for name, v in variants.items():
        f = _variant_fields(v)
        nets = list(getattr(v, "nets", ("cifar10",)))
        layers = {n: [ly.name for ly in kernel_layers(get_net(n)) if impl_for(f["impls"], ly)] for n in nets}
        desc[name] = {"target": f["target"], "arrays": f["arrays"], "per_image": bool(f["per_image"]),
                      "nets": nets, "layers": layers, "note": getattr(v, "note", "")}
    with open(out, "w") as fh:
        json.dump({"variants": desc, "order": list(variants)}, fh)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--describe"]:
        describe(argv[1], argv[3] if len(argv) > 3 and argv[2] == "--json" else "describe.json")
        return 0
    stdin = sys.stdin
    job = json.loads(stdin.readline())
    chan = _Channel(int(job["fd"]))
    try:
        _set_limits(job)
        info = device.info()  # detected once, before the snapshot, so putting labkit back keeps it
        run_job(job, chan, stdin, info, _snapshot(_namespaces()))
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
