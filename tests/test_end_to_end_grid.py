"""tools/end_to_end_grid.py (issue 35, point 4) on the simulator: every part runs at toy sizes on a variant whose
layers do their arithmetic on the host (a simulated kernel costs seconds), every cell's classes equal Job.serial's
and the reference's, the timeline numbers the call's chunks from 0, and the summary's arithmetic holds."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from labkit import device

import tool_modules  # noqa: E402  (tests/ is on the path)
from test_bench_whole import FUNCTIONS  # noqa: E402

grid = tool_modules.load("end_to_end_grid")

SOURCE = FUNCTIONS + '''
from pipelines import pipeline  # tests/pipelines.py

VARIANTS = {"graphed": lk.Variant(IMPLS, arrays="device", nets=("cifar10",), graph=True, pipeline=pipeline)}
'''


@pytest.mark.skipif(not device.info().simulated, reason="the simulator's toy run (a GPU runs the real sizes)")
def test_quick_run_writes_every_part(tmp_path):
    nb = tmp_path / "10_whole_job.ipynb"
    cell = new_code_cell(SOURCE)
    cell.metadata["tags"] = ["kernel"]
    nbformat.write(new_notebook(cells=[cell]), nb)
    out = tmp_path / "out"
    assert grid.main(["--quick", "--notebook", str(nb), "--variant", "graphed", "--out", str(out)]) == 0
    got = json.loads((out / "e2e_grid.json").read_text())
    assert got["images"] == 3 and got["simulated"] is True and len(got["bus"]) == 2
    assert got["pinned"]["raw"] is True and got["pinned"]["pageable_control"] is False
    for mode in ("graphs", "launches"):
        cells = got["modes"][mode]["cells"]
        assert [(c["chunk"], c["streams"]) for c in cells] == [(2, 1), (2, 2), (3, 1), (3, 2)]
        for c in cells:
            assert c["differing_from_serial"] == 0 and c["differing_from_reference"] == 0, c
            assert c["runs"] == 1 and c["allocations"] == 0 and c["replayed"] is False
            assert c["lane_synchronizations"] == c["streams"]  # the pipeline waits for each of its lanes
        (tl,) = got["modes"][mode]["timelines"]
        assert [row["chunk"] for row in tl["chunks"]] == [0, 1]  # 3 images in chunks of 2 over 2 lanes
        assert tl["chunks"][0]["lane"] != tl["chunks"][1]["lane"]
        assert got["modes"][mode]["summary"]["worst_over_best"] >= 1
    assert "by cumulative" in (out / "e2e_profile.txt").read_text()
    assert "mode graphs" in (out / "e2e_grid.txt").read_text()


def test_summary_finds_the_best_cell_and_the_cells_past_the_cliff():
    cells = [{"chunk": 2500, "streams": 4, "median_s": 0.029}, {"chunk": 10000, "streams": 2, "median_s": 0.007},
             {"chunk": 50000, "streams": 1, "median_s": 0.0104}, {"chunk": 5000, "streams": 1, "error": "x"}]
    s = grid.summary(cells)
    assert s["best"] == {"chunk": 10000, "streams": 2, "median_s": 0.007}
    assert s["worst_over_best"] == pytest.approx(0.029 / 0.007)
    assert s["cells_over_cliff"] == [(2500, 4)]  # 0.0104 / 0.007 = 1.49: inside
    assert cells[2]["over_best"] == pytest.approx(0.0104 / 0.007)
    assert grid.cells("2500x4, 10000x2") == [(2500, 4), (10000, 2)] and grid.summary([]) == {}
