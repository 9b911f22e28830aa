"""Plots for the timing cells: per-layer bars, the stage ladder, a roofline.

Library code never shows a figure: each function returns its ``Figure`` (the last value of a notebook cell
displays it) and closes it in pyplot so figures do not pile up or print twice; this also keeps it headless-safe
(no display is needed, Agg is matplotlib's fallback).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..course.stages import order_key, speedup_baseline
from ..measuring.report import RunReport


def _figure(ax, figsize=(8, 4)):
    """Use the caller's axes, or make a figure that pyplot forgets (returned, never shown)."""
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    plt.close(fig)
    return fig, ax


def _name(report: RunReport, i: int) -> str:
    return report.stage or f"{report.net} #{i + 1}"


def layer_bars(report_or_reports: RunReport | Sequence[RunReport], ax=None, share: bool = False, log: bool = False):
    """Per-layer times, one group per layer and one bar per report (e.g. stages side by side);
    ``share=True`` plots each layer's percent of its report's total instead, which compares shapes, not speed;
    ``log=True`` keeps a slow baseline from flattening the fast runs' bars."""
    reports = [report_or_reports] if isinstance(report_or_reports, RunReport) else list(report_or_reports)
    if not reports:
        raise ValueError("layer_bars: no reports to plot")
    per_report = [r.layers() for r in reports]
    names: list[str] = []
    for layers in per_report:
        names += [n for n in layers if n not in names]
    fig, ax = _figure(ax, figsize=(min(18, max(6, 0.7 * len(names) * max(1, len(reports) / 2))), 4.5))
    x = np.arange(len(names))
    width = 0.8 / len(reports)
    for i, (report, layers) in enumerate(zip(reports, per_report)):
        values = np.array([layers[n][1] if n in layers else 0.0 for n in names])
        if share:
            values = 100 * values / report.total if report.total > 0 else values * 0
        label = _name(report, i) + (" (simulated)" if report.simulated else "")
        ax.bar(x + (i - (len(reports) - 1) / 2) * width, values, width, label=label)
    ax.set_xticks(x, names, rotation=45 if len(names) > 8 else 0)
    ax.set_ylabel("share of total time (%)" if share else "seconds")
    if log:
        ax.set_yscale("log")
    images = sorted({r.images for r in reports})
    ax.set_title(f"{reports[0].net}: time per layer, {'/'.join(map(str, images))} images")
    if len(reports) > 1 or reports[0].stage:
        ax.legend(fontsize=8 if len(reports) < 6 else 6, ncol=1 if len(reports) < 6 else 2)
    return fig


def per_image_bars(runs: dict, ax=None, title: str = ""):
    """Seconds per image of every layer, one bar per run (``name -> NetRun``, of any image counts), log scale."""
    if not runs:
        fig, ax = _figure(ax)
        ax.text(0.5, 0.5, "nothing measured yet", ha="center", va="center", transform=ax.transAxes)
        return fig
    reports = []
    for name, r in runs.items():
        rep = r.report
        reports.append(RunReport(rep.net, 1, {k: v / rep.images for k, v in rep.layer_seconds.items()},
                                 device=rep.device, simulated=rep.simulated, stage=name))
    fig = layer_bars(reports, ax=ax)
    ax = ax or fig.axes[0]
    ax.set(yscale="log", ylabel="seconds per image", title=title or ax.get_title())
    return fig


def scaling(reports, ax=None, title: str = ""):
    """Milliseconds per image against the number of images, one line per run label (log scales): a flat line is a
    cost per image (launches, copies, faults per call), a falling one a fixed cost spread over more images."""
    fig, ax = _figure(ax, figsize=(6.5, 4))
    lines: dict[str, list] = {}
    for rep in reports:
        lines.setdefault(rep.stage or rep.net, []).append((rep.images, 1e3 * rep.total / rep.images))
    for name, points in lines.items():
        ax.plot(*zip(*sorted(points)), marker="o", ls="--" if "managed" in name else "-", label=name)
    ax.set(xscale="log", yscale="log", xlabel="images", ylabel="ms per image", title=title)
    if lines:
        ax.legend(fontsize=8)
    return fig


def _ladder_rows(records_or_reports, net: str, images, device):
    """(stage, total, conv, device) per stage: the newest run of each stage, one image count and device."""
    runs: list[dict] = []
    items = list(records_or_reports)
    if items and isinstance(items[0], RunReport):
        for order, r in enumerate(items):
            kinds = r.by_kind()
            runs.append({"stage": r.stage, "net": r.net, "images": r.images, "device": r.device,
                         "total": r.total, "conv": kinds.get("conv", 0.0), "order": order})
    else:  # ledger lines
        grouped: dict[str, dict] = {}
        for order, row in enumerate(items):
            run = grouped.setdefault(row.get("run") or row["date"], {
                "stage": row.get("stage"), "net": row["net"], "images": row["images"], "device": row["device"],
                "total": None, "conv": 0.0, "order": (row["date"], order)})
            if row["layer"] == "total":
                run["total"] = row["seconds"]
            elif row.get("kind") == "conv":
                run["conv"] += row["seconds"]
        runs = [r for r in grouped.values() if r["total"] is not None]
    runs = [r for r in runs if r["net"] == net]
    if not runs:
        raise ValueError(f"stage_ladder: no results for network {net!r}")
    if device is None:  # the device of the newest run: a ladder compares stages on one machine
        device = max(runs, key=lambda r: r["order"])["device"]
    runs = [r for r in runs if r["device"] == device]
    if images is None:  # the image count most stages were run with (the larger on a tie)
        counts: dict[int, set] = {}
        for r in runs:
            counts.setdefault(r["images"], set()).add(r["stage"])
        images = max(counts, key=lambda n: (len(counts[n]), n))
    runs = [r for r in runs if r["images"] == images]
    if not runs:
        raise ValueError(f"stage_ladder: no results for {net!r} with {images} images on {device}")
    newest: dict[str, dict] = {}
    for r in sorted(runs, key=lambda r: r["order"]):
        newest.pop(r["stage"] or "(no stage)", None)
        newest[r["stage"] or "(no stage)"] = r
    ordered = sorted(newest.items(), key=lambda item: order_key(item[0]))
    return [(stage, r["total"], r["conv"], device) for stage, r in ordered], images, device


def stage_ladder(records_or_reports: Iterable, net, images: int | None = None, log: bool = True,
                 device: str | None = None, ax=None):
    """The kit's speed ladder: per run label (in course order, newest run of each) a total bar and a conv bar,
    annotated with the speedup of the total over the baseline (``labkit.stages.speedup_baseline``: the numpy
    reference when present). Takes ledger lines or RunReports."""
    net = getattr(net, "name", net)
    rows, images, device = _ladder_rows(records_or_reports, net, images, device)
    stages = [r[0] for r in rows]
    totals = np.array([r[1] for r in rows])
    convs = np.array([r[2] for r in rows])
    fig, ax = _figure(ax, figsize=(max(6, 1.1 * len(stages)), 4))
    x = np.arange(len(stages))
    bars = ax.bar(x - 0.2, totals, 0.4, label="total")
    ax.bar(x + 0.2, convs, 0.4, label="conv")
    base = totals[stages.index(speedup_baseline(stages))]
    for bar, total in zip(bars, totals):
        if total > 0 and base > 0:
            ax.annotate(f"x{base / total:.3g}", (bar.get_x() + bar.get_width() / 2, total),
                        ha="center", va="bottom", fontsize=8)
    if log and (totals > 0).all():
        ax.set_yscale("log")
    ax.set_xticks(x, stages, rotation=30 if len(stages) > 2 else 0, ha="right" if len(stages) > 2 else "center")
    ax.set_ylabel("seconds")
    ax.set_title(f"{net}, {images} images on {device}")
    ax.legend()
    return fig


def roofline(points: Iterable[tuple], peak_flops: float, peak_bandwidth: float, ax=None):
    """Achieved FLOP/s against arithmetic intensity (FLOP per byte moved), under the roofs
    ``min(peak_flops, intensity * peak_bandwidth)``: shows whether a kernel is memory- or compute-bound.
    ``points``: (label, flops, bytes, seconds), or (series, label, flops, bytes, seconds) to colour by series."""
    points = [p if len(p) == 5 else ("", *p) for p in points]
    if peak_flops <= 0 or peak_bandwidth <= 0:
        raise ValueError("roofline: peak_flops and peak_bandwidth must be positive")
    for _, label, flops, nbytes, seconds in points:
        if flops <= 0 or nbytes <= 0 or seconds <= 0:
            raise ValueError(f"roofline: point {label!r} needs positive flops, bytes and seconds")
    fig, ax = _figure(ax, figsize=(6, 4.5))
    ridge = peak_flops / peak_bandwidth
    intensities = [f / b for _, _, f, b, _ in points]
    lo = min([ridge / 100, *[i / 4 for i in intensities]])
    hi = max([ridge * 100, *[i * 4 for i in intensities]])
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(xs, np.minimum(peak_flops, xs * peak_bandwidth), color="k", lw=1.5)
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    series: dict[str, list] = {}
    for name, label, flops, nbytes, seconds in points:
        series.setdefault(name, []).append((label, flops / nbytes, flops / seconds))
    for name, pts in series.items():
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], zorder=3, label=name or None)
        for label, x, y in pts:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"roofline: ridge at {ridge:.3g} FLOP/byte")
    if any(series):
        ax.legend(fontsize=7, loc="lower right")
    return fig


def roofline_runs(reports, ceilings, kinds: tuple[str, ...] = ("conv",), ax=None, title: str | None = None):
    """A roofline of runs: one point per layer of ``kinds`` per report (FLOPs and minimum bytes from the spec,
    the layer's measured seconds), coloured by run, under the device's ``labkit.ceilings.Ceilings``."""
    points = [(rep.stage or rep.net, name, t["flops"], t["bytes"], t["seconds"])
              for rep in reports for name, t in rep.throughput().items()
              if t["kind"] in kinds and t["seconds"] > 0 and t["flops"] > 0]
    if not points:
        raise ValueError("roofline_runs: no timed layers of kinds " + ", ".join(kinds))
    fig, ax = _figure(ax, figsize=(6.5, 4.5))
    roofline(points, ceilings.flops, ceilings.bandwidth, ax=ax)
    ax.set_title(title or f"{ceilings.device} ({ceilings.source}): ridge at {ceilings.ridge:.1f} FLOP/byte",
                 fontsize=9)
    return fig


def save(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG, creating folders."""
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix(".png")
    elif path.suffix.lower() != ".png":
        raise ValueError(f"save writes PNG; give a .png path, not {path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path
