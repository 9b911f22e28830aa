"""The process table: every process's parent and group from /proc, a process's descendants, their resident memory,
and ending a child with every process it started (named one by one, nothing else on the machine touched). The
sandbox (``sandbox``) and the isolation layers (``isolation``) both end their children here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


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


# ------------------------------------------------------------------------------ PID namespaces (the sandboxes')

#: how long a sandbox's processes may take to go once it was ended
WAIT_GONE_S = 30.0


def pid_ns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def ns_members(ns: int) -> list[int]:
    """Every process of this machine in the PID namespace ``ns`` (empty once the namespace is gone)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and pid_ns(int(entry)) == ns:
            out.append(int(entry))
    return out


def wait_gone(namespaces, timeout: float = WAIT_GONE_S) -> list[int]:
    """Wait until no process of these PID namespaces runs any more; those still running at the timeout. A zombie
    has ended (its memory, files and devices are released: only its exit status waits to be collected): bubblewrap
    leaves its namespace's first process to the machine's init, which may reap it a second or two later."""
    namespaces = {n for n in namespaces if n}
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for ns in namespaces for pid in ns_members(ns) if state(pid) not in ("Z", "X")]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def foreign_namespaces(pids) -> set[int]:
    """The PID namespaces of ``pids`` other than this process's own (a container's)."""
    own = pid_ns(os.getpid())
    return {ns for ns in map(pid_ns, pids) if ns and ns != own}


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"  # gone


def wait_stopped(pids, timeout: float = 2.0) -> None:
    """Until every one of ``pids`` is stopped (or gone), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(state(p) not in ("T", "t", "Z", "X") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.002)
