"""Draw one access figure per GPU task of stages 02 to 09 from the kit's solution kernels (``labkit.show``), with a
digest of each figure's access pattern beside it, so a test can tell when a solution's pattern changes without its
figure. The figures show which elements threads read and write, never code.

    python tools/draw_access_figures.py                # draw every figure into notebooks/figures/ (PNG + JSON)
    python tools/draw_access_figures.py 05_task1       # only the named figures
    python tools/draw_access_figures.py --list         # the figures, per notebook
    python tools/draw_access_figures.py --check        # exit 1 when a solution's pattern differs from a digest
    python tools/draw_access_figures.py --insert       # put each figure's reference into its task's spec cell in
                                                       # solutions/ (idempotent); then run tools/make_student.py
    python tools/draw_access_figures.py --docs         # the pictures docs/ shows, into docs/img/: three task figures
                                                       # (redrawn) and two "yours vs the spec" pictures of wrong
                                                       # kernels, made through the self-check's FAIL hint

Tasks without a figure: CPU code (02 tasks 1-2), no kernel of their own (03's wrapper, 04 task 3's job, 05 and 07
task 3's predictions, 09 task 4's search space), and CUDA C that only a GPU runs (06 task 2 and 09 task 2 have the
access pattern of the numba kernel before them). 09 task 3's register tiles are CUDA C too: its figure is drawn from a
numba model of the kernel below (``tiles_model``), and the digest keeps a hash of the CUDA C source it models
(TILES_SOURCE), so the check fails when that source changes and the model has not been looked at again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # the recordings need the simulator, on any machine
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FIGURES = REPO / "notebooks" / "figures"
DOCS_IMG = REPO / "docs" / "img"


@dataclass
class Scene:
    """One task's figure: which function of the stage's solution, on which small case, which launch and threads."""

    name: str  # "05_task1": the file name and the task it belongs to
    stage: str
    task: int
    caption: str  # what the figure shows, one sentence
    fn: object  # namespace of the stage's solution -> layer function
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
    model_of: str = ""  # the CUDA C source a numba model stands for (its solution block's hash goes in the digest)
    dpi: int = 100


def _case(**kw) -> dict:
    base = {"net": "cifar10", "layer": "conv2", "fuse": (), "channels": 2, "maps": 2, "size": None, "images": 1,
            "seed": 0}
    return {**base, **kw}


SCENES = [
    Scene("02_task3", "02", 3, "one thread per output element: the thread of out[0, 0, 3, 3] reads its C·K·K window "
          "of x and map 0's weights, all from global memory, and writes one element",
          lambda s: s.conv_thread_per_output, _case(), element=(0, 0, 3, 3),
          budget={"global load": "101 (2·C·K² + 1)", "global store": "1"}),
    Scene("02_task4", "02", 4, "one block per output element: each thread sums a quarter of the C·K·K products, then "
          "the block adds its partial sums in shared memory, one level per barrier",
          lambda s: s.conv_reduction, _case(), element=(0, 0, 3, 3), most_epochs=5,
          budget={"global load": "27 (2·⌈C·K²/4⌉ + 1)"}),
    Scene("04_task1", "04", 1, "pad once: each thread copies one element of x into the padded buffer, or writes a "
          "zero in the border", lambda s: s.conv_padded, _case(), kernel="pad_kernel", thread=40,
          budget={"global load": "1", "global store": "1"}),
    Scene("04_task2", "04", 2, "no bounds tests: the thread of out[0, 0, 3, 3] reads its window of the padded "
          "buffer, every element inside it", lambda s: s.conv_padded, _case(), kernel="conv_padded_kernel",
          element=(0, 0, 3, 3), budget={"global load": "101 (2·C·K² + 1)", "global store": "1"}),
    Scene("05_task1", "05", 1, "tile + halo: T = 8, 2×2 tiles on a 12×12 image; the block of the bottom-right tile "
          "loads its 12×12 patch of x (IN = T + K − 1: rows and columns 6..17, of which 6..11 are in the image) and "
          "the map's weights per channel, then after the barrier each thread reads its K×K window of the tile",
          lambda s: s.conv_tiled(8), _case(size=(12, 12), maps=1), block=3, thread=(1, 2),
          budget={"global load": "9 (C·(⌈IN²/T²⌉ + 1) + 1)", "shared load": "100 (2·C·K²)",
                  "global store": "1"}),
    Scene("05_task2", "05", 2, "the launch: one block per (tile, map, image); the whole block of tile 1 (top right), "
          "with the patch of x it loads and the outputs it writes", lambda s: s.conv_tiled(8),
          _case(size=(12, 12), maps=1), block=1, most_epochs=3),
    Scene("06_task1", "06", 1, "uniform vs divergent constant reads: warp 0 of the uniform kernel (maps slowest) "
          "asks for one weight address per load, warp 0 of the divergent one (maps fastest) for one per map",
          lambda s: s.conv_const_uniform, _case(maps=4), kernel="conv_const_kernel", block=0, warp=0,
          also=lambda s: s.conv_const_divergent, heads=("uniform", "divergent"),
          budget={"global load": "51 (C·K² + 1)", "constant load": "50 (C·K²)", "warp": "1"}),
    Scene("07_task1", "07", 1, "unroll: each thread writes one element of the unrolled matrix (row (c, p, q), column "
          "(i, j)) from one element of x, or a zero in the padding", lambda s: s.conv_unroll_tiled, _case(channels=1),
          kernel="unroll_kernel", block=4, thread=2, budget={"global load": "1", "global store": "1"}),
    Scene("07_task2", "07", 2, "tiled product: per step the block loads a T×T tile of the weights and one of the "
          "unrolled matrix; thread (tx 3, ty 1) then reads row 1 of the one and column 3 of the other",
          lambda s: s.conv_unroll_tiled, _case(), kernel="matmul_kernel", block=0, thread=(3, 1), most_epochs=4,
          budget={"global load": "15 (2·⌈C·K²/T⌉ + 1)", "global store": "1"}),
    Scene("08_task1", "08", 1, "implicit GEMM with the pool in the epilogue: the thread gathers its tile elements "
          "straight from x (no unrolled matrix), and the first thread of each 2×2 window writes the pooled output",
          lambda s: s.conv_fused, _case(fuse=("relu", "pool")), element=(0, 0, 1, 1), most_epochs=4),
    Scene("08_task2", "08", 2, "atomics: one thread per (output, input channel) reads that channel's window and "
          "weights and adds its sum into out with an atomic", lambda s: s.conv_atomic, _case(),
          kernel="conv_atomic_kernel", element=(0, 0, 3, 3),
          budget={"global load": "51 (2·K² + 1)", "global store": "1"}),
    Scene("09_task1", "09", 1, "one thread per pooled output: the thread of pooled output (0, 1, 1) reads its "
          "(K + POOL − 1)² window of every channel once and writes all M maps' pooled outputs",
          lambda s: s.conv_pooled, _case(fuse=("relu", "pool"), size=(8, 8)), element=(0, 1, 1, 1),
          budget={"global load": "74 (C·(K + POOL − 1)² + M)", "global store": "2 (M)",
                  "constant load": "400 (C·K²·POOL²·M)"}),
    Scene("09_task3", "09", 3, "register tiles (a numba model of the CUDA C): the block copies its maps' weights "
          "into shared memory laid out [c][p][q][m], then each thread loads a (TR + K − 1)×(TC + K − 1) window "
          "per channel once and reads every map's weight of each (c, p, q) side by side",
          lambda s: tiles_model, _case(fuse=("relu", "pool"), size=(8, 8)), element=(0, 1, 1, 1),
          model_of="TILES_SOURCE", budget={"global load": "78 (C·(TR+K−1)(TC+K−1) + ⌈C·K²·M/TPB⌉ + M)",
                                           "global store": "2 (M)", "shared load": "100 (C·K²·M)"}),
]
DOCS_FIGURES = {"05_task1": "show-05-tile-halo.png", "06_task1": "show-06-uniform-divergent.png",
                "09_task3": "show-09-register-window.png"}


# ---------------------------------------------------------------------------- 09 task 3's model in numba


def tiles_model(x, w, b, out, pad, stride, act=0, pool=0):
    """The register-tile kernel of notebook 09 task 3 (CUDA C, WSHARED=1, PREFETCH=0, pooled layers: TR = TC = 2,
    one block holds all M maps), written in numba so the simulator can record its accesses. Local arrays stand for
    the registers; a ``wvec`` load of VEC maps is VEC loads here."""
    global cuda, float32
    import math

    from numba import cuda, float32

    import labkit as lk

    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    assert pool == 2 and stride == 1, "the model draws pooled layers"
    WR = WC = 2 + K - 1
    TR = TC = 2
    HO, WO = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    TROWS, TCOLS = HO // 2, WO // 2
    key = (M, C, K, H, W, pad, act)
    if key not in _MODELS:
        CKK = C * K * K

        @cuda.jit
        def conv_tiles(x, w, b, out, N):
            ws = cuda.shared.array((C * K, K * M), float32)  # [c][p][q][m]: row (c, p), column (q, m)
            v = cuda.local.array((WR, WC), float32)
            acc = cuda.local.array((M, TR, TC), float32)
            for i in range(cuda.threadIdx.x, CKK * M, cuda.blockDim.x):
                k = i // M  # (c, p, q) of element i of the [c][p][q][m] layout
                ws[i // (K * M), i % (K * M)] = w[i % M, k // (K * K), (k // K) % K, k % K]
            cuda.syncthreads()
            t = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            if t < N * TROWS * TCOLS:
                tc, tr, n = t % TCOLS, (t // TCOLS) % TROWS, t // (TCOLS * TROWS)
                r0, c0 = tr * TR - pad, tc * TC - pad
                for m in range(M):
                    for i in range(TR):
                        for j in range(TC):
                            acc[m, i, j] = 0.0
                for c in range(C):
                    for p in range(WR):
                        for q in range(WC):
                            r, s = r0 + p, c0 + q
                            v[p, q] = x[n, c, r, s] if 0 <= r < H and 0 <= s < W else 0.0
                    for p in range(K):
                        for q in range(K):
                            for m in range(M):
                                wv = ws[c * K + p, q * M + m]
                                for i in range(TR):
                                    for j in range(TC):
                                        acc[m, i, j] += v[i + p, j + q] * wv
                for m in range(M):
                    best = max(max(acc[m, 0, 0], acc[m, 0, 1]), max(acc[m, 1, 0], acc[m, 1, 1])) + b[m]
                    if act == 1:
                        best = max(best, 0.0)
                    elif act == 2:
                        best = math.tanh(best)
                    out[n, m, tr, tc] = best

        _MODELS[key] = conv_tiles
    lk.gpu.launch(_MODELS[key], N * TROWS * TCOLS, x, w, b, out, N, block=32)  # one warp: a small launch


_MODELS: dict = {}
cuda = float32 = None  # numba's, imported by tiles_model: the simulator swaps a kernel's global ``cuda`` for its own


def solution_block_hash(stage: str, variable: str) -> str:
    """sha256 of the CUDA C string ``variable`` (``NAME = r\"\"\"...\"\"\"``) in a stage's solution (its source,
    NN_topic.py): any change to the source a model stands for shows in the digest."""
    from labkit import nbcells
    from labkit.stages import solution

    nb = nbcells.read(solution(stage))
    for cell in nb.cells:
        found = re.search(rf'^{variable}\s*=\s*r?"""(.*?)"""', cell.source, re.M | re.S) if cell.cell_type == "code" \
            else None
        if found:
            return hashlib.sha256(found.group(1).encode()).hexdigest()
    raise SystemExit(f"no {variable} = r\"\"\"...\"\"\" in stage {stage}'s solution: update tools/draw_access_figures.py")


# ------------------------------------------------------------------------------------ record, digest, draw


def record(scene: Scene):
    """The scene's recording(s): [(label, Recording)]."""
    import labkit as lk
    from labkit import access

    sol = lk.from_stage(scene.stage)
    case = {**scene.case, "fuse": tuple(scene.case["fuse"])}
    out = [(scene.heads[0] if scene.heads else "", access.record_here(scene.fn(sol), access.small_case(**case)))]
    if scene.also is not None:
        out.append((scene.heads[1], access.record_here(scene.also(sol), access.small_case(**case))))
    return out


def selection(scene: Scene, rec, launch) -> tuple:
    from labkit import access

    return access.selection(rec, launch, scene.element, scene.block, scene.thread, scene.warp)


def digest(scene: Scene, recordings) -> dict:
    """What the figure shows, as data: per launch drawn, its arrays, a hash of every access (sorted: the simulator's
    thread order varies), and what the chosen threads read and wrote per epoch."""
    import numpy as np

    from labkit import draw

    d = {"figure": f"{scene.name}.png", "stage": scene.stage, "task": scene.task, "case": scene.case, "launches": []}
    for label, rec in recordings:
        launch = rec.launch(scene.kernel)
        sel = selection(scene, rec, launch)
        mask, _, who = draw.select(launch, *sel)
        rows = launch.rows[np.lexsort(launch.rows.T[::-1])]
        chosen = {}
        for r in launch.rows[mask]:
            op = "writes" if r[9] else "reads"
            key = f"epoch {r[8]} {op} {launch.names[r[0]]}"
            chosen.setdefault(key, set()).add(int(r[1]))
        d["launches"].append({
            "label": label, "kernel": launch.kernel, "grid": list(launch.grid), "block": list(launch.block),
            "arrays": launch.arrays, "accesses": int(len(rows)),
            "sha256": hashlib.sha256(rows.astype(np.int64).tobytes()).hexdigest(), "chosen": who,
            "chosen_counts": draw.per_thread_counts(launch, mask),
            "chosen_elements": {k: sorted(v) for k, v in sorted(chosen.items())}})
    if scene.model_of:
        d["models_cuda_c"] = {"variable": scene.model_of, "sha256": solution_block_hash(scene.stage, scene.model_of)}
    return d


def draw_scene(scene: Scene, recordings):
    from labkit import draw

    title = f"{scene.stage} task {scene.task}: {scene.caption}"
    items = []
    for label, rec in recordings:
        launch = rec.launch(scene.kernel)
        items.append((launch, selection(scene, rec, launch), label))
    c = recordings[0][1].case
    source = "a numba model of the kit's CUDA C solution" if scene.model_of else "the kit's solution"
    case = (f"drawn from {source} on one {c['C']}-channel {c['H']}×{c['W']} image, {c['M']} map"
            f"{'s' * (c['M'] != 1)} of "
            f"{c['K']}×{c['K']}, pad {c['pad']}" + (f", pool {c['pool']}" if c.get("pool") else "") +
            " (a small launch on the simulator)")
    return draw.stacked_figure(items, title=_wrap(title, 118), budget=scene.budget, most_epochs=scene.most_epochs,
                               note=case, heads=scene.heads or None)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def write(scene: Scene, folder: Path = FIGURES) -> float:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = time.perf_counter()
    recordings = record(scene)
    fig = draw_scene(scene, recordings)
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / f"{scene.name}.png", dpi=scene.dpi)
    plt.close(fig)
    (folder / f"{scene.name}.json").write_text(json.dumps(digest(scene, recordings), indent=1) + "\n")
    return time.perf_counter() - start


# -------------------------------------------------------------------------------------- --insert


def reference_line(scene: Scene) -> str:
    """The markdown of a figure in its spec cell (its caption is the figure's own title)."""
    alt = f"Task {scene.task}: what the threads read and write, drawn from the kit's solution"
    return f"![{alt}](figures/{scene.name}.png)"


def insert(solutions: Path | None = None) -> list[str]:
    """Put each figure's reference at the end of its task's spec cell (the markdown cell with the task's
    ``## Task N`` heading) of the solution notebook; a reference already there is replaced, so running it twice
    changes nothing. The notebook's source (NN_topic.py) is written again from it (``jupytext --to py:percent``), so
    the two stay in step; a pair out of step before is refused. Returns the notebooks changed."""
    import subprocess

    import nbformat

    from labkit import nbcells
    from labkit.stages import STAGES, solutions_folder

    solutions = solutions or solutions_folder()
    changed = []
    for stage in sorted({s.stage for s in SCENES}):
        path = solutions / STAGES[stage].notebook
        paired = nbcells.source_of(path).is_file()
        why = nbcells.out_of_step(path) if paired else ""
        if why:
            raise SystemExit(f"{why}: run `jupytext --sync {nbcells.source_of(path)}` first")
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        for scene in (s for s in SCENES if s.stage == stage):
            heading = re.compile(rf"^##+ Task {scene.task}\b", re.M)
            cells = [c for c in nb.cells if c.cell_type == "markdown" and heading.search(c.source)]
            if len(cells) != 1:
                raise SystemExit(f"{path.name}: {len(cells)} markdown cells have a '## Task {scene.task}' heading "
                                 f"(need exactly one for {scene.name}); fix the notebook or the scene")
            cell = cells[0]
            ref = re.compile(rf"^!\[[^\n]*\]\(figures/{re.escape(scene.name)}\.png\)$", re.M)
            if ref.search(cell.source):
                cell.source = ref.sub(lambda _: reference_line(scene), cell.source)
            else:
                cell.source = cell.source.rstrip("\n") + "\n\n" + reference_line(scene)
        if nbformat.writes(nb) != before:
            nbformat.write(nb, path)
            if paired:  # solutions/jupytext.toml says how
                subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--to", "py:percent", str(path)],
                               check=True)
            changed.append(path.name)
    return changed


# ---------------------------------------------------------------------------------------- --docs


WRONG = {  # a student's likely slip in a solution kernel: (stage, text in the solution, the slip, layer, fuse)
    "05": ("r, q = row0 + e // IN - pad, col0 + e % IN - pad", "r, q = row0 + e // IN - pad + 1, col0 + e % IN - pad",
           "tiled_8", "show-05-yours-vs-spec-halo.png"),
    "08": ("r, s = i * stride + p - pad, j * stride + q - pad", "r, s = i * stride + p - pad, j * stride + p - pad",
           "implicit_gemm", "show-08-yours-vs-spec-gather.png"),
}


HINT = re.compile(r"lk\.show\.failure\(VARIANTS\[[^\]]+\], '[^']+', '[^']+'\)")


def wrong_namespace(stage: str) -> dict:
    """The solution's kernel cells (from its source) with one slip (``WRONG``), loaded as a student's notebook
    would be."""
    import labkit as lk
    from labkit import nbcells
    from labkit.stages import STAGES, solution

    right, slip, _, _ = WRONG[stage]
    nb = nbcells.read(solution(stage))
    ns = {"__name__": f"wrong_{stage}"}
    found = False
    for index, src in nbcells.tagged_cells(nb):
        found = found or right in src
        src = src.replace(right, slip)
        filename = f"<{STAGES[stage].notebook} cell {index}, with a slip>"
        import linecache

        linecache.cache[filename] = (len(src), None, [ln + "\n" for ln in src.splitlines()], filename)
        exec(compile(src, filename, "exec"), ns)  # noqa: S102 - the kit's own cells
    if not found:
        raise SystemExit(f"stage {stage}'s solution no longer has {right!r}: update WRONG in "
                         f"tools/draw_access_figures.py")
    assert lk  # the cells import labkit themselves
    return ns


def failure_picture(stage: str, folder: Path = DOCS_IMG) -> Path:
    """Check the wrong variant as a student's check cell does, then draw what its FAIL line says to draw."""
    import contextlib
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import labkit as lk

    _, _, name, png = WRONG[stage]
    VARIANTS = wrong_namespace(stage)["VARIANTS"]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        lk.check_variant(VARIANTS[name], "cifar10", network=False)
    lines = text.getvalue().splitlines()
    print("\n".join(lines))
    hint = next((m.group(0) for m in map(HINT.search, lines) if m), None)
    if hint is None:
        raise SystemExit(f"stage {stage}'s wrong variant printed no lk.show.failure hint")
    fig = eval(hint, {"lk": lk, "VARIANTS": VARIANTS})  # noqa: S307 - the call the FAIL line tells a student to make
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / png, dpi=100)
    plt.close(fig)
    return folder / png


# ------------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="figures to draw (default: all), e.g. 05_task1")
    parser.add_argument("--list", action="store_true", help="list the figures per notebook")
    parser.add_argument("--check", action="store_true", help="exit 1 when a digest differs from the solutions")
    parser.add_argument("--insert", action="store_true", help="put the figure references into solutions/")
    parser.add_argument("--docs", action="store_true", help="draw the pictures of docs/img/")
    args = parser.parse_args(argv)
    known = {s.name: s for s in SCENES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"no figure named {', '.join(unknown)}; figures: {', '.join(known)}")
        return 2
    scenes = [known[n] for n in args.names] or ([known[n] for n in DOCS_FIGURES] if args.docs else SCENES)
    if args.list:
        from labkit.stages import STAGES

        for stage in sorted({s.stage for s in scenes}):
            print(STAGES[stage].notebook)
            for s in (s for s in scenes if s.stage == stage):
                print(f"  figures/{s.name}.png  task {s.task}: {s.caption}")
        return 0
    if args.insert:
        changed = insert()
        print(f"references inserted into {', '.join(changed)}; now run python tools/make_student.py" if changed
              else "every reference is in place already")
        return 0
    if args.check:
        stale = [s.name for s in scenes if stale_reason(s)]
        for name in stale:
            print(f"{name}: {stale_reason(known[name])}")
        return 1 if stale else 0
    for s in scenes:
        print(f"{s.name}: drawn in {write(s):.1f} s")
    if args.docs:
        for name, png in DOCS_FIGURES.items():
            (DOCS_IMG / png).write_bytes((FIGURES / f"{name}.png").read_bytes())
        for stage in WRONG:
            print(f"{failure_picture(stage)}")
    return 0


def stale_reason(scene: Scene) -> str:
    """Why the committed digest of ``scene`` no longer matches the solution ("" when it does)."""
    path = FIGURES / f"{scene.name}.json"
    if not path.exists():
        return f"no {path.relative_to(REPO)}: run python tools/draw_access_figures.py {scene.name}"
    stored = json.loads(path.read_text())
    now = json.loads(json.dumps(digest(scene, record(scene))))
    if now == stored:
        return ""
    diffs = [k for k in now if now.get(k) != stored.get(k)]
    return (f"the solution's access pattern changed ({', '.join(diffs)} differ) but its figure was not redrawn: run "
            f"python tools/draw_access_figures.py {scene.name} (and look at the new figure)")


if __name__ == "__main__":
    sys.exit(main())
