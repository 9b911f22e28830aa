"""From what came back of one job to one row of the report: status, points and the one-line message.

Kept apart from the process handling so that the rules (correctness gates everything; accuracy only counts on
labelled images; op time only when measured: against a partner's passes of the same turn, the median of the pass
pairs, else the best of the timed passes) read in one place, in the order the message names problems: the most
fundamental first (the grader's own error, tampering, forbidden library use, then what the student's code got
wrong).
"""

from __future__ import annotations

import dataclasses
import math
import signal
from pathlib import Path
from statistics import median

import numpy as np

from ..course.stages import Stage, label
from .phases import rounded
from .plan import StagePlan
from .rubric import op_time_fraction
from .sandbox import LINGER_S


@dataclasses.dataclass
class JobOutcome:
    """What came back from one child, judged by the parent."""

    device: str = ""
    phase: str = "starting"
    load_error: str | None = None
    problems: dict = dataclasses.field(default_factory=dict)
    cases: int = 0  # how many checks were sent
    case_variants: dict = dataclasses.field(default_factory=dict)  # case id -> variant name
    checks: dict = dataclasses.field(default_factory=dict)  # case id -> CheckResult
    checks_done: bool = False
    accuracy_runs: int = 0  # how many accuracy runs were sent
    accuracy: dict = dataclasses.field(default_factory=dict)  # accuracy id -> dict
    accuracy_done: bool = False
    reference_runs: list | None = None  # the reference solution's timed passes (timed in a child of its own)
    reference_method: str = ""
    timing_runs: list | None = None
    timing_method: str = ""
    time_limit: float = 0.0  # the limit this job ran under (the rubric's, or from the reference's job)
    timing_error: str | None = None
    done: bool = False
    grader_error: str | None = None
    protocol_error: str | None = None
    timed_out: bool = False
    memory_exceeded: bool = False
    returncode: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0
    tampered: list = dataclasses.field(default_factory=list)  # files on disk the job changed
    tampered_code: dict | None = None  # what the snapshot showed changed after a call into the student's code
    forbidden: list = dataclasses.field(default_factory=list)  # own kernels only: what the timed conv computed with
    reference_mismatches: list | None = None  # per timed pass of the reference: predictions off the float64 ones
    timing_mismatches: list | None = None  # ... of the student's timed passes
    timed_images: int = 0  # images of each timed pass
    technique: dict | None = None  # {passed, line}: the stage's memory technique, as check_technique saw it
    task_calls: dict = dataclasses.field(default_factory=dict)  # task -> calls sent (its own check, labkit.tasks)
    tasks: dict = dataclasses.field(default_factory=dict)  # task -> {passed, line, calls}: the calls judged
    resource_error: bool = False  # the grader's machinery ran out of a resource (a retry may pass)
    survivors: list = dataclasses.field(default_factory=list)  # pids still there long after the job was ended
    paused_s: float = 0.0  # stopped while other jobs timed, or waiting for its own turn: not in its limit
    quiet_s: float = 0.0  # on a GPU, how long its timing waited for the stopped jobs' queued work to drain
    timing_attempts: list = dataclasses.field(default_factory=list)  # each timing turn's probe (GradingJob._again)
    paired: list = dataclasses.field(default_factory=list)  # each attempt's passes beside the reference partner's
    last_kernel: str = ""  # on a GPU, the kernel the child launched last (a hung job's row names it)
    finished: set = dataclasses.field(default_factory=set)  # the phases the child finished (PHASES)
    phases: dict = dataclasses.field(default_factory=dict)  # seconds per phase (labkit.grading.phases)
    technique_child: dict = dataclasses.field(default_factory=dict)  # on a GPU, the phases of the technique's
    # simulator child when it ran beside this job's (its part after this child ended is in phases' technique)
    notes: list = dataclasses.field(default_factory=list)


OWN_KERNELS = "the timed layer must compute with your own kernels"


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": median(values), "max": max(values), "runs": len(values)}


def timing_allowance(o: JobOutcome, images: int) -> int:
    """How many predictions of a timed pass may differ from the float64 reference's: as many as the reference
    solution's own passes had, or 1 % of the images (float32 near-ties), whichever is more."""
    return max(max(o.reference_mismatches or [0]), math.ceil(0.01 * images))


def timing_mismatch(o: JobOutcome, images: int) -> tuple[int, int] | None:
    """(pass, mismatches) of the first student's timed pass whose predictions are off, or None."""
    allowed = timing_allowance(o, images)
    for k, m in enumerate(o.timing_mismatches or []):
        if m > allowed:
            return k, m
    return None


def checks_passed(o: JobOutcome) -> bool:
    return not o.problems and len(o.checks) == o.cases and all(r.passed for r in o.checks.values())


def accuracy_passed(o: JobOutcome) -> bool:
    return len(o.accuracy) == o.accuracy_runs and all(a["passed"] for a in o.accuracy.values())


def empty_row(student: str, stage: Stage, plan: StagePlan) -> dict:
    return {"student": student, "stage": stage.number, "status": "", "passed": False, "score": 0.0,
            "max_score": plan.max_score(), "correctness_points": 0.0, "accuracy_points": 0.0,
            "op_time_points": 0.0, "technique_points": 0.0, "task_points": 0.0, "error": None, "accuracy": None,
            "reference_accuracy": None, "op_time_s": None,
            "reference_op_time_s": None, "ratio": None, "message": "", "notebook": "", "seed": None,
            "seconds": 0.0, "device": "", "details": {}, "max_points": plan.max_points()}


def _gerund(phase: str) -> str:
    phase = phase or "starting"
    if phase.startswith(("loading", "timing", "starting")):
        return phase
    return f"running {phase}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _check_messages(o: JobOutcome, plan: StagePlan) -> list[str]:
    failing = list(dict.fromkeys((o.case_variants[cid], res.name) for cid, res in sorted(o.checks.items())
                                 if not res.passed))
    first = next(res for _, res in sorted(o.checks.items()) if not res.passed)
    msg = [str(first)]
    if len(plan.variants) > 1:
        msg[0] = f"variant {failing[0][0]!r}: {msg[0]}"
    if len(failing) > 1:
        names = [layer if len(plan.variants) == 1 else f"{v}:{layer}" for v, layer in failing[1:]]
        more = f" and {len(names) - 6} more" if len(names) > 6 else ""
        msg.append("also failing: " + ", ".join(names[:6]) + more)
    return msg


#: a job's phases in the order its child runs them; all but the technique settle the status (what the code computes
#: and with what: a later phase can still find a library call or a patch), the technique only adds its points
PHASES = ("load", "checks", "tasks", "accuracy", "timing", "technique")


def not_run(o: JobOutcome) -> list[str]:
    """The phases a child that ended early never finished."""
    return [p for p in PHASES if p not in o.finished]


def _stuck(o: JobOutcome) -> str:
    if not o.survivors:
        return ""
    return (f"; its processes were still running {LINGER_S:.0f} s after they were ended: a GPU kernel that never "
            f"returns (a barrier not every thread of the block reaches, cuda.syncthreads() inside an if?)")


def _ended_early(o: JobOutcome, plan: StagePlan) -> tuple[str, str] | None:
    """(status, why) when the child did not finish its work normally."""
    if not (o.timed_out or o.memory_exceeded or o.protocol_error or (not o.done and not o.grader_error)):
        return None
    if o.timed_out:
        kernel = f" (the last kernel it launched: {o.last_kernel})" if o.last_kernel else ""
        return "timeout", (f"time limit ({o.time_limit or plan.time_limit:.0f} s) reached while {_gerund(o.phase)}"
                           f"{kernel}: an infinite loop, a kernel that never ends, or too slow for the limit"
                           f"{_stuck(o)}")
    if o.memory_exceeded:
        return "error", (f"memory limit ({plan.rubric['limits']['memory_mb']} MB resident) exceeded while "
                         f"{_gerund(o.phase)}")
    if o.protocol_error:
        return "error", f"{o.protocol_error} while {_gerund(o.phase)}"
    tail = _last_line(o.stderr_tail)
    return "error", (f"the grading process ended unexpectedly ({_exit_text(o.returncode)}) while {_gerund(o.phase)}"
                     + (f"; last stderr line: {tail}" if tail else ""))


def row(plan: StagePlan, student: str, notebook: Path, seed: int, o: JobOutcome) -> dict:
    """The report's row for one graded (student, stage)."""
    out = empty_row(student, plan.stage, plan)
    out.update(notebook=str(notebook), seed=seed, seconds=round(o.seconds, 2), device=o.device)
    details = out["details"]
    details["checks"] = [f"[{label(plan.stage.number, o.case_variants[cid])}] {res}"
                         for cid, res in sorted(o.checks.items())]
    details["accuracy_runs"] = list(o.accuracy.values())
    if o.phases:
        details["phases_s"] = rounded(o.phases)
    if o.technique_child:
        details["technique_child_s"] = o.technique_child
    # the largest relative error over the compared outputs; none when an output was missing, not finite or the
    # wrong shape (the message says which), since a maximum over the others would look like a pass
    errors = [res.error for res in o.checks.values()]
    out["error"] = max(errors) if errors and all(np.isfinite(e) for e in errors) else None
    correct = checks_passed(o) and not o.load_error and not o.grader_error and o.checks_done
    acc_ok = correct and accuracy_passed(o)
    main = _accuracy(out, o, plan)
    images = o.timed_images or plan.rubric["timing"]["images"]
    ratio, bad_pass = _op_time(out, o, plan, images)
    verdict = _status(out, o, plan, correct, acc_ok, bad_pass, images)
    cheated = _points(out, o, plan, verdict, correct, acc_ok, ratio)
    out["passed"] = bool(correct and acc_ok and not cheated and bad_pass is None and not verdict["task_failures"]
                         and verdict["early"] is None)
    if not out["status"]:
        out["status"] = "pass" if out["passed"] else "fail"
    msg = _pass_words(o, plan, main, ratio, details) if out["status"] == "pass" else verdict["msg"]
    if out["status"] != "pass" and o.timing_error:
        msg.append(f"op time: {o.timing_error}")
    out["message"] = "; ".join(m for m in [*msg, *o.notes] if m)
    return out


def _accuracy(out: dict, o: JobOutcome, plan: StagePlan) -> dict | None:
    """The accuracy figures of the timed variant's first net (or the first accuracy run) into ``out``; that run."""
    main = o.accuracy.get(f"{plan.timed}/{plan.variants[plan.timed].nets[0]}") or next(
        iter(o.accuracy.values()), None)
    if main is not None:
        out["reference_accuracy"] = main["reference_accuracy"]
        if main["simulated"]:
            out["accuracy"] = "n/a (simulated)"
        elif main["synthetic"]:
            out["accuracy"] = "n/a (synthetic inputs)"
        else:
            out["accuracy"] = main["accuracy"]
    return main


def _op_time(out: dict, o: JobOutcome, plan: StagePlan, images: int) -> tuple[float | None, tuple | None]:
    """Op time against the reference's into ``out``: the ratio that scores it (None: not scored) and the first
    timed pass that predicted differently from the reference, if one did."""
    details, ratio = out["details"], None
    bad_pass = timing_mismatch(o, images) if o.timing_runs else None
    pairs = [p for p in o.paired if p["reference"]]
    if o.timing_runs and (pairs or o.reference_runs):
        # the whole pass: every layer, whatever it left running, until the last result is on the device
        best = min(pairs, key=lambda p: min(run["pass"] for run in p["student"])) if pairs else None
        if pairs:
            student, ref, ratio = paired_op_time(pairs)
            st, rt = median(student), median(ref)
        else:  # the reference job's passes: the best of each, what the code can do, not the noise
            student, ref = [run["pass"] for run in o.timing_runs], [run["pass"] for run in o.reference_runs]
            st, rt = min(student), min(ref)
            ratio = st / rt if rt > 0 else None
        out["op_time_s"], out["reference_op_time_s"] = st, rt
        out["ratio"] = ratio
        details["op_time_runs"] = {"run": label(plan.stage.number, plan.timed), "student": o.timing_runs,
                                   "reference": o.reference_runs}
        details["op_time_reference"] = (
            {"timed": "in the student's turn, just before it (a partner)", "attempt": best["attempt"],
             "pairs": [{"attempt": p["attempt"], "student_s": min(r["pass"] for r in p["student"]),
                        "reference_s": min(r["pass"] for r in p["reference"]) if p["reference"] else None,
                        # each pass, in the order they alternated: how far a core's swings reach the ratio
                        "student_passes_s": [r["pass"] for r in p["student"]],
                        "reference_passes_s": [r["pass"] for r in p["reference"]] if p["reference"] else None,
                        **({"why": p["why"]} if "why" in p else {})} for p in o.paired]} if best else
            {"timed": "in the reference job", **({"why": o.paired[0].get("why", "")} if o.paired else {})})
        details["op_time_spread"] = {"student": spread(student), "reference": spread(ref)}
        details["turn"] = {"paused_s": round(o.paused_s, 2), "quiet_wait_s": round(o.quiet_s, 3),
                           "attempts": o.timing_attempts}
        details["timed_predictions"] = {"student_mismatches": o.timing_mismatches,
                                        "reference_mismatches": o.reference_mismatches,
                                        "allowed": timing_allowance(o, images), "images": images}
    elif not plan.measured:
        out["op_time_s"] = f"not measured ({plan.not_measured_why})"
    if bad_pass is not None:
        ratio = None  # the times of passes that computed something else are no op time
    return ratio, bad_pass


def paired_op_time(pairs: list[dict]) -> tuple[list[float], list[float], float | None]:
    """The student's and the partner's passes of every paired turn, and the ratio that scores them: the median,
    over the turns' pass pairs, of the student's pass over the partner's pass just before it. A core's speed
    swings within a turn, pass by pass; a pair's two passes share the swing, a minimum of each side does not. On
    two H200s (the same class graded on one GPU and on two, three times) the largest gap between the two runs'
    ratios of one submission was 12-14 % this way against 24-55 % for the best passes' ratio, and copies of the
    solution scored 0.965-1.153 against 0.684-1.272 (results/h200x2-2026-11-28c)."""
    student = [run["pass"] for p in pairs for run in p["student"]]
    ref = [run["pass"] for p in pairs for run in p["reference"]]
    ratios = [s["pass"] / r["pass"] for p in pairs for s, r in zip(p["student"], p["reference"]) if r["pass"] > 0]
    return student, ref, (median(ratios) if ratios else None)


def _status(out: dict, o: JobOutcome, plan: StagePlan, correct: bool, acc_ok: bool, bad_pass, images: int) -> dict:
    """Status and message, the most fundamental problem first, into ``out``; returns the message's parts, the
    tasks' points and failures, the library calls found and how the job ended early (None: it did not)."""
    details, msg = out["details"], []
    forbidden = list(dict.fromkeys(o.forbidden))
    if forbidden:
        details["forbidden"] = forbidden
    if o.grader_error:
        out["status"], msg = "grader-error", [o.grader_error]
    elif forbidden:
        out["status"] = "forbidden"
        msg = [f"{forbidden[0]}: {OWN_KERNELS}"] + ([f"also: {'; '.join(forbidden[1:4])}"] if len(forbidden) > 1
                                                     else [])
    elif o.load_error:
        out["status"], msg = "error", [o.load_error]
    elif o.problems:
        out["status"], msg = "fail", list(o.problems.values())
    elif any(not res.passed for res in o.checks.values()):
        out["status"], msg = "fail", _check_messages(o, plan)
    elif correct and not acc_ok and o.accuracy_done:
        out["status"] = "fail"
        msg = [a["message"] for a in o.accuracy.values() if not a["passed"]][:2]
    elif bad_pass is not None:
        out["status"] = "fail"
        k, m = bad_pass
        msg = [f"timed pass {k + 1} (fresh images) predicted differently from the reference (class or "
               f"probabilities) on {m} of "
               f"{images} images (at most {timing_allowance(o, images)} allowed): a result kept from an earlier "
               f"pass, or a race? op time not scored"]
    task_points, task_failures = _tasks(o, plan, details)
    if task_failures and not out["status"]:
        out["status"], msg = "fail", task_failures
    early = _ended_early(o, plan)
    if early:
        if out["status"] in ("", "pass", "fail") and not o.grader_error:
            out["status"] = early[0]
        missing = not_run(o)
        msg.append(early[1] + (f"; not run: {', '.join(missing)} (nothing that depends on them is scored)"
                               if missing else ""))
    elif o.survivors:
        msg.append(_stuck(o).lstrip("; "))
    if o.resource_error:
        details["resource_error"] = True
    if o.tampered_code or o.tampered:
        what = []
        if o.tampered_code:
            t = details["tampered"] = o.tampered_code
            more = f" and {t['count'] - 10} more" if t["count"] > 10 else ""
            what.append(f"the grader's code while it ran ({', '.join(t['what'][:10])}{more}; {t['when']})")
        if o.tampered:
            what.append(f"the grader's files on disk ({', '.join(o.tampered)})")
        out["status"] = "tampered"
        msg.insert(0, f"the submission changed {' and '.join(what)}: stage scored 0")
    return {"msg": msg, "task_points": task_points, "task_failures": task_failures, "forbidden": forbidden,
            "early": early}


def _points(out: dict, o: JobOutcome, plan: StagePlan, verdict: dict, correct: bool, acc_ok: bool,
            ratio: float | None) -> bool:
    """The points into ``out``: correctness gates everything; accuracy counts only where labels exist. Returns
    whether the submission cheated (a patch, a library call: nothing scores)."""
    pts, op, details = plan.rubric["points"], plan.rubric["op_time"], out["details"]
    op_points = 0.0
    c_points = float(pts["correctness"]) if correct else 0.0
    a_points = float(pts["accuracy"]) if acc_ok and plan.accuracy_scored else 0.0
    op_allowed = correct and (acc_ok or not op["requires_accuracy"])
    if op_allowed and plan.measured and ratio is not None:
        op_points = pts["op_time"] * op_time_fraction(ratio, op["full_at_ratio"], op["zero_at_ratio"])
    elif op_allowed and not plan.measured and op["when_not_measured"] == "full":
        op_points = float(pts["op_time"])
    t_points = 0.0
    if plan.technique():
        t = o.technique or {}
        details["technique"] = t.get("line", "not checked (the checks did not pass)")
        if t.get("gpu"):  # on a GPU: its own check, beside the simulator child's count that decides
            details["technique_gpu"] = t["gpu"]
        if correct and t.get("passed"):
            t_points = float(pts["technique"])
        elif correct:
            o.notes.append(f"no technique points: {t.get('line') or 'the technique was not checked'}")
    task_points = verdict["task_points"] if correct else 0.0
    cheated = bool(o.tampered or o.tampered_code or verdict["forbidden"])
    unsettled = verdict["early"] is not None and any(p != "technique" for p in not_run(o))
    if cheated or unsettled:  # a phase that did not run could still have found a library call or a patch
        c_points = a_points = op_points = t_points = task_points = 0.0
    elif verdict["early"] is not None:
        t_points = 0.0
    out.update(correctness_points=c_points, accuracy_points=a_points, op_time_points=round(op_points, 2),
               technique_points=t_points, task_points=task_points,
               score=round(c_points + a_points + op_points + t_points + task_points, 2))
    return cheated


def _pass_words(o: JobOutcome, plan: StagePlan, main: dict | None, ratio: float | None, details: dict) -> list[str]:
    """The message of a row that passed."""
    msg = ["all checks pass", _accuracy_words(main, plan.accuracy_scored)]
    if details.get("tasks"):
        msg.append(f"task{'s' * (len(details['tasks']) > 1)} {', '.join(details['tasks'])} pass")
    if ratio is not None:
        msg.append(f"op time {ratio:.2f}x the reference's")
    elif o.timing_error:
        msg.append(f"op time not scored: {o.timing_error}")
    elif not plan.measured:
        policy = {"exclude": "not counted", "full": "given in full",
                  "zero": "not given"}[plan.rubric["op_time"]["when_not_measured"]]
        msg.append(f"op time not measured ({plan.not_measured_why}): op-time points {policy}")
    return msg


def _tasks(o: JobOutcome, plan: StagePlan, details: dict) -> tuple[float, list[str]]:
    """The stage's tasks with checks of their own (``labkit.tasks``): the points they earned (before correctness
    gates them) and the FAIL line of each that failed. A task passes when every call it was sent came back right."""
    earned, failures = 0.0, []
    for name, pts in plan.graded_tasks().items():
        rec, sent = o.tasks.get(name), o.task_calls.get(name, 0)
        if rec is None and not o.checks_done:
            continue  # never reached: the checks' message says why
        passed = rec is not None and rec["passed"] and rec["calls"] == sent > 0
        line = (rec or {}).get("line") or (f"{name}: PASS (every call right)" if passed
                                           else f"{name}: not checked (the job ended first)")
        details.setdefault("tasks", {})[name] = {"passed": passed, "line": line, "points": pts}
        if passed:
            earned += pts
        elif rec is not None and not rec["passed"]:
            failures.append(f"task {name!r}: {line}")
    return earned, failures


def _accuracy_words(main: dict | None, scored: bool) -> str:
    if not scored:
        why = "simulated" if main is not None and main["simulated"] else "synthetic inputs"
        return f"predictions equal the reference's; accuracy not scored (no labelled images: {why}), not counted"
    if main is not None and main["accuracy"] is not None:
        return "accuracy equals the reference's"
    return "predictions equal the reference's"
