"""lk.whole.Job's graphs (issue 35, point 4): where the variant's forward pass can be captured, ``classes`` on a lane
replays one CUDA graph per lane, chunk size and input buffer, captured on first use and again after the buffer pool
was released; never while the pipeline check runs a case, while a recorder counts launches, on the default stream,
or with ``graphs=False``; a capture that fails turns them off and the job goes on launching. On the CPU the
capture is a stand-in that records what would be captured and replays by calling (as ``lk.graphs`` does on the
simulator), and the job is told it is on a GPU with cupy streams."""

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

import labkit as lk
from labkit import gpu, graphs, simulator, whole

from pipelines import pipeline  # noqa: E402  (tests/ is on the path)
from test_streams import HOST_MATH, raw_images  # noqa: E402

GRAPHED = lk.Variant(HOST_MATH.impls, arrays="device", graph=True, name="host_math_graphed")


@pytest.fixture
def net():
    return simulator.net("cifar10")


@pytest.fixture
def captures(monkeypatch):
    """graphs.capture replaced: each capture recorded, the graph replays by calling on the lane."""
    if not lk.device.info().simulated:
        pytest.skip("the CPU's stand-in for a capture (on a GPU: test_a_gpu_job_captures_and_replays_its_chunks)")
    made = []

    def capture(fn, lane):
        made.append(lane.name)
        with lane:
            out = fn()
        return graphs.Graph(fn, lane, None, out, "stand-in")

    monkeypatch.setattr(graphs, "capture", capture)
    monkeypatch.setattr(whole, "simulator", SimpleNamespace(active=lambda: False))
    return made


def _job(net, **kw):
    job = whole.Job(net, GRAPHED, lk.random_weights(net, 0), **kw)
    for lane in job.lanes(3):
        lane.cupy = nullcontext()  # a GPU's lane has a cupy stream; the stand-in enters it as a context
    return job


def _classify(job, raw, chunk, count):
    classes = lk.streams.pinned((len(raw),), np.int32)
    classes[...] = -1
    pipeline(job, raw, classes, chunk, count)
    return np.array(classes)


def test_one_capture_per_lane_and_chunk_size_then_replays(net, captures):
    job = _job(net)
    raw = raw_images(net, 7, seed=3)
    want = job.serial(raw)
    assert not captures  # the default stream never replays
    assert (_classify(job, raw, 2, 2) == want).all()
    # chunks of 2, 2, 2 and 1 on lanes 0, 1, 0, 1: lane0 one size, lane1 two
    a, b = job.lanes(2)
    assert sorted(captures) == [a.name, b.name, b.name]
    assert len(job._graphs) == 3
    captures.clear()
    assert (_classify(job, raw, 2, 2) == want).all() and not captures  # replayed, nothing captured again
    assert (_classify(job, raw, 3, 2) == want).all() and len(captures) == 3  # new sizes: captured
    captures.clear()
    gpu.DEVICE.release()  # the pool's buffers are gone: what the graphs point at with them
    assert (_classify(job, raw, 2, 2) == want).all() and len(captures) == 3
    assert all(k[3] == gpu.DEVICE.generation for k in job._graphs)  # the old generation's graphs dropped


def test_no_graphs_while_checking_recording_or_when_turned_off(net, captures):
    raw = raw_images(net, 5, seed=4)
    job = _job(net)
    assert whole.check_pipeline(pipeline, job, cases=((5, 2, 2),), seed=1).passed
    assert not captures  # run_pipeline's cases launch every time
    with gpu.counting() as counts:
        got = _classify(job, raw, 2, 2)
    assert not captures and counts.launches > 0  # a recorder sees every launch
    assert (got == job.serial(raw)).all()
    off = _job(net, graphs=False)
    assert not off.replays(off.lanes(1)[0])
    _classify(off, raw, 2, 2)
    assert not captures
    plain = whole.Job(net, HOST_MATH, lk.random_weights(net, 0))  # graph=False: its forward may not capture
    assert not plain.graphs and whole.Job(net, HOST_MATH, lk.random_weights(net, 0), graphs=True).graphs


def test_a_failed_capture_turns_the_graphs_off_and_the_job_goes_on(net, captures, monkeypatch):
    def refuse(fn, lane):
        raise graphs.CaptureError("capture failed: CUDAError: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT")

    monkeypatch.setattr(graphs, "capture", refuse)
    job = _job(net)
    raw = raw_images(net, 5, seed=5)
    assert (_classify(job, raw, 2, 2) == job.serial(raw)).all()
    assert not job.graphs and "CAPTURE_IMPLICIT" in job.graph_note


@pytest.mark.skipif(not lk.device.info().simulated, reason="the simulator's own behaviour")
def test_the_simulator_never_replays(net):
    job = whole.Job(net, GRAPHED, lk.random_weights(net, 0))
    assert job.graphs and not job.replays(job.lanes(1)[0])  # no cupy stream there, and the simulator


@pytest.mark.skipif(lk.device.info().simulated, reason="a real capture needs a GPU with cupy")
def test_a_gpu_job_captures_and_replays_its_chunks():
    from test_streams import KERNELS

    net = lk.get_net("cifar10")
    variant = lk.Variant(KERNELS.impls, arrays="device", graph=True, name="kernels_graphed")
    job = whole.Job(net, variant, lk.random_weights(net, 6))
    raw = raw_images(net, 301, seed=6)
    want = job.serial(raw)
    for _ in range(3):  # captured on the first call, replayed on the others
        assert (_classify(job, raw, 64, 3) == want).all(), job.graph_note
    assert job.graphs and job.replays(job.lanes(1)[0]) and len(job._graphs) == 4  # 64 on lanes 0-2, 45 on lane 1
