"""The shipped weights: present, small, loadable, and as accurate as their records say (recomputed, not trusted)."""

import hashlib

import numpy as np
import pytest

from labkit import reference
from labkit.data import load_cifar10, load_fashion, to_input
from labkit.nets import CIFAR10, FASHION
from labkit.weights_io import WEIGHTS_DIR, load_weights, shipped_weights_path, weights_info

NETS = [CIFAR10, FASHION]
IDS = [net.name for net in NETS]
RECORD_FIELDS = {"net", "file", "sha256", "recipe", "seed", "versions", "training_data", "date", "command",
                 "training_wall_time_s", "accuracies"}
RECIPE_FIELDS = {"optimizer", "lr_schedule", "batch_size", "epochs", "augmentation", "loss"}
# The accuracies each record must hold: (images, split).
REPORTED = {"cifar10": {(1200, "train"), (50000, "train"), (1000, "test")},
            "fashion": {(100, "test"), (1000, "test"), (10000, "test")}}


def recorded(net, n, split):
    entry = [a for a in weights_info(net)["accuracies"] if a["images"] == n and a["split"] == split]
    assert len(entry) == 1, f"{net.name}.json should record exactly one accuracy for {n} {split} images"
    return entry[0]["value"]


def test_shipped_files_exist_and_total_under_10_mb():
    paths = [shipped_weights_path(net) for net in NETS]
    for path in paths:
        assert path.is_file(), f"{path} missing: run `python tools/train_weights.py --net all`"
        assert path.with_suffix(".json").is_file()
    total = sum(p.stat().st_size for p in WEIGHTS_DIR.glob("*.npz"))
    assert total < 10 * 1024 * 1024, f"shipped weights are {total} bytes, over 10 MB"


@pytest.mark.parametrize("net", NETS, ids=IDS)
def test_load_gives_float32_with_spec_shapes(net):
    weights = load_weights(net)
    expected = net.weight_shapes()
    assert set(weights) == set(expected)
    for key, shape in expected.items():
        assert weights[key].dtype == np.float32, key
        assert weights[key].shape == shape, key
        assert weights[key].flags.c_contiguous, key
        assert np.all(np.isfinite(weights[key])), key
        assert np.abs(weights[key]).max() > 0, f"{key} is all zeros"


def test_large_layers_stored_as_float16_and_upcast():
    with np.load(shipped_weights_path(FASHION)) as data:
        assert data["fc1.weight"].dtype == np.float16
        stored = data["fc1.weight"]
    loaded = load_weights(FASHION)["fc1.weight"]
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, stored.astype(np.float32))


@pytest.mark.parametrize("net", NETS, ids=IDS)
def test_record_fields_and_sha256(net):
    info = weights_info(net)
    assert RECORD_FIELDS <= set(info), f"missing {sorted(RECORD_FIELDS - set(info))}"
    assert info["net"] == net.name
    assert RECIPE_FIELDS <= set(info["recipe"]), f"recipe lacks {sorted(RECIPE_FIELDS - set(info['recipe']))}"
    assert {"torch", "numpy"} <= set(info["versions"])
    assert {"dataset", "split", "count"} <= set(info["training_data"])
    assert info["training_data"]["split"] == "train"
    assert info["training_data"]["count"] == {"cifar10": 50000, "fashion": 60000}[net.name]
    assert "smoke_test_limit" not in info, "shipped weights must come from a full run, not a --limit smoke test"
    assert info["command"].startswith("python tools/train_weights.py")
    assert info["training_wall_time_s"] > 0
    path = shipped_weights_path(net)
    assert info["file"] == path.name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == info["sha256"], "npz changed since its record"
    got = {(a["images"], a["split"]) for a in info["accuracies"]}
    assert got == REPORTED[net.name]
    for entry in info["accuracies"]:
        assert 0.0 <= entry["value"] <= 1.0
        assert "labkit.reference" in entry["computed_by"] and "as loaded" in entry["computed_by"]


def test_cifar10_recorded_accuracy_recomputes_exactly(cifar_root):
    images = load_cifar10(1200, "train")
    probs = reference.forward(CIFAR10, load_weights(CIFAR10), to_input(CIFAR10, images))
    assert reference.accuracy(probs, images.labels) == recorded(CIFAR10, 1200, "train")


def test_fashion_recorded_accuracy_recomputes_exactly(fashion_root):
    images = load_fashion(1000, "test")
    probs = reference.forward(FASHION, load_weights(FASHION), to_input(FASHION, images))
    assert reference.accuracy(probs, images.labels) == recorded(FASHION, 1000, "test")


def test_shipped_weights_far_above_chance(cifar_root, fashion_root, need):
    need("cifar-10-batches-bin/test_batch.bin")
    # Chance is 0.10 for both. Thresholds sit well below what training reaches, well above anything untrained.
    cifar = load_cifar10(500, "test")
    acc = reference.accuracy(reference.forward(CIFAR10, load_weights(CIFAR10), to_input(CIFAR10, cifar)),
                             cifar.labels)
    assert acc > 0.5, f"cifar10 shipped weights: {acc:.3f} on 500 test images"
    fashion = load_fashion(500, "test")
    acc = reference.accuracy(reference.forward(FASHION, load_weights(FASHION), to_input(FASHION, fashion)),
                             fashion.labels)
    assert acc > 0.8, f"fashion shipped weights: {acc:.3f} on 500 test images"


@pytest.mark.parametrize("net", NETS, ids=IDS)
def test_recorded_test_accuracy_far_above_chance(net):
    split_n = {"cifar10": (1000, "test"), "fashion": (10000, "test")}[net.name]
    assert recorded(net, *split_n) > {"cifar10": 0.5, "fashion": 0.88}[net.name]
