"""GPU probe for issue 24 (the whole job ahead of cuDNN): measurements and working prototypes before stage 10.

One process, four sections, each reported as it finishes and kept in ``OUT/whole_job_probe.json`` and ``.txt``:

1. whole call: stage 09's tuned variants through the engine, CUDA events around the whole forward call (launches
   and the small output download), beside cuDNN through PyTorch on the same weights and inputs, the kit's own
   per-layer breakdown, predictions compared on every image;
2. fc as a GEMM grown up: the given tile kernel, bigger register tiles, split-K (atomics, or partial sums and a
   reduction), each checked against numpy in float64 and timed beside torch's ``F.linear``;
3. launch overhead: cifar10 at 1200 images as the engine calls it, as a walk on one explicit stream, and that walk
   captured once in a CUDA graph and replayed;
4. end to end: 50000 CIFAR images as uint8 bytes on the host to classes on the host, serially and in chunks over
   streams from pinned memory.

``--quick`` runs every correctness path on numba's CUDA simulator at toy sizes (shrunk nets, a few images) and
skips, one line each, what needs cupy or PyTorch. Stage 10 took the prototypes into the kit, and the probe runs the
kit's: the fc's register tiles and split-K (``labkit.gemm``, its three stores), lanes (``lk.streams``), graphs
(``lk.graphs``), the engine's forward pass left on the device, the whole job's steps (``lk.whole.Job``) and
cuDNN's whole call (``labkit.cudnn.whole_call``). Its own are the measurements, the pipeline loop over Job's steps
(stage 10's task, which the kit does not hold) and the engine's captures as it was before the lanes.

    OUT=/some/folder python3 tools/whole_job_probe.py --out "$OUT"
    python3 tools/whole_job_probe.py --quick --out /tmp/probe
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import (cudnn, device, engine, gemm, gpu, graphs, kernels, nbcells, reference, streams,  # noqa: E402
                    weights_io, whole)

from numba import cuda  # noqa: E402

SOLUTION_09 = REPO / "solutions" / "09_per_layer_tuning.ipynb"
MAX_REL_ERROR = 1e-4


# ----------------------------------------------------------------------------------------------- fc prototypes

def _prototype(p: gemm.Plan, store: str, regs: int, name: str):
    """An fc layer function launching ``labkit.gemm``'s kernel by plan ``p`` with ``store``; ``regs`` caps the
    registers a thread (0: none)."""

    def fc(x, w, b, out):
        gemm.launch(p, x, w, b, out, store=store, registers=regs)

    fc.__name__ = name
    return fc


def _regs(regs: int) -> str:
    return f", regs {regs}" if regs else ""


def fc_tiles(BM, BN, TM, TN, BK=16, regs=0):
    """(b) Bigger register tiles, one launch (gemm's "bias" store): more multiply-adds per shared-memory read than
    the given 4 x 4."""
    return _prototype(gemm.Plan(gemm.Tiles(BM, BN, TM, TN, BK)), "bias", regs,
                      f"tiles {BM}x{BN} ({TM}x{TN}, BK {BK}{_regs(regs)})")


def fc_split_atomic(BM, BN, TM, TN, splits, BK=16):
    """(c) split-K with atomics (gemm's "atomic" store): few tiles (79 at 10000 images) become ``splits`` times as
    many blocks, each adding its share of the inputs into an output pre-filled with the bias."""
    return _prototype(gemm.Plan(gemm.Tiles(BM, BN, TM, TN, BK), splits), "atomic", 0,
                      f"split-K {splits} atomic, tiles {BM}x{BN} ({TM}x{TN}, BK {BK})")


def fc_split_reduce(BM, BN, TM, TN, splits, BK=16, regs=0):
    """(c) split-K with partial sums (gemm's "planes" store, the kit's fc_tiles): each split writes its own plane,
    a second small kernel adds the planes and the bias (no atomics, the same order every run)."""
    return _prototype(gemm.Plan(gemm.Tiles(BM, BN, TM, TN, BK), splits), "planes", regs,
                      f"split-K {splits} reduce, tiles {BM}x{BN} ({TM}x{TN}, BK {BK}{_regs(regs)})")


def fc_prototypes(features: int, quick: bool) -> list:
    """The given kernel and the prototypes for a layer of ``features`` outputs: tiles whose feature width covers
    the layer in one or two tiles (160 = 16 x 10, 140 = 14 x 10), and split-K over those tiles."""
    if quick:  # simulator: a handful of threads per block, the same code paths (ragged tiles, uneven K splits;
        # 6 x 12 tiles of 8 threads load 4 rows of 2 inputs per pass: the second pass runs 2 rows past the tile)
        tile = (8, 10, 2, 5, 8)
        return [kernels.fc, gemm.fc_tiles, fc_tiles(*tile), fc_split_atomic(*tile[:4], 3, BK=8),
                fc_split_reduce(*tile[:4], 3, BK=8), fc_split_reduce(*tile[:4], 7, BK=8),
                fc_tiles(6, 12, 3, 3, 2), fc_split_atomic(6, 12, 3, 3, 4, BK=2)]
    protos = [kernels.fc, gemm.fc_tiles]  # the kit's layer: its plan for the shape
    tiles = []  # (BM, BN, TM, TN, BK)
    if features % 10 == 0:  # one tile of all features: 16 x 10 threads' columns for 160, 14 x 10 for 140
        tiles += [(128, features, 8, 10, 16), (64, features, 4, 10, 16)]
    if features % 10 == 0 and (features // 2) % 5 == 0:
        tiles += [(128, features // 2, 8, 5, 16)]  # two tiles of features
    tiles += [(128, 64, 8, 8, 16)]  # 32-aligned tiles, some waste on 160
    if features % 10 == 0:
        tiles += [(128, features, 8, 10, 32)]  # twice the inputs per step: half the barriers, 128-byte rows
    for t in tiles:
        protos.append(fc_tiles(*t))
    for t in tiles[:2]:
        for s in (4, 8, 16):
            protos.append(fc_split_atomic(*t[:4], s, BK=t[4]))
            protos.append(fc_split_reduce(*t[:4], s, BK=t[4]))
    if features % 10 == 0:
        protos.append(fc_split_reduce(*tiles[-1][:4], 8, BK=tiles[-1][4]))
        # ptxas (sm_90): 128 registers for 8 x 10 (two blocks of 256 threads per SM), 88-94 for 4 x 10 and 8 x 5;
        # capped at 80, three blocks fit, at 16-36 bytes of spills
        protos += [fc_tiles(*tiles[1], regs=80), fc_split_reduce(*tiles[1][:4], 8, BK=tiles[1][4], regs=80),
                   fc_tiles(*tiles[2], regs=80)]
    return protos


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: the error against the scale of the result (NaN anywhere is infinite)."""
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def fc_error(fn, xd, wd, bd, out, want: np.ndarray) -> float:
    """Relative error of ``fn`` on device arrays against ``want`` (the float64 product), ``out`` poisoned first."""
    out.copy_to_device(np.full(out.shape, np.nan, np.float32))
    fn(xd, wd, bd, out)
    return rel_error(out.copy_to_host(), want)


def check_fc(fn, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> float:
    """``fc_error`` on host arrays, against their float64 product."""
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    out = cuda.device_array((x.shape[0], w.shape[0]), np.float32)
    return fc_error(fn, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out, want)


# ----------------------------------------------------------------------------------------------- timing, report



def summary(seconds: list[float]) -> dict:
    return {"median_ms": 1e3 * statistics.median(seconds), "min_ms": 1e3 * min(seconds),
            "max_ms": 1e3 * max(seconds), "runs": len(seconds)}


def ms(s: dict) -> str:
    return f"{s['median_ms']:9.3f} ms (range {s['min_ms']:.3f}-{s['max_ms']:.3f}, {s['runs']} runs)"


class Report:
    """Lines printed as they come (progress) and kept for the .txt; results kept for the .json."""

    def __init__(self):
        self.lines: list[str] = []
        self.data: dict = {}
        self.t0 = time.perf_counter()
        self.failures: list[str] = []

    def say(self, line: str = "") -> None:
        stamp = f"[{time.perf_counter() - self.t0:6.1f}s] " if line else ""
        print(stamp + line, flush=True)
        self.lines.append(line)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        self.say(f"CHECK FAILED: {what}")


# ----------------------------------------------------------------------------------------------- devices

def has_cupy() -> bool:
    return device.info().kind == "gpu" and bool(device.info().cupy)


def has_torch() -> bool:
    return cudnn.available()


# ----------------------------------------------------------------------------------------------- workloads

def load_variants() -> dict:
    """Stage 09's variants from the solution notebook's kernel cells (the tuned ones take results/tuning.json's
    choice for this device)."""
    return nbcells.load(SOLUTION_09)["VARIANTS"]


def workload_for(net: str, images: int):
    """The kit's workload (real images where LABKIT_DATA has them, synthetic otherwise); ece408's weights are the
    course's and not shipped: random weights of the same shapes where they are not found."""
    try:
        return lk.workload(net, images, tile=True, quiet=True), ""
    except FileNotFoundError as exc:
        wl = lk.workload(net, images, weights=weights_io.random_weights(net, seed=0), tile=True, quiet=True)
        return wl, f"random weights ({str(exc).splitlines()[0][:80]})"


def reference_predictions(wl) -> np.ndarray:
    return reference.predict(reference.forward(wl.net, wl.weights, wl.x))


# ----------------------------------------------------------------------------------------------- 1. whole call

def engine_call(wl, v):
    """The engine's whole call of variant ``v`` on ``wl`` (prepared once here): (prepared, call, got), where each
    call leaves its class probabilities (on the host) in ``got["probs"]``."""
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    got = {}

    def call():
        got["probs"] = engine.forward(wl.net, v, prepared)

    return prepared, call, got


def whole_call(rep: Report, variants: dict, cases, repeat: int, reference_max: int) -> None:
    rows = rep.data["whole_call"] = []  # filled as each case finishes: an error later keeps the earlier ones
    for net, images, name in cases:
        wl, note = workload_for(net, images)
        v = variants[name]
        rep.say(f"whole call: {wl.net.name} {wl.images} images, 09 {name} ({wl.note}{'; ' + note if note else ''})")
        prepared, call, got = engine_call(wl, v)
        kit = summary(lk.measure(call, warmup=2, repeat=repeat).times)
        kit_pred = reference.predict(got["probs"])
        _, passes = engine.time_passes(wl.net, v, prepared, repeat, warmup=False)
        per_layer = {k: 1e3 * s for k, s in engine.median_seconds(passes).items()}
        row = {"net": wl.net.name, "images": wl.images, "variant": f"09 {name}", "workload": wl.note + (
            f"; {note}" if note else ""), "kit_whole_call": kit, "kit_per_layer_ms": per_layer,
               "kit_per_layer_sum_ms": sum(per_layer.values())}
        rows.append(row)
        rep.say(f"  kit   whole call {ms(kit)}; per-layer sum {row['kit_per_layer_sum_ms']:.3f} ms: "
                + ", ".join(f"{layer} {t:.3f}" for layer, t in per_layer.items()))
        if has_torch():
            seconds, cudnn_pred = cudnn.whole_call(wl, repeat, warmup=3)
            row["cudnn_whole_call"] = summary(seconds)
            report, _ = cudnn.time_forward(wl, repeat=repeat)
            row["cudnn_per_layer_ms"] = {k: 1e3 * s for k, s in report.layer_seconds.items()}
            row["kit_vs_cudnn_differing"] = int(np.count_nonzero(kit_pred != cudnn_pred))
            ratio = row["cudnn_whole_call"]["median_ms"] / kit["median_ms"]
            row["cudnn_over_kit"] = ratio
            rep.say(f"  cuDNN whole call {ms(row['cudnn_whole_call'])}: cuDNN / kit {ratio:.2f}; predictions "
                    f"differing from the kit's: {row['kit_vs_cudnn_differing']} of {wl.images}")
        else:
            rep.say("  cuDNN: skipped (no PyTorch with a usable GPU here)")
        if wl.images <= reference_max:
            ref = reference_predictions(wl)
            row["kit_vs_reference_differing"] = int(np.count_nonzero(kit_pred != ref))
            rep.say(f"  predictions differing from the numpy reference's: {row['kit_vs_reference_differing']} "
                    f"of {wl.images}")
            if row["kit_vs_reference_differing"] and not wl.synthetic:  # random inputs may hold near-ties
                rep.fail(f"{wl.net.name} {wl.images}: the kit's predictions differ from the reference's")
        else:
            rep.say(f"  numpy reference left out above {reference_max} images (--reference-max)")
        if wl.labels is not None:
            row["accuracy"] = reference.accuracy(kit_pred, wl.labels)
        gpu.release_buffers()


# ----------------------------------------------------------------------------------------------- 2. fc

def fc_layers(quick: bool) -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """(name, images, weight, bias) of the fc layers worth a GEMM: Fashion's fc1 (20184 -> 160) and the ECE408
    model's fc1 (5184 -> 140) at 10000 images; CIFAR's only fc (320 -> 10) for scale. On the simulator a toy layer
    whose inputs split unevenly and whose images and features end in ragged tiles."""
    rng = np.random.default_rng(24)
    if quick:
        return [("toy 50 -> 13", 19, rng.standard_normal((13, 50)).astype(np.float32),
                 rng.standard_normal(13).astype(np.float32))]
    out = []
    for net, layer, images in (("fashion", "fc1", 10000), ("ece408", "fc1", 10000), ("cifar10", "fc", 50000)):
        try:
            w = weights_io.load_weights(net)
        except FileNotFoundError:
            w = weights_io.random_weights(net, seed=0)
        wt, b = w[f"{layer}.weight"], w[f"{layer}.bias"]
        out.append((f"{net} {layer} ({wt.shape[1]} -> {wt.shape[0]})", images, wt, b))
    return out


def torch_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray, repeat: int) -> tuple[list[float], np.ndarray]:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    xt, wt, bt = (torch.from_numpy(a).cuda() for a in (x, w, b))
    got = {}

    def call():
        got["y"] = F.linear(xt, wt, bt)

    seconds = lk.measure(call, warmup=3, repeat=repeat).times
    y = got["y"].cpu().numpy()
    del xt, wt, bt, got
    torch.cuda.empty_cache()
    return seconds, y


def fc_section(rep: Report, quick: bool, repeat: int) -> None:
    rows = rep.data["fc"] = []
    for name, images, w, b in fc_layers(quick):
        rng = np.random.default_rng(images)
        x = rng.standard_normal((images, w.shape[1]), dtype=np.float32)
        flop = 2.0 * images * w.shape[0] * w.shape[1]
        rep.say(f"fc {name}, {images} images ({flop / 1e9:.1f} GFLOP): float64 reference ...")
        want = x.astype(np.float64) @ w.astype(np.float64).T + b
        xd, wd, bd = cuda.to_device(x), cuda.to_device(w), cuda.to_device(b)
        out = cuda.device_array((images, w.shape[0]), np.float32)
        kit = f"kit lk.gemm.fc_tiles ({gemm.plan(images, w.shape[1], w.shape[0])})"
        protos = fc_prototypes(w.shape[0], quick) if quick or w.shape[0] > kernels.FC_WARP_MAX else \
            [kernels.fc, gemm.fc_tiles]
        for fn in protos:
            label = {kernels.fc: "given lk.kernels.fc", gemm.fc_tiles: kit}.get(fn, getattr(fn, "__name__", ""))
            row = {"layer": name, "images": images, "prototype": label}
            rows.append(row)
            try:  # one prototype that fails to compile or launch must not hide the others
                row["rel_error"] = err = fc_error(fn, xd, wd, bd, out, want)
                if err >= MAX_REL_ERROR:
                    rep.fail(f"fc {name} {label}: relative error {err:.2e} (want < {MAX_REL_ERROR:g})")
                    continue
                s = row["time"] = summary(lk.measure(fn, xd, wd, bd, out, warmup=2, repeat=repeat).times)
            except Exception as exc:  # noqa: BLE001 - recorded and shown
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                rep.fail(f"fc {name} {label}: {row['error']}")
                continue
            row["tflops"] = flop / (s["median_ms"] / 1e3) / 1e12
            rep.say(f"  {label:<60} rel err {err:.1e}  {ms(s)}  {row['tflops']:6.2f} TFLOP/s")
        if has_torch():
            seconds, y = torch_linear(x, w, b, repeat)
            s = summary(seconds)
            err = rel_error(y, want)
            rows.append({"layer": name, "images": images, "prototype": "torch F.linear (cuBLAS)", "rel_error": err,
                         "time": s, "tflops": flop / (s["median_ms"] / 1e3) / 1e12})
            rep.say(f"  {'torch F.linear (cuBLAS, TF32 off)':<60} rel err {err:.1e}  {ms(s)}  "
                    f"{rows[-1]['tflops']:6.2f} TFLOP/s")
        else:
            rep.say("  torch F.linear: skipped (no PyTorch with a usable GPU here)")
        del xd, wd, bd, out
        gpu.release_buffers()


# ----------------------------------------------------------------------------------------------- 3. launch overhead

def launch_overhead(rep: Report, variants: dict, net: str, images: int, name: str, repeat: int) -> None:
    wl, note = workload_for(net, images)
    v = variants[name]
    rep.say(f"launch overhead: {wl.net.name} {wl.images} images, 09 {name} ({wl.note}{'; ' + note if note else ''})")
    prepared, call, got = engine_call(wl, v)
    out = rep.data["launch_overhead"] = {"net": wl.net.name, "images": wl.images, "variant": f"09 {name}"}
    out["engine_whole_call"] = summary(lk.measure(call, warmup=2, repeat=repeat).times)
    ref = reference.predict(got["probs"])
    rep.say(f"  engine as is (numba launches on the default stream, download in the call) "
            f"{ms(out['engine_whole_call'])}")

    lane = streams.lanes(1)[0]
    probs_host = streams.pinned((wl.images, *wl.net.shapes()[wl.net.layers[-1].name]), np.float32)

    def stream_call():  # launches and the download on the lane (inside it), left in flight
        probs = engine.forward(wl.net, v, prepared, download=False, tag="probe graph")
        return gpu.to_host(probs, out=probs_host)

    def stream_whole_call():
        with lane:
            stream_call()
        lane.synchronize()

    out["stream_whole_call"] = summary(lk.measure(stream_whole_call, warmup=2, repeat=repeat).times)
    out["stream_differing"] = int(np.count_nonzero(reference.predict(probs_host) != ref))
    rep.say(f"  one explicit stream, pinned download {ms(out['stream_whole_call'])}; predictions differing from "
            f"the engine's: {out['stream_differing']}")
    if out["stream_differing"]:
        rep.fail("launch overhead: the stream walk's predictions differ from the engine's")
    if not has_cupy():
        rep.say("  CUDA graph: skipped (needs cupy on a GPU)")
        return
    graph = graphs.capture(stream_call, lane)
    probs_host[:] = np.nan

    def graph_whole_call():
        graph.replay()
        lane.synchronize()

    out["graph_whole_call"] = summary(lk.measure(graph_whole_call, warmup=2, repeat=repeat).times)
    out["graph_differing"] = int(np.count_nonzero(reference.predict(probs_host) != ref))
    out["graph_unwritten"] = int(np.count_nonzero(np.isnan(probs_host)))
    rep.say(f"  captured CUDA graph, replayed {ms(out['graph_whole_call'])}; predictions differing from the "
            f"engine's: {out['graph_differing']}, probabilities left unwritten: {out['graph_unwritten']}")
    if out["graph_differing"] or out["graph_unwritten"]:
        rep.fail("launch overhead: the graph replay's predictions differ from the engine's")


#: both libraries' default stream per thread: numba (through CUDA Python's binding) and cupy launch on
#: cudaStreamPerThread, which can be captured; the legacy default stream cannot
PTDS_ENV = {"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}


def ptds_child(net: str, images: int, name: str, repeat: int) -> dict:
    """In a process started with PTDS_ENV: the engine's own walk, unchanged, captured on the per-thread default
    stream with an asynchronous download after it, then replayed; beside the engine's whole call in that process."""
    import cupy

    rt = cupy.cuda.runtime
    ptds = cuda.per_thread_default_stream()
    out = {"cupy_current_stream": int(cupy.cuda.get_current_stream().ptr), "numba_stream": int(ptds.handle)}
    wl, _ = workload_for(net, images)
    v = load_variants()[name]
    prepared, call, got = engine_call(wl, v)
    out["engine_whole_call"] = summary(lk.measure(call, warmup=2, repeat=repeat).times)
    want = reference.predict(got["probs"])
    probs_host = cuda.pinned_array(got["probs"].shape, np.float32)
    cuda.synchronize()
    rt.streamBeginCapture(int(ptds.handle), getattr(rt, "streamCaptureModeRelaxed", 2))
    try:
        with cuda.defer_cleanup():
            probs = engine._layers(wl.net, v, prepared.x, prepared.weights, engine._NoClock(), False)
            probs.copy_to_host(probs_host, stream=ptds)
    finally:
        graph = rt.streamEndCapture(int(ptds.handle))
    exe = rt.graphInstantiate(graph)

    def replay():
        rt.graphLaunch(exe, int(ptds.handle))
        ptds.synchronize()

    out["graph_whole_call"] = summary(lk.measure(replay, warmup=2, repeat=repeat).times)
    out["graph_differing"] = int(np.count_nonzero(reference.predict(probs_host) != want))
    return out


def engine_capture_ptds(rep: Report, net: str, images: int, name: str, repeat: int) -> None:
    """The engine as it is, captured in a child process whose default streams are per-thread (PTDS_ENV)."""
    import os
    import subprocess

    if not has_cupy():
        rep.say("engine captured with per-thread default streams: skipped (needs cupy on a GPU)")
        return
    job = json.dumps({"net": net, "images": images, "name": name, "repeat": repeat})
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--ptds-child", job],
                              env={**os.environ, **PTDS_ENV}, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        rep.say("engine captured with per-thread default streams: the child ran past 240 s")
        rep.data["engine_capture_ptds"] = {"error": "timeout"}
        return
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        result = {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    rep.data["engine_capture_ptds"] = result
    if "error" in result:
        rep.say(f"engine captured with per-thread default streams: failed: {result['error'][:300]}")
        return
    rep.say(f"engine captured with per-thread default streams ({', '.join(PTDS_ENV)}; cupy stream "
            f"{result['cupy_current_stream']}, numba {result['numba_stream']}):")
    rep.say(f"  engine whole call there {ms(result['engine_whole_call'])}; its walk captured and replayed "
            f"{ms(result['graph_whole_call'])}; predictions differing: {result['graph_differing']}")
    if result["graph_differing"]:
        rep.fail("the per-thread-stream graph's predictions differ from the engine's")


def _ptds_child_main(job: str) -> int:
    args = json.loads(job)
    try:
        result = ptds_child(args["net"], args["images"], args["name"], args["repeat"])
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        result = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                  "traceback": traceback.format_exc(limit=6)}
    print(json.dumps(result))
    return 0


def engine_capture_attempt(rep: Report, variants: dict, net: str, images: int, name: str) -> None:
    """Capture the engine's walk as it was before the lanes: cupy's launches on the capturing stream, numba's on
    the legacy default stream (a lane whose numba side is that stream), which a capture on a blocking stream cannot
    take. Run last: a failed capture may leave the context unusable."""
    if not has_cupy():
        rep.say("engine captured as is: skipped (needs cupy on a GPU)")
        return
    wl, _ = workload_for(net, images)
    v = variants[name]
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    engine.forward(wl.net, v, prepared)  # warm: compiled, buffers pooled
    as_is = streams.Lane(cuda.default_stream(), streams.lanes(1)[0].cupy)
    result = {}
    try:
        graph = graphs.capture(lambda: engine.forward(wl.net, v, prepared, download=False, tag="probe as is"), as_is)
        graph.replay()
        as_is.cupy.synchronize()
        result["captured"] = True
        rep.say("engine captured as is: the capture succeeded (check whether the numba launches ran outside it)")
    except Exception as exc:  # noqa: BLE001 - the expected outcome, recorded
        result.update(captured=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        rep.say(f"engine captured as is: failed, as expected: {result['error']}")
    try:
        cuda.synchronize()
        result["context_usable_after"] = True
    except Exception as exc:  # noqa: BLE001
        result["context_usable_after"] = f"{type(exc).__name__}: {exc}"
    rep.data["engine_capture_as_is"] = result


# ----------------------------------------------------------------------------------------------- 4. end to end

def classify_streamed(job: whole.Job, raw_pinned: np.ndarray, classes_pinned: np.ndarray, chunk: int,
                      lanes: list) -> None:
    """Host bytes (pinned) to host classes (pinned) in chunks over several lanes, each chunk's steps (upload,
    classes, download) on its lane: chunk k + 1's upload overlaps chunk k's layers; each lane has its own
    buffers. Then every lane synchronized."""
    bounds = list(range(0, raw_pinned.shape[0], chunk)) + [raw_pinned.shape[0]]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        lane = lanes[k % len(lanes)]
        job.download(lane, job.classes(lane, job.upload(lane, raw_pinned[a:b]), b - a), classes_pinned[a:b])
    for lane in lanes:
        lane.synchronize()


def end_to_end(rep: Report, variants: dict, images: int, name: str, configs, repeat: int) -> None:
    wl, _ = workload_for("cifar10", 1)  # the net (shrunk on the simulator) and its weights
    net, v = wl.net, variants[name]
    raw = np.random.default_rng(50000).integers(0, 256, (images, *net.input_shape), dtype=np.uint8)
    rep.say(f"end to end: {images} random CIFAR-shaped images ({raw.nbytes / 1e6:.1f} MB of uint8) -> classes, "
            f"09 {name}, normalised on the device as lk.data.to_input does (byte/255 - 0.5)")
    job = whole.Job(net, v, wl.weights)
    out = rep.data["end_to_end"] = {"images": images, "uint8_bytes": int(raw.nbytes), "variant": f"09 {name}",
                                    "net": net.name}
    got = {}

    def serial():
        got["serial"] = job.serial(raw)

    out["serial"] = summary(lk.measure(serial, warmup=1, repeat=repeat).times)
    truth = got["serial"]
    want = reference.predict(reference.forward(net, wl.weights, lk.data.to_input("cifar10", raw))) \
        if images <= 2000 else None  # the reference on the host: the toy sizes only (the GPU run has section 1's)
    if want is not None and not np.array_equal(truth, want):
        rep.fail("end to end: the serial path's classes differ from the numpy reference's")
    rep.say(f"  serial (Job.serial: pageable upload, forward, classes on the device, int32 down) {ms(out['serial'])}")
    raw_pinned = streams.pinned(raw.shape, np.uint8)
    raw_pinned[:] = raw
    classes_pinned = streams.pinned((images,), np.int32)
    out["streamed"] = []
    for chunk, count in configs:
        lanes = job.lanes(count)
        classes_pinned[:] = -1

        def streamed():
            classify_streamed(job, raw_pinned, classes_pinned, chunk, lanes)

        s = summary(lk.measure(streamed, warmup=1, repeat=repeat).times)
        differing = int(np.count_nonzero(classes_pinned != truth))
        out["streamed"].append({"chunk": chunk, "streams": count, "time": s, "differing_from_serial": differing})
        rep.say(f"  pinned, chunks of {chunk} over {count} stream(s) {ms(s)}; classes differing from the "
                f"serial path's: {differing} of {images}")
        if differing:
            rep.fail(f"end to end: chunks of {chunk} over {count} streams give other classes than the serial path")
        gpu.release_buffers()


# ----------------------------------------------------------------------------------------------- main

FULL = {"cases": [("cifar10", 50000, "tuned_cifar10"), ("cifar10", 1200, "tuned_cifar10"),
                  ("fashion", 10000, "tuned_fashion"), ("ece408", 10000, "tuned_fashion")],
        "repeat": 15, "fc_repeat": 20, "graph": ("cifar10", 1200, "tuned_cifar10"),
        "e2e_images": 50000, "e2e_configs": [(50000, 1), (10000, 2), (5000, 2), (5000, 4), (12500, 4)],
        "e2e_repeat": 7}
QUICK = {"cases": [("cifar10", 3, "tuned_cifar10"), ("fashion", 2, "tuned_fashion")],
         "repeat": 2, "fc_repeat": 2, "graph": ("cifar10", 3, "tuned_cifar10"),
         "e2e_images": 5, "e2e_configs": [(5, 1), (2, 2)], "e2e_repeat": 1}
SECTIONS = ("1", "2", "3", "4")


def closing_summary(data: dict) -> list[str]:
    """The figures issue 24 asks about, one line each: whole calls against cuDNN, the fastest correct fc of each
    layer against cuBLAS, the 1200-image call with and without a graph, host bytes to host classes."""
    lines = ["", "summary (medians)"]
    for r in data.get("whole_call", []):
        cud = r.get("cudnn_whole_call")
        lines.append(f"  whole call {r['net']:>8} {r['images']:>6}: kit {r['kit_whole_call']['median_ms']:.3f} ms "
                     f"(per-layer sum {r['kit_per_layer_sum_ms']:.3f})"
                     + (f", cuDNN {cud['median_ms']:.3f} ms, ratio {r['cudnn_over_kit']:.2f}" if cud else ""))
    for layer in dict.fromkeys(r["layer"] for r in data.get("fc", [])):
        timed = [r for r in data["fc"] if r["layer"] == layer and "time" in r]
        ours = [r for r in timed if not r["prototype"].startswith("torch")]
        best = min(ours, key=lambda r: r["time"]["median_ms"], default=None)
        given = next((r for r in ours if r["prototype"].startswith("given")), None)
        blas = next((r for r in timed if r["prototype"].startswith("torch")), None)
        parts = [f"given {given['time']['median_ms']:.3f} ms" if given else "",
                 f"fastest {best['prototype']} {best['time']['median_ms']:.3f} ms" if best else "",
                 f"cuBLAS {blas['time']['median_ms']:.3f} ms" if blas else ""]
        lines.append(f"  fc {layer}: " + "; ".join(p for p in parts if p))
    lo = data.get("launch_overhead", {})
    if lo:
        lines.append("  launch overhead: " + "; ".join(f"{k.removesuffix('_whole_call')} {lo[k]['median_ms']:.3f} ms"
                                                         for k in ("engine_whole_call", "stream_whole_call",
                                                                   "graph_whole_call") if k in lo))
    pt = data.get("engine_capture_ptds", {})
    if "graph_whole_call" in pt:
        lines.append(f"  engine as is, per-thread default streams: call {pt['engine_whole_call']['median_ms']:.3f} ms,"
                     f" its graph {pt['graph_whole_call']['median_ms']:.3f} ms")
    e2e = data.get("end_to_end", {})
    if "serial" in e2e:
        best = min(e2e.get("streamed", []), key=lambda r: r["time"]["median_ms"], default=None)
        lines.append(f"  end to end {e2e['images']} images: serial {e2e['serial']['median_ms']:.3f} ms" + (
            f"; best streamed (chunks of {best['chunk']}, {best['streams']} streams) {best['time']['median_ms']:.3f} ms"
            if best else ""))
    return lines


def versions() -> dict:
    out = {"labkit": lk.__version__, "numpy": np.__version__}
    for mod in ("numba", "numba_cuda", "cupy", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent or broken: say so
            out[mod] = None
    return out


def parse(argv) -> argparse.Namespace:
    import os

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for whole_job_probe.json/.txt "
                   "(default: $OUT)")
    p.add_argument("--quick", action="store_true", help="toy sizes (the CUDA simulator's correctness run)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="which of 1,2,3,4 to run (default: all)")
    p.add_argument("--reference-max", type=int, default=10000, help="compare with the numpy reference up to this "
                   "many images (above: with cuDNN only)")
    args = p.parse_args(argv)
    if not args.out:
        p.exit(2, "whole_job_probe: no output folder: pass --out FOLDER (or set OUT)\n")
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        p.exit(2, f"whole_job_probe: unknown section(s) {', '.join(bad)}: choose from {', '.join(SECTIONS)}\n")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ptds-child"]:
        return _ptds_child_main(argv[1])
    args = parse(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"whole_job_probe: cannot create {out}: {exc.strerror}; pass another --out", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    rep = Report()
    rep.data["meta"] = {"device": device.label(), "simulated": device.info().simulated, "quick": args.quick,
                        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                        "command": " ".join(["python3", "tools/whole_job_probe.py", *argv]),
                        "versions": versions()}
    rep.say(f"whole_job_probe on {device.label()}{' (quick)' if args.quick else ''}, sections {args.sections}")
    if device.info().kind != "gpu" and not args.quick:
        rep.say("no GPU here: the timings mean nothing; --quick runs the correctness paths at toy sizes")
    variants = load_variants()
    for net, images in (("cifar10", 50000), ("fashion", 10000)):  # what the tuned variants run here
        kept = lk.tune.stored(net, images)
        rep.data["meta"][f"tuned_{net}"] = kept and {"device": kept["device"], "choice": kept["choice"]}
        rep.say(f"tuned_{net}: " + (f"{kept['device']}'s choice {kept['choice']}" if kept else
                                    "no committed choice: the pooled kernel in every conv layer"))
    errors = {}
    jobs = [("1", "whole_call", lambda: whole_call(rep, variants, plan["cases"], plan["repeat"], args.reference_max)),
            ("2", "fc", lambda: fc_section(rep, args.quick, plan["fc_repeat"])),
            ("4", "end_to_end", lambda: end_to_end(rep, variants, plan["e2e_images"], "tuned_cifar10",
                                                   plan["e2e_configs"], plan["e2e_repeat"])),
            ("3", "launch_overhead", lambda: launch_overhead(rep, variants, *plan["graph"], plan["repeat"])),
            ("3", "engine_capture_ptds", lambda: engine_capture_ptds(rep, *plan["graph"], plan["repeat"])),
            ("3", "engine_capture_as_is", lambda: engine_capture_attempt(rep, variants, *plan["graph"]))]
    for section, name, job in jobs:  # section 3 last: its capture of the engine as is may break the context
        if section not in args.sections:
            continue
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others' results
            errors[name] = traceback.format_exc(limit=6)
            rep.say(f"{name}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            try:
                gpu.release_buffers()
            except Exception as exc:  # noqa: BLE001 - a context broken by the last section: keep the results
                rep.say(f"{name}: releasing buffers failed afterwards: {type(exc).__name__}")
    rep.data["errors"] = errors
    rep.data["check_failures"] = rep.failures
    try:
        for line in closing_summary(rep.data):
            rep.say(line)
    except Exception as exc:  # noqa: BLE001 - the summary is a convenience; the results are in the JSON
        rep.say(f"summary: {type(exc).__name__}: {exc}")
    rep.say(f"done: {len(rep.failures)} check failure(s), {len(errors)} section error(s)")
    (out / "whole_job_probe.json").write_text(json.dumps(rep.data, indent=1, default=str) + "\n")
    (out / "whole_job_probe.txt").write_text("\n".join(rep.lines) + "\n" + "".join(
        f"\n--- {name}\n{tb}" for name, tb in errors.items()))
    print(f"wrote {out / 'whole_job_probe.json'} and whole_job_probe.txt")
    return 1 if rep.failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
