"""CUDA C without a GPU: a kit kernel's source compiled for this CPU (``compiler``) with a thin header of the CUDA
built-ins it uses (``sources.HEADER``), its blocks run one after another and each block's threads as cooperative
threads with a real barrier (``sources.LAUNCHER``), behind the part of ``cupy.RawModule`` the kit uses
(``module.Module``). ``labkit.gpu.raw_module`` hands one out where there is no GPU; check lines of such runs say
"CPU emulation of CUDA C".
"""

from __future__ import annotations

from .compiler import CompileError, NoCompiler, build, find_compiler, kernels, missing
from .module import Global, Kernel, LaunchError, Module

LABEL = "CPU emulation of CUDA C"
#: what a check adds to a NaN output of an emulated kernel: shared memory starts as NaN in every block here
NAN_HINT = ("; on the CPU emulation shared memory starts as NaN: a read before the __syncthreads() that follows "
            "its store, or of an element never staged (the halo)?")

__all__ = ["LABEL", "NAN_HINT", "CompileError", "Global", "Kernel", "LaunchError", "Module", "NoCompiler", "available", "build",
           "find_compiler", "kernels", "sandbox_paths"]


def available() -> str:
    """'' when CUDA C can be compiled and run on this CPU, else one line saying what to install."""
    return missing()


def sandbox_paths() -> list[str]:
    """Folders a grading sandbox must let the child read for the compiler: the toolchain of a ``$LABKIT_CXX``
    (the folder above its ``bin/``, where its headers and libraries are). ziglang lives in the Python environment and
    a system compiler in /usr, which the sandbox binds already: nothing more for those."""
    import os
    import shlex
    import shutil

    named = os.environ.get("LABKIT_CXX", "").strip()
    if not named or find_compiler() is None:
        return []
    first = shlex.split(named)[0]
    folder = os.path.dirname(os.path.realpath(shutil.which(first) or first))
    root = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
    return [] if root == "/usr" or root.startswith("/usr/") else [root]
