"""Notebook machinery: format, the student copies, and loading the tagged kernel cells."""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from labkit import nbcells, stages
from labkit.check import check_variant

import tool_modules  # noqa: E402  (tests/ is on the path)

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
STUDENT = sorted((REPO / "notebooks").glob("*.ipynb"))

make_student = tool_modules.load("make_student")


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
    c_src = 'SRC = r"""\n  int t = 0;\n  /// BEGIN SOLUTION\n  out[t] = 1;\n  // why\n  out[t + 1] = 2;\n  /// END SOLUTION\n"""\n'
    stub = make_student.stub_source(c_src)
    assert "out[t] = 1" not in stub and "  return;  // replace this line" in stub and "about 2 lines" in stub


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
    assert all(r.passed for r in check_variant(variants["serial"], "cifar10", quiet=True))
    student = stages.load_variants(REPO / "notebooks" / path.name)
    results = check_variant(student["serial"], "cifar10", quiet=True)
    assert results and all(not r.passed and "not implemented yet" in r.detail for r in results)


def _todo_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and ("NotImplementedError(" in c.source or "// TODO: your code here" in c.source)]


@pytest.mark.parametrize("path", STUDENT, ids=lambda p: p.name)
def test_lean_template(path):
    """At most four TODO cells, each right after its spec with "roughly N lines"; three learning goals;
    the findings ("What the kit measured") after the reflect questions, never before the tasks."""
    nb = nbformat.read(path, as_version=4)
    todos = _todo_cells(nb)
    assert len(todos) <= 4, f"{len(todos)} TODO cells"
    for i in todos:
        spec = nb.cells[i - 1]
        assert spec.cell_type == "markdown" and "oughly" in spec.source, f"cell {i}: no spec with 'roughly N lines'"
    goals = nb.cells[0].source.split("**Learning goals**")[1].split("\n\n")[0]
    assert goals.count("\n- ") == 3, "three learning goals"
    text = [c.source for c in nb.cells]
    reflect = next(i for i, t in enumerate(text) if "## Reflect" in t)
    assert all(i < reflect for i in todos)
    measured = [i for i, t in enumerate(text) if "lk.measured.show" in t]
    assert (not measured and path.name.startswith("00")) or (measured and min(measured) > reflect)


def test_each_kernel_body_is_written_once_across_the_course():
    """No solution block repeats another's code: a layer written once comes to later stages as given code."""
    blocks = {}
    for path in SOLUTIONS:
        for cell in nbformat.read(path, as_version=4).cells:
            for block in cell.source.split("### BEGIN SOLUTION")[1:]:
                body = "\n".join(line.strip() for line in block.split("### END SOLUTION")[0].splitlines()
                                 if line.strip() and not line.strip().startswith("#"))
                if body.count("\n") >= 2:
                    assert body not in blocks, f"{path.name} repeats a solution of {blocks.get(body)}"
                    blocks[body] = path.name


def test_no_stored_output_or_doc_names_a_path_outside_the_repository():
    # the pieces are joined so that this file does not match them itself
    pattern = re.compile("|".join(re.escape(p) for p in ("../" "shared", "/" "work/", "/" "home/", "/" "root/",
                                                           "/" "tmp/", "shared " "folder")))
    files = [*SOLUTIONS, *(p.with_suffix(".py") for p in SOLUTIONS), *STUDENT, REPO / "README.md",
             *(REPO / "docs").glob("*.md")]
    for path in files:
        hits = pattern.findall(path.read_text())
        assert not hits, f"{path.relative_to(REPO)} names {sorted(set(hits))}"


@pytest.mark.parametrize("path", [p for p in STUDENT if p.name[:2] != "00"], ids=lambda p: p.name)
def test_untouched_student_copy_runs_top_to_bottom_without_a_traceback(path, tmp_path):
    """What a student sees before writing a line: FAIL lines that say "not implemented", no PASS line but the one
    that sums up the given code, one "not measured yet" line per measure cell, and no error output anywhere."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in outputs)
    assert "FAIL (not implemented yet:" in text
    own_passes = [ln for ln in text.splitlines() if "PASS" in ln and not ln.startswith("given code (")]
    assert not own_passes, own_passes
    assert "not measured yet" in text


def test_the_readmes_figures_are_rendered_from_the_committed_results():
    update_docs = tool_modules.load("update_docs")
    text = (REPO / "README.md").read_text()
    assert update_docs.render(text) == text, "run python tools/update_docs.py"
