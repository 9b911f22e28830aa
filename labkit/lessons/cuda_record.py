"""What each thread of a CUDA C launch reads and writes, recorded on the CPU emulation for ``labkit.show``.

Inside ``recording(watch)`` every launch through ``labkit.gpu.launch_raw`` of a kernel built for the CPU runs instead
from a second build of the same source and options, compiled with ThreadSanitizer's instrumentation
(``-fsanitize=thread``: a call before every load and store, and for struct copies) but linked without its runtime:
the calls land in ``RECORDER`` below, which keeps the accesses that fall in the launch's array arguments, its
``__constant__`` arrays and its ``__shared__`` memory, with the block, the thread and the thread's barrier epoch
(``__syncthreads`` is renamed in the kernel's unit so that the recorder counts it). Each launch becomes a
``labkit.simcheck.SimLaunch`` with ``accesses`` and ``arrays``, appended to ``watch.launches`` in launch order, as a
numba kernel's on the simulator: ``labkit.access`` draws both alike.

Names: a pointer parameter's from the kernel's parameter list, a ``__constant__`` array's from the source, shaped
as the array last uploaded into it (``labkit.gpu.upload_constant``); shared memory as one array named after the
source's ``__shared__`` declaration (the kit's kernels declare one), shaped by ``shapes`` when given.
"""

from __future__ import annotations

import ctypes
import re
from contextlib import contextmanager

import numpy as np

from ..launch import gpu
from ..launch.cudacpu import compiler, sources
from ..launch.cudacpu.module import LaunchError, Module, _three, pack, pointer_of
from ..launch.simcheck import SimLaunch

RECORDER = r"""// labkit.lessons.cuda_record: ThreadSanitizer's entry points, keeping the accesses inside registered ranges.
#include <stddef.h>
#include <stdint.h>
#include <string.h>
extern "C" {
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim;
void cudacpu_syncthreads(void);
#define RANGES 32
static uintptr_t lo[RANGES], hi[RANGES];
static int ranges;
static int32_t* rows;  // 10 per access: range, element, block x y z, thread x y z, epoch, store (packed below)
static size_t capacity, count, dropped;
static unsigned epoch[1024];
static uint3 block_now = {0xffffffffu, 0, 0};

__attribute__((visibility("default"))) void cudacpu_record_start(const uint64_t* bounds, int n, int32_t* buffer,
                                                                 size_t cap) {
    ranges = n < RANGES ? n : RANGES;
    for (int k = 0; k < ranges; ++k) lo[k] = (uintptr_t)bounds[2 * k], hi[k] = (uintptr_t)bounds[2 * k + 1];
    rows = buffer, capacity = cap, count = 0, dropped = 0;
    block_now.x = 0xffffffffu;
}
__attribute__((visibility("default"))) size_t cudacpu_record_count(void) { return count; }
__attribute__((visibility("default"))) size_t cudacpu_record_dropped(void) { return dropped; }
__attribute__((visibility("default"))) void cudacpu_shared_section(uint64_t* out) {
    extern char __start_cudacpu_shared[] __attribute__((weak, visibility("hidden")));
    extern char __stop_cudacpu_shared[] __attribute__((weak, visibility("hidden")));
    out[0] = (uint64_t)(uintptr_t)__start_cudacpu_shared, out[1] = (uint64_t)(uintptr_t)__stop_cudacpu_shared;
}

static inline unsigned me(void) { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
static inline void new_block(void) {
    if (blockIdx.x != block_now.x || blockIdx.y != block_now.y || blockIdx.z != block_now.z) {
        memset(epoch, 0, sizeof epoch);
        block_now = blockIdx;
    }
}
static void keep(const void* p, size_t size, int store) {
    uintptr_t a = (uintptr_t)p;
    for (int k = 0; k < ranges; ++k) {
        if (a + size <= lo[k] || a >= hi[k]) continue;
        new_block();
        for (uintptr_t e = a < lo[k] ? lo[k] : a; e < a + size && e < hi[k]; e += 4) {
            if (count >= capacity) { ++dropped; return; }
            int32_t* r = rows + 10 * count++;
            r[0] = k, r[1] = (int32_t)((e - lo[k]) / 4);
            r[2] = blockIdx.x, r[3] = blockIdx.y, r[4] = blockIdx.z;
            r[5] = threadIdx.x, r[6] = threadIdx.y, r[7] = threadIdx.z;
            r[8] = (int32_t)epoch[me() & 1023], r[9] = store;
        }
        return;
    }
}
void cudacpu_rec_syncthreads(void) {
    new_block();
    ++epoch[me() & 1023];
    cudacpu_syncthreads();
}
void __tsan_init(void) {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit(void) {}
#define READS(n)                                                                                                 \
    void __tsan_read##n(void* p) { keep(p, n, 0); }                                                              \
    void __tsan_unaligned_read##n(void* p) { keep(p, n, 0); }                                                    \
    void __tsan_write##n(void* p) { keep(p, n, 1); }                                                             \
    void __tsan_unaligned_write##n(void* p) { keep(p, n, 1); }
READS(1) READS(2) READS(4) READS(8) READS(16)
void __tsan_read_range(void* p, size_t n) { keep(p, n, 0); }
void __tsan_write_range(void* p, size_t n) { keep(p, n, 1); }
void* __tsan_memcpy(void* d, const void* s, size_t n) { keep(s, n, 0); keep(d, n, 1); return memcpy(d, s, n); }
void* __tsan_memmove(void* d, const void* s, size_t n) { keep(s, n, 0); keep(d, n, 1); return memmove(d, s, n); }
void* __tsan_memset(void* d, int c, size_t n) { keep(d, n, 1); return memset(d, c, n); }
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
}
"""

#: what the kernel's unit is compiled with, beyond ``compiler.FLAGS``: the instrumentation, and barriers counted
INSTRUMENT = ("-fsanitize=thread", "-Dcudacpu_syncthreads=cudacpu_rec_syncthreads")
#: the kernel unit's flags: ``compiler.FLAGS`` with UBSan alone off (zig keeps every sanitizer off after "all")
KERNEL_FLAGS = tuple("-fno-sanitize=undefined" if f == "-fno-sanitize=all" else f for f in compiler.FLAGS)
ROW = 10  # int32 per access in the recorder's buffer
MOST = 2_000_000  # accesses kept per launch (a small launch makes tens of thousands); pages only touched as filled


def available() -> str:
    """'' when CUDA C launches can be recorded here, else one line saying why not."""
    why = compiler.missing()
    if why:
        return why
    try:
        build_recording("extern \"C\" __global__ void k(float* a) { a[0] = 1.0f; }")
    except (compiler.CompileError, compiler.NoCompiler) as exc:
        return f"this C++ compiler cannot instrument CUDA C for recording ({exc})"
    return ""


def build_recording(code: str, options=()) -> str:
    """The shared library of ``code`` with every load and store instrumented (cached as ``compiler.build``'s)."""
    command = compiler.find_compiler()
    if command is None or compiler.missing():
        raise compiler.NoCompiler(compiler.missing())
    options = tuple(str(o) for o in options)
    unit = compiler.translation_unit(code)
    tools = [*command, compiler.version(command), sources.HEADER, *KERNEL_FLAGS, *INSTRUMENT, RECORDER]
    folder = compiler.cache_folder()
    target = folder / f"rec-{compiler._key(unit, *options, *tools, sources.LAUNCHER)}.so"
    if target.exists():
        return str(target)
    import tempfile
    from pathlib import Path

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        tmp = Path(tmp)
        (tmp / "cudacpu.h").write_text(sources.HEADER)
        (tmp / "launcher.cpp").write_text(sources.LAUNCHER)
        (tmp / "recorder.cpp").write_text(RECORDER)
        (tmp / "kernel.cu.cpp").write_text(unit)
        objects = []
        for name, extra in (("launcher", ()), ("recorder", ())):
            compiler._run([*command, *compiler.FLAGS, *extra, "-c", str(tmp / f"{name}.cpp"), "-o",
                           str(tmp / f"{name}.o")])
            objects.append(str(tmp / f"{name}.o"))
        compiler._run([*command, *KERNEL_FLAGS, *INSTRUMENT, "-include", str(tmp / "cudacpu.h"), *options, "-c",
                       str(tmp / "kernel.cu.cpp"), "-o", str(tmp / "kernel.o")])
        compiler._run([*command, "-shared", "-nostdlib", str(tmp / "kernel.o"), *objects, "-o", str(tmp / "k.so")])
        (tmp / "k.so").replace(target)
    return str(target)


class RecordingModule(Module):
    """``cudacpu.Module`` built with the instrumentation (``build_recording``)."""

    def __init__(self, code: str, options=()):  # noqa: D107 - as Module's, another build
        self.code, self.options = code, tuple(options)
        self.path = build_recording(code, self.options)
        self.lib = ctypes.CDLL(self.path)
        self.lib.cudacpu_launch.restype = ctypes.c_int
        self.lib.cudacpu_symbol_size.restype = ctypes.c_long
        self.lib.cudacpu_symbol_size.argtypes = [ctypes.c_void_p]
        self.lib.cudacpu_record_count.restype = ctypes.c_size_t
        self.lib.cudacpu_record_dropped.restype = ctypes.c_size_t
        self._functions = {}


# ---------------------------------------------------------------------------------------------- the source


def parameters(code: str, kernel: str) -> list[str]:
    """The parameter names of ``__global__`` kernel ``kernel`` (the last word of each parameter)."""
    bare = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)
    found = re.search(rf"__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?{re.escape(kernel)}\s*\(([^)]*)\)",
                      bare)
    if not found:
        return []
    return [re.findall(r"\w+", p)[-1] if re.findall(r"\w+", p) else f"arg{k}"
            for k, p in enumerate(found.group(1).split(","))]


def shared_names(code: str) -> list[str]:
    bare = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)
    return re.findall(r"__shared__\s+[\w\s]+?\b(\w+)\s*\[", bare)


def constant_names(code: str) -> list[str]:
    bare = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)
    return re.findall(r"__constant__\s+[\w\s]+?\b(\w+)\s*\[", bare)


# ------------------------------------------------------------------------------------------------ recording

_state: dict = {"watch": None, "uploads": {}, "modules": {}, "shapes": {}}


@contextmanager
def recording(watch, shapes: dict | None = None):
    """Record every CUDA C launch made through ``labkit.gpu`` on the CPU emulation inside the block into
    ``watch.launches`` (a ``labkit.simcheck.Watch``). ``shapes``: name -> shape for a shared array."""
    saved = (gpu.launch_raw, gpu.upload_constant)
    prev = dict(_state)
    _state.update(watch=watch, uploads={}, shapes=dict(shapes or {}))
    real_launch, real_upload = saved

    def upload(module, name, array):
        real_upload(module, name, array)
        _state["uploads"][(id(module), name)] = (tuple(np.shape(array)), gpu.as_host(array)
                                                 if not isinstance(array, np.ndarray) else array)

    def launch(kernel, grid, block, args, shared_bytes=0):
        if type(kernel).__module__.startswith("labkit.launch.cudacpu") and _state["watch"] is not None:
            return gpu._recorded("kernel", getattr(kernel, "name", "raw_kernel"), 0,
                                 lambda: _launch(kernel, grid, block, tuple(args)),
                                 blocks=int(np.prod(_three(grid))), threads=int(np.prod(_three(grid)) *
                                                                                np.prod(_three(block))))
        return real_launch(kernel, grid, block, args, shared_bytes=shared_bytes)

    gpu.launch_raw, gpu.upload_constant = launch, upload
    try:
        yield watch
    finally:
        gpu.launch_raw, gpu.upload_constant = saved
        _state.update(prev)


def _recording_module(module) -> RecordingModule:
    key = (module.code, module.options)
    if key not in _state["modules"]:
        _state["modules"][key] = RecordingModule(module.code, module.options)
    return _state["modules"][key]


def _launch(kernel, grid, block, args: tuple) -> None:
    """Run ``kernel`` from its instrumented build (its module's ``__constant__`` arrays copied over) and append what
    it touched to the watch."""

    module = kernel.module
    rec = _recording_module(module)
    ranges, named = [], []  # (start, end), (name, kind, shape)
    for name in constant_names(module.code):
        try:
            src, dst = module.get_global(name), rec.get_global(name)
        except LaunchError:  # declared inside an #if the options turn off
            continue
        if src.size > 0:
            ctypes.memmove(dst.ptr, src.ptr, src.size)
        shape, _ = _state["uploads"].get((id(module), name), ((max(dst.size, 4) // 4,), None))
        ranges.append((dst.ptr, dst.ptr + 4 * int(np.prod(shape))))
        named.append((name, "constant", tuple(shape)))
    params = parameters(module.code, kernel.name)
    for k, a in enumerate(args):
        host = getattr(a, "_ary", a)
        if kernel.signature[k:k + 1] == "p" and isinstance(host, np.ndarray) and host.dtype.itemsize == 4:
            start = pointer_of(host)
            ranges.append((start, start + host.nbytes))
            named.append((params[k] if k < len(params) else f"arg{k}", "global", host.shape))
    bounds = (ctypes.c_uint64 * 2)()
    rec.lib.cudacpu_shared_section(bounds)
    if bounds[1] > bounds[0]:
        names = shared_names(module.code)
        label = names[0] if len(names) == 1 else "shared memory"
        words = (bounds[1] - bounds[0]) // 4
        shape = _state["shapes"].get(label)
        shape = tuple(shape) if shape is not None and int(np.prod(shape)) <= words else (words,)
        ranges.append((bounds[0], bounds[0] + 4 * int(np.prod(shape))))
        named.append((label, "shared", shape))
    flat = (ctypes.c_uint64 * (2 * len(ranges)))(*[v for r in ranges for v in r])
    buffer = np.empty(MOST * ROW, np.int32)
    rec.lib.cudacpu_record_start(flat, len(ranges), buffer.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(MOST))
    mine = rec.get_function(kernel.name)
    keep = pack(kernel.name, mine.signature, args)
    pointers = (ctypes.c_void_p * max(1, len(keep)))(*(ctypes.addressof(k) for k in keep))
    error = ctypes.create_string_buffer(300)
    g, b = _three(grid), _three(block)
    status = rec.lib.cudacpu_launch(mine._call, pointers, (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), error,
                                    ctypes.c_size_t(300))
    rows = buffer[:ROW * int(rec.lib.cudacpu_record_count())].reshape(-1, ROW)
    launch = SimLaunch(kernel.name, g, b)
    launch.accesses = [(named[r[0]][0], int(r[1]), (int(r[2]), int(r[3]), int(r[4])), (int(r[5]), int(r[6]), int(r[7])),
                        int(r[8]), bool(r[9]), False) for r in rows]
    launch.arrays = {name: (kind, shape) for name, kind, shape in named
                     if any(a[0] == name for a in launch.accesses)}
    _state["watch"].launches.append(launch)
    if status:
        raise LaunchError(f"{kernel.name}: {error.value.decode(errors='replace')}")
    # the caller's outputs are the real module's arguments already: the instrumented build wrote them
