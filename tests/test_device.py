"""labkit.device under the simulator: it must say so, never claim a GPU, and shrink the work."""

import os

import pytest

from labkit import device
from labkit.nets import CIFAR10, FASHION

pytestmark = pytest.mark.skipif(os.environ.get("LABKIT_TEST_GPU") == "1", reason="simulator-only expectations")


def test_info_says_simulator_and_no_gpu():
    d = device.info()
    assert d.kind == "simulator"
    assert d.simulated is True
    assert d.name == "CUDA simulator"
    assert not d.gpu
    assert d.cupy is False  # never probed under the simulator
    assert d.numba_cuda is True and d.numba_version
    assert d.compute_capability is None and d.memory_total is None
    assert any("CUDA simulator" in n and "not meaningful" in n for n in d.notes)
    assert device.info() is d  # cached
    assert device.info(refresh=True) == d


def test_info_is_frozen():
    with pytest.raises(Exception):
        device.info().kind = "gpu"


def test_describe_explains_findings():
    text = device.describe()
    assert "CUDA simulator" in text
    assert "sizes are shrunk" in text and "timings are not meaningful" in text
    assert "managed memory and CUDA C via cupy need a real GPU" in text
    assert "labkit[cuda12]" in text or "labkit[cuda13]" in text
    assert "GPU:" not in text.split("\n")[0]


def test_label_is_stable():
    assert device.label() == "CUDA simulator (CPU)"
    assert device.label() == device.label(device.info())


def test_problem_size_shrinks_but_stays_sane(monkeypatch):
    monkeypatch.delenv("LABKIT_SIM_IMAGES", raising=False)
    for net in (CIFAR10, FASHION, "cifar10", None):
        for wanted in (1, 3, 100, 1200, 50000):
            n = device.problem_size(net, wanted)
            assert 1 <= n <= min(wanted, device.SIM_MAX_IMAGES)
    assert device.problem_size("cifar10", 1200) == 4
    assert device.problem_size("fashion", 10000) < device.problem_size("cifar10", 1200)  # costlier convs
    assert device.problem_size("fashion", 1) == 1
    assert device.problem_size("cifar10", 1200, kernels=False) == 1200  # CPU-only work runs in full
    monkeypatch.setenv("LABKIT_SIM_IMAGES", "7")
    assert device.problem_size("cifar10", 1200) == 7
    assert device.problem_size("cifar10", 5) == 5
    with pytest.raises(ValueError):
        device.problem_size("cifar10", 0)


def test_check_batches_small_with_an_odd_one():
    batches = device.check_batches()
    assert 1 in batches and any(b % 2 == 1 and b > 1 for b in batches)
    assert max(batches) <= 4


@pytest.mark.parametrize("shape,expected", [
    ((16, 32, 32), (16, 9, 7)),
    ((5, 3, 70, 70), (5, 3, 9, 7)),
    ((20, 8, 8), (20, 8, 7)),
    ((12, 4, 4), (12, 4, 4)),
    ((320,), (320,)),
])
def test_check_spatial(shape, expected):
    out = device.check_spatial(shape)
    assert out == expected
    assert len(out) == len(shape) and out[:-2] == shape[:-2] or len(shape) < 3


def test_check_spatial_is_odd_and_not_square_for_large_maps():
    c, h, w = device.check_spatial((3, 70, 70))
    assert c == 3 and h % 2 == 1 and w % 2 == 1 and h != w


def test_requires_gpu_prints_one_line(capsys):
    assert device.requires_gpu("managed memory") is False
    out = capsys.readouterr().out
    assert out == "SKIPPED (needs a real GPU): managed memory\n"


def test_extra_for_driver_versions():
    assert device._extra_for((12, 4)) == "labkit[cuda12]"
    assert device._extra_for((13, 0)) == "labkit[cuda13]"
    assert device._extra_for((11, 8)) is None
    assert device._extra_for(None) is None


def test_simulator_requested_reads_env(monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert device.simulator_requested()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    assert not device.simulator_requested()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "yes")
    assert not device.simulator_requested()
