"""What a release holds (docs/releases.md, "What a release holds"): no code that answers a task of its milestone or a
later one, none of the maintainers' machinery, and everything its notebooks use. Every milestone, 00 to 10, builds
with nothing found; the search for answers' shapes flags the kit's own answer code and the solutions' answers, and
none of the code students are meant to have; an untouched notebook of a release plots the committed GPU results."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from labkit import answer_shapes, leave_out, measured, nbcells, release, stages, tasks
from labkit.cli import main

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / "labkit"


def _kit_files() -> list[Path]:
    """The kit's files as a release copies them (git's, less caches), relative to labkit/."""
    listed = subprocess.run(["git", "ls-files", "-z", "labkit"], cwd=REPO, capture_output=True, text=True).stdout
    files = [Path(n).relative_to("labkit") for n in listed.split("\0") if n] or \
        [p.relative_to(KIT) for p in KIT.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(f for f in files if (KIT / f).is_file() and f.suffix != ".pyc")


def _kit_module(name: str) -> Path:
    """The one file of the kit that is module ``name``, wherever under labkit/ it lives."""
    found = [KIT / f for f in _kit_files() if f.name == f"{name}.py"]
    assert len(found) == 1, (name, found)
    return found[0]


def _shapes(path: Path) -> list[str]:
    return sorted({f.shape.name for f in answer_shapes.find(path.read_text())})


# ------------------------------------------------------------------------------------------------ the rule


def test_each_name_left_out_is_one_module_package_or_file_of_the_kit():
    """Keyed by name, so that a module moved into a subpackage stays left out; a name that no longer names anything
    (renamed, removed) would leave its code in every release, so it fails here."""
    files = _kit_files()
    for item in leave_out.LEAVE_OUT:
        held = {f.parts[: f.parts.index(item.name) + 1] if item.name in f.parts[:-1] else f.parts
                for f in files if leave_out.kit_name(f) == item.name}
        assert len(held) == 1, f"LEAVE_OUT names {item.name!r}: {len(held)} modules, packages or files of labkit/ " \
                               f"({sorted(held)})"
        assert item.concern in ("answers", "machinery") and item.why
        assert item.stage is None if item.concern == "machinery" else item.stage in stages.STAGES


def test_a_module_moved_into_a_subpackage_is_still_left_out():
    for rel, milestone, name in (("gemm.py", "10", "gemm"), ("kernels/gemm.py", "10", "gemm"),
                                 ("measure/bench.py", "10", "bench"), ("grading/run.py", "10", "grading"),
                                 ("course/release.py", "00", "release"), ("rubric.toml", "05", "rubric.toml"),
                                 ("launch/tensor_cores.py", "09", "tensor_cores")):
        assert leave_out.kit_left_out(rel, milestone).name == name, rel
    assert leave_out.kit_left_out("launch/tensor_cores.py", "10") is None  # stage 09's deadline has passed
    assert leave_out.kit_left_out("whole.py", "05") is None and leave_out.kit_left_out("whole.py", "04").name == "whole"
    for rel in ("given.py", "kernels.py", "graphs.py", "course/notebook.py", "weights/cifar10.npz"):
        assert leave_out.kit_left_out(rel, "00") is None, rel


# ---------------------------------------------------------------------------------------------- the shapes


def test_the_shapes_flag_the_kits_answer_code():
    """labkit/gemm.py (split-K in numba), labkit/gemm_cuda.py (split-K in CUDA C), labkit/bench_whole.py and
    labkit/job_graphs.py (the forward pass captured in a CUDA graph and replayed) share no line with the solutions,
    and are found anyway."""
    assert _shapes(_kit_module("gemm")) == ["split-K"]
    assert _shapes(_kit_module("gemm_cuda")) == ["split-K"]
    assert _shapes(_kit_module("bench_whole")) == ["graph"]
    assert _shapes(_kit_module("job_graphs")) == ["graph"]  # lk.whole.Job's graphs, apart from labkit/whole.py


def test_the_shapes_flag_the_solutions_answers_and_not_the_student_copies():
    """Stage 10's three tasks, each in the solution's cell and in none of the student copy's: the search reads the
    answer, not the stub and the given code around it."""
    name = stages.STAGES["10"].notebook
    solution = nbformat.read(REPO / "solutions" / name, as_version=4)
    found = {f.shape.name: f.where for c in solution.cells if c.cell_type == "code"
             for f in answer_shapes.find(c.source)}
    assert set(found) == {"split-K", "graph", "streamed"}
    assert "fc_splitk_kernel" in found["split-K"] and "graph_call" in found["graph"]
    assert "classify_streamed" in found["streamed"]
    assert {t.name for t in tasks.of_stage("10")} == {s.task for s in answer_shapes.SHAPES if s.stage == "10"}
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert not [f for c in nb.cells if c.cell_type == "code" for f in answer_shapes.find(c.source)], path.name


def test_the_shapes_flag_none_of_the_code_students_are_meant_to_have():
    """Every module of the kit that some release ships (labkit/course/given.py, the kernels, the launch layer, the
    checks ...), and every stage's given code (the solutions' kernel cells of stages 01 to 09, which milestone 10
    ships as labkit/given/)."""
    shipped = [f for f in _kit_files() if f.suffix == ".py" and leave_out.kit_left_out(f, "10") is None]
    assert len(shipped) > 30 and Path("course/given.py") in shipped and Path("core/graphs.py") in shipped
    flagged = {str(f): _shapes(KIT / f) for f in shipped}
    assert not {f: s for f, s in flagged.items() if s}
    for number, stage in stages.STAGES.items():
        if number >= "10":
            continue
        nb = nbcells.read(stages.solution(number))
        for index, src in nbcells.tagged_cells(nb):
            assert not answer_shapes.find(src), (number, index)


SPLIT_K_ATOMIC = """
@cuda.jit
def partial(a, b, c, chunk):
    i, j = cuda.grid(2)
    part = cuda.blockIdx.z
    first = part * chunk
    total = 0.0
    for k in range(first, min(first + chunk, a.shape[1])):
        total += a[i, k] * b[k, j]
    cuda.atomic.add(c, (i, j), total)
"""

#: blockIdx.z picks the image (stages 05, 07, 08): a plane per z, but no slice of the reduction
Z_IS_THE_IMAGE = """
@cuda.jit
def conv(x, w, out):
    m, n = cuda.blockIdx.y, cuda.blockIdx.z
    acc = 0.0
    for c in range(x.shape[1]):
        acc += x[n, c, 0, 0] * w[m, c, 0, 0]
    out[n, m, 0, 0] = acc
"""

CAPTURED_ONLY = """
def make(fn, lane):
    graph = lk.graphs.capture(fn, lane)
    return graph
"""

CUPY_GRAPH = """
def replayed(stream, fn):
    stream.begin_capture()
    fn()
    exe = stream.end_capture()
    exe.launch(stream)
"""


#: a class that captures in one method and replays in another (lk.whole.Job's graphs did, before labkit/job_graphs.py)
CLASS_GRAPH = """
class Job:
    def _graph(self, lane):
        if lane not in self.held:
            self.held[lane] = lk.graphs.capture(lambda: self.forward(lane), lane)
        return self.held[lane]

    def classes(self, lane):
        return self._graph(lane).replay()
"""


def test_the_shapes_are_structure_not_names():
    """Other names and an atomic reduction are still split-K; blockIdx.z as the image is not; a capture that is
    never replayed is not the graph task; cupy's own capture and launch are."""
    assert [f.shape.name for f in answer_shapes.find(SPLIT_K_ATOMIC)] == ["split-K"]
    assert not answer_shapes.find(Z_IS_THE_IMAGE)
    assert not answer_shapes.find(CAPTURED_ONLY)
    assert [f.shape.name for f in answer_shapes.find(CUPY_GRAPH)] == ["graph"]
    assert [str(f) for f in answer_shapes.find(CLASS_GRAPH)] == ["graph in class Job (line 2)"]
    assert [str(f) for f in answer_shapes.find("g = lk.graphs.capture(f, lane)\ng.replay()\n")] == [
        "graph in the top-level code"]  # a notebook cell's own code
    assert not answer_shapes.find("def broken(:\n")  # a cell that does not parse holds nothing


def test_cuda_c_split_k_needs_the_slice_and_the_per_slice_store():
    source = _kit_module("gemm_cuda").read_text()
    tree = ast.parse(source)
    cuda_c = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and "__global__" in n.value)
    assert answer_shapes.cuda_split_k(cuda_c) == ["fc_cuda_tiles"]
    no_slice = cuda_c.replace("const int start = blockIdx.z * span", "const int start = 0 * span")
    assert answer_shapes.cuda_split_k(no_slice.replace("(size_t)blockIdx.z * N * OUT", "0")) == []


# ------------------------------------------------------------------------------------------ every milestone


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """The release of every milestone (a few seconds: files searched once are not searched again)."""
    base = tmp_path_factory.mktemp("releases")
    return {m: (base / m, release.build(m, base / m)) for m in stages.STAGES}


def test_every_milestone_builds_with_nothing_found(releases):
    for milestone, (out, result) in releases.items():
        assert result.clean, result.report()
        assert sorted(result.secrets.lines) == [n for n in stages.STAGES if n >= milestone]
        assert {s.stage for s in answer_shapes.of_stages(milestone)} == ({"10"} if milestone <= "10" else set())
        shipped = {Path(f).relative_to("labkit") for f in release.file_list(out) if f.startswith("labkit/")
                   and not f.startswith("labkit/given/")}
        want = {f for f in _kit_files() if leave_out.kit_left_out(f, milestone) is None}
        assert shipped == want, (milestone, sorted(shipped ^ want))


def test_each_release_leaves_out_what_answers_its_tasks_and_ships_what_later_ones_need(releases):
    files = {m: set(release.file_list(out)) for m, (out, _) in releases.items()}
    for milestone in stages.STAGES:
        held = files[milestone]
        assert "labkit/course/given.py" in held and "labkit/ops/kernels.py" in held and "labkit/core/graphs.py" in held
        assert not [f for f in held if f.startswith("labkit/grading/") or f.endswith(("/bench.py", "/release.py"))]
        assert not [f for f in held if f.endswith(("/bench_baselines.py", "/bench_files.py", "/bench_table.py",
                                                   "/leak_search.py"))]
        assert not [f for f in held if f.endswith(("/gemm.py", "/gemm_cuda.py", "/fc_tensor_cores.py",
                                                   "/bench_whole.py"))]
        assert ("labkit/ops/tensor_cores.py" in held) == (milestone == "10")  # notebook 10's variants use it
        assert ("labkit/ops/tensor_cores_source.py" in held) == (milestone == "10")  # and its CUDA C with it
        assert ("labkit/ops/mma_source.py" in held) == (milestone == "10")  # and the MMA that both are built on
        assert ("labkit/core/whole.py" in held) == (milestone >= "05")


def test_a_release_refuses_answer_code_left_out_code_and_uses_of_it(releases, tmp_path):
    """Planted into a built release: the kit's split-K fc under another name (its shape), the bench moved into a
    subpackage (by name), a notebook calling lk.gemm and a module importing the bench when imported; an import
    inside a function (as labkit.cli's ``labkit bench``) is not a use."""
    out, result = releases["05"]
    planted = {out / "labkit" / "fast_fc.py": _kit_module("gemm").read_text(),
               out / "labkit" / "measure" / "bench.py": "X = 1\n",
               out / "labkit" / "uses_bench.py": "from . import bench\n\ndef later():\n    from . import grading\n"}
    nb_path = out / "notebooks" / "02_kernels_vs_parallel.ipynb"
    nb_text = nb_path.read_text()
    nb = json.loads(nb_text)
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "planted", "metadata": {}, "outputs": [],
                        "source": "%matplotlib inline\nfc = lk.gemm.fc_tiles\n"})
    try:
        for path, text in planted.items():
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
        nb_path.write_text(json.dumps(nb))
        found = release.verify(out, "05", found=result.secrets)
    finally:
        for path in planted:
            path.unlink()
        (out / "labkit" / "measure").rmdir()
        nb_path.write_text(nb_text)
    assert not found.clean and not found.hits
    assert [(f, stage) for f, stage, _ in found.shapes] == [("labkit/fast_fc.py", "10")]
    assert [(f, item.name) for f, item in found.kept] == [("labkit/measure/bench.py", "bench")]
    assert [(f, what.split(",")[0]) for f, what in found.missing] == [
        ("labkit/uses_bench.py", "line 1: bench"), ("notebooks/02_kernels_vs_parallel.ipynb", "cell %d: line 2: gemm"
                                                    % (len(nb["cells"]) - 1))]
    report = found.report()
    assert "found: 1 answer shape(s)" in report and "labkit/fast_fc.py: stage 10: split-K in function" in report
    assert release.verify(out, "05", found=result.secrets).clean  # the plants gone, nothing found again


def test_verify_searches_a_release_again(releases):
    """``labkit release --verify`` of a release (a clone, an unzipped copy): found nothing; with the kit's gemm.py
    copied back in, exit 1 naming it twice, as an answer's shape and as a file a release leaves out."""
    out, _ = releases["10"]
    got = CliRunner().invoke(main, ["release", "--verify", str(out)])
    assert got.exit_code == 0 and got.output.strip().endswith("found: nothing"), got.output
    assert "stage 10: " in got.output and "split-K (stage 10: " in got.output
    assert "answers gemm, gemm_cuda, fc_tensor_cores, job_graphs;" in got.output
    back = out / "labkit" / "gemm.py"
    back.write_text(_kit_module("gemm").read_text())
    try:
        got = CliRunner().invoke(main, ["release", "--verify", str(out)])
    finally:
        back.unlink()
    assert got.exit_code == 1, got.output
    assert "labkit/gemm.py: stage 10: split-K in function fc_register_tiles" in got.output
    assert "labkit/gemm.py: answers: fc as register tiles split over K" in got.output


_FRESH = textwrap.dedent("""
    import sys
    # the kit may also be installed (pip install -e): its finder would find a module the release left out
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
    import json
    import matplotlib
    matplotlib.use("Agg")
    report = {}
    for folder, stages_ in json.loads(sys.argv[1]):
        for name in [m for m in sys.modules if m == "labkit" or m.startswith("labkit.")]:
            del sys.modules[name]
        sys.path.insert(0, folder)
        import labkit as lk
        row = {"file": lk.__file__, "late": {}, "ladders": {}}
        for name in lk.LATE:
            try:
                row["late"][name] = getattr(lk, name).__file__
            except AttributeError as exc:
                row["late"][name] = str(exc)
        for stage in stages_:
            row["ladders"][stage] = type(lk.notebook.ladder(stage, runs={})).__name__
        if not row["late"]["whole"].startswith("labkit.whole is not"):
            row["job_graphs"] = lk.whole._job_graphs() is not None  # lk.whole.Job launches every time
        from click.testing import CliRunner
        from labkit import cli  # labkit lab, labkit data: the commands a student runs

        got = CliRunner().invoke(cli.main, ["release", folder + "/elsewhere", "--upto", "05"])
        row["cli"] = [got.exit_code, got.output.strip()]
        report[folder] = row
        sys.path.remove(folder)
    print(json.dumps(report))
""")


def test_each_release_imports_and_its_untouched_notebooks_plot_the_committed_results(releases):
    """In one fresh process, each release first on the path and nothing else of the kit to be found: ``import
    labkit`` works, a left-out module is one line (``lk.gemm``, ``labkit release``), and every ladder its notebooks
    draw has the committed GPU results to draw (an untouched notebook has no runs of its own)."""
    draws = re.compile(r"lk\.notebook\.ladder(_and_roofline)?\(")
    ladders = {m: [n for n in stages.STAGES if n <= m and draws.search(
                   (REPO / "notebooks" / stages.STAGES[n].notebook).read_text())] for m in stages.STAGES}
    assert ladders["10"] == ["02", "04", "05", "06", "07", "08", "09"]
    # the committed results are the same in every release: milestone 10's draws every ladder there is
    wanted = [(str(releases[m][0]), ladders[m] if m == "10" else []) for m in ("00", "04", "05", "09", "10")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LABKIT_SOLUTIONS")}
    env.update(NUMBA_ENABLE_CUDASIM="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-c", _FRESH, json.dumps(wanted)], cwd=releases["00"][0], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to plot" not in proc.stdout
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for folder, _ in wanted:
        row, milestone = report[folder], Path(folder).name
        assert Path(row["file"]).resolve().is_relative_to(Path(folder).resolve())
        for name, got in row["late"].items():
            if leave_out.kit_left_out(f"{name}.py", milestone):
                assert got.startswith(f"labkit.{name} is not in this release of the kit"), (milestone, got)
            else:
                assert Path(got).resolve().is_relative_to(Path(folder).resolve()), (milestone, name, got)
        assert set(row["ladders"].values()) <= {"Figure"}, (milestone, row["ladders"])
        assert row.get("job_graphs") is (False if milestone >= "05" else None), (milestone, row)
        assert row["cli"] == [1, "Error: labkit.release is not in this copy of the kit: a student release leaves out "
                                 "the maintainers' tools (docs/releases.md)"], row["cli"]


# --------------------------------------------------------------------------------- notebook 10 and the kit


def test_notebook_10_compares_with_the_kits_fc_from_the_committed_results():
    """The student copy names no left-out module; the kit's fc kernels' rows come from the committed timings;
    the kit's own variants stay in the solution (for the bench) in a kit-only cell, which the grader does not
    grade."""
    name = stages.STAGES["10"].notebook
    student = nbformat.read(REPO / "notebooks" / name, as_version=4)
    code = "\n".join(c.source for c in student.cells if c.cell_type == "code")
    assert "lk.measured.fc_times()" in code and "lk.gemm" not in code and "whole_fashion_tiles" not in code
    assert "\nfig if yours else print(" in code  # an untouched notebook (nothing of the student's timed): no plot
    solution = nbformat.read(REPO / "solutions" / name, as_version=4)
    kit_only = [c for c in solution.cells if nbcells.KIT_ONLY_TAG in c.metadata.get("tags", [])]
    assert len(kit_only) == 1 and "whole_fashion_tiles" in kit_only[0].source and "lk.gemm." in kit_only[0].source
    times = measured.fc_times()
    assert times is not None and times.device.startswith("NVIDIA")
    assert 0 < times.seconds("tc", 10000) < times.seconds("cuda", 10000) < times.seconds("tiles", 10000)
    from labkit import fc_tensor_cores, gemm_cuda  # the committed rows are the kits' default configurations

    assert measured.FC_KERNELS["cuda"][0].endswith(f"[{gemm_cuda.DEFAULT}:")
    assert measured.FC_KERNELS["tc"][0].endswith(f"[{fc_tensor_cores.DEFAULT}:")
    rubric = (KIT / "rubric.toml").read_text().split('[stage."10"]')[1]
    graded = ast.literal_eval(rubric.split("\nvariants = ")[1].splitlines()[0])
    assert graded and all(f'"{v}": lk.Variant(' in code for v in graded)
