"""Own kernels only: what the timed variant's conv layers may compute with (docs/grading.md, "Own kernels only").

Runs in the grader's child, on the student's code. Three parts:

- ``Code``: which code objects are the student's (compiled from their kernel cells), which are given code (the
  kit's solutions of EARLIER stages, loaded with ``lk.from_stage``; labkit's own kernels) and which are the kit's
  solution of the graded stage (timed in the same process, never the student's answer);
- ``scan``: a static scan (ast) of the student's functions that the timed conv functions reach (through globals,
  closures, jit dispatchers and labkit's wrappers), for library compute routines (numpy's dot/matmul/einsum/
  tensordot/convolve/sliding_window_view..., numpy.linalg, labkit.reference, labkit.cudnn, scipy, PyTorch, cupy's
  routines, cuDNN, cuBLAS), the ``@`` operator and ``.dot()``: it sees inside ``@njit`` and ``@cuda.jit`` code, which
  no runtime trace can;
- ``Tracer``: during each call of a timed conv function, the library entry points are replaced by recorders and
  every kernel launch is classified (the student's, given, the kit's solution, other); on a GPU stage at least one
  of the student's (or given) kernels must run.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager

from ..launch import gpu as kit_gpu
from ..model.layers import impl_for, kernel_layers
from .library import (  # noqa: F401 - ownership.Library, ownership.Code, ownership.load_cells, as before
    FAMILY_ROOTS, INTERNAL, LABKIT_MODULES, METHODS, SHARED_WRAPPERS, SUBMODULES, Code, Library, cell_contents,
    code_objects, functions_behind, in_family, load_cells)
from ..model.nets import get_net

_setprofile, _getprofile = sys.setprofile, sys.getprofile  # bound before any student code exists

# ------------------------------------------------------------------------------------------ static scan


def conv_roots(variant, kinds=("conv",)) -> list[tuple[str, object]]:
    """(label, function) of every conv function of a variant (or of every layer of ``kinds``: the stage's own work,
    ``checks.own_layers``), one per function: ("conv1, conv2 (variant 'x')", fn)."""
    by_fn: dict[int, tuple[list[str], object]] = {}
    for net_name in variant.nets:
        for layer in kernel_layers(get_net(net_name)):
            fn = impl_for(variant.impls, layer) if layer.kind in kinds else None
            if fn is not None:
                names = by_fn.setdefault(id(fn), ([], fn))[0]
                if layer.name not in names:
                    names.append(layer.name)
    return [(f"{', '.join(names)} (variant {variant.name!r})", fn) for names, fn in by_fn.values()]


def _function_nodes(tree: ast.Module) -> dict[int, list[ast.AST]]:
    """Function and lambda nodes by the first line of their code object (a decorated function's starts at its
    first decorator)."""
    nodes: dict[int, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            nodes.setdefault(first, []).append(node)
        elif isinstance(node, ast.Lambda):
            nodes.setdefault(node.lineno, []).append(node)
    return nodes


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None unless it is a chain of attributes on a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


_MISSING = object()


def _resolve(parts: list[str], scope: dict, local_imports: dict[str, str]):
    """Follow a dotted name through modules, classes and namespaces; _MISSING where it cannot be known statically."""
    root = parts[0]
    if root in local_imports:
        obj = sys.modules.get(local_imports[root], _MISSING)
    else:
        obj = scope.get(root, getattr(builtins, root, _MISSING))
    for attr in parts[1:]:
        if obj is _MISSING or not isinstance(obj, (types.ModuleType, type, types.SimpleNamespace)):
            return _MISSING
        try:
            obj = inspect.getattr_static(obj, attr) if isinstance(obj, type) else getattr(obj, attr)
        except AttributeError:
            return _MISSING
    return obj


def _where(fn: types.FunctionType, node: ast.AST) -> str:
    name = fn.__code__.co_filename.strip("<>")
    return f"{fn.__name__}, {name}, line {getattr(node, 'lineno', fn.__code__.co_firstlineno)}"


def _scan_function(fn: types.FunctionType, node: ast.AST, lib: Library, stage: str) -> list[str]:
    found: list[str] = []
    scope = fn.__globals__
    local_imports: dict[str, str] = {}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            for alias in sub.names:
                local_imports[(alias.asname or alias.name).split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
                if in_family(alias.name, SUBMODULES + LABKIT_MODULES):
                    found.append(f"imports {alias.name} ({_where(fn, sub)})")
        elif isinstance(sub, ast.ImportFrom) and sub.module:
            mod = sys.modules.get(sub.module)
            for alias in sub.names:
                obj = getattr(mod, alias.name, _MISSING) if mod is not None else _MISSING
                what = lib.name(obj) if obj is not _MISSING else None
                if what is None and in_family(f"{sub.module}.{alias.name}", SUBMODULES + LABKIT_MODULES):
                    what = f"{sub.module}.{alias.name}"
                if what:
                    found.append(f"imports {what} ({_where(fn, sub)})")
    for sub in ast.walk(node):
        if isinstance(sub, (ast.BinOp, ast.AugAssign)) and isinstance(sub.op, ast.MatMult):
            found.append(f"uses the @ operator, a library matrix product ({_where(fn, sub)})")
        elif isinstance(sub, (ast.Attribute, ast.Name)) and isinstance(getattr(sub, "ctx", None), ast.Load):
            parts = _chain(sub)
            if parts is None:
                if isinstance(sub, ast.Attribute) and sub.attr in METHODS:
                    found.append(f"calls .{sub.attr}(), a library matrix product ({_where(fn, sub)})")
                continue
            obj = _resolve(parts, scope, local_imports)
            if obj is _MISSING:
                if len(parts) > 1 and parts[-1] in METHODS:
                    found.append(f"calls .{parts[-1]}(), a library matrix product ({_where(fn, sub)})")
                continue
            what = lib.name(obj)
            if what:
                found.append(f"calls {what} ({_where(fn, sub)})")
        elif isinstance(sub, ast.Call):
            parts = _chain(sub.func)
            obj = _resolve(parts, scope, local_imports) if parts else _MISSING
            if obj is not _MISSING and getattr(obj, "__name__", "") == "from_stage" and \
                    getattr(obj, "__module__", "") == "labkit.course.stages" and sub.args and \
                    isinstance(sub.args[0], ast.Constant) and str(sub.args[0].value) >= stage:
                found.append(f"loads the kit's solution of stage {sub.args[0].value} ({_where(fn, sub)}): only earlier "
                             f"stages' solutions are given code")
    return list(dict.fromkeys(found))


def scan(roots: list[tuple[str, object]], code: Code, lib: Library) -> list[str]:
    """Findings, one line each ("conv1 (variant 'x') calls numpy.matmul (conv_padded, nb cell 7, line 25)"), for
    the student's code the ``(label, function)`` roots reach; and for a root that is not computed by code from the
    notebook (or given code) at all."""
    lib.refresh()
    nodes = {name: _function_nodes(tree) for name, tree in code.trees.items()}
    findings: list[str] = []
    for label, root in roots:
        behind = functions_behind(root)
        kinds = [code.kind(f.__code__) for f in behind]
        direct = lib.name(root) or next((lib.name(f) for f in behind if lib.name(f)), None)
        if direct:
            findings.append(f"{label} is {direct}")
            continue
        if "own" not in kinds:
            where = next((f"{f.__module__}.{f.__qualname__}" for f in behind if code.kind(f.__code__) != "labkit"),
                         type(root).__name__)
            what = ("the kit's solution of this stage" if "solution" in kinds
                    else "given code (an earlier stage's solution, lk.from_stage)" if "given" in kinds else where)
            findings.append(f"{label} is computed by {what}, not by code from your notebook")
            continue
        seen: set = set()
        todo = [f for f in behind if code.kind(f.__code__) == "own"]
        while todo:
            fn = todo.pop()
            if fn.__code__ in seen:
                continue
            seen.add(fn.__code__)
            cands = nodes.get(fn.__code__.co_filename, {}).get(fn.__code__.co_firstlineno, [])
            node = next((n for n in cands if getattr(n, "name", "<lambda>") == fn.__code__.co_name),
                        cands[0] if cands else None)
            if node is not None:
                findings.extend(f"{label} calls {f[6:]}" if f.startswith("calls ") else f"{label} {f}"
                                for f in _scan_function(fn, node, lib, code.stage))
            names = {n for c in code_objects(fn.__code__) for n in c.co_names}
            reached = [fn.__globals__[n] for n in names if n in fn.__globals__] + cell_contents(fn)
            for obj in reached:
                if isinstance(obj, (types.ModuleType, type)) or not callable(obj):
                    continue
                todo.extend(f for f in functions_behind(obj) if code.kind(f.__code__) == "own")
    return list(dict.fromkeys(findings))


# ------------------------------------------------------------------------------------------ runtime trace


class Tracer:
    """Records, while a timed conv function runs, every library routine called and every kernel launched.

    Two ways see a routine: its public names are replaced by recorders for the call (``np.einsum``, the names the
    student's cells bound), and a profile hook (``sys.setprofile``) sees every Python function of a library entered
    and every C function called while the conv runs, however the student reached it (a routine kept in a list or
    a dict built at load time, a name built at run time). Calls a library makes into itself are its own business.
    numpy's ufuncs (``np.matmul``) enter no Python frame and call no profiled C function: the scan sees ``@``."""

    def __init__(self, code: Code, lib: Library, namespaces: list[dict]):
        self.code, self.lib, self.namespaces = code, lib, namespaces
        self.current: dict | None = None
        self._points: list | None = None
        self._modules_seen = 0
        self._codes: dict = {}  # code object of a library's Python function -> its name
        self._dispatchers: dict = {}  # name of a C routine's array-function dispatcher -> the routine's name
        self._installed = 0

    # the launch hook calls this for every real launch (never for device functions)
    def launched(self, py_func) -> None:
        rec = self.current
        if rec is not None:
            kind = self.code.kind(getattr(py_func, "__code__", None))
            rec["launches"][kind] = rec["launches"].get(kind, 0) + 1

    def _record(self, name: str, caller: str) -> None:
        rec = self.current
        if rec is not None and len(rec["library"]) < 4 and name not in rec["library"] \
                and not in_family(caller, INTERNAL + ("labkit",)):
            rec["library"].append(name)

    def _wrapper(self, original: Callable, name: str) -> Callable:
        tracer = self

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            if tracer.current is not None:
                tracer._record(name, sys._getframe(1).f_globals.get("__name__", "") or "")
            return original(*args, **kwargs)

        return recorded

    def _profile(self, frame, event, arg) -> None:
        """The profile hook: a library's Python function entered, or a C function of a library called."""
        if event == "call":
            code = frame.f_code
            name = self._codes.get(code)
            if name is None and code.co_name in self._dispatchers and \
                    (frame.f_globals.get("__name__") or "").startswith(("numpy.", "cupy.")):
                name = self._dispatchers[code.co_name]  # the dispatcher of a C routine (np.dot)
            caller = frame.f_back
        elif event == "c_call":
            name = self.lib.name(arg)
            caller = frame
        else:
            return
        if name is not None:
            # a context manager's generator (cupyx.errstate) is entered from contextlib: its caller is the `with`
            while caller is not None and caller.f_globals.get("__name__") == "contextlib":
                caller = caller.f_back
            self._record(name, caller.f_globals.get("__name__", "") or "" if caller is not None else "")

    def _patch_points(self) -> list:
        if self._points is not None and len(sys.modules) == self._modules_seen:
            return self._points
        self.lib.refresh()
        self._modules_seen = len(sys.modules)
        self._codes, self._dispatchers = {}, {}
        for obj in self.lib._objects:
            for f in (obj, getattr(obj, "__wrapped__", None), getattr(obj, "_implementation", None)):
                code = getattr(f, "__code__", None)
                # a decorator's wrapper (contextlib.contextmanager's helper) shares one code object among every
                # function it wraps in the process, the kit's own included: only the wrapped function's code names it
                if isinstance(code, types.CodeType) and code.co_filename not in SHARED_WRAPPERS:
                    self._codes.setdefault(code, self.lib.name(obj))
            impl = getattr(obj, "_implementation", None)
            if impl is not None and not hasattr(impl, "__code__"):  # a C routine behind numpy's dispatcher
                self._dispatchers.setdefault(getattr(obj, "__name__", ""), self.lib.name(obj))
        points = []
        # where a student's code looks a routine up: public modules (np.dot, np.linalg.solve, lk.reference.conv2d,
        # lk.conv2d, scipy.signal.convolve2d), and the names their cells bound (from numpy import dot)
        owners: list = list({id(m): m for n, m in sorted(sys.modules.items())  # once each (labkit's old names)
                             if isinstance(m, types.ModuleType) and in_family(n, FAMILY_ROOTS)
                             and not any(part.startswith("_") for part in n.split("."))}.values())
        for owner in owners:
            for attr, value in list(vars(owner).items()):
                name = self.lib.name(value)
                if name is not None and _settable(owner, attr, value):
                    points.append((owner, attr, value, self._wrapper(value, name), True))
        for ns in self.namespaces:
            for attr, value in list(ns.items()):
                name = self.lib.name(value)
                if name is not None:
                    points.append((ns, attr, value, self._wrapper(value, name), False))
        self._points = points
        return points

    @contextmanager
    def installed(self):
        """The recorders in place (for a call, or for a whole timed pass: installed once, not per layer)."""
        if self._installed:
            self._installed += 1
            try:
                yield
            finally:
                self._installed -= 1
            return
        points = self._patch_points()
        for owner, attr, _, wrapper, is_mod in points:
            if is_mod:
                setattr(owner, attr, wrapper)
            else:
                owner[attr] = wrapper
        self._installed = 1
        try:
            yield
        finally:
            self._installed = 0
            for owner, attr, original, _, is_mod in points:
                if is_mod:
                    setattr(owner, attr, original)
                else:
                    owner[attr] = original

    def call(self, fn: Callable, args: tuple) -> dict:
        """Run ``fn(*args)`` traced; the record: {"library": [names], "launches": {kind: count}}."""
        rec = {"library": [], "launches": {}}
        with self.installed():
            self.current = rec
            previous = _getprofile()
            _setprofile(self._profile)
            try:
                fn(*args)
            finally:
                _setprofile(previous)
                self.current = None
        return rec


def _settable(owner, attr: str, value) -> bool:
    """Whether a module lets its attribute be replaced: some refuse (torch's config modules raise on any name not
    in their config), and those cannot be patched, so they are not traced."""
    try:
        setattr(owner, attr, value)
    except Exception:  # noqa: BLE001 - whatever a module's __setattr__ raises, it cannot be patched
        return False
    return True


def install_launch_hook(tracer_ref: list, on_launch=None) -> list[tuple[type, str, object]]:
    """Count every kernel launch (``kernel[grid, block](...)`` and ``lk.gpu.launch``) for the tracer in
    ``tracer_ref[0]``: the simulator's ``FakeCUDAKernel.__call__``, or numba-cuda's ``CUDADispatcher.call`` on a
    GPU; ``on_launch(name)`` hears each GPU launch's kernel name (what a hung job's row names). Returns (class,
    attribute, hook) of what it installed (the snapshot keeps them in place)."""
    installed = []
    try:
        from numba.cuda.simulator import kernel as sim_kernel
    except Exception:  # noqa: BLE001 - no simulator module: nothing to hook there
        sim_kernel = None
    if sim_kernel is not None:
        orig = sim_kernel.FakeCUDAKernel.__call__

        def sim_call(self, *args, _orig=orig):
            if not self._device and not sim_kernel._kernel_context and tracer_ref[0] is not None:
                tracer_ref[0].launched(self.fn)
            return _orig(self, *args)

        sim_kernel.FakeCUDAKernel.__call__ = sim_call
        installed.append((sim_kernel.FakeCUDAKernel, "__call__", sim_call))
    try:
        from numba.cuda import dispatcher
    except Exception:  # noqa: BLE001
        dispatcher = None
    cls = getattr(dispatcher, "CUDADispatcher", None)
    if cls is not None and hasattr(cls, "call"):
        orig_gpu = cls.call

        def gpu_call(self, *args, _orig=orig_gpu, **kwargs):
            if tracer_ref[0] is not None:
                tracer_ref[0].launched(getattr(self, "py_func", None))
            if on_launch is not None:
                on_launch(getattr(getattr(self, "py_func", None), "__name__", "a kernel"))
            return _orig(self, *args, **kwargs)

        cls.call = gpu_call
        installed.append((cls, "call", gpu_call))
    # CUDA C (``lk.gpu.launch_raw``): a cupy RawKernel has no Python function, so the launch counts for the function
    # that asked for it, the host code of the notebook (own, given or the kit's) that holds the kernel's source

    orig_raw = kit_gpu.launch_raw

    def raw_call(kernel, *args, _orig=orig_raw, **kwargs):
        if tracer_ref[0] is not None:
            tracer_ref[0].launched(types.SimpleNamespace(__code__=sys._getframe(1).f_code))
        return _orig(kernel, *args, **kwargs)

    kit_gpu.launch_raw = raw_call  # before the snapshot: it stays in place, and replacing it is tampering
    return installed
