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

from ..about import __version__
from .report import RunReport


def repo_root() -> Path:
    """The checkout labkit runs from (where pyproject.toml is), else the current folder."""
    here = Path(__file__).resolve().parents[2]
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
    return __version__  # the one version: pyproject.toml reads it from there


#: keys every line of a kit's ledger has (a file whose first line lacks one is not a ledger of the kit)
LINE_KEYS = ("net", "images", "device", "layer", "seconds", "date")


class LedgerError(ValueError):
    """A file that cannot take a run's lines: not a ledger of the kit, or another device's ledger."""


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
    never typed in, and keep the device, date and command that produced them.

    A ledger named by its path keeps one device's runs (``one_device``): a line of another device is refused, so a
    GPU's results folder never gets simulator rows. The default ledger (``results/ledger.jsonl``, this clone's
    working ledger, which a machine may fill from the simulator and from its GPU) takes any device's; its readers
    filter by device. Either refuses to append to a file that is not a ledger of the kit."""

    def __init__(self, path: str | Path | None = None, one_device: bool | None = None):
        self.path = Path(path) if path is not None else default_ledger_path()
        self.one_device = path is not None if one_device is None else one_device

    def first_line(self, todo: str = "record to a new .jsonl file") -> dict | None:
        """The ledger's first line, or None when the file is absent or holds no line yet; ``LedgerError`` when the
        path is a folder or the file is not a ledger of the kit (a text file, another program's JSON), the message
        ending with ``todo``."""
        if self.path.is_dir():
            raise LedgerError(f"{self.path} is a folder, not a ledger file: name a .jsonl file, e.g. "
                              f"{self.path / 'ledger.jsonl'}")
        if not self.path.is_file():
            return None
        with self.path.open("rb") as fh:
            for _ in range(100):
                raw = fh.readline(1 << 16)  # bounded: a binary file may have no line breaks
                if not raw:
                    return None
                if raw.strip():
                    break
            else:
                raw = b""
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            row = None
        if not isinstance(row, dict) or any(key not in row for key in LINE_KEYS):
            raise LedgerError(f"{self.path} is not a labkit ledger (its first line is not one of the JSON lines "
                              f"`labkit run --record` and `labkit bench` write): {todo}")
        return row

    def check(self, device: str | None = None) -> None:
        """Refuse, before a run, a file this run's lines cannot go to: not a ledger of the kit, or (``one_device``)
        the ledger of another device than ``device``."""
        first = self.first_line()
        if first is not None and device is not None and self.one_device and first["device"] != device:
            raise LedgerError(f"{self.path} holds runs on {first['device']}, and this run is on {device}: a ledger "
                              f"keeps one device's runs, so record to another file")

    def record(self, report: RunReport, command: str | None = None) -> Recorded:
        """Append ``report``; returns the lines written. Lines of one run share ``run`` and ``date``. Raises
        ``LedgerError`` (before writing anything) where ``check`` refuses the file."""
        self.check(report.device)
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
