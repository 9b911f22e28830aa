"""labkit.freed: new arrays handed on at the addresses of freed ones, and the checks built on it. A stage-06 kernel
cache keyed by id(w) that does not keep w (what a student writes before PerWeights) fails the self-check and is worded
alike by the grader, while the kit's PerWeights and the shipped solutions pass."""

import types
from pathlib import Path

import numpy as np
import pytest

from labkit import check, device, engine, freed, gpu, kernels, stages
from labkit.grading import job as grading_job, protocol as P
from labkit.nets import get_net

from buggy_kernels import patched_stage
from wrong_submissions import BY_ID, KINDS, PER_WEIGHTS

simulated = pytest.mark.skipif(not device.is_simulated(), reason="stage 06's numba kernels, shrunk on the simulator")

WORDS = (*KINDS["id_cache"].words, "PerWeights")


def by_id_conv():
    """Stage 06's solution with its kernel cache keyed by id(w) (tests/wrong_submissions.py: id_cache)."""
    return patched_stage("06", PER_WEIGHTS, BY_ID)["VARIANTS"]["const_uniform"]


@pytest.mark.parametrize("make", [np.ascontiguousarray, gpu.to_device], ids=["host", "device"])
def test_new_arrays_are_handed_on_where_the_freed_ones_were(rng, make):
    shapes = ((3, 2, 5, 6), (4, 2, 5, 5), (4,))
    held = freed.Held()
    held.keep([make(rng.standard_normal(s).astype(np.float32)) for s in shapes])
    addresses = [id(a) for a in held.arrays]
    new = [make(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    got = held.swap(new)
    assert [id(a) for a in got] == addresses and held.landed == 3
    for g, n in zip(got, new):  # views of the new arrays: their values, their memory
        assert g is not n and np.array_equal(gpu.as_host(g), gpu.as_host(n))


def test_an_array_kept_elsewhere_keeps_its_address(rng):
    """What PerWeights does with w: the old array lives on, so the new one gets an address of its own."""
    held = freed.Held()
    held.keep([gpu.to_device(rng.standard_normal((4, 2, 5, 5)).astype(np.float32)) for _ in range(2)])
    kept = held.arrays[1]
    new = [gpu.to_device(rng.standard_normal((4, 2, 5, 5)).astype(np.float32)) for _ in range(2)]
    got = held.swap(new)
    assert got[1] is new[1] and id(got[1]) != id(kept) and held.landed == 1


@simulated
def test_a_kernel_cache_keyed_by_id_fails_the_self_check_saying_what_to_look_at():
    r = check.check_layer(by_id_conv().impls["conv"], "cifar10", "conv2", arrays="device", batches=(1,), quiet=True)
    assert not r.passed and all(w in r.detail for w in WORDS), r
    net = check.check_network(by_id_conv(), "cifar10", quiet=True)  # each batch's weights where the last's were
    assert not net.passed and "batch size 3" in net.detail, net


@simulated
@pytest.mark.parametrize("stage, name", [("06", "const_uniform"), ("09", "pooled")])
def test_the_kits_kernel_caches_pass(stage, name):
    """PerWeights keeps w: the landing case's weights get addresses of their own, and its kernel is found by them."""
    variant = stages.load_variants(stages.solutions_folder() / stages.STAGES[stage].notebook)[name]
    group = (get_net("cifar10").layer("conv2"),)
    r = check.check_group(variant.impls["conv"], "cifar10", group, arrays="device", batches=(1,), quiet=True)
    assert r.passed, r


@simulated
def test_the_grader_words_it_as_the_self_check_does():
    """The child calls the layer through one freed.Pair for its cases, which keeps the first case's arrays and hands
    the case that lands on it (``CaseSpec.lands_on``) its own where they were; the parent words a wrong result with
    the self-check's builder."""
    seed = check.fresh_seed(None)
    mine = check.check_layer(by_id_conv().impls["conv"], "cifar10", "conv2", arrays="device", batches=(1,),
                             seed=seed, quiet=True)
    fn = by_id_conv().impls["conv"]  # a cache of its own
    rng = np.random.default_rng(seed)
    cases = [check.layer_case("cifar10", "conv2", 1, rng) for _ in range(2)]  # the self-check's, in its order
    pair = freed.Pair(fn)  # as the child does (StudentPhases._paired): keep the first case's, land on them
    plan = types.SimpleNamespace(time_limit=60.0, rubric={"checks": {"tol": check.DEFAULT_TOL}}, variants={})
    job = grading_job.GradingJob(plan, None, "s", Path("s.ipynb"), seed, gpu=False)
    for cid, case in enumerate(cases):
        pair.land(0) if cid else pair.keep(0)
        out = engine.checked_call(pair, case.layer, case.x, case.weights, "device").out
        job.cases[cid] = {"variant": "v", "net_name": "cifar10", "name": "conv2", "batch": 1, "target": "gpu",
                          "expected": case.expected, "scale": case.scale, "layer": case.layer, "x": case.x,
                          "weights": case.weights, "lands_on": 0 if cid else None}
        [(frame, meta, payload)], _ = P.parse(bytearray(P.encode(P.CaseResult(cid, launches=2), {"out": out})))
        job._case(P.decode(frame, meta), payload)
    assert job.outcome.checks[0].passed
    judged = job.outcome.checks[1]
    assert not judged.passed and judged.detail == mine.detail, (judged.detail, mine.detail)


def test_the_child_hands_a_case_its_arrays_where_the_case_it_lands_on_had_them(rng):
    """student_phases.StudentPhases: a layer's case keeps its arrays when a later one names it (``lands_on``), and
    that one gets its own at their addresses; a net's second case gets its weights where the first's were."""
    from labkit.grading import student_phases
    from labkit.stages import Variant

    net = get_net("cifar10")
    conv = net.layer("conv2")
    cases = [P.CaseSpec(id=i, variant="v", batch=1, what="conv2", net_name="cifar10", x="", weights={},
                        lands_on=0 if i == 1 else None) for i in range(2)]
    phases = object.__new__(student_phases.StudentPhases)
    phases.ctx, phases.held = types.SimpleNamespace(job=types.SimpleNamespace(cases=cases)), {}
    seen = []

    def conv_fn(x, w, b, out, pad, stride):
        seen.append([id(a) for a in (x, w, b)])
        out[:] = 0.0  # written: no re-runs of the call for NaN (a GPU device array takes no Ellipsis)

    for case in cases:
        layer_case = check.layer_case(net, "conv2", 1, rng)
        engine.call_layer(phases._paired(case, conv_fn, conv), conv, layer_case.x, layer_case.weights, "device")
    assert seen[1] == seen[0], seen
    variant = Variant({**kernels.GIVEN, "conv": conv_fn}, arrays="device")
    kept = []
    for i in range(2):
        case = P.CaseSpec(id=2 + i, variant="v", batch=1, what="cifar10 forward", net_name="cifar10", x="",
                          weights={}, lands_on=2 if i else None)
        net_case = check.network_case(net, 1, rng)
        prepared = phases._landed(case, engine.prepare(net_case.net, variant, net_case.x, net_case.weights))
        kept.append([id(a) for a in prepared.weights.values()])
        del prepared
    assert kept[1] == kept[0], kept
