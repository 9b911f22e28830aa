"""labkit.timing: the median of timed calls, the two fixed report layouts, the ledger round trip."""

import json
import re
import time

import pytest

from labkit import timing
from labkit.nets import CIFAR10, Layer, Net
from labkit.timing import Ledger, RunReport, format_cifar, format_ece408, format_report, measure


# ------------------------------------------------------------------------------------------------- timers


def test_timer_measures_a_sleep():
    with timing.Timer() as t:
        time.sleep(0.02)
    assert t.method == "perf_counter"
    assert 0.015 < t.seconds < 0.5


def test_cuda_events_fall_back_without_a_gpu():
    assert timing.resolve_method("cuda-events") == "perf_counter"
    with pytest.raises(ValueError):
        timing.resolve_method("stopwatch")
    timing.sync()  # a no-op here, must not fail


def test_measure_skips_warmup_and_takes_the_median():
    sleeps = iter([0.2, 0.2, 0.03, 0.001, 0.05, 0.002, 0.01])  # two warm-ups, then five timed calls
    calls = []

    def fn(tag, scale=1.0):
        calls.append(tag)
        s = next(sleeps) * scale
        time.sleep(s)
        return s

    m = measure(fn, "x", warmup=2, repeat=5, scale=1.0)
    assert len(calls) == 7 and calls == ["x"] * 7
    assert len(m.times) == 5
    assert all(t < 0.15 for t in m.times)  # the slow warm-ups were not timed
    assert m.median == sorted(m.times)[2]
    assert 0.01 <= m.median < 0.03  # the median of 0.03, 0.001, 0.05, 0.002, 0.01
    assert m.result == 0.01 and m.method == "perf_counter" and m.simulated is True
    assert m.min <= m.median <= max(m.times)


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError):
        measure(lambda: None, repeat=0)
    with pytest.raises(ValueError):
        measure(lambda: None, warmup=-1)


# ------------------------------------------------------------------------------------------------ reports


CIFAR_SECONDS = {"conv1": 0.113322, "relu1": 0.0004, "pool1": 0.03, "conv2": 0.092, "relu2": 0.0003,
                 "pool2": 0.02, "conv3": 0.061, "relu3": 0.0003, "pool3": 0.015, "flatten": 0.0,
                 "fc": 0.001, "softmax": 0.0001}


def cifar_report(**kw):
    args = dict(net="cifar10", images=1200, layer_seconds=dict(CIFAR_SECONDS), accuracy=0.7825,
                device="Tesla V100-PCIE-32GB", simulated=False, synthetic=False, stage="05_shared",
                method="cuda-events")
    args.update(kw)
    return RunReport(**args)


def test_runreport_totals():
    r = cifar_report()
    assert r.total == pytest.approx(sum(CIFAR_SECONDS.values()))
    kinds = r.by_kind(CIFAR10)
    assert list(kinds) == ["conv", "relu", "pool", "fc", "softmax"]
    assert kinds["conv"] == pytest.approx(0.113322 + 0.092 + 0.061)
    assert sum(kinds.values()) == pytest.approx(r.total)


def test_runreport_defaults_describe_this_machine():
    r = RunReport(CIFAR10, 4, {"conv1": 1.0})
    assert r.net == "cifar10"
    assert r.simulated is True and r.device == "CUDA simulator (CPU)" and r.method == "perf_counter"


def parse_cifar(text):
    lines = text.split("\n")
    m = re.fullmatch(r"CNN for (\d+) images", lines[0])
    assert m, lines[0]
    assert lines[1] == ""
    m_total = re.fullmatch(r"Net Forward total time:(\d+\.\d{6}) seconds", lines[2])
    assert m_total, lines[2]
    i = 3
    layers = {}
    while lines[i]:
        m = re.fullmatch(r"    Time for (\w+): (\d+\.\d{6}) seconds", lines[i])
        assert m, lines[i]
        layers[m[1]] = float(m[2])
        i += 1
    i += 1
    kinds = {}
    while lines[i]:
        m = re.fullmatch(r"  (\w+):( +)(\d+\.\d{6}) seconds", lines[i])
        assert m, lines[i]
        assert len(m[1]) + 1 + len(m[2]) == max(6, len(m[1]) + 2)  # "FC:   " aligned with "Conv: "
        kinds[m[1]] = float(m[3])
        i += 1
    i += 1
    return int(lines[0].split()[2]), float(m_total[1]), layers, kinds, lines[i:]


def test_format_cifar_layout():
    text = format_cifar(cifar_report())
    images, total, layers, kinds, rest = parse_cifar(text)
    assert images == 1200
    assert list(layers) == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3",
                            "fc", "softmax"]  # flatten has no line
    assert layers["conv1"] == 0.113322
    assert list(kinds) == ["Conv", "ReLU", "Pool", "FC", "Softmax"]
    assert kinds["Conv"] == pytest.approx(0.266322, abs=1e-6)
    assert sum(kinds.values()) == pytest.approx(total, abs=1e-5)
    assert sum(layers.values()) == pytest.approx(total, abs=1e-5)
    assert rest == ["Net Accuracy: 78.25 %"]
    assert "  FC:   0.001000 seconds" in text.split("\n")


def test_format_cifar_synthetic_and_simulated():
    text = format_cifar(cifar_report(synthetic=True, accuracy=None, simulated=True))
    *_, rest = parse_cifar(text)
    assert rest[0] == "Net Accuracy: n/a (synthetic inputs)"
    assert len(rest) == 2 and "CUDA simulator" in rest[1]


def test_flatten_time_is_folded_so_everything_adds_up():
    secs = dict(CIFAR_SECONDS, flatten=0.5)
    r = cifar_report(layer_seconds=secs)
    _, total, layers, kinds, _ = parse_cifar(format_cifar(r))
    assert "flatten" not in layers
    assert layers["fc"] == pytest.approx(0.501)
    assert sum(kinds.values()) == pytest.approx(total, abs=1e-5)


def test_format_cifar_any_spec_with_tanh():
    r = RunReport("fashion", 100, {"conv1": 0.2, "tanh1": 0.01, "pool1": 0.02, "conv2": 0.3, "flatten": 0.0,
                                   "fc1": 0.05, "tanh2": 0.001, "fc2": 0.002, "softmax": 0.0001},
                  accuracy=0.8512, simulated=False, synthetic=False)
    _, total, layers, kinds, rest = parse_cifar(format_cifar(r))
    assert list(kinds) == ["Conv", "Tanh", "Pool", "FC"] + ["Softmax"]
    assert "ReLU" not in kinds
    assert kinds["FC"] == pytest.approx(0.052)
    assert sum(kinds.values()) == pytest.approx(total, abs=1e-5)


def test_format_ece408_layout():
    r = RunReport("fashion", 10000, {"conv1": 0.021169, "tanh1": 0.5, "pool1": 0.2, "conv2": 0.0688},
                  accuracy=0.85124, simulated=False, synthetic=False)
    lines = format_ece408(r).split("\n")
    assert lines == ["Op Time: 0.021169", "Op Time: 0.068800", "Correctness: 0.8512 Model: fashion"]
    assert format_report(r) == format_ece408(r)
    assert format_ece408(r, conv_layers=["conv2"]).split("\n")[0] == "Op Time: 0.068800"


def test_format_ece408_synthetic_and_missing():
    r = RunReport("fashion", 100, {"conv1": 0.1, "conv2": 0.2}, accuracy=None, simulated=True, synthetic=True)
    lines = format_ece408(r).split("\n")
    assert lines[2] == "Correctness: n/a Model: fashion"
    assert "CUDA simulator" in lines[3]
    with pytest.raises(ValueError, match="conv2"):
        format_ece408(RunReport("fashion", 1, {"conv1": 0.1}))


def test_format_report_picks_by_net():
    assert format_report(cifar_report()).startswith("CNN for 1200 images")
    custom = Net("tiny", (1, 8, 8), (Layer("c", "conv", out=2, kernel=3), Layer("r", "relu")), "fashion", "ece408")
    r = RunReport("tiny", 2, {"c": 0.5, "r": 0.1}, accuracy=0.5)
    assert format_report(r, net=custom).split("\n")[:2] == ["Op Time: 0.500000", "Correctness: 0.5000 Model: tiny"]


# ------------------------------------------------------------------------------------------------- ledger


def test_ledger_round_trip(tmp_path):
    ledger = Ledger(tmp_path / "deep" / "ledger.jsonl")
    rows = ledger.record(cifar_report(), command="labkit bench --stage 05")
    ledger.record(cifar_report(stage="01_serial", images=50000, synthetic=True, accuracy=None))
    ledger.record(RunReport("fashion", 100, {"conv1": 0.1, "conv2": 0.2}, accuracy=0.8, stage="01_serial"))
    lines = (tmp_path / "deep" / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 12 + 12 + 3  # 11 reported layers + total, twice; 2 layers + total
    first = json.loads(lines[0])
    for key in ("stage", "net", "layer", "images", "device", "seconds", "simulated", "synthetic", "method", "date",
                "command", "labkit"):
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
