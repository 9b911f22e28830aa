"""How much each student notebook asks: its TODO cells, its tasks, and the largest task's size in lines.

A task is one spec (a markdown cell with "roughly N lines") and the stubs below it; its size is the sum of its
stubs' counts, which tools/make_student.py computes from the solution blocks. A spec may split its task into parts
with a size each (stage 09's register tiles: four steps, each checked on its own): the largest part is the most a
student writes before a check says whether it works.

    python tools/task_sizes.py            # the table for notebooks/
    python tools/task_sizes.py --markdown # the same as a markdown table
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
STUB = re.compile(r"TODO: your code here \(the solution takes about (\d+) lines?\)")
PART = re.compile(r"[Rr]oughly\s+(\d+)\s+lines?\b")


def sizes(path: Path) -> dict:
    """TODO cells, and (title, lines, largest part) for each task of one student notebook."""
    nb = nbformat.read(path, as_version=4)
    todo_cells = sum(1 for c in nb.cells if c.cell_type == "code" and STUB.search(c.source))
    tasks, title, lines, parts = [], None, 0, []

    def close():
        if title is not None and lines:
            tasks.append((title, lines, max(parts, default=lines)))

    for cell in nb.cells:
        if cell.cell_type == "markdown":
            close()
            headings = [ln[3:] for ln in cell.source.splitlines() if ln.startswith("## ")]
            title = (headings[-1] if len(headings[-1]) <= 30 else headings[-1][:29].rstrip() + "…") if headings else title
            lines, parts = 0, [int(n) for n in PART.findall(cell.source)]
        else:
            lines += sum(int(n) for n in STUB.findall(cell.source))
    close()
    return {"todo_cells": todo_cells, "tasks": tasks}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("folder", nargs="?", type=Path, default=REPO / "notebooks", help="student notebooks")
    args = parser.parse_args(argv)
    paths = sorted(args.folder.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks in {args.folder}: run `python tools/make_student.py` first")
        return 1
    rows = []
    for path in paths:
        s = sizes(path)
        largest = max(s["tasks"], key=lambda t: t[1], default=("-", 0, 0))
        part = max((t[2] for t in s["tasks"]), default=0)
        rows.append((path.stem, str(s["todo_cells"]), str(len(s["tasks"])), f"{largest[1] or '-'}",
                     largest[0], f"{part or '-'}"))
    head = ("notebook", "TODO cells", "tasks", "largest task (lines)", "which", "largest part before a check")
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        for row in [head, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
