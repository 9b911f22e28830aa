"""labkit.const_kernels: a kernel per weights is made once for equal weights in new arrays (the bench's workloads),
found by identity on every later call, and made anew for other weights or other extras."""

import numpy as np

from labkit import const_kernels, gpu


def test_equal_weights_in_a_new_array_reuse_the_kernel_and_others_get_their_own():
    made = []
    kernels = const_kernels.PerWeights(lambda w, act: made.append((w.copy(), act)) or len(made))
    w = np.random.default_rng(3).standard_normal((4, 2, 5, 5)).astype(np.float32)
    first = gpu.to_device(w)
    assert kernels(first, 1) == kernels(first, 1) == 1
    assert kernels(gpu.to_device(w.copy()), 1) == 1  # a new workload's copy of the same weights
    assert kernels(first, 2) == 2  # another activation: another kernel
    other = w.copy()
    other[3, 1, 4, 4] += 1
    assert kernels(gpu.to_device(other), 1) == 3
    assert kernels.made == 3 and np.array_equal(made[0][0], w)


def test_a_kernel_is_found_by_identity_without_reading_the_weights_again(monkeypatch):
    kernels = const_kernels.PerWeights(lambda w: object())
    w = gpu.to_device(np.ones((2, 1, 5, 5), np.float32))
    k = kernels(w)
    monkeypatch.setattr(gpu, "as_host", lambda a: (_ for _ in ()).throw(AssertionError("weights read again")))
    assert kernels(w) is k


def test_it_keeps_at_most_keep_kernels():
    kernels = const_kernels.PerWeights(lambda w: float(w.sum()), keep=2)
    arrays = [np.full((1, 1, 5, 5), v, np.float32) for v in range(4)]
    for a in arrays:
        kernels(a)
    assert len(kernels._by_id) == len(kernels._by_content) == 2
    assert kernels(arrays[0]) == 0.0 and kernels.made == 5  # evicted: made again
