"""The autotuner of stage 09: per conv layer, sweep a declared space of kernels and parameters, check every
candidate before timing it, keep the fastest, and remember the choice per device.

A candidate is a conv function (the layer convention, or the fused one of ``labkit.layers``) with a name and its
parameters. ``tune`` checks each candidate on the layer (fresh inputs, several batch sizes; fused candidates against
the reference through their whole group), times the ones that pass on the layer's real input at the workload's batch
size (CUDA events, median of ``repeat`` after a warm-up), and returns the table and the choice per layer. On the
simulator timing means nothing, so ``tune`` only checks there and takes its choice from the committed GPU choices
(``results/tuning.json``), saying so. On a GPU ``save=True`` writes the choices there for this device.

On the simulator a candidate that is given code (an earlier stage's, ``lk.from_stage``, or the kit's: not the
notebook's own, ``own``) is not checked again: the kit's own tests check it, as the grader assumes, and its check
on every layer took four of the five minutes stage 09's tune cell ran on a laptop. Its line says "given". On a GPU
every candidate is checked before it is timed.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core import check, engine
from ..launch import device, gpu, simulator
from ..measuring.ledger import repo_root
from ..measuring.timing import Clock
from ..model import layers
from ..model.nets import Net, get_net
from .plots import _figure

STORE = repo_root() / "results" / "tuning.json"


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: a name, its parameters, and the conv function they make."""

    name: str
    params: dict
    fn: Callable
    fused: bool = False  # called with the fused convention (conv, activation, pool in one call)


def space(name: str, make: Callable[..., Callable], fused: bool = False, **axes) -> list[Candidate]:
    """Every combination of the axes' values, each made into a conv function by ``make(**params)`` and named
    after ``name`` and its parameters: ``space("05 tiled", lambda T: ..., T=[8, 16])`` gives "05 tiled T=8" ..."""
    keys = list(axes)
    out = []
    for values in itertools.product(*(axes[k] for k in keys)):
        params = dict(zip(keys, values))
        label = name + "".join(f" {k}={v}" for k, v in params.items())
        out.append(Candidate(label, params, make(**params), fused))
    return out


@dataclass
class Trial:
    layer: str
    candidate: Candidate
    check: check.CheckResult
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


@dataclass
class Tuning:
    """Every trial, and the fastest passing candidate of each layer."""

    net: str
    images: int
    device: str
    trials: list[Trial]
    choice: dict[str, str]  # layer -> candidate name
    source: str  # "measured here" or where the choice came from

    def table(self) -> str:
        wide = max([34, *(len(t.candidate.name) + 1 for t in self.trials)])
        lines = [f"{'layer':<8}{'candidate':<{wide}}{'check':<7}{'median ms':>11}{'':>4}"]
        for t in self.trials:
            ms = f"{1e3 * t.median:.4f}" if t.median is not None else "-"
            mark = " <-" if self.choice.get(t.layer) == t.candidate.name else ""
            verdict = "given" if t.check.note == GIVEN else "PASS" if t.check.passed else "FAIL"
            lines.append(f"{t.layer:<8}{t.candidate.name:<{wide}}{verdict:<7}{ms:>11}{mark}")
        if any(t.check.note == GIVEN for t in self.trials):
            lines.append(f"given: {GIVEN}")
        lines.append(f"choice: {self.source}")
        return "\n".join(lines)


#: the note of a given candidate's line on the simulator
GIVEN = "given code, checked by the kit's own tests: not again on the simulator"


def _check(c: Candidate, spec: Net, layer: str, group: tuple, own: str, on_gpu: bool) -> check.CheckResult:
    """The candidate's check on its layer (its group, when fused); a given one on the simulator passes unchecked,
    saying so."""
    given = None if on_gpu else check.origin(c.fn, own)
    if given:
        return check.CheckResult(f"{layer} {c.name}", True, note=GIVEN, given=given)
    if c.fused and len(group) > 1:
        return check.check_group(c.fn, spec, group, arrays="device", quiet=True)
    return check.check_layer(c.fn, spec, layer, arrays="device", quiet=True)


def _group_of(spec: Net, layer: str, fused: bool) -> tuple:
    conv = spec.layer(layer)
    if not fused:
        return (conv,)
    for group in layers.groups(layers.kernel_layers(spec), ("relu", "tanh", "pool")):
        if group[0] is conv:
            return group
    return (conv,)


def _inputs(spec: Net, group: tuple, batch: int, rng) -> tuple:
    """A layer's timing input and weights on the device, made once per layer and shared by its candidates (at
    50000 CIFAR images the input alone is 600 MB: making it per candidate took longer than timing them)."""
    conv = group[0]
    x = rng.standard_normal((batch, *spec.input_shape_of(conv.name))).astype(np.float32)
    weights = layers.with_biases(group, {k: v for k, v in _weights(spec, conv, rng).items()})
    out_shape = layers.group_output_shape(group, x.shape, weights)
    return gpu.to_device(x), {k: gpu.to_device(v) for k, v in weights.items()}, out_shape


def _time(c: Candidate, group: tuple, inputs: tuple, repeat: int) -> list[float]:
    conv = group[0]
    xd, wd, out_shape = inputs
    out = gpu.buffer(f"tune {conv.name}", out_shape)

    def call():
        args = layers.fused_args(group, xd, wd, out) if len(group) > 1 else layers.args(conv, xd, wd, out)
        c.fn(*args)

    call()  # warm-up: compiles
    seconds = []
    for _ in range(repeat):
        clock = Clock("auto")
        with clock.section("layer"):
            call()
        seconds.append(clock.seconds()["layer"])
    return seconds


def _weights(spec: Net, conv, rng) -> dict:
    shapes = spec.weight_shapes()
    return {k: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]) if len(s) > 1 else 1)).astype(np.float32)
            for k, s in shapes.items() if k.startswith(f"{conv.name}.")}


def stored(net: str, images: int, dev: str | None = None) -> dict | None:
    """The committed choice for ``net`` at ``images`` on ``dev``; without ``dev``, this device's when one is
    recorded (a choice is only as good as the device it was timed on), else the newest recorded."""
    if not STORE.exists():
        return None
    data = json.loads(STORE.read_text())
    entries = [e for e in data.get("choices", []) if e["net"] == net and e["images"] == images
               and (dev is None or e["device"] == dev)]
    if dev is None:
        entries = [e for e in entries if e["device"] == device.label()] or entries
    return entries[-1] if entries else None


def size_for(sizes, n: int) -> int:
    """The tuned size of ``sizes`` whose choice serves a batch of ``n`` images: the smallest at or above ``n`` (the
    largest past them all), a choice tuned where the GPU was no fuller than this batch fills it. One rule for the
    calls (``by_images``) and for what ``labkit.floors`` says they issue. The nearest by ratio gave chunks of 2500
    and 5000 images the 1200-image choice: on an H200 (``results/h200-2026-11-28``, call 6) the end-to-end grid's
    cells at 2500 and 5000 images over 2 and 4 streams took 8.49-9.64 ms with it and 7.30-8.54 ms with this rule."""
    n = max(1, int(n))
    return min([s for s in sizes if s >= n] or [max(sizes)])


def by_images(tuned: dict[int, dict]) -> dict:
    """One set of layer functions from choices tuned per workload size (``{1200: impls, 50000: impls}``): where
    the sizes' functions for a layer differ, a function that calls, at each call, the one tuned for the size that
    serves the call's batch (``size_for``); the kit's checks (a few images) get the smallest size's. A layer's best
    kernel at 1200 images is not its best at 50000: at 1200 the small layers do not fill the GPU."""
    sizes = sorted(tuned)
    if not sizes:
        raise ValueError("by_images: no tuned sizes given")
    out = {}
    for key in dict.fromkeys(k for s in sizes for k in tuned[s]):
        fns = {s: tuned[s].get(key) for s in sizes}
        if any(fn is None for fn in fns.values()):
            raise ValueError(f"by_images: layer {key!r} has no function at "
                             f"{', '.join(str(s) for s, fn in fns.items() if fn is None)} images")
        if len({id(fn) for fn in fns.values()}) == 1:
            out[key] = fns[sizes[0]]
            continue

        def pick(x, *args, _fns=fns):
            return _fns[size_for(sizes, x.shape[0])](x, *args)

        pick.__name__ = f"tuned_by_images_{key}"
        pick.__qualname__ = pick.__name__
        pick.tuned = fns  # what it picks from, for a reader (lk.show, a test)
        out[key] = pick
    return out


def tune(candidates: dict[str, list[Candidate]], net: str | Net, images: int, repeat: int = 5,
         save: bool = False, quiet: bool = False, own: str = "09") -> Tuning:
    """Tune every layer named in ``candidates`` (layer -> its candidates) of ``net`` at ``images`` images; ``own``:
    the stage whose notebook's code is the student's own (always checked)."""
    spec = get_net(net)
    rng = np.random.default_rng(0)
    on_gpu = device.info().kind == "gpu"
    trials = []
    for layer, cands in candidates.items():
        inputs = {}  # group -> its timing input, made when a first candidate of the group passes
        for c in cands:
            group = _group_of(spec, layer, c.fused)
            result = _check(c, spec, layer, group, own, on_gpu)
            trial = Trial(layer, c, result)
            if result.passed and on_gpu:
                if group not in inputs:
                    inputs.clear()  # one layer's input on the device at a time
                    inputs[group] = _inputs(spec, group, images, rng)
                trial.seconds = _time(c, group, inputs[group], repeat)
            trials.append(trial)
            if not quiet:
                timing = f", {1e3 * trial.median:.4f} ms" if trial.median is not None else ""
                verdict = "given" if result.note == GIVEN else "PASS" if result.passed else "FAIL"
                print(f"{layer} {c.name}: {verdict}{timing}"
                      + ("" if result.passed else f" ({result.detail})"))
    if on_gpu:
        choice = {}
        for layer in candidates:
            timed = [t for t in trials if t.layer == layer and t.median is not None]
            if timed:
                choice[layer] = min(timed, key=lambda t: t.median).candidate.name
        source = f"measured here ({device.label()}, {images} images, median of {repeat})"
        tuning = Tuning(spec.name, images, device.label(), trials, choice, source)
        if save:
            _save(tuning)
        return tuning
    kept = stored(spec.name, images)
    choice = dict(kept["choice"]) if kept else {}
    source = (f"the kit's committed choice and medians, measured on {kept['device']} on {kept['date']} "
              f"(results/tuning.json): the {'simulator' if simulator.active() else 'CPU'} can check candidates, "
              f"not time them") if kept else \
        "none: this machine cannot time candidates and no choice is committed for this workload"
    if kept:  # show the committed medians of the candidates that passed here, labelled with their device
        medians = kept.get("medians_ms", {})
        for tr in trials:
            ms = medians.get(f"{tr.layer} {tr.candidate.name}")
            if ms is not None and tr.check.passed:
                tr.seconds = [ms / 1e3]
    where = f"{kept['device']} ({kept['date']}, committed)" if kept else device.label()
    return Tuning(spec.name, images, where, trials, choice, source)


def _save(t: Tuning) -> None:
    data = json.loads(STORE.read_text()) if STORE.exists() else {"choices": []}
    data["choices"] = [e for e in data["choices"] if not (e["net"] == t.net and e["images"] == t.images
                                                          and e["device"] == t.device)]
    data["choices"].append({
        "net": t.net, "images": t.images, "device": t.device, "date": dt.date.today().isoformat(),
        "choice": t.choice,
        "medians_ms": {f"{tr.layer} {tr.candidate.name}": round(1e3 * tr.median, 5) for tr in t.trials
                       if tr.median is not None},
    })
    STORE.parent.mkdir(parents=True, exist_ok=True)
    STORE.write_text(json.dumps(data, indent=1) + "\n")


def plot(t: Tuning, ax=None):
    """Median time of every passing candidate, one group per layer (log scale): the spread the choice came from."""
    fig, ax = _figure(ax, figsize=(9, 4))
    timed = [tr for tr in t.trials if tr.median is not None]
    if not timed:
        ax.text(0.5, 0.5, "no timings here: " + t.source, ha="center", va="center", transform=ax.transAxes,
                wrap=True, fontsize=8)
        return fig
    layers_ = list(dict.fromkeys(tr.layer for tr in timed))
    names = list(dict.fromkeys(tr.candidate.name for tr in timed))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [layers_.index(tr.layer) + (k - (len(names) - 1) / 2) * width for tr in timed
              if tr.candidate.name == name]
        ys = [1e3 * tr.median for tr in timed if tr.candidate.name == name]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(layers_)), layers_)
    ax.set(yscale="log", ylabel="ms", title=f"{t.net}, {t.images} images on {t.device}")
    ax.legend(fontsize=7)
    return fig
