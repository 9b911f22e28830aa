"""The part of ``cupy.RawModule`` the kit uses, for a CUDA C source built for the CPU: ``Module(code, options)``,
``.get_function(name)`` (a kernel called as ``kernel(grid, block, args, shared_mem=0)``, as cupy's RawKernel) and
``.get_global(name)`` (a ``__constant__`` array: its address and size, which ``labkit.gpu.upload_constant`` fills).

Arguments: a pointer parameter takes an integer address (what ``labkit.gpu.launch_raw`` makes of a device array),
a numpy array, or a device array of numba's simulator (its numpy array's data); scalars go in by the parameter's
type (``np.int32`` for ``int``, ``np.float32`` for ``float``). A wrong count or kind is refused in one line.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import compiler

_LAUNCH = threading.Lock()  # a library's launcher state is one per process: one launch at a time
SCALARS = {"i": (ctypes.c_int32, "int"), "I": (ctypes.c_uint32, "unsigned int"), "l": (ctypes.c_int64, "long"),
           "L": (ctypes.c_uint64, "unsigned long"), "f": (ctypes.c_float, "float"), "d": (ctypes.c_double, "double")}


HINTS = {"i": "an np.int32", "f": "an np.float32", "d": "an np.float64", "l": "an np.int64"}


class LaunchError(RuntimeError):
    """A launch the CPU emulation refused or that failed (an illegal memory access)."""


class Module:
    """A CUDA C source compiled for the CPU (``labkit.cudacpu.compiler``) and loaded into this process."""

    def __init__(self, code: str, options=()):
        self.code, self.options = code, tuple(options)
        self.path = compiler.build(code, self.options)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.cudacpu_launch.restype = ctypes.c_int
        self.lib.cudacpu_symbol_size.restype = ctypes.c_long
        self.lib.cudacpu_symbol_size.argtypes = [ctypes.c_void_p]
        self._functions: dict = {}

    def get_function(self, name: str) -> Kernel:
        if name not in self._functions:
            try:
                call = getattr(self.lib, f"cudacpu_call_{name}")
                signature = getattr(self.lib, f"cudacpu_signature_{name}")
            except AttributeError:
                raise LaunchError(f"no __global__ kernel {name!r} in this source (kernels: "
                                  f"{', '.join(compiler.kernels(self.code)) or 'none'})") from None
            signature.restype = ctypes.c_char_p
            self._functions[name] = Kernel(self, name, call, signature().decode())
        return self._functions[name]

    def get_global(self, name: str) -> Global:
        try:
            address = ctypes.c_void_p.in_dll(self.lib, name)
        except ValueError:
            raise LaunchError(f"no __constant__ variable {name!r} in this source") from None
        address = ctypes.addressof(address)
        return Global(name, address, int(self.lib.cudacpu_symbol_size(address)))


class Global:
    """A ``__constant__`` variable: ``ptr`` its address, ``size`` its bytes (-1 when the library cannot say)."""

    def __init__(self, name: str, ptr: int, size: int):
        self.name, self.ptr, self.size = name, ptr, size

    def copy_from_host(self, array: np.ndarray) -> None:
        """Fill the variable's first bytes from a host array (as ``cudaMemcpyToSymbol``)."""
        data = np.ascontiguousarray(array)
        if self.size >= 0 and data.nbytes > self.size:
            raise ValueError(f"{self.name}: {data.nbytes} bytes do not fit in its {self.size}")
        ctypes.memmove(self.ptr, data.ctypes.data, data.nbytes)


class Kernel:
    """One ``__global__`` kernel of a ``Module``: ``kernel(grid, block, args, shared_mem=0)``."""

    def __init__(self, module: Module, name: str, call, signature: str):
        self.module, self.name, self._call, self.signature = module, name, call, signature
        self.attributes = None  # cupy's RawKernel has the compiled kernel's (registers, memory); a CPU has none

    def __call__(self, grid, block, args, shared_mem: int = 0):
        if shared_mem:
            raise LaunchError(f"{self.name}: dynamic shared memory (shared_mem={shared_mem}) is not emulated on "
                              f"the CPU; declare the shared array with its size")
        grid, block = _three(grid), _three(block)
        keep = pack(self.name, self.signature, tuple(args))
        pointers = (ctypes.c_void_p * max(1, len(keep)))(*(ctypes.addressof(k) for k in keep))
        error = ctypes.create_string_buffer(300)
        with _LAUNCH:
            status = self.module.lib.cudacpu_launch(self._call, pointers, (ctypes.c_uint * 3)(*grid),
                                                    (ctypes.c_uint * 3)(*block), error, ctypes.c_size_t(300))
        if status:
            raise LaunchError(f"{self.name}: {error.value.decode(errors='replace')}")


def _three(d) -> tuple[int, int, int]:
    dims = tuple(int(v) for v in d) if isinstance(d, tuple | list) else (int(d),)
    if not 1 <= len(dims) <= 3:
        raise LaunchError(f"a grid or block has 1 to 3 dimensions, not {len(dims)}")
    return (*dims, *(1,) * (3 - len(dims)))


def pointer_of(a) -> int | None:
    """The address a pointer parameter gets from ``a``, or None when ``a`` is not an address or an array."""
    if isinstance(a, int | np.integer) and not isinstance(a, bool):
        return int(a)
    host = getattr(a, "_ary", a)  # numba's simulator: a FakeCUDAArray around a numpy array
    if isinstance(host, np.ndarray):
        if not host.flags.c_contiguous:
            raise LaunchError("an array argument is not C-contiguous; pass a contiguous copy")
        return host.ctypes.data
    return None


def pack(name: str, signature: str, args: tuple) -> list:
    """Each argument as the ctypes value its parameter takes; refused in one line when it does not fit."""
    if "?" in signature:
        k = signature.index("?")
        raise LaunchError(f"{name}: parameter {k} has a type the CPU emulation cannot pass (pointers, int, "
                          f"unsigned, long, float, double only)")
    if len(args) != len(signature):
        raise LaunchError(f"{name} takes {len(signature)} arguments, got {len(args)}")
    out = []
    for k, (code, a) in enumerate(zip(signature, args)):
        if code == "p":
            address = pointer_of(a)
            if address is None:
                raise LaunchError(f"{name}: argument {k} is a pointer parameter, got a {type(a).__name__}")
            out.append(ctypes.c_void_p(address))
            continue
        kind, c_name = SCALARS[code]
        if code == "f":  # cupy passes a Python float as a double: on a GPU a float parameter would read garbage
            ok = isinstance(a, np.float32)
        elif code == "d":
            ok = isinstance(a, float | np.float64)
        else:
            ok = isinstance(a, int | np.integer) and not isinstance(a, bool)
        if not ok:
            raise LaunchError(f"{name}: argument {k} is for a parameter of type {c_name}: pass "
                              f"{HINTS.get(code, c_name)}, not a {type(a).__name__}")
        out.append(kind(a.item() if isinstance(a, np.generic) else a))
    return out
