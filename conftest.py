"""Shared test set-up: the CUDA simulator (unless LABKIT_TEST_GPU=1) and the real data from LABKIT_DATA."""

import os
import sys
from pathlib import Path

import pytest

# Must happen before anything imports numba. On a GPU box, LABKIT_TEST_GPU=1 runs the tests on the real device.
if os.environ.get("LABKIT_TEST_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    os.environ.setdefault("LABKIT_QUICK", "1")  # notebooks run by nbval inherit it: CPU stages use fewer images
    if "numba.core.config" in sys.modules:  # a plugin imported numba first: make it read the variable again
        sys.modules["numba.core.config"].reload_config()

REPO = Path(__file__).resolve().parent

# Tests and the notebooks nbval runs record timings in a ledger of their own, never in results/ledger.jsonl.
if not os.environ.get("LABKIT_RESULTS"):
    import atexit
    import shutil
    import tempfile

    _results = tempfile.mkdtemp(prefix="labkit-test-results-")
    atexit.register(shutil.rmtree, _results, ignore_errors=True)
    os.environ["LABKIT_RESULTS"] = str(Path(_results) / "ledger.jsonl")

# ... and keep the grader's reference jobs in a cache of their own (labkit.grading.refcache), never the user's.
if not os.environ.get("LABKIT_CACHE"):
    import atexit
    import shutil
    import tempfile

    _cache = tempfile.mkdtemp(prefix="labkit-test-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["LABKIT_CACHE"] = _cache

DATA_ROOT = Path(os.environ["LABKIT_DATA"]) if os.environ.get("LABKIT_DATA") else None


def _has(rel: str) -> bool:
    return DATA_ROOT is not None and (DATA_ROOT / rel).exists()


def _skip_reason(rel: str) -> str:
    where = f"LABKIT_DATA={DATA_ROOT}" if DATA_ROOT else "LABKIT_DATA (unset)"
    return (f"real data {rel} not found under {where}; point LABKIT_DATA at a folder with cifar-10-batches-bin/, "
            f"fashion-mnist/ and cnn-cifar10-weights/ (labkit data fetch makes the first two)")


@pytest.fixture(scope="session")
def cifar_data() -> Path:
    """The real CIFAR-10 data, for module-scoped fixtures (``cifar_root`` is the per-test one)."""
    if not _has("cifar-10-batches-bin/data_batch_1.bin"):
        pytest.skip(_skip_reason("cifar-10-batches-bin/data_batch_1.bin"))
    return DATA_ROOT


@pytest.fixture
def cifar_root(cifar_data) -> Path:
    return cifar_data


@pytest.fixture
def fashion_root() -> Path:
    if not _has("fashion-mnist/t10k-images-idx3-ubyte.gz"):
        pytest.skip(_skip_reason("fashion-mnist/t10k-images-idx3-ubyte.gz"))
    return DATA_ROOT


@pytest.fixture
def c_study_weights() -> Path:
    if not _has("cnn-cifar10-weights/layer1_conv.txt"):
        pytest.skip(_skip_reason("cnn-cifar10-weights/layer1_conv.txt"))
    return DATA_ROOT / "cnn-cifar10-weights"


_COMPLETE = {f"cifar-10-batches-bin/data_batch_{i}.bin": 30730000 for i in range(1, 6)}


@pytest.fixture
def need():
    """``need("cifar-10-batches-bin/data_batch_2.bin", ...)`` skips the test, saying why, unless those files are
    under LABKIT_DATA (CIFAR training batches complete): a partial copy of the data runs the tests it can."""

    def check(*rels: str) -> Path:
        for rel in rels:
            if not _has(rel):
                pytest.skip(_skip_reason(rel))
            if rel in _COMPLETE and (DATA_ROOT / rel).stat().st_size != _COMPLETE[rel]:
                pytest.skip(f"{rel} under LABKIT_DATA={DATA_ROOT} is partial; this test needs the complete file")
        return DATA_ROOT

    return check


@pytest.fixture
def rng():
    """Fresh randomness every run: tests must hold for any valid input, not one seed."""
    import numpy as np

    return np.random.default_rng()
