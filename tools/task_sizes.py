"""How much each student notebook asks: its TODO cells, its tasks, and the largest task's size in lines.

The tasks are the registry's (``labkit.course.tasks``); a task's size is the lines of its solution blocks, counted
as tools/make_student.py counts them for the stubs and the specs. A task written in steps checked one by one (stage
09's register tiles: ``Task.steps``) is also sized per step: the largest step is the most a student writes before a
check says whether it works; any other task is checked whole.

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
sys.path.insert(0, str(REPO / "tools"))
import make_student  # noqa: E402 - one count of a block's lines
from labkit.course import tasks  # noqa: E402 - the tasks, declared once

STUB = re.compile(r"TODO: your code here \(the solution takes about (\d+) lines?\)")


def sizes(student: Path, solutions: Path = REPO / "solutions") -> dict:
    """TODO cells of one student notebook, and (task, lines, largest step) for each of its stage's tasks."""
    nb = nbformat.read(student, as_version=4)
    todo_cells = sum(1 for c in nb.cells if c.cell_type == "code" and STUB.search(c.source))
    blocks = make_student.block_sizes(nbformat.read(solutions / student.name, as_version=4))
    found = []
    for task in tasks.of_stage(student.name[:2]):
        steps: dict[str, int] = {}
        for step, block in zip(task.steps or ("whole",) * len(task.blocks), task.blocks):
            steps[step] = steps.get(step, 0) + blocks[block]
        found.append((task, sum(steps.values()), max(steps.values())))
    return {"todo_cells": todo_cells, "tasks": found}


def _short(text: str, width: int = 30) -> str:
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


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
        task, lines, _ = max(s["tasks"], key=lambda t: t[1], default=(None, 0, 0))
        step = max((t[2] for t in s["tasks"]), default=0)
        rows.append((path.stem, str(s["todo_cells"]), str(len(s["tasks"])), f"{lines or '-'}",
                     _short(f"{task.number} {task.label}") if task else "-", f"{step or '-'}"))
    head = ("notebook", "TODO cells", "tasks", "largest task (lines)", "which", "most lines before a check")
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
