"""Judging a child's raw outputs in the parent, against the float64 reference's answers on the same inputs: a
check's output (``labkit.check.compare``, then ``hints``), an accuracy run's classes, each timed pass's
probabilities (``PROBABILITY_TOL``), a task call's result. The child never sees an answer: every comparison is here.
"""

from __future__ import annotations

import numpy as np

from ..core import graphs
from ..core.cases import kept_from_earlier
from ..core.check import CheckResult, compare
from ..core.engine import NanCauses
from ..model import reference
from . import hints
from . import protocol as P
from .plan import References, StagePlan
from .protocol import read_array

#: how far a timed pass's class probability may be from the float64 reference's (float32 sums differ by ~1e-6)
PROBABILITY_TOL = 1e-3


def timed_probabilities(payload: bytes, passes: int, images: int) -> list | None:
    """The class probabilities of each timed pass, if they all came back whole and finite."""
    probs = [read_array(payload, f"prob{k}") for k in range(passes)]
    if not passes or any(p is None or p.ndim != 2 or p.shape[0] != images or not np.isfinite(p).all() for p in probs):
        return None
    return probs


def expected_passes(refs: References, plan: StagePlan, images: list[np.ndarray], seed: int | None = None) -> list:
    """The float64 reference's class probabilities on each timed pass's images: one piece of work a pass (none
    where op time is not measured). ``seed``: the images were drawn from the run's seed for timed passes
    (``inputs.passes_seed``), the same for every job of the run that times this workload, so each pass's answer is
    computed once for them all (``References.shared``): computed job by job, their float64 convolutions were most
    of a grading worker's own processor time on an H200 (results/h200-2026-11-28c, results/h200x2-2026-11-28b)."""
    if not images:
        return []
    run = plan.timing_run()
    wl = refs.get(*run)[0]

    def forward(x) -> np.ndarray:
        return np.asarray(reference.forward(wl.net, wl.weights, x), np.float64)

    if seed is None:
        return [lambda x=x: forward(x) for x in images]
    return [lambda k=k, x=x: refs.shared(("timed pass", run, seed, k), lambda: forward(x))
            for k, x in enumerate(images)]


def mismatches(expected: list[np.ndarray], probs: list) -> list[int]:
    """Per timed pass: images whose prediction differs from the float64 reference's on the same images, or whose
    probabilities are off by more than PROBABILITY_TOL (a kept result with the same argmax)."""
    out = []
    for ref, p in zip(expected, probs):
        if p.shape != ref.shape:
            out.append(len(p))
            continue
        off = (p.argmax(axis=1) != ref.argmax(axis=1)) | (np.abs(p - ref).max(axis=1) > PROBABILITY_TOL)
        out.append(int(off.sum()))
    return out


def nan_causes(msg: P.CaseResult) -> NanCauses | None:
    """The engine's diagnosis of a layer's NaN outputs from the counts the child sent (None: it sent none)."""
    if msg.nan_unwritten is None and msg.nan_added is None and msg.nan_read is None:
        return None
    return NanCauses(unwritten=msg.nan_unwritten or 0, added=msg.nan_added or 0, read=msg.nan_read or 0)


#: a class the float64 reference gives with a lead this small over the next is a near tie: float32 may pick either
NEAR_TIE = 1e-5


def task_mismatch(want: dict, out: np.ndarray | None) -> str | None:
    """What is wrong with one task call's result (``labkit.tasks``), in a clause; None when it is right. graph:
    the probabilities on the host, each within ``PROBABILITY_TOL`` of the float64 reference's; pipeline: every
    image's class (near ties aside), as the pipeline left them when it returned."""
    ref = np.asarray(want["probs"], np.float64)
    if want["check"] == "pipeline":
        return _classes_mismatch(out, ref)
    why = graphs.unusable(out, ref.shape, bool(want.get("later")))
    if why:
        return why
    off = np.flatnonzero(np.abs(out.astype(np.float64) - ref).max(axis=1) > PROBABILITY_TOL)
    if off.size:
        return (f"{off.size} of {len(out)} images' probabilities differ from the reference's, first at image "
                f"{off[0]}" + (f": {graphs.KEPT}" if want.get("later") else ""))
    return None


def _classes_mismatch(got: np.ndarray | None, probs: np.ndarray) -> str | None:
    """A pipeline's classes against the float64 reference's (images whose two best classes are a near tie aside)."""
    n = len(probs)
    if got is None or not isinstance(got, np.ndarray) or got.shape != (n,):
        return f"the classes came back as {getattr(got, 'shape', None)}, expected ({n},)"
    best = np.sort(probs, axis=1)
    tie = best[:, -1] - best[:, -2] < NEAR_TIE
    wrong = np.flatnonzero((got != probs.argmax(axis=1)) & ~tie)
    if not wrong.size:
        return None
    unwritten = int(np.count_nonzero(got == -1))
    return (f"{wrong.size} of {n} classes differ from the reference's, first at image {wrong[0]} (got {got[wrong[0]]}, "
            f"want {probs[wrong[0]].argmax()})" + (f"; {unwritten} still -1 (never downloaded: the last, smaller "
                                                   f"chunk left out, or a lane not synchronized before returning?)"
                                                   if unwritten else ""))


class JobVerdicts:
    """``GradingJob``'s judging of what a frame carries: a check's output, an accuracy run's, the timed passes', and
    the trace of the calls that made them (its state is the job's, made in ``GradingJob.__init__``)."""

    def _case(self, msg: P.CaseResult, payload: bytes) -> None:
        if msg.id not in self.cases:
            self.outcome.protocol_error = f"a result for an unknown case {msg.id!r}"
            return
        c = self.cases[msg.id]
        if msg.skipped:
            if self._ahead is not None:
                self._ahead.skip(("case", msg.id))
            return
        if c["expected"] is None:  # its answer, computed ahead (labkit.grading.ahead)
            case = self._ahead.get(("case", msg.id))
            c["expected"], c["scale"] = case.expected, case.scale
        got = None
        if msg.error:
            res = CheckResult(c["name"], False, detail=msg.error, seed=self.seed)
        elif msg.race:  # the values may be right on the simulator; on a GPU they would not be
            res = CheckResult(c["name"], False, detail=msg.race, seed=self.seed)
        else:
            got = read_array(payload, "out")
            if got is None:
                res = CheckResult(c["name"], False, detail="no output array came back", seed=self.seed)
            else:
                res = compare(c["name"], got, c["expected"], self.plan.rubric["checks"]["tol"], batch=c["batch"],
                              launches=msg.launches, scale=c.get("scale"), nan=nan_causes(msg))
                res.seed = self.seed
                res.batches = (c["batch"],)
                if not res.passed and c.get("lands_on") is not None and c["layer"] is not None:
                    earlier = self.cases[c["lands_on"]]
                    kept = kept_from_earlier(c["layer"], (earlier["x"], earlier["weights"]), (c["x"], c["weights"]),
                                             got, self.plan.rubric["checks"]["tol"])
                    res.detail += kept
                    self._hinted = self._hinted or bool(kept)  # said what it is: no second guess after it
        if not res.passed and got is not None and not self._hinted:
            self._hinted = True
            res.detail += hints.explain(c, got, res, self._outputs, self.plan.rubric["checks"]["tol"])
        if got is not None:
            self._outputs.setdefault((c["variant"], c["net_name"], c["name"], c["batch"]), []).append(
                hints.fingerprint(got))
        self._trace(msg.trace, c["variant"], res.passed)
        self.outcome.checks[msg.id] = res

    def _trace(self, trace: P.Trace | None, variant: str, passed: bool) -> None:
        """Own kernels only: library routines called by the timed conv functions, and (GPU code) calls that computed
        a right answer without launching any kernel of the student's notebook or of given code."""
        if trace is None:
            return
        o = self.outcome
        for item in trace.library:
            if len(item) == 2:
                o.forbidden.append(f"{item[0]} (variant {variant!r}) calls {item[1]}")
        gpu = self.plan.variants[variant].target == "gpu"
        ran = ", ".join(f"{n} of {k}" for k, n in sorted(trace.launches.items())) or "no kernel at all"
        if passed and trace.without_own_launch and gpu:
            o.forbidden.append(f"{', '.join(trace.without_own_launch)} (variant {variant!r}) computed its output "
                               f"without launching a kernel of your notebook (launches: {ran})")
        elif passed and trace.given_only and gpu and self.plan.rubric["checks"]["own_kernel"]:
            o.forbidden.append(f"{', '.join(trace.given_only)} (variant {variant!r}) launched only given kernels "
                               f"(earlier stages' solutions, lk.from_stage), none of your notebook's (launches: "
                               f"{ran}): this stage grades a kernel of your own")

    def _accuracy(self, msg: P.AccuracyResult, payload: bytes) -> None:
        if msg.id not in self.acc_items:
            self.outcome.protocol_error = f"an accuracy result for an unknown run {msg.id!r}"
            return
        item = self.acc_items[msg.id]
        wl, ref_pred, ref_acc = self.refs.get(*item["key"])
        res = {"variant": item["variant"], "net": item["net"], "images": wl.images, "simulated": wl.simulated,
               "synthetic": wl.synthetic, "reference_accuracy": ref_acc, "accuracy": None, "mismatches": None,
               "passed": False, "message": ""}
        self.outcome.accuracy[msg.id] = res
        if msg.error:
            res["message"] = msg.error
            self._trace(msg.trace, item["variant"], False)
            return
        probs = read_array(payload, "probs")
        classes = len(wl.net.classes) or 10
        if probs is None or probs.ndim != 2 or probs.shape[0] != wl.images:
            shape = None if probs is None else probs.shape
            res["message"] = (f"the {wl.net.name} forward pass returned {shape} instead of ({wl.images}, {classes}) "
                              f"class probabilities")
            return
        if not np.all(np.isfinite(probs)):
            bad = int((~np.isfinite(probs)).any(axis=1).sum())
            res["message"] = (f"the {wl.net.name} forward pass gave NaN/inf probabilities for {bad} of {wl.images} "
                              f"images (a layer left outputs unwritten?)")
            return
        pred = reference.predict(probs)
        res["mismatches"] = int((pred != ref_pred).sum())
        if wl.labels is not None:
            res["accuracy"] = reference.accuracy(pred, wl.labels)
            res["passed"] = int((pred == wl.labels).sum()) == int((ref_pred == wl.labels).sum())
        else:
            res["passed"] = res["mismatches"] == 0
        self._trace(msg.trace, item["variant"], res["passed"])
        if not res["passed"]:
            acc = (f" (accuracy {100 * res['accuracy']:.2f} % vs the reference's {100 * ref_acc:.2f} %)"
                   if res["accuracy"] is not None else "")
            res["message"] = (f"variant {item['variant']!r}: predictions differ from the reference's on "
                              f"{res['mismatches']} of {wl.images} {wl.net.name} images{acc}")

    def _runs(self, runs: list) -> list | None:
        ok = runs and all("pass" in run and all(np.isfinite(t) and t >= 0 for t in run.values()) for run in runs)
        if not ok:
            self.outcome.protocol_error = "timing results without each pass's time"
            return None
        return runs

    def _predictions(self, payload: bytes, runs: list | None) -> list | None:
        """The class probabilities of each timed pass, if they all came back."""
        if not runs:
            return None
        images = self.refs.get(*self.plan.timing_run())[0].images
        self.outcome.timed_images = images
        probs = timed_probabilities(payload, len(runs), images)
        if probs is None:
            self.outcome.protocol_error = "timing results without each pass's class probabilities"
        return probs
