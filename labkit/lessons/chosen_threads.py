"""Which threads of a recorded launch (``labkit.access``) a picture shows, and what they count: ``select`` picks a
thread, a warp or a block; ``per_thread_counts`` gives the busiest chosen thread's loads and stores of each kind,
``warp_addresses`` the most addresses one warp-wide load asks for. No drawing: ``labkit.draw`` and the scenes'
budgets (``labkit.lessons.scenes``) read them.
"""

from __future__ import annotations

import numpy as np

from .access import Launch

KINDS = ("global load", "global store", "shared load", "shared store", "constant load")


def select(launch: Launch, block=0, thread=None, warp=None) -> tuple[np.ndarray, np.ndarray, str]:
    """(mask of the chosen threads' accesses, mask of their block's accesses, a label). ``block``/``thread``: an
    int (flat index) or an (x, y, z) tuple; ``warp``: a warp number in the block; neither: the whole block."""
    rows = launch.rows
    b = _dims(block, launch.grid)
    in_block = (rows[:, 2] == b[0]) & (rows[:, 3] == b[1]) & (rows[:, 4] == b[2])
    bl = show_dims(b)
    if thread is not None:
        t = _dims(thread, launch.block)
        sel = in_block & (rows[:, 5] == t[0]) & (rows[:, 6] == t[1]) & (rows[:, 7] == t[2])
        return sel, in_block, f"thread {show_dims(t)} of block {bl}"
    if warp is not None:
        bx, by, _ = launch.block
        linear = rows[:, 5] + bx * (rows[:, 6] + by * rows[:, 7])
        sel = in_block & (linear // 32 == int(warp))
        return sel, in_block, f"warp {warp} of block {bl} (threads {32 * warp}..{32 * warp + 31})"
    return in_block, in_block, f"block {bl} ({int(np.prod(launch.block))} threads)"


def _dims(d, shape) -> tuple[int, int, int]:
    if isinstance(d, (int, np.integer)):
        return tuple(int(v) for v in np.unravel_index(int(d), tuple(shape)[::-1])[::-1])  # x fastest
    d = tuple(int(v) for v in d) + (0, 0, 0)
    return d[:3]


def show_dims(d) -> str:
    d = tuple(d)
    while len(d) > 1 and d[-1] == 0:
        d = d[:-1]
    return "(" + ", ".join(map(str, d)) + ")" if len(d) > 1 else str(d[0])


def per_thread_counts(launch: Launch, mask: np.ndarray) -> dict[str, int]:
    """Loads and stores of each kind among the accesses ``mask`` picks, for the busiest thread among them."""
    rows = launch.rows[mask]
    if not len(rows):
        return {k: 0 for k in KINDS}
    kind_of = np.array([launch.arrays[n]["kind"] for n in launch.names])[rows[:, 0]]
    _, owner = np.unique(rows[:, 2:8], axis=0, return_inverse=True)
    owner = owner.ravel()
    out = {}
    for kind in KINDS:  # an atomic add's read is part of its one store, not a load of its own
        mem, op = kind.split()
        pick = (kind_of == mem) & (rows[:, 9] == (op == "store")) & ((op == "store") | (rows[:, 10] == 0))
        out[kind] = int(np.bincount(owner[pick]).max()) if pick.any() else 0
    return out


def warp_addresses(launch: Launch, mask: np.ndarray, memory: str = "constant") -> int:
    """The most distinct addresses one warp-wide load of ``memory`` asks for: the k-th load of every thread of a
    warp is one load instruction; constant memory serves one address per step and serializes the rest."""
    rows = launch.rows[mask & (launch.rows[:, 9] == 0)]
    kind_of = np.array([launch.arrays[n]["kind"] for n in launch.names])[rows[:, 0]] if len(rows) else []
    rows = rows[np.asarray(kind_of) == memory] if len(rows) else rows
    if not len(rows):
        return 0
    bx, by, _ = launch.block
    linear = rows[:, 5] + bx * (rows[:, 6] + by * rows[:, 7])
    steps: dict = {}
    seen: dict = {}
    for r, lin in zip(rows, linear):
        thread = (r[2], r[3], r[4], lin)
        k = seen.get(thread, 0)
        seen[thread] = k + 1
        steps.setdefault((r[2], r[3], r[4], lin // 32, k), set()).add((r[0], r[1]))
    return max(len(v) for v in steps.values())
