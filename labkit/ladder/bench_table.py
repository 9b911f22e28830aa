"""The ladder's rows as numbers and as text: the columns a run's report gives a row (``row_numbers``), and the table
that ``labkit bench``, its summary.md and ``labkit ladder`` print. Apart from the run (``labkit.bench``) so that the
files a bench writes and the baselines' rows use them too."""

from __future__ import annotations

from ..course import stages
from ..measuring.report import RunReport
from . import bench_whole, benchdoc


def row_numbers(rep: RunReport, net) -> dict:
    kinds = rep.by_kind(net)
    thr = rep.throughput(net)
    conv = [r for r in thr.values() if r["kind"] == "conv"]
    conv_flops = sum(r["flops"] for r in conv)
    conv_bytes = sum(r["bytes"] for r in conv)  # the spec's minimum: each element moved once
    return {"total_s": rep.total, "conv_s": kinds.get("conv", 0.0), "layer_seconds": rep.layer_seconds,
            "conv_gflops": conv_flops / kinds["conv"] / 1e9 if kinds.get("conv") else None,
            "conv_gbs": conv_bytes / kinds["conv"] / 1e9 if kinds.get("conv") else None,
            "total_range": rep.total_range, "runs": rep.runs, "device": rep.device, "method": rep.method}

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
            measured = benchdoc.e2e_measured(r, differ="")  # a 4-wide column
            if measured is None:
                lines.append(f"{r['stage']:<64} {r['images']:>6} {r.get('error', '')}")
                continue
            lo, hi, same = measured
            lines.append(f"{r['stage']:<64} {r['images']:>6} {r['e2e_s']:>10.6f} {f'{lo:.6f}-{hi:.6f}':>21} "
                         f"{r['e2e_runs']:>4} {same:>4}")
    said = benchdoc.peers(ladder)
    if said:
        lines += ["", "whole calls against the peers and the units' floor", *said]
    return "\n".join(lines)

