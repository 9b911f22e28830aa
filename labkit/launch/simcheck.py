"""Races, missing barriers and memory traffic, seen without a GPU: instrumentation of numba's CUDA simulator.

The simulator runs one block at a time, its threads as Python threads, so a kernel whose threads race for the same
element usually gets the right answer there, and a missing ``syncthreads`` rarely shows. Inside ``watching()``
every array access of every simulated launch is recorded with the thread that made it, the barrier epoch it was in
(the number of ``syncthreads`` that thread has passed) and the source line, and each launch is judged:

- **write conflicts**: an element of global memory written by two threads, not both through ``cuda.atomic``;
- **shared-memory hazards**: in one block, an element of shared memory written by one thread and read or written by
  another with no barrier between them (same epoch).

The same records count loads and stores, per kind of memory (global, shared, constant) and per thread: the memory
traffic a student can see without a GPU. Local arrays (``cuda.local.array``) are private to a thread: not counted.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from . import simulator

MAX_REPORTED = 3  # conflicts described per launch


@dataclass
class Conflict:
    kind: str  # "write conflict", "read after write without a barrier", ...
    where: str  # "out[0, 1, 2, 3]"
    first: tuple  # (thread, line)
    second: tuple

    def __str__(self) -> str:
        (t1, l1), (t2, l2) = self.first, self.second
        return (f"{self.kind} on {self.where}: thread {_thread(t1)} ({_fmt(l1)}) and thread {_thread(t2)} "
                f"({_fmt(l2)})")


def _thread(t) -> str:
    b, th = t
    return f"{_dim(th)} of block {_dim(b)}"


def _dim(d) -> str:
    d = tuple(d)
    while len(d) > 1 and d[-1] == 0:
        d = d[:-1]
    return "(" + ", ".join(map(str, d)) + ")" if len(d) > 1 else str(d[0])


@dataclass
class SimLaunch:
    """What one simulated launch did: its memory operations and the conflicts found among them."""

    kernel: str
    grid: tuple
    block: tuple
    loads: Counter = field(default_factory=Counter)  # kind -> count
    stores: Counter = field(default_factory=Counter)
    per_thread: dict = field(default_factory=lambda: defaultdict(Counter))  # thread -> Counter("global load"...)
    conflicts: list[Conflict] = field(default_factory=list)
    conflict_count: int = 0
    #: with ``watching(log=True)``: every element access, (array name, flat index, block, thread, epoch, store,
    #: atomic), in the order the simulator made them (``labkit.access`` draws them); None otherwise
    accesses: list | None = None
    arrays: dict = field(default_factory=dict)  # with log=True: array name -> (kind, shape) of the arrays touched

    @property
    def threads(self) -> int:
        return int(np.prod(self.grid)) * int(np.prod(self.block))

    def per_thread_max(self, what: str) -> int:
        """The most operations of one kind ("global load", "shared store", ...) any thread made."""
        return max((c[what] for c in self.per_thread.values()), default=0)

    def describe(self) -> str:
        worst = self.conflicts[0]
        more = f" (and {self.conflict_count - 1} more)" if self.conflict_count > 1 else ""
        return f"{worst} in {self.kernel}{more}"


@dataclass
class Watch:
    """The launches made inside ``watching()``."""

    launches: list[SimLaunch] = field(default_factory=list)
    log: bool = False  # keep every access of every launch (SimLaunch.accesses)

    @property
    def conflicts(self) -> list[SimLaunch]:
        return [launch for launch in self.launches if launch.conflict_count]

    def totals(self) -> Counter:
        """Loads and stores of every kind, summed over the launches: {"global load": n, "shared store": m, ...}."""
        out = Counter()
        for launch in self.launches:
            for kind, n in launch.loads.items():
                out[f"{kind} load"] += n
            for kind, n in launch.stores.items():
                out[f"{kind} store"] += n
        return out


# ------------------------------------------------------------------------------------------- recording

_state = threading.local()
_lock = threading.RLock()
_active: list[Watch] = []
_paused: list[Watch] = []  # watches set aside by paused(): their patches stay installed
_current: list = [None]  # the _Recorder of the launch in progress (the simulator runs one launch at a time)


class _Recorder:
    """The accesses of one launch, appended as they happen (the cheap part, in the simulated threads) and judged
    once the launch has ended (in the launching thread)."""

    def __init__(self, launch: SimLaunch, named: list[tuple[int, int, str, np.ndarray]]):
        self.launch = launch
        self.named = named  # (start address, end address, name, array) of the kernel's array arguments
        self.bases: dict = {}  # id(array) -> (address, strides, array)
        self.log: list = []  # (kind, address, thread, epoch, store, atomic, file, line, array, idx)

    def record(self, kind: str, array: np.ndarray, idx, store: bool) -> None:
        t = threading.current_thread()
        if not hasattr(t, "threadIdx"):
            return
        frame = sys._getframe(2)
        while frame.f_code in _SKIPPED:
            frame = frame.f_back
        while frame.f_code.co_filename == __file__ or "simulator" in frame.f_code.co_filename:
            _SKIPPED.add(frame.f_code)
            frame = frame.f_back
        if not isinstance(idx, tuple):
            idx = (idx,)
        base = self.bases.get(id(array))
        if base is None:
            base = self.bases[id(array)] = (array.__array_interface__["data"][0], array.strides, array)
        try:
            addr = base[0] + sum(i * st for i, st in zip(idx, base[1])) if len(idx) == array.ndim else None
        except TypeError:  # a slice: not one element
            addr = None
        self.log.append((kind, addr, t, getattr(t, "_lk_epoch", 0), store, getattr(_state, "atomic", False),
                         frame.f_code.co_filename, frame.f_lineno, array, idx))

    def judge(self) -> None:
        launch = self.launch
        if any(w.log for w in _active):
            self.keep()
        writers: dict = {}  # global address -> (thread, line, atomic)
        shared: dict = {}  # (block, address) -> [writer, epoch, line, {reader: line}]
        for kind, addr, t, epoch, store, atomic, filename, lineno, array, idx in self.log:
            me = (tuple(t.blockIdx), tuple(t.threadIdx))
            line = (filename, lineno)
            (launch.stores if store else launch.loads)[kind] += 1
            launch.per_thread[me][f"{kind} {'store' if store else 'load'}"] += 1
            if addr is None or kind == "constant":
                continue
            if kind == "global":
                if store:
                    prev = writers.get(addr)
                    if prev is not None and prev[0] != me and not (prev[2] and atomic):
                        self.conflict("write conflict (two threads, no atomic)", self.name(addr, kind, array, idx),
                                      (prev[0], prev[1]), (me, line))
                    writers[addr] = (me, line, atomic)
                continue
            rec = shared.get((me[0], addr))
            if rec is None or rec[1] != epoch:
                rec = shared[(me[0], addr)] = [None, epoch, None, {}]
            if store:
                if rec[0] is not None and rec[0] != me and not atomic:
                    self.conflict("shared-memory write conflict with no barrier between",
                                  self.name(addr, kind, array, idx), (rec[0], rec[2]), (me, line))
                readers = [(r, ln) for r, ln in rec[3].items() if r != me]
                if readers and not atomic:
                    self.conflict("shared-memory write after another thread's read with no barrier between",
                                  self.name(addr, kind, array, idx), readers[0], (me, line))
                rec[0], rec[2] = me, line
            else:
                if rec[0] is not None and rec[0] != me:
                    self.conflict("shared-memory read of another thread's write with no barrier between",
                                  self.name(addr, kind, array, idx), (rec[0], rec[2]), (me, line))
                if len(rec[3]) < 4:
                    rec[3].setdefault(me, line)
        self.log.clear()

    def keep(self) -> None:
        """The log as plain records, each element named by its array and flat index (SimLaunch.accesses)."""
        launch, accesses = self.launch, []
        by_id = {id(arr): (name, arr) for _, _, name, arr in self.named}
        for kind, addr, t, epoch, store, atomic, _, _, array, idx in self.log:
            if kind == "global":
                name, arr = by_id.get(id(array), (None, array))
                if name is None:
                    found = next(((n, a, s) for s, e, n, a in self.named if addr is not None and s <= addr < e), None)
                    if found is None or not found[1].flags.c_contiguous:
                        continue
                    name, arr = found[0], found[1]
                    flat = (addr - found[2]) // arr.itemsize
                else:
                    flat = _flat(idx, arr.shape)
            else:
                name, arr = _names.get(id(array), (f"{kind} array", array))[0], array
                flat = _flat(idx, arr.shape)
            if flat is None:
                continue
            launch.arrays.setdefault(name, (kind, tuple(arr.shape)))
            accesses.append((name, flat, tuple(t.blockIdx), tuple(t.threadIdx), epoch, store, atomic))
        launch.accesses = accesses

    def name(self, addr: int, kind: str, array, idx=None) -> str:
        if kind != "global":
            label = _names.get(id(array), (f"a {kind} array",))[0]
            return f"{label}[{', '.join(map(str, idx))}]" if idx is not None else label
        for start, end, name, arr in self.named:
            if start <= addr < end:
                idx = np.unravel_index((addr - start) // arr.itemsize, arr.shape) if arr.flags.c_contiguous \
                    else None
                return f"{name}[{', '.join(map(str, idx))}]" if idx is not None else name
        return f"a {kind} array"

    def conflict(self, kind, where, first, second) -> None:
        self.launch.conflict_count += 1
        if len(self.launch.conflicts) < MAX_REPORTED:
            self.launch.conflicts.append(Conflict(kind, where, first, second))


def _flat(idx, shape) -> int | None:
    """Flat (C-order) index of one element, negative indices wrapped as numpy wraps them; None for a slice."""
    if len(idx) != len(shape):
        return None
    try:
        return int(np.ravel_multi_index(tuple(int(i) for i in idx), shape, mode="wrap"))
    except (TypeError, ValueError):
        return None


_SKIPPED: set = set()  # code objects of the wrappers and the simulator: never the kernel's line


def _caller_line() -> tuple[str, int]:
    """(file, line) of the kernel code that is running: the first frame outside this module and the simulator."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__ or "simulator" in frame.f_code.co_filename):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("?", 0)


def _fmt(loc) -> str:
    import linecache

    filename, lineno = loc
    text = linecache.getline(filename, lineno).strip()
    where = filename.strip("<>") if filename.startswith("<") else filename.rsplit("/", 1)[-1]
    return f"{where}, line {lineno}" + (f": {text}" if text else "")


# ----------------------------------------------------------------------------------------- the patches


class _WatchedArray:
    """A shared or constant array inside a simulated kernel, with its accesses recorded."""

    def __init__(self, array: np.ndarray, kind: str):
        self._a, self._kind = array, kind
        self.shape, self.size, self.dtype, self.ndim = array.shape, array.size, array.dtype, array.ndim
        import linecache
        import re

        filename, lineno = _caller_line()
        found = re.match(r"\s*(\w+)\s*=", linecache.getline(filename, lineno))
        _names[id(array)] = (found.group(1) if found else f"the {kind} array of line {lineno}", array)

    def __getitem__(self, idx):
        rec = _current[0]
        if rec is not None:
            rec.record(self._kind, self._a, idx, False)
        return self._a[idx]

    def __setitem__(self, idx, value):
        rec = _current[0]
        if rec is not None:
            rec.record(self._kind, self._a, idx, True)
        self._a[idx] = value

    def __len__(self):
        return len(self._a)


def _patches():
    """(class, attribute, original, replacement) of every patch of the simulator that watching installs."""
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv import devicearray as sim_array

    return [*_access_patches(sim_array.FakeWithinKernelCUDAArray), _launch_patch(sim_kernel),
            *_memory_patches(sim_kernel, kernelapi), *_atomic_patches(kernelapi)]


def _access_patches(within) -> list[tuple]:
    """Every global load and store of a kernel's array, recorded by the launch's recorder."""
    orig_get, orig_set = within.__getitem__, within.__setitem__

    def get(self, idx):
        rec = _current[0]
        if rec is not None:
            rec.record("global", self._item._ary, idx, False)
        return orig_get(self, idx)

    def set_(self, idx, value):
        rec = _current[0]
        if rec is not None:
            rec.record("global", self._item._ary, idx, True)
        return orig_set(self, idx, value)

    return [(within, "__getitem__", orig_get, get), (within, "__setitem__", orig_set, set_)]


def _launch_patch(sim_kernel) -> tuple:
    """A launch while watching: its array arguments named, a recorder for it, judged when it ends."""
    orig_call = sim_kernel.FakeCUDAKernel.__call__

    def call(self, *args):
        if self._device or sim_kernel._kernel_context or not _active:
            return orig_call(self, *args)
        import inspect

        try:
            names = list(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):
            names = []
        named = []
        for i, a in enumerate(args):
            arr = getattr(a, "_ary", a if isinstance(a, np.ndarray) else None)
            if isinstance(arr, np.ndarray) and arr.ndim:
                start = arr.__array_interface__["data"][0]
                named.append((start, start + arr.nbytes, names[i] if i < len(names) else f"arg{i}", arr))
        grid, block = sim_kernel.normalize_kernel_dimensions(self.grid_dim, self.block_dim)
        launch = SimLaunch(getattr(self.fn, "__name__", "kernel"), tuple(grid), tuple(block))
        recorder = _current[0] = _Recorder(launch, named)
        try:
            return orig_call(self, *args)
        finally:
            _current[0] = None
            recorder.judge()
            for w in _active:
                w.launches.append(launch)

    return (sim_kernel.FakeCUDAKernel, "__call__", orig_call, call)


def _memory_patches(sim_kernel, kernelapi) -> list[tuple]:
    """Barrier epochs counted per thread; shared and constant arrays watched."""
    orig_sync = sim_kernel.BlockThread.syncthreads
    orig_shared, orig_const = kernelapi.FakeCUDAShared.array, kernelapi.FakeCUDAConst.array_like

    def sync(self):
        orig_sync(self)
        self._lk_epoch = getattr(self, "_lk_epoch", 0) + 1

    def shared(self, shape, dtype, alignment=None):
        if shape == 0:  # dynamic shared memory: one buffer for the whole launch, as the simulator has it
            return _WatchedArray(orig_shared(self, shape, dtype, alignment), "shared")
        # the simulator tells allocations apart by the source line that makes them: key by the kernel's line,
        # not this wrapper's (else every shared array of a kernel would be one and the same)
        from numba.cuda import types as cuda_types
        from numba.cuda.np import numpy_support

        if isinstance(dtype, cuda_types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        array = self._allocations.get(key)
        if array is None:
            array = self._allocations[key] = np.empty(shape, dtype)
        return _WatchedArray(array, "shared")

    def const(self, ary):
        return _WatchedArray(np.asarray(orig_const(self, ary)), "constant")

    return [(sim_kernel.BlockThread, "syncthreads", orig_sync, sync),
            (kernelapi.FakeCUDAShared, "array", orig_shared, shared),
            (kernelapi.FakeCUDAConst, "array_like", orig_const, const)]


def _atomic_patches(kernelapi) -> list[tuple]:
    """The accesses the simulator's atomics make, recorded as atomic."""
    atomics = []
    for name in ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin", "cas",
                 "compare_and_swap"):
        orig = getattr(kernelapi.FakeCUDAAtomic, name, None)
        if orig is None:
            continue

        def atomic(self, *a, _orig=orig):
            _state.atomic = True  # the accesses the simulator's atomic makes are recorded as atomic
            try:
                return _orig(self, *a)
            finally:
                _state.atomic = False

        atomics.append((kernelapi.FakeCUDAAtomic, name, orig, atomic))
    return atomics


_installed: list = []
_names: dict = {}  # id(shared or constant array) -> (the kernel's name for it, the array)


@contextmanager
def watching(log: bool = False):
    """Record and judge every simulated launch made inside the block: ``with watching() as w: ...`` then
    ``w.conflicts`` (launches with races) and ``w.totals()`` (loads and stores); ``log=True`` also keeps every
    access (``SimLaunch.accesses``). Does nothing on a real GPU."""
    watch = Watch(log=log)
    if not simulator.active():
        yield watch
        return
    with _lock:
        if not _installed:
            _installed[:] = _patches()
            for owner, name, _, new in _installed:
                setattr(owner, name, new)
        _active.append(watch)
    try:
        yield watch
    finally:
        with _lock:
            _active.remove(watch)
            if not _active and not _paused:
                for owner, name, orig, _ in _installed:
                    setattr(owner, name, orig)
                _installed.clear()
                _names.clear()


@contextmanager
def paused():
    """Launches inside the block are no watch's (neither judged nor logged): the engine's diagnosis re-runs a call
    that its watches already saw (``engine.checked_call``)."""
    with _lock:
        watches = list(_active)
        _paused.extend(watches)
        _active.clear()
    try:
        yield
    finally:
        with _lock:
            for w in watches:
                _paused.remove(w)
            _active[:] = watches + _active
