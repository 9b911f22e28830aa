"""The process table: every process's parent and group from /proc, a process's descendants, their resident memory,
and ending a child with every process it started (named one by one, nothing else on the machine touched). The
sandbox (``sandbox``) and the isolation layers (``isolation``) both end their children here.
"""

from __future__ import annotations

import os
import signal
import subprocess


def proc_table() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every process, from /proc (empty where there is none)."""
    rows = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                rows.append((int(entry), int(fields[1]), int(fields[2])))
            except (OSError, ValueError, IndexError):
                continue
    return rows


def descendants(pid: int, table=None) -> list[int]:
    parents: dict[int, list[int]] = {}
    for child, ppid, _ in table if table is not None else proc_table():
        parents.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return total / 1024


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child, every process of its process group (a session of its own) and every descendant, even
    one that left the group: named one by one, so nothing else on the machine is touched."""
    table = proc_table()
    victims = {pid for pid, _, pgid in table if pgid == proc.pid} | set(descendants(proc.pid, table))
    if proc.returncode is None:
        victims.add(proc.pid)
    if not table and proc.returncode is None:  # no /proc (macOS): the group, while its leader is surely ours
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
