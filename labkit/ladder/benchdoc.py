"""docs/BENCHMARKS.md from `labkit bench` output folders.

Every number on the page is read or computed from a folder's bench.json (device, date, command, versions and
ceilings from its meta) and every plot is that folder's own, so the page is regenerated, never edited, and a
figure in it can always be traced to the run that made it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from ..course.stages import REFERENCE_LABEL
from ..measuring.ledger import repo_root
from ..model.nets import get_net, layer_cost
from . import unfinished

PLOTS = ("ladder", "layers", "roofline")
_ABSOLUTE = re.compile(r"(?<![\w.~$/…-])/[^\s/`'\"|)\]]+(?:/[^\s/`'\"|)\]]+)*/?")

HEADER = """# Benchmarks

Made by `labkit bench-doc` from the output folders of `labkit bench`: every number below is read or computed from
the folder's `bench.json` (device, date, command, library versions and ceilings from its meta) and every plot is
the folder's own. Do not edit by hand; run `labkit bench-doc FOLDER ...` again.

Columns: *conv GB/s* is the spec's minimum conv bytes (each input, weight and output element moved once) over the
conv time; *% fp32* is conv GFLOP/s over the device's fp32 ceiling; *speedup* is the numpy reference's total time
over this one; *time / cuDNN* is this total over cuDNN's (above 1: slower than cuDNN); *= ref* says whether the
predictions equal the numpy reference's. *whole call s* is the whole forward call as a caller waits for it (CUDA
events around every launch, the gaps between them and the download of the class probabilities; *(graph)*: a
replay of the forward captured in a CUDA graph, then the download), the median of its runs; *% of floor* is the
net's FLOPs at the device's fp32 peak over that whole call. Both ceilings are the FMA units'; the convs stage 10
runs on the tensor cores (`labkit.tensor_cores`, fp32's accuracy from three fp16 products) are not bound by them, so
there *% fp32* and *% of floor* can pass 100. *% of limit* is the floor of the units the call runs on over the
whole call (`labkit.floors`: per layer, its useful multiply-adds times the passes its method issues at the measured
rate of its unit, `mma.sync` fp16 or TF32 or FMA, or its compulsory bytes at the measured copy bandwidth, whichever
is longer, summed over the layers; rates from `tools/mma_rates.py` on the device); below each table, stage 10's whole
calls against cuDNN fp32's and the peer's (cuDNN fp16, channels_last, a CUDA graph replay, measured in the same
process) and what bounds each layer of that floor. *End to end* tables time a stage's pipeline from
uint8 images on the host to classes on the host (pinned memory, chunks over streams) beside `Job.serial` (one
stream, pageable), every image's class compared with the numpy reference's (*= ref*).
"""


class BenchDocError(Exception):
    """A folder the page cannot be made from: the message says which and why."""


def load(folder: Path) -> dict:
    """bench.json of ``folder``, checked for the parts the page reads."""
    path = Path(folder) / "bench.json"
    if not Path(folder).is_dir():
        raise BenchDocError(f"{folder}: no such folder (give the --out folder of a `labkit bench` run)")
    if (Path(folder) / unfinished.MARKER).is_file():  # an appended run cut off: bench.json is the earlier one's
        raise BenchDocError(f"{folder}: holds {unfinished.MARKER}: {unfinished.reason(Path(folder))}; run the bench "
                            f"again (--force) or give a finished run's folder")
    try:
        bench = json.loads(path.read_text())
    except FileNotFoundError:
        raise BenchDocError(f"{folder}: no bench.json (not the --out folder of a `labkit bench` run?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchDocError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(bench, dict) or not isinstance(bench.get("meta"), dict) or not isinstance(
            bench.get("rows"), list) or not all(isinstance(r, dict) for r in bench["rows"]):
        raise BenchDocError(f"{path}: expected {{\"meta\": {{...}}, \"rows\": [...]}} as `labkit bench` writes")
    return bench


def render(folders: list[Path], doc: Path, img_dir: Path) -> str:
    """Write ``doc`` from the bench folders (plots copied into ``img_dir``, linked relative to the doc); return
    its text. Every folder is checked before anything is written."""
    doc, img_dir = Path(doc).resolve(), Path(img_dir).resolve()
    benches = [(Path(f).resolve(), load(Path(f))) for f in folders]
    if not benches:
        raise BenchDocError("no bench folders given")
    parts = [HEADER]
    for (folder, bench), slug in zip(benches, _slugs([f for f, _ in benches])):
        parts.append(_section(folder, bench, doc, img_dir / slug))
    text = "\n".join(parts).rstrip("\n") + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return text


def _slugs(folders: list[Path]) -> list[str]:
    out: list[str] = []
    for f in folders:
        base = re.sub(r"[^\w.-]+", "-", f.name) or "bench"
        slug, i = base, 1
        while slug in out:
            i += 1
            slug = f"{base}-{i}"
        out.append(slug)
    return out


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _shown(path: Path, doc: Path) -> str:
    """A path as the page may name it: relative to the doc inside the repository, else only its name."""
    root = repo_root().resolve()
    if _inside(path, root) and _inside(doc, root):
        return Path(os.path.relpath(path, doc.parent)).as_posix()
    return path.name


def _scrub(text: str) -> str:
    """Absolute paths in recorded text (commands, errors) made repository-relative, or cut to their last part."""
    root = repo_root().resolve()

    def one(m: re.Match) -> str:
        p = Path(m.group(0))
        return p.relative_to(root).as_posix() if _inside(p, root) and p != root else f"…/{p.name}"

    return _ABSOLUTE.sub(one, str(text))


def _f(x, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def _ratio(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _on_cpu(row: dict) -> bool:
    """The GPU's roofline does not bound a CPU run (older bench.json rows have no target for the reference)."""
    return row.get("target") == "cpu" or row.get("stage") == REFERENCE_LABEL


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}" if x >= 0.1 else f"{x:.2g}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _section(folder: Path, bench: dict, doc: Path, img_dir: Path) -> str:
    meta, rows = bench["meta"], bench["rows"]
    roof = meta.get("ceilings")
    lines = [f"## {meta.get('device', 'device not recorded')}: `{_shown(folder, doc)}`", "",
             f"- date: {meta.get('date', 'not recorded')}",
             f"- command: `{_scrub(meta.get('command', 'not recorded'))}`",
             f"- versions: {_versions(meta)}", f"- ceilings: {_ceilings(roof)}"]
    if meta.get("simulated"):
        lines.append("- times from the CUDA simulator, not a GPU: not meaningful as performance")
    lines += [f"- {_scrub(note)}" for note in meta.get("notes") or []]
    analysis = []
    for net, n in sorted({(r["net"], r["images"]) for r in rows if "net" in r and "images" in r}):
        group = [r for r in rows if (r.get("net"), r.get("images")) == (net, n)]
        ladder = [r for r in group if r.get("kind") != "end_to_end"]
        e2e = [r for r in group if r.get("kind") == "end_to_end"]
        lines += ["", f"### {net}, {n} images"]
        if ladder:
            lines += ["", *_table(ladder, roof)]
            said = peers(ladder)
            if said:
                lines += ["", *(f"- {_cell(line)}" for line in said)]
        if e2e:
            lines += ["", f"End to end, {n} uint8 images on the host to classes on the host:", "", *_e2e_table(e2e)]
        untimed = [r for r in ladder if "total_s" not in r]
        if untimed:
            lines += ["", "Not timed: " + "; ".join(f"`{r.get('stage', '?')}` ({_why(r)})" for r in untimed) + "."]
        links = _plots(folder, net, n, doc, img_dir)
        if links:
            lines += ["", *links]
        analysis += _analysis(net, n, group, roof)
    if analysis:
        lines += ["", "### Where the time goes", "", *analysis]
    return "\n".join(lines) + "\n"


def _versions(meta: dict) -> str:
    versions = meta.get("versions") or ({"python": meta["python"]} if meta.get("python") else {})
    if not versions:
        return "not recorded"
    extra = "" if meta.get("versions") else " (only Python's recorded by this bench)"
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None) + extra


def _ceilings(roof: dict | None) -> str:
    if not roof:
        return "none recorded for this device, so no roofline and no fraction of peak"
    return (f"{roof['flops'] / 1e12:.1f} TFLOP/s fp32, {roof['bandwidth'] / 1e12:.2f} TB/s, ridge at "
            f"{roof['flops'] / roof['bandwidth']:.1f} FLOP/byte ({roof.get('source', 'source not recorded')})")


def _why(row: dict) -> str:
    why = row.get("skipped") or str(row.get("error") or "no time recorded").splitlines()[0]
    why = _scrub(why)
    return why if len(why) <= 120 else why[:117] + "..."


def _conv_rates(row: dict) -> tuple[float | None, float | None]:
    """conv GFLOP/s and GB/s; GB/s from the spec where the row predates its recording."""
    gf, gb = row.get("conv_gflops"), row.get("conv_gbs")
    if gf is not None and gb is None and row.get("conv_s"):
        try:
            spec = get_net(row["net"])
            data = sum(layer_cost(spec, layer.name, row["images"]).bytes for layer in spec.layers
                       if layer.kind == "conv" and layer.name in row.get("layer_seconds", {}))
            gb = data / row["conv_s"] / 1e9 or None
        except (KeyError, ValueError):
            gb = None
    return gf, gb


def _is_cudnn(row: dict) -> bool:
    return row.get("variant") == "cudnn" or str(row.get("stage", "")).startswith("cuDNN")


def _baseline(rows: list[dict], which) -> float | None:
    return next((r["total_s"] for r in rows if "total_s" in r and r["total_s"] > 0 and which(r)), None)


def _table(rows: list[dict], roof: dict | None) -> list[str]:
    ref = _baseline(rows, lambda r: r.get("stage") == REFERENCE_LABEL)
    cudnn = _baseline(rows, _is_cudnn)
    out = [("| stage | checks | total s | conv s | conv GFLOP/s | conv GB/s | % fp32 | speedup | time / cuDNN "
            "| accuracy % | = ref | whole call s | % of floor | % of limit |"), "|" + "---|" * 14]
    for r in rows:
        if "total_s" not in r:
            continue
        gf, gb = _conv_rates(r)
        peak = None if gf is None or not roof or _on_cpu(r) else 100 * gf * 1e9 / roof["flops"]
        t = r["total_s"]
        speedup = f"{_ratio(ref / t)}x" if ref and t > 0 else "-"
        acc = None if r.get("accuracy") is None else 100 * r["accuracy"]
        same = r.get("predictions_equal")
        out.append(f"| {_cell(r.get('stage', '?'))} | {r.get('checks', '-')} | {_f(t)} | {_f(r.get('conv_s'))} | "
                   f"{_f(gf, '.1f')} | {_f(gb, '.1f')} | {_pct(peak)} | "
                   f"{speedup} | "
                   f"{_ratio(t / cudnn) if cudnn else '-'} | {_f(acc, '.2f')} | "
                   f"{'-' if same is None else 'yes' if same else 'NO'} | {_whole(r)} | "
                   f"{_pct(None if r.get('floor_fraction') is None else 100 * r['floor_fraction'])} | "
                   f"{_pct(None if r.get('limit_fraction') is None else 100 * r['limit_fraction'])} |")
    return out


def _whole(row: dict) -> str:
    """The whole call's median and range, "(graph)" when it replays a CUDA graph."""
    w = row.get("whole_call_s")
    if w is None:
        return "-"
    lo, hi = row.get("whole_call_range") or (w, w)
    graph = " (graph)" if "graph" in str(row.get("whole_call_how", "")) and "no CUDA graph" not in str(
        row.get("whole_call_how", "")) else ""
    return f"{_f(w)} ({_f(lo)}-{_f(hi)}){graph}"


def e2e_measured(row: dict, differ: str = " differ") -> tuple[float, float, str] | None:
    """An end-to-end row's range and whether its classes equal the reference's ("yes", or "NO (n differ)" with
    ``differ`` after the count); None for a row without a time (its ``error`` says why). The bench's text table and
    this page's both print from it."""
    if "e2e_s" not in row:
        return None
    lo, hi = row["e2e_range"]
    return lo, hi, "yes" if row.get("classes_equal") else f"NO ({row.get('classes_differing')}{differ})"


def _e2e_table(rows: list[dict]) -> list[str]:
    out = ["| stage | chunk | streams | end to end s | range s | runs | = ref |", "|" + "---|" * 7]
    for r in rows:
        measured = e2e_measured(r)
        if measured is None:
            out.append(f"| {_cell(r.get('stage', '?'))} | - | - | {_cell(_why(r))} | - | - | - |")
            continue
        lo, hi, same = measured
        out.append(f"| {_cell(r.get('stage', '?'))} | {r.get('chunk', '-')} | {r.get('streams', '-')} | "
                   f"{_f(r['e2e_s'])} | {_f(lo)}-{_f(hi)} | {r.get('e2e_runs', '-')} | {same} |")
    return out


def _plots(folder: Path, net: str, n: int, doc: Path, img_dir: Path) -> list[str]:
    links = []
    for kind in PLOTS:
        src = folder / f"{kind}_{net}_{n}.png"
        if not src.is_file():
            continue
        dest = img_dir / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or dest.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dest)
        links.append(f"![{kind}: {net}, {n} images]({Path(os.path.relpath(dest, doc.parent)).as_posix()})")
    return links


def _group(stage: str) -> str:
    head = stage.split(" ", 1)[0]
    return head if head.isdigit() else stage


def _analysis(net: str, n: int, rows: list[dict], roof: dict | None) -> list[str]:
    """One sentence per stage: its fastest variant against the roofline, and the layer that takes its time."""
    fastest: dict[str, dict] = {}
    for r in rows:
        if "total_s" in r and r["total_s"] > 0:
            g = _group(str(r.get("stage", "?")))
            if g not in fastest or r["total_s"] < fastest[g]["total_s"]:
                fastest[g] = r
    out = []
    for g, r in fastest.items():
        out.append(f"- {net}, {n} images, **{_cell(g)}** (fastest: `{_cell(r.get('stage'))}`, "
                   f"{r['total_s']:.4g} s): {_bound(r, roof)} {_dominant(r)}")
    return out


def _bound(row: dict, roof: dict | None) -> str:
    gf, gb = _conv_rates(row)
    if not gf or not gb:
        return "no conv time recorded."
    intensity = gf / gb
    if roof and _on_cpu(row):
        return (f"conv intensity {intensity:.3g} FLOP/byte at {gf:.1f} GFLOP/s, on the CPU (the GPU's roofline "
                f"does not bound it).")
    if not roof:
        return (f"conv intensity {intensity:.3g} FLOP/byte at {gf:.1f} GFLOP/s (no ceilings recorded for this "
                f"device: no roofline verdict).")
    ridge = roof["flops"] / roof["bandwidth"]
    memory = intensity < ridge
    attainable = min(roof["flops"], intensity * roof["bandwidth"])
    return (f"conv intensity {intensity:.3g} FLOP/byte is {'below' if memory else 'above'} the ridge at "
            f"{ridge:.3g}, so the roofline calls it {'memory' if memory else 'compute'}-bound; conv runs at "
            f"{gf:.1f} GFLOP/s ({gb:.1f} GB/s), {_pct(100 * gf * 1e9 / roof['flops'])} % of the fp32 peak and "
            f"{_pct(100 * gf * 1e9 / attainable)} % of the roof at that intensity.")


def _dominant(row: dict) -> str:
    layers = {k: v for k, v in (row.get("layer_seconds") or {}).items() if v is not None}
    total = sum(layers.values())
    if not layers or total <= 0:
        return ""
    name, secs = max(layers.items(), key=lambda kv: kv[1])
    conv = f" (conv layers {_pct(100 * row['conv_s'] / total)} %)" if row.get("conv_s") else ""
    return f"`{name}` takes the most time, {_pct(100 * secs / total)} % of the total{conv}."


def _is_peer(r: dict, which: str) -> bool:
    return r.get("variant") == which and r.get("whole_call_s")


def peers(rows: list[dict]) -> list[str]:
    """One line per stage 10 row with a whole call: its whole call; cuDNN fp32's and the peer's (``cudnn.PEER``:
    fp16, channels_last, CUDA graph) on the same workload, each with its time over the stage's; and its units'
    floor (``labkit.floors``) with the share of it the call reaches and what bounds each layer there."""
    out = []
    for r in rows:
        if not str(r.get("stage", "")).startswith("10 ") or not r.get("whole_call_s"):
            continue
        same = [p for p in rows if (p.get("net"), p.get("images")) == (r["net"], r["images"])]
        w = r["whole_call_s"]
        parts = [f"{r['stage']} ({r['net']}, {r['images']} images): whole call {1e3 * w:.4g} ms"]
        for which, name in (("cudnn", "cuDNN fp32"), ("cudnn_peer", "cuDNN fp16 channels_last graph")):
            peer = next((p for p in same if _is_peer(p, which)), None)
            if peer is not None:
                parts.append(f"{name} {1e3 * peer['whole_call_s']:.4g} ms ({peer['whole_call_s'] / w:.2f}x its time)")
        if r.get("limit_s"):
            parts.append(f"its units' floor {1e3 * r['limit_s']:.4g} ms, {_pct(100 * r['limit_fraction'])} % of the "
                         f"call ({r.get('limit_bounds', '')})")
        out.append("; ".join(parts))
    return out
