"""Student code that reaches outside its job (tests/escape_submissions.py), graded by ``labkit grade`` under
bubblewrap on the simulator: every attack is stopped; under the docker mode (where ``$LABKIT_SANDBOX_IMAGE`` names an
image that ``$LABKIT_DOCKER`` or ``docker`` runs: not in CI) attacks 1 and 3 are too. And the sandbox's parts: what a child can see and write, a
detached grandchild ended with its sandbox, the limits inside it, the container modes' command lines, the refusal
to grade without a sandbox unless the instructor says --unsandboxed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from labkit import device, stages
from labkit.cli import main
from labkit.grading import isolation, sandbox

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import escape_submissions as es  # noqa: E402

BWRAP, WHY = isolation.bwrap_usable()
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason=f"no bubblewrap sandbox here: {WHY}")
DOCKER, DOCKER_WHY = es.docker_usable()
needs_docker = pytest.mark.skipif(DOCKER is None, reason=f"the docker mode cannot run here: {DOCKER_WHY}")


def _view(tmp_path: Path, read=()) -> isolation.View:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = isolation.child_env(dict(os.environ), str(scratch), None)
    return isolation.View(tuple(str(p) for p in read), str(scratch), env)


def _run(iso, argv, view, timeout=120) -> subprocess.CompletedProcess:
    child = iso.spawn(argv, view, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.proc.communicate(timeout=timeout)
    assert iso.stop(child) == []
    return subprocess.CompletedProcess(argv, iso.exit_status(child.proc.returncode), out, err)


# --------------------------------------------------------------------------------- the attacks, graded


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if BWRAP is None:
        pytest.skip(f"no bubblewrap sandbox here: {WHY}")
    if not device.is_simulated():
        pytest.skip("the class is graded on the CUDA simulator")
    setup = es.write(tmp_path_factory.mktemp("escape"))
    before = es.snapshot(setup)
    report = es.grade(setup, sandbox="bwrap")
    return es.observe(setup, report, before)


def test_the_class_is_graded_in_bubblewrap(graded):
    assert graded["sandbox"] == "bwrap"
    assert set(graded["rows"]) == {*es.ATTACKS, *es.VICTIMS}


def test_another_students_notebook_cannot_be_edited(graded):
    r, victim = graded["rows"]["a1_edit_student"], graded["rows"]["z1_victim"]
    assert "could not rewrite z1_victim's notebook (FileNotFoundError)" in r["message"], r["message"]
    assert not graded["victim_file_changed"]
    # graded after the attack, the victim's row is its own notebook's
    assert victim["status"] == "error" and es.OWN in victim["message"], victim["message"]
    assert es.EDITED not in victim["message"]


def test_the_solutions_folder_cannot_be_edited(graded):
    r, later = graded["rows"]["a2_edit_solutions"], graded["rows"]["z2_later"]
    assert "could not rewrite the --solutions folder's stage-03 solution (FileNotFoundError)" in r["message"], \
        r["message"]
    assert not graded["solutions_changed"]
    assert later["status"] == "error" and es.OWN in later["message"], later["message"]  # its given code loaded
    assert es.EDITED not in later["message"]


def test_a_detached_process_ends_with_its_job_and_the_grades_stay(graded):
    r = graded["rows"]["a3_detached"]
    assert r["status"] == "error" and "left a detached process" in r["message"], r["message"]
    assert graded["alive_at_exit"] == []
    assert not graded["grades_changed_after_exit"]
    assert graded["detached_row_after"][0] == "error" and graded["detached_row_after"][2] == "error"


def test_the_graded_stages_solution_cannot_be_read(graded):
    r = graded["rows"]["a4_read_solution"]
    assert r["status"] == "error" and r["score"] == 0, r["message"]
    msg = r["message"]
    assert "could not read the stage-04 solution" in msg, msg
    for where in ("repo: FileNotFoundError", "--solutions: FileNotFoundError", "LABKIT_SOLUTIONS: FileNotFoundError",
                  "package: FileNotFoundError"):
        assert where in msg, msg
    assert ": read" not in msg


@pytest.fixture(scope="module")
def graded_in_docker(tmp_path_factory):
    """Attacks 1 and 3 and the classmate attack 1 aims at, graded in the docker mode (podman here)."""
    if DOCKER is None:
        pytest.skip(f"the docker mode cannot run here: {DOCKER_WHY}")
    if not device.is_simulated():
        pytest.skip("the class is graded on the CUDA simulator")
    setup = es.write(tmp_path_factory.mktemp("escape-docker"))
    before = es.snapshot(setup)
    report = es.grade(setup, sandbox="docker", students=["a1_edit_student", "a3_detached", "z1_victim"])
    return es.observe(setup, report, before)


def test_in_docker_another_students_notebook_cannot_be_edited(graded_in_docker):
    seen = graded_in_docker
    assert seen["sandbox"] == "docker" and set(seen["rows"]) == {"a1_edit_student", "a3_detached", "z1_victim"}
    r, victim = seen["rows"]["a1_edit_student"], seen["rows"]["z1_victim"]
    assert "could not rewrite z1_victim's notebook" in r["message"], r["message"]  # not bound in its container
    assert not seen["victim_file_changed"]
    assert victim["status"] == "error" and es.OWN in victim["message"] and es.EDITED not in victim["message"]


def test_in_docker_a_detached_process_ends_with_its_job_and_the_grades_stay(graded_in_docker):
    seen = graded_in_docker
    r = seen["rows"]["a3_detached"]
    assert r["status"] == "error" and "left a detached process" in r["message"], r["message"]
    assert seen["alive_at_exit"] == []
    assert not seen["grades_changed_after_exit"]
    assert seen["detached_row_after"][0] == "error" and seen["detached_row_after"][2] == "error"


@needs_docker
def test_in_docker_ending_the_container_ends_a_detached_grandchild(tmp_path):
    """The job still runs when it is ended: ``docker rm -f`` (not the job's own exit) ends the grandchild too, and
    its scratch folder, which it could write, stays as it was."""
    late, token = _detach_and_stop(DOCKER, tmp_path, _view(tmp_path))
    assert es.processes_with(token) == []  # this machine sees a container's processes: none left
    time.sleep(2.5)
    assert not late.exists()


# ------------------------------------------------------------------------------------ the sandbox's parts


PROBE = """
import json, os, socket, subprocess, sys
seen = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        open(path, "rb").read(1)
        seen[name] = "read"
    except OSError as e:
        seen[name] = type(e).__name__
for name, path in json.loads(sys.argv[2]).items():
    try:
        with open(path, "w") as fh:
            fh.write("x")
        seen[name] = "wrote"
    except OSError as e:
        seen[name] = type(e).__name__
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    seen["net"] = "connected"
except OSError as e:
    seen["net"] = type(e).__name__
seen["remount"] = subprocess.run(["mount", "-o", "remount,bind,rw", sys.argv[3]], capture_output=True).returncode
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(seen))
"""


def _probe(iso, tmp_path: Path) -> tuple[dict, Path]:
    """What a child of ``iso`` could read, write, reach and see (PROBE), and the file it was given to read."""
    import json

    allowed = tmp_path / "allowed.txt"
    allowed.write_text("ok")
    (tmp_path / "hidden.txt").write_text("secret")
    view = _view(tmp_path, [allowed])
    reads = {"allowed": str(allowed), "hidden": str(tmp_path / "hidden.txt"),
             "solution": str(REPO / "solutions" / es.NB), "kit source": str(REPO / "labkit" / "core" / "check.py"),
             "shadow": "/etc/shadow", "home": os.path.expanduser("~/.bashrc")}
    writes = {"scratch": f"{view.scratch}/out.txt", "allowed (read-only)": str(allowed), "tmp": "/tmp/escape.txt",
              "venv": f"{sys.prefix}/escape.txt", "root": "/escape.txt"}
    got = _run(iso, [sys.executable, "-c", PROBE, json.dumps(reads), json.dumps(writes), str(allowed)], view)
    assert got.returncode == 0, got.stderr
    # in a container the results' stdout is descriptor 3: a print goes to stderr
    return json.loads(got.stdout if iso.results_fd is None else got.stderr.strip().splitlines()[-1]), allowed


@needs_bwrap
def test_a_child_reads_only_its_view_and_writes_only_its_scratch(tmp_path):
    seen, allowed = _probe(BWRAP, tmp_path)
    assert seen["allowed"] == "read" and seen["scratch"] == "wrote"
    for name in ("hidden", "solution", "kit source", "shadow", "home"):
        assert seen[name] == "FileNotFoundError", (name, seen)
    for name in ("allowed (read-only)", "tmp", "venv", "root"):
        assert seen[name] == "OSError", (name, seen)  # EROFS: a read-only file system
    assert seen["net"] in ("OSError", "ConnectionRefusedError") and seen["net"] != "connected", seen
    assert seen["remount"] != 0  # no capability left to make a read-only bind writable again
    assert max(seen["pids"]) < 10  # a PID namespace of its own: none of this machine's processes
    assert allowed.read_text() == "ok" and not Path("/tmp/escape.txt").exists()


@needs_docker
def test_in_docker_a_child_reads_only_its_view_and_writes_only_its_scratch(tmp_path):
    seen, allowed = _probe(DOCKER, tmp_path)
    assert seen["allowed"] == "read" and seen["scratch"] == "wrote"
    for name in ("hidden", "solution", "kit source", "shadow", "home"):
        assert seen[name] == "FileNotFoundError", (name, seen)
    for name in ("allowed (read-only)", "venv", "root"):
        assert seen[name] == "OSError", (name, seen)
    assert seen["tmp"] == "wrote" and not Path("/tmp/escape.txt").exists()  # podman's /tmp: the container's own
    assert seen["net"] in ("OSError", "ConnectionRefusedError") and seen["net"] != "connected", seen
    assert seen["remount"] != 0
    assert max(seen["pids"]) < 10
    assert allowed.read_text() == "ok"


DETACH = """
import os, sys, time
if os.fork() == 0:          # the child forks a grandchild in a session of its own, then leaves it orphaned
    if os.fork() == 0:
        os.setsid()
        time.sleep(float(sys.argv[2]))
        open(sys.argv[1], "w").write("outlived its job")
        os._exit(0)
    os._exit(0)
time.sleep(600)             # the job itself: still running when it is ended
"""


def _detach_and_stop(iso, tmp_path: Path, view) -> tuple[Path, str]:
    late, token = Path(view.scratch) / "late.txt", f"labkit-detach-{uuid.uuid4().hex[:10]}"
    child = iso.spawn([sys.executable, "-c", DETACH, str(late), "2", token], view)
    time.sleep(1.0)  # the grandchild is detached by now
    assert iso.stop(child) == []
    return late, token


@needs_bwrap
def test_ending_the_sandbox_ends_a_detached_grandchild(tmp_path):
    late, token = _detach_and_stop(BWRAP, tmp_path, _view(tmp_path))
    assert es.processes_with(token) == []  # gone when stop() returns, not later
    time.sleep(2.5)
    assert not late.exists()


def test_unsandboxed_a_detached_grandchild_outlives_its_job(tmp_path):
    """Why the sandbox is needed: ended by pid, the same grandchild survives and writes (the test above could fail)."""
    view = _view(tmp_path)
    late, token = _detach_and_stop(isolation.Isolation(), tmp_path, view)
    try:
        assert es.processes_with(token) != []
        deadline = time.monotonic() + 10
        while not late.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert late.read_text() == "outlived its job"
    finally:
        for pid in es.processes_with(token):
            os.kill(pid, 9)


MEMORY = """
import resource, sys, time
mb = int(sys.argv[1])
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (mb << 20, hard))          # the worker's own guard (rlimit)
try:
    bytearray(2 * mb << 20)
    print("allocated")
except MemoryError:
    print("MemoryError")
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
block = bytearray(int(sys.argv[2]) << 20)                        # what the parent's RSS watchdog must see
for i in range(0, len(block), 4096):
    block[i] = 1
print("resident", flush=True)
time.sleep(60)
"""


@needs_bwrap
def test_both_memory_guards_work_inside_the_sandbox(tmp_path):
    child = BWRAP.spawn([sys.executable, "-c", MEMORY, "1024", "300"], _view(tmp_path), stdout=subprocess.PIPE,
                        text=True)
    try:
        assert child.proc.stdout.readline().strip() == "MemoryError"
        assert child.proc.stdout.readline().strip() == "resident"
        # the watchdog sums this machine's view of the sandbox's processes, as run_child does
        assert sandbox.rss_mb([child.proc.pid, *sandbox.descendants(child.proc.pid)]) > 250
    finally:
        assert BWRAP.stop(child) == []
    assert BWRAP.exit_status(child.proc.returncode) == -9


@needs_docker
def test_in_docker_the_memory_limit_is_the_containers(tmp_path):
    """``--memory``: a child touching 1 GiB in a 256 MB container is killed (the watchdog could not see it)."""
    import dataclasses

    view = dataclasses.replace(_view(tmp_path), memory_mb=256)
    touch = "b = bytearray(1 << 30)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('allocated')"
    got = _run(DOCKER, [sys.executable, "-c", touch], view)
    assert got.returncode == -9 and "allocated" not in got.stderr, (got.returncode, got.stderr[-300:])


@needs_bwrap
def test_the_bwrap_command_line():
    view = isolation.View(("/job/lib", "/job/student/04.ipynb"), "/job/work", {})
    cmd = BWRAP.command(["python", "-m", "labkit.grading.worker"], view, info_fd=7)
    line = isolation.shell_line(cmd)
    for part in ("--unshare-all --unshare-user", "--cap-drop ALL", "--die-with-parent", "--new-session",
                 "--info-fd 7", "--ro-bind /job/lib /job/lib", "--bind /job/work /job/work", "--dev /dev",
                 "--proc /proc", "--remount-ro / --chdir /job/work -- python -m labkit.grading.worker"):
        assert part in line, part
    assert "--bind / " not in line and "--ro-bind / /" not in line and "/etc/shadow" not in line
    assert str(REPO) + " " not in line and str(REPO / "solutions") not in line


def test_container_command_lines(monkeypatch):
    monkeypatch.setattr(isolation, "nvidia_devices", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    view = isolation.View(("/job/lib", "/job/inputs.npz"), "/job/work",
                          {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2", "HOME": "/job/work"}, memory_mb=4096)
    argv = [sys.executable, "-m", "labkit.grading.worker"]
    app = isolation.shell_line(isolation.Apptainer("apptainer", "labkit.sif").command(argv, view))
    assert app.startswith("apptainer exec --containall --no-home --net --network none --pwd /job/work --nv ")
    assert "-B /job/lib:/job/lib:ro -B /job/inputs.npz:/job/inputs.npz:ro -B /job/work:/job/work labkit.sif" in app
    assert app.endswith("labkit.sif sh -c 'exec 3>&1 1>&2; exec \"$@\"' sh python3 -m labkit.grading.worker")
    dock = isolation.shell_line(isolation.Docker("docker", "course/labkit:1").command(argv, view, name="job-1"))
    for part in ("docker run --rm -i --name job-1 --network none --read-only --cap-drop ALL",
                 "--security-opt no-new-privileges", "--memory 4096m --memory-swap 4096m", "--gpus device=2",
                 "-v /job/lib:/job/lib:ro", "-v /job/work:/job/work -e HOME=/job/work -e PATH=/usr/bin",
                 "course/labkit:1 sh -c"):
        assert part in dock, part
    assert "CUDA_VISIBLE_DEVICES" not in dock  # inside, its one GPU is GPU 0
    assert isolation.Docker.results_fd == isolation.Apptainer.results_fd == 3 and isolation.Bwrap.results_fd is None


def test_the_docker_command_can_be_named(monkeypatch, tmp_path):
    """$LABKIT_DOCKER names a docker-compatible command (podman, where docker has no daemon); unset, docker."""
    engine = tmp_path / "podman"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    monkeypatch.setenv(isolation.DOCKER_ENV, str(engine))
    found = isolation.choose("docker", image="localhost/labkit-sandbox")
    assert found.mode == "docker" and found.exe == str(engine) and found.describe()["tool"] == "podman"
    view = isolation.View(("/job/lib",), "/job/work", {}, memory_mb=0)
    assert isolation.shell_line(found.command(["python"], view, name="j")).startswith(f"{engine} run --rm -i --name j ")
    monkeypatch.setenv(isolation.DOCKER_ENV, "no-such-engine-labkit")
    with pytest.raises(isolation.GradeError, match=r"no-such-engine-labkit \(LABKIT_DOCKER\) is not installed"):
        isolation.choose("docker", image="localhost/labkit-sandbox")
    monkeypatch.delenv(isolation.DOCKER_ENV)
    monkeypatch.setattr(isolation.shutil, "which", lambda name: f"/usr/bin/{name}" if name == "docker" else None)
    plain = isolation.choose("docker", image="course/labkit:1")
    assert plain.exe == "/usr/bin/docker" and plain.describe()["tool"] == "docker"


def test_the_docker_mode_kills_its_container_before_removing_it(monkeypatch):
    """podman's ``rm -f`` alone waits 10 s on a SIGTERM the container's first process ignores: kill first."""
    calls = []
    monkeypatch.setattr(isolation.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    done = subprocess.Popen(["true"])
    done.wait()
    assert isolation.Docker("podman", "img").stop(isolation.Child(done, name="labkit-job-1")) == []
    assert calls == [["podman", "kill", "labkit-job-1"], ["podman", "rm", "-f", "labkit-job-1"]]


def test_a_childs_environment_keeps_no_secrets(tmp_path):
    env = isolation.child_env({"PATH": "/usr/bin", "GITHUB_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k",
                               "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO), "HOME": "/root"},
                              str(tmp_path), "/job/lib")
    assert "GITHUB_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["NUMBA_ENABLE_CUDASIM"] == "1" and env["PYTHONPATH"] == "/job/lib"
    for var in ("HOME", "TMPDIR", "NUMBA_CACHE_DIR", "CUPY_CACHE_DIR", "MPLCONFIGDIR", "XDG_CACHE_HOME"):
        assert Path(env[var]).is_relative_to(tmp_path), var
    assert not any(str(REPO) in p for p in isolation.kit_paths() if Path(REPO).is_relative_to(p))


def test_the_private_solutions_hold_earlier_stages_only(tmp_path):
    names = {p.name[:2] for p in sandbox.private_solutions(REPO / "solutions", tmp_path / "a", "04")}
    assert names == {"00", "01", "02", "03"}
    timed = {p.name[:2] for p in sandbox.private_solutions(REPO / "solutions", tmp_path / "b", "04",
                                                           REPO / "solutions" / es.NB)}
    assert timed == {"00", "01", "02", "03", "04"}  # the reference, only while the child times it
    # given code runs from the earlier stages' sources (solutions/NN_topic.py); the reference's stays behind
    copied = {p.name for p in (tmp_path / "b").iterdir()}
    assert {n for n in copied if n.endswith(".py")} == {stages.STAGES[n].source for n in ("00", "01", "02", "03")}


@needs_bwrap
def test_a_childs_given_code_runs_from_the_private_solutions_sources(tmp_path):
    """In its sandbox a stage-04 job's child reads the earlier stages' sources (NN_topic.py) from its private
    solutions and runs lk.from_stage("03") from one, under the notebook's cell names; the graded stage's solution,
    notebook or source, is not there."""
    folder = tmp_path / "job"
    (folder / "work").mkdir(parents=True)
    sandbox.private_labkit(folder / "lib")
    sandbox.private_solutions(REPO / "solutions", folder / "solutions", "04")
    env = sandbox.child_env({"LABKIT_SOLUTIONS": str(folder / "solutions"), "NUMBA_ENABLE_CUDASIM": "1"},
                            lib=folder / "lib")
    code = ("import labkit as lk\nfrom labkit import stages\n"
            "print(stages.given_source('03'))\n"
            "s03 = lk.from_stage('03')\n"
            "print(sorted({f.__code__.co_filename for f in vars(s03).values() if hasattr(f, '__code__')}))\n"
            "try:\n    stages.given_source('04').read_text()\nexcept OSError as e:\n    print(type(e).__name__)\n")
    got = _run(BWRAP, [sys.executable, "-c", code], sandbox.job_view({"stage": "04"}, folder, env))
    assert got.returncode == 0, got.stderr
    where, files, refused = got.stdout.strip().splitlines()[-3:]
    assert where == str(folder / "solutions" / stages.STAGES["03"].source)
    assert eval(files) and all(f.startswith("<03_managed_memory.ipynb cell ") for f in eval(files)), files
    assert refused == "FileNotFoundError"


def test_grading_without_a_sandbox_is_refused_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    isolation.bwrap_usable.cache_clear()
    try:
        nb = tmp_path / "ann" / "notebooks" / es.NB
        nb.parent.mkdir(parents=True)
        nb.write_bytes((REPO / "notebooks" / es.NB).read_bytes())
        result = CliRunner().invoke(main, ["grade", str(tmp_path), "--stages", "04", "--out", str(tmp_path / "o"),
                                           "--no-progress"])
        assert result.exit_code != 0 and not (tmp_path / "o").exists()
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, result.output
        for words in ("no sandbox for student code here", "bubblewrap is not installed", "apt-get install bubblewrap",
                      "--unsandboxed"):
            assert words in lines[0], lines[0]
        forced = CliRunner().invoke(main, ["grade", str(tmp_path), "--sandbox", "docker", "--out", str(tmp_path / "o")])
        assert forced.exit_code != 0 and "docker is not installed" in forced.output
        both = CliRunner().invoke(main, ["grade", str(tmp_path), "--sandbox", "bwrap", "--unsandboxed"])
        assert both.exit_code != 0 and "contradict" in both.output
        assert isolation.choose(unsandboxed=True).mode == "none"
    finally:
        isolation.bwrap_usable.cache_clear()


# ------------------------------------------------------------------------------------------- before any job


def _class(tmp_path: Path) -> Path:
    """One student's untouched stage-01 notebook: grading would start at once, were it not refused."""
    nb = tmp_path / "class" / "ann" / "notebooks" / "01_serial_baseline.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_bytes((REPO / "notebooks" / "01_serial_baseline.ipynb").read_bytes())
    return tmp_path / "class"


def _refused(args: list[str], says: list[str], out: Path) -> str:
    """``labkit grade`` refused in one line saying each of ``says``, before any job (no report, no --out)."""
    got = CliRunner().invoke(main, ["grade", *args, "--out", str(out), "--no-progress"])
    lines = got.output.strip().splitlines()
    assert got.exit_code != 0 and len(lines) == 1 and "Traceback" not in got.output, got.output
    for words in says:
        assert words in lines[0], (words, lines[0])
    assert not out.exists()
    return lines[0]


@needs_bwrap
def test_a_child_importing_other_versions_refuses_the_run_before_any_job(tmp_path, monkeypatch):
    """The grader's numpy on PYTHONPATH and the child's elsewhere failed every reference solution with
    ``module 'numpy' has no attribute 'row_stack'``: now a probe child in the run's sandbox says what it imports,
    and a difference refuses the run in one line (the package, both versions, where from, what to do)."""
    from labkit.grading import environment, run

    real, where = environment.imported()
    monkeypatch.setattr(environment, "imported", lambda: ({**real, "numpy": "1.26.4"},
                                                          {**where, "numpy": "/opt/hpc/numpy/lib"}))

    def no_plans(*args, **kwargs):
        raise AssertionError("the run went on to plan its stages")

    monkeypatch.setattr(run, "Context", no_plans)
    _refused([str(_class(tmp_path)), "--stages", "01", "--sandbox", "bwrap"],
             ["nothing was graded: the grading child's Python imports numpy " + real["numpy"],
              "the grader numpy 1.26.4 from /opt/hpc/numpy/lib", "bubblewrap binds the grader's Python environment"],
             tmp_path / "grades")


def test_a_job_whose_child_imports_other_versions_is_the_graders_error_and_ends_at_hello():
    """A job's own child (a cluster worker's, a job started without the run's probe) is checked too: its row is the
    grader's error and nothing of the student's runs after the hello."""
    from labkit.grading import environment, job, protocol as P, scoring

    versions, origins = environment.imported()
    j = job.GradingJob.__new__(job.GradingJob)
    j.outcome, j.running, j.lib = scoring.JobOutcome(), None, Path(origins["labkit"])
    hello = P.Hello(device="d", kind="simulator", simulated=True, pid=1, labkit=str(Path(origins["labkit"]) / "labkit"),
                    versions={**versions, "numba": "0.59.0"}, origins=origins)
    assert j.handle(P.Kind.HELLO, hello.to_json(), b"", None) is True
    assert j.outcome.grader_error.startswith(f"not graded: the grading child's Python imports numba 0.59.0 from "
                                             f"{origins['numba']}, the grader numba {versions['numba']}")
    same = job.GradingJob.__new__(job.GradingJob)
    same.outcome, same.running, same.lib = scoring.JobOutcome(), None, Path(origins["labkit"])
    hello.versions = versions
    assert same.handle(P.Kind.HELLO, hello.to_json(), b"", None) is False and same.outcome.grader_error is None


@needs_bwrap
@pytest.mark.skipif(not device.is_simulated(), reason="a fake cupy on the path: only where nothing imports cupy")
def test_packages_on_pythonpath_are_imported_in_bubblewrap_as_by_the_grader(tmp_path):
    """pip install --target DIR, DIR on PYTHONPATH: the child reads DIR too (bound read-only, on its path after its
    labkit), so the probe finds the same versions. A cupy that only its metadata makes (nothing imports it here)."""
    site = tmp_path / "site"
    (site / "cupy").mkdir(parents=True)
    (site / "cupy" / "__init__.py").write_text("__version__ = '13.0.0'\n")
    (site / "cupy-13.0.0.dist-info").mkdir()
    (site / "cupy-13.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: cupy\nVersion: 13.0.0\n")
    code = ("from labkit.grading import child_start, environment, isolation\n"
            "print(environment.imported()[0]['cupy'])\n"
            "print(child_start.probe(isolation.choose('bwrap')))\n")
    env = {**os.environ, "PYTHONPATH": str(site), "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["13.0.0", "None"], proc.stdout


def test_a_pythonpath_entry_holding_what_students_must_not_read_is_refused(tmp_path, monkeypatch):
    """An entry is bound into the sandbox whole: one that holds the submissions, --out, the solutions, the jobs'
    folders, the home folder or / would let a student's code read them. The kit's checkout itself is left out
    (the child imports labkit from its job's copy); a folder of packages is fine."""
    import tempfile

    site, subs = tmp_path / "site", tmp_path / "class"
    site.mkdir()
    subs.mkdir()
    private = {"the submissions": subs, "--out": tmp_path / "grades", "the solutions": REPO / "solutions"}
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO), str(tmp_path / "gone"), ""])}
    assert isolation.python_path(env) == [str(site)] and isolation.python_path_refusal(private, env) == ""
    cases = [(tmp_path, private, f"holds the submissions ({subs})"),
             (tmp_path, {"--out": tmp_path / "grades"}, f"holds --out ({tmp_path / 'grades'})"),
             ("/", {}, "PYTHONPATH holds /,"), (Path.home(), {}, "holds the home folder"),
             (tempfile.gettempdir(), {}, "holds the jobs' folders")]
    if not any(Path(p).resolve().is_relative_to(REPO.parent.resolve()) for p in (tempfile.gettempdir(), Path.home())):
        cases.append((REPO.parent, {}, "holds the kit's checkout"))  # (else it holds one of those first)
    for entry, mine, says in cases:
        why = isolation.python_path_refusal(mine, {"PYTHONPATH": f"{site}{os.pathsep}{entry}"})
        assert says in why and "take it off PYTHONPATH" in why, (entry, why)
    if BWRAP is not None:
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        _refused([str(_class(tmp_path)), "--stages", "01", "--sandbox", "bwrap"],
                 [f"nothing was graded: PYTHONPATH entry {tmp_path} holds the submissions"], tmp_path / "grades")


def test_docker_without_its_daemon_is_refused_before_any_job(tmp_path, monkeypatch):
    """The docker client without a daemon gave a report of grader-error rows blaming the reference solution, exit
    0: now `docker version` is asked once, before any job, and its answer refuses the run in one line."""
    engine = tmp_path / "bin" / "docker"
    engine.parent.mkdir()
    engine.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the "
                      "docker daemon running?' >&2\nexit 1\n")
    engine.chmod(0o755)
    monkeypatch.setenv(isolation.DOCKER_ENV, str(engine))
    monkeypatch.setenv(isolation.IMAGE_ENV, "course/labkit:1")
    subs = _class(tmp_path)
    _refused([str(subs), "--stages", "01", "--sandbox", "docker"],
             ["nothing was graded: docker cannot start a container here: `docker version` says 'Cannot connect to "
              "the Docker daemon", f"or set {isolation.DOCKER_ENV}=podman"], tmp_path / "grades")
    engine.write_text("#!/bin/sh\nexit 0\n")  # a daemon answers; no image runs: the probe child says so
    _refused([str(subs), "--stages", "01", "--sandbox", "docker"],
             ["nothing was graded: the docker sandbox did not start a grading child"], tmp_path / "grades")
    assert "is not there" in isolation.Apptainer("apptainer", str(tmp_path / "labkit.sif")).unusable()
    assert isolation.Apptainer("apptainer", "docker://course/labkit:1").unusable() == ""
