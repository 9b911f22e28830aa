"""The speed ladder: check and time every variant of every stage notebook in one run, on this machine.

Each variant is checked first (fresh inputs, several batch sizes), then timed on real images (warm-up, then
the per-layer median of several runs), and its predictions are compared with the numpy reference's on the
same images. Results go to a ledger (JSON lines) with the device, date and command, bench.json (with the library
versions and the device's ceilings), a CSV summary, and plots (ladder, per-layer bars, roofline).

Here: what a call may ask (``validate``, ``prepare_out``) and the run itself; the files it writes are
``bench_files``', the baselines' rows ``bench_baselines``', the rows' numbers and table ``bench_table``'s.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
from tqdm import tqdm  # plain text bar: works in a terminal and in a notebook without ipywidgets

from ..core.check import check_variant
from ..core.engine import run
from ..core.workloads import workload
from ..course import stages
from ..course.nbcells import NotebookError, notebook_name, read, source_of, tagged_cells
from ..launch import device, gpu
from ..measuring.ledger import Ledger, repo_root
from ..measuring.report import RunReport
from ..model import nets as nets_mod
from ..model import reference
from ..model.data import DataError, check_fits
from ..model.nets import get_net, net_cost
from ..model.weights_io import NOT_SHIPPED, course_weights, random_weights
from ..outputs import OutputError, contents, listed, writable_folder
from . import bench_baselines, bench_files, bench_whole, plots, unfinished
from .bench_table import row_numbers, table


@dataclass
class Limits:
    """Variants that would take minutes at large sizes are run only up to these image counts."""

    per_image: int = 1200  # per-image launches: images x layers launches
    cpu: int = 1200  # CPU variants (numba)
    slow_gflop: float | None = 10.0  # and both only where the forward pass is at most this much work: an image of
    # one net costs more than an image of another, and these rows' time is the host's, which varies between machines
    cpu_repeat: int = 1  # CPU variants take seconds per run: fewer timed runs
    per_image_repeat: int = 1  # so do per-image variants (a launch per layer and image)
    budget_s: float = 10.0  # no further timed run of a row once its runs add up to this (each row says how many ran)


class BenchError(Exception):
    """Arguments the bench cannot run with: the message says what is wrong and what to do."""


def validate(stage_numbers: list[str] | None, nets: list[str] | None, images: tuple[int, ...] | None,
             notebooks: Path, random_weights: bool = False) -> list[str] | None:
    """Check what was asked before anything runs: known stages that have a notebook with VARIANTS, known nets,
    image counts that fit in memory, and a device that can run GPU code (a GPU, or the simulator)."""
    numbers = [n.zfill(2) for n in stage_numbers] if stage_numbers else None
    timed = {p.name[:2]: p for p in _stage_paths(Path(notebooks), None)
             if p.name[:2] in stages.STAGES and any("VARIANTS" in src for _, src in _cells(p, tagged_cells))}
    if not timed:
        found = len(_stage_paths(Path(notebooks), None))
        raise BenchError(f"--notebooks {notebooks}: no stage notebook with VARIANTS there ("
                         + (f"{found} notebooks, none a stage's NN_topic.ipynb with a kernel cell defining VARIANTS"
                            if found else "no .ipynb files")
                         + "): name the folder that holds them (the default is solutions/)")
    for n in numbers or []:
        if n not in stages.STAGES:
            raise BenchError(f"--stages: there is no stage {n}; the stages are {', '.join(stages.STAGES)}")
        if n not in timed:
            raise BenchError(f"--stages: stage {n} has no notebook with VARIANTS in {notebooks} (stages with "
                             f"variants there: {', '.join(sorted(timed)) or 'none'})")
    for net in nets or []:
        if net not in nets_mod.NETS:
            raise BenchError(f"--nets: unknown network {net!r}; choose from {', '.join(nets_mod.NETS)}")
        if net in NOT_SHIPPED and course_weights(net) is None and not random_weights:
            raise BenchError(f"--nets {net}: {NOT_SHIPPED[net]}; or --random-weights to time it on random weights")
    for net in nets or list(nets_mod.NETS):
        for n in images or ():
            try:
                check_fits(net, n)
            except DataError as exc:
                raise BenchError(f"--images: {exc}") from None
    if device.info().kind == "cpu":
        raise BenchError("no usable GPU here and the CUDA simulator is off, so the GPU stages cannot run: set "
                         "NUMBA_ENABLE_CUDASIM=1 (before starting Python) to run them on the simulator, or bench on a "
                         "GPU machine. " + " ".join(n for n in device.info().notes if "numba.cuda" in n))
    return numbers


def _cells(path: Path, tagged_cells) -> list:
    try:
        return tagged_cells(read(path))
    except NotebookError:
        return []


def _stage_paths(notebooks: Path, selected: list[str] | None) -> list[Path]:
    """The folder's notebooks to run, in order: a notebook whose source lies beside it (a solution's NN_topic.py,
    ``labkit.nbcells``) as that source, the others as they are."""
    paths = [source_of(p) if source_of(p).is_file() else p for p in sorted(notebooks.glob("*.ipynb"))]
    if selected:
        paths = [p for p in paths if p.name[:2] in selected]
    return paths


#: what a bench writes into its folder (``--force`` removes these, and only these, before a run); ``UNFINISHED``
#: (``labkit.unfinished``) only while it runs, and after it when it did not finish
OUTPUT_FILES = ("ledger.jsonl", "bench.json", "bench.csv", "summary.md", unfinished.MARKER)
OUTPUT_PLOTS = ("ladder_*.png", "layers_*.png", "roofline_*.png")


def default_out() -> Path:
    return repo_root() / "results" / "scratch"


def prepare_out(out: Path | None, force: bool = False, append: bool = False) -> Path:
    """Check the output folder before the ladder runs: it can be created or written, and it holds no results
    unless asked: ``force`` removes the earlier run's files (``OUTPUT_FILES`` and plots; nothing else), ``append``
    adds this run's rows to them, only when they are this device's. Returns the folder."""
    out = Path(out or default_out())
    try:
        writable_folder(out, "--out")
    except OutputError as exc:
        raise BenchError(str(exc)) from None
    held = contents(out)
    if not held:
        return out
    if force and append:
        raise BenchError("--force and --append do not go together: replace the folder's results, or add to them")
    if force:
        for path in [*(out / name for name in OUTPUT_FILES), *(p for pat in OUTPUT_PLOTS for p in out.glob(pat))]:
            path.unlink(missing_ok=True)
        return out
    if not append:
        raise BenchError(f"--out {out} already holds {listed(held)}: pass --append to add this run's rows (same "
                         f"device only), --force to replace the earlier results, or name a new folder")
    here, there = device.label(), folder_device(out)
    if there is None:
        raise BenchError(f"--append: {out} holds no bench results to add to (no bench.json or ledger.jsonl, but "
                         f"{listed(held)}): name a new folder, or pass --force to write into it")
    if there != here:
        raise BenchError(f"--append: {out} holds results of {there}, and this machine is {here}: one folder keeps "
                         f"one device's results, so name a new folder")
    return out


def folder_device(out: Path) -> str | None:
    """The device of a bench folder's results (its bench.json, else its ledger's first line), or None."""
    try:
        return json.loads((out / "bench.json").read_text())["meta"]["device"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        first = Ledger(out / "ledger.jsonl").first_line()
    except ValueError:
        return None
    return first["device"] if first else None


def bench(stage_numbers: list[str] | None = None, nets: list[str] | None = None, images: tuple[int, ...] | None = None,
          notebooks: Path | None = None, out: Path | None = None, repeat: int = 3, limits: Limits = Limits(),
          baselines: bool = True, command: str | None = None, progress: bool = True,
          skip: list[str] | None = None, append: bool = False, random_weights: bool = False) -> list[dict]:
    """Run the ladder; return one row per (stage, variant, net, images) and write them under ``out``.

    ``images``: the image counts of every net (default: each net's own workloads, e.g. 1200 and 50000 for cifar10,
    100, 1000 and 10000 for fashion). ``skip``: shell patterns matched against the variant name and against
    "NN name"; matches are listed, not run. ``random_weights``: a net whose weights are neither shipped nor found
    (ece408) runs on seeded random weights of its shapes (``stand_in_weights``), each row's workload saying so.
    ``append``: the rows of the bench.json already in ``out`` are kept
    (those this run measures again are replaced); ``prepare_out`` checks a folder first. ``out`` holds an
    ``UNFINISHED`` file (``labkit.unfinished``) from the start until bench.json is written, so a run that is cut
    off (its ledger holds the rows measured so far) is never read as a finished one.
    """
    out = Path(out or default_out())
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / "ledger.jsonl")
    notebooks = Path(notebooks or stages.solutions_folder())
    command = command or " ".join(["labkit", *sys.argv[1:]])
    unfinished.mark(out, command)  # until bench.json is written: a run cut off leaves its folder marked
    call = _Call(images, limits, repeat, skip, random_weights, ledger, command)
    jobs = _jobs(notebooks, stage_numbers, nets)
    lifted = call.lifted(jobs)
    rows: list[dict] = []
    base_nets = list(dict.fromkeys(nets or [net for *_, net in jobs] or ["cifar10"]))
    bar = tqdm(total=sum(len(call.sizes(net)) for *_, net in jobs)
               + (sum(len(call.sizes(net)) for net in base_nets) if baselines else 0),
               disable=not progress, desc="bench", unit="run")
    for path, name, variant, net in jobs:
        rows += _job_rows(call, path, name, variant, net, lifted, bar)
    if baselines:
        for net in base_nets:
            for n in call.sizes(net):
                rows += bench_baselines.baselines(net, n, call.reference_of, ledger, command, repeat)
                bar.update()
    bar.close()
    written = Rows(rows, bench_files.write(out, rows, command, append=append))
    unfinished.clear(out)
    return written


def _jobs(notebooks: Path, stage_numbers: list[str] | None, nets: list[str] | None) -> list[tuple]:
    """(path, name, variant, net) of every variant of the notebooks' stages on every net it runs (of ``nets``, when
    given); a notebook whose variants cannot load is said in one line and left out."""
    jobs = []
    for path in _stage_paths(Path(notebooks), stage_numbers):
        try:
            variants = stages.load_variants(path)
        except NotebookError as exc:
            if "no VARIANTS" not in str(exc):
                print(f"{path.name}: not benched: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - a broken notebook must not stop the ladder
            print(f"{path.name}: not benched: its kernel cells raised {type(exc).__name__}: {exc}")
            continue
        for name, variant in variants.items():
            for net in nets or variant.nets:  # asked for: every net the variant runs (ece408 runs fashion's)
                if variant.runs_on(net):
                    jobs.append((path, name, variant, net))
    return jobs


@dataclass
class _Call:
    """One bench call's settings, and what its rows share: the workloads and the numpy reference's runs on them
    (``reference_of``), and the functions already checked."""

    images: tuple[int, ...] | None
    limits: Limits
    repeat: int
    skip: list[str] | None
    random_weights: bool
    ledger: Ledger
    command: str
    refs: dict = dataclasses.field(default_factory=dict)
    picked: dict = dataclasses.field(default_factory=dict)  # (net, images, target) -> key of its workload in refs
    #: a function several variants share (given code) is checked once, not once per variant
    checked: dict = dataclasses.field(default_factory=dict)

    def sizes(self, net: str) -> tuple[int, ...]:
        return tuple(self.images) if self.images else get_net(net).workloads

    def capped_at(self, variant) -> int | None:
        return None if _slow_kind(variant) is None else self.limits.per_image if variant.per_image else self.limits.cpu

    def left_out(self, path, name) -> bool:
        stage = stages.stage_of(path)
        label = stages.label(stage.number if stage else path.stem, name)
        return any(fnmatch(name, pat) or fnmatch(label, pat) for pat in self.skip or ())

    def lifted(self, jobs: list[tuple]) -> dict:
        """(path, net) -> the variant that keeps a row there though capped: a stage whose variants on a net are all
        capped below its smallest size (stage 01's serial code, when per-image runs stop below CIFAR's 1200 images)
        still gets one row there: its first variant's."""
        lifted = {}
        for path, name, variant, net in jobs:
            if not self.left_out(path, name):
                lifted.setdefault((path, net), name)
        for path, name, variant, net in jobs:
            cap = self.capped_at(variant)
            if not self.left_out(path, name) and (cap is None or min(self.sizes(net)) <= cap):
                lifted.pop((path, net), None)
        return lifted

    def reference_of(self, net, n, target):
        """The workload and the numpy reference's timed run on it, made once per distinct workload (on a GPU the
        CPU and GPU targets get the same one): at 50000 images the inputs take 600 MB and the reference a minute,
        and its run is both the truth for predictions and the CPU baseline."""
        if (net, n, target) not in self.picked:
            stand_in = stand_in_weights(net) if self.random_weights else None
            wl = workload(net, n, target=target, tile=True, quiet=True, weights=stand_in)
            if stand_in is not None and not wl.simulated:
                wl = dataclasses.replace(wl, note=f"{wl.note}; RANDOM weights (seed 0: the course's were not "
                                                  f"found; times hold, accuracy means nothing)")
            key = (wl.net.name, wl.images, wl.note)
            if key not in self.refs:
                self.refs[key] = (wl, run(wl, label=bench_baselines.REFERENCE_STAGE, warmup=False, quiet=True))
            self.picked[(net, n, target)] = key
        return self.refs[self.picked[(net, n, target)]]


def _job_rows(call: _Call, path, name, variant, net, lifted: dict, bar) -> list[dict]:
    """One variant's rows on one net: checked once, then a row per image count (timed, or why not), then a
    pipeline variant's end-to-end rows."""
    stage = stages.stage_of(path)
    label = stages.label(stage.number if stage else path.stem, name)
    skipped = call.left_out(path, name)
    checks = [] if skipped or variant.unavailable() else check_variant(variant, net, quiet=True, done=call.checked)
    failed = [str(c) for c in checks if not c.passed]
    rows = []
    for n in call.sizes(net):
        row = {"stage": label, "notebook": notebook_name(path), "variant": name, "net": net, "images": n,
               "target": variant.target, "arrays": variant.arrays, "per_image": variant.per_image,
               "checks": "-" if skipped else "PASS" if not failed else "FAIL", "check_failures": failed}
        slow, limit = _slow_kind(variant), call.capped_at(variant)
        if slow and lifted.get((path, net)) == name and n == min(call.sizes(net)):
            limit = n  # the stage's one row on this net
        work = _gflop(net, n)
        if skipped:
            row["skipped"] = "left out by --skip"
        elif variant.unavailable():
            row["skipped"] = variant.unavailable()
        elif failed:
            row["skipped"] = "checks failed"
        elif slow and n > limit:
            row["skipped"] = f"{slow} variants run up to {limit} images"
        elif slow and call.limits.slow_gflop is not None and work > call.limits.slow_gflop:
            row["skipped"] = (f"{slow} variants run on workloads up to {call.limits.slow_gflop:g} GFLOP "
                              f"(this one: {work:.1f})")
        else:
            _time_row(call, row, variant, net, n, label)
        rows.append(row)
        bar.update()
    if variant.pipeline is not None and net == "cifar10" and not (skipped or variant.unavailable() or failed):
        rows += _end_to_end(label, name, variant, max(call.sizes(net)), call.reference_of, call.repeat,
                            call.limits.budget_s)
    return rows


def _time_row(call: _Call, row: dict, variant, net: str, n: int, label: str) -> None:
    """Time the variant on the workload of ``n`` images into ``row`` (its numbers, accuracy, predictions against
    the reference's, a GPU variant's whole call), recording its run in the ledger; an error is the row's."""
    limits = call.limits
    try:
        wl, ref_run = call.reference_of(net, n, variant.target)
        ref_pred = ref_run.predictions
        times = (limits.cpu_repeat if variant.target == "cpu" else
                 limits.per_image_repeat if variant.per_image else call.repeat)
        managed_before = gpu.MANAGED.handed
        r = run(wl, variant, label=label, quiet=True, repeat=times, budget_s=limits.budget_s)
        managed = gpu.MANAGED.handed > managed_before  # its functions took lk.gpu.managed_buffer
        rep, preds = r.report, r.predictions
        call.ledger.record(rep, command=call.command)
        ref_acc = None if wl.labels is None else reference.accuracy(ref_pred, wl.labels)
        row.update(row_numbers(rep, wl.net), accuracy=rep.accuracy, reference_accuracy=ref_acc,
                   predictions_equal=bool(np.array_equal(preds, ref_pred)),
                   simulated=rep.simulated, workload=wl.note)
        if variant.target == "gpu":
            row.update(_whole_call(wl, variant, times, limits.budget_s, rep, managed))
    except Exception as exc:  # noqa: BLE001 - one broken variant must not stop the ladder
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=4)


def stand_in_weights(net: str) -> dict | None:
    """Seeded random weights for a net the kit neither ships nor finds weights of (None where it has them): the
    workload's note says so, as every row and the summary repeat it."""
    if net not in NOT_SHIPPED or course_weights(net) is not None:
        return None
    return random_weights(net, seed=0)


class Rows(list):
    """A bench's rows and the folder its outputs went to (``out``, or a fallback folder where ``out`` failed)."""

    def __init__(self, rows: list[dict], folder: Path):
        super().__init__(rows)
        self.folder = folder


def _whole_call(wl, variant, repeat: int, budget_s: float | None, per_layer: RunReport | None = None,
                managed: bool = False) -> dict:
    """The whole call's columns (``bench_whole``) and the fraction of the fp32 floor it reaches; a failure (a
    graph that cannot be captured, say) is one line in ``whole_call_error``, the per-layer row stays.
    ``per_layer``: the report of the row's per-layer run just before (same variant, same workload), whose slowest
    pass tells the whole call whether it needs an untimed call of its own (``bench_whole.own_warmup``); ``managed``:
    that run took managed buffers."""
    slowest = None if per_layer is None else max(per_layer.total_range or (per_layer.total,))
    try:
        out = bench_whole.whole_call(wl, variant, repeat, budget_s, per_layer_pass_s=slowest, managed=managed)
    except Exception as exc:  # noqa: BLE001 - recorded in the row
        return {"whole_call_error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {**out, **bench_whole.floor(wl.net, wl.images, out["whole_call_s"], variant)}


def _end_to_end(label: str, name: str, variant, images: int, reference_of, repeat: int,
                budget_s: float | None) -> list[dict]:
    """A pipeline variant's end-to-end rows (``bench_whole.end_to_end``) at ``images`` cifar10 images (the
    simulator's few on the simulator); one row with the error when they cannot run."""
    try:
        wl, ref_run = reference_of("cifar10", images, variant.target)
        return bench_whole.end_to_end(label, name, variant, wl, ref_run.predictions, repeat, budget_s)
    except Exception as exc:  # noqa: BLE001 - one broken pipeline must not stop the ladder
        return [{"stage": f"{label}: end to end", "variant": name, "net": "cifar10", "images": images,
                 "target": "gpu", "kind": "end_to_end", "error": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc(limit=4)}]


def _slow_kind(variant) -> str | None:
    """Which capped kind a variant is (its runs take seconds: a launch per layer and image, or numba on the CPU),
    or None for batched GPU code, which runs at every size."""
    return "per-image" if variant.per_image else "CPU" if variant.target == "cpu" else None


def _gflop(net: str, images: int) -> float:
    """The forward pass's work on ``images`` images, from the spec (a multiply-add counts 2)."""
    return sum(c.flops for c in net_cost(get_net(net), images).values()) / 1e9


def rows_from_ledgers(paths: list[Path]) -> list[dict]:
    """Ladder rows (one per recorded run) from ledger files, e.g. several bench calls on one device."""
    rows = []
    for path in paths:
        for rep in Ledger(path).reports():
            rows.append({"stage": rep.stage or "?", "net": rep.net, "images": rep.images, "checks": "PASS"
                         if rep.stage and rep.stage[:2].isdigit() else "-", **row_numbers(rep, rep.net),
                         "accuracy": rep.accuracy, "simulated": rep.simulated, "source": str(path)})
    return rows


def summarize(paths: list[Path], out: Path, command: str) -> list[dict]:
    """Table, CSV and plots of the runs recorded in ``paths`` (one device), written under ``out``."""
    rows = sorted(rows_from_ledgers(paths), key=lambda r: (r["net"], r["images"]))
    out.mkdir(parents=True, exist_ok=True)
    reports = [rep for path in paths for rep in Ledger(path).reports()]
    devices = sorted({r["device"] for r in rows})
    text = table(rows)
    (out / "summary.md").write_text(f"# Speed ladder on {', '.join(devices)}\n\nMade by `{command}` from "
                                    f"{', '.join(str(p) for p in paths)}.\nSpeedups are over the first row of "
                                    f"the same net and image count. Accuracy equal to the numpy reference's "
                                    f"row means the same predictions count.\n\n```\n{text}\n```\n")
    for net, n in sorted({(r["net"], r["images"]) for r in rows}):
        plots.save(plots.stage_ladder(reports, net, images=n), out / f"ladder_{net}_{n}.png")
    return rows


