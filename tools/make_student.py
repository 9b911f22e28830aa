"""Regenerate the student notebooks in notebooks/ from the complete ones in solutions/.

Code between ``### BEGIN SOLUTION name`` and ``### END SOLUTION`` becomes a TODO stub that raises
NotImplementedError and says roughly how many lines the answer takes; in CUDA C source held in a string, code
between ``/// BEGIN SOLUTION name`` and ``/// END SOLUTION`` becomes a stub that returns before writing anything. Both
stubs carry ``labkit.stages.STUB_MARK``: the launch layer refuses a kernel (and ``lk.gpu.raw_module`` a source) that
still has it, so an untouched kernel is "not implemented" on a GPU too, where kernels raise nothing. Outputs are
dropped.

A task's size is counted once, from its solution block (lines that are neither blank nor comments), and rendered
twice from that one count: in the stub, and in the task's spec, which names the block with a placeholder,
``{{lines:name}}`` ("7 lines"), or ``{{lines:a+b}}`` for a spec that covers several blocks. The solution notebook
keeps the placeholder (its code is right below it); a name that no block has is an error.

The tasks are the registry's (``labkit.course.tasks``): a solution is refused when its blocks are not exactly its
stage's tasks' blocks, or when a task's spec heading is not the one the registry gives it (its number and title), so
the student copy, the grader, the figures and the tile steps all speak of the same tasks.

A solution cell tagged ``kit-only`` (``labkit.nbcells.KIT_ONLY_TAG``: the bench's variants of the kit's own
kernels) is left out of the student copy.

A solution notebook is built from as it is committed (its cell ids come along); its source beside it
(``NN_topic.py``, where code and prose are edited) must hold the same cells: a pair out of step is refused (run
``jupytext --sync solutions/NN_topic.py`` first).

    python tools/make_student.py           # write notebooks/
    python tools/make_student.py --check   # exit 1 if notebooks/ is out of date (the tests do this)
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import NamedTuple

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from labkit import nbcells  # noqa: E402 - a notebook and its source in step
from labkit.course import tasks  # noqa: E402 - what a stage's tasks are: the registry
from labkit.nbcells import KIT_ONLY_TAG  # noqa: E402 - the kit's own cells, not the students'
from labkit.stages import STUB_MARK  # noqa: E402 - the marker the launch layer looks for

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_BEGIN_RE = re.compile(r"^(\s*)(###|///) BEGIN SOLUTION(?:[ \t]+([A-Za-z_]\w*))?\s*$")
PLACEHOLDER = re.compile(r"\{\{lines:([A-Za-z_]\w*(?:\+[A-Za-z_]\w*)*)\}\}")


class Block(NamedTuple):
    """One solution block: its name (None when unnamed), where it is, and its size in lines of code."""

    name: str | None
    mark: str  # "###" (Python) or "///" (CUDA C in a string)
    indent: str
    start: int  # index of the BEGIN line
    end: int  # index of the END line
    size: int


def blocks(source: str) -> list[Block]:
    """The solution blocks of one cell's source, in order."""
    found, lines, i = [], source.splitlines(), 0
    while i < len(lines):
        m = _BEGIN_RE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, mark, name = m.group(1), m.group(2), m.group(3)
        end = f"{mark} END SOLUTION"
        j = i + 1
        while j < len(lines) and lines[j].strip() != end:
            j += 1
        if j == len(lines):
            raise ValueError(f"'{mark} BEGIN SOLUTION' without '{end}' in:\n{source}")
        comment = "#" if mark == "###" else "//"
        size = sum(1 for line in lines[i + 1:j] if line.strip() and not line.strip().startswith(comment))
        found.append(Block(name, mark, indent, i, j, size))
        i = j + 1
    return found


def lines_text(size: int) -> str:
    return f"{size} line{'s' * (size != 1)}"


def stub_source(source: str) -> str:
    """Replace each solution block by a stub at the block's indentation."""
    lines, out, at = source.splitlines(), [], 0
    for b in blocks(source):
        out += lines[at:b.start]
        if b.mark == "###":
            out.append(f"{b.indent}# TODO: your code here (the solution takes about {lines_text(b.size)})")
            out.append(f'{b.indent}raise NotImplementedError("{STUB_MARK}")')
        else:
            out.append(f"{b.indent}// TODO: your code here (the solution takes about {lines_text(b.size)})")
            out.append(f"{b.indent}return;  // {STUB_MARK}")
        at = b.end + 1
    return "\n".join(out + lines[at:])


def block_sizes(nb: nbformat.NotebookNode) -> dict[str, int]:
    """Name -> size of every named solution block of a notebook; a name used twice is an error."""
    sizes: dict[str, int] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for b in blocks(cell.source):
            if b.name is None:
                continue
            if b.name in sizes:
                raise ValueError(f"two solution blocks are named {b.name!r}")
            sizes[b.name] = b.size
    return sizes


def render_sizes(text: str, sizes: dict[str, int]) -> str:
    """Resolve every ``{{lines:name}}`` placeholder of a spec from the blocks' sizes."""

    def size(m: re.Match) -> str:
        names = m.group(1).split("+")
        unknown = [n for n in names if n not in sizes]
        if unknown:
            raise ValueError(f"{m.group(0)}: no solution block named {', '.join(unknown)} "
                             f"(blocks: {', '.join(sorted(sizes)) or 'none'})")
        return lines_text(sum(sizes[n] for n in names))

    return PLACEHOLDER.sub(size, text)


def student_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    sizes = block_sizes(nb)
    nb.cells = [cell for cell in nb.cells if KIT_ONLY_TAG not in cell.get("metadata", {}).get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source)
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.source = render_sizes(cell.source, sizes)
        cell.metadata.pop("execution", None)
    return nb


def task_problems(nb: nbformat.NotebookNode, stage: str) -> list[str]:
    """What in a solution disagrees with its stage's tasks in the registry: a block no task owns, a task's block
    missing, a task whose heading is not there or comes out of order."""
    found = block_sizes(nb)
    owned = [b for t in tasks.of_stage(stage) for b in t.blocks]
    problems = [f"block {b!r} belongs to no task of stage {stage} (labkit/course/tasks.py)" for b in found
                if b not in owned]
    problems += [f"task {t.name!r}: no block {b!r}" for t in tasks.of_stage(stage) for b in t.blocks if b not in found]
    headings = [ln[3:].strip() for c in nb.cells if c.cell_type == "markdown" for ln in c.source.splitlines()
                if ln.startswith("## Task")]
    wanted = [t.heading for t in tasks.of_stage(stage)]
    if headings != wanted:
        problems.append(f"the task headings are {headings}; labkit/course/tasks.py gives {wanted}: make them agree")
    return problems


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def build(solutions: Path = REPO / "solutions", notebooks: Path = REPO / "notebooks", check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) every student notebook; return the names that differ."""
    stale = []
    notebooks.mkdir(exist_ok=True)
    for src in sorted(solutions.glob("*.ipynb")):
        why = nbcells.out_of_step(src) if nbcells.source_of(src).is_file() else ""
        if why:
            raise ValueError(f"{why}: edit the source and run `jupytext --sync {nbcells.source_of(src)}` first")
        try:
            nb = nbformat.read(src, as_version=4)
            problems = task_problems(nb, src.name[:2])
            if problems:
                raise ValueError("; ".join(problems))
            text = render(student_notebook(nb))
        except ValueError as exc:
            raise ValueError(f"{src.name}: {exc}") from None
        dst = notebooks / src.name
        if not dst.exists() or dst.read_text() != text:
            stale.append(src.name)
            if not check:
                dst.write_text(text)
    extra = sorted({p.name for p in notebooks.glob("*.ipynb")} - {p.name for p in solutions.glob("*.ipynb")})
    stale += [f"{name} (no solution)" for name in extra]
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks that are out of date")
    args = parser.parse_args(argv)
    try:
        stale = build(check=args.check)
    except ValueError as exc:
        print(f"make_student: {exc}")
        return 2
    if args.check and stale:
        print("notebooks/ is out of date for: " + ", ".join(stale) + ". Run `python tools/make_student.py`.")
        return 1
    print(("updated: " + ", ".join(stale)) if stale else "notebooks/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
