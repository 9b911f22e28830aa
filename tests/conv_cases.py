"""Cases and the float64 expectation shared by the tests of the kit's given CUDA C convs (Winograd, tensor cores)."""

import numpy as np

from labkit import gpu, reference

#: (images, channels, rows, columns, maps, pad, activation, pool): odd maps, overhanging tiles, a pool that drops a
#: row and a column (odd conv output), one channel, padding 0 and 2
CASES = [(3, 3, 8, 12, 16, 2, 1, 2), (2, 5, 13, 11, 6, 0, 2, 2), (1, 1, 11, 10, 13, 0, 2, 2),
         (2, 4, 9, 7, 6, 0, 0, 0), (5, 2, 6, 9, 4, 2, 1, 0)]


def expected(x, w, b, pad, act, pool):
    y = reference.conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), pad)
    y = np.maximum(y, 0) if act == 1 else np.tanh(y) if act == 2 else y
    return reference.maxpool2d(y, 2, 2) if pool else y


def case(seed, n, c, h, wd, m):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd), dtype=np.float32)
    w = (rng.standard_normal((m, c, 5, 5), dtype=np.float32) / np.sqrt(25 * c)).astype(np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    return x, w, b


def run(conv, x, w, b, pad, act, pool, shape, **kwargs) -> np.ndarray:
    """``conv`` (the fused conv convention) on device copies, into a NaN-poisoned output: an unwritten one stays NaN."""
    out = gpu.to_device(np.full(shape, np.nan, np.float32))
    conv(gpu.to_device(x), gpu.to_device(w), gpu.to_device(b), out, pad, 1, act, pool, **kwargs)
    return gpu.as_host(out)


def rel_error(got, want) -> float:
    """‖got − want‖ / ‖want‖, after asserting that every output was written."""
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} outputs unwritten"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))
