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

from . import simulator, streams

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

    from . import gpu

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


def check_replay(make_call, variant, wl, lane: streams.Lane | None = None):
    """Check a call that replays a graph: ``make_call(variant, wl, lane)`` returns a no-argument ``call()`` giving
    the class probabilities of ``wl``'s images on the host (images x classes). PASS when ``lk.predict(call())``
    equals the predictions of the engine's own call (``engine.forward`` on ``engine.prepare(wl...)``) on every
    image. A raise is one FAIL line worded as every self-check words it (``labkit.check.describe_failure``: a TODO
    stub is "not implemented yet"). Returns the ``CheckResult``; the notebook prints it."""
    import numpy as np

    from . import engine, gpu, reference
    from .check import CheckResult, describe_failure

    name, fn_name = "graph replay", getattr(make_call, "__name__", "make_call")
    shape = (wl.images, *wl.net.shapes()[wl.net.layers[-1].name])
    try:
        got = make_call(variant, wl, lane if lane is not None else streams.lanes(1)[0])()
    except Exception as exc:  # noqa: BLE001 - the student's code: said in one line
        gpu.synchronize()
        return CheckResult(name, False, detail=describe_failure(exc, fn_name))
    if not isinstance(got, np.ndarray) or got.shape != shape:
        what = f"an array of shape {got.shape}" if isinstance(got, np.ndarray) else f"a {type(got).__name__}"
        return CheckResult(name, False, detail=f"call() returned {what}; expected the probabilities on the host, "
                                               f"{shape[0]} x {shape[1]} (images x classes)")
    bad = np.flatnonzero(~np.isfinite(got).all(axis=1))
    if bad.size:
        return CheckResult(name, False, detail=f"{bad.size} of {wl.images} images' probabilities are not finite, "
                                               f"first image {bad[0]}: never copied back, or read before the lane "
                                               f"was synchronized?")
    want = reference.predict(engine.forward(wl.net, variant, engine.prepare(wl.net, variant, wl.x, wl.weights)))
    differ = np.flatnonzero(reference.predict(got) != want)
    if differ.size:
        return CheckResult(name, False, detail=f"{differ.size} of {wl.images} predictions differ from the engine's, "
                                               f"first at image {differ[0]}")
    return CheckResult(name, True, note="its predictions equal the engine's on every image")
