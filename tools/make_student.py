"""Regenerate the student notebooks in notebooks/ from the complete ones in solutions/.

Code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a TODO stub that raises
NotImplementedError and says roughly how many lines the answer takes; in CUDA C source held in a string, code
between ``/// BEGIN SOLUTION`` and ``/// END SOLUTION`` becomes a stub that returns before writing anything. Both
stubs carry ``labkit.stages.STUB_MARK``: the launch layer refuses a kernel (and ``lk.gpu.raw_module`` a source) that
still has it, so an untouched kernel is "not implemented" on a GPU too, where kernels raise nothing. Outputs are
dropped.

    python tools/make_student.py           # write notebooks/
    python tools/make_student.py --check   # exit 1 if notebooks/ is out of date (the tests do this)
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from labkit.stages import STUB_MARK  # noqa: E402 - the marker the launch layer looks for

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_BEGIN_RE = re.compile(r"^(\s*)(###|///) BEGIN SOLUTION\s*$")


def stub_source(source: str) -> str:
    """Replace each solution block by a stub at the block's indentation."""
    out, lines, i = [], source.splitlines(), 0
    while i < len(lines):
        m = _BEGIN_RE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, mark = m.group(1), m.group(2)
        end = f"{mark} END SOLUTION"
        j = i + 1
        while j < len(lines) and lines[j].strip() != end:
            j += 1
        if j == len(lines):
            raise ValueError(f"'{mark} BEGIN SOLUTION' without '{end}' in:\n{source}")
        comment = "#" if mark == "###" else "//"
        size = sum(1 for line in lines[i + 1:j] if line.strip() and not line.strip().startswith(comment))
        if mark == "###":
            out.append(f"{indent}# TODO: your code here (the solution takes about {size} line{'s' * (size != 1)})")
            out.append(f'{indent}raise NotImplementedError("{STUB_MARK}")')
        else:
            out.append(f"{indent}// TODO: your code here (the solution takes about {size} line{'s' * (size != 1)})")
            out.append(f"{indent}return;  // {STUB_MARK}")
        i = j + 1
    return "\n".join(out)


def student_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = stub_source(cell.source)
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def build(solutions: Path = REPO / "solutions", notebooks: Path = REPO / "notebooks", check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) every student notebook; return the names that differ."""
    stale = []
    notebooks.mkdir(exist_ok=True)
    for src in sorted(solutions.glob("*.ipynb")):
        text = render(student_notebook(nbformat.read(src, as_version=4)))
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
    stale = build(check=args.check)
    if args.check and stale:
        print("notebooks/ is out of date for: " + ", ".join(stale) + ". Run `python tools/make_student.py`.")
        return 1
    print(("updated: " + ", ".join(stale)) if stale else "notebooks/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
