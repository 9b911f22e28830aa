"""The steps of stage 09's register-tile kernel, each checked on its own.

Stage 09's register-tile kernel (``TILES_SOURCE``, CUDA C) is written as four steps, each a ``__device__`` function:
(a) ``load_window``, (b) ``add_channel``, (c) ``stage_weights`` and ``sum_channels``, (d) ``store_tile``. A student
should see each step pass before writing the next, so every function gets a harness kernel of its own (below),
compiled together with the student's source on small shapes chosen to reach the edges (padding, a tile that
overhangs the map, several map groups, every weight-vector width), and compared with numpy. A step whose function
is still the TODO stub says so; ``sum_channels`` is checked once the steps it calls pass.

CUDA C runs through cupy on a GPU, else on the CPU emulation (``labkit.cudacpu``: the lines say so); where neither
can (``labkit.stages.unavailable``) the steps are skipped, in one line.
"""

from __future__ import annotations

import re

import numpy as np

from ..core.check import CheckResult, compare
from ..course import tasks
from ..course.stages import STUB_MARK, unavailable
from ..launch import gpu
from ..launch.cudacpu import LABEL

#: (step, function) in the order a student writes them, as the task declares them; sum_channels calls the two
#: before it
STEPS = tasks.find("09", "tiles").step_names
NEEDS = {"sum_channels": ("load_window", "add_channel")}

HARNESS = r"""
extern "C" {
// each harness copies through one flat index k, so that no line of it is a line of the kernel's steps
#if WSHARED  // the harnesses' weights: given already laid out [c][p][q][m] (shared), or in c_w (constant)
#define STEP_WEIGHTS(wl) __shared__ wvec ws[C * K * K * MG / VEC]; \
    for (int k = threadIdx.x; k < C * K * K * MG; k += blockDim.x) ws[k / VEC].v[k % VEC] = wl[k]; \
    __syncthreads();
#else
#define STEP_WEIGHTS(wl) const wvec* ws = nullptr;
#endif
#define SUMS (MG * TR * TC)
#define GET_SUMS(src) for (int k = 0; k < SUMS; ++k) acc[k / (TR * TC)][k / TC % TR][k % TC] = src[t * SUMS + k];
#define PUT_SUMS(dst) for (int k = 0; k < SUMS; ++k) dst[t * SUMS + k] = acc[k / (TR * TC)][k / TC % TR][k % TC];

__global__ void step_load_window(const float* x, const int* corners, float* out, int count) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    float v[WR][WC];
    load_window(x, corners[2 * t], corners[2 * t + 1], v);
    for (int k = 0; k < WR * WC; ++k) out[t * WR * WC + k] = v[k / WC][k % WC];
}

__global__ void step_add_channel(const float* windows, const float* wl, float* sums, int c, int count) {
    STEP_WEIGHTS(wl)
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    float win[WR][WC], acc[MG][TR][TC];
    for (int k = 0; k < WR * WC; ++k) win[k / WC][k % WC] = windows[t * WR * WC + k];
    GET_SUMS(sums)
    wvec wv;
    add_channel(win, ws, c, wv, acc);
    PUT_SUMS(sums)
}

__global__ void step_stage_weights(const float* w, float* out, int m0) {
#if WSHARED
    __shared__ wvec ws[C * K * K * MG / VEC];
    stage_weights(w, m0, ws);
    __syncthreads();
    for (int k = threadIdx.x; k < C * K * K * MG; k += blockDim.x) out[k] = ws[k / VEC].v[k % VEC];
#endif
}

__global__ void step_sum_channels(const float* x, const float* wl, const int* corners, float* sums, int count) {
    STEP_WEIGHTS(wl)
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    float acc[MG][TR][TC], v[WR][WC], next[WR][WC];
    for (int k = 0; k < SUMS; ++k) acc[k / (TR * TC)][k / TC % TR][k % TC] = 0.0f;
    wvec wv;
    sum_channels(x, corners[2 * t], corners[2 * t + 1], ws, v, next, wv, acc);
    PUT_SUMS(sums)
}

__global__ void step_store_tile(const float* sums, const float* b, float* out, int N, int m0) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * TILE_ROWS * TILE_COLS) return;
    float acc[MG][TR][TC];
    GET_SUMS(sums)
    store_tile(acc, b, out, t / (TILE_COLS * TILE_ROWS), m0, (t / TILE_COLS) % TILE_ROWS, t % TILE_COLS);
}
}
"""

TPB = 64  # threads per block of every harness: fewer than the weights a block stages, so its loop must stride


def shape(C, M, K, H, W, PAD, P, TR, TC, ACT=0, MG=None, WSHARED=1, PREFETCH=0) -> dict:
    """The macros of one harness compilation (the same names ``conv_tiles`` compiles with)."""
    HO, WO = H + 2 * PAD - K + 1, W + 2 * PAD - K + 1
    return dict(C=C, M=M, K=K, H=H, W=W, PAD=PAD, HO=HO, WO=WO, P=P, ACT=ACT, TR=TR, TC=TC, WSHARED=WSHARED,
                MG=MG or M, TPB=TPB, PREFETCH=PREFETCH, MINB=1)


# small shapes that reach every branch: padding and tiles that overhang the map (EDGES), no padding and windows
# that never cross an edge (INSIDE is true), a 5x5 kernel with the 2x2 pool; map groups of 8, 6 and 3 maps give
# weight vectors of 4, 2 and 1
EDGES = dict(C=3, M=8, K=3, H=7, W=9, PAD=1, P=1, TR=3, TC=2)
INSIDE = dict(C=2, M=6, K=3, H=8, W=8, PAD=0, P=2, TR=2, TC=2)
POOLED = dict(C=4, M=6, K=5, H=6, W=6, PAD=2, P=2, TR=2, TC=2)

CASES = {
    "load_window": [shape(**EDGES), shape(**INSIDE)],
    "add_channel": [shape(**EDGES, MG=8), shape(**{**EDGES, "M": 6}), shape(**POOLED, MG=3), shape(**EDGES, WSHARED=0)],
    "stage_weights": [shape(**EDGES, MG=4), shape(**POOLED, MG=3)],
    "sum_channels": [shape(**EDGES), shape(**EDGES, PREFETCH=1), shape(**POOLED, WSHARED=0),
                     shape(**INSIDE, PREFETCH=1)],
    "store_tile": [shape(**EDGES, MG=4, ACT=2), shape(**INSIDE, ACT=1), shape(**POOLED, MG=3, ACT=1)],
}


def function_body(source: str, name: str) -> str | None:
    """The body of the ``__device__`` function ``name`` in ``source`` (None when it is not defined there)."""
    m = re.search(r"__device__[^;{}]*\b" + re.escape(name) + r"\s*\(", source)
    if m is None:
        return None
    start = source.find("{", m.end())
    depth = 0
    for i in range(start, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[start + 1:i]
    return None


def _window_corners(mac: dict) -> np.ndarray:
    """Every tile's window corner (r0, c0), as ``conv_tiles`` computes them."""
    rows = mac["HO"] // 2 if mac["P"] == 2 else -(-mac["HO"] // mac["TR"])
    cols = mac["WO"] // 2 if mac["P"] == 2 else -(-mac["WO"] // mac["TC"])
    return np.array([(tr * mac["TR"] - mac["PAD"], tc * mac["TC"] - mac["PAD"]) for tr in range(rows)
                     for tc in range(cols)], np.int32)


def _padded(x: np.ndarray, mac: dict) -> tuple[np.ndarray, int]:
    """``x`` (channels, H, W) with enough zeros around it for any window; the offset of x[0, 0] in it."""
    edge = mac["PAD"] + mac["TR"] + mac["TC"] + mac["K"]
    return np.pad(x.astype(np.float64), ((0, 0), (edge, edge), (edge, edge))), edge


def _windows(xp: np.ndarray, off: int, corners: np.ndarray, mac: dict, c: int) -> np.ndarray:
    wr, wc = mac["TR"] + mac["K"] - 1, mac["TC"] + mac["K"] - 1
    return np.stack([xp[c, off + r0:off + r0 + wr, off + c0:off + c0 + wc] for r0, c0 in corners])


def _tile_sums(windows: np.ndarray, w: np.ndarray, c: int, mac: dict) -> np.ndarray:
    """acc[t, m, i, j] = sum over (p, q) of window[t, i + p, j + q] * w[m, c, p, q], for the group's maps."""
    K, TR, TC = mac["K"], mac["TR"], mac["TC"]
    out = np.zeros((len(windows), len(w), TR, TC))
    for p in range(K):
        for q in range(K):
            out += windows[:, None, p:p + TR, q:q + TC] * w[None, :, c, p, q, None, None].astype(np.float64)
    return out


def _layout(w: np.ndarray) -> np.ndarray:
    """A map group's weights as the shared array holds them: [c][p][q][m], maps fastest."""
    return np.ascontiguousarray(w.transpose(1, 2, 3, 0)).ravel()


class _Module:
    """The student's source and the harnesses, compiled for one shape; runs one harness kernel."""

    def __init__(self, source: str, mac: dict):
        self.mac = mac
        self.module = gpu.raw_module(source + HARNESS, [f"-D{k}={v}" for k, v in mac.items()])

    def constant(self, w: np.ndarray) -> None:
        gpu.upload_constant(self.module, "c_w", np.ascontiguousarray(w))

    def run(self, kernel: str, threads: int, *args, blocks: int | None = None) -> None:
        dev = [gpu.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args]
        grid = blocks if blocks is not None else -(-threads // TPB)
        gpu.launch_raw(self.module.get_function(kernel), (grid,), (TPB,), tuple(dev))
        gpu.synchronize()
        return [gpu.to_host(d) if d is not a else a for d, a in zip(dev, args)]


def _where(mac: dict) -> str:
    keys = ("C", "M", "MG", "K", "H", "W", "PAD", "P", "TR", "TC", "WSHARED", "PREFETCH")
    return "shape " + " ".join(f"{k}={mac[k]}" for k in keys)


def _check_load_window(source, mac, rng):
    corners = _window_corners(mac)
    if mac["PAD"]:  # windows further out than any tile's, where every value is padding
        corners = np.concatenate([corners, np.array([(-mac["K"], -mac["K"]), (mac["H"], 1)], np.int32)])
    x = rng.standard_normal((1, mac["H"], mac["W"])).astype(np.float32)
    wr, wc = mac["TR"] + mac["K"] - 1, mac["TC"] + mac["K"] - 1
    out = np.full((len(corners), wr, wc), np.nan, np.float32)
    got = _Module(source, mac).run("step_load_window", len(corners), x, corners.ravel(), out, np.int32(len(corners)))[2]
    xp, off = _padded(x, mac)
    return got, _windows(xp, off, corners, mac, 0).astype(np.float32), "v"


def _weights(rng, mac) -> np.ndarray:
    return (rng.standard_normal((mac["M"], mac["C"], mac["K"], mac["K"])) / mac["K"]).astype(np.float32)


def _check_add_channel(source, mac, rng):
    count, c = 5, mac["C"] - 1
    wr, wc = mac["TR"] + mac["K"] - 1, mac["TC"] + mac["K"] - 1
    windows = rng.standard_normal((count, wr, wc)).astype(np.float32)
    sums = rng.standard_normal((count, mac["MG"], mac["TR"], mac["TC"])).astype(np.float32)  # added to, not replaced
    w = _weights(rng, mac)
    module = _Module(source, mac)
    if not mac["WSHARED"]:
        module.constant(w)
    got = module.run("step_add_channel", count, windows, _layout(w[:mac["MG"]]), sums.copy(), np.int32(c),
                     np.int32(count))[2]
    expected = sums + _tile_sums(windows.astype(np.float64), w[:mac["MG"]], c, mac)
    return got, expected.astype(np.float32), "acc"


def _check_stage_weights(source, mac, rng):
    w = _weights(rng, mac)
    m0 = mac["M"] - mac["MG"]  # the last map group: a block that ignores m0 stages the first group's weights
    out = np.full(mac["C"] * mac["K"] ** 2 * mac["MG"], np.nan, np.float32)
    got = _Module(source, mac).run("step_stage_weights", TPB, w, out, np.int32(m0), blocks=1)[1]
    return got, _layout(w[m0:m0 + mac["MG"]]), "ws"


def _check_sum_channels(source, mac, rng):
    corners = _window_corners(mac)
    x = rng.standard_normal((mac["C"], mac["H"], mac["W"])).astype(np.float32)
    w = _weights(rng, mac)
    module = _Module(source, mac)
    if not mac["WSHARED"]:
        module.constant(w)
    sums = np.full((len(corners), mac["MG"], mac["TR"], mac["TC"]), np.nan, np.float32)
    got = module.run("step_sum_channels", len(corners), x, _layout(w[:mac["MG"]]), corners.ravel(), sums,
                     np.int32(len(corners)))[3]
    xp, off = _padded(x, mac)
    expected = sum(_tile_sums(_windows(xp, off, corners, mac, c), w[:mac["MG"]], c, mac) for c in range(mac["C"]))
    return got, expected.astype(np.float32), "acc"


def _activate(v: np.ndarray, act: int) -> np.ndarray:
    return np.maximum(v, 0) if act == 1 else np.tanh(v) if act == 2 else v


def _check_store_tile(source, mac, rng):
    N, (TR, TC) = 2, (mac["TR"], mac["TC"])
    corners = _window_corners(mac)
    rows, cols = (mac["HO"] // 2, mac["WO"] // 2) if mac["P"] == 2 else (-(-mac["HO"] // TR), -(-mac["WO"] // TC))
    sums = rng.standard_normal((N, rows, cols, mac["MG"], TR, TC)).astype(np.float32)
    b = rng.standard_normal(mac["M"]).astype(np.float32)
    m0 = mac["M"] - mac["MG"]
    out_shape = (N, mac["M"], rows, cols) if mac["P"] == 2 else (N, mac["M"], mac["HO"], mac["WO"])
    slack = 64  # past the end: a store that ignores the map's edge lands here or in another map
    out = np.full(int(np.prod(out_shape)) + slack, np.nan, np.float32)
    got = _Module(source, mac).run("step_store_tile", N * len(corners), sums, b, out, np.int32(N), np.int32(m0))[2]
    expected = np.full(out_shape, np.nan)
    grp = slice(m0, m0 + mac["MG"])
    s64 = sums.astype(np.float64)
    if mac["P"] == 2:
        best = s64.max(axis=(4, 5))  # (N, rows, cols, MG)
        expected[:, grp] = _activate(best.transpose(0, 3, 1, 2) + b[grp, None, None], mac["ACT"])
    else:
        full = s64.transpose(0, 3, 1, 4, 2, 5).reshape(N, mac["MG"], rows * TR, cols * TC)
        expected[:, grp] = _activate(full[:, :, :mac["HO"], :mac["WO"]] + b[grp, None, None], mac["ACT"])
    flat = np.concatenate([expected.ravel(), np.full(slack, np.nan)])
    stray = np.flatnonzero(np.isnan(flat) & ~np.isnan(got))
    if stray.size:
        i = int(stray[0])
        where = (f"out{[int(k) for k in np.unravel_index(i, out_shape)]}" if i < flat.size - slack
                 else f"{i - (flat.size - slack)} elements past the end of out")
        return None, f"a store outside this block's outputs ({stray.size} in all; the first at {where})", "out"
    keep = ~np.isnan(flat)
    return got[keep], flat[keep].astype(np.float32), "out"


NOTES = {"load_window": "windows in the padding and inside the image", "add_channel": "weight vectors of 4, 2 and 1 "
         "maps, shared and constant", "stage_weights": "the last map group", "sum_channels": "with and without "
         "the prefetch, shared and constant", "store_tile": "pooled, and tiles that overhang the map"}

CHECKS = {"load_window": _check_load_window, "add_channel": _check_add_channel,
          "stage_weights": _check_stage_weights, "sum_channels": _check_sum_channels,
          "store_tile": _check_store_tile}


def check(source: str, seed: int | None = None, quiet: bool = False) -> list[CheckResult]:
    """Check each step of ``source`` (the notebook's ``TILES_SOURCE``) on its own: one line per step function."""
    why = unavailable(("cuda_c",))
    if why:
        if not quiet:
            print(f"register-tile steps a-d: SKIPPED ({why})")
        return [CheckResult(f"step {s}, {name}", False, detail=f"skipped: {why}") for s, name in STEPS]
    seed = int(np.random.SeedSequence(seed).entropy % 2 ** 32) if seed is None else int(seed)
    rng = np.random.default_rng(seed)
    stubbed = {name for _, name in STEPS if STUB_MARK in (function_body(source, name) or STUB_MARK)}
    compiled = source.replace(STUB_MARK, "TODO stub")  # one step may be checked while a later one is a stub
    passed: set[str] = set()
    results = []
    for step, name in STEPS:
        label = f"step {step}, {name}"
        waiting = [n for n in NEEDS.get(name, ()) if n not in passed]
        if name in stubbed:
            result = CheckResult(label, False, detail=f"not implemented yet: {name} is still the TODO stub")
        elif waiting:
            result = CheckResult(label, False, detail=f"not checked yet: it calls {' and '.join(waiting)}, "
                                                      f"whose check does not pass yet")
        else:
            before = gpu.emulated_launches()
            result = _run(label, CHECKS[name], compiled, rng)
            result.seed = seed
            if gpu.emulated_launches() > before:
                result.emulated = LABEL
        if result.passed:
            passed.add(name)
        results.append(result)
        if not quiet:
            print(result)
    return results


def _run(label: str, fn, source: str, rng) -> CheckResult:
    cases = CASES[label.split(", ")[1]]
    for mac in cases:
        try:
            got, expected, what = fn(source, mac, rng)
        except Exception as exc:  # noqa: BLE001 - a compile error or a launch failure is this step's FAIL line
            first = " ".join(str(exc).split())[:300]
            return CheckResult(label, False, detail=f"{_where(mac)}: {type(exc).__name__}: {first}")
        if got is None:
            return CheckResult(label, False, detail=f"{_where(mac)}: {expected}")
        result = compare(label, got, expected, out_name=what)
        if not result.passed:
            result.detail = f"{_where(mac)}: {result.detail}"
            return result
    return CheckResult(label, True, note=f"{len(cases)} shapes, {NOTES[label.split(', ')[1]]}")
