"""What a piece of host code queues, in order: launches, copies, synchronizations and host touches of managed
memory, on which stream. ``lk.show`` draws it for the tasks that are more than one kernel (stage 03's managed
wrapper, stage 04's classify, stage 10's graph and pipeline): the student's code above the kit's solution.

``record(call)`` runs ``call()`` with ``labkit.gpu``'s recorder on (every launch and copy made through ``lk.gpu``),
and with ``Lane.synchronize``, ``lk.gpu.synchronize``, ``numba.cuda.synchronize``, ``lk.graphs.capture``,
``Graph.replay`` and the managed buffer pool watched for the length of the call: every event gets the stream it was
queued on (the host, the default stream or a lane) and the phase it belongs to (a graph's capture or replay). It
records in this process, on the simulator as on a GPU: the order of what the host queued is the same on both; no
duration is measured, so the drawing places events left to right in the order they were queued, a run of
neighbouring events of one kind on one stream as one box (``layout``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core import graphs
from ..launch import gpu, streams

KINDS = ("kernel", "HtoD", "DtoH", "sync", "host write", "host read", "graph")
COLOURS = {"kernel": "#ff7f0e", "HtoD": "#1f77b4", "DtoH": "#9467bd", "sync": "#333333", "host write": "#7f7f7f",
           "host read": "#bcbd22", "graph": "#e377c2"}
HOST, DEFAULT = "host", "default stream"
#: what a timeline figure's note says about its x axis
ORDER = ("Left to right in the order the code queued them; neighbouring work of one kind on one stream is one box. "
         "No duration is drawn: boxes in different rows may run at the same time on a GPU.")


@dataclass
class Event:
    lane: str  # HOST, DEFAULT or "stream 1", "stream 2" ... in order of first use
    kind: str  # one of KINDS
    name: str
    nbytes: int = 0
    phase: str = ""  # "capture", "replay" or ""


@dataclass
class Timeline:
    name: str
    events: list[Event] = field(default_factory=list)
    raised: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "events": [asdict(e) for e in self.events], "raised": self.raised}

    @classmethod
    def from_json(cls, d: dict) -> Timeline:
        return cls(d["name"], [Event(**e) for e in d["events"]], d.get("raised", ""))

    def counts(self) -> dict[str, int]:
        out = {k: sum(1 for e in self.events if e.kind == k) for k in KINDS}
        out["bytes in"] = sum(e.nbytes for e in self.events if e.kind in ("HtoD", "host write"))
        out["bytes out"] = sum(e.nbytes for e in self.events if e.kind in ("DtoH", "host read"))
        return out

    def lanes(self) -> list[str]:
        host = any(e.lane == HOST or e.kind == "sync" for e in self.events) or not self.events
        seen = [HOST] * host + [e.lane for e in self.events if e.lane != HOST]
        return list(dict.fromkeys(seen))

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{c['kernel']} launch{'es' * (c['kernel'] != 1)}"]
        if c["HtoD"] or c["DtoH"]:
            parts.append(f"{c['HtoD']} copies in ({_size(c['bytes in'])}), {c['DtoH']} out")
        if c["host write"] or c["host read"]:
            parts.append(f"{c['host write']} host writes, {c['host read']} host reads of managed memory")
        if c["graph"]:
            parts.append(f"{c['graph']} graph replay{'s' * (c['graph'] != 1)}")
        parts.append(f"{c['sync']} synchronization{'s' * (c['sync'] != 1)}")
        streams = {e.lane for e in self.events if e.lane.startswith("stream") and e.kind != "sync"}  # with work
        if streams:
            parts.append(f"on {len(streams)} stream{'s' * (len(streams) != 1)}")
        return ", ".join(parts)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB" if n >= 1e3 else f"{n} B"


class Watched(np.ndarray):
    """A host array whose writes on the host are events (a managed buffer, or the caller's output)."""

    def __setitem__(self, idx, value):
        rec = getattr(self, "_lk_rec", None)
        if rec is not None:
            rec.host(self._lk_kind, self._lk_label, self.nbytes)
        super().__setitem__(idx, value)


def watched(array: np.ndarray, rec: _Recorder, kind: str, label: str) -> Watched:
    w = array.view(Watched)
    w._lk_rec, w._lk_kind, w._lk_label = rec, kind, label
    return w


class _Recorder:
    """``labkit.gpu``'s recorder interface (``activity``), plus the events of the watched calls."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.names: dict[int, str] = {}  # id(lane) -> "stream k"
        self.phase = ""
        self.busy = False  # inside a launch or copy: the simulator's own copies of host arrays are no host touch

    def lane_name(self, lane) -> str:
        if lane is None:
            return DEFAULT
        return self.names.setdefault(id(lane), f"stream {len(self.names) + 1}")

    def add(self, lane: str, kind: str, name: str, nbytes: int = 0) -> None:
        self.timeline.events.append(Event(lane, kind, name, int(nbytes), self.phase))

    @contextmanager
    def activity(self, name: str, kind: str, nbytes: int = 0, **_):
        label = name.replace("[CUDA memcpy HtoD]", "").replace("[CUDA memcpy DtoH]", "").strip()
        self.add(self.lane_name(streams.current()), kind, label or kind, nbytes)
        self.busy = True
        try:
            yield
        finally:
            self.busy = False

    def host(self, kind: str, label: str, nbytes: int) -> None:
        if not self.busy:
            self.add(HOST, kind, label, nbytes)


@contextmanager
def _patched(owner, name: str, make):
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _patches(rec: _Recorder) -> list[tuple[object, str, object]]:
    """(object, attribute, wrapper maker) for everything ``record`` watches: lanes' and the device's
    synchronizations, graph capture and replay, managed buffers' host writes."""
    from numba import cuda

    def lane_sync(original):
        def synchronize(lane):
            rec.add(rec.lane_name(lane), "sync", "synchronize")
            return original(lane)
        return synchronize

    def device_sync(label):
        def make(original):
            def synchronize(*args, **kwargs):
                rec.add(HOST, "sync", label)
                return original(*args, **kwargs)
            return synchronize
        return make

    def phase(name, original, before_call=None):
        def wrapped(*args):
            before, rec.phase = rec.phase, name
            try:
                if before_call is not None:
                    before_call(*args)
                return original(*args)
            finally:
                rec.phase = before
        return wrapped

    def launched(graph):
        if graph.captured:
            rec.add(rec.lane_name(graph.lane), "graph", "graph launch")

    def managed(original):
        def get(role, shape, dtype=np.float32):
            array = original(role, shape, dtype)
            return watched(array, rec, "host write", role) if type(array) is np.ndarray else array
        return get

    return [(streams.Lane, "synchronize", lane_sync),
            (gpu, "synchronize", device_sync("lk.gpu.synchronize()")),
            (cuda, "synchronize", device_sync("cuda.synchronize()")),
            (graphs, "capture", lambda original: phase("capture", original)),
            (graphs.Graph, "replay", lambda original: phase("replay", original, launched)),
            (gpu.MANAGED, "get", managed)]


def record(call, name: str = "", *, watch_out: tuple[np.ndarray, str] | None = None) -> Timeline:
    """Run ``call()`` and return what it queued. A raise inside is kept as ``raised`` (what ran before it is still
    drawn); NotImplementedError (a TODO stub) and NameError (a name not defined yet) are raised again."""
    timeline = Timeline(name)
    rec = _Recorder(timeline)
    with ExitStack() as stack:
        stack.enter_context(gpu.recording(rec))
        for obj, attr, make in _patches(rec):
            stack.enter_context(_patched(obj, attr, make))
        try:
            call(rec)
        except (NotImplementedError, NameError):
            raise
        except Exception as exc:  # noqa: BLE001 - what ran before the raise is still worth drawing
            timeline.raised = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
    return timeline


# ------------------------------------------------------------------------------------------------ drawing


@dataclass
class Box:
    """A run of events of one kind on one lane in one phase, drawn as one box (a sync: one marker)."""

    x: float
    width: float
    first: Event
    count: int = 1
    nbytes: int = 0
    names: list = field(default_factory=list)


def layout(events: list[Event]) -> list[Box]:
    """Runs of neighbouring events of one kind on one lane and phase merged into one box, laid out left to right in
    the order they were queued: a box one unit wide (a merged run 1.6), a sync half a unit."""
    boxes: list[Box] = []
    for e in events:
        last = boxes[-1] if boxes else None
        if last and e.kind != "sync" and (last.first.kind, last.first.lane, last.first.phase) == (e.kind, e.lane,
                                                                                                    e.phase):
            last.count += 1
            last.nbytes += e.nbytes
            last.names.append(e.name)
            last.width = 1.6
            continue
        x = last.x + last.width + 0.15 if last else 0.0
        boxes.append(Box(x, 0.5 if e.kind == "sync" else 1.0, e, 1, e.nbytes, [e.name]))
    return boxes


def _label(box: Box) -> str:
    import textwrap

    e, n = box.first, box.count
    if e.kind == "kernel":
        return "\n".join(textwrap.wrap(e.name.replace("_", "_ "), 13)).replace("_ ", "_") if n == 1 \
            else f"{n} kernels"
    if e.kind in ("HtoD", "DtoH"):
        return f"{e.kind}\n{_size(box.nbytes)}" + (f"\n×{n}" if n > 1 else "")
    if e.kind in ("host write", "host read"):
        what = ", ".join(box.names) if n <= 3 else f"{n} arrays"
        return f"{e.kind}\n{what}\n{_size(box.nbytes)}"
    return e.name


def _draw(ax, timeline: Timeline, title: str, lanes: list[str], width: float) -> None:
    from matplotlib.patches import Rectangle

    row = {name: k for k, name in enumerate(lanes)}
    boxes = layout(timeline.events)
    for phase, colour in (("capture", "#fde0ef"), ("replay", "#e5f5e0")):
        spans = [b for b in boxes if b.first.phase == phase]
        if spans:
            x0, x1 = spans[0].x - 0.07, spans[-1].x + spans[-1].width + 0.07
            ax.axvspan(x0, x1, color=colour, zorder=0)
            ax.text((x0 + x1) / 2, -0.62, f"graph {phase}", ha="center", va="bottom", fontsize=7.5, color="#555555")
    for box in boxes:
        e, y = box.first, row[box.first.lane]
        if e.kind == "sync":
            mid = box.x + box.width / 2
            ax.plot([mid, mid], [0, len(lanes) - 1 if e.lane == HOST else y], color=COLOURS["sync"], linewidth=1.2,
                    zorder=3)
            ax.plot([mid], [y], marker="D", color=COLOURS["sync"], markersize=5, zorder=3)
            ax.text(mid, -0.42, "wait", ha="center", va="bottom", fontsize=6.5)
            continue
        ax.add_patch(Rectangle((box.x, y - 0.36), box.width, 0.72, facecolor=COLOURS[e.kind], edgecolor="black",
                               linewidth=0.4, zorder=2))
        ax.text(box.x + box.width / 2, y, _label(box), ha="center", va="center", fontsize=7, zorder=4,
                color="white" if e.kind in ("kernel", "HtoD", "DtoH", "graph") else "black", clip_on=True,
                linespacing=1.0)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.75)
    ax.set_xlim(-0.15, max(width, 1.0) + 0.15)
    ax.set_xticks([])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=8.5, loc="left")


def figure(items: list[tuple[str, Timeline]], *, title: str = "", note: str = ""):
    """Timelines one above the other (``items``: (label, Timeline)), on one scale: yours above the spec."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ends = [(lambda b: b[-1].x + b[-1].width if b else 1.0)(layout(t.events)) for _, t in items]
    width = max(ends, default=1.0)
    fig_w = min(16.0, max(9.0, 0.62 * width + 1.6))
    title = "\n".join(textwrap.wrap(" ".join(title.split()), int(fig_w * 13)))
    heights = [0.6 * len(t.lanes()) + 0.8 for _, t in items]
    fig = plt.figure(figsize=(fig_w, sum(heights) + 1.0 + 0.17 * title.count("\n") + (0.45 if note else 0)))
    h = fig.get_figheight()
    grid = fig.add_gridspec(len(items), 1, height_ratios=heights, hspace=0.7, left=1.2 / fig_w, right=0.99,
                            top=1 - (0.6 + 0.17 * title.count("\n")) / h, bottom=(0.5 + (0.45 if note else 0)) / h)
    for k, (label, t) in enumerate(items):
        words = f"{label}: {t.summary()}" + (f"   (raised {t.raised})" if t.raised else "")
        _draw(fig.add_subplot(grid[k]), t, words, t.lanes(), width)
    used = {e.kind for _, t in items for e in t.events}
    handles = [Patch(facecolor=COLOURS[k], label=k) for k in KINDS if k in used and k != "sync"]
    if "sync" in used:
        handles.append(plt.Line2D([], [], marker="D", color=COLOURS["sync"], label="synchronize: the host waits"))
    fig.legend(handles=handles, loc="lower right", ncols=len(handles) or 1, fontsize=7.5, frameon=False,
               bbox_to_anchor=(1.0, (0.4 if note else 0.0) / h))
    fig.text(0.1 / fig_w, 1 - 0.1 / h, title, fontsize=9.5, va="top")
    if note:
        fig.text(0.1 / fig_w, 0.05 / h, "\n".join(textwrap.wrap(note, int(fig_w * 17))), fontsize=7.5, va="bottom")
    return fig
