"""labkit.tensor_cores, the kit's 3xTF32 tensor-core conv in CUDA C (the CPU emulation here, cupy on a GPU): every
configuration equals the float64 conv with its fused activation and pool to fp32's accuracy on odd shapes, poisoned
outputs, a block walking several image groups, and a last group with fewer images; the split's small parts are what
make it so (without them the same comparison fails); the kit's group check passes it; what it does not do is refused
in one line."""

import json

import numpy as np
import pytest

from labkit import check, gpu, layers, simulator, stages, tensor_cores

from conv_cases import CASES, case, expected, rel_error, run  # noqa: E402  (tests/ is on the path)

pytestmark = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")

#: one and two warps, one tile each, parts rounded toward zero: tiles cross images and windows overhang
SMALL = (tensor_cores.Config("tiny", warps=1, mt=1, imgs=2, round=0, bpre=1),
         tensor_cores.Config("two", warps=2, mt=3, apre=1), tensor_cores.config_named("w2 mt2 i3 r0 bpre apre"),
         tensor_cores.config_named("w1 mt3 i2 f16"), tensor_cores.config_named("w2 mt2 i3 apre f16"),
         tensor_cores.config_named("w2 mt2 i2 apre f16 breg"), tensor_cores.config_named("w2 mt2 i2 apre f16 kperm"),
         tensor_cores.config_named("w1 mt3 i2 r0 bpre kperm"), tensor_cores.config_named("w2 mt1 i3 apre f16 breg kperm"))
CONFIGS = [*tensor_cores.CONFIGS.values(), *SMALL]
#: fp32's accuracy on these sums: a direct fp32 conv's own error here is about 1e-7
MAX_ERROR = 2e-6


def _run(x, w, b, pad, act, pool, config=tensor_cores.DEFAULT, shape=None):
    return run(tensor_cores.conv_split3, x, w, b, pad, act, pool, shape, config=config)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("case_", CASES, ids=lambda c: "x".join(map(str, c)))
def test_every_configuration_is_the_reference_conv(config, case_):
    n, c, h, wd, m, pad, act, pool = case_
    x, w, b = case(sum(case_), n, c, h, wd, m)
    want = expected(x, w, b, pad, act, pool)
    error = rel_error(_run(x, w, b, pad, act, pool, config, want.shape), want)
    assert error < MAX_ERROR, f"relative error {error:.2e}"


def test_one_block_walks_every_group(monkeypatch):
    """The grid is capped at BLOCKS_PER_SM blocks a multiprocessor; a block then takes group after group."""
    monkeypatch.setattr(tensor_cores, "BLOCKS_PER_SM", 0)  # a grid of one block
    x, w, b = case(3, 7, 3, 8, 8, 5)
    want = expected(x, w, b, 2, 1, 2)
    assert rel_error(_run(x, w, b, 2, 1, 2, tensor_cores.CONFIGS["w4 mt2 i2 r0"], want.shape), want) < MAX_ERROR


@pytest.mark.parametrize("config", ["w2 mt2 i2 apre f16", "w2 mt1 i1 r0"])
def test_an_input_not_aligned_to_float4_is_read_value_by_value(config):
    """Rows of 4k values are staged with float4 loads where the input allows them; a view one float into an
    allocation does not, and must give the same outputs."""
    x, w, b = case(11, 3, 2, 8, 12, 6)
    want = expected(x, w, b, 2, 1, 2)
    flat = gpu.to_device(np.concatenate([[np.float32(np.nan)], x.ravel()]).astype(np.float32))
    for xd in (gpu.to_device(x), flat[1:].reshape(x.shape)):
        out = gpu.to_device(np.full(want.shape, np.nan, np.float32))
        tensor_cores.conv_split3(xd, gpu.to_device(w), gpu.to_device(b), out, 2, 1, 1, 2, config=config)
        assert rel_error(gpu.as_host(out), want) < MAX_ERROR


@pytest.mark.parametrize("config, line, cut", [
    ("w4 mt2 i1", "small = to_tf32(v - as_float(big));", "small = 0u;"),
    ("w4 mt2 i1 f16", "small = pack_h2((v0 - b0) * LO_SCALE, (v1 - b1) * LO_SCALE);", "small = 0u;")])
def test_without_the_small_parts_the_comparison_fails(monkeypatch, config, line, cut):
    """Plain TF32 or fp16 (each value its 10-bit rounding only) is what the split corrects: the bound must tell."""
    plain = tensor_cores.SOURCE.replace(line, cut)
    assert plain != tensor_cores.SOURCE
    monkeypatch.setattr(tensor_cores, "SOURCE", plain)  # a new source: compiled anew (the cache is keyed by it)
    x, w, b = case(5, 2, 6, 9, 9, 12)
    want = expected(x, w, b, 2, 0, 0)
    error = rel_error(_run(x, w, b, 2, 0, 0, tensor_cores.config_named(config), want.shape), want)
    assert error > 10 * MAX_ERROR


@pytest.mark.parametrize("config", ["w4 mt2 i1 f16", "w4 mt2 i1 apre f16"])
@pytest.mark.parametrize("scale, bound", [(1e3, MAX_ERROR), (1e-3, MAX_ERROR), (1e-6, 1e-5)])
def test_the_fp16_split_keeps_its_accuracy_far_from_one(scale, bound, config):
    """fp16's normal numbers run from 6e-5 to 65504: below, the big part goes subnormal and the small part (kept
    2^11 larger) saves most of what it loses: inputs of about 1e-6 stay within the kit's checks' 1e-5."""
    x, w, b = case(11, 3, 4, 8, 9, 8)
    x, b = (x * scale).astype(np.float32), (b * scale).astype(np.float32)
    want = expected(x, w, b, 2, 1, 2)
    error = rel_error(_run(x, w, b, 2, 1, 2, tensor_cores.config_named(config), want.shape), want)
    assert error < bound, f"relative error {error:.2e}"


@pytest.mark.parametrize("config", ["w4 mt2 i1 f16", "w4 mt2 i1 apre f16"])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_an_input_fp16_cannot_hold_gives_nans_not_quiet_numbers(act, config):
    x, w, b = case(12, 2, 3, 8, 8, 4)
    x[1, 2, 3, 3] = 1e5  # over fp16's 65504: image 1's outputs that read it must say so
    want = expected(x, w, b, 2, act, 2)
    got = _run(x, w, b, 2, act, 2, tensor_cores.config_named(config), want.shape)
    assert np.isnan(got[1]).any() and np.isfinite(got[0]).all()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_the_kits_group_check_passes_it_on_the_simulator_net():
    net = simulator.net("cifar10")
    group = layers.groups(list(net.layers), ("relu", "pool"))[0]
    result = check.check_group(tensor_cores.conv_split3, net, group, arrays="device", quiet=True)
    assert result.passed, str(result)


@pytest.mark.parametrize("bad, words", [
    (dict(w=(4, 3, 3, 3)), "5 x 5 filters"), (dict(stride=2), "stride 2"), (dict(pool=3), "2 x 2"),
    (dict(x=(1, 64, 70, 70), w=(24, 64, 5, 5), config="w4 mt4 i2 r0 bpre"), "fewer images")])
def test_what_it_does_not_do_is_refused_in_one_line(bad, words):
    x = np.zeros(bad.get("x", (1, 3, 8, 8)), np.float32)
    w = np.zeros(bad.get("w", (4, 3, 5, 5)), np.float32)
    with pytest.raises(ValueError, match=words) as err:
        tensor_cores.plan_for(x, w, 0, bad.get("stride", 1), 0, bad.get("pool", 0), bad.get("config", "w4 mt2 i1"))
    assert "\n" not in str(err.value)


def test_a_configuration_name_that_means_nothing_is_refused_in_one_line():
    want = tensor_cores.Config("w8 mt2 i4 r0", warps=8, mt=2, imgs=4, round=0)
    assert tensor_cores.config_named("w8 mt2 i4 r0") == want
    with pytest.raises(ValueError, match="no configuration") as err:
        tensor_cores.config_named("fast please")
    assert "\n" not in str(err.value)


def test_the_timing_tools_choices_are_the_fastest_that_passed_and_stage_10_reads_them(tmp_path, monkeypatch):
    import tool_modules

    tool = tool_modules.load("conv_timing")
    row = dict(net="cifar10", images=50000)
    rows = [{**row, "layer": "conv1", "kernel": tool.DIRECT, "time": {"median_ms": 3.0}},
            {**row, "layer": "conv1", "kernel": "tc w4 mt2 i1", "time": {"median_ms": 2.0}, "rel_error": 3e-7},
            {**row, "layer": "conv1", "kernel": "tc w8 mt1 i1 f16", "median_ms": 1.0, "rel_error": 1e-3},  # failed
            {**row, "layer": "conv2", "kernel": tool.DIRECT, "median_ms": 1.0},
            {**row, "layer": "conv2", "kernel": "tc w4 mt4 i2 r0 bpre", "median_ms": 1.5, "rel_error": 3e-7},
            {**row, "layer": "conv3", "kernel": "winograd mg8", "median_ms": 0.1},  # not a tensor-core choice
            {**row, "layer": "conv3", "kernel": "tf32x3 w4 mt2 i2 f16", "median_ms": 0.5, "rel_error": 3e-7}]
    store = tmp_path / "tensor_cores.json"
    data = tool.save_choices(rows, {"device": "GPU X", "date": "d", "command": "c"}, store)
    assert data["entries"][0]["choice"] == {"conv1": "w4 mt2 i1", "conv2": None, "conv3": "w4 mt2 i2 f16"}
    monkeypatch.setattr(tensor_cores, "STORE", store)
    impls = tensor_cores.tuned("cifar10", 50000)
    assert sorted(impls) == ["conv1", "conv3"] and tensor_cores.tuned("cifar10", 1200) == {}
    x, w, b = case(9, 2, 3, 8, 8, 4)
    want = expected(x, w, b, 2, 1, 2)
    out = gpu.to_device(np.full(want.shape, np.nan, np.float32))
    impls["conv3"](gpu.to_device(x), gpu.to_device(w), gpu.to_device(b), out, 2, 1, 1, 2)
    assert rel_error(gpu.as_host(out), want) < MAX_ERROR


def test_the_committed_choices_name_configurations_that_exist():
    for entry in json.loads(tensor_cores.STORE.read_text())["entries"]:
        for name in filter(None, entry["choice"].values()):
            tensor_cores.config_named(name)
