"""The main job and the other commands, as a person runs them."""

import re

import numpy as np
import pytest
from click.testing import CliRunner

from labkit import data
from labkit.cli import main


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
