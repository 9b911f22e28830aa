"""tools/whole_job_probe.py: the fc prototypes it measures (register tiles, split-K with atomics or with partial
sums and a reduction: labkit.gemm's stores) give x @ w.T + b on ragged sizes, the probe's check catches one that does
not, and its quick run (every section on the simulator, through the kit's lanes, graphs and Job) finds nothing
wrong."""

import json

import numpy as np

import labkit  # noqa: F401  (sets up numba: the simulator without a GPU)
from labkit import gemm, gpu

import tool_modules  # noqa: E402  (tests/ is on the path)

probe = tool_modules.load("whole_job_probe")

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
    assert gemm.fc_tiles in protos  # the kit's layer, by its own plan, beside the prototypes
    for fn in protos:
        assert probe.check_fc(fn, x, w, b) < probe.MAX_REL_ERROR, fn.__name__


def test_the_check_catches_a_split_k_that_leaves_out_its_last_split():
    x, w, b = _layer(2)
    p = gemm.Plan(gemm.Tiles(8, 10, 2, 5, 8), 3)

    def missing_last_split(xd, wd, bd, out):  # the reduction adds every plane, the launch fills one too few
        part = gpu.to_device(np.zeros((3, N, OUT), np.float32))
        gpu.launch_grid(gemm.kernel(p.tiles), (3, 2, 2), p.tiles.threads, xd, wd, bd, part, p.span(IN))
        gpu.launch(gemm.add_planes, (OUT, N), part, bd, out, block=gemm.ELEMENTWISE_BLOCK)

    assert probe.check_fc(missing_last_split, x, w, b) > probe.MAX_REL_ERROR


def test_the_quick_run_finds_nothing_wrong(tmp_path, capsys):
    assert probe.main(["--quick", "--out", str(tmp_path)]) == 0, capsys.readouterr().out[-3000:]
    data = json.loads((tmp_path / "whole_job_probe.json").read_text())
    assert not data["errors"] and not data["check_failures"]
    streamed = data["end_to_end"]["streamed"]
    assert streamed and all(r["differing_from_serial"] == 0 for r in streamed)
    assert data["launch_overhead"]["stream_differing"] == 0
    kit = [r for r in data["fc"] if r["prototype"].startswith("kit lk.gemm.fc_tiles (16 x 12 tiles")]
    assert len(kit) == 1 and kit[0]["rel_error"] < probe.MAX_REL_ERROR  # the kit's layer, its plan named
