"""One stream for both libraries: a ``Lane`` is where a piece of work queues, whoever launches it.

A GPU runs the work of one stream in order and the work of different streams side by side, so a copy on one stream
can overlap a kernel on another. The kit launches from two libraries (numba for its kernels and copies, cupy for
CUDA C), each with its own idea of "the current stream"; a ``Lane`` holds one CUDA stream as both: ``lane.cupy``
(a cupy ``Stream``) and ``lane.numba`` (the same stream seen by numba through ``cuda.external_stream``).

``with lane:`` sends every launch and copy made through ``lk.gpu`` inside the block to that stream:
``lk.gpu.launch``, ``launch_grid``, ``launch_raw`` (and cupy's own routines, through cupy's current stream),
``lk.gpu.to_device(host, to=dev)`` and ``lk.gpu.to_host(dev, out=host)``. Those copies become asynchronous: the
call returns at once and the copy happens when the stream reaches it, so

- ``out`` is filled only after ``lane.synchronize()`` (or ``lk.gpu.synchronize()``): read it before and you may
  read what was there before;
- a copy overlaps other streams' work only from *pinned* host memory (``pinned(shape, dtype)``): from ordinary
  (pageable) memory the driver first copies through a staging buffer, and the call waits for that.

Nesting restores the lane outside. Blocks of different lanes may use the same device buffer only with a
synchronization in between; the kit's per-lane buffers (``lk.whole.Job``) never share one.

On numba's CUDA simulator every launch runs at once, in call order, so streams change nothing there except one
thing this module imitates on purpose: a ``to_host(dev, out=host)`` inside a lane into pinned memory (``pinned``)
reads the device array at the call but fills ``out`` only at ``lane.synchronize()`` (or ``lk.gpu.synchronize()``),
so a pipeline that forgets to synchronize fails here as it would on a GPU. (Into pageable memory a GPU's copy is
done when the call returns, and so is the simulator's.) The rest of what a GPU would do differently, the model of
``lk.stream_order`` checks there: a lane's work that nothing orders after another lane's raises.

``refusing_raw_streams()`` makes numba's ``cuda.stream()`` and cupy's ``cupy.cuda.Stream()`` raise for the block
(the pipeline check: work on a raw stream escapes the model and the delays); ``lanes()`` keeps working.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from contextlib import contextmanager, nullcontext

import numpy as np
from numba import cuda

from . import device, simulator, stream_order

_ids = itertools.count()
_local = threading.local()
#: lanes holding host copies the simulator has not delivered yet (``synchronize_all`` delivers them)
_waiting: weakref.WeakSet = weakref.WeakSet()
#: what ``lanes()`` makes its streams with, bound before ``refusing_raw_streams`` can replace them (cupy's on first use)
_makers: dict = {"numba": cuda.stream}


def _stack() -> list:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


class Lane:
    """One CUDA stream for numba and cupy. ``numba``: a numba stream; ``cupy``: the same stream as a cupy
    ``Stream``, or None without cupy (and on the simulator). ``id``: unique in the process, so buffers named after
    a lane are never another lane's. ``chunk``: the chunk of stage 10's job its last ``Job.upload`` began (the
    order model's errors name it). Use ``lanes(count)`` to make them."""

    def __init__(self, numba, cupy=None):
        self.numba = numba
        self.cupy = cupy
        self.id = next(_ids)
        self.chunk: int | None = None
        self._pending: list = []  # the simulator's host copies (out, values, chunk), delivered at synchronize()
        self._entered: list = []

    @property
    def name(self) -> str:
        return f"lane{self.id}"

    def __enter__(self) -> Lane:
        ctx = self.cupy if self.cupy is not None else nullcontext()
        ctx.__enter__()  # cupy's own current stream too: its routines (cupy.matmul) queue here as well
        self._entered.append(ctx)
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _stack().pop()
        self._entered.pop().__exit__(*exc)

    def synchronize(self) -> None:
        """Wait until everything queued on this lane is done (the host copies into ``out`` included)."""
        self.numba.synchronize()
        pending, self._pending = self._pending, []
        for out, values, _ in pending:
            out[...] = values
        stream_order.synchronized(self)

    def __repr__(self) -> str:
        kind = "numba + cupy stream" if self.cupy is not None else "numba stream"
        return f"<Lane {self.id}: {kind}>"


def current() -> Lane | None:
    """The lane of the innermost ``with lane:`` in this thread, or None (the default stream)."""
    stack = _stack()
    return stack[-1] if stack else None


def lanes(count: int) -> list[Lane]:
    """``count`` new lanes. On a GPU with cupy each is a blocking cupy stream (``non_blocking=False``: work on the
    legacy default stream, such as a CUDA event of ``lk.Timer``, still waits for it and it for that) seen by numba
    through ``cuda.external_stream``; without cupy a numba stream; on the simulator the simulator's stream."""
    if count < 1:
        raise ValueError(f"lanes: count must be at least 1, got {count}")
    if _cupy_streams():
        made = []
        for _ in range(count):
            s = _cupy_stream()(non_blocking=False)
            made.append(Lane(cuda.external_stream(s.ptr), s))  # the Lane keeps s alive as long as numba's view
        return made
    return [Lane(_makers["numba"]()) for _ in range(count)]


def _cupy_stream():
    import cupy

    return _makers.setdefault("cupy", cupy.cuda.Stream)


def _cupy_streams() -> bool:
    return device.info().kind == "gpu" and bool(device.info().cupy)


class SimulatedPinned(np.ndarray):
    """The simulator's pinned memory: a numpy array that a lane's host copies fill only at the lane's
    synchronize(), as a GPU's asynchronous copies into pinned memory land some time before it."""


def pinned(shape, dtype=np.float32) -> np.ndarray:
    """A host array in pinned (page-locked) memory (``cuda.pinned_array``): copies from and to it on a lane are
    truly asynchronous, so they overlap other lanes' kernels. Its contents start undefined. On the simulator a
    numpy array (``SimulatedPinned``; there is nothing to overlap)."""
    if simulator.active():
        return np.empty(shape, dtype).view(SimulatedPinned)
    return cuda.pinned_array(shape, dtype)


# ------------------------------------------------------------------------------ what lk.gpu asks of the current lane


def copy_to_host(lane: Lane, device_array, out):
    """``device_array`` into ``out`` asynchronously on ``lane`` (lk.gpu.to_host inside ``with lane:``). On the
    simulator, into pinned memory (``pinned``), the values are taken now and written into ``out`` at
    ``lane.synchronize()``; into pageable memory at once (a GPU's copy into pageable memory is done on return)."""
    if simulator.active() and isinstance(out, SimulatedPinned):
        values = device_array.copy_to_host()
        if np.shape(out) != values.shape:
            raise ValueError(f"to_host: out has shape {np.shape(out)}, the device array {values.shape}")
        lane._pending.append((out, values, lane.chunk))
        _waiting.add(lane)
        return out
    return device_array.copy_to_host(out, stream=lane.numba)


def synchronize_all() -> None:
    """Deliver every lane's pending host copies (the simulator's; lk.gpu.synchronize calls this)."""
    for lane in list(_waiting):
        lane.synchronize()
    _waiting.clear()
    stream_order.everything_ordered()


def undelivered(into: np.ndarray) -> list[tuple[Lane, int | None]]:
    """The simulator's host copies into ``into`` (or a part of it) still waiting for their lane's synchronize(), as
    (lane, chunk): a pipeline that returns with some has not waited for its lanes."""
    return [(lane, chunk) for lane in list(_waiting) for out, _, chunk in lane._pending
            if np.may_share_memory(out, into)]


# ------------------------------------------------------------------------------------------------ raw streams

RAW_STREAM = ("{} makes a stream of its own, refused while the pipeline check runs: use job.lanes(n) (lk.streams): "
              "the check sees the order of work on lanes only")


@contextmanager
def refusing_raw_streams():
    """Inside the block numba's ``cuda.stream()`` and (if cupy is loaded) ``cupy.cuda.Stream()`` raise
    ``StreamOrderError`` in one line; ``lanes()`` keeps working (its makers were bound before)."""
    patches = [(cuda, "stream", _refusing("cuda.stream()"))]
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        patches.append((cupy.cuda, "Stream", _refusing("cupy.cuda.Stream()", _cupy_stream())))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, refusal in patches:
        setattr(owner, name, refusal)
    try:
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _refusing(what: str, cls=None):
    """A stand-in that raises when called: a function, or for a class a subclass (its class attributes, such as
    cupy's ``Stream.null``, still there)."""
    def refuse(*args, **kwargs):
        raise stream_order.StreamOrderError(RAW_STREAM.format(what))

    if cls is None:
        return refuse
    return type(cls.__name__, (cls,), {"__new__": staticmethod(lambda cls, *args, **kwargs: refuse())})
