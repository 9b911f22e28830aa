"""Which notebooks are graded: the students' submissions on disk, and the stages their solutions make gradable.

Students hand in folders in every shape (``notebooks/``, the files at the top, a repository clone one level
down), so a stage's notebook is looked for at any depth and the choice is noted when there are several.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..course import nbcells
from ..course.stages import STAGES, Stage
from .rubric import GradeError


@dataclasses.dataclass
class Submission:
    student: str
    root: Path | None
    notebooks: dict[str, Path]  # stage number -> notebook
    notes: dict[str, str] = dataclasses.field(default_factory=dict)


def _find_notebook(folder: Path, stage: Stage) -> tuple[Path | None, str]:
    candidates = [p for p in folder.rglob(stage.notebook) if ".ipynb_checkpoints" not in p.parts]
    if not candidates:
        candidates = [p for p in folder.rglob(f"{stage.number}_*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    if not candidates:
        return None, ""
    candidates.sort(key=lambda p: (p.parent.name != "notebooks", len(p.parts), str(p)))
    note = f"{len(candidates)} candidates; graded {candidates[0].relative_to(folder)}" if len(candidates) > 1 else ""
    return candidates[0], note


def stage_of_notebook(path: Path) -> Stage:
    """The stage a single notebook belongs to, from its file name."""
    stage = next((s for s in STAGES.values() if s.notebook == path.name), None) or next(
        (s for s in STAGES.values() if path.name.startswith(s.number + "_")), None)
    if stage is None:
        raise GradeError(f"cannot tell which stage {path.name} is: name it like {STAGES['01'].notebook}")
    return stage


def find_submissions(path: Path, stages: list[Stage]) -> list[Submission]:
    """A folder of student folders (each with notebooks/ or the .ipynb files), one student's folder, or one .ipynb."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".ipynb":
            raise GradeError(f"{path} is not a notebook (.ipynb) or a folder of submissions")
        stage = stage_of_notebook(path)
        student = path.parent.parent.name if path.parent.name == "notebooks" else path.parent.name
        return [Submission(student or path.stem, None, {stage.number: path})]
    if not path.is_dir():
        raise GradeError(f"no submissions at {path}")
    direct = [p for p in path.glob("*.ipynb") if any(p.name.startswith(s.number + "_") for s in STAGES.values())]
    roots = [path] if direct or (path / "notebooks").is_dir() else sorted(
        p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not roots:
        raise GradeError(f"{path} holds no student folders and no stage notebooks")
    subs = []
    for root in roots:
        sub = Submission(root.name, root, {})
        for stage in stages:
            nb, note = _find_notebook(root, stage)
            if nb is not None:
                sub.notebooks[stage.number] = nb
            if note:
                sub.notes[stage.number] = note
        subs.append(sub)
    return subs


def _defines_variants(path: Path) -> bool:
    try:
        return any("VARIANTS" in src for _, src in nbcells.tagged_cells(nbcells.read(path)))
    except nbcells.NotebookError:
        return False


def select_stages(numbers: list[str] | None, solutions: Path) -> list[Stage]:
    """The stages asked for (default: every stage whose solution defines VARIANTS), each with a solution."""
    if not numbers:
        chosen = [s for s in STAGES.values() if (solutions / s.notebook).exists()
                  and _defines_variants(solutions / s.notebook)]
        if not chosen:
            raise GradeError(f"no stage notebook with VARIANTS in {solutions}")
        return chosen
    chosen = []
    for n in dict.fromkeys(n.strip().zfill(2) for n in numbers):
        if n not in STAGES:
            raise GradeError(f"unknown stage {n!r}; stages are {', '.join(STAGES)}")
        sol = solutions / STAGES[n].notebook
        if not sol.exists():
            raise GradeError(f"no reference solution for stage {n}: {sol} is missing (see --solutions)")
        if not _defines_variants(sol):
            raise GradeError(f"stage {n} ({sol.name}) defines no VARIANTS: there is nothing to grade")
        chosen.append(STAGES[n])
    return chosen
