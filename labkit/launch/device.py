"""What hardware and software is here, and what that means for a run.

Every other module asks this one whether it is on a real GPU, on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
kernels run as Python threads on the CPU) or on a CPU with no CUDA at all, so that sizes shrink, results are
labelled as simulated and hardware-only features are skipped with one visible line, the same way everywhere.

Detection never needs a GPU: cupy is imported lazily and only when not simulated, the driver version is read
through ``ctypes`` (no context is created), and every probe is wrapped so a broken install reports instead of crashing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from dataclasses import dataclass, field

from . import cudacpu
from .cudacpu.compiler import ENV, find_compiler


@dataclass(frozen=True)
class DeviceInfo:
    """A snapshot of the machine as labkit sees it; ``notes`` say what each finding means."""

    kind: str  # "gpu" | "simulator" | "cpu"
    name: str
    simulated: bool
    numba_version: str | None
    numba_cuda: bool
    numba_cuda_version: str | None
    cupy: bool
    cupy_version: str | None
    compute_capability: tuple[int, int] | None = None
    memory_total: int | None = None
    memory_free: int | None = None
    driver: tuple[int, int] | None = None  # CUDA version the driver supports (what nvidia-smi shows)
    runtime: tuple[int, int] | None = None  # CUDA toolkit (NVRTC) version numba compiles with
    cpu: str = ""
    python: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def cuda_extra(self) -> str | None:
        """The pip extra matching the driver's CUDA major version, e.g. ``labkit[cuda12]``."""
        return _extra_for(self.driver)


_INFO: DeviceInfo | None = None


def info(refresh: bool = False) -> DeviceInfo:
    """Detect once per process (probing a GPU costs a context); ``refresh=True`` detects again."""
    global _INFO
    if _INFO is None or refresh:
        _INFO = _detect()
    return _INFO


# ------------------------------------------------------------------------------------------------ detection


def simulator_requested() -> bool:
    """True when the environment asks numba for the CUDA simulator (what numba reads at import)."""
    value = os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip()
    try:
        return bool(int(value)) if value else False
    except ValueError:
        return False


def honour_simulator_env() -> bool:
    """Make ``NUMBA_ENABLE_CUDASIM=1`` count even if numba's core was imported before it was set.

    numba reads its config once, at first import; something as innocent as a pytest warning filter naming a numba
    class imports it early. The mode is only fixed when ``numba.cuda`` is imported, so until then re-reading the
    config is enough. Returns False when it is too late (numba.cuda already imported in GPU mode).
    """
    if not simulator_requested():
        return True
    config = sys.modules.get("numba.core.config")
    if config is None or getattr(config, "ENABLE_CUDASIM", 0):
        return True
    if "numba.cuda" in sys.modules:
        return _numba_cuda_is_simulator(sys.modules["numba.cuda"])
    try:
        config.reload_config()
    except Exception:
        return False
    return bool(getattr(config, "ENABLE_CUDASIM", 0))


def _numba_cuda_is_simulator(cuda) -> bool:
    """Ask the imported numba.cuda itself: its mode is fixed when it is first imported, whatever the env says now."""
    event = getattr(cuda, "event", None)
    if getattr(event, "__module__", "").startswith("numba.cuda.simulator"):
        return True
    try:
        from numba.cuda.core import config as cuda_config  # numba-cuda's own copy of the flag

        return bool(cuda_config.ENABLE_CUDASIM)
    except Exception:
        import numba

        return bool(getattr(numba.config, "ENABLE_CUDASIM", 0))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _driver_version() -> tuple[int, int] | None:
    """CUDA version of the installed driver via cuDriverGetVersion: needs no cuInit, so it cannot hang or fail."""
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so", "libcuda.dylib"]
    found = ctypes.util.find_library("cuda")
    if found:
        names.append(found)
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return version.value // 1000, (version.value % 1000) // 10
        except (OSError, AttributeError):
            continue
    return None


def _extra_for(driver: tuple[int, int] | None) -> str | None:
    if driver is None or driver[0] < 12:  # labkit's GPU stack needs a CUDA 12+ driver
        return None
    return f"labkit[cuda{min(driver[0], 13)}]"


def _probe_cupy() -> tuple[bool, str | None, str | None]:
    """(usable, version, why-not). Usable means a tiny round trip to the device worked."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library missing underneath
        first = str(exc).splitlines()[0] if str(exc) else ""
        return False, None, f"cupy is not importable ({type(exc).__name__}: {first})"
    version = getattr(cupy, "__version__", None)
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, version, "cupy sees no GPU"
        back = cupy.asarray([1.0, 2.0]).get()
        if float(back.sum()) != 3.0:
            return False, version, "cupy's test round trip returned a wrong value"
    except Exception as exc:
        return False, version, f"cupy is installed but cannot use a GPU ({type(exc).__name__}: {exc})"
    return True, version, None


def _detect() -> DeviceInfo:
    notes: list[str] = []
    if not honour_simulator_env():
        notes.append("NUMBA_ENABLE_CUDASIM=1 was set after numba.cuda was imported, so it has no effect: "
                     "restart Python (the notebook kernel) and set it before anything imports numba")
    driver = _driver_version()
    numba_version, numba_cuda, numba_cuda_version, simulated, gpu = _probe_numba(notes)
    name, cc, mem_total, mem_free, runtime = "", None, None, None, None
    if gpu:
        name, cc, mem_total, mem_free, runtime, driver = _probe_gpu(notes, driver)
    if simulated:
        cupy_ok, cupy_version, cupy_why = False, None, None  # never touch a device under the simulator
    else:
        cupy_ok, cupy_version, cupy_why = _probe_cupy()

    kind = "gpu" if gpu else ("simulator" if simulated else "cpu")
    cpu = _cpu_name()
    if kind == "simulator":
        name = "CUDA simulator"
    elif kind == "cpu":
        name = cpu
    _meaning(notes, kind, name, cc, mem_total, driver)
    _installs(notes, kind, driver, cupy_ok, cupy_why, numba_cuda)
    return DeviceInfo(kind=kind, name=name, simulated=simulated, numba_version=numba_version,
                      numba_cuda=numba_cuda, numba_cuda_version=numba_cuda_version, cupy=cupy_ok,
                      cupy_version=cupy_version, compute_capability=cc, memory_total=mem_total,
                      memory_free=mem_free, driver=driver, runtime=runtime, cpu=cpu,
                      python=platform.python_version(), notes=tuple(notes))


def _probe_numba(notes: list[str]) -> tuple[str | None, bool, str | None, bool, bool]:
    """numba's version, whether numba.cuda imports and its version, whether it is the simulator, whether it sees a
    usable GPU; what went wrong goes to ``notes``."""
    numba_version = numba_cuda_version = None
    numba_cuda = simulated = gpu = False
    try:
        import numba

        numba_version = numba.__version__
    except Exception as exc:
        notes.append(f"numba is not importable ({exc}): install labkit's dependencies (pip install -e .)")
    if numba_version is not None:
        try:
            from numba import cuda

            numba_cuda = True
            try:
                from importlib.metadata import version as _version

                numba_cuda_version = _version("numba-cuda")
            except Exception:
                numba_cuda_version = None
            simulated = _numba_cuda_is_simulator(cuda)
            if not simulated:
                gpu = bool(cuda.is_available())
                if not gpu:
                    err = cuda.cuda_error() if hasattr(cuda, "cuda_error") else None
                    if err:
                        notes.append(f"numba.cuda found no usable GPU: {str(err).strip().splitlines()[0]}")
        except Exception as exc:
            notes.append(f"numba.cuda is not importable ({type(exc).__name__}: {exc}); "
                         "install numba-cuda with the extra for your CUDA version")
    return numba_version, numba_cuda, numba_cuda_version, simulated, gpu


def _probe_gpu(notes: list[str], driver):
    """The GPU's name, compute capability, total and free memory, the CUDA runtime's version and the driver's
    (asked of numba where ``driver`` is None)."""
    from numba import cuda

    name, cc, mem_total, mem_free, runtime = "", None, None, None, None
    try:
        dev = cuda.get_current_device()
        raw = dev.name
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        cc = tuple(dev.compute_capability)
        mem_free, mem_total = (int(v) for v in cuda.current_context().get_memory_info())
    except Exception as exc:
        notes.append(f"the GPU did not answer a query ({type(exc).__name__}: {exc})")
        name = name or "CUDA GPU"
    try:
        runtime = tuple(cuda.runtime.get_version())
        if driver is None:
            driver = tuple(cuda.cudadrv.driver.driver.get_version())
    except Exception:
        pass
    return name, cc, mem_total, mem_free, runtime, driver


def _meaning(notes: list[str], kind: str, name: str, cc, mem_total, driver) -> None:
    """What the findings mean for a run, into ``notes``."""
    if kind == "gpu":
        notes.append(f"GPU: {name}" + (f", compute capability {cc[0]}.{cc[1]}" if cc else "")
                     + (f", {mem_total / 2**30:.1f} GiB" if mem_total else "") + ": kernels run on the device, "
                     "timings are real (CUDA events)")
    elif kind == "simulator":
        notes.append("no GPU: kernels run on the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), sizes are shrunk, "
                     "timings are not meaningful")
        if driver is not None:
            notes.append(f"a CUDA driver ({driver[0]}.{driver[1]}) is installed: unset NUMBA_ENABLE_CUDASIM "
                         "(before numba is imported) to use the GPU")
    else:
        notes.append("no GPU and no simulator: CPU-only stages run; for GPU kernels set NUMBA_ENABLE_CUDASIM=1 "
                     "before numba is imported (labkit then shrinks sizes and labels results as simulated)")
    if kind != "gpu":
        notes.append("managed memory and cupy's own routines (cuBLAS) need a real GPU: those cells are skipped with a "
                     "message")


def _installs(notes: list[str], kind: str, driver, cupy_ok: bool, cupy_why: str | None, numba_cuda: bool) -> None:
    """What to install for this driver, into ``notes``."""
    if cupy_why and kind == "gpu":
        notes.append(cupy_why + ": the cuBLAS comparison and CUDA C cells need cupy")
    extra = _extra_for(driver)
    if driver is not None and extra is None:
        notes.append(f"CUDA driver {driver[0]}.{driver[1]} is too old: numba-cuda and cupy need a CUDA 12 or "
                     "newer driver")
    elif extra and (kind != "gpu" or not cupy_ok or not numba_cuda):
        notes.append(f"CUDA driver {driver[0]}.{driver[1]} found: install the matching extra {extra} "
                     f"(from the repo: pip install -e '.[{extra[7:-1]}]') for numba-cuda and cupy")
    elif extra and kind == "gpu":
        notes.append(f"CUDA driver {driver[0]}.{driver[1]}: the matching pip extra is {extra}")
    elif kind != "gpu":
        notes.append("on a GPU machine, install the extra for the driver's CUDA major version "
                     "(nvidia-smi shows it): labkit[cuda12] or labkit[cuda13]")


# ----------------------------------------------------------------------------------------------- reporting


def _version(v: tuple[int, int] | None) -> str:
    return f"{v[0]}.{v[1]}" if v else "unknown"


def describe(device: DeviceInfo | None = None) -> str:
    """The text ``labkit info`` prints: findings, then what they mean."""
    d = device or info()
    mode = {"gpu": "real GPU", "simulator": "CUDA simulator (kernels run on the CPU)",
            "cpu": "CPU only (no CUDA)"}[d.kind]
    cupy = "not installed"
    if d.cupy_version:
        cupy = d.cupy_version + (" (usable)" if d.cupy else " (not usable)")
    lines = [
        f"device:      {label(d)}",
        f"mode:        {mode}",
        f"python:      {d.python}",
        f"numba:       {d.numba_version or 'not installed'}",
        f"numba-cuda:  {(d.numba_cuda_version or 'installed') if d.numba_cuda else 'not importable'}",
        f"cupy:        {cupy}",
        f"CUDA driver: {_version(d.driver)}",
        f"CUDA C:      {_cuda_c(d)}",
    ]
    if d.kind == "gpu":
        lines.append(f"CUDA toolkit (NVRTC): {_version(d.runtime)}")
        if d.compute_capability:
            lines.append(f"compute capability: {d.compute_capability[0]}.{d.compute_capability[1]}")
        if d.memory_total:
            free = f", {d.memory_free / 2**30:.1f} GiB free" if d.memory_free is not None else ""
            lines.append(f"memory:      {d.memory_total / 2**30:.1f} GiB{free}")
    lines.append(f"CPU:         {d.cpu}")
    lines.append("")
    lines.extend(f"- {note}" for note in d.notes)
    return "\n".join(lines)


def _cuda_c(d: DeviceInfo) -> str:
    """How CUDA C cells run here (``unavailable``, the rule the checks, the bench and the grader follow):
    through cupy on a GPU, on the CPU emulation (``labkit.cudacpu``) where there is none and a C++ compiler is."""
    why = unavailable(("cuda_c",))
    if why:
        return f"skipped ({why})"
    if d.kind == "gpu":
        return "through cupy, on the GPU"
    words = find_compiler() or ("?",)
    used = ("zig's clang from the ziglang package" if "ziglang" in words else f"{words[0]} from ${ENV}"
            if os.environ.get(ENV, "").strip() else words[0])
    return (f"on the CPU emulation of CUDA C (labkit.cudacpu, compiled with {used}): checked as on a GPU, its "
            f"times are not meaningful")


def unavailable(requires: tuple[str, ...]) -> str:
    """Why code needing ``requires`` cannot run here ("" when it can): CUDA C ("cuda_c") runs through cupy on a
    GPU, else on the CPU emulation where a C++ compiler is installed; cupy's own routines ("cupy") need a real GPU
    with cupy. Variants and tuning candidates both ask this (``labkit.stages.unavailable``)."""
    if "cuda_c" in requires:
        if info().kind != "gpu":  # gpu.cuda_c_on_cpu(): CUDA C runs on the CPU emulation wherever there is no GPU
            why = cudacpu.available()
            if why:
                return why
        elif not info().cupy:
            return "CUDA C on a GPU runs through cupy: install the cuda12 or cuda13 extra (labkit info says which)"
    if "cupy" in requires:
        if info().kind != "gpu" or not info().cupy:
            return "needs a real GPU with cupy (CUDA C through cupy.RawModule)"
    return ""


def label(device: DeviceInfo | None = None) -> str:
    """Short stable device string stored with every result."""
    d = device or info()
    if d.kind == "gpu":
        return d.name
    if d.kind == "simulator":
        return "CUDA simulator (CPU)"
    return f"CPU: {d.cpu}"


def is_gpu() -> bool:
    return info().kind == "gpu"


def is_simulated() -> bool:
    return info().simulated


def requires_gpu(what: str) -> bool:
    """Guard for hardware-only cells: ``if lk.requires_gpu("managed memory"): ...``."""
    if info().kind == "gpu":
        return True
    print(f"SKIPPED (needs a real GPU): {what}")
    return False


def use_simulator_if_no_gpu() -> bool:
    """Turn the simulator on when no CUDA driver is installed; only works before numba is first imported.

    Returns True when the simulator is (now) requested. For ``labkit``'s entry points and notebooks' first cell.
    """
    if simulator_requested():
        return True
    if "numba" in sys.modules or _driver_version() is not None:
        return False
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return True


honour_simulator_env()  # at import: labkit is often imported before numba.cuda, the last moment this works
