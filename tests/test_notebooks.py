"""Notebook machinery: format, the student copies, and loading the tagged kernel cells."""

import ast
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

from labkit import nbcells, stages

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
STUDENT = sorted((REPO / "notebooks").glob("*.ipynb"))

spec = importlib.util.spec_from_file_location("make_student", REPO / "tools" / "make_student.py")
make_student = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_student)


def test_there_are_stage_notebooks_in_both_folders():
    assert SOLUTIONS, "solutions/ holds no notebooks"
    assert [p.name for p in SOLUTIONS] == [p.name for p in STUDENT]


@pytest.mark.parametrize("path", SOLUTIONS + STUDENT, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_format(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert all(cell.get("id") for cell in nb.cells), "every cell needs an id"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.name[:2]} — "), "title '# NN — Topic'"
    assert "**Learning goals**" in first.source
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Reflect" in text
    if path.parent.name == "notebooks":
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "student copies have no outputs"
        assert "### BEGIN SOLUTION" not in json.dumps(nb)


@pytest.mark.parametrize("path", [p for p in SOLUTIONS if stages.stage_of(p) and p.name[:2] != "00"],
                         ids=lambda p: p.name)
def test_stage_notebooks_have_kernel_cells_with_variants_and_a_checked_self_check(path):
    nb = nbformat.read(path, as_version=4)
    assert nbcells.tagged_cells(nb), "stage notebooks tag their kernel cells 'kernel'"
    assert any(c.source.startswith("# NBVAL_CHECK_OUTPUT") and "check" in c.source for c in nb.cells
               if c.cell_type == "code"), "a self-check cell is checked by nbval"
    assert "VARIANTS" in "\n".join(src for _, src in nbcells.tagged_cells(nb))


def test_student_notebooks_are_up_to_date():
    stale = make_student.build(check=True)
    assert not stale, f"run `python tools/make_student.py`: out of date: {stale}"


def test_stub_replaces_solution_blocks_at_their_indentation():
    src = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    z = x + y\n    # a comment\n    return z\n    ### END SOLUTION\n"
    out = make_student.stub_source(src)
    assert "z = x + y" not in out and "    raise NotImplementedError" in out
    assert "about 2 lines" in out
    ast.parse(out)
    with pytest.raises(ValueError, match="without"):
        make_student.stub_source("    ### BEGIN SOLUTION\n    x = 1\n")


@pytest.mark.parametrize("path", STUDENT, ids=lambda p: p.name)
def test_student_code_cells_are_valid_python(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in cell.source.splitlines()))


def test_nbcells_loads_only_tagged_cells(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook

    tagged = new_code_cell("A = 1\n%time B = 2\n", metadata={"tags": ["kernel"]})
    other = new_code_cell("raise SystemExit('must not run')")
    later = new_code_cell("def f():\n    return 1 / 0\n", metadata={"tags": ["kernel"]})
    path = tmp_path / "nb.ipynb"
    nbformat.write(new_notebook(cells=[tagged, other, later]), path)
    ns = nbcells.load(path)
    assert ns["A"] == 1 and "B" not in ns
    with pytest.raises(ZeroDivisionError) as info:
        ns["f"]()
    assert "nb.ipynb cell 2" in str(info.traceback[-1].path) or "nb.ipynb cell 2" in str(info.traceback[-1])


def test_nbcells_errors_are_clear(tmp_path):
    from nbformat.v4 import new_code_cell, new_notebook

    path = tmp_path / "untagged.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("x = 1")]), path)
    with pytest.raises(nbcells.NotebookError, match="no code cells tagged 'kernel'"):
        nbcells.load(path)
    (tmp_path / "broken.ipynb").write_text("{not json")
    with pytest.raises(nbcells.NotebookError, match="not a readable notebook"):
        nbcells.load(tmp_path / "broken.ipynb")
    with pytest.raises(nbcells.NotebookError, match="no notebook"):
        nbcells.load(tmp_path / "absent.ipynb")


def test_solution_variants_pass_and_student_variants_say_not_implemented():
    path = REPO / "solutions" / "01_serial_baseline.ipynb"
    variants = stages.load_variants(path)
    assert all(r.passed for r in stages.check_variant(variants["serial"], "cifar10", quiet=True))
    student = stages.load_variants(REPO / "notebooks" / path.name)
    results = stages.check_variant(student["serial"], "cifar10", quiet=True)
    assert results and all(not r.passed and "not implemented yet" in r.detail for r in results)


cite_spec = importlib.util.spec_from_file_location("cite_measurements", REPO / "tools" / "cite_measurements.py")
cite = importlib.util.module_from_spec(cite_spec)
cite_spec.loader.exec_module(cite)


def test_quoted_measurements_are_computed_from_the_committed_ledgers():
    """The notebooks' and README's figures from the real-GPU run are rendered from its ledgers, never typed in."""
    measured = cite.Measured()
    for number, render in cite.CELLS.items():
        assert cite.stored_cell(number) == render(measured), (
            f"solutions/{number}: its '{number}-h100' cell differs from the ledgers; run "
            f"python tools/cite_measurements.py && python tools/make_student.py")
    assert cite.stored_readme_block() == cite.readme_block(measured)


def test_measured_refuses_an_ambiguous_run():
    measured = cite.Measured()
    with pytest.raises(KeyError, match="name the call"):
        measured.total("03 explicit_batched")  # run in both calls
    assert measured.total("03 explicit_batched", call=2) > 0
