"""The GPU plumbing every stage shares: launch configuration, copies, a buffer pool, a guard on managed memory,
and the record of what happened (launches, copies, bytes) that ``labkit.profile`` and the counts tables read.

Notebooks launch with ``launch(kernel, threads, *args)`` (enough blocks of ``TPB`` threads to cover ``threads``)
or ``launch_grid(kernel, grid, block, *args)``, and copy with ``to_device`` / ``to_host``: every launch and copy
then counts, and is timed when a ``labkit.Profiler`` records. Buffers come from ``buffer(role, shape)`` (device
memory) or ``managed_buffer(role, shape)`` (unified memory): allocated once per role and shape and handed back on
every later call, because ``cudaMalloc`` has a cost of its own that a timing should not include. While a check runs
(``poisoned()``), every buffer handed out is filled with NaN first, so a kernel that skips elements is caught even
in its intermediates.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from ..model.layers import OUT_AT
from . import cudacpu, device, stream_order, streams
from .buffers import (DEVICE, MANAGED, BufferPool, buffer, free_memory, managed_buffer, poison,  # noqa: F401
                      poisoned, poisoning, release_buffers)

#: the line tools/make_student.py leaves where a solution was: the launch layer refuses a kernel that still has it
STUB_MARK = "replace this line with your code"
TPB = 128  # threads per block of a 1-D launch: a multiple of the warp size, small enough for any kernel here


# ------------------------------------------------------------------------------------------- recording

_recorders: list = []  # objects with activity(name, kind, nbytes) -> context manager


@contextmanager
def recording(recorder):
    """Send every launch and copy made inside the block to ``recorder`` (a ``Traffic`` or a ``labkit.Profiler``)."""
    _recorders.append(recorder)
    try:
        yield recorder
    finally:
        _recorders.remove(recorder)


def _recorded(kind: str, name: str, nbytes: int, call: Callable, **info):
    if not _recorders:
        return call()
    with ExitStack() as stack:
        for r in list(_recorders):
            stack.enter_context(r.activity(name, kind, nbytes, **info))
        return call()


@dataclass
class Traffic:
    """Launches and copies counted while ``counting()`` is active: the quantities stage 04 is about."""

    launches: int = 0
    blocks: int = 0
    threads: int = 0
    htod: int = 0
    dtoh: int = 0
    htod_bytes: int = 0
    dtoh_bytes: int = 0
    kernels: Counter = field(default_factory=Counter)
    launched: dict = field(default_factory=dict)  # kernel name -> the kernel object (for its resource usage)

    @contextmanager
    def activity(self, name: str, kind: str, nbytes: int = 0, blocks: int = 0, threads: int = 0, kernel=None):
        if kind == "kernel":
            self.launches += 1
            self.blocks += blocks
            self.threads += threads
            self.kernels[name] += 1
            if kernel is not None:
                self.launched[name] = kernel
        elif kind == "HtoD":
            self.htod += 1
            self.htod_bytes += nbytes
        elif kind == "DtoH":
            self.dtoh += 1
            self.dtoh_bytes += nbytes
        yield

    @property
    def copies(self) -> int:
        return self.htod + self.dtoh


@contextmanager
def counting():
    """``with counting() as c: ...`` then ``c.launches``, ``c.htod``, ``c.dtoh``, ``c.htod_bytes`` ..."""
    with recording(Traffic()) as counts:
        yield counts


# -------------------------------------------------------------------------------------------- launching


def blocks(n: int, block: int = TPB) -> int:
    """Blocks of ``block`` threads that cover ``n`` threads (the last one may have spare threads)."""
    return max(1, math.ceil(int(n) / int(block)))


def kernel_name(kernel) -> str:
    return getattr(getattr(kernel, "py_func", kernel), "__name__", "kernel")


_stub_of: dict = {}


def refuse_stub(kernel) -> None:
    """Raise NotImplementedError for a numba kernel whose source still has the TODO stub. The simulator runs the
    stub's ``raise``; a GPU compiles it away (kernels report no exceptions), so without this an untouched kernel
    would run, write nothing, and fail its check as a wrong answer instead of "not implemented"."""
    py = getattr(kernel, "py_func", None)
    if py is None:
        return
    if py not in _stub_of:
        try:
            _stub_of[py] = STUB_MARK in inspect.getsource(py)
        except (OSError, TypeError):  # no source (built at run time): it runs as it is
            _stub_of[py] = False
    if _stub_of[py]:
        raise NotImplementedError(f"{py.__name__}: {STUB_MARK}")


def raw_module(code: str, options: tuple = ()):
    """``cupy.RawModule(code=code, options=options)`` on a GPU with cupy; elsewhere the same source compiled for the
    CPU (``labkit.cudacpu.Module``, the same ``get_function``/``get_global``). Refused while ``code`` still has the
    TODO stub."""
    if STUB_MARK in code:
        raise NotImplementedError(f"the CUDA C source: {STUB_MARK}")
    if cuda_c_on_cpu():
        _emulated[0] += 1
        return cudacpu.Module(code, tuple(options))
    import cupy

    return cupy.RawModule(code=code, options=tuple(options))


def kit_module(code: str, options=()):
    """``raw_module`` compiled once per source and options, for the kit's own given CUDA C (Winograd, the SGEMM, the
    tensor cores), whose kernels keep nothing in ``__constant__`` memory that one caller could change under another.
    Students' sources go through ``raw_module``, each call its own module."""
    return _kit_module(code, tuple(options))


@functools.cache
def _kit_module(code: str, options: tuple):
    return raw_module(code, options)


#: an H100's multiprocessors, where no GPU can be asked (the CPU emulation; a plan for a named GPU)
H100_SMS = 132


def multiprocessors() -> int:
    """The GPU's multiprocessors; an H100's where there is no GPU (the plans made on the CPU are an H100's)."""
    if cuda_c_on_cpu():
        return H100_SMS
    from numba import cuda

    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def cuda_c_on_cpu() -> bool:
    """Whether CUDA C runs on the CPU emulation here: wherever there is no GPU (numba's simulator runs the rest). A
    GPU machine runs it through cupy only, so that no CPU time is ever taken for a GPU timing."""
    return device.info().kind != "gpu"


def upload_constant(module, name: str, array) -> None:
    """Copy ``array`` (host or device, float32) into the ``__constant__`` variable ``name`` of ``module`` (a cupy
    RawModule or a CPU one): one copy, as ``cudaMemcpyToSymbol``."""
    symbol = module.get_global(name)
    if isinstance(symbol, cudacpu.Global):  # the CPU emulation: host memory either way
        host = getattr(array, "_ary", None)  # numba's simulator: the numpy array itself, no copy
        symbol.copy_from_host(host if isinstance(host, np.ndarray) else as_host(array))
        return
    import cupy

    data = cupy.asarray(array)
    size = symbol.mem.size  # cupy 14 reports 0 for a module's global (its size is not asked): no check then
    if size and data.nbytes > size:
        raise ValueError(f"{name}: {data.nbytes} bytes do not fit in its {size}")
    symbol.copy_from_device(cupy.ascontiguousarray(data).data, data.nbytes)


def launch_grid(kernel, grid, block, *args, shared_bytes: int = 0):
    """``kernel[grid, block](*args)`` (``shared_bytes`` of dynamic shared memory), counted and recorded; on the
    stream of the current ``lk.streams`` lane (``with lane:``), else on the default stream."""
    refuse_stub(kernel)
    lane = streams.current()
    if lane is not None:
        config = (grid, block, lane.numba, shared_bytes)
    else:
        config = (grid, block) if not shared_bytes else (grid, block, 0, shared_bytes)
    n_blocks, per_block = math.prod(_dims(grid)), math.prod(_dims(block))
    return _recorded("kernel", kernel_name(kernel), 0,
                     lambda: stream_order.launch(lane, args, lambda: kernel[config](*args)), blocks=n_blocks,
                     threads=n_blocks * per_block, kernel=kernel)


#: dynamic shared memory a kernel may take without asking (cudaFuncSetAttribute) for more
STATIC_SHARED = 48 * 1024


def launch_raw(kernel, grid, block, args: tuple, shared_bytes: int = 0):
    """Launch a CUDA C kernel of ``raw_module`` (``kernel(grid, block, args)``; a cupy RawModule's or the CPU
    emulation's), counted and recorded like every other launch. Array arguments may be cupy arrays or any
    C-contiguous device array (numba's, PyTorch's):
    those go in as their device pointers, because wrapping each in a cupy array costs tens of microseconds a
    launch, which a timing of a millisecond kernel would otherwise include. Inside ``with lane:`` a cupy kernel
    goes to the lane's stream (``with lane.cupy``); the CPU emulation runs at once, in call order."""
    grid, block = _dims(grid), _dims(block)
    given, args = args, tuple(_raw_arg(a, i) for i, a in enumerate(args))
    on_cpu = type(kernel).__module__.startswith("labkit.launch.cudacpu")
    if on_cpu:
        _emulated[0] += 1
    lane = streams.current()
    on_lane = lane.cupy if lane is not None and lane.cupy is not None and not on_cpu else nullcontext()
    n_blocks, per_block = math.prod(grid), math.prod(block)
    allowed = 0 if on_cpu else getattr(kernel, "max_dynamic_shared_size_bytes", 0)
    if shared_bytes > max(STATIC_SHARED, allowed) and not on_cpu:
        kernel.max_dynamic_shared_size_bytes = shared_bytes  # above 48 KB a kernel must be allowed it first

    def call():
        with on_lane:
            return kernel(grid, block, args, shared_mem=shared_bytes)

    return _recorded("kernel", getattr(kernel, "name", "raw_kernel"), 0,
                     lambda: stream_order.launch(lane, given, call), blocks=n_blocks,
                     threads=n_blocks * per_block, kernel=kernel)


_emulated = [0]


def emulated_launches() -> int:
    """CUDA C launches made so far on the CPU emulation (labkit.cudacpu): a check that made some says so."""
    return _emulated[0]


def _raw_arg(a, i: int):
    """A kernel argument as cupy takes it: cupy arrays and scalars as they are, another device array as its
    pointer (a 64-bit integer is what a ``float*`` parameter holds)."""
    if isinstance(a, (int, float, np.generic)) or type(a).__module__.startswith("cupy"):
        return a
    host = getattr(a, "_ary", None)  # numba's simulator: a FakeCUDAArray around a numpy array
    if isinstance(host, np.ndarray):
        if not host.flags.c_contiguous:
            raise ValueError(f"launch_raw: argument {i} (shape {host.shape}) is not C-contiguous; a kernel on a "
                             f"flat pointer would read it wrongly: pass a contiguous copy")
        return np.uint64(host.ctypes.data)
    pointer = getattr(a, "device_ctypes_pointer", None)  # numba's arrays: the pointer without building the interface
    if pointer is not None and a.is_c_contiguous():
        return np.uint64(pointer.value or 0)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"launch_raw: argument {i} is a {type(a).__name__}, not a device array or a scalar; "
                        f"copy host arrays to the device first (lk.gpu.to_device)")
    strides, shape = cai.get("strides"), cai["shape"]
    if strides is not None and any(n > 1 for n in shape):
        item = np.dtype(cai["typestr"]).itemsize
        dense = tuple(item * math.prod(shape[k + 1:]) for k in range(len(shape)))
        if any(s != d for s, d, n in zip(strides, dense, shape) if n > 1):
            raise ValueError(f"launch_raw: argument {i} (shape {tuple(shape)}) is not C-contiguous; a kernel on a "
                             f"flat pointer would read it wrongly: pass a contiguous copy")
    return np.uint64(cai["data"][0])


def memory_use(kernel) -> dict[str, int]:
    """Bytes of static shared memory per block and of constant memory a compiled kernel uses (numba's compiled
    overloads, or a cupy RawKernel's attributes); empty for a kernel not compiled yet or on the simulator."""
    if hasattr(kernel, "get_shared_mem_per_block") and getattr(kernel, "overloads", None):
        def biggest(v):
            return max(v.values(), default=0) if isinstance(v, dict) else int(v or 0)

        return {"shared": biggest(kernel.get_shared_mem_per_block()),
                "constant": biggest(kernel.get_const_mem_size())}
    attrs = getattr(kernel, "attributes", None)
    if isinstance(attrs, dict):
        return {"shared": int(attrs.get("shared_size_bytes", 0)), "constant": int(attrs.get("const_size_bytes", 0))}
    return {}


def _dims(d) -> tuple[int, ...]:
    return tuple(int(v) for v in d) if isinstance(d, tuple | list) else (int(d),)


def launch(kernel, threads, *args, block=TPB, shared_bytes: int = 0):
    """Launch at least ``threads`` threads in blocks of ``block``: an int for a 1-D grid, or a tuple with one
    entry per dimension (then ``block`` is a tuple too). The kernel must ignore the spare threads."""
    if isinstance(threads, tuple):
        grid = tuple(blocks(t, b) for t, b in zip(threads, block))
    else:
        grid = blocks(threads, block)
    return launch_grid(kernel, grid, block, *args, shared_bytes=shared_bytes)


_device_functions: dict = {}


def device_function(fn):
    """The CUDA device-function version of a plain or ``@njit`` Python function, compiled once: write the
    arithmetic of one output element once, and call it from CPU loops and from GPU kernels alike."""
    py = getattr(fn, "py_func", fn)
    if py not in _device_functions:
        from numba import cuda

        _device_functions[py] = cuda.jit(device=True)(py)
    return _device_functions[py]


# ---------------------------------------------------------------------------------------------- copies


def to_device(host, to=None, name: str = ""):
    """Host -> device copy: a new device array, or into the device array ``to``. Counted and recorded.

    Inside ``with lane:`` (``lk.streams``) the copy is queued on the lane's stream and the call returns at once;
    it overlaps other lanes' work only from pinned host memory (``lk.streams.pinned``)."""
    from numba import cuda

    host = np.ascontiguousarray(host)
    label = "[CUDA memcpy HtoD]" + (f" {name}" if name else "")
    lane = streams.current()
    stream = lane.numba if lane is not None else 0
    if to is not None:
        return _recorded("HtoD", label, host.nbytes, lambda: stream_order.copy_in(
            lane, to, lambda: (to.copy_to_device(host, stream=stream), to)[1]))
    return _recorded("HtoD", label, host.nbytes,
                     lambda: stream_order.copy_in(lane, None, lambda: cuda.to_device(host, stream=stream)))


def to_host(device_array, out=None, name: str = ""):
    """Device -> host copy: a new numpy array, or into ``out``. Waits for the kernels queued before it.

    Inside ``with lane:`` (``lk.streams``) a copy into ``out`` is queued on the lane's stream and the call returns
    at once: ``out`` holds the values only after ``lane.synchronize()``; the copy overlaps other lanes' work only
    into pinned host memory (``lk.streams.pinned``)."""
    label = "[CUDA memcpy DtoH]" + (f" {name}" if name else "")
    lane = streams.current()
    if out is not None and lane is not None:
        return _recorded("DtoH", label, device_array.nbytes, lambda: stream_order.copy_out(
            lane, device_array, lambda: streams.copy_to_host(lane, device_array, out)))
    # the default stream (outside a lane, or a new array: numba copies it there)
    if out is not None:
        return _recorded("DtoH", label, device_array.nbytes,
                         lambda: stream_order.copy_out(None, device_array, lambda: device_array.copy_to_host(out)))
    return _recorded("DtoH", label, device_array.nbytes,
                     lambda: stream_order.copy_out(None, device_array, lambda: device_array.copy_to_host()))


def flat(a):
    """A 1-D view of a device, managed or host array, for kernels that work element by element. (numpy's
    reshape of a managed array makes a view numba cannot launch on; this one can.)"""
    if hasattr(a, "gpu_data") and isinstance(a, np.ndarray):  # numba's ManagedNDArray
        from numba import cuda

        iface = dict(a.__cuda_array_interface__, shape=(a.size,), strides=None)
        return cuda.from_cuda_array_interface(iface, owner=a, sync=False)
    return a.reshape(a.size)


def as_host(a) -> np.ndarray:
    """A numpy array from a numpy, numba device or cupy array (not recorded: for checks and results)."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return a.get()


def synchronize() -> None:
    """Wait for all queued GPU work (numba, and cupy if loaded), every lane's included; without a GPU only the
    simulator's pending lane copies to deliver (``lk.streams``)."""
    streams.synchronize_all()
    if device.info().kind != "gpu":
        return
    import sys

    from numba import cuda

    cuda.synchronize()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.cuda.Device().synchronize()
        except Exception:  # noqa: BLE001 - a cupy without a usable device has nothing queued
            pass


def with_copies(fn: Callable, kind: str) -> Callable:
    """A layer function written for device arrays -> the same layer on host (numpy) arrays, the way a first GPU
    port works: every call copies each input array in (weights too), allocates its output on the device, runs,
    and copies the output back into the caller's ``out``."""
    out_at = OUT_AT[kind]

    def on_host_arrays(*args):
        from numba import cuda

        dev = [to_device(a) if isinstance(a, np.ndarray) and k != out_at else a for k, a in enumerate(args)]
        dev[out_at] = cuda.device_array(args[out_at].shape, np.float32)
        fn(*dev)
        to_host(dev[out_at], out=args[out_at])

    on_host_arrays.__name__ = f"{getattr(fn, '__name__', kind)}_with_copies"
    on_host_arrays.device_fn = fn
    return on_host_arrays


stream_order.attach(sys.modules[__name__])  # stream_order names buffers by this pool's roles
