"""What a bench writes into its folder: bench.json (with the library versions and the device's ceilings), bench.csv,
summary.md and the plots (ladder, per-layer bars, roofline), or all of them in a fallback folder where the folder
fails at the end; and a folder's plots drawn again from its bench.json (``refresh_plots``, ``refresh_ceilings``).
Apart from the run (``labkit.bench``): a folder's files are written and redrawn from rows, with nothing to run."""

from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import json
import platform
import re
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

from ..about import __version__
from ..course import stages
from ..launch import device
from ..measuring.ledger import Ledger
from ..measuring.report import RunReport
from ..ops import tensor_cores
from ..outputs import write_or_fallback
from . import ceilings, plots, unfinished
from .bench_table import table


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


def write(out: Path, rows: list[dict], command: str, append: bool = False) -> Path:
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
