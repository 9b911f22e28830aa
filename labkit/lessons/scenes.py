"""Every GPU task's picture, declared once: what runs, on which small case, which launch and which threads are
drawn, and the task's per-thread budget. Two things read it:

- ``tools/draw_access_figures.py`` runs each scene on the kit's solution and commits the figure the task's spec cell
  shows (``notebooks/figures/NN_taskK.png``) with a JSON file beside it: a digest of the pattern (a test compares it
  with the solution's) and the spec's recording, the part the figure draws;
- ``lk.show.task(stage, name)``, the cell at the end of each task, runs the same scene on the student's own code and
  draws it above the spec's committed recording; a TODO stub gives one line.

Kinds of scene: ``conv`` (a conv layer function on a small case, ``labkit.access``; CUDA C through the CPU
emulation's recorder), ``kernel`` (one kernel launched on small arrays of its own: pad, normalize, unroll, the tiled
kernel, split-K), ``cpu`` (stage 02's ``prange`` loop nests, ``labkit.cpu_threads``) and ``timeline`` (what a
multi-launch task queues, ``labkit.timeline``: stage 03's managed wrapper, 04's classify, 10's graph and pipeline).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import access, chosen_threads, cpu_threads, timeline
from . import scene_cases as cases
from ..core.counts import _notebook_for
from ..course import nbcells, tasks
from ..launch import simulator
from ..launch.gpu import STUB_MARK

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Scene:
    """One figure of a task (``labkit.course.tasks``): its file is named by the task's stage and number ("05_task1";
    a second figure of the same task adds a ``suffix``, "04_task3b")."""

    of: tasks.Task
    caption: str  # what the figure shows, one sentence
    fn: object  # namespace (the solution's, or the notebook's) -> what runs
    kind: str = "conv"  # conv | kernel | cpu | timeline
    run: object = None  # kernel and timeline scenes: (what fn gave, the case) -> (call, sizes)
    case: dict = field(default_factory=dict)
    kernel: str | None = None
    element: tuple | None = None  # the thread that writes this output element (default: the middle one)
    block: object = None
    thread: object = None
    warp: int | None = None
    budget: dict = field(default_factory=dict)
    most_epochs: int = 6
    also: object = None  # a second function, drawn under the first (06: divergent under uniform)
    heads: tuple = ()
    shapes: dict = field(default_factory=dict)  # CUDA C: shared array -> shape, from the case
    dpi: int = 100
    suffix: str = ""

    @property
    def stage(self) -> str:
        return self.of.stage

    @property
    def task(self) -> int:
        """The task's number, as its spec's heading says it."""
        return self.of.number

    @property
    def task_name(self) -> str:
        """The task's name: lk.show.task(stage, task_name)."""
        return self.of.name

    @property
    def name(self) -> str:
        return f"{self.stage}_task{self.task}{self.suffix}"


def _case(**kw) -> dict:
    base = {"net": "cifar10", "layer": "conv2", "fuse": (), "channels": 2, "maps": 2, "size": None, "images": 1,
            "seed": 0}
    return {**base, **kw}


# ------------------------------------------------------------------------------------------------ the scenes

GLOBAL_1 = {"global load": "1", "global store": "1"}
_task = tasks.find
SCENES = [
    Scene(_task("02", "prange"), "prange over the images: thread t writes image t; over the maps (inside "
          "the serial image loop): thread t writes map t of every image", lambda s: (s.conv_prange_n, s.conv_prange_m),
          kind="cpu", case=_case(images=4, maps=4, size=(4, 4))),
    Scene(_task("02", "prange_reduction"), "only the reduction in parallel: the C·K·K products of one output "
          "element, out[0, 0, 3, 3], shared among the threads in equal runs", lambda s: (s.conv_prange_reduction,),
          kind="cpu", case=_case(size=(6, 6)), element=(0, 0, 3, 3)),
    Scene(_task("02", "gpu_mappings"), "one thread per output element: the thread of out[0, 0, 3, 3] reads "
          "its C·K·K window of x and map 0's weights, all from global memory, and writes one element; one block "
          "per map: its thread of out[0, 0, 3, 3] reads the same window", lambda s: s.conv_thread_per_output,
          case=_case(), element=(0, 0, 3, 3), also=lambda s: s.conv_block_per_map,
          heads=("thread per output", "block per map"), most_epochs=2,
          budget={"global load": "101 (2·C·K² + 1)", "global store": "1"}),
    Scene(_task("02", "tree"), "one block per output element: each thread sums a quarter of the C·K·K "
          "products, then the block adds its partial sums in shared memory, one level per barrier",
          lambda s: s.conv_reduction, case=_case(), element=(0, 0, 3, 3), most_epochs=5,
          budget={"global load": "27 (2·⌈C·K²/4⌉ + 1)"}),
    Scene(_task("03", "with_managed"), "one conv call through the managed wrapper: the host writes the "
          "inputs into managed buffers, the kernel runs on them, the host waits, then reads the output back",
          lambda s: s.with_managed(s.GPU_LAYERS["conv"], "conv"), kind="timeline", run=cases.managed, case=_case()),
    Scene(_task("04", "pad"), "pad once: each thread copies one element of x into the padded buffer, or "
          "writes a zero in the border", lambda s: s.pad_kernel, kind="kernel", run=cases.pad, case=_case(), thread=40,
          budget=GLOBAL_1),
    Scene(_task("04", "padded"), "no bounds tests: the thread of out[0, 0, 3, 3] reads its window of the "
          "padded buffer, every element inside it", lambda s: s.conv_padded, case=_case(),
          kernel="conv_padded_kernel", element=(0, 0, 3, 3),
          budget={"global load": "101 (2·C·K² + 1)", "global store": "1"}),
    Scene(_task("04", "classify"), "normalize on the device: each thread turns one byte into one input "
          "value", lambda s: s.normalize_kernel, kind="kernel", run=cases.normalize, case=_case(), thread=5,
          budget=GLOBAL_1),
    Scene(_task("04", "classify"), "classify one image at a time: per image, the bytes go up, normalize "
          "and every layer run on the device, the probabilities come back", lambda s: s, kind="timeline",
          run=cases.classify, case=_case(), suffix="b"),
    Scene(_task("05", "tiled_kernel"), "tile + halo: T = 8, 2×2 tiles on a 12×12 image; the block of the "
          "bottom-right tile loads its 12×12 patch of x (IN = T + K − 1: rows and columns 6..17, of which 6..11 are "
          "in the image) and the map's weights per channel, then after the barrier each thread reads its K×K window "
          "of the tile", lambda s: s.make_tiled_kernel, kind="kernel", run=cases.tiled,
          case=_case(size=(12, 12), maps=1), block=3, thread=(1, 2),
          budget={"global load": "9 (C·(⌈IN²/T²⌉ + 1) + 1)", "shared load": "100 (2·C·K²)", "global store": "1"}),
    Scene(_task("05", "tiled_launch"), "the launch: one block per (tile, map, image); the whole block of "
          "tile 1 (top right), with the patch of x it loads and the outputs it writes", lambda s: s.conv_tiled(8),
          case=_case(size=(12, 12), maps=1), block=1, most_epochs=3),
    Scene(_task("06", "const_kernel"), "uniform vs divergent constant reads: warp 0 of the uniform kernel "
          "(maps slowest) asks for one weight address per load, warp 0 of the divergent one (maps fastest) for one "
          "per map", lambda s: s.conv_const_uniform, case=_case(maps=4), kernel="conv_const_kernel", block=0, warp=0,
          also=lambda s: s.conv_const_divergent, heads=("uniform", "divergent"), most_epochs=2,
          budget={"global load": "51 (C·K² + 1)", "constant load": "50 (C·K²)", "warp": "1"}),
    Scene(_task("06", "const_c"), "the CUDA C kernel (on the CPU emulation): the thread of out[0, 0, 3, 3] "
          "reads its window of the padded input from global memory and the map's weights from the __constant__ "
          "array c_w", lambda s: s.conv_const_c, case=_case(), kernel="conv_const_c", element=(0, 0, 3, 3),
          budget={"global load": "51 (C·K² + 1)", "constant load": "50 (C·K²)", "global store": "1"}),
    Scene(_task("07", "unroll"), "unroll: each thread writes one element of the unrolled matrix (row "
          "(c, p, q), column (i, j)) from one element of x, or a zero in the padding", lambda s: s.unroll_kernel,
          kind="kernel", run=cases.unroll, case=_case(channels=1), block=4, thread=2, budget=GLOBAL_1),
    Scene(_task("07", "matmul"), "tiled product: per step the block loads a T×T tile of the weights and one "
          "of the unrolled matrix; thread (tx 3, ty 1) then reads row 1 of the one and column 3 of the other",
          lambda s: s.conv_unroll_tiled, case=_case(), kernel="matmul_kernel", block=0, thread=(3, 1), most_epochs=4,
          budget={"global load": "15 (2·⌈C·K²/T⌉ + 1)", "global store": "1"}),
    Scene(_task("08", "fused"), "implicit GEMM with the pool in the epilogue: the thread gathers its tile "
          "elements straight from x (no unrolled matrix), and the first thread of each 2×2 window writes the pooled "
          "output", lambda s: s.conv_fused, case=_case(fuse=("relu", "pool")), element=(0, 0, 1, 1), most_epochs=4),
    Scene(_task("08", "atomic"), "atomics: one thread per (output, input channel) reads that channel's "
          "window and weights and adds its sum into out with an atomic", lambda s: s.conv_atomic, case=_case(),
          kernel="conv_atomic_kernel", element=(0, 0, 3, 3),
          budget={"global load": "51 (2·K² + 1)", "global store": "1"}),
    Scene(_task("09", "pooled"), "one thread per pooled output: the thread of pooled output (0, 1, 1) reads "
          "its (K + POOL − 1)² window of every channel once and writes all M maps' pooled outputs",
          lambda s: s.conv_pooled, case=_case(fuse=("relu", "pool"), size=(8, 8)), element=(0, 1, 1, 1),
          budget={"global load": "74 (C·(K + POOL − 1)² + M)", "global store": "2 (M)",
                  "constant load": "400 (C·K²·POOL²·M)"}),
    Scene(_task("09", "pooled_c"), "the same kernel in CUDA C (on the CPU emulation): the thread of pooled "
          "output (0, 1, 1) reads its window once per channel and every map's weights from c_w",
          lambda s: s.conv_pooled_cuda(False), case=_case(fuse=("relu", "pool"), size=(8, 8)), element=(0, 1, 1, 1),
          budget={"global load": "74 (C·(K + POOL − 1)² + M)", "global store": "2 (M)",
                  "constant load": "400 (C·K²·POOL²·M)"}),
    Scene(_task("09", "tiles"), "register tiles (the CUDA C, on the CPU emulation): the block copies its "
          "maps' weights into shared memory laid out [c][p][q][m], then each thread loads a (TR + K − 1)×(TC + K − 1) "
          "window per channel once and reads every map's weight of each (c, p, q) side by side",
          lambda s: s.conv_tiles(), case=_case(fuse=("relu", "pool"), size=(8, 8)), kernel="conv_tiles",
          element=(0, 1, 1, 1), shapes={"ws": (50, 2)}, most_epochs=2,
          budget={"global load": "75 (C·(TR+K−1)(TC+K−1) + ⌈C·K²·M/TPB⌉ + M)", "global store": "2 (M)",
                  "shared load": "100 (C·K²·M)"}),
    Scene(_task("10", "splitk"), "split-K: block (0, 0, 1) adds up inputs 14..27 of its tile in two steps "
          "of T = 8 (the second ends inside the step); thread (tx 3, ty 1) reads row 1 of the x tile and row 3 of "
          "the w tile and writes its sum into plane 1 of the partial sums", lambda s: s.fc_splitk, kind="kernel",
          run=cases.splitk, case=_case(), kernel="fc_splitk_kernel", block=(0, 0, 1), thread=(3, 1), most_epochs=5,
          budget={"global load": "4 (2·⌈kchunk/T⌉)", "global store": "1"}),
    Scene(_task("10", "graph"), "the whole call as one CUDA graph: the weights go up, the capture records "
          "a forward pass and the copy back once, then each call replays it and waits for its stream",
          lambda s: s.graph_call, kind="timeline", run=cases.graph, case=_case()),
    Scene(_task("10", "streamed"), "host bytes to host classes over two streams: chunk i's upload, forward "
          "pass and download go to stream i % 2, then every stream is synchronized", lambda s: s.classify_streamed,
          kind="timeline", run=cases.streamed, case=_case()),
]
BY_NAME = {s.name: s for s in SCENES}


def of_task(stage: str, name: str) -> list[Scene]:
    """The scenes of one task (``labkit.tasks``' name), in order; none for a task with no GPU work of its own."""

    tasks.find(str(stage).zfill(2), name)  # an unknown task is refused in one line, naming the stage's tasks
    return [s for s in SCENES if s.stage == str(stage).zfill(2) and s.task_name == name]


# ------------------------------------------------------------------------------------------------ recording


class Names:
    """A notebook's namespace (a dict) seen as attributes, as ``lk.from_stage`` gives a solution's."""

    def __init__(self, names: dict):
        self.__dict__["_names"] = names

    def __getattr__(self, name):
        try:
            return self._names[name]
        except KeyError:
            raise NameError(f"name '{name}' is not defined: run the cells above first") from None


def record(scene: Scene, namespace) -> list[tuple[str, object]]:
    """The scene's recordings on ``namespace`` (a solution's or a notebook's): [(label, Recording | Timeline |
    Launch)]; access recordings need the simulator (``record_any`` goes to a child process on a GPU machine)."""
    ns = Names(namespace if isinstance(namespace, dict) else vars(namespace))
    fns = [scene.fn] + ([scene.also] if scene.also is not None else [])
    heads = scene.heads or ("",) * len(fns)
    if scene.kind == "timeline":
        return [("", timeline.record(scene.run(scene.fn(ns), scene.case), scene.name))]
    if scene.kind == "cpu":
        return [(getattr(fn, "py_func", fn).__name__, _cpu(fn, scene)) for fn in scene.fn(ns)]
    out = []
    for head, fn in zip(heads, fns):
        if scene.kind == "kernel":
            call, sizes, want = scene.run(fn(ns), scene.case)
            rec = access.record_call(call, sizes, getattr(fn(ns), "__name__", scene.name))
            rec.expected = np.asarray(want, np.float64).ravel().tolist()
        else:
            rec = access.record_here(fn(ns), cases.conv_case(scene.case), shapes=scene.shapes)
        out.append((head, rec))
    return out


def _cpu(fn, scene: Scene) -> access.Launch:
    c = cases.conv_case(scene.case)
    out = np.zeros(c.expected.shape, np.float32)
    arrays = {"x": c.x, "w": c.weights["conv2.weight"], "b": c.weights["conv2.bias"], "out": out}
    launch = cpu_threads.record(fn, arrays, (c.layer.pad, 1), {"w": "weights", "b": "bias"})
    rows, o = launch.rows, launch.names.index("out")
    if scene.element is None:  # what the figure draws: the writes of out, or the reads that went into one element
        keep = rows[(rows[:, 0] == o) & (rows[:, 9] == 1)]
    else:
        flat = int(np.ravel_multi_index(scene.element, out.shape))
        keep = cpu_threads.element_reads(launch, "out", flat).copy()
        keep[:, 8] = 0
        keep = np.vstack([keep, [[o, flat, 0, 0, 0, 0, 0, 0, 0, 1, 0]]])
    launch.rows = keep
    return launch


def record_any(scene: Scene, namespace: dict, stage: str) -> list[tuple[str, object]]:
    """``record`` here when it can (the simulator; a timeline or a prange nest anywhere), else in a child process
    under the simulator that loads the stage's notebook as last saved."""

    if simulator.active() or scene.kind in ("timeline", "cpu"):  # a timeline records on a GPU too; cpu: Python
        return record(scene, namespace)
    stub = _stub_in(namespace, (scene.kernel, tasks.find(stage, scene.task_name).function))
    if stub:  # the child would record the notebook as saved, or the kit's solution: never the solution as "yours"
        raise NotImplementedError(f"{stub}: {STUB_MARK}")
    job = {"notebook": str(_notebook_for(stage)), "scene": scene.name}
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "labkit.lessons.scenes"], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=600)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"recording under the simulator failed: {tail[0]}")
    got = json.loads(lines[-1])
    if "stub" in got:
        raise NotImplementedError(got["stub"])
    if "missing" in got:
        raise NameError(got["missing"])
    return [(label, _from_json(scene, d)) for label, d in got["items"]]


def _stub_in(namespace: dict, names) -> str | None:
    """The first of ``names`` whose function in ``namespace`` still raises the TODO stub's error (its code, or a
    function nested in it, holds ``STUB_MARK``)."""
    def holds(code) -> bool:
        return any(STUB_MARK in c if isinstance(c, str) else holds(c) if hasattr(c, "co_consts") else False
                   for c in code.co_consts)

    for name in filter(None, names):
        fn = namespace.get(name)
        code = getattr(getattr(fn, "py_func", fn), "__code__", None)
        if code is not None and holds(code):
            return name
    return None


def _to_json(scene: Scene, item) -> dict:
    if scene.kind == "timeline":
        return item.to_json()
    if scene.kind == "cpu":
        return item.to_json(packed=True)
    return item.to_json()


def _from_json(scene: Scene, d: dict):
    if scene.kind == "timeline":
        return timeline.Timeline.from_json(d)
    if scene.kind == "cpu":
        return access.Launch.from_json(d)
    return access.Recording.from_json(d)


def _main() -> int:
    """Child: load the notebook's kernel cells under the simulator, record the scene, print it as JSON."""

    job = json.loads(sys.stdin.read())
    scene = BY_NAME[job["scene"]]
    try:
        items = record(scene, nbcells.load(job["notebook"]))
    except NotImplementedError as exc:
        print(json.dumps({"stub": " ".join(str(exc).split())}))
        return 0
    except NameError as exc:
        print(json.dumps({"missing": str(exc)}))
        return 0
    print(json.dumps({"items": [(label, _to_json(scene, item)) for label, item in items]}))
    return 0


# ---------------------------------------------------------------------------- the spec's committed recording


def figures_folder() -> Path:
    """Where the task figures and their recordings are: ``figures/`` beside the notebook (Jupyter's working
    folder), else the kit's ``notebooks/figures``."""
    here = Path.cwd() / "figures"
    return here if here.is_dir() else REPO / "notebooks" / "figures"


def selection(scene: Scene, rec, launch) -> tuple:
    return access.selection(rec, launch, scene.element, scene.block, scene.thread, scene.warp)


def spec_json(scene: Scene, recordings) -> dict:
    """What ``lk.show.task`` draws of the spec: per item its launch's chosen block (access scenes), its launch
    (cpu) or its timeline."""
    items = []
    for label, item in recordings:
        if scene.kind in ("timeline", "cpu"):
            items.append({"label": label, "data": _to_json(scene, item)})
            continue
        launch = item.launch(scene.kernel)
        sel = selection(scene, item, launch)
    
        _, ctx, _ = chosen_threads.select(launch, *sel)
        rows = launch.rows[ctx]
        rows = rows[np.lexsort(rows[:, 7:1:-1].T)]  # by thread (stable: each thread's own order kept, which the
        # simulator's interleaving of threads is not)
        block = access.Launch(launch.kernel, launch.grid, launch.block, launch.arrays, rows)
        items.append({"label": label, "launch": block.to_json(packed=True), "selection": _plain(sel),
                      "case": item.case})
    return {"kind": scene.kind, "items": items}


def _plain(value):
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value if value is None else int(value) if isinstance(value, (int, np.integer)) else value


def load_spec(scene: Scene) -> list[tuple[str, object, tuple | None, dict]] | None:
    """The committed spec of ``scene``: [(label, Launch | Timeline, selection, case)], or None without its file."""
    path = figures_folder() / f"{scene.name}.json"
    if not path.is_file():
        return None
    spec = json.loads(path.read_text()).get("spec")
    if spec is None:
        return None
    out = []
    for item in spec["items"]:
        if scene.kind == "timeline":
            out.append((item["label"], timeline.Timeline.from_json(item["data"]), None, {}))
        elif scene.kind == "cpu":
            out.append((item["label"], access.Launch.from_json(item["data"]), None, {}))
        else:
            sel = tuple(tuple(v) if isinstance(v, list) else v for v in item["selection"])
            out.append((item["label"], access.Launch.from_json(item["launch"]), sel, item["case"]))
    return out


def digest(scene: Scene, recordings) -> dict:
    """What the figure shows, as data (a test compares it with the solution's pattern now), and the spec's
    recording (``spec_json``)."""

    d = {"figure": f"{scene.name}.png", "stage": scene.stage, "task": scene.task, "case": scene.case,
         "launches": []}
    for label, item in recordings:
        if scene.kind == "timeline":
            d["launches"].append({"label": label, "events": [[e.lane, e.kind, e.name, e.phase]
                                                             for e in item.events]})
            continue
        launch = item if scene.kind == "cpu" else item.launch(scene.kernel)
        rows = launch.rows[np.lexsort(launch.rows.T[::-1])]
        entry = {"label": label, "kernel": launch.kernel, "grid": list(launch.grid), "block": list(launch.block),
                 "arrays": launch.arrays, "accesses": int(len(rows)),
                 "sha256": hashlib.sha256(rows.astype(np.int64).tobytes()).hexdigest()}
        if scene.kind != "cpu":
            mask, _, who = chosen_threads.select(launch, *selection(scene, item, launch))
            chosen = {}
            for r in launch.rows[mask]:
                chosen.setdefault(f"epoch {r[8]} {'writes' if r[9] else 'reads'} {launch.names[r[0]]}",
                                  set()).add(int(r[1]))
            entry.update(chosen=who, chosen_counts=chosen_threads.per_thread_counts(launch, mask),
                         chosen_elements={k: sorted(v) for k, v in sorted(chosen.items())})
        d["launches"].append(entry)
    d["spec"] = spec_json(scene, recordings)
    return d


if __name__ == "__main__":
    sys.exit(_main())
