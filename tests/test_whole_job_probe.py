"""tools/whole_job_probe.py: the fc prototypes stage 10 grows from (register tiles, split-K with atomics or with
partial sums and a reduction) give x @ w.T + b on ragged sizes, and the probe's check catches one that does not."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import labkit  # noqa: F401  (sets up numba: the simulator without a GPU)

from numba import cuda  # noqa: E402

TOOL = Path(__file__).resolve().parents[1] / "tools" / "whole_job_probe.py"
spec = importlib.util.spec_from_file_location("whole_job_probe", TOOL)
probe = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = probe  # dataclasses look their module up there
spec.loader.exec_module(probe)

# 19 images (ragged against 8-image tiles), 50 inputs (3 splits of 24 and 7 of 8: the last split is ragged),
# 13 features (ragged against 10-feature tiles)
N, IN, OUT = 19, 50, 13


def _layer(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((N, IN)).astype(np.float32), rng.standard_normal((OUT, IN)).astype(np.float32),
            rng.standard_normal(OUT).astype(np.float32))


def test_every_quick_prototype_matches_the_float64_product():
    x, w, b = _layer(1)
    protos = probe.fc_prototypes(OUT, quick=True)
    names = [getattr(p, "__name__", "") for p in protos]
    assert any("atomic" in n for n in names) and any("reduce" in n for n in names) and any("tiles" in n for n in names)
    for fn in protos:
        assert probe.check_fc(fn, x, w, b) < probe.MAX_REL_ERROR, fn.__name__


@pytest.mark.parametrize("splits, bk", [(3, 8), (7, 8), (4, 16)])
def test_k_chunks_cover_the_inputs_in_whole_steps(splits, bk):
    chunk = probe.k_chunk(IN, splits, bk)
    assert chunk % bk == 0 and chunk * splits >= IN and chunk * (splits - 1) < IN + bk


def test_the_check_catches_a_split_k_that_leaves_out_its_last_split():
    x, w, b = _layer(2)
    kernel = probe._gemm(8, 10, 2, 5, 8, "partial")

    def missing_last_split(xd, wd, bd, out):  # the reduction adds every plane, the launch fills one too few
        part = cuda.to_device(np.zeros((3, N, OUT), np.float32))
        grid = (3, 2, 2)
        kernel[grid, 8](xd, wd, bd, part, probe.k_chunk(IN, 3, 8))
        probe.sum_splits[(N * OUT + 127) // 128, 128](part, bd, out)

    assert probe.check_fc(missing_last_split, x, w, b) > probe.MAX_REL_ERROR
