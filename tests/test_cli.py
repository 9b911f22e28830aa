"""The main job and the other commands, as a person runs them."""

import re

import numpy as np
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
    code, out = run("info")
    assert code == 0 and "simulator" in out.lower() and "data cifar10" in out
    code, out = run("data", "where")
    assert code == 0 and ("$LABKIT_DATA" in out or "repository data/" in out)


def test_record_writes_a_ledger(tmp_path, cifar_root):
    ledger = tmp_path / "ledger.jsonl"
    code, out = run("run", "--net", "cifar10", "--images", "5", "--record", str(ledger))
    assert code == 0 and ledger.read_text().count("\n") >= 11
