"""The order of work between lanes, checked: modelled on the simulator, provoked on a GPU.

A GPU runs two streams side by side: a copy queued on lane B of a buffer that lane A's kernels write may run
before those kernels, and the wrong values show only when the timing lets them. numba's simulator runs every launch
at once, in call order, so there such a race always "works"; on a GPU it often does too. Stage 10's pipeline check
(``lk.whole.check_pipeline``) closes both gaps with this module:

- **the model** (the simulator only): for work queued through the kit's API inside ``with lane:`` (``lk.gpu``'s
  launches and copies, hence ``Job``'s steps) each lane counts its steps, and each device buffer remembers the lane
  and step that last wrote it (a copy into it; a launch whose run changed its contents: every array argument of a
  launch is read, the written ones are found by comparing contents before and after). ``lane.synchronize()``
  orders that lane's steps before all later work; ``lk.gpu.synchronize()`` and work on the default stream (no
  lane: on a GPU the legacy default stream waits for the lanes, blocking streams, and they for it) order every
  lane's. A read or write on lane X of a buffer last written on lane Y != X, not yet ordered, raises
  ``StreamOrderError``: one line naming both lanes, the buffer's ``lk.gpu.buffer`` role and the chunk (``Lane.chunk``,
  which ``Job.upload`` sets). The model runs only while some lane has work not yet ordered: elsewhere a launch or
  copy costs one test;
- **the delays** (a GPU only): ``hold_back`` queues a spin kernel first on each lane, longest on one, so that work
  queued on another lane than a chunk's kernels, or a read before the final wait, runs before them.
"""

from __future__ import annotations

import re
import weakref

import numpy as np
from numba import cuda, uint32

from . import simulator


class StreamOrderError(RuntimeError):
    """Work on one lane that nothing orders after the work of another, or a stream the check cannot see."""


_steps: dict = {}  # lane -> [steps queued, steps ordered]: the lanes with steps since everything was last ordered
_writers: dict = {}  # id(root) -> (weak reference to root, lane, step, chunk, what wrote it)


def root(a) -> np.ndarray | None:
    """The numpy array holding a simulator device array's memory (every view of a buffer has the same), or None for
    anything else (a scalar, a host array, a GPU's device array)."""
    ary = getattr(a, "_ary", None)
    if not isinstance(ary, np.ndarray):
        return None
    while isinstance(ary.base, np.ndarray):
        ary = ary.base
    return ary


def launch(lane, args, call):
    """``call()``: a launch of ``args`` on ``lane`` (None: the default stream), as the model sees it."""
    if lane is None:
        everything_ordered()
        return call()
    if not simulator.active():
        return call()
    views = [(r, a._ary) for a in args if (r := root(a)) is not None]
    for r, _ in views:
        _check(lane, r, "reads")
    before = [view.tobytes() for _, view in views]
    result = call()
    step = _step(lane)
    for (r, view), was in zip(views, before):
        if view.tobytes() != was:
            _wrote(r, lane, step, "kernels")
    return result


def copy_in(lane, target, call):
    """``call()``: a host-to-device copy on ``lane`` into ``target`` (None: into the new array it returns)."""
    if lane is None:
        everything_ordered()
        return call()
    if not simulator.active():
        return call()
    if target is not None and (r := root(target)) is not None:
        _check(lane, r, "writes")
    result = call()
    r = root(target if target is not None else result)
    if r is not None:
        _wrote(r, lane, _step(lane), "copy")
    return result


def copy_out(lane, source, call):
    """``call()``: a device-to-host copy of ``source`` on ``lane`` (None: the default stream)."""
    if lane is None:
        everything_ordered()
        return call()
    if simulator.active() and (r := root(source)) is not None:
        _check(lane, r, "reads")
        _step(lane)
    return call()


def synchronized(lane) -> None:
    """Everything queued on ``lane`` so far is done (``lane.synchronize()``)."""
    held = _steps.get(lane)
    if held is not None:
        held[1] = held[0]
        if all(done == queued for queued, done in _steps.values()):
            everything_ordered()


def everything_ordered() -> None:
    """Every lane's work so far is ordered before all later work (``lk.gpu.synchronize()``, the default stream)."""
    if _steps or _writers:
        _steps.clear()
        _writers.clear()


def _step(lane) -> int:
    held = _steps.setdefault(lane, [0, 0])
    held[0] += 1
    return held[0]


def _wrote(r: np.ndarray, lane, step: int, what: str) -> None:
    _writers[id(r)] = (weakref.ref(r), lane, step, getattr(lane, "chunk", None), what)


def _check(lane, r: np.ndarray, verb: str) -> None:
    held = _writers.get(id(r))
    if held is None or held[0]() is not r:
        return
    _, writer, step, chunk, what = held
    if writer is lane or _steps[writer][1] >= step:
        return
    chunk = f"chunk {chunk}, " if chunk is not None else ""
    them = "them" if what == "kernels" else "it"
    raise StreamOrderError(f"{lane.name} {verb} {_name(r)} ({chunk}written by {writer.name}'s {what}) with nothing "
                           f"ordering it after {them}: queue a chunk's upload, classes and download on one lane, or "
                           f"synchronize {writer.name} first")


_LANE_SUFFIX = re.compile(r" \[lane\d+\]$")


#: the launch layer (``labkit.launch.gpu``), which attaches itself when it is imported: it queues every launch and
#: copy through this model, so this module sits below it and reaches it only through this reference
_gpu = None


def attach(gpu_module) -> None:
    """``gpu_module`` names buffers (its pool's roles) and launches the spins of ``hold_back``."""
    global _gpu
    _gpu = gpu_module


def _name(r: np.ndarray) -> str:
    """A buffer as the errors name it: its ``lk.gpu.buffer`` role (without the lane the pool adds), else its shape."""
    for role, held in _gpu.DEVICE.roles():
        if root(held) is r:
            return f"'{_LANE_SUFFIX.sub('', role)}'"
    return f"a device array {r.shape} {r.dtype}"


# ------------------------------------------------------------------------------------------- the GPU's delays

#: the delay of the lane that computes the chunk the check picked, in milliseconds: longer than a pipeline takes to
#: queue its work, so that a copy of that chunk on another lane, or a read before the final wait, comes first
LONGEST_MS = 30.0


@cuda.jit
def _spin(microseconds):
    """Hold a stream back: one thread sleeping about ``microseconds``."""
    for _ in range(microseconds):
        cuda.nanosleep(uint32(1000))


def hold_back(lanes, longest, rng) -> dict[str, float]:
    """Queue a spin first on each lane: ``LONGEST_MS`` on ``longest``, shorter and different ones (up to half of it,
    in a random order) on the others. Returns the delays in ms by lane name; on the simulator queues nothing and
    returns {} (the model catches there what the delays provoke on a GPU)."""
    others = [lane for lane in lanes if lane is not longest]
    ms = {lane: LONGEST_MS / 2 * (1 + k) / len(others) for lane, k in zip(others, rng.permutation(len(others)))}
    ms[longest] = LONGEST_MS
    if simulator.active():
        return {}
    for lane, delay in ms.items():
        with lane:
            _gpu.launch_grid(_spin, 1, 1, int(delay * 1000))
    return {lane.name: delay for lane, delay in ms.items()}
