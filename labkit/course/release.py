"""Student repositories without the answers: ``labkit release --upto NN OUT/``.

A release for milestone NN holds the student copies of stages 00..NN, the given code of the stages before NN (their
deadlines have passed: ``labkit.given``), the kit, the student docs, the kit's committed GPU results (without the
executed solution notebooks kept there), a small test suite and a README. It never holds ``solutions/``: ``build``
runs the leak search (``labkit.course.leak_search``) on what it wrote and fails when it finds anything.

What of the kit's own code a release leaves out (code that answers a task of the milestone's stage or a later one,
and the maintainers' machinery) is declared in ``labkit.leave_out``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from ..outputs import OutputError, writable_folder
from . import given, nbcells
from .leak_search import ReleaseError, Verification, make_student, released_files, solution_notebook, verify
from .leave_out import kit_left_out
from .stages import REPO, STAGES, solution

DOCS = ("students.md", "reference_figures.md", "design.md")  # the docs a student reads; their images come along
KIT_TESTS = ("test_device.py", "test_kernels.py", "test_reference.py", "test_weights.py")  # kit-only tests
SUITE = REPO / "tools" / "release_tests"  # the release's own tests, copied into its tests/
_SKIP_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints", "given"}
_SKIP_RESULTS = {".ipynb"}  # results/ keeps executed solution notebooks: never released
_IGNORED_RESULTS = {"scratch", "ledger.jsonl"}  # .gitignore'd there


# ------------------------------------------------------------------------------------------------ building


def _tracked(repo: Path, folder: Path) -> set[Path] | None:
    """The files git tracks under ``folder`` (None when ``repo`` is no git checkout): an untracked file in the
    instructor's working tree (a scratch run, a module not committed yet) is not released."""
    if not (repo / ".git").exists():
        return None
    listed = subprocess.run(["git", "ls-files", "-z", "--", str(folder.relative_to(repo))], cwd=repo,
                            capture_output=True, text=True)
    return {repo / name for name in listed.stdout.split("\0") if name} if listed.returncode == 0 else None


def _copy_tree(src: Path, dst: Path, repo: Path, skip_suffixes=(), skip_names=(), skip=None) -> None:
    tracked = _tracked(repo, src)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or set(rel.parts) & _SKIP_DIRS or path.suffix in (".pyc", *skip_suffixes) \
                or rel.parts[0] in skip_names or (tracked is not None and path not in tracked) \
                or (skip is not None and skip(rel)):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst / rel)


def _prepare(out: Path, repo: Path, milestone: str, force: bool = False) -> None:
    """An empty ``out``, or a previous release emptied but for its .git (the next milestone is a new commit); a
    release of a later milestone only with ``force`` (its later stages would go)."""
    out = out.resolve()
    if out == repo.resolve() or repo.resolve().is_relative_to(out):
        raise ReleaseError(f"{out} holds the instructor's repository: give a new folder for the release")
    if out.exists() and not out.is_dir():
        raise ReleaseError(f"{out} is a file: give a folder for the release")
    try:
        writable_folder(out, "the release folder")
    except OutputError as exc:
        raise ReleaseError(str(exc)) from None
    if out.exists() and any(p.name != ".git" for p in out.iterdir()):
        info = given.manifest(out / "labkit" / "given")
        if info is None:
            raise ReleaseError(f"{out} is not empty and holds no earlier release: give an empty or new folder")
        lost = [n for n in STAGES if milestone < n <= info["milestone"]]
        if lost and not force:
            code = sorted(n for n in info.get("files", {}) if n >= milestone)
            raise ReleaseError(f"{out} holds the release of milestone {info['milestone']}: --upto {milestone} would "
                               f"delete stages {given.span(lost)} from it (their notebooks"
                               + (f"; and the given code of {given.span(code)}" if code else "")
                               + "): pass --force to do that, or name another folder")
        for p in out.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _pyproject(repo: Path) -> str:
    """The kit's pyproject (same dependencies and package data), with pytest collecting the release's tests only."""
    text = (repo / "pyproject.toml").read_text()
    fixed = re.sub(r'(?m)^testpaths = .*$', 'testpaths = ["tests"]', text, count=1)
    fixed = re.sub(r'(?m)^addopts = .*$', 'addopts = "-p no:cacheprovider"', fixed, count=1)
    if 'testpaths = ["tests"]' not in fixed or 'addopts = "-p no:cacheprovider"' not in fixed:
        raise ReleaseError("pyproject.toml has no testpaths and addopts lines under [tool.pytest.ini_options] "
                           "for the release to rewrite")
    return fixed


def _docs(repo: Path, out: Path) -> list[str]:
    copied = []
    for name in DOCS:
        src = repo / "docs" / name
        if not src.is_file():
            continue
        (out / "docs").mkdir(exist_ok=True)
        text = src.read_text()
        (out / "docs" / name).write_text(text)
        copied.append(name)
        for img in re.findall(r"\]\((img/[^)\s]+)\)", text):
            if (repo / "docs" / img).is_file():
                (out / "docs" / img).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(repo / "docs" / img, out / "docs" / img)
    return copied


def _readme(milestone: str, released: dict[str, str]) -> str:
    """The release's README.md: how to start, this milestone's stages and given code, then ``_readme_rest``."""
    numbers = [n for n in STAGES if n <= milestone]
    rows = "\n".join(
        f"| `{STAGES[n].notebook[:-6]}` | {STAGES[n].title} | "
        + (f"given: `labkit/given/{released[n]}`" if n in released else
           "deadline passed (no kernels)" if n < milestone else "yours: this milestone") + " |"
        for n in numbers)
    before = given.span([n for n in STAGES if n < milestone])
    return f"""# labkit: make a small CNN fast on a GPU — milestone {milestone}

Your copy of the course kit for milestone {milestone}: the notebooks of stages {given.span(numbers)} in `notebooks/`,
and `labkit`, the package they import. You fill in the cells marked TODO in `notebooks/{STAGES[milestone].notebook}`
(and any earlier stage you have not finished); the self-check cell says PASS, or FAIL with where the first wrong
value is. A GPU is not needed: without one, numba's CUDA simulator runs your kernels on shrunk problems.

## Start

```bash
python3 -m venv .venv && .venv/bin/pip install -e ".[lab]" && .venv/bin/labkit lab
```

opens JupyterLab on `notebooks/`. [docs/students.md](docs/students.md) says how on a laptop, a GPU machine or a
hosted notebook service.

## This milestone

| notebook | topic | code |
|---|---|---|
{rows}

The deadlines of stages {before} have passed, so their kernels come with this milestone as given code: the
kit's own solutions of those stages, in `labkit/given/`, which `lk.from_stage("NN")` loads in the notebooks that
build on them (a bug left in your earlier stage cannot break a later one). Asking for a stage whose deadline has not
passed says so in one line; its code comes with the milestone after that deadline.

""" + _readme_rest(before)


def _readme_rest(before: str) -> str:
    """The README's sections after the milestone's: data, tests, handing in."""
    return f"""## Data

CIFAR-10 and Fashion-MNIST, from their official URLs with their published md5 sums:

```bash
.venv/bin/labkit data fetch      # both, into data/ of this folder (needs internet)
.venv/bin/labkit data where      # where labkit looks, in order, and what it finds
```

If your course gives you a copy, set `LABKIT_DATA` to the folder that holds `cifar-10-batches-bin/` and
`fashion-mnist/`. Without data the notebooks still run, on synthetic inputs, and say so (accuracy "n/a").

## Tests

```bash
.venv/bin/pip install -e ".[dev]" && .venv/bin/pytest
```

checks that the kit imports and computes what it should, that the given code of stages {before} loads, that later
stages' code is not here, and that every notebook runs untouched from top to bottom (on the simulator; a few
minutes).

## Handing in

Your course says how (for a GitHub Classroom assignment: commit your notebooks and push). The grader runs only the
cells tagged `kernel` in your notebooks, on inputs of its own, so keep your kernels in those cells.
"""


def _given_code(repo: Path, out: Path, milestone: str) -> dict[str, str]:
    """labkit/given/: each earlier stage's kernel cells (from its solution's source, NN_topic.py) as a file, and the
    manifest that makes this a release."""
    folder = out / "labkit" / "given"
    folder.mkdir(parents=True)
    files = {}
    for number, stage in STAGES.items():
        if number >= milestone:
            continue
        nb = nbcells.read(solution(number, solution_notebook(repo, number).parent))
        cells = [(i, src) for i, src in nbcells.tagged_cells(nb)
                 if nbcells.KIT_ONLY_TAG not in nb.cells[i].get("metadata", {}).get("tags", [])]
        if cells:
            name = stage.notebook.replace(".ipynb", ".py")
            (folder / name).write_text(given.render(number, stage.notebook, stage.title, cells, milestone))
            files[number] = name
    manifest = {"milestone": milestone, "released": [n for n in STAGES if n < milestone], "files": files}
    (folder / given.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return files


def _figures(repo: Path, out: Path, number: str) -> None:
    """The access pictures a released stage's task specs show (``notebooks/figures/NN_task*.png``) and the spec's
    recordings beside them, which ``lk.show.task`` draws under a student's own (``NN_task*.json``): patterns of reads
    and writes, no code, so they ship with the stage's notebook."""
    for path in sorted((repo / "notebooks" / "figures").glob(f"{number}_task*")):
        if path.suffix in (".png", ".json"):
            (out / "notebooks" / "figures").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / "notebooks" / "figures" / path.name)


def build(milestone: str, out: Path, repo: Path = REPO, git: bool = False, force: bool = False) -> Verification:
    """Write the student repository of ``milestone`` into ``out`` and search it for solution text; ReleaseError
    when anything leaks (the folder is left for inspection, not to be published). ``force``: replace a release of a
    later milestone too."""
    import nbformat

    if milestone not in STAGES:
        raise ReleaseError(f"unknown stage {milestone!r}: milestones are {', '.join(STAGES)}")
    repo, out = Path(repo), Path(out)
    for number in STAGES:
        solution_notebook(repo, number)
    _prepare(out, repo, milestone, force)
    ms = make_student(repo)
    _copy_tree(repo / "labkit", out / "labkit", repo, skip=lambda rel: kit_left_out(rel, milestone) is not None)
    files = _given_code(repo, out, milestone)
    (out / "notebooks").mkdir()
    for number, stage in STAGES.items():
        if number <= milestone:
            nb = ms.student_notebook(nbformat.read(solution_notebook(repo, number), as_version=4))
            (out / "notebooks" / stage.notebook).write_text(ms.render(nb))
            _figures(repo, out, number)
    _docs(repo, out)
    if (repo / "results").is_dir():
        _copy_tree(repo / "results", out / "results", repo, skip_suffixes=tuple(_SKIP_RESULTS),
                   skip_names=_IGNORED_RESULTS)
    (out / "tests").mkdir()
    for name in KIT_TESTS:
        shutil.copyfile(repo / "tests" / name, out / "tests" / name)
    for path in sorted(SUITE.glob("*.py")):
        shutil.copyfile(path, out / "tests" / path.name)
    for name in ("conftest.py", "environment.yml", ".gitignore"):
        if (repo / name).is_file():
            shutil.copyfile(repo / name, out / name)
    (out / "pyproject.toml").write_text(_pyproject(repo))
    (out / "README.md").write_text(_readme(milestone, files))
    result = verify(out, milestone, repo)
    if not result.clean:
        raise ReleaseError(f"{out} must not be published: its search found {result.found()}:\n" + result.report())
    if git:
        _commit(out, milestone)
    return result


def _commit(out: Path, milestone: str) -> None:
    """One commit of the whole folder (a fresh repository, or the next commit of an earlier release's)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=out, capture_output=True, text=True)

    if not (out / ".git").exists() and git("init", "-q", "-b", "main").returncode:
        git("init", "-q")
    ident = [] if git("config", "user.email").stdout.strip() else ["-c", "user.name=labkit release",
                                                                    "-c", "user.email=labkit-release@localhost"]
    git("add", "-A")
    done = git(*ident, "commit", "-q", "-m", f"Milestone {milestone}: stages {given.span([n for n in STAGES if n <= milestone])}, "
               f"given code of {given.span([n for n in STAGES if n < milestone])}")
    if done.returncode and "nothing to commit" not in done.stdout + done.stderr:
        raise ReleaseError(f"git commit in {out} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def file_list(folder: Path) -> list[str]:
    return [p.relative_to(folder).as_posix() for p in released_files(Path(folder))]
