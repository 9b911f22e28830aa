"""labkit.report: the two fixed report layouts, and throughput from the spec's FLOPs and bytes."""

import re

import pytest

from labkit import device
from labkit.nets import CIFAR10, Layer, Net, layer_cost
from labkit.report import RunReport, format_cifar, format_ece408, format_report, format_throughput

from sample_reports import CIFAR_SECONDS, cifar_report  # noqa: E402


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
    assert r.device == device.label() and r.simulated is (not device.is_gpu())
    assert r.method == ("cuda-events" if device.is_gpu() else "perf_counter")


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




def test_throughput_is_the_specs_flops_and_bytes_over_the_seconds():
    r = cifar_report()
    rows = r.throughput()
    assert list(rows) == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "conv3", "relu3", "pool3", "fc",
                          "softmax"]
    conv1 = layer_cost(CIFAR10, "conv1", 1200)
    assert conv1.flops == 1200 * 16 * 32 * 32 * (2 * 3 * 25 + 1)
    assert conv1.bytes == 4 * (1200 * (3 * 32 * 32 + 16 * 32 * 32) + 16 * 3 * 25 + 16)
    assert rows["conv1"]["gflops"] == pytest.approx(conv1.flops / 0.113322 / 1e9)
    assert rows["conv1"]["gbps"] == pytest.approx(conv1.bytes / 0.113322 / 1e9)
    text = format_throughput(r).split("\n")
    assert text[0].split() == ["layer", "seconds", "GFLOP", "MB", "GFLOP/s", "GB/s", "FLOP/B"]
    assert re.match(r"conv1\s+0\.113322\s+", text[1]) and text[-1].startswith("total")


def test_throughput_of_a_simulated_run_uses_the_shrunk_spec():
    from labkit import simulator

    small = simulator.net("cifar10")
    r = RunReport(small.name, 2, {"conv1": 0.5}, simulated=True)
    assert r.throughput()["conv1"]["flops"] == layer_cost(small, "conv1", 2).flops
    assert "CUDA simulator" in format_throughput(r)
