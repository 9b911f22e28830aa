"""The whole job: host bytes in, host classes out, in pieces a student composes into a pipeline over streams.

``Job(net, variant, weights)`` puts the weights on the device once, then offers three steps, each on a lane
(``lk.streams``) and each only *queued* there (the call returns before the GPU is done):

- ``job.upload(lane, raw)``: a chunk of stored uint8 images (N x C x H x W) into the lane's own device buffer;
- ``job.classes(lane, bytes_dev, n)``: the bytes normalised on the device with the net's table (as
  ``lk.data.to_input`` does), the variant's forward pass left on the device (``engine.forward(download=False)``,
  buffers tagged with the lane), and the class of each image (``lk.kernels.argmax_rows``);
- ``job.download(lane, classes_dev, host_out)``: the int32 classes into a host array.

Every buffer is the lane's own (named after it), so work in flight on two lanes never shares one; a step handed a
buffer another lane made refuses in one line (the two lanes would need a synchronization between them).
``job.serial(raw)`` is the baseline: everything at once on the default stream from pageable memory.

``job.classes`` on a lane queues a dozen launches, each a call through Python, numba or cupy and the driver. Over
many small chunks that host time, not the GPU, set the pace: notebook 10's run in ``results/h100-2026-11-26e`` took
23.7 to 24.2 ms for 50000 images in chunks of 2000 whether over 1, 2, 4 or 8 streams (about 1 ms a chunk, more than
a chunk's kernels), where chunks of 10000 took 7.0 to 7.2 over 2 to 8 (``tools/end_to_end_grid.py`` times the host's
part of each chunk). For a variant whose forward pass can be captured (``Variant(graph=True)``), a GPU with cupy,
and no check or recording going on, the job therefore records a chunk's launches once per lane, chunk size and input
buffer in a CUDA graph (``lk.graphs``, through ``labkit.job_graphs``) and replays it: one call a chunk. The first
chunk of a size on a lane pays the capture (one call outside it, a synchronization of that lane); a capture that
fails turns the graphs off for the job (``graph_note`` says why), and the buffer pool's release
(``lk.gpu.BufferPool.generation``) makes the job capture again. ``Job(..., graphs=False)`` launches every time, as
the simulator always does, and as a student release does (it leaves ``labkit.job_graphs`` out: docs/releases.md).

``check_pipeline(fn, job)`` checks a pipeline ``fn(job, raw_pinned, classes_pinned, chunk, streams)`` (the host
bytes to host classes in chunks over ``streams`` lanes) against ``job.serial`` on fresh random bytes, the classes
poisoned with -1 first, on cases with odd image counts, a last chunk smaller than the others and more streams than
chunks, with ``job.classes`` launching every time (no graphs: the delays the check queues on a GPU must not be
waited out by a capture). Writing ``fn`` is stage 10's task: the kit has no such loop. Its PASS line names what the
cases cover, not their sizes, so that it reads the same on the simulator and on a GPU (nbval compares it). Each case
runs as ``run_pipeline`` runs it (the grader's child calls that too, and compares in its parent): the order between
lanes checked by ``lk.stream_order`` (the model on the simulator, unequal delays on a GPU), raw streams refused.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import numpy as np
from numba import cuda

from ..course.stages import Variant
from ..launch import gpu, simulator, stream_order, streams
from ..model import data
from ..model.nets import Net, get_net
from ..ops import kernels
from . import engine
from .check import CheckResult, describe_failure


def input_table(net: Net) -> np.ndarray:
    """The float32 value of each byte value, for nets whose input is a byte-by-byte table (``data.to_input``):
    CIFAR-10's byte/255 - 0.5. Fashion's and ECE408's inputs are resized, not looked up: refused in one line."""
    if net.dataset == "cifar10":
        return data._CIFAR_LUT
    raise ValueError(f"the whole job from bytes needs an input made byte by byte from a table (cifar10's "
                     f"byte/255 - 0.5); {net.name}'s images are resized first")


def _on(lane):
    return lane if lane is not None else nullcontext()


@cuda.jit
def bytes_to_input(raw, lut, x):
    """The network's input from stored bytes, on the device: ``x[t] = lut[raw[t]]`` (``data.to_input``'s table)."""
    t = cuda.grid(1)
    if t < x.size:
        x[t] = lut[raw[t]]


def _job_graphs():
    """``labkit.job_graphs``, or None in a copy of the kit without it: a student release leaves it out (capturing
    and replaying a forward pass is stage 10's task 2, docs/releases.md), and there ``Job`` launches every time."""
    try:
        from . import job_graphs
    except ImportError:
        return None
    return job_graphs


class Job:
    """One net and variant's whole job, host bytes to host classes, in steps queued on lanes (module docstring).
    ``weights``: host arrays by name (a workload's ``weights``), put on the device once here. ``graphs``: replay
    a chunk's launches from a CUDA graph (module docstring); None: where the variant's forward pass can be
    captured (``variant.graph``)."""

    def __init__(self, net: Net | str, variant: Variant, weights: dict, graphs: bool | None = None):
        self.net = get_net(net)
        if variant.per_image or variant.arrays != "device" or variant.target != "gpu":
            raise ValueError(f"Job: {variant.label} must be a GPU variant with arrays='device' on the whole batch "
                             f"(the forward pass stays on the device between the steps)")
        self.variant = variant
        self.table = gpu.to_device(input_table(self.net), name="input table")
        placeholder = np.zeros((1, *self.net.input_shape), np.float32)
        self.weights = engine.prepare(self.net, variant, placeholder, weights).weights
        self._lanes: list[streams.Lane] = []
        self._owner: dict[int, tuple] = {}  # id(device buffer) -> (weak reference to it, lane name)
        self._chunks = 0  # uploads on lanes since run_pipeline's case began: the chunk the next one starts
        self.graphs = bool(variant.graph) if graphs is None else bool(graphs)
        self.graph_note = ""  # why the graphs were turned off (a capture that failed)
        self._graphs: dict = {}  # (lane id, n, id(bytes), pool generation) -> (bytes buffer, lk.graphs.Graph)
        self._checking = 0  # run_pipeline is running a case: launch every time

    def lanes(self, count: int) -> list[streams.Lane]:
        """The job's first ``count`` lanes: made once and kept, so their buffers are reused call after call."""
        if count < 1:
            raise ValueError(f"Job.lanes: count must be at least 1, got {count}")
        if len(self._lanes) < count:
            self._lanes += streams.lanes(count - len(self._lanes))
        return self._lanes[:count]

    @staticmethod
    def _tag(lane) -> str:
        return f"whole {lane.name}" if lane is not None else "whole serial"

    def _own(self, buf, lane) -> None:
        self._owner[id(buf)] = (weakref.ref(buf), self._tag(lane))

    def _check_owner(self, buf, lane, step: str) -> None:
        held = self._owner.get(id(buf))
        if held is None or held[0]() is not buf:
            return  # not one of the job's buffers: the caller's own
        if held[1] != self._tag(lane):
            raise ValueError(f"Job.{step}: this buffer belongs to {held[1].removeprefix('whole ')}, not to "
                             f"{self._tag(lane).removeprefix('whole ')}: another lane's buffer may still be in use "
                             f"there (queue a chunk's upload, classes and download on one lane)")

    def upload(self, lane: streams.Lane | None, raw: np.ndarray):
        """Queue the copy of ``raw`` (uint8, N x C x H x W, pinned for an overlapping copy) into the lane's own
        device buffer; returns that buffer (filled once the lane gets there)."""
        shape = self.net.input_shape
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 4 or raw.shape[1:] != shape:
            what = f"{raw.dtype} {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
            raise ValueError(f"Job.upload: expected uint8 images N x {' x '.join(map(str, shape))} on the host, "
                             f"got {what}")
        if lane is not None:
            lane.chunk, self._chunks = self._chunks, self._chunks + 1
        with _on(lane):
            buf = gpu.buffer(f"{self._tag(lane)} bytes", raw.shape, np.uint8)
            gpu.to_device(raw, to=buf, name="input bytes")
        self._own(buf, lane)
        return buf

    def classes(self, lane: streams.Lane | None, bytes_dev, n: int):
        """Queue the first ``n`` images of ``bytes_dev`` (from ``upload`` on the same lane) to their classes on the
        device: normalised by the net's table, the variant's forward pass, argmax. Returns the int32 classes'
        device buffer (the lane's own)."""
        self._check_owner(bytes_dev, lane, "classes")
        if not 0 < n <= bytes_dev.shape[0]:
            raise ValueError(f"Job.classes: n = {n}, but the bytes hold {bytes_dev.shape[0]} images")
        tag = self._tag(lane)
        classes = self._replayed(lane, bytes_dev, n, tag)
        if classes is None:
            with _on(lane):
                classes = self._queue_classes(bytes_dev, n, tag)
        self._own(classes, lane)
        return classes

    def _queue_classes(self, bytes_dev, n: int, tag: str):
        """The launches of ``classes`` on the current lane: normalise, forward pass, argmax; the classes' buffer."""
        x = self._normalised(bytes_dev, n, tag)
        probs = engine.forward(self.net, self.variant, engine.Prepared(x, self.weights), download=False, tag=tag)
        classes = gpu.buffer(f"{tag} classes", (n,), np.int32)
        kernels.argmax_rows(probs, classes)
        return classes

    def replays(self, lane) -> bool:
        """Whether ``classes`` on ``lane`` replays a CUDA graph now (module docstring)."""
        return (self.graphs and not self._checking and lane is not None and lane.cupy is not None
                and not simulator.active() and not gpu.poisoning() and not gpu._recorders
                and _job_graphs() is not None)

    def _replayed(self, lane, bytes_dev, n: int, tag: str):
        """The classes' buffer, queued by replaying the chunk's CUDA graph (``labkit.job_graphs``), or None where
        the job launches every time (``replays``)."""
        return _job_graphs().replayed(self, lane, bytes_dev, n, tag) if self.replays(lane) else None

    def _normalised(self, bytes_dev, n: int, tag: str):
        x = gpu.buffer(f"{tag} input", (n, *self.net.input_shape))
        gpu.launch(bytes_to_input, x.size, gpu.flat(bytes_dev), self.table, gpu.flat(x))
        return x

    def inputs(self, raw: np.ndarray) -> np.ndarray:
        """The network input ``classes`` makes from ``raw`` on the device, on the host: what ``upload.end_to_end``
        compares with ``data.to_input``'s (equal predictions alone can hide a wrong input)."""
        raw = np.ascontiguousarray(raw, np.uint8)
        return gpu.to_host(self._normalised(self.upload(None, raw), raw.shape[0], self._tag(None)), name="input")

    def download(self, lane: streams.Lane | None, classes_dev, host_out: np.ndarray) -> np.ndarray:
        """Queue the copy of the classes into ``host_out`` (int32, one per image; pinned for an overlapping copy).
        On a lane ``host_out`` holds them only after ``lane.synchronize()``."""
        self._check_owner(classes_dev, lane, "download")
        if not isinstance(host_out, np.ndarray) or host_out.dtype != np.int32 or \
                host_out.shape != tuple(classes_dev.shape):
            what = f"{host_out.dtype} {host_out.shape}" if isinstance(host_out, np.ndarray) else \
                type(host_out).__name__
            raise ValueError(f"Job.download: host_out must be int32 of shape {tuple(classes_dev.shape)} (one per "
                             f"image of the chunk), got {what}")
        with _on(lane):
            gpu.to_host(classes_dev, out=host_out, name="classes")
        return host_out

    def _poison_classes(self, lanes, sizes) -> None:
        """Fill the classes buffers of ``lanes`` for chunks of these sizes with ``CLASSES_POISON`` (the default
        stream, before the check's delays): a copy that runs before a chunk's kernels copies the poison."""
        for lane in lanes:
            with lane:
                for n in sizes:
                    gpu.poison(gpu.buffer(f"{self._tag(lane)} classes", (n,), np.int32))

    def serial(self, raw: np.ndarray) -> np.ndarray:
        """The baseline: all of ``raw`` at once on the default stream, from pageable memory; the classes."""
        raw = np.ascontiguousarray(raw, np.uint8)
        out = np.empty(raw.shape[0], np.int32)
        self.download(None, self.classes(None, self.upload(None, raw), raw.shape[0]), out)
        return out


#: (images, chunk, streams) of check_pipeline: odd counts, a last chunk smaller than the others, more streams than
#: chunks, a chunk bigger than the images, one stream
CASES_SIMULATOR = ((5, 2, 4), (3, 4, 1))
CASES_GPU = ((1001, 128, 3), (999, 250, 8), (7, 3, 2), (3, 4, 1))


def covered(cases) -> str:
    """What the cases (images, chunk, streams) cover, in words and without their sizes: the simulator's and the GPU's
    cases differ in size but cover the same, so a PASS line stored in a notebook matches on both."""
    chunks = [(i, c, s, -(-i // c)) for i, c, s in cases]  # ... and the number of chunks
    found = [("odd image counts", any(i % 2 for i, *_ in chunks)),
             ("a last chunk smaller than the others", any(n > 1 and i % c for i, c, _, n in chunks)),
             ("more streams than chunks", any(s > n for *_, s, n in chunks)),
             ("a chunk larger than the images", any(c > i for i, c, *_ in chunks)),
             ("one stream", any(s == 1 for _, _, s, _ in chunks))]
    return ", ".join(what for what, present in found if present)


#: what a lane's classes buffer holds before its kernels write it, while a case runs (``gpu.poison`` of int32)
CLASSES_POISON = np.iinfo(np.int32).max


class ReturnedEarly(stream_order.StreamOrderError):
    """A pipeline returned while copies of its classes were still queued (the simulator knows; a GPU shows -1)."""


def case_bytes(net: Net, images: int, rng: np.random.Generator) -> np.ndarray:
    """A case's stored images, drawn from ``rng``: the same state gives the same bytes in every process."""
    return rng.integers(0, 256, (images, *net.input_shape), dtype=np.uint8)


def run_pipeline(fn, job: Job, case: tuple[int, int, int], rng: np.random.Generator):
    """Run one case (images, chunk, streams) of ``fn(job, raw_pinned, classes_pinned, chunk, streams)`` as the
    check does, comparing nothing: fresh bytes (``case_bytes``) in pinned memory, the classes pinned and poisoned
    with -1, the job's classes buffers on its lanes with ``CLASSES_POISON``; raw streams refused
    (``streams.refusing_raw_streams``); the order between lanes checked (``lk.stream_order``: on a GPU the lanes
    held back first, longest the lane of a chunk picked from ``rng``; on the simulator the model, every buffer
    poisoned as it is handed out so that a launch's writes show). Returns (the bytes, the classes as ``fn`` left
    them when it returned); raises what ``fn`` raised (the model's ``StreamOrderError`` included) or, on the
    simulator, ``ReturnedEarly``."""
    images, chunk, count = case
    raw = case_bytes(job.net, images, rng)
    raw_pinned = streams.pinned(raw.shape, np.uint8)
    raw_pinned[...] = raw
    classes = streams.pinned((images,), np.int32)
    classes[...] = -1
    lanes = job.lanes(count)
    job._poison_classes(lanes, {min(chunk, images - first) for first in range(0, images, chunk)})
    picked = int(rng.integers(-(-images // chunk)))  # chunk i goes to lane i % count (stage 10's spec)
    job._chunks = 0
    job._checking += 1  # no graphs: a capture's synchronization would wait out the delays
    try:
        with streams.refusing_raw_streams(), gpu.poisoned() if simulator.active() else nullcontext():
            stream_order.hold_back(lanes, lanes[picked % count], rng)
            fn(job, raw_pinned, classes, chunk, count)
            got = np.array(classes)  # as it is when fn returns: no synchronization of ours first
            late = streams.undelivered(classes)
    finally:
        job._checking -= 1
        gpu.synchronize()  # whatever fn left in flight finishes before the next case
    if late:
        chunks = sorted({c for _, c in late if c is not None})
        which = f" of chunk{'s' * (len(chunks) > 1)} {_listed(map(str, chunks))}" if chunks else ""
        lanes_late = _listed(sorted({lane.name for lane, _ in late}, key=lambda n: (len(n), n)))
        raise ReturnedEarly(f"{getattr(fn, '__name__', 'the pipeline')} returned while {lanes_late} still had the "
                            f"classes{which} to copy (a lane's copies land at its synchronize()): synchronize every "
                            f"lane before returning")
    return raw, got


def _listed(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def check_pipeline(fn, job: Job, cases=None, seed: int | None = None) -> CheckResult:
    """Run each case (images, chunk, streams) of ``fn(job, raw_pinned, classes_pinned, chunk, streams)`` as
    ``run_pipeline`` does, and compare every image's class as ``fn`` left it with ``job.serial``'s (a pipeline must
    have synchronized its lanes by then). One PASS/FAIL line: a raise is worded as every self-check words it
    (``labkit.check.describe_failure``: a TODO stub is "not implemented yet"; the order model's error is its own
    line), a pipeline that returned too early says so; a FAIL names its case's sizes, a PASS what the cases cover
    (``covered``)."""
    name = getattr(fn, "__name__", "pipeline")
    cases = tuple(cases or (CASES_SIMULATOR if simulator.active() else CASES_GPU))
    seed = int(np.random.default_rng().integers(2**31)) if seed is None else seed
    rng = np.random.default_rng(seed)
    for images, chunk, count in cases:
        where = f"{images} images in chunks of {chunk} over {count} streams"
        try:
            raw, got = run_pipeline(fn, job, (images, chunk, count), rng)
        except Exception as exc:  # noqa: BLE001 - the student's code: said in one line
            said = str(exc) if isinstance(exc, ReturnedEarly) else describe_failure(exc, name)
            detail = said if isinstance(exc, NotImplementedError) else f"{where}: {said}"
            return CheckResult(name, False, detail=detail, seed=seed)
        want = job.serial(raw)
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            return CheckResult(name, False, detail=f"{where}: {wrong.size} of {images} classes differ from "
                               f"Job.serial's, first at image {wrong[0]} (got {got[wrong[0]]}, want "
                               f"{want[wrong[0]]}){_why(got)}", seed=seed)
    return CheckResult(name, True, note=f"every image's class equals Job.serial's, on {covered(cases)}", seed=seed)


def _why(got: np.ndarray) -> str:
    """What the poisons among a pipeline's classes say (on a GPU the delays make them show)."""
    unwritten, early = int(np.count_nonzero(got == -1)), int(np.count_nonzero(got == CLASSES_POISON))
    why = (f"; {unwritten} still -1 (never downloaded: the last, smaller chunk left out, or a lane not "
           f"synchronized before returning?)" if unwritten else "")
    return why + (f"; {early} copied before their chunk's kernels wrote them (a download on another lane than "
                  f"the chunk's kernels, with nothing ordering it after them?)" if early else "")
