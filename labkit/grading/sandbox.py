"""Process control for the children that run student code: private copies, the sandbox's view, limits, clean ends.

A child gets its own copy of labkit and of the solutions it may load (``LABKIT_SOLUTIONS``: the given code of
EARLIER stages only), and runs in the run's sandbox (``labkit.grading.isolation``): read access to those copies, its
submission and its inputs, write access to its scratch folder only, no network, a PID namespace of its own. It runs
under a wall-time limit and a memory limit; at the end every process it left behind is ended (with its namespace,
or, unsandboxed, by pid) before its results are judged final, and the copies are checksummed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..course.nbcells import source_of
from . import isolation, protocol
from .processes import descendants, kill_tree, proc_table, rss_mb  # noqa: F401 - sandbox.descendants, as before

PACKAGE = Path(__file__).resolve().parent.parent  # labkit/
WORKER = "labkit.grading.worker"
COPIED = (".py", ".toml", ".cfg")


# ----------------------------------------------------------------------------------------- private copies


def package_folders() -> list[Path]:
    """labkit/ and every folder below it that is a package (holds an __init__.py), at any depth
    (labkit/launch/cudacpu/), in a fixed order."""
    return [PACKAGE, *sorted(p.parent for p in PACKAGE.rglob("__init__.py")
                             if p.parent != PACKAGE and "__pycache__" not in p.parts)]


def private_labkit(dest: Path) -> list[Path]:
    """Copy labkit's sources (and its subpackages', at any depth) into ``dest/labkit``; the child imports this copy
    (PYTHONPATH comes before the installed package), so nothing a child does to its labkit reaches the grader."""
    copied = []
    for src_dir in package_folders():
        out = dest / "labkit" / src_dir.relative_to(PACKAGE)
        out.mkdir(parents=True)
        for f in sorted(src_dir.iterdir()):
            if f.is_file() and f.suffix in COPIED:
                shutil.copyfile(f, out / f.name)
                copied.append(out / f.name)
    return copied


def private_solutions(src: Path, dest: Path, stage: str | None = None, reference: Path | None = None) -> list[Path]:
    """Copy the solution notebooks a child may read into ``dest`` (the child's ``LABKIT_SOLUTIONS``): with ``stage``,
    only those of EARLIER stages (the given code that stage notebooks load with ``lk.from_stage``, from each one's
    source NN_topic.py beside it where there is one), never the graded stage's or a later one's; ``reference`` (a
    solution notebook) too, only while the child still times it."""
    dest.mkdir(parents=True)
    copied = []
    for f in sorted(src.glob("*.ipynb")):
        given = stage is None or f.name[:2] < stage
        if given or (reference is not None and f.name == Path(reference).name):
            for g in (f, source_of(f)) if given and source_of(f).is_file() else (f,):
                shutil.copyfile(g, dest / g.name)
                copied.append(dest / g.name)
    return copied


def job_view(job: dict, folder: Path, env: dict, memory_mb: int = 0, python_path=()) -> isolation.View:
    """What a job's child may read in its sandbox: its private labkit, the notebook it runs (its submission's copy),
    its inputs (each timed pass's too, once the parent writes them) and the tuning file it is told of, of the private solutions only earlier stages' (the graded stage's
    too only where the child times the reference), and the ``python_path`` folders its sandbox binds (the grader's
    PYTHONPATH, after its labkit on its path); it writes ``folder/work`` only."""
    read = [folder / "lib", *(Path(job[k]) for k in ("notebook", "student_notebook", "inputs", "tuning") if job.get(k))]
    if (job.get("timing") or {}).get("pass_inputs"):  # the folder each timed pass's images appear in
        read.append(Path(job["timing"]["pass_inputs"]).parent)
    stage = str(job["stage"])
    ref = Path(job["reference_notebook"]) if job.get("timing") and job.get("reference_notebook") else None
    read += [f for f in sorted((folder / "solutions").glob("*.ipynb")) if f.name[:2] < stage or f == ref]
    read += [f for f in sorted((folder / "solutions").glob("*.py")) if f.name[:2] < stage]  # given code's sources
    read += [Path(p) for p in python_path]
    scratch = folder / "work"
    return isolation.View(tuple(dict.fromkeys(str(p) for p in read if p.exists())), str(scratch),
                          isolation.child_env(env, str(scratch), str(folder / "lib"), python_path), memory_mb)


class Guard:
    """Checksums of the files a child must not change (its private labkit and solutions), by display name.
    ``changed()`` names the ones that differ; the job folder is deleted afterwards, so nothing is restored."""

    def __init__(self, files: dict[str, Path]):
        self.files = {name: (Path(p), self._digest(Path(p))) for name, p in files.items() if Path(p).is_file()}

    @staticmethod
    def _digest(path: Path) -> str | None:
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None

    def changed(self) -> list[str]:
        return [name for name, (path, digest) in self.files.items() if self._digest(path) != digest]


def child_env(extra: dict | None = None, lib: Path | None = None) -> dict:
    """The grader's environment (NUMBA_ENABLE_CUDASIM included), importing labkit from ``lib`` (a private copy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(lib or PACKAGE.parent), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


# ------------------------------------------------------------------------------------------- memory guard


def memory_guard(memory_mb: int, gpu: bool) -> str:
    """"rlimit" (set by the child on itself), "rss" (the parent's watchdog: CUDA needs the address space) or
    "none"."""
    if memory_mb <= 0:
        return "none"
    return "rss" if gpu else "rlimit"


def memory_guard_text(memory_mb: int, gpu: bool) -> str:
    guard = memory_guard(memory_mb, gpu)
    if guard == "none":
        return "none (limits.memory_mb = 0)"
    if guard == "rss":
        return (f"resident-memory watchdog at {memory_mb} MB (RLIMIT_AS is not used on a GPU: CUDA reserves more "
                f"address space than any sensible limit)")
    return f"address-space limit (RLIMIT_AS) of {memory_mb} MB"


# ------------------------------------------------------------------------------------------------ running


@dataclasses.dataclass
class ChildExit:
    """How a child ended, as the parent saw it."""

    timed_out: bool = False
    memory_exceeded: bool = False
    protocol_error: str | None = None
    returncode: int | None = None
    stderr_tail: str = ""
    survivors: list = dataclasses.field(default_factory=list)  # pids still there LINGER_S after the job was ended


#: how long a job's processes may take to go after they were killed, before the row says so: a process inside a GPU
#: kernel that never returns (a deadlock at a barrier) ends only once the driver has torn its context down
LINGER_S = 120.0


OnFrame = Callable[[protocol.Kind, dict, bytes, Callable[[protocol.Answer], None]], bool]


def _linger(pids: list[int], seconds: float) -> list[int]:
    """Wait up to ``seconds`` for processes that were killed to go; those still there."""
    deadline = time.monotonic() + seconds
    while True:
        left = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def linger_long(pids: list[int]) -> list[int]:
    """After a job's row: wait longer for processes that would not go (``STUCK_S``); those still there, whose
    device the run then gives no other job."""
    return _linger(pids, STUCK_S)


#: how much longer a device waits for a stuck job's processes before the run gives that device no more jobs
STUCK_S = 480.0


def run_child(job: dict, folder: Path, env: dict, time_limit: float, memory_mb: int, rss_guard: bool,
              on_frame: OnFrame, sandbox: isolation.Isolation | None = None, running=None, turns=None) -> ChildExit:
    """Start the worker in ``folder/work`` inside ``sandbox`` (None: the best this machine has, refused where there
    is none) with ``job`` on its stdin, hand every frame to ``on_frame`` (which returns True once the results are
    complete, or wrong enough to stop reading), and end it: at the limit, above the memory, when it exits, or once
    ``on_frame`` says so. ``running`` (a ``turns.Running``) and ``turns``: the child is registered with the run's
    turns (stopped while another job times), and the time it spends stopped or waiting for a turn moves its deadline.
    It returns once every process of the job is gone, or ``LINGER_S`` after they were killed (``survivors``)."""
    sandbox = sandbox if sandbox is not None else isolation.choose()
    result = ChildExit()
    rfd, wfd = os.pipe()
    inside_fd = sandbox.results_fd
    job = {**job, "fd": wfd if inside_fd is None else inside_fd}
    child = _spawn(sandbox, job, folder, env, memory_mb, wfd)
    proc = child.proc
    if running is not None:
        running.child = child
        if turns is not None:
            turns.started(running)

    def send(line: str) -> None:
        try:
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass

    send(json.dumps(job))
    try:
        _read(proc, rfd, result, send, on_frame, time_limit, (memory_mb if rss_guard else 0), running)
    finally:
        survivors = _end(sandbox, child, rfd, result, folder, running, turns)
    result.survivors = survivors
    return result


def _spawn(sandbox: isolation.Isolation, job: dict, folder: Path, env: dict, memory_mb: int, wfd: int):
    """The worker started in ``sandbox`` (its stdout and stderr into ``folder``'s files; the results on ``wfd``,
    which is closed here once the child holds it)."""
    argv = [sys.executable, "-m", WORKER]
    out = open(folder / "stdout.txt", "wb")
    err = open(folder / "stderr.txt", "wb")
    try:
        if sandbox.mode == "none":
            view = isolation.View((), str(folder / "work"), env, memory_mb)
        else:
            view = job_view(job, folder, env, memory_mb, sandbox.python_path())
        if sandbox.results_fd is None:  # the pipe is handed down
            return sandbox.spawn(argv, view, stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(wfd,))
        return sandbox.spawn(argv, view, stdin=subprocess.PIPE, stdout=wfd, stderr=err)  # results on its stdout
    finally:
        os.close(wfd)
        out.close()
        err.close()


def _read(proc, rfd: int, result: ChildExit, send, on_frame: OnFrame, time_limit: float, rss_limit_mb: int,
          running) -> None:
    """Frames from ``rfd`` to ``on_frame`` until the results are complete, the child exits, the limit passes
    (moved by the time it spent stopped), or its resident memory goes above ``rss_limit_mb`` (0: not watched)."""
    started = time.monotonic()
    buf = bytearray()
    reading, complete = True, False
    next_rss = 0.0
    while True:
        now = time.monotonic()
        deadline = started + time_limit + (running.paused_s() if running is not None else 0.0)
        if now >= deadline:
            result.timed_out = True
            return
        if not reading:
            try:
                proc.wait(timeout=min(0.5, deadline - now))
                return
            except subprocess.TimeoutExpired:
                if complete:  # nothing more to hear: a thread the student left running keeps it alive
                    return
                continue
        ready, _, _ = select.select([rfd], [], [], min(0.5, deadline - now))
        if ready:
            chunk = os.read(rfd, 1 << 20)
            if not chunk:
                reading = False
                continue
            buf += chunk
            frames, bad = protocol.parse(buf)
            for kind, meta, payload in frames:
                if on_frame(kind, meta, payload, lambda answer: send(answer.value)):
                    reading, complete = False, True
            if bad:
                result.protocol_error = bad
                return
        if rss_limit_mb > 0 and now >= next_rss:
            next_rss = now + 1.0
            if rss_mb([proc.pid, *descendants(proc.pid)]) > rss_limit_mb:
                result.memory_exceeded = True
                return


def _end(sandbox: isolation.Isolation, child, rfd: int, result: ChildExit, folder: Path, running, turns) -> list:
    """Every process of the job ended (those still there ``LINGER_S`` after: returned), its turn given back, its
    exit status and the tail of its stderr into ``result``."""
    proc = child.proc
    os.close(rfd)
    if running is not None and running.frozen:
        running.thaw()  # a stopped process takes no SIGKILL until it runs again
    survivors = sandbox.stop(child)
    if survivors:  # a process inside a GPU kernel that never returns goes only once the driver lets it
        survivors = _linger(survivors, LINGER_S)
    if turns is not None and running is not None:
        turns.ended(running)
    try:
        proc.stdin.close()
    except OSError:
        pass
    result.returncode = sandbox.exit_status(proc.returncode)
    try:
        result.stderr_tail = (folder / "stderr.txt").read_text(errors="replace")[-4000:]
    except OSError:
        pass
    return survivors
