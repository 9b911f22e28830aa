"""What a student release leaves out of the kit, and what in a release would still need it.

``LEAVE_OUT`` declares, by concern, the kit's code that no release holds: code that answers a task of the release's
milestone or a later one (``answers``, with the stage whose task it answers), and the maintainers' machinery (the
bench, the grader, the release itself). Each is named as ``import`` names it last (a module, a package, a data
file), wherever under ``labkit/`` it lives, so that a module moved into a subpackage stays left out.
``missing(folder, milestone)`` finds what in a built release uses left-out code: a notebook's ``lk.gemm``, a
test's import, a kit module that imports the bench when it is imported. ``labkit.release`` copies the kit without
them and searches every release for them (docs/releases.md, "What a release holds").
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .answer_shapes import walk_outside


@dataclass(frozen=True)
class LeftOut:
    """Kit code a release leaves out, named as ``import`` names it last: ``gemm`` is ``labkit/gemm.py`` wherever
    under ``labkit/`` it lives (``labkit/kernels/gemm.py`` after a move), ``grading`` the package
    ``labkit/grading/``; a data file by its file name (``rubric.toml``)."""

    name: str
    concern: str  # "answers" or "machinery"
    why: str
    stage: str | None = None  # answers: the stage whose task it answers; out of that milestone and every earlier one

    def out_of(self, milestone: str) -> bool:
        return self.stage is None or milestone <= self.stage


def _answers(name: str, stage: str, why: str) -> LeftOut:
    return LeftOut(name, "answers", why, stage)


def _machinery(name: str, why: str) -> LeftOut:
    return LeftOut(name, "machinery", why)


#: The kit's code that a release leaves out, by concern (docs/releases.md, "What a release holds"). Answers: code
#: that does what a task of stage NN asks, out of the releases of milestones up to NN (after NN's deadline its
#: solution is given code anyway; stage 10's never is). Machinery: the maintainers' own, out of every release.
LEAVE_OUT: tuple[LeftOut, ...] = (
    _answers("gemm", "10", "fc as register tiles split over K into planes of partial sums (stage 10's task 1)"),
    _answers("gemm_cuda", "10", "the same split-K fc in CUDA C (stage 10's task 1)"),
    _answers("fc_tensor_cores", "10", "the same split-K fc on the tensor cores, in CUDA C (stage 10's task 1)"),
    _answers("bench_whole", "10", "captures the forward pass in a CUDA graph and replays it (stage 10's task 2)"),
    _answers("job_graphs", "10", "captures a chunk's forward pass in a CUDA graph and replays it (stage 10's task 2)"),
    _answers("tensor_cores", "09", "a conv as an implicit GEMM with staged inputs and weights, register sums and a "
                                   "fused bias, activation and pool, in CUDA C (stages 08 and 09's tasks)"),
    _answers("tensor_cores_source", "09", "the CUDA C source of tensor_cores' conv (stages 08 and 09's tasks)"),
    _answers("mma_source", "09", "the tensor cores' MMA and fp32 split in CUDA C, which tensor_cores' conv is "
                                 "built on (stages 08 and 09's tasks)"),
    _answers("precision", "09", "notebook 10's lesson on the split: it times tensor_cores' conv (left out with it)"),
    _answers("winograd", "09", "a conv whose threads keep a pool window's sums for several maps in registers and "
                               "pool them, in CUDA C (stage 09's tasks)"),
    _answers("upload", "04", "uint8 images normalised on the device (stage 04's task 3)"),
    _answers("whole", "04", "uint8 images uploaded, normalised and classified on the device (stage 04's task 3)"),
    _machinery("bench", "the bench: the kit's ladders and ledgers"),
    _machinery("bench_baselines", "the bench's numpy reference and cuDNN rows"),
    _machinery("bench_files", "the files and plots a bench writes"),
    _machinery("bench_table", "the bench's rows as numbers and as a table"),
    _machinery("bench_whole", "the bench's whole-call and end-to-end rows"),
    _machinery("benchdoc", "the bench's pages of docs"),
    _machinery("cudnn", "the bench's cuDNN and cuBLAS baselines"),
    _machinery("grading", "the grader"),
    _machinery("rubric.toml", "the grader's rubric"),
    _machinery("release", "building releases"),
    _machinery("leak_search", "the release's search for solution text and left-out code"),
    _machinery("leave_out", "what releases leave out (this module)"),
    _machinery("answer_shapes", "the release's search for answers' shapes"),
)


def left_out(milestone: str) -> dict[str, LeftOut]:
    """name -> what, of the kit's code a release of ``milestone`` leaves out (machinery first where both apply)."""
    out: dict[str, LeftOut] = {}
    for item in sorted(LEAVE_OUT, key=lambda i: i.concern != "machinery"):
        if item.out_of(milestone):
            out.setdefault(item.name, item)
    return out


def kit_name(rel: str | Path) -> str | None:
    """The ``LEAVE_OUT`` name that a path under ``labkit/`` (relative to it) falls under, if any: a folder of it, its
    module name, or its file name."""
    parts = Path(rel).parts
    names = {item.name for item in LEAVE_OUT}
    candidates = [*parts[:-1], parts[-1][:-3] if parts[-1].endswith(".py") else None, parts[-1]]
    return next((c for c in candidates if c in names), None)


def kit_left_out(rel: str | Path, milestone: str) -> LeftOut | None:
    """What leaves a path under ``labkit/`` (relative to it) out of a release of ``milestone``; None: it is in."""
    name = kit_name(rel)
    return left_out(milestone).get(name) if name else None


# ------------------------------------------------------------------------------ uses of left-out code


def python_sources(path: Path, raw: bytes) -> list[tuple[str, str]]:
    """(where, source) of the Python a released file holds: a .py file's text (where: ""), a notebook's code cells
    (where: "cell N: "; IPython's magic and shell lines blanked, so that the rest parses)."""
    if path.suffix == ".py":
        return [("", raw.decode("utf-8"))]
    if path.suffix != ".ipynb":
        return []
    try:
        cells = json.loads(raw).get("cells", [])
    except ValueError:
        return []
    out = []
    for number, cell in enumerate(cells):
        if cell.get("cell_type") == "code":
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            out.append((f"cell {number}: ", "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                                       for line in src.splitlines())))
    return out


def _module_level(tree: ast.AST):
    """The nodes that run when a module is imported: all but the bodies of its functions."""
    return walk_outside(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))


@functools.lru_cache(maxsize=1024)
def _uses(source: str, names: frozenset[str], module_level: bool) -> tuple[tuple[str, int], ...]:
    """(name, line) of each import of a module in ``names`` (any module path, relative or ``labkit.``) and, unless
    ``module_level`` (the kit's own modules: only what runs on import counts), each ``lk.``/``labkit.`` attribute
    chain through one."""
    if not any(name in source for name in names):
        return ()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    found = []
    for node in (_module_level(tree) if module_level else ast.walk(tree)):
        parts: list[str] = []
        if isinstance(node, ast.Import):
            parts = [p for alias in node.names if alias.name.split(".")[0] == "labkit" for p in alias.name.split(".")]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "labkit"):
            parts = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
        elif isinstance(node, ast.Attribute) and not module_level:
            chain, root = [], node
            while isinstance(root, ast.Attribute):
                chain.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("lk", "labkit"):
                parts = chain
        found += [(p, node.lineno) for p in parts if p in names]
    return tuple(sorted(set(found), key=lambda f: f[1]))


def missing(folder: Path, milestone: str) -> list[tuple[str, str]]:
    """(file, what) for each use of kit code that a release of ``milestone`` leaves out, in the release in
    ``folder``: in its notebooks' code cells, its given code and its tests anywhere; in the kit's own modules what
    runs on import (so that ``import labkit`` works; a function of the kit that the students never call, as
    ``labkit bench``'s, may still import the bench when it runs)."""
    gone = left_out(milestone)
    problems = []
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts):
        rel = path.relative_to(folder).as_posix()
        module_level = rel.startswith("labkit/") and not rel.startswith("labkit/given/")
        for where, src in python_sources(path, path.read_bytes()) if path.suffix in (".py", ".ipynb") else []:
            problems += [(rel, f"{where}line {line}: {name}, which a release of milestone {milestone} leaves out "
                               f"({gone[name].concern}: {gone[name].why})")
                         for name, line in _uses(src, frozenset(gone), module_level)]
    return problems
