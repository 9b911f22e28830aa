"""The reference timed in each student's own turn (labkit.grading.partner; docs/grading.md, "Grades at any load"):
a reference job timed during a slow spell of its core must not move its stage's ratios, and the partner runs on the
holder's kept core while the student's processes are stopped."""

from __future__ import annotations

import re
import shutil
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_grade_load import PinningSandbox, _running  # noqa: E402

from labkit import grading  # noqa: E402
from labkit.grading import context, reports, rubric, scoring  # noqa: E402
from labkit.grading.cores import Cores  # noqa: E402
from labkit.grading.turns import Turns  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SOLUTION = REPO / "solutions" / "01_serial_baseline.ipynb"
SLOW = 10.0  # the reference job's passes as if its core had run this much slower (far beyond a busy 2-core
# machine's own swings: at 3, one copy of the solution timed alone scored 0.58 in a clean CI run, not below 0.5)


def _rubric(paired: str) -> str:
    text = (REPO / "tests" / "test_grade.py").read_text()
    body = re.search(r'TEST_RUBRIC = f"""(.*?)"""', text, re.S).group(1)
    body = body.replace("{TIME_LIMIT}", "120").replace("{{", "{").replace("}}", "}")
    if paired == "always":  # the limit as given: its students do not wait for the reference job (below)
        body = body.replace("[limits]\n", "[limits]\ntime_factor = 0\n")
    return body.replace("repeat = 3\n", f'repeat = 3\npaired = "{paired}"\n').replace(
        "full_at_ratio = 10.0", "full_at_ratio = 1.25").replace("zero_at_ratio = 20.0", "zero_at_ratio = 4.0")


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory):
    """Two copies of stage 01's solution graded at --jobs 2, the reference job's timed passes made SLOW times
    longer (a slow spell of its core), once with partners ("always": this stage's code is the CPU's) and once
    without; each run's report."""
    root = tmp_path_factory.mktemp("partner")
    for student in ("ann", "ben"):
        (root / "subs" / student).mkdir(parents=True)
        shutil.copy(SOLUTION, root / "subs" / student / SOLUTION.name)
    measured = context.reference_job

    def slowed(*args, **kwargs):
        retimes.append(kwargs.get("retime", True))
        ref = measured(*args, **kwargs)
        ref.runs = [{k: SLOW * v for k, v in run.items()} for run in ref.runs or []]
        return ref

    mp = pytest.MonkeyPatch()
    mp.setattr(context, "reference_job", slowed)
    reports, retimes = {}, []
    try:
        for paired in ("always", "never"):
            retimes.clear()
            (root / f"{paired}.toml").write_text(_rubric(paired))
            reports[paired] = grading.grade(root / "subs", stages=["01"], rubric=root / f"{paired}.toml",
                                            out=root / paired, progress=False, seed=11, jobs=2)
            reports[paired]["reference_retimed"] = list(retimes)
    finally:
        mp.undo()
    return reports


def test_a_slow_reference_job_does_not_move_the_ratios_of_paired_timing(slow_reference):
    paired, alone = slow_reference["always"]["rows"], slow_reference["never"]["rows"]
    assert [r["status"] for r in paired + alone] == ["pass"] * 4
    # the same code as the reference, timed beside its partner in the same turns: near 1 whatever the reference
    # job measured; against the slowed reference job's passes alone: about 1 / SLOW
    assert all(0.5 < r["ratio"] < 2.0 for r in paired), [r["ratio"] for r in paired]
    assert all(r["ratio"] < 5.0 / SLOW for r in alone), [r["ratio"] for r in alone]
    assert all(r["op_time_points"] > 20 for r in paired)  # (a ratio below 2 earns at least 21.8 of 30 here)
    for r in paired:
        how = r["details"]["op_time_reference"]
        assert how["timed"].startswith("in the student's turn")
        best = next(p for p in how["pairs"] if p["attempt"] == how["attempt"])
        assert best["student_s"] == min(p["student_s"] for p in how["pairs"])  # the student's best attempt's pair
        # the ratio: the median of each student's pass over the partner's pass just before it, every turn's
        pairs = [(s, q) for p in how["pairs"] if p["reference_passes_s"]
                 for s, q in zip(p["student_passes_s"], p["reference_passes_s"])]
        assert len(pairs) >= 3 and r["ratio"] == pytest.approx(statistics.median(s / q for s, q in pairs))
        assert r["op_time_s"] == pytest.approx(statistics.median(s for s, _ in pairs))
        assert r["reference_op_time_s"] == pytest.approx(statistics.median(q for _, q in pairs))
    for r in alone:
        assert r["details"]["op_time_reference"] == {"timed": "in the reference job"}
    # and each student's Gradescope line says how its op time was taken
    lines = {paired: [t["output"] for r in slow_reference[paired]["rows"]
                      for t in reports.gradescope_results([r], slow_reference[paired]["meta"])["tests"]
                      if t["name"].endswith(": op time")] for paired in ("always", "never")}
    assert len(lines["always"]) == 2 and all("the ratio is the median of your passes" in x for x in lines["always"])
    assert len(lines["never"]) == 2 and all("(best of the timed passes)" in x for x in lines["never"])
    # a slow core earns the reference job more turns only where its op time scores students
    assert slow_reference["always"]["reference_retimed"] == [False]
    assert slow_reference["never"]["reference_retimed"] == [True]


def test_the_partner_times_once_in_every_turn_and_ends_with_the_run(slow_reference):
    meta = slow_reference["always"]["meta"]
    attempts = sum(len(r["details"]["op_time_reference"]["pairs"]) for r in slow_reference["always"]["rows"])
    partner = meta["reference_partners"]["01"]
    assert partner["starts"] == 1 and partner["attempts_served"] == attempts and "error" not in partner
    assert slow_reference["never"]["meta"]["reference_partners"] == {}
    # no turn of the partner's own: its warm-up is untimed and stops nobody; the turns are the students' attempts
    # and the reference job's
    reference = sum(len(v["reference_attempts"]) for v in meta["time_limits"].values())
    assert meta["turns"]["turns"] == attempts + reference, (meta["turns"], attempts, reference)
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("labkit-grade-partner")]


def test_a_paired_student_does_not_wait_for_the_reference_job_where_it_scales_no_limit(slow_reference):
    """``time_factor = 0`` and a partner: the reference job runs in a slot of its own, first, and every student
    starts while it runs and reads its result once graded (a run on two H100s left half its slots waiting for stage
    06's; on two H200s the slot that ran it before its own student made the class's longest chain)."""
    report = slow_reference["always"]
    ref_start, ref_end = report["meta"]["reference_jobs"]["01"]["ran"]
    after = [r for r in report["rows"] if r["details"]["ran"].get("reference_read") == "after the job"]
    assert len(after) == 2 and min(r["details"]["ran"]["from"] for r in after) < ref_end
    assert ref_start <= min(r["details"]["ran"]["from"] for r in after) + 2.0  # taken first
    assert all(r["details"]["ran"]["reference_s"] < ref_end - ref_start for r in after)  # no student's slot ran it
    assert all(r["status"] == "pass" and r["details"]["op_time_reference"]["timed"].startswith("in the student")
               for r in report["rows"])
    # with the limit scaled by the reference job's wall time (the rubric's default), the other student waits
    alone = slow_reference["never"]
    ref_end = alone["meta"]["reference_jobs"]["01"]["ran"][1]
    assert not [r for r in alone["rows"] if "reference_read" in r["details"]["ran"]]
    assert min(r["details"]["ran"]["from"] + r["details"]["ran"]["reference_s"] for r in alone["rows"]) \
        >= ref_end - 0.5


def test_the_partner_runs_on_the_holders_kept_core_while_the_holder_is_stopped():
    box = PinningSandbox()
    turns = Turns(Cores(1, allowed=[0, 1, 2], siblings=lambda c: {c}))
    holder, partner, other = _running(box, "gpu0", 1), _running(box, "gpu0", 2), _running(box, "gpu0", 3)
    holder.kept_core = True
    for r in (holder, partner, other):
        turns.started(r)
    turns.acquire(holder, "gpu0")
    assert partner.frozen and other.frozen and box.pins == [(1, {2})]
    turns.lend_to(holder, partner)
    assert holder.frozen and not partner.frozen and other.frozen  # nothing of the student's runs beside it
    assert box.pins[-1] == (2, {2})  # on the holder's kept core
    turns.lend_back(holder, partner)
    assert not holder.frozen and partner.frozen and box.pins[-1] == (2, {0, 1})
    turns.release(holder)
    assert not any(r.frozen for r in (holder, partner, other))


def test_an_attempt_timed_beside_its_partner_is_not_timed_again_on_a_slow_core(shipped_plan):
    """A slow spell slows the partner's attempt and the student's alike (same core, same turn): another attempt
    would only lengthen the turns every other job waits for. Without a partner's passes it is timed again."""
    from labkit.grading.job import GradingJob

    job = GradingJob(shipped_plan, None, "ann", SOLUTION, 1, False)
    job._started = job._turn_at = __import__("time").monotonic()
    job.time_limit = 3600.0
    assert job._again(speed=3.0, fastest=1.0)  # no partner: a core three times slower is timed again
    job.partner, job._paired = object(), ([_pass(0.01)], "")
    assert not job._again(speed=3.0, fastest=1.0)
    job._paired = (None, "the reference partner did not start")
    assert job._again(speed=3.0, fastest=1.0)


def test_the_timed_passes_start_settled_and_run_uncollected():
    """What the earlier phases left (cyclic garbage) is collected before the turn, not inside a pass, and the
    collector is off while the passes run, on again after (docs/grading.md, "Grades at any load")."""
    import gc
    import weakref

    from labkit.grading import timed

    class Cycle:
        pass

    a = Cycle()
    a.me = a
    alive = weakref.ref(a)
    del a
    was = gc.isenabled()
    gc.disable()  # (so only settle can collect it)
    try:
        assert alive() is not None
        timed.settle(False)
        assert alive() is None
    finally:
        if was:
            gc.enable()
    gc.enable()
    with timed.uncollected():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with timed.uncollected():
        pass
    assert not gc.isenabled()  # (as it was)
    gc.enable()


class _LendLog:
    """Turns as a relay sees them: who runs (the holder, or the partner lent its core)."""

    def __init__(self):
        self.running = "holder"

    def lend_to(self, holder, other):
        self.running = "partner"

    def lend_back(self, holder, other):
        self.running = "holder"


def test_a_relay_takes_the_partners_passes_and_the_students_in_turn():
    """Partner pass 0, student pass 0, partner pass 1...: a slow spell of the core inside the attempt slows passes
    of both (with the partner's whole attempt first, copies of stage 07's solution scored 0.72 and 1.58 on an H100).
    Each side asks for pass k's images as the previous pass ends (``done``), then waits for its turn (``wait``); the
    partner's passes run while the holder is stopped, the student's while the partner is."""
    import threading

    from labkit.grading.partner import Relay

    log, turns, order = [], _LendLog(), []
    relay = Relay(turns, "holder", "partner", 3)
    relay.start()

    def side(who, name):
        for k in range(3):
            relay.before_pass(who, k)
            order.append(f"{name}{k}")
            log.append((f"{name}{k}", turns.running))
        if who == Relay.PARTNER:
            relay.finish([_pass(0.01)] * 3, "")
        else:
            relay.done(who, 2)

    threads = [threading.Thread(target=side, args=(Relay.STUDENT, "s")),
               threading.Thread(target=side, args=(Relay.PARTNER, "p"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["p0", "s0", "p1", "s1", "p2", "s2"]
    assert all(running == ("partner" if name[0] == "p" else "holder") for name, running in log), log
    assert relay.result() == ([_pass(0.01)] * 3, "") and turns.running == "holder"


def test_a_relay_whose_partner_ends_lets_the_student_go_on_alone():
    import threading

    from labkit.grading.partner import Relay

    turns = _LendLog()
    relay = Relay(turns, "holder", "partner", 3)
    relay.start()
    waited = threading.Thread(target=relay.wait, args=(Relay.STUDENT, 1))
    waited.start()
    relay.abort("the reference partner ended")
    waited.join(5)
    assert not waited.is_alive() and turns.running == "holder"
    assert relay.result() == (None, "the reference partner ended")
    assert Relay.ended("not ready").result() == (None, "not ready")


def test_a_pass_asked_for_out_of_order_ends_the_relay_at_once():
    """A child that skips a pass (or asks for one again) would wait for a turn that cannot come, holding every other
    job's turn for ATTEMPT_S: the relay ends at once, says why, and frees the side waiting for it."""
    import threading
    import time

    from labkit.grading.partner import Relay

    for asked in ([0, 2], [0, 0], [1]):
        turns = _LendLog()
        relay = Relay(turns, "holder", "partner", 3)
        relay.start()
        partner = threading.Thread(target=lambda: [relay.before_pass(Relay.PARTNER, k) for k in range(3)])
        partner.start()
        started = time.monotonic()
        for k in asked:
            relay.before_pass(Relay.STUDENT, k)
        partner.join(5)
        assert time.monotonic() - started < 5 and not partner.is_alive(), asked
        runs, why = relay.result()
        assert runs is None and f"asked for pass {asked[-1]}'s images where pass" in why, (asked, why)
        assert turns.running == "holder"


def _pass(t: float) -> dict:
    return {"pass": t, "conv1": t / 2}


def test_op_time_pairs_each_student_pass_with_the_reference_pass_of_its_turn(shipped_plan):
    o = scoring.JobOutcome(timing_runs=[_pass(0.020), _pass(0.012)], reference_runs=[_pass(0.030)],
                           paired=[{"attempt": 0, "student": [_pass(0.020)], "reference": [_pass(0.019)]},
                                   {"attempt": 1, "student": [_pass(0.012)], "reference": [_pass(0.010)]}])
    out = {"details": {}}
    ratio, _ = scoring._op_time(out, o, shipped_plan, 4)
    # the median of 0.020 / 0.019 and 0.012 / 0.010 (the best attempt's best passes alone: 1.2); the attempt with
    # the student's best pass is still named
    assert ratio == pytest.approx((0.020 / 0.019 + 1.2) / 2) and out["details"]["op_time_reference"]["attempt"] == 1
    assert out["op_time_s"] == pytest.approx(0.016) and out["reference_op_time_s"] == pytest.approx(0.0145)
    assert [(p["student_passes_s"], p["reference_passes_s"]) for p in out["details"]["op_time_reference"]["pairs"]] \
        == [([0.020], [0.019]), ([0.012], [0.010])]  # every pass of each turn, kept in the row
    # the partner timed nothing (it could not start): the reference job's passes, and the row says why
    o.paired = [{"attempt": 0, "student": [_pass(0.012)], "reference": None, "why": "it did not load"}]
    out = {"details": {}}
    ratio, _ = scoring._op_time(out, o, shipped_plan, 4)
    assert ratio == pytest.approx(0.4)
    assert out["details"]["op_time_reference"] == {"timed": "in the reference job", "why": "it did not load"}


def test_a_bad_pairing_mode_is_refused(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[timing]\npaired = "sometimes"\n')
    with pytest.raises(rubric.RubricError, match="timing.paired must be one of gpu, always, never"):
        rubric.load_rubric(path)


@pytest.fixture(scope="module")
def shipped_plan():
    from labkit.grading.plan import plan_stage
    from labkit.stages import STAGES

    return plan_stage(STAGES["01"], REPO / "solutions", rubric.load_rubric(), gpu=False, simulated=True)



def test_a_partner_that_cannot_start_says_why_once_and_is_not_started_again(shipped_plan, tmp_path):
    """Its students are timed against the reference job's passes (their rows say why: see the scoring test above),
    and no student job waits for it to start again."""
    import dataclasses

    from labkit.grading.partner import Partner
    from labkit.grading.plan import References

    plan = dataclasses.replace(shipped_plan, solution=tmp_path / "gone.ipynb")
    partner = Partner(plan, References(), False, 1, {}, None, None)
    partner.wait_ready(None)
    runs, why = partner.pair(None, 3).result()
    assert runs is None and why.startswith("the reference partner failed: FileNotFoundError")
    partner.wait_ready(None)
    assert partner.starts == 1 and partner.report()["error"] == why


def test_the_paired_ratio_is_the_median_of_pass_pairs_not_of_the_best_passes():
    """One student's pass that caught a fast spell of the core its partner's pass before it missed moves the ratio
    of the turn's best passes, not the median of the pairs (on two H200s the first moved copies of the solution
    by up to 24.5 % between runs, the second by up to 13.5 %)."""
    student = [1.10, 1.21, 0.60, 1.32, 1.10]
    partner = [1.00, 1.10, 1.00, 1.20, 1.00]
    turn = {"attempt": 0, "student": [{"pass": s} for s in student], "reference": [{"pass": q} for q in partner]}
    passes, refs, ratio = scoring.paired_op_time([turn])
    assert ratio == pytest.approx(1.10) and passes == student and refs == partner
    # a second turn's pairs count as well; a turn the partner could not time (no passes) gives nothing
    second = {"attempt": 1, "student": [{"pass": 2.4}, {"pass": 2.6}], "reference": [{"pass": 2.0}, {"pass": 2.0}]}
    assert scoring.paired_op_time([turn, second])[2] == pytest.approx(1.10)  # of 0.6, 1.1 x4, 1.2, 1.3
    assert scoring.paired_op_time([{"attempt": 0, "student": [{"pass": 1.0}], "reference": []}])[2] is None
