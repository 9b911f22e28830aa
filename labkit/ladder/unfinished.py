"""A bench that stops before its end marks its folder, so nothing takes its partial ledger for the kit's figures.

``labkit bench`` appends each run to ``OUT/ledger.jsonl`` as it goes and writes bench.json at its end; a run cut
off between the two (a step's time limit, Ctrl-C, a lost machine) leaves a ledger that looks like a finished one.
So the bench writes ``UNFINISHED`` into its folder before its first run and removes it only once bench.json is
written: a folder that still holds one is a run that did not finish. ``labkit.measured`` leaves out such a folder
and everything under it (and says so), ``labkit bench-doc`` refuses it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

MARKER = "UNFINISHED"
WHY = ("this run did not finish: its ledger holds the rows it measured before it stopped; labkit.measured skips "
       "this folder")


def mark(folder: Path, command: str) -> Path:
    """Write the marker into ``folder``: one line, the command, the start time and what the marker means."""
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    path = Path(folder) / MARKER
    path.write_text(f"`{command}`, started {started}: {WHY}\n")
    return path


def clear(folder: Path) -> None:
    """Remove the marker: the run's bench.json is written. A folder that cannot be written any more (its results
    went to a fallback folder) keeps it, which only leaves its ledger out."""
    try:
        (Path(folder) / MARKER).unlink(missing_ok=True)
    except OSError:
        pass


def marked(folder: Path, root: Path) -> Path | None:
    """The marker that leaves ``folder`` out: one in ``folder`` or in a folder above it, up to ``root``; or None."""
    folder, root = Path(folder), Path(root)
    for place in [folder, *folder.parents]:
        if (place / MARKER).is_file():
            return place / MARKER
        if place == root:
            break
    return None


def under(root: Path) -> list[Path]:
    """Every marked folder at or under ``root`` (sorted)."""
    root = Path(root)
    return sorted(p.parent for p in root.glob(f"**/{MARKER}") if p.is_file())


def reason(folder: Path) -> str:
    """The marker's line (what ran, when, and that it did not finish), for a message."""
    try:
        return (Path(folder) / MARKER).read_text().strip() or WHY
    except OSError:
        return WHY
