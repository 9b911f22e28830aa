"""What the grader's child calls the student's code and the libraries (docs/grading.md, "Own kernels only"): the
library compute routines loaded in the process, by identity (``Library``), which code objects are the student's,
given or the kit's solution (``Code``, ``load_cells``), and the functions behind a jit dispatcher or a wrapper
(``functions_behind``). ``labkit.grading.ownership`` scans and traces with them.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import sys
import types
from collections.abc import Iterable

from ..about import old_name
from ..course import nbcells

LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the (private) labkit package
_KERNELS_FILE = os.path.join(LABKIT_DIR, "ops", "kernels.py")

#: numpy (and cupy) routines that compute a product, a convolution or a window view for you
ROUTINES = ("dot", "matmul", "einsum", "einsum_path", "tensordot", "convolve", "correlate", "inner", "outer", "vdot",
            "kron")
#: submodules whose every function is a library routine
SUBMODULES = ("numpy.linalg", "numpy.fft", "cupy.linalg", "cupy.fft", "cupy.cuda.cudnn", "cupy.cudnn",
              "cupy.cublas", "cupy.cuda.cublas", "cupyx", "scipy", "torch", "tensorflow", "jax")
STRIDE_TRICKS = ("sliding_window_view", "as_strided")
#: labkit modules that compute a layer for you, and the engine's entry points that fall back to the reference
LABKIT_MODULES = ("labkit.model.reference", "labkit.ladder.cudnn")
LABKIT_ENGINE = ("forward", "run", "call_layer", "checked_call", "time_passes")
#: method names of an array that compute a product (an unresolvable ``x.dot(w)``)
METHODS = ("dot", "matmul", "tensordot", "einsum", "__matmul__")
#: modules whose calls into a library are its own business (the simulator, numpy calling numpy)
INTERNAL = ("numba", "numpy", "scipy", "torch", "cupy", "cupyx", "importlib", "functools")

#: files whose functions wrap others (their code object is the same for every wrapped function)
SHARED_WRAPPERS = frozenset(os.path.abspath(m.__file__) for m in (contextlib, functools)) | \
    frozenset(m.__file__ for m in (contextlib, functools))

FAMILY_ROOTS = ("numpy", "cupy", "cupyx", "scipy", "torch", "tensorflow", "jax", "labkit")


def in_family(modname: str, families: Iterable[str]) -> bool:
    return any(modname == f or modname.startswith(f + ".") for f in families)


def _public(modname: str) -> str:
    """``numpy.linalg._linalg`` -> ``numpy.linalg``, ``labkit.model.reference`` -> ``labkit.reference``: the name a
    student would write."""
    if modname.startswith("labkit."):
        return old_name(modname)
    parts = modname.split(".")
    while len(parts) > 1 and parts[-1].startswith("_"):
        parts.pop()
    return ".".join(parts)


class Library:
    """Every library compute routine loaded in this process, by identity -> its name ("numpy.matmul")."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self._objects: list = []  # keeps them alive (ids stay valid)
        self._seen_modules = 0

    def refresh(self) -> None:
        mods = dict(sys.modules)
        if len(mods) == self._seen_modules:
            return
        self._seen_modules = len(mods)
        for name in sorted(mods):
            mod = mods[name]
            if not isinstance(mod, types.ModuleType) or not in_family(name, FAMILY_ROOTS):
                continue
            family = next((f for f in SUBMODULES + LABKIT_MODULES if in_family(name, (f,))), None)
            for attr, value in list(vars(mod).items()):
                if attr.startswith("_") or isinstance(value, (types.ModuleType, type)) or not callable(value):
                    continue
                qual = None
                owner = getattr(value, "__module__", None)
                if name in ("numpy", "cupy") and attr in ROUTINES:
                    qual = f"{name}.{attr}"
                elif name in ("numpy.lib.stride_tricks", "cupy.lib.stride_tricks") and attr in STRIDE_TRICKS:
                    qual = f"{name}.{attr}"
                elif name == "labkit.core.engine" and attr in LABKIT_ENGINE:
                    qual = f"{_public(name)}.{attr}"
                elif family is not None and (not isinstance(owner, str) or in_family(owner, (family,))):
                    # a routine of that library (not a name it imported from elsewhere, such as labkit.get_net)
                    qual = f"{_public(owner) if isinstance(owner, str) else name}.{attr}"
                if qual is not None and id(value) not in self.names:
                    self.names[id(value)] = qual
                    self._objects.append(value)

    def name(self, obj) -> str | None:
        """The library routine ``obj`` is, or None."""
        try:
            return self.names.get(id(obj))
        except TypeError:
            return None


# ---------------------------------------------------------------------------------------------- code objects


def code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and every code object nested in it (functions, lambdas, comprehensions, classes)."""
    out, todo = [], [code]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


def cell_filename(notebook: str, index: int) -> str:
    return f"<{notebook} cell {index}>"


class Code:
    """Where code comes from: the student's cells, given code, the kit's solution of this stage, or elsewhere."""

    def __init__(self, stage: str, stage_notebooks: dict[str, str]):
        self.stage = stage
        self.own: set = set()  # code objects compiled from the student's kernel cells
        self.solution: set = set()  # ... from the kit's solution of the graded stage
        self.trees: dict[str, ast.Module] = {}  # cell file name -> its ast (the student's)
        self.earlier = {nb for number, nb in stage_notebooks.items() if number < stage}

    def kind(self, code: types.CodeType | None) -> str:
        if code is None:
            return "other"
        if code in self.own:
            return "own"
        if code in self.solution:
            return "solution"
        name = code.co_filename
        if name.startswith("<") and " cell " in name and name[1:].split(" cell ", 1)[0] in self.earlier:
            return "given"
        if os.path.abspath(name) == _KERNELS_FILE:
            return "kit"
        if os.path.abspath(name).startswith(LABKIT_DIR + os.sep):
            return "labkit"
        return "other"


def load_cells(path: str, record: set, trees: dict | None = None, define: tuple[str, ...] = ()) -> dict:
    """``labkit.nbcells.load`` that also records every code object its cells compile to (and their asts); with
    ``define``, also the untagged cells that define those functions (``nbcells.tagged_cells``)."""
    import re
    from pathlib import Path

    path = Path(path)
    cells = nbcells.tagged_cells(nbcells._read_quick(path) or nbcells.read(path), define=define)
    if not cells:
        raise nbcells.NotebookError(f"{path.name} has no code cells tagged {nbcells.KERNEL_TAG!r}; the cells that "
                                    f"define your kernels must keep that tag (View > Cell Toolbar > Tags in Jupyter)")
    ns = {"__name__": f"labkit_nb_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"}
    for index, src in cells:
        filename = cell_filename(path.name, index)
        nbcells.register(src, filename)
        code = compile(src, filename, "exec")
        record.update(code_objects(code))
        if trees is not None:
            trees[filename] = ast.parse(src, filename)
        exec(code, ns)  # noqa: S102 - running the student's own cells is the point
    return ns


# ------------------------------------------------------------------------------------------- unwrapping


def functions_behind(obj) -> list[types.FunctionType]:
    """The Python functions a callable runs: jit dispatchers' ``py_func``, partials, bound methods, a callable
    object's ``__call__``, and what labkit's wrappers (``lk.gpu.with_copies``) keep in ``device_fn`` and their
    closures."""
    out, todo, seen = [], [obj], set()
    while todo:
        o = todo.pop()
        if id(o) in seen or o is None:
            continue
        seen.add(id(o))
        if isinstance(o, functools.partial):
            todo.append(o.func)
        elif inspect.ismethod(o):
            todo.append(o.__func__)
        elif isinstance(o, types.FunctionType):
            out.append(o)
            if os.path.abspath(o.__code__.co_filename).startswith(LABKIT_DIR + os.sep):
                todo.append(getattr(o, "device_fn", None))  # a labkit wrapper: what it wraps
                todo.extend(cell_contents(o))
        elif getattr(o, "py_func", None) is not None and getattr(o, "py_func", None) is not o:
            todo.append(o.py_func)
        elif not isinstance(o, type) and callable(o):
            call = getattr(type(o), "__call__", None)
            if isinstance(call, types.FunctionType):
                todo.append(call)
    return out


def cell_contents(fn: types.FunctionType) -> list:
    out = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and not isinstance(value, (type, types.ModuleType)):
            out.append(value)
    return out
