"""labkit.kernels: the kit's given GPU layers. The fc layer has three kernels (a thread per output for a few images;
for many, a warp per image when the outputs are few and shared-memory tiles when they are many): each must give
x @ w.T + b on every size, ragged tiles and partial warps' inputs included."""

import numpy as np
import pytest

import labkit as lk
from labkit import gpu, kernels

from numba import cuda  # noqa: E402  (after labkit, which sets up numba)


@pytest.mark.parametrize("n, inputs, features", [
    (1, 4, 10),  # a thread per output
    (17, 37, 160),
    (kernels.FC_TILED_FROM, 32, 10),  # a warp per image, every lane one input per step
    (kernels.FC_TILED_FROM + 1, 33, 10),  # a warp per image, one lane with a second input
    (kernels.FC_TILED_FROM + 3, 20, kernels.FC_WARP_MAX),  # fewer inputs than lanes, the most outputs it takes
    (131, 21, 17),  # tiles (more than FC_WARP_MAX features), ragged in images, features and inputs
])
def test_fc_matches_the_float64_product_on_every_size(n, inputs, features):
    rng = np.random.default_rng(n * 1000 + features)
    x = rng.uniform(-1, 1, (n, inputs)).astype(np.float32)
    w = rng.uniform(-1, 1, (features, inputs)).astype(np.float32)
    b = rng.uniform(-1, 1, features).astype(np.float32)
    out = cuda.to_device(np.full((n, features), np.nan, np.float32))  # poisoned: an unwritten element stays NaN
    with gpu.counting() as counts:
        kernels.fc(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out)
    got = out.copy_to_host()
    want = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * inputs)
    many = n >= kernels.FC_TILED_FROM
    want_kernel = "_fc" if not many else "fc_warp" if features <= kernels.FC_WARP_MAX else "fc_tiled"
    assert list(counts.kernels) == [want_kernel]


def test_fc_is_the_kernel_a_variant_gets():
    assert lk.kernels.GIVEN["fc"] is kernels.fc
