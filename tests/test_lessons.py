"""Lessons that teach: goals before findings, one source for a task's size, the student's checks apart from the
kit's, and stage 09's register tiles in steps that are checked one by one."""

import os
import re
import types
from pathlib import Path

import nbformat
import numpy as np
import pytest

from labkit import check, notebook, stages, tile_steps
from labkit.check import CheckResult

from test_notebooks import REPO, SOLUTIONS, STUDENT, make_student  # noqa: E402 - one loader of the tool

# ------------------------------------------------------------------------ findings only after the measure cells

#: the calls that measure something: a cell with one of them is a measure cell
MEASURE_CALLS = ("run_variants(", "lk.notebook.measure(", "lk.counts.", "lk.tune.tune(", "lk.measure(", "lk.run(",
                 "lk.engine.run(", "lk.Profiler", "lk.measured.show(")
#: words that announce how a measurement comes out
VERDICT = re.compile(r"\b(beats?|beating|beaten|lose|loses|losing|wins?|winning|winners?|outperforms?|outperformed|"
                     r"faster than|slower than|better than|worse than|best for|worst|pays off|differs per layer)\b",
                     re.I)
#: a measured figure: a time, a throughput, a share or a speedup ("9.7 ms", "3.46×", "99 %"); 16 × 32 is a size
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(ms|µs|us|ns|s|GFLOP/s|TFLOP/s|GB/s|%|×|x)(?![\w²/])(?!\s*\d)")


def reference_numbers() -> list[float]:
    """Every number in docs/reference_figures.md: what the original studies (and the cuDNN baseline planned with the
    kit) measured, which the context tables may quote before the student measures."""
    text = (REPO / "docs" / "reference_figures.md").read_text()
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)]


def is_reference(value: str, refs: list[float]) -> bool:
    """Does ``value`` (as written, e.g. "0.0688") quote a reference figure, rounded, in s, ms or µs?"""
    digits = len(value.split(".")[1]) if "." in value else 0
    v = float(value)
    return any(abs(round(r * scale, digits) - v) < 10 ** -(digits + 3) for r in refs for scale in (1, 1e3, 1e-3))


def before_first_measure(nb) -> list[tuple[int, str]]:
    """(index, text) of the markdown cells before the notebook's first measure cell."""
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                  and any(call in c.source for call in MEASURE_CALLS)), len(nb.cells))
    return [(i, c.source) for i, c in enumerate(nb.cells[:first]) if c.cell_type == "markdown"]


def findings_before_measuring(nb, refs: list[float]) -> list[str]:
    """The rule: before the first measure cell, no verdict word and no measured figure other than a quoted
    reference figure (so none of the kit's own results, in results/ or anywhere)."""
    found = []
    for i, text in before_first_measure(nb):
        found += [f"cell {i}: verdict {m.group(0)!r}" for m in VERDICT.finditer(text)]
        found += [f"cell {i}: figure {m.group(0)!r}" for m in FIGURE.finditer(text) if not is_reference(m.group(1), refs)]
    return found


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_goals_and_tasks_state_no_finding_before_the_first_measure_cell(path):
    found = findings_before_measuring(nbformat.read(path, as_version=4), reference_numbers())
    assert not found, f"{path.name} states a result before the student measures it: {found}"


def test_the_rule_catches_a_verdict_and_a_figure_of_the_kits_results():
    from labkit import measured

    res = measured.latest("09")
    if res is None:
        pytest.skip("no committed GPU results of stage 09 to take a figure from")
    total = max(res.runs("09"), key=lambda r: r.images).total  # the final stage at its largest workload
    nb = nbformat.read(REPO / "solutions" / "08_fusion.ipynb", as_version=4)
    refs = reference_numbers()
    assert not findings_before_measuring(nb, refs)
    goals = nb.cells[0]
    goals.source = goals.source.replace("**Learning goals**", "**Learning goals**\n- Measure why the atomics lose.")
    assert findings_before_measuring(nb, refs) == ["cell 0: verdict 'lose'"]
    goals.source += f"\n\nThe tuned network takes {1e3 * total:.3f} ms, 3.46× faster than cuDNN."
    found = " ".join(findings_before_measuring(nb, refs))
    assert f"{1e3 * total:.3f} ms" in found and "3.46×" in found and "faster than" in found
    assert not is_reference("9.698", refs) and is_reference("0.0688", refs) and is_reference("0.0317", refs)


# ------------------------------------------------------------------------------- a task's size, one source


def _partitions_into(sizes: list[int], targets: list[int]) -> bool:
    """Can ``sizes`` (the stubs, in order) be cut into consecutive groups whose sums are ``targets`` (in order)?"""
    if not targets:
        return not sizes
    total = 0
    for k, s in enumerate(sizes):
        total += s
        if total == targets[0] and _partitions_into(sizes[k + 1:], targets[1:]):
            return True
    return False


def spec_and_stub_sizes(nb) -> list[tuple[int, list[int], list[int]]]:
    """(spec cell, sizes the spec says, sizes the stubs below it say) for every spec followed by TODO stubs."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        stubs = []
        for nxt in nb.cells[i + 1:]:
            if nxt.cell_type == "markdown":
                break
            stubs += [int(n) for n in re.findall(r"TODO: your code here \(the solution takes about (\d+) lines?\)",
                                                   nxt.source)]
        if stubs:
            said = [int(n) for n in re.findall(r"[Rr]oughly\s+(\d+)\s+lines?\b", cell.source)]
            out.append((i, said, stubs))
    return out


@pytest.mark.parametrize("path", STUDENT, ids=lambda p: p.name)
def test_each_specs_roughly_n_lines_is_its_stubs_count(path):
    nb = nbformat.read(path, as_version=4)
    assert "{{lines:" not in "".join(c.source for c in nb.cells), "an unresolved size placeholder"
    for i, said, stubs in spec_and_stub_sizes(nb):
        assert said, f"cell {i}: a task spec without 'roughly N lines'"
        assert _partitions_into(stubs, said), f"cell {i}: the spec says {said} lines, its stubs {stubs}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_specs_take_their_sizes_from_the_blocks(path):
    """No typed size: every "roughly N lines" of a solution's spec is a placeholder naming its blocks."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    assert not re.findall(r"[Rr]oughly\s+\d", text), "a typed 'roughly N': use {{lines:block}}"


def test_a_changed_block_changes_both_the_spec_and_the_stub():
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    code = "def f(x):\n    ### BEGIN SOLUTION body\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
    nb = new_notebook(cells=[new_markdown_cell("Write f. Roughly {{lines:body}}."), new_code_cell(code)])
    student = make_student.student_notebook(nb)
    assert student.cells[0].source == "Write f. Roughly 2 lines."
    assert "about 2 lines" in student.cells[1].source and "x + 1" not in student.cells[1].source
    nb.cells[1].source = code.replace("    return y\n", "    y *= 2\n    # a comment is not a line\n    return y\n")
    student = make_student.student_notebook(nb)
    assert student.cells[0].source == "Write f. Roughly 3 lines." and "about 3 lines" in student.cells[1].source
    nb.cells[0].source = "Roughly {{lines:bodyy}}."
    with pytest.raises(ValueError, match="no solution block named bodyy"):
        make_student.student_notebook(nb)
    nb.cells[0].source = "Roughly {{lines:body}}."
    nb.cells.append(new_code_cell(code))
    with pytest.raises(ValueError, match="two solution blocks are named 'body'"):
        make_student.student_notebook(nb)


# -------------------------------------------------------------------- the student's checks apart from the kit's


def _compiled(src: str, filename: str) -> dict:
    ns: dict = {}
    exec(compile(src, filename, "exec"), ns)  # noqa: S102 - a function as a notebook cell defines it
    return ns


def test_origin_tells_given_code_from_the_notebooks_own():
    from labkit import gpu, kernels

    own = _compiled("def conv(x, w, b, out, pad, stride):\n    pass\n", "<05_shared_memory.ipynb cell 5>")["conv"]
    earlier = _compiled("def conv(x, w, b, out, pad, stride):\n    pass\n", "<02_kernels_vs_parallel.ipynb cell 13>")
    jupyter = _compiled("def conv(x, w, b, out, pad, stride):\n    pass\n", "/tmp/ipykernel_77/123.py")["conv"]
    assert check.origin(own, "05") is None and check.origin(jupyter, "05") is None
    assert check.origin(earlier["conv"], "05") == "stage 02"
    assert check.origin(kernels.GIVEN["relu"], "05") == "the kit"
    assert check.origin(gpu.with_copies(earlier["conv"], "conv"), "03") == "stage 02"  # a kit wrapper: what it wraps
    assert check.origin(gpu.with_copies(own, "conv"), "05") is None


def _result(name, passed, given="", detail=""):
    return CheckResult(name, passed, 1e-7 if passed else float("nan"), batches=(1, 3), given=given, detail=detail)


def test_the_self_check_lists_own_functions_and_sums_up_given_code(monkeypatch, capsys):
    relu = _result("relu1", True, "the kit")
    results = {
        "mine": [_result("conv1", False, detail="not implemented yet: conv() is still the TODO stub"), relu],
        "given_only": [_result("conv1", True, "stage 02"), relu, _result("cifar10 forward", True, "stage 02, the kit")],
        "cuda": [CheckResult("08 cuda", False, detail="skipped: needs a real GPU with cupy")],
    }
    monkeypatch.setattr(notebook, "check_variant", lambda variant, net, done, quiet: results[variant.name])
    variants = {name: stages.Variant({"conv": (lambda *a, _n=name: None)}, name=name, stage="08") for name in results}
    checked = notebook.check(variants)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["-- mine", "conv1: FAIL (not implemented yet: conv() is still the TODO stub)",
                     "-- given_only (given code only: in the line below)", "-- cuda",
                     "08 cuda: SKIPPED (needs a real GPU with cupy)",
                     "given code (stage 02, the kit's layers): 2 layers and 1 forward pass PASS"]
    assert checked.passed("given_only") and not checked.passed("mine")
    assert not [ln for ln in lines if "PASS" in ln and not ln.startswith("given code (")]


def test_a_failing_check_of_given_code_is_shown_in_full(monkeypatch, capsys):
    bad = _result("fc", False, "the kit", detail="first wrong element: out[0, 1]")
    monkeypatch.setattr(notebook, "check_variant", lambda variant, net, done, quiet: [bad])
    notebook.check({"v": stages.Variant({"fc": lambda *a: None}, name="v", stage="05")})
    out = capsys.readouterr().out
    assert out.splitlines() == ["-- v", "fc: FAIL (first wrong element: out[0, 1])"]


# ------------------------------------------------------------------------------ stage 09's register-tile steps


def _tiles_source(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "TILES_SOURCE = r" in c.source)
    return cell.source.split('TILES_SOURCE = r"""', 1)[1].split('"""', 1)[0]


def test_each_register_tile_step_is_small_and_has_a_check():
    nb = nbformat.read(REPO / "solutions" / "09_per_layer_tuning.ipynb", as_version=4)
    sizes = make_student.block_sizes(nb)
    steps = {name for _, name in tile_steps.STEPS}
    assert steps <= set(sizes) and steps == set(tile_steps.CHECKS) == set(tile_steps.CASES)
    by_step: dict = {}
    for step, name in tile_steps.STEPS:
        by_step[step] = by_step.get(step, 0) + sizes[name]
    assert by_step and max(by_step.values()) <= 25, by_step
    source = _tiles_source(REPO / "solutions" / "09_per_layer_tuning.ipynb")
    for name in steps:
        assert tile_steps.function_body(source, name), f"{name} is not a __device__ function of TILES_SOURCE"


def test_the_step_harnesses_hold_no_line_of_a_solution_block():
    """labkit ships to students: its harnesses must not give away a line of the steps they check."""
    norm = " ".join((REPO / "labkit" / "lessons" / "tile_steps.py").read_text().split())
    nb = nbformat.read(REPO / "solutions" / "09_per_layer_tuning.ipynb", as_version=4)
    leaks = []
    for cell in nb.cells:
        lines = cell.source.splitlines()
        for b in make_student.blocks(cell.source) if cell.cell_type == "code" else []:
            leaks += [ln.strip() for ln in lines[b.start + 1:b.end] if len(ln.strip()) >= 12
                      and " ".join(ln.split()) in norm]
    assert not leaks, leaks


def test_tile_steps_say_which_step_is_a_stub_and_wait_for_the_steps_they_call(monkeypatch):
    source = _tiles_source(REPO / "notebooks" / "09_per_layer_tuning.ipynb")  # every step still the stub
    assert all(stages.STUB_MARK in tile_steps.function_body(source, n) for _, n in tile_steps.STEPS)
    monkeypatch.setattr(tile_steps, "unavailable", lambda requires: "")
    ran = []

    def fake_run(label, fn, src, rng):
        ran.append(label)
        assert stages.STUB_MARK not in src  # the other steps' stubs must not stop this one from compiling
        return CheckResult(label, "add_channel" not in label, detail="first wrong element")

    monkeypatch.setattr(tile_steps, "_run", fake_run)
    results = tile_steps.check(source, quiet=True)
    assert [r.passed for r in results] == [False] * 5
    assert all("not implemented yet" in r.detail for r in results) and not ran
    done = source
    for name in ("load_window", "add_channel", "stage_weights", "sum_channels"):  # written: the stub replaced
        body = tile_steps.function_body(done, name)
        done = done.replace(body, "\n    /* written */\n")
    results = {r.name: r for r in tile_steps.check(done, quiet=True)}
    assert results["step a, load_window"].passed and not results["step b, add_channel"].passed
    assert "whose check does not pass yet" in results["step c, sum_channels"].detail
    assert "TODO stub" in results["step d, store_tile"].detail
    assert ran == ["step a, load_window", "step b, add_channel", "step c, stage_weights"]


def test_tile_steps_skip_in_one_line_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(tile_steps, "unavailable", lambda requires: "needs a real GPU with cupy")
    results = tile_steps.check("whatever")
    assert capsys.readouterr().out == "register-tile steps a-d: SKIPPED (needs a real GPU with cupy)\n"
    assert len(results) == len(tile_steps.STEPS) and not any(results)


needs_cuda_c = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))),
                                  reason=f"CUDA C steps cannot run here: {stages.unavailable(('cuda_c',))}")

#: one mistake per step, each a plausible student error; the step's check must FAIL on it
BROKEN = {
    "load_window": ("s >= 0", "s > 0"),  # off by one at the left edge: column 0 read as padding
    "add_channel": ("acc[mv * VEC + e][i][j] += ", "acc[mv * VEC + e][i][j] = "),  # replaces instead of adding
    "stage_weights": ("w[(m0 + i % MG)", "w[(i % MG)"),  # every block stages the first group's weights
    "sum_channels": ("if (c + 1 < C) load_window", "if (c + 2 < C) load_window"),  # the last channel never loads
    "store_tile": ("if (row < HO && col < WO) ", ""),  # no guard: the overhanging tile stores outside the map
}


@needs_cuda_c
def test_the_solutions_register_tile_steps_pass_on_a_gpu():
    results = tile_steps.check(_tiles_source(REPO / "solutions" / "09_per_layer_tuning.ipynb"), quiet=True)
    assert all(results), [str(r) for r in results]


@needs_cuda_c
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_register_tile_step_fails_its_own_check(name):
    source = _tiles_source(REPO / "solutions" / "09_per_layer_tuning.ipynb")
    old, new = BROKEN[name]
    body = tile_steps.function_body(source, name)
    assert old in body
    results = {r.name.split(", ")[1]: r for r in tile_steps.check(source.replace(body, body.replace(old, new)),
                                                                  quiet=True)}
    assert not results[name].passed, str(results[name])
    earlier = [n for _, n in tile_steps.STEPS][:[n for _, n in tile_steps.STEPS].index(name)]
    assert all(results[n].passed for n in earlier)
