"""The speed ladder: check and time every variant of every stage notebook in one run, on this machine.

Each variant is checked first (fresh inputs, several batch sizes), then timed on real images (warm-up, then
the per-layer median of several runs), and its predictions are compared with the numpy reference's on the
same images. Results go to a ledger (JSON lines) with the device, date and command, bench.json (with the library
versions and the device's ceilings), a CSV summary, and plots (ladder, per-layer bars, roofline).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import importlib.util
import json
import platform
import re
import sys
import traceback
from dataclasses import dataclass
from fnmatch import fnmatch
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

import numpy as np
from tqdm import tqdm  # plain text bar: works in a terminal and in a notebook without ipywidgets

from ..about import __version__
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
from ..ops import tensor_cores
from ..outputs import OutputError, contents, listed, writable_folder, write_or_fallback
from . import bench_whole, benchdoc, ceilings, cudnn, plots, unfinished

REFERENCE_STAGE = stages.REFERENCE_LABEL


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
    def sizes(net: str) -> tuple[int, ...]:
        return tuple(images) if images else get_net(net).workloads

    out = Path(out or default_out())
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / "ledger.jsonl")
    notebooks = Path(notebooks or stages.solutions_folder())
    command = command or " ".join(["labkit", *sys.argv[1:]])
    unfinished.mark(out, command)  # until bench.json is written: a run cut off leaves its folder marked
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
    def capped_at(variant) -> int | None:
        return None if _slow_kind(variant) is None else limits.per_image if variant.per_image else limits.cpu

    def left_out(path, name) -> bool:
        stage = stages.stage_of(path)
        label = stages.label(stage.number if stage else path.stem, name)
        return any(fnmatch(name, pat) or fnmatch(label, pat) for pat in skip or ())

    # a stage whose variants on a net are all capped below its smallest size (stage 01's serial code, when per-image
    # runs stop below CIFAR's 1200 images) still gets one row there: its first variant's
    lifted = {}
    for path, name, variant, net in jobs:
        if not left_out(path, name):
            lifted.setdefault((path, net), name)
    for path, name, variant, net in jobs:
        cap = capped_at(variant)
        if not left_out(path, name) and (cap is None or min(sizes(net)) <= cap):
            lifted.pop((path, net), None)
    rows: list[dict] = []
    refs: dict = {}
    checked: dict = {}  # a function several variants share (given code) is checked once, not once per variant
    base_nets = list(dict.fromkeys(nets or [net for *_, net in jobs] or ["cifar10"]))
    bar = tqdm(total=sum(len(sizes(net)) for *_, net in jobs)
               + (sum(len(sizes(net)) for net in base_nets) if baselines else 0),
               disable=not progress, desc="bench", unit="run")

    picked: dict = {}  # (net, images, target) -> key of its workload in refs

    def reference_of(net, n, target):
        """The workload and the numpy reference's timed run on it, made once per distinct workload (on a GPU the
        CPU and GPU targets get the same one): at 50000 images the inputs take 600 MB and the reference a minute,
        and its run is both the truth for predictions and the CPU baseline."""
        if (net, n, target) not in picked:
            stand_in = stand_in_weights(net) if random_weights else None
            wl = workload(net, n, target=target, tile=True, quiet=True, weights=stand_in)
            if stand_in is not None and not wl.simulated:
                wl = dataclasses.replace(wl, note=f"{wl.note}; RANDOM weights (seed 0: the course's were not "
                                                  f"found; times hold, accuracy means nothing)")
            key = (wl.net.name, wl.images, wl.note)
            if key not in refs:
                refs[key] = (wl, run(wl, label=REFERENCE_STAGE, warmup=False, quiet=True))
            picked[(net, n, target)] = key
        return refs[picked[(net, n, target)]]

    for path, name, variant, net in jobs:
        stage = stages.stage_of(path)
        label = stages.label(stage.number if stage else path.stem, name)
        skipped = left_out(path, name)
        checks = [] if skipped or variant.unavailable() else check_variant(variant, net, quiet=True, done=checked)
        failed = [str(c) for c in checks if not c.passed]
        for n in sizes(net):
            row = {"stage": label, "notebook": notebook_name(path), "variant": name, "net": net, "images": n,
                   "target": variant.target, "arrays": variant.arrays, "per_image": variant.per_image,
                   "checks": "-" if skipped else "PASS" if not failed else "FAIL", "check_failures": failed}
            slow, limit = _slow_kind(variant), capped_at(variant)
            if slow and lifted.get((path, net)) == name and n == min(sizes(net)):
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
            elif slow and limits.slow_gflop is not None and work > limits.slow_gflop:
                row["skipped"] = (f"{slow} variants run on workloads up to {limits.slow_gflop:g} GFLOP "
                                  f"(this one: {work:.1f})")
            else:
                try:
                    wl, ref_run = reference_of(net, n, variant.target)
                    ref_pred = ref_run.predictions
                    times = (limits.cpu_repeat if variant.target == "cpu" else
                             limits.per_image_repeat if variant.per_image else repeat)
                    managed_before = gpu.MANAGED.handed
                    r = run(wl, variant, label=label, quiet=True, repeat=times, budget_s=limits.budget_s)
                    managed = gpu.MANAGED.handed > managed_before  # its functions took lk.gpu.managed_buffer
                    rep, preds = r.report, r.predictions
                    ledger.record(rep, command=command)
                    ref_acc = None if wl.labels is None else reference.accuracy(ref_pred, wl.labels)
                    row.update(_row_numbers(rep, wl.net), accuracy=rep.accuracy, reference_accuracy=ref_acc,
                               predictions_equal=bool(np.array_equal(preds, ref_pred)),
                               simulated=rep.simulated, workload=wl.note)
                    if variant.target == "gpu":
                        row.update(_whole_call(wl, variant, times, limits.budget_s, rep, managed))
                except Exception as exc:  # noqa: BLE001 - one broken variant must not stop the ladder
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    row["traceback"] = traceback.format_exc(limit=4)
            rows.append(row)
            bar.update()
        if variant.pipeline is not None and net == "cifar10" and not (skipped or variant.unavailable() or failed):
            rows += _end_to_end(label, name, variant, max(sizes(net)), reference_of, repeat, limits.budget_s)
    if baselines:
        for net in base_nets:
            for n in sizes(net):
                rows += _baselines(net, n, reference_of, ledger, command, repeat)
                bar.update()
    bar.close()
    written = Rows(rows, _write(out, rows, command, append=append))
    unfinished.clear(out)
    return written


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


def _row_numbers(rep: RunReport, net) -> dict:
    kinds = rep.by_kind(net)
    thr = rep.throughput(net)
    conv = [r for r in thr.values() if r["kind"] == "conv"]
    conv_flops = sum(r["flops"] for r in conv)
    conv_bytes = sum(r["bytes"] for r in conv)  # the spec's minimum: each element moved once
    return {"total_s": rep.total, "conv_s": kinds.get("conv", 0.0), "layer_seconds": rep.layer_seconds,
            "conv_gflops": conv_flops / kinds["conv"] / 1e9 if kinds.get("conv") else None,
            "conv_gbs": conv_bytes / kinds["conv"] / 1e9 if kinds.get("conv") else None,
            "total_range": rep.total_range, "runs": rep.runs, "device": rep.device, "method": rep.method}


def _baselines(net: str, n: int, reference_of, ledger, command, repeat) -> list[dict]:
    """numpy reference on the CPU, and cuDNN through PyTorch where it is installed with a GPU."""
    rows = []
    wl, r = reference_of(net, n, "cpu")
    ref_pred = r.predictions
    ledger.record(r.report, command=command)
    rows.append({"stage": REFERENCE_STAGE, "variant": "reference", "net": net, "images": n, "target": "cpu",
                 "checks": "-", **_row_numbers(r.report, wl.net), "accuracy": r.report.accuracy,
                 "predictions_equal": True, "simulated": False, "workload": wl.note})
    if cudnn.available():
        rep, preds = cudnn.time_forward(wl, repeat=max(repeat, 5))
        ledger.record(rep, command=command)
        row = {"stage": rep.stage, "variant": "cudnn", "net": net, "images": n, "target": "gpu",
               "checks": "-", **_row_numbers(rep, wl.net), "accuracy": rep.accuracy,
               "predictions_equal": bool(np.array_equal(preds, ref_pred)), "simulated": False,
               "workload": wl.note}
        try:  # the whole torch forward and the copy of its output to the host, in this process, as the kit's
            seconds, _ = cudnn.whole_call(wl, repeat=max(repeat, 5))
            row.update(whole_call_s=float(np.median(seconds)), whole_call_range=(min(seconds), max(seconds)),
                       whole_call_runs=len(seconds), whole_call_how=CUDNN_WHOLE_CALL,
                       **bench_whole.floor(wl.net, n, float(np.median(seconds))))
        except Exception as exc:  # noqa: BLE001 - the per-layer row stays
            row["whole_call_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
        rows.append(_peer(wl, n, ref_pred, ledger, command, repeat))
    return rows


def _peer(wl, n: int, ref_pred, ledger, command, repeat) -> dict:
    """cuDNN as stage 10's peer (``cudnn.PEER``: fp16, channels_last), in the same process as its fp32 row: its
    layers timed one by one, its whole call a CUDA graph replay and the probabilities copied to the host; the
    predictions compared with the numpy reference's (``predictions_differing``: fp16 may move a few). The fp32
    floor's fraction only: the units' floor (``labkit.floors``) is the kit's fp32-accurate one."""
    row = {"stage": cudnn.stage_label(_torch_version(), cudnn.PEER), "variant": "cudnn_peer", "net": wl.net.name,
           "images": n, "target": "gpu", "checks": "-", "simulated": False, "workload": wl.note}
    try:
        rep, preds = cudnn.time_forward(wl, repeat=max(repeat, 5), precision=cudnn.PEER)
        ledger.record(rep, command=command)
        row.update(stage=rep.stage, **_row_numbers(rep, wl.net), accuracy=rep.accuracy,
                   predictions_equal=bool(np.array_equal(preds, ref_pred)),
                   predictions_differing=int(np.count_nonzero(preds != ref_pred)))
        seconds, _ = cudnn.peer_call(wl, repeat=max(repeat, 5))
        whole = float(np.median(seconds))
        row.update(whole_call_s=whole, whole_call_range=(min(seconds), max(seconds)), whole_call_runs=len(seconds),
                   whole_call_how=cudnn.PEER_WHOLE_CALL,
                   **{k: v for k, v in bench_whole.floor(wl.net, n, whole).items() if not k.startswith("limit")})
    except Exception as exc:  # noqa: BLE001 - one line in the row; the ladder goes on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "not installed"


CUDNN_WHOLE_CALL = "torch forward (launches + output copy to host)"


def versions() -> dict:
    """Library versions a timing depends on; absent libraries are left out."""
    out = {"python": platform.python_version()}

    out["labkit"] = __version__  # the package's own, not an installed copy's metadata
    for dist in ("numpy", "numba", "numba-cuda"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    if importlib.util.find_spec("cupy") is not None:  # found, not imported: importing it may touch the driver
        names = sorted(d.metadata["Name"] for d in distributions() if (d.metadata["Name"] or "").startswith("cupy"))
        if names:
            out["cupy"] = f"{version(names[0])} ({names[0]})"
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            out["torch"] = torch.__version__
            out["cudnn"] = torch.backends.cudnn.version()
        except Exception as exc:  # noqa: BLE001 - a torch that cannot load: say so, bench on
            out["torch"] = f"installed, not loadable ({type(exc).__name__})"
    return out


def _ceilings_meta(device_label: str) -> dict | None:
    roof = ceilings.for_device(device_label)
    return None if roof is None else {"device": roof.device, "flops": roof.flops, "bandwidth": roof.bandwidth,
                                      "source": roof.source}


#: the notes of ``_above_the_roof`` (and of runs before the tensor cores' wording)
_ROOF_NOTE = re.compile(r"that ceiling is too low|above the FMA units' fp32 ceiling")


def _above_the_roof(rows: list[dict], meta: dict) -> list[str]:
    """Notes for runs faster than the recorded fp32 ceiling (the FMA units'): a kit stage at a workload whose convs
    have recorded tensor-core choices is not bound by it; any other such run means the ceiling is wrong."""
    roof = meta.get("ceilings")
    if not roof:
        return []
    notes = []
    for r in rows:
        if "total_s" not in r or not r.get("conv_gflops") or r["conv_gflops"] * 1e9 <= roof["flops"]:
            continue
        said = (f"{r['stage']} ({r['net']}, {r['images']} images) reached {r['conv_gflops'] / 1e3:.1f} TFLOP/s in "
                f"its convolutions, above the FMA units' fp32 ceiling of {roof['flops'] / 1e12:.1f} TFLOP/s "
                f"({roof['source']}): ")
        on_tc = tensor_cores.layers_on_tensor_cores(r["net"], r["images"]) if r["stage"][:2].isdigit() else []
        notes.append(said + (f"its {', '.join(on_tc)} ran on the tensor cores (lk.tensor_cores), which that ceiling "
                             f"does not bound" if on_tc else "that ceiling is too low"))
    return notes


def refresh_ceilings(out: Path) -> dict:
    """Redraw a bench folder's plots against the ceilings known now for its device (``labkit.ceilings``), when the
    ones its run recorded were wrong; the note says what was replaced and when. Returns the new meta."""
    out = Path(out)
    data = json.loads((out / "bench.json").read_text())
    meta, rows = data["meta"], data["rows"]
    old, new = meta.get("ceilings"), _ceilings_meta(meta["device"])
    if old != new:
        was = "none" if not old else f"{old['flops'] / 1e12:.1f} TFLOP/s, {old['bandwidth'] / 1e12:.2f} TB/s " \
                                     f"({old['source']})"
        above = len(_above_the_roof(rows, {"ceilings": old}))
        why = f", which {above} of its runs exceeded" if above else ""
        meta["notes"] = [n for n in meta.get("notes", []) if not n.startswith("roofline skipped")] + [
            f"ceilings replaced on {dt.date.today().isoformat()}: the run recorded {was}{why}"]
        meta["ceilings"] = new
    meta["notes"] = [n for n in meta["notes"] if not _ROOF_NOTE.search(n)] + _above_the_roof(rows, meta)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    _plots(out, rows, meta)
    return meta


def refresh_plots(out: Path) -> None:
    """Draw a bench folder's plots again from its bench.json (a run cut off while plotting, say)."""
    data = json.loads((Path(out) / "bench.json").read_text())
    _plots(Path(out), data["rows"], data["meta"])


def _latest(reports: list[RunReport], labels: list[str], device_label: str) -> list[RunReport]:
    """The newest run of each label of this bench call on this device, in the rows' order (the ledger may hold
    runs of earlier calls into the same folder)."""
    newest = {r.stage: r for r in reports if r.device == device_label and r.stage in labels}
    return [newest[label] for label in labels if label in newest]


def _plots(out: Path, rows: list[dict], meta: dict) -> None:
    """Ladder, per-layer bars and roofline of every (net, images) with timed rows; a failure costs one plot."""
    roof = ceilings.Ceilings(**meta["ceilings"]) if meta["ceilings"] else None
    for net, n in sorted({(r["net"], r["images"]) for r in rows if "total_s" in r}):
        reports = Ledger(out / "ledger.jsonl").reports(net=net, images=n)
        timed = [r for r in rows if "total_s" in r and (r["net"], r["images"]) == (net, n)]
        ours = _latest(reports, [r["stage"] for r in timed], meta["device"])
        gpu = _latest(reports, [r["stage"] for r in timed if r.get("target") == "gpu"], meta["device"])
        if roof and not gpu:
            print(f"(roofline of {net}, {n} images skipped: no GPU runs)")
        todo = [("ladder", plots.stage_ladder, (reports, net, n), bool(reports)),
                ("layers", plots.layer_bars, (ours, None, False, _spread(ours) > 20), bool(ours)),
                ("roofline", plots.roofline_runs, (_fastest_per_stage(gpu), roof), bool(roof and gpu))]
        for kind, draw, args, wanted in todo:
            if not wanted:
                continue
            try:
                plots.save(draw(*args), out / f"{kind}_{net}_{n}.png")
            except Exception as exc:  # noqa: BLE001 - a plot must not lose the numbers
                print(f"({kind} plot of {net}, {n} images skipped: {type(exc).__name__}: {exc})")


def _fastest_per_stage(reports: list[RunReport]) -> list[RunReport]:
    """The fastest run of each stage (and each baseline): a roofline of every variant is a cloud nobody can read."""
    def key(r: RunReport) -> str:
        return (r.stage or "").split(" ", 1)[0] if stages.order_key(r.stage)[0] == 0 else r.stage

    best: dict[str, RunReport] = {}
    for r in reports:
        if key(r) not in best or r.total < best[key(r)].total:
            best[key(r)] = r
    return [r for r in reports if best[key(r)] is r]


def _spread(reports: list[RunReport]) -> float:
    totals = [r.total for r in reports if r.total > 0]
    return max(totals) / min(totals) if totals else 1.0


def _appended(out: Path, rows: list[dict], meta: dict) -> list[dict]:
    """The rows of the bench.json already in ``out``, but those ``rows`` measure again, then ``rows``; ``meta``
    gets the earlier calls' dates and commands."""
    try:
        old = json.loads((out / "bench.json").read_text())
    except (OSError, ValueError):
        return rows
    key = lambda r: (r.get("stage"), r.get("variant"), r.get("net"), r.get("images"))  # noqa: E731
    new = {key(r) for r in rows}
    om = old.get("meta", {})
    meta["earlier"] = [*om.get("earlier", []), {"date": om.get("date"), "command": om.get("command")}]
    return [r for r in old.get("rows", []) if key(r) not in new] + rows


def _write(out: Path, rows: list[dict], command: str, append: bool = False) -> Path:
    """bench.json, bench.csv, summary.md and the plots; a folder that fails now (removed, full) gets them written
    to a fallback folder, named, with a copy of the ledger: the measured rows are never lost."""
    label = device.label()
    meta = {"device": label, "simulated": device.info().simulated, "date": dt.datetime.now(
        dt.timezone.utc).isoformat(timespec="seconds"), "command": command, "python": platform.python_version(),
        "versions": versions(), "ceilings": _ceilings_meta(label), "notes": []}
    if append:
        rows = _appended(out, rows, meta)
    if meta["ceilings"] is None:
        meta["notes"].append(f"roofline skipped: no fp32 or bandwidth ceilings known for {label}")
        print(f"({meta['notes'][-1]})")
    for note in _above_the_roof(rows, meta):
        meta["notes"].append(note)
        print(f"({note})")

    def write(folder: Path) -> None:
        if folder != out and (out / "ledger.jsonl").is_file():
            try:
                (folder / "ledger.jsonl").write_bytes((out / "ledger.jsonl").read_bytes())
            except OSError:
                pass
        _write_files(folder, rows, command, meta)

    return write_or_fallback(out, write, "bench results")


def _write_files(out: Path, rows: list[dict], command: str, meta: dict) -> None:
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    fields = ["stage", "net", "images", "checks", "total_s", "whole_call_s", "whole_call_how", "floor_fraction",
              "limit_s", "limit_fraction", "conv_s", "conv_gflops", "conv_gbs", "accuracy", "reference_accuracy",
              "predictions_equal", "e2e_s",
              "chunk", "streams", "classes_differing", "simulated", "skipped", "error"]
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "summary.md").write_text(f"# Bench: {meta['device']}\n\n{meta['date']}, `{command}`\n\n```\n"
                                    f"{table(rows)}\n```\n")
    unfinished.clear(out)  # every row is written: the plots are drawn from them and can be redrawn (refresh_plots)
    _plots(out, rows, meta)


def rows_from_ledgers(paths: list[Path]) -> list[dict]:
    """Ladder rows (one per recorded run) from ledger files, e.g. several bench calls on one device."""
    rows = []
    for path in paths:
        for rep in Ledger(path).reports():
            rows.append({"stage": rep.stage or "?", "net": rep.net, "images": rep.images, "checks": "PASS"
                         if rep.stage and rep.stage[:2].isdigit() else "-", **_row_numbers(rep, rep.net),
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


def _yes_no(value) -> str:
    return "-" if value is None else "yes" if value else "NO"


def table(rows: list[dict]) -> str:
    """Stage ladder as text: one line per run; speedup over the baseline of the same net and image count
    (``labkit.stages.speedup_baseline``: the numpy reference when it ran); ``whole s``: the whole call
    (``bench_whole``: launches and download, a graph replay where the variant has one: marked ``g``); ``%floor``:
    the fp32 floor over the whole call; ``%limit``: the floor of the units the call runs on (``labkit.floors``)
    over the whole call; ``runs``: the timed runs its times are the median of. End-to-end rows (host bytes to
    host classes) follow in a table of their own; then each workload's whole calls against the peers
    (``peers``)."""
    ladder = [r for r in rows if r.get("kind") != "end_to_end"]
    lines = [f"{'stage':<34} {'net':<8} {'images':>6} {'check':<5} {'total s':>10} {'whole s':>11} {'conv s':>10} "
             f"{'conv GF/s':>9} {'conv GB/s':>9} {'%floor':>6} {'%limit':>6} {'speedup':>8} {'accuracy':>8} "
             f"{'=ref':>4} {'runs':>4}"]
    timed: dict = {}
    for r in ladder:
        if "total_s" in r:
            timed.setdefault((r["net"], r["images"]), {})[r["stage"]] = r["total_s"]
    base = {key: runs[stages.speedup_baseline(runs)] for key, runs in timed.items()}
    for r in ladder:
        key = (r["net"], r["images"])
        if "total_s" not in r:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"{r['stage']:<34} {r['net']:<8} {r['images']:>6} {r.get('checks', ''):<5} {why}")
            continue
        acc = "n/a" if r.get("accuracy") is None else f"{100 * r['accuracy']:.2f}"
        gf = "-" if r.get("conv_gflops") is None else f"{r['conv_gflops']:.1f}"
        gb = "-" if r.get("conv_gbs") is None else f"{r['conv_gbs']:.1f}"
        whole = "-" if r.get("whole_call_s") is None else \
            f"{r['whole_call_s']:.6f}" + ("g" if r.get("whole_call_how") == bench_whole.WHOLE_CALL_GRAPH else " ")
        floor = "-" if r.get("floor_fraction") is None else f"{100 * r['floor_fraction']:.1f}"
        limit = "-" if r.get("limit_fraction") is None else f"{100 * r['limit_fraction']:.1f}"
        lines.append(f"{r['stage']:<34} {r['net']:<8} {r['images']:>6} {r.get('checks', ''):<5} "
                     f"{r['total_s']:>10.6f} {whole:>11} {r['conv_s']:>10.6f} {gf:>9} {gb:>9} {floor:>6} "
                     f"{limit:>6} {base[key] / r['total_s']:>7.1f}x {acc:>8} "
                     f"{_yes_no(r.get('predictions_equal')):>4} {r.get('runs', '?'):>4}")
    e2e = [r for r in rows if r.get("kind") == "end_to_end"]
    if e2e:
        lines += ["", "end to end: uint8 images on the host to classes on the host",
                  f"{'stage':<64} {'images':>6} {'e2e s':>10} {'range s':>21} {'runs':>4} {'=ref':>4}"]
        for r in e2e:
            if "e2e_s" not in r:
                lines.append(f"{r['stage']:<64} {r['images']:>6} {r.get('error', '')}")
                continue
            lo, hi = r["e2e_range"]
            same = "yes" if r.get("classes_equal") else f"NO ({r.get('classes_differing')})"
            lines.append(f"{r['stage']:<64} {r['images']:>6} {r['e2e_s']:>10.6f} {f'{lo:.6f}-{hi:.6f}':>21} "
                         f"{r['e2e_runs']:>4} {same:>4}")
    said = benchdoc.peers(ladder)
    if said:
        lines += ["", "whole calls against the peers and the units' floor", *said]
    return "\n".join(lines)

