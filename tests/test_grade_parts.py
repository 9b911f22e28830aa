"""The grader's parts that need no grading run: the own-kernels scan and trace, the snapshot's comparison, the
hints, seeds, the Gradescope file, merging, and the shipped solutions passing the own-kernels rule."""

from __future__ import annotations

import json
import sys
import textwrap
import time
import types
from pathlib import Path

import nbformat
import numpy as np
import pytest

import labkit as lk
from labkit import check, device, grading, reference
from labkit.grading import hints, ownership, reports, run
from labkit.grading.snapshot import Snapshot
from labkit.stages import STAGES

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from wrong_submissions import TOKEN_SHARED  # noqa: E402  (a right conv with a token shared load)


def _notebook(tmp_path: Path, stage: str, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(src), metadata={"tags": ["kernel"]}) for src in cells]
    path = tmp_path / STAGES[stage].notebook
    nbformat.write(nb, path)
    return path


def _scan(path: Path, stage: str, variant: str = "v") -> list[str]:
    code = ownership.Code(stage, {n: s.notebook for n, s in STAGES.items()})
    ns = ownership.load_cells(path, code.own, code.trees)
    v = ns["VARIANTS"][variant]
    return ownership.scan(ownership.conv_roots(v), code, ownership.Library())


HEAD = """
import numpy as np
from numba import njit
import labkit as lk
"""


@pytest.mark.parametrize("body, words", [
    ("""
     @njit
     def conv(x, w, b, out, pad, stride):  # numpy inside njit: no runtime trace sees it
         out[0, 0] = np.dot(x[0, 0], w[0, 0])
     """, "calls numpy.dot"),
    ("""
     from numpy import tensordot as td

     def helper(a, b):
         return td(a, b)

     def conv(x, w, b, out, pad, stride):
         out[...] = helper(x, w)
     """, "calls numpy.tensordot (helper,"),
    ("""
     def conv(x, w, b, out, pad, stride):
         out[...] = x.reshape(len(x), -1) @ w.reshape(len(w), -1).T
     """, "uses the @ operator"),
    ("""
     def conv(x, w, b, out, pad, stride):
         out[...] = x.dot(w)
     """, "calls .dot()"),
    ("""
     def conv(x, w, b, out, pad, stride):
         import scipy.signal
         out[...] = scipy.signal.correlate(x, w)
     """, "imports scipy.signal"),
    ("""
     def conv(x, w, b, out, pad, stride):
         out[...] = lk.conv2d(x, w, b, pad, stride)
     """, "calls labkit.reference.conv2d"),
    ("""
     conv = lk.reference.conv2d
     """, "is labkit.reference.conv2d"),
])
def test_the_scan_finds_library_compute_routines(tmp_path, body, words):
    path = _notebook(tmp_path, "01", HEAD + textwrap.dedent(body),
                     'VARIANTS = lk.variants("01", {"v": lk.Variant({"conv": conv}, target="cpu", nets=("cifar10",))})')
    found = _scan(path, "01")
    assert any(words in f for f in found), found
    assert all(f.startswith("conv1, conv2, conv3 (variant 'v')") for f in found), found


def test_the_scan_leaves_own_loops_and_other_layers_alone(tmp_path):
    path = _notebook(tmp_path, "01", HEAD + textwrap.dedent("""
        @njit
        def conv(x, w, b, out, pad, stride):
            for n in range(out.shape[0]):
                out[n] = np.sum(x[n]) * 0.0 + b[0]  # numpy's elementwise routines are fine

        def fc(x, w, b, out):
            out[...] = x @ w.T + b  # not the timed conv: allowed
        """), 'VARIANTS = lk.variants("01", {"v": lk.Variant({"conv": conv, "fc": fc}, target="cpu")})')
    assert _scan(path, "01") == []


@pytest.mark.parametrize("stage", ["01", "02", "03", "04"])
def test_shipped_solutions_pass_the_scan(stage):
    """No false positives: every solution's timed conv (and the given code it uses) passes."""
    path = REPO / "solutions" / STAGES[stage].notebook
    code = ownership.Code(stage, {n: s.notebook for n, s in STAGES.items()})
    ns = ownership.load_cells(path, code.own, code.trees)
    timed = list(ns["VARIANTS"])[-1]
    assert ownership.scan(ownership.conv_roots(ns["VARIANTS"][timed]), code, ownership.Library()) == []


def test_stage_10s_own_work_is_its_fc_and_the_scan_looks_there(tmp_path):
    """Stage 10's convolutions are stage 09's (given code): as conv roots they are not the student's work, so its
    rubric names the fc layers instead (checks.own_layers); the solution's fc passes the scan, and an fc that calls
    a library matrix product is found there."""
    r = grading.load_rubric().for_stage("10")
    kinds = tuple(r["checks"]["own_layers"])
    assert kinds == ("fc",)
    code = ownership.Code("10", {n: s.notebook for n, s in STAGES.items()})
    ns = ownership.load_cells(REPO / "solutions" / STAGES["10"].notebook, code.own, code.trees)
    timed = ns["VARIANTS"][r["timed_variant"]]
    assert ownership.scan(ownership.conv_roots(timed, kinds), code, ownership.Library()) == []
    as_convs = ownership.scan(ownership.conv_roots(timed), code, ownership.Library())
    assert as_convs and all("given code" in f for f in as_convs), as_convs
    path = _notebook(tmp_path, "10", HEAD, """
        def fc(x, w, b, out):
            out[...] = x @ w.T + b
        """, 'VARIANTS = lk.variants("10", {"v": lk.Variant({"fc": fc}, target="cpu")})')
    code = ownership.Code("10", {n: s.notebook for n, s in STAGES.items()})
    v = ownership.load_cells(path, code.own, code.trees)["VARIANTS"]["v"]
    found = ownership.scan(ownership.conv_roots(v, kinds), code, ownership.Library())
    assert found and "@ operator" in found[0] and ownership.scan(ownership.conv_roots(v), code, ownership.Library()) == []


def test_the_trace_records_library_calls_and_whose_kernels_ran(tmp_path):
    code = ownership.Code("04", {n: s.notebook for n, s in STAGES.items()})
    lib = ownership.Library()
    ns = {}
    tracer = ownership.Tracer(code, lib, [ns])

    def sneaky(x):
        return getattr(np, "ein" + "sum")("ij->", x)  # a name no scan sees

    original = np.einsum
    rec = tracer.call(sneaky, (np.ones((2, 2)),))
    assert rec["library"] == ["numpy.einsum"] and rec["launches"] == {}
    assert np.einsum is original  # put back afterwards
    rec = tracer.call(lambda: reference.conv2d(np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 3, 3), np.float32)),
                      ())
    assert rec["library"][0] == "labkit.reference.conv2d"
    assert tracer.call(lambda: np.zeros(3).sum(), ())["library"] == []


def test_the_snapshot_names_what_changed():
    mod = types.ModuleType("labkit_fake")
    mod.f = len
    pkg = types.ModuleType("labkit_fakepkg")
    pkg.__path__ = []
    snap = Snapshot([(mod, True), (pkg, False)])
    assert snap.changes() == []
    mod.f = max
    mod.extra = 1
    pkg.sub = types.ModuleType("labkit_fakepkg.sub")  # importing a submodule is no patch
    pkg.g = 2
    mod.__warningregistry__ = {}
    assert sorted(snap.changes()) == ["labkit_fake.extra (added)", "labkit_fake.f", "labkit_fakepkg.g (added)"]
    snap.restore()
    assert mod.f is len and not hasattr(mod, "extra") and snap.changes() == ["labkit_fakepkg.g (added)"]


def _case(layer_name: str, batch: int, seed: int = 0) -> tuple[dict, object]:
    rng = np.random.default_rng(seed)
    case = check.layer_case("cifar10", layer_name, batch, rng, target="cpu")
    c = {"variant": "v", "net_name": "cifar10", "name": layer_name, "batch": batch, "expected": case.expected,
         "layer": case.layer, "x": case.x, "weights": case.weights}
    return c, case


@pytest.mark.parametrize("mistake, words", [
    ("bias", "without the bias"),
    ("transposed", "filter transposed"),
    ("halo", "off by one row (+1)"),
    ("float16", "reduced precision"),
    ("image0", "only image 0 of the 3"),
])
def test_hints_name_the_mistake(mistake, words):
    c, case = _case("conv1", 3)
    layer, x, w = case.layer, case.x, case.weights
    wt, b = w["conv1.weight"], w["conv1.bias"]
    if mistake == "bias":
        got = reference.conv2d(x, wt, None, layer.pad, layer.stride, "float64")
    elif mistake == "transposed":
        got = reference.conv2d(x, wt.transpose(0, 1, 3, 2), b, layer.pad, layer.stride, "float64")
    elif mistake == "halo":  # r = i * stride + p - pad + 1, zero outside the image
        xp = np.pad(x, ((0, 0), (0, 0), (layer.pad - 1, layer.pad + 1), (layer.pad, layer.pad)))
        got = reference.conv2d(xp, wt, b, 0, layer.stride, "float64")[:, :, :c["expected"].shape[2]]
    elif mistake == "float16":
        got = reference.conv2d(x.astype(np.float16).astype(np.float32), wt.astype(np.float16).astype(np.float32), b,
                               layer.pad, layer.stride, "float64")
    else:
        got = c["expected"].copy()
        got[1:] = np.nan
    got = got.astype(np.float32)
    res = check.compare("conv1", got, c["expected"])
    assert not res.passed
    assert words in hints.explain(c, got, res, {}, check.DEFAULT_TOL)


def _epilogue(late_bias: bool, half: bool):
    """A fused conv (``fn(x, w, b, out, pad, stride, act, pool)``) on the host: the bias added after the activation
    and the pool (``late_bias``), or the right epilogue on x and w rounded to float16 (``half``)."""
    def conv(x, w, b, out, pad, stride, act, pool):
        if half:
            x, w = x.astype(np.float16).astype(np.float32), w.astype(np.float16).astype(np.float32)
        y = lk.conv2d(x, w, None if late_bias else b, pad, stride, accumulate="float64")
        y = {0: y, 1: np.maximum(y, 0), 2: np.tanh(y)}[act]
        if pool:
            y = y.reshape(*y.shape[:2], y.shape[2] // pool, pool, y.shape[3] // pool, pool).max(axis=(3, 5))
        out[...] = y + b[None, :, None, None] if late_bias else y

    return conv


@pytest.mark.parametrize("net, what", [("cifar10", "group"), ("fashion", "group"), ("cifar10", "forward")])
def test_a_fused_epilogue_with_the_bias_late_is_named_and_float16_is_reduced_precision(net, what):
    """A fused epilogue that adds the bias after the activation (or the pool: they commute) was told "close to the
    reference ... reduced precision?"; the hint names the epilogue's order, and reduced precision only where the
    output matches a float16 computation. A fused group's case (relu; tanh with a bias given to fashion's conv1)
    and a whole net whose variant fuses (the grader's first failing check of a fused stage)."""
    from labkit import engine, layers

    rng = np.random.default_rng()
    fuse = ("relu", "tanh", "pool")
    spec = lk.get_net(net)
    if what == "group":
        group = layers.groups(layers.kernel_layers(spec), fuse)[0]
        case = check.group_case(net, group, 3, rng, target="cpu")
        weights = {**case.weights, f"{group[0].name}.bias": rng.standard_normal(case.weights[
            f"{group[0].name}.weight"].shape[0]).astype(np.float32)}  # fashion's conv1 has none
        expected = engine.call_layer(_epilogue(False, False), group, case.x, weights)
        c = {"variant": "v", "net_name": net, "name": case.name, "batch": 3, "expected": expected, "layer": group,
             "x": case.x, "weights": weights}

        def run(fn):
            return engine.call_layer(fn, group, case.x, weights)
    else:
        case = check.network_case(net, 3, rng, target="cpu")
        c = {"variant": "v", "net_name": net, "name": case.name, "batch": 3, "expected": case.expected, "layer": None,
             "x": case.x, "weights": case.weights, "net": case.net, "fuse": fuse}

        def run(fn):
            v = lk.Variant({"conv": fn}, target="cpu", fuse=fuse)
            return engine.forward(case.net, v, engine.prepare(case.net, v, case.x, case.weights), check=True)

    def hint(fn):
        got = run(fn)
        res = check.compare(c["name"], got, c["expected"])
        assert not res.passed, res
        return hints.explain(c, got, res, {}, check.DEFAULT_TOL)

    late = hint(_epilogue(True, False))
    assert "bias added after the activation (or after the pool)" in late and "reduced precision" not in late, late
    if what == "group":
        half = hint(_epilogue(False, True))
        assert "rounded to float16" in half and "reduced precision" in half and "epilogue" not in half, half

        def slightly_off(x, w, b, out, *rest):  # a small error of no known cause: no hint
            _epilogue(False, False)(x, w, b, out, *rest)
            out *= np.float32(1 + 1e-4)

        assert hint(slightly_off) == ""


def test_hint_for_a_cached_result():
    c, _ = _case("relu1", 1)
    got = np.zeros_like(c["expected"])
    res = check.compare("relu1", got, c["expected"])
    seen = {("v", "cifar10", "relu1", 1): [hints.fingerprint(got)]}
    assert "cached" in hints.explain(c, got, res, seen, check.DEFAULT_TOL)


def test_seeds_are_secret_fresh_and_per_job():
    a, b = run.fresh_seed(), run.fresh_seed()
    assert a != b and a >= 0
    s = grading.job_seed(123, "ada", "04")
    assert s == grading.job_seed(123, "ada", "04") != grading.job_seed(124, "ada", "04")
    assert s != grading.job_seed(123, "ada", "01") and s != grading.job_seed(123, "ben", "04")


def _row(student, stage, **kw):
    row = {"student": student, "stage": stage, "status": "pass", "passed": True, "score": 80.0, "max_score": 80,
           "correctness_points": 50.0, "accuracy_points": 0.0, "op_time_points": 30.0, "op_time_s": 0.5,
           "reference_op_time_s": 0.5, "ratio": 1.0, "message": "all checks pass [seed 5]", "seconds": 3.0,
           "max_points": {"correctness": 50, "accuracy": 0, "op_time": 30}, "details": {}}
    row.update(kw)
    return row


def test_gradescope_results_and_merging(tmp_path):
    meta = {"stages": ["01"], "device": "CUDA simulator (CPU)", "date": "d", "seed": 1, "single_submission": False,
            "op_time": {"01": "measured"}, "memory_guard": "", "environment": {"device": "CUDA simulator (CPU)"}}
    report = {"meta": meta, "rows": [_row("ada", "01"), _row("ben", "01", status="fail", passed=False, score=0.0,
                                                             correctness_points=0.0, op_time_points=0.0,
                                                             op_time_s=None, message="conv1: FAIL (x) [seed 77]")]}
    grading.write_reports(tmp_path, report)
    ada = json.loads((tmp_path / "gradescope" / "ada" / "results.json").read_text())
    assert ada["score"] == 80 and [t["max_score"] for t in ada["tests"]] == [50, 30]
    assert ada["leaderboard"] == [{"name": "stage 01 op time (s)", "value": 0.5, "order": "asc"}]
    ben = json.loads((tmp_path / "gradescope" / "ben" / "results.json").read_text())
    assert ben["tests"][0]["output"] == "fail: conv1: FAIL (x)" and ben["leaderboard"] == []
    new = {"meta": {**meta, "seed": 2, "stages": ["01", "02"]},
           "rows": [_row("ben", "01", seed=9), _row("ben", "02"), _row("cy", "01")]}
    merged = reports.merge_reports(tmp_path / "grades.json", new)
    assert [(r["student"], r["stage"]) for r in merged["rows"]] == [("ada", "01"), ("ben", "01"), ("ben", "02"),
                                                                      ("cy", "01")]
    assert merged["rows"][1]["seed"] == 9 and merged["meta"]["stages"] == ["01", "02"]
    assert merged["meta"]["merge"]["replaced"] == 1 and merged["meta"]["merge"]["added"] == 2
    assert [r["seed"] for r in merged["meta"]["runs"]] == [1, 2]
    assert "replaced 1 row and added 2" in reports.merge_line(merged)


def test_compare_reports_sets_op_times_against_the_spread():
    spread = {"student": {"min": 0.4, "median": 0.5, "max": 0.6, "runs": 3}}
    a = {"rows": [_row("ada", "01", details={"op_time_spread": spread})]}
    b = {"rows": [_row("ada", "01", op_time_s=0.55, details={"op_time_spread": spread})]}
    out = grading.compare_reports(a, b)
    assert out["differences"] == [] and out["op_times"][0]["within"]
    b["rows"][0]["status"] = "fail"
    assert grading.compare_reports(a, b)["differences"] == ["ada 01: status 'pass' != 'fail'"]


# ------------------------------------------------------------------ issue 25: what the grader watches now


def test_the_trace_sees_numpy_kept_in_a_container_built_before_the_call():
    """Neither the scan nor a patched name sees a routine kept in a list made at load time: the profile hook does
    (every Python function of a library entered, every C function of one called, while the conv runs)."""
    code = ownership.Code("04", {n: s.notebook for n, s in STAGES.items()})
    tracer = ownership.Tracer(code, ownership.Library(), [{}])
    ops = [np.einsum, np.lib.stride_tricks.sliding_window_view, np.dot]
    a = np.ones((3, 3))
    assert tracer.call(lambda: ops[0]("ij->", a), ())["library"] == ["numpy.einsum"]
    assert tracer.call(lambda: ops[1](a, (2, 2)), ())["library"] == ["numpy.lib.stride_tricks.sliding_window_view"]
    assert tracer.call(lambda: ops[2](a, a), ())["library"] == ["numpy.dot"]
    assert tracer.call(lambda: np.pad(a, 1).sum(), ())["library"] == []  # numpy's own calls inside np.pad: fine
    with tracer.installed():  # installed once for a whole timed pass: calls inside record, the names stay patched
        assert np.einsum is not ops[0]
        assert tracer.call(lambda: ops[0]("ij->", a), ())["library"] == ["numpy.einsum"]
    assert np.einsum is ops[0]


def test_patching_a_kit_class_is_seen_and_put_back():
    """The snapshot holds every class a labkit module defines: a class attribute patched (the tracer's call, the
    technique counter's per_output) reaches every instance, and is reported, not only module attributes."""
    from labkit import counts
    from labkit.grading import worker

    snap = Snapshot(worker._namespaces([]))
    call, per_output = ownership.Tracer.call, counts.Counts.per_output
    try:
        ownership.Tracer.call = lambda self, fn, args: {"library": [], "launches": {"own": 1}}
        counts.Counts.per_output = lambda self, kind: 1e9
        counts.Counts.shortcut = 1
        changes = snap.changes()
        assert {"labkit.grading.ownership.Tracer.call", "labkit.counts.Counts.per_output",
                "labkit.counts.Counts.shortcut (added)"} <= set(changes), changes
        snap.restore()
        assert ownership.Tracer.call is call and counts.Counts.per_output is per_output
        assert not hasattr(counts.Counts, "shortcut") and snap.changes() == []
    finally:
        ownership.Tracer.call, counts.Counts.per_output = call, per_output


def test_earlier_stages_given_code_is_not_the_graded_stages_work(tmp_path):
    path = _notebook(tmp_path, "05", HEAD + 'conv = lk.from_stage("04").conv_padded\n',
                     'VARIANTS = lk.variants("05", {"v": lk.Variant({**lk.kernels.GIVEN, "conv": conv}, '
                     'arrays="device")})')
    found = _scan(path, "05")
    assert any("is computed by given code" in f and "not by code from your notebook" in f for f in found), found


@pytest.mark.parametrize("kind", ["unwritten", "added", "read"])
def test_the_grader_words_nan_outputs_as_the_self_check_does(kind):
    """NaN never written, added onto (``+=`` onto the poison) and read from a buffer never written (a split-K plane
    no block wrote) are different mistakes. The child runs the engine's diagnosis and sends its raw counts; the
    parent words them with the self-check's builder: the same case gives the grader the self-check's line."""
    from buggy_kernels import NAN_BUGS
    from test_check import NAN_WORDS

    from labkit import engine, gpu
    from labkit.grading import job as grading_job, protocol as P, student_calls

    fn, layer = NAN_BUGS[kind]
    seed = check.fresh_seed(None)
    mine = check.check_layer(fn, "cifar10", layer, arrays="device", seed=seed, quiet=True)
    batch = check.default_batches()[0]
    case = check.layer_case("cifar10", layer, batch, np.random.default_rng(seed))  # the self-check's first case
    sent = P.CaseResult(0)  # as the child sends it (student_phases.StudentPhases._check)
    with gpu.counting() as counts:
        called = engine.checked_call(fn, case.layer, case.x, case.weights, "device")
    sent.launches = counts.launches
    student_calls.nan_counts(sent, called.nan)
    [(frame, meta, payload)], _ = P.parse(bytearray(P.encode(sent, {"out": called.out})))
    plan = types.SimpleNamespace(time_limit=60.0, rubric={"checks": {"tol": check.DEFAULT_TOL}}, variants={})
    job = grading_job.GradingJob(plan, None, "s", Path("s.ipynb"), seed, gpu=False)
    job.cases[0] = {"variant": "v", "net_name": "cifar10", "name": layer, "batch": batch, "expected": case.expected,
                    "scale": case.scale, "layer": case.layer, "x": case.x, "weights": case.weights, "target": "gpu"}
    job._case(P.decode(frame, meta), payload)
    judged = job.outcome.checks[0]
    assert not judged.passed and judged.detail == mine.detail, (judged.detail, mine.detail)
    assert all(w in judged.detail for w in NAN_WORDS[kind]), judged.detail


@pytest.mark.skipif(not device.is_simulated(), reason="the technique budget is counted on the CUDA simulator")
def test_a_token_shared_load_earns_no_technique_points():
    from labkit.grading import protocol, student_calls

    ns = {}
    exec(compile("import labkit as lk\nimport numpy as np\nVARIANTS = {}\n" + TOKEN_SHARED, "<token>", "exec"), ns)
    conv = ns["conv_token"]
    budget = protocol.TechniqueSpec("shared", "cifar10", "conv2", min_fraction=0.75)
    token = student_calls.technique_budget(conv, budget, "device")
    assert not token.passed and token.fraction < 0.05 and "the stage asks for at least 75 %" in token.line, token
    assert student_calls.technique_budget(conv, protocol.TechniqueSpec("shared", "cifar10", "conv2"), "device").passed


def test_the_child_reads_the_tuning_choices_the_grader_reads(tmp_path):
    """Issue 25: a tuned variant graded something else than the student's kernels on a GPU. The child imports a
    private copy of labkit outside the checkout, where labkit.tune finds no results/tuning.json, so the tuned
    variant fell back to its default kernel. The job now names the grader's tuning file and the child reads it."""
    import subprocess
    import sys

    from labkit import tune
    from labkit.grading import child_start, sandbox

    if not tune.STORE.is_file():
        pytest.skip("no results/tuning.json in this checkout")
    sandbox.private_labkit(tmp_path / "lib")
    (tmp_path / "work").mkdir()
    copy = child_start.tuning_copy(tmp_path)
    probe = ("import json, sys; from labkit import tune; from labkit.grading import protocol, worker\n"
             "before = tune.stored('cifar10', 50000)\n"
             "worker._use_tuning(protocol.JobSpec(stage='09', notebook='', inputs='', variants={}, nets={}, "
             "workloads={}, tuning=sys.argv[1]))\n"
             "print(json.dumps([before, tune.stored('cifar10', 50000)]))")
    env = sandbox.child_env(lib=tmp_path / "lib")
    out = subprocess.run([sys.executable, "-c", probe, copy], cwd=tmp_path / "work", env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before is None  # where the bug came from: no choices in the private copy
    assert after == tune.stored("cifar10", 50000) and after["choice"]["conv1"].startswith("09 tiles")


def test_a_cuda_c_launch_counts_for_the_host_function_that_asked_for_it():
    """lk.gpu.launch_raw (CUDA C) has no Python kernel to classify: the launch hook records the calling function's
    code, so a stage-09 variant whose layers run only CUDA C is not taken for 'no kernel at all' on a GPU."""
    import subprocess
    import sys

    code = (
        "import labkit as lk\n"
        "from labkit.grading import ownership\n"
        "seen = []\n"
        "class T:\n"
        "    def launched(self, f): seen.append(f.__code__.co_name)\n"
        "ref = [T()]\n"
        "ownership.install_launch_hook(ref)\n"
        "def students_host_code():\n"
        "    lk.gpu.launch_raw(lambda grid, block, args, shared_mem=0: None, (2,), (32,), (1, 2.0))\n"
        "students_host_code()\n"
        "ref[0] = None\n"
        "students_host_code()\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['students_host_code']"


def test_a_library_context_manager_counts_for_the_code_that_entered_it():
    """A library's @contextmanager (cupyx.errstate, numpy's) is entered from contextlib's frame: the tracer names
    the caller of the `with`, so a library that enters its own context manager is not taken for the student (on an
    H100 every reference solution was refused for 'calls cupyx.errstate'), and a student's `with` still is."""
    import contextlib
    import types as _types

    from labkit.grading import ownership

    tracer = ownership.Tracer.__new__(ownership.Tracer)
    tracer.current, seen = {"library": [], "launches": {}}, []
    tracer._record = lambda name, caller: seen.append((name, caller))

    @contextlib.contextmanager
    def errstate():
        yield

    tracer._codes = {errstate.__wrapped__.__code__: "cupyx.errstate"}
    tracer._dispatchers = {}
    tracer.lib = _types.SimpleNamespace(name=lambda obj: None)  # no C routine is a library's here
    library_module = _types.ModuleType("cupy._core.fake")
    exec("def library_code(cm):\n    with cm():\n        pass\n", library_module.__dict__)
    previous = sys.getprofile()
    sys.setprofile(tracer._profile)
    try:
        library_module.library_code(errstate)
        with errstate():
            pass
    finally:
        sys.setprofile(previous)
    assert ("cupyx.errstate", "cupy._core.fake") in seen
    assert ("cupyx.errstate", __name__) in seen
    assert not [c for _, c in seen if c == "contextlib"]


def test_a_contextmanager_wrapper_does_not_name_every_context_manager():
    """contextlib's helper is one code object for every @contextmanager in the process: registered under the first
    library routine's name ("cupyx.errstate" where cupy is loaded), it made each `with` of any context manager a
    library call (on an H100 every reference solution was refused). Only a function's own code names it."""
    import contextlib

    from labkit.grading import ownership

    @contextlib.contextmanager
    def routine():
        yield

    tracer = ownership.Tracer.__new__(ownership.Tracer)
    tracer.lib = types.SimpleNamespace(_objects=[routine], refresh=lambda: None,
                                       name=lambda obj: "somelib.routine" if obj is routine else None)
    tracer.namespaces, tracer._points, tracer._modules_seen = [], None, -1
    tracer._patch_points()
    assert routine.__wrapped__.__code__ in tracer._codes
    assert routine.__code__ not in tracer._codes  # contextlib's helper, shared with every other context manager


@pytest.mark.skipif(not device.is_simulated(), reason="the technique's child runs on the CUDA simulator")
def test_on_a_gpu_the_technique_is_counted_again_in_a_simulator_child(tmp_path, monkeypatch):
    """Issue 25: on a GPU the technique check was "its kernels have shared memory", so one token shared load per
    output earned the points. A GPU job now grades the technique a second time, in a sandboxed child of its own
    under the CUDA simulator (load fractions against the stage's budget), and that line decides the points."""
    import wrong_submissions as ws

    from labkit.grading import isolation, job as grading_job

    paths = ws.write(tmp_path / "class", ["token_shared"])
    ctx = run.Context(["05"], grading.load_rubric(), ws.REPO / "solutions", gpu=False, simulated=True,
                      sandbox=isolation.choose("auto", unsandboxed=True))
    plan = ctx.plans["05"]

    def counted(notebook):
        j = grading_job.TechniqueJob(plan, ctx.refs, "s", notebook, 7, gpu=False)
        j.sandbox = ctx.sandbox
        return j.run()

    token, right = counted(paths["token_shared"]), counted(plan.solution)
    assert token.technique and not token.technique["passed"], token.technique
    assert "counted on the simulator" in token.technique["line"] and "at least 75 %" in token.technique["line"]
    assert right.technique and right.technique["passed"], right.technique
    assert token.cases == 0 and not token.checks and not token.timing_runs  # the technique alone, nothing else

    # the GPU job's own line ("uses shared memory: PASS (… bytes)") is replaced by the counted one, kept beside it
    gpu_job = grading_job.GradingJob(plan, ctx.refs, "s", paths["token_shared"], 7, gpu=True)
    gpu_job.outcome.technique = {"passed": True, "line": "conv2 uses shared memory: PASS (kernel: 1024 bytes)"}
    monkeypatch.setattr(grading_job.TechniqueJob, "run", lambda self: token)
    gpu_job._technique_counted()
    assert gpu_job.outcome.technique["passed"] is False
    assert gpu_job.outcome.technique["gpu"].endswith("(kernel: 1024 bytes)")
    assert gpu_job.outcome.technique["line"] == token.technique["line"]
    gpu_job.outcome.checks_done, gpu_job.outcome.accuracy_done = True, True
    details = gpu_job.row()["details"]
    assert details["technique"] == token.technique["line"] and details["technique_gpu"].endswith("1024 bytes)")


def _stage09_plan(tmp_path, monkeypatch, variants: list[str]):
    """Stage 09 planned with the shipped rubric, grading ``variants`` and timing the last (its solution's
    declaration stood in for: the plan's rules only)."""
    from labkit.grading import plan as planning
    from labkit.grading.protocol import VariantSpec

    spec = {n: VariantSpec(name=n, target="gpu", arrays="device", per_image=False, nets=("cifar10",),
                           layers={"cifar10": ["conv1", "conv2"]}) for n in ("pooled", "tuned_cifar10")}
    monkeypatch.setattr(planning, "describe_stage", lambda solution: (spec, list(spec)))
    monkeypatch.setattr(planning, "in_step", lambda stage, solutions: None)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(f'[stage."09"]\nvariants = {json.dumps(variants)}\ntimed_variant = "{variants[-1]}"\n')
    return planning.plan_stage(STAGES["09"], tmp_path, grading.load_rubric(rubric), gpu=True, simulated=False)


def test_the_technique_is_counted_on_the_students_kernel_whatever_variant_is_timed(tmp_path, monkeypatch):
    """On an H100, a rubric timing stage 09's tuned_cifar10 took the kit's own solution's technique points: the tuner
    had chosen given code for conv2, and the technique was counted on the timed variant. The shipped rubric names
    the variant whose conv is the student's (technique.variant); one that does not grade it is refused."""
    plan = _stage09_plan(tmp_path, monkeypatch, ["pooled", "tuned_cifar10"])
    assert plan.timed == "tuned_cifar10" and plan.technique()["variant"] == "pooled"
    with pytest.raises(grading.GradeError, match="counts its technique on variant 'pooled', which is not graded"):
        _stage09_plan(tmp_path, monkeypatch, ["tuned_cifar10"])


@pytest.mark.parametrize("named", ["pooled", ""])
def test_the_child_counts_the_technique_of_the_variant_it_is_told(monkeypatch, named):
    from labkit.grading import protocol as P, student_phases

    counted = []
    monkeypatch.setattr(student_phases, "technique_budget",
                        lambda conv, tech, arrays: counted.append(conv) or P.Technique(passed=True, line="ok"))
    monkeypatch.setattr(student_phases.simulator, "active", lambda: True)
    sent = []
    ctx = types.SimpleNamespace(
        job=types.SimpleNamespace(technique=P.TechniqueSpec("constant", "cifar10", "conv2", 0.4, named),
                                  timed="tuned_cifar10"),
        restore=lambda: None, compare=lambda when: None, send=sent.append)
    phases = student_phases.StudentPhases(ctx)
    own, given = (lambda *a: None), (lambda *a: None)
    phases.student = {n: types.SimpleNamespace(impls={"conv": f}, arrays="device")
                      for n, f in (("pooled", own), ("tuned_cifar10", given))}
    assert phases.technique()
    assert counted == [own if named else given]
    assert f"of variant {named or 'tuned_cifar10'!r}" in sent[0].what and sent[1].passed


def test_a_runs_stages_are_described_by_one_child_and_its_workers_plan_from_that(tmp_path, monkeypatch):
    """A run asks what each stage's solution declares of one child, not of one child a stage (seven took about 17 s
    of a run's start on an H200 host, again in each cluster worker); a solution that does not load is named with
    its error; a worker's context plans from the parent's description and starts no child."""
    import shutil
    import subprocess

    import wrong_submissions as ws

    from labkit.grading import plan as planning

    children = []
    real_run = subprocess.run
    monkeypatch.setattr(planning.subprocess, "run", lambda *a, **kw: children.append(a[0]) or real_run(*a, **kw))
    solutions = ws.REPO / "solutions"
    ctx = run.Context(["01", "02"], grading.load_rubric(), solutions, gpu=False, simulated=True)
    assert len(children) == 1 and sum(arg.endswith(".ipynb") for arg in children[0]) == 2
    for n in ("01", "02"):  # the same as each described alone
        variants, order = planning.describe_stage(solutions / STAGES[n].notebook)
        assert list(ctx.plans[n].variants) == [v for v in order if v in ctx.plans[n].variants]
        assert all(ctx.plans[n].variants[v] == variants[v] for v in ctx.plans[n].variants)

    children.clear()
    worker = run.Context(["01", "02"], grading.load_rubric(), solutions, gpu=False, simulated=True,
                         described=json.loads(json.dumps(ctx.described_json())))
    assert children == [] and {n: p.variants for n, p in worker.plans.items()} == \
        {n: p.variants for n, p in ctx.plans.items()}

    broken = tmp_path / "solutions"
    broken.mkdir()
    for n in ("01", "02"):
        shutil.copy(solutions / STAGES[n].notebook, broken / STAGES[n].notebook)
    nb = nbformat.read(broken / STAGES["02"].notebook, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "VARIANTS" in c.source)
    cell.source += '\nraise RuntimeError("this solution is broken")'
    nbformat.write(nb, broken / STAGES["02"].notebook)
    with pytest.raises(grading.GradeError, match=r"02_.*does not load:(.|\n)*this solution is broken"):
        run.Context(["01", "02"], grading.load_rubric(), broken, gpu=False, simulated=True)
