"""The numpy reference against independent computations, and the specs and weight files it runs on."""

import numpy as np
import pytest
from scipy import signal

from labkit import data, nets, reference, weights_io


def loop_conv(x, w, b, pad, stride):
    """Plain loops, straight from the definition: the slowest and most obvious convolution."""
    n, c, h, wd = x.shape
    m, _, k, _ = w.shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (wd + 2 * pad - k) // stride + 1
    out = np.zeros((n, m, ho, wo))
    for a in range(n):
        for o in range(m):
            for i in range(ho):
                for j in range(wo):
                    s = 0.0 if b is None else float(b[o])
                    for ch in range(c):
                        for p in range(k):
                            for q in range(k):
                                r, col = i * stride + p - pad, j * stride + q - pad
                                if 0 <= r < h and 0 <= col < wd:
                                    s += float(x[a, ch, r, col]) * float(w[o, ch, p, q])
                    out[a, o, i, j] = s
    return out


@pytest.mark.parametrize("n,c,m,h,w,k,pad,stride", [(2, 3, 4, 7, 6, 5, 2, 1), (1, 2, 3, 9, 8, 3, 0, 2),
                                                     (3, 1, 2, 6, 6, 5, 0, 1)])
def test_conv2d_matches_plain_loops(rng, n, c, m, h, w, k, pad, stride):
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((m, c, k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    got = reference.conv2d(x, wt, b, pad, stride, accumulate="float64")
    np.testing.assert_allclose(got, loop_conv(x, wt, b, pad, stride), rtol=1e-10, atol=1e-10)


def test_conv2d_matches_scipy_correlate(rng):
    """Cross-correlation (not convolution), zero padding: scipy.signal.correlate with mode='valid' on the padded input."""
    x = rng.standard_normal((2, 3, 12, 10)).astype(np.float32)
    wt = rng.standard_normal((5, 3, 5, 5)).astype(np.float32)
    got = reference.conv2d(x, wt, None, pad=2, accumulate="float64")
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)))
    for a in range(2):
        for o in range(5):
            want = signal.correlate(xp[a], wt[o].astype(np.float64), mode="valid")[0]
            np.testing.assert_allclose(got[a, o], want, rtol=1e-10, atol=1e-10)


def test_float32_reference_close_to_float64(rng):
    x = rng.standard_normal((3, 16, 16, 16)).astype(np.float32)
    wt = rng.standard_normal((20, 16, 5, 5)).astype(np.float32)
    f32 = reference.conv2d(x, wt, None, 2)
    f64 = reference.conv2d(x, wt, None, 2, accumulate="float64")
    assert f32.dtype == np.float32 and f64.dtype == np.float64
    assert np.linalg.norm(f32 - f64) / np.linalg.norm(f64) < 1e-6


def test_conv2d_chunking_does_not_change_results(rng):
    x = rng.standard_normal((300, 3, 32, 32)).astype(np.float32)  # > one 64 MB chunk of im2col in float64
    wt = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    whole = reference.conv2d(x, wt, None, 2, accumulate="float64")
    np.testing.assert_allclose(whole[[0, 150, 299]], reference.conv2d(x[[0, 150, 299]], wt, None, 2,
                                                                      accumulate="float64"), rtol=1e-12)


def test_conv2d_threads_do_not_change_results(rng, monkeypatch):
    x = rng.standard_normal((700, 3, 32, 32)).astype(np.float32)  # four chunks of im2col in float32
    wt = rng.standard_normal((5, 3, 5, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    monkeypatch.setattr(reference, "CONV_THREADS", 1)
    serial = reference.conv2d(x, wt, b, 2)
    monkeypatch.setattr(reference, "CONV_THREADS", 3)
    np.testing.assert_array_equal(reference.conv2d(x, wt, b, 2), serial)
    np.testing.assert_allclose(serial[[0, 699]], reference.conv2d(x[[0, 699]], wt, b, 2), rtol=1e-5, atol=1e-4)


def test_pool_relu_fc_softmax(rng):
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    pooled = reference.maxpool2d(x, 2, 2)
    assert pooled.shape == (2, 3, 2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(pooled[:, :, i, j], x[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2].max(axis=(2, 3)))
    overlapping = reference.maxpool2d(x, 3, 2)  # windows that share a row and a column
    assert overlapping.shape == (2, 3, 2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(overlapping[:, :, i, j],
                                          x[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3)))
    np.testing.assert_array_equal(reference.relu(x), np.where(x > 0, x, 0))
    v = rng.standard_normal((4, 6))
    w, b = rng.standard_normal((3, 6)), rng.standard_normal(3)
    np.testing.assert_allclose(reference.fc(v, w, b, "float64"), [[b[o] + sum(v[n, k] * w[o, k] for k in range(6))
                                                                   for o in range(3)] for n in range(4)])
    s = reference.softmax(np.array([[1000.0, 1000.0], [0.0, np.log(3.0)]]))
    np.testing.assert_allclose(s, [[0.5, 0.5], [0.25, 0.75]])


@pytest.mark.parametrize("name", ["cifar10", "fashion"])
def test_forward_layer_by_layer(rng, name):
    net = nets.get_net(name)
    w = weights_io.random_weights(net, seed=int(rng.integers(1000)))
    x = rng.uniform(-0.5, 0.5, (3, *net.input_shape)).astype(np.float32)
    outs = reference.forward(net, w, x, keep=True)
    assert list(outs) == net.layer_names
    for layer, shape in net.shapes().items():
        assert outs[layer].shape == (3, *shape) and outs[layer].dtype == np.float32
    np.testing.assert_allclose(outs["softmax"].sum(axis=1), 1.0, rtol=1e-6)
    # upto / start compose to the whole net
    mid = reference.forward(net, w, x, upto="pool1")
    np.testing.assert_array_equal(mid, outs["pool1"])
    rest = reference.forward(net, w, mid, start=net.layers[net.index("pool1") + 1].name)
    np.testing.assert_allclose(rest, outs["softmax"], rtol=1e-6)


def test_forward_rejects_wrong_shape():
    net = nets.get_net("cifar10")
    with pytest.raises(ValueError, match=r"\(N, 3, 32, 32\)"):
        reference.forward(net, weights_io.random_weights(net), np.zeros((2, 32, 32, 3), np.float32))


def test_network_shapes_are_the_designs():
    c, f = nets.get_net("cifar10").shapes(), nets.get_net("fashion").shapes()
    assert c["conv1"] == (16, 32, 32) and c["pool1"] == (16, 16, 16) and c["pool2"] == (20, 8, 8)
    assert c["pool3"] == (20, 4, 4) and c["flatten"] == (320,) and c["softmax"] == (10,)
    assert f["conv1"] == (12, 66, 66) and f["pool1"] == (12, 33, 33) and f["conv2"] == (24, 29, 29)
    assert f["flatten"] == (20184,) and f["fc1"] == (160,) and f["softmax"] == (10,)
    ws = nets.get_net("fashion").weight_shapes()
    assert "conv1.bias" not in ws and ws["fc1.weight"] == (160, 20184)


def test_weights_npz_round_trip_and_validation(tmp_path, rng):
    net = nets.get_net("fashion")
    w = weights_io.random_weights(net, seed=1)
    path = weights_io.save_weights(tmp_path / "w.npz", net, w, float16_above=100_000)
    back = weights_io.load_weights(net, path)
    assert all(a.dtype == np.float32 for a in back.values())
    np.testing.assert_array_equal(back["conv1.weight"], w["conv1.weight"])
    np.testing.assert_allclose(back["fc1.weight"], w["fc1.weight"], rtol=1e-3, atol=1e-4)  # stored as float16
    bad = dict(w)
    bad["conv2.weight"] = bad["conv2.weight"][:, :6]
    with pytest.raises(ValueError, match="conv2.weight has shape"):
        weights_io.validate_weights(net, bad)
    with pytest.raises(ValueError, match="missing"):
        weights_io.validate_weights(net, {k: v for k, v in w.items() if k != "fc2.bias"})
    with pytest.raises(FileNotFoundError, match="no weights"):
        weights_io.load_weights(net, tmp_path / "absent.npz")


def test_c_study_importer_matches_the_golden_conv1_output(c_study_weights, cifar_root, need):
    need("cnn-cifar10-weights/conv1_output_image0.gold.txt")
    w = weights_io.load_c_study_weights(c_study_weights)
    gold = np.loadtxt(c_study_weights / "conv1_output_image0.gold.txt", skiprows=1).reshape(16, 32, 32)
    x = data.to_input("cifar10", data.load_cifar10(1))
    got = reference.forward("cifar10", w, x, upto="conv1")[0]
    assert np.abs(got - gold).max() < 1e-5


def test_c_study_weights_classify_far_above_chance(c_study_weights, cifar_root):
    w = weights_io.load_weights("cifar10", c_study_weights)  # a folder goes through the importer
    x, images = data.load_inputs("cifar10", 1200)
    acc = reference.accuracy(reference.forward("cifar10", w, x), images.labels)
    assert acc > 0.5, f"C-study weights reach only {acc} on the first 1200 training images"


def test_c_study_importer_rejects_malformed_files(tmp_path, c_study_weights):
    for name in weights_io.C_STUDY_FILES.values():
        (tmp_path / name).write_text((c_study_weights / name).read_text())
    lines = (tmp_path / "layer4_conv.txt").read_text().split()
    (tmp_path / "layer4_conv.txt").write_text(" ".join(lines[:-3]))
    with pytest.raises(ValueError, match="layer4_conv.txt: header '5 5 16 20' needs"):
        weights_io.load_c_study_weights(tmp_path)
    (tmp_path / "layer10_fc.txt").unlink()
    with pytest.raises(FileNotFoundError, match="layer10_fc.txt"):
        weights_io.load_c_study_weights(tmp_path)


def test_truncated_npz_is_one_clear_error(tmp_path):
    net = nets.get_net("cifar10")
    good = weights_io.save_weights(tmp_path / "w.npz", net, weights_io.random_weights(net))
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable .npz weights file") as info:
        weights_io.load_weights(net, bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["cifar10", "fashion"])
def test_layer_costs_follow_the_spec(name, rng):
    net = nets.get_net(name)
    batch = int(rng.integers(1, 9))
    costs = nets.net_cost(net, batch)
    assert list(costs) == [ly.name for ly in net.layers if ly.kind != "flatten"]
    for layer in net.layers:
        if layer.kind != "conv":
            continue
        c, _, _ = net.input_shape_of(layer.name)
        m, ho, wo = net.shapes()[layer.name]
        cost = costs[layer.name]
        assert cost.flops == batch * m * ho * wo * (2 * c * layer.kernel ** 2 + int(layer.bias))
        n_in, n_out = c * int(np.prod(net.input_shape_of(layer.name)[1:])), m * ho * wo
        assert cost.bytes == 4 * (batch * (n_in + n_out) + m * c * layer.kernel ** 2 + (m if layer.bias else 0))
        assert cost.intensity == cost.flops / cost.bytes
    assert nets.layer_cost(net, "flatten", batch) == nets.Cost(0, 0)
