"""The main job and the other commands, as a person runs them."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from labkit import data
from labkit.cli import main

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


def run(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_cifar_report_has_every_layer_and_an_accuracy(cifar_root):
    code, out = run("run", "--net", "cifar10", "--images", "40")
    assert code == 0, out
    assert "CNN for 40 images" in out and re.search(r"Net Forward total time:\d+\.\d{6} seconds", out)
    for layer in ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3", "fc", "softmax"]:
        assert re.search(rf"    Time for {layer}: \d+\.\d{{6}} seconds", out), layer
    for kind in ["Conv", "ReLU", "Pool", "FC", "Softmax"]:
        assert re.search(rf"  {kind}:\s+\d+\.\d{{6}} seconds", out), kind
    assert re.search(r"Net Accuracy: \d+\.\d\d %", out)


def test_fashion_report_has_two_op_times_and_correctness(fashion_root):
    code, out = run("run", "--net", "fashion", "--images", "100")
    assert code == 0, out
    assert len(re.findall(r"^Op Time: \d+\.\d{6}$", out, re.M)) == 2
    assert re.search(r"^Correctness: 0\.\d{4} Model: fashion$", out, re.M)


def test_c_study_weights_through_the_cli(c_study_weights, cifar_root):
    code, out = run("run", "--net", "cifar10", "--images", "200", "--weights", str(c_study_weights))
    acc = float(re.search(r"Net Accuracy: (\d+\.\d\d) %", out).group(1))
    assert code == 0 and acc > 50, out


def test_no_data_offline_runs_on_labelled_synthetic_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    monkeypatch.setattr(data, "REPO_DATA", tmp_path / "repo-data")
    monkeypatch.setattr(data, "user_cache", lambda: tmp_path / "cache")
    code, out = run("run", "--net", "cifar10", "--images", "3", "--no-download")
    assert code == 0, out
    assert "SYNTHETIC" in out and "labkit data fetch cifar10" in out and "Net Accuracy: n/a" in out


def test_bad_weights_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "w.npz"
    np.savez(bad, **{"conv1.weight": np.zeros((3, 3, 5, 5), np.float32)})
    result = CliRunner().invoke(main, ["run", "--net", "cifar10", "--images", "2", "--weights", str(bad),
                                       "--synthetic"])
    assert result.exit_code != 0 and "do not fit network 'cifar10'" in result.output


def test_info_and_data_where():
    from labkit import device

    code, out = run("info")
    assert code == 0 and "data cifar10" in out
    assert ("mode:        real GPU" if device.is_gpu() else "simulator") in out
    code, out = run("data", "where")
    assert code == 0 and ("$LABKIT_DATA" in out or "repository data/" in out)


def test_info_names_the_ece408_model_and_a_labkit_data_that_is_a_file(tmp_path, monkeypatch):
    """The model the kit does not ship: where it was found, or where to get it; a LABKIT_DATA naming a file is said
    (the data lines alone only said "not found")."""
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    model = tmp_path / "ece408-model" / "ece408-sp19-0002.params"
    model.parent.mkdir()
    model.write_bytes(b"\x12\x01")
    code, out = run("info")
    assert code == 0 and f"model ece408: {model}" in out, out
    model.unlink()
    monkeypatch.setattr("labkit.weights_io.course_weights", lambda net: None)  # nor in data/ or the user cache
    code, out = run("info")
    assert "model ece408: not found; labkit ships no weights for ece408" in out and "ece408_mxnet_docker" in out, out
    monkeypatch.setenv("LABKIT_DATA", str(model.parent / "notes.txt"))
    (model.parent / "notes.txt").write_text("mine\n")
    code, out = run("info")
    assert code == 0 and f"data: LABKIT_DATA={model.parent / 'notes.txt'} is a file, not a folder: point it" in out


def test_record_writes_a_ledger(tmp_path, cifar_root):
    ledger = tmp_path / "ledger.jsonl"
    code, out = run("run", "--net", "cifar10", "--images", "5", "--record", str(ledger))
    assert code == 0 and ledger.read_text().count("\n") >= 11


def test_bench_refuses_bad_arguments_in_one_line(tmp_path):
    for args, says in ((["--images", "0"], "at least 1"), (["--images", "-5"], "at least 1"),
                       (["--images", "3,x"], "whole numbers"), (["--stages", "99"], "no stage 99"),
                       (["--stages", "00"], "no notebook with VARIANTS"), (["--nets", "imagenet"], "unknown network"),
                       (["--images", "999999999"], "more than half of this machine")):
        result = CliRunner().invoke(main, ["bench", *args, "--out", str(tmp_path)])
        assert result.exit_code != 0, args
        assert says in result.output and "Traceback" not in result.output, (args, result.output)
    assert not (tmp_path / "bench.json").exists()  # nothing ran


def test_run_refuses_an_image_count_that_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    code, out = run("run", "--images", "999999999", "--no-download")
    assert code != 0 and "ask for fewer" in out and "MemoryError" not in out


def test_a_truncated_weights_file_is_one_line(tmp_path):
    from labkit import weights_io

    good = weights_io.save_weights(tmp_path / "w.npz", "cifar10", weights_io.random_weights("cifar10"))
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(good.read_bytes()[:2000])
    result = CliRunner().invoke(main, ["run", "--images", "2", "--synthetic", "--weights", str(bad)])
    assert result.exit_code != 0 and "not a readable .npz weights file" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_labkit_data_folder_that_does_not_exist_is_named(tmp_path, monkeypatch):
    missing = tmp_path / "typo"
    monkeypatch.setenv("LABKIT_DATA", str(missing))
    code, out = run("data", "where")
    assert code == 0 and "(does not exist)" in out and str(missing) in out
    with pytest.raises(data.DataNotFound, match="does not exist: fix the variable"):
        data.find("cifar10")
    with pytest.raises(data.DataError, match="does not exist"):
        data.fetch("cifar10")
    assert not missing.exists()  # a download never creates the mistyped folder
    monkeypatch.delenv("LABKIT_DATA")
    code, out = run("data", "where")
    assert "$LABKIT_DATA" in out and "(unset" in out


# ------------------------------------------------- bad inputs: checked before the work, one line each (issue 22)


def one_line(code, out, says):
    """A refusal: a non-zero exit and one line saying ``says``, no traceback."""
    assert code != 0 and says in out, out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out


@pytest.fixture
def blocker(tmp_path):
    """A regular file where a folder is needed: nothing can be created under it."""
    path = tmp_path / "blocker"
    path.write_text("not a folder\n")
    return path


def gpu_results(folder, device="NVIDIA H100 80GB HBM3"):
    """A bench folder of another device's results: its ledger, tables and a plot."""
    from sample_reports import cifar_report

    from labkit.ledger import Ledger

    folder.mkdir(parents=True, exist_ok=True)
    Ledger(folder / "ledger.jsonl").record(cifar_report(device=device))
    (folder / "bench.json").write_text(json.dumps({"meta": {"device": device}, "rows": []}))
    for name in ("bench.csv", "summary.md", "ladder_fashion_100.png", "notes.txt"):
        (folder / name).write_text("earlier\n")
    return folder


def test_grade_checks_out_before_grading(tmp_path, blocker, monkeypatch):
    from labkit import grading

    def must_not_run(*args, **kwargs):
        raise AssertionError("graded although --out was refused")

    monkeypatch.setattr(grading, "grade", must_not_run)
    code, out = run("grade", str(tmp_path), "--out", str(blocker / "grades"))
    one_line(code, out, f"--out {blocker / 'grades'} cannot be created: {blocker} is a file, not a folder")
    report = tmp_path / "old"
    report.mkdir()
    (report / "grades.json").write_text("{}")
    code, out = run("grade", str(tmp_path), "--out", str(report), "--no-merge")
    one_line(code, out, "already holds a report (grades.json): pass --merge to update its rows, --force to replace")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("mine\n")
    code, out = run("grade", str(tmp_path), "--out", str(tmp_path / "home"))
    one_line(code, out, "is not empty (thesis.tex) and holds no report: name a new or empty folder, or pass --force")

    def reached(*args, **kwargs):
        raise grading.GradeError("the grader ran")

    monkeypatch.setattr(grading, "grade", reached)  # said so: the check lets the run start
    for args in (["--out", str(report), "--force"], ["--out", str(report), "--stages", "01"]):
        code, out = run("grade", str(tmp_path), *args)
        one_line(code, out, "the grader ran")


def test_a_report_whose_folder_fails_at_the_end_goes_to_a_named_fallback(tmp_path, blocker, capsys):
    from labkit.grading import write_reports

    report = {"meta": {"single_submission": True, "date": "today", "environment": {}}, "rows": []}
    where = write_reports(blocker / "grades", report)  # checked before the run, but gone bad since
    assert where != blocker / "grades" and report["meta"]["written_to"] == str(where)
    assert json.loads((where / "grades.json").read_text())["meta"]["written_to"] == str(where)
    assert f"could not write the grades to {blocker / 'grades'}" in capsys.readouterr().err


def test_run_record_checks_its_ledger_before_the_run(tmp_path, blocker):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    gpu = gpu_results(tmp_path / "gpu")
    for path, says in ((blocker / "l.jsonl", f"--record {blocker / 'l.jsonl'} cannot be created: {blocker} is a file"),
                       (notes, "is not a labkit ledger"),
                       (gpu / "ledger.jsonl", "holds runs on NVIDIA H100 80GB HBM3, and this run is on")):
        code, out = run("run", "--images", "2", "--synthetic", "--record", str(path))
        one_line(code, out, says)  # one line: no report was printed before it
    assert notes.read_text() == "my notes\n" and len((gpu / "ledger.jsonl").read_text().splitlines()) == 12


def test_run_record_writes_this_versions_lines_and_never_loses_them(tmp_path, monkeypatch):
    from labkit import __version__
    from labkit.ledger import Ledger

    code, out = run("run", "--images", "2", "--synthetic", "--record", str(tmp_path / "new.jsonl"))
    assert code == 0 and f"recorded 12 lines in {tmp_path / 'new.jsonl'}" in out, out
    assert {r["labkit"] for r in Ledger(tmp_path / "new.jsonl").read()} == {__version__}
    record = Ledger.record

    def full_disk(self, *args, **kwargs):
        if self.path.parent == tmp_path:
            raise OSError(28, "No space left on device")
        return record(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "record", full_disk)
    result = CliRunner().invoke(main, ["run", "--images", "2", "--synthetic", "--record", str(tmp_path / "l.jsonl")])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    fallback = re.search(r"No space left on device\): wrote them to (\S+) instead", result.output).group(1)
    assert f"recorded 12 lines in {fallback}/l.jsonl" in result.output


def test_version_is_one_and_the_same_everywhere():
    from labkit import __version__
    from labkit.ladder import bench_files

    code, out = run("--version")
    assert code == 0 and out.strip() == f"labkit, version {__version__}"
    assert bench_files.versions()["labkit"] == __version__
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "labkit.about.__version__"}


def test_bench_out_refuses_existing_results_and_uncreatable_folders(tmp_path, blocker, monkeypatch):
    from labkit import bench, device

    def must_not_run(*args, **kwargs):
        raise AssertionError("benched although --out was refused")

    monkeypatch.setattr(bench, "bench", must_not_run)
    args = ["bench", "--stages", "01", "--nets", "cifar10", "--images", "2", "--no-baselines"]
    one_line(*run(*args, "--out", str(blocker / "out")), f"--out {blocker / 'out'} cannot be created")
    gpu = gpu_results(tmp_path / "gpu")
    before = {p.name: p.read_bytes() for p in gpu.iterdir()}
    one_line(*run(*args, "--out", str(gpu)), "already holds bench.csv, bench.json, ladder_fashion_100.png and 3 more: "
                                             "pass --append")
    one_line(*run(*args, "--out", str(gpu), "--append"),
             f"holds results of NVIDIA H100 80GB HBM3, and this machine is {device.label()}")
    one_line(*run(*args, "--out", str(gpu), "--append", "--force"), "do not go together")
    assert {p.name: p.read_bytes() for p in gpu.iterdir()} == before  # nothing replaced, nothing mixed

    seen = {}

    def fake(*args, append=False, **kwargs):
        seen.update(out=args[4], append=append, left=sorted(p.name for p in args[4].iterdir()))
        return bench.Rows([], args[4])

    monkeypatch.setattr(bench, "bench", fake)
    code, out = run(*args, "--out", str(gpu), "--force")
    assert code == 0 and seen == {"out": gpu, "append": False, "left": ["notes.txt"]}, out  # the kit's files only
    assert f"and 0 plots in {gpu}" in out
    mine = gpu_results(tmp_path / "mine", device=device.label())
    code, out = run(*args, "--out", str(mine), "--append")
    assert code == 0 and seen["append"] and "ladder_fashion_100.png" in seen["left"], out


def test_data_locations_that_cannot_be_used_are_named(tmp_path, blocker, monkeypatch):
    code, out = run("data", "fetch", "cifar10", "--root", str(blocker / "data"))
    one_line(code, out, f"the download folder {blocker / 'data'} cannot be created: {blocker} is a file")
    monkeypatch.setenv("LABKIT_DATA", str(blocker))
    code, out = run("data", "where")
    assert code == 0 and f"{blocker}  (is a file, not a folder)" in out, out
    code, out = run("data", "fetch", "cifar10")
    one_line(code, out, f"LABKIT_DATA={blocker} is a file, not a folder, so there is nowhere to download cifar10 to")
    with pytest.raises(data.DataNotFound, match="is a file, not a folder: point it at the folder"):
        data.find("cifar10")



@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, where nothing can be created")
def test_a_place_nothing_can_be_written_is_refused_before_the_work(monkeypatch):
    """/proc takes no new file, even from root, to whom ``os.access`` says yes: each output is tried (a file made
    and removed), so every command refuses it in one line before its work (grading a class took 7 min before)."""
    from labkit import bench, grading

    def must_not_run(*args, **kwargs):
        raise AssertionError("the work started although its output was refused")

    monkeypatch.setattr(grading, "grade", must_not_run)
    monkeypatch.setattr(bench, "bench", must_not_run)
    nope = "/proc/labkit-nope"
    for args, says in ((["grade", "/proc", "--out", nope], f"--out {nope} cannot be created"),
                       (["run", "--images", "2", "--synthetic", "--record", f"{nope}.jsonl"],
                        f"--record {nope}.jsonl cannot be created"),
                       (["bench", "--stages", "01", "--nets", "cifar10", "--images", "2", "--out", nope],
                        f"--out {nope} cannot be created"),
                       (["data", "fetch", "cifar10", "--root", nope], f"the download folder {nope} cannot be created")):
        one_line(*run(*args), says)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, where nothing can be created")
def test_grading_from_python_checks_out_first(tmp_path):
    """From a notebook (labkit.grading.grade) too: the reports' folder is tried before any job, not after."""
    from labkit import grading

    with pytest.raises(grading.GradeError, match="^--out /proc/labkit-nope cannot be created"):
        grading.grade(tmp_path, out="/proc/labkit-nope", progress=False)

@pytest.mark.parametrize("name, body, says", [
    ("notes.txt", "conv1 0.1 0.2\n", "is not an .npz weights file: it is a text file"),
    ("w.json", '{"conv1.weight": [1, 2]}', "is not an .npz weights file: it is a JSON file"),
    ("ece408-sp19-symbol.json", json.dumps({"nodes": [{"op": "null", "name": "data"}], "arg_nodes": [0]}),
     "is an MXNet symbol file: the network's structure, no weights. The weights are in the .params file"),
    ("w.npy", None, "is not an .npz weights file: it is a single .npy array"),
    ("objects.npz", None, "is not a readable .npz weights file (it holds Python objects, not plain arrays)"),
])
def test_a_weights_file_of_another_kind_is_named_without_unsafe_advice(tmp_path, name, body, says):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, np.zeros(3, np.float32))
    elif name.endswith(".npz"):
        np.savez(path, conv1=np.array([{"a": 1}], dtype=object))
    else:
        path.write_text(body)
    code, out = run("run", "--net", "ece408", "--images", "2", "--synthetic", "--weights", str(path))
    one_line(code, out, says)
    assert "allow_pickle" not in out and "pickled" not in out


def test_a_weights_folder_points_at_the_file_in_it(tmp_path):
    (tmp_path / "ece408-sp19-0002.params").write_bytes(bytes(40))
    code, out = run("run", "--net", "ece408", "--images", "2", "--synthetic", "--weights", str(tmp_path))
    one_line(code, out, f"is a folder: for --net ece408 pass the weights file in it, e.g. "
                        f"{tmp_path / 'ece408-sp19-0002.params'}")
    code, out = run("run", "--net", "cifar10", "--images", "2", "--synthetic", "--weights", str(tmp_path))
    one_line(code, out, "lacks layer1_conv.txt")
    assert "(it holds ece408-sp19-0002.params: pass that file itself)" in out


def cifar_batch(root, records, stray=0, name="data_batch_1.bin"):
    """A CIFAR-10 binary batch of ``records`` random images (then ``stray`` bytes) under ``root``."""
    rng = np.random.default_rng(records)
    raw = rng.integers(0, 256, size=(records, data.CIFAR_RECORD), dtype=np.uint8)
    raw[:, 0] = rng.integers(0, 10, size=records)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(raw.tobytes() + bytes(stray))
    return folder / name


def test_a_short_cifar_batch_says_which_file_and_what_to_ask_for(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path))
    cifar_batch(tmp_path, 5)
    code, out = run("run", "--images", "9", "--no-download")
    one_line(code, out, "asked for 9 CIFAR-10 train images but only 5 exist in")
    assert "Ask for at most 5 (this copy of data_batch_1.bin is partial)." in out and "test batch" not in out
    code, out = run("run", "--images", "5", "--no-download")  # the count the message suggested runs
    assert code == 0 and "CNN for 5 images" in out, out

    for stray, records in ((100, 5), (100, 0)):  # mid-record; shorter than one record
        cifar_batch(tmp_path, records, stray)
        for images in (9, 5, 1):  # never suggests a count that is then refused
            code, out = run("run", "--images", str(images), "--no-download")
            one_line(code, out, f"is truncated mid-record: {records * data.CIFAR_RECORD + stray} bytes is not a "
                                f"multiple of the 3073-byte record ({records} whole records, then {stray} stray bytes)")
            assert "Ask for at most" not in out
    cifar_batch(tmp_path, 0)
    one_line(*run("run", "--images", "1", "--no-download"), "holds none (data_batch_1.bin is empty): fetch the data")


def test_bench_and_ladder_refuse_inputs_that_hold_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    code, out = run("bench", "--notebooks", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    one_line(code, out, "no stage notebook with VARIANTS there (no .ipynb files): name the folder that holds them")
    assert not (tmp_path / "out").exists()  # no baseline ran
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (tmp_path / "none.jsonl").write_text("")
    for path, says in ((notes, "is not a labkit ledger"), (tmp_path / "none.jsonl", "holds no runs")):
        one_line(*run("ladder", str(path), "--out", str(tmp_path / "lad")), says)
    gpu = gpu_results(tmp_path / "gpu")
    one_line(*run("ladder", str(gpu / "ledger.jsonl"), "--out", str(gpu)), "already holds bench.csv")
    assert not (tmp_path / "lad").exists()


def test_lab_names_a_notebook_that_is_there_and_starts_as_root(tmp_path, monkeypatch):
    import subprocess

    pytest.importorskip("jupyterlab")
    from jupyterlab.labapp import LabApp

    from labkit import cli

    (tmp_path / "empty").mkdir()
    one_line(*run("lab", "--notebooks", str(tmp_path / "empty")), "holds no notebooks (.ipynb)")
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "03_managed_memory.ipynb").write_text("{}")
    started = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: None)  # the device and data check's child
    monkeypatch.setattr(LabApp, "launch_instance", classmethod(lambda cls, argv: started.append(argv)))
    for root in (True, False):
        monkeypatch.setattr(cli, "is_root", lambda: root)
        code, out = run("lab", "--notebooks", str(tmp_path / "books"), "--no-browser")
        assert code == 0 and "(start with 03_managed_memory.ipynb;" in out, out
        assert ("--allow-root" in started[-1]) == root == ("Running as root" in out)
    run("lab", "--notebooks", str(tmp_path / "books"), "--allow-root")
    assert started[-1].count("--allow-root") == 1


def test_readme_says_how_long_the_tests_take_and_how_to_see_why_they_skip():
    root = Path(__file__).parent.parent
    tests = (root / "README.md").read_text().split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"about \d+( to \d+)? minutes", tests) and "-rs" in tests
    assert "-rs" in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
