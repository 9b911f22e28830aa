"""The third network, ``ece408``: the ECE408 Spring 2019 project's own trained model (MXNet ``.params``), its spec,
its input preparation (the project's scikit-image resize, reimplemented in numpy), the importer, the command line,
and the self-checks and the simulator's shrunk copy of it."""

from __future__ import annotations

import hashlib
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import labkit as lk
from labkit import bench, check, data, device, gpu, reference, report, simulator, workloads
from labkit.cli import main
from labkit.ladder import bench_baselines
from labkit.layers import impl_for
from labkit.nets import ECE408, FASHION, NETS
from labkit.weights_io import (MXNET_NAMES, NOT_SHIPPED, course_weights, load_mxnet_params, load_weights,
                               read_mxnet_params)

from buggy_kernels import device_conv  # noqa: E402  (after labkit, which makes a late NUMBA_ENABLE_CUDASIM count)

ON_GPU = device.is_gpu()
PARAMS = "ece408-model/ece408-sp19-0002.params"
# the arrays of the Spring 2019 file, as its README lists them: MXNet name -> shape
DOCUMENTED = {"arg:new0_weight": (6, 1, 5, 5), "arg:new1_weight": (16, 6, 5, 5),
              "arg:fullyconnected0_weight": (140, 5184), "arg:fullyconnected0_bias": (140,),
              "arg:fullyconnected1_weight": (10, 140), "arg:fullyconnected1_bias": (10,)}


def run_cli(*args):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def params_file() -> Path:
    """The real ``.params`` file under LABKIT_DATA (skips, saying so, without it)."""
    root = os.environ.get("LABKIT_DATA")
    if not root or not (Path(root) / PARAMS).is_file():
        pytest.skip(f"the ECE408 model {PARAMS} is not under LABKIT_DATA ({root or 'unset'}): point LABKIT_DATA at "
                    f"a folder holding it (the course's trained weights; the kit ships no copy)")
    return Path(root) / PARAMS


# ------------------------------------------------------------------------------------------------------ spec


def test_spec_shapes_and_registration():
    assert NETS["ece408"] is ECE408 and lk.get_net("ece408") is ECE408
    shapes = ECE408.shapes()
    assert ECE408.input_shape == (1, 48, 48)
    assert shapes["conv1"] == (6, 44, 44) and shapes["tanh1"] == (6, 44, 44)
    assert shapes["pool1"] == (6, 22, 22)
    assert shapes["conv2"] == (16, 18, 18)
    assert shapes["flatten"] == (5184,)
    assert shapes["fc1"] == (140,) and shapes["tanh2"] == (140,)
    assert shapes["fc2"] == (10,) and shapes["softmax"] == (10,)
    assert [ly.kind for ly in ECE408.layers] == ["conv", "tanh", "pool", "conv", "flatten", "fc", "tanh", "fc",
                                                 "softmax"]
    assert not any(ly.bias for ly in ECE408.layers if ly.kind == "conv")
    assert all(ly.pad == 0 and ly.stride == 1 for ly in ECE408.layers if ly.kind == "conv")
    assert ECE408.weight_shapes() == {"conv1.weight": (6, 1, 5, 5), "conv2.weight": (16, 6, 5, 5),
                                      "fc1.weight": (140, 5184), "fc1.bias": (140,),
                                      "fc2.weight": (10, 140), "fc2.bias": (10,)}
    assert (ECE408.report, ECE408.dataset, ECE408.workloads, ECE408.default_images) == (
        "ece408", "fashion", (100, 1000, 10000), 10000)
    assert ECE408.classes == FASHION.classes and len(ECE408.classes) == 10
    assert ECE408.input_prep == "ece408" and FASHION.input_prep == ""
    assert set(MXNET_NAMES["ece408"].values()) == set(ECE408.weight_shapes())


def test_reference_forward_gives_probabilities():
    w = lk.random_weights(ECE408, seed=1)
    x = np.random.default_rng(0).uniform(0, 255, (3, 1, 48, 48)).astype(np.float32)
    probs = reference.forward(ECE408, w, x)
    assert probs.shape == (3, 10) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-5)


# ------------------------------------------------------------------------------------------ the .params format


def params_bytes(arrays: dict[str, np.ndarray], dtype_flag: int = 0) -> bytes:
    """An MXNet NDArray list written by hand from the format the data set's README gives (little-endian):
    uint64 0x112, uint64 0, uint64 count; per array uint32 0xF993FAC9, int32 storage type 0, uint32 ndim,
    int64 dims, int32 dev_type, int32 dev_id, int32 dtype, raw data; then uint64 count, per name uint64 length
    and its bytes."""
    dt = {0: "<f4", 1: "<f8", 2: "<f2"}[dtype_flag]
    out = [struct.pack("<QQQ", 0x112, 0, len(arrays))]
    for arr in arrays.values():
        out.append(struct.pack("<IiI", 0xF993FAC9, 0, arr.ndim))
        out.append(struct.pack(f"<{arr.ndim}q", *arr.shape))
        out.append(struct.pack("<iii", 1, 0, dtype_flag))
        out.append(np.ascontiguousarray(arr, dtype=dt).tobytes())
    out.append(struct.pack("<Q", len(arrays)))
    for name in arrays:
        raw = name.encode()
        out.append(struct.pack("<Q", len(raw)) + raw)
    return b"".join(out)


def synthetic_model(rng) -> dict[str, np.ndarray]:
    """Random arrays under the documented names and shapes, in the real file's order (biases first)."""
    order = ["arg:fullyconnected1_bias", "arg:fullyconnected1_weight", "arg:new1_weight", "arg:new0_weight",
             "arg:fullyconnected0_bias", "arg:fullyconnected0_weight"]
    return {name: rng.standard_normal(DOCUMENTED[name]).astype(np.float32) for name in order}


def test_importer_round_trip_on_a_synthetic_file(tmp_path, rng):
    model = synthetic_model(rng)
    path = tmp_path / "model-0002.params"
    path.write_bytes(params_bytes(model))
    assert {k: v.shape for k, v in read_mxnet_params(path).items()} == DOCUMENTED
    w = load_mxnet_params(path)
    assert set(w) == set(ECE408.weight_shapes())
    for mx_name, key in MXNET_NAMES["ece408"].items():
        assert w[key].dtype == np.float32 and w[key].flags.c_contiguous
        np.testing.assert_array_equal(w[key], model[f"arg:{mx_name}"])  # no permutation: MXNet's layout is the kit's
    routed = load_weights("ece408", path)  # load_weights sends a .params file to the importer
    assert all(np.array_equal(routed[k], w[k]) for k in w)
    # float64 and float16 storage are read and come out float32
    for flag in (1, 2):
        other = tmp_path / f"model-{flag}.params"
        other.write_bytes(params_bytes(model, dtype_flag=flag))
        w2 = load_mxnet_params(other)
        assert all(v.dtype == np.float32 for v in w2.values())
        np.testing.assert_allclose(w2["conv1.weight"], model["arg:new0_weight"], rtol=1e-3)


def _one_line_error(path, match: str, net="ece408"):
    with pytest.raises(ValueError, match=match) as info:
        load_mxnet_params(path, net)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_bad_files_are_one_clear_error_each(tmp_path, rng):
    model = synthetic_model(rng)
    good = params_bytes(model)

    npz = tmp_path / "weights.params"
    np.savez(npz.with_suffix(".npz"), a=np.zeros(3))
    npz.write_bytes(npz.with_suffix(".npz").read_bytes())
    _one_line_error(npz, "not an MXNet NDArray list")
    tiny = tmp_path / "tiny.params"
    tiny.write_bytes(b"\x12\x01")
    _one_line_error(tiny, "not an MXNet NDArray list")

    # truncated: in the header, inside an array's shape, inside its data, inside the names
    for cut in (20, 24 + 13, 24 + 60, len(good) - 5):
        bad = tmp_path / f"cut{cut}.params"
        bad.write_bytes(good[:cut])
        _one_line_error(bad, "truncated|not an MXNet")
    cut = tmp_path / "cut-data.params"
    cut.write_bytes(good[:len(good) // 2])
    _one_line_error(cut, "is truncated: it ends at byte")

    stray = tmp_path / "stray.params"
    stray.write_bytes(good + b"\0\0")
    _one_line_error(stray, "stray bytes")

    renamed = dict(model)
    renamed["arg:conv9_weight"] = renamed.pop("arg:new1_weight")
    wrong = tmp_path / "renamed.params"
    wrong.write_bytes(params_bytes(renamed))
    _one_line_error(wrong, r"does not hold the ece408 model: unexpected arrays \['arg:conv9_weight'\], missing "
                           r"\['arg:new1_weight'\]")

    reshaped = dict(model)
    reshaped["arg:new0_weight"] = rng.standard_normal((12, 1, 5, 5)).astype(np.float32)
    wrong.write_bytes(params_bytes(reshaped))
    _one_line_error(wrong, r"arg:new0_weight has shape \(12, 1, 5, 5\); ece408's conv1.weight needs \(6, 1, 5, 5\)")

    nan = dict(model)
    nan["arg:fullyconnected1_bias"] = np.full(10, np.nan, np.float32)
    wrong.write_bytes(params_bytes(nan))
    _one_line_error(wrong, "NaN")

    wrong.write_bytes(good)
    _one_line_error(wrong, "can be imported for ece408 only, not 'cifar10'", net="cifar10")


def test_bad_params_through_the_cli_is_one_line(tmp_path, rng):
    bad = tmp_path / "ece408-sp19-0002.params"
    bad.write_bytes(params_bytes(synthetic_model(rng))[:1000])
    result = CliRunner().invoke(main, ["run", "--net", "ece408", "--images", "2", "--synthetic", "--weights",
                                       str(bad)])
    assert result.exit_code != 0 and "is truncated" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_the_real_file_loads_with_the_documented_shapes(params_file):
    stored = read_mxnet_params(params_file)
    assert {k: v.shape for k, v in stored.items()} == DOCUMENTED
    assert all(v.dtype == np.float32 for v in stored.values())
    w = load_weights("ece408", params_file)
    assert {k: v.shape for k, v in w.items()} == ECE408.weight_shapes()
    for key, arr in w.items():
        assert arr.dtype == np.float32 and np.all(np.isfinite(arr)) and np.abs(arr).max() > 0, key


# --------------------------------------------------------------------------------------------- input preparation

# How resize_constant_uint8 was verified against scikit-image (which labkit does not depend on): in a scratch
# virtualenv made outside the repository (python3 -m venv, then pip install scikit-image numpy: scikit-image 0.26.0,
# scipy 1.17.1, numpy 2.4.6), every one of the 10000 Fashion-MNIST t10k images was prepared as
# the data set's README says, (skimage.transform.resize(img / 256, (48, 48), mode='constant', cval=0) * 256)
# .astype(np.uint8), saved with np.save, and compared with labkit.data.resize_constant_uint8 in the kit's
# environment: 0 of 23,040,000 pixels differ. The same held for synthetic images there (random, no zero pixel, a
# narrow range, all 256 constant images, sparse, 28->70, 11x17->23x40, same size). Two things matter for bit-exact
# results and are reproduced: scipy's order of float64 operations (((p * wr) * wc) summed over the 2x2 taps
# row-major: a matrix form of the same bilinear resize differs in 17956 pixels of the 10000 images) and
# scikit-image's clip to each image's own [min, max] (a constant image stays constant).
# The values pinned below were computed by labkit's implementation AFTER it matched scikit-image as described,
# never typed from scikit-image output.

PATTERN = ((np.arange(28 * 28).reshape(28, 28) * 37 + 11) % 256).astype(np.uint8)
NO_ZERO = (PATTERN // 2 + 100).astype(np.uint8)  # darkest pixel 100: the faded border is clipped up to it


def test_resize_matches_pinned_values():
    y = data.resize_constant_uint8(np.stack([PATTERN, NO_ZERO, np.full((28, 28), 200, np.uint8)])[:, None],
                                   (48, 48))
    assert y.dtype == np.uint8 and y.shape == (3, 1, 48, 48)
    pat, nz, const = y[:, 0]
    assert pat[0, :6].tolist() == [6, 19, 36, 53, 70, 88]
    assert pat[:6, 0].tolist() == [6, 12, 17, 23, 28, 34]
    assert pat[47, 44:].tolist() == [107, 14, 31, 33]
    assert pat[24, 22:27].tolist() == [131, 153, 174, 196, 217]
    assert int(pat.sum(dtype=np.int64)) == 287321
    assert hashlib.sha256(pat.tobytes()).hexdigest() == (
        "5ddd2efec4db03fdc240108d413a76e69d0b016ca5f5864d4d476dc870d44034")
    assert nz[0, :6].tolist() == [100, 100, 100, 105, 114, 123] and nz[:6, 0].tolist() == [100] * 6
    assert hashlib.sha256(nz.tobytes()).hexdigest() == (
        "beda256d4c88eeeed59a1a95ffe4671176b20fb0e8b1975b351a4c0876c00945")
    assert np.all(const == 200)


def test_resize_is_not_the_fashion_nets_edge_clamped_resize():
    x = np.full((1, 1, 28, 28), 255, np.uint8)
    x[0, 0, 0, 0] = 0  # the darkest pixel is 0: nothing clips the border back up
    ece = data.to_input(ECE408, x)
    assert ece.dtype == np.float32 and ece.shape == (1, 1, 48, 48)
    assert np.array_equal(ece, np.floor(ece)) and ece.max() == 255  # uint8 values as float, no normalisation
    assert ece[0, 0, 47, 47] < 200  # zeros outside the image: the border fades
    fashion = data.to_input(FASHION, x)  # the fashion net keeps its own preparation: byte/255, clamped edges, 70x70
    np.testing.assert_array_equal(fashion, data.resize_bilinear(x.astype(np.float32) / np.float32(255.0), 70))
    assert fashion.shape == (1, 1, 70, 70) and fashion[0, 0, 69, 69] > 0.99  # clamped: no fade


def test_upscaling_only_and_unknown_preparations_refused():
    with pytest.raises(ValueError, match="upscales only"):
        data.resize_constant_uint8(np.zeros((1, 1, 28, 28), np.uint8), (20, 48))
    odd = lk.Net("odd", (1, 8, 8), (lk.Layer("s", "softmax"),), "fashion", "ece408", input_prep="mystery")
    with pytest.raises(ValueError, match="no input preparation 'mystery'"):
        data.to_input(odd, np.zeros((1, 1, 28, 28), np.uint8))


def test_real_inputs_match_pinned_values(fashion_root):
    images = data.load_fashion(None, "test")
    x = data.to_input(ECE408, images)
    assert x.shape == (10000, 1, 48, 48) and x.dtype == np.float32
    u8 = x.astype(np.uint8)
    assert np.array_equal(u8, x)
    assert int(u8.sum(dtype=np.int64)) == 1675682946
    assert hashlib.sha256(u8[:, 0].tobytes()).hexdigest() == (
        "90e1d81af661e453b6e8e6118aa9731052d389dbd5496dd72e734a17f69338a3")
    assert u8[0, 0, 20, 18:30].tolist() == [0, 1, 1, 1, 0, 12, 46, 84, 123, 122, 120, 128]


# ------------------------------------------------------------------------------------------- without the weights


@pytest.fixture
def no_course_data(monkeypatch, tmp_path):
    """LABKIT_DATA unset and the other data search roots (the repository's data/, the user cache) empty folders:
    the ECE408 weights are nowhere."""
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path / "repo-data")
    monkeypatch.setattr(data, "user_cache", lambda: tmp_path / "user-cache")
    assert [label for label, _ in data.search_roots()] == ["repository data/", "user cache"]
    assert course_weights("ece408") is None


def test_no_shipped_weights_is_one_clear_line(no_course_data):
    code, out = run_cli("run", "--net", "ece408", "--images", "3", "--synthetic")
    assert code != 0 and "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert NOT_SHIPPED["ece408"] in out
    assert "--weights PATH/ece408-sp19-0002.params" in out and "github.com/illinois-impact/ece408_mxnet_docker" in out
    with pytest.raises(FileNotFoundError) as info:
        workloads.workload("ece408", 3, target="cpu", quiet=True)
    assert str(info.value) == NOT_SHIPPED["ece408"]
    with pytest.raises(FileNotFoundError, match="ships no weights for ece408"):
        load_weights("ece408")


def test_cli_runs_with_weights_from_a_params_file(tmp_path, rng):
    path = tmp_path / "ece408-sp19-0002.params"
    path.write_bytes(params_bytes(synthetic_model(rng)))
    code, out = run_cli("run", "--net", "ece408", "--images", "3", "--synthetic", "--weights", str(path))
    assert code == 0, out
    assert len(re.findall(r"^Op Time: \d+\.\d{6}$", out, re.M)) == 2
    assert re.search(r"^Correctness: n/a Model: ece408$", out, re.M)


# ---------------------------------------------------------------------------------------- the real model's figure


def test_cli_reports_the_real_models_correctness(params_file, fashion_root):
    code, out = run_cli("run", "--net", "ece408", "--images", "100", "--weights", str(params_file))
    assert code == 0, out
    assert len(re.findall(r"^Op Time: \d+\.\d{6}$", out, re.M)) == 2
    assert re.search(r"^Correctness: 0\.\d{4} Model: ece408$", out, re.M)


def test_correctness_on_1000_images_is_the_references(params_file, fashion_root, monkeypatch):
    """A consistency check, not a typed figure: what `labkit run` prints for the first 1000 test images is what
    the numpy reference computes through labkit.run on the same workload, and far above chance (0.1)."""
    code, out = run_cli("run", "--net", "ece408", "--images", "1000", "--weights", str(params_file))
    assert code == 0, out
    printed = re.search(r"^Correctness: (0\.\d{4}) Model: ece408$", out, re.M).group(1)
    monkeypatch.delenv("LABKIT_QUICK", raising=False)  # the suite's CPU cap would take 64 images
    wl = lk.workload("ece408", 1000, target="cpu", weights=params_file, allow_synthetic=False, quiet=True)
    assert wl.images == 1000 and not wl.synthetic
    result = lk.run(wl, warmup=False, quiet=True)
    assert result.report.accuracy == reference.accuracy(reference.forward(ECE408, wl.weights, wl.x), wl.labels)
    assert f"{result.report.accuracy:.4f}" == printed
    assert result.report.accuracy > 0.5


# ------------------------------------------------------------------------------- self-checks and the simulator


def good_conv(x, w, b, out, pad, stride):
    out[...] = lk.conv2d(x, w, b, pad, stride, accumulate="float64")


@pytest.mark.parametrize("layer", ["conv1", "conv2"])
def test_check_layer_passes_a_correct_conv(layer):
    r = check.check_layer(good_conv, "ece408", layer, quiet=True)
    assert r.passed and r.batches == check.default_batches(), str(r)


def test_check_layer_catches_a_wrong_conv():
    def flipped(x, w, b, out, pad, stride):
        good_conv(x, w[:, :, ::-1, ::-1].copy(), b, out, pad, stride)  # convolution, not cross-correlation

    assert not check.check_layer(flipped, "ece408", "conv1", quiet=True).passed


def test_simulator_shrinks_ece408_to_a_valid_net():
    small = simulator.net("ece408")
    assert small.name == "ece408-mini" and small.input_prep == "ece408"
    assert small.input_shape[1] != small.input_shape[2]  # not square: swapped indices fail
    assert all(d >= 1 for shape in small.shapes().values() for d in shape), small.shapes()
    assert all(small.layer(n).out <= simulator.MAX_CHANNELS for n in small.conv_layers)
    assert [ly.kind for ly in small.layers] == [ly.kind for ly in ECE408.layers]
    assert report.spec_of("ece408-mini").shapes() == small.shapes()


def test_whole_net_on_the_device_path():
    """The kit's GPU kernels and a GPU conv chain through the engine for ece408 (its shrunk copy on the
    simulator), and a simulated workload reports in the ECE408 format."""
    variant = lk.Variant({**lk.kernels.GIVEN, "conv": device_conv}, arrays="device")
    r = check.check_network(variant, "ece408", batches=(1, 3) if not ON_GPU else None, quiet=True)
    assert r.passed, str(r)
    if not ON_GPU:
        wl = workloads.workload("ece408", target="gpu", quiet=True)  # random weights on the shrunk net
        assert wl.simulated and wl.net.name == "ece408-mini"
        out = str(lk.run(wl, variant, warmup=False, quiet=True))
        assert len(re.findall(r"^Op Time: \d+\.\d{6}$", out, re.M)) == 2
        assert "Correctness: n/a Model: ece408-mini" in out


# --------------------------------------------------------------------- every stage's fashion kernels run ece408


def test_variants_run_ece408_through_fashions_kernels():
    assert ECE408.kernels_of == "fashion" and FASHION.kernels_of == "" and lk.get_net("cifar10").kernels_of == ""
    assert simulator.net("ece408").kernels_of == "fashion"  # the simulator's shrunk copy keeps it
    variants = {"both": lk.Variant(), "fashion": lk.Variant(nets=("fashion",)),
                "cifar10": lk.Variant(nets=("cifar10",))}
    truth = {("both", "cifar10"): True, ("both", "fashion"): True, ("both", "ece408"): True,
             ("fashion", "cifar10"): False, ("fashion", "fashion"): True, ("fashion", "ece408"): True,
             ("cifar10", "cifar10"): True, ("cifar10", "fashion"): False, ("cifar10", "ece408"): False}
    assert {(v, net): variants[v].runs_on(net) for v, net in truth} == truth
    assert lk.Variant(nets=("ece408",)).runs_on("ece408") and not lk.Variant(nets=("ece408",)).runs_on("fashion")
    with pytest.raises(ValueError, match="unknown network"):
        variants["both"].runs_on("imagenet")
    assert "ece408" not in lk.Variant().nets  # the grader's contract (variant.nets) never needs the unshipped weights


def _stages_with_variants() -> list[str]:
    """Stage numbers whose solution notebook has kernel cells defining VARIANTS (read, not run: collection stays
    fast)."""
    from labkit.nbcells import NotebookError, read, tagged_cells

    def has_variants(path) -> bool:
        try:
            return any("VARIANTS" in src for _, src in tagged_cells(read(path)))
        except NotebookError:
            return True  # unreadable: its test says why, collection goes on

    folder = lk.stages.solutions_folder()
    return [n for n, s in lk.stages.STAGES.items()
            if (folder / s.notebook).is_file() and has_variants(folder / s.notebook)]


@pytest.mark.parametrize("stage", _stages_with_variants())
def test_every_stages_fashion_kernels_pass_their_checks_on_ece408(stage):
    """Each variant of the stage's solution that runs fashion passes the self-checks on ece408 (on the simulator its
    shrunk copy, batches 1 and 3): every layer it computes, then its whole forward pass. CPU and per-image variants
    included (a few seconds each); variants that need cupy say why they cannot run here and are left out."""
    variants = lk.stages.load_variants(lk.stages.solutions_folder() / lk.stages.STAGES[stage].notebook)
    runs = {name: v for name, v in variants.items() if v.runs_on("ece408")}
    assert runs.keys() == {name for name, v in variants.items() if "fashion" in v.nets}
    checked, done = [], {}
    for name, variant in runs.items():
        if variant.unavailable():
            assert "cupy" in variant.requires
            continue
        results = check.check_variant(variant, "ece408", quiet=True, batches=(1, 3), done=done)
        failed = [str(r) for r in results if not r.passed]
        assert not failed, f"{variant.label} on ece408: {failed}"
        names = [r.name for r in results]
        covered = {layer for n in names for layer in n.split("+")}  # a fused group checks all of its layers
        computed = {ly.name for ly in ECE408.layers if impl_for(variant.impls, ly) is not None} - {"flatten"}
        assert {"conv1", "conv2"} <= computed <= covered, (variant.label, names)
        assert names[-1] == "ece408 forward", (variant.label, names)
        checked.append(name)
    assert checked, f"stage {stage}: no variant that runs fashion could be checked here"


def test_the_course_weights_are_found_under_labkit_data(params_file, fashion_root):
    """No --weights: the file under $LABKIT_DATA, the same arrays as loading it by path, and `labkit run` prints the
    Correctness the kit computes from them (the numpy reference on the same 100 images), never a typed figure."""
    assert course_weights("ece408") == params_file
    found = load_weights("ece408")
    given = load_weights("ece408", params_file)
    assert found.keys() == given.keys() and all(np.array_equal(found[k], given[k]) for k in found)
    code, out = run_cli("run", "--net", "ece408", "--images", "100")
    assert code == 0, out
    assert "weights $LABKIT_DATA/ece408-model/ece408-sp19-0002.params" in out
    printed = re.search(r"^Correctness: (0\.\d{4}|1\.0000) Model: ece408$", out, re.M)
    assert printed, out
    x, stored = data.load_inputs("ece408", 100)
    expected = reference.accuracy(reference.predict(reference.forward(ECE408, given, x)), stored.labels)
    assert printed.group(1) == f"{expected:.4f}"


def test_bench_runs_a_stages_fashion_kernels_on_ece408(params_file, fashion_root, tmp_path):
    rows = bench.bench(["05"], nets=["ece408"], images=(2,), out=tmp_path / "out", repeat=1, progress=False,
                       baselines=True, command="pytest ece408 bench", skip=["*_16"])  # one kernel is enough
    assert {r["net"] for r in rows} == {"ece408"}
    (timed,) = [r for r in rows if r["stage"] == "05 tiled_8"]
    assert timed["checks"] == "PASS" and not timed["check_failures"] and "error" not in timed, timed
    assert timed["total_s"] > 0 and set(timed["layer_seconds"]) >= {"conv1", "conv2"}
    assert timed["workload"].startswith("ece408: 2 fashion" if ON_GPU else "simulated: ece408-mini"), timed
    assert timed["predictions_equal"] is True
    (left_out,) = [r for r in rows if r["stage"] == "05 tiled_16"]
    assert left_out["skipped"] == "left out by --skip"
    # real ece408, the course's weights, real images
    (ref,) = [r for r in rows if r["stage"] == bench_baselines.REFERENCE_STAGE]
    assert ref["workload"].startswith("ece408: 2 fashion test images from $LABKIT_DATA") and ref["accuracy"] is not None
    assert (tmp_path / "out" / "bench.csv").read_text().count("ece408") == len(rows)


def test_bench_jobs_and_workloads_per_net(tmp_path):
    """Which (variant, net, images) rows the bench makes, without running any (every variant left out by --skip):
    --nets ece408 takes every variant that runs it, at ece408's own workloads; no --nets, each variant's own nets."""
    def jobs(nets):
        rows = bench.bench(["09"], nets=nets, out=tmp_path / str(nets), progress=False, baselines=False,
                           command="pytest", skip=["*"])
        assert all(r["skipped"] == "left out by --skip" for r in rows)
        return {(r["variant"], r["net"], r["images"]) for r in rows}

    variants = lk.stages.load_variants(lk.stages.solutions_folder() / "09_per_layer_tuning.ipynb")
    on_ece408 = [name for name, v in variants.items() if v.runs_on("ece408")]
    assert "tuned_fashion" in on_ece408 and "tuned_cifar10" not in on_ece408
    assert ECE408.workloads == FASHION.workloads == (100, 1000, 10000)
    assert jobs(["ece408"]) == {(name, "ece408", n) for name in on_ece408 for n in ECE408.workloads}
    assert jobs(None) == {(name, net, n) for name, v in variants.items() for net in v.nets
                          for n in lk.get_net(net).workloads}


def test_bench_without_the_course_weights_is_one_line(no_course_data, tmp_path):
    with pytest.raises(bench.BenchError) as info:
        bench.validate(None, ["ece408"], None, lk.stages.solutions_folder())
    assert str(info.value) == (f"--nets ece408: {NOT_SHIPPED['ece408']}; or --random-weights to time it on random "
                               f"weights") and "\n" not in str(info.value)
    bench.validate(None, ["fashion"], None, lk.stages.solutions_folder())  # the other nets need no such file
    code, out = run_cli("bench", "--nets", "ece408", "--images", "2", "--out", str(tmp_path / "out"))
    assert code != 0 and len(out.strip().splitlines()) == 1 and NOT_SHIPPED["ece408"] in out, out
    assert not (tmp_path / "out").exists()  # refused before anything ran
