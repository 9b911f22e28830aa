"""Resizing stored images into network inputs: bilinear (fashion's 28 x 28 to 70 x 70) and the ECE408 project's own
resize to 48 x 48, reimplemented bit-exactly (``labkit.data.to_input`` uses both).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=None)
def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) matrix of 1-D bilinear resampling, half-pixel centres, edges clamped
    (the same as torch's ``interpolate(mode="bilinear", align_corners=False)`` and OpenCV's INTER_LINEAR)."""
    scale = n_in / n_out
    src = np.clip((np.arange(n_out) + 0.5) * scale - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    m = np.zeros((n_out, n_in), dtype=np.float64)
    m[np.arange(n_out), lo] += 1 - frac
    m[np.arange(n_out), hi] += frac
    return m


def resize_bilinear(images: np.ndarray, size: int) -> np.ndarray:
    """Resize a batch (N, C, H, W) to (N, C, size, size) bilinearly; float32 out."""
    n, c, h, w = images.shape
    rows, cols = bilinear_matrix(h, size), bilinear_matrix(w, size)
    x = images.astype(np.float64)
    return np.einsum("ih,nchw,jw->ncij", rows, x, cols, optimize=True).astype(np.float32)


@lru_cache(maxsize=None)
def _constant_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1-D taps of scikit-image's bilinear ``resize`` (scipy.ndimage.zoom, grid_mode=True, order=1): source
    coordinate ``(i + 0.5) * (n_in / n_out) - 0.5`` (half-pixel centres), left tap ``floor`` of it, weights
    ``w0 = 1 - frac`` and ``w1 = 1 - w0``, computed in float64 in scipy's order so the results match bit for bit."""
    zoom = n_in / n_out
    cc = (np.arange(n_out, dtype=np.float64) + 0.5) * zoom - 0.5
    start = np.floor(cc)
    w0 = 1.0 - (cc - start)
    return start.astype(np.intp), w0, 1.0 - w0


def resize_constant_uint8(images: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The ECE408 project's input preparation, without scikit-image: for each uint8 image (N, C, H, W)
    ``skimage.transform.resize(img / 256, shape, mode='constant', cval=0) * 256`` then ``astype(uint8)``.

    Bilinear (order 1), half-pixel centres; ``mode='constant', cval=0``: a tap outside the image reads 0 (so the
    border fades towards 0, unlike ``resize_bilinear``'s clamped edges), then clipped to the image's own range as
    scikit-image does (``clip=True``). Upscaling, so no anti-aliasing filter
    (scikit-image only smooths when some axis shrinks; this refuses that case). The sum is taken in scipy's order,
    ``((p * wr) * wc)`` over the 2x2 taps row-major, and ``astype(uint8)`` truncates; tests/test_ece408.py says how
    it was checked against scikit-image."""
    x = np.asarray(images)
    if x.dtype != np.uint8 or x.ndim != 4:
        raise ValueError(f"resize_constant_uint8 expects uint8 images (N, C, H, W), got {x.dtype} {x.shape}")
    n, c, h, w = x.shape
    ho, wo = shape
    if ho < h or wo < w:
        raise ValueError(f"resize_constant_uint8 upscales only ({h}x{w} -> {ho}x{wo} would need anti-aliasing)")
    r0, wr0, wr1 = _constant_taps(h, ho)
    c0, wc0, wc1 = _constant_taps(w, wo)
    # zero border: padded index = index + 1, so taps at -1 and at h (w) read the cval 0
    v = x.astype(np.float64) / 256.0
    p = np.pad(v, ((0, 0), (0, 0), (1, 1), (1, 1)))
    rows = (r0 + 1, r0 + 2)
    cols = (c0 + 1, c0 + 2)
    wr, wc = (wr0[:, None], wr1[:, None]), (wc0[None, :], wc1[None, :])
    t = np.zeros((n, c, ho, wo), np.float64)
    for i in range(2):
        pr = p[:, :, rows[i], :]
        for j in range(2):
            t += (pr[:, :, :, cols[j]] * wr[i]) * wc[j]
    # skimage's clip=True: clip to each image's own [min, max] (not widened to cval), except that where cval lies
    # outside that range, outputs exactly equal to cval stay cval. An image with no 0 pixel so gets its faded
    # border raised to its darkest pixel, and a constant image stays constant.
    lo, hi = v.min(axis=(2, 3), keepdims=True), v.max(axis=(2, 3), keepdims=True)
    keep = (t == 0.0) & (lo > 0.0)
    t = np.where(keep, 0.0, np.clip(t, lo, hi))
    return (t * 256.0).astype(np.uint8)
