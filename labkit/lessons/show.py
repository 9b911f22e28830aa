"""``lk.show``: see what each thread of your kernel touches, as GPU-Puzzles' ``problem.show()`` does.

``lk.show(fn)`` calls a conv layer function once on a small case (one image, two channels, two maps: a few blocks),
records every access on the simulator (``labkit.access``: in a child process when this machine has a GPU) and draws
(``labkit.draw``) the arrays it touched, what the chosen thread read in each barrier epoch and what it wrote, with
its load and store counts beside the task's budget. ``spec=True`` draws the kit's solution's thread for the same
output element under yours. ``lk.show.failure(VARIANTS["name"], "cifar10", "conv1")`` does that for the thread that
wrote the first wrong element, the picture a FAIL line of the self-check points to.

``lk.show.task("04", "pad")`` is the cell at the end of every task of stages 02 to 10 with GPU work of its own: the
task's scene (``labkit.scenes``: pad, normalize, unroll, matmul, atomics, split-K and the convolutions; CUDA C on
the CPU emulation; a timeline of what the code queues for the tasks of several launches; which CPU thread of a
``prange`` does what) run on the student's own code and drawn beside the spec's committed recording. A TODO stub
gives one line.
"""

from __future__ import annotations

import sys

import numpy as np

from ..core.counts import _path_of
from ..course import tasks
from ..course.stages import STUB_MARK, Variant, from_stage
from ..model.layers import impl_for
from ..model.nets import get_net
from . import access, chosen_threads, cpu_threads, draw, scenes, timeline


def show(fn, net: str = "cifar10", layer: str = "conv2", *, element=None, block=None, thread=None, warp=None,
         kernel: str | None = None, spec=None, budget: dict | None = None, fuse: tuple[str, ...] | None = None,
         channels: int = 2, maps: int = 2, size: tuple[int, int] | None = None, seed: int = 0,
         arrays: str | None = None, stage: str | None = None, most_epochs: int = 6, title: str = "",
         namespace: dict | None = None):
    """Draw what one thread (``block`` and ``thread``: ints or (x, y, z)), one warp (``warp``) or a whole block
    (``block`` alone) of ``fn``'s kernel reads and writes on a small case of ``layer``; by default the thread that
    writes ``element`` (n, m, i, j) of the output, the middle one unless given. ``fn``: a layer function or a
    ``labkit.Variant``. ``kernel``: which launch, when the function makes several (default: the last that writes
    the output). ``spec``: True (the kit's solution of the same variant or function) or a layer function: draw
    its thread for the same output element under yours. ``budget``: {"global load": n, ...} per thread.
    Returns the matplotlib figure."""
    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    target = _target(fn, layer, fuse, arrays, stage)
    case = _case_args(net, layer, target["fuse"], channels, maps, size, seed)
    rec = access.record(target["fn"], case, target["arrays"], target["name"], target["stage"], namespace)
    launch = rec.launch(kernel)
    if spec is None or spec is False:
        sel = access.selection(rec, launch, element, block, thread, warp)
        return _shown(draw.thread_figure(launch, *sel, title=title or _title(rec, launch, target), budget=budget,
                                         most_epochs=most_epochs, note=_note(rec)))
    spec_fn = _spec_for(target, layer, namespace) if spec is True else spec
    ref = access.record(spec_fn, case, target["arrays"], "the spec", target["stage"], namespace)
    ref_launch = ref.launch(kernel)
    element = access.element_or_middle(rec, element)
    return _shown(_compare(rec, launch, ref, ref_launch, element, target, budget, most_epochs, title))


def failure(fn, net: str = "cifar10", layer: str = "conv2", *, seed: int | None = None, kernel: str | None = None,
            budget: dict | None = None, fuse: tuple[str, ...] | None = None, arrays: str | None = None,
            stage: str | None = None, spec=True, namespace: dict | None = None):
    """"Yours vs the spec" for the first wrong element: ``fn`` (a layer function or a Variant) runs on a small case
    of ``layer`` (then on the simulator's shrunk check case if the small one comes out right); the thread that wrote
    the first wrong element is drawn with what it read, above the kit's solution's thread for the same element and
    what that one read. Prints one line and draws nothing when every element comes out right."""
    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    target = _target(fn, layer, fuse, arrays, stage)
    spec_fn = _spec_for(target, layer, namespace) if spec is True else spec
    tried = []
    for channels, maps in ((2, 2), (4, 5)):
        case = _case_args(net, layer, target["fuse"], channels, maps, None, 0 if seed is None else seed)
        rec = access.record(target["fn"], case, target["arrays"], target["name"], target["stage"], namespace)
        tried.append(f"{channels} channels, {maps} maps")
        wrong = access.first_wrong(rec)
        if wrong is not None:
            ref = access.record(spec_fn, case, target["arrays"], "the spec", target["stage"], namespace)
            return _shown(_compare(rec, rec.launch(kernel), ref, ref.launch(kernel), wrong, target, budget, 2,
                                   _failure_title(rec, wrong, f"{layer} of {net}")))
    print(f"{target['name']}: every element right on {' and on '.join(tried)} of {layer} (one image): the failure "
          f"needs the check's own sizes or seed; run the self-check again and look at its FAIL line")
    return None


def task(stage: str, name: str, *, namespace: dict | None = None):
    """The cell at the end of a task: the task's scene (``labkit.scenes``) run on your own code, drawn beside the
    kit's solution's committed recording, as GPU-Puzzles' ``problem.show()``: what a thread (a warp, a block) of
    your kernel reads and writes with its counts against the task's budget, or for a task of several launches what
    your code queues on which stream (a timeline), or for a ``prange`` which CPU thread does what. While your code
    is the TODO stub it prints one line. Returns the (last) figure; a task of two pictures shows the first too."""

    namespace = namespace if namespace is not None else sys._getframe(1).f_globals
    found = tasks.find(str(stage).zfill(2), name)
    figures = [f for f in (_task_figure(s, found, namespace) for s in scenes.of_task(stage, name)) if f is not None]
    for fig in figures:
        fig.set_dpi(TASK_DPI)
    if not scenes.of_task(stage, name):
        print(f"task {found.name} ({found.label}) has no GPU work of its own to draw")
    if len(figures) > 1:
        try:
            from IPython.display import display

            for fig in figures[:-1]:
                display(fig)
        except ImportError:
            pass
    return figures[-1] if figures else None


show.failure = failure  # lk.show.failure(...), next to lk.show(...)
show.task = task  # lk.show.task("04", "pad"): the cell at the end of a task


# ----------------------------------------------------------------------------------------------- lk.show.task

TASK_DPI = 80  # a task cell's figure as the notebook stores it: a notebook holds one per task


def _task_figure(scene, found, namespace: dict):
    """One scene of a task on the notebook's code, above the spec's; None (and one line) when nothing to draw."""
    import textwrap

    head = f"{scene.stage} task {scene.task} ({found.label})"
    try:
        yours = scenes.record_any(scene, namespace, scene.stage)
    except NotImplementedError as exc:
        _stub_line(head, str(exc), found.function)
        return None
    except NameError as exc:
        print(f"{head}: nothing to draw: {exc}")
        return None
    stopped = [rec.case["stub"] for _, rec in yours if isinstance(rec, access.Recording) and rec.case.get("stub")
               and scene.kernel and not any(ln.kernel.startswith(scene.kernel) for ln in rec.launches)]
    if stopped:
        _stub_line(head, stopped[0], found.function)
        return None
    spec = scenes.load_spec(scene)
    title = "\n".join(textwrap.wrap(f"{head}, yours and the spec: {scene.caption}", 118))
    missing = "" if spec is not None else f"(the spec's recording, figures/{scene.name}.json, is not here: yours alone)"
    if scene.kind == "timeline":
        items = [("yours", yours[0][1])] + ([("the spec", spec[0][1])] if spec else [])
        note = timeline.ORDER + (" " + missing if missing else "")
        return _shown(timeline.figure(items, title=title, note=note))
    if scene.kind == "cpu":
        rows = []
        for k, (label, launch) in enumerate(yours):
            flat = None if scene.element is None else int(np.ravel_multi_index(
                scene.element, launch.arrays["out"]["shape"]))
            row = [(f"yours: {label}", launch, "out", flat)]
            if spec and k < len(spec):
                row.append((f"the spec: {spec[k][0]}", spec[k][1], "out", flat))
            rows += [row] if flat is None else [[item] for item in row]
        note = (f"{cpu_threads.THREADS} threads, numba's default schedule (each thread one contiguous, equal share of "
                f"a prange's iterations). {missing}")
        return _shown(cpu_threads.figure(rows, title=title, note=note.strip()))
    return _access_figure(scene, yours, spec, title, missing)


def _stub_line(head: str, said: str, function: str) -> None:
    """The one line of a task whose code (or code it needs) is still the TODO stub."""
    said = " ".join(said.split()).replace(f": {STUB_MARK}", "").replace(STUB_MARK, "").strip(" :")
    which = said if said and " " not in said else "the CUDA C source" if "CUDA C" in said else function
    print(f"{head}: nothing of yours to draw yet: {which} is still the TODO stub (the spec's picture is in the task "
          f"above)")


def _access_figure(scene, yours, spec, title: str, missing: str):
    pairs, stack, notes = [], [], []
    for k, (label, rec) in enumerate(yours):
        try:
            launch = rec.launch(scene.kernel)
        except ValueError as exc:
            why = rec.case.get("stub") or rec.case.get("raised")
            print(f"{scene.stage} task {scene.task}: nothing to draw: {exc}" + (f" ({why})" if why else ""))
            return None
        try:
            sel = scenes.selection(scene, rec, launch)
        except ValueError as exc:  # your launch is shaped otherwise than the spec's: its first block
            notes.append(f"{exc}; drawn: your block 0")
            sel = (0, scene.thread if scene.thread is not None else None, scene.warp)
        if scene.element is not None and scene.block is None and access.writer(rec, launch, scene.element) is None:
            notes.append(f"no thread of yours wrote out[{', '.join(map(str, scene.element))}]: drawn, your thread 0 "
                         f"of block 0")
        notes.append(_verdict(rec, label))
        if spec and k < len(spec):
            pairs.append((label, launch, sel, spec[k][1], spec[k][2]))
        else:
            stack.append((launch, sel, label))
    note = "\n".join(filter(None, [*notes, missing]))
    if pairs and not stack:
        return _shown(draw.compare_pairs(pairs, title=title, budget=scene.budget or None,
                                         most_epochs=scene.most_epochs, note=note))
    return _shown(draw.stacked_figure(stack, title=title, budget=scene.budget or None, most_epochs=scene.most_epochs,
                                      note=note))


def _verdict(rec, label: str) -> str:
    """One line on your output for this small case: right, or its first wrong element (the check says more)."""
    who = f"{label}: " if label else ""
    if rec.case.get("raised"):
        return f"{who}your code raised {rec.case['raised']}"
    if rec.case.get("stub"):
        return f"{who}it stopped at a TODO stub: {rec.case['stub']}"
    if rec.output is None or rec.expected is None:
        return ""
    wrong = access.first_wrong(rec)
    if wrong is None:
        return f"{who}your output on this small case: every element right"
    return f"{who}your output on this small case: first wrong element out[{', '.join(map(str, wrong))}]"


# ----------------------------------------------------------------------------------------------- helpers


def _shown(fig):
    """The figure, closed to pyplot: a notebook shows it once, as the cell's value, and a script can save it."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return fig


def _target(fn, layer, fuse, arrays, stage) -> dict:
    if isinstance(fn, Variant):
        spec = get_net(fn.nets[0]).layer(layer) if fn.nets else None
        impl = impl_for(fn.impls, spec) if spec is not None else fn.impls.get("conv")
        if impl is None:
            raise ValueError(f"variant {fn.name} has no function for {layer}")
        if fn.target != "gpu":
            raise ValueError(f"variant {fn.name} is CPU code: lk.show draws GPU kernels' accesses")
        if fn.unavailable() or "cuda_c" in fn.requires:
            raise ValueError(f"variant {fn.name} is CUDA C: lk.show records the accesses of numba kernels on the "
                             f"simulator, not CUDA C's")
        return {"fn": getattr(impl, "__wrapped__", impl), "fuse": fuse if fuse is not None else fn.fuse,
                "arrays": arrays or "device", "stage": stage or fn.stage, "name": fn.label, "variant": fn.name}
    if not callable(fn):
        raise TypeError(f"lk.show needs a conv layer function or a labkit.Variant, got {fn!r}")
    return {"fn": fn, "fuse": fuse or (), "arrays": arrays or "device", "stage": stage,
            "name": getattr(fn, "__name__", "fn"), "variant": None}


def _case_args(net, layer, fuse, channels, maps, size, seed) -> dict:
    return {"net": net, "layer": layer, "fuse": tuple(fuse), "channels": channels, "maps": maps,
            "size": None if size is None else tuple(size), "images": 1, "seed": seed}


def _spec_for(target: dict, layer: str, namespace: dict):
    """The kit's solution of the same thing: the stage's variant of the same name, or the function the notebook
    binds to the same name."""
    if target["stage"] is None:
        raise ValueError("spec=True needs to know the stage whose solution is the spec: pass stage='05' or a "
                         "Variant")
    sol = from_stage(target["stage"])
    if target["variant"]:
        v = sol.VARIANTS[target["variant"]]
        fn = impl_for(v.impls, get_net(v.nets[0]).layer(layer))
        return getattr(fn, "__wrapped__", fn)
    name = _path_of(target["fn"], namespace)
    if name.startswith("@"):
        return target["fn"]  # given code is the kit's own already
    if not hasattr(sol, name):
        raise ValueError(f"the kit's solution of stage {target['stage']} has no {name}: pass spec=<function>")
    return getattr(sol, name)


def _compare(rec, launch, ref, ref_launch, element, target, budget, most_epochs, title):
    mine = access.writer(rec, launch, element)
    theirs = access.writer(ref, ref_launch, element)
    where = "out[" + ", ".join(map(str, element)) + "]"
    note = (f"No thread of yours wrote {where}: drawn is your thread "
            f"{chosen_threads.show_dims(mine[1]) if mine else '0'} of block 0. " if mine is None else "")
    return draw.compare_figure(launch, ref_launch, mine or (0, 0), theirs or (0, 0),
                               title=title or f"{target['name']}: the thread that writes {where}, yours vs the spec",
                               budget=budget, most_epochs=most_epochs, note=note + _note(rec))


def _title(rec, launch, target) -> str:
    c = rec.case
    return (f"{target['name']} → {launch.kernel}: grid {chosen_threads.show_dims(launch.grid)}, block "
            f"{chosen_threads.show_dims(launch.block)}; input {c['N']}×{c['C']}×{c['H']}×{c['W']}, {c['M']} maps of "
            f"{c['K']}×{c['K']}, pad {c['pad']}" + (f", pool {c['pool']}" if c.get("pool") else ""))


def _failure_title(rec, wrong, what: str) -> str:
    where = "out[" + ", ".join(map(str, wrong)) + "]"
    got = "unwritten" if rec.output is None or not np.isfinite(
        rec.output[int(np.ravel_multi_index(wrong, rec.case["out"]))]) else "wrong"
    c = rec.case
    return (f"{rec.name}, {what} on a small case (input {c['N']}×{c['C']}×{c['H']}×{c['W']}, {c['M']} maps, pad "
            f"{c['pad']}): first {got} element {where}.\nThe thread that wrote it, yours above the spec's")


def _note(rec) -> str:
    return f"The call raised {rec.case['raised']}" if rec.case.get("raised") else ""
