"""The shapes of tasks' answers: code that does what a task asks, found by its structure rather than its lines.

The release's line search (``labkit.release``) finds a solution copied into a file. Code that answers a task in
other words (the kit's own split-K fc, a graph the bench captures and replays) shares no line with the solution and
passes it. Each ``AnswerShape`` here is the structure one task's answer cannot do without, found in Python's syntax tree
(numba kernels included) or in CUDA C held in a Python string:

- ``split-K`` (stage 10, task 1): a loop over the range of the reduction that ``blockIdx.z`` picks (the inputs sliced
  over the grid's third dimension), multiply-adds into a sum inside it, and the sum stored into a plane that
  ``blockIdx.z`` indexes, or added atomically;
- ``graph`` (stage 10, task 2): a function that captures a call into a CUDA graph and replays what it captured
  (``g = ...capture(...)`` then ``g.replay()``, or cupy's ``exe = ...end_capture()`` then ``exe.launch(...)``);
- ``streamed`` (stage 10, task 3): a loop over chunks (a ``range`` with a step) that hands each chunk to one of several
  lanes in turn (``lanes[i % n]``), and a synchronization of the lanes.

``find(source)`` returns each shape a Python source holds (``Found``: the shape and the function it is in); a source
that does not parse (a notebook cell with a magic) holds none. What counts as an answer is judged on the released
files by ``labkit.release``; the tests hold each shape to the kit's own answer code (``labkit/gemm.py``,
``labkit/bench_whole.py``, the solutions' blocks) and to the given code students are meant to have.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class AnswerShape:
    name: str
    stage: str
    task: str  # the task's name in ``labkit.tasks``
    what: str  # one line, for the release's report


SHAPES = (
    AnswerShape("split-K", "10", "splitk",
          "partial sums over slices of K picked by blockIdx.z, stored per slice or atomically"),
    AnswerShape("graph", "10", "graph", "a call captured into a CUDA graph and replayed"),
    AnswerShape("streamed", "10", "streamed", "chunks handed to lanes in turn (i % n), then the lanes synchronized"),
)
BY_NAME = {s.name: s for s in SHAPES}


@dataclass(frozen=True)
class Found:
    shape: AnswerShape
    where: str  # "function fc_register_tiles (line 105)", "CUDA C kernel fc_cuda_tiles (string at line 33)"

    def __str__(self) -> str:
        return f"{self.shape.name} in {self.where}"


def of_stages(first: str) -> tuple[AnswerShape, ...]:
    """The shapes of the tasks of stage ``first`` and every later one: what a release of milestone ``first`` must
    not hold."""
    return tuple(s for s in SHAPES if s.stage >= first)


#: words a source holds where it may hold the shape (no need to parse the rest)
_WORDS = {"split-K": ("blockIdx",), "graph": ("capture",), "streamed": ("synchronize",)}


def find(source: str, shapes=SHAPES) -> list[Found]:
    """Each of ``shapes`` that ``source`` (Python) holds, once per function (or CUDA C kernel) it is in."""
    return list(_find(source, tuple(s.name for s in shapes)))


@functools.lru_cache(maxsize=512)
def _find(source: str, names: tuple[str, ...]) -> tuple[Found, ...]:
    wanted = {n for n in names if all(word in source for word in _WORDS[n])}
    if not wanted:
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    found: list[Found] = []
    for fn in _functions(tree):
        if "split-K" in wanted and _split_k(fn):
            found.append(Found(BY_NAME["split-K"], f"function {fn.name} (line {fn.lineno})"))
    for where, unit in _units(tree):
        if "graph" in wanted and _graph(unit):
            found.append(Found(BY_NAME["graph"], where))
        if "streamed" in wanted and _streamed(unit):
            found.append(Found(BY_NAME["streamed"], where))
    if "split-K" in wanted:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
                found += [Found(BY_NAME["split-K"], f"CUDA C kernel {name} (string at line {node.lineno})")
                          for name in cuda_split_k(node.value)]
    return tuple(found)


# ----------------------------------------------------------------------------------------------- Python trees

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, _FUNCTIONS)]


def _units(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """Where the graph and streamed shapes are looked for, each as a whole: every function at a module's top level
    (with the functions inside it), every class at the top level (all its methods together: one may capture what
    another replays), and the module's own top-level statements (a notebook cell's code)."""
    units, loose = [], []
    for node in tree.body:
        if isinstance(node, _FUNCTIONS):
            units.append((f"function {node.name} (line {node.lineno})", node))
        elif isinstance(node, ast.ClassDef):
            units.append((f"class {node.name} (line {node.lineno})", node))
        else:
            loose.append(node)
    if loose:
        units.append(("the top-level code", ast.Module(body=loose, type_ignores=[])))
    return units


def walk_outside(tree: ast.AST, stop: tuple[type, ...]):
    """The nodes under ``tree``, not descending into those of the kinds ``stop`` names (they are yielded)."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, stop):
            todo.extend(ast.iter_child_nodes(node))


def _own_nodes(fn: ast.AST):
    """The nodes of a function's own body, not of the functions, lambdas and classes defined inside it."""
    return walk_outside(fn, (*_FUNCTIONS, ast.Lambda, ast.ClassDef))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_block_z(node: ast.AST) -> bool:
    """``cuda.blockIdx.z`` (or ``blockIdx.z``)."""
    return isinstance(node, ast.Attribute) and node.attr == "z" and (
        (isinstance(node.value, ast.Attribute) and node.value.attr == "blockIdx")
        or (isinstance(node.value, ast.Name) and node.value.id == "blockIdx"))


def _has_block_z(node: ast.AST) -> bool:
    return any(_is_block_z(n) for n in ast.walk(node))


def _pairs(target: ast.AST, value: ast.AST):
    """(target name, the expression it gets), element by element where a tuple is unpacked from a tuple."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _pairs(t, v)
    else:
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                yield n.id, value


def _assignments(fn: ast.AST):
    for node in _own_nodes(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _pairs(target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            yield from _pairs(node.target, node.value)
        elif isinstance(node, ast.For):
            yield from _pairs(node.target, node.iter)


def _is_range(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"


def _multiply_add(loop: ast.For) -> bool:
    """``acc += a * b`` (or ``acc = acc + a * b``) somewhere inside the loop."""
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _has_product(node.value):
            return True
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Add) \
                and _has_product(node.value) and _names(node.targets[0]) & _names(node.value):
            return True
    return False


def _has_product(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in ast.walk(node))


def _split_k(fn: ast.FunctionDef) -> bool:
    """A loop over a range that depends on ``blockIdx.z``, multiply-adds inside it, and a store indexed by the
    slice (``blockIdx.z`` or a name given it directly) or an atomic add."""
    pairs = list(_assignments(fn))
    slice_names = {name for name, value in pairs if _has_block_z(value)}
    if not slice_names:
        return False
    derived, grew = set(slice_names), True
    while grew:
        grew = False
        for name, value in pairs:
            if name not in derived and _names(value) & derived:
                derived.add(name)
                grew = True
    sliced = any(isinstance(node, ast.For) and _is_range(node.iter)
                 and any(_names(a) & derived or _has_block_z(a) for a in node.iter.args) and _multiply_add(node)
                 for node in _own_nodes(fn))
    if not sliced:
        return False
    for node in _own_nodes(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add" \
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "atomic":
            return True
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and (_names(target.slice) & slice_names
                                                          or _has_block_z(target.slice)):
                    return True
    return False


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _graph(unit: ast.AST) -> bool:
    """A capture and a replay in one unit (``_units``): a call of ``...capture(...)`` and one of ``.replay()``
    (``lk.graphs``: what is captured in one method may be replayed in another), or cupy's own, a name bound to
    ``...end_capture()`` and then ``.launch()``-ed."""
    calls = [n for n in ast.walk(unit) if isinstance(n, ast.Call)]
    if any(_callee(c) == "capture" for c in calls) and any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "replay" for c in calls):
        return True
    executables = {n.id for node in ast.walk(unit) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                   and _callee(node.value) == "end_capture" for target in node.targets for n in ast.walk(target)
                   if isinstance(n, ast.Name)}
    return any(isinstance(c.func, ast.Attribute) and c.func.attr == "launch" and isinstance(c.func.value, ast.Name)
               and c.func.value.id in executables for c in calls)


def _steps(iterator: ast.AST) -> bool:
    """``range(a, b, step)``, possibly inside ``enumerate``/``zip``."""
    return any(_is_range(n) and len(n.args) == 3 for n in ast.walk(iterator))


def _streamed(fn: ast.AST) -> bool:
    """A loop over chunks that picks its lane in turn (``lanes[i % n]``), and a ``.synchronize()`` in the same unit
    (``_units``)."""
    turns = any(isinstance(node, ast.For) and _steps(node.iter) and any(
        isinstance(n, ast.Subscript) and isinstance(n.slice, ast.BinOp) and isinstance(n.slice.op, ast.Mod)
        for n in ast.walk(node)) for node in ast.walk(fn))
    return turns and any(isinstance(n, ast.Call) and _callee(n) == "synchronize" for n in ast.walk(fn))


# ----------------------------------------------------------------------------------------------------- CUDA C

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_KERNEL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")
_FOR = re.compile(r"\bfor\s*\(([^;]*);([^;]*);([^)]*)\)")
_ASSIGN = re.compile(r"(?:[A-Za-z_][\w:<>]*[\s*&]+)*\**\s*([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*=(?!=)\s*(.+)$", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _top_level_commas(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _c_assignments(body: str):
    for statement in re.split(r"[;{}]", _FOR.sub(lambda m: f"{m.group(1)};", body)):
        for part in _top_level_commas(statement):
            m = _ASSIGN.match(part.strip())
            if m:
                yield m.group(1), m.group(2)


def _kernels(source: str) -> list[tuple[str, str]]:
    """(name, body) of each ``__global__`` function: its text up to the next kernel."""
    marks = list(_KERNEL.finditer(source))
    return [(m.group(1), source[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(source)])
            for i, m in enumerate(marks)]


def cuda_split_k(source: str) -> list[str]:
    """The kernels of a CUDA C source that hold the split-K shape: a ``for`` loop whose bounds depend on
    ``blockIdx.z``, a multiply-add after it starts, and a store at an address or index that ``blockIdx.z`` (or a
    name given it directly) picks, or an ``atomicAdd``."""
    found = []
    for name, body in _kernels(_COMMENTS.sub("", source)):
        pairs = list(_c_assignments(body))
        slice_names = {n for n, value in pairs if "blockIdx.z" in value}
        derived, grew = set(slice_names), True
        while grew:
            grew = False
            for n, value in pairs:
                if n not in derived and set(_IDENT.findall(value)) & derived:
                    derived.add(n)
                    grew = True
        loops = [m for m in _FOR.finditer(body)
                 if "blockIdx.z" in m.group(1) + m.group(2) or set(_IDENT.findall(m.group(1) + m.group(2))) & derived]
        if not loops:
            continue
        after = body[loops[0].start():]
        if not re.search(r"\+=[^;]*\*|fmaf?\s*\(", after):
            continue
        z = "|".join(re.escape(n) for n in {"blockIdx.z", *slice_names})
        stored = re.search(r"atomicAdd\s*\(", body) or re.search(rf"=\s*\w+\s*\+[^;]*\b(?:{z})\b", body) \
            or re.search(rf"\w+\s*\[[^\]]*\b(?:{z})\b[^\]]*\]\s*=(?!=)", body)
        if stored:
            found.append(name)
    return found
