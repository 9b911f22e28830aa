"""Pictures of a recorded launch (``labkit.access``): the arrays a kernel touches as grids, what the chosen threads
read and wrote in each barrier epoch, and their load and store counts against the task's budget.

One colour per role (what an array holds), the same in every stage: the input is blue wherever it lives (global
``x``, a shared tile, stage 07's unrolled matrix is the input rearranged: teal), the weights green (global, shared or
constant), the bias brown, the output red. A panel shows one array in one epoch: the chosen threads' reads in the
full colour, writes with a black cross, what the rest of their block touched in that epoch pale. A 4-D array is a
grid of planes (rows: its first axis, columns: its second), a 3-D array a row of planes. Which threads are chosen,
and their counts, is ``labkit.lessons.chosen_threads``'.
"""

from __future__ import annotations

import numpy as np

from .access import ROLES, Launch
from .chosen_threads import KINDS, per_thread_counts, select, warp_addresses

COLOURS = {"input": "#1f77b4", "weights": "#2ca02c", "bias": "#8c564b", "buffer": "#17becf", "output": "#d62728"}
WIDTH = 9.0  # inches: a notebook's width
MISSED, EXTRA = "#ff00ff", "#000000"  # "yours vs the spec": what the spec reads and yours does not, and the reverse


# ------------------------------------------------------------------------------------------------ layout


def mosaic(shape) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(height, width, row of each flat index, column of each flat index) of an array drawn as a grid of planes."""
    shape = tuple(int(s) for s in shape)
    flat = np.arange(int(np.prod(shape)))
    if len(shape) == 1:
        w = min(shape[0], 32)
        return -(-shape[0] // w), w, flat // w, flat % w
    if len(shape) == 2:
        return shape[0], shape[1], flat // shape[1], flat % shape[1]
    if len(shape) == 3:
        shape = (1, *shape)
    lead = shape[:-3] if len(shape) > 4 else ()
    a, b, h, w = int(np.prod(shape[:-3])) if lead else shape[0], shape[-3], shape[-2], shape[-1]
    i = flat // (b * h * w)
    j = (flat // (h * w)) % b
    r, c = (flat // w) % h, flat % w
    return a * (h + 1) - 1, b * (w + 1) - 1, i * (h + 1) + r, j * (w + 1) + c


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])


def _pale(colour: np.ndarray) -> np.ndarray:
    return 0.35 * colour + 0.65


def _panel(ax, launch: Launch, name: str, sel_rows: np.ndarray, ctx_rows: np.ndarray, marks=None) -> None:
    """One array in one epoch: background, the block's accesses pale, the chosen threads' reads full, writes ×."""
    info = launch.arrays[name]
    a = launch.names.index(name)
    h, w, rr, cc = mosaic(info["shape"])
    colour = _rgb(COLOURS[info["role"]])
    img = np.ones((h, w, 3))
    img[rr, cc] = 0.93  # the array's cells; white between planes
    ctx = ctx_rows[ctx_rows[:, 0] == a, 1]
    img[rr[ctx], cc[ctx]] = _pale(colour)
    mine = sel_rows[sel_rows[:, 0] == a]
    reads, writes = mine[mine[:, 9] == 0, 1], mine[mine[:, 9] == 1, 1]
    img[rr[reads], cc[reads]] = colour
    img[rr[writes], cc[writes]] = colour * 0.75
    ax.imshow(img, interpolation="nearest", aspect="equal")
    if len(writes):
        ws = np.unique(writes)
        _crosses(ax, cc[ws], rr[ws])
    if marks:
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        for colour_, flats in marks:
            flats = np.unique(np.asarray(flats, np.int64))
            if len(flats):
                rects = [Rectangle((cc[f] - 0.5, rr[f] - 0.5), 1, 1) for f in flats]
                ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor=colour_, linewidth=1.3))
    ax.set_xticks([])
    ax.set_yticks([])
    if max(h, w) <= 40:  # thin white lines between cells, so cells can be counted
        ax.set_xticks(np.arange(-0.5, w, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, h, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.35)
        ax.tick_params(which="minor", length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def _crosses(ax, xs, ys, size: float = 0.32) -> None:
    """A cross on each written cell, in data units so it scales with the cell."""
    from matplotlib.collections import LineCollection

    segs = [[(x - size, y - size), (x + size, y + size)] for x, y in zip(xs, ys)]
    segs += [[(x - size, y + size), (x + size, y - size)] for x, y in zip(xs, ys)]
    ax.add_collection(LineCollection(segs, colors="black", linewidths=0.9))


def _columns(launch: Launch, ctx: np.ndarray) -> list[str]:
    """The arrays the block touches: global ones first (input, weights, bias, buffers), then constant, then shared
    memory, the global output last."""
    used = {launch.names[a] for a in np.unique(launch.rows[ctx, 0])}
    kind_order = {"global": 0, "constant": 1, "shared": 2}

    def key(n):
        info = launch.arrays[n]
        last = info["kind"] == "global" and info["role"] == "output"
        return (last, kind_order[info["kind"]], ROLES.index(info["role"]), n)

    return sorted(used, key=key)


ALL = -1  # the pseudo-epoch of a row that shows every epoch together


def _epochs(sel_rows: np.ndarray, ctx_rows: np.ndarray, most: int, prefer=()) -> tuple[list[int], str]:
    """The epochs to draw: every one the block is in; when there are more than ``most``, a row of all epochs
    together, then the first ``most - 1`` (or those in ``prefer``: where yours and the spec differ) and the last."""
    all_ = sorted(set(ctx_rows[:, 8].tolist()) | set(sel_rows[:, 8].tolist()))
    if len(all_) <= most:
        return all_, ""
    picked = [e for e in all_[:-1] if e in set(prefer)][:most - 1]
    picked = sorted(set(picked) | set([e for e in all_[:-1] if e not in picked][:most - 1 - len(picked)]))
    keep = [ALL] + picked + all_[-1:]
    left = [e for e in all_ if e not in keep]
    which = f"epoch {left[0]}" if len(left) == 1 else f"{len(left)} epochs"
    return keep, f"{which} not drawn on their own"


def _epoch_label(e: int, last: int) -> str:
    if e == ALL:
        return "all epochs\ntogether"
    if last == 0:
        return "no barrier"
    if e == 0:
        return "epoch 0\nbefore the 1st\nsyncthreads"
    if e == last:
        return f"epoch {e}\nafter the\nlast syncthreads"
    return f"epoch {e}\nafter {e} barrier{'s' * (e != 1)}"


def _array_title(launch: Launch, name: str) -> str:
    info = launch.arrays[name]
    shape = "×".join(map(str, info["shape"]))
    return f"{name}  ({info['kind']}, {info['role']})\n[{shape}]"


# ------------------------------------------------------------------------------------------------ figures


def thread_figure(launch: Launch, block=0, thread=None, warp=None, *, title: str = "", budget: dict | None = None,
                  most_epochs: int = 6, note: str = ""):
    """The figure of one launch for the chosen thread, warp or block (see ``select``)."""
    return stacked_figure([(launch, (block, thread, warp), "")], title=title, budget=budget,
                          most_epochs=most_epochs, note=note)


def stacked_figure(items, *, title: str = "", budget: dict | None = None, most_epochs: int = 6, note: str = "",
                   heads: tuple[str, ...] | None = None):
    """Several launches (or several threads of one), one above the other, each with its own count column:
    ``items`` = [(launch, (block, thread, warp), label), ...]."""
    stack = []
    for launch, sel_args, label in items:
        sel, ctx, who = select(launch, *sel_args)
        stack.append((launch, sel, ctx, f"{label}{': ' if label else ''}{who}", None))
    return _figure(stack, title, budget, most_epochs, note, heads=heads or tuple(
        (label or "chosen") for _, _, label in items))


def compare_figure(yours: Launch, spec: Launch, yours_sel, spec_sel, *, title: str = "", budget: dict | None = None,
                   most_epochs: int = 4, note: str = ""):
    """"Yours vs the spec": the same picture for a thread of your launch and the spec's thread, one above the other,
    with squares where they (or their blocks) differ (magenta: the spec reads it, yours does not; black: yours
    reads it, the spec does not). ``*_sel``: (block, thread) pairs, or (block, thread, warp)."""
    return compare_pairs([("", yours, yours_sel, spec, spec_sel)], title=title, budget=budget,
                         most_epochs=most_epochs, note=note)


def compare_pairs(pairs, *, title: str = "", budget: dict | None = None, most_epochs: int = 4, note: str = ""):
    """``compare_figure`` for several pairs, each yours above the spec's: ``pairs`` = [(label, your launch, your
    selection, the spec's launch, its selection), ...] (stage 06's uniform and divergent kernels: two pairs)."""
    stack, words, heads = [], [], []
    for label, yours, yours_sel, spec, spec_sel in pairs:
        (ys, yc, ywho), (ss, sc, swho) = select(yours, *yours_sel), select(spec, *spec_sel)
        match, tag = _match_arrays(yours, spec), f", {label}" if label else ""
        ymarks, smarks = _differences(yours, ys, spec, ss, match, yc, sc)
        stack += [(yours, ys, yc, f"yours{tag}: {ywho}", ymarks), (spec, ss, sc, f"the spec{tag}: {swho}", smarks)]
        said = diff_words(yours, ys, spec, ss, match)
        words.append(f"{label}, {said[0].lower() + said[1:]}" if label else said)
        heads += [f"yours {label}".strip(), f"spec {label}".strip()]
    return _figure(stack, title, budget, most_epochs, "\n".join(filter(None, [*words, note])), heads=tuple(heads),
                   compare=True)


def diff_words(yours: Launch, ys, spec: Launch, ss, pairs: dict | None = None, most: int = 4) -> str:
    """What the chosen thread of yours reads that the spec's does not, and the reverse, as element names."""
    pairs = pairs if pairs is not None else _match_arrays(yours, spec)
    extra, missed = [], []
    for yname, sname in pairs.items():
        ya, sa = yours.names.index(yname), spec.names.index(sname)
        yr, sr = yours.rows[ys & (yours.rows[:, 9] == 0)], spec.rows[ss & (spec.rows[:, 9] == 0)]
        mine, theirs = set(yr[yr[:, 0] == ya, 1].tolist()), set(sr[sr[:, 0] == sa, 1].tolist())
        shape = yours.arrays[yname]["shape"]
        extra += [_element_name(yname, f, shape) for f in sorted(mine - theirs)]
        missed += [_element_name(yname, f, shape) for f in sorted(theirs - mine)]
    if not extra and not missed:
        return "Your thread reads the same elements as the spec's (in some epoch): compare where it writes them."

    def some(items):
        return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")

    parts = ([f"yours reads {some(extra)}, which the spec's does not"] if extra else []) + (
        [f"the spec's reads {some(missed)}, which yours does not"] if missed else [])
    return "Your thread vs the spec's: " + "; ".join(parts) + "."


def _element_name(name: str, flat: int, shape) -> str:
    return f"{name}[{', '.join(str(int(i)) for i in np.unravel_index(int(flat), tuple(shape)))}]"


def _match_arrays(yours: Launch, spec: Launch) -> dict[str, str]:
    """Your array name -> the spec's array holding the same thing (same kind and role, in order of appearance)."""
    out, taken = {}, set()
    for name in yours.names:
        if name in spec.arrays and spec.arrays[name]["kind"] == yours.arrays[name]["kind"]:
            out[name] = name
            taken.add(name)
    for name in yours.names:
        if name in out:
            continue
        y = yours.arrays[name]
        match = next((n for n in spec.names if n not in taken and spec.arrays[n]["kind"] == y["kind"]
                      and spec.arrays[n]["role"] == y["role"] and spec.arrays[n]["shape"] == y["shape"]), None)
        if match:
            out[name] = match
            taken.add(match)
    return out


def _differences(yours, ys, spec, ss, pairs, yc=None, sc=None) -> tuple[dict, dict]:
    """Per (array, epoch): cells read by one and not the other, as marks for ``_panel``: the chosen threads', and
    (``yc``, ``sc``: their blocks' masks) their blocks', so a block's shifted load shows as a whole row."""
    ymarks, smarks = {}, {}
    for ymask, smask in ((ys, ss), (yc, sc)):
        if ymask is None or smask is None:
            continue
        yr, sr = yours.rows[ymask & (yours.rows[:, 9] == 0)], spec.rows[smask & (spec.rows[:, 9] == 0)]
        for yname, sname in pairs.items():
            ya, sa = yours.names.index(yname), spec.names.index(sname)
            for e in set(yr[:, 8].tolist()) | set(sr[:, 8].tolist()) | {ALL}:
                ye, se = _in_epoch(yr, e), _in_epoch(sr, e)
                mine = set(ye[ye[:, 0] == ya, 1].tolist())
                theirs = set(se[se[:, 0] == sa, 1].tolist())
                for colour, cells in ((EXTRA, mine - theirs), (MISSED, theirs - mine)):
                    if cells:
                        ymarks.setdefault((yname, e), []).append((colour, sorted(cells)))
                        smarks.setdefault((sname, e), []).append((colour, sorted(cells)))
    return ymarks, smarks


LABEL_IN, HEAD_IN, TITLE_IN, FOOT_IN = 0.95, 0.68, 0.4, 1.35
MAX_PANEL_IN = 1.6  # the tallest panel of an epoch row, inches
MAX_CELL_IN, MIN_CELL_IN = 0.2, 0.075  # a cell's side; below the smallest, the arrays go on two lines


def _in_epoch(rows: np.ndarray, e: int) -> np.ndarray:
    return rows if e == ALL else rows[rows[:, 8] == e]


def _row_heights(band, cell: float) -> list[float]:
    """Inches of each epoch row of a band: its tallest panel, and room for the epoch's label."""
    launch, sel_rows, ctx_rows, _, _, epochs, cols, sizes = band
    out = []
    for e in epochs:
        used = set(_in_epoch(sel_rows, e)[:, 0].tolist()) | set(_in_epoch(ctx_rows, e)[:, 0].tolist())
        tall = [min(cell * h, MAX_PANEL_IN) for name, (h, _) in zip(cols, sizes) if launch.names.index(name) in used]
        out.append(max(0.55, max(tall, default=0) + 0.14))
    return out


def _fit(sizes: list, room: float) -> float:
    """The largest cell side (inches) at which panels of ``sizes`` fit ``room``, tall ones capped in height."""
    cell = MAX_CELL_IN
    while cell > 0.01 and sum(w * min(cell, MAX_PANEL_IN / h) for h, w in sizes) + GAP * cell * (len(sizes) - 1) > room:
        cell *= 0.95
    return cell


def _lines(cols: list, room: float) -> list[list]:
    """The columns split into lines that fit the width at the smallest cell size (most figures: one line)."""
    lines, line, used = [], [], 0.0
    for name, (h, w) in cols:
        c = min(MIN_CELL_IN, MAX_PANEL_IN / h)
        need = w * c + (GAP * MIN_CELL_IN if line else 0)
        if line and used + need > room:
            lines.append(line)
            line, used = [], 0.0
            need = w * c
        line.append((name, (h, w)))
        used += need
    return lines + ([line] if line else [])
GAP = 1.5  # cells between two panels


def _figure(stack, title, budget, most_epochs, note, heads, compare=False):
    import matplotlib.pyplot as plt

    room = WIDTH - LABEL_IN - 0.1
    bands = _bands(stack, most_epochs, room)
    # one cell size for the whole figure, so that a tile and the image it comes from compare by eye; an array
    # taller than a panel may be (an unrolled matrix) gets smaller cells of its own
    cell = min(_fit(b[7], room) for b in bands)
    rows_in = [_row_heights(b, cell) for b in bands]  # per band, per epoch: its tallest panel
    title_in = TITLE_IN + 0.17 * title.count("\n")
    note_in = 0.13 * (note.count("\n") + 1) + 0.12 if note else 0.0
    height = title_in + sum(HEAD_IN + sum(r) for r in rows_in) + FOOT_IN + note_in
    fig = plt.figure(figsize=(WIDTH, height))
    y = height - title_in
    for (launch, sel_rows, ctx_rows, who, marks, epochs, cols, sizes), row_in in zip(bands, rows_in):
        if who:
            fig.text(0.1 / WIDTH, (y - 0.05) / height, who, fontsize=9, fontweight="bold", va="top")
        boxes, x = [], LABEL_IN
        for h, w in sizes:
            c = min(cell, MAX_PANEL_IN / h)
            boxes.append((x, w * c, h * c))
            x += w * c + GAP * cell
        for (x0, bw, _), name in zip(boxes, cols):
            info = launch.arrays[name]
            shape = "×".join(map(str, info["shape"]))
            fig.text((x0 + bw / 2) / WIDTH, (y - HEAD_IN + 0.03) / height,
                     f"$\\bf{{{_tex(name)}}}$\n{info['kind']}\n[{shape}]", fontsize=7.5, ha="center", va="bottom",
                     color=COLOURS[info["role"]], linespacing=1.1)
        y -= HEAD_IN
        last = max(epochs) if epochs else 0
        a_index = {name: launch.names.index(name) for name in cols}
        for e, eh in zip(epochs, row_in):
            fig.text((LABEL_IN - 0.08) / WIDTH, (y - eh / 2) / height, _epoch_label(e, last), fontsize=7.5,
                     ha="right", va="center")
            s_e, c_e = _in_epoch(sel_rows, e), _in_epoch(ctx_rows, e)
            for (x0, bw, bh), name in zip(boxes, cols):
                if not ((s_e[:, 0] == a_index[name]).any() or (c_e[:, 0] == a_index[name]).any()):
                    continue  # this array is not touched in this epoch: no panel
                ax = fig.add_axes([x0 / WIDTH, (y - 0.07 - bh) / height, bw / WIDTH, bh / height])
                _panel(ax, launch, name, s_e, c_e, (marks or {}).get((name, e)))
            y -= eh
    base = note_in
    _count_table(fig, height, stack, budget, compare, heads, base)
    _legend(fig, stack, compare, base, height)
    fig.text(0.1 / WIDTH, 1 - 0.08 / height, title, fontsize=9.5, va="top")
    if note:
        fig.text(0.1 / WIDTH, 0.06 / height, note, fontsize=7.5, va="bottom")
    return fig


def _bands(stack, most_epochs, room) -> list[tuple]:
    """(launch, rows..., who, marks, epochs, skipped, columns, sizes): a stack item's arrays, a line each (its
    arrays on several lines where they do not fit the width)."""
    bands = []
    for launch, sel, ctx, who, marks in stack:
        sel_rows, ctx_rows = launch.rows[sel], launch.rows[ctx & ~sel]
        epochs, skipped = _epochs(sel_rows, launch.rows[ctx], most_epochs, {e for _, e in (marks or {})})
        cols = _columns(launch, ctx)
        sizes = [mosaic(launch.arrays[n]["shape"])[:2] for n in cols]
        for k, part in enumerate(_lines(list(zip(cols, sizes)), room)):
            ids = [launch.names.index(c) for c, _ in part]
            touched = set(sel_rows[np.isin(sel_rows[:, 0], ids), 8].tolist()) | set(
                ctx_rows[np.isin(ctx_rows[:, 0], ids), 8].tolist()) | {ALL}
            bands.append((launch, sel_rows, ctx_rows, (who + (f"   ({skipped})" if skipped else "")) if k == 0
                          else "", marks, [e for e in epochs if e in touched or (k == 0 and e == ALL)],
                          [c for c, _ in part], [z for _, z in part]))
    return bands


def _legend(fig, stack, compare, base, height) -> None:
    """The roles' colours of the arrays in the figure, pale and written, and in a comparison what each square
    means."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLOURS[r], label=r) for r in ROLES if any(
        launch.arrays[n]["role"] == r for launch, *_ in stack for n in launch.names)]
    handles.append(Patch(facecolor=_pale(_rgb(COLOURS["input"])), label="pale: the rest of its block"))
    handles.append(plt.Line2D([], [], marker="x", color="black", linestyle="none", label="written"))
    if compare:
        handles += [Patch(facecolor="none", edgecolor=colour, linewidth=1.3, label=label) for colour, label in (
            (MISSED, "the spec (its block) reads, yours not"), (EXTRA, "yours (your block) reads, the spec not"))]
    fig.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, (base + 0.02) / height),
               fontsize=7.5, frameon=False, ncols=2)


def _tex(name: str) -> str:
    return name.replace("_", "\\_")


def _count_table(fig, height, stack, budget, compare, heads, base: float = 0.0) -> None:
    """Per-thread loads and stores: the chosen thread (the busiest of a warp or block) of each item, the busiest
    thread of its whole launch, and the budget the task states."""
    ax = fig.add_axes([0.1 / WIDTH, (base + 0.05) / height, 4.6 / WIDTH, (FOOT_IN - 0.15) / height])
    ax.axis("off")
    counts = [per_thread_counts(ln, sel) for ln, sel, *_ in stack]
    whole = None if compare or len(stack) > 1 else per_thread_counts(stack[0][0], np.ones(len(stack[0][0].rows),
                                                                                             bool))
    kinds = [k for k in KINDS if any(c[k] for c in counts) or (budget and k in budget)]
    head = ["per thread", *heads] + (["busiest"] if whole else []) + (["budget"] if budget else [])
    rows = []
    for kind in kinds:
        cells = [str(c[kind]) for c in counts] + ([str(whole[kind])] if whole else [])
        rows.append([kind, *cells] + ([str(budget.get(kind, ""))] if budget else []))
    warp_rows = [(i, warp_addresses(ln, sel)) for i, (ln, sel, *_) in enumerate(stack)]
    if any(v for _, v in warp_rows) and any(" warp " in f" {who} " for *_, who, _ in stack):
        cells = [str(v) for _, v in warp_rows] + ([""] if whole else [])
        rows.append(["const. addresses\nper warp load", *cells] + ([str(budget.get("warp", ""))] if budget
                                                                    else []))
    if not rows:
        return
    table = ax.table(cellText=rows, colLabels=head, loc="upper left", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    for (r, c), cell in table.get_celld().items():
        cell.set_linewidth(0.4)
        cell.set_height((0.3 if r and "\n" in rows[r - 1][0] else 0.19) / (FOOT_IN - 0.15))
        if r == 0:
            cell.set_text_props(fontweight="bold")
        if c == 0:
            cell.set_text_props(ha="left")
            cell.PAD = 0.04
    if budget:
        for r, kind in enumerate(kinds, start=1):
            limit = _number(budget.get(kind))
            for c, got in enumerate(counts, start=1):
                if limit is not None and got[kind] > limit:
                    table[r, c].set_facecolor("#f4cccc")
    table.auto_set_column_width(list(range(len(head))))


def _number(v) -> float | None:
    """The number a budget cell starts with ("100 (2·C·K²)" -> 100), or None."""
    import re

    found = re.match(r"\s*(\d+(\.\d+)?)", str(v)) if v is not None else None
    return float(found.group(1)) if found else None
