"""``lk.show``: see what each thread of your kernel touches, as GPU-Puzzles' ``problem.show()`` does.

``lk.show(fn)`` calls a conv layer function once on a small case (one image, two channels, two maps: a few blocks),
records every access on the simulator (``labkit.access``: in a child process when this machine has a GPU) and draws
(``labkit.draw``) the arrays it touched, what the chosen thread read in each barrier epoch and what it wrote, with
its load and store counts beside the task's budget. ``spec=True`` draws the kit's solution's thread for the same
output element under yours. ``lk.show.failure(VARIANTS["name"], "cifar10", "conv1")`` does that for the thread that
wrote the first wrong element, the picture a FAIL line of the self-check points to.
"""

from __future__ import annotations

import sys

import numpy as np

from ..core.counts import _path_of
from ..course.stages import Variant, from_stage
from ..model.layers import impl_for
from ..model.nets import get_net
from . import access, draw


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


show.failure = failure  # lk.show.failure(...), next to lk.show(...)


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
    note = (f"No thread of yours wrote {where}: drawn is your thread {draw._show_dims(mine[1]) if mine else '0'} of "
            f"block 0. " if mine is None else "")
    return draw.compare_figure(launch, ref_launch, mine or (0, 0), theirs or (0, 0),
                               title=title or f"{target['name']}: the thread that writes {where}, yours vs the spec",
                               budget=budget, most_epochs=most_epochs, note=note + _note(rec))


def _title(rec, launch, target) -> str:
    c = rec.case
    return (f"{target['name']} → {launch.kernel}: grid {draw._show_dims(launch.grid)}, block "
            f"{draw._show_dims(launch.block)}; input {c['N']}×{c['C']}×{c['H']}×{c['W']}, {c['M']} maps of "
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
