"""What a report was graded with: the device (GPU model and driver, or the simulator), Python and the libraries.

Recorded in every report's ``meta.environment``, so two runs' op times are only compared where they match.
Versions come from the installed packages' metadata (nothing is imported for it: cupy is never touched on the
simulator); the NVIDIA driver's own version from ``nvidia-smi`` where there is one.

The versions a process imports (``imported``) are the grader's and its children's, compared (``mismatch``) before
any job is graded: a child whose Python imports another numpy than the grader's fails every reference solution.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from importlib import metadata

from ..about import __version__
from ..launch import device

PACKAGES = ("numpy", "numba", "numba-cuda", "cupy", "labkit")
_CUPY = ("cupy", "cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x")


def _version(name: str) -> str | None:
    if name == "labkit":
        return __version__
    names = _CUPY if name == "cupy" else (name,)
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


#: the module each checked package is imported as (cupy: never imported for it, see ``imported``)
MODULES = {"numpy": "numpy", "numba": "numba", "numba-cuda": "numba_cuda", "labkit": "labkit"}


def imported() -> tuple[dict[str, str | None], dict[str, str]]:
    """({package: the version this process imports, None where it has none}, {package: the folder it comes from}):
    numpy, numba, numba-cuda and labkit as imported (``__version__``); cupy from the metadata beside the package
    that would be imported, never imported itself (the simulator never touches it)."""
    versions: dict[str, str | None] = {}
    origins: dict[str, str] = {}
    for name in PACKAGES:
        try:
            if name == "cupy":
                spec = importlib.util.find_spec("cupy")
                versions[name] = _version("cupy") if spec is not None else None
                origin = spec.origin if spec is not None else None
            else:
                module = importlib.import_module(MODULES[name])
                versions[name] = getattr(module, "__version__", None)
                origin = getattr(module, "__file__", None)
        except Exception:  # noqa: BLE001 - not importable here: "none", which differs from a version
            versions[name], origin = None, None
        if origin:
            origins[name] = os.path.dirname(os.path.dirname(origin))
    return versions, origins


def mismatch(versions: dict, origins: dict, advice: Callable[[str, str | None], str]) -> str | None:
    """One line naming the first package a child imports in another version than this process (both versions,
    where each comes from, and ``advice(package, this version)``: what to do), or None when they all match."""
    mine, here = imported()
    for name in PACKAGES:
        theirs = versions.get(name)
        if theirs == mine[name]:
            continue
        where = f" from {origins[name]}" if origins.get(name) else ""
        return (f"the grading child's Python imports {name} {theirs or '(none: not importable)'}{where}, the grader "
                f"{name} {mine[name] or '(none)'}" + (f" from {here[name]}" if here.get(name) else "")
                + f" (with other versions a reference solution can fail its own grading); {advice(name, mine[name])}")
    return None


def _nvidia_smi() -> dict:
    """Each GPU of this machine (index, model, UUID, memory) and the NVIDIA driver version, from nvidia-smi ({}
    without it): a report graded on several GPUs says which ones they were (the rows name theirs)."""
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return gpus_from_csv(out)


def gpus_from_csv(out: str) -> dict:
    """nvidia-smi's "index, name, uuid, memory.total, driver_version" lines -> {"gpus": [...], "nvidia_driver"}."""
    rows = [[part.strip() for part in line.split(",")] for line in out.strip().splitlines() if line.count(",") >= 4]
    if not rows:
        return {}
    gpus = [{"index": int(r[0]) if r[0].isdigit() else r[0], "name": r[1], "uuid": r[2] or None,
             "memory_mib": int(r[3]) if r[3].isdigit() else None} for r in rows]
    return {"gpus": gpus, "nvidia_driver": rows[0][4]}


def describe(info: device.DeviceInfo | None = None) -> dict:
    d = info or device.info()
    env = {
        "device": device.label(d),
        "kind": d.kind,
        "simulated": d.simulated,
        "python": platform.python_version(),
        **{name: _version(name) for name in PACKAGES},
        "cuda_driver": f"{d.driver[0]}.{d.driver[1]}" if d.driver else None,
        "cuda_runtime": f"{d.runtime[0]}.{d.runtime[1]}" if d.runtime else None,
        "cpu": d.cpu,
        "platform": platform.platform(),
    }
    if d.kind == "gpu":
        env["gpu"] = d.name
        env["compute_capability"] = f"{d.compute_capability[0]}.{d.compute_capability[1]}" \
            if d.compute_capability else None
        env.update(_nvidia_smi())
        env.setdefault("gpus", [{"index": 0, "name": d.name, "uuid": None, "memory_mib": None}])  # no nvidia-smi
    elif d.simulated:
        env["gpu"] = None
        env["note"] = ("CUDA simulator (NUMBA_ENABLE_CUDASIM=1): GPU code ran on the CPU, shrunk; its op time is not "
                       "measured")
        if env["cupy"]:
            env["cupy"] += " (installed, not used on the simulator)"
    else:
        env["gpu"] = None
        env["note"] = "no GPU and no simulator: CPU code only"
    return env


def one_line(env: dict) -> str:
    """"NVIDIA H100 80GB HBM3, driver 550.54.15 (CUDA 12.4); python 3.11.7, numpy 2.4.6, ..."."""
    head = env["device"]
    if env.get("nvidia_driver"):
        head += f", driver {env['nvidia_driver']}"
    if env.get("cuda_driver"):
        head += f" (CUDA {env['cuda_driver']})"
    libs = ", ".join(f"{k} {env[k] or 'not installed'}" for k in ("python", *PACKAGES))
    return f"{head}; {libs}"
