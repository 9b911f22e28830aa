"""Every task of stage 10 graded (labkit.tasks): the split-K fc through the variants, the graph replay and the pipeline
by phases of their own, with points of their own. Stage 10's solution passes all three, also as a notebook from an
earlier release whose graph cell lacks the `kernel` tag (the function is found by its name); a graph kept from the
first call and replayed on later calls' inputs, a pipeline without its final wait, one that copies a chunk's classes
on another lane, and one that makes its own streams each lose that task's points, with the cause named."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from labkit import device, grading, nbcells

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "10_whole_job.ipynb"
pytestmark = pytest.mark.skipif(not device.is_simulated(), reason="graded on the CUDA simulator here")

KEEPS_THE_FIRST_GRAPH = '''

_graph_call_made = graph_call
_kept = []


def graph_call(variant, wl, lane):  # the first call's graph, replayed for every later call
    if not _kept:
        _kept.append(_graph_call_made(variant, wl, lane))
    return _kept[0]
'''
NO_FINAL_WAIT = '''

def classify_streamed(job, raw, classes, chunk, streams):  # returns with its copies still queued
    lanes = job.lanes(streams)
    for i, first in enumerate(range(0, raw.shape[0], chunk)):
        lane, last = lanes[i % streams], min(first + chunk, raw.shape[0])
        job.download(lane, job.classes(lane, job.upload(lane, raw[first:last]), last - first), classes[first:last])
'''
OTHER_LANE = '''

def classify_streamed(job, raw, classes, chunk, streams):  # a chunk's classes copied on the next lane
    lanes = job.lanes(streams)
    for i, first in enumerate(range(0, raw.shape[0], chunk)):
        lane, last = lanes[i % streams], min(first + chunk, raw.shape[0])
        found = job.classes(lane, job.upload(lane, raw[first:last]), last - first)
        with lanes[(i + 1) % streams]:
            lk.gpu.to_host(found, out=classes[first:last])
    for lane in lanes:
        lane.synchronize()
'''
OWN_STREAMS = '''

def classify_streamed(job, raw, classes, chunk, streams):  # streams of its own, outside the kit's lanes
    own = [cuda.stream() for _ in range(streams)]
    classes[...] = job.serial(raw)
    for s in own:
        s.synchronize()
'''

#: student -> (what the graph cell gets appended, what the pipeline's cell gets appended, the graph cell's tag kept)
CLASS = {"old_release": ("", "", False), "kept_graph_other_lane": (KEEPS_THE_FIRST_GRAPH, OTHER_LANE, True),
         "no_final_wait": ("", NO_FINAL_WAIT, True), "own_streams": ("", OWN_STREAMS, True)}


def _defining(nb, name: str):
    return next(c for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage10")
    for student, (graph, pipeline, tagged) in CLASS.items():
        nb = nbformat.read(REPO / "solutions" / NOTEBOOK, as_version=4)
        cell = _defining(nb, "graph_call")
        cell.source += graph
        tags = [t for t in cell.metadata.get("tags", []) if t != nbcells.KERNEL_TAG]
        cell.metadata["tags"] = [*tags, nbcells.KERNEL_TAG] if tagged else tags
        _defining(nb, "classify_streamed").source += pipeline
        (root / "class" / student).mkdir(parents=True)
        nbformat.write(nb, root / "class" / student / NOTEBOOK)
    rubric = root / "rubric.toml"  # the timed variant only: the other variants' fc is the same kernel
    rubric.write_text('[limits]\ntime_factor = 0\n[stage."10"]\nvariants = ["whole_fashion"]\n')
    report = grading.grade(root / "class", rubric=rubric, out=root / "grades", progress=False, seed=5, jobs=2)
    shutil.rmtree(root / "class", ignore_errors=True)
    return {r["student"]: r for r in report["rows"]}


def test_every_task_earns_its_points_also_from_an_earlier_release(graded):
    row = graded["old_release"]
    assert row["status"] == "pass", row["message"]
    assert row["max_points"]["tasks"] == 30 and row["task_points"] == 30 and row["score"] == row["max_score"] == 80
    assert {name: t["passed"] for name, t in row["details"]["tasks"].items()} == {"graph": True, "streamed": True}


def test_a_graph_kept_from_the_first_call_and_a_copy_on_another_lane_lose_their_points(graded):
    row = graded["kept_graph_other_lane"]
    assert row["status"] == "fail" and row["correctness_points"] == 50 and row["task_points"] == 0, row["message"]
    graph, streamed = row["details"]["tasks"]["graph"], row["details"]["tasks"]["streamed"]
    assert not graph["passed"] and "a graph captured for other inputs or another variant" in graph["line"]
    assert not streamed["passed"] and "with nothing ordering it" in streamed["line"], streamed["line"]
    assert "task 'graph'" in row["message"] and "task 'streamed'" in row["message"]


def test_a_pipeline_without_its_final_wait_loses_the_pipelines_points_only(graded):
    row = graded["no_final_wait"]
    assert row["status"] == "fail" and row["task_points"] == 15, row["message"]
    line = row["details"]["tasks"]["streamed"]["line"]
    assert "synchronize every lane before returning" in line, line


def test_a_pipeline_on_streams_of_its_own_is_refused_in_one_line(graded):
    line = graded["own_streams"]["details"]["tasks"]["streamed"]["line"]
    assert "job.lanes" in line and "\n" not in line, line
