"""labkit.ledger: the round trip, filters, the default path, bad lines."""

import json

import pytest

from labkit import __version__
from labkit.ledger import Ledger, LedgerError
from labkit.report import RunReport

from sample_reports import CIFAR_SECONDS, cifar_report  # noqa: E402

def test_ledger_round_trip(tmp_path):
    ledger = Ledger(tmp_path / "deep" / "ledger.jsonl")
    rows = ledger.record(cifar_report(), command="labkit bench --stage 05")
    ledger.record(cifar_report(stage="01_serial", images=50000, synthetic=True, accuracy=None))
    ledger.record(RunReport("fashion", 100, {"conv1": 0.1, "conv2": 0.2}, accuracy=0.8, stage="01_serial",
                            device="Tesla V100-PCIE-32GB"))
    lines = (tmp_path / "deep" / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 12 + 12 + 3  # 11 reported layers + total, twice; 2 layers + total
    first = json.loads(lines[0])
    for key in ("stage", "net", "layer", "images", "device", "seconds", "simulated", "synthetic", "method", "date",
                "command", "labkit", "runs", "total_range"):
        assert key in first
    assert first["command"] == "labkit bench --stage 05" and first["date"].endswith("+00:00")
    assert rows[-1]["layer"] == "total" and rows[-1]["seconds"] == pytest.approx(cifar_report().total)
    assert repr(rows) == f"recorded 05_shared (cifar10, 1200 images): 12 lines in {ledger.path}"

    totals = ledger.read(layer="total")
    assert [r["net"] for r in totals] == ["cifar10", "cifar10", "fashion"]
    assert len(ledger.read(net="cifar10", stage="01_serial")) == 12
    assert len(ledger.read(stage=["01_serial", "05_shared"], layer="conv1")) == 3
    assert len(ledger.read(seconds=lambda s: s > 0.1)) >= 4
    assert ledger.read(net="nope") == []
    assert ledger.read(net="fashion", layer="conv2")[0]["seconds"] == 0.2

    back = ledger.reports(net="cifar10")
    assert len(back) == 2
    assert back[0].layer_seconds["conv1"] == 0.113322 and back[0].stage == "05_shared"
    assert back[0].total == pytest.approx(cifar_report().total)
    assert back[0].runs == 3 and back[0].total_range == (0.3, 0.4)


def test_ledger_default_path_and_bad_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "res"))
    assert Ledger().path == tmp_path / "res" / "ledger.jsonl"
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "x.jsonl"))
    assert Ledger().path == tmp_path / "x.jsonl"
    monkeypatch.delenv("LABKIT_RESULTS")
    assert Ledger().path.parts[-2:] == ("results", "ledger.jsonl")
    path = tmp_path / "l.jsonl"
    Ledger(path).record(RunReport("fashion", 1, {"conv1": 0.1}))
    with path.open("a") as fh:
        fh.write('{"half a line\n')
    with pytest.warns(UserWarning, match="not a JSON line"):
        assert len(Ledger(path).read()) == 2
    assert Ledger(tmp_path / "missing.jsonl").read() == []


def test_a_ledger_keeps_one_devices_runs_and_refuses_other_files(tmp_path, monkeypatch):
    gpu = Ledger(tmp_path / "gpu.jsonl")
    rows = gpu.record(cifar_report())
    assert rows[0]["labkit"] == __version__  # the one version, as `labkit --version` says it
    before = gpu.path.read_text()
    with pytest.raises(LedgerError, match="holds runs on Tesla V100-PCIE-32GB, and this run is on CUDA simulator"):
        gpu.record(cifar_report(device="CUDA simulator (CPU)", simulated=True))
    assert gpu.path.read_text() == before  # nothing of the refused run was written
    gpu.record(cifar_report(stage="01_serial"))  # the same device: appended
    assert len(gpu.read(layer="total")) == 2

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    for path, says in ((notes, "is not a labkit ledger"), (tmp_path, "is a folder, not a ledger file")):
        with pytest.raises(LedgerError, match=says):
            Ledger(path).record(cifar_report())
    assert notes.read_text() == "my notes\n"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"net": "cifar10", "seconds": 1}) + "\n")  # JSON, but not the kit's lines
    with pytest.raises(LedgerError, match="not a labkit ledger"):
        Ledger(other).check()

    # the default ledger, this clone's working ledger, takes any device's runs (its readers filter by device)
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "res"))
    Ledger().record(cifar_report())
    Ledger().record(cifar_report(device="CUDA simulator (CPU)", simulated=True))
    assert {r["device"] for r in Ledger().read()} == {"Tesla V100-PCIE-32GB", "CUDA simulator (CPU)"}
