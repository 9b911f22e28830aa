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
skips, one line each, what needs cupy or PyTorch. The prototypes live here until stage 10 takes them.

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import cudnn, device, engine, gpu, kernels, layers, nbcells, reference, upload, weights_io  # noqa: E402

from numba import cuda, float32  # noqa: E402

SOLUTION_09 = REPO / "solutions" / "09_per_layer_tuning.ipynb"
MAX_REL_ERROR = 1e-4
#: unsigned indices in the fc tiles' loops: numba then leaves out its negative-index wraparound, which took a third
#: of the registers (ptxas, sm_90: 166 -> 128 for the 8 x 10 tile, 160 -> 88 for 4 x 10, no spills)
U = np.uint64


# ----------------------------------------------------------------------------------------------- fc prototypes

def make_fc_gemm(BM: int, BN: int, TM: int, TN: int, BK: int = 16, mode: str = "store", regs: int = 0):
    """out = x @ w.T + b as a register-tiled GEMM: a block computes BM images x BN features over the K range of its
    grid z (split-K), stages BK-wide slices of both operands in shared memory, and each thread keeps TM x TN sums,
    multiplying TM inputs by TN weights read once per step into registers (the given kernel reads shared memory per
    multiply-add). ``mode``: "store" (one split, bias added), "atomic" (sums added into an output holding the bias),
    "partial" (each split's sums into its own plane, ``sum_splits`` adds them up). ``regs``: a register cap per
    thread (numba's ``max_registers``; 0: none), so that two blocks of 256 threads fit on an SM."""
    if mode not in ("store", "atomic", "partial"):
        raise ValueError(f"mode must be store, atomic or partial, not {mode!r}")
    if BM % TM or BN % TN:
        raise ValueError(f"tile {BM}x{BN} is not a whole number of {TM}x{TN} thread tiles")
    TX, TY = BN // TN, BM // TM  # threads along features, along images
    NT = TX * TY
    if NT % BK:
        raise ValueError(f"{NT} threads do not load whole rows of {BK} inputs")
    RSTEP = NT // BK  # rows of a slice the block loads per pass: each thread one input column, fixed per thread
    XPASS, WPASS = -(-BM // RSTEP), -(-BN // RSTEP)  # constant trip counts: unrolled, no division per element
    XC, WC = BM + 1, BN + 1  # padded rows: the transposing stores miss no bank
    ATOMIC, PARTIAL = mode == "atomic", mode == "partial"
    jit = cuda.jit(max_registers=regs) if regs and not lk.simulator.active() else cuda.jit  # the simulator: no cap

    @jit
    def fc_gemm(x, w, b, dst, kchunk):
        N, IN = x.shape
        OUT = w.shape[0]
        xs = cuda.shared.array((BK, XC), float32)  # [k][image]
        ws = cuda.shared.array((BK, WC), float32)  # [k][feature]
        acc = cuda.local.array((TM, TN), float32)
        xv = cuda.local.array(TM, float32)
        wv = cuda.local.array(TN, float32)
        t = cuda.threadIdx.x
        tx, ty = t % TX, t // TX
        lc, lr = t % BK, t // BK  # the input column this thread loads, its first row
        n0, o0, z = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN, cuda.blockIdx.z
        kbeg = z * kchunk
        kend = min(IN, kbeg + kchunk)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)
        for k0 in range(kbeg, kend, BK):
            k = k0 + lc
            for q in range(XPASS):
                r = lr + q * RSTEP
                if r < BM:
                    xs[U(lc), U(r)] = x[U(n0 + r), U(k)] if n0 + r < N and k < kend else float32(0.0)
            for q in range(WPASS):
                r = lr + q * RSTEP
                if r < BN:
                    ws[U(lc), U(r)] = w[U(o0 + r), U(k)] if o0 + r < OUT and k < kend else float32(0.0)
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    xv[i] = xs[U(kk), U(ty + i * TY)]
                for j in range(TN):
                    wv[j] = ws[U(kk), U(tx + j * TX)]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += xv[i] * wv[j]
            cuda.syncthreads()
        for i in range(TM):
            n = n0 + ty + i * TY
            for j in range(TN):
                o = o0 + tx + j * TX
                if n < N and o < OUT:
                    if ATOMIC:
                        cuda.atomic.add(dst, (0, n, o), acc[i, j])
                    elif PARTIAL:
                        dst[z, n, o] = acc[i, j]
                    else:
                        dst[0, n, o] = acc[i, j] + b[o]

    fc_gemm.tile = (BM, BN, NT, BK)
    return fc_gemm


@cuda.jit
def fill_bias(b, out):
    t = cuda.grid(1)
    if t < out.size:
        out[t // b.size, t % b.size] = b[t % b.size]


@cuda.jit
def sum_splits(part, b, out):
    S, N, OUT = part.shape
    t = cuda.grid(1)
    if t < N * OUT:
        n, o = t // OUT, t % OUT
        s = b[o]
        for z in range(S):
            s += part[z, n, o]
        out[n, o] = s


_GEMMS: dict = {}


def _gemm(BM, BN, TM, TN, BK, mode, regs=0):
    key = (BM, BN, TM, TN, BK, mode, regs)
    if key not in _GEMMS:
        _GEMMS[key] = make_fc_gemm(*key)
    return _GEMMS[key]


def k_chunk(inputs: int, splits: int, bk: int) -> int:
    """Inputs per split, a whole number of BK steps (the last split takes what is left, maybe nothing)."""
    per = -(-inputs // splits)
    return -(-per // bk) * bk


def _launch_gemm(kernel, x, w, b, dst, splits: int):
    BM, BN, NT, BK = kernel.tile
    N, IN = x.shape
    grid = (gpu.blocks(N, BM), gpu.blocks(w.shape[0], BN), splits)
    gpu.launch_grid(kernel, grid, NT, x, w, b, dst, k_chunk(IN, splits, BK))


def fc_tiles(BM, BN, TM, TN, BK=16, regs=0):
    """(b) Bigger register tiles, one launch: more multiply-adds per shared-memory read than the given 4 x 4."""
    kernel = _gemm(BM, BN, TM, TN, BK, "store", regs)

    def fc(x, w, b, out):
        _launch_gemm(kernel, x, w, b, out.reshape(1, *out.shape), 1)

    fc.__name__ = f"tiles {BM}x{BN} ({TM}x{TN}, BK {BK}{f', regs {regs}' if regs else ''})"
    return fc


def fc_split_atomic(BM, BN, TM, TN, splits, BK=16):
    """(c) split-K with atomics: few tiles (79 at 10000 images) become ``splits`` times as many blocks, each adding
    its share of the inputs into an output pre-filled with the bias."""
    kernel = _gemm(BM, BN, TM, TN, BK, "atomic")

    def fc(x, w, b, out):
        gpu.launch(fill_bias, out.size, b, out)
        _launch_gemm(kernel, x, w, b, out.reshape(1, *out.shape), splits)

    fc.__name__ = f"split-K {splits} atomic, tiles {BM}x{BN} ({TM}x{TN}, BK {BK})"
    return fc


def fc_split_reduce(BM, BN, TM, TN, splits, BK=16, regs=0):
    """(c) split-K with partial sums: each split writes its own plane, a second small kernel adds the planes and
    the bias (no atomics, the same order every run)."""
    kernel = _gemm(BM, BN, TM, TN, BK, "partial", regs)

    def fc(x, w, b, out):
        part = gpu.buffer("probe fc split-K parts", (splits, *out.shape))
        _launch_gemm(kernel, x, w, b, part, splits)
        gpu.launch(sum_splits, out.size, part, b, out)

    fc.__name__ = f"split-K {splits} reduce, tiles {BM}x{BN} ({TM}x{TN}, BK {BK}{f', regs {regs}' if regs else ''})"
    return fc


def fc_prototypes(features: int, quick: bool) -> list:
    """The given kernel and the prototypes for a layer of ``features`` outputs: tiles whose feature width covers
    the layer in one or two tiles (160 = 16 x 10, 140 = 14 x 10), and split-K over those tiles."""
    if quick:  # simulator: a handful of threads per block, the same code paths (ragged tiles, uneven K splits;
        # 6 x 12 tiles of 8 threads load 4 rows of 2 inputs per pass: the second pass runs 2 rows past the tile)
        tile = (8, 10, 2, 5, 8)
        return [kernels.fc, fc_tiles(*tile), fc_split_atomic(*tile[:4], 3, BK=8),
                fc_split_reduce(*tile[:4], 3, BK=8), fc_split_reduce(*tile[:4], 7, BK=8),
                fc_tiles(6, 12, 3, 3, 2), fc_split_atomic(6, 12, 3, 3, 4, BK=2)]
    protos = [kernels.fc]
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

def time_calls(fn, repeat: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``repeat`` calls after ``warmup`` (CUDA events on the default stream around the whole
    call on a GPU, ``perf_counter`` elsewhere: ``lk.Timer``)."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeat):
        with lk.Timer() as t:
            fn()
        seconds.append(t.seconds)
    return seconds


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


# ----------------------------------------------------------------------------------------------- streams

def has_cupy() -> bool:
    return device.info().kind == "gpu" and bool(device.info().cupy)


def has_torch() -> bool:
    return cudnn.available()


@dataclass
class Lane:
    """One stream for both libraries: cupy launches (stage 09's CUDA C convs) and numba launches (the kit's layers,
    copies) queue on it in order. On the simulator a numba stream alone (CUDA C runs on the CPU emulation, in
    call order)."""

    cupy: object
    numba: object

    @contextmanager
    def launching(self):
        """Every launch inside goes to this stream: cupy's through its current stream, numba's by handing the
        stream to ``lk.gpu.launch_grid`` (the engine passes none today; this is what gpu.py would need)."""
        plain = gpu.launch_grid

        def on_stream(kernel, grid, block, *args, shared_bytes: int = 0):
            return kernel[grid, block, self.numba, shared_bytes](*args)

        gpu.launch_grid = on_stream
        try:
            with self.cupy if self.cupy is not None else nullcontext():
                yield
        finally:
            gpu.launch_grid = plain

    def synchronize(self) -> None:
        self.numba.synchronize()


def make_lanes(count: int) -> list[Lane]:
    if has_cupy():
        import cupy

        lanes = []
        for _ in range(count):
            s = cupy.cuda.Stream(non_blocking=False)  # blocking: events on the default stream bracket its work
            lanes.append(Lane(s, cuda.external_stream(s.ptr)))
        return lanes
    return [Lane(None, cuda.stream()) for _ in range(count)]


def forward_on(lane: Lane, net, variant, x, weights: dict, tag: str):
    """The engine's walk over the layers (fused groups, flatten as a reshape) into pooled buffers, every launch on
    ``lane``, no download: the shape of forward a CUDA graph can capture and streams can overlap."""
    y = x
    with lane.launching():
        for group in layers.groups(list(net.layers), variant.fuse):
            layer = group[0]
            if layer.kind == "flatten":
                y = y.reshape(y.shape[0], int(np.prod(y.shape[1:])))
                continue
            fn = layers.impl_for(variant.impls, layer)
            out = gpu.buffer(f"probe {tag} {group[-1].name}", layers.group_output_shape(group, y.shape, weights))
            fn(*(layers.fused_args(group, y, weights, out) if len(group) > 1 else layers.args(layer, y, weights, out)))
            y = out
    return y


@cuda.jit
def argmax_rows(p, classes):
    n = cuda.grid(1)
    if n < p.shape[0]:
        best, k = p[n, 0], 0
        for j in range(1, p.shape[1]):
            if p[n, j] > best:  # strict: the first of equal maxima, as numpy's argmax
                best, k = p[n, j], j
        classes[n] = k


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

def cudnn_whole_call(wl, repeat: int) -> tuple[list[float], np.ndarray]:
    """cuDNN through PyTorch (fp32, TF32 off) on the same weights and inputs, timed as the kit's call is: the same
    events around every layer and the download of the class probabilities."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    weights = {k: torch.from_numpy(v).to(dev) for k, v in wl.weights.items()}
    fns = [cudnn._layer_fn(layer, weights) for layer in wl.net.layers]
    x = torch.from_numpy(np.ascontiguousarray(wl.x)).to(dev)
    got = {}

    def call():
        y = x
        for fn in fns:
            y = fn(y)
        got["probs"] = y.cpu().numpy()

    with torch.inference_mode():
        seconds = time_calls(call, repeat, warmup=3)
    del x, weights
    torch.cuda.empty_cache()
    return seconds, reference.predict(got["probs"])


def whole_call(rep: Report, variants: dict, cases, repeat: int, reference_max: int) -> None:
    rows = rep.data["whole_call"] = []  # filled as each case finishes: an error later keeps the earlier ones
    for net, images, name in cases:
        wl, note = workload_for(net, images)
        v = variants[name]
        rep.say(f"whole call: {wl.net.name} {wl.images} images, 09 {name} ({wl.note}{'; ' + note if note else ''})")
        prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
        got = {}

        def call():
            got["probs"] = engine.forward(wl.net, v, prepared)

        kit = summary(time_calls(call, repeat, warmup=2))
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
            seconds, cudnn_pred = cudnn_whole_call(wl, repeat)
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

    seconds = time_calls(call, repeat, warmup=3)
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
        for fn in fc_prototypes(w.shape[0], quick) if (quick or w.shape[0] > kernels.FC_WARP_MAX) else [kernels.fc]:
            label = "given lk.kernels.fc" if fn is kernels.fc else fn.__name__
            row = {"layer": name, "images": images, "prototype": label}
            rows.append(row)
            try:  # one prototype that fails to compile or launch must not hide the others
                row["rel_error"] = err = fc_error(fn, xd, wd, bd, out, want)
                if err >= MAX_REL_ERROR:
                    rep.fail(f"fc {name} {label}: relative error {err:.2e} (want < {MAX_REL_ERROR:g})")
                    continue
                s = row["time"] = summary(time_calls(lambda: fn(xd, wd, bd, out), repeat))
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

ENGINE_NEEDS = ("a current stream in lk.gpu (launch_grid handing it to numba as cuda.external_stream, launch_raw "
                "launching under the matching cupy stream), the download out of engine.forward (or an asynchronous "
                "copy into pinned memory on that stream), and every buffer allocated before the capture (the pool "
                "does after one warm call)")


def capture(lane: Lane, fn):
    """``fn``'s launches and copies recorded once on the lane's stream into a CUDA graph (cupy): a replay is one
    launch for the whole forward."""
    import cupy

    mode = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
    try:
        lane.cupy.begin_capture(mode)  # relaxed: nothing else in the process is capturing
    except TypeError:  # a cupy whose begin_capture takes no mode
        lane.cupy.begin_capture()
    try:
        with cuda.defer_cleanup():  # no numba frees while capturing
            fn()
    except BaseException:
        try:
            lane.cupy.end_capture()
        except Exception:  # noqa: BLE001 - the capture is broken already; the first error is the one to see
            pass
        raise
    return lane.cupy.end_capture()


def launch_overhead(rep: Report, variants: dict, net: str, images: int, name: str, repeat: int) -> None:
    wl, note = workload_for(net, images)
    v = variants[name]
    rep.say(f"launch overhead: {wl.net.name} {wl.images} images, 09 {name} ({wl.note}{'; ' + note if note else ''})")
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    got = {}

    def engine_call():
        got["engine"] = engine.forward(wl.net, v, prepared)

    out = rep.data["launch_overhead"] = {"net": wl.net.name, "images": wl.images, "variant": f"09 {name}"}
    out["engine_whole_call"] = summary(time_calls(engine_call, repeat, warmup=2))
    ref = reference.predict(got["engine"])
    rep.say(f"  engine as is (numba launches on the default stream, download in the call) "
            f"{ms(out['engine_whole_call'])}")

    lane = make_lanes(1)[0]
    probs_host = cuda.pinned_array((wl.images, *wl.net.shapes()[wl.net.layers[-1].name]), np.float32)

    def stream_call():  # launches and the download on one stream, then one wait
        probs = forward_on(lane, wl.net, v, prepared.x, prepared.weights, "graph")
        probs.copy_to_host(probs_host, stream=lane.numba)

    def stream_whole_call():
        stream_call()
        lane.synchronize()

    out["stream_whole_call"] = summary(time_calls(stream_whole_call, repeat, warmup=2))
    out["stream_differing"] = int(np.count_nonzero(reference.predict(probs_host) != ref))
    rep.say(f"  one explicit stream, pinned download {ms(out['stream_whole_call'])}; predictions differing from "
            f"the engine's: {out['stream_differing']}")
    if out["stream_differing"]:
        rep.fail("launch overhead: the stream walk's predictions differ from the engine's")
    if not has_cupy():
        rep.say("  CUDA graph: skipped (needs cupy on a GPU)")
        return
    probs_host[:] = np.nan
    graph = capture(lane, stream_call)

    def graph_whole_call():
        graph.launch(lane.cupy)
        lane.synchronize()

    out["graph_whole_call"] = summary(time_calls(graph_whole_call, repeat, warmup=2))
    out["graph_differing"] = int(np.count_nonzero(reference.predict(probs_host) != ref))
    out["graph_unwritten"] = int(np.count_nonzero(np.isnan(probs_host)))
    rep.say(f"  captured CUDA graph, replayed {ms(out['graph_whole_call'])}; predictions differing from the "
            f"engine's: {out['graph_differing']}, probabilities left unwritten: {out['graph_unwritten']}")
    if out["graph_differing"] or out["graph_unwritten"]:
        rep.fail("launch overhead: the graph replay's predictions differ from the engine's")
    out["engine_would_need"] = ENGINE_NEEDS
    rep.say(f"  what the engine would need for a graph: {ENGINE_NEEDS}")


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
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    got = {}

    def engine_call():
        got["engine"] = engine.forward(wl.net, v, prepared)

    out["engine_whole_call"] = summary(time_calls(engine_call, repeat, warmup=2))
    want = reference.predict(got["engine"])
    probs_host = cuda.pinned_array(got["engine"].shape, np.float32)
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

    out["graph_whole_call"] = summary(time_calls(replay, repeat, warmup=2))
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
    """Capture the engine's own walk as it is on a cupy stream: its numba launches go to the legacy default stream,
    which a capture on a blocking stream cannot take. Run last: a failed capture may leave the context unusable."""
    if not has_cupy():
        rep.say("engine captured as is: skipped (needs cupy on a GPU)")
        return
    wl, _ = workload_for(net, images)
    v = variants[name]
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    engine.forward(wl.net, v, prepared)  # warm: compiled, buffers pooled
    lane = make_lanes(1)[0]
    result = {}

    def engine_walk():  # the engine's own walk, cupy's launches on the capturing stream, numba's where they go
        with lane.cupy:
            engine._layers(wl.net, v, prepared.x, prepared.weights, engine._NoClock(), False)

    try:
        graph = capture(lane, engine_walk)
        graph.launch(lane.cupy)
        lane.cupy.synchronize()
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

def classify_serial(net, variant, weights, raw: np.ndarray, lut) -> np.ndarray:
    """The kit's end-to-end path today (labkit.upload's bytes path): every byte up from pageable memory into a
    pooled buffer, normalised on the device, the engine's forward with its probabilities download, argmax on the
    host."""
    rd = gpu.buffer("probe serial bytes", (raw.size,), np.uint8)
    gpu.to_device(raw.reshape(-1), to=rd)
    x = gpu.buffer("probe serial input", raw.shape)
    gpu.launch(upload.bytes_to_input, raw.size, rd, lut, gpu.flat(x))
    return reference.predict(engine.forward(net, variant, engine.Prepared(x, weights)))


def classify_streamed(net, variant, weights, raw_pinned: np.ndarray, classes_pinned: np.ndarray, lut,
                      chunk: int, lanes: list[Lane]) -> None:
    """Host bytes (pinned) to host classes (pinned) in chunks over several streams: chunk k + 1's upload overlaps
    chunk k's layers; each lane has its own buffers, so chunks on different lanes never share one."""
    per_image = int(np.prod(raw_pinned.shape[1:]))
    for k, start in enumerate(range(0, raw_pinned.shape[0], chunk)):
        i = k % len(lanes)
        lane, n = lanes[i], min(chunk, raw_pinned.shape[0] - start)
        rd = gpu.buffer(f"probe lane{i} bytes", (n * per_image,), np.uint8)
        x = gpu.buffer(f"probe lane{i} input", (n, *raw_pinned.shape[1:]))
        classes = gpu.buffer(f"probe lane{i} classes", (n,), np.int32)
        rd.copy_to_device(raw_pinned[start:start + n].reshape(-1), stream=lane.numba)
        with lane.launching():
            gpu.launch(upload.bytes_to_input, n * per_image, rd, lut, gpu.flat(x))
        probs = forward_on(lane, net, variant, x, weights, f"lane{i}")
        with lane.launching():
            gpu.launch(argmax_rows, n, probs, classes)
        classes.copy_to_host(classes_pinned[start:start + n], stream=lane.numba)
    for lane in lanes:
        lane.synchronize()


def end_to_end(rep: Report, variants: dict, images: int, name: str, configs, repeat: int) -> None:
    wl, _ = workload_for("cifar10", 1)  # the net (shrunk on the simulator) and its weights
    net, v = wl.net, variants[name]
    raw = np.random.default_rng(50000).integers(0, 256, (images, *net.input_shape), dtype=np.uint8)
    rep.say(f"end to end: {images} random CIFAR-shaped images ({raw.nbytes / 1e6:.1f} MB of uint8) -> classes, "
            f"09 {name}, normalised on the device as lk.data.to_input does (byte/255 - 0.5)")
    weights = engine.prepare(net, v, wl.x[:1], wl.weights).weights
    lut = cuda.to_device(lk.data._CIFAR_LUT)
    out = rep.data["end_to_end"] = {"images": images, "uint8_bytes": int(raw.nbytes), "variant": f"09 {name}",
                                    "net": net.name}
    got = {}

    def serial():
        got["serial"] = classify_serial(net, v, weights, raw, lut)

    out["serial"] = summary(time_calls(serial, repeat, warmup=1))
    truth = got["serial"]
    want = reference.predict(reference.forward(net, wl.weights, lk.data.to_input("cifar10", raw))) \
        if images <= 2000 else None  # the reference on the host: the toy sizes only (the GPU run has section 1's)
    if want is not None and not np.array_equal(truth, want):
        rep.fail("end to end: the serial path's classes differ from the numpy reference's")
    rep.say(f"  serial (pageable upload, forward, probabilities down, argmax on the host) {ms(out['serial'])}")
    raw_pinned = cuda.pinned_array(raw.shape, np.uint8)
    raw_pinned[:] = raw
    classes_pinned = cuda.pinned_array((images,), np.int32)
    out["streamed"] = []
    for chunk, streams in configs:
        lanes = make_lanes(streams)
        classes_pinned[:] = -1

        def streamed():
            classify_streamed(net, v, weights, raw_pinned, classes_pinned, lut, chunk, lanes)

        s = summary(time_calls(streamed, repeat, warmup=1))
        differing = int(np.count_nonzero(classes_pinned != truth))
        out["streamed"].append({"chunk": chunk, "streams": streams, "time": s, "differing_from_serial": differing})
        rep.say(f"  pinned, chunks of {chunk} over {streams} stream(s) {ms(s)}; classes differing from the "
                f"serial path's: {differing} of {images}")
        if differing:
            rep.fail(f"end to end: chunks of {chunk} over {streams} streams give other classes than the serial path")
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
