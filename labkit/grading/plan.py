"""What is graded for a stage, decided once per run: the variants, their contract, the sizes, the limits, and
the reference data every job of the run shares.

The parent never imports a kernel: what a reference solution's VARIANTS declare is asked of a child
(``worker --describe``), and the reference answers come from the numpy reference in float64.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..core import check
from ..core.workloads import Workload, workload
from ..course import nbcells, tasks
from ..course.stages import STAGES, Stage
from ..launch import simulator
from ..model import data, reference
from ..model.nets import Net, get_net
from ..model.weights_io import load_c_study_weights, load_weights, random_weights
from .protocol import VariantSpec
from .rubric import GradeError, Rubric
from .sandbox import WORKER, child_env


Declared = tuple[dict[str, VariantSpec], list[str]]  # a solution's variants by name, and their order


def describe_stages(solutions: list[Path], timeout: float = 600) -> dict[Path, Declared]:
    """What each reference solution's VARIANTS declare, asked of one child process (the parent imports no
    kernels). One child for a run's stages imports the kit once: with a child a stage, in the parent and again in
    each cluster worker, a class's wall outside its jobs was 42 s on an H200 pair, 17 s after
    (results/h200x2-2026-11-28b). A solution that does not load is refused in one line with the end of its
    traceback."""
    with tempfile.TemporaryDirectory(prefix="labkit-describe-") as tmp:
        out = Path(tmp) / "describe.json"
        names = [str(s) for s in solutions]
        folder = str(solutions[0].parent) if solutions else ""
        try:
            proc = subprocess.run([sys.executable, "-m", WORKER, "--describe", *names, "--json", str(out)],
                                  cwd=tmp, env=child_env({"LABKIT_SOLUTIONS": folder}),
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GradeError(f"the reference solutions in {folder} did not load within {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise GradeError(f"the reference solutions in {folder} do not load:\n{tail}")
        found = json.loads(out.read_text())
    described = {}
    for solution, name in zip(solutions, names):
        desc = found[name]
        if "error" in desc:
            raise GradeError(f"the reference solution {solution} does not load:\n{desc['error']}")
        described[solution] = ({n: VariantSpec.from_json(d) for n, d in desc["variants"].items()}, list(desc["order"]))
    return described


def describe_stage(solution: Path, timeout: float = 600) -> Declared:
    """What one reference solution's VARIANTS declare (``describe_stages``)."""
    return describe_stages([solution], timeout)[solution]


def declared_json(declared: Declared) -> dict:
    """``declared`` as JSON, for a cluster's workers (``declared_from_json``): they plan from the parent's."""
    variants, order = declared
    return {"variants": {n: v.to_json() for n, v in variants.items()}, "order": list(order)}


def declared_from_json(d: dict) -> Declared:
    return {n: VariantSpec.from_json(v) for n, v in d["variants"].items()}, list(d["order"])


@dataclasses.dataclass
class StagePlan:
    stage: Stage
    solution: Path
    rubric: dict
    variants: dict[str, VariantSpec]  # the graded variants, as the solution declares them
    timed: str
    measured: bool  # op time is measured (CPU code, or GPU code on a real GPU)
    not_measured_why: str
    time_limit: float
    accuracy_scored: bool = True  # some accuracy run has labelled images (set once the references exist)
    skipped: dict = dataclasses.field(default_factory=dict)  # variant -> why it cannot run here (not graded)

    def layer_batches(self, target: str) -> tuple[int, ...]:
        """Batch sizes of the single-layer checks: the simulator's for GPU code on it, else the rubric's
        (``checks.batches``, default ``labkit.check.BATCHES``), and for GPU code on a GPU the simulator's shapes
        after them (``simulator.boundary_batches``)."""
        if simulator.shrinks(target):
            return tuple(simulator.BATCHES)
        return (*(self.rubric["checks"].get("batches") or check.BATCHES), *simulator.boundary_batches(target))

    @staticmethod
    def network_batches(target: str) -> tuple[int, ...]:
        """Batch sizes of the whole-network check, as ``labkit.check.check_network`` uses them."""
        return tuple(simulator.NETWORK_BATCHES) if simulator.shrinks(target) else tuple(check.NETWORK_BATCHES)

    def accuracy_runs(self) -> list[tuple[str, str, int, str]]:
        """(variant, net, images asked for, target) of every accuracy run. A variant launched once an image that is
        not the timed one runs on ``accuracy.per_image`` of the images: the same kernels as the batched variants,
        launched image by image, where 1200 images cost a stage-04 job most of its time on an H100 (36 of 51 s)."""
        images, per_image = self.rubric["accuracy"]["images"], self.rubric["accuracy"].get("per_image")
        return [(name, net, min(images, per_image) if per_image and spec.per_image and name != self.timed else images,
                 spec.target) for name, spec in self.variants.items() for net in spec.nets]

    def timing_run(self) -> tuple[str, int, str] | None:
        """(net, images, target) of the op-time runs, or None when op time is not measured."""
        if not self.measured:
            return None
        spec = self.variants[self.timed]
        return spec.nets[0], self.rubric["timing"]["images"], spec.target

    def conv_layers(self) -> list[str]:
        """The conv layers the timed variant computes (their time is the op time)."""
        spec = self.variants[self.timed]
        net = spec.nets[0]
        return [n for n in spec.layers[net] if get_net(net).layer(n).kind == "conv"]

    def task_points(self, name: str) -> float:
        """A task's own points (``labkit.tasks``): the rubric's ``tasks`` table, else the task's."""
        return float(self.rubric.get("tasks", {}).get(name, tasks.find(self.stage.number, name).points))

    def graded_tasks(self) -> dict[str, float]:
        """The stage's tasks with checks of their own that earn points, and their points."""
        found = {t.name: self.task_points(t.name) for t in tasks.own_phases(self.stage.number)}
        return {name: pts for name, pts in found.items() if pts > 0}

    def max_points(self) -> dict[str, float]:
        """The most each part can give: accuracy counts only on labelled images, op time only when measured
        (unless ``op_time.when_not_measured`` says otherwise)."""
        pts, op = self.rubric["points"], self.rubric["op_time"]
        return {"correctness": pts["correctness"], "accuracy": pts["accuracy"] if self.accuracy_scored else 0,
                "op_time": 0 if not self.measured and op["when_not_measured"] == "exclude" else pts["op_time"],
                "technique": pts["technique"] if self.technique() else 0,
                "tasks": sum(self.graded_tasks().values())}

    def technique(self) -> dict | None:
        """What the technique part checks ({memory, net, layer, min_fraction, variant}: the variant whose conv is
        looked at, the rubric's or else the timed one), or None when the stage has none."""
        t = self.rubric["technique"]
        return {**t, "variant": t.get("variant") or self.timed} \
            if t["memory"] and self.rubric["points"]["technique"] > 0 else None

    def max_score(self) -> float:
        return sum(self.max_points().values())


def in_step(stage: Stage, solutions: Path) -> None:
    """GradeError unless each solution a stage's jobs run (its own, graded as the reference from its notebook, and
    the earlier stages', given code run from their sources) holds the same cells as its source NN_topic.py, where
    the folder has one."""
    for s in (s for n, s in STAGES.items() if n <= stage.number):
        notebook = solutions / s.notebook
        why = nbcells.out_of_step(notebook) if notebook.is_file() and nbcells.source_of(notebook).is_file() else ""
        if why:
            raise GradeError(f"--solutions: {why}; run `jupytext --sync {nbcells.source_of(notebook)}` first")


def plan_stage(stage: Stage, solutions: Path, rubric: Rubric, gpu: bool, simulated: bool,
               described: Declared | None = None) -> StagePlan:
    """The stage's plan; ``described``: what its solution declares, where it was asked already
    (``describe_stages``)."""
    in_step(stage, solutions)
    solution = solutions / stage.notebook
    declared, order = described if described is not None else describe_stage(solution)
    r = rubric.for_stage(stage.number)
    names = r.get("variants") or order
    # a variant that cannot run here (CUDA C through cupy on a machine without a GPU) is left out, and said so
    skipped = {n: declared[n].unavailable for n in names if n in declared and declared[n].unavailable}
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise GradeError(f"rubric: stage {stage.number} grades variants {unknown}, which {solution.name} does not "
                         f"define (it defines {', '.join(order)})")
    if r.get("timed_variant") in skipped:
        raise GradeError(f"rubric: stage {stage.number} times variant {r['timed_variant']!r}, which "
                         f"{skipped[r['timed_variant']]}: grade on such a machine or time another variant")
    names = [n for n in names if n not in skipped]
    if not names:
        raise GradeError(f"stage {stage.number}: no graded variant can run here ({'; '.join(skipped.values())})")
    timed = r.get("timed_variant") or names[-1]
    if timed not in names:
        raise GradeError(f"rubric: stage {stage.number} times variant {timed!r}, which is not graded ({names})")
    counted = r["technique"].get("variant")  # the student's own kernel, where the timed variant may run given code
    if counted and r["technique"]["memory"] and r["points"]["technique"] > 0 and counted not in names:
        raise GradeError(f"rubric: stage {stage.number} counts its technique on variant {counted!r}, which is not "
                         f"graded ({names}): add it to the stage's variants, or set points.technique = 0")
    variants = {n: declared[n] for n in names}
    measured, why = True, ""
    if variants[timed].target == "gpu" and not gpu:
        measured, why = False, "simulated" if simulated else "no GPU"
    tnet = variants[timed].nets[0]
    if not any(get_net(tnet).layer(n).kind == "conv" for n in variants[timed].layers[tnet]):
        measured, why = False, "the timed variant has no conv function"
    sim_stage = simulated and any(v.target == "gpu" for v in variants.values())
    limit = r["limits"]["sim_time_s"] if sim_stage else r["limits"]["time_s"]
    return StagePlan(stage, solution, r, variants, timed, measured, why, float(limit), skipped=skipped)


#: values ``References.shared`` keeps: a run's timed passes, 9 a timed workload, for a few runs
SHARED_KEEP = 256


class References:
    """Real-image workloads and the reference's predictions on them, computed once per run in the parent."""

    def __init__(self):
        self._cache: dict = {}
        self._probabilities: dict = {}
        self._weights: dict = {}
        self.weight_sources: dict[str, str] = {}
        self._lock = threading.Lock()
        self._shared: dict = {}  # key -> [lock, value, done]: ``shared``

    def shared(self, key, compute: Callable[[], object]) -> object:
        """``compute()``'s value, computed once for every job of this process that asks for ``key`` (the others
        wait for it); the ``SHARED_KEEP`` latest keys are kept. A failure is raised to its caller and computed
        again by the next."""
        with self._lock:
            slot = self._shared.pop(key, None) or [threading.Lock(), None, False]
            self._shared[key] = slot  # now the latest
            while len(self._shared) > SHARED_KEEP:
                self._shared.pop(next(iter(self._shared)))
        with slot[0]:
            if not slot[2]:
                slot[1], slot[2] = compute(), True
        return slot[1]

    def weights(self, net: Net) -> dict:
        if net.name not in self._weights:
            try:
                w, src = load_weights(net), "shipped weights"
            except FileNotFoundError:
                folder = data.find_folder("cnn-cifar10-weights") if net.name == "cifar10" else None
                if folder is not None:
                    w, src = load_c_study_weights(folder, net), f"the C study's weights ({folder})"
                else:
                    w, src = random_weights(net, seed=0), "RANDOM weights (no shipped weights found)"
            self._weights[net.name] = w
            self.weight_sources[net.name] = src
        return self._weights[net.name]

    def get(self, net_name: str, images: int, target: str) -> tuple[Workload, np.ndarray, float | None]:
        """The workload (shrunk for GPU code on the simulator), the reference's predictions, its accuracy."""
        key = (net_name, images, target)
        with self._lock:
            if key not in self._cache:
                net = get_net(net_name)
                wl = workload(net, images, target=target, weights=self.weights(net), tile=True, quiet=True)
                probs = reference.forward(wl.net, wl.weights, wl.x)
                pred = reference.predict(probs)
                acc = None if wl.labels is None else reference.accuracy(pred, wl.labels)
                self._cache[key] = (wl, pred, acc)
                self._probabilities[key] = np.asarray(probs, np.float64)
            return self._cache[key]

    def probabilities(self, net_name: str, images: int, target: str) -> np.ndarray:
        """The reference's class probabilities on that workload (float64), for the timed passes' comparison."""
        self.get(net_name, images, target)
        return self._probabilities[(net_name, images, target)]

    def prepare(self, plan: StagePlan) -> None:
        """Compute what the stage's jobs need before any child starts, and whether accuracy can be scored."""
        labelled = [self.get(net, n, target)[0].labels is not None for _, net, n, target in plan.accuracy_runs()]
        plan.accuracy_scored = any(labelled)
        if plan.timing_run():
            self.get(*plan.timing_run())
