"""What a failing check most likely got wrong, said in the grader's message (the first failing check of a job).

``labkit.check.compare`` already names the layout (NHWC) and why outputs are NaN; the grader, which keeps the
inputs of every case, can also try the usual mistakes on them with the float64 reference and name the one whose
values the student's output matches: a result cached from an earlier call, images of the batch never written (the
grid does not cover it), the bias left out, the filter transposed, the input window off by one (the halo), a fused
epilogue that adds the bias after the activation (or the pool), or a conv computed in float16 (reduced precision).
A small error alone names nothing: each hint is a computation the output matches.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..model import reference
from ..model.layers import ACT_CODES, groups


def fingerprint(got: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(got).tobytes()).hexdigest()


def _close(got: np.ndarray, want: np.ndarray, tol: float) -> bool:
    want = want.astype(np.float64)
    norm = np.linalg.norm(want)
    return bool(norm > 0 and np.linalg.norm(got.astype(np.float64) - want) / norm <= 10 * tol)


def _off_by_one(x, w, b, layer, axis: int, by: int, shape) -> np.ndarray | None:
    """The conv whose window is ``by`` rows (axis 2) or columns (axis 3) off: out[i] = sum_p x[i*s + p - pad + by]
    (zero outside the image), i.e. the padding ``pad - by`` before and ``pad + by`` after; None if impossible."""
    pad = layer.pad
    if pad - by < 0:
        return None
    pads = [(0, 0), (0, 0), (pad, pad), (pad, pad)]
    pads[axis] = (pad - by, pad + by)
    y = reference.conv2d(np.pad(x, pads), w, b, 0, layer.stride, "float64")
    return y[:, :, :shape[2], :shape[3]] if y.shape[2] >= shape[2] and y.shape[3] >= shape[3] else None


def explain(case: dict, got: np.ndarray, res, outputs: dict, tol: float) -> str:
    """A " — ..." clause for the failing check ``case`` (its inputs, weights and layer), or ""."""
    try:
        return _explain(case, got, res, outputs, tol)
    except Exception:  # noqa: BLE001 - a hint is a courtesy: never let it break the judging
        return ""


def _explain(case: dict, got: np.ndarray, res, outputs: dict, tol: float) -> str:
    expected = case["expected"]
    if not isinstance(got, np.ndarray) or got.shape != expected.shape or got.dtype != np.float32:
        return ""
    seen = outputs.get((case["variant"], case["net_name"], case["name"], case["batch"]), [])
    if fingerprint(got) in seen:
        return (" — exactly the output of an earlier call at this batch size, on other inputs: is a result cached "
                "across calls?")
    finite = np.isfinite(got).reshape(got.shape[0], -1)
    n = got.shape[0]
    if n > 1 and not finite.all():
        written = finite.all(axis=1)
        k = int(written.argmin()) if not written.all() else n
        if 0 < k < n and not written[k:].any() and _close(got[:k], expected[:k], tol):
            which = "image 0" if k == 1 else f"images 0 to {k - 1}"
            return (f" — only {which} of the {n} in the batch {'was' if k == 1 else 'were'} written in full: does the "
                    f"launch (the grid, or the loop over images) cover the whole batch?")
        return ""
    if not np.isfinite(got).all():
        return ""
    layer = case.get("layer")
    group = layer if isinstance(layer, tuple) else (layer,) if layer is not None else ()
    x, w = case["x"], case["weights"]
    if len(group) == 1 and group[0].kind == "conv":
        layer = group[0]
        wt, b = w[f"{layer.name}.weight"], w.get(f"{layer.name}.bias")

        def conv(xx, ww, bb):
            return reference.conv2d(xx, ww, bb, layer.pad, layer.stride, "float64")

        if b is not None and _close(got, conv(x, wt, None), tol):
            return " — these are the values without the bias: is b[m] added?"
        if _close(got, conv(x, wt.transpose(0, 1, 3, 2), b), tol):
            return (" — these are the values of the filter transposed (w[m, c, q, p] where w[m, c, p, q] belongs): "
                    "rows and columns of the filter swapped?")
        for axis, what in ((2, "row"), (3, "column")):
            for by in (1, -1):
                shifted = _off_by_one(x, wt, b, layer, axis, by, got.shape)
                if shifted is not None and _close(got, shifted, tol):
                    return (f" — the input window is off by one {what} ({'+' if by > 0 else '-'}1): check the halo "
                            f"index, i * stride + p - pad (or the padding's offset)")
    late = _late_bias(case, group)
    if late is not None and _close(got, late, tol):
        return (" — these are the values with the bias added after the activation (or after the pool): a fused "
                "epilogue adds b[m] to the sum first, then applies the activation, then pools")
    error = res.error if np.isfinite(res.error) else np.inf
    for what, values in _reduced_precision(group, x, w):
        if _close(got, values, tol):
            return (f" — these are the values of {what} (error {error:.1e} > {tol:.0e}): is something computed in "
                    f"reduced precision (float16 inputs, products or results)?")
    return ""


def _late_epilogue(group: tuple, y: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A conv group's epilogue on the conv's sums ``y`` (no bias yet) with the bias added last. A 2 x 2 max and a
    monotonic activation (relu, tanh) commute, and so do the max and a bias of the whole map: the one misplaced
    bias that changes the values is a bias added after the activation, before the pool or after it."""
    for ly in group[1:]:
        y = reference.layer_forward(ly, y, {}, accumulate="float64")
    return y + b.astype(np.float64)[None, :, None, None]


def _biased_activation(group: tuple, w: dict) -> np.ndarray | None:
    """The bias of a group whose epilogue has an activation to put it after, when it has a nonzero one."""
    b = w.get(f"{group[0].name}.bias")
    if len(group) < 2 or group[0].kind != "conv" or not any(ly.kind in ACT_CODES for ly in group[1:]):
        return None
    return b if b is not None and np.any(b) else None


def _late_bias(case: dict, group: tuple) -> np.ndarray | None:
    """The case's answer with the bias added after the activation in every fused conv group: a fused group's case
    (``labkit.check.group_case``), or a whole net whose variant fuses (``fuse``); None where no group has a bias
    and an activation."""
    x, w = case["x"], case["weights"]
    if group:
        b = _biased_activation(group, w)
        if b is None:
            return None
        conv = group[0]
        return _late_epilogue(group, reference.conv2d(x, w[f"{conv.name}.weight"], None, conv.pad, conv.stride,
                                                      "float64"), b)
    net, fuse = case.get("net"), tuple(case.get("fuse") or ())
    if net is None or not fuse:
        return None
    late, y = False, x.astype(np.float64)
    for g in groups(list(net.layers), fuse):
        b = _biased_activation(g, w)
        if b is None:
            for ly in g:
                y = reference.layer_forward(ly, y, w, accumulate="float64")
            continue
        late = True
        conv = g[0]
        y = _late_epilogue(g, reference.conv2d(y, w[f"{conv.name}.weight"], None, conv.pad, conv.stride, "float64"), b)
    return y if late else None


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def _half_products(x: np.ndarray, w: np.ndarray, pad: int, stride: int) -> np.ndarray:
    """The conv's sums of float16 products of float16-rounded x and w (a float16 multiply), added in float64,
    image by image (the products of one image at a time)."""
    from numpy.lib.stride_tricks import sliding_window_view

    k = w.shape[2]
    xp = np.pad(_half(x), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]  # N, C, Ho, Wo, K, K
    wh = _half(w)[:, :, None, None]  # M, C, 1, 1, K, K
    return np.stack([(win[n][None] * wh).astype(np.float64).sum(axis=(1, 4, 5)) for n in range(len(x))])


def _reduced_precision(group: tuple, x: np.ndarray, w: dict):
    """(what, values) of a conv (through its group's epilogue) or an fc computed in float16: inputs and weights
    rounded, then each product too, then the float64 answer rounded; nothing for other layers."""
    if not group or group[0].kind not in ("conv", "fc"):
        return
    layer = group[0]
    wt, b = w[f"{layer.name}.weight"], w.get(f"{layer.name}.bias")
    b64 = None if b is None else b.astype(np.float64)

    def through(y):
        for ly in group[1:]:
            y = reference.layer_forward(ly, y, {}, accumulate="float64")
        return y

    if layer.kind == "fc":
        yield "the same fc with x and w rounded to float16", reference.fc(
            _half(x).astype(np.float64), _half(wt).astype(np.float64), b64, accumulate="float64")
        products = np.stack([(_half(xi)[None] * _half(wt)).astype(np.float64).sum(axis=1) for xi in x])
        yield "the same fc with x, w and each product rounded to float16", products + (0 if b64 is None else b64)
        exact = reference.fc(x, wt, b, accumulate="float64")
    else:
        def conv(xx, ww):
            return reference.conv2d(xx, ww, b64, layer.pad, layer.stride, "float64")

        yield "the same conv with x and w rounded to float16", through(conv(_half(x).astype(np.float64),
                                                                            _half(wt).astype(np.float64)))
        sums = _half_products(x, wt, layer.pad, layer.stride)
        yield ("the same conv with x, w and each product rounded to float16",
               through(sums + (0 if b64 is None else b64[None, :, None, None])))
        exact = through(conv(x, wt))
    yield "the answer rounded to float16", _half(exact).astype(np.float64)
