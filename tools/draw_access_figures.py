"""Draw one figure per GPU task of stages 02 to 10 from the kit's solution (the scenes of ``labkit.scenes``), with a
JSON file beside each: a digest of the pattern it shows, so a test can tell when a solution's pattern changes without
its figure, and the spec's recording that ``lk.show.task`` draws under a student's own. The figures show which
elements threads read and write (or, for the tasks of several launches, what the code queues on which stream; for
stage 02's prange tasks, which CPU thread does what), never code.

    python tools/draw_access_figures.py                # draw every figure into notebooks/figures/ (PNG + JSON)
    python tools/draw_access_figures.py 05_task1       # only the named figures
    python tools/draw_access_figures.py --list         # the figures, per notebook
    python tools/draw_access_figures.py --check        # exit 1 when a solution's pattern differs from a digest
    python tools/draw_access_figures.py --insert       # put each figure's reference into its task's spec cell in
                                                       # solutions/ (idempotent); then run tools/make_student.py
    python tools/draw_access_figures.py --docs         # the pictures docs/ shows, into docs/img/: three task figures
                                                       # (redrawn) and two "yours vs the spec" pictures of wrong
                                                       # kernels, made through the self-check's FAIL hint

Tasks without a figure: no GPU work of their own (05 and 07 task 3's predictions, 09 task 4's search space). The CUDA
C tasks (06 task 2, 09 tasks 2 and 3) are recorded on the CPU emulation of CUDA C (``labkit.lessons.cuda_record``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

if __name__ == "__main__":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # the recordings need the simulator, on any machine
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FIGURES = REPO / "notebooks" / "figures"
DOCS_IMG = REPO / "docs" / "img"


from labkit.lessons.scenes import SCENES, Scene, digest  # noqa: E402,F401 - the scenes live in the package (lk.show.task)

DOCS_FIGURES = {"05_task1": "show-05-tile-halo.png", "06_task1": "show-06-uniform-divergent.png",
                "09_task3": "show-09-register-window.png"}


# ------------------------------------------------------------------------------------ record, digest, draw


def record(scene: Scene):
    """The scene's recording(s) on the kit's solution: [(label, Recording | Launch | Timeline)]."""
    import labkit as lk
    from labkit.lessons import scenes

    return scenes.record(scene, lk.from_stage(scene.stage))


def draw_scene(scene: Scene, recordings):
    """The figure of the spec alone, as the task's spec cell shows it."""
    from labkit.lessons import cpu_threads, draw, scenes
    from labkit.lessons import timeline as tl

    title = _wrap(f"{scene.stage} task {scene.task}: {scene.caption}", 118)
    if scene.kind == "timeline":
        return tl.figure([("the kit's solution", recordings[0][1])], title=title,
                         note=tl.ORDER)
    if scene.kind == "cpu":
        items = []
        for label, launch in recordings:
            flat = None if scene.element is None else int(np.ravel_multi_index(scene.element,
                                                                               launch.arrays["out"]["shape"]))
            items.append([(label, launch, "out", flat)])
        return cpu_threads.figure(items, title=title, note=f"{cpu_threads.THREADS} threads, numba's default "
                                  f"schedule: each thread one contiguous, equal share of a prange's iterations")
    items = []
    for label, rec in recordings:
        launch = rec.launch(scene.kernel)
        items.append((launch, scenes.selection(scene, rec, launch), label))
    c = recordings[0][1].case
    if "N" in c:
        case = (f"drawn from the kit's solution on one {c['C']}-channel {c['H']}×{c['W']} image, {c['M']} map"
                f"{'s' * (c['M'] != 1)} of {c['K']}×{c['K']}, pad {c['pad']}" +
                (f", pool {c['pool']}" if c.get("pool") else "") + " (a small launch on the simulator)")
    else:
        case = f"drawn from the kit's solution on {c.get('what', 'a small case')} (a small launch on the simulator)"
    return draw.stacked_figure(items, title=title, budget=scene.budget, most_epochs=scene.most_epochs,
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
    what = {"timeline": "what the code queues, on which stream", "cpu": "which CPU thread does what"}.get(
        scene.kind, "what the threads read and write")
    alt = f"Task {scene.task}: {what}, drawn from the kit's solution"
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
            heading = re.compile(rf"^##+ Task (?:{scene.task}\b{'|—' if scene.task == 1 else ''})", re.M)
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


def slipped(stage: str, right: str, wrong: str) -> dict:
    """The kernel cells of stage ``stage``'s solution (its source) with ``right`` replaced by ``wrong``, loaded as a
    student's notebook binds them; ValueError when the solution no longer has ``right``."""
    import labkit as lk
    from labkit import nbcells
    from labkit.stages import STAGES, solution

    nb = nbcells.read(solution(stage))
    ns = {"__name__": f"slipped_{stage}"}
    found = False
    for index, src in nbcells.tagged_cells(nb):
        found = found or right in src
        src = src.replace(right, wrong)
        nbcells.run_cell(src, f"<{STAGES[stage].notebook} cell {index}, with a slip>", ns)
    if not found:
        raise ValueError(f"stage {stage}'s solution no longer has {right!r}")
    assert lk  # the cells import labkit themselves
    return ns


def wrong_namespace(stage: str) -> dict:
    """The solution's kernel cells (from its source) with one slip (``WRONG``), loaded as a student's notebook
    would be."""
    right, slip, _, _ = WRONG[stage]
    try:
        return slipped(stage, right, slip)
    except ValueError as exc:
        raise SystemExit(f"{exc}: update WRONG in tools/draw_access_figures.py") from None


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
