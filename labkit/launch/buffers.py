"""The device's buffers: a pool per kind of memory (device, managed) that hands out arrays by role, shape and dtype,
allocated once and reused, never more than a share of the GPU's free memory (a clear MemoryError instead), each
lane's its own (``lk.streams``); and NaN poisoning of every buffer handed out while checking. ``lk.gpu.buffer``,
``lk.gpu.managed_buffer`` and the rest are these, under ``labkit.gpu``.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from . import device, streams

_poison = [0]


@contextmanager
def poisoned():
    """Inside the block every buffer handed out (and every engine intermediate) is filled with NaN first."""
    _poison[0] += 1
    try:
        yield
    finally:
        _poison[0] -= 1


def poisoning() -> bool:
    return _poison[0] > 0


def poison(array) -> None:
    """Fill a host, managed or device array with NaN (floats) or 0xFF bytes (integers)."""
    value = np.nan if np.issubdtype(np.dtype(array.dtype), np.floating) else np.iinfo(array.dtype).max
    if isinstance(array, np.ndarray):
        array[...] = value
    else:
        array.copy_to_device(np.full(array.shape, value, array.dtype))


def free_memory() -> int | None:
    """Free GPU memory in bytes, or None without a GPU."""
    if device.info().kind != "gpu":
        return None
    from numba import cuda

    return int(cuda.current_context().get_memory_info()[0])


class BufferPool:
    """Arrays by (role, shape, dtype), allocated on first use and reused, with a guard: the pool never holds more
    than ``share`` of the GPU memory that was free when it started, and refuses one clear way (MemoryError) if one
    buffer alone would need more. For managed memory that guard matters most: a program that asks for more
    managed memory than the card has can hang the GPU, not only itself."""

    def __init__(self, managed: bool = False, share: float = 0.9):
        self.managed, self.share = managed, share
        self._arrays: dict = {}
        self.held = 0
        self.limit: float | None = None
        self.handed = 0  # arrays handed out so far: the bench asks whether a variant's run took managed memory
        self.allocations = 0  # arrays allocated so far (a timed call that allocates shows here)
        self.generation = 0  # releases so far: what holds a pooled array's address (a CUDA graph) checks this

    def get(self, role: str, shape, dtype=np.float32):
        """The array for ``role``, ``shape`` and ``dtype``. Inside ``with lane:`` (``lk.streams``) each lane has
        arrays of its own: work in flight on two lanes at once never shares a buffer (a conv's padded input,
        say), whoever asked for it."""
        shape = tuple(int(s) for s in (shape if isinstance(shape, tuple | list) else (shape,)))
        lane = streams.current()
        if lane is not None:
            role = f"{role} [{lane.name}]"
        key = (role, shape, np.dtype(dtype).str)
        array = self._arrays.get(key)
        if array is None:
            array = self._allocate(role, shape, np.dtype(dtype))
            self._arrays[key] = array
        if poisoning():
            poison(array)
        self.handed += 1
        return array

    def roles(self) -> list[tuple[str, object]]:
        """(role, array) of every pooled array (a lane's role ends with its name): errors name a buffer by its role."""
        return [(role, array) for (role, *_), array in self._arrays.items()]

    def _allocate(self, role: str, shape: tuple, dtype: np.dtype):
        nbytes = int(np.prod(shape)) * dtype.itemsize
        free = free_memory()
        if free is not None:
            if self.limit is None:
                self.limit = self.share * free
            if self.held + nbytes > self.limit:
                self.release()  # a cache, not a hoard: start again before asking for more
                self.limit = self.share * free_memory()
                if nbytes > self.limit:
                    kind = "managed" if self.managed else "device"
                    raise MemoryError(f"{role} {shape} needs {nbytes / 1e9:.2f} GB of {kind} memory, more than "
                                      f"{self.share:.0%} of the {self.limit / self.share / 1e9:.2f} GB the GPU has "
                                      f"free: run fewer images per call")
        from numba import cuda

        if not self.managed:
            array = cuda.device_array(shape, dtype)
        elif free is not None:
            array = cuda.managed_array(shape, dtype)
        else:  # the simulator has no unified memory: a numpy array it copies in and out at every launch
            array = np.empty(shape, dtype)
        self.held += nbytes
        self.allocations += 1
        return array

    def release(self) -> None:
        """Drop every buffer and give its memory back now."""
        self._arrays.clear()
        self.held = 0
        self.limit = None
        self.generation += 1
        if free_memory() is not None:
            from numba import cuda

            cuda.current_context().deallocations.clear()


DEVICE = BufferPool(managed=False, share=0.9)
MANAGED = BufferPool(managed=True, share=0.5)


def buffer(role: str, shape, dtype=np.float32):
    """A device array for ``role``, allocated once per shape and reused by every later call."""
    return DEVICE.get(role, shape, dtype)


def managed_buffer(role: str, shape, dtype=np.float32):
    """A managed (unified-memory) array: one address valid on the host and on the GPU, pages moved on demand.
    Allocated once per role and shape; never more than half of the GPU's free memory in all. On the simulator,
    which has no unified memory, a numpy array."""
    return MANAGED.get(role, shape, dtype)


def release_buffers() -> None:
    """Give back every pooled buffer, device and managed."""
    DEVICE.release()
    MANAGED.release()
