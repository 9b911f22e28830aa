"""Memory traffic a student can see without a GPU: loads and stores of global, shared and constant memory that a
layer function makes, counted by the simulator's instrumentation (``labkit.simcheck``), per output element.

Stages 05–08 are about reuse: a tiled convolution should cut the global loads per output element by about the
reuse factor of its tile. ``show`` puts the counts of several functions side by side with the count each design
predicts. On the simulator it counts in this process; on a GPU machine it runs the count in a child process under
the simulator, on the stage's notebook as last saved (or the kit's solution), since counting needs the simulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..course import nbcells
from ..course.stages import STAGES, from_stage, given_stage, solution
from ..launch import simcheck, simulator
from ..launch.simulator import layer_input_shape
from ..model.nets import get_net
from . import engine
from .cases import layer_case

KINDS = ("global load", "global store", "shared load", "shared store", "constant load")


@dataclass
class Counts:
    """What one call of a layer function did, on one shrunk case."""

    name: str
    outputs: int  # output elements of the case
    totals: Counter = field(default_factory=Counter)  # "global load" -> n, ...
    launches: int = 0
    per_thread_max: Counter = field(default_factory=Counter)

    def per_output(self, kind: str) -> float:
        return self.totals[kind] / self.outputs if self.outputs else float("nan")


def count_layer(fn, net: str, layer: str, arrays: str = "device", batch: int = 1, seed: int = 0,
                name: str = "") -> Counts:
    """Call ``fn`` once on a shrunk case of ``layer`` (the self-check's inputs, fixed ``seed``) and count its memory
    operations. Needs the simulator."""
    if not simulator.active():
        raise RuntimeError("counting memory operations needs the CUDA simulator (labkit.counts.show runs it in a "
                           "child process on a GPU machine)")
    case = layer_case(net, layer, batch, np.random.default_rng(seed), target="gpu")
    with simcheck.watching() as watch:
        engine.call_layer(fn, case.layer, case.x, case.weights, arrays)
    c = Counts(name or getattr(fn, "__name__", "fn"), int(case.expected.size), watch.totals(), len(watch.launches))
    for launch in watch.launches:
        for kind in KINDS:
            c.per_thread_max[kind] = max(c.per_thread_max[kind], launch.per_thread_max(kind))
    return c


def table(rows: list[Counts], predicted: dict[str, float] | None = None, title: str = "") -> str:
    """Per output element: each kind of memory operation, and the global loads the design predicts."""
    head = f"{'per output element':<24}" + "".join(f"{k:>14}" for k in KINDS) + (
        f"{'predicted':>11}" if predicted else "")
    lines = ([title] if title else []) + [head]
    for c in rows:
        cells = "".join(f"{c.per_output(k):>14.2f}" for k in KINDS)
        pred = predicted.get(c.name) if predicted else None
        lines.append(f"{c.name:<24}{cells}" + (f"{pred:>11.2f}" if pred is not None else ("" if not predicted
                                                                                         else f"{'-':>11}")))
    return "\n".join(lines)


def _notebook_for(stage: str) -> Path:
    """The stage's notebook as the student last saved it (Jupyter's working folder), else the kit's solution (its
    source, ``stages.solution``)."""
    here = Path.cwd() / STAGES[stage].notebook
    return here if here.exists() else solution(stage)


def show(stage: str, functions: dict, net: str = "cifar10", layer: str = "conv2",
         predicted: dict[str, float] | None = None, arrays: dict[str, str] | None = None) -> list[Counts]:
    """Print the counts of ``functions`` (label -> a layer function bound to a name in the stage's kernel cells) on
    a shrunk ``layer``. ``predicted``: label -> global loads per output element the design predicts. ``arrays``:
    label -> "host" or "device" (default "device")."""
    arrays = arrays or {}
    if simulator.active():
        rows = [count_layer(fn, net, layer, arrays.get(label, "device"), name=label)
                for label, fn in functions.items()]
    else:
        caller = sys._getframe(1).f_globals  # the notebook's namespace: where the child finds the same names
        names = {label: _path_of(fn, caller) for label, fn in functions.items()}
        rows = _in_child(stage, names, net, layer, arrays)

    spec = get_net(net)
    shape = "x".join(map(str, layer_input_shape(spec, spec.layer(layer))))
    saved = _notebook_for(stage).with_suffix(".ipynb").name  # a solution's source: its notebook's name
    source = "" if simulator.active() else f", counted under the simulator on {saved} as saved"
    print(table(rows, predicted, f"{layer} of {net}, shrunk input {shape}, 1 image{source}"))
    return rows


def _path_of(fn, namespace: dict) -> str:
    """How the child finds ``fn``: the name the notebook bound to it (``conv_tiled_8``), or ``@NN.name`` for given
    code of stage NN (``s04.conv_padded``: the child loads only the kernel cells, which need not bind ``s04``). A
    function's own ``__name__`` can differ from both (a closure a factory made)."""
    for name, obj in namespace.items():
        if obj is fn and not name.startswith("_"):
            return name
    for obj in namespace.values():
        number = given_stage(obj) if isinstance(obj, types.SimpleNamespace) else None
        for attr, value in vars(obj).items() if number else ():
            if value is fn:
                return f"@{number}.{attr}"
    return getattr(fn, "__name__", str(fn))


def _resolve(namespace: dict, path: str):
    if path.startswith("@"):
        number, attr = path[1:].split(".", 1)
        return getattr(from_stage(number), attr)
    return namespace[path]


def _in_child(stage: str, functions: dict[str, str], net: str, layer: str, arrays: dict[str, str]) -> list[Counts]:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1")
    job = json.dumps({"notebook": str(_notebook_for(stage)), "stage": stage, "functions": functions, "net": net,
                      "layer": layer, "arrays": arrays})
    proc = subprocess.run([sys.executable, "-m", "labkit.core.counts"], input=job, capture_output=True, text=True,
                          env=env, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"counting under the simulator failed: {tail[0]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [Counts(r["name"], r["outputs"], Counter(r["totals"]), r["launches"], Counter(r["per_thread_max"]))
            for r in rows]


def _main() -> int:
    """Child: load the stage notebook's kernel cells under the simulator and count the named functions."""
    job = json.loads(sys.stdin.read())
    namespace = nbcells.load(job["notebook"])
    rows = []
    for label, fn in job["functions"].items():
        c = count_layer(_resolve(namespace, fn), job["net"], job["layer"], job["arrays"].get(label, "device"), name=label)
        rows.append({"name": c.name, "outputs": c.outputs, "totals": dict(c.totals), "launches": c.launches,
                     "per_thread_max": dict(c.per_thread_max)})
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
