"""Which C++ compiler builds CUDA C for the CPU, and the build itself: source + options -> a shared library, cached
by a hash of everything that decides its bytes.

The compiler: ``$LABKIT_CXX`` when set, else zig's clang (the ``ziglang`` wheel, a dependency of the ``dev`` and
``lab`` extras, so the install brings it), else the system's ``c++``/``g++``/``clang++``. The source is compiled
as C++ without its standard library (C headers only, no exceptions, no RTTI) and linked with ``-nostdlib``: the
library's libc and libm symbols stay undefined and resolve against the Python process when it is loaded. That keeps
a build to a second or less even with an empty cache (zig would otherwise first build its own libc pieces, tens of
seconds), which matters where every grading job starts with a fresh HOME and cache.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import sources

ENV = "LABKIT_CXX"
INSTALL = "pip install ziglang"
FLAGS = ("-x", "c++", "-std=c++14", "-O0", "-fPIC", "-fno-exceptions", "-fno-rtti", "-fvisibility=hidden",
         "-fno-strict-aliasing", "-fno-sanitize=all", "-U_FORTIFY_SOURCE", "-w")
# -O0: a check compiles a kernel once per layer shape and runs it on small inputs, so compile time is what counts
# (the unrolled register-tile kernel: 0.8 s against 1.5 s at -O2, a third of a stage 09 check); no fortify: its
# longjmp refuses to change stacks; no sanitizer (zig turns UBSan on at -O0, whose runtime is not linked)
#: a __global__ kernel's name (comments are removed first); a kernel inside a disabled #if block is not supported
KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?(\w+)\s*\(")


class CompileError(RuntimeError):
    """The compiler refused the source: the message is its first error line."""


class NoCompiler(RuntimeError):
    """No C++ compiler was found."""


@functools.lru_cache(maxsize=1)
def find_compiler() -> tuple[str, ...] | None:
    """The command that compiles C++ here (a list of words), or None: ``$LABKIT_CXX``, ziglang, a system one."""
    named = os.environ.get(ENV, "").strip()
    if named:
        words = shlex.split(named)
        return tuple(words) if shutil.which(words[0]) or Path(words[0]).is_file() else None
    if importlib.util.find_spec("ziglang") is not None:
        return (sys.executable, "-m", "ziglang", "c++", *_zig_target())
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return (found,)
    return None


def _zig_target() -> tuple[str, ...]:
    """zig's target for this machine with glibc: its own headers, no search of the host's."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    return ("-target", f"{arch}-linux-gnu") if sys.platform.startswith("linux") else ()


def missing() -> str:
    """'' when CUDA C can be built here, else one line saying what to install."""
    if not sys.platform.startswith("linux"):
        return f"the CPU emulation of CUDA C runs on Linux only (this is {sys.platform})"
    if find_compiler() is None:
        if os.environ.get(ENV, "").strip():
            return f"{ENV}={os.environ[ENV]} names no compiler found here: unset it, or name an existing one"
        return f"no C++ compiler for the CPU emulation of CUDA C: {INSTALL} (or set {ENV})"
    return ""


@functools.lru_cache(maxsize=4)
def version(command: tuple[str, ...]) -> str:
    """The compiler's own version line (part of every build's cache key)."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else ""


def cache_folder() -> Path:
    """Where the built libraries are kept: ``$XDG_CACHE_HOME/labkit/cudacpu`` (``~/.cache`` by default)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "labkit" / "cudacpu"


def kernels(code: str) -> list[str]:
    """The names of the ``__global__`` kernels of a CUDA C source, in order."""
    bare = re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)
    return list(dict.fromkeys(KERNEL.findall(bare)))


def translation_unit(code: str) -> str:
    """What is compiled of a source: the source, then a trampoline per kernel (the header comes by -include)."""
    trampolines = "".join(f"CUDACPU_KERNEL({name})\n" for name in kernels(code))
    return f'{code}\n#line 1 "cudacpu-trampolines"\n{sources.TRAMPOLINES}\n{trampolines}'


def build(code: str, options=()) -> Path:
    """The shared library of ``code`` compiled with ``options`` (``-DNAME=VALUE`` ...), built once and cached."""
    command = find_compiler()
    if command is None or missing():
        raise NoCompiler(missing())
    options = tuple(str(o) for o in options)
    unit = translation_unit(code)
    tools = [*command, version(command), sources.HEADER, *FLAGS]
    target = cache_folder() / f"{_key(unit, *options, *tools, sources.LAUNCHER)}.so"  # the launcher is linked in
    if target.exists():
        return target
    launcher = cache_folder() / f"launcher-{_key(sources.LAUNCHER, *tools)}.o"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        header, source = Path(tmp) / "cudacpu.h", Path(tmp) / "kernel.cu.cpp"
        obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        header.write_text(sources.HEADER)
        if not launcher.exists():  # its own translation unit: no option of a kernel's reaches it
            (Path(tmp) / "launcher.cpp").write_text(sources.LAUNCHER)
            _run([*command, *FLAGS, "-c", str(Path(tmp) / "launcher.cpp"), "-o", str(obj)])
            os.replace(obj, launcher)
        source.write_text(unit)
        _run([*command, *FLAGS, "-include", str(header), *options, "-c", str(source), "-o", str(obj)])
        _run([*command, "-shared", "-nostdlib", str(obj), str(launcher), "-o", str(lib)])
        os.replace(lib, target)  # atomic: a concurrent build of the same key leaves one whole file
    return target


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise NoCompiler(f"the C++ compiler could not start ({exc}): {INSTALL} (or set {ENV})") from exc
    if done.returncode:
        raise CompileError(first_error(done.stderr + done.stdout) or f"the compiler exited with {done.returncode}")


def first_error(text: str) -> str:
    """The compiler's first error line, with the source's own line number (the temporary file's name left out)."""
    for line in text.splitlines():
        if re.search(r"\berror\b", line):
            line = re.sub(r"^\S*kernel\.cu\.cpp:", "line ", line.strip())
            return re.sub(r"^\S*(launcher\.cpp|cudacpu-trampolines):", r"\1, line ", line)
    return ""
