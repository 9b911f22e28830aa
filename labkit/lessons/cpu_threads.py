"""Which CPU thread of a ``prange`` loop nest writes, or reads for one output element, what: stage 02's CPU tasks,
drawn as ``lk.show`` draws a kernel's threads.

``record(fn, arrays, scalars)`` runs the Python source of an ``@njit(parallel=True)`` function (its ``py_func``,
and the same for every numba function it calls) on arrays that log each element they hand out or take in, with
``prange`` replaced by a loop that says which of ``THREADS`` threads runs each iteration: numba's default schedule
gives each thread one contiguous, equal share of a ``prange``'s iterations (the last share may be shorter), and the
code outside a ``prange`` runs on thread 0. The accesses come back as a ``labkit.access.Launch`` whose "block" is the
CPU thread; its barrier-epoch column holds how many outputs had been written before the access, so the reads that
went into one output element are the ones before its write and after the previous one.
"""

from __future__ import annotations

import math
import types

import numpy as np

from .access import COLUMNS, Launch
from .draw import _crosses, mosaic

THREADS = 4
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


class _Log:
    def __init__(self, names: list[str], output: str):
        self.names, self.output = names, output
        self.rows: list[tuple] = []
        self.thread = 0
        self.written = 0

    def prange(self, *args):
        """``range`` that sets the thread of each iteration: contiguous equal shares."""
        items = range(*args)
        share = max(1, math.ceil(len(items) / THREADS))
        outer = self.thread
        try:
            for k, i in enumerate(items):
                self.thread = k // share
                yield i
        finally:
            self.thread = outer


class Traced:
    """An array whose element reads and writes are logged (what the py_func indexes)."""

    def __init__(self, array: np.ndarray, name: str, log: _Log):
        self._a, self._name, self._log = array, name, log
        self.shape, self.ndim, self.size, self.dtype = array.shape, array.ndim, array.size, array.dtype

    def _note(self, idx, store: bool) -> None:
        idx = idx if isinstance(idx, tuple) else (idx,)
        try:
            flat = int(np.ravel_multi_index(tuple(int(i) for i in idx), self.shape, mode="wrap"))
        except (TypeError, ValueError):
            return
        log = self._log
        log.rows.append((log.names.index(self._name), flat, log.thread, 0, 0, 0, 0, 0, log.written, int(store), 0))
        if store and self._name == log.output:
            log.written += 1

    def __getitem__(self, idx):
        self._note(idx, False)
        return self._a[idx]

    def __setitem__(self, idx, value):
        self._note(idx, True)
        self._a[idx] = value

    def __len__(self):
        return len(self._a)


def _python(fn, log: _Log, made: dict):
    """``fn``'s Python source as a function whose ``prange`` is ``log``'s and whose numba callees are Python too."""
    py = getattr(fn, "py_func", fn)
    if py in made:
        return made[py]
    scope = dict(py.__globals__)
    made[py] = new = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    scope["prange"] = log.prange
    for name in py.__code__.co_names:
        value = scope.get(name)
        if hasattr(value, "py_func") and callable(value):
            scope[name] = _python(value, log, made)
    return new


def record(fn, arrays: dict[str, np.ndarray], scalars: tuple = (), roles: dict[str, str] | None = None,
           output: str = "out") -> Launch:
    """Run ``fn(*arrays.values(), *scalars)`` in Python with every access logged (module docstring)."""
    names = list(arrays)
    log = _Log(names, output)
    traced = [Traced(np.array(a, copy=True), n, log) for n, a in arrays.items()]
    _python(fn, log, {})(*traced, *scalars)
    rows = np.array(log.rows, np.int64).reshape(-1, len(COLUMNS))
    roles = roles or {}
    info = {n: {"kind": "global", "shape": list(np.shape(a)), "role": roles.get(n, "output" if n == output else
                                                                              "input")} for n, a in arrays.items()}
    name = getattr(getattr(fn, "py_func", fn), "__name__", "fn")
    return Launch(name, (THREADS, 1, 1), (1, 1, 1), info, rows)


def element_reads(launch: Launch, output: str, element: int) -> np.ndarray:
    """The rows of the reads that went into output element ``element`` (flat): those after the write before it."""
    o = launch.names.index(output)
    rows = launch.rows
    writes = rows[(rows[:, 0] == o) & (rows[:, 9] == 1)]
    order = np.flatnonzero(writes[:, 1] == element)
    if not len(order):
        return rows[:0]
    k = int(order[0])
    return rows[(rows[:, 8] == k) & (rows[:, 9] == 0)]


# ----------------------------------------------------------------------------------------------- drawing


def _panel(ax, launch: Launch, name: str, rows: np.ndarray, mark: int | None = None) -> None:

    info = launch.arrays[name]
    h, w, rr, cc = mosaic(info["shape"])
    img = np.ones((h, w, 3))
    img[rr, cc] = 0.93
    a = launch.names.index(name)
    mine = rows[rows[:, 0] == a]
    for t in range(THREADS):
        cells = mine[mine[:, 2] == t, 1]
        img[rr[cells], cc[cells]] = [int(PALETTE[t][i:i + 2], 16) / 255 for i in (1, 3, 5)]
    ax.imshow(img, interpolation="nearest", aspect="equal")
    if mark is not None:
        _crosses(ax, [cc[mark]], [rr[mark]])
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    shape = "×".join(map(str, info["shape"]))
    grid = "\nrows: 1st index, columns: 2nd" if len(info["shape"]) == 4 else ""
    ax.set_title(f"{name} [{shape}]{grid}", fontsize=7)


def _shown(launch: Launch, output: str, element: int | None) -> list[tuple]:
    """The panels of one item: (array, its rows to colour, the element to mark)."""
    if element is None:
        o = launch.names.index(output)
        return [(output, launch.rows[(launch.rows[:, 0] == o) & (launch.rows[:, 9] == 1)], None)]
    reads = element_reads(launch, output, element)
    shown = [(n, reads, None) for n in launch.names if n != output and (reads[:, 0] == launch.names.index(n)).any()]
    return shown + [(output, launch.rows[:0], element)]


def figure(rows: list[list[tuple[str, Launch, str, int | None]]], *, title: str = "", note: str = ""):
    """A row of items (label, launch, output name, element) per entry of ``rows``, side by side (yours beside the
    spec): with ``element`` None, the output coloured by the thread that wrote each element; else the inputs
    coloured by the thread that read them for that element."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch


    rows_in, width = 2.1, 9.0
    fig = plt.figure(figsize=(width, 0.7 + 0.17 * title.count("\n") + rows_in * len(rows) + (0.3 if note else 0)))
    height = fig.get_figheight()
    top = 0.55 + 0.17 * title.count("\n")
    for k, row in enumerate(rows):
        y1 = height - top - k * rows_in
        share = (width - 0.3) / len(row)
        for j, (label, launch, output, element) in enumerate(row):
            x = 0.2 + j * share
            fig.text(x / width, (y1 - 0.05) / height, label, fontsize=8.5, fontweight="bold", va="top")
            shown = _shown(launch, output, element)
            dims = [mosaic(launch.arrays[name]["shape"])[:2] for name, _, _ in shown]
            cell = min(0.2, (share - 0.2 - 0.35 * len(shown)) / sum(w for _, w in dims),
                       (rows_in - 0.75) / max(h for h, _ in dims))
            for (name, rows_, mark), (h, w) in zip(shown, dims):
                ax = fig.add_axes([(x + 0.1) / width, (y1 - 0.62 - h * cell) / height, w * cell / width,
                                   h * cell / height])
                _panel(ax, launch, name, rows_, mark)
                x += w * cell + 0.35
    handles = [Patch(facecolor=PALETTE[t], label=f"thread {t}") for t in range(THREADS)]
    fig.legend(handles=handles, loc="lower right", ncols=THREADS, fontsize=7.5, frameon=False,
               bbox_to_anchor=(1.0, (0.3 if note else 0.0) / height))
    fig.text(0.1 / width, 1 - 0.08 / height, title, fontsize=9.5, va="top")
    if note:
        fig.text(0.1 / width, 0.06 / height, note, fontsize=7.5, va="bottom")
    return fig
