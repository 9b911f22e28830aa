"""A fully connected layer's inputs for the fc kernels' tests (tests/test_gemm.py, tests/test_gemm_cuda.py,
tests/test_fc_tensor_cores.py): fresh seeded random x, w and b, the float64 product every kernel is compared with,
and the device arrays and comparison those tests share."""

import numpy as np

from labkit import gpu


def layer(N: int, K: int, OUT: int, seed: int = 0):
    """(x, w, b, x @ w.T + b in float64) for N images, K inputs and OUT outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, K)).astype(np.float32)
    w = rng.standard_normal((OUT, K)).astype(np.float32)
    b = rng.standard_normal(OUT).astype(np.float32)
    return x, w, b, x.astype(np.float64) @ w.T.astype(np.float64) + b


def on_device(a, offset=0):
    """``a`` on the device inside a NaN buffer, starting ``offset`` floats in (1: not on 16 bytes)."""
    whole = np.full(a.size + offset + 64, np.nan, np.float32)
    whole[offset:offset + a.size] = a.ravel()
    return gpu.to_device(whole)[offset:offset + a.size].reshape(a.shape)


def run(fn, x, w, b, offset=0):
    """``fn(x, w, b, out)`` on the device, x and w ``offset`` floats into NaN buffers, out poisoned (unwritten stays
    NaN); out on the host."""
    out = gpu.to_device(np.full((x.shape[0], w.shape[0]), np.nan, np.float32))
    fn(on_device(x, offset), on_device(w, offset), on_device(b), out)
    return gpu.as_host(out)


def close(got, want):
    """Every output written and within fp32's error of a K-long sum."""
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} outputs unwritten or NaN read"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def record_plans(monkeypatch, module) -> list:
    """The plans ``module.launch`` is called with, in order (the launch still runs)."""
    seen = []
    real = module.launch
    monkeypatch.setattr(module, "launch", lambda p, *a: (seen.append(p), real(p, *a))[1])
    return seen
