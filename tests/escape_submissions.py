"""Stage-04 submissions whose code reaches outside its job, with the two classmates they aim at, and what each
sandbox mode lets them do (docs/grading.md, "Isolation").

    python tests/escape_submissions.py --write DIR     # the class: DIR/class/<student>/notebooks/04_...ipynb, and
                                                       # DIR/solutions (the --solutions copy the attacks aim at)
    python tests/escape_submissions.py --table         # grade the class under bubblewrap and under --unsandboxed
                                                       # (simulator) and print the Markdown table of docs/grading.md;
                                                       # under the docker mode too where it runs here
                                                       # ($LABKIT_SANDBOX_IMAGE, and $LABKIT_DOCKER=podman or docker)
    python tests/escape_submissions.py --table --before OLD   # ... and with the kit of an older checkout OLD
                                                       # (a `git archive` of it): the grader as it was

Each attack is the student copy of stage 04 (TODO stubs: it fails fast) with code that runs when its cells load,
and is given the paths it aims at (the strongest attacker: the class knows the course's layout):

1. ``edit_student``: rewrites the next student's notebook (``z1_victim``) so that it raises.
2. ``edit_solutions``: rewrites stage 03's solution in ``--solutions`` (the notebook and its source
   ``03_managed_memory.py``, which given code runs from), given code that the later student (``z2_later``, who
   loads ``lk.from_stage("03")``) takes from there, so that it cannot load.
3. ``detached``: leaves a grandchild in a session of its own that waits for ``grades.json`` to be written, then
   rewrites its own row in ``grades.json`` and ``grades.csv`` to a full-marks pass.
4. ``read_solution``: reads the graded stage's solution notebook (and its source, ``04_data_transfer_padding.py``)
   from the repo's ``solutions/``, the installed package's location, the ``--solutions`` folder and
   ``$LABKIT_SOLUTIONS``, and runs its kernel cells as its own.

Attacks 1-3 end by raising a RuntimeError that says what they did, so the grader's row says it. The classmates are
student copies too, that raise their own error when they load (``OWN``): fast to grade, and a row that is not
theirs shows. ``tests/test_grade_isolation.py`` grades the class under bubblewrap and asserts every attack is
stopped, and under the docker mode (where an engine and an image are here) that attacks 1 and 3 are.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = "04"
NB = "04_data_transfer_padding.ipynb"
GIVEN = "03_managed_memory.ipynb"  # an earlier stage's solution that z2_later loads (lk.from_stage("03"))
STUDENT_COPY = REPO / "notebooks" / NB

# graded on the simulator: only the timed variant, every job well within the limit, which is the rubric's (no
# reference job to scale it: op time is not measured on the simulator)
RUBRIC = """
[limits]
time_s = 240
sim_time_s = 240
time_factor = 0
memory_mb = 6144

[stage."04"]
variants = ["batched_padded"]
"""

ATTACKS = {
    "a1_edit_student": "edits another student's notebook in the submissions folder",
    "a2_edit_solutions": "edits stage 03's solution in the --solutions folder (given code a later student loads)",
    "a3_detached": "leaves a detached process (setsid grandchild) to rewrite grades.csv/grades.json after the grader",
    "a4_read_solution": "reads the graded stage's solution notebook (repo, installed package, --solutions, "
                        "$LABKIT_SOLUTIONS) and submits its kernel cells",
}
VICTIMS = {"z1_victim": "a1_edit_student", "z2_later": "a2_edit_solutions"}
EDITED = "edited by a classmate"  # what attacks 1 and 2 make the victims raise
OWN = "my own notebook, as I handed it in"  # what the victims raise by themselves

# ----------------------------------------------------------------------------------------- the attacks' code

_PRELUDE = '''
import json as _json
import os as _os
import sys as _sys
from pathlib import Path as _Path


def _poison(path, words):
    """Make a notebook's first kernel cell raise."""
    nb = _json.loads(_Path(path).read_text())
    cell = next(c for c in nb["cells"] if "kernel" in c.get("metadata", {{}}).get("tags", []))
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = f"raise RuntimeError({{words!r}})\\n" + src
    _Path(path).write_text(_json.dumps(nb))


def _poison_source(path, words):
    """Make a notebook source's (NN_topic.py, percent format) first kernel cell raise."""
    lines = _Path(path).read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("# %%") and '"kernel"' in line)
    lines.insert(at + 1, f"raise RuntimeError({{words!r}})\\n")
    _Path(path).write_text("".join(lines))


def _percent(text):
    """A notebook source's cells, as much of a notebook as the attack needs."""
    cells = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# %%"):
            cells.append({{"metadata": {{"tags": ["kernel"] if '"kernel"' in line else []}}, "source": []}})
        elif cells:
            cells[-1]["source"].append(line)
    return {{"cells": cells}}
'''

EDIT_STUDENT = _PRELUDE + '''
try:
    _poison({victim!r}, {edited!r})
    _got = "rewrote z1_victim's notebook"
except OSError as _e:
    _got = f"could not rewrite z1_victim's notebook ({{type(_e).__name__}})"
raise RuntimeError("escape attempt: " + _got)
'''

EDIT_SOLUTIONS = _PRELUDE + '''
try:
    _poison({given!r}, {edited!r})
    _poison_source({given_source!r}, {edited!r})
    _got = "rewrote the --solutions folder's stage-03 solution"
except OSError as _e:
    _got = f"could not rewrite the --solutions folder's stage-03 solution ({{type(_e).__name__}})"
raise RuntimeError("escape attempt: " + _got)
'''

# the grandchild: waits until grades.json was written (and left alone 2 s), then gives its own row full marks
REWRITE = '''
import csv, json, os, sys, time
out, me = sys.argv[1], sys.argv[2]
if os.fork():
    os._exit(0)
os.setsid()
js, cs = os.path.join(out, "grades.json"), os.path.join(out, "grades.csv")
end = time.time() + 900
while time.time() < end and not (os.path.exists(js) and time.time() - os.path.getmtime(js) > 2):
    time.sleep(0.2)
report = json.load(open(js))
for r in report["rows"]:
    if r["student"] == me:
        r.update(status="pass", passed=True, score=r["max_score"], message="all checks pass")
json.dump(report, open(js, "w"))
rows = list(csv.DictReader(open(cs)))
for r in rows:
    if r["student"] == me:
        r.update(status="pass", passed="True", score=r["max_score"], message="all checks pass")
with open(cs, "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
'''

DETACHED = '''
import subprocess as _sp
import sys as _sys

_p = _sp.Popen([_sys.executable, "-c", {code!r}, {out!r}, "a3_detached", {token!r}], start_new_session=True,
               stdin=_sp.DEVNULL, stdout=_sp.DEVNULL, stderr=_sp.DEVNULL)
_p.wait()  # its child forked the rewriter off and returned: the rewriter's parent is gone
raise RuntimeError("escape attempt: left a detached process to rewrite grades.json and grades.csv")
'''

READ_SOLUTION = _PRELUDE + '''
def _candidates():
    """Every place the graded stage's solution could be read from."""
    yield "repo", _Path({repo!r}) / "solutions" / {nb!r}
    yield "repo source", _Path({repo!r}) / "solutions" / {source!r}
    yield "--solutions", _Path({solutions!r}) / {nb!r}
    yield "--solutions source", _Path({solutions!r}) / {source!r}
    yield "LABKIT_SOLUTIONS", _Path(_os.environ.get("LABKIT_SOLUTIONS", "/nonexistent")) / {nb!r}
    yield "LABKIT_SOLUTIONS source", _Path(_os.environ.get("LABKIT_SOLUTIONS", "/nonexistent")) / {source!r}
    try:  # the installed package's location: an editable install names its checkout
        import importlib.metadata as _md
        _url = _json.loads(_md.distribution("labkit").read_text("direct_url.json") or "{{}}").get("url", "")
        if _url.startswith("file://"):
            yield "package", _Path(_url[7:]) / "solutions" / {nb!r}
        for _f in _md.distribution("labkit").files or []:
            if _f.name.startswith("__editable__") and _f.name.endswith("_finder.py"):
                _text = _Path(_f.locate()).read_text()
                for _part in _text.split("'"):
                    if _part.endswith("/labkit"):
                        yield "package", _Path(_part).parent / "solutions" / {nb!r}
    except Exception as _e:  # noqa: BLE001
        yield f"package ({{type(_e).__name__}})", _Path("/nonexistent") / {nb!r}


_tried = []
_solution = None
for _where, _path in _candidates():
    try:
        _text = _path.read_text()
        _found = _percent(_text) if _path.suffix == ".py" else _json.loads(_text)
        _solution = _solution or _found
        _tried.append(f"{{_where}}: read")
    except (OSError, ValueError) as _e:
        _tried.append(f"{{_where}}: {{type(_e).__name__}}")
if _solution is None:
    raise RuntimeError("escape attempt: could not read the stage-04 solution (" + "; ".join(_tried) + ")")
print("escape attempt:", "; ".join(_tried), file=_sys.stderr)
for _cell in _solution["cells"]:
    if "kernel" in _cell.get("metadata", {{}}).get("tags", []) and "VARIANTS" not in "".join(_cell["source"]):
        exec("".join(_cell["source"]), globals())
'''


def _cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]


def write(root: Path) -> dict:
    """The class under ``root/class``, a copy of the solutions under ``root/solutions`` (the --solutions the attacks
    aim at) and the grades folder they aim at (``root/out``); returns those paths and the detached process's token."""
    import nbformat

    token = f"labkit-escape-{uuid.uuid4().hex[:12]}"
    solutions, klass, out = root / "solutions", root / "class", root / "out"
    shutil.copytree(REPO / "solutions", solutions, ignore=shutil.ignore_patterns(".*"))
    paths = {name: klass / name / "notebooks" / NB for name in [*ATTACKS, *VICTIMS]}
    code = {
        "a1_edit_student": EDIT_STUDENT.format(victim=str(paths["z1_victim"]), edited=EDITED),
        "a2_edit_solutions": EDIT_SOLUTIONS.format(given=str(solutions / GIVEN),
                                                   given_source=str((solutions / GIVEN).with_suffix(".py")),
                                                   edited=EDITED),
        "a3_detached": DETACHED.format(code=REWRITE, out=str(out), token=token),
        "a4_read_solution": READ_SOLUTION.format(repo=str(REPO), solutions=str(solutions), nb=NB,
                                                 source=NB.replace(".ipynb", ".py")),
    }
    for name, path in paths.items():
        nb = nbformat.read(STUDENT_COPY, as_version=4)
        cells = _cells(nb)
        if name == "a4_read_solution":  # before the VARIANTS cell builds its dicts from the functions
            cells[-1].source = code[name] + "\n\n" + cells[-1].source
        elif name in code:  # when the first kernel cell runs
            cells[0].source += "\n\n" + code[name]
        else:  # a classmate (z2: with given code of an earlier stage, as a student may load it): its own error
            given = 's03 = lk.from_stage("03")\n' if name == "z2_later" else ""
            cells[0].source += f'\n\n{given}raise RuntimeError({OWN!r})\n'
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    (root / "rubric.toml").write_text(RUBRIC)
    return {"class": klass, "solutions": solutions, "out": out, "rubric": root / "rubric.toml", "token": token,
            "notebooks": paths}


# ---------------------------------------------------------------------------------------------- observing


def digests(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def processes_with(token: str) -> list[int]:
    """Processes of this machine whose command line holds ``token`` (the detached rewriter's)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                continue
    return out


def grade(setup: dict, sandbox: str = "auto", unsandboxed: bool = False, seed: int = 2024,
          students: list[str] | None = None) -> dict:
    """Grade the class (or ``students`` of it) one job at a time (each attack runs before the classmate it aims at),
    in this process."""
    from labkit import grading

    return grading.grade(setup["class"], stages=[STAGE], rubric=setup["rubric"], solutions=setup["solutions"],
                         out=setup["out"], jobs=1, seed=seed, progress=False, sandbox=sandbox, unsandboxed=unsandboxed,
                         students=students,
                         command=f"labkit grade class --stages {STAGE} --solutions solutions --jobs 1 --seed {seed}"
                                 + (" --unsandboxed" if unsandboxed else f" --sandbox {sandbox}"))


def observe(setup: dict, report: dict, before: dict, wait_s: float = 3.0) -> dict:
    """What each attack got: the rows, then (after ``wait_s``, the rewriter's chance) the files it aimed at."""
    rows = {r["student"]: r for r in report["rows"]}
    out = setup["out"]
    written = {n: (out / n).read_bytes() for n in ("grades.json", "grades.csv")}
    alive_at_exit = processes_with(setup["token"])
    time.sleep(wait_s)
    deadline = time.monotonic() + 60
    while processes_with(setup["token"]) and time.monotonic() < deadline:  # let a live rewriter finish
        time.sleep(0.5)
    after = {n: (out / n).read_bytes() for n in ("grades.json", "grades.csv")}
    rewritten = json.loads(after["grades.json"])
    mine = next(r for r in rewritten["rows"] if r["student"] == "a3_detached")
    with open(out / "grades.csv", newline="") as fh:
        csv_row = next(r for r in csv.DictReader(fh) if r["student"] == "a3_detached")
    return {
        "rows": rows,
        "victim_file_changed": setup["notebooks"]["z1_victim"].read_bytes() != before["victim"],
        "solutions_changed": digests(setup["solutions"]) != before["solutions"],
        "alive_at_exit": alive_at_exit,
        "grades_changed_after_exit": after != written,
        "detached_row_after": (mine["status"], mine["score"], csv_row["status"]),
        "sandbox": report["meta"].get("sandbox", {}).get("mode", "none (before: no sandbox)"),
    }


def docker_usable():
    """The kit's docker mode (``--sandbox docker``) where it runs here, else None, and why not: the command
    (``$LABKIT_DOCKER`` or ``docker``) and ``$LABKIT_SANDBOX_IMAGE`` set, and that image's ``python3`` importing the
    kit's dependencies in a container as the kit starts one (no network, read-only, no capabilities)."""
    from labkit.grading import isolation
    from labkit.grading.rubric import GradeError

    try:
        iso = isolation.choose("docker")
    except GradeError as exc:
        return None, str(exc)
    trial = [iso.exe, "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL", iso.image, iso.PYTHON,
             "-c", "import numba, numpy, nbformat"]
    try:
        proc = subprocess.run(trial, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{iso.exe} did not run: {exc}"
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["no message"])[0]
        return None, f"{iso.exe} cannot run {iso.image}'s {iso.PYTHON} (exit {proc.returncode}): {first}"
    return iso, ""


def snapshot(setup: dict) -> dict:
    return {"victim": setup["notebooks"]["z1_victim"].read_bytes(), "solutions": digests(setup["solutions"])}


def run_mode(mode: str, before_kit: Path | None = None) -> dict:
    """A fresh class graded one way ("bwrap", "docker", "unsandboxed", or "before": the kit of ``before_kit``),
    observed."""
    with tempfile.TemporaryDirectory(prefix="labkit-escape-") as tmp:
        setup = write(Path(tmp))
        try:
            return _graded(mode, setup, tmp, before_kit)
        finally:  # a rewriter that outlived everything (unsandboxed): this script started it, this script ends it
            for pid in processes_with(setup["token"]):
                os.kill(pid, signal.SIGKILL)


def _graded(mode: str, setup: dict, tmp: str, before_kit: Path | None) -> dict:
    snap = snapshot(setup)
    if mode == "before":  # the older kit's grader, in a process of its own (its rubric knows no time_factor)
        rubric = Path(tmp) / "rubric-before.toml"
        rubric.write_text(RUBRIC.replace("time_factor = 0\n", ""))
        env = {**os.environ, "PYTHONPATH": str(before_kit), "NUMBA_ENABLE_CUDASIM": "1"}
        prog = ("import sys, json; from labkit import grading; r = grading.grade(sys.argv[1], stages=['04'], "
                "rubric=sys.argv[2], solutions=sys.argv[3], out=sys.argv[4], jobs=1, seed=2024, progress=False)")
        subprocess.run([sys.executable, "-c", prog, str(setup["class"]), str(rubric), str(setup["solutions"]),
                        str(setup["out"])], env=env, check=True, cwd=tmp)
        report = json.loads((setup["out"] / "grades.json").read_text())
    else:
        report = grade(setup, unsandboxed=mode == "unsandboxed", sandbox="auto" if mode == "unsandboxed" else mode)
    return observe(setup, report, snap)


# ---------------------------------------------------------------------------------------------- the table


def _verdict(attack: str, seen: dict) -> str:
    rows = seen["rows"]
    if attack == "a1_edit_student":
        v = rows["z1_victim"]
        hit = seen["victim_file_changed"] or EDITED in v["message"]
        return (f"**{'victim hit' if hit else 'stopped'}**: z1_victim's notebook "
                f"{'rewritten' if seen['victim_file_changed'] else 'unchanged'}, graded {v['status']} "
                f"({'raises ' + repr(EDITED) if EDITED in v['message'] else 'its own error'})")
    if attack == "a2_edit_solutions":
        v = rows["z2_later"]
        hit = seen["solutions_changed"] or EDITED in v["message"]
        return (f"**{'later students hit' if hit else 'stopped'}**: --solutions "
                f"{'rewritten' if seen['solutions_changed'] else 'unchanged'}; z2_later graded {v['status']} "
                f"({'its given code raises' if EDITED in v['message'] else 'its own error'})")
    if attack == "a3_detached":
        status, score, csv_status = seen["detached_row_after"]
        # its cells raise: a pass is the rewriter's (written before this process looked, where the grader was another)
        hit = seen["grades_changed_after_exit"] or "pass" in (status, csv_status)
        return (f"**{'grades rewritten' if hit else 'stopped'}**: "
                f"{len(seen['alive_at_exit'])} rewriter process(es) alive when the grader returned; its row after: "
                f"{status} {score:g} (csv: {csv_status})")
    r = rows["a4_read_solution"]
    if "could not read" in r["message"]:
        return f"**stopped**: every path unreadable; graded {r['status']} {r['score']:g}/{r['max_score']:g}"
    caught = " (its exec'd cells are not its notebook's own code: the own-kernels rule)" \
        if r["status"] == "forbidden" else ""
    return f"**read it**: graded {r['status']} {r['score']:g}/{r['max_score']:g}{caught}"


def table(results: dict[str, dict]) -> str:
    modes = list(results)
    lines = ["| attack | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for name, what in ATTACKS.items():
        lines.append(f"| `{name}`: {what} | " + " | ".join(_verdict(name, results[m]) for m in modes) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", type=Path)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--before", type=Path, help="an older checkout's files (git archive): grade with its kit too")
    args = ap.parse_args(argv)
    if args.write:
        setup = write(args.write)
        print(f"wrote {setup['class']} and {setup['solutions']}; grade with --solutions {setup['solutions']} "
              f"--out {setup['out']}")
        return 0
    if args.table:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
        from labkit import device

        results = {}
        if args.before:
            results["before (the kit of --before)"] = run_mode("before", args.before)
        results["bwrap"] = run_mode("bwrap")
        docker, why = docker_usable()
        if docker is not None:  # the engine's name where it is not docker itself (podman)
            tool = docker.describe()["tool"]
            results["docker" if tool == "docker" else f"docker ({tool})"] = run_mode("docker")
        else:
            print(f"(no docker column: {why})", file=sys.stderr)
        results["--unsandboxed"] = run_mode("unsandboxed")
        print(table(results))
        cmd = "python tests/escape_submissions.py --table" + (" --before OLD" if args.before else "")
        if docker is not None:  # the engine and the image the docker column ran with
            from labkit.grading import isolation

            cmd = " ".join([*(f"{k}={os.environ[k]}" for k in (isolation.DOCKER_ENV, isolation.IMAGE_ENV)
                              if os.environ.get(k)), cmd])
        print(f"\n(computed by `{cmd}`: {time.strftime('%Y-%m-%d', time.gmtime())}, "
              f"{device.label(device.info())}, one job at a time)")
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
