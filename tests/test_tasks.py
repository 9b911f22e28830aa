"""The task registry (labkit.tasks) against the notebooks it describes: every task a student fills in is there once,
named as the solution names it, with a function the notebook defines; the grader runs the ones with checks of their
own."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from labkit import nbcells, tasks
from labkit.stages import STAGES

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(?:###|///) BEGIN SOLUTION (\w+)")


def _cells(stage: str):
    return [c for c in nbformat.read(REPO / "solutions" / STAGES[stage].notebook, as_version=4).cells
            if c.cell_type == "code"]


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "00"])
def test_every_solution_block_belongs_to_exactly_one_task(stage):
    blocks = [b for c in _cells(stage) for b in BLOCK.findall(c.source)]
    owned = [b for t in tasks.of_stage(stage) for b in t.blocks]
    assert sorted(owned) == sorted(set(owned)), f"stage {stage}: a block in two tasks"
    assert set(blocks) == set(owned), f"stage {stage}: blocks {sorted(set(blocks) ^ set(owned))} not matched"


@pytest.mark.parametrize("task", [t for s in tasks.TASKS.values() for t in s], ids=lambda t: f"{t.stage}-{t.name}")
def test_each_task_names_a_function_its_notebook_defines_where_its_check_finds_it(task):
    assert task.check in tasks.CHECKS
    cells = _cells(task.stage)
    defining = [c for c in cells if re.search(rf"\b(?:def|void)\s+(?:__\w+__\([^)]*\)\s+)?{task.function}\b",
                                              c.source)]
    assert defining, f"stage {task.stage}: no cell defines {task.function}"
    tagged = [c for c in defining if nbcells.KERNEL_TAG in c.metadata.get("tags", [])]
    if task.check == "variants":  # the bench and the grader run kernel cells only
        assert tagged, f"{task.function} is checked through VARIANTS but its cell is not tagged kernel"
    if task.own_phase:  # found by name even where an earlier release left the tag off
        nb = nbcells._read_quick(REPO / "solutions" / STAGES[task.stage].notebook)
        found = [src for _, src in nbcells.tagged_cells(nb, tag="no such tag", define=(task.function,))]
        assert any(re.search(rf"^def {task.function}\(", src, re.M) for src in found)
        assert task.points > 0 and task.given, "a task graded apart has its points and the given code it runs on"


def test_the_grader_runs_stage_10s_graph_and_pipeline_apart():
    assert [t.name for t in tasks.own_phases("10")] == ["graph", "streamed"]
    assert {t.check for t in tasks.own_phases("10")} == {"graph", "pipeline"}
    assert not any(tasks.own_phases(s) for s in STAGES if s != "10")
    with pytest.raises(KeyError, match="stage 10 has no task 'nope'; its tasks are splitk, graph, streamed"):
        tasks.find("10", "nope")


def test_a_task_is_numbered_by_its_place_and_its_heading_and_steps_come_from_the_registry():
    from labkit import tile_steps

    assert [t.number for t in tasks.of_stage("10")] == [1, 2, 3]
    assert tasks.find("07", "matmul").heading == "Task 2 — the tiled matrix multiply"
    assert tasks.find("03", "with_managed").heading == "Task — one managed-memory wrapper for every layer"
    assert tasks.find("04", "classify").label == "uint8 in, probabilities out"
    assert [name for _, name in tile_steps.STEPS] == list(tasks.find("09", "tiles").blocks)


@pytest.mark.parametrize("slip", ["heading", "block", "order"])
def test_make_student_refuses_a_solution_that_disagrees_with_the_registry(slip):
    from test_notebooks import make_student

    nb = nbformat.read(REPO / "solutions" / STAGES["07"].notebook, as_version=4)
    assert make_student.task_problems(nb, "07") == []
    specs = [c for c in nb.cells if c.cell_type == "markdown" and "## Task" in c.source]
    if slip == "heading":
        specs[1].source = specs[1].source.replace("the tiled matrix multiply", "the tiled product")
        want = "the task headings are"
    elif slip == "order":
        specs[0].source, specs[1].source = specs[1].source, specs[0].source
        want = "the task headings are"
    else:
        cell = next(c for c in nb.cells if c.cell_type == "code" and "BEGIN SOLUTION matmul" in c.source)
        cell.source = cell.source.replace("BEGIN SOLUTION matmul", "BEGIN SOLUTION product")
        want = "block 'product' belongs to no task of stage 07"
    problems = make_student.task_problems(nb, "07")
    assert problems and want in problems[0], problems


def test_task_sizes_reads_the_registry_and_counts_every_stub_once():
    """tools/task_sizes.py: each stage's tasks are its registry's, and their sizes add up to the stubs' counts; the
    register tiles' largest step is its largest step's blocks, not the whole task."""
    import tool_modules

    task_sizes = tool_modules.load("task_sizes")
    for student in sorted((REPO / "notebooks").glob("*.ipynb")):
        found = task_sizes.sizes(student)
        stubs = [int(n) for c in nbformat.read(student, as_version=4).cells if c.cell_type == "code"
                 for n in task_sizes.STUB.findall(c.source)]
        assert [t for t, *_ in found["tasks"]] == list(tasks.of_stage(student.name[:2])), student.name
        assert sum(lines for _, lines, _ in found["tasks"]) == sum(stubs), student.name
    tiles = next(t for t in task_sizes.sizes(REPO / "notebooks" / STAGES["09"].notebook)["tasks"]
                 if t[0].name == "tiles")
    assert 0 < tiles[2] < tiles[1]
