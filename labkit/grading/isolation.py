"""The sandbox a job's child runs in: an existing tool, not a home-made one (docs/grading.md, "Isolation").

Every mode gives the child the same view: read access to the kit (its private labkit copy, the Python
environment, the system's libraries) and to the files its job names (its submission copy, its inputs, the given
code of earlier stages), write access to one private scratch folder (its working directory, HOME and every cache),
no network, and a process tree that ends with it (a PID namespace: nothing detaches). Paths are the same inside as
outside, so the job's JSON is valid in both.

- ``bwrap``: bubblewrap (Linux workstations, CI). User, PID, network, IPC, UTS and cgroup namespaces; every
  capability dropped (run as root, bubblewrap would otherwise leave the child able to remount its read-only binds
  writable); no nested user namespace where bubblewrap can refuse one; the root read-only; NVIDIA device nodes
  bound where the host has them.
- ``apptainer``: Slurm clusters. ``apptainer exec --containall --no-home --net --network none --nv`` with the
  course's image (``LABKIT_SANDBOX_IMAGE``) and the same paths bound.
- ``docker``: where a course grades in Docker: ``docker run --network none --read-only --cap-drop ALL`` with the
  course's image, the same paths bound, the memory limit as the container's; ``$LABKIT_DOCKER`` names another
  docker-compatible command (``podman``: no daemon).
- ``none``: only when the instructor says ``--unsandboxed``: a plain child process (``labkit.grading.sandbox``).

In the container modes the results travel on the container's stdout (the student's prints go to its stderr), as
no file descriptor crosses into a Docker container; bubblewrap and ``none`` hand the child the result pipe.

The grader's ``PYTHONPATH`` (packages installed with ``pip install --target``, an HPC module's) is bound read-only
into bubblewrap and stays on the child's path after its private labkit (``python_path``), except an entry that holds
what a student must not read (the submissions, ``--out``, the solutions, the jobs' folders, the home folder, ``/``):
refused in one line before any job (``python_path_refusal``). A container's image has its own environment.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

from .cores import set_affinity
from .processes import (WAIT_GONE_S, descendants, foreign_namespaces, kill_tree, ns_members, proc_table,
                        wait_gone, wait_stopped)
from .reading import (ETC, SYSTEM, SYSTEM_LINKS, child_env, kit_paths, named, nvidia_devices,  # noqa: F401
                      python_path, python_path_refusal)
from .rubric import GradeError

MODES = ("bwrap", "apptainer", "docker")
CHOICES = ("auto", *MODES)
IMAGE_ENV = "LABKIT_SANDBOX_IMAGE"
BWRAP_ENV = "LABKIT_BWRAP"  # a bubblewrap binary that is not on PATH
DOCKER_ENV = "LABKIT_DOCKER"  # the docker-compatible command of --sandbox docker (e.g. podman), else docker



@dataclasses.dataclass(frozen=True)
class View:
    """What one child may see: ``read`` (files or folders, read-only, at the same paths inside), ``scratch`` (the one
    writable folder, its working directory), its environment, and its memory limit in MB (0: none; the container
    modes enforce it, the others leave it to ``labkit.grading.sandbox``)."""

    read: tuple[str, ...]
    scratch: str
    env: dict
    memory_mb: int = 0


@dataclasses.dataclass
class Child:
    """A started child: the process this one waits on, and what its mode needs to end it."""

    proc: subprocess.Popen
    init_pid: int | None = None  # the PID namespace's first process, as this machine numbers it (bwrap)
    pid_ns: int | None = None  # that namespace's inode
    name: str = ""  # the container's name (docker)


# ---------------------------------------------------------------------------------------------------- modes


class Isolation:
    """No sandbox (``--unsandboxed``): the child is a plain process; ``labkit.grading.sandbox`` ends it by pid."""

    mode = "none"
    #: where the child writes its results inside: None = the inherited pipe, an int = that descriptor, which the
    #: container's stdout carries
    results_fd: int | None = None

    def describe(self) -> dict:
        return {"mode": self.mode, "tool": "", "guarantees": "none: the child runs as the grader's user, with the "
                "grader's file system and network (the instructor said --unsandboxed)"}

    def unusable(self) -> str:
        """Why this sandbox cannot start a child now, in a clause ("" when it can): asked once per run, before any
        job (docker without its daemon, an image file that is not there)."""
        return ""

    def python_path(self) -> list[str]:
        """The grader's PYTHONPATH folders this sandbox binds and puts on the child's path (``python_path``)."""
        return []

    def advice(self, package: str, version: str | None) -> str:
        """What to do when the child imports another version of ``package`` than the grader (``version``)."""
        return ("the child runs with the grader's own environment: start labkit grade from the Python environment "
                "the kit is installed in, with the PYTHONPATH it was installed for")

    def command(self, argv: list[str], view: View, **_) -> list[str]:
        return list(argv)

    def spawn(self, argv: list[str], view: View, **popen) -> Child:
        return Child(subprocess.Popen(argv, cwd=view.scratch, env=view.env, start_new_session=True, **popen))

    def stop(self, child: Child) -> list[int]:
        """End the child and everything it started; the pids still alive after (none expected)."""

        kill_tree(child.proc)
        return []

    def exit_status(self, code: int | None) -> int | None:
        """The worker's exit status as ``subprocess`` gives it (-N: killed by signal N)."""
        return code

    def processes(self, child: Child) -> list[int]:
        """Every process of the job now: the child's session and its descendants."""

        table = proc_table()
        return sorted({pid for pid, _, pgid in table if pgid == child.proc.pid}
                      | set(descendants(child.proc.pid, table)) | ({child.proc.pid} if child.proc.poll() is None
                                                                   else set()))

    def pause(self, child: Child, stop: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the job (``labkit.grading.turns``): twice, so that
        a process forked while the first pass ran is stopped too."""
        sig = signal.SIGSTOP if stop else signal.SIGCONT
        done: set[int] = set()
        for _ in range(2):
            for pid in self.processes(child):
                if pid not in done:
                    done.add(pid)
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
        if stop:  # a signal takes effect when its process next runs: a turn starts once they all have
            wait_stopped(done)

    def pin(self, child: Child, cores: set[int]) -> None:
        """Every thread of every process of the job onto ``cores`` (a turn's kept core, and back)."""
        set_affinity(self.processes(child), cores)



class Sandboxed(Isolation):
    """A tool between this process and the worker, which reports a worker killed by signal N as 128 + N."""

    def exit_status(self, code: int | None) -> int | None:
        return -(code - 128) if code is not None and 128 < code < 128 + 65 else code


class Bwrap(Sandboxed):
    mode = "bwrap"

    def __init__(self, exe: str, version: str, disable_userns: bool):
        self.exe, self.version, self.disable_userns = exe, version, disable_userns

    def describe(self) -> dict:
        return {"mode": self.mode, "tool": self.version, "guarantees": (
            "reads only the kit, its submission, its inputs and earlier stages' given code; writes only its scratch "
            "folder; no network; all capabilities dropped; its PID namespace ends with it")}

    def python_path(self) -> list[str]:
        return python_path()

    def advice(self, package: str, version: str | None) -> str:
        return (f"bubblewrap binds the grader's Python environment and its PYTHONPATH folders, so the child imports "
                f"{package} from a folder the grader does not: install {named(package, version)} where the grader's "
                f"Python imports it from, and leave one version on the path")

    def command(self, argv: list[str], view: View, info_fd: int | None = None) -> list[str]:
        cmd = [self.exe, "--unshare-all", "--unshare-user", *(["--disable-userns"] if self.disable_userns else []),
               "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
        if info_fd is not None:
            cmd += ["--info-fd", str(info_fd)]
        for path in SYSTEM:
            cmd += ["--ro-bind", path, path]
        for path in SYSTEM_LINKS:
            if os.path.islink(path):
                cmd += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                cmd += ["--ro-bind", path, path]
        for name in ETC:
            cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for path in [*kit_paths(), *view.read]:
            cmd += ["--ro-bind", path, path]
        cmd += ["--bind", view.scratch, view.scratch, "--dev", "/dev"]
        gpus = nvidia_devices()
        for dev in gpus:  # the GPU reachable inside: its device nodes, and /sys for the driver's queries
            cmd += ["--dev-bind", dev, dev]
        cmd += ["--proc", "/proc"]
        if gpus:
            cmd += ["--ro-bind", "/sys", "/sys"]
        return [*cmd, "--remount-ro", "/", "--chdir", view.scratch, "--", *argv]

    def spawn(self, argv: list[str], view: View, pass_fds=(), **popen) -> Child:
        rfd, wfd = os.pipe()
        try:
            proc = subprocess.Popen(self.command(argv, view, info_fd=wfd), env=view.env, start_new_session=True,
                                    pass_fds=(*pass_fds, wfd), **popen)
        finally:
            os.close(wfd)
        data = b""
        try:  # bwrap writes where its namespace's first process is, then closes the descriptor (or exits)
            while chunk := os.read(rfd, 4096):
                data += chunk
        finally:
            os.close(rfd)
        try:
            info = json.loads(data.decode() or "{}")
        except ValueError:
            info = {}
        return Child(proc, info.get("child-pid"), info.get("pid-namespace"))

    def stop(self, child: Child) -> list[int]:
        """SIGKILL the namespace's first process: the kernel kills every other process of the namespace, and bwrap
        exits once they are all gone; then check that none is left."""

        if child.init_pid and child.proc.poll() is None:
            try:
                os.kill(child.init_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_tree(child.proc)
        return wait_gone([child.pid_ns])

    def processes(self, child: Child) -> list[int]:
        """Every process of the job's PID namespace (a process that left the child's tree is still there)."""
        return ns_members(child.pid_ns) if child.pid_ns else super().processes(child)


class Container(Sandboxed):
    """A course's container image: the child reads the image and the bound paths, writes its scratch folder."""

    results_fd = 3
    #: inside the container: descriptor 3 carries the results on stdout, the student's prints go to stderr
    WRAP = ["sh", "-c", 'exec 3>&1 1>&2; exec "$@"', "sh"]
    PYTHON = "python3"
    TESTED = "not run by the kit's own tests"

    def __init__(self, exe: str, image: str, version: str = ""):
        self.exe, self.image, self.version = exe, image, version

    def describe(self) -> dict:
        return {"mode": self.mode, "tool": self.version, "image": self.image, "guarantees": (
            "reads only the image and the bound kit, submission, inputs and earlier stages' given code; writes only "
            f"its scratch folder; no network; its PID namespace ends with it ({self.TESTED})")}

    def inner(self, argv: list[str]) -> list[str]:
        """The worker's command inside the image: the image's Python, the results on stdout."""
        return [*self.WRAP, self.PYTHON, *argv[1:]]

    def advice(self, package: str, version: str | None) -> str:
        return (f"the image {self.image} ({IMAGE_ENV}) must hold the grader's versions: install "
                f"{named(package, version)} in it (or grade with a Python that has the image's)")


class Apptainer(Container):
    mode = "apptainer"

    def unusable(self) -> str:
        """An image named by its path (not ``docker://``, ``library://``...) must be there."""
        if "://" not in self.image and not os.path.exists(self.image):
            return (f"the image {self.image} ({IMAGE_ENV}) is not there: build it (apptainer build) or name the "
                    f".sif file that holds the kit's Python environment")
        return ""

    def command(self, argv: list[str], view: View, **_) -> list[str]:
        cmd = [self.exe, "exec", "--containall", "--no-home", "--net", "--network", "none", "--pwd", view.scratch]
        if nvidia_devices():
            cmd.append("--nv")
        for path in view.read:
            cmd += ["-B", f"{path}:{path}:ro"]
        cmd += ["-B", f"{view.scratch}:{view.scratch}"]
        return [*cmd, self.image, *self.inner(argv)]

    def spawn(self, argv: list[str], view: View, **popen) -> Child:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),  # --containall cleans the rest
               **{f"APPTAINERENV_{k}": v for k, v in view.env.items() if k != "PATH"}}
        return Child(subprocess.Popen(self.command(argv, view), env=env, cwd=view.scratch, start_new_session=True,
                                      **popen))

    def stop(self, child: Child) -> list[int]:

        namespaces = foreign_namespaces(descendants(child.proc.pid))
        kill_tree(child.proc)  # the container's first process among them: its namespace goes with it
        return wait_gone(namespaces)

    def processes(self, child: Child) -> list[int]:

        members = [pid for ns in foreign_namespaces(descendants(child.proc.pid)) for pid in ns_members(ns)]
        return sorted(set(members) | set(super().processes(child)))


class Docker(Container):
    mode = "docker"
    TESTED = "run by the kit's own tests through podman where an image is built, not in CI"

    def unusable(self) -> str:
        """``docker version`` fails where the client has no daemon to talk to (podman needs none)."""
        try:
            done = subprocess.run([self.exe, "version"], capture_output=True, text=True, timeout=WAIT_GONE_S)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{self.exe} version did not run ({exc})"
        if done.returncode == 0:
            return ""
        said = " ".join((done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").split())[:200]
        return (f"{Path(self.exe).name} cannot start a container here: `{Path(self.exe).name} version` says {said!r} "
                f"(start its daemon, or set {DOCKER_ENV}=podman, which needs none)")

    def command(self, argv: list[str], view: View, name: str = "labkit-job", **_) -> list[str]:
        cmd = [self.exe, "run", "--rm", "-i", "--name", name, "--network", "none", "--read-only", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--pids-limit", "4096", "--user", f"{os.getuid()}:{os.getgid()}",
               "-w", view.scratch]
        if view.memory_mb > 0:
            cmd += ["--memory", f"{view.memory_mb}m", "--memory-swap", f"{view.memory_mb}m"]
        env = dict(view.env)
        visible = env.pop("CUDA_VISIBLE_DEVICES", None)  # inside, the GPU it is given is GPU 0
        if visible is not None and visible.strip():
            cmd += ["--gpus", f"device={visible}"]
        elif nvidia_devices():
            cmd += ["--gpus", "all"]
        for path in view.read:
            cmd += ["-v", f"{path}:{path}:ro"]
        cmd += ["-v", f"{view.scratch}:{view.scratch}"]
        for k, v in sorted(env.items()):
            cmd += ["-e", f"{k}={v}"]
        return [*cmd, self.image, *self.inner(argv)]

    def spawn(self, argv: list[str], view: View, **popen) -> Child:
        name = f"labkit-job-{uuid.uuid4().hex[:12]}"
        return Child(subprocess.Popen(self.command(argv, view, name=name), cwd=view.scratch, start_new_session=True,
                                      **popen), name=name)

    def stop(self, child: Child) -> list[int]:
        """The engine runs the container, not this process: ``docker kill`` (SIGKILL at once; podman's ``rm -f`` alone
        sends SIGTERM, which the container's first process ignores, and kills 10 s later, while a detached process
        still runs), then ``docker rm -f``, which returns once it is gone."""

        for action in (["kill", child.name], ["rm", "-f", child.name]):
            try:
                subprocess.run([self.exe, *action], capture_output=True, timeout=WAIT_GONE_S)
            except (OSError, subprocess.SubprocessError):
                pass
        kill_tree(child.proc)
        return []

    def pin(self, child: Child, cores: set[int]) -> None:
        """The container's processes belong to the engine: left where it runs them (docs/grading.md)."""

    def pause(self, child: Child, stop: bool) -> None:
        """The engine runs the container: ``docker pause`` (the cgroup freezer) or ``docker unpause``."""
        try:
            subprocess.run([self.exe, "pause" if stop else "unpause", child.name], capture_output=True,
                           timeout=WAIT_GONE_S)
        except (OSError, subprocess.SubprocessError):
            pass


# ------------------------------------------------------------------------------------------------ choosing


@functools.lru_cache(maxsize=None)
def bwrap_usable() -> tuple[Bwrap | None, str]:
    """A working bubblewrap (``$LABKIT_BWRAP``, else ``bwrap`` on PATH), or why there is none (not installed, or it
    cannot make its namespaces here)."""
    exe = shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")
    if exe is None:
        return None, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = "bwrap"
    why = ""
    for disable in (True, False):  # --disable-userns needs bubblewrap 0.8
        trial = [exe, "--unshare-all", "--unshare-user", *(["--disable-userns"] if disable else []), "--cap-drop",
                 "ALL", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--", "true"]
        try:
            proc = subprocess.run(trial, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"bubblewrap ({exe}) did not run: {exc}"
        if proc.returncode == 0:
            return Bwrap(exe, version or "bwrap", disable), ""
        why = " ".join(proc.stderr.split())[:200]
    return None, (f"bubblewrap ({exe}) cannot make its namespaces here ({why}): allow unprivileged user namespaces "
                  f"(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu an AppArmor profile for bwrap)")


def _container(mode: str, image: str | None) -> tuple[Isolation | None, str]:
    cls, tool = (Apptainer, "apptainer") if mode == "apptainer" else (Docker, "docker")
    named = os.environ.get(DOCKER_ENV) if tool == "docker" else None  # e.g. podman, where docker has no daemon
    exe = shutil.which(named or tool) or (shutil.which("singularity") if tool == "apptainer" else None)
    if exe is None:
        return None, f"{named} ({DOCKER_ENV}) is not installed" if named else f"{tool} is not installed"
    if named:
        tool = Path(exe).name
    if not image:
        return None, (f"{tool} needs the course's image with the kit's Python environment: set {IMAGE_ENV} "
                      f"(e.g. {IMAGE_ENV}=labkit.sif)")
    return cls(exe, image, tool), ""


def choose(request: str = "auto", unsandboxed: bool = False, image: str | None = None) -> Isolation:
    """The isolation a grading run uses: ``request`` (auto: bubblewrap where it works, else apptainer or docker where
    installed with an image in LABKIT_SANDBOX_IMAGE), or no sandbox with ``unsandboxed``. Raises GradeError, in one
    line, where none can be had."""
    request = (request or "auto").lower()
    if request not in CHOICES:
        raise GradeError(f"--sandbox takes {', '.join(CHOICES)}, not {request!r}")
    if unsandboxed:
        if request != "auto":
            raise GradeError(f"--sandbox {request} and --unsandboxed contradict each other: give one")
        return Isolation()
    image = image if image is not None else os.environ.get(IMAGE_ENV)
    if request == "bwrap":
        found, why = bwrap_usable()
    elif request in ("apptainer", "docker"):
        found, why = _container(request, image)
    else:
        found, why = bwrap_usable()
        if found is None and image:  # a container tool that is installed and can start a container
            found = next((f for f, _ in (_container(m, image) for m in ("apptainer", "docker"))
                          if f and not f.unusable()), None)
    if found is None:
        raise GradeError(f"no sandbox for student code here: {why}; or --sandbox apptainer|docker with {IMAGE_ENV}; "
                         f"or grade without one with --unsandboxed (only code you trust)")
    return found


def by_mode(described: dict | None) -> Isolation:
    """The isolation a report's ``meta.sandbox`` (``describe()``) names, chosen again here (a cluster worker)."""
    d = described or {}
    if d.get("mode") == "none":
        return Isolation()
    return choose(d.get("mode") or "auto", image=d.get("image"))


def shell_line(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)
