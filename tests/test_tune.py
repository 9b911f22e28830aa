"""labkit.tune: every candidate checked before it is timed, the fastest passing one chosen on a GPU, the committed
choice (and its medians, labelled with their device) used where nothing can be timed."""

import json

import numpy as np
import pytest

from labkit import device, tune

from buggy_kernels import conv_grid_bug, device_conv  # noqa: E402  (after labkit, which sets up numba)

ON_GPU = device.is_gpu()


def _space():  # the grid bug passes at batch 1 and fails at 5 and 17: fast or not, never chosen
    return tune.space("test", lambda bug: conv_grid_bug if bug else device_conv, bug=[False, True])


def test_space_names_every_combination():
    names = [c.name for c in tune.space("k", lambda T, U: None, T=[8, 16], U=[1])]
    assert names == ["k T=8 U=1", "k T=16 U=1"]


def test_a_wrong_candidate_fails_its_check_and_is_never_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "STORE", tmp_path / "tuning.json")
    t = tune.tune({"conv1": _space()}, "fashion", 7, repeat=2, save=True, quiet=True)
    verdicts = {tr.candidate.name: tr.check.passed for tr in t.trials}
    assert verdicts == {"test bug=False": True, "test bug=True": False}
    wrong = next(tr for tr in t.trials if not tr.check.passed)
    assert wrong.median is None  # a failing candidate is not timed
    if ON_GPU:
        assert t.choice == {"conv1": "test bug=False"} and t.source.startswith("measured here")
        saved = json.loads((tmp_path / "tuning.json").read_text())["choices"][0]
        assert saved["choice"] == t.choice and list(saved["medians_ms"]) == ["conv1 test bug=False"]
    else:
        assert t.choice == {} and "no choice is committed" in t.source
        assert not (tmp_path / "tuning.json").exists()


@pytest.mark.skipif(ON_GPU, reason="the committed choice stands in for timings only where nothing can be timed")
def test_without_a_gpu_the_committed_choice_and_medians_are_shown_with_their_device(tmp_path, monkeypatch):
    store = tmp_path / "tuning.json"
    store.write_text(json.dumps({"choices": [{
        "net": "fashion", "images": 7, "device": "Some GPU", "date": "2026-01-02",
        "choice": {"conv1": "test bug=False"},
        "medians_ms": {"conv1 test bug=False": 1.5, "conv1 test bug=True": 0.5}}]}))
    monkeypatch.setattr(tune, "STORE", store)
    t = tune.tune({"conv1": _space()}, "fashion", 7, quiet=True)
    assert t.choice == {"conv1": "test bug=False"}
    assert t.device == "Some GPU (2026-01-02, committed)" and "measured on Some GPU on 2026-01-02" in t.source
    medians = {tr.candidate.name: tr.median for tr in t.trials}
    # the wrong candidate failed here: its committed time is not shown as if it could be chosen
    assert medians == {"test bug=False": pytest.approx(1.5e-3), "test bug=True": None}
    table = t.table()
    assert "1.5000 <-" in table and "FAIL" in table
    fig = tune.plot(t)
    assert "Some GPU" in fig.axes[0].get_title()


def test_the_stored_choice_is_this_devices_when_one_is_recorded_else_the_newest(tmp_path, monkeypatch):
    def entry(dev, kernel):
        return {"net": "fashion", "images": 7, "device": dev, "date": "2026-01-02", "choice": {"conv1": kernel}}

    store = tmp_path / "tuning.json"
    monkeypatch.setattr(tune, "STORE", store)
    store.write_text(json.dumps({"choices": [entry(device.label(), "here"), entry("Other GPU", "newest")]}))
    assert tune.stored("fashion", 7)["choice"] == {"conv1": "here"}
    assert tune.stored("fashion", 7, "Other GPU")["choice"] == {"conv1": "newest"}
    store.write_text(json.dumps({"choices": [entry("Old GPU", "old"), entry("Other GPU", "newest")]}))
    assert tune.stored("fashion", 7)["choice"] == {"conv1": "newest"}
    assert tune.stored("fashion", 8) is None and tune.stored("cifar10", 7) is None


def test_by_images_calls_the_choice_tuned_at_the_smallest_size_at_or_above_the_batch():
    """A batch between two tuned sizes gets the larger size's choice (tuned where the GPU was no fuller); past the
    largest, the largest's."""
    calls = []

    def small(x, *a):
        calls.append(("small", x.shape[0]))

    def big(x, *a):
        calls.append(("big", x.shape[0]))

    def same(x, *a):
        calls.append(("same", x.shape[0]))

    impls = tune.by_images({1200: {"conv1": small, "fc": same}, 50000: {"conv1": big, "fc": same}})
    assert impls["fc"] is same  # one function at every size: no dispatcher
    for n in (1, 7, 1200, 1201, 2500, 8000, 50000, 90000):
        impls["conv1"](np.zeros((n, 1)))
    assert calls == [("small", 1), ("small", 7), ("small", 1200), ("big", 1201), ("big", 2500), ("big", 8000),
                     ("big", 50000), ("big", 90000)]
    with pytest.raises(ValueError, match="conv2"):
        tune.by_images({1200: {"conv2": small}, 50000: {}})


@pytest.mark.skipif(ON_GPU, reason="on a GPU every candidate is checked before it is timed")
def test_given_candidates_are_not_checked_again_on_the_simulator_and_own_ones_are(monkeypatch):
    """A candidate from an earlier stage's given code says "given" (the kit's tests check it); the same wrong kernel
    as the notebook's own code (stage 09's cells) is checked and fails."""
    from labkit import nbcells

    def made_in(cell: str):
        ns = {"bug": conv_grid_bug}
        nbcells.run_cell("def conv_in_a_cell(*args):\n    return bug(*args)\n", cell, ns)
        return ns["conv_in_a_cell"]

    cands = [tune.Candidate("from 05", {}, made_in("<05_shared_memory.ipynb cell 4>")),
             tune.Candidate("own", {}, made_in("<09_per_layer_tuning.ipynb cell 4>"))]
    t = tune.tune({"conv1": cands}, "fashion", 7, quiet=True)
    verdicts = {tr.candidate.name: (tr.check.passed, tr.check.note, tr.check.given) for tr in t.trials}
    assert verdicts == {"from 05": (True, tune.GIVEN, "stage 05"), "own": (False, "", "")}
    lines = t.table().splitlines()
    assert any("from 05" in ln and "given" in ln for ln in lines) and any("own" in ln and "FAIL" in ln for ln in lines)
    assert f"given: {tune.GIVEN}" in lines
