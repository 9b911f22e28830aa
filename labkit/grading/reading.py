"""What a grading child reads and which environment it gets, in every sandbox (``labkit.grading.isolation``): the
kit's folders, the system's, the grader's PYTHONPATH (and when it holds what a student must not read), the child's
environment variables, the NVIDIA device nodes.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

from ..launch import cudacpu

#: the system folders every child reads (the interpreter's shared libraries, the CUDA driver's)
SYSTEM = ("/usr",)
#: top-level folders that are symlinks into /usr on merged-/usr systems (copied as symlinks), else bound
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: the few files of /etc a Python process and the dynamic loader read (not /etc as a whole: it holds secrets)
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf",
       "alternatives", "fonts", "os-release")
#: environment variables a child keeps (a grader's tokens and keys stay out: the student's output is reported)
ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "MPLBACKEND", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
            "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
ENV_KEEP_PREFIXES = ("NUMBA_", "CUDA_", "CUPY_", "NVIDIA_", "LABKIT_", "OMP_", "MKL_", "OPENBLAS_", "LC_")


def _covered(path: str, others) -> bool:
    return any(path != o and Path(path).is_relative_to(o) for o in others)


def kit_paths() -> list[str]:
    """The Python environment the grader runs in (prefixes, site-packages, the interpreter's real folder) and the
    library folders its environment names, outermost only; never a folder that holds the kit's checkout (its
    solutions/ are what a student must not read)."""
    checkout = _checkout()
    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             str(Path(os.path.realpath(sys.executable)).parent), *site.getsitepackages()}
    if _user_site():
        found.add(site.getusersitepackages())
    for var in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"):
        found.update(p for p in os.environ.get(var, "").split(os.pathsep) if p)
    found.update(cudacpu.sandbox_paths())  # a $LABKIT_CXX outside the system folders (CUDA C without a GPU)
    paths = {os.path.realpath(p) for p in found} | {os.path.abspath(p) for p in found}
    keep = sorted(p for p in paths if os.path.exists(p) and not checkout.is_relative_to(p))
    return [p for p in keep if not _covered(p, keep) and not _covered(p, SYSTEM)]


def _user_site() -> bool:
    """Whether this Python imports from the user's site-packages (``pip install --user``): the child must too."""
    return bool(site.ENABLE_USER_SITE) and site.getusersitepackages() in sys.path


def _checkout() -> Path:
    """The folder that holds the grader's labkit package (a checkout, with its solutions/, or site-packages)."""
    return Path(__file__).resolve().parent.parent.parent


def python_path(env: dict | None = None) -> list[str]:
    """The grader's ``PYTHONPATH`` folders a bubblewrap child imports from too (absolute, existing, once each), less
    the folder of the grader's own labkit: the child imports labkit from its job's private copy, and a checkout holds
    the solutions."""
    env = os.environ if env is None else env
    out: list[str] = []
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        path = os.path.abspath(entry) if entry else ""
        if path and os.path.isdir(path) and Path(path).resolve() != _checkout() and path not in out:
            out.append(path)
    return out


def python_path_refusal(private: dict[str, str | Path], env: dict | None = None) -> str:
    """Why the grader's PYTHONPATH cannot be bound into the sandbox, in one line ("" when it can): an entry that holds
    one of ``private`` ({what: path}: the submissions, --out, the solutions), the jobs' folders (the system's
    temporary folder), the grader's labkit checkout, the home folder or /, which a student's code must not read."""
    import tempfile

    guarded = {**{what: Path(p) for what, p in private.items() if p}, "the jobs' folders": Path(tempfile.gettempdir()),
               "the home folder": Path.home()}
    if (_checkout() / "solutions").is_dir():
        guarded["the kit's checkout"] = _checkout()
    for entry in python_path(env):
        real = Path(entry).resolve()
        if real == Path("/"):
            return ("PYTHONPATH holds /, which would let a student's code read every file: take it off PYTHONPATH "
                    "(put the packages in a folder of their own, e.g. pip install --target DIR)")
        for what, path in guarded.items():
            if path.resolve().is_relative_to(real):
                return (f"PYTHONPATH entry {entry} holds {what} ({path}), which a student's code must not read: take "
                        f"it off PYTHONPATH (put the packages in a folder of their own, e.g. pip install --target "
                        f"DIR), or grade --unsandboxed only code you trust")
    return ""


def child_env(env: dict, scratch: str, lib: str | None, extra_path=()) -> dict:
    """The child's environment inside a sandbox: the grader's, less anything secret, with HOME, TMPDIR and every
    cache in the scratch folder and labkit imported from ``lib`` (the job's private copy) first, then ``extra_path``
    (the grader's PYTHONPATH where the sandbox binds it: ``python_path``)."""
    out = {k: v for k, v in env.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    s = Path(scratch)
    out.update(HOME=str(s), TMPDIR=str(s / "tmp"), XDG_CACHE_HOME=str(s / ".cache"), MPLCONFIGDIR=str(s / ".mpl"),
               CUPY_CACHE_DIR=str(s / ".cupy"), PYTHONDONTWRITEBYTECODE="1")
    if _user_site():  # HOME moves to the scratch folder: name the user's site-packages where they are
        out["PYTHONUSERBASE"] = site.getuserbase()
    else:
        out["PYTHONNOUSERSITE"] = "1"
    if not Path(out.get("NUMBA_CACHE_DIR", "/")).is_relative_to(s):
        out["NUMBA_CACHE_DIR"] = str(s / "numba-cache")
    out.pop("PYTHONPATH", None)
    path = [p for p in [lib, *extra_path] if p]
    if path:
        out["PYTHONPATH"] = os.pathsep.join(path)
    (s / "tmp").mkdir(parents=True, exist_ok=True)
    return out


def named(package: str, version: str | None) -> str:
    return f"{package} {version}" if version else package


def nvidia_devices() -> list[str]:
    """The NVIDIA device nodes of this machine (``/dev/nvidia*``, ``/dev/nvidia-caps``): bound where present."""
    return sorted(str(p) for p in Path("/dev").glob("nvidia*"))
