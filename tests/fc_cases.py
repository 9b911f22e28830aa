"""A fully connected layer's inputs for the fc kernels' tests (tests/test_gemm.py, tests/test_gemm_cuda.py): fresh
seeded random x, w and b, and the float64 product every kernel is compared with."""

import numpy as np


def layer(N: int, K: int, OUT: int, seed: int = 0):
    """(x, w, b, x @ w.T + b in float64) for N images, K inputs and OUT outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, K)).astype(np.float32)
    w = rng.standard_normal((OUT, K)).astype(np.float32)
    b = rng.standard_normal(OUT).astype(np.float32)
    return x, w, b, x.astype(np.float64) @ w.T.astype(np.float64) + b
