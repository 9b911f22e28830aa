"""Each solution notebook's source: solutions/NN_topic.py in jupytext's percent format, paired with the notebook.

The .py is where a stage's code and prose are edited; the .ipynb stays committed with its outputs (GPU-executed ones
included). These tests keep the pairs in step (the same cells, types, sources and tags), show that jupytext turns a
source back into its committed notebook byte for byte (outputs, ids and metadata kept), that ``labkit.nbcells``
reads a source as jupytext does, and that the kit runs a solution's code from its source.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit import nbcells, stages

import tool_modules  # noqa: E402  (tests/ is on the path)

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = sorted(SOLUTIONS.glob("*.ipynb"))
CONFIG = SOLUTIONS / "jupytext.toml"

try:
    import jupytext
except ImportError:  # the dev extra brings it; the in-step checks below do without
    jupytext = None
needs_jupytext = pytest.mark.skipif(jupytext is None, reason="jupytext (the dev extra) writes and reads the "
                                                              "solutions' sources: pip install -e '.[dev]'")


def _jupytext(*args: str) -> None:
    """The jupytext command line, in this process (it reads the jupytext.toml of each file's folder)."""
    from jupytext.cli import jupytext as command

    assert command(["--quiet", *args]) in (None, 0)


def _copy(tmp_path: Path, names=None) -> Path:
    """solutions/ (its notebooks, sources and jupytext.toml, or only ``names``' pairs) in a folder of its own."""
    folder = tmp_path / "solutions"
    folder.mkdir()
    shutil.copyfile(CONFIG, folder / CONFIG.name)
    for nb in NOTEBOOKS:
        if names is None or nb.name in names:
            for f in (nb, nbcells.source_of(nb)):
                shutil.copyfile(f, folder / f.name)
    return folder


def _cells(nb) -> list[tuple[str, str, list]]:
    return [(c.cell_type, c.source, list(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


def test_every_solution_notebook_has_its_source_and_only_they_do():
    assert NOTEBOOKS
    sources = sorted(p.name for p in SOLUTIONS.glob("*.py"))
    assert sources == [nbcells.source_of(p).name for p in NOTEBOOKS], "one NN_topic.py per NN_topic.ipynb, no more"
    assert [stages.STAGES[p.name[:2]].source for p in NOTEBOOKS] == sources
    # the student copies are not paired: no source beside them, no jupytext settings that would pair them
    assert not list((REPO / "notebooks").glob("*.py"))
    assert [p.relative_to(REPO).as_posix() for p in REPO.glob("**/jupytext.toml")
            if ".venv" not in p.parts] == ["solutions/jupytext.toml"]
    assert "[tool.jupytext]" not in (REPO / "pyproject.toml").read_text()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_each_pair_is_in_step(notebook):
    """The CI check: the source holds the notebook's cells (type, source, tags), in order."""
    assert nbcells.out_of_step(notebook) == "", f"run `jupytext --sync {nbcells.source_of(notebook)}`"
    assert _cells(nbcells.read_source(nbcells.source_of(notebook))) == _cells(nbformat.read(notebook, 4))


@needs_jupytext
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_nbcells_reads_a_source_as_jupytext_does(notebook):
    """labkit reads the sources without jupytext (the grader's children, lk.from_stage): the same cells, and jupytext
    finds no cell metadata but the tags (solutions/jupytext.toml keeps the rest in the notebook)."""
    source = nbcells.source_of(notebook)
    ours, theirs = nbcells.read_source(source), jupytext.read(source)
    assert _cells(ours) == _cells(theirs)
    assert all(set(c.metadata) <= {"tags"} for c in theirs.cells)
    assert not source.read_text().startswith("# ---"), "no YAML header: the notebook's metadata stays in the .ipynb"


@needs_jupytext
def test_the_notebooks_come_back_from_their_sources_byte_for_byte(tmp_path):
    """``jupytext --sync`` after an edit of the sources: each notebook written from its source with the committed
    notebook's outputs, ids and metadata is the committed file, and each source written from its notebook is the
    committed source. Tags (``kernel``), NBVAL_CHECK_OUTPUT comments and solution markers come through."""
    folder = _copy(tmp_path)
    for source in sorted(folder.glob("*.py")):
        source.touch()  # the newer side, as after an edit: --sync writes the notebook from it
    _jupytext("--sync", *sorted(str(p) for p in folder.glob("*.py")))
    for nb in NOTEBOOKS:
        assert (folder / nb.name).read_bytes() == nb.read_bytes(), f"{nb.name} changed when written from its source"
    for nb in sorted(folder.glob("*.ipynb")):
        (folder / nb.with_suffix(".py").name).unlink()
    _jupytext("--to", "py:percent", *sorted(str(p) for p in folder.glob("*.ipynb")))
    for nb in NOTEBOOKS:
        source = nbcells.source_of(nb)
        assert (folder / source.name).read_text() == source.read_text(), f"{source.name} written from its notebook"
    text = "".join(p.read_text() for p in folder.glob("*.py"))
    assert len(re.findall(r'(?m)^# %% tags=\[[^\]]*"kernel"', text)) == sum(
        "kernel" in c.metadata.get("tags", []) for nb in NOTEBOOKS for c in nbformat.read(nb, 4).cells)
    assert "# NBVAL_CHECK_OUTPUT" in text and "### BEGIN SOLUTION" in text and "/// BEGIN SOLUTION" in text


@needs_jupytext
def test_tags_markers_and_magics_round_trip(tmp_path):
    """What the solutions may hold and do not all hold yet: nbval's tags, ``raises-exception``, a tagged markdown
    cell, a raw cell, a magic, a cell marker inside a CUDA C string's neighbour, blank lines in a cell."""
    folder = tmp_path / "solutions"
    folder.mkdir()
    shutil.copyfile(CONFIG, folder / CONFIG.name)
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell("# 99 — A probe\n\n**Learning goals**\n- one\n\n## Task 1 — roughly {{lines:a}}",
                             metadata={"tags": ["spec"]}),
        v4.new_code_cell("import math\n%time x = 1\n\n\ndef f():\n    ### BEGIN SOLUTION a\n    return 1\n"
                         "    ### END SOLUTION", metadata={"tags": ["kernel"]}),
        v4.new_code_cell('SRC = r"""\n__global__ void k(float *out) {\n  /// BEGIN SOLUTION b\n  out[0] = 1;\n'
                         '  /// END SOLUTION\n}\n"""', metadata={"tags": ["kernel"]}),
        v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(f())", metadata={"tags": ["nbval-ignore-output"]}),
        v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception", "nbval-skip"]}),
        v4.new_raw_cell("raw text\n\nsecond paragraph"),
        v4.new_code_cell("class A:\n    pass"),
        v4.new_code_cell("y = 2"),
    ]
    nb = v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                               "language": "python"}})
    for i, cell in enumerate(nb.cells):
        cell.id = f"s99-{i:02d}-probe"
    nb.cells[3].outputs = [v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells[3].execution_count = 3
    path = folder / "99_probe.ipynb"
    nbformat.write(nb, path)
    committed = path.read_bytes()
    _jupytext("--to", "py:percent", str(path))
    source = nbcells.source_of(path)
    text = source.read_text()
    assert '# %% [markdown] tags=["spec"]' in text and '# %% tags=["raises-exception", "nbval-skip"]' in text
    assert "\n%time x = 1\n" in text  # magics as they are (comment_magics = false)
    assert _cells(nbcells.read_source(source)) == _cells(jupytext.read(source)) == _cells(nb)
    assert nbcells.out_of_step(path) == ""
    source.touch()
    _jupytext("--sync", str(source))
    assert path.read_bytes() == committed, "ids, outputs, execution counts and tags kept"


@needs_jupytext
def test_nbcells_reads_blank_lines_and_empty_cells_as_jupytext_does(tmp_path):
    """Blank lines at a cell's ends (jupytext separates cells by one blank line, two after a definition), empty
    cells, magics. One thing does not round-trip through jupytext itself: a code cell ending in a single newline
    loses it (jupytext keeps it only in metadata that solutions/jupytext.toml filters out); the pair is then out of
    step, which the tests say."""
    folder = tmp_path / "solutions"
    folder.mkdir()
    shutil.copyfile(CONFIG, folder / CONFIG.name)
    v4 = nbformat.v4
    sources = ["def f():\n    return 1", "x = 1\n\n", "\n\nx = 2", "", "class A:\n    pass\n\n\n",
               "# %time\n%%timeit\nz = 1", "import os\n\n\n\n\nw = 1"]
    cells = [*(v4.new_code_cell(s) for s in sources), v4.new_markdown_cell("a\n\n\nb"), v4.new_markdown_cell(""),
             v4.new_code_cell("def g():\n    pass"), v4.new_markdown_cell("x")]
    path = folder / "99_probe.ipynb"
    nbformat.write(v4.new_notebook(cells=cells), path)
    _jupytext("--to", "py:percent", str(path))
    source = nbcells.source_of(path)
    assert _cells(nbcells.read_source(source)) == _cells(jupytext.read(source)) == [(c.cell_type, c.source, [])
                                                                                   for c in cells]
    assert nbcells.out_of_step(path) == ""
    nbformat.write(v4.new_notebook(cells=[*cells, v4.new_code_cell("y = 3\n")]), path)
    _jupytext("--to", "py:percent", str(path))
    assert _cells(nbcells.read_source(source)) == _cells(jupytext.read(source))
    assert nbcells.out_of_step(path) == f"cell {len(cells)} of 99_probe.ipynb and of 99_probe.py differ (source)"


def test_a_pair_edited_on_one_side_is_out_of_step(tmp_path):
    """The CI check fails when either side is edited alone: a source line, a tag, a cell more, a notebook edit."""
    name = "04_data_transfer_padding.ipynb"
    folder = _copy(tmp_path, {name})
    nb_path, source = folder / name, nbcells.source_of(folder / name)
    assert nbcells.out_of_step(nb_path) == ""
    text = source.read_text()
    kernel = [c for c, (kind, _, tags) in enumerate(_cells(nbcells.read_source(source))) if "kernel" in tags][0]

    source.write_text(text.replace("import numpy as np", "import numpy as np  # edited", 1))
    why = nbcells.out_of_step(nb_path)
    assert why.startswith("cell ") and "(source)" in why, why

    source.write_text(text.replace('# %% tags=["kernel"]', "# %%", 1))
    assert nbcells.out_of_step(nb_path) == f"cell {kernel} of {name} and of {source.name} differ (tags)"

    source.write_text(text + "\n# %%\nx = 1\n")
    assert "cells" in nbcells.out_of_step(nb_path)

    source.write_text(text)
    nb = nbformat.read(nb_path, 4)
    nb.cells[0].source += "\nedited in Jupyter"
    nbformat.write(nb, nb_path)
    assert "cell 0 " in nbcells.out_of_step(nb_path) and "(source)" in nbcells.out_of_step(nb_path)

    source.unlink()
    assert "has no source" in nbcells.out_of_step(nb_path)


def test_a_cell_marker_the_reader_does_not_know_is_refused(tmp_path):
    source = tmp_path / "04_data_transfer_padding.py"
    source.write_text('# %% tags=["kernel"]\nx = 1\n\n# %% some title\ny = 2\n')
    with pytest.raises(nbcells.NotebookError, match="line 4: a cell marker this reader does not know"):
        nbcells.read_source(source)
    source.write_text("# ---\n# jupyter:\n# ---\n\n# %%\nx = 1\n")
    with pytest.raises(nbcells.NotebookError, match="text before the first cell marker"):
        nbcells.read_source(source)
    source.write_text('# %% tags="kernel"\nx = 1\n')
    with pytest.raises(nbcells.NotebookError, match="cell marker this reader does not know"):
        nbcells.read_source(source)
    with pytest.raises(nbcells.NotebookError, match="no notebook source"):
        nbcells.read_source(tmp_path / "absent.py")


@needs_jupytext
def test_a_marker_inside_a_string_puts_the_pair_out_of_step(tmp_path):
    """jupytext does not split a cell at a '# %%' line inside a string; labkit's reader does: such a source is out
    of step with its notebook, so the CI check says so before the kit runs it."""
    folder = tmp_path / "solutions"
    folder.mkdir()
    shutil.copyfile(CONFIG, folder / CONFIG.name)
    cell = nbformat.v4.new_code_cell('S = """\n# %%\n"""', metadata={"tags": ["kernel"]})
    nb = nbformat.v4.new_notebook(cells=[cell])
    path = folder / "99_probe.ipynb"
    nbformat.write(nb, path)
    _jupytext("--to", "py:percent", str(path))
    assert len(jupytext.read(nbcells.source_of(path)).cells) == 1
    assert nbcells.out_of_step(path) == "cell 0 of 99_probe.ipynb and of 99_probe.py differ (source)"


def test_the_kit_runs_a_solutions_code_from_its_source(tmp_path, monkeypatch):
    """from_stage and the tools load the .py; its cells run under the notebook's name and cell indices, so the code
    is the notebook's own (the grader's ownership rules and tracebacks see no difference)."""
    monkeypatch.delenv("LABKIT_SOLUTIONS", raising=False)
    assert stages.solution("04") == SOLUTIONS / "04_data_transfer_padding.py"
    assert stages.given_source("04") == stages.solution("04")
    assert stages.stage_of(stages.solution("04")) is stages.STAGES["04"]
    from_source = nbcells.load(stages.solution("01"))
    from_notebook = nbcells.load(SOLUTIONS / stages.STAGES["01"].notebook)
    assert sorted(from_source) == sorted(from_notebook) and list(from_source["VARIANTS"]) == \
        list(from_notebook["VARIANTS"])
    own = lambda ns: {k: v.__code__.co_filename for k, v in ns.items() if hasattr(v, "__code__")}  # noqa: E731
    assert own(from_source) == own(from_notebook) and "<01_serial_baseline.ipynb cell 3>" in own(from_source).values()
    assert from_source["__name__"] == from_notebook["__name__"]
    # a solutions folder of notebooks only (an older private copy) still runs them
    folder = tmp_path / "only_notebooks"
    folder.mkdir()
    shutil.copyfile(SOLUTIONS / stages.STAGES["01"].notebook, folder / stages.STAGES["01"].notebook)
    assert stages.solution("01", folder) == folder / "01_serial_baseline.ipynb"


def test_tools_refuse_a_pair_out_of_step(tmp_path, monkeypatch):
    """make_student and execute_solutions say which pair to sync instead of building from (or running) a stale
    notebook."""
    make_student = tool_modules.load("make_student")
    execute_solutions = tool_modules.load("execute_solutions")
    folder = _copy(tmp_path, {"01_serial_baseline.ipynb"})
    source = folder / "01_serial_baseline.py"
    source.write_text(source.read_text().replace("lk.hello(\"01\")", "lk.hello(\"01\")  # edited", 1))
    with pytest.raises(ValueError, match=r"cell \d+ of 01_serial_baseline.ipynb .* differ \(source\).*jupytext --sync"):
        make_student.build(folder, tmp_path / "notebooks", check=True)
    monkeypatch.setattr(execute_solutions, "REPO", tmp_path)
    monkeypatch.setattr(execute_solutions, "test_environment", lambda: {})
    monkeypatch.setattr(execute_solutions, "execute", lambda *a, **k: pytest.fail("executed a stale notebook"))
    assert execute_solutions.main(["01"]) == 2
    shutil.copyfile(SOLUTIONS / source.name, source)  # in step again: it runs
    ran = []
    monkeypatch.setattr(execute_solutions, "execute", lambda path, *a, **k: ran.append(path.name) or 1.0)
    assert execute_solutions.main(["01"]) == 0 and ran == ["01_serial_baseline.ipynb"]


def test_pytest_collects_no_source_as_a_test():
    """testpaths holds solutions/: nbval collects the notebooks, and the sources (not test_*.py) are not imported."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", "--nbval-lax", "solutions"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    items = [ln for ln in done.stdout.splitlines() if "::" in ln]
    assert items and all(ln.split("::")[0].endswith(".ipynb") for ln in items), items[:5]
    assert {ln.split("::")[0] for ln in items} == {f"solutions/{p.name}" for p in NOTEBOOKS}


def test_release_code_reads_given_code_from_the_sources():
    """labkit release writes each earlier stage's given code from its solution's source: the same cells as the
    notebook's kernel cells."""
    for number in ("02", "04"):
        nb = nbformat.read(SOLUTIONS / stages.STAGES[number].notebook, 4)
        assert nbcells.tagged_cells(nbcells.read(stages.solution(number))) == nbcells.tagged_cells(nb)


def test_the_grader_refuses_solutions_out_of_step(tmp_path):
    """The grader grades a stage's reference from its notebook and runs given code from the earlier stages'
    sources: a --solutions folder where a pair differs is refused in one line before anything is graded."""
    from labkit.grading import plan
    from labkit.grading.rubric import GradeError

    folder = _copy(tmp_path, {"03_managed_memory.ipynb", "04_data_transfer_padding.ipynb"})
    plan.in_step(stages.STAGES["04"], folder)
    source = folder / "03_managed_memory.py"
    source.write_text(source.read_text().replace('# %% tags=["kernel"]', "# %%", 1))
    plan.in_step(stages.STAGES["02"], folder)  # stage 02's jobs run neither
    with pytest.raises(GradeError, match=r"--solutions: cell \d+ of 03_managed_memory.ipynb and of "
                                         r"03_managed_memory.py differ \(tags\); run `jupytext --sync "):
        plan.plan_stage(stages.STAGES["04"], folder, None, gpu=False, simulated=True)
