"""labkit.winograd, the kit's F(2, 5) row conv in CUDA C: the matrices satisfy the minimal-filtering identity, the
host form of the arithmetic equals a direct conv, and the kernel (on the CPU emulation here, cupy on a GPU) equals the
reference conv with its fused activation and pool on odd shapes, every configuration, poisoned outputs, several
output-channel groups and padded ones; the kit's group check passes it; what it does not do is refused in one line."""

import numpy as np
import pytest

from labkit import check, gpu, layers, reference, simulator, stages, tensor_cores, winograd

import tool_modules  # noqa: E402  (tests/ is on the path)
from conv_cases import CASES, case as _case, expected as _expected, rel_error, run  # noqa: E402

pytestmark = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")

#: four output channels a thread: cases of 6, 13 and 16 maps cross groups and pad the last one
SMALL = winograd.Config("small", mg=4, threads=32)
CONFIGS = [*winograd.CONFIGS.values(), SMALL]


def test_the_matrices_are_minimal_filtering_of_a_5_tap_row():
    at, g, bt = winograd.matrices()
    assert at.shape == (2, 6) and g.shape == (6, 5) and bt.shape == (6, 6)
    assert np.array_equal(bt, np.round(bt)), "B^T should be small integers"
    rng = np.random.default_rng(1)
    d, f = rng.standard_normal(6), rng.standard_normal(5)
    direct = np.array([d[i:i + 5] @ f for i in range(2)])
    np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), direct, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pad", [0, 2])
def test_the_host_form_is_a_direct_conv(pad):
    rng = np.random.default_rng(pad)
    x, w = rng.standard_normal((2, 3, 9, 8)), rng.standard_normal((4, 3, 5, 5))
    want = reference.conv2d(x, w, None, pad, accumulate="float64")
    np.testing.assert_allclose(winograd.conv_numpy(x, w, pad), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_every_configuration_is_the_reference_conv(config, case):
    n, c, h, wd, m, pad, act, pool = case
    x, w, b = _case(sum(case), n, c, h, wd, m)
    want = _expected(x, w, b, pad, act, pool)
    error = rel_error(run(winograd.conv_winograd, x, w, b, pad, act, pool, want.shape, config=config), want)
    assert error < 2e-6, f"relative error {error:.2e}"


def test_the_kits_group_check_passes_it_on_the_simulator_net():
    net = simulator.net("cifar10")
    group = layers.groups(list(net.layers), ("relu", "pool"))[0]
    result = check.check_group(winograd.conv_winograd, net, group, arrays="device", quiet=True)
    assert result.passed, str(result)


def test_a_filter_row_left_out_is_caught():
    """The check above would pass a kernel that skipped nothing; a weight transform that drops the last filter row
    must fail the same comparison."""
    x, w, b = _case(7, 2, 3, 8, 8, 4)
    want = _expected(x, w, b, 2, 0, 0)
    cut = w.copy()
    cut[:, :, 4, :] = 0.0
    out = gpu.to_device(np.full(want.shape, np.nan, np.float32))
    winograd.conv_winograd(gpu.to_device(x), gpu.to_device(cut), gpu.to_device(b), out, 2, 1, 0, 0)
    assert np.linalg.norm(gpu.as_host(out) - want) / np.linalg.norm(want) > 1e-2


@pytest.mark.parametrize("bad, words", [
    (dict(w=(4, 3, 3, 3)), "5 x 5 filters"), (dict(stride=2), "stride 2"), (dict(pool=3), "2 x 2"),
    (dict(w=(4, 200, 5, 5), x=(1, 200, 8, 8), config=winograd.Config("wide", mg=16)), "smaller mg")])
def test_what_it_does_not_do_is_refused_in_one_line(bad, words):
    x = np.zeros(bad.get("x", (1, 3, 8, 8)), np.float32)
    w = np.zeros(bad.get("w", (4, 3, 5, 5)), np.float32)
    with pytest.raises(ValueError, match=words) as err:
        winograd.plan_for(x, w, 0, bad.get("stride", 1), 0, bad.get("pool", 0), bad.get("config", "mg8"))
    assert "\n" not in str(err.value)


def test_the_timing_tools_quick_run_checks_every_kernel_and_fails_a_wrong_one(tmp_path, monkeypatch):
    import json

    tool = tool_modules.load("conv_timing")
    assert tool.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "conv_timing.json").read_text())
    layers_run = sum(len(tool.conv_groups(simulator.net(n))) for n, _ in tool.QUICK)
    kernels = 1 + len(winograd.CONFIGS) + len(tensor_cores.CONFIGS)
    assert len(data["rows"]) == layers_run * kernels and not data["failures"]
    real = winograd.conv_winograd

    def no_bias(x, w, b, out, pad, stride=1, act=0, pool=0, config=winograd.DEFAULT):
        real(x, w, gpu.to_device(np.zeros(w.shape[0], np.float32)), out, pad, stride, act, pool, config=config)

    monkeypatch.setattr(winograd, "conv_winograd", no_bias)
    assert tool.main(["--quick"]) == 1
