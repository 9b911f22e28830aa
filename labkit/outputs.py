"""Output locations, checked before the work starts: a folder that cannot be created or written, or one that already
holds results, is refused in one line that names it and says what to do; and whatever a run computed is never lost
to a late write error (the folder removed, the disk full): it goes to a fallback folder, named in a line.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Callable


class OutputError(Exception):
    """An output location that cannot be used: the message names it and says what to do."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or the closest of its parents that exists (what a ``mkdir -p`` of ``path`` would start from)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _cannot_write(folder: Path) -> str:
    """Why no file can be made in ``folder`` now ("" when one can): tried, by making one and removing it at once,
    because ``os.access`` says yes to root where nothing can be written (``/proc``, a read-only file system)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".labkit-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return ""


def _refusal(what: str, path: Path, base: Path, kind: str) -> str | None:
    """The one line refusing ``path`` when nothing can be written in ``base`` (its nearest existing folder)."""
    why = _cannot_write(base)
    if not why:
        return None
    verb = "written" if base == path.absolute() else "created"
    reason = f"no permission to write in {base}" if "ermission" in why else f"no file can be made in {base} ({why})"
    return f"{what} {path} cannot be {verb}: {reason}; name a {kind} you can write to"


def writable_folder(path: str | Path, what: str) -> Path:
    """``path`` if it is a folder that can be written, or one that can be created; else ``OutputError``. Nothing
    is left behind here (a file is made and removed at once, to know), so a command refused later for another reason
    leaves no trace. ``what`` names the location in the message (``"--out"``, ``"the download folder"``)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder: name a folder (a new one is created)")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputError(f"{what} {path} cannot be created: {base} is a file, not a folder; name another folder")
    refused = _refusal(what, path, base, "folder")
    if refused:
        raise OutputError(refused)
    return path


def writable_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a file that can be appended to, or one that can be created; else ``OutputError``."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder: name a file in it, e.g. {path / 'ledger.jsonl'}")
    if path.exists():
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            raise OutputError(f"{what} {path} cannot be written ({exc.strerror or exc}); name a file you can "
                              f"write") from None
        return path
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise OutputError(f"{what} {path} cannot be created: {base} is a file, not a folder; name another file")
    refused = _refusal(what, path, base, "file")
    if refused:
        raise OutputError(refused)
    return path


def contents(folder: str | Path) -> list[str]:
    """What a folder holds (names, sorted; hidden files left out: a file manager's droppings are not results)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def listed(names: list[str], most: int = 3) -> str:
    """``bench.json, ledger.jsonl and 12 more``: a folder's contents in a line."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def fallback_folder(what: str) -> Path:
    """A new folder in the system's temporary folder, named after what it holds and the time."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"labkit-{re.sub(r'[^0-9A-Za-z]+', '-', what)}-{stamp}-"))


def write_or_fallback(out: Path, write: Callable[[Path], None], what: str) -> Path:
    """``write(out)``; when that fails with an OSError, ``write`` into a fallback folder instead and say where in one
    line (stderr). Returns the folder written."""
    try:
        write(Path(out))
        return Path(out)
    except OSError as exc:
        fallback = fallback_folder(what)
        write(fallback)
        print(f"could not write the {what} to {out} ({exc.strerror or exc}): wrote them to {fallback} instead",
              file=sys.stderr)
        return fallback
