"""Nothing handed out breaks: notebooks written against the kit before its layers (the solutions of stages 01-05 as
committed at 9338251, before the package was cut into subpackages, kept in tests/fixtures/before_layers.json with
their outputs dropped) still find every name they use, and a class of them is graded today as the kit's own
solutions are."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

import labkit as lk
from labkit import device, grading

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "before_layers.json"
BUNDLE = json.loads(FIXTURE.read_text())
NOTEBOOKS = {name: nbformat.reads(text, as_version=4) for name, text in BUNDLE["notebooks"].items()}


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_fixture_is_the_kit_before_its_layers():
    """The notebooks import the old flat names (lk.gpu, lk.simulator, lk.from_stage): were the fixture rewritten to
    today's names, the tests below would prove nothing."""
    text = "\n".join(src for nb in NOTEBOOKS.values() for src in _code(nb))
    assert BUNDLE["commit"] == "9338251" and sorted(NOTEBOOKS)[0].startswith("01_") and len(NOTEBOOKS) == 5
    assert "lk.gpu.launch" in text and "lk.simulator." in text
    assert not re.search(r"\blk\.(launch|lessons|grading|ladder|course|core|measuring|model|ops)\.", text)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_every_name_they_use_still_resolves(name):
    """Every ``lk.a.b`` chain and every ``from labkit... import`` of the notebook's code cells."""
    missing = []
    for src in _code(NOTEBOOKS[name]):
        for chain in sorted(set(re.findall(r"\blk(?:\.\w+)+", src))):
            obj = lk
            for part in chain.split(".")[1:]:
                if not hasattr(obj, part):
                    missing.append(chain)
                    break
                obj = getattr(obj, part)
        try:
            tree = ast.parse(src)
        except SyntaxError:  # a cell of IPython magics
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                module = __import__(node.module, fromlist=["_"])
                missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert not missing, f"{name}: {missing}"


@pytest.mark.slow  # two minutes on 2 cores
@pytest.mark.skipif(not device.is_simulated(), reason="graded on the CUDA simulator here")
def test_a_class_of_them_is_graded_as_the_kits_own_solutions(tmp_path):
    """Stages 03 and 05 of one student, from the notebooks of before the layers: each passes with every point
    (05's technique points included), as the kit's solutions of today do (tests/test_grade_stages_*)."""
    student = tmp_path / "class" / "before_layers"
    student.mkdir(parents=True)
    for name in ("03_managed_memory.ipynb", "05_shared_memory.ipynb"):
        nbformat.write(NOTEBOOKS[name], student / name)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('[limits]\ntime_factor = 0\n[stage."05"]\nvariants = ["tiled_8"]\n')
    report = grading.grade(tmp_path / "class", rubric=rubric, out=tmp_path / "grades", progress=False, seed=3,
                           jobs=2, stages=["03", "05"])
    rows = {r["stage"]: r for r in report["rows"]}
    assert set(rows) == {"03", "05"}
    for stage, row in rows.items():
        assert row["status"] == "pass", f"{stage}: {row['status']}: {row['message']}"
        assert row["score"] == row["max_score"] > 0, f"{stage}: {row['score']} of {row['max_score']}"
    assert rows["05"]["technique_points"] == rows["05"]["max_points"]["technique"] > 0
