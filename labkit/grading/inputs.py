"""What a job's child is given, drawn in the parent: the arrays of its one ``inputs.npz`` and the specs that name
them (``Inputs``), every check's case, the calls of the stage's tasks, and fresh images for each timed pass.

The answers never go with them: each case's, task call's and timed pass's float64 answer stays in the parent, left
to compute while the child runs (``labkit.grading.ahead``), and is judged there (``labkit.grading.verdicts``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..core import graphs, whole
from ..core.cases import answer, layer_case, network_case, weighted
from ..course import tasks
from ..launch import simulator
from ..model import data, reference
from ..model.nets import get_net
from . import protocol as P
from . import sandbox
from .ahead import Ahead
from .plan import References, StagePlan
from .verdicts import expected_passes


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
        passes = folder / "timing"  # each pass's images appear here when it asks (the sandbox binds it read-only)
        passes.mkdir()
        return P.TimingSpec(variant=plan.timed, workload=key, warmup=t["warmup"], repeat=t["repeat"],
                            attempts=t.get("attempts", 1),
                            pass_inputs=str(passes / "attempt{attempt}_pass{k}.npy")), images, x

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


def spec_limits(plan: StagePlan, gpu: bool) -> dict:
    """What every child's ``JobSpec`` takes from the rubric whatever its job (a student's, a technique count, a
    reference partner): the layer kinds that are its own work and its limits."""
    r = plan.rubric
    return {"own_layers": list(r["checks"].get("own_layers", ["conv"])), "memory_mb": r["limits"]["memory_mb"],
            "memory_guard": sandbox.memory_guard(r["limits"]["memory_mb"], gpu),
            "max_file_mb": r["limits"]["max_file_mb"]}


def passes_seed(run_seed: int) -> int:
    """The seed a run's timed passes are drawn from (``fresh_passes``): the same images for every job of the run,
    new ones for every run. A job's child sees only its own passes, and no job can leave anything for another (the
    sandbox), so no memo can hold their answers; a later attempt draws its own from the job's seed."""
    return int(np.random.SeedSequence(int(run_seed), spawn_key=(2 ** 32 - 1,)).generate_state(1, dtype=np.uint32)[0])


def fresh_passes(x: np.ndarray, rng: np.random.Generator, repeat: int) -> list[np.ndarray]:
    """``repeat`` copies of the images ``x`` with noise of a tenth of their spread, new for every pass and every
    run (and every later attempt): drawn from the run's ``passes_seed``, or else from the job's."""
    scale = 0.1 * float(x.std()) or 0.1
    return [(x + rng.normal(0.0, scale, x.shape)).astype(np.float32) for _ in range(repeat)]


def share_weights(case, pool: dict, network: dict | None = None) -> None:
    """``case`` with copies of the weight values of an earlier case in ``pool`` whose arrays have the same names
    and shapes, or else of ``network``'s arrays of those names where their shapes agree (its own arrays, the same
    numbers); else its own weights join the pool."""
    key = tuple((k, v.shape) for k, v in case.weights.items())
    if key not in pool and network and all(k in network and network[k].shape == shape for k, shape in key):
        pool[key] = {k: network[k] for k, _ in key}
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


class JobInputs:
    """``GradingJob``'s inputs: the job its child reads and every case drawn, each answer left to compute ahead (its
    state is the job's, made in ``GradingJob.__init__``)."""

    def build(self, folder: Path) -> P.JobSpec:
        """The job the child reads and its inputs (``inputs.npz``); the answers stay here."""
        plan = self.plan
        rng = np.random.default_rng(self.seed)
        inputs = Inputs(self.refs)
        cases = self._cases(inputs, rng)
        accuracy: list[P.AccuracySpec] = []
        for vname, net_name, images, target in plan.accuracy_runs():
            aid = f"{vname}/{net_name}"
            accuracy.append(P.AccuracySpec(id=aid, variant=vname, workload=inputs.workload(net_name, images, target)))
            self.acc_items[aid] = {"variant": vname, "net": net_name, "key": (net_name, images, target)}
        self._rng = rng
        # the timed passes' images: from the run's seed for them where there is one (every job of the run times
        # the same images, and the reference's answers on them are computed once for all: ``expected_passes``)
        passes = rng if self.passes_seed is None else np.random.default_rng(self.passes_seed)
        timing, self._pass_images, self._timed_x = inputs.timing(plan, passes, folder) if plan.timing_run() \
            else (None, [], None)
        self._pass_inputs = timing.pass_inputs if timing is not None else ""
        task_calls, self._task_expected = inputs.task_calls(plan, rng, 0)
        # the answers, in the order the child asks for them: computed while it runs, never beside another job's turn
        self._answers.update({("task", tid): want.pop("answer") for tid, want in self._task_expected.items()})
        self._answers.update({("pass", k): piece
                              for k, piece in enumerate(expected_passes(self.refs, plan, self._pass_images,
                                                                         self.passes_seed))})
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
                         **spec_limits(plan, self.gpu))

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
                # the whole network's cases are drawn first: each layer's real-size cases take their weight values
                # from its first, the check's last call from its second (new values for the arrays put where the
                # first's were), so a constant-memory kernel made for those weights serves the network's check too
                # (a compile less per layer and network case: stage 06 compiled about 80 kernels a job)
                networks = [network_case(net_name, b, rng, target=spec.target, answers=False)
                            for b in plan.network_batches(spec.target)]
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
                            share_weights(case, pool, networks[0].weights)
                        elif len(networks) > 1:
                            share_weights(case, {}, networks[1].weights)
                        put_case(case, vname, b, layer_name, net_name, lands_on=again if k == len(batches) else None)
                before = None  # each batch's weights put where the batch before's, freed, were
                for b, case in zip(plan.network_batches(spec.target), networks):  # the layers chained by the engine,
                    # intermediates poisoned
                    put_case(case, vname, b, f"{get_net(net_name).name} forward", net_name, case.net, lands_on=before)
                    before = len(cases) - 1
        return cases
