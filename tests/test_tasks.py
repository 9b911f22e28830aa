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
