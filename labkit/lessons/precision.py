"""Why the tensor cores' split keeps fp32's accuracy: a value's parts drawn bit by bit, and one layer three ways.

Notebook 10 uses it after the tensor cores' conv is given (``labkit.ops.tensor_cores``): ``draw_split`` shows
which of an fp32 value's 24 significant bits its fp16 big part and its fp16 small part hold; ``three_ways`` times
one fused conv layer with the FMA units (stage 09's direct kernel, passed in), with the TF32 split and with the fp16
split, and measures each one's error against the float64 reference. The student predicts, then measures; the
numbers come from the run, never from here. Kept out of releases before milestone 10, with the tensor cores' conv.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.cases import layer_case
from ..launch import gpu
from ..measuring.timing import measure
from ..model import layers, reference
from ..model.nets import get_net
from ..ops import tensor_cores

#: the fp16 split keeps the small part 2^11 times larger, so that it stays in fp16's range (as the kernel does)
SMALL_SCALE = 2.0 ** 11
#: the split configurations timed: the tensor cores' default (TF32 parts) and one with fp16 halves
WAYS = {"FMA": None, "TF32 split": tensor_cores.DEFAULT, "fp16 split": "w4 mt1 i2 f16"}


def split_fp16(a) -> tuple[np.ndarray, np.ndarray]:
    """fp32 values as fp16 big parts and fp16 small parts: ``a ~ big + small / SMALL_SCALE``."""
    a = np.asarray(a, np.float32)
    big = a.astype(np.float16)
    small = ((a.astype(np.float64) - big.astype(np.float64)) * SMALL_SCALE).astype(np.float16)
    return big, small


def joined(big, small) -> np.ndarray:
    """The value the two parts stand for, exactly (float64)."""
    return np.asarray(big, np.float64) + np.asarray(small, np.float64) / SMALL_SCALE


def _bits(value: float, top: int, width: int = 24) -> dict[int, int]:
    """The significant bits of a finite nonzero ``value``: power of two -> bit, ``width`` of them from its highest."""
    exp = int(np.floor(np.log2(abs(value))))
    mant = abs(value) / 2.0 ** exp  # in [1, 2)
    out = {}
    for k in range(width):
        bit = int(mant >= 1.0)
        out[exp - k] = bit
        mant = (mant - bit) * 2
    return {p: b for p, b in out.items() if p <= top}


def draw_split(value: float = 1 / 3):
    """A figure of ``value`` in fp32, its fp16 big part and its fp16 small part: each row one part's significant
    bits, placed at the powers of two they stand for (a dark cell a 1), the returned figure and the three parts."""
    import matplotlib.pyplot as plt

    a = np.float32(value)
    big, small = split_fp16(a)
    small_value = float(small) / SMALL_SCALE
    top = int(np.floor(np.log2(abs(float(a)))))
    rows = [("fp32 value", float(a), 24, "#4c72b0"), ("fp16 big part", float(big), 11, "#dd8452"),
            ("fp16 small part", small_value, 11, "#55a868")]
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for r, (name, v, width, colour) in enumerate(rows):
        if v == 0:
            ax.text(0, -r, "0 (nothing left)", va="center", fontsize=9)
            continue
        for p, bit in _bits(v, top, width).items():  # the highest power of two on the left
            ax.add_patch(plt.Rectangle((top - p - 0.45, -r - 0.4), 0.9, 0.8,
                                       color=colour if bit else "#eeeeee", ec="#999999", lw=0.5))
        ax.text(27.0, -r, f"{name}: {v:.12g}", va="center", fontsize=9)
    ax.set_xlim(-1, 40)
    ax.set_ylim(-len(rows) + 0.4, 0.6)
    ax.set_yticks([])
    ticks = list(range(0, 27, 4))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"2^{top - t}" for t in ticks])
    ax.set_xlabel("the power of two a bit stands for (a dark cell: a 1)")
    ax.set_title(f"{float(a):.9g} split into two fp16 numbers: big = fp16(a), small = fp16((a - big) x 2^11)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig, (float(a), float(big), small_value)


@dataclass
class Way:
    """One way of computing the layer: its median time and range (seconds), its largest error against the float64
    reference relative to the largest output, and how the time was taken."""

    name: str
    seconds: float
    low: float
    high: float
    error: float
    method: str


def _fused(net_name: str, layer_name: str, fuse: tuple[str, ...]) -> tuple:
    group = next(g for g in layers.groups(list(get_net(net_name).layers), fuse) if g[0].name == layer_name)
    return group, layers.fused_codes(group)


def _want(group, x, weights) -> np.ndarray:
    y = np.asarray(x, np.float64)
    for layer in group:
        y = reference.layer_forward(layer, y, weights if layer is group[0] else {}, accumulate="float64")
    return np.asarray(y, np.float64)


def three_ways(fma, net: str = "cifar10", layer: str = "conv2", images: int = 1200, repeat: int = 10,
               fuse: tuple[str, ...] = ("relu", "tanh", "pool"), seed: int = 0) -> list[Way]:
    """``layer`` of ``net`` with the activation and pool fused after it, on ``images`` random images (the real
    layer on a GPU, the simulator's shrunk one elsewhere), computed by ``fma`` (a fused conv function, as stage 09's)
    and by the tensor cores' conv with each split (``WAYS``): each timed with ``lk.measure`` and compared with the
    float64 reference, on an output poisoned with NaN before each way."""
    group, (act, pool) = _fused(net, layer, fuse)
    case = layer_case(net, layer, images, np.random.default_rng(seed), target="gpu", answers=False)
    w, b = case.weights[f"{layer}.weight"], case.weights[f"{layer}.bias"]
    want = _want(group, case.x, case.weights)
    scale = float(np.abs(want).max()) or 1.0
    x, wd, bd = gpu.to_device(case.x), gpu.to_device(w), gpu.to_device(b)
    conv = group[0]
    rows = []
    for name, config in WAYS.items():
        fn = fma if config is None else (lambda *a, c=config: tensor_cores.conv_split3(*a, config=c))
        out = gpu.to_device(np.full(want.shape, np.nan, np.float32))
        m = measure(fn, x, wd, bd, out, conv.pad, conv.stride, act, pool, repeat=repeat)
        got = gpu.as_host(out).astype(np.float64)
        error = float(np.abs(got - want).max() / scale) if np.isfinite(got).all() else float("inf")
        rows.append(Way(name, m.median, min(m.times), max(m.times), error, m.method))
    return rows


def table(rows: list[Way]) -> str:
    """The ways as lines: time (median and range) and error."""
    return "\n".join(f"{r.name:11s} {1e3 * r.seconds:9.3f} ms (range {1e3 * r.low:.3f}-{1e3 * r.high:.3f}), "
                     f"largest error {r.error:.1e} of the largest output" for r in rows)
