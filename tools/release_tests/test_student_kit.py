"""The student repository of one milestone (built by `labkit release`): the kit imports, the given code of the
stages whose deadlines have passed loads, later stages' code is not here and asking for it says so in one line,
and every notebook runs untouched from top to bottom."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import labkit as lk
from labkit import given

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = given.manifest()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_this_is_a_release_of_one_milestone():
    assert MANIFEST is not None, "labkit/given/manifest.json is missing: this is not a labkit release"
    milestone = MANIFEST["milestone"]
    assert [p.name for p in NOTEBOOKS] == [s.notebook for n, s in lk.STAGES.items() if n <= milestone]
    assert MANIFEST["released"] == [n for n in lk.STAGES if n < milestone]
    assert not (ROOT / "solutions").exists()


@pytest.mark.parametrize("number", sorted(MANIFEST["files"]) if MANIFEST else [])
def test_released_given_code_loads(number):
    ns = lk.from_stage(number)
    variants = ns.VARIANTS
    assert variants and all(isinstance(v, lk.Variant) and v.stage == number for v in variants.values())
    impls = next(iter(variants.values())).impls
    assert impls and all(callable(f) for f in impls.values())


@pytest.mark.parametrize("number", [n for n in lk.STAGES if MANIFEST and n >= MANIFEST["milestone"]])
def test_unreleased_stage_says_so_in_one_line(number):
    with pytest.raises(given.NotReleased) as err:
        lk.from_stage(number)
    message = str(err.value)
    assert "\n" not in message and f"stage {number}'s code is not released yet" in message


def test_a_fresh_process_refuses_in_one_line():
    """What a student sees from a notebook cell: one line, no solution file anywhere to fall back on."""
    later = MANIFEST["milestone"]  # the stage students work on now: never released in its own milestone
    env = dict(os.environ)
    env.pop("LABKIT_SOLUTIONS", None)
    proc = subprocess.run([sys.executable, "-c", f"import labkit as lk\ntry:\n lk.from_stage({later!r})\n"
                           f"except lk.given.NotReleased as e:\n print(e)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().count("\n") == 0 and "not released yet" in proc.stdout


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_untouched(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
