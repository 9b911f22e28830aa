"""labkit.tune: every candidate checked before it is timed, the fastest passing one chosen on a GPU, the committed
choice (and its medians, labelled with their device) used where nothing can be timed."""

import json

import numpy as np
import pytest

import labkit as lk
from labkit import device, tune

from numba import cuda  # noqa: E402  (after labkit)

ON_GPU = device.is_gpu()


@cuda.jit
def _conv_kernel(x, w, b, out, pad, stride, shift):
    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    t = cuda.grid(1)
    if t < N * M * Ho * Wo:
        j, i, m, n = t % Wo, (t // Wo) % Ho, (t // (Wo * Ho)) % M, t // (Wo * Ho * M)
        acc = b[m] + shift
        for c in range(C):
            for p in range(K):
                r = i * stride + p - pad
                for q in range(K):
                    s = j * stride + q - pad
                    if 0 <= r < H and 0 <= s < W:
                        acc += x[n, c, r, s] * w[m, c, p, q]
        out[n, m, i, j] = acc


def _make(shift):
    def conv(x, w, b, out, pad, stride):
        lk.gpu.launch(_conv_kernel, out.size, x, w, b, out, pad, stride, np.float32(shift))

    return conv


def _space():
    return tune.space("test shift", _make, shift=[0.0, 0.5])  # shift 0.5: fast or not, wrong


def test_space_names_every_combination():
    names = [c.name for c in tune.space("k", lambda T, U: None, T=[8, 16], U=[1])]
    assert names == ["k T=8 U=1", "k T=16 U=1"]


def test_a_wrong_candidate_fails_its_check_and_is_never_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "STORE", tmp_path / "tuning.json")
    t = tune.tune({"conv1": _space()}, "fashion", 7, repeat=2, save=True, quiet=True)
    verdicts = {tr.candidate.name: tr.check.passed for tr in t.trials}
    assert verdicts == {"test shift shift=0.0": True, "test shift shift=0.5": False}
    wrong = next(tr for tr in t.trials if not tr.check.passed)
    assert wrong.median is None  # a failing candidate is not timed
    if ON_GPU:
        assert t.choice == {"conv1": "test shift shift=0.0"} and t.source.startswith("measured here")
        saved = json.loads((tmp_path / "tuning.json").read_text())["choices"][0]
        assert saved["choice"] == t.choice and list(saved["medians_ms"]) == ["conv1 test shift shift=0.0"]
    else:
        assert t.choice == {} and "no choice is committed" in t.source
        assert not (tmp_path / "tuning.json").exists()


@pytest.mark.skipif(ON_GPU, reason="the committed choice stands in for timings only where nothing can be timed")
def test_without_a_gpu_the_committed_choice_and_medians_are_shown_with_their_device(tmp_path, monkeypatch):
    store = tmp_path / "tuning.json"
    store.write_text(json.dumps({"choices": [{
        "net": "fashion", "images": 7, "device": "Some GPU", "date": "2026-01-02",
        "choice": {"conv1": "test shift shift=0.0"},
        "medians_ms": {"conv1 test shift shift=0.0": 1.5, "conv1 test shift shift=0.5": 0.5}}]}))
    monkeypatch.setattr(tune, "STORE", store)
    t = tune.tune({"conv1": _space()}, "fashion", 7, quiet=True)
    assert t.choice == {"conv1": "test shift shift=0.0"}
    assert t.device == "Some GPU (2026-01-02, committed)" and "measured on Some GPU on 2026-01-02" in t.source
    medians = {tr.candidate.name: tr.median for tr in t.trials}
    # the wrong candidate failed here: its committed time is not shown as if it could be chosen
    assert medians == {"test shift shift=0.0": pytest.approx(1.5e-3), "test shift shift=0.5": None}
    table = t.table()
    assert "1.5000 <-" in table and "FAIL" in table
    fig = tune.plot(t)
    assert "Some GPU" in fig.axes[0].get_title()
