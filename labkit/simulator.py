"""The simulator's rules, in one place: what labkit shrinks when GPU kernels run on numba's CUDA simulator.

Under ``NUMBA_ENABLE_CUDASIM=1`` every GPU thread is a Python thread, about a million times slower than the GPU.
So GPU code is checked and run on a shrunk copy of the problem: fewer maps, small odd-sized images, a few images.
A kernel that reads its sizes from the arrays it is given passes both. Every result says it was simulated.
CPU code (numba ``@njit``, numpy) is never shrunk, except under ``LABKIT_QUICK=1`` (set by the test suite),
which caps CPU runs at a few images.
"""

from __future__ import annotations

import os

from .nets import Layer, Net, get_net

#: batch sizes of a self-check of GPU code on the simulator: three, one of them odd and above 4 (a grid that is
#: right only for some batch sizes must fail here)
BATCHES = (1, 3, 5)
#: at most this many maps per conv layer (conv checks use one more output map than input maps: M != C)
MAX_CHANNELS = 4
#: fc layers get at most this many input features
FEATURES = 37
#: images of a simulated whole-network run
IMAGES = 2
#: CPU runs under LABKIT_QUICK=1
QUICK_CPU_IMAGES = 64
#: threads per block where a kernel's block is a reduction tree: each level of the tree is a barrier, and the
#: simulator waits on every thread of the block at every barrier
REDUCTION_THREADS = 4
#: how long the simulator's block manager sleeps between looks at its threads: numba's busy loop competes with the
#: simulated threads for the interpreter; a short sleep lets them run (1.5 to 3 times faster on 2 cores, measured
#: on stage 02's and 05's kernels)
POLL_SECONDS = 1e-4


def active() -> bool:
    """True when numba.cuda is the simulator in this process."""
    from .device import info

    return info().simulated


def quick() -> bool:
    """``LABKIT_QUICK=1``: the test suite's short runs."""
    return os.environ.get("LABKIT_QUICK", "") not in ("", "0")


def shrinks(target: str) -> bool:
    """GPU code on the simulator runs shrunk; CPU code never does."""
    return target == "gpu" and active()


def threads(gpu: int, simulated: int = REDUCTION_THREADS) -> int:
    """A block size: ``gpu`` on a real GPU, ``simulated`` on the simulator."""
    return simulated if active() else gpu


def net(spec: str | Net) -> Net:
    """The network a simulated run or check uses: the same layers on a small input, at most ``MAX_CHANNELS``
    maps per conv layer. Images are not square, so swapped row and column indices fail."""
    spec = get_net(spec)
    padded = bool(spec.layers[0].pad)
    return spec.scaled((8, 12) if padded else (16, 14), MAX_CHANNELS)


def net_for(spec: str | Net, target: str) -> Net:
    """The real network, or its shrunk copy when ``target`` code runs on the simulator."""
    return net(spec) if shrinks(target) else get_net(spec)


def layer_input_shape(spec: Net, layer: Layer) -> tuple[int, ...]:
    """Input shape (no batch axis) of a shrunk single-layer check: odd sizes, height != width."""
    shape = spec.input_shape_of(layer.name)
    if len(shape) == 3:
        c = min(shape[0], MAX_CHANNELS)
        k = layer.kernel or 2
        h, w = (max(k + 4, 7), max(k + 2, 6)) if not layer.pad else (7, 6)
        return (c, h, w)
    return (min(shape[0], FEATURES),)


def layer_outputs(layer: Layer) -> int:
    """Output maps of a shrunk conv check: one more than its input maps, so M != C."""
    return min(layer.out, MAX_CHANNELS + 1)


def images(n: int, target: str) -> int:
    """How many images a run of ``target`` code uses when ``n`` are asked for."""
    if shrinks(target):
        return min(n, IMAGES)
    if target == "cpu" and quick():
        return min(n, QUICK_CPU_IMAGES)
    return n


_patched = [False]


def be_polite() -> None:
    """Make the simulator's block manager sleep between polls of its threads instead of spinning (once per process;
    a numba whose block manager looks different is left alone)."""
    if _patched[0]:
        return
    _patched[0] = True
    import time

    import numpy as np

    try:
        from numba.cuda.simulator import kernel as sim
    except ImportError:
        return
    if not hasattr(sim, "BlockManager") or not hasattr(sim, "BlockThread"):
        return

    def run(self, grid_point, *args):  # numba's BlockManager.run, with a sleep where it spun
        threads, live, blocked = set(), set(), set()
        for block_point in np.ndindex(*self._block_dim):
            def target():
                self._f(*args)

            t = sim.BlockThread(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.add(t)
            live.add(t)
        while live:
            for t in live:
                if t.syncthreads_blocked:
                    blocked.add(t)
                elif t.exception:
                    for other in threads:
                        other.abort = True
                        other.syncthreads_blocked = False
                        other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if live == blocked:
                for t in blocked:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                blocked = set()
            live = {t for t in live if t.is_alive()}
            if live and live != blocked:
                time.sleep(POLL_SECONDS)
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    sim.BlockManager.run = run
