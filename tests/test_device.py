"""labkit.device: under the simulator it must say so and never claim a GPU; on a GPU it must describe it."""

import os

import pytest

from labkit import device

ON_GPU = os.environ.get("LABKIT_TEST_GPU") == "1"
simulator_only = pytest.mark.skipif(ON_GPU, reason="what the simulator reports (the GPU test is below)")


@pytest.mark.skipif(not ON_GPU, reason="needs LABKIT_TEST_GPU=1 on a GPU machine")
def test_info_describes_the_gpu():
    d = device.info()
    assert d.kind == "gpu" and d.gpu and not d.simulated
    assert d.name and d.compute_capability and d.memory_total > 0 and d.driver
    assert device.label() == d.name
    assert device.requires_gpu("anything") is True
    assert "timings are real" in device.describe()


@simulator_only
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


@simulator_only
def test_describe_explains_findings():
    text = device.describe()
    assert "CUDA simulator" in text
    assert "sizes are shrunk" in text and "timings are not meaningful" in text
    assert "managed memory and cupy's own routines (cuBLAS) need a real GPU" in text
    assert "labkit[cuda12]" in text or "labkit[cuda13]" in text
    assert "GPU:" not in text.split("\n")[0]


@simulator_only
def test_describe_says_where_cuda_c_runs(monkeypatch):
    """Without a GPU, CUDA C runs on the CPU emulation where a C++ compiler is found (it said "skipped" before);
    without a compiler the line says what to install, as the checks' skip does."""
    from labkit.cudacpu import compiler

    if compiler.missing():
        pytest.skip(f"no compiler for the CPU emulation here: {compiler.missing()}")
    text = device.describe()
    assert "CUDA C:      on the CPU emulation of CUDA C (labkit.cudacpu, compiled with " in text, text
    assert "CUDA C via cupy need a real GPU" not in text and "CUDA C cells are skipped" not in text
    monkeypatch.delenv(compiler.ENV, raising=False)
    monkeypatch.setattr(compiler, "find_compiler", lambda: None)
    assert "CUDA C:      skipped (no C++ compiler for the CPU emulation of CUDA C: " in device.describe()


@simulator_only
def test_label_is_stable():
    assert device.label() == "CUDA simulator (CPU)"
    assert device.label() == device.label(device.info())


@simulator_only
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
