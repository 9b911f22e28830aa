"""The student path as a person meets it: the README's `labkit lab` starts JupyterLab on notebooks/, headless
Chromium opens a notebook from the file browser, Run > Run All Cells runs it, and the test reads what the student
sees on the page.

Needs Debian's Chromium (/usr/bin/chromium), the Python package playwright (the dev extra; it drives that Chromium,
`playwright install` is never needed) and JupyterLab (the lab extra). Without one of them the tests skip and say
which, except in CI (CI set, as .ci/run runs), where they must run and fail instead: .ci/run installs all three.

Screenshots of the checked states go to $LABKIT_SCREENSHOTS when it is set, else to the test's tmp_path; the
committed ones in docs/img/ come from

    LABKIT_SCREENSHOTS=docs/img .venv/bin/pytest tests/test_browser.py -o addopts=""

Everything runs in temporary copies (the notebooks, Jupyter's settings, the results ledger): the repo is not changed.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "01_serial_baseline.ipynb"  # the quickest stage notebook with a self-check and a plot
CHROMIUM = Path("/usr/bin/chromium")
# This machine's closed network (and CI's) refuses Chromium's background connections: switch them all off.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = {"student": "01-student-self-check.png", "solution": "01-solution-plot.png",  # names docs/ refer to
         "show": "05-student-lk-show.png"}
RUN_TIMEOUT_MS = 600_000  # Run All of one notebook; ~10 s for the student copy, ~30 s for the solution on 2 cores

# What counts as an error output. An output on the page is an error when it is
#   1. rendered with mime type application/vnd.jupyter.stderr (a .jp-RenderedText: what a cell wrote to stderr, and
#      also how JupyterLab 4 shows an exception a cell raised) and its text holds a Python traceback: the words
#      "Traceback (most recent call last)", or a line that starts with an exception's name and a colon
#      ("ValueError: ...", "numba.core.errors.TypingError: ...", "SomeException: ..."); or
#   2. rendered with mime type application/vnd.jupyter.error (how other front ends show a raised exception), whatever
#      its text.
# Other stderr text (a warning, a progress bar) is not an error; a failure message lists it all the same. A cell that
# raises also stops Run All Cells: the cells after it keep an empty prompt, which the tests report too.
ERROR_MIME = "application/vnd.jupyter.error"
STDERR_MIME = "application/vnd.jupyter.stderr"
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*(\w+\.)*\w*(Error|Exception)\s*:", re.M)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing() -> str | None:
    if not CHROMIUM.is_file():
        return f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)"
    if find_spec("playwright") is None:
        return "the Python package playwright is not installed (pip install -e \".[dev]\")"
    if find_spec("jupyterlab") is None:
        return "JupyterLab is not installed (pip install -e \".[lab]\")"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium with a fresh profile (Playwright's persistent context: its own --user-data-dir)."""
    why = _missing()
    if why and in_ci():
        pytest.fail(f"the browser test must run in CI, but {why}: .ci/run installs it")
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000})
        context.set_default_timeout(90_000)
        yield context
        context.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ["LABKIT_SCREENSHOTS"]) if os.environ.get("LABKIT_SCREENSHOTS") else tmp_path / "shots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ------------------------------------------------------------------------------------------ the README's command


def readme_lab_command() -> list[str]:
    """The README's student command, from its last `&&` on: `.venv/bin/labkit lab`, as words."""
    readme = (REPO / "README.md").read_text()
    line = next((ln for ln in readme.splitlines() if ln.startswith("Students:")), None)
    assert line, "the README's quick start has a 'Students:' line with the command a student runs"
    command = re.search(r"`([^`]*labkit lab[^`]*)`", line)
    assert command, f"the README's student line names no `... labkit lab` command: {line}"
    words = command.group(1).split("&&")[-1].split()
    assert Path(words[0]).name == "labkit" and words[1:] == ["lab"], words
    return words


def labkit_script() -> str:
    """`labkit` as this environment installed it (``pip install -e``), i.e. the README's `.venv/bin/labkit`."""
    script = Path(sys.executable).parent / ("labkit.exe" if os.name == "nt" else "labkit")
    if script.is_file():
        return str(script)
    found = shutil.which("labkit")
    assert found, "no `labkit` script next to this Python or on PATH: pip install -e \".[lab]\""
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_env(tmp: Path) -> dict[str, str]:
    """The kernel runs on the CUDA simulator with LABKIT_QUICK=1 and this process's LABKIT_DATA (if any); Jupyter's
    and IPython's own state, the ledger, and the matplotlib backend are the test's, never the user's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "IPYTHON", "MPLBACKEND", "LABKIT_DATA"))}
    settings = tmp / "jupyter" / "settings"
    for plugin, values in {
        # all cells in the page, so every output can be read and screenshot (the default skips off-screen cells)
        "notebook-extension/tracker": '{"windowingMode": "none"}',
        # no news or update check from the internet, no toast over the notebook
        "apputils-extension/notification": '{"fetchNews": "false", "checkForUpdates": false, "doNotDisturbMode": true}',
    }.items():
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(values)
    env.update(NUMBA_ENABLE_CUDASIM="1", LABKIT_QUICK="1", LABKIT_RESULTS=str(tmp / "ledger.jsonl"),
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter" / "config"), JUPYTER_DATA_DIR=str(tmp / "jupyter" / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "jupyter" / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "jupyter" / "workspaces"), JUPYTER_PLATFORM_DIRS="1",
               IPYTHONDIR=str(tmp / "ipython"))
    if os.environ.get("LABKIT_DATA"):
        env["LABKIT_DATA"] = os.environ["LABKIT_DATA"]
    return env


@contextmanager
def lab_server(clone: Path, tmp: Path):
    """The README's `labkit lab`, run in ``clone`` (laid out like a fresh clone: clone/notebooks/), with the options
    a test server needs: no browser of its own, 127.0.0.1 on a free port, a token. Yields (url, token, log)."""
    port, token = _free_port(), secrets.token_hex(16)
    command = [labkit_script(), *readme_lab_command()[1:], "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root; Jupyter refuses root unless told
    log = tmp / "labkit-lab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=clone, env=_server_env(tmp), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(server, url, token, log)
        yield url, token, log
    finally:
        server.terminate()  # SIGTERM: the server shuts its kernels down, then exits
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_until_serving(server: subprocess.Popen, url: str, token: str, log: Path, timeout: float = 120) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"`labkit lab` exited ({server.returncode}) before serving:\n{log.read_text()[-4000:]}")
        try:
            with opener.open(f"{url}/api/status?token={token}", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"`labkit lab` did not serve within {timeout:.0f} s:\n{log.read_text()[-4000:]}")


def copy_like_a_clone(tmp: Path, source: Path, only: str | None = None) -> Path:
    """tmp/clone/notebooks/ holding the notebooks of ``source`` (just ``only``, if given) without stored outputs:
    what a student has after cloning (or after finishing the notebook, for solutions/)."""
    folder = tmp / "clone" / "notebooks"
    folder.mkdir(parents=True)
    for path in sorted(source.glob("*.ipynb")):
        if only and path.name != only:
            continue
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, folder / path.name)
    return folder.parent


# ------------------------------------------------------------------------------------------ in the browser


def open_lab(browser, url: str, token: str):
    page = browser.new_page()
    page.goto(f"{url}/lab?token={token}")
    page.locator(".jp-DirListing-content .jp-DirListing-item").first.wait_for()
    return page


def listed(page) -> list[str]:
    """The names in JupyterLab's file browser."""
    return sorted(t.strip() for t in page.locator(".jp-DirListing-content .jp-DirListing-itemText").all_text_contents())


def open_and_run_all(page, name: str, shots: Path):
    """Double-click the notebook in the file browser, wait until its kernel is up and idle, then Run > Run All Cells
    and wait until every code cell has run (or one raised, or a dialog asks something) and the kernel is idle.
    Returns the notebook panel; on a time-out, a screenshot of the page is left in ``shots`` as failure-*.png."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(".jp-DirListing-item", has_text=name).dblclick()
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    try:
        # the toolbar says "No Kernel" (and idle) until the kernel is started and connected
        page.wait_for_function("""() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const kernel = panel?.querySelector('.jp-Toolbar-kernelName')?.textContent.trim();
            const status = panel?.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
            return kernel && kernel !== 'No Kernel' && status === 'idle';
        }""", timeout=120_000, polling=250)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        # Run All stops at a cell that raises: then the later cells never run, and that is the end too
        state = page.wait_for_function("""([errorMime, stderrMime, traceback]) => {
            const dialog = document.querySelector('.jp-Dialog');
            if (dialog) return 'a dialog: ' + dialog.textContent;
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const idle = panel.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle';
            const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
            const outputs = panel.querySelectorAll(`[data-mime-type="${errorMime}"], [data-mime-type="${stderrMime}"]`);
            const raised = [...outputs]
                .some(o => o.dataset.mimeType === errorMime || new RegExp(traceback, 'm').test(o.textContent));
            if (idle && raised) return 'a cell raised';
            return idle && prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t)) && 'done';
        }""", arg=[ERROR_MIME, STDERR_MIME, TRACEBACK.pattern], timeout=RUN_TIMEOUT_MS, polling=500).json_value()
    except PlaywrightTimeout:
        page.screenshot(path=shots / f"failure-{Path(name).stem}.png", full_page=True)
        raise
    if state != "done":
        page.screenshot(path=shots / f"failure-{Path(name).stem}.png", full_page=True)
    assert state in ("done", "a cell raised"), f"Run All Cells of {name} stopped: {state}"
    return panel


def cells(panel) -> list[dict]:
    """Every cell on the page, in order: its kind, its prompt, its outputs (mime type and text) and its images."""
    # the mime type sits on the output element itself (JupyterLab 4) or on the rendered widget inside it
    return panel.evaluate("""(panel) => [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map(cell => ({
        code: cell.classList.contains('jp-CodeCell'),
        prompt: cell.querySelector('.jp-InputPrompt')?.textContent.trim() ?? '',
        outputs: [...cell.querySelectorAll(['.jp-OutputArea-output[data-mime-type]',
                                            '.jp-OutputArea-output [data-mime-type]'].join(', '))]
            .map(o => ({mime: o.dataset.mimeType, text: o.textContent})),
        images: [...cell.querySelectorAll('.jp-OutputArea-output img')]
            .filter(img => img.complete && img.naturalWidth > 0).length,
    }))""")


def text_of(cell: dict) -> str:
    return "".join(o["text"] for o in cell["outputs"] if o["mime"].startswith("application/vnd.jupyter.std"))


def error_outputs(page_cells: list[dict]) -> list[str]:
    """The error outputs on the page (see ERROR_MIME / TRACEBACK above), as 'cell N: text'."""
    return [f"cell {i}: {o['text'][:2000]}" for i, cell in enumerate(page_cells) for o in cell["outputs"]
            if o["mime"] == ERROR_MIME or (o["mime"] == STDERR_MIME and TRACEBACK.search(o["text"]))]


def stderr_outputs(page_cells: list[dict]) -> list[str]:
    return [f"cell {i}: {o['text'][:500]}" for i, cell in enumerate(page_cells) for o in cell["outputs"]
            if o["mime"] == STDERR_MIME]


def cell_index(path: Path, starts: str) -> int:
    """Index (among all cells, as on the page) of the first code cell of the notebook file whose source starts so."""
    nb = nbformat.read(path, as_version=4)
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(starts))


def check_run(page_cells: list[dict], path: Path) -> None:
    """Every code cell ran; no error output; the first cell is lk.hello's: machine, data and GPU timings."""
    nb = nbformat.read(path, as_version=4)
    assert len(page_cells) == len(nb.cells), "every cell of the notebook is on the page"
    not_run = [i for i, c in enumerate(page_cells) if c["code"] and not re.fullmatch(r"\[\d+\]:", c["prompt"])]
    errors = error_outputs(page_cells)
    assert not errors, ("error outputs:\n" + "\n".join(errors) + "\nall stderr:\n"
                        + "\n".join(stderr_outputs(page_cells)))
    assert not not_run, f"code cells that did not run: {not_run}"
    check_hello(text_of(page_cells[cell_index(path, "import numpy as np\nimport labkit as lk")]))


def check_hello(out: str) -> None:
    """lk.hello, for a student without a GPU: what the machine is, the data (or what to do), the kit's timings."""
    from labkit import data

    assert "This machine: no GPU, so GPU kernels run on numba's CUDA simulator" in out, out
    assert "checked on shrunk problems, timings not meaningful" in out, out
    for name, ds in data.DATASETS.items():  # the same lookup as the kernel's (same LABKIT_DATA)
        try:
            data.find(name)
            assert f"{name} in " in out, out
        except data.DataNotFound:
            assert f"{name} is missing (`{ds.fetch_hint}`, or point LABKIT_DATA at a copy)" in out, out
            assert "runs without data use synthetic inputs" in out, out
    assert re.search(r"The kit's GPU timings of stage 01: results/\S+/ \(.+, \d{4}-\d\d-\d\d\); this notebook draws "
                     r"its plots from them\.", out), out


def check_lines(out: str) -> list[str]:
    """The self-check's result lines: 'conv1: PASS (...)', 'cifar10 forward: FAIL (...)'."""
    return [ln for ln in out.splitlines() if re.match(r"^[\w ]+: (PASS|FAIL)\b", ln)]


# ------------------------------------------------------------------------------------------ the tests


def test_readme_command_opens_the_notebooks_and_an_untouched_notebook_says_not_implemented(browser, tmp_path, shots):
    clone = copy_like_a_clone(tmp_path, REPO / "notebooks")
    with lab_server(clone, tmp_path) as (url, token, log):
        said = log.read_text()
        assert re.search(r"^Machine: no GPU, so the notebooks run GPU kernels on numba's CUDA simulator", said,
                         re.M), said
        assert re.search(r"^Data: cifar10 (in |is missing: run `labkit data fetch cifar10`)", said, re.M), said
        assert "Starting JupyterLab on" in said, said
        page = open_lab(browser, url, token)
        assert listed(page) == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
        panel = open_and_run_all(page, NOTEBOOK, shots)
        page_cells = cells(panel)
        check_run(page_cells, REPO / "notebooks" / NOTEBOOK)
        i = cell_index(REPO / "notebooks" / NOTEBOOK, "# NBVAL_CHECK_OUTPUT")
        lines = check_lines(text_of(page_cells[i]))
        assert lines and all(re.search(r": FAIL \(not implemented yet", ln) for ln in lines), lines
        assert any(ln.startswith("conv1: FAIL (not implemented yet") for ln in lines), lines
        panel.locator(".jp-Notebook .jp-Cell").nth(i).screenshot(path=shots / SHOTS["student"])
        page.close()


def test_solution_notebook_passes_its_self_check_and_draws_its_plot(browser, tmp_path, shots):
    clone = copy_like_a_clone(tmp_path, REPO / "solutions", only=NOTEBOOK)
    with lab_server(clone, tmp_path) as (url, token, _):
        page = open_lab(browser, url, token)
        assert listed(page) == [NOTEBOOK]
        panel = open_and_run_all(page, NOTEBOOK, shots)
        page_cells = cells(panel)
        check_run(page_cells, REPO / "solutions" / NOTEBOOK)
        i = cell_index(REPO / "solutions" / NOTEBOOK, "# NBVAL_CHECK_OUTPUT")
        lines = check_lines(text_of(page_cells[i]))
        assert len(lines) >= 10 and all(": PASS (" in ln for ln in lines), lines
        plot = cell_index(REPO / "solutions" / NOTEBOOK, "lk.plots.layer_bars")
        assert page_cells[plot]["images"] == 1, page_cells[plot]
        panel.locator(".jp-Notebook .jp-Cell").nth(plot).screenshot(path=shots / SHOTS["solution"])
        page.close()


SHOW_NOTEBOOK = "05_shared_memory.ipynb"
SHOW_CELL = 'lk.show(conv_padded, kernel="conv_padded_kernel")'


def test_lk_show_draws_what_a_thread_touches_in_a_student_notebook(browser, tmp_path, shots):
    """lk.show in the student copy of stage 05, on the given code it starts from (stage 04's conv): the figure is on
    the page as an image. The notebook is cut to its given-code cell and the lk.show cell, so the test stays short."""
    clone = copy_like_a_clone(tmp_path, REPO / "notebooks", only=SHOW_NOTEBOOK)
    path = clone / "notebooks" / SHOW_NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    given = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "lk.from_stage(" in c.source)
    nb.cells = [nb.cells[given], nbformat.v4.new_markdown_cell("What one thread of the given conv touches:"),
                nbformat.v4.new_code_cell(SHOW_CELL)]
    nbformat.write(nb, path)
    with lab_server(clone, tmp_path) as (url, token, _):
        page = open_lab(browser, url, token)
        panel = open_and_run_all(page, SHOW_NOTEBOOK, shots)
        page_cells = cells(panel)
        errors = error_outputs(page_cells)
        assert not errors, "error outputs:\n" + "\n".join(errors)
        assert page_cells[-1]["prompt"].startswith("[") and page_cells[-1]["images"] == 1, page_cells[-1]
        assert text_of(page_cells[-1]) == "", "the figure comes alone, not beside a printed repr"
        panel.locator(".jp-Notebook .jp-Cell").nth(len(page_cells) - 1).screenshot(path=shots / SHOTS["show"])
        page.close()
