"""labkit.profile: call counts, bytes and an nvprof-shaped table of the launches and copies made through
labkit.gpu, on the simulator or a GPU."""

import re
import time

import numpy as np
import pytest

from labkit import device, gpu
from labkit.profile import HEADER, Profiler, format_time  # labkit first: it makes a late NUMBA_ENABLE_CUDASIM count

from numba import cuda  # noqa: E402  (isort: skip)

ON_GPU = device.is_gpu()


@cuda.jit
def add_one(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] + 1.0


def test_profiler_counts_launches_copies_and_bytes(rng):
    n = int(rng.integers(5, 40))
    images = 3
    host = rng.standard_normal(n).astype(np.float32)
    results = []
    gpu.to_device(host)  # before the profiler: not recorded
    with Profiler() as prof:
        assert prof.simulated is (not ON_GPU)
        assert prof.method == ("cuda-events" if ON_GPU else "perf_counter")
        for _ in range(images):  # per-image style: copy in, launch, copy out
            d_x = gpu.to_device(host)
            d_y = cuda.device_array_like(d_x)
            gpu.launch(add_one, n, d_x, d_y, block=32)
            results.append(gpu.to_host(d_y))
        with prof.activity("pad", kind="other"):
            time.sleep(0.001)
    gpu.to_device(host)  # after it: not recorded either
    for r in results:
        np.testing.assert_allclose(r, host + 1.0)

    rows = {r["name"]: r for r in prof.rows()}
    assert set(rows) == {"add_one", "[CUDA memcpy HtoD]", "[CUDA memcpy DtoH]", "pad"}
    assert rows["add_one"]["calls"] == images and rows["add_one"]["kind"] == "kernel"
    assert rows["[CUDA memcpy HtoD]"]["calls"] == images
    assert rows["[CUDA memcpy HtoD]"]["bytes"] == images * n * 4
    assert rows["[CUDA memcpy DtoH]"]["bytes"] == images * n * 4
    assert rows["pad"]["kind"] == "other" and rows["pad"]["total"] >= 0.001
    for r in rows.values():
        assert r["min"] <= r["avg"] <= r["max"] and r["total"] == pytest.approx(r["avg"] * r["calls"])
    on_gpu = [r for r in prof.rows() if r["kind"] != "other"]
    assert [r["total"] for r in on_gpu] == sorted((r["total"] for r in on_gpu), reverse=True)
    assert sum(r["percent"] for r in on_gpu) == pytest.approx(100.0)
    assert prof.calls(kind="kernel") == images and prof.calls() == 3 * images + 1

    prof.reset()
    assert prof.rows() == [] and prof.calls() == 0


def test_named_copies_and_copy_into_existing(rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    out = np.empty_like(w)
    with Profiler() as prof:
        d_w = gpu.to_device(w, name="weights")
        gpu.to_device(w * 2, to=d_w)
        gpu.to_host(d_w, out=out, name="result")
    np.testing.assert_array_equal(out, w * 2)
    names = {r["name"]: r for r in prof.rows()}
    assert names["[CUDA memcpy HtoD] weights"]["bytes"] == w.nbytes
    assert names["[CUDA memcpy HtoD]"]["calls"] == 1
    assert names["[CUDA memcpy DtoH] result"]["kind"] == "DtoH"


def test_table_layout():
    prof = Profiler()
    for _ in range(4):
        with prof.activity("conv1_kernel"):
            time.sleep(0.002)
    with prof.activity("[CUDA memcpy HtoD]", kind="HtoD", nbytes=100):
        pass
    with prof.activity("host_pool", kind="other"):
        pass
    lines = prof.table().split("\n")
    assert ("CUDA simulator" in lines[0]) is (not ON_GPU)
    assert lines[1] == HEADER
    cols = r"\s+(\d+\.\d\d)%\s+(\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(.+)"
    m = re.fullmatch(r" GPU activities:" + cols, lines[2])
    assert m, lines[2]
    assert m[7] == "conv1_kernel" and m[3] == "4" and m[2].endswith("ms")
    assert lines[2].index("%") == HEADER.index("Time(%)") + len("Time(%)") - 1  # columns line up
    assert lines[2].index("conv1_kernel") == HEADER.index("Name")
    m = re.fullmatch(" {16}" + cols, lines[3])
    assert m and m[7] == "[CUDA memcpy HtoD]" and m[3] == "1"
    assert re.fullmatch(r"\s+Other:" + cols, lines[4]) and lines[4].endswith("host_pool")
    assert len(lines) == 5


def test_bad_kind_and_empty_table():
    prof = Profiler()
    with pytest.raises(ValueError, match="kind"):
        with prof.activity("x", kind="gpu"):
            pass
    assert "No activities recorded." in prof.table()


@pytest.mark.parametrize("seconds,text", [
    (13.431, "13.431s"), (1.34, "1.3400s"), (3.7402e-3, "3.7402ms"), (280.03e-3, "280.03ms"),
    (25.824e-6, "25.824us"), (3.504e-6, "3.5040us"), (960e-9, "960ns"), (0.0, "0ns"), (0.99999999, "1.0000s"),
])
def test_format_time_like_nvprof(seconds, text):
    assert format_time(seconds) == text
