"""labkit.timing: what each timer measures on this machine, the median of timed calls, per-section clocks."""

import time

import numpy as np
import pytest

from labkit import device, gpu, timing
from labkit.timing import Clock, measure

from numba import cuda  # noqa: E402  (after labkit, which makes a late NUMBA_ENABLE_CUDASIM count)

ON_GPU = device.is_gpu()


def test_timer_measures_a_sleep():
    with timing.Timer("perf_counter") as t:
        time.sleep(0.02)
    assert t.method == "perf_counter"
    assert 0.015 < t.seconds < 0.5


def test_auto_method_is_events_on_a_gpu_and_perf_counter_elsewhere():
    assert timing.resolve_method("auto") == ("cuda-events" if ON_GPU else "perf_counter")
    assert timing.resolve_method("cuda-events") == ("cuda-events" if ON_GPU else "perf_counter")
    assert timing.resolve_method("perf_counter") == "perf_counter"
    with pytest.raises(ValueError):
        timing.resolve_method("stopwatch")
    timing.sync()  # waits for the GPU, or does nothing: must not fail either way


def test_measure_skips_warmup_and_takes_the_median():
    sleeps = iter([0.2, 0.2, 0.03, 0.001, 0.05, 0.002, 0.01])  # two warm-ups, then five timed calls
    calls = []

    def fn(tag, scale=1.0):
        calls.append(tag)
        s = next(sleeps) * scale
        time.sleep(s)
        return s

    m = measure(fn, "x", warmup=2, repeat=5, scale=1.0, method="perf_counter")
    assert len(calls) == 7 and calls == ["x"] * 7
    assert len(m.times) == 5
    assert all(t < 0.15 for t in m.times)  # the slow warm-ups were not timed
    assert m.median == sorted(m.times)[2]
    assert 0.01 <= m.median < 0.03  # the median of 0.03, 0.001, 0.05, 0.002, 0.01
    assert m.result == 0.01 and m.method == "perf_counter" and m.simulated is (not ON_GPU)
    assert m.min <= m.median <= m.max


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError):
        measure(lambda: None, repeat=0)
    with pytest.raises(ValueError):
        measure(lambda: None, warmup=-1)


def test_clock_sums_repeated_sections_and_keeps_them_apart():
    clock = Clock("perf_counter")
    for _ in range(3):
        with clock.section("a"):
            time.sleep(0.004)
        with clock.section("b"):
            pass
    seconds = clock.seconds()
    assert set(seconds) == {"a", "b"}
    assert seconds["a"] >= 0.012 > seconds["b"]


@cuda.jit
def spin(out, n):
    t = cuda.grid(1)
    if t < out.size:
        acc = 0.0
        for k in range(n):
            acc += k * 0.5
        out[t] = acc


def test_auto_clock_times_gpu_work_on_this_machine():
    out = cuda.device_array(64, np.float32)
    clock = Clock("auto")
    assert clock.method == ("cuda-events" if ON_GPU else "perf_counter")
    with clock.section("spin"):
        gpu.launch(spin, out.size, out, 200)
    assert clock.seconds()["spin"] > 0
    assert out.copy_to_host()[1] == pytest.approx(sum(k * 0.5 for k in range(200)))
