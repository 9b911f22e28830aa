"""Student repositories without the answers: ``labkit release --upto NN OUT/`` and its leak search.

A release for milestone NN holds the student copies of stages 00..NN, the given code of the stages before NN (their
deadlines have passed: ``labkit.given``), the kit, the student docs, the kit's committed GPU results (without the
executed solution notebooks kept there), a small test suite and a README. It never holds ``solutions/``.

The leak search (``verify``) takes every line that ``tools/make_student.py`` strips from a solution notebook of stage
NN or later (the solution blocks, Python and CUDA C alike), whitespace-normalised, at least ``MIN_CHARS`` long, and
not also public by construction (in a student notebook of any stage, or in the released given code, as a line or
within one), and looks for it in every file of the release: inside JSON strings (notebooks, results), text files,
and the bytes of the rest. In the kit's own Python a single line of a stage is not counted (``_copied``). It also
looks for the shapes of those stages' answers in every Python file and notebook code cell (``labkit.answer_shapes``:
a split-K loop, a graph captured and replayed, chunks over lanes), for kit files a release leaves out, and for
code that uses one (``missing``). ``build`` runs it and fails when it finds anything.

What of the kit's own code a release leaves out (code that answers a task of the milestone's stage or a later one,
and the maintainers' machinery) is declared in ``labkit.leave_out``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..outputs import OutputError, writable_folder
from . import answer_shapes, given, nbcells
from .leave_out import LeftOut, kit_left_out, left_out, missing, python_sources
from .stages import REPO, STAGES, STUB_MARK, solution

MIN_CHARS = 12  # shorter solution lines ("return out", "acc = 0.0") are too common to mean anything
KIT_LINES = 2  # lines of one stage's solutions in one file of the kit's own Python before they count (``_copied``)
#: stages whose tasks are the kit's own layers, shipped to every milestone: stage 01's serial conv, activations,
#: pool, fc and softmax are what ``labkit.reference`` computes and ``labkit.kernels`` runs on the GPU. Their lines in
#: the kit's Python are public by design (the grader's library rule keeps a submission from calling them).
KIT_OWN_STAGES = ("01",)
DOCS = ("students.md", "reference_figures.md", "design.md")  # the docs a student reads; their images come along
KIT_TESTS = ("test_device.py", "test_kernels.py", "test_reference.py", "test_weights.py")  # kit-only tests
SUITE = REPO / "tools" / "release_tests"  # the release's own tests, copied into its tests/
_SKIP_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints", "given"}
_SKIP_RESULTS = {".ipynb"}  # results/ keeps executed solution notebooks: never released
_IGNORED_RESULTS = {"scratch", "ledger.jsonl"}  # .gitignore'd there


class ReleaseError(Exception):
    """Why no release could be built (or verified): one line that says what to do."""


# ------------------------------------------------------------------------------------------- what is secret


def _norm(line: str) -> str:
    return " ".join(line.split())


def _make_student(repo: Path):
    """tools/make_student.py of the instructor's repository: the one definition of what a student copy is."""
    path = repo / "tools" / "make_student.py"
    if not path.is_file():
        raise ReleaseError(f"no tools/make_student.py in {repo}: labkit release runs in the instructor's repository")
    spec = importlib.util.spec_from_file_location("labkit_make_student", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def _solution(repo: Path, number: str) -> Path:
    path = repo / "solutions" / STAGES[number].notebook
    if not path.is_file():
        raise ReleaseError(f"no {path.relative_to(repo)}: labkit release runs in the instructor's repository, "
                           f"which holds every stage's solution")
    return path


def stripped_lines(solution_nb, student_nb) -> list[str]:
    """The lines of the solution's code cells that its student copy does not have: the solution blocks' text, and
    the whole of a cell the copy leaves out (``kit-only``). Cells are paired by id (a student copy keeps its
    solution's), else in order."""
    out = []
    ids = [c.get("id") for c in student_nb.cells]
    if all(ids) and len(set(ids)) == len(ids):
        by_id = {c.get("id"): c for c in student_nb.cells}
        pairs = [(sol, by_id.get(sol.get("id"))) for sol in solution_nb.cells]
    elif len(solution_nb.cells) == len(student_nb.cells):
        pairs = list(zip(solution_nb.cells, student_nb.cells))
    else:
        pairs = [(type("C", (), {"cell_type": "code", "source": "\n".join(c.source for c in solution_nb.cells)}),
                  type("C", (), {"source": "\n".join(c.source for c in student_nb.cells)}))]
    for sol, stu in pairs:
        if sol.cell_type != "code":
            continue
        a, b = sol.source.splitlines(), stu.source.splitlines() if stu is not None else []
        for op, i1, i2, _, _ in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if op in ("delete", "replace"):
                out.extend(a[i1:i2])
    return out


@dataclass
class Secrets:
    """What must not be in a release of ``milestone``: per stage, the normalised solution lines to look for."""

    milestone: str
    lines: dict[str, set[str]] = field(default_factory=dict)  # stage -> lines searched for
    public: dict[str, int] = field(default_factory=dict)  # stage -> stripped lines that are public anyway
    short: dict[str, int] = field(default_factory=dict)  # stage -> stripped lines under MIN_CHARS

    def all(self) -> dict[str, str]:
        """line -> the first stage it belongs to."""
        found = {}
        for number in sorted(self.lines):
            for line in self.lines[number]:
                found.setdefault(line, number)
        return found


def secrets(milestone: str, repo: Path = REPO, min_chars: int = MIN_CHARS) -> Secrets:
    """The solution lines of stages ``milestone``..last, less those that are public by construction: in a student
    notebook (of any stage: its text outside the solution blocks), or in the given code this milestone releases."""
    import nbformat

    ms = _make_student(repo)
    public: set[str] = set()
    stripped: dict[str, list[str]] = {}
    for number in STAGES:
        nb = nbformat.read(_solution(repo, number), as_version=4)
        student = ms.student_notebook(nb)
        public.update(_norm(line) for cell in student.cells for line in cell.source.splitlines())
        if number < milestone:
            public.update(_norm(line) for _, src in nbcells.tagged_cells(nb) for line in src.splitlines())
        else:
            stripped[number] = [_norm(line) for line in stripped_lines(nb, student)]
    out = Secrets(milestone)
    public_text = "\n".join(public)  # a line inside a longer public one is public too
    for number, lines in stripped.items():
        lines = [line for line in lines if line and "BEGIN SOLUTION" not in line and "END SOLUTION" not in line
                 and STUB_MARK not in line]
        out.short[number] = len({line for line in lines if len(line) < min_chars})
        long = {line for line in lines if len(line) >= min_chars}
        shared = {line for line in long if line in public or line in public_text}
        out.public[number] = len(shared)
        out.lines[number] = long - shared
    return out


# -------------------------------------------------------------------------------------------- the search


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


#: (suffix, content digest) -> (searchable text, line -> found): a file searched again (the results every milestone
#: ships, in a run that builds several) is not read into text and searched for the same line twice
_SEARCHED: dict[tuple[str, bytes], tuple[str | None, dict[str, bool]]] = {}


def _search(path: Path, lines) -> tuple[str | None, bytes, list[str]]:
    """A file's text (None: binary), its bytes, and which of ``lines`` it holds (in its text, or its bytes)."""
    raw = path.read_bytes()
    key = (path.suffix, hashlib.blake2b(raw, digest_size=16).digest())
    if key not in _SEARCHED:
        _SEARCHED[key] = (_text_of(path.suffix, raw), {})
    text, seen = _SEARCHED[key]
    for line in lines:
        if line not in seen:
            seen[line] = line in text if text is not None else line.encode("utf-8") in raw
    return text, raw, [line for line in lines if seen[line]]


def _text_of(suffix: str, raw: bytes) -> str | None:
    """A file's searchable text: JSON strings unescaped, whitespace normalised per line; None for a binary file."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = [text]
    try:
        if suffix in (".json", ".ipynb"):
            parts += _strings(json.loads(text))
        elif suffix == ".jsonl":
            parts += [s for line in text.splitlines() if line.strip() for s in _strings(json.loads(line))]
    except ValueError:
        pass  # not JSON after all: its text is searched as it is
    return "\n".join(_norm(line) for part in parts for line in part.splitlines())


@dataclass
class Verification:
    folder: Path
    secrets: Secrets
    files: int = 0
    binary: int = 0
    hits: list[tuple[str, str, str]] = field(default_factory=list)  # (file, stage, line)
    shapes: list[tuple[str, str, str]] = field(default_factory=list)  # (file, stage, shape and where)
    kept: list[tuple[str, LeftOut]] = field(default_factory=list)  # kit files the release leaves out, found there
    missing: list[tuple[str, str]] = field(default_factory=list)  # (file, a use of kit code the release leaves out)

    @property
    def clean(self) -> bool:
        return not (self.hits or self.shapes or self.kept or self.missing)

    def found(self) -> str:
        """What the search found, counted in one clause ("2 solution lines, 1 answer shape")."""
        counts = ((self.hits, "solution line", "solution lines"), (self.shapes, "answer shape", "answer shapes"),
                  (self.kept, "file of left-out kit code", "files of left-out kit code"),
                  (self.missing, "use of left-out kit code", "uses of left-out kit code"))
        return ", ".join(f"{len(x)} {one if len(x) == 1 else many}" for x, one, many in counts if x) or "nothing"

    def report(self) -> str:
        s = self.secrets
        stages = sorted(s.lines)
        lines = [f"searched {self.files} files of {self.folder} ({self.binary} binary, searched as bytes) for the "
                 f"solution lines of stages {given.span(stages)} (whitespace-normalised, at least {MIN_CHARS} "
                 f"characters, not also in a student notebook or in released given code):"]
        for number in stages:
            lines.append(f"  stage {number}: {len(s.lines[number])} lines searched for ({s.public[number]} public "
                         f"anyway, {s.short[number]} shorter than {MIN_CHARS} characters)")
        shapes = answer_shapes.of_stages(s.milestone)
        if shapes:
            lines.append("and its Python (notebooks' code cells too) for the shapes of those stages' answers: "
                         + "; ".join(f"{x.name} (stage {x.stage}: {x.what})" for x in shapes))
        out = left_out(s.milestone)
        lines.append(f"and for the kit's code a release of milestone {s.milestone} leaves out, and code using it: "
                     + "; ".join(f"{concern} " + ", ".join(n for n, i in out.items() if i.concern == concern)
                                 for concern in ("answers", "machinery")))
        if self.clean:
            lines.append("found: nothing")
            return "\n".join(lines)
        if self.hits:
            lines.append(f"found: {len(self.hits)} solution line(s) in the release:")
            lines += [f"  {file}: stage {number}: {line}" for file, number, line in self.hits]
        if self.shapes:
            lines.append(f"found: {len(self.shapes)} answer shape(s) in the release:")
            lines += [f"  {file}: stage {number}: {what}" for file, number, what in self.shapes]
        if self.kept:
            lines.append(f"found: {len(self.kept)} file(s) of kit code a release of milestone {s.milestone} leaves "
                         f"out:")
            lines += [f"  {file}: {item.concern}: {item.why}" for file, item in self.kept]
        if self.missing:
            lines.append(f"found: {len(self.missing)} use(s) of kit code this release leaves out:")
            lines += [f"  {file}: {what}" for file, what in self.missing]
        return "\n".join(lines)


def _released_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.relative_to(folder).parts)


def verify(folder: Path, milestone: str | None = None, repo: Path = REPO, found: Secrets | None = None) -> Verification:
    """Search every file under ``folder`` for every solution line of stages ``milestone``..last (the milestone of
    the release's manifest when not given), its Python for the shapes of those stages' answers, and the kit in it
    for code that a release of ``milestone`` leaves out and for uses of that code."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReleaseError(f"no folder {folder} to search")
    info = given.manifest(folder / "labkit" / "given")
    if info is None:  # a search of a folder holding no release finds nothing, and "found: nothing" would mislead
        held = "it is empty" if not any(folder.iterdir()) else f"no labkit/given/{given.MANIFEST}"
        raise ReleaseError(f"{folder} is not a labkit release ({held}): name the folder `labkit release` wrote, or "
                           f"a clone or unzipped copy of it")
    milestone = milestone or info["milestone"]
    found = found or secrets(milestone, repo)
    table = found.all()
    result = Verification(folder, found)
    for path in _released_files(folder):
        result.files += 1
        text, raw, hits = _search(path, table)
        result.binary += text is None
        rel = path.relative_to(folder).as_posix()
        result.hits += [(rel, table[line], line) for line in _copied(rel, hits, table)]
        if text is not None:
            result.shapes += [(rel, f.shape.stage, f"{where}{f}") for where, src in python_sources(path, raw)
                              for f in answer_shapes.find(src, answer_shapes.of_stages(milestone))]
        item = kit_left_out(path.relative_to(folder / "labkit"), milestone) if rel.startswith("labkit/") else None
        if item is not None:
            result.kept.append((rel, item))
    result.missing = missing(folder, milestone)
    return result


def _copied(rel: str, hits: list[str], table: dict[str, str]) -> list[str]:
    """The hits that count. In the kit's own Python (``labkit/`` and its ``tests/``, released to every milestone
    less ``LEAVE_OUT``) one line of a stage's solution alone is a common line of index arithmetic or a type test
    (``i = (t // Wo) % Ho``), not its answer: there a stage's lines count from the second one in the same file on.
    Anywhere else (notebooks, docs, results) every line counts. Lines of ``KIT_OWN_STAGES`` never count in the
    kit's Python."""
    if not (rel.startswith(("labkit/", "tests/")) and rel.endswith(".py")):
        return hits
    hits = [line for line in hits if table[line] not in KIT_OWN_STAGES]
    per_stage: dict[str, int] = {}
    for line in hits:
        per_stage[table[line]] = per_stage.get(table[line], 0) + 1
    return [line for line in hits if per_stage[table[line]] >= KIT_LINES]


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

## Data

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
        nb = nbcells.read(solution(number, _solution(repo, number).parent))
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
        _solution(repo, number)
    _prepare(out, repo, milestone, force)
    ms = _make_student(repo)
    _copy_tree(repo / "labkit", out / "labkit", repo, skip=lambda rel: kit_left_out(rel, milestone) is not None)
    files = _given_code(repo, out, milestone)
    (out / "notebooks").mkdir()
    for number, stage in STAGES.items():
        if number <= milestone:
            nb = ms.student_notebook(nbformat.read(_solution(repo, number), as_version=4))
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
    return [p.relative_to(folder).as_posix() for p in _released_files(Path(folder))]
