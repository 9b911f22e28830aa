"""Load the tagged cells of a notebook into a fresh namespace.

The bench and the grader run only the cells that define a student's kernels and wrappers (tag ``kernel``),
never the rest of the notebook, so a notebook's timing or plotting cells cannot interfere.

A solution notebook ``solutions/NN_topic.ipynb`` has its source beside it, ``NN_topic.py`` in jupytext's percent
format (``solutions/jupytext.toml``); ``read`` and ``load`` take either. The kit runs a solution's code from its
source (``source_of``): each ``# %%`` block is the notebook cell of the same index and runs under that cell's name
(``<NN_topic.ipynb cell 7>``), so tracebacks and the grader's ownership rules see the same code either way. The
source is read here without jupytext (a dev dependency): ``read_source`` knows the part of the format that the
kit's jupytext settings write and refuses the rest; tests/test_sources.py checks that it reads every solution's
source as jupytext does, and that each source holds its notebook's cells.
"""

from __future__ import annotations

import json
import linecache
import re
from pathlib import Path
from types import SimpleNamespace

KERNEL_TAG = "kernel"
#: a solution cell for the kit's repository only (the bench's extra variants): not in a student copy
#: (tools/make_student.py), nor in a release's given code (labkit.release)
KIT_ONLY_TAG = "kit-only"
SOURCE_SUFFIX = ".py"  # a notebook's source beside it: NN_topic.py for NN_topic.ipynb
_MAGIC = re.compile(r"^\s*[%!]")
# the cell markers the kit's jupytext settings write: "# %%", "# %% [markdown]", each with tags=[...] or not
_CELL_MARK = re.compile(r"^# %%(?: \[(markdown|raw)\])?(?: tags=(\[.*\]))?$")
_ANY_MARK = re.compile(r"^\s*#\s*(?:%%%*(?:\s|$)|(?:<codecell>|In\[[0-9 ]*\]:?)\s*$)")  # jupytext's markers


class NotebookError(Exception):
    """A notebook that cannot be read or has no cells with the tag: the message says which and what to do."""


def read(path: str | Path) -> nbformat.NotebookNode:  # noqa: F821 - imported when called
    """A notebook (nbformat), or a notebook's percent-format source (``read_source``) for a ``.py`` path."""
    path = Path(path)
    if path.suffix == SOURCE_SUFFIX:
        return read_source(path)
    import nbformat  # here, not at import: nbformat's schema validator costs seconds to import

    if not path.is_file():
        raise NotebookError(f"no notebook at {path}")
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises several types for broken JSON
        raise NotebookError(f"{path} is not a readable notebook ({type(exc).__name__}: {exc})") from None


def defines(src: str, names: tuple[str, ...]) -> bool:
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
        if tag in cell.get("metadata", {}).get("tags", []) or (define and defines(cell.source, define)):
            src = "\n".join("" if _MAGIC.match(line) else line for line in cell.source.splitlines())
            cells.append((i, src))
    return cells


def source_of(notebook: str | Path) -> Path:
    """Where a notebook's percent-format source is (or would be): beside it, same name, ``.py``."""
    return Path(notebook).with_suffix(SOURCE_SUFFIX)


def notebook_name(path: str | Path) -> str:
    """The notebook's file name of a notebook or of its source (``04_data_transfer_padding.ipynb`` for either)."""
    return Path(path).with_suffix(".ipynb").name


def _cell(cell_type: str, metadata: dict, source: str) -> SimpleNamespace:
    return SimpleNamespace(cell_type=cell_type, metadata=metadata, source=source,
                           get=lambda key, default=None: metadata if key == "metadata" else default)


def _uncomment(line: str) -> str:
    return line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line


def read_source(path: str | Path) -> SimpleNamespace:
    """The cells of a notebook's source in jupytext's percent format, as jupytext reads what the kit's settings
    (``solutions/jupytext.toml``) write: no header, cells that start with ``# %%`` (``[markdown]`` or ``[raw]``, and
    ``tags=[...]``, on the marker line), markdown and raw lines commented with ``# ``, code as it is, one blank line
    before the next marker (two after a definition). A marker it does not know, or text before the first one, is
    refused (NotebookError); what it reads otherwise differently from jupytext (a '# %%' line inside a string) makes
    the pair out of step (``out_of_step``), which the tests check for every solution."""
    path = Path(path)
    if not path.is_file():
        raise NotebookError(f"no notebook source at {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NotebookError(f"{path} is not a readable notebook source ({type(exc).__name__}: {exc})") from None

    def refuse(number: int, why: str):
        raise NotebookError(f"{path.name} line {number}: {why}; write it as `jupytext --sync` does with the settings "
                            f"of solutions/jupytext.toml (cells that start with '# %%', tags only)")

    starts = [i for i, line in enumerate(lines) if _ANY_MARK.match(line)]
    if any(line.strip() for line in lines[:starts[0] if starts else len(lines)]):
        refuse(1, "text before the first cell marker (a header or a cell without '# %%')")
    cells = []
    for k, start in enumerate(starts):
        m = _CELL_MARK.match(lines[start])
        if not m:
            refuse(start + 1, f"a cell marker this reader does not know ({lines[start]!r})")
        metadata = {}
        if m.group(2):
            try:
                tags = json.loads(m.group(2))
            except ValueError:
                tags = None
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                refuse(start + 1, f"tags that are not a JSON list of strings ({m.group(2)})")
            metadata["tags"] = tags
        body = lines[start + 1:starts[k + 1] if k + 1 < len(starts) else len(lines)]
        # jupytext's ends of cells: two blank lines (after a definition) when the line before them is not blank
        # (the marker counts), else one empty line
        if len(body) >= 2 and not body[-1].strip() and not body[-2].strip() and (len(body) == 2 or body[-3].strip()):
            body = body[:-2]
        elif body and not body[-1]:
            body = body[:-1]
        cell_type = m.group(1) or "code"
        if cell_type != "code":
            body = [_uncomment(line) for line in body]
        cells.append(_cell(cell_type, metadata, "\n".join(body)))
    if not cells:
        raise NotebookError(f"{path.name} has no cells (no '# %%' line): not a notebook source")
    return SimpleNamespace(cells=cells)


def _key(cell) -> tuple[str, str, list]:
    return cell.cell_type, cell.source, list((cell.get("metadata", {}) or {}).get("tags", []))


def out_of_step(notebook: str | Path) -> str:
    """Why a notebook and its source (``source_of``) do not hold the same cells, "" when they do: cell by cell the
    same type, source and tags (a notebook's ids, outputs and other metadata are its own)."""
    notebook = Path(notebook)
    source = source_of(notebook)
    if not source.is_file():
        return f"{notebook.name} has no source {source.name} beside it"
    nb, src = _read_quick(notebook) or read(notebook), read_source(source)
    for index, (a, b) in enumerate(zip(nb.cells, src.cells)):
        if _key(a) != _key(b):
            what = [w for w, x, y in zip(("type", "source", "tags"), _key(a), _key(b)) if x != y]
            return f"cell {index} of {notebook.name} and of {source.name} differ ({', '.join(what)})"
    if len(nb.cells) != len(src.cells):
        return f"{notebook.name} has {len(nb.cells)} cells, {source.name} {len(src.cells)}"
    return ""


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
    self-checks' failure lines) point at the student's own line. ``path`` may be a notebook's source (``.py``,
    ``read_source``): its cells run under the notebook's name and their indices in it.
    """
    path = Path(path)
    nb = read_source(path) if path.suffix == SOURCE_SUFFIX else _read_quick(path) or read(path)
    cells = tagged_cells(nb, tag)
    if not cells:
        raise NotebookError(f"{path.name} has no code cells tagged {tag!r}; the cells that define your kernels "
                            f"must keep that tag (View > Cell Toolbar > Tags in Jupyter)")
    ns = {"__name__": f"labkit_nb_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"} if namespace is None else namespace
    for index, src in cells:
        run_cell(src, f"<{notebook_name(path)} cell {index}>", ns)
    return ns


def register(src: str, filename: str) -> None:
    """Make ``src`` the text that ``linecache`` (and so ``inspect`` and tracebacks) gives for ``filename``."""
    linecache.cache[filename] = (len(src), None, [line + "\n" for line in src.splitlines()], filename)


def run_cell(src: str, filename: str, ns: dict):
    """Compile ``src`` under ``filename``, register its text for that name and execute it in ``ns``; returns the
    code object. The text must be registered each time: ``inspect.getsource`` (the stub check, tracebacks, the
    simulator's failure lines) reads it by file name, so a cell compiled under a name another cell registered
    before would be read as that other cell."""
    register(src, filename)
    code = compile(src, filename, "exec")
    exec(code, ns)  # noqa: S102 - running notebook cells is the point
    return code
