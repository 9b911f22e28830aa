"""What the kit measured on real GPUs: the committed results under ``results/``, and one renderer for them.

Each folder ``results/<device>-<date>/`` holds the ledgers of one or more ``labkit bench`` calls (``ledger*.jsonl``,
at its top or in one output folder per call) and may hold a ``meta.json`` with the device, date and commands. Notebooks, the README and docs quote those figures only
through this module, so every number they show comes from a run that can be named; on a machine without a GPU the
plots of a stage are drawn from here, labelled with the device and date. A folder holding an ``UNFINISHED`` file
(``labkit.unfinished``: a bench that was cut off) is left out with everything under it, and named where the
folders read are listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..course.stages import REFERENCE_LABEL, order_key, speedup_baseline
from ..measuring.ledger import Ledger, repo_root
from ..measuring.report import RunReport
from ..model.nets import get_net
from . import unfinished

RESULTS = repo_root() / "results"


@dataclass
class Results:
    """One committed results folder: its runs and what produced them."""

    folder: Path
    meta: dict
    reports: list[RunReport]
    left_out: list[Path] = field(default_factory=list)  # marked UNFINISHED (at or under ``folder``): not read

    @property
    def device(self) -> str:
        return self.meta.get("device") or (self.reports[0].device if self.reports else "?")

    @property
    def date(self) -> str:
        return str(self.meta.get("date", "?"))[:10]

    @property
    def stamp(self) -> str:
        """The date with its time where one is recorded: two folders of one day are ordered by it."""
        return str(self.meta.get("date", "?"))

    @property
    def where(self) -> str:
        """The folder as the repository names it."""
        return _where(self.folder)

    def runs(self, stage: str | None = None, net: str | None = None, images: int | None = None) -> list[RunReport]:
        """The runs of one stage (labels "NN ..."), or every run, on one net and image count; newest of each
        label, in course order."""
        newest: dict[tuple, RunReport] = {}
        for rep in self.reports:
            if stage is not None and not (rep.stage or "").startswith(f"{stage} "):
                continue
            if (net is not None and rep.net != net) or (images is not None and rep.images != images):
                continue
            newest.pop((rep.stage, rep.net, rep.images), None)
            newest[(rep.stage, rep.net, rep.images)] = rep
        return sorted(newest.values(), key=lambda r: order_key(r.stage))

    def baselines(self, net: str, images: int) -> list[RunReport]:
        """The numpy reference and library runs (cuDNN, cuBLAS) on the same workload."""
        return [r for r in self.runs(net=net, images=images) if order_key(r.stage)[0] == 1]


def finished(folder: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` at or under ``folder`` that no ``UNFINISHED`` marker leaves out."""
    folder = Path(folder)
    return [p for p in sorted(folder.glob(f"**/{pattern}")) if unfinished.marked(p.parent, folder) is None]


def load(folder: str | Path) -> Results:
    folder = Path(folder)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    ledgers = [Ledger(path) for path in finished(folder, "ledger*.jsonl")]
    reports = [rep for ledger in ledgers for rep in ledger.reports()]
    if "date" not in meta:  # the date of the first recorded run
        meta["date"] = next((row["date"] for ledger in ledgers for row in ledger.read()), "?")
    return Results(folder, meta, [r for r in reports if not r.simulated], unfinished.under(folder))


def all_results(root: Path = RESULTS) -> list[Results]:
    """Every committed results folder with GPU runs of finished benches, newest first."""
    found = [load(p) for p in sorted(root.glob("*/")) if finished(p, "ledger*.jsonl")]
    return sorted([r for r in found if r.reports], key=lambda r: r.stamp, reverse=True)


def left_out(root: Path = RESULTS) -> list[str]:
    """The folders under ``root`` that an ``UNFINISHED`` marker leaves out, as the repository names them."""
    return [_where(p) for p in unfinished.under(root) if p != Path(root)]


def _where(folder: Path) -> str:
    try:
        return folder.relative_to(repo_root()).as_posix()
    except ValueError:
        return folder.name


def latest(stage: str | None = None, root: Path = RESULTS) -> Results | None:
    """The newest committed results that hold runs of ``stage`` (any, if None)."""
    for res in all_results(root):
        if stage is None or res.runs(stage):
            return res
    return None


def table(reports: list[RunReport], baseline: RunReport | None = None) -> str:
    """One line per run: total and conv seconds, conv GFLOP/s, speedup over the baseline, accuracy."""
    base = baseline or next((r for r in reports if r.stage == speedup_baseline([x.stage for x in reports])), None)
    lines = [f"{'run':<30}{'net':>9}{'images':>7}{'total s':>12}{'conv s':>12}{'conv GF/s':>10}"
             f"{'speedup':>9}{'accuracy':>9}"]
    for r in reports:
        conv = r.by_kind().get("conv", 0.0)
        flops = sum(t["flops"] for t in r.throughput().values() if t["kind"] == "conv")
        gf = f"{flops / conv / 1e9:.1f}" if conv > 0 else "-"
        speed = f"{base.total / r.total:.1f}x" if base is not None and r.total > 0 else "-"
        acc = "n/a" if r.accuracy is None else f"{100 * r.accuracy:.2f}"
        lines.append(f"{r.stage or '?':<30}{r.net:>9}{r.images:>7}{r.total:>12.6f}{conv:>12.6f}{gf:>10}{speed:>9}"
                     f"{acc:>9}")
    return "\n".join(lines)


def ratio(res: Results, a: str, b: str, net: str, images: int) -> float | None:
    """Total time of run ``a`` over run ``b`` (labels) on one workload, or None if either is missing."""
    runs = {r.stage: r for r in res.runs(net=net, images=images)}
    if a in runs and b in runs and runs[b].total > 0:
        return runs[a].total / runs[b].total
    return None


def whole_calls(res: Results, net: str, images: int) -> dict[str, tuple[float, str]]:
    """The whole forward call as a caller waits for it (``labkit bench``'s whole-call column, in the folder's
    ``bench.json`` files): label -> (median seconds, how it was timed), for the runs on one workload that have it."""
    found: dict[str, tuple[float, str]] = {}
    for path in finished(res.folder, "bench.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for row in data.get("rows", []) if isinstance(data, dict) else data:
            if row.get("net") == net and row.get("images") == images and row.get("whole_call_s"):
                found[row["stage"]] = (float(row["whole_call_s"]), str(row.get("whole_call_how", "")))
    return found


def _whole_call_lines(res: Results, runs: list[RunReport], net: str, images: int) -> list[str]:
    calls = whole_calls(res, net, images)
    shown = [(r.stage, *calls[r.stage]) for r in runs if r.stage in calls]
    if not shown:
        return []
    width = max(len(label) for label, *_ in shown)
    return ["whole call (CUDA events around the whole forward call, the output's download included):"] + [
        f"  {label:<{width}} {1e3 * seconds:9.3f} ms  ({how})" for label, seconds, how in shown]


def show(stage: str, compare: tuple[tuple[str, str], ...] = (), root: Path = RESULTS) -> Results | None:
    """Print what the kit measured for ``stage`` on a real GPU: per workload, the stage's runs beside the numpy
    reference and the libraries (with their whole-call times where the bench recorded them), and the ratios asked for in ``compare`` ((run a, run b) labels: "a takes x times
    b's time"). Says so when nothing is committed yet."""
    res = latest(stage, root)
    if res is None:
        print(f"No committed GPU results for stage {stage} yet (results/ has none): run `labkit bench --stages "
              f"{stage}` on a GPU machine (docs/gpu.md).")
        return None
    print(f"Measured by the kit: {res.device}, {res.date}, {res.where}/ (its README gives the commands)")
    for folder in res.left_out:
        print(f"(left out: {_where(folder)}/, a bench that did not finish: its {unfinished.MARKER} file says why)")
    workloads = sorted({(r.net, r.images) for r in res.runs(stage)})
    for net, images in workloads:
        runs = res.runs(stage, net, images) + res.baselines(net, images)
        print()
        print(table(runs, next((r for r in runs if r.stage == REFERENCE_LABEL), None)))
        for line in _whole_call_lines(res, runs, net, images):
            print(line)
    for a, b in compare:
        found = [(net, images, ratio(res, a, b, net, images)) for net, images in workloads]
        found = [f"{x:.2f}x at {images} {net} images" for net, images, x in found if x is not None]
        if found:
            print(f"\n{a} takes {', '.join(found)} the time of {b}")
    return res


#: the kit's fc kernels as ``tools/fc_gemm_timing.py`` labels them in its ``fc_gemm_timing.json`` (the CUDA C SGEMM
#: and the tensor cores' fc in their default configurations, ``labkit.gemm_cuda.DEFAULT`` and
#: ``labkit.fc_tensor_cores.DEFAULT``): the code is not in a student release (it answers stage 10's task 1), so
#: notebook 10 compares the student's fc with these committed times
FC_KERNELS = {"tiles": ("lk.gemm.fc_tiles", "the kit's register tiles"),
              "cuda": ("lk.gemm_cuda.fc_cuda[k8:", "the kit's CUDA C SGEMM"),
              "tc": ("lk.fc_tensor_cores.fc_split3[m128:", "the kit's fc on the tensor cores")}


@dataclass
class FcTimes:
    """The kit's fc kernels timed alone on a GPU (one committed ``fc_gemm_timing.json``)."""

    path: Path
    device: str
    date: str
    rows: list[dict]

    def seconds(self, kernel: str, images: int, layer: str = "fashion fc1") -> float | None:
        """The median time of ``kernel`` ("tiles", "cuda": ``FC_KERNELS``) on ``layer`` at ``images`` images."""
        prefix = FC_KERNELS[kernel][0]
        return next((row["time"]["median_ms"] / 1e3 for row in self.rows if row.get("layer") == layer
                     and row.get("images") == images and str(row.get("kernel", "")).startswith(prefix)
                     and "time" in row), None)

    def __str__(self) -> str:
        lines = [f"the kit's fc1 kernels measured on {self.device}, {self.date} ({_where(self.path.parent)}/, "
                 f"tools/fc_gemm_timing.py):"]
        for images in sorted({r["images"] for r in self.rows if r.get("layer") == "fashion fc1"}):
            found = [(what, self.seconds(kind, images)) for kind, (_, what) in FC_KERNELS.items()]
            lines.append(f"  fc1 at {images} images: " + "; ".join(f"{what} {1e3 * s:.3f} ms" for what, s in found
                                                                    if s is not None))
        return "\n".join(lines)


def fc_times(root: Path = RESULTS) -> FcTimes | None:
    """The newest committed timings of the kit's fc kernels (``tools/fc_gemm_timing.py``), None if none."""
    found = []
    for path in finished(root, "fc_gemm_timing.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and not data.get("quick") and data.get("rows"):
            stamp = str(data.get("date", "?"))  # to the second: several runs of one day are ordered
            found.append((stamp, FcTimes(path, str(data.get("device", "?")), stamp[:10], data["rows"])))
    return max(found, key=lambda t: t[0], default=(None, None))[1]


README_BEGIN, README_END = "<!-- measured:begin -->", "<!-- measured:end -->"


def readme_block(root: Path = RESULTS) -> str:
    """The README's "measured so far" block: the fastest run of every stage on each net's default workload, each
    stage (and each baseline) from the newest committed results that hold it, with the folders named. Rendered,
    never typed."""
    found = all_results(root)
    if not found:
        body = "No GPU results are committed yet: `labkit bench` on a GPU machine makes them (docs/gpu.md)."
        return f"{README_BEGIN}\n{body}\n{README_END}"
    blocks, used = [], {}
    for net in sorted({r.net for res in found for r in res.reports}):
        images = get_net(net).default_images
        best: dict[str, RunReport] = {}
        owner: dict[str, Results] = {}
        for res in found:  # newest first: a stage's runs come from the newest folder that has them
            for r in res.runs(net=net, images=images):
                stage = order_key(r.stage)[0] == 0
                key = (r.stage or "").split(" ", 1)[0] if stage else r.stage
                if owner.setdefault(key if stage else "baselines", res) is not res:
                    continue
                if key not in best or r.total < best[key].total:
                    best[key] = r
        if not best:
            continue
        for key, res in owner.items():
            used.setdefault(res.where, (res, []))[1].append(key)
        runs = sorted(best.values(), key=lambda r: order_key(r.stage))
        blocks += [f"`{net}`, {images} images:", "", "```", table(runs), "```", ""]
    def stages_of(keys):
        numbered = sorted(k for k in keys if k[:2].isdigit())
        return ", ".join(([f"stages {', '.join(numbered)}"] if numbered else []) + (["baselines"] if "baselines" in
                                                                                    keys else []))

    sources = "; ".join(f"{res.device}, {res.date}, `{where}/` ({stages_of(set(keys))})"
                        for where, (res, keys) in used.items())
    skipped = left_out(root)
    skipped = (f" Left out, as benches that did not finish (an `{unfinished.MARKER}` file says so): "
               f"{', '.join(f'`{where}/`' for where in skipped)}." if skipped else "")
    lines = [f"The kit's GPU results, each stage's newest (each folder's README gives the commands): {sources}."
             f"{skipped} The fastest run of each stage:", "", *blocks]
    return "\n".join([README_BEGIN, *lines, README_END])
