"""labkit.engine: the one forward engine, on host and device arrays, batched and per image, timed and checked."""

import numpy as np
import pytest

import labkit as lk
from labkit import device, engine, gpu, simulator
from labkit.workloads import Workload

from buggy_kernels import device_conv  # noqa: E402  (after labkit, which sets up numba)

ON_GPU = device.is_gpu()


def small_workload(net="cifar10", n=3, seed=0, shrunk=False):
    spec = simulator.net(net) if shrunk else lk.get_net(net)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 0.5, (n, *spec.input_shape)).astype(np.float32)
    labels = rng.integers(0, 10, n)
    return Workload(spec, lk.random_weights(spec, seed), x, labels, simulated=shrunk, synthetic=False, note="test")


def host_conv(x, w, b, out, pad, stride):
    out[...] = lk.conv2d(x, w, b, pad, stride)


DEVICE = lk.Variant({**lk.kernels.GIVEN, "conv": device_conv}, arrays="device")


def test_reference_only_run_matches_forward():
    wl = small_workload()
    r = lk.run(wl, quiet=True)
    np.testing.assert_allclose(r.probs, lk.forward(wl.net, wl.weights, wl.x), rtol=1e-6)
    assert list(r.report.layer_seconds) == [n for n in wl.net.layer_names if n != "flatten"]
    assert r.report.accuracy == lk.accuracy(r.predictions, wl.labels)
    assert r.report.stage == "numpy reference" and r.report.method == "perf_counter"


def test_student_functions_replace_layers_by_kind_and_name():
    calls = []

    def conv(x, w, b, out, pad, stride):
        calls.append("conv")
        host_conv(x, w, b, out, pad, stride)

    def relu1(x, out):
        calls.append("relu1")
        out[...] = np.maximum(x, 0)

    wl = small_workload()
    r = lk.run(wl, {"conv": conv, "relu1": relu1}, warmup=False, quiet=True)
    assert calls.count("conv") == 3 and calls.count("relu1") == 1
    np.testing.assert_allclose(r.probs, lk.forward(wl.net, wl.weights, wl.x), rtol=1e-5)


@pytest.mark.parametrize("n", [1, 4, 5])
def test_per_image_launches_once_per_image_and_layer(n):
    calls = []

    def relu(x, out):
        calls.append(x.shape[0])
        out[...] = np.maximum(x, 0)

    wl = small_workload(n=n)
    batched = lk.run(wl, {"relu": relu}, warmup=False, quiet=True)
    assert calls == [n] * 3
    calls.clear()
    per_image = lk.run(wl, lk.Variant({"relu": relu}, target="cpu", per_image=True), warmup=False, quiet=True)
    assert calls == [1] * 3 * n
    np.testing.assert_array_equal(batched.predictions, per_image.predictions)


@pytest.mark.parametrize("per_image", [False, True])
def test_device_arrays_run_real_kernels_and_match_the_reference(per_image):
    wl = small_workload(n=3, shrunk=not ON_GPU)
    with gpu.counting() as c:
        r = lk.run(wl, DEVICE, per_image=per_image, warmup=False, quiet=True)
    np.testing.assert_allclose(r.probs, lk.forward(wl.net, wl.weights, wl.x), rtol=1e-4, atol=1e-6)
    layers = len([ly for ly in wl.net.layers if ly.kind != "flatten"])
    assert c.launches == layers * (3 if per_image else 1)
    assert c.htod == 1 + len(lk.layers.with_biases(wl.net.layers, wl.weights))  # inputs and weights, once
    assert c.dtoh == (3 if per_image else 1)  # the probabilities, per image or once


def test_device_arrays_need_every_layer():
    wl = small_workload()
    with pytest.raises(ValueError, match="every layer needs a function; missing: conv1"):
        lk.run(wl, {"relu": lambda x, out: None}, arrays="device", quiet=True)


def test_repeated_passes_keep_medians_and_the_range(monkeypatch):
    """Each layer's median over the passes, and the fastest and slowest whole pass. The medians' sum need not lie
    inside that range (each layer's median may come from another pass: a clean CI run once summed them below the
    fastest pass), so the passes here are given: each layer slow in a different one."""
    wl = small_workload(n=2)
    timed = engine.time_passes

    def given(net, variant, prepared, repeat, *args, **kwargs):
        probs, real = timed(net, variant, prepared, repeat, *args, **kwargs)
        names = list(real[0])
        return probs, [{n: (9.0 if i == k % len(names) else 1.0) for i, n in enumerate(names)} for k in range(repeat)]

    monkeypatch.setattr(engine, "time_passes", given)
    r = lk.run(wl, {"conv": host_conv}, repeat=3, quiet=True)
    layers = len(r.report.layer_seconds)
    assert r.report.runs == 3 and layers > 3
    assert r.report.layer_seconds == {n: 1.0 for n in r.report.layer_seconds}  # every layer's median
    assert r.report.total == layers and r.report.total_range == (layers + 8.0, layers + 8.0)  # below the range


class _FixedClock:
    """Each pass 'takes' one second per layer it times: a budget test independent of the machine's speed."""

    def __init__(self):
        self.names = []

    def section(self, name):
        self.names.append(name)
        return engine.nullcontext()

    def seconds(self):
        return {name: 1.0 for name in self.names}


@pytest.mark.parametrize("budget, runs", [(None, 5), (0.0, 1), (25.0, 3), (1e9, 5)])
def test_a_time_budget_ends_the_repeats_early_and_the_report_counts_the_runs(budget, runs):
    wl = small_workload(n=2)
    v = lk.Variant({"conv": host_conv}, target="cpu")
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    per_pass = len(wl.net.layers) - sum(ly.kind == "flatten" for ly in wl.net.layers)  # seconds of one pass
    _, passes = engine.time_passes(wl.net, v, prepared, repeat=5, warmup=False, clock_factory=_FixedClock,
                                   budget_s=None if budget is None else budget * per_pass / 10)
    assert len(passes) == runs and all(sum(p.values()) == per_pass for p in passes)
    real = lk.run(wl, {"conv": host_conv}, repeat=4, quiet=True, budget_s=0.0)
    assert real.report.runs == 1  # a zero budget still times one run, and the report says one ran


def test_check_mode_poisons_every_intermediate():
    seen = []

    def spy_relu(x, out):
        seen.append(bool(np.isnan(out).all()))
        out[...] = np.maximum(x, 0)

    wl = small_workload(n=2)
    v = lk.Variant({"relu": spy_relu}, target="cpu")
    prepared = engine.prepare(wl.net, v, wl.x, wl.weights)
    engine.forward(wl.net, v, prepared, check=True)
    assert seen == [True, True, True]
    seen.clear()
    engine.forward(wl.net, v, prepared)
    assert len(seen) == 3  # not poisoned outside checks (np.empty may hold anything)


def test_a_run_records_to_the_ledger_when_asked(tmp_path):
    ledger = lk.Ledger(tmp_path / "l.jsonl")
    wl = small_workload(n=2)
    lk.run(wl, lk.variants("01", {"mine": lk.Variant({"conv": host_conv}, target="cpu")})["mine"], quiet=True,
           record=ledger, command="test")
    (row,) = ledger.read(layer="total")
    assert row["stage"] == "01 mine" and row["command"] == "test" and row["images"] == 2


def test_report_prints_in_the_nets_format_with_throughput(capsys):
    lk.run(small_workload("fashion", n=2), quiet=False)
    out = capsys.readouterr().out
    assert out.count("Op Time:") == 2 and "Correctness:" in out and "GFLOP/s" in out
