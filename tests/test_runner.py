"""The timed runner: student functions in place of reference layers, on host or device arrays."""

import numpy as np
import pytest
from numba import cuda

import labkit as lk
from labkit.workloads import Workload


def small_workload(net="cifar10", n=3, seed=0):
    net = lk.get_net(net)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 0.5, (n, *net.input_shape)).astype(np.float32)
    labels = rng.integers(0, 10, n)
    return Workload(net, lk.random_weights(net, seed), x, labels, simulated=False, synthetic=False, note="test")


def test_reference_only_run_matches_forward():
    wl = small_workload()
    r = lk.run(wl, quiet=True)
    np.testing.assert_allclose(r.probs, lk.forward(wl.net, wl.weights, wl.x), rtol=1e-6)
    assert list(r.report.layer_seconds) == [n for n in wl.net.layer_names if n != "flatten"]
    assert r.report.accuracy == lk.accuracy(r.predictions, wl.labels)


def test_student_functions_replace_layers_by_kind_and_name():
    calls = []

    def conv(x, w, b, out, pad, stride):
        calls.append("conv")
        out[...] = lk.conv2d(x, w, b, pad, stride)

    def relu1(x, out):
        calls.append("relu1")
        out[...] = np.maximum(x, 0)

    wl = small_workload()
    r = lk.run(wl, {"conv": conv, "relu1": relu1}, warmup=False, quiet=True)
    assert calls.count("conv") == 3 and calls.count("relu1") == 1
    np.testing.assert_allclose(r.probs, lk.forward(wl.net, wl.weights, wl.x), rtol=1e-5)


def test_per_image_launches_once_per_image_and_layer():
    calls = []

    def relu(x, out):
        calls.append(x.shape[0])
        out[...] = np.maximum(x, 0)

    wl = small_workload(n=4)
    batched = lk.run(wl, {"relu": relu}, warmup=False, quiet=True)
    calls.clear()
    per_image = lk.run(wl, lk.Variant(impls={"relu": relu}, target="cpu", per_image=True), warmup=False, quiet=True)
    assert calls == [1] * 12
    np.testing.assert_array_equal(batched.predictions, per_image.predictions)


@cuda.jit
def _relu(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out.reshape(x.size)[i] = max(x.reshape(x.size)[i], 0.0)


def test_device_arrays_need_every_layer():
    wl = small_workload()
    with pytest.raises(ValueError, match="every layer needs a function; missing: conv1"):
        lk.run(wl, {"relu": lambda x, out: None}, arrays="device", quiet=True)


def test_report_prints_in_the_nets_format(capsys):
    lk.run(small_workload("fashion", n=2), quiet=False)
    out = capsys.readouterr().out
    assert out.count("Op Time:") == 2 and "Correctness:" in out
