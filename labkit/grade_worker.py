"""The grader's child process: runs ONE student's stage notebook, and nothing else, for ``labkit.grade``.

Started by the grader as ``python -m labkit.grade_worker`` in a fresh temporary folder, with a time limit and a
memory limit, it reads one job (JSON) on stdin. Everything it needs is set up BEFORE any student code runs: the
inputs (read from the ``.npz`` the grader wrote), the layer specs, the clock (``time.perf_counter`` and, on a GPU,
the CUDA event functions, bound here so that a cell that replaces ``time.perf_counter`` or ``labkit.timing`` changes
nothing), the result channel (a pipe the grader opened, written with ``os.write`` bound here) and, when op time
is measured, the reference solution's timing (taken before the student's cells exist, so they cannot slow it).

Then it executes only the student's ``kernel``-tagged cells (``labkit.nbcells.load``), calls the student's
functions on the grader's inputs with NaN-poisoned outputs and sends the RAW outputs back. It never decides a
grade: the grader compares every output with the float64 reference itself, in its own process, so patching
``labkit.check`` (or anything else) in here cannot turn a wrong answer into a pass. Student prints go to this
process's stdout/stderr, which the grader keeps apart from the result channel.

Result channel frames: ``b"LKG1"``, uint32 length of a JSON header, uint64 length of an optional ``.npz`` payload,
then the two. The grader answers ``continue`` or ``stop`` on stdin after the checks and after the accuracy runs.

``python -m labkit.grade_worker --describe NOTEBOOK --json OUT`` (trusted solution notebooks only) writes what the
notebook's VARIANTS declare: target, arrays, per_image, nets and the layers each variant implements.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import time
import traceback

import numpy as np

# Bound at import, before any student code exists: a cell that patches these names in their modules changes
# nothing here.
_perf_counter = time.perf_counter
_os_write = os.write
_np_full = np.full
_np_empty = np.empty
_np_savez = np.savez
_np_concatenate = np.concatenate

from . import nbcells  # noqa: E402
from .check import impl_for as _impl  # noqa: E402
from .check import layer_args as _layer_args  # noqa: E402
from .check import to_host as _host  # noqa: E402
from .nets import Layer, Net, get_net  # noqa: E402
from .reference import layer_forward as _layer_forward  # noqa: E402

MAGIC = b"LKG1"
HEADER = struct.Struct("<4sIQ")


# --------------------------------------------------------------------------------------------- channel


class Channel:
    """Length-prefixed frames on the pipe the grader opened for results (never stdout)."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, kind: str, meta: dict | None = None, arrays: dict[str, np.ndarray] | None = None) -> None:
        head = json.dumps({"type": kind, **(meta or {})}, default=str).encode()
        payload = b""
        if arrays:
            buf = io.BytesIO()
            _np_savez(buf, **arrays)
            payload = buf.getvalue()
        data = memoryview(HEADER.pack(MAGIC, len(head), len(payload)) + head + payload)
        while data:
            n = _os_write(self.fd, data)
            data = data[n:]


def _read_command(stdin) -> str:
    line = stdin.readline()
    return line.strip() or "stop"


# ------------------------------------------------------------------------------------------------ specs


def net_from_dict(d: dict) -> Net:
    return Net(d["name"], tuple(d["input_shape"]), tuple(Layer(**ly) for ly in d["layers"]), d["dataset"],
               d["report"], tuple(d.get("workloads", ())), tuple(d.get("classes", ())),
               d.get("default_images", 0))


def _student_frames(tb) -> list:
    return [f for f in traceback.extract_tb(tb) if f.filename.startswith("<") and " cell " in f.filename]


def describe_exception(exc: BaseException, what: str) -> str:
    """One line: what raised, the exception, and the line of the student's cell it came from."""
    if isinstance(exc, SyntaxError) and exc.filename and " cell " in str(exc.filename):
        text = (exc.text or "").strip()
        return (f"SyntaxError in {exc.filename.strip('<>')}, line {exc.lineno}: {exc.msg}"
                + (f" ({text[:80]})" if text else ""))
    frames = _student_frames(exc.__traceback__)
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


# ------------------------------------------------------------------------------------------------ clock


class Clock:
    """Seconds of one call, measured with functions bound before student code runs."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.perf = _perf_counter
        self._sync = []
        if gpu:
            from numba import cuda

            self._event, self._elapsed = cuda.event, cuda.event_elapsed_time
            self._sync.append(cuda.synchronize)
            try:  # cupy work (CUDA C variants) must be finished too
                import cupy

                self._sync.append(cupy.cuda.Device().synchronize)
            except Exception:  # noqa: BLE001 - no cupy: nothing to wait for
                pass

    def sync(self) -> None:
        for fn in self._sync:
            fn()

    def time(self, fn, *args) -> float:
        if self.gpu:
            self.sync()
            start, end = self._event(timing=True), self._event(timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            self.sync()
            return self._elapsed(start, end) / 1e3
        t0 = self.perf()
        fn(*args)
        return self.perf() - t0


# ---------------------------------------------------------------------------------------------- forward


class Forward:
    """The whole network with a variant's functions (the numpy reference for layers it does not implement),
    called the way ``labkit.runner`` calls them; optional per-layer timing with the grader's clock."""

    def __init__(self, net: Net, impls: dict, arrays: str, per_image: bool, clock: Clock):
        self.net, self.impls, self.arrays, self.per_image, self.clock = net, impls, arrays, per_image, clock
        self.shapes = net.shapes()
        if arrays == "device":
            missing = [ly.name for ly in net.layers if ly.kind != "flatten" and _impl(impls, ly) is None]
            if missing:
                raise ValueError(f"arrays='device' needs a function for every layer; missing: {', '.join(missing)}")
            from numba import cuda

            self._cuda = cuda

    def upload(self, x, weights):
        if self.arrays == "device":
            return self._cuda.to_device(x), {k: self._cuda.to_device(v) for k, v in weights.items()}
        return x, weights

    def _alloc(self, shape, poison: bool):
        if self.arrays == "device":
            out = self._cuda.device_array(shape, np.float32)
            if poison:
                out.copy_to_device(_np_full(shape, np.nan, np.float32))
            return out
        return _np_full(shape, np.nan, np.float32) if poison else _np_empty(shape, np.float32)

    def _once(self, x, weights, seconds: dict | None, poison: bool):
        y = x
        for layer in self.net.layers:
            fn = _impl(self.impls, layer)
            if layer.kind == "flatten":
                y = y.reshape(y.shape[0], -1)
                continue
            if fn is None:
                def call(layer=layer, y=y):
                    return _layer_forward(layer, y, weights).astype(np.float32, copy=False)
                if seconds is None:
                    y = call()
                else:
                    box = []
                    seconds[layer.name] = seconds.get(layer.name, 0.0) + self.clock.time(lambda: box.append(call()))
                    y = box[0]
                continue
            out = self._alloc((y.shape[0], *self.shapes[layer.name]), poison)
            args = _layer_args(layer, y, weights, out)
            if seconds is None:
                fn(*args)
            else:
                seconds[layer.name] = seconds.get(layer.name, 0.0) + self.clock.time(fn, *args)
            y = out
        return y

    def run(self, x, weights, timed: bool = False, poison: bool = True):
        """(class probabilities on the host, per-layer seconds or None)."""
        seconds: dict | None = {} if timed else None
        if self.per_image:
            probs = _np_concatenate([_host(self._once(x[i:i + 1], weights, seconds, poison))
                                     for i in range(x.shape[0])])
        else:
            probs = _host(self._once(x, weights, seconds, poison))
        return probs, seconds


def time_variant(fwd: Forward, x, weights, warmup: int, repeat: int) -> list[dict[str, float]]:
    """Warm up on one image (compiles every function), then ``repeat`` timed passes: per-layer seconds each."""
    xd, wd = fwd.upload(x, weights)
    for _ in range(warmup):
        fwd.run(xd[:1], wd, timed=False, poison=False)
    return [fwd.run(xd, wd, timed=True, poison=False)[1] for _ in range(repeat)]


# ------------------------------------------------------------------------------------------------- job


def _set_limits(job: dict) -> None:
    import resource

    mb = int(job.get("memory_mb") or 0)
    if mb > 0 and job.get("memory_guard") == "rlimit":
        limit = mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
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


def run_job(job: dict, chan: Channel, stdin) -> None:
    from . import device

    info = device.info()
    gpu = info.kind == "gpu"
    clocks = {"cpu": Clock(False), "gpu": Clock(gpu)}  # CPU code is timed with perf_counter even on a GPU box
    with np.load(job["inputs"], allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    nets = {k: net_from_dict(d) for k, d in job["nets"].items()}
    contract = job["contract"]  # variant name -> {target, arrays, per_image}
    workloads = {k: (nets[w["net"]], arrays[w["x"]], {n: arrays[a] for n, a in w["weights"].items()})
                 for k, w in job["workloads"].items()}
    cases = [(c, Layer(**c["layer"]) if c["layer"] else None, arrays[c["x"]],
              {n: arrays[a] for n, a in c["weights"].items()}) for c in job["cases"]]
    chan.send("hello", {"device": device.label(info), "kind": info.kind, "simulated": info.simulated,
                        "pid": os.getpid(), "labkit": os.path.dirname(os.path.abspath(nbcells.__file__))})
    timing = job.get("timing")

    # --- the reference solution, timed before any student code exists
    if timing:
        chan.send("phase", {"what": "loading and timing the reference solution"})
        try:
            ref_ns = nbcells.load(job["reference_notebook"])
            ref = _variant_fields(_variants_of(ref_ns, "reference solution")[timing["variant"]])
            spec = contract[timing["variant"]]
            net, x, w = workloads[timing["workload"]]
            fwd = Forward(net, ref["impls"], spec["arrays"], spec["per_image"], clocks[spec["target"]])
            runs = time_variant(fwd, x, w, timing["warmup"], timing["repeat"])
        except BaseException as exc:  # noqa: BLE001 - reported as the grader's own problem
            chan.send("grader_error", {"message": "the reference solution failed: "
                                                  + describe_exception(exc, "the reference solution"),
                                       "traceback": traceback.format_exc(limit=6)})
            return
        chan.send("reference", {"runs": runs, "method": "cuda-events" if clocks[spec["target"]].gpu else "perf_counter"})

    # --- the student's kernel cells, and nothing else of the notebook
    chan.send("phase", {"what": "loading the notebook's kernel cells"})
    try:
        ns = nbcells.load(job["student_notebook"])
        found = _variants_of(ns, "your notebook")
    except BaseException as exc:  # noqa: BLE001 - every way a notebook can fail to load becomes one message
        if isinstance(exc, nbcells.NotebookError):
            msg = str(exc)
        else:
            msg = "loading the kernel cells failed: " + describe_exception(exc, "a kernel cell")
        chan.send("load_error", {"message": msg})
        return
    student: dict[str, dict] = {}
    problems: dict[str, str] = {}
    for name in contract:
        if name not in found:
            problems[name] = (f"VARIANTS has no {name!r} (it has {', '.join(map(repr, found)) or 'nothing'}); "
                              f"this stage grades {', '.join(map(repr, contract))}")
            continue
        try:
            student[name] = _variant_fields(found[name])
        except TypeError as exc:
            problems[name] = f"VARIANTS[{name!r}] {exc}"
    chan.send("loaded", {"variants": {n: {k: v for k, v in f.items() if k != "impls"} | {"impls": sorted(f["impls"])}
                                      for n, f in student.items()}, "problems": problems})

    # --- checks: raw outputs back to the grader, which compares them
    failed_layers: set = set()
    for c, layer, x, w in cases:
        label = layer.name if layer is not None else c["name"]  # None: the whole-network function
        name, what = c["variant"], f"{label} (batch size {c['batch']})"
        if name not in student or (name, label) in failed_layers:
            chan.send("case", {"id": c["id"], "skipped": True})
            continue
        impls = student[name]["impls"]
        fn = _impl(impls, layer) if layer is not None else impls.get("network")
        if fn is None:
            failed_layers.add((name, label))
            entry = f"a {layer.name!r} or {layer.kind!r} entry" if layer is not None else "a 'network' entry"
            chan.send("case", {"id": c["id"], "error": f"VARIANTS[{name!r}] has no function for {label} "
                                                       f"(give impls {entry})"})
            continue
        chan.send("start", {"what": f"{what} of variant {name!r}"})
        device_arrays = contract[name]["arrays"] == "device"
        try:
            if device_arrays:
                from numba import cuda

                xa, wa = cuda.to_device(x), {k: cuda.to_device(v) for k, v in w.items()}
                out = cuda.to_device(_np_full(c["out_shape"], np.nan, np.float32))
            else:
                xa, wa, out = x.copy(), {k: v.copy() for k, v in w.items()}, _np_full(c["out_shape"], np.nan,
                                                                                       np.float32)
            t0 = _perf_counter()
            fn(*(_layer_args(layer, xa, wa, out) if layer is not None else (xa, wa, out)))
            got = _host(out)
            seconds = _perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - the student's raise is a FAIL with its line, not a crash
            failed_layers.add((name, label))
            chan.send("case", {"id": c["id"], "error": describe_exception(exc, label)})
            continue
        if not isinstance(got, np.ndarray):
            chan.send("case", {"id": c["id"], "error": f"{label}: out is a {type(got).__name__}"})
            continue
        chan.send("case", {"id": c["id"], "seconds": seconds}, {"out": np.ascontiguousarray(got)})
    chan.send("checks_done")
    if _read_command(stdin) != "continue":
        return

    def student_forward(name: str, net: Net) -> Forward:
        spec = contract[name]
        return Forward(net, student[name]["impls"], spec["arrays"], spec["per_image"], clocks[spec["target"]])

    # --- accuracy: the whole network with the student's functions on the grader's images
    for a in job["accuracy"]:
        name = a["variant"]
        net, x, w = workloads[a["workload"]]
        chan.send("start", {"what": f"the {net.name} forward pass ({x.shape[0]} images) of variant {name!r}"})
        try:
            fwd = student_forward(name, net)
            xd, wd = fwd.upload(x, w)
            probs, _ = fwd.run(xd, wd, poison=True)
        except BaseException as exc:  # noqa: BLE001
            chan.send("accuracy", {"id": a["id"], "error": describe_exception(exc, f"the {net.name} forward pass")})
            continue
        chan.send("accuracy", {"id": a["id"]}, {"probs": np.ascontiguousarray(probs)})
    chan.send("accuracy_done")
    if not timing or _read_command(stdin) != "continue":
        return

    # --- op time: the student's timed variant, the same way as the reference's above
    name = timing["variant"]
    net, x, w = workloads[timing["workload"]]
    chan.send("start", {"what": f"timing variant {name!r} on {x.shape[0]} images"})
    try:
        fwd = student_forward(name, net)
        runs = time_variant(fwd, x, w, timing["warmup"], timing["repeat"])
    except BaseException as exc:  # noqa: BLE001
        chan.send("timing", {"error": describe_exception(exc, "the timed run")})
        return
    gpu_clock = clocks[contract[name]["target"]].gpu
    chan.send("timing", {"runs": runs, "method": "cuda-events" if gpu_clock else "perf_counter"})


def describe(notebook: str, out: str) -> None:
    """What a (trusted) solution notebook's VARIANTS declare, as JSON for the grader."""
    ns = nbcells.load(notebook)
    variants = _variants_of(ns, notebook)
    desc = {}
    for name, v in variants.items():
        f = _variant_fields(v)
        nets = list(getattr(v, "nets", ("cifar10",)))
        layers = {n: [ly.name for ly in get_net(n).layers if ly.kind != "flatten" and _impl(f["impls"], ly)]
                  for n in nets}
        desc[name] = {"target": f["target"], "arrays": f["arrays"], "per_image": bool(f["per_image"]),
                      "nets": nets, "layers": layers, "network": "network" in f["impls"],
                      "note": getattr(v, "note", "")}
    with open(out, "w") as fh:
        json.dump({"variants": desc, "order": list(variants)}, fh)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--describe"]:
        describe(argv[1], argv[3] if len(argv) > 3 and argv[2] == "--json" else "describe.json")
        return 0
    stdin = sys.stdin
    job = json.loads(stdin.readline())
    chan = Channel(int(job["fd"]))
    try:
        _set_limits(job)
        run_job(job, chan, stdin)
        chan.send("done")
    except BaseException as exc:  # noqa: BLE001 - the grader must hear about its worker's own failures
        try:
            chan.send("grader_error", {"message": f"grade worker failed: {type(exc).__name__}: {exc}",
                                       "traceback": traceback.format_exc(limit=8)})
        except OSError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit hooks: a student's cannot write after the last frame


if __name__ == "__main__":
    sys.exit(main())
