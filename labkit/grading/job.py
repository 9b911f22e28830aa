"""One (student, stage) job in the parent: draw the inputs, run the child on them, judge every answer.

The parent keeps the expected answers and never sends them: the child gets inputs only, sends raw outputs back,
and every comparison happens here (``labkit.check.compare``), where the student's cells cannot reach.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from ..core import graphs, whole
from ..core.cases import answer, kept_from_earlier, layer_case, network_case, weighted
from ..core.check import CheckResult, compare
from ..core.engine import NanCauses
from ..course import tasks
from ..ladder import tune
from ..launch import simulator
from ..launch.cudacpu import LABEL as CUDA_C_LABEL
from ..model import data, reference
from ..model.nets import get_net
from . import environment, hints, isolation, sandbox, scoring
from . import protocol as P
from .ahead import Ahead
from .phases import PhaseClock, rounded
from .plan import References, StagePlan
from .protocol import read_array
from .scoring import JobOutcome
from .turns import WHOLE, Running, Turns

#: how far a timed pass's class probability may be from the float64 reference's (float32 sums differ by ~1e-6)
PROBABILITY_TOL = 1e-3


class Inputs:
    """The arrays a child gets (one ``.npz``), the nets and workloads that name them: built in the parent."""

    def __init__(self, refs: References):
        self.refs = refs
        self.arrays: dict[str, np.ndarray] = {}
        self.nets: dict[str, dict] = {}
        self.workloads: dict[str, P.WorkloadSpec] = {}

    def weights(self, prefix: str, weights: dict) -> dict[str, str]:
        names = {}
        for i, (k, v) in enumerate(weights.items()):
            self.arrays[f"{prefix}.w{i}"] = np.ascontiguousarray(v, dtype=np.float32)
            names[k] = f"{prefix}.w{i}"
        return names

    def workload(self, net_name: str, images: int, target: str) -> str:
        """A real-image workload (shrunk for GPU code on the simulator), as the references have it."""
        wl, _, _ = self.refs.get(net_name, images, target)
        key = f"wl_{net_name}_{images}_{target}"
        if key not in self.workloads:
            self.nets[wl.net.name] = dataclasses.asdict(wl.net)
            self.arrays[f"{key}.x"] = np.ascontiguousarray(wl.x, dtype=np.float32)
            self.workloads[key] = P.WorkloadSpec(net=wl.net.name, x=f"{key}.x", weights=self.weights(key, wl.weights))
        return key

    def timing(self, plan: StagePlan, rng: np.random.Generator, folder: Path) \
            -> tuple[P.TimingSpec, list[np.ndarray], np.ndarray]:
        """The timed passes: each on the workload's images freshly perturbed (``fresh_passes``), so that no memo,
        of an earlier pass or of the accuracy run, holds its answer; those images, for the reference's answers on
        them; and the workload's images, for a later attempt's (written only when it is asked for)."""
        t = plan.rubric["timing"]
        key = self.workload(*plan.timing_run())
        x = self.arrays[self.workloads[key].x]
        images = fresh_passes(x, rng, t["repeat"])
        keys = [f"pass{k}.x" for k in range(len(images))]
        self.arrays.update(zip(keys, images))
        later = folder / "timing"  # a later attempt's images appear here (the child's sandbox binds it read-only)
        later.mkdir()
        return P.TimingSpec(variant=plan.timed, workload=key, warmup=t["warmup"], repeat=t["repeat"], passes=keys,
                            attempts=t.get("attempts", 1),
                            retry_inputs=str(later / "attempt{attempt}.npz")), images, x

    def save(self, folder: Path) -> str:
        np.savez(folder / "inputs.npz", **self.arrays)
        return str(folder / "inputs.npz")

    def task_calls(self, plan: StagePlan, rng: np.random.Generator, first_id: int) -> tuple[list, dict]:
        """The calls of the stage's tasks with checks of their own (``labkit.tasks``) and, for each, what the
        grader expects: the float64 reference's probabilities (graph) or classes (pipeline) on fresh inputs."""
        calls, expected = [], {}
        for task in tasks.own_phases(plan.stage.number):
            if plan.task_points(task.name) <= 0:
                continue
            for spec, want in _TASK_CALLS[task.check](task, rng):
                spec.id = first_id + len(calls)
                spec.weights = self.weights(f"t{spec.id}", want.pop("weights"))
                self.nets[want["net"].name] = dataclasses.asdict(want["net"])
                if "x" in want:
                    self.arrays[f"t{spec.id}.x"] = want.pop("x")
                    spec.x = f"t{spec.id}.x"
                calls.append(spec)
                expected[spec.id] = {**want, "task": task.name, "function": task.function, "check": task.check}
        return calls, expected


#: a later timing attempt waits this long for its turn (not counted against its limit): on the GPU machines a core's
#: speed changed between samples 50 ms apart, and stayed slow for longer (results/h100-2026-11-27c)
RETRY_AFTER_S = 1.0


def fresh_passes(x: np.ndarray, rng: np.random.Generator, repeat: int) -> list[np.ndarray]:
    """``repeat`` copies of the images ``x`` with noise of a tenth of their spread, new for every pass and every
    job (and every attempt)."""
    scale = 0.1 * float(x.std()) or 0.1
    return [(x + rng.normal(0.0, scale, x.shape)).astype(np.float32) for _ in range(repeat)]


def share_weights(case, pool: dict) -> None:
    """``case`` with copies of the weight values of an earlier case in ``pool`` whose arrays have the same names
    and shapes (its own arrays, the same numbers); else its own weights join the pool."""
    key = tuple((k, v.shape) for k, v in case.weights.items())
    if key in pool:
        case.weights = {k: v.copy() for k, v in pool[key].items()}
    else:
        pool[key] = case.weights


def _graph_calls(task: tasks.Task, rng: np.random.Generator):
    """A graph's calls as ``labkit.graphs.REPLAY_PLAN`` says (made, replayed again, made for other images, for the
    other given variant, for new images of the first shape), each on fresh random images and weights, each compared:
    a graph kept from an earlier call replays that call's inputs."""
    first = 3 if simulator.active() else 128
    sets = [network_case("cifar10", n, rng, answers=False) for n in (first, max(1, first // 2), first)]
    for k, (v, i, fresh) in enumerate(graphs.REPLAY_PLAN):
        case, variant = sets[i], task.given[v]
        spec = P.TaskCallSpec(id=0, task=task.name, check="graph", function=task.function, variant=variant,
                              net=case.net.name, weights={}, fresh_call=fresh)
        want = {"net": case.net, "answer": lambda case=case: answer(case).expected,
                "weights": case.weights if fresh else {}, "later": k > 0,
                "what": f"{len(case.x)} images, {variant}" + ("" if fresh else ", replayed again")}
        if fresh:
            want["x"] = case.x
        yield spec, want


def _pipeline_calls(task: tasks.Task, rng: np.random.Generator):
    """A pipeline's cases (``labkit.whole``'s: odd counts, a smaller last chunk, more streams than chunks): bytes
    drawn from a fresh seed, which the child draws again (``whole.run_pipeline``), and the float64 reference's
    class of every image."""
    net = simulator.net_for("cifar10", "gpu")
    weights = network_case("cifar10", 1, rng, answers=False).weights
    for images, chunk, count in (whole.CASES_SIMULATOR if simulator.active() else whole.CASES_GPU):
        seed = int(rng.integers(2 ** 31))
        raw = whole.case_bytes(net, images, np.random.default_rng(seed))
        spec = P.TaskCallSpec(id=0, task=task.name, check="pipeline", function=task.function, variant=task.given[0],
                              net=net.name, weights={}, images=images, seed=seed, chunk=chunk, streams=count)
        yield spec, {"net": net, "weights": weights,
                     "what": f"{images} images in chunks of {chunk} over {count} streams",
                     "answer": lambda raw=raw: np.asarray(reference.forward(net, weights, data.to_input(net, raw),
                                                                            accumulate="float64"))}


_TASK_CALLS = {"graph": _graph_calls, "pipeline": _pipeline_calls}


def _private_folder(plan: StagePlan) -> tuple[Path, Path, Path, sandbox.Guard]:
    """A fresh job folder with private copies of labkit and of the solutions (checksummed): (folder, lib,
    solutions, guard)."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    (folder / "student").mkdir()
    (folder / "work").mkdir()
    lib, solutions = folder / "lib", folder / "solutions"
    guarded = {str(p.relative_to(lib / "labkit")): p for p in sandbox.private_labkit(lib)}
    guarded.update({f"solutions/{p.name}": p for p in sandbox.private_solutions(plan.solution.parent, solutions,
                                                                                plan.stage.number)})  # earlier only
    return folder, lib, solutions, sandbox.Guard(guarded)


def _tuning_copy(folder: Path) -> str:
    """A copy of the tuning choices this grader reads (``results/tuning.json``), for the child to read the same:
    a tuned variant then runs the kernels the student's notebook picks, not a fallback ("" when there are none)."""
    if not tune.STORE.is_file():
        return ""
    shutil.copyfile(tune.STORE, folder / "tuning.json")
    return str(folder / "tuning.json")


def _child_env(folder: Path, lib: Path, solutions: Path, extra: dict) -> dict:
    return sandbox.child_env({"NUMBA_CACHE_DIR": str(folder / "work" / "numba-cache"),
                              "LABKIT_SOLUTIONS": str(solutions), **extra}, lib=lib)


def _last_kernel(folder: Path) -> str:
    """The kernel the child launched last on a GPU (the worker writes its name), for a hung job's row."""
    try:
        return (folder / "work" / P.LAST_LAUNCH).read_text(errors="replace").split("\n")[0].strip()[:120]
    except OSError:
        return ""


def _imported_from(lib: Path, msg: P.Hello) -> str | None:
    """A grader error unless the child imported labkit from its private copy."""
    if not Path(msg.labkit).resolve().is_relative_to(lib.resolve()):
        return f"the grading process imported labkit from {msg.labkit}, not from its private copy in {lib}"
    return None


def _not_as_the_grader(lib: Path, msg: P.Hello, iso: isolation.Isolation) -> str | None:
    """Why a child cannot grade as the grader does (labkit not its private copy, or another version of a library
    than the grader's), in one line; None when it can."""
    return _imported_from(lib, msg) or environment.mismatch(msg.versions, msg.origins, iso.advice)


#: how long a probe child may take to start and say what it imports (a container's first start can be slow)
PROBE_S = 300.0


def probe(iso: isolation.Isolation, memory_mb: int = 0, env_extra: dict | None = None,
          time_limit: float = PROBE_S) -> str | None:
    """Start one child in the run's sandbox as a job's is started (its private labkit, its view, its environment)
    that only says what it imports (``worker``: ``{"probe": true}``), before any job: why no job could be graded
    there (the sandbox does not start, or its Python imports other versions than the grader's), in one line; None
    when it can."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-probe-"))
    heard: list = []

    def on_frame(kind: P.Kind, meta: dict, payload: bytes, answer) -> bool:
        try:
            heard.append(P.decode(kind, meta))
        except P.ProtocolError as exc:
            heard.append(exc)
            return True
        return isinstance(heard[-1], (P.Done, P.GraderError))

    try:
        (folder / "work").mkdir()
        lib = folder / "lib"
        sandbox.private_labkit(lib)
        env = _child_env(folder, lib, folder / "solutions", env_extra or {})
        end = sandbox.run_child({"probe": True, "stage": "00"}, folder, env, time_limit, memory_mb, False, on_frame,
                                iso)
        hello = next((m for m in heard if isinstance(m, P.Hello)), None)
        if hello is not None:
            return _not_as_the_grader(lib, hello, iso)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    failed = next((m for m in heard if isinstance(m, (P.GraderError, P.ProtocolError))), None)
    tail = [line.strip() for line in end.stderr_tail.splitlines() if line.strip()][-2:]  # docker: its error, a hint
    said = (getattr(failed, "message", None) or str(failed) if failed is not None else
            " / ".join(tail) or f"exit status {end.returncode}")
    return (f"the {iso.mode} sandbox did not start a grading child"
            + (f" within {time_limit:.0f} s" if end.timed_out else "") + f": {' '.join(said.split())[:300]}")


@dataclasses.dataclass
class ReferenceTiming:
    """What the stage's solution did as a job of its own (``reference_job``): its timed passes (the op time's
    denominator) and how long the whole job took (the scale of the students' time limit)."""

    runs: list | None = None
    method: str = ""
    mismatches: list | None = None
    error: str | None = None
    device: str = ""
    seconds: float = 0.0
    phases_s: dict = dataclasses.field(default_factory=dict)  # where its wall time went (labkit.grading.phases)


def reference_job(plan: StagePlan, refs: References, gpu: bool, seed: int, env_extra: dict | None = None,
                  sandbox=None, turns: Turns | None = None) -> ReferenceTiming:
    """The stage's solution graded as a student is, in a child of its own that never holds student code (once per
    stage and device in a run): the same engine, clock and tracing time it, and the job's wall time, measured alone
    (the whole machine's turn: every other job stopped), scales the students' time limit. Where it scales nothing
    (``limits.time_factor = 0``) only its timed phase takes the device's turn, as a student's does, and the other
    jobs run beside the rest of it. A solution that does not pass is the grader's error."""
    job = GradingJob(plan, refs, "(reference solution)", plan.solution, seed, gpu)
    job.env_extra, job.sandbox, job.turns = dict(env_extra or {}), sandbox, turns
    job.alone = bool(plan.rubric["limits"]["time_factor"])
    job.time_limit = 2 * plan.time_limit  # the kit's own code: a busy machine must not make it the grader's error
    o = job.run()
    row = job.row()
    result = ReferenceTiming(runs=o.timing_runs, method=o.timing_method, mismatches=o.timing_mismatches,
                             device=o.device, seconds=o.seconds, phases_s=rounded(o.phases))
    # its timed passes' own mismatches (float32 near-ties) only widen the students' allowance: not a failure
    passed = row["status"] == "pass" or (o.checks_done and scoring.checks_passed(o) and scoring.accuracy_passed(o)
                                          and not o.forbidden and not o.tampered_code and not o.grader_error)
    if not passed or (plan.measured and not o.timing_runs):
        result.error = (f"the reference solution {plan.solution.name} does not pass its own grading "
                        f"({row['status']}): {row['message'][:400]}")
    return result


def timed_probabilities(payload: bytes, passes: int, images: int) -> list | None:
    """The class probabilities of each timed pass, if they all came back whole and finite."""
    probs = [read_array(payload, f"prob{k}") for k in range(passes)]
    if not passes or any(p is None or p.ndim != 2 or p.shape[0] != images or not np.isfinite(p).all() for p in probs):
        return None
    return probs


def expected_passes(refs: References, plan: StagePlan, images: list[np.ndarray]) -> list:
    """The float64 reference's class probabilities on each timed pass's images: one piece of work a pass (none
    where op time is not measured)."""
    if not images:
        return []
    wl = refs.get(*plan.timing_run())[0]
    return [lambda x=x: np.asarray(reference.forward(wl.net, wl.weights, x), np.float64) for x in images]


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


class GradingJob:
    """One (student, stage) graded, the parent's side: build inputs, run the child, judge what comes back (the
    child's side is ``worker.GradingChild``)."""

    def __init__(self, plan: StagePlan, refs: References, student: str, notebook: Path, seed: int, gpu: bool):
        self.plan, self.refs, self.student, self.notebook = plan, refs, student, notebook
        self.seed, self.gpu = seed, gpu
        self.cases: dict[int, dict] = {}
        self.acc_items: dict[str, dict] = {}
        self.outcome = JobOutcome()
        self.lib = Path()
        self._outputs: dict = {}  # (variant, net, layer, batch) -> fingerprints of the outputs seen
        self._hinted = False
        self.time_limit = plan.time_limit  # the rubric's, or the one that follows from the reference's job
        self._pass_images: list = []  # each timed pass's images (fresh): the reference's answers are computed here
        self._answers: dict = {}  # ("case" | "task" | "pass", id) -> the float64 reference's answer, to compute
        self._ahead: Ahead | None = None  # ... computed while the child runs (labkit.grading.ahead)
        self._attempt, self._retry = 0, None  # the timing's attempt now, and a later attempt's answers (Ahead)
        self._turn_at = self._started = time.monotonic()
        self._retry_at = 0.0  # a later attempt's turn is not taken before then (RETRY_AFTER_S)
        self.env_extra: dict = {}  # e.g. CUDA_VISIBLE_DEVICES for a worker pinned to one GPU
        self.sandbox = None  # the run's labkit.grading.isolation (run.grade_task sets it; None: the best here)
        self.turns: Turns | None = None  # the run's turns (labkit.grading.turns): None, no other job to stop
        self.alone = False  # a reference job: the whole machine's turn for its whole run
        self.running: Running | None = None
        self._task_expected: dict[int, dict] = {}  # task call id -> what the grader expects of it
        self.clock = PhaseClock(lambda: self.running.paused_s() if self.running is not None else 0.0)
        self._counting: tuple | None = None  # on a GPU: the technique's simulator child, started beside this one

    # ---- inputs
    def build(self, folder: Path) -> P.JobSpec:
        """The job the child reads and its inputs (``inputs.npz``); the answers stay here."""
        plan, r = self.plan, self.plan.rubric
        rng = np.random.default_rng(self.seed)
        inputs = Inputs(self.refs)
        cases = self._cases(inputs, rng)
        accuracy: list[P.AccuracySpec] = []
        for vname, net_name, images, target in plan.accuracy_runs():
            aid = f"{vname}/{net_name}"
            accuracy.append(P.AccuracySpec(id=aid, variant=vname, workload=inputs.workload(net_name, images, target)))
            self.acc_items[aid] = {"variant": vname, "net": net_name, "key": (net_name, images, target)}
        self._rng = rng
        timing, self._pass_images, self._timed_x = inputs.timing(plan, rng, folder) if plan.timing_run() \
            else (None, [], None)
        self._retry_inputs = timing.retry_inputs if timing is not None else ""
        task_calls, self._task_expected = inputs.task_calls(plan, rng, 0)
        # the answers, in the order the child asks for them: computed while it runs, never beside another job's turn
        self._answers.update({("task", tid): want.pop("answer") for tid, want in self._task_expected.items()})
        self._answers.update({("pass", k): piece
                              for k, piece in enumerate(expected_passes(self.refs, plan, self._pass_images))})
        self._ahead = Ahead(self._answers, self.turns, self.running)
        self.outcome.task_calls = {}
        for want in self._task_expected.values():
            self.outcome.task_calls[want["task"]] = self.outcome.task_calls.get(want["task"], 0) + 1
        self.outcome.cases = len(cases)
        self.outcome.case_variants = {cid: c["variant"] for cid, c in self.cases.items()}
        self.outcome.accuracy_runs = len(accuracy)
        tech = plan.technique()
        return P.JobSpec(stage=plan.stage.number, notebook="", inputs=inputs.save(folder),
                         variants=dict(plan.variants), nets=inputs.nets, workloads=inputs.workloads, timed=plan.timed,
                         cases=cases, accuracy=accuracy, timing=timing, tasks=task_calls,
                         technique=P.TechniqueSpec(**tech) if tech else None,
                         own_layers=list(r["checks"].get("own_layers", ["conv"])), memory_mb=r["limits"]["memory_mb"],
                         memory_guard=sandbox.memory_guard(r["limits"]["memory_mb"], self.gpu),
                         max_file_mb=r["limits"]["max_file_mb"])

    def _cases(self, inputs: Inputs, rng) -> list[P.CaseSpec]:
        """Every check's case, its inputs put into ``inputs`` and its float64 answer left to compute ahead."""
        plan = self.plan
        cases: list[P.CaseSpec] = []

        def put_case(case, vname: str, batch: int, what: str, net_name: str, net=None,
                     lands_on: int | None = None) -> None:
            cid = len(cases)
            inputs.arrays[f"c{cid}.x"] = case.x
            if net is not None:
                inputs.nets[net.name] = dataclasses.asdict(net)
            cases.append(P.CaseSpec(id=cid, variant=vname, batch=batch, what=what, net_name=net_name, x=f"c{cid}.x",
                                    weights=inputs.weights(f"c{cid}", case.weights),
                                    layer=dataclasses.asdict(case.layer) if case.layer is not None else None,
                                    net=net.name if net is not None else None, lands_on=lands_on))
            self._answers[("case", cid)] = lambda: answer(case)  # the float64 reference's, computed ahead
            self.cases[cid] = {"variant": vname, "name": what, "batch": batch, "expected": None, "scale": None,
                               "net_name": net_name, "layer": case.layer, "x": case.x, "weights": case.weights,
                               "target": plan.variants[vname].target, "net": net,
                               "fuse": tuple(plan.variants[vname].fuse),  # net, fuse: hints' fused epilogue
                               "lands_on": lands_on}

        for vname, spec in plan.variants.items():
            for net_name in spec.nets:
                # layer by layer: the stage's own layers (given code is the kit's, tested there; a student's own
                # version of a given layer is still checked in the whole network, every intermediate poisoned)
                own = spec.layers[net_name] if spec.own is None else spec.own.get(net_name, [])
                for layer_name in own:
                    # every batch size, then the first one again on fresh inputs: a result kept from an earlier
                    # call (cached by shape) is wrong there; for a layer with weights, its arrays are put where the
                    # first call's, freed just before, were (labkit.freed): a kernel or result kept by id() of a
                    # freed array answers with the first call's
                    # the batch sizes share weight values where their shapes agree (a GPU's real sizes): a
                    # constant-memory kernel compiles once per weights, about a second each on an H100, and
                    # stage 06 spent 60 s a job compiling
                    batches = plan.layer_batches(spec.target)
                    first = len(cases)
                    again = first if weighted(get_net(net_name).layer(layer_name)) else None
                    pool: dict = {}
                    for k, b in enumerate((*batches, batches[0])):
                        case = layer_case(net_name, layer_name, b, rng, target=spec.target, answers=False)
                        if k < len(batches):
                            share_weights(case, pool)
                        put_case(case, vname, b, layer_name, net_name, lands_on=again if k == len(batches) else None)
                before = None  # each batch's weights put where the batch before's, freed, were
                for b in plan.network_batches(spec.target):  # the layers chained by the engine, intermediates poisoned
                    case = network_case(net_name, b, rng, target=spec.target, answers=False)
                    put_case(case, vname, b, f"{get_net(net_name).name} forward", net_name, case.net, lands_on=before)
                    before = len(cases) - 1
        return cases

    # ---- judging, message by message
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

    # ---- one handler per message (HANDLERS below): each judges its message and answers where the child waits
    def _phase(self, phase: str) -> None:
        """The job's ``phase`` begins now, on the parent's clock (a job a test made without one has none)."""
        clock = getattr(self, "clock", None)
        if clock is not None:
            clock.switch(phase)

    def _on_hello(self, msg: P.Hello, payload, answer) -> None:
        self._phase("load")  # started: its interpreter, imports, snapshot and inputs are behind it
        self.outcome.device = msg.device
        iso = self.running.sandbox if self.running is not None else isolation.Isolation()
        refused = _not_as_the_grader(self.lib, msg, iso)
        self.outcome.grader_error = f"not graded: {refused}" if refused else self.outcome.grader_error

    def _on_phase(self, msg: P.Phase | P.Start, payload, answer) -> None:
        self.outcome.phase = msg.what[:200]
        if isinstance(msg, P.Phase) and msg.step in scoring.PHASES:  # the child's own phases only
            self._phase(msg.step)

    def _on_load_error(self, msg: P.LoadError, payload, answer) -> None:
        self.outcome.load_error = msg.message[:2000]
        self.outcome.forbidden += msg.forbidden

    def _on_loaded(self, msg: P.Loaded, payload, answer) -> None:
        o = self.outcome
        o.finished.add("load")
        o.problems = dict(msg.problems)
        o.forbidden += msg.forbidden
        answer(P.Answer.STOP if o.forbidden else P.Answer.CONTINUE)
        for name, declared in msg.variants.items():
            spec = self.plan.variants.get(name)
            differ = spec.differences(declared) if spec is not None else []
            if differ:
                o.notes.append(f"variant {name!r} graded as the stage declares it: {', '.join(differ)}")

    def _on_case(self, msg: P.CaseResult, payload, answer) -> None:
        self._case(msg, payload)
        if not msg.skipped:  # the child waits for the verdict: stop repeating a failing layer
            res = self.outcome.checks.get(msg.id)
            answer(P.Answer.CONTINUE if res is not None and res.passed else P.Answer.STOP)

    def _on_checks_done(self, msg: P.ChecksDone, payload, answer) -> None:
        o = self.outcome
        o.checks_done = True
        o.finished.add("checks")
        if msg.emulated:
            o.notes.append(f"its CUDA C ran on the {CUDA_C_LABEL} (labkit.cudacpu): the checks a GPU runs, no timing")
        go = scoring.checks_passed(o) and not o.forbidden
        if not go:
            self._no_timing()
        elif self.gpu and not self.alone and self.plan.technique() and self._counting is None:
            self._start_counting()  # (once: a second ChecksDone frame starts nothing)
        answer(P.Answer.CONTINUE if go else P.Answer.STOP)

    def _on_task(self, msg: P.TaskResult, payload, answer) -> None:
        want = self._task_expected.get(msg.id)
        if want is None:
            self.outcome.protocol_error = f"a task result for an unknown call {msg.id!r}"
            return
        rec = self.outcome.tasks.setdefault(want["task"], {"passed": True, "line": "", "calls": 0})
        if msg.skipped:
            if self._ahead is not None:
                self._ahead.skip(("task", msg.id))
            return
        if "probs" not in want:  # its answer, computed ahead
            want["probs"] = self._ahead.get(("task", msg.id))
        rec["calls"] += 1
        why = msg.error or task_mismatch(want, read_array(payload, "out"))
        if why and rec["passed"]:
            rec.update(passed=False, line=f"{want['function']}: FAIL ({want['what']}: {why})")
        answer(P.Answer.STOP if why else P.Answer.CONTINUE)

    def _on_turn(self, msg: P.Turn, payload, answer) -> None:
        """The timed phase waits for its turn: every other job stopped (``labkit.grading.turns``), and the parent's
        answers for the attempt's passes computed (nothing of the parent's runs beside its timing)."""
        for k in range(len(self._pass_images)):
            self._pass_answer(k)
        pause = self._retry_at - time.monotonic()
        if pause > 0:  # a later attempt: the core's slow spell given time to pass
            with self.running.waiting() if self.running is not None else nullcontext():
                time.sleep(pause)
        if self.turns is not None and self.running is not None:
            self.turns.acquire(self.running, WHOLE if self.alone else self.device)
        self._turn_at = time.monotonic()
        answer(P.Answer.CONTINUE)

    def _pass_answer(self, k: int):
        """The float64 reference's answer for pass ``k`` of the current attempt."""
        return (self._ahead if self._attempt == 0 else self._retry).get(("pass", k))

    def _no_timing(self) -> None:
        """The job will not be timed: the parent's answers for its passes are not needed."""
        for k in range(len(self._pass_images)) if self._ahead is not None else ():
            self._ahead.skip(("pass", k))

    def _again(self, speed: float | None, fastest: float | None) -> bool:
        """Time another attempt, later, on fresh images: this one's core ran slower than ``timing.slow_core`` above
        the fastest probe the run saw on this device, an attempt is left, and the job's limit leaves room for two
        more like it."""
        t = self.plan.rubric["timing"]
        if speed is None or self._attempt + 1 >= t.get("attempts", 1) or speed <= (1 + t.get("slow_core", 0.15)) \
                * fastest:
            return False
        used = time.monotonic() - self._started - (self.running.paused_s() if self.running is not None else 0.0)
        return used + 2 * (time.monotonic() - self._turn_at) < self.time_limit

    def _next_attempt(self) -> None:
        """The next attempt's images, fresh, written where the child reads them only now, and the reference's
        answers on them computed while it waits for its turn."""
        self._attempt += 1
        self._retry_at = time.monotonic() + RETRY_AFTER_S
        self._pass_images = fresh_passes(self._timed_x, self._rng, len(self._pass_images))
        np.savez(self._retry_inputs.format(attempt=self._attempt),
                 **{f"pass{k}.x": x for k, x in enumerate(self._pass_images)})
        self._retry = Ahead({("pass", k): piece for k, piece in
                             enumerate(expected_passes(self.refs, self.plan, self._pass_images))},
                            self.turns, self.running)

    def _release_turn(self) -> None:
        if self.turns is not None and self.running is not None and not self.alone:
            self.turns.release(self.running)

    def _on_technique(self, msg: P.Technique, payload, answer) -> None:
        self.outcome.technique = {"passed": msg.passed, "line": msg.line}
        self.outcome.finished.add("technique")

    def _on_accuracy(self, msg: P.AccuracyResult, payload, answer) -> None:
        self._accuracy(msg, payload)

    def _on_accuracy_done(self, msg, payload, answer) -> None:
        o = self.outcome
        o.accuracy_done = True
        o.finished.update(("tasks", "accuracy"))
        req = self.plan.rubric["op_time"]["requires_accuracy"]
        go = self.plan.measured and (scoring.accuracy_passed(o) or not req)
        if not go:
            o.finished.add("timing")  # nothing to time
            self._no_timing()
        answer(P.Answer.STOP if o.forbidden else P.Answer.CONTINUE if go else P.Answer.SKIP)

    def _on_timing(self, msg: P.Timing, payload, answer) -> None:
        """One attempt's passes: kept beside the earlier attempts' (op time is the best pass of them all), and
        answered with another attempt when its core ran slow (``_again``), else with enough."""
        self._release_turn()
        o = self.outcome
        if msg.error or msg.attempt != self._attempt:
            o.finished.add("timing")
            o.timing_error = msg.error or None
            if not msg.error:
                o.protocol_error = f"timing results of attempt {msg.attempt} where {self._attempt} was asked for"
            answer(P.Answer.SKIP)
            return
        runs = self._runs(msg.runs)
        speed = P.probe_speed_us(msg.probe)
        fastest = self.turns.fastest(self.device, speed) if self.turns is not None and speed else speed
        o.timing_attempts.append({"attempt": msg.attempt, "speed_us": speed, "fastest_us": fastest,
                                  "quiet_s": round(msg.quiet_s, 3), "probe": msg.probe})
        preds = self._predictions(payload, runs)
        expected = [self._pass_answer(k) for k in range(len(self._pass_images))] if preds else []
        again = runs is not None and self._again(speed, fastest)
        if again:
            self._next_attempt()
        else:
            o.finished.add("timing")
        answer(P.Answer.CONTINUE if again else P.Answer.SKIP)
        o.timing_method, o.quiet_s = msg.method, o.quiet_s + msg.quiet_s
        o.timing_runs = (o.timing_runs or []) + runs if runs is not None else None
        o.timing_mismatches = (o.timing_mismatches or []) + mismatches(expected, preds) if preds else None
        self._trace(msg.trace, self.plan.timed, True)  # a library call made only in the timed passes

    def _on_tampered(self, msg: P.Tampered, payload, answer) -> None:
        self.outcome.tampered_code = {"what": msg.what[:20], "count": msg.count, "when": msg.when[:300]}

    def _on_grader_error(self, msg: P.GraderError, payload, answer) -> None:
        self.outcome.grader_error = msg.message
        self.outcome.resource_error = msg.resource

    def _on_done(self, msg, payload, answer) -> None:
        self.outcome.done = True
        self._phase("end")

    HANDLERS = {P.Hello: _on_hello, P.Phase: _on_phase, P.Start: _on_phase,
                P.LoadError: _on_load_error, P.Loaded: _on_loaded, P.CaseResult: _on_case,
                P.ChecksDone: _on_checks_done, P.Technique: _on_technique, P.AccuracyResult: _on_accuracy,
                P.AccuracyDone: _on_accuracy_done, P.TaskResult: _on_task, P.Turn: _on_turn,
                P.Timing: _on_timing, P.Tampered: _on_tampered,
                P.GraderError: _on_grader_error, P.Done: _on_done}

    def handle(self, kind: P.Kind, meta: dict, payload: bytes, answer) -> bool:
        """Judge one frame; True once nothing more needs to be heard (done, or a broken protocol)."""
        try:
            message = P.decode(kind, meta)
        except P.ProtocolError as exc:
            self.outcome.protocol_error = f"a malformed {kind.value!r} message on the result channel ({exc})"[:300]
            return True
        self.HANDLERS[type(message)](self, message, payload, answer)
        if isinstance(message, P.Hello) and self.outcome.grader_error:  # a child that cannot grade as the grader
            return True
        return self.outcome.done or self.outcome.protocol_error is not None

    # ---- running
    def use_reference(self, ref: ReferenceTiming | None, time_limit: float | None = None) -> None:
        """The reference solution's job (``reference_job``): its timing, this job's op time is compared with,
        and the time limit that follows from its duration."""
        o = self.outcome
        if time_limit:
            self.time_limit = time_limit
        if ref is None:
            return
        if ref.error:
            o.grader_error = ref.error
        else:
            o.reference_runs, o.reference_mismatches, o.reference_method = ref.runs, ref.mismatches, ref.method

    def run(self) -> JobOutcome:
        """Private copies in a fresh folder, the child under its limits, then the checksums; the folder goes."""
        o = self.outcome
        if o.grader_error:  # the reference could not be timed: the grader's problem, said in this job's row
            return o
        start = self._started = time.monotonic()
        self.clock.switch("start")
        folder, self.lib, solutions, guard = _private_folder(self.plan)
        iso = self.sandbox if self.sandbox is not None else isolation.choose()
        self.running = Running(iso, self.device)
        self.running.kept_core = self.gpu and self.plan.variants[self.plan.timed].target == "gpu"
        try:
            student_nb = folder / "student" / self.notebook.name
            shutil.copyfile(self.notebook, student_nb)
            self.clock.switch("inputs")
            job = self.build(folder)
            job.notebook, job.tuning = str(student_nb), _tuning_copy(folder)
            self.clock.switch("start")
            limits = self.plan.rubric["limits"]
            with self.turns.hold(self.running) if self.alone and self.turns is not None else nullcontext():
                end = sandbox.run_child(job.to_json(), folder,
                                        _child_env(folder, self.lib, solutions, self.env_extra), self.time_limit,
                                        limits["memory_mb"], job.memory_guard == "rss", self.handle, iso,
                                        self.running, self.turns)
            if self.clock.current != "end":  # no last frame (ended at its limit, crashed): its phase ends here
                self.clock.switch("end")
            o.time_limit = self.time_limit
            o.timed_out, o.memory_exceeded, o.returncode, o.stderr_tail, o.survivors = \
                end.timed_out, end.memory_exceeded, end.returncode, end.stderr_tail, end.survivors
            o.protocol_error = o.protocol_error or end.protocol_error
            o.tampered = guard.changed()
            o.last_kernel = _last_kernel(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            o.phases = self.clock.stop()
            for ahead in (self._ahead, self._retry):  # (a job that ended early: nothing more is needed)
                if ahead is not None:
                    ahead.cancel()
        if not self.plan.technique():
            o.finished.add("technique")
        if self.gpu and o.technique is not None:
            self._technique_counted()
        elif self._counting is not None:  # started, and not needed: waited for all the same (no child outlives its
            try:                          # job's row); what it found or raised is not used, as before
                self._counted()
            except Exception:  # noqa: BLE001
                pass
        o.paused_s += self.running.paused_s()  # (the technique's second child adds its own)
        o.seconds = time.monotonic() - start - o.paused_s
        return o

    @property
    def device(self) -> str:
        """What a timing here shares: the GPU the job is pinned to, or this machine's processors."""
        if not self.gpu:
            return "cpu"
        return f"gpu{self.env_extra.get('CUDA_VISIBLE_DEVICES', '')}"

    def _counting_job(self) -> "TechniqueJob":
        counted = TechniqueJob(self.plan, self.refs, self.student, self.notebook, self.seed, gpu=False)
        counted.env_extra, counted.sandbox, counted.time_limit, counted.turns = \
            {**self.env_extra, "NUMBA_ENABLE_CUDASIM": "1"}, self.sandbox, self.time_limit, self.turns
        return counted

    def _start_counting(self) -> None:
        """A student's GPU job whose checks pass starts the technique's simulator child now, beside its own child's
        accuracy and timing, instead of after them: a child of the same run as any other, so it is stopped while a
        timing holds its turn (this job's own included). Its line is used only as before: once this job's child
        reached its technique phase. (A reference job counts after its child: its wall time is its work alone.)"""
        counted, box = self._counting_job(), {}

        def count() -> None:
            try:
                box["outcome"] = counted.run()
            except BaseException as exc:  # noqa: BLE001 - the grader's error, raised where the job waits for it
                box["error"] = exc

        thread = threading.Thread(target=count, daemon=True, name="labkit-grade-technique")
        self._counting = (counted, thread, box)
        thread.start()

    def _counted(self) -> JobOutcome:
        """The technique child's outcome: the one started beside this job (waited for; the wait is this job's
        technique phase, the part of it that child spent stopped is waiting), or one run now."""
        if self._counting is None:
            c = self._counting_job().run()
            self.outcome.paused_s += c.paused_s
            self.clock.add(c.phases, "technique")  # the second child exists for the technique only
            return c
        counted, thread, box = self._counting

        def paused() -> float:
            return counted.running.paused_s() if counted.running is not None else 0.0

        t0, p0 = time.monotonic(), paused()
        thread.join()
        waited, stopped = time.monotonic() - t0, max(0.0, paused() - p0)
        self.outcome.paused_s += stopped
        self.clock.add({"technique": waited - stopped, "waiting": stopped}, "technique")
        if "error" in box:
            raise box["error"]
        self.outcome.technique_child = rounded(box["outcome"].phases)  # its own phases, beside this job's
        return box["outcome"]

    def _technique_counted(self) -> None:
        """On a GPU the conv's loads cannot be counted, and "its kernels have shared memory" earns the points for a
        token use: the technique is measured again, as on a CPU machine, by a second child of the same job under
        the CUDA simulator (its load fractions against the stage's budget); that line replaces the GPU's."""
        c = self._counted()
        o = self.outcome
        t = c.technique or {"passed": False, "line": f"{self.plan.technique()['layer']} uses "
                                                     f"{self.plan.technique()['memory']} memory: not counted on the "
                                                     f"simulator ({TechniqueJob.failure(c)})"}
        o.technique = {**t, "gpu": o.technique.get("line", "")}
        o.tampered = o.tampered or c.tampered
        if c.tampered_code and not o.tampered_code:
            o.tampered_code = c.tampered_code
        o.forbidden += [f for f in c.forbidden if f not in o.forbidden]

    def row(self) -> dict:
        return scoring.row(self.plan, self.student, self.notebook, self.seed, self.outcome)


class TechniqueJob(GradingJob):
    """A job's technique part alone, in a child under the CUDA simulator (``GradingJob._technique_counted``): the
    submission loaded as in any job, no checks, then the technique's load fractions."""

    def build(self, folder: Path) -> P.JobSpec:
        r, tech = self.plan.rubric, self.plan.technique()
        return P.JobSpec(stage=self.plan.stage.number, notebook="", inputs=Inputs(self.refs).save(folder),
                         variants=dict(self.plan.variants), nets={}, workloads={}, timed=self.plan.timed, cases=[],
                         accuracy=[], timing=None, technique=P.TechniqueSpec(**tech),
                         own_layers=list(r["checks"].get("own_layers", ["conv"])),
                         memory_mb=r["limits"]["memory_mb"], memory_guard=sandbox.memory_guard(r["limits"]["memory_mb"],
                                                                                              False),
                         max_file_mb=r["limits"]["max_file_mb"])

    def _on_checks_done(self, msg, payload, answer) -> None:
        self.outcome.checks_done = True
        answer(P.Answer.STOP if self.outcome.forbidden else P.Answer.CONTINUE)

    def _on_accuracy_done(self, msg, payload, answer) -> None:
        answer(P.Answer.SKIP)  # no timing: the technique's count, which comes after it

    HANDLERS = {**GradingJob.HANDLERS, P.ChecksDone: _on_checks_done, P.AccuracyDone: _on_accuracy_done}

    @staticmethod
    def failure(o: JobOutcome) -> str:
        """Why the simulator child gave no technique line, in a few words."""
        if o.timed_out:
            return "it ran out of time"
        if o.memory_exceeded:
            return "it ran out of memory"
        if o.load_error:
            return f"the notebook did not load there: {o.load_error.splitlines()[0][:200]}"
        return o.protocol_error or o.grader_error or (o.stderr_tail or "").strip()[-200:] or "no result came back"
