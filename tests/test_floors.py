"""labkit.floors (issue 35, point 1): a layer's useful multiply-adds leave the padding out, the floor of a call is the
sum over its groups of the larger of the method's passes at its unit's rate and the compulsory bytes at the copy
bandwidth, the methods follow a variant's functions, the rates come from recorded measurements, and the bench and
BENCHMARKS.md show the floor beside the fp32 one. Fresh random shapes, rates and sizes every run (the seed is in
each assertion's message)."""

import json
import math

import numpy as np
import pytest

from labkit import bench_whole, benchdoc, ceilings, floors, layers, tensor_cores, tune
from labkit.ladder import bench_table
from labkit.nets import Layer, get_net
from labkit.stages import Variant

SEED = int(np.random.default_rng().integers(2**31))
RNG = np.random.default_rng(SEED)


def brute_macs(C, H, W, M, K, pad, stride) -> int:
    """Every (output, tap) whose input pixel is inside the image, counted one by one."""
    ho, wo = (H + 2 * pad - K) // stride + 1, (W + 2 * pad - K) // stride + 1
    inside = 0
    for i in range(ho):
        for j in range(wo):
            for p in range(K):
                for q in range(K):
                    r, c = i * stride + p - pad, j * stride + q - pad
                    inside += 0 <= r < H and 0 <= c < W
    return inside * C * M


def test_useful_multiply_adds_leave_the_padding_out():
    for _ in range(25):
        K = int(RNG.integers(1, 6))
        pad, stride = int(RNG.integers(0, 4)), int(RNG.integers(1, 4))
        H, W = (int(RNG.integers(max(1, K - 2 * pad), 13)) for _ in range(2))
        C, M = int(RNG.integers(1, 5)), int(RNG.integers(1, 5))
        layer = Layer("conv", "conv", out=M, kernel=K, pad=pad, stride=stride)
        got = floors.useful_macs(layer, (C, H, W))
        assert got == brute_macs(C, H, W, M, K, pad, stride), (SEED, C, H, W, M, K, pad, stride)
        if pad == 0:  # no padding: every tap counts
            ho, wo = (H - K) // stride + 1, (W - K) // stride + 1
            assert got == M * C * K * K * ho * wo, SEED
    fc = Layer("fc", "fc", out=7)
    assert floors.useful_macs(fc, (320,)) == 7 * 320
    assert floors.useful_macs(Layer("p", "pool", kernel=2, stride=2), (3, 8, 8)) == 0


def _rates(fma, tf32, f16, bw):
    return floors.Rates("X", {"fma": fma, "tf32": tf32, "f16": f16}, bw, "test")


def _random_methods(net):
    choices = [floors.FMA, floors.Method("f16", 3), floors.Method("tf32", 3)]
    return {name: choices[int(RNG.integers(3))] for name in net.layer_names
            if net.layer(name).kind in ("conv", "fc")}


@pytest.mark.parametrize("name", ["cifar10", "fashion", "ece408"])
def test_with_unbounded_bandwidth_the_floor_is_the_passes_at_each_units_rate(name):
    net = get_net(name)
    images = int(RNG.integers(1, 60000))
    rates = _rates(*(float(r) for r in RNG.uniform(1e12, 1e15, 3)), 1e40)
    methods = _random_methods(net)
    want = 0.0
    for layer in net.layers:
        if layer.kind == "conv":
            c, h, w = net.input_shape_of(layer.name)
            macs = brute_macs(c, h, w, layer.out, layer.kernel, layer.pad, layer.stride)
        elif layer.kind == "fc":
            macs = layer.out * math.prod(net.input_shape_of(layer.name))
        else:
            continue
        m = methods[layer.name]
        want += images * macs * m.passes / rates.macs[m.unit]
    got = floors.net_floor(net, images, rates, methods, ("relu", "tanh", "pool"))
    assert got.seconds == pytest.approx(want, rel=1e-9), SEED
    assert all(g.bound == "compute" for g in got.groups if g.macs), SEED


def test_with_unbounded_rates_the_floor_is_the_compulsory_bytes_at_the_copy_bandwidth():
    net = get_net("cifar10")
    images, bw = int(RNG.integers(1, 60000)), float(RNG.uniform(1e11, 5e12))
    rates = _rates(1e40, 1e40, 1e40, bw)
    # cifar10 from its spec: 3x32x32 in; conv 16, 20, 20 maps of 5x5 (pad 2) each with relu and a 2x2 pool; fc 320->10
    fused = 4 * ((images * (3 * 32 * 32 + 16 * 16 * 16) + 16 * 3 * 25 + 16)
                 + (images * (16 * 16 * 16 + 20 * 8 * 8) + 20 * 16 * 25 + 20)
                 + (images * (20 * 8 * 8 + 20 * 4 * 4) + 20 * 20 * 25 + 20)
                 + (images * (320 + 10) + 10 * 320 + 10)
                 + images * (10 + 10))
    got = floors.net_floor(net, images, rates, {}, ("relu", "tanh", "pool"))
    assert got.seconds == pytest.approx(fused / bw, rel=1e-12), SEED
    assert [g.layers for g in got.groups] == [("conv1", "relu1", "pool1"), ("conv2", "relu2", "pool2"),
                                               ("conv3", "relu3", "pool3"), ("fc",), ("softmax",)]
    # unfused, every layer reads its input and writes its output: the spec's own minimum bytes of each layer
    from labkit.nets import net_cost

    alone = floors.net_floor(net, images, rates, {}, ())
    assert alone.seconds == pytest.approx(sum(c.bytes for c in net_cost(net, images).values()) / bw, rel=1e-12)


def test_each_group_takes_the_larger_of_its_two_times_and_the_call_their_sum():
    net = get_net("fashion")
    images = int(RNG.integers(1, 20000))
    rates = _rates(*(float(r) for r in RNG.uniform(1e11, 1e14, 3)), float(RNG.uniform(1e10, 1e13)))
    got = floors.net_floor(net, images, rates, _random_methods(net), ("tanh", "pool"))
    assert got.seconds == pytest.approx(sum(max(g.compute_s, g.memory_s) for g in got.groups)), SEED
    for g in got.groups:
        assert g.compute_s == pytest.approx(g.macs * g.method.passes / rates.macs[g.method.unit]), SEED
        assert g.memory_s == pytest.approx(g.bytes / rates.bandwidth), SEED
        assert g.bound == ("compute" if g.compute_s >= g.memory_s else "memory")
    assert f"floor {1e3 * got.seconds:.4f} ms" in got.table()
    assert got.bounds().count("%") == sum(1 for g in got.groups if g.seconds > 0)


def test_methods_follow_the_variants_functions_and_tune_by_images_picks_the_same():
    def plain(*args):
        plain.called = True

    def tc16(*args):
        tc16.called = True

    def tc32(*args):
        pass

    tc16.tensor_core_config = tensor_cores.config_named("w4 mt1 i1 apre f16")
    tc32.tensor_core_config = tensor_cores.config_named("w4 mt2 i1")
    assert floors.method_of(plain, 10) == floors.Method("fma", 1, "plain")
    assert floors.method_of(tc16, 10) == floors.Method("f16", 3, "w4 mt1 i1 apre f16")
    assert floors.method_of(tc32, 10).unit == "tf32"
    picked = tune.by_images({1200: {"conv2": plain}, 50000: {"conv2": tc16}})["conv2"]
    for n in [*RNG.integers(1, 100000, 20), 1200, 1201, 50000, 2500]:
        plain.called = tc16.called = False
        picked(type("X", (), {"shape": (int(n),)})())
        want = "f16" if tc16.called else "fma"
        assert floors.method_of(picked, int(n)).unit == want, (SEED, n)
    variant = Variant({"conv": plain, "conv2": picked, "fc": plain}, arrays="device", fuse=("relu", "pool"))
    got = floors.variant_methods("cifar10", variant, 50000)
    assert {k: m.unit for k, m in got.items()} == {"conv1": "fma", "conv2": "f16", "conv3": "fma", "fc": "fma"}


def test_tuned_tensor_core_functions_say_what_they_issue():
    found = tensor_cores.tuned("cifar10", 50000)
    if not found:
        pytest.skip("no recorded choice, or CUDA C cannot run here (no GPU and no C++ compiler)")
    for layer, fn in found.items():
        kept = tensor_cores.stored("cifar10", 50000)["choice"][layer]
        assert fn.tensor_core_config == tensor_cores.config_named(kept)
        assert floors.method_of(fn, 50000).passes == 3


def _measured(device, fma, tf32, f16, bw=None):
    out = {"device": device, "sms": 132, "date": "2026-01-02", "command": "python3 tools/mma_rates.py",
           "rows": {"ffma": {"tmacs": fma}, "tf32": {"tmacs": tf32}, "f16": {"tmacs": f16}}}
    if bw:
        out["copy"] = {"bandwidth": bw}
    return out


def test_rates_come_from_the_store_else_a_committed_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(floors, "STORE", tmp_path / "unit_rates.json")
    fma, tf32, f16, bw = (float(v) for v in RNG.uniform(1, 700, 4))
    floors.save(_measured("Some GPU", fma, tf32, f16, bw * 1e9), floors.STORE)
    got = floors.rates_for("Some GPU")
    assert got.macs == {"fma": fma * 1e12, "tf32": tf32 * 1e12, "f16": f16 * 1e12} and got.bandwidth == bw * 1e9
    assert "2026-01-02" in got.source
    with pytest.raises(ValueError, match="no copy bandwidth"):
        floors.save(_measured("Other", 1, 2, 3), floors.STORE)
    assert floors.rates_for("No such GPU") is None
    committed = sorted((floors.repo_root() / "results").glob("*/mma_rates.json"))
    if not committed:
        pytest.skip("no committed mma_rates.json")
    data = json.loads(committed[-1].read_text())
    got = floors.rates_for(data["device"])
    assert got.macs["f16"] == pytest.approx(data["rows"]["f16"]["tmacs"] * 1e12)
    assert got.macs["fma"] == pytest.approx(data["rows"]["ffma"]["tmacs"] * 1e12)
    assert committed[-1].parent.name in got.source
    roof = ceilings.for_device(data["device"])
    if not data.get("copy"):
        assert got.bandwidth == roof.bandwidth and roof.source in got.source


def _gpu_here(monkeypatch, rates):
    monkeypatch.setattr(bench_whole.device, "info", lambda: type("I", (), {"kind": "gpu"})())
    monkeypatch.setattr(bench_whole.device, "label", lambda: "X")
    monkeypatch.setattr(ceilings, "for_device", lambda name: ceilings.Ceilings(name, 50e12, 1e12, "datasheet"))
    monkeypatch.setattr(floors, "rates_for", lambda name: rates)


def test_the_bench_rows_floor_is_the_variants_units(monkeypatch):
    rates = _rates(*(float(r) for r in RNG.uniform(1e12, 1e15, 3)), float(RNG.uniform(1e11, 5e12)))
    _gpu_here(monkeypatch, rates)

    def tc(*args):
        pass

    tc.tensor_core_config = tensor_cores.config_named("w4 mt1 i1 apre f16")
    variant = Variant({"conv": lambda *a: None, "conv2": tc, "fc": lambda *a: None}, arrays="device",
                      fuse=("relu", "pool"))
    net, images, whole = get_net("cifar10"), int(RNG.integers(1, 60000)), float(RNG.uniform(1e-4, 1e-1))
    got = bench_whole.floor(net, images, whole, variant)
    want = floors.net_floor(net, images, rates, floors.variant_methods(net, variant, images), variant.fuse)
    assert got["limit_s"] == pytest.approx(want.seconds)
    assert got["limit_fraction"] == pytest.approx(want.seconds / whole)
    assert "conv2" in got["limit_bounds"] and "mma.sync fp16 x3" in got["limit_bounds"]
    assert got["floor_s"] > 0 and got["limit_source"] == "test"
    plain = bench_whole.floor(net, images, whole)  # no variant (cuDNN): every layer alone, FMA
    assert plain["limit_s"] == pytest.approx(floors.net_floor(net, images, rates, {}, ()).seconds)
    monkeypatch.setattr(floors, "rates_for", lambda name: None)
    assert "limit_s" not in bench_whole.floor(net, images, whole, variant)


def _rows():
    limit = float(RNG.uniform(1e-4, 1e-3))
    whole = limit / float(RNG.uniform(0.2, 0.9))
    common = {"net": "cifar10", "images": 1200, "target": "gpu", "checks": "PASS", "conv_s": 1e-4,
              "layer_seconds": {"conv1": 1e-4}, "runs": 5}
    return [
        {**common, "stage": "10 whole_cifar10", "variant": "whole_cifar10", "total_s": 2 * whole,
         "whole_call_s": whole, "whole_call_range": (whole, whole), "floor_fraction": 0.5, "limit_s": limit,
         "limit_fraction": limit / whole, "limit_bounds": "conv1 compute (mma.sync fp16 x3, 0.1 ms, 60 %)",
         "whole_call_how": bench_whole.WHOLE_CALL_GRAPH},
        {**common, "stage": "cuDNN (PyTorch 9)", "variant": "cudnn", "checks": "-", "total_s": 9 * whole,
         "whole_call_s": 8 * whole},
        {**common, "stage": "cuDNN (PyTorch 9), fp16, channels_last", "variant": "cudnn_peer", "checks": "-",
         "total_s": 5 * whole, "whole_call_s": 3 * whole},
    ]


def test_the_table_and_the_page_show_the_limit_beside_the_fp32_floor_and_the_peers(tmp_path):
    rows = _rows()
    stage10 = rows[0]
    text = bench_table.table(rows)
    assert "%limit" in text.splitlines()[0]
    line = next(x for x in text.splitlines() if x.startswith("10 whole_cifar10"))
    assert f"{100 * stage10['limit_fraction']:.1f}" in line.split()
    peer = next(x for x in text.splitlines() if x.startswith("10 whole_cifar10 (cifar10, 1200 images)"))
    assert "cuDNN fp32" in peer and "(8.00x its time)" in peer and "(3.00x its time)" in peer
    assert f"its units' floor {1e3 * stage10['limit_s']:.4g} ms" in peer
    out = tmp_path / "b"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({"meta": {"device": "X", "date": "d", "command": "c",
                                                         "ceilings": None}, "rows": rows}))
    page = benchdoc.render([out], tmp_path / "docs" / "B.md", tmp_path / "docs" / "img")
    assert "| whole call s | % of floor | % of limit |" in page
    cells = [c.strip() for c in next(x for x in page.splitlines()
                                     if x.startswith("| 10 whole_cifar10 |")).strip("|").split("|")]
    assert cells[12] == benchdoc._pct(50.0) and cells[13] == benchdoc._pct(100 * stage10["limit_fraction"])
    assert "- 10 whole_cifar10 (cifar10, 1200 images): whole call" in page and "(3.00x its time)" in page


def test_groups_are_the_engines():
    """The floor groups a net as the engine calls it (``layers.groups``), so a fused row's bytes are its calls'."""
    net = get_net("ece408")
    got = floors.net_floor(net, 3, _rates(1, 1, 1, 1), {}, ("tanh", "pool"))
    want = [tuple(ly.name for ly in g) for g in layers.groups(list(net.layers), ("tanh", "pool"))
            if g[0].kind != "flatten"]
    assert [g.layers for g in got.groups] == want


def _fake_cupy(elapsed_ms: float, sms: int):
    """Enough of cupy for tools/mma_rates.py on a CPU: every launch and copy "takes" ``elapsed_ms``."""
    from types import SimpleNamespace as NS

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

    class Array:
        def __init__(self, n):
            self.nbytes = 4 * n
            self.data = NS(copy_from_device_async=lambda src, size: None)

    return NS(cuda=NS(Device=lambda: NS(id=0), Event=Event, get_elapsed_time=lambda a, b: elapsed_ms,
                      runtime=NS(getDeviceProperties=lambda i: {"multiProcessorCount": sms, "name": b"Fake GPU"})),
              RawModule=lambda code: NS(get_function=lambda name: lambda grid, block, args: None),
              zeros=lambda n, dtype: Array(n), ones=lambda n, dtype: Array(n),
              empty_like=lambda a: Array(a.nbytes // 4),
              float32="float32", int32=int, get_default_memory_pool=lambda: NS(free_all_blocks=lambda: None))


def test_mma_rates_writes_what_the_floor_reads(tmp_path, monkeypatch):
    import sys

    import tool_modules  # noqa: E402  (tests/ is on the path)

    mma = tool_modules.load("mma_rates")
    ms, sms, iters = float(RNG.uniform(0.5, 5)), int(RNG.integers(1, 200)), int(RNG.integers(16, 4096))
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(ms, sms))
    monkeypatch.setattr(floors, "STORE", tmp_path / "unit_rates.json")
    assert mma.main(["--repeat", "3", "--iters", str(iters), "--copy-mib", "64", "--out", str(tmp_path),
                     "--save"]) == 0
    written = json.loads((tmp_path / "mma_rates.json").read_text())
    warps = 8 * sms * 256 // 32
    rates = floors.rates_for("Fake GPU")
    for unit, row in (("fma", "ffma"), ("tf32", "tf32"), ("f16", "f16")):
        want = mma.PER_WARP_ITER[row] * warps * iters / (ms / 1e3)
        assert rates.macs[unit] == pytest.approx(want) == written["rows"][row]["tmacs"] * 1e12, SEED
    assert rates.bandwidth == pytest.approx(2 * (64 << 20) / (ms / 1e3)), SEED
    assert written["device"] == "Fake GPU" and "--save" in written["command"]
