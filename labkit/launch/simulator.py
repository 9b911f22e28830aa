"""The simulator's rules, in one place: what labkit shrinks when GPU kernels run on numba's CUDA simulator.

Under ``NUMBA_ENABLE_CUDASIM=1`` every GPU thread is a Python thread, about a million times slower than the GPU.
So GPU code is checked and run on a shrunk copy of the problem: fewer maps, small odd-sized images, a few images.
A kernel that reads its sizes from the arrays it is given passes both. Every result says it was simulated.
CPU code (numba ``@njit``, numpy) is never shrunk, except under ``LABKIT_QUICK=1`` (set by the test suite),
which caps CPU runs at a few images.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..model.nets import Layer, Net, get_net
from .device import info

#: the widest tile any of the kit's kernels covers on the simulator along one extent of a map or of the maps: stage 05's
#: 16 x 16 output tiles (07's and 08's matmul tiles are 8 x 8 there, the 1-D launches' blocks cover flat indices).
#: The checks' shapes below are drawn from it, and tests/test_boundaries.py records every launch of every stage's
#: checks to hold it to that: a kernel whose block edge exceeds it fails there, so a wider tile raises this first.
TILE = 16
#: images a kernel might cover in one block row or a student might cap a grid at ("a few dozen"): the widest tile,
#: twice
GRID_ROW = 2 * TILE
#: images up to which the kit's own kernels take one path and a student's grid might stop ("a few dozen", twice): the
#: kit's fc computes a thread per output below 64 images (kernels.FC_TILED_FROM), tiles or warps from there
GRID_CAP = 2 * GRID_ROW
#: batch sizes of a self-check of one layer of GPU code on the simulator, each with a shape of its own (``case``):
#: 1 the base shape (the counts tables and the notebooks' worked example use it), 2 maps wider and taller than a
#: tile, 3 many output maps, and more images than GRID_CAP (odd and above 4: a grid that is right only for some
#: batch sizes fails there; 3 more than a multiple of 4, 8, 16, 32 and 64)
BATCHES = (1, 2, 3, GRID_CAP + 3)
#: batch sizes of a whole-network check on the simulator: the layers crossed every boundary in their own checks,
#: the chain is about what passes between them
NETWORK_BATCHES = (1, 3)
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
#: the most bytes of a buffer a kernel cuts its batch into chunks for (stage 07's unroll: 256 MB on a GPU,
#: ``buffer_bytes``): 16 KB here, so that the images case's unroll (one map's 5 x 5 windows onto 2 x 3 outputs, 600
#: bytes an image) takes 27 images a chunk and its GRID_CAP + 3 = 67 three chunks, the last one smaller
BUFFER_BYTES = 16 << 10
#: how long the simulator's block manager sleeps between looks at its threads: numba's busy loop competes with the
#: simulated threads for the interpreter; a short sleep lets them run (1.5 to 3 times faster on 2 cores, measured
#: on stage 02's and 05's kernels)
POLL_SECONDS = 1e-4
#: the stack of one simulated thread: a block is as many Python threads as it has CUDA threads, and at the system's
#: 8 MB each a block of 256 reserved 2 GB of address space, which a grading child's limit (RLIMIT_AS) counts
THREAD_STACK_BYTES = 2 << 20
#: glibc's malloc arenas: one per thread that finds the others busy, each reserving 64 MB; on a busy 16-core machine
#: a simulated block took dozens (the child then ran out of address space: "can't start new thread")
MALLOC_ARENAS = 2


def active() -> bool:
    """True when numba.cuda is the simulator in this process."""
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


def buffer_bytes(gpu: int) -> int:
    """The most bytes of a buffer that a kernel cuts its batch into chunks for: ``gpu`` on a real GPU,
    ``BUFFER_BYTES`` on the simulator, whose checks then cross a chunk, with a smaller last one."""
    return BUFFER_BYTES if active() else gpu


def net(spec: str | Net) -> Net:
    """The network a simulated run or check uses: the same layers on a small input, at most ``MAX_CHANNELS``
    maps per conv layer. Images are not square, so swapped row and column indices fail."""
    spec = get_net(spec)
    padded = bool(spec.layers[0].pad)
    return spec.scaled((8, 12) if padded else (16, 14), MAX_CHANNELS)


def net_for(spec: str | Net, target: str) -> Net:
    """The real network, or its shrunk copy when ``target`` code runs on the simulator."""
    return net(spec) if shrinks(target) else get_net(spec)


@dataclass(frozen=True)
class Shape:
    """One shrunk single-layer case: input maps (at most), output maps of a conv (at most), and the conv's output
    rows and columns (None: the base shape's). Each case but the base crosses a boundary of its own."""

    name: str
    maps: int
    outputs: int | None = None  # None: one more than the input maps, so M != C
    rows: int | None = None
    cols: int | None = None


#: batch size -> the case it checks (``BATCHES``). Each kernel of stages 02-09 runs, across these, more than one
#: block in every dimension of its grid, with a remainder: maps of TILE + 3 x TILE + 5 outputs cross a tile in rows
#: and columns (and a 1-D block of 128 along a map's pixels; its pooled outputs, a second 1-D block); TILE + 3
#: output maps cross a matmul's M tiles; one input map makes the reduction C * K * K = K * K (25), a whole tile and a
#: remainder of 8 or of 16; GRID_CAP + 3 images on 2 x 3 outputs (the cheapest map that still pools) cross an image
#: grid capped at a few dozen or at 64, the kit's fc's change of path at 64 images, and stage 07's unroll chunks
#: (``BUFFER_BYTES``); its conv weights have the tiles case's shapes, so a check hands its arrays over where that
#: case's, freed, were (``labkit.freed``). Few maps where the case is not about maps: the simulator's cost is its
#: threads.
CASES = {
    1: Shape("base", MAX_CHANNELS),
    2: Shape("tiles", 1, outputs=1, rows=TILE + 3, cols=TILE + 5),
    3: Shape("output maps", 1, outputs=TILE + 3),
    GRID_CAP + 3: Shape("images", 1, outputs=1, rows=2, cols=3),
}


def case(batch: int) -> Shape:
    """The case a batch size checks (a batch size not in ``CASES``: the base shape)."""
    return CASES.get(int(batch), CASES[1])


class Shrunk(int):
    """A batch size that checks its ``CASES`` shape on a real GPU too. The real layers' sizes often fill whole
    blocks and tiles (cifar10's conv1: 32 x 32 x 32 outputs a map stack, a multiple of every block), so a kernel
    without a guard or wrong only on a second tile can pass every real-size check; after them, a GPU also runs these
    shapes. An int, so it travels and prints as its batch size; ``str`` names the shape."""

    def __str__(self) -> str:
        return f"{int(self)} (the shape {case(self).name!r}, crossing the tiles)"


def boundary_batches(target: str) -> tuple[int, ...]:
    """The shrunk cases a check of ``target`` code runs after its real sizes: all of ``BATCHES`` for GPU code on a
    GPU, none on the simulator (its shapes are these already) or for CPU code."""
    return tuple(Shrunk(b) for b in BATCHES) if target == "gpu" and not active() else ()


def layer_input_shape(spec: Net, layer: Layer, batch: int = 1) -> tuple[int, ...]:
    """Input shape (no batch axis) of a shrunk single-layer check at ``batch`` images (``case``): odd sizes,
    height != width."""
    shape = spec.input_shape_of(layer.name)
    if len(shape) != 3:
        return (min(shape[0], FEATURES),)
    shrink = case(batch)
    c = min(shape[0], shrink.maps)
    k = layer.kernel or 2
    if shrink.rows is None:
        h, w = (max(k + 4, 7), max(k + 2, 6)) if not layer.pad else (7, 6)
        return (c, h, w)
    if layer.kind != "conv":  # an activation's or a pool's input is a conv's output
        return (c, shrink.rows, shrink.cols)
    return (c, *((n - 1) * layer.stride + k - 2 * layer.pad for n in (shrink.rows, shrink.cols)))


def layer_outputs(layer: Layer, batch: int = 1) -> int:
    """Output maps of a shrunk conv check at ``batch`` images: the case's count, never more than the layer has (the
    base case: one more than its most input maps, so M != C)."""
    shrink = case(batch)
    return min(layer.out, MAX_CHANNELS + 1 if shrink.outputs is None else shrink.outputs)


def images(n: int, target: str) -> int:
    """How many images a run of ``target`` code uses when ``n`` are asked for."""
    if shrinks(target):
        return min(n, IMAGES)
    if target == "cpu" and quick():
        return min(n, QUICK_CPU_IMAGES)
    return n


_patched = [False]


def size_threads() -> None:
    """What a block of simulated threads needs, and no more: small stacks, few malloc arenas (glibc only)."""
    import ctypes
    import threading

    threading.stack_size(THREAD_STACK_BYTES)
    try:
        ctypes.CDLL(None).mallopt(-8, MALLOC_ARENAS)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def be_polite() -> None:
    """Make the simulator's block manager sleep between polls of its threads instead of spinning (once per process;
    a numba whose block manager looks different is left alone)."""
    if _patched[0]:
        return
    _patched[0] = True
    size_threads()
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
