"""CUDA graphs: a forward pass's launches recorded once, then replayed as one launch.

A small batch's forward pass is mostly launch overhead: a dozen kernels of a few microseconds each, every one a
call through Python and the driver. ``capture(fn, lane)`` records what ``fn`` queues on a lane's stream into a CUDA
graph (cupy's ``Stream.begin_capture`` / ``end_capture``); ``graph.replay()`` then queues all of it with one call.

What a capture needs: every launch and copy inside ``fn`` on the lane's stream (``fn`` runs inside ``with lane:``,
so everything through ``lk.gpu`` goes there; a launch on the legacy default stream breaks the capture), and no
allocation and no synchronization inside: ``fn`` is called once before the capture, which compiles its kernels and
fills the buffer pool, so the captured call finds every buffer there. A replay writes into the same buffers the
captured call used (its return value is the captured call's: the same device array, refilled), with the values
its device inputs hold at replay time.

On numba's CUDA simulator (and on a GPU without cupy) there is no graph: ``Graph.captured`` is False and
``replay()`` calls ``fn`` again on the lane, which gives the same results.

``check_replay(make_call, variant, wl)`` is stage 10's one-line check of a graph-replaying call: the predictions of
``make_call(variant, wl, lane)()`` against the engine's on every image of the workload.
"""

from __future__ import annotations

from ..launch import gpu, simulator, streams
from ..model import reference
from . import engine
from .check import CheckResult, describe_failure
from .workloads import Workload

NO_GRAPH_SIMULATOR = "simulator: no CUDA graph, replay calls the function"
NO_GRAPH_CUPY = "no cupy: no CUDA graph, replay calls the function"


class CaptureError(RuntimeError):
    """A capture that failed; the message says why in one line."""


class Graph:
    """A captured function: ``replay()`` queues it on its lane (asynchronous: ``lane.synchronize()`` to wait) and
    returns what the captured call returned. ``captured``: whether a CUDA graph exists (False on the simulator:
    ``replay()`` calls the function again; ``note`` says so)."""

    def __init__(self, fn, lane: streams.Lane, exe=None, output=None, note: str = ""):
        self.fn, self.lane, self._exe, self.output, self.note = fn, lane, exe, output, note

    @property
    def captured(self) -> bool:
        return self._exe is not None

    def replay(self):
        if self._exe is None:
            with self.lane:
                self.output = self.fn()
            return self.output
        self._exe.launch(self.lane.cupy)
        return self.output

    def __str__(self) -> str:
        name = getattr(self.fn, "__name__", "function")
        return f"CUDA graph of {name} on {self.lane.name}" if self.captured else f"{name}: {self.note}"

    __repr__ = __str__


def capture(fn, lane: streams.Lane) -> Graph:
    """Record ``fn()``'s launches and copies on ``lane`` into a CUDA graph (after one call outside the capture:
    it compiles and allocates). On the simulator, or without cupy, a ``Graph`` that calls ``fn`` at each replay.
    Raises ``CaptureError`` with the reason in one line when the capture fails."""
    if simulator.active() or lane.cupy is None:
        note = NO_GRAPH_SIMULATOR if simulator.active() else NO_GRAPH_CUPY
        with lane:
            output = fn()
        return Graph(fn, lane, None, output, note)
    import cupy
    from numba import cuda


    if gpu.poisoning():
        raise CaptureError("capture: not while checking (lk.gpu.poisoned() fills buffers with synchronous copies, "
                           "which a capture cannot hold)")
    with lane:
        fn()  # compiles every kernel and fills the pool: no allocation inside the capture
    lane.synchronize()
    mode = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
    try:
        lane.cupy.begin_capture(mode)  # relaxed: nothing else in the process is capturing
    except TypeError:  # a cupy whose begin_capture takes no mode
        lane.cupy.begin_capture()
    try:
        with cuda.defer_cleanup(), lane:  # no numba frees while capturing
            output = fn()
    except BaseException as exc:
        try:
            lane.cupy.end_capture()
        except Exception:  # noqa: BLE001 - the capture is broken already; the first error is the one to tell
            pass
        raise CaptureError(_why(exc)) from exc
    try:
        exe = lane.cupy.end_capture()
    except Exception as exc:  # noqa: BLE001 - said in one line
        raise CaptureError(_why(exc)) from exc
    return Graph(fn, lane, exe, output, "")


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    hint = ""
    if any(k in text for k in ("IMPLICIT", "UNSUPPORTED", "INVALIDATED", "not permitted", "CAPTURE")):
        hint = (": a launch or copy outside the lane (the legacy default stream: a numba launch not through "
                "lk.gpu, a cuda.to_device without stream), a synchronization or an allocation inside the capture?")
    return f"capture failed: {type(exc).__name__}: {text[:200]}{hint}"


#: the calls a graph-replaying function is checked on, here and by the grader (``labkit.tasks``): (variant,
#: images, fresh) with variant 0 or 1 of the two given, images 0 (the first set), 1 (others, fewer) or 2 (as many as
#: the first, other values); fresh: a new ``make_call(...)``, else the last call replayed again. A function that
#: keeps the first call's graph and replays it for later calls' other inputs or variant fails on the third call.
REPLAY_PLAN = ((0, 0, True), (0, 0, False), (0, 1, True), (1, 1, True), (0, 2, True))
#: what a call that gives another call's answers most likely does
KEPT = "a graph captured for other inputs or another variant, replayed here?"


def replay_images(wl) -> list:
    """The three sets of images of ``REPLAY_PLAN`` from one workload: its images, half of them in reverse order, and
    its images reversed (as many as the first, other values where they differ)."""
    def subset(x, note):
        return Workload(wl.net, wl.weights, x, None, wl.simulated, wl.synthetic, f"{wl.note} ({note})")

    return [wl, subset(wl.x[::-1][:max(1, wl.images // 2)].copy(), "half of the images, reversed"),
            subset(wl.x[::-1].copy(), "the images reversed")]


def check_replay(make_call, variant, wl, lane: streams.Lane | None = None, other=None):
    """Check a call that replays a graph: ``make_call(variant, wl, lane)`` returns a no-argument ``call()`` giving
    the class probabilities of ``wl``'s images on the host (images x classes). Called as ``REPLAY_PLAN`` says
    (made, replayed again, made for other images, for ``other`` variant, for images of the first shape): PASS when
    every call's predictions equal those of the engine's own call on the same images and variant. A raise is one
    FAIL line worded as every self-check words it (``labkit.check.describe_failure``: a TODO stub is "not
    implemented yet"). Returns the ``CheckResult``; the notebook prints it."""
    name, fn_name = "graph replay", getattr(make_call, "__name__", "make_call")
    variants, sets = (variant, other if other is not None else variant), replay_images(wl)
    call = None
    for k, (v, i, fresh) in enumerate(REPLAY_PLAN):
        try:
            if fresh or call is None:
                call = make_call(variants[v], sets[i], lane if lane is not None else streams.lanes(1)[0])
            got = call()
        except Exception as exc:  # noqa: BLE001 - the student's code: said in one line
            gpu.synchronize()
            return CheckResult(name, False, detail=describe_failure(exc, fn_name))
        why = _replay_wrong(got, variants[v], sets[i], later=k > 0)
        if why:
            where = f"call {k + 1} ({sets[i].images} images{'' if fresh else ', replayed again'})"
            return CheckResult(name, False, detail=f"{where}: {why}")
    return CheckResult(name, True, note="its predictions equal the engine's on every image of every call")


def unusable(got, shape: tuple[int, int], later: bool) -> str | None:
    """Why a call's result is not the probabilities on the host (``shape``: images x classes), in a clause; None
    when it is. A ``later`` call that answers for another number of images most likely replays another's graph."""
    import numpy as np

    if not isinstance(got, np.ndarray) or got.shape != shape:
        what = f"an array of shape {got.shape}" if isinstance(got, np.ndarray) else f"a {type(got).__name__}"
        kept = later and isinstance(got, np.ndarray) and got.shape[1:] == shape[1:]
        return (f"call() returned {what}; expected the probabilities on the host, {shape[0]} x {shape[1]} "
                f"(images x classes)" + (f": {KEPT}" if kept else ""))
    bad = np.flatnonzero(~np.isfinite(got).all(axis=1))
    if bad.size:
        return (f"{bad.size} of {shape[0]} images' probabilities are not finite, first image {bad[0]}: never copied "
                f"back, or read before the lane was synchronized?")
    return None


def _replay_wrong(got, variant, wl, later: bool) -> str | None:
    """What is wrong with one call's probabilities against the engine's on the same images; None if right. A
    ``later`` call whose answers are another's is most likely a graph kept from an earlier call (``KEPT``)."""
    import numpy as np


    why = unusable(got, (wl.images, *wl.net.shapes()[wl.net.layers[-1].name]), later)
    if why:
        return why
    want = reference.predict(engine.forward(wl.net, variant, engine.prepare(wl.net, variant, wl.x, wl.weights)))
    differ = np.flatnonzero(reference.predict(got) != want)
    if differ.size:
        return (f"{differ.size} of {wl.images} predictions differ from the engine's, first at image {differ[0]}"
                + (f": {KEPT}" if later else ""))
    return None
