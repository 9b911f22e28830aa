"""CUDA C without a GPU: a kit kernel's source compiled for this CPU (``compiler``) with a thin header of the CUDA
built-ins it uses (``sources.HEADER``), its blocks run one after another and each block's threads as cooperative
threads with a real barrier (``sources.LAUNCHER``), behind the part of ``cupy.RawModule`` the kit uses
(``module.Module``). ``labkit.gpu.raw_module`` hands one out where there is no GPU; check lines of such runs say
"CPU emulation of CUDA C".
"""

from __future__ import annotations

from .compiler import CompileError, NoCompiler, build, find_compiler, kernels
from .module import Global, Kernel, LaunchError, Module

LABEL = "CPU emulation of CUDA C"

__all__ = ["LABEL", "CompileError", "Global", "Kernel", "LaunchError", "Module", "NoCompiler", "available", "build",
           "find_compiler", "kernels", "sandbox_paths"]


def available() -> str:
    """'' when CUDA C can be compiled and run on this CPU, else one line saying what to install."""
    from .compiler import missing

    return missing()


def sandbox_paths() -> list[str]:
    """Folders a grading sandbox must let the child read for the compiler: a ``$LABKIT_CXX`` outside the system
    folders and the Python environment (ziglang lives in the environment, which the sandbox binds already)."""
    import os
    import shutil
    import shlex

    command = find_compiler()
    named = os.environ.get("LABKIT_CXX", "").strip()
    if not command or not named:
        return []
    path = shutil.which(shlex.split(named)[0]) or shlex.split(named)[0]
    return [os.path.dirname(os.path.realpath(path))]
