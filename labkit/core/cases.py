"""The self-checks' cases: fresh random inputs and weights for a layer, a fused group or the whole network (shrunk
when GPU code runs on the simulator), the float64 reference's answer, and the words for a result that came from an
earlier call's arrays (``labkit.freed``). The self-checks (``labkit.check``), the memory counts (``labkit.counts``),
``lk.show`` and the grader draw their cases here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..launch import simulator
from ..model import reference
from ..model.nets import Layer, Net, get_net
from ..model.weights_io import random_weights

# float32 kernels land far below this against a float64 reference (conv sums of a few hundred terms: ~1e-7 of the
# sums' magnitude); a wrong index or a missed term lands far above it. For conv and fc the error is measured against
# that magnitude (``magnitude``), not the result's own size: after a ReLU a case can keep only outputs that are small
# differences of large terms, whose rounding, relative to themselves, reached 1.5e-5 on an H100
# (results/h100-2026-11-26c/recheck_conv2_split3.txt) for a correct kernel.
DEFAULT_TOL = 1e-5
BATCHES = (1, 3, 8, 17)  # real sizes; odd ones catch kernels that assume a multiple of the block size
NETWORK_BATCHES = (1, 3)  # a whole forward pass at real sizes: the layers were checked one by one already


# ------------------------------------------------------------------------------------------------- cases


def fresh_seed(seed: int | None) -> int:
    return int(np.random.SeedSequence(seed).entropy % (2 ** 32)) if seed is None else int(seed)


def _layer_weights(layer: Layer, in_shape: tuple[int, ...], rng, shrunk: bool, batch: int = 1) -> dict[str, np.ndarray]:
    if layer.kind == "conv":
        m = simulator.layer_outputs(layer, batch) if shrunk else layer.out
        shape = (m, in_shape[0], layer.kernel, layer.kernel)
    elif layer.kind == "fc":
        shape = (layer.out, in_shape[0])
    else:
        return {}
    fan_in = int(np.prod(shape[1:]))
    w = {f"{layer.name}.weight": (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)}
    if layer.bias:
        w[f"{layer.name}.bias"] = rng.standard_normal(shape[0]).astype(np.float32)
    return w


@dataclass
class Case:
    """One test case: inputs, weights and the float64 reference's answer (as float32). ``layer`` None: the net.
    ``scale``: for conv and fc, the magnitude each output's rounding scales with (``magnitude``)."""

    name: str
    layer: Layer | None
    x: np.ndarray
    weights: dict[str, np.ndarray]
    expected: np.ndarray
    net: Net | None = None
    scale: np.ndarray | None = None


def magnitude(layer: Layer, x: np.ndarray, weights: dict, then=()) -> np.ndarray | None:
    """The same conv or fc on |x|, |weights| and |bias| in float64 (each output's sum of its terms' sizes, which
    fp32 rounding scales with), through the group's pooling (``then``: max over a window keeps the bound;
    activations are skipped, as relu and tanh never enlarge a difference). None for other layers."""
    if layer.kind not in ("conv", "fc"):
        return None
    y = reference.layer_forward(layer, np.abs(x.astype(np.float64)),
                                {k: np.abs(v.astype(np.float64)) for k, v in weights.items()}, accumulate="float64")
    for ly in then:
        if ly.kind == "pool":
            y = reference.layer_forward(ly, y, {}, accumulate="float64")
    return y


def layer_case(net: str | Net, layer: str, batch: int, rng, target: str = "gpu", answers: bool = True) -> Case:
    """Fresh random inputs and weights for one layer (shrunk when ``target`` code runs on the simulator), and the
    reference's answer (``answers=False``: not yet, see ``answer``)."""
    net = get_net(net)
    spec = net.layer(layer)
    if spec.kind == "flatten":
        raise ValueError("flatten is a reshape, not a kernel: there is nothing to check")
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target must be 'gpu' or 'cpu', not {target!r}")
    shrunk = simulator.shrinks(target) or isinstance(batch, simulator.Shrunk)
    in_shape = simulator.layer_input_shape(net, spec, batch) if shrunk else net.input_shape_of(spec.name)
    x = rng.standard_normal((batch, *in_shape)).astype(np.float32)
    if spec.kind == "softmax":
        x *= 3
    weights = _layer_weights(spec, in_shape, rng, shrunk, batch)
    case = Case(spec.name, spec, x, weights, None)
    return answer(case) if answers else case


def answer(case: Case) -> Case:
    """``case`` with the float64 reference's answer (and a layer's scale), for a case drawn without it: the same
    values, computed when they are needed (the grader computes them while its child runs: ``grading.ahead``)."""
    if case.layer is None:
        case.expected = reference.forward(case.net, case.weights, case.x, accumulate="float64")
    else:
        case.expected = reference.layer_forward(case.layer, case.x, case.weights, accumulate="float64").astype(
            np.float32)
        case.scale = magnitude(case.layer, case.x, case.weights)
    return case


def group_case(net: str | Net, group: tuple[Layer, ...], batch: int, rng, target: str = "gpu") -> Case:
    """A fused conv group's case: the conv's fresh inputs and weights, the reference through the whole group."""
    case = layer_case(net, group[0].name, batch, rng, target)
    y = case.expected
    for layer in group[1:]:
        y = reference.layer_forward(layer, y.astype(np.float64), {}, accumulate="float64").astype(np.float32)
    return Case("+".join(ly.name for ly in group), group, case.x, case.weights, y,
                scale=magnitude(group[0], case.x, case.weights, group[1:]))


def network_case(net: str | Net, batch: int, rng, target: str = "gpu", answers: bool = True) -> Case:
    """Fresh random inputs and weights for the whole network (the shrunk net when simulated), and the reference's
    answer (``answers=False``: not yet, see ``answer``)."""
    spec = simulator.net_for(net, target)
    weights = random_weights(spec, seed=int(rng.integers(2 ** 31)))
    x = rng.uniform(-0.5, 0.5, (batch, *spec.input_shape)).astype(np.float32)
    case = Case(get_net(net).name, None, x, weights, None, spec)
    return answer(case) if answers else case


def default_batches(target: str = "gpu") -> tuple[int, ...]:
    """A one-layer check's batch sizes: the simulator's shapes there; on a GPU the real sizes, then those shapes."""
    return simulator.BATCHES if simulator.shrinks(target) else (*BATCHES, *simulator.boundary_batches(target))


# ------------------------------------------------------------------------------- new arrays where freed ones were

#: the earlier call's arrays a kept kernel or result may have answered with, most likely first, and what they make
_EARLIER = ((("w",), "the values with the weights (w) of an earlier call"),
            (("w", "b"), "the values with the weights and bias (w, b) of an earlier call"),
            (("x", "w", "b"), "the output of an earlier call"),
            (("b",), "the values with the bias (b) of an earlier call"),
            (("x",), "the values with the input (x) of an earlier call"),
            (("x", "w"), "the values with the input and weights (x, w) of an earlier call"),
            (("x", "b"), "the values with the input and bias (x, b) of an earlier call"))


def weighted(layer: Layer | tuple[Layer, ...]) -> bool:
    """A layer (or fused group) with weights: its check ends with the first batch again, on new arrays put where the
    first call's were (``labkit.freed``)."""
    return (layer[0] if isinstance(layer, tuple) else layer).kind in ("conv", "fc")


def kept_from_earlier(layer: Layer | tuple[Layer, ...], earlier: tuple[np.ndarray, dict], now: tuple[np.ndarray, dict],
                      got: np.ndarray, tol: float = DEFAULT_TOL) -> str:
    """" — ..." when ``got``, the output of a call whose arrays were put at the addresses of an earlier call's
    (freed just before it: ``labkit.freed``), is the layer's on some of that earlier call's (x, weights) instead of
    its own: something kept across calls answered, by the shapes or by the id() of a freed array (either gives the
    same values here). "" otherwise. The self-check's and the grader's words."""
    group = layer if isinstance(layer, tuple) else (layer,)
    if not weighted(group) or not isinstance(got, np.ndarray) or not np.isfinite(got).all():
        return ""
    conv = group[0]
    names = {"w": f"{conv.name}.weight", "b": f"{conv.name}.bias"}
    (x0, w0), (x1, w1) = earlier, now
    for parts, what in _EARLIER:
        if "b" in parts and names["b"] not in w1:
            continue
        x = x0 if "x" in parts else x1
        weights = {**w1, **{names[p]: w0[names[p]] for p in parts if p != "x"}}
        y = reference.layer_forward(conv, x.astype(np.float64), weights, accumulate="float64")
        for ly in group[1:]:
            y = reference.layer_forward(ly, y, {}, accumulate="float64")
        norm = np.linalg.norm(y)
        if y.shape == got.shape and norm > 0 and np.linalg.norm(got - y) <= 10 * tol * norm:
            return (f" — these are {what}: is a kernel or result cached across calls, keyed by the arrays' shapes "
                    f"or by their id() (that call's arrays were freed before this one, and this call's took their "
                    f"addresses)? Key it by what the arrays hold, or keep each array alive with what you keep for "
                    f"it (lk.const_kernels.PerWeights does)")
    return ""
