"""The layer calling convention: how every student (and kit) layer function is called.

A layer function writes its result into ``out`` and returns nothing. When a check calls it, ``out`` arrives filled
with NaN, so an element it never writes shows up as a failure. One convention per layer kind:

    conv     fn(x, w, b, out, pad, stride)   x (N,C,H,W), w (M,C,K,K), b (M,) (zeros if the layer has none)
    fc       fn(x, w, b, out)                x (N,IN), w (OUT,IN), b (OUT,)
    pool     fn(x, out, kernel, stride)      max pooling
    relu     fn(x, out)
    tanh     fn(x, out)
    softmax  fn(x, out)                      over axis 1

The arrays are numpy arrays for a variant with ``arrays="host"`` and device arrays (numba or cupy) for
``arrays="device"``. ``flatten`` is a reshape that the engine does itself.

A variant may fuse the activation and the pooling that follow a convolution into it (``Variant.fuse``): its conv
function is then called once for the group, as ``fn(x, w, b, out, pad, stride, act, pool)`` with ``act`` 0 (none),
1 (ReLU) or 2 (tanh), ``pool`` the pooling window (its stride too; 0 for none), and ``out`` shaped like the group's
last layer's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .nets import Layer, Net, layer_output_shape

SIGNATURES = {
    "conv": "fn(x, w, b, out, pad, stride)",
    "fc": "fn(x, w, b, out)",
    "pool": "fn(x, out, kernel, stride)",
    "relu": "fn(x, out)",
    "tanh": "fn(x, out)",
    "softmax": "fn(x, out)",
}
#: position of ``out`` in each convention
OUT_AT = {"conv": 3, "fc": 3, "pool": 1, "relu": 1, "tanh": 1, "softmax": 1}
FUSED_SIGNATURE = "fn(x, w, b, out, pad, stride, act, pool)"
ACT_CODES = {"relu": 1, "tanh": 2}  # 0: no activation


def args(layer: Layer, x, weights: dict, out) -> tuple:
    """The positional arguments a function for ``layer`` receives. ``weights`` must hold a bias for every conv
    and fc layer (``with_biases`` adds zeros where the spec has none)."""
    if layer.kind in ("conv", "fc"):
        w, b = weights[f"{layer.name}.weight"], weights[f"{layer.name}.bias"]
        return (x, w, b, out, layer.pad, layer.stride) if layer.kind == "conv" else (x, w, b, out)
    if layer.kind == "pool":
        return (x, out, layer.kernel, layer.stride)
    if layer.kind in ("relu", "tanh", "softmax"):
        return (x, out)
    raise ValueError(f"layer {layer.name!r} of kind {layer.kind!r} takes no layer function")


def with_biases(layers, weights: dict) -> dict:
    """``weights`` plus a float32 zero bias for every conv and fc layer that has none (host arrays)."""
    out = dict(weights)
    for layer in layers:
        if layer.kind in ("conv", "fc") and f"{layer.name}.bias" not in out:
            out[f"{layer.name}.bias"] = np.zeros(weights[f"{layer.name}.weight"].shape[0], np.float32)
    return out


def impl_for(impls: dict, layer: Layer) -> Callable | None:
    """The function a variant gives for ``layer``: the one registered under its name, else under its kind."""
    return impls.get(layer.name) or impls.get(layer.kind)


def output_shape(layer: Layer, x_shape: tuple[int, ...], weights: dict) -> tuple[int, ...]:
    """(N, ...) that ``layer`` makes from an input of shape ``x_shape``; conv and fc widths come from the
    weights, so a shrunk check's layer works as well as the real one."""
    if layer.has_weights:
        layer = replace(layer, out=int(weights[f"{layer.name}.weight"].shape[0]))
    return (int(x_shape[0]), *layer_output_shape(layer, tuple(int(s) for s in x_shape[1:])))


def kernel_layers(net: Net) -> list[Layer]:
    """The layers that take a layer function (all but flatten)."""
    return [layer for layer in net.layers if layer.kind != "flatten"]


def groups(layers_: list[Layer], fuse: tuple[str, ...] = ()) -> list[tuple[Layer, ...]]:
    """The layers in calling order, a conv and the activation and pooling right after it in one group when
    ``fuse`` names their kinds ("relu", "tanh", "pool"); every other layer alone."""
    out: list[tuple[Layer, ...]] = []
    i = 0
    while i < len(layers_):
        group = [layers_[i]]
        if layers_[i].kind == "conv" and fuse:
            j = i + 1
            if j < len(layers_) and layers_[j].kind in ("relu", "tanh") and layers_[j].kind in fuse:
                group.append(layers_[j])
                j += 1
            if j < len(layers_) and layers_[j].kind == "pool" and "pool" in fuse and \
                    layers_[j].stride == layers_[j].kernel:
                group.append(layers_[j])
        out.append(tuple(group))
        i += len(group)
    return out


def fused_codes(group: tuple[Layer, ...]) -> tuple[int, int]:
    """(activation code, pooling window) of a fused conv group: 0 where it has none."""
    act = next((ACT_CODES[ly.kind] for ly in group[1:] if ly.kind in ACT_CODES), 0)
    pool = next((ly.kernel for ly in group[1:] if ly.kind == "pool"), 0)
    return act, pool


@dataclass(frozen=True)
class Conv5x5:
    """A fused 5 x 5 conv's compile-time shape: what the kit's given CUDA C convs (Winograd's, the tensor cores')
    build their plans on, each adding its configuration."""

    C: int
    M: int
    H: int
    W: int
    pad: int
    act: int
    pool: int


def conv5x5(who: str, x, w, pad: int, stride: int, act: int, pool: int) -> Conv5x5:
    """A call's shape, or the one-line refusal of what those convs do not do: they take 5 x 5 filters at stride 1
    and a fused pool of 2 x 2 or none."""
    n, ch, h, wd = x.shape
    if tuple(w.shape[1:]) != (ch, 5, 5) or stride != 1:
        raise ValueError(f"{who}: takes 5 x 5 filters at stride 1 over the input's {ch} channels (got weights "
                         f"{tuple(w.shape)}, stride {stride}): use a direct conv there")
    if pool not in (0, 2):
        raise ValueError(f"{who}: a fused pool must be 2 x 2, not {pool}")
    return Conv5x5(int(ch), int(w.shape[0]), int(h), int(wd), pad, act, pool)


def fused_args(group: tuple[Layer, ...], x, weights: dict, out) -> tuple:
    """The arguments of a fused conv group: the conv's, then the activation code and the pooling window."""
    return (*args(group[0], x, weights, out), *fused_codes(group))


def group_output_shape(group: tuple[Layer, ...], x_shape: tuple[int, ...], weights: dict) -> tuple[int, ...]:
    shape = tuple(x_shape)
    for layer in group:
        shape = output_shape(layer, shape, weights)
    return shape
