"""What the stage notebooks call around the student's code: where am I, check every variant, time the ones that
pass, and plot, from this machine's runs on a GPU or from the kit's committed GPU results elsewhere.

A student's untouched notebook runs top to bottom without a traceback: a variant whose check fails is not timed,
and its measure cells print one line saying so instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core import engine
from ..core.check import check_variant, given_summary
from ..core.engine import NetRun, run
from ..core.workloads import Workload, workload
from ..course.stages import STAGES, Variant, order_key
from ..ladder import ceilings, measured, plots
from ..launch import device, gpu
from ..measuring.ledger import Ledger
from ..model import data
from ..model.nets import base_name, get_net


def hello(stage: str) -> None:
    """One short output: what this machine is, whether the data is there (and what to do if not), and where the
    kit's own GPU timings of this stage are."""
    info = device.info()
    if info.kind == "gpu":
        print(f"This machine: {info.name}: kernels run on the GPU, timings are real (CUDA events).")
    elif info.kind == "simulator":
        print("This machine: no GPU, so GPU kernels run on numba's CUDA simulator: checked on shrunk problems, "
              "timings not meaningful.")
    else:
        print("This machine: no GPU and no simulator: only CPU stages run. Set NUMBA_ENABLE_CUDASIM=1 before "
              "starting Jupyter to run GPU kernels on the simulator.")
    found, missing = [], []
    for name, ds in data.DATASETS.items():
        try:
            found.append(f"{name} in {data.shown(data.find(name))}")
        except data.DataNotFound:
            missing.append(f"{name} is missing (`{ds.fetch_hint}`, or point LABKIT_DATA at a copy)")
    print("Data: " + "; ".join(found + missing) + ("; runs without data use synthetic inputs." if missing else "."))
    res = measured.latest(stage) if stage in STAGES else None
    if res is not None:
        print(f"The kit's GPU timings of stage {stage}: {res.where}/ ({res.device}, {res.date})"
              + ("; this notebook draws its plots from them." if info.kind != "gpu" else "."))


class Checked(dict):
    """Variant name -> its check results, with a one-line reason for each variant that does not pass."""

    def passed(self, name: str) -> bool:
        results = self.get(name)
        return bool(results) and all(results)

    def why(self, name: str) -> str:
        results = self.get(name) or []
        bad = next((r for r in results if not r.passed), None)
        if bad is None:
            return "it was not checked"
        if bad.detail.startswith("skipped: "):
            return f"it {bad.detail[len('skipped: '):]}"
        if "not implemented" in bad.detail:
            return f"{bad.name} is not implemented"
        return f"{bad.name} fails its check"


def check(variants: dict[str, Variant], net: str | None = None) -> Checked:
    """Check every variant on every net it runs (each function on its own, then the whole forward pass). The
    notebook's own functions get one line per check; the given code (earlier stages' solutions, the kit's layers)
    one line in all at the end, unless a check of it fails. A function several variants share is checked once; a
    variant with the same functions and launch pattern as an earlier one is not checked again."""
    checked = Checked()
    seen: dict = {}
    done: dict = {}
    given: dict = {}  # id -> result: every check of given code, once
    for name, variant in variants.items():
        key = (variant.arrays, variant.per_image, variant.nets, variant.fuse,
               tuple(sorted((k, id(f)) for k, f in variant.impls.items())))
        if key in seen:
            print(f"-- {name}: the functions of {seen[key]}, checked above")
            checked[name] = checked[seen[key]]
            continue
        seen[key] = name
        before = set(map(id, done.values()))
        results = checked[name] = check_variant(variant, net, done=done, quiet=True)
        own = [r for r in results if not (r.given and r.passed) and (id(r) not in before or r.name.endswith(" forward"))]
        print(f"-- {name}" + ("" if own or not results else " (given code only: in the line below)"))
        for r in results:
            if r.given and r.passed:
                given[id(r)] = r
            elif id(r) not in before or r.name.endswith(" forward"):
                print(f"{variant.label}: SKIPPED ({r.detail[len('skipped: '):]})" if r.detail.startswith("skipped: ")
                      else r)
    line = given_summary(list(given.values()))
    if line:
        print(line)
    return checked


def run_variants(variants: dict[str, Variant], wl: Workload, checked: Checked, names: Iterable[str] | None = None,
                 record: bool = True, **kwargs) -> dict[str, NetRun]:
    """Time every named variant that passed its check on ``wl`` (one summary line each) and record it; a variant
    that did not pass gets one line saying why it was not measured."""
    runs = {}
    for name in names or variants:
        if not checked.passed(name):
            why = checked.why(name)
            print(f"{name}: not measured here: {why}" if why.startswith("it needs") else
                  f"{name}: not measured yet: {why}; make the self-check pass first")
            continue
        try:
            runs[name] = run(wl, variants[name], quiet=True, record=record, **kwargs)
        except MemoryError as exc:
            print(f"{name}: not measured at {wl.images} images: {exc}")
            continue
        r = runs[name].report
        print(f"{name}: {r.images} images, total {r.total:.6f} s, conv {r.by_kind().get('conv', 0.0):.6f} s, "
              f"accuracy {'n/a' if r.accuracy is None else f'{100 * r.accuracy:.2f} %'}")
    if any(r.report.simulated for r in runs.values()):
        print("(simulated: these times measure the CUDA simulator, not a GPU)")
    return runs


#: the workloads a stage's Measure cell runs every variant on: the small one first (the simulator stops there)
STAGE_WORKLOADS = (("cifar10", 1200), ("cifar10", 50000), ("fashion", 10000))


def measure(variants: dict[str, Variant], checked: Checked, repeat: int = 3) -> dict[str, NetRun]:
    """A stage's Measure cell: every variant that passed, on each of ``STAGE_WORKLOADS`` its net runs (on the
    simulator only the first, shrunk), keyed "variant net images"; prints one line a run and the CIFAR-10 table."""
    runs = {}
    for net, images in STAGE_WORKLOADS:
        wl = workload(net, images, target="gpu", tile=True)
        names = [v for v, var in variants.items() if net in var.nets]
        for name, found in run_variants(variants, wl, checked, names, repeat=repeat).items():
            runs[f"{name} {net} {wl.images}"] = found
        if wl.simulated:
            break
    table({k: v for k, v in runs.items() if " cifar10 " in k})
    return runs


def smallest(runs: dict[str, NetRun]) -> dict[str, NetRun]:
    """The CIFAR-10 runs of ``measure`` at its smallest workload, keyed by variant: what the ladder compares."""
    least = min((r.report.images for r in runs.values()), default=0)
    return {k.split()[0]: r for k, r in runs.items() if " cifar10 " in k and r.report.images == least}


def ladder_and_roofline(stage: str, runs: dict[str, NetRun]):
    """A stage's Plot cell: this stage on the ladder of the earlier ones (left) and its conv layers on the device's
    roofline (right), from ``measure``'s smallest CIFAR-10 runs."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), layout="constrained")
    plt.close(fig)
    small = smallest(runs)
    ladder(stage, runs=small, ax=left)
    roofline(stage, small, ax=right)
    return fig


def committed(stage: str) -> measured.Results | None:
    """The kit's committed GPU results for ``stage``, when this machine has no GPU of its own to measure with."""
    return None if device.info().kind == "gpu" else measured.latest(stage)


def ladder(stage: str, net: str = "cifar10", images: int | None = None, runs: dict[str, NetRun] | None = None,
           ax=None):
    """The speed ladder of this stage against the earlier ones: from this machine's ledger on a GPU (or for CPU
    stages), else from the kit's committed GPU results, labelled with their device and date. No runs yet (an
    untouched notebook: nothing passed its check) is the committed results too, where this machine has no GPU."""
    res = committed(stage) if not runs or any(r.report.simulated for r in runs.values()) else None
    if res is not None:
        images = images or _images_of(res, stage, net)
        fig = plots.stage_ladder(_best_of_earlier(res.reports, stage), net, images=images, device=res.device, ax=ax)
        (ax or fig.axes[0]).set_title(f"{net}, {images} images on {res.device}\n(the kit's committed results, "
                                      f"{res.date}: this machine has no GPU)", fontsize=9)
        return fig
    if runs:
        first = next(iter(runs.values())).report
        reports = Ledger().reports(device=first.device, net=first.net, images=first.images)
        return plots.stage_ladder(_best_of_earlier(reports, stage), first.net, images=first.images,
                                  device=first.device, ax=ax)
    print(f"Nothing to plot yet for stage {stage}: no measured runs here"
          + (" (make the self-check pass first)." if device.info().kind == "gpu" else
             " and no committed GPU results."))
    return None


def _best_of_earlier(reports, stage: str) -> list:
    """This stage's runs, the fastest run of every other stage (per net and image count), and the baselines."""
    best: dict = {}
    keep = []
    for rep in reports:
        head = (rep.stage or "").split(" ", 1)[0]
        if head == stage or order_key(rep.stage)[0] == 1:
            keep.append(rep)
            continue
        key = (head, rep.net, rep.images)
        if key not in best or rep.total < best[key].total:
            best[key] = rep
    return list(best.values()) + keep


def _images_of(res: measured.Results, stage: str, net: str) -> int | None:
    """The image count to show committed runs at: the net's default workload if the stage ran it, else the largest."""
    counts = {r.images for r in res.runs(stage, net)}
    default = get_net(net).default_images
    return default if default in counts else max(counts, default=None)


def scaling(stage: str, runs: list[NetRun], ax=None):
    """Time per image against the image count: this machine's runs on a GPU, else the kit's committed GPU runs of
    the stage."""
    res = committed(stage) if not runs or any(r.report.simulated for r in runs) else None
    if res is not None:
        return plots.scaling(res.runs(stage), ax=ax, title=f"{res.device} (the kit's committed results, {res.date})")
    return plots.scaling([r.report for r in runs], ax=ax, title=device.label())


def roofline(stage: str, runs: dict[str, NetRun] | None = None, net: str = "cifar10", images: int | None = None,
             ax=None):
    """Conv layers of this stage's runs on the device's roofline: this machine's runs on a GPU, else the kit's
    committed GPU runs of the stage."""
    if runs and not any(r.report.simulated for r in runs.values()):
        reports = [r.report for r in runs.values()]
        roof = ceilings.for_device(reports[0].device)
    else:
        res = measured.latest(stage)
        if res is None:
            print(f"No roofline yet: no GPU here and no committed GPU results for stage {stage}.")
            return None
        images = images or _images_of(res, stage, net)
        reports = res.runs(stage, net, images)
        roof = ceilings.for_device(res.device)
    if roof is None or not reports:
        print(ceilings.describe(roof))
        return None
    return plots.roofline_runs(reports, roof, ax=ax)


def table(runs: dict[str, NetRun], per_image: bool = False, baseline: str | None = None,
          counts: dict | None = None) -> None:
    """One line per run: each conv layer, all conv layers and the total (seconds, or milliseconds per image when
    ``per_image``, for runs of different sizes), the speedup of the total over ``baseline`` (default: the first
    run), and with ``counts`` (name -> ``labkit.gpu.Traffic`` of one pass) its launches and copies."""
    if not runs:
        print("nothing measured yet")
        return
    first = next(iter(runs.values())).report
    convs = [n for n, (kind, _) in first.layers().items() if kind == "conv"]
    unit = "ms/image" if per_image or len({r.report.images for r in runs.values()}) > 1 else "seconds"
    scale = (lambda rep, s: 1e3 * s / rep.images) if unit == "ms/image" else (lambda rep, s: s)
    base = runs[baseline or next(iter(runs))].report
    extra = f"{'launches':>10}{'copies':>8}" if counts else ""
    print(f"{unit:<26}{'images':>7}" + "".join(f"{c:>10}" for c in convs) + f"{'conv':>10}{'total':>10}{'speedup':>9}"
          + extra)
    for name, r in runs.items():
        rep = r.report
        conv = rep.by_kind().get("conv", 0.0)
        cells = "".join(f"{scale(rep, rep.layer_seconds.get(c, 0.0)):>10.4f}" for c in convs)
        speed = scale(base, base.total) / scale(rep, rep.total) if rep.total > 0 else float("nan")
        c = (counts or {}).get(name)
        tail = f"{c.launches:>10}{c.copies:>8}" if c is not None else ""
        print(f"{name:<26}{rep.images:>7}{cells}{scale(rep, conv):>10.4f}{scale(rep, rep.total):>10.4f}"
              f"{speed:>8.2f}x{tail}")


def parallel_diagnostics(fn, level: int = 1) -> None:
    """Compile a CPU conv function on conv1-sized float32 arrays (the types every later call uses), show the
    warning numba gives, and print its parallel diagnostics (level 1..4: 4 says the most)."""
    import warnings

    import numpy as np

    x, w = np.zeros((1, 3, 32, 32), np.float32), np.zeros((16, 3, 5, 5), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(x, w, np.zeros(16, np.float32), np.empty((1, 16, 32, 32), np.float32), 2, 1)
        except NotImplementedError:
            print(f"{fn.py_func.__name__}: not implemented yet")
            return
    for warning in caught:
        print(f"{type(warning.message).__name__}: {str(warning.message).strip().splitlines()[0]}")
    import contextlib
    import io
    import re

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        fn.parallel_diagnostics(level=level)
    # a notebook cell's code lives in a temporary file named by the kernel: say where it really is
    print(re.sub(r"\S*ipykernel_\d+[/\\]\d+\.py", "<this notebook>", text.getvalue()), end="")


def counts(variant: Variant, wl: Workload):
    """The launches and copies of one forward pass of ``variant`` on ``wl`` (after its one-time upload), counted
    by ``labkit.gpu`` as they happen."""
    prepared = engine.prepare(wl.net, variant, wl.x, wl.weights)
    with gpu.counting() as c:
        engine.forward(wl.net, variant, prepared)
    return c


def raw_images(wl: Workload):
    """The stored uint8 images behind ``wl``, in the net's input shape: the same real bytes for a real CIFAR-10
    workload (repeated as the workload repeats them), synthetic bytes for a simulated or synthetic one."""
    import numpy as np


    n, (c, h, w) = wl.images, wl.net.input_shape
    if wl.synthetic or wl.net.dataset != "cifar10":
        return np.ascontiguousarray(data.synthetic(base_name(wl.net), n).images[:, :c, :h, :w])
    try:
        return data.load_cifar10(n).images
    except data.DataError:  # fewer images here than the workload: it repeated them, and so do we
        have = data.load_cifar10(None).images
        return np.resize(have, (n, *have.shape[1:]))
