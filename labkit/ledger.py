"""The results ledger: append-only JSON lines, one per layer plus a ``total`` line per run.

Results come from ``RunReport``s, never typed in, and keep the device, date and command that produced them, so
every figure a notebook, the README or the bench quotes can be traced to a run.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
import warnings
from datetime import datetime, timezone
from pathlib import Path

from .report import RunReport


def repo_root() -> Path:
    """The checkout labkit runs from (where pyproject.toml is), else the current folder."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def default_ledger_path() -> Path:
    """``$LABKIT_RESULTS`` (a .jsonl file, or a folder that gets ledger.jsonl), else results/ledger.jsonl."""
    env = os.environ.get("LABKIT_RESULTS")
    if env:
        path = Path(env).expanduser()
        return path / "ledger.jsonl" if path.is_dir() or not path.suffix else path
    return repo_root() / "results" / "ledger.jsonl"


def _default_command() -> str:
    argv = sys.argv or [""]
    if "ipykernel" in argv[0] or "ipykernel" in " ".join(argv[1:2]):
        return "notebook"
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def _labkit_version() -> str:
    try:
        from importlib.metadata import version

        return version("labkit")
    except Exception:
        from . import __version__

        return __version__


class Recorded(list):
    """The ledger lines one ``record`` wrote; a notebook shows one line about them, not the whole list."""

    def __init__(self, rows: list[dict], path: Path):
        super().__init__(rows)
        self.path = path

    def __repr__(self) -> str:
        first = self[0] if self else {}
        return (f"recorded {first.get('stage') or 'run'} ({first.get('net')}, {first.get('images')} images): "
                f"{len(self)} lines in {self.path}")


class Ledger:
    """Append-only JSON lines, one per layer plus a ``total`` line per run: results come from RunReports,
    never typed in, and keep the device, date and command that produced them."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_ledger_path()

    def record(self, report: RunReport, command: str | None = None) -> Recorded:
        """Append ``report``; returns the lines written. Lines of one run share ``run`` and ``date``."""
        try:
            layers = report.layers()
        except ValueError:  # a spec the registry does not know: keep the layers as given
            layers = {name: ("other", secs) for name, secs in report.layer_seconds.items()}
        common = {
            "run": uuid.uuid4().hex[:12], "stage": report.stage, "net": report.net, "images": report.images,
            "device": report.device, "simulated": report.simulated, "synthetic": report.synthetic,
            "method": report.method, "accuracy": report.accuracy, "runs": report.runs,
            "total_range": list(report.total_range) if report.total_range else None,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": command if command is not None else _default_command(), "labkit": _labkit_version(),
        }
        rows = [{**common, "layer": name, "kind": kind, "seconds": secs} for name, (kind, secs) in layers.items()]
        rows.append({**common, "layer": "total", "kind": "total", "seconds": report.total})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(row) + "\n" for row in rows))  # one write: runs do not interleave
        return Recorded(rows, self.path)

    def read(self, **filters) -> list[dict]:
        """Lines matching every filter: ``read(net="cifar10", layer="total", stage=["01_serial", "05_shared"])``
        (a list, tuple or set means any of; a callable is a predicate)."""
        if not self.path.exists():
            return []
        out = []
        with self.path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    warnings.warn(f"{self.path}:{number}: not a JSON line (an interrupted write?); skipped",
                                  stacklevel=2)
                    continue
                if all(_matches(row.get(key), want) for key, want in filters.items()):
                    out.append(row)
        return out

    def reports(self, **filters) -> list[RunReport]:
        """Rebuild one RunReport per recorded run (the lines matching ``filters``), oldest first."""
        runs: dict[str, list[dict]] = {}
        for row in self.read(**filters):
            runs.setdefault(row.get("run") or row["date"], []).append(row)
        out = []
        for rows in runs.values():
            first = rows[0]
            out.append(RunReport(
                net=first["net"], images=first["images"],
                layer_seconds={r["layer"]: r["seconds"] for r in rows if r["layer"] != "total"},
                accuracy=first.get("accuracy"), device=first["device"], simulated=first["simulated"],
                synthetic=first["synthetic"], stage=first.get("stage"), method=first["method"],
                runs=first.get("runs") or 1, total_range=first.get("total_range")))
        return out


def _matches(value, want) -> bool:
    if callable(want):
        return bool(want(value))
    if isinstance(want, (list, tuple, set, frozenset)):
        return value in want
    return value == want
