"""What a failing check most likely got wrong, said in the grader's message (the first failing check of a job).

``labkit.check.compare`` already names the layout (NHWC) and an output never written; the grader, which keeps the
inputs of every case, can also try the usual mistakes on them with the float64 reference and name the one whose
values the student's output matches: a result cached from an earlier call, images of the batch never written (the
grid does not cover it), the bias left out, the filter transposed, the input window off by one (the halo), or values
close to the reference but above the tolerance (reduced precision).
"""

from __future__ import annotations

import hashlib

import numpy as np

from .. import reference


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
    error = res.error if np.isfinite(res.error) else np.inf
    if layer is not None and layer.kind == "conv":
        x, w = case["x"], case["weights"]
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
    if tol < error < 1e-2:
        return (f" — close to the reference but not within the tolerance ({error:.1e} > {tol:.0e}): is something "
                f"computed in reduced precision (float16 inputs or accumulation)?")
    return ""
