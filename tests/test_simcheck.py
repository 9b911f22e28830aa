"""labkit.simcheck: races and missing barriers caught on the simulator, with the element, the threads and the
line; loads and stores counted. (On a real GPU the instrumentation is off: a race there shows in the values.)"""

import numpy as np
import pytest

import labkit as lk
from labkit import gpu, simcheck, simulator

from numba import cuda, float32  # noqa: E402  (after labkit)

from buggy_kernels import conv_channel_atomic as conv_atomic, conv_channel_race as conv_race  # noqa: E402

pytestmark = pytest.mark.skipif(not simulator.active(), reason="the instrumentation watches the CUDA simulator")


@cuda.jit
def block_sum(x, out, with_barrier):
    """Each block sums its slice of x in shared memory: thread 0 reads what the others wrote."""
    part = cuda.shared.array(8, float32)
    t = cuda.threadIdx.x
    part[t] = x[cuda.blockIdx.x * cuda.blockDim.x + t]
    if with_barrier:
        cuda.syncthreads()
    if t == 0:
        acc = float32(0.0)
        for k in range(cuda.blockDim.x):
            acc += part[k]
        out[cuda.blockIdx.x] = acc


def test_the_channel_race_fails_its_check_and_names_element_threads_and_line():
    r = lk.check_layer(conv_race, "cifar10", "conv2", arrays="device", quiet=True)
    assert not r.passed and "data race" in r.detail and "write conflict" in r.detail
    assert "out[0, 0, 0, 0]" in r.detail and "of block" in r.detail
    assert "out[n, m, i, j] += acc" in r.detail and "channel_partial_sums" in r.detail


def test_the_same_sums_through_atomics_pass():
    assert lk.check_layer(conv_atomic, "cifar10", "conv2", arrays="device", quiet=True).passed


def test_a_missing_barrier_before_reading_shared_memory_is_caught():
    x = cuda.to_device(np.arange(16, dtype=np.float32))
    for barrier, hazards in ((True, 0), (False, 1)):
        out = cuda.device_array(2, np.float32)
        with simcheck.watching() as w:
            block_sum[2, 8](x, out, barrier)
        assert len(w.conflicts) == hazards
    text = w.conflicts[0].describe()
    assert "shared-memory" in text and "with no barrier between on part[" in text
    assert "acc += part[k]" in text and "part[t] = x[" in text  # the two lines that race


def test_loads_and_stores_are_counted_per_kind_and_thread():
    x = cuda.to_device(np.arange(16, dtype=np.float32))
    out = cuda.device_array(2, np.float32)
    with simcheck.watching() as w:
        block_sum[2, 8](x, out, True)
    (launch,) = w.launches
    assert launch.loads["global"] == 16 and launch.stores["shared"] == 16 and launch.loads["shared"] == 16
    assert launch.stores["global"] == 2 and launch.threads == 16
    assert launch.per_thread_max("shared load") == 8  # thread 0 of each block reads all 8
    assert w.totals()["global load"] == 16


def test_nothing_is_watched_outside_the_block():
    x = cuda.to_device(np.arange(16, dtype=np.float32))
    out = cuda.device_array(2, np.float32)
    with simcheck.watching() as w:
        pass
    block_sum[2, 8](x, out, False)  # outside: not recorded, not judged
    assert w.launches == []


def test_the_engines_nan_diagnosis_is_neither_counted_nor_watched():
    """A layer whose output holds NaN runs twice more (``engine.checked_call``): those launches are not the call's,
    so neither the launch count nor a watch (races, the access log of ``lk.show``) sees them; a watch opened while
    paused leaves the outer one's instrumentation in place."""
    from buggy_kernels import conv_short_grid

    from labkit import check, engine

    case = check.layer_case("cifar10", "conv1", 1, np.random.default_rng())
    with gpu.counting() as counts, simcheck.watching(log=True) as watch:
        called = engine.checked_call(conv_short_grid, case.layer, case.x, case.weights, "device")
        with simcheck.paused(), simcheck.watching() as inner:
            conv_short_grid(*[gpu.to_device(a) for a in (case.x, *case.weights.values())],
                            gpu.to_device(np.zeros_like(case.expected)), case.layer.pad, case.layer.stride)
        conv_short_grid(*[gpu.to_device(a) for a in (case.x, *case.weights.values())],
                        gpu.to_device(np.zeros_like(case.expected)), case.layer.pad, case.layer.stride)
    assert called.nan is not None and called.nan.unwritten > 0
    assert counts.launches == 3 and len(watch.launches) == 2 and len(inner.launches) == 1
    assert not simcheck._installed and not simcheck._active and not simcheck._paused
