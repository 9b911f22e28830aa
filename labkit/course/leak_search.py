"""The leak search of a student release (``labkit release``, ``labkit release --verify``): what of the solutions must
not be in a release of a milestone (``secrets``), and the search of every file of a release for it (``verify``).

The search takes every line that ``tools/make_student.py`` strips from a solution notebook of stage NN or later (the
solution blocks, Python and CUDA C alike), whitespace-normalised, at least ``MIN_CHARS`` long, and not also public
by construction (in a student notebook of any stage, or in the released given code, as a line or within one), and
looks for it in every file of the release: inside JSON strings (notebooks, results), text files, and the bytes of
the rest. In the kit's own Python a single line of a stage is not counted (``_copied``). It also looks for the
shapes of those stages' answers in every Python file and notebook code cell (``labkit.answer_shapes``: a split-K
loop, a graph captured and replayed, chunks over lanes), for kit files a release leaves out, and for code that uses
one (``missing``).

Apart from building (``labkit.release``): ``labkit release --verify`` searches any folder with it, an unzipped copy
or a clone of a published release.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import answer_shapes, given, nbcells
from .leave_out import LeftOut, kit_left_out, left_out, missing, python_sources
from .stages import REPO, STAGES, STUB_MARK

MIN_CHARS = 12  # shorter solution lines ("return out", "acc = 0.0") are too common to mean anything
KIT_LINES = 2  # lines of one stage's solutions in one file of the kit's own Python before they count (``_copied``)
#: stages whose tasks are the kit's own layers, shipped to every milestone: stage 01's serial conv, activations,
#: pool, fc and softmax are what ``labkit.reference`` computes and ``labkit.kernels`` runs on the GPU. Their lines in
#: the kit's Python are public by design (the grader's library rule keeps a submission from calling them).
KIT_OWN_STAGES = ("01",)


class ReleaseError(Exception):
    """Why no release could be built (or verified): one line that says what to do."""


# ------------------------------------------------------------------------------------------- what is secret


def _norm(line: str) -> str:
    return " ".join(line.split())


def make_student(repo: Path):
    """tools/make_student.py of the instructor's repository: the one definition of what a student copy is."""
    path = repo / "tools" / "make_student.py"
    if not path.is_file():
        raise ReleaseError(f"no tools/make_student.py in {repo}: labkit release runs in the instructor's repository")
    spec = importlib.util.spec_from_file_location("labkit_make_student", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def solution_notebook(repo: Path, number: str) -> Path:
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

    ms = make_student(repo)
    public: set[str] = set()
    stripped: dict[str, list[str]] = {}
    for number in STAGES:
        nb = nbformat.read(solution_notebook(repo, number), as_version=4)
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


def released_files(folder: Path) -> list[Path]:
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
    for path in released_files(folder):
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
