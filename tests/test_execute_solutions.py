"""tools/execute_solutions.py says why a notebook's run ended when its kernel died (issue 32's "flaky" notebook 09).

On an H100 notebook 09 twice ended in a bare AssertionError: both runs were cut by the step's time limit, whose
SIGTERM nbclient answers by shutting the kernel down, then failing its own cleanup. The tool now names the cell and
the cause in one line, keeps the cells run so far, and exits 1; a kernel that dies on its own is told apart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent

RUN = """
import sys
sys.path.insert(0, {tools!r})
from pathlib import Path
import execute_solutions as ex
try:
    ex.execute(Path({nb!r}), timeout=60, out=Path({out!r}))
except ex.KernelDied as exc:
    print("DIED", exc.signalled, exc)
    sys.exit(1)
print("DONE")
"""


def _run(tmp_path: Path, second_cell: str) -> tuple[subprocess.CompletedProcess, Path]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 41 + 1\nx"),
                                         nbformat.v4.new_code_cell(second_cell),
                                         nbformat.v4.new_code_cell("never = True")])
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "out"
    out.mkdir()
    code = RUN.format(tools=str(REPO / "tools"), nb=str(path), out=str(out))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180), out


@pytest.mark.parametrize("cell, signalled, cause", [
    # the kernel's parent (the tool) sent SIGTERM, as GNU timeout does to the whole process group
    ("import os, signal, time\nos.kill(os.getppid(), signal.SIGTERM)\ntime.sleep(30)", True, "was sent SIGTERM"),
    # the kernel killed on its own, as the out-of-memory killer does
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", False, "killed from outside"),
])
def test_a_dead_kernel_is_one_line_naming_the_cell_and_the_cause(tmp_path, cell, signalled, cause):
    done, out = _run(tmp_path, cell)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("DIED"))
    assert line.startswith(f"DIED {signalled} the kernel died during cell 1 ("), line
    assert cause in line and "no cell raised" in line
    assert "AssertionError" not in done.stdout
    partial = nbformat.read(out / "probe.partial.ipynb", as_version=4)
    assert partial.cells[0].outputs[0]["data"]["text/plain"] == "42"  # the cells run before it are kept
    assert not partial.cells[2].get("outputs")


def test_a_cell_error_is_not_a_dead_kernel(tmp_path):
    done, out = _run(tmp_path, "raise ValueError('a cell of its own')")
    assert "DIED" not in done.stdout and "CellExecutionError" in done.stderr, done.stdout + done.stderr
