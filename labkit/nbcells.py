"""Load the tagged cells of a notebook into a fresh namespace.

The bench and the grader run only the cells that define a student's kernels and wrappers (tag ``kernel``),
never the rest of the notebook, so a notebook's timing or plotting cells cannot interfere.
"""

from __future__ import annotations

import json
import linecache
import re
from pathlib import Path
from types import SimpleNamespace

KERNEL_TAG = "kernel"
_MAGIC = re.compile(r"^\s*[%!]")


class NotebookError(Exception):
    """A notebook that cannot be read or has no cells with the tag: the message says which and what to do."""


def read(path: str | Path) -> nbformat.NotebookNode:  # noqa: F821 - imported when called
    import nbformat  # here, not at import: nbformat's schema validator costs seconds to import

    path = Path(path)
    if not path.is_file():
        raise NotebookError(f"no notebook at {path}")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several types for broken JSON
        raise NotebookError(f"{path} is not a readable notebook ({type(exc).__name__}: {exc})") from None


def _defines(src: str, names: tuple[str, ...]) -> bool:
    """Whether a cell defines one of ``names`` at its top level (``def name(`` at the start of a line)."""
    return any(re.search(rf"^(?:async\s+)?def\s+{re.escape(n)}\s*\(", src, re.M) for n in names)


def tagged_cells(nb: nbformat.NotebookNode, tag: str = KERNEL_TAG, define: tuple[str, ...] = ()) \
        -> list[tuple[int, str]]:
    """(cell index, source) of the code cells carrying ``tag``, with IPython magics removed; with ``define``, also
    the untagged cells that define one of those functions (a task's function in a notebook from an earlier
    release, whose cell lacked the tag), in notebook order."""
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if tag in cell.get("metadata", {}).get("tags", []) or (define and _defines(cell.source, define)):
            src = "\n".join("" if _MAGIC.match(line) else line for line in cell.source.splitlines())
            cells.append((i, src))
    return cells


def _read_quick(path: Path):
    """The cells of an nbformat-4 notebook read as plain JSON (what ``tagged_cells`` needs), without importing
    nbformat; None when it is not that simple (``read`` then says what is wrong)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("nbformat") != 4 or not isinstance(raw.get("cells"), list):
            return None
        cells = [SimpleNamespace(cell_type=c["cell_type"], metadata=c.get("metadata") or {},
                                 source="".join(c["source"]) if isinstance(c["source"], list) else c["source"],
                                 get=lambda key, default=None, _c=c: _c.get(key, default)) for c in raw["cells"]]
        return SimpleNamespace(cells=cells)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def load(path: str | Path, tag: str = KERNEL_TAG, namespace: dict | None = None) -> dict:
    """Execute the cells tagged ``tag`` in order in a fresh namespace and return it.

    Each cell is compiled with a file name that names the notebook and cell, so tracebacks (and the
    self-checks' failure lines) point at the student's own line.
    """
    path = Path(path)
    nb = _read_quick(path) or read(path)
    cells = tagged_cells(nb, tag)
    if not cells:
        raise NotebookError(f"{path.name} has no code cells tagged {tag!r}; the cells that define your kernels "
                            f"must keep that tag (View > Cell Toolbar > Tags in Jupyter)")
    ns = {"__name__": f"labkit_nb_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"} if namespace is None else namespace
    for index, src in cells:
        filename = f"<{path.name} cell {index}>"
        linecache.cache[filename] = (len(src), None, [line + "\n" for line in src.splitlines()], filename)
        exec(compile(src, filename, "exec"), ns)  # noqa: S102 - running the student's own cells is the point
    return ns
