"""lk.show: the accesses it records, the figures of the tasks (their access patterns against the committed digests),
"yours vs the spec" for a wrong kernel and the FAIL line that points to it, the child process a GPU machine uses, and
the tool's --insert. Recordings run on the simulator on small launches (a second or a few each)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import labkit as lk  # noqa: E402
from labkit import access, nbcells  # noqa: E402
from labkit.lessons import chosen_threads  # noqa: E402

import tool_modules  # noqa: E402  (tests/ is on the path)

REPO = Path(__file__).resolve().parent.parent
# every test records on the simulator in this process, but the last, which records in a child process as a GPU
# machine does (LABKIT_TEST_GPU=1 runs it on the GPU; here the simulator is told it is not there)
simulated = pytest.mark.skipif(not lk.simulator.active(), reason="recording in this process needs the simulator")
s04 = lk.from_stage("04")  # given code, as a notebook binds it: lk.show finds it by this name from a child process


def _tool():
    """tools/draw_access_figures.py as a module (tools/ is not a package)."""
    return tool_modules.load("draw_access_figures")


TOOL = _tool()
SCENES = {s.name: s for s in TOOL.SCENES}


@pytest.fixture(scope="module")
def tiled05():
    """Stage 05's solution, 8x8 tiles, on a 12x12 image of 2 channels and one map: 2x2 tiles, 4 blocks."""
    fn = lk.from_stage("05").conv_tiled_8
    return access.record_here(fn, access.small_case(channels=2, maps=1, size=(12, 12), seed=3))


@simulated
def test_recording_has_roles_epochs_and_the_windows_of_the_tiled_kernel(tiled05):
    launch = tiled05.launch()
    assert launch.kernel == "conv_tiled_kernel" and launch.grid == (4, 1, 1) and launch.block == (8, 8, 1)
    roles = {n: (a["kind"], a["role"]) for n, a in launch.arrays.items()}
    assert roles == {"x": ("global", "input"), "w": ("global", "weights"), "b": ("global", "bias"),
                     "out": ("global", "output"), "tile": ("shared", "input"), "wts": ("shared", "weights")}
    rows, names = launch.rows, launch.names
    # two channels, two barriers each: epochs 0..4, the output written in the last
    assert sorted(set(rows[:, 8].tolist())) == [0, 1, 2, 3, 4]
    out = rows[rows[:, 0] == names.index("out")]
    assert (out[:, 9] == 1).all() and (out[:, 8] == 4).all()
    assert sorted(out[:, 1].tolist()) == list(range(12 * 12)), "every output element written once"
    # thread (tx 1, ty 2) of block 3 (the bottom-right tile) reads tile[2..6, 1..5] in epochs 1 and 3
    mask, _, who = chosen_threads.select(launch, 3, (1, 2))
    assert who == "thread (1, 2) of block 3"
    mine = rows[mask]
    tile = mine[(mine[:, 0] == names.index("tile")) & (mine[:, 9] == 0)]
    want = sorted(r * 12 + c for r in range(2, 7) for c in range(1, 6))
    for epoch in (1, 3):
        assert sorted(tile[tile[:, 8] == epoch, 1].tolist()) == want
    assert not len(tile[np.isin(tile[:, 8], [0, 2, 4])]), "no shared read before the barrier"
    # its block loads the x patch of rows and columns 6..17 (12.. are past the image: zeros, no load), channel 0
    # before the first barrier, channel 1 after the second
    blk = rows[(rows[:, 2] == 3) & (rows[:, 0] == names.index("x"))]
    patch = sorted(r * 12 + c for r in range(6, 12) for c in range(6, 12))
    assert sorted(set(blk[blk[:, 8] == 0, 1].tolist())) == patch
    assert sorted(set(blk[blk[:, 8] == 2, 1].tolist())) == [144 + f for f in patch]
    counts = chosen_threads.per_thread_counts(launch, mask)
    assert counts["shared load"] == 2 * 2 * 25 and counts["global store"] == 1
    assert access.first_wrong(tiled05) is None
    assert access.writer(tiled05, launch, (0, 0, 9, 10)) == ((3, 0, 0), (2, 1, 0))


@simulated
def test_warp_addresses_tell_uniform_from_divergent_constant_reads():
    s06 = lk.from_stage("06")
    case = access.small_case(maps=4, seed=1)
    uniform = access.record_here(s06.conv_const_uniform, case).launch("conv_const_kernel")
    divergent = access.record_here(s06.conv_const_divergent, case).launch("conv_const_kernel")
    for launch, want in ((uniform, 1), (divergent, 4)):
        mask, _, _ = chosen_threads.select(launch, 0, warp=0)
        assert chosen_threads.warp_addresses(launch, mask) == want
        assert launch.arrays["wc"] == {"kind": "constant", "shape": [4, 2, 5, 5], "role": "weights"}


@simulated
@pytest.mark.parametrize("name", list(SCENES))
def test_each_figure_matches_its_solutions_access_pattern(name):
    """The committed digest beside each figure is what the solution does now: a solution whose access pattern
    changed needs its figure redrawn (python tools/draw_access_figures.py NAME)."""
    assert (REPO / "notebooks" / "figures" / f"{name}.png").is_file()
    reason = TOOL.stale_reason(SCENES[name])
    assert reason == "", reason


@simulated
def test_a_changed_access_pattern_is_caught():
    wrong = TOOL.wrong_namespace("05")
    scene = replace(SCENES["05_task2"], fn=lambda _: wrong["conv_tiled"](4))
    assert "access pattern changed" in TOOL.stale_reason(scene)
    stored = json.loads((REPO / "notebooks" / "figures" / "05_task2.json").read_text())
    now = json.loads(json.dumps(TOOL.digest(scene, TOOL.record(scene))))
    assert now["launches"][0]["sha256"] != stored["launches"][0]["sha256"]


@simulated
def test_a_wrong_kernel_fails_with_a_hint_and_the_hint_draws_yours_vs_the_spec(capsys):
    variants = TOOL.wrong_namespace("05")["VARIANTS"]
    only_conv = lk.Variant({"conv1": variants["tiled_8"].impls["conv"]}, arrays="device", nets=("cifar10",),
                           name="tiled_8", stage="05")
    lk.notebook.check({"tiled_8": only_conv}, "cifar10")  # what the student's check cell runs
    out = capsys.readouterr().out
    assert "conv1: FAIL (" in out and "first wrong element" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("conv1: FAIL ("))
    assert TOOL.HINT.search(line).group(0) == "lk.show.failure(VARIANTS['tiled_8'], 'cifar10', 'conv1')", line
    fig = eval(TOOL.HINT.search(line).group(0), {"lk": lk, "VARIANTS": variants})  # the call the line asks for
    words = " ".join(t.get_text() for t in fig.texts)
    assert "yours: thread" in words and "the spec: thread" in words
    assert "first wrong element out[0, 0, 0, 0]" in words
    # the slip loads the patch one row low: thread 0 loads patch elements 0, 64, 128 (tile rows 0, 5, 10, column 4),
    # of which only row 5 - pad = 3 lies in the image for the spec, and row 4 with the slip, in both channels
    assert "yours reads x[0, 0, 4, 2], x[0, 1, 4, 2], which the spec's does not" in words, words
    assert "the spec's reads x[0, 0, 3, 2], x[0, 1, 3, 2], which yours does not" in words, words


@simulated
def test_the_right_kernel_has_no_failure_to_draw(capsys):
    s05 = lk.from_stage("05")
    assert lk.show.failure(s05.conv_tiled_8, "cifar10", "conv1", stage="05") is None
    assert "every element right" in capsys.readouterr().out


@simulated
def test_show_draws_a_figure_with_a_count_table_and_refuses_what_it_cannot_record():
    s04 = lk.from_stage("04")
    fig = lk.show(s04.conv_padded, kernel="conv_padded_kernel", budget={"global load": 101})
    words = " ".join(t.get_text() for t in fig.texts)
    assert "conv_padded_kernel" in words and "thread" in words
    table = [a for a in fig.axes if a.tables][0].tables[0]
    cells = {(r, c): cell.get_text().get_text() for (r, c), cell in table.get_celld().items()}
    assert cells[(0, 0)] == "per thread" and "global load" in cells.values() and cells[(1, 1)] == "101"
    with pytest.raises(ValueError, match="launched no kernel named 'nope'"):
        lk.show(s04.conv_padded, kernel="nope")
    cpu = lk.from_stage("02").VARIANTS["cpu_prange_n"]
    with pytest.raises(ValueError, match="CPU code"):
        lk.show(cpu)
    with pytest.raises(ValueError, match="draws conv layers"):
        lk.show(s04.conv_padded, layer="fc")



@simulated
def test_a_block_thread_warp_or_element_out_of_range_names_the_valid_range(tiled05):
    """Asked for what the launch does not have, lk.show says what it has (it failed with numpy's words before:
    ``min() arg is an empty sequence``)."""
    with pytest.raises(ValueError, match=r"^block \(5, 5\) is outside the launch's grid \(\d+, \d+, 1\): give 0\.\."):
        lk.show(lk.from_stage("05").conv_tiled_8, block=(5, 5))
    launch = tiled05.launch()  # grid (4, 1, 1), block (8, 8, 1), output 1 x 1 x 12 x 12
    for kwargs, says in ((dict(block=4), "block 4 is outside the launch's grid (4, 1, 1): give 0..3, or (x, y, z) "
                                         "with x < 4, y < 1, z < 1"),
                         (dict(block=1, thread=(8, 0)), "thread (8, 0) is outside the launch's block (8, 8, 1): give "
                                                        "0..63"),
                         (dict(thread=64), "thread 64 is outside the launch's block (8, 8, 1)"),
                         (dict(warp=2), "warp 2 is outside the block: its 64 threads make warps 0..1")):
        with pytest.raises(ValueError) as got:
            access.selection(tiled05, launch, **kwargs)
        assert str(got.value).startswith(says), (kwargs, str(got.value))
    for element in ((0, 0, 12, 0), (1, 0, 0, 0), (0, 0, 0), (0, 0, -1, 0)):
        with pytest.raises(ValueError, match=r"is outside this case's output, of shape \(1, 1, 12, 12\): give "
                                             r"\(n, m, i, j\) with 0 <= n < 1, 0 <= m < 1, 0 <= i < 12, 0 <= j < 12"):
            access.element_or_middle(tiled05, element)
    assert access.selection(tiled05, launch, block=3, thread=(7, 7), warp=None) == (3, (7, 7), None)
    assert access.element_or_middle(tiled05, (0, 0, 11, 11)) == (0, 0, 11, 11)

@simulated
def test_the_child_process_records_what_this_process_records(tiled05):
    """On a GPU machine lk.show records in a child under the simulator: same accesses as here."""
    case = {"net": "cifar10", "layer": "conv2", "fuse": (), "channels": 2, "maps": 2, "size": (8, 8), "images": 1,
            "seed": 3}
    job = {"notebook": str(REPO / "solutions" / "05_shared_memory.ipynb"), "function": "conv_tiled_16",
           "case": case, "arrays": "device", "name": "conv_tiled_16"}
    there = access._in_child(job).launch()
    here = access.record_here(lk.from_stage("05").conv_tiled_16, access.small_case(**case)).launch()

    def key(launch):
        return launch.arrays, launch.rows[np.lexsort(launch.rows.T[::-1])].tolist()

    assert there.kernel == here.kernel and key(there) == key(here)


def test_insert_puts_each_reference_in_its_task_spec_once(tmp_path):
    import nbformat

    folder = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions", folder, symlinks=True)
    for path in folder.glob("*.ipynb"):  # the shipped notebooks hold the references: take them out first
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = re.sub(r"\n*!\[[^\]]*\]\(figures/[^)]*\)", "", cell.source)
        nbformat.write(nb, path)
        source = nbcells.source_of(path)  # and from its paired source, the same lines as its markdown comments
        if source.is_file():
            source.write_text(re.sub(r"(\n#)*\n# !\[[^\]]*\]\(figures/[^)]*\)", "", source.read_text()))
            assert not nbcells.out_of_step(path), nbcells.out_of_step(path)
    changed = TOOL.insert(folder)
    assert changed, "the first --insert changes the notebooks"
    assert TOOL.insert(folder) == [], "a second --insert changes nothing"
    for scene in TOOL.SCENES:
        nb = nbformat.read(folder / lk.STAGES[scene.stage].notebook, as_version=4)
        holding = [c for c in nb.cells if f"(figures/{scene.name}.png)" in c.source]
        assert len(holding) == 1 and re.search(rf"## Task ({scene.task}\b|—)", holding[0].source), scene.name
        assert holding[0].source.count(f"(figures/{scene.name}.png)") == 1
        assert not nbcells.out_of_step(folder / lk.STAGES[scene.stage].notebook)  # its source written again too


def test_the_tool_says_what_is_wrong_in_one_line():
    run = subprocess.run([sys.executable, str(REPO / "tools" / "draw_access_figures.py"), "99_task9"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout.strip().startswith("no figure named 99_task9;"), run
    assert "Traceback" not in run.stderr


def test_on_a_gpu_machine_lk_show_records_in_a_child_process(monkeypatch):
    if lk.simulator.active():
        monkeypatch.setattr(lk.simulator, "active", lambda: False)  # what a GPU machine's lk.show sees
    with pytest.raises(ValueError, match="say which stage's notebook holds the function"):
        lk.show(s04.conv_padded, kernel="conv_padded_kernel")
    fig = lk.show(s04.conv_padded, kernel="conv_padded_kernel", stage="04", element=(0, 1, 2, 3))
    words = " ".join(t.get_text() for t in fig.texts)
    assert "conv_padded_kernel" in words and "thread" in words
    cells = [a for a in fig.axes if a.tables][0].tables[0].get_celld()
    assert {cells[(r, 0)].get_text().get_text(): cells[(r, 1)].get_text().get_text() for r in (1, 2)} == {
        "global load": "101", "global store": "1"}, "one window of 2 channels of 5x5, weights and bias: 101 loads"


# ------------------------------------------------------------------------------- lk.show.task: each kind of task


def slipped(stage: str, right: str, wrong: str) -> dict:
    """The kernel cells of stage ``stage``'s solution (its source) with one slip, as a student's notebook binds them."""
    try:
        return TOOL.slipped(stage, right, wrong)
    except ValueError as exc:
        pytest.fail(f"{exc}: update the slip")


def _words(fig) -> str:
    return " ".join(t.get_text() for t in fig.texts) + " " + " ".join(
        a.get_title(loc=loc) for a in fig.axes for loc in ("left", "center"))


def _table(fig) -> dict:
    cells = [a for a in fig.axes if a.tables][0].tables[0].get_celld()
    rows = max(r for r, _ in cells)
    return {cells[(r, 0)].get_text().get_text(): [cells[(r, c)].get_text().get_text() for c in range(1, 3)]
            for r in range(1, rows + 1)}


# (stage, task, the solution's line, the slip, what the figure then says): one per kind of picture
SLIPS = {
    "conv": ("04", "padded", "acc += xp[n, c, i * stride + p, j * stride + q] * w[m, c, p, q]",
             "acc += xp[n, 0, i * stride + p, j * stride + q] * w[m, c, p, q]",
             "the spec's reads xp[0, 1, 3, 3]"),
    "pad": ("04", "pad", "            xp[n, c, r, col] = 0.0", "            pass", "first wrong element"),
    "normalize": ("04", "classify", "out[t] = raw[t] / 255.0 - 0.5", "out[t] = raw[t // 2] / 255.0 - 0.5",
                  "the spec's reads raw[5]"),
    "unroll": ("07", "unroll", "c, p, q = row // (K * K), (row // K) % K, row % K",
               "c, p, q = row // (K * K), row % K, (row // K) % K", "first wrong element"),
    "atomics": ("08", "atomic", "acc = b[m] if c == 0 else float32(0.0)", "acc = b[m]", "first wrong element"),
    "split-K": ("10", "splitk", "k_end = min((z + 1) * kchunk, K)", "k_end = K", "which the spec's does not"),
    "CUDA C": ("06", "const_c", "* Wp + j * stride + q]", "* Wp + j * stride]", "the spec's reads xp[0, 0, 3, 4]"),
}


@simulated
@pytest.mark.parametrize("kind", list(SLIPS))
def test_a_slip_in_a_task_draws_differently_from_the_spec(kind, capsys):
    """lk.show.task on the solution with one slip: the figure says where yours and the spec's part (and the right
    solution draws none of that)."""
    from labkit.course import tasks
    from labkit.lessons import scenes

    stage, task, right, wrong, says = SLIPS[kind]
    ns = slipped(stage, right, wrong)
    show_module = importlib.import_module("labkit.show")  # lk.show is its function
    fig = show_module._task_figure(scenes.of_task(stage, task)[0], tasks.find(stage, task), ns)  # its first picture
    words = _words(fig)
    assert says in words, words
    assert "yours" in words and "the spec" in words


@simulated
def test_the_right_code_draws_as_the_spec():
    fig = lk.show.task("04", "padded", namespace=dict(vars(lk.from_stage("04"))))
    words = _words(fig)
    assert "Your thread reads the same elements as the spec's" in words
    assert "every element right" in words
    assert _table(fig)["global load"] == ["101", "101"]


@simulated
def test_the_pad_slip_leaves_the_border_thread_without_a_store():
    fig = lk.show.task("04", "pad", namespace=slipped("04", "            xp[n, c, r, col] = 0.0", "            pass"))
    assert _table(fig)["global store"] == ["0", "1"], "thread 40 sits in the border: yours writes nothing there"


@simulated
def test_cpu_threads_show_which_thread_writes_what():
    from labkit.lessons import cpu_threads, scenes

    scene = scenes.BY_NAME["02_task1"]
    right = dict(scenes.record(scene, lk.from_stage("02")))
    out = right["conv_prange_n"].arrays["out"]["shape"]
    per_image = np.prod(out[1:])
    for name, owner in (("conv_prange_n", lambda f: f // per_image), ("conv_prange_m", lambda f: (f // np.prod(
            out[2:])) % out[1])):
        rows = right[name].rows
        assert (rows[:, 9] == 1).all() and sorted(rows[:, 1].tolist()) == list(range(int(np.prod(out))))
        assert (rows[:, 2] == owner(rows[:, 1])).all(), name
    wrong = dict(scenes.record(scene, slipped("02", "    for n in prange(N):", "    for n in range(N):")))
    assert set(wrong["conv_prange_n"].rows[:, 2].tolist()) == {0}, "a serial loop: every output on thread 0"
    fig = lk.show.task("02", "prange", namespace=slipped("02", "    for n in prange(N):", "    for n in range(N):"))
    assert "yours: conv_prange_n" in _words(fig) and "the spec: conv_prange_n" in _words(fig)
    # the reduction: the 50 products of one output, in four runs of 13, 13, 13 and 11
    red = dict(scenes.record(scenes.BY_NAME["02_task2"], lk.from_stage("02")))["conv_prange_reduction"]
    reads = cpu_threads.element_reads(red, "out", int(np.ravel_multi_index((0, 0, 3, 3), red.arrays["out"]["shape"])))
    x = reads[reads[:, 0] == red.names.index("w")]
    assert np.bincount(x[:, 2]).tolist() == [13, 13, 13, 11]


@simulated
def test_timelines_show_what_the_code_queues():
    from labkit.lessons import scenes

    managed = scenes.record(scenes.BY_NAME["03_task1"], lk.from_stage("03"))[0][1]
    kinds = [e.kind for e in managed.events]
    assert kinds == ["host write"] * 3 + ["kernel", "sync", "host read"], kinds  # the simulator's own copies: none
    no_sync = slipped("03", "        cuda.synchronize()\n", "")
    fig = lk.show.task("03", "with_managed", namespace=no_sync)
    assert "yours: 1 launch, 3 host writes, 1 host reads of managed memory, 0 synchronizations" in _words(fig)
    one_lane = slipped("10", "lane, last = lanes[i % streams]", "lane, last = lanes[0]")
    fig = lk.show.task("10", "streamed", namespace=one_lane)
    words = _words(fig)
    assert "on 1 stream" in words and "on 2 streams" in words, words
    graph = scenes.record(scenes.BY_NAME["10_task2"], lk.from_stage("10"))[0][1]
    phases = [e.phase for e in graph.events]
    assert "capture" in phases and "replay" in phases and graph.events[-1].kind == "sync"


@simulated
def test_cuda_c_is_recorded_on_the_cpu_emulation_as_numba_is_on_the_simulator():
    """06 task 2's CUDA C and task 1's numba kernel: the same thread reads the same window and weights."""
    from labkit.lessons import cuda_record as c_record

    if c_record.available():
        pytest.skip(c_record.available())
    s06 = lk.from_stage("06")
    case = access.small_case(seed=2)
    c = access.record_here(s06.conv_const_c, case)
    numba = access.record_here(s06.conv_const_uniform, case)
    picked = []
    for rec, kernel in ((c, "conv_const_c"), (numba, "conv_const_kernel")):
        launch = rec.launch(kernel)
        mask, _, _ = chosen_threads.select(launch, *access.selection(rec, launch, (0, 1, 3, 2)))
        rows = launch.rows[mask]
        picked.append({(launch.arrays[launch.names[a]]["kind"], launch.arrays[launch.names[a]]["role"], f, st)
                       for a, f, st in rows[:, [0, 1, 9]].tolist()})  # c_w is numba's wc: by kind and role
        assert access.first_wrong(rec) is None
    assert picked[0] == picked[1] and len(picked[0]) == 1 + 50 + 50 + 1


def test_every_gpu_task_ends_with_its_picture_before_the_check():
    """Every task of stages 02-10 with GPU work of its own (and 02's prange tasks) has a scene, and its notebook a
    ``lk.show.task`` cell after the task's code and before the self-check, in the solution and the student copy."""
    import nbformat

    from labkit.course import tasks
    from labkit.lessons import scenes

    for stage in [f"{n:02d}" for n in range(2, 11)]:
        for path in (REPO / "solutions" / lk.STAGES[stage].notebook, REPO / "notebooks" / lk.STAGES[stage].notebook):
            nb = nbformat.read(path, as_version=4)
            cells = [c.source if c.cell_type == "code" else "" for c in nb.cells]
            check = next(i for i, src in enumerate(cells) if src.startswith("# NBVAL_CHECK_OUTPUT")
                         and "check(" in src)
            for task in tasks.of_stage(stage):
                if task.check == "notebook" and task.name != "classify":
                    continue  # a prediction: nothing runs on the GPU
                assert scenes.of_task(stage, task.name), (stage, task.name)
                call = f'lk.show.task("{stage}", "{task.name}")'
                at = [i for i, src in enumerate(cells) if call in src]
                defined = next(i for i, src in enumerate(cells) if re.search(rf"\b{task.function}\(", src))
                assert len(at) == 1 and defined < at[0] < check, (path.name, task.name)


def test_a_stub_gives_one_line(capsys):
    """The student copies: every task cell prints one line, and nothing is drawn."""
    from labkit.lessons import scenes

    shown = 0
    for stage in ("03", "04", "09", "10"):
        ns = nbcells.load(REPO / "notebooks" / lk.STAGES[stage].notebook)
        for scene in {s.task_name: s for s in scenes.SCENES if s.stage == stage}.values():
            assert lk.show.task(stage, scene.task_name, namespace=ns) is None
            lines = capsys.readouterr().out.strip().splitlines()
            assert len(lines) == len(scenes.of_task(stage, scene.task_name)) and all(
                "is still the TODO stub" in ln for ln in lines), lines
            shown += 1
    assert shown >= 8


def test_on_a_gpu_machine_a_task_is_recorded_in_a_child_process(monkeypatch, capsys):
    """lk.show.task where numba has a GPU: the access scenes record in a child under the simulator, on the notebook
    as last saved in Jupyter's folder (here the student copy: its stub is one line), else on the kit's solution."""
    if lk.simulator.active():
        monkeypatch.setattr(lk.simulator, "active", lambda: False)  # what a GPU machine's lk.show sees
    fig = lk.show.task("04", "padded", namespace=dict(vars(lk.from_stage("04"))))
    words = _words(fig)
    assert "Your thread reads the same elements as the spec's" in words and "every element right" in words
    monkeypatch.chdir(REPO / "notebooks")
    assert lk.show.task("04", "pad", namespace={}) is None
    monkeypatch.chdir(REPO)  # no notebook here: the child would record the kit's solution, so a stub says so first
    stub = nbcells.load(REPO / "notebooks" / lk.STAGES["04"].notebook)
    assert lk.show.task("04", "pad", namespace=stub) is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("pad_kernel is still the TODO stub" in ln for ln in lines), lines
