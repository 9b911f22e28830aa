"""A class of wrong submissions of stages 04-09, each made from the kit's solution by editing its kernel cells, with
what the self-check and the grader should say about each (on the simulator; on a GPU where it differs).

    python tests/wrong_submissions.py --write DIR      # the class: DIR/<kind>/notebooks/<the stage's notebook>
    python tests/wrong_submissions.py --table          # grade it (this machine: simulator or GPU) and print the
                                                       # Markdown table of docs/grading.md: kind, self-check line,
                                                       # grader status and message
    python tests/wrong_submissions.py --table --kinds halo pad_border_nan   # only those kinds
    python tests/wrong_submissions.py --selfcheck KIND [KIND ...] --json OUT   # the self-check lines only

``tests/test_grade_wrong.py`` grades the kinds marked ``ci`` in one run and asserts every status and message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: stage -> (solution notebook, the graded and timed variant)
STAGES = {"04": ("04_data_transfer_padding.ipynb", "batched_padded"), "05": ("05_shared_memory.ipynb", "tiled_16"),
          "06": ("06_constant_memory.ipynb", "const_uniform"), "07": ("07_unroll_matmul.ipynb", "unroll_tiled"),
          "08": ("08_fusion.ipynb", "atomic_channels"), "09": ("09_per_layer_tuning.ipynb", "tuned_cifar10")}
SOLUTION = REPO / "solutions" / STAGES["04"][0]
NB = SOLUTION.name
STAGE = "04"
TIMED = "batched_padded"
# kernel cells of the stage-04 solution, in order
IMPORTS, PAD_CELL, CONV_CELL, VARIANTS_CELL = range(4)

#: graded beside the timed variant: stage 09's pooled, the student's kernel, on which the shipped rubric counts the
#: technique (the tuned variant's conv may be given code: the tuner's choice)
ALSO = {"09": ["pooled"]}
# the timed variant of each stage (the wrong kinds all change its conv), a fixed short time limit
RUBRIC = """
[limits]
time_s = 240
sim_time_s = 240
time_factor = 0
memory_mb = 6144
""" + "".join(f'\n[stage."{n}"]\nvariants = {json.dumps([*ALSO.get(n, []), v])}\ntimed_variant = "{v}"\n'
              for n, (_, v) in STAGES.items())

LAUNCH = "lk.gpu.launch(conv_padded_kernel, out.size, xp, w, b, out, stride)"
PAD_ONCE = '''    xp = x
    if pad:
        xp = lk.gpu.buffer("padded", (N, C, H + 2 * pad, W + 2 * pad))
        lk.gpu.launch(pad_kernel, xp.size, x, xp, pad)
'''


def _replace(cells, index: int, old: str, new: str) -> None:
    src = cells[index].source
    assert old in src, f"the stage-04 solution's kernel cell {index} no longer contains {old!r}"
    cells[index].source = src.replace(old, new, 1)


def _append(cells, index: int, code: str) -> None:
    cells[index].source += "\n\n" + code.strip("\n") + "\n"


# ------------------------------------------------------------------------------------------- the kinds


def halo(cells):  # the pad kernel copies the input one row too low
    _replace(cells, PAD_CELL, "src_r, src_c = r - pad, col - pad", "src_r, src_c = r - pad + 1, col - pad")


def unwritten(cells):  # the last output row of every map is never written
    _replace(cells, CONV_CELL, "        out[n, m, i, j] = acc", "        if i < Ho - 1:\n            out[n, m, i, j] = acc")


def batch0(cells):  # threads for one image only: images 1.. of a batch are never written
    _replace(cells, CONV_CELL, LAUNCH, LAUNCH.replace("out.size,", "out.size // N,"))


def transposed(cells):  # the filter read as w[m, c, q, p]
    _replace(cells, CONV_CELL, "* w[m, c, p, q]", "* w[m, c, q, p]")


def no_bias(cells):
    _replace(cells, CONV_CELL, "        acc = b[m]\n", "        acc = 0.0\n")


def channel_race(cells):  # one thread per (output, input channel), plain += into out (tests/buggy_kernels.py)
    _append(cells, CONV_CELL, '''
@cuda.jit
def zero_kernel(out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = 0.0


@cuda.jit
def conv_channel_kernel(xp, w, b, out, stride):
    C = xp.shape[1]
    M, _, K, _ = w.shape
    N, _, Ho, Wo = out.shape
    t = cuda.grid(1)
    if t < N * M * Ho * Wo * C:
        c, e = t % C, t // C
        j, i, m, n = e % Wo, (e // Wo) % Ho, (e // (Wo * Ho)) % M, e // (Wo * Ho * M)
        acc = b[m] if c == 0 else 0.0 * b[m]
        for p in range(K):
            for q in range(K):
                acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]
        out[n, m, i, j] += acc


def conv_padded(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
''' + PAD_ONCE + '''    lk.gpu.launch(zero_kernel, out.size, lk.gpu.flat(out))
    lk.gpu.launch(conv_channel_kernel, out.size * C, xp, w, b, out, stride)
''')


def out_of_bounds(cells):  # no guard: the spare threads of the last block read past the end
    _replace(cells, CONV_CELL, "    if t < N * M * Ho * Wo:\n", "    if True:\n")


def grid(cells):  # four images per block row, grid y = max(N // 4, 1) (tests/buggy_kernels.py)
    _append(cells, CONV_CELL, '''
@cuda.jit
def conv_four_images_kernel(xp, w, b, out, stride):
    C = xp.shape[1]
    M, _, K, _ = w.shape
    N, _, Ho, Wo = out.shape
    e = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if e < M * Ho * Wo:
        j, i, m = e % Wo, (e // Wo) % Ho, e // (Wo * Ho)
        for k in range(4):
            n = cuda.blockIdx.y * 4 + k
            if n < N:
                acc = b[m]
                for c in range(C):
                    for p in range(K):
                        for q in range(K):
                            acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]
                out[n, m, i, j] = acc


def conv_padded(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
''' + PAD_ONCE + '''    M, Ho, Wo = out.shape[1], out.shape[2], out.shape[3]
    lk.gpu.launch_grid(conv_four_images_kernel, (lk.gpu.blocks(M * Ho * Wo), max(N // 4, 1)), lk.gpu.TPB,
                       xp, w, b, out, stride)
''')


def cached(cells):  # computes once per shape, then hands back that first result
    _append(cells, CONV_CELL, '''
_conv_once = conv_padded
_FIRST = {}


def conv_padded(x, w, b, out, pad, stride):
    key = (tuple(out.shape), pad, stride)
    if key in _FIRST:
        lk.gpu.to_device(_FIRST[key], to=out)
        return
    _conv_once(x, w, b, out, pad, stride)
    _FIRST[key] = lk.gpu.as_host(out).copy()
''')


def nhwc(cells):  # the right values, in NHWC order, in the NCHW out
    _append(cells, CONV_CELL, '''
@cuda.jit
def conv_nhwc_kernel(xp, w, b, flat_out, N, M, Ho, Wo, stride):
    C = xp.shape[1]
    K = w.shape[2]
    t = cuda.grid(1)
    if t < N * M * Ho * Wo:
        j = t % Wo
        i = (t // Wo) % Ho
        m = (t // (Wo * Ho)) % M
        n = t // (Wo * Ho * M)
        acc = b[m]
        for c in range(C):
            for p in range(K):
                for q in range(K):
                    acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]
        flat_out[((n * Ho + i) * Wo + j) * M + m] = acc


def conv_padded(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
''' + PAD_ONCE + '''    M, Ho, Wo = out.shape[1], out.shape[2], out.shape[3]
    lk.gpu.launch(conv_nhwc_kernel, out.size, xp, w, b, lk.gpu.flat(out), N, M, Ho, Wo, stride)
''')


def float64_elsewhere(cells):  # computes in float64, into a buffer of its own: out is never written
    _append(cells, CONV_CELL, '''
@cuda.jit
def conv_padded64_kernel(xp, w, b, res, stride):
    C = xp.shape[1]
    M, _, K, _ = w.shape
    N, _, Ho, Wo = res.shape
    t = cuda.grid(1)
    if t < N * M * Ho * Wo:
        j = t % Wo
        i = (t // Wo) % Ho
        m = (t // (Wo * Ho)) % M
        n = t // (Wo * Ho * M)
        acc = 1.0 * b[m]
        for c in range(C):
            for p in range(K):
                for q in range(K):
                    acc += 1.0 * xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]
        res[n, m, i, j] = acc


def conv_padded(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
''' + PAD_ONCE + '''    res = lk.gpu.buffer("result64", out.shape, np.float64)
    lk.gpu.launch(conv_padded64_kernel, out.size, xp, w, b, res, stride)
''')


def float16(cells):  # inputs and weights rounded to float16 before they are multiplied
    _replace(cells, CONV_CELL, "acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]",
             "acc += types.float16(xp[n, c, i * stride + p, j * stride + q]) * types.float16(w[m, c, p, q])")
    cells[CONV_CELL].source = "from numba import types\n\n" + cells[CONV_CELL].source


def library(cells):  # the timed conv computes with labkit's numpy reference
    _append(cells, CONV_CELL, '''
def conv_padded(x, w, b, out, pad, stride):
    y = lk.reference.conv2d(lk.gpu.as_host(x), lk.gpu.as_host(w), lk.gpu.as_host(b), pad, stride)
    lk.gpu.to_device(y, to=out)
''')


def library_numpy(cells):  # ... with numpy: a window view and an einsum
    _append(cells, CONV_CELL, '''
from numpy.lib.stride_tricks import sliding_window_view


def conv_padded(x, w, b, out, pad, stride):
    xh = np.pad(lk.gpu.as_host(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xh, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.einsum("nchwpq,mcpq->nmhw", win, lk.gpu.as_host(w)) + lk.gpu.as_host(b)[None, :, None, None]
    lk.gpu.to_device(np.ascontiguousarray(y, dtype=np.float32), to=out)
''')


def library_hidden(cells):  # ... with numpy, looked up by a name built at run time: no scan can see it
    _append(cells, CONV_CELL, '''
def conv_padded(x, w, b, out, pad, stride):
    xh = np.pad(lk.gpu.as_host(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = getattr(np.lib.stride_tricks, "sliding" + "_window_view")
    win = windows(xh, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    y = getattr(np, "ein" + "sum")("nchwpq,mcpq->nmhw", win, lk.gpu.as_host(w)) + lk.gpu.as_host(b)[None, :, None, None]
    lk.gpu.to_device(np.ascontiguousarray(y, dtype=np.float32), to=out)
''')


def timer(cells):  # the right kernels, and every clock the grader could use made to read zero
    _append(cells, VARIANTS_CELL, '''
import time as _time

import labkit.engine
import labkit.timing

_time.perf_counter = lambda: 0.0
labkit.timing.Timer = None
labkit.engine.time_passes = lambda net, variant, prepared, repeat, **k: (
    None, [{n: 1e-9 for n in net.layer_names} for _ in range(repeat)])
_main = __import__("__main__")
_main._perf_counter = lambda: 0.0  # the grade worker's own clock
''')


# ------------------------------------------------------------------------------- kinds of issue 25 (04-09)


def pad_border_nan(cells):  # the pad kernel leaves the border unwritten: the conv reads the check's NaN poison there
    _replace(cells, PAD_CELL, "        else:\n            xp[n, c, r, col] = 0.0\n", "")


def numpy_container(cells):  # numpy kept in a container built at load time: neither the scan nor a name patch sees it
    _append(cells, CONV_CELL, """
_OPS = {"windows": np.lib.stride_tricks.sliding_window_view, "sum": np.einsum}


def conv_padded(x, w, b, out, pad, stride):
    xh = np.pad(lk.gpu.as_host(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = _OPS["windows"](xh, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    y = _OPS["sum"]("nchwpq,mcpq->nmhw", win, lk.gpu.as_host(w)) + lk.gpu.as_host(b)[None, :, None, None]
    lk.gpu.to_device(np.ascontiguousarray(y, dtype=np.float32), to=out)
""")


def class_patch(cells):  # the library tracer and the technique counter patched through class attributes
    _append(cells, VARIANTS_CELL, """
import labkit.counts as _counts
import labkit.grading.ownership as _own

_own.Tracer.call = lambda self, fn, args: (fn(*args), {"library": [], "launches": {"own": 1}})[1]
_counts.Counts.per_output = lambda self, kind: 1e9 if "shared" in kind or "constant" in kind else 0.0
""")


_TIMED = """
import sys as _sys


def _timed():  # inside the grader's timed passes (or a bench)?
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("timed_passes", "time_passes"):
            return True
        frame = frame.f_back
    return False
"""


def timed_only_library(cells):  # right kernels in every check; numpy in the timed passes only
    _append(cells, CONV_CELL, _TIMED + """

_conv_own = conv_padded


def conv_padded(x, w, b, out, pad, stride):
    if not _timed():
        return _conv_own(x, w, b, out, pad, stride)
    xh = np.pad(lk.gpu.as_host(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xh, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.einsum("nchwpq,mcpq->nmhw", win, lk.gpu.as_host(w)) + lk.gpu.as_host(b)[None, :, None, None]
    lk.gpu.to_device(np.ascontiguousarray(y, dtype=np.float32), to=out)
""")


def memo_content(cells):  # results memoised by the input images' content (the accuracy run primes the memo)
    _append(cells, CONV_CELL, """
import hashlib as _hashlib

_conv_own = conv_padded
_MEMO = {}


def conv_padded(x, w, b, out, pad, stride):
    key = _hashlib.sha1(lk.gpu.as_host(x).tobytes()).hexdigest(), tuple(out.shape)
    if key in _MEMO:
        lk.gpu.to_device(_MEMO[key], to=out)
        return
    _conv_own(x, w, b, out, pad, stride)
    _MEMO[key] = lk.gpu.as_host(out).copy()
""")


def untimed_layer(cells):  # in the timed passes the conv only records its arguments; the relu after it computes
    _append(cells, VARIANTS_CELL, _TIMED + """

_PENDING = []
_conv_own, _relu_given = PADDED["conv"], PADDED["relu"]


def conv_later(x, w, b, out, pad, stride):
    if _timed():  # a conv layer's time used to be the op time: do nothing in it
        _PENDING.append((x, w, b, out, pad, stride))
        return
    _conv_own(x, w, b, out, pad, stride)


def relu_and_conv(x, out):
    while _PENDING:
        _conv_own(*_PENDING.pop(0))
    _relu_given(x, out)


VARIANTS["batched_padded"] = lk.Variant({**PADDED, "conv": conv_later, "relu": relu_and_conv}, arrays="device")
""")


def stream_deferred(cells):  # the conv's kernels on a stream of its own, waited for only by the relu after it
    _append(cells, VARIANTS_CELL, """

from numba import cuda as _cuda

_SIDE = _cuda.stream()
_relu_given = PADDED["relu"]


def conv_on_the_side(x, w, b, out, pad, stride):
    N, C, H, W = x.shape
    xp = x
    if pad:
        xp = lk.gpu.buffer("padded", (N, C, H + 2 * pad, W + 2 * pad))
        pad_kernel[lk.gpu.blocks(xp.size), lk.gpu.TPB, _SIDE](x, xp, pad)
    conv_padded_kernel[lk.gpu.blocks(out.size), lk.gpu.TPB, _SIDE](xp, w, b, out, stride)


def relu_after_the_side(x, out):
    _SIDE.synchronize()
    _relu_given(x, out)


VARIANTS["batched_padded"] = lk.Variant({**PADDED, "conv": conv_on_the_side, "relu": relu_after_the_side},
                                        arrays="device")
""")


# stage 05: a right conv of the student's own with one token load per output through shared memory
TOKEN_SHARED = """

from numba import cuda, float32


@cuda.jit
def token_conv_kernel(x, w, b, out, pad, stride):
    token = cuda.shared.array(128, float32)
    t = cuda.grid(1)
    N, M, Ho, Wo = out.shape
    if t < N * M * Ho * Wo:
        j, i, m, n = t % Wo, (t // Wo) % Ho, (t // (Wo * Ho)) % M, t // (Wo * Ho * M)
        acc = b[m]
        for c in range(w.shape[1]):
            for p in range(w.shape[2]):
                r = i * stride + p - pad
                for q in range(w.shape[3]):
                    s = j * stride + q - pad
                    if 0 <= r < x.shape[2] and 0 <= s < x.shape[3]:
                        acc += x[n, c, r, s] * w[m, c, p, q]
        token[cuda.threadIdx.x] = acc
        out[n, m, i, j] = token[cuda.threadIdx.x]


def conv_token(x, w, b, out, pad, stride):
    lk.gpu.launch(token_conv_kernel, out.size, x, w, b, out, pad, stride)


VARIANTS = lk.variants("05", {name: lk.Variant({**lk.kernels.GIVEN, "conv": conv_token}, arrays="device")
                              for name in VARIANTS})
"""


def token_shared(cells):
    _append(cells, len(cells) - 1, TOKEN_SHARED)


def counter_patch(cells):  # stage 06: the technique counter patched through a class attribute
    _append(cells, len(cells) - 1, """
import labkit.counts as _counts

_counts.Counts.per_output = lambda self, kind: 1e9 if "constant" in kind else 0.0
""")


def given_as_own(cells):  # stage 08: an earlier stage's given conv submitted as this stage's
    _append(cells, len(cells) - 1, """
s07 = lk.from_stage("07")
VARIANTS = lk.variants("08", {name: variant(s07.conv_unroll_tiled, "stage 07's unroll + tiled matmul")
                              for name in VARIANTS})
""")


def given_wrapped(cells):  # stage 08: the same, behind a function of the student's own
    _append(cells, len(cells) - 1, """
s07 = lk.from_stage("07")


def conv_mine(x, w, b, out, pad, stride):
    s07.conv_unroll_tiled(x, w, b, out, pad, stride)


VARIANTS = lk.variants("08", {name: variant(conv_mine, "my conv") for name in VARIANTS})
""")


#: stage 06's kernel cache, and a student's: keyed by id(w), w itself not kept, so a new array may take its id once w
#: is freed (the checks provoke it: labkit.freed), and its kernel of the old weights answers
PER_WEIGHTS = "KERNELS = lk.const_kernels.PerWeights(make_const_kernel)"
BY_ID = '''_BY_ID = {}


def KERNELS(w, maps_fastest):  # keyed by id(w); w itself is not kept, so a new array may take its id
    key = (id(w), maps_fastest)
    if key not in _BY_ID:
        _BY_ID[key] = make_const_kernel(w.copy_to_host(), maps_fastest)
    return _BY_ID[key]'''


def id_cache(cells):  # stage 06: constant-memory kernels cached by id(w), w not kept alive
    index = next(i for i, c in enumerate(cells) if PER_WEIGHTS in c.source)
    _replace(cells, index, PER_WEIGHTS, BY_ID)


def cuda_c_wrong_source(cells):  # stage 09: register tiles in CUDA C that ignore the padding (windows cross the edge)
    src = "#define INSIDE (PAD == 0 && (TILE_ROWS - 1) * TR + WR <= H && (TILE_COLS - 1) * TC + WC <= W)"
    index = next(i for i, c in enumerate(cells) if src in c.source)
    _replace(cells, index, src, "#define INSIDE 1")


@dataclasses.dataclass
class Kind:
    edit: Callable | None
    what: str  # the mistake, in the table
    status: str  # what the grader must say (on the simulator)
    words: tuple[str, ...]  # ... in its message
    selfcheck_fails: bool | None  # the self-check line FAILs (None: not asserted, it depends on shapes)
    stage: str = "04"
    ci: bool = True  # graded by tests/test_grade_wrong.py (the others: the table's run, and on a GPU)
    gpu: str = ""  # what a GPU run must say where it differs from the simulator's (op time is measured there)


KINDS: dict[str, Kind] = {
    "correct": Kind(None, "the kit's solution", "pass", ("all checks pass",), False),
    "halo": Kind(halo, "halo off by one (pad kernel copies one row too low)", "fail",
                 ("conv1: FAIL", "off by one row"), True),
    "unwritten": Kind(unwritten, "last output row never written", "fail", ("unwritten (still NaN)",), True),
    "batch0": Kind(batch0, "only image 0 of a batch written", "fail", ("only image 0",), True),
    "transposed": Kind(transposed, "filter transposed (w[m, c, q, p])", "fail", ("filter transposed",), True),
    "no_bias": Kind(no_bias, "bias never added", "fail", ("without the bias",), True),
    "channel_race": Kind(channel_race, "one thread per (output, input channel), plain += into out", "fail",
                         ("data race", "write conflict", "out["), True),
    "out_of_bounds": Kind(out_of_bounds, "no thread guard: spare threads read past the end", "fail",
                          ("out of bounds",), True,
                          gpu="fail: the real sizes fill whole blocks, the boundary shapes after them have spare "
                              "threads, which write into the guard after out"),
    "grid": Kind(grid, "grid y = max(N // 4, 1), four images per block row", "fail",
                 ("batch size 67", "only images 0 to 63"), True),  # labkit.simulator.BATCHES[-1]: 67 images
    "cached": Kind(cached, "first result per shape cached and handed back", "fail", ("cached",), None),
    "nhwc": Kind(nhwc, "right values written in NHWC order", "fail", ("NHWC",), True),
    "float64_elsewhere": Kind(float64_elsewhere, "float64 result in a buffer of its own, out never written",
                              "fail", ("nothing was written into out", "kernel launch"), True),
    "float16": Kind(float16, "inputs and weights rounded to float16", "fail", ("reduced precision",), True),
    "library": Kind(library, "timed conv computes with labkit.reference", "forbidden",
                    ("labkit.reference.conv2d", "own kernels"), False),
    "library_numpy": Kind(library_numpy, "timed conv computes with numpy (sliding_window_view + einsum)", "forbidden",
                          ("numpy.einsum", "own kernels"), False),
    "library_hidden": Kind(library_hidden, "the same, numpy looked up by names built at run time", "forbidden",
                           ("numpy.einsum", "own kernels"), False),
    "timer": Kind(timer, "patches time.perf_counter, labkit.timing, labkit.engine and the worker's clock", "tampered",
                  ("time.perf_counter", "labkit.engine.time_passes", "stage scored 0"), False),
    "pad_border_nan": Kind(pad_border_nan, "pad kernel never writes the border: the conv reads NaN there", "fail",
                           ("is NaN although your kernel wrote it", "read data that was never written"), True),
    "numpy_container": Kind(numpy_container, "timed conv computes with numpy kept in a dict built at load time",
                            "forbidden", ("calls numpy.lib.stride_tricks.sliding_window_view", "own kernels"), False),
    "class_patch": Kind(class_patch, "patches the library tracer and the technique counter (class attributes)",
                        "tampered", ("labkit.grading.ownership.Tracer.call", "labkit.counts.Counts.per_output"),
                        False),
    "timed_only_library": Kind(timed_only_library, "own kernels in the checks, numpy only in the timed passes",
                               "forbidden", ("calls numpy", "own kernels"), False, ci=False,
                               gpu="forbidden (the scan sees the names; with names it cannot see, the tracer, which "
                                   "runs in the timed passes too)"),
    "memo_content": Kind(memo_content, "conv results memoised by the images' content", "pass",
                         ("op time not measured",), False, ci=False,
                         gpu="pass at its real op time: every timed pass has fresh images, the memo never hits"),
    "untimed_layer": Kind(untimed_layer, "in timed passes the conv defers its work to its own relu", "pass",
                          ("op time not measured",), False, ci=False,
                          gpu="forbidden: in the timed passes its conv launched no kernel of its own (and the "
                              "op time is the whole pass: the deferred work would count)"),
    "stream_deferred": Kind(stream_deferred, "the conv's kernels on a stream of their own, waited for by the relu",
                            "pass", ("op time not measured",), False, ci=False,
                            gpu="pass at its real op time: the op time is the whole pass, until the device is idle"),
    "token_shared": Kind(token_shared, "a right conv with one token shared-memory load per output", "pass",
                         ("no technique points", "% of its loads from shared memory"), False, stage="05"),
    "counter_patch": Kind(counter_patch, "patches the technique counter (labkit.counts.Counts.per_output)",
                          "tampered", ("labkit.counts.Counts.per_output",), False, stage="06", ci=False),
    "given_as_own": Kind(given_as_own, "stage 07's given conv (lk.from_stage) submitted as stage 08's", "forbidden",
                         ("given code", "not by code from your notebook"), False, stage="08"),
    "given_wrapped": Kind(given_wrapped, "the same behind a function of the student's own", "forbidden",
                          ("launched only given kernels",), False, stage="08", ci=False),
    "id_cache": Kind(id_cache, "constant-memory kernels cached by id(w), w not kept alive", "fail",
                     ("with the weights (w) of an earlier call", "id()"), True, stage="06"),
    "cuda_c_wrong_source": Kind(cuda_c_wrong_source, "register-tile CUDA C ignores the padding (#define INSIDE 1)",
                                "fail", ("conv1: FAIL", "read outside its input"), None, stage="09", ci=False),
    # (the tuned variant runs the student's CUDA C: on a GPU, and on the CPU emulation where there is none)
}


def write(root: Path, kinds=None) -> dict[str, Path]:
    """``root/<kind>/notebooks/<the stage's notebook>`` for each kind; their paths."""
    import nbformat

    out = {}
    for name in kinds or KINDS:
        notebook = STAGES[KINDS[name].stage][0]
        nb = nbformat.read(REPO / "solutions" / notebook, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]
        if KINDS[name].edit is not None:
            KINDS[name].edit(cells)
        folder = root / name / "notebooks"
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / notebook)
        out[name] = folder / notebook
    return out


# ------------------------------------------------------------------------------------------- self-checks


def selfcheck(notebook: Path) -> tuple[str, list[str]]:
    """The line a student sees from ``labkit.check.check_variant`` on the timed variant (the first FAIL, or how
    many checks passed), and every line. Run in a process of its own (the timer kind patches the clock)."""
    from labkit import check, nbcells

    timed = next(v for nb, v in STAGES.values() if nb == notebook.name)
    variant = nbcells.load(notebook)["VARIANTS"][timed]
    results = check.check_variant(variant, net="cifar10", quiet=True)
    lines = [str(r) for r in results]
    bad = next((line for line in lines if ": FAIL" in line), None)
    return bad or f"PASS (all {len(lines)} checks of {timed}, cifar10)", lines


def selfcheck_all(root: Path, kinds: list[str]) -> dict[str, str]:
    """Each kind's self-check line, each in a fresh process (on the GPU, or the simulator where there is none)."""
    out = {}
    env = dict(os.environ)  # the simulator where there is no CUDA driver (import labkit switches it on)
    for name in kinds:
        nb = root / name / "notebooks" / STAGES[KINDS[name].stage][0]
        proc = subprocess.run([sys.executable, __file__, "--selfcheck-one", str(nb)], capture_output=True, text=True,
                              env=env, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SELFCHECK ")]
        out[name] = lines[-1][len("SELFCHECK "):] if lines else f"(self-check crashed: {proc.stderr[-300:]})"
    return out


# ------------------------------------------------------------------------------------------- the table


def grade_class(root: Path, out: Path, seed: int = 2024, jobs: int = 2, kinds=None) -> dict:
    """Grade ``root/class`` (the kinds written there) for every stage they belong to, in one run."""
    rubric = root / "rubric.toml"
    rubric.write_text(RUBRIC)
    from labkit import grading

    stages = sorted({KINDS[k].stage for k in kinds or KINDS})
    return grading.grade(root / "class", stages=stages, rubric=rubric, out=out, jobs=jobs, seed=seed,
                         progress=False, command=f"labkit grade class --stages {','.join(stages)} --rubric "
                                                 f"rubric.toml --jobs {jobs} --seed {seed}")


def _cell(text: str, width: int = 150) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 3] + "..."


def table(selfchecks: dict[str, str], rows: dict[str, dict], kinds=None) -> str:
    lines = ["| stage | kind | the mistake | self-check line (`check_variant`) | grader status | grader's message "
             "(start) |", "|---|---|---|---|---|---|"]
    for name in kinds or KINDS:
        kind, r = KINDS[name], rows[name]
        lines.append(f"| {kind.stage} | `{name}` | {kind.what} | {_cell(selfchecks.get(name, '(not run)'))} | "
                     f"**{r['status']}** {r['score']:g}/{r['max_score']:g} | {_cell(r['message'], 460)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--selfcheck", nargs="+")
    ap.add_argument("--selfcheck-one", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS), help="only these kinds (default: all)")
    ap.add_argument("--no-selfcheck", action="store_true", help="grade only (the self-checks run one process each)")
    args = ap.parse_args(argv)
    if args.selfcheck_one:
        line, _ = selfcheck(args.selfcheck_one)
        print("SELFCHECK " + line)
        return 0
    if args.write:
        write(args.write)
        return 0
    if args.selfcheck:
        with tempfile.TemporaryDirectory() as tmp:
            write(Path(tmp), args.selfcheck)
            result = selfcheck_all(Path(tmp), args.selfcheck)
        text = json.dumps(result, indent=1)
        if args.json:
            args.json.write_text(text)
        else:
            print(text)
        return 0
    if args.table:
        kinds = args.kinds or list(KINDS)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write(root / "class", kinds)
            report = grade_class(root, root / "out", seed=args.seed, kinds=kinds)
            rows = {r["student"]: r for r in report["rows"] if r["stage"] == KINDS[r["student"]].stage}
            checks = {} if args.no_selfcheck else selfcheck_all(root / "class", kinds)
            if args.json:
                args.json.write_text(json.dumps({"rows": rows, "selfchecks": checks, "meta": report["meta"]},
                                                indent=1, default=str))
        print(table(checks, rows, kinds))
        print(f"\n(computed by `python tests/wrong_submissions.py --table`: {report['meta']['date']}, "
              f"{report['meta']['device']}, seed {report['meta']['seed']}, graded in {report['meta']['seconds']} s)")
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
