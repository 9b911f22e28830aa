"""labkit release: a student repository of milestone 05 holds no solution of stages 05-10, anywhere; its given code
loads and a later stage is refused in one line; the leak search can fail."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from labkit import given, release, stages
from labkit.cli import main
from labkit.course import leak_search

REPO = Path(__file__).resolve().parent.parent
MILESTONE = "05"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "m05"
    result = release.build(MILESTONE, out, git=True)
    return out, result


def test_release_holds_the_milestones_notebooks_and_no_solutions(built):
    out, _ = built
    files = release.file_list(out)
    assert not [f for f in files if f.startswith("solutions/") or "/solutions/" in f]
    # nor the solutions' sources (solutions/NN_topic.py, jupytext's percent format) under any name: a stage's given
    # code is its kernel cells only (no markdown cell, no cell of a later stage), and no file is a source
    sources = {p.read_bytes() for p in (REPO / "solutions").glob("*.py")}
    assert sources and not [f for f in files if (out / f).read_bytes() in sources]
    assert not [f for f in files if f.endswith(".py") and re.search(r"(?m)^# %% \[markdown\]", (out / f).read_text())]
    assert not [f for f in files if f.endswith("jupytext.toml")]
    notebooks = sorted(f for f in files if f.endswith(".ipynb"))
    assert notebooks == [f"notebooks/{s.notebook}" for n, s in stages.STAGES.items() if n <= MILESTONE]
    assert stages.STUB_MARK in (out / "notebooks" / stages.STAGES[MILESTONE].notebook).read_text()
    info = given.manifest(out / "labkit" / "given")
    assert info["milestone"] == MILESTONE and info["released"] == ["00", "01", "02", "03", "04"]
    assert sorted(f for f in files if f.startswith("labkit/given/")) == sorted(
        ["labkit/given/manifest.json", *(f"labkit/given/{name}" for name in info["files"].values())])
    assert set(info["files"]) == {"01", "02", "03", "04"}  # 00 has no kernels
    assert "tests/test_student_kit.py" in files and "pyproject.toml" in files and "README.md" in files
    figures = sorted(f for f in files if f.startswith("notebooks/figures/"))  # the task specs' access pictures
    assert figures and all(f.endswith((".png", ".json")) and f.split("/")[-1][:2] <= MILESTONE for f in figures)
    assert any(f.startswith(f"notebooks/figures/{MILESTONE}_task") for f in figures)
    # each picture with the spec's recording that lk.show.task draws under a student's own
    assert {f[:-4] for f in figures if f.endswith(".png")} == {f[:-5] for f in figures if f.endswith(".json")}
    pyproject = (out / "pyproject.toml").read_text()
    assert 'testpaths = ["tests"]' in pyproject and "nbval" not in pyproject.split("[tool.pytest.ini_options]")[1]
    log = subprocess.run(["git", "log", "--format=%s"], cwd=out, capture_output=True, text=True).stdout
    assert log.splitlines() == [log.splitlines()[0]] and log.startswith("Milestone 05")  # one commit
    assert not subprocess.run(["git", "status", "--porcelain"], cwd=out, capture_output=True, text=True).stdout


def test_leak_search_of_the_build_finds_nothing_for_05_to_10(built):
    _, result = built
    assert result.clean, result.report()
    assert sorted(result.secrets.lines) == ["05", "06", "07", "08", "09", "10"]
    assert all(result.secrets.lines[n] for n in result.secrets.lines)  # every stage has lines searched for
    assert result.files == len(release.file_list(built[0]))


def test_leak_search_finds_a_planted_solution_line(built, tmp_path):
    """A solution line of a random later stage, planted with other whitespace in a notebook's markdown and as
    is in a docs page, is found in both; nothing else is."""
    out, result = built
    number = random.Random(63).choice(sorted(result.secrets.lines))
    line = random.Random(64).choice(sorted(result.secrets.lines[number]))
    nb_path = out / "notebooks" / "00_setup.ipynb"
    doc_path = out / "docs" / "students.md"
    nb_text, doc_text = nb_path.read_text(), doc_path.read_text()
    try:
        nb = json.loads(nb_text)
        nb["cells"][0]["source"] = "    " + line.replace(" ", "   ") + "\n"  # JSON-escaped, spaced out
        nb_path.write_text(json.dumps(nb))
        doc_path.write_text(doc_text + f"\n```\n{line}\n```\n")
        found = release.verify(out, MILESTONE, found=result.secrets)
    finally:
        nb_path.write_text(nb_text)
        doc_path.write_text(doc_text)
    first = result.secrets.all()[line]
    assert sorted(found.hits) == sorted([("notebooks/00_setup.ipynb", first, line), ("docs/students.md", first, line)])
    assert not found.clean and "found: 2 solution line(s)" in found.report()


def test_one_line_of_a_stage_in_the_kits_python_is_not_a_leak_two_are(built):
    """The kit is released whole to every milestone, and its Python shares single common lines with solutions
    (``i = (t // Wo) % Ho``): one line of a stage in one of its files is not counted, a second line of the same
    stage in that file is, and both are then reported. Before this, milestones 00 to 04 could not be released."""
    out, result = built
    table = result.secrets.all()
    kit_file = out / "labkit" / "ops" / "kernels.py"
    text = kit_file.read_text()
    # a stage none of whose lines the file holds already (it shares "if n < N and o < OUT:" with stage 10's
    # task 1: one more line of that stage is its second, which counts), two of its lines, by a fixed choice
    held = {leak_search._norm(line) for line in text.splitlines()}
    own = {n: sorted(line for line in result.secrets.lines[n] if table[line] == n) for n in result.secrets.lines}
    free = [n for n in sorted(own) if len(own[n]) >= 2 and not held & set(own[n])]
    assert free, "every stage already has a line in labkit/ops/kernels.py: plant into another kit file"
    number = random.Random(24).choice(free)
    one, two = random.Random(25).sample(own[number], 2)
    try:
        kit_file.write_text(text + f"\n# {one}\n")
        alone = release.verify(out, MILESTONE, found=result.secrets)
        kit_file.write_text(text + f"\n# {one}\n# {two}\n")
        copied = release.verify(out, MILESTONE, found=result.secrets)
    finally:
        kit_file.write_text(text)
    assert alone.clean, alone.report()
    assert sorted(copied.hits) == sorted([("labkit/ops/kernels.py", table[one], one),
                                          ("labkit/ops/kernels.py", table[two], two)])


def test_given_code_in_the_release_and_one_line_for_a_later_stage(built):
    """In a fresh process with the release first on the path and no solutions anywhere to fall back on."""
    out, _ = built
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_SOLUTIONS"}
    env.update(PYTHONPATH=str(out), NUMBA_ENABLE_CUDASIM="1")
    code = ("import labkit as lk\n"
            "print(lk.__file__)\n"
            "print(sorted(lk.from_stage('04').VARIANTS))\n"
            "try:\n    lk.from_stage('05')\nexcept lk.given.NotReleased as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    where, variants, refusal = proc.stdout.strip().splitlines()
    assert Path(where).resolve().is_relative_to(out.resolve())
    assert eval(variants) == sorted(stages.load_variants(REPO / "solutions" / stages.STAGES["04"].notebook))
    assert refusal == ("stage 05's code is not released yet in this milestone (released: 00\u201304); it comes with "
                       "the milestone after 05's deadline")


def test_instructors_repository_reads_the_solutions():
    """From their sources (solutions/NN_topic.py), the notebooks' pairs."""
    assert given.manifest() is None
    assert stages.given_source("05") == stages.solutions_folder() / stages.STAGES["05"].source


def test_given_file_keeps_the_notebooks_cells(tmp_path):
    """A given-code file runs each cell under its notebook cell's name, as the solution notebook's cells ran."""
    cells = [(3, "x = 1"), (7, "def f():\n    return x + 1\n\n\ny = f()")]
    path = tmp_path / "04_data_transfer_padding.py"
    path.write_text(given.render("04", "04_data_transfer_padding.ipynb", "t", cells, "05"))
    assert given.cells(path.read_text()) == cells
    ns = given.load(path, "04_data_transfer_padding.ipynb")
    assert ns["y"] == 2 and ns["f"].__code__.co_filename == "<04_data_transfer_padding.ipynb cell 7>"
    with pytest.raises(ValueError, match="cell marker"):
        given.render("04", "04_data_transfer_padding.ipynb", "t", [(1, "# %% cell 9")], "05")


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    runner = CliRunner()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for args, says in ((["release", str(busy), "--upto", "05"], "is not empty and holds no earlier release"),
                       (["release", str(tmp_path / "new"), "--upto", "42"], "unknown stage '42'"),
                       (["release", str(tmp_path / "new")], "--upto"),
                       (["release", "--verify", str(busy)], "is not a labkit release")):
        got = runner.invoke(main, args)
        assert got.exit_code != 0 and says in got.output, (args, got.output)
        assert not got.exception or isinstance(got.exception, SystemExit)
    assert (busy / "notes.txt").read_text() == "mine"


def _fake_release(folder: Path, milestone: str) -> Path:
    """A folder as a release of ``milestone`` leaves it: its manifest and a notebook of each of its stages."""
    (folder / "labkit" / "given").mkdir(parents=True)
    files = {n: s.notebook.replace(".ipynb", ".py") for n, s in stages.STAGES.items() if "01" <= n < milestone}
    (folder / "labkit" / "given" / given.MANIFEST).write_text(json.dumps(
        {"milestone": milestone, "released": [n for n in stages.STAGES if n < milestone], "files": files}))
    (folder / "notebooks").mkdir()
    for n, s in stages.STAGES.items():
        if n <= milestone:
            (folder / "notebooks" / s.notebook).write_text("{}")
    return folder


def test_an_earlier_milestone_onto_a_later_release_is_refused_unless_forced(tmp_path, monkeypatch):
    """--upto 06 onto milestone 10's release would delete stages 07-10: refused in one line naming them, the folder
    untouched; --force goes on."""
    out = _fake_release(tmp_path / "course", "10")
    before = sorted(release.file_list(out))
    got = CliRunner().invoke(main, ["release", str(out), "--upto", "06"])
    assert got.exit_code != 0 and len(got.output.strip().splitlines()) == 1, got.output
    assert ("holds the release of milestone 10: --upto 06 would delete stages 07\u201310 from it (their notebooks; "
            "and the given code of 06\u201309): pass --force") in got.output, got.output
    assert sorted(release.file_list(out)) == before

    def reached(repo):
        raise release.ReleaseError("went on to build")

    monkeypatch.setattr(release, "make_student", reached)
    got = CliRunner().invoke(main, ["release", str(out), "--upto", "06", "--force"])
    assert got.exit_code != 0 and "went on to build" in got.output, got.output


def test_verify_of_a_folder_holding_no_release_is_refused(tmp_path):
    """"found: nothing" of a folder that holds no release would say a typo is clean: with --upto too, one line."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder, says in ((empty, "is not a labkit release (it is empty)"),
                         (tmp_path, "is not a labkit release (no labkit/given/manifest.json)")):
        got = CliRunner().invoke(main, ["release", "--verify", str(folder), "--upto", "05"])
        assert got.exit_code != 0 and says in got.output and len(got.output.strip().splitlines()) == 1, got.output


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, where nothing can be created")
def test_a_release_folder_that_cannot_be_created_is_one_line(tmp_path):
    """As root ``os.access`` says yes to /proc: the folder is tried (a file made there), not asked about."""
    got = CliRunner().invoke(main, ["release", "/proc/labkit-nope", "--upto", "01"])
    assert got.exit_code != 0 and "the release folder /proc/labkit-nope cannot be created" in got.output, got.output
    assert len(got.output.strip().splitlines()) == 1 and "Traceback" not in got.output
