"""labkit.streams, graphs, whole (issue 24's closing stage): lanes route every launch and copy of the launch layer,
engine.forward leaves its output on the device, graphs on the simulator say there is none and replay by calling,
and the whole job's pieces (Job) and its pipeline check (check_pipeline) catch the pipelines' usual mistakes."""

import numpy as np
import pytest

import labkit as lk
from labkit import device, engine, gpu, graphs, simulator, streams, whole

from buggy_kernels import device_conv  # noqa: E402  (after labkit, which sets up numba)
from pipelines import (downloads_on_another_lane, forgets_the_last_chunk, forgets_to_synchronize,  # noqa: E402
                       makes_its_own_streams, mixes_lanes, pipeline)

SIM = device.info().simulated
needs_sim = pytest.mark.skipif(not SIM, reason="the simulator's own behaviour (no streams, no graphs)")


def _on_device(compute):
    """A layer function of the device calling convention that computes on the host (numpy): the simulator runs
    kernels as Python threads, so the tests of the plumbing around the layers use these."""

    def fn(*args):
        return compute(args, [gpu.as_host(a) if hasattr(a, "copy_to_host") else a for a in args])

    return fn


def _conv(args, host):
    x, w, b, out, pad, stride = host
    args[3].copy_to_device(lk.conv2d(x, w, b, pad, stride).astype(np.float32))


def _unary(f):
    def run(args, host):
        args[1].copy_to_device(np.ascontiguousarray(f(host[0]), np.float32))
    return run


def _pool(args, host):
    x, out, k, s = host
    args[1].copy_to_device(lk.maxpool2d(x, k, s).astype(np.float32))


def _fc(args, host):
    x, w, b, out = host
    args[3].copy_to_device(lk.fc(x, w, b).astype(np.float32))


HOST_MATH = lk.Variant({"conv": _on_device(_conv), "relu": _on_device(_unary(lk.relu)),
                        "tanh": _on_device(_unary(lk.tanh)), "pool": _on_device(_pool), "fc": _on_device(_fc),
                        "softmax": _on_device(_unary(lk.softmax))}, arrays="device", name="host_math")
KERNELS = lk.Variant({**lk.kernels.GIVEN, "conv": device_conv}, arrays="device", name="kernels")


@pytest.fixture(scope="module")
def net():
    return simulator.net("cifar10") if SIM else lk.get_net("cifar10")


@pytest.fixture(scope="module")
def job(net):
    return whole.Job(net, HOST_MATH, lk.random_weights(net, 0))


def raw_images(net, n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, *net.input_shape), dtype=np.uint8)


# ------------------------------------------------------------------------------------------------ lanes


class SpyKernel:
    """A launchable stand-in: records the launch configuration numba would get (grid, block[, stream, shared])."""

    def __init__(self):
        self.configs = []

    def __getitem__(self, config):
        self.configs.append(config)
        return lambda *args: None


def test_lanes_route_launches_and_nesting_restores():
    a, b = streams.lanes(2)
    assert a.id != b.id and a.name != b.name
    k = SpyKernel()
    gpu.launch(k, 10)
    with a:
        assert streams.current() is a
        gpu.launch(k, 300)
        with b:
            gpu.launch_grid(k, (2, 3), (4, 4), shared_bytes=64)
        gpu.launch(k, 5)
    gpu.launch(k, 5, shared_bytes=8)
    assert streams.current() is None
    assert k.configs[0] == (1, 128)
    assert k.configs[1] == (3, 128, a.numba, 0)
    assert k.configs[2] == ((2, 3), (4, 4), b.numba, 64)
    assert k.configs[3][2] is a.numba
    assert k.configs[4] == (1, 128, 0, 8)


class SpyCupyStream:
    def __init__(self):
        self.inside = 0
        self.seen = []

    def __enter__(self):
        self.inside += 1
        return self

    def __exit__(self, *exc):
        self.inside -= 1


def test_launch_raw_goes_to_the_lanes_cupy_stream():
    stream = SpyCupyStream()
    lane = streams.Lane(streams.lanes(1)[0].numba, stream)

    def raw_kernel(grid, block, args, shared_mem=0):
        stream.seen.append(stream.inside)

    raw_kernel.name = "raw"
    gpu.launch_raw(raw_kernel, 1, 1, ())
    with lane:
        assert stream.inside == 1  # cupy's own routines queue on the lane too
        gpu.launch_raw(raw_kernel, 1, 1, (np.float32(1),))
    assert stream.seen == [0, 2] and stream.inside == 0


class SpyDeviceArray:
    def __init__(self):
        self.streams = []

    def copy_to_device(self, host, stream=0):
        self.streams.append(stream)


def test_copies_go_to_the_lane_and_host_copies_wait_for_synchronize():
    lane = streams.lanes(1)[0]
    dev = SpyDeviceArray()
    gpu.to_device(np.zeros(3), to=dev)
    with lane:
        gpu.to_device(np.zeros(3), to=dev)
    assert dev.streams == [0, lane.numba]
    d = gpu.to_device(np.arange(4, dtype=np.float32))
    out = streams.pinned(4, np.float32)
    out[...] = -1
    with lane:
        assert gpu.to_host(d, out=out) is out
    if SIM:  # the simulator delivers a lane's copies into pinned memory at its synchronize, as a GPU may
        assert (out == -1).all()
    lane.synchronize()
    np.testing.assert_array_equal(out, np.arange(4))
    out[...] = -1
    with lane:
        gpu.to_host(d, out=out)
    gpu.synchronize()  # the device-wide wait delivers every lane's copies too
    np.testing.assert_array_equal(out, np.arange(4))
    pageable = np.full(4, -1, np.float32)
    with lane:
        gpu.to_host(d, out=pageable)  # into pageable memory a copy is done when the call returns
    np.testing.assert_array_equal(pageable, np.arange(4))
    lane.synchronize()
    np.testing.assert_array_equal(gpu.to_host(d), np.arange(4))  # outside a lane: at once


def test_pool_gives_each_lane_its_own_buffers():
    a, b = streams.lanes(2)
    plain = gpu.buffer("test shared role", (3,))
    with a:
        in_a = gpu.buffer("test shared role", (3,))
        assert gpu.buffer("test shared role", (3,)) is in_a
    with b:
        in_b = gpu.buffer("test shared role", (3,))
    assert len({id(plain), id(in_a), id(in_b)}) == 3


def test_pinned_is_a_host_array():
    p = streams.pinned((2, 3), np.uint8)
    assert isinstance(p, np.ndarray) and p.shape == (2, 3) and p.dtype == np.uint8
    with pytest.raises(ValueError, match="at least 1"):
        streams.lanes(0)


# ------------------------------------------------------------------------------------------------ engine


def test_forward_without_download_returns_the_device_output(net):
    w = lk.random_weights(net, 1)
    x = np.random.default_rng(2).uniform(-0.5, 0.5, (1, *net.input_shape)).astype(np.float32)
    prepared = engine.prepare(net, KERNELS, x, w)
    host = engine.forward(net, KERNELS, prepared)
    dev = engine.forward(net, KERNELS, prepared, download=False, tag="test lane")
    assert not isinstance(dev, np.ndarray) and hasattr(dev, "copy_to_host")
    np.testing.assert_array_equal(gpu.as_host(dev), host)
    np.testing.assert_allclose(host, lk.forward(net, w, x), rtol=1e-4, atol=1e-6)
    prepared = engine.prepare(net, HOST_MATH, x, w)
    mine = engine.forward(net, HOST_MATH, prepared, download=False, tag="test lane")
    again = engine.forward(net, HOST_MATH, prepared, download=False, tag="test lane")
    other = engine.forward(net, HOST_MATH, prepared, download=False, tag="test other")
    assert again is mine and other is not mine  # the tag names the pooled buffers


def test_forward_without_download_refuses_per_image_and_host_variants(net):
    w = lk.random_weights(net, 1)
    x = np.zeros((1, *net.input_shape), np.float32)
    per_image = lk.Variant(dict(KERNELS.impls), arrays="device", per_image=True, name="pi")
    with pytest.raises(ValueError, match="per image"):
        engine.forward(net, per_image, engine.prepare(net, per_image, x, w), download=False)
    host = lk.Variant({}, target="cpu", name="ref")
    with pytest.raises(ValueError, match="on the host"):
        engine.forward(net, host, engine.prepare(net, host, x, w), download=False)


# ------------------------------------------------------------------------------------------------ graphs


@needs_sim
def test_graph_on_the_simulator_replays_by_calling_and_says_so():
    lane = streams.lanes(1)[0]
    d = gpu.to_device(np.zeros(4, np.float32))
    calls, lanes_seen = [], []

    def step():
        calls.append(1)
        lanes_seen.append(streams.current())
        d.copy_to_device(np.full(4, len(calls), np.float32))
        return d

    g = graphs.capture(step, lane)
    assert g.captured is False and len(calls) == 1
    assert "simulator: no CUDA graph, replay calls the function" in str(g)
    assert g.note == graphs.NO_GRAPH_SIMULATOR
    assert g.replay() is d and len(calls) == 2
    np.testing.assert_array_equal(gpu.as_host(d), np.full(4, 2))
    assert lanes_seen == [lane, lane]


def test_variant_graph_and_pipeline_fields_are_validated():
    v = lk.Variant(dict(KERNELS.impls), arrays="device", graph=True, pipeline=lambda *a: None)
    assert v.graph and callable(v.pipeline)
    assert lk.Variant().graph is False and lk.Variant().pipeline is None
    with pytest.raises(ValueError, match="arrays='device'"):
        lk.Variant(dict(KERNELS.impls), arrays="host", graph=True)
    with pytest.raises(ValueError, match="pipeline"):
        lk.Variant(dict(KERNELS.impls), arrays="device", per_image=True, pipeline=lambda *a: None)
    with pytest.raises(TypeError, match="pipeline"):
        lk.Variant(dict(KERNELS.impls), arrays="device", pipeline=3)


# ------------------------------------------------------------------------------------------------ the whole job


def test_argmax_rows_takes_the_first_of_equal_maxima():
    p = np.array([[0.1, 0.5, 0.5], [0.7, 0.1, 0.7], [0.0, 0.0, 0.2]], np.float32)
    classes = gpu.to_device(np.full(3, -1, np.int32))
    lk.kernels.argmax_rows(gpu.to_device(p), classes)
    np.testing.assert_array_equal(gpu.as_host(classes), np.argmax(p, axis=1))
    with pytest.raises(ValueError, match="rows"):
        lk.kernels.argmax_rows(gpu.to_device(p), gpu.to_device(np.zeros(2, np.int32)))


@pytest.mark.parametrize("n", [1, 3, 5])
def test_job_serial_equals_the_reference(job, net, n):
    raw = raw_images(net, n, seed=n)
    want = lk.predict(lk.forward(net, lk.random_weights(net, 0), lk.to_input(net, raw)))
    got = job.serial(raw)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_job_serial_with_the_kit_kernels_equals_the_reference(net):
    w = lk.random_weights(net, 3)
    raw = raw_images(net, 2, seed=9)
    got = whole.Job(net, KERNELS, w).serial(raw)
    np.testing.assert_array_equal(got, lk.predict(lk.forward(net, w, lk.to_input(net, raw))))


def test_job_refuses_what_it_cannot_run(net):
    with pytest.raises(ValueError, match="arrays='device'"):
        whole.Job(net, lk.Variant({}, target="cpu"), lk.random_weights(net, 0))
    with pytest.raises(ValueError, match="resized"):
        whole.Job(simulator.net("fashion"), HOST_MATH, lk.random_weights(simulator.net("fashion"), 0))


def test_job_steps_check_their_arguments(job, net):
    lane = job.lanes(1)[0]
    with pytest.raises(ValueError, match="uint8"):
        job.upload(lane, np.zeros((2, *net.input_shape), np.float32))
    b = job.upload(lane, raw_images(net, 2))
    with pytest.raises(ValueError, match="hold 2 images"):
        job.classes(lane, b, 3)
    c = job.classes(lane, b, 2)
    with pytest.raises(ValueError, match="int32 of shape"):
        job.download(lane, c, np.zeros(3, np.int32))
    lane.synchronize()


def test_job_lanes_are_kept_and_have_their_own_buffers(job, net):
    two = job.lanes(2)
    assert job.lanes(2) == two and job.lanes(3)[:2] == two
    raw = raw_images(net, 2)
    assert job.upload(two[0], raw) is not job.upload(two[1], raw)
    for lane in two:
        lane.synchronize()


# a pipeline as stage 10 asks for, and the mistakes check_pipeline must catch: tests/pipelines.py


def test_check_pipeline_passes_a_right_pipeline(job):
    r = whole.check_pipeline(pipeline, job)
    assert r.passed, str(r)
    assert str(r) == ("pipeline: PASS (every image's class equals Job.serial's, on odd image counts, a last chunk "
                      "smaller than the others, more streams than chunks, a chunk larger than the images, one stream)")


def test_check_pipelines_pass_line_is_the_same_on_the_simulator_and_a_gpu(job):
    """nbval compares the stored line: it must not name the cases' sizes, which differ between the two."""
    assert whole.covered(whole.CASES_SIMULATOR) == whole.covered(whole.CASES_GPU)
    other = ((7, 3, 4), (1, 2, 1))  # other sizes, the same five things covered
    assert str(whole.check_pipeline(pipeline, job, cases=other)) == str(whole.check_pipeline(pipeline, job))
    assert whole.covered(((4, 2, 2),)) == ""  # even, whole chunks, streams = chunks: none of them


def classify_streamed(job, raw, classes, chunk, streams):
    raise NotImplementedError  # as tools/make_student.py leaves a task


def test_check_pipeline_words_a_stub_as_every_self_check_does(job):
    r = whole.check_pipeline(classify_streamed, job, cases=ONE_CASE, seed=1)
    assert str(r) == "classify_streamed: FAIL (not implemented yet: classify_streamed() is still the TODO stub) [seed 1]"


ONE_CASE = ((5, 2, 2),)


def test_check_pipeline_fails_the_missing_last_chunk(job):
    r = whole.check_pipeline(forgets_the_last_chunk, job, cases=ONE_CASE, seed=1)
    assert not r.passed
    assert "1 of 5 classes differ" in str(r) and "first at image 4" in str(r) and "still -1" in str(r)


@needs_sim  # on a GPU the copies have not landed when it returns (the delays): its classes are still -1
def test_check_pipeline_fails_a_missing_synchronize(job):
    a, b = job.lanes(2)
    r = whole.check_pipeline(forgets_to_synchronize, job, cases=ONE_CASE, seed=1)
    assert str(r) == (f"forgets_to_synchronize: FAIL (5 images in chunks of 2 over 2 streams: forgets_to_synchronize "
                      f"returned while {a.name} and {b.name} still had the classes of chunks 0, 1 and 2 to copy (a "
                      f"lane's copies land at its synchronize()): synchronize every lane before returning) [seed 1]")


@needs_sim  # on a GPU: test_the_gpus_delays_fail_the_two_races
def test_check_pipeline_fails_a_download_on_another_lane(job):
    a, b = job.lanes(2)
    r = whole.check_pipeline(downloads_on_another_lane, job, cases=ONE_CASE)
    assert not r.passed and "downloads_on_another_lane raised StreamOrderError: " in str(r)
    assert (f"{b.name} reads 'whole {a.name} classes' (chunk 0, written by {a.name}'s kernels) with nothing ordering "
            f"it after them: queue a chunk's upload, classes and download on one lane, or synchronize {a.name} first "
            f"(line ") in str(r)


def _last_chunk_downloaded_on_another_lane(job, raw, classes, chunk, count):
    lanes, starts = job.lanes(count), range(0, raw.shape[0], chunk)
    for k, start in enumerate(starts):
        lane, n = lanes[k % count], min(chunk, raw.shape[0] - start)
        c = job.classes(lane, job.upload(lane, raw[start:start + n]), n)
        with lanes[(k + (k == len(starts) - 1)) % count]:
            gpu.to_host(c, out=classes[start:start + n])
    for lane in lanes:
        lane.synchronize()


@needs_sim
def test_the_order_models_error_names_the_chunk_counted_from_the_cases_start(job):
    a, b = job.lanes(2)
    for _ in range(2):  # each case counts its chunks from 0 again
        r = whole.check_pipeline(_last_chunk_downloaded_on_another_lane, job, cases=ONE_CASE)
        assert f"{b.name} reads 'whole {a.name} classes' (chunk 2, written by {a.name}'s kernels)" in str(r)


def _same_classes_again_then_another_lane(job, raw, classes, chunk, count):
    a, b = job.lanes(2)
    for _ in range(2):  # chunks 0 and 1 hold the same images: the second writes the values the first left
        c = job.classes(a, job.upload(a, raw[:chunk]), chunk)
    with b:
        gpu.to_host(c, out=classes[:chunk])


@needs_sim
def test_a_launch_writing_the_values_a_buffer_held_still_counts_as_its_writer(job):
    """run_pipeline poisons every buffer as it is handed out on the simulator, so a launch's writes always show."""
    a, b = job.lanes(2)
    r = whole.check_pipeline(_same_classes_again_then_another_lane, job, cases=((4, 2, 2),))
    assert f"{b.name} reads 'whole {a.name} classes' (chunk 1, written by {a.name}'s kernels)" in str(r)


def _downloads_before_the_kernels(job, raw, classes, chunk, count):
    lanes = job.lanes(count)
    for k, start in enumerate(range(0, raw.shape[0], chunk)):
        lane, n = lanes[k % count], min(chunk, raw.shape[0] - start)
        with lane:  # the buffer job.classes will write, copied before it does: what a GPU's race copies
            gpu.to_host(gpu.buffer(f"whole {lane.name} classes", (n,), np.int32), out=classes[start:start + n])
        job.classes(lane, job.upload(lane, raw[start:start + n]), n)
    for lane in lanes:
        lane.synchronize()


def test_check_pipeline_says_which_classes_were_copied_before_their_kernels(job):
    r = whole.check_pipeline(_downloads_before_the_kernels, job, cases=ONE_CASE, seed=1)
    assert str(r).startswith("_downloads_before_the_kernels: FAIL (5 images in chunks of 2 over 2 streams: 5 of 5 "
                             f"classes differ from Job.serial's, first at image 0 (got {whole.CLASSES_POISON}, want ")
    assert str(r).endswith("; 5 copied before their chunk's kernels wrote them (a download on another lane than the "
                           "chunk's kernels, with nothing ordering it after them?)) [seed 1]")


def test_check_pipeline_refuses_a_raw_stream_in_one_line(job):
    r = whole.check_pipeline(makes_its_own_streams, job, cases=ONE_CASE, seed=1)
    assert str(r).startswith("makes_its_own_streams: FAIL (5 images in chunks of 2 over 2 streams: "
                             "makes_its_own_streams raised StreamOrderError: cuda.stream() makes a stream of its own, "
                             "refused while the pipeline check runs: use job.lanes(n) (lk.streams): the check sees the "
                             "order of work on lanes only (line ")
    from numba import cuda

    cuda.stream().synchronize()  # given back after the check


def _wrong_classes(job, raw, classes, chunk, count):
    classes[...] = 11  # no class of the net's ten


def test_run_pipeline_runs_a_case_as_the_check_does_and_compares_nothing(job, net):
    seed = int(np.random.default_rng().integers(2**31))
    raw, got = whole.run_pipeline(pipeline, job, (5, 2, 2), np.random.default_rng(seed))
    np.testing.assert_array_equal(raw, whole.case_bytes(net, 5, np.random.default_rng(seed)))  # the grader's parent
    assert isinstance(got, np.ndarray) and not isinstance(got, streams.SimulatedPinned)
    np.testing.assert_array_equal(got, job.serial(raw))
    raw, got = whole.run_pipeline(_wrong_classes, job, (3, 2, 1), np.random.default_rng(seed))
    assert raw.shape == (3, *net.input_shape) and (got == 11).all()
    if SIM:
        with pytest.raises(whole.ReturnedEarly, match="synchronize every lane before returning"):
            whole.run_pipeline(forgets_to_synchronize, job, (3, 2, 1), np.random.default_rng(seed))


def test_check_pipeline_fails_lanes_sharing_buffers(job):
    r = whole.check_pipeline(mixes_lanes, job, cases=ONE_CASE, seed=1)
    assert not r.passed and "5 images in chunks of 2 over 2 streams: mixes_lanes raised ValueError" in str(r)
    assert "belongs to lane" in str(r) and "(line " in str(r)  # the line of the pipeline that raised


@pytest.fixture(scope="module")
def kernel_job(net):
    """A job on GPU kernels (HOST_MATH's host copies would wait for every lane on a GPU and hide the races)."""
    return whole.Job(net, KERNELS, lk.random_weights(net, 5))


@pytest.mark.skipif(SIM, reason="a GPU's races, provoked by the check's delays (the simulator has the model instead)")
@pytest.mark.parametrize("wrong", [forgets_to_synchronize, downloads_on_another_lane])
def test_the_gpus_delays_fail_the_two_races(kernel_job, wrong):
    assert whole.check_pipeline(pipeline, kernel_job).passed
    r = whole.check_pipeline(wrong, kernel_job)
    assert not r.passed and "classes differ from Job.serial's" in str(r), str(r)


# ------------------------------------------------------------------------------------------------ graph replay check


@pytest.fixture(scope="module")
def replay_workload(net):
    return lk.workload(net, 3, target="gpu", weights=lk.random_weights(net, 4), quiet=True)


def graph_call(variant, wl, lane):
    """What stage 10's task 2 asks for (the kit has no such function): the forward pass and the copy of its
    probabilities into pinned memory captured on the lane, replayed by call()."""
    prepared = engine.prepare(wl.net, variant, wl.x, wl.weights)
    probs = streams.pinned((wl.images, 10), np.float32)

    def forward_and_download():
        return gpu.to_host(engine.forward(wl.net, variant, prepared, download=False, tag=lane.name), out=probs)

    graph = graphs.capture(forward_and_download, lane)

    def call():
        graph.replay()
        lane.synchronize()
        return probs

    return call


def test_check_replay_passes_a_right_graph_call(replay_workload):
    r = graphs.check_replay(graph_call, KERNELS, replay_workload)
    assert r.passed, str(r)
    assert str(r) == "graph replay: PASS (its predictions equal the engine's on every image of every call)"


def test_check_replay_fails_a_graph_kept_from_the_first_call(replay_workload):
    """Called again with other images (fewer, then as many with other values) and another variant: a call that
    keeps the first graph and replays it gives the first images' answers."""
    kept = []

    def keeps_the_first(variant, wl, lane):
        if not kept:
            kept.append(graph_call(variant, wl, lane))
        return kept[0]

    r = graphs.check_replay(keeps_the_first, KERNELS, replay_workload)
    n, half = replay_workload.images, max(1, replay_workload.images // 2)
    assert str(r) == (f"graph replay: FAIL (call 3 ({half} images): call() returned an array of shape ({n}, 10); "
                      f"expected the probabilities on the host, {half} x 10 (images x classes): {graphs.KEPT})")
    same_size = []

    def keeps_by_shape(variant, wl, lane):  # a graph per batch size: the third set has the first one's size
        found = [c for size, c in same_size if size == wl.images]
        if not found:
            same_size.append((wl.images, graph_call(variant, wl, lane)))
            return same_size[-1][1]
        return found[0]

    r = graphs.check_replay(keeps_by_shape, KERNELS, replay_workload)
    assert not r.passed and str(r).startswith("graph replay: FAIL (call 5 (") and graphs.KEPT in str(r), str(r)


def _rolled(variant, wl, lane):
    call = graph_call(variant, wl, lane)
    return lambda: np.roll(call(), 1, axis=1)  # every image's class moved on by one


def _unwritten(variant, wl, lane):
    call = graph_call(variant, wl, lane)
    return lambda: np.full_like(call(), np.nan)


def test_check_replay_fails_other_predictions(replay_workload):
    r = graphs.check_replay(_rolled, KERNELS, replay_workload)
    n = replay_workload.images
    assert str(r) == (f"graph replay: FAIL (call 1 ({n} images): {n} of {n} predictions differ from the engine's, "
                      f"first at image 0)")
    r = graphs.check_replay(_unwritten, KERNELS, replay_workload)
    assert str(r) == (f"graph replay: FAIL (call 1 ({n} images): {n} of {n} images' probabilities are not finite, "
                      f"first image 0: never copied back, or read before the lane was synchronized?)")


def test_check_replay_fails_a_call_that_returns_no_probabilities(replay_workload):
    r = graphs.check_replay(lambda v, wl, lane: (lambda: None), KERNELS, replay_workload)
    assert str(r) == (f"graph replay: FAIL (call 1 ({replay_workload.images} images): call() returned a NoneType; "
                      f"expected the probabilities on the host, {replay_workload.images} x 10 (images x classes))")
    r = graphs.check_replay(lambda v, wl, lane: (lambda: np.zeros((9, 10))), KERNELS, replay_workload)
    assert not r.passed and "an array of shape (9, 10)" in str(r)


def test_check_replay_words_a_stub_and_a_raise_as_every_self_check_does(replay_workload):
    def graph_call(variant, wl, lane):
        raise NotImplementedError

    r = graphs.check_replay(graph_call, KERNELS, replay_workload)
    assert str(r) == "graph replay: FAIL (not implemented yet: graph_call() is still the TODO stub)"

    def broken(variant, wl, lane):
        return 1 / 0

    r = graphs.check_replay(broken, KERNELS, replay_workload)
    assert str(r).startswith("graph replay: FAIL (broken raised ZeroDivisionError: division by zero (line ")


def test_labkit_exports_the_stage_10_modules():
    assert lk.streams is streams and lk.graphs is graphs and lk.whole is whole
