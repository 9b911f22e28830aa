"""labkit.stream_order: the simulator's model of the order between lanes (who last wrote a buffer, and whether
anything orders a later use on another lane after it), the GPU's delays, and streams' refusal of raw streams.
Stage 10's pipeline check through it: tests/test_streams.py."""

import sys
import time
import types

import numpy as np
import pytest
from numba import cuda

from labkit import device, gpu, stream_order, streams

SIM = device.info().simulated
needs_sim = pytest.mark.skipif(not SIM, reason="the simulator's order model (a GPU has the delays instead)")


@cuda.jit
def _copy(x, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i]


def _launch_copy(x, out):
    gpu.launch_grid(_copy, 1, 4, x, out)


def _filled(role: str, rng):
    """A pooled device buffer of four floats, fresh random values, written on the default stream."""
    buf = gpu.buffer(role, (4,))
    gpu.to_device(rng.standard_normal(4).astype(np.float32), to=buf)
    return buf


@pytest.fixture
def rng():
    return np.random.default_rng()


@needs_sim
def test_a_read_on_another_lane_before_the_writers_synchronize_raises(rng):
    a, b = streams.lanes(2)
    x, out = _filled("order test x", rng), _filled("order test out", rng)
    a.chunk = int(rng.integers(10))
    with a:
        _launch_copy(x, out)
    host = streams.pinned(4, np.float32)
    with b, pytest.raises(stream_order.StreamOrderError) as raised:
        gpu.to_host(out, out=host)
    assert str(raised.value) == (
        f"{b.name} reads 'order test out' (chunk {a.chunk}, written by {a.name}'s kernels) with nothing ordering it "
        f"after them: queue a chunk's upload, classes and download on one lane, or synchronize {a.name} first")
    a.synchronize()
    with b:
        gpu.to_host(out, out=host)  # ordered now
    b.synchronize()
    np.testing.assert_array_equal(host, gpu.as_host(x))


@needs_sim
def test_every_argument_of_a_launch_is_read_but_only_the_changed_ones_were_written(rng):
    a, b = streams.lanes(2)
    x, out = _filled("order test x", rng), _filled("order test out", rng)
    with a:
        gpu.to_device(rng.standard_normal(4).astype(np.float32), to=x)
    with b, pytest.raises(stream_order.StreamOrderError, match=rf"^{b.name} reads 'order test x' \((chunk .*, )?"
                                                                rf"written by {a.name}'s copy\) .* after it:"):
        _launch_copy(x, out)  # x only read by the kernel: still a use of lane a's copy
    a.synchronize()
    with b:
        _launch_copy(x, out)  # reads x, writes out
    with a:
        _launch_copy(x, _filled("order test other", rng))  # x was read on b, not written: no order needed
        with pytest.raises(stream_order.StreamOrderError, match=rf"^{a.name} reads 'order test out'"):
            _launch_copy(out, x)
    gpu.synchronize()


@needs_sim
def test_a_copy_into_a_buffer_another_lane_wrote_raises_as_a_write(rng):
    a, b = streams.lanes(2)
    x = _filled("order test x", rng)
    with a:
        _launch_copy(_filled("order test y", rng), x)
    written = rf"^{b.name} writes 'order test x' .*{a.name}'s kernels"
    with b, pytest.raises(stream_order.StreamOrderError, match=written):
        gpu.to_device(np.zeros(4, np.float32), to=x)
    gpu.synchronize()


@needs_sim
@pytest.mark.parametrize("order", ["lk.gpu.synchronize", "a launch on the default stream",
                                   "a copy on the default stream", "the same lane"])
def test_what_orders_a_lanes_work_before_another_lanes(rng, order):
    a, b = streams.lanes(2)
    x, out, other = (_filled(f"order test {role}", rng) for role in ("x", "out", "other"))
    with a:
        _launch_copy(x, out)
    if order == "lk.gpu.synchronize":
        gpu.synchronize()
    elif order == "a launch on the default stream":
        _launch_copy(x, other)  # no lane: it waits for the lanes, and they for it
    elif order == "a copy on the default stream":
        gpu.to_host(other)
    reader = a if order == "the same lane" else b
    with reader:
        gpu.to_host(out, out=streams.pinned(4, np.float32))
    gpu.synchronize()
    assert not stream_order._steps and not stream_order._writers  # all ordered: the model holds nothing


def test_raw_streams_are_refused_in_the_block_and_lanes_still_work(monkeypatch):
    monkeypatch.setattr(streams, "_makers", dict(streams._makers))  # the fake cupy below must not stay bound

    class FakeStream:
        null = "the null stream"

        def __init__(self, non_blocking=False):
            self.non_blocking = non_blocking

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Stream=FakeStream)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(streams, "_cupy_streams", lambda: False)  # lanes() from numba's maker, on a GPU too
    before = cuda.stream
    with streams.refusing_raw_streams():
        with pytest.raises(stream_order.StreamOrderError) as raised:
            cuda.stream()
        assert str(raised.value) == ("cuda.stream() makes a stream of its own, refused while the pipeline check runs: "
                                     "use job.lanes(n) (lk.streams): the check sees the order of work on lanes only")
        with pytest.raises(stream_order.StreamOrderError, match=r"^cupy\.cuda\.Stream\(\) makes a stream"):
            fake.cuda.Stream(non_blocking=True)
        assert fake.cuda.Stream.null == "the null stream"  # the class's own attributes are still there
        assert len(streams.lanes(2)) == 2
        assert streams._cupy_stream() is FakeStream  # what lanes() makes cupy's streams with
    assert cuda.stream is before and fake.cuda.Stream is FakeStream
    assert isinstance(fake.cuda.Stream(), FakeStream)


@needs_sim
def test_hold_back_queues_nothing_on_the_simulator(rng):
    lanes = streams.lanes(3)
    with gpu.counting() as counts:
        assert stream_order.hold_back(lanes, lanes[1], rng) == {}
    assert counts.launches == 0


@pytest.mark.skipif(SIM, reason="a GPU's delays (the simulator has no nanosleep; its order model does their job)")
def test_hold_back_delays_each_lane_longest_the_chosen_one(rng):
    lanes = streams.lanes(4)
    stream_order.hold_back(lanes, lanes[0], rng)  # compiles the spin kernel
    gpu.synchronize()
    start = time.perf_counter()
    ms = stream_order.hold_back(lanes, lanes[2], rng)
    queued = time.perf_counter() - start
    lanes[2].synchronize()
    took = time.perf_counter() - start
    assert ms[lanes[2].name] == stream_order.LONGEST_MS == max(ms.values()) and len(set(ms.values())) == 4
    assert 1e3 * queued < stream_order.LONGEST_MS / 2 <= 1e3 * took, (queued, took)  # queued at once, then waited
    gpu.synchronize()
