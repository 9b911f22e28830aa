"""One (student, stage) job in the parent: draw the inputs, run the child on them, judge every answer.

The parent keeps the expected answers and never sends them: the child gets inputs only, sends raw outputs back,
and every comparison happens here (``labkit.check.compare``), where the student's cells cannot reach.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import reference
from ..check import CheckResult, compare, layer_case, network_case
from ..nets import get_net
from . import hints, sandbox, scoring
from .plan import References, StagePlan
from .protocol import Answer, Kind, read_array
from .scoring import JobOutcome


#: how far a timed pass's class probability may be from the float64 reference's (float32 sums differ by ~1e-6)
PROBABILITY_TOL = 1e-3


class Job:
    """One (student, stage): build inputs, run the child, judge what comes back."""

    def __init__(self, plan: StagePlan, refs: References, student: str, notebook: Path, seed: int, gpu: bool):
        self.plan, self.refs, self.student, self.notebook = plan, refs, student, notebook
        self.seed, self.gpu = seed, gpu
        self.cases: dict[int, dict] = {}
        self.acc_items: dict[str, dict] = {}
        self.outcome = JobOutcome()
        self.lib = Path()
        self._outputs: dict = {}  # (variant, net, layer, batch) -> fingerprints of the outputs seen
        self._hinted = False
        self.env_extra: dict = {}  # e.g. CUDA_VISIBLE_DEVICES for a worker pinned to one GPU

    # ---- inputs
    def build(self, folder: Path) -> dict:
        """The job the child reads (JSON) and its inputs (``inputs.npz``); the answers stay here."""
        plan, r = self.plan, self.plan.rubric
        rng = np.random.default_rng(self.seed)
        arrays: dict[str, np.ndarray] = {}
        nets: dict[str, dict] = {}
        cases, workloads, accuracy = [], {}, []

        def put_weights(prefix: str, weights: dict) -> dict:
            names = {}
            for i, (k, v) in enumerate(weights.items()):
                arrays[f"{prefix}.w{i}"] = np.ascontiguousarray(v, dtype=np.float32)
                names[k] = f"{prefix}.w{i}"
            return names

        def put_case(case, vname: str, batch: int, what: str, net_name: str, net=None) -> None:
            cid = len(cases)
            arrays[f"c{cid}.x"] = case.x
            if net is not None:
                nets[net.name] = dataclasses.asdict(net)
            cases.append({"id": cid, "variant": vname, "batch": batch, "what": what, "net_name": net_name,
                          "layer": dataclasses.asdict(case.layer) if case.layer is not None else None,
                          "net": net.name if net is not None else None, "x": f"c{cid}.x",
                          "weights": put_weights(f"c{cid}", case.weights)})
            self.cases[cid] = {"variant": vname, "name": what, "batch": batch, "expected": case.expected,
                               "net_name": net_name, "layer": case.layer, "x": case.x, "weights": case.weights,
                               "target": plan.contract[vname]["target"]}

        def put_workload(net_name: str, images: int, target: str) -> str:
            wl, _, _ = self.refs.get(net_name, images, target)
            key = f"wl_{net_name}_{images}_{target}"
            if key not in workloads:
                nets[wl.net.name] = dataclasses.asdict(wl.net)
                arrays[f"{key}.x"] = np.ascontiguousarray(wl.x, dtype=np.float32)
                workloads[key] = {"net": wl.net.name, "x": f"{key}.x", "weights": put_weights(key, wl.weights)}
            return key

        for vname, spec in plan.contract.items():
            target = spec["target"]
            for net_name in spec["nets"]:
                for layer_name in spec["layers"][net_name]:
                    # every batch size, then the first one again on fresh inputs: a result kept from an earlier
                    # call (cached by shape) is wrong there
                    batches = plan.layer_batches(target)
                    for b in (*batches, batches[0]):
                        put_case(layer_case(net_name, layer_name, b, rng, target=target), vname, b, layer_name,
                                 net_name)
                for b in plan.network_batches(target):  # the layers chained by the engine, intermediates poisoned
                    case = network_case(net_name, b, rng, target=target)
                    put_case(case, vname, b, f"{get_net(net_name).name} forward", net_name, case.net)
        for vname, net_name, images, target in plan.accuracy_runs():
            aid = f"{vname}/{net_name}"
            accuracy.append({"id": aid, "variant": vname, "workload": put_workload(net_name, images, target)})
            self.acc_items[aid] = {"variant": vname, "net": net_name, "key": (net_name, images, target)}
        timing = None
        if plan.timing_run():
            timing = {"variant": plan.timed, "workload": put_workload(*plan.timing_run()),
                      "warmup": r["timing"]["warmup"], "repeat": r["timing"]["repeat"]}
        np.savez(folder / "inputs.npz", **arrays)
        self.outcome.cases = len(cases)
        self.outcome.case_variants = {cid: c["variant"] for cid, c in self.cases.items()}
        self.outcome.accuracy_runs = len(accuracy)
        return {"inputs": str(folder / "inputs.npz"), "stage": plan.stage.number, "nets": nets,
                "workloads": workloads, "cases": cases, "accuracy": accuracy, "timing": timing, "timed": plan.timed,
                "technique": plan.technique(),
                "contract": {n: {k: s.get(k, ()) for k in ("target", "arrays", "per_image", "nets", "fuse", "requires")}
                             for n, s in plan.contract.items()},
                "memory_mb": r["limits"]["memory_mb"],
                "memory_guard": sandbox.memory_guard(r["limits"]["memory_mb"], self.gpu),
                "max_file_mb": r["limits"]["max_file_mb"]}

    # ---- judging, message by message
    def _case(self, meta: dict, payload: bytes) -> None:
        cid = meta.get("id")
        if cid not in self.cases:
            self.outcome.protocol_error = f"a result for an unknown case {cid!r}"
            return
        c = self.cases[cid]
        if meta.get("skipped"):
            return
        got = None
        if meta.get("error"):
            res = CheckResult(c["name"], False, detail=str(meta["error"]), seed=self.seed)
        elif meta.get("race"):  # the values may be right on the simulator; on a GPU they would not be
            res = CheckResult(c["name"], False, detail=str(meta["race"]), seed=self.seed)
        else:
            got = read_array(payload, "out")
            if got is None:
                res = CheckResult(c["name"], False, detail="no output array came back", seed=self.seed)
            else:
                launches = meta.get("launches") if isinstance(meta.get("launches"), int) else None
                res = compare(c["name"], got, c["expected"], self.plan.rubric["checks"]["tol"], batch=c["batch"],
                              launches=launches)
                res.seed = self.seed
                res.batches = (c["batch"],)
        if not res.passed and got is not None and not self._hinted:
            self._hinted = True
            res.detail += hints.explain(c, got, res, self._outputs, self.plan.rubric["checks"]["tol"])
        if got is not None:
            self._outputs.setdefault((c["variant"], c["net_name"], c["name"], c["batch"]), []).append(
                hints.fingerprint(got))
        self._trace(meta.get("trace"), c["variant"], res.passed)
        self.outcome.checks[cid] = res

    def _trace(self, trace, variant: str, passed: bool) -> None:
        """Own kernels only: library routines called by the timed conv functions, and (GPU code) calls that computed
        a right answer without launching any kernel of the student's notebook or of given code."""
        if not isinstance(trace, dict):
            return
        o = self.outcome
        for item in trace.get("library") or []:
            if isinstance(item, list) and len(item) == 2:
                o.forbidden.append(f"{item[0]} (variant {variant!r}) calls {item[1]}")
        without = trace.get("without_own_launch") or []
        if passed and without and self.plan.contract[variant]["target"] == "gpu":
            kinds = trace.get("launches") or {}
            ran = ", ".join(f"{n} of {k}" for k, n in sorted(kinds.items())) or "no kernel at all"
            o.forbidden.append(f"{', '.join(map(str, without))} (variant {variant!r}) computed its output without "
                               f"launching a kernel of your notebook (launches: {ran})")

    def _accuracy(self, meta: dict, payload: bytes) -> None:
        aid = meta.get("id")
        if aid not in self.acc_items:
            self.outcome.protocol_error = f"an accuracy result for an unknown run {aid!r}"
            return
        item = self.acc_items[aid]
        wl, ref_pred, ref_acc = self.refs.get(*item["key"])
        res = {"variant": item["variant"], "net": item["net"], "images": wl.images, "simulated": wl.simulated,
               "synthetic": wl.synthetic, "reference_accuracy": ref_acc, "accuracy": None, "mismatches": None,
               "passed": False, "message": ""}
        self.outcome.accuracy[aid] = res
        if meta.get("error"):
            res["message"] = str(meta["error"])
            self._trace(meta.get("trace"), item["variant"], False)
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
        self._trace(meta.get("trace"), item["variant"], res["passed"])
        if not res["passed"]:
            acc = (f" (accuracy {100 * res['accuracy']:.2f} % vs the reference's {100 * ref_acc:.2f} %)"
                   if res["accuracy"] is not None else "")
            res["message"] = (f"variant {item['variant']!r}: predictions differ from the reference's on "
                              f"{res['mismatches']} of {wl.images} {wl.net.name} images{acc}")

    def _runs(self, meta: dict) -> list | None:
        runs = meta.get("runs")
        conv = self.plan.conv_layers()
        ok = isinstance(runs, list) and runs and all(
            isinstance(run, dict) and all(isinstance(run.get(n), (int, float)) and np.isfinite(run.get(n))
                                          and run.get(n) >= 0 for n in conv) for run in runs)
        if not ok:
            self.outcome.protocol_error = "timing results without the conv layers' times"
            return None
        return runs

    def _predictions(self, payload: bytes, runs: list | None) -> list | None:
        """The class probabilities of each timed pass (pass k on the images rotated by k), if they all came back."""
        if not runs:
            return None
        probs = [read_array(payload, f"prob{k}") for k in range(len(runs))]
        images = self.refs.get(*self.plan.timing_run())[0].images
        self.outcome.timed_images = images
        if any(p is None or p.ndim != 2 or p.shape[0] != images or not np.isfinite(p).all() for p in probs):
            self.outcome.protocol_error = "timing results without each pass's class probabilities"
            return None
        return probs

    def mismatches(self, probs: list) -> list[int]:
        """Per timed pass: images whose prediction differs from the float64 reference's on the same (rotated)
        images, or whose probabilities are off by more than PROBABILITY_TOL (a kept result with the same argmax)."""
        _, ref_pred, _ = self.refs.get(*self.plan.timing_run())
        ref = self.refs.probabilities(*self.plan.timing_run())
        out = []
        for k, p in enumerate(probs):
            r = np.roll(ref, -k, axis=0)
            off = (p.argmax(axis=1) != np.roll(ref_pred, -k)) if p.shape == r.shape else np.ones(len(p), bool)
            if p.shape == r.shape:
                off |= np.abs(p - r).max(axis=1) > PROBABILITY_TOL
            out.append(int(off.sum()))
        return out

    def handle(self, kind: Kind, meta: dict, payload: bytes, answer) -> bool:
        """Judge one frame; True once nothing more needs to be heard (done, or a broken protocol)."""
        o = self.outcome
        if kind is Kind.HELLO:
            o.device = str(meta.get("device", ""))
            if not Path(str(meta.get("labkit", ""))).resolve().is_relative_to(self.lib.resolve()):
                o.grader_error = (f"the grading process imported labkit from {meta.get('labkit')}, not from its "
                                  f"private copy in {self.lib}")
        elif kind in (Kind.PHASE, Kind.START):
            o.phase = str(meta.get("what", ""))[:200]
        elif kind is Kind.REFERENCE:
            o.reference_runs = self._runs(meta)
            preds = self._predictions(payload, o.reference_runs)
            o.reference_mismatches = self.mismatches(preds) if preds else None
        elif kind is Kind.LOAD_ERROR:
            o.load_error = str(meta.get("message", ""))[:2000]
            o.forbidden += [str(f) for f in meta.get("forbidden") or []]
        elif kind is Kind.LOADED:
            o.problems = {str(k): str(v) for k, v in (meta.get("problems") or {}).items()}
            o.forbidden += [str(f) for f in meta.get("forbidden") or []]
            answer(Answer.STOP if o.forbidden else Answer.CONTINUE)
            for name, declared in (meta.get("variants") or {}).items():
                spec = self.plan.contract.get(name, {})
                differ = [f"{k}={spec[k]!r} (your VARIANTS says {declared.get(k)!r})"
                          for k in ("target", "arrays", "per_image") if k in spec and declared.get(k) != spec[k]]
                if differ:
                    o.notes.append(f"variant {name!r} graded as the stage declares it: {', '.join(differ)}")
        elif kind is Kind.CASE:
            self._case(meta, payload)
            if not meta.get("skipped"):  # the child waits for the verdict: stop repeating a failing layer
                res = o.checks.get(meta.get("id"))
                answer(Answer.CONTINUE if res is not None and res.passed else Answer.STOP)
        elif kind is Kind.CHECKS_DONE:
            o.checks_done = True
            answer(Answer.CONTINUE if scoring.checks_passed(o) and not o.forbidden else Answer.STOP)
        elif kind is Kind.TECHNIQUE:
            o.technique = {"passed": bool(meta.get("passed")), "line": str(meta.get("line", ""))}
        elif kind is Kind.ACCURACY:
            self._accuracy(meta, payload)
        elif kind is Kind.ACCURACY_DONE:
            o.accuracy_done = True
            req = self.plan.rubric["op_time"]["requires_accuracy"]
            go = self.plan.measured and (scoring.accuracy_passed(o) or not req) and not o.forbidden
            answer(Answer.CONTINUE if go else Answer.STOP)
        elif kind is Kind.TIMING:
            if meta.get("error"):
                o.timing_error = str(meta["error"])
            else:
                o.timing_runs = self._runs(meta)
                preds = self._predictions(payload, o.timing_runs)
                o.timing_mismatches = self.mismatches(preds) if preds else None
        elif kind is Kind.TAMPERED:
            o.tampered_code = {"what": [str(w) for w in meta.get("what") or []][:20],
                               "count": int(meta.get("count") or 0), "when": str(meta.get("when", ""))[:300]}
        elif kind is Kind.GRADER_ERROR:
            o.grader_error = str(meta.get("message", ""))
        elif kind is Kind.DONE:
            o.done = True
        return o.done or o.protocol_error is not None

    # ---- running
    def run(self) -> JobOutcome:
        """Private copies in a fresh folder, the child under its limits, then the checksums; the folder goes."""
        o = self.outcome
        start = time.monotonic()
        folder = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
        try:
            (folder / "student").mkdir()
            (folder / "work").mkdir()
            student_nb = folder / "student" / self.notebook.name
            shutil.copyfile(self.notebook, student_nb)
            self.lib = folder / "lib"
            solutions = folder / "solutions"
            guarded = {str(p.relative_to(self.lib / "labkit")): p for p in sandbox.private_labkit(self.lib)}
            guarded.update({f"solutions/{p.name}": p for p in sandbox.private_solutions(self.plan.solution.parent,
                                                                                        solutions)})
            guard = sandbox.Guard(guarded)
            job = self.build(folder)
            job.update(student_notebook=str(student_nb), reference_notebook=str(solutions / self.plan.solution.name))
            env = sandbox.child_env({"NUMBA_CACHE_DIR": str(folder / "work" / "numba-cache"),
                                     "LABKIT_SOLUTIONS": str(solutions), **self.env_extra}, lib=self.lib)
            limits = self.plan.rubric["limits"]
            end = sandbox.run_child(job, folder, env, self.plan.time_limit, limits["memory_mb"],
                                    job["memory_guard"] == "rss", self.handle)
            o.timed_out, o.memory_exceeded, o.returncode, o.stderr_tail = \
                end.timed_out, end.memory_exceeded, end.returncode, end.stderr_tail
            o.protocol_error = o.protocol_error or end.protocol_error
            o.tampered = guard.changed()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        o.seconds = time.monotonic() - start
        return o

    def row(self) -> dict:
        return scoring.row(self.plan, self.student, self.notebook, self.seed, self.outcome)
