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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

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
