"""A release's given code: the ``kernel`` cells of the kit's solution of each released stage, as plain files.

A student repository built by ``labkit release`` holds no solution notebooks. The given code of the stages whose
deadlines have passed lies in ``labkit/given/NN_topic.py``, one file per stage, beside ``manifest.json`` (the
milestone and which stages are released). Each file keeps the notebook's cells as ``# %% cell N`` blocks and is run
cell by cell under the same names the notebook's cells get (``<04_data_transfer_padding.ipynb cell 7>``), so
tracebacks, the simulator's race reports and the grader's ownership rules see given code the same way whether it
came from a solution notebook or from a release.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import nbcells

FOLDER = Path(__file__).resolve().parents[1] / "given"  # labkit/given/
MANIFEST = "manifest.json"
_CELL = re.compile(r"^# %% cell (\d+)$")


class NotReleased(nbcells.NotebookError):
    """A stage whose code this milestone does not release: the message says which stages are, in one line."""


def manifest(folder: Path = FOLDER) -> dict | None:
    """The release's manifest (``milestone``, ``released`` stage numbers, ``files``), or None outside a release."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def span(numbers) -> str:
    """Stage numbers as a short range: 00–04, or 00, 02 when they are not consecutive; "none" when empty."""
    numbers = sorted(numbers)
    if not numbers:
        return "none"
    if len(numbers) > 2 and [int(n) for n in numbers] == list(range(int(numbers[0]), int(numbers[-1]) + 1)):
        return f"{numbers[0]}\u2013{numbers[-1]}"
    return ", ".join(numbers)


def path_of(number: str, folder: Path = FOLDER) -> Path:
    """The file of stage ``number``'s given code in this release; NotReleased says in one line when there is none."""
    info = manifest(folder) or {}
    released = info.get("released", [])
    if number not in released:
        raise NotReleased(f"stage {number}'s code is not released yet in this milestone (released: {span(released)}); "
                          f"it comes with the milestone after {number}'s deadline")
    name = info.get("files", {}).get(number)
    if not name:
        raise NotReleased(f"stage {number} has no given code: its notebook defines no kernels")
    return folder / name


def render(number: str, notebook: str, title: str, cells: list[tuple[int, str]], milestone: str) -> str:
    """The text of a given-code file: a docstring saying what it is, then each kernel cell as ``# %% cell N``."""
    head = (f'"""Given code of stage {number} ({title}), released with milestone {milestone}.\n\n'
            f"The `kernel` cells of the kit's solution of {notebook}, which `lk.from_stage(\"{number}\")` runs: each\n"
            f"`# %% cell N` block is that notebook's cell N. Written by `labkit release`.\n"
            f'"""\n')
    parts = [head]
    for index, src in cells:
        if any(_CELL.match(line) for line in src.splitlines()):
            raise ValueError(f"{notebook} cell {index} has a line that looks like a cell marker ('# %% cell N')")
        parts.append(f"\n# %% cell {index}\n{src.rstrip()}\n")
    return "".join(parts)


def cells(text: str) -> list[tuple[int, str]]:
    """The (cell index, source) blocks of a given-code file; the docstring before the first marker is not run."""
    found, index, lines = [], None, []
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            if index is not None:
                found.append((index, "\n".join(lines).strip("\n")))
            index, lines = int(m.group(1)), []
        elif index is not None:
            lines.append(line)
    if index is not None:
        found.append((index, "\n".join(lines).strip("\n")))
    return found


def load(path: Path, notebook: str) -> dict:
    """Run a given-code file's cells in a fresh namespace, each under its notebook cell's name, as
    ``nbcells.load`` runs a notebook's kernel cells."""
    stem = Path(notebook).stem
    ns = {"__name__": f"labkit_nb_{re.sub(r'[^0-9A-Za-z_]', '_', stem)}"}
    for index, src in cells(Path(path).read_text(encoding="utf-8")):
        nbcells.run_cell(src, f"<{notebook} cell {index}>", ns)
    return ns
