"""tools/fc_gemm_timing.py: its quick run checks every kernel it would time (the kit's fc, its register tiles, each
CUDA C configuration, each configuration of the tensor cores' fc) on tiny odd shapes, writes its JSON, and fails when a kernel is wrong."""

import json

import numpy as np
import pytest

from labkit import gemm_cuda, stages
from labkit.ops import fc_tensor_cores

import tool_modules  # noqa: E402  (tests/ is on the path)

timing = tool_modules.load("fc_gemm_timing")

pytestmark = pytest.mark.skipif(bool(stages.unavailable(("cuda_c",))), reason=stages.unavailable(("cuda_c",)) or "")


def test_the_quick_run_checks_every_kernel_and_writes_its_json(tmp_path):
    assert timing.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "fc_gemm_timing.json").read_text())
    rows = data["rows"]
    assert data["quick"] and not data["failures"]
    assert len(rows) == len(timing.QUICK) * (2 + len(gemm_cuda.CONFIGS) + len(fc_tensor_cores.CONFIGS))
    for name in gemm_cuda.CONFIGS:
        assert sum(f"fc_cuda[{name}:" in r["kernel"] for r in rows) == len(timing.QUICK)
    for name in fc_tensor_cores.CONFIGS:
        assert sum(f"fc_split3[{name}:" in r["kernel"] for r in rows) == len(timing.QUICK)
    assert all(r["rel_error"] <= timing.MAX_REL_ERROR for r in rows)


def test_a_wrong_kernel_fails_the_run(monkeypatch, capsys):
    real = gemm_cuda.fc_cuda

    def off_by_one(x, w, b, out, config=gemm_cuda.DEFAULT):  # the product without the bias's last output
        real(x, w, b, out, config=config)
        host = out.copy_to_host()
        host[:, -1] += 1.0
        out.copy_to_device(host)

    monkeypatch.setattr(gemm_cuda, "fc_cuda", off_by_one)
    assert timing.main(["--quick"]) == 1
    assert "CHECK FAILED" in capsys.readouterr().out


def test_rel_error_counts_nan_as_infinite():
    assert timing.rel_error(np.array([np.nan, 1.0]), np.array([1.0, 1.0])) == float("inf")
