"""Network specs: layers, shapes, and what each layer costs (FLOPs, minimum bytes).

A network is a declarative list of layers, so the reference forward pass, the self-checks, the timing report,
the throughput figures and the grader work for any spec, not only the ones the kit ships. Shapes are NCHW
float32 everywhere; conv weights are ``[M, C, K, K]`` (out, in, row, col) and fc weights ``[out, in]``.
Weights files are read and written by ``labkit.weights_io``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

KINDS = ("conv", "relu", "tanh", "pool", "flatten", "fc", "softmax")


@dataclass(frozen=True)
class Layer:
    """One layer of a spec. ``out`` is output channels (conv) or output features (fc)."""

    name: str
    kind: str
    out: int = 0
    kernel: int = 0
    pad: int = 0
    stride: int = 1
    bias: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"layer {self.name!r}: unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")

    @property
    def has_weights(self) -> bool:
        return self.kind in ("conv", "fc")


SCALED_SUFFIX = "-mini"


def base_name(net) -> str:
    """The name of the full-size network: results of a simulator-sized copy ("cifar10-mini") file under it."""
    name = net if isinstance(net, str) else net.name
    return name.removesuffix(SCALED_SUFFIX)


@dataclass(frozen=True)
class Net:
    """A network: its input shape (C, H, W), its layers, and how its report and data are chosen."""

    name: str
    input_shape: tuple[int, int, int]
    layers: tuple[Layer, ...]
    dataset: str
    report: str  # "cifar" (per-layer report, Net Accuracy) or "ece408" (Op Time / Correctness)
    workloads: tuple[int, ...] = ()
    classes: tuple[str, ...] = field(default=())
    default_images: int = 0  # what `labkit run` uses when no count is given
    #: how ``labkit.data.to_input`` turns stored uint8 images into this net's input: "" for the dataset's own
    #: preparation (cifar10: byte/255 - 0.5; fashion: byte/255, bilinear with clamped edges), "ece408" for the
    #: ECE408 project's (skimage-style bilinear resize with zeros outside the image, truncated to uint8, 0..255)
    input_prep: str = ""
    #: the net whose stage variants this one runs: the same layer stack at other sizes ("" for none). ECE408's model
    #: is Fashion's stack, so every stage's fashion kernels run it (``Variant.runs_on``, ``labkit bench --nets``)
    kernels_of: str = ""

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r}; its layers are: {', '.join(self.layer_names)}")

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def index(self, name: str) -> int:
        return self.layer_names.index(self.layer(name).name)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Output shape (without the batch axis) of every layer, in order."""
        shapes: dict[str, tuple[int, ...]] = {}
        shape: tuple[int, ...] = tuple(self.input_shape)
        for layer in self.layers:
            shape = layer_output_shape(layer, shape)
            shapes[layer.name] = shape
        return shapes

    def input_shape_of(self, name: str) -> tuple[int, ...]:
        """Shape (without batch) that layer ``name`` receives."""
        i = self.index(name)
        return tuple(self.input_shape) if i == 0 else self.shapes()[self.layers[i - 1].name]

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every weight array, keyed as in the npz files."""
        out: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            if not layer.has_weights:
                continue
            in_shape = self.input_shape_of(layer.name)
            if layer.kind == "conv":
                out[f"{layer.name}.weight"] = (layer.out, in_shape[0], layer.kernel, layer.kernel)
            else:
                out[f"{layer.name}.weight"] = (layer.out, int(np.prod(in_shape)))
            if layer.bias:
                out[f"{layer.name}.bias"] = (layer.out,)
        return out

    @property
    def conv_layers(self) -> list[str]:
        return [layer.name for layer in self.layers if layer.kind == "conv"]

    def scaled(self, input_hw: tuple[int, int], max_channels: int | None = None) -> "Net":
        """A smaller copy of this net (same layer kinds, kernels, pads and strides) for the CUDA simulator:
        a smaller input and, optionally, at most ``max_channels`` maps per conv layer. fc input sizes follow."""
        layers = []
        for layer in self.layers:
            if layer.kind == "conv" and max_channels:
                layer = Layer(layer.name, layer.kind, min(layer.out, max_channels), layer.kernel, layer.pad,
                              layer.stride, layer.bias)
            layers.append(layer)
        c = self.input_shape[0]
        net = Net(self.name + SCALED_SUFFIX, (c, *input_hw), tuple(layers), self.dataset, self.report, (), self.classes,
                  default_images=2, input_prep=self.input_prep, kernels_of=self.kernels_of)
        if any(d < 1 for shape in net.shapes().values() for d in shape):
            raise ValueError(f"input {input_hw} is too small for {self.name}: some layer would have no output")
        return net

    def describe(self) -> str:
        lines = [f"{self.name}: input {'x'.join(map(str, self.input_shape))}"]
        for layer, shape in zip(self.layers, self.shapes().values()):
            extra = ""
            if layer.kind == "conv":
                extra = f" {layer.out}@{layer.kernel}x{layer.kernel} pad {layer.pad} stride {layer.stride}"
                extra += "" if layer.bias else " no bias"
            elif layer.kind == "pool":
                extra = f" {layer.kernel}x{layer.kernel}/{layer.stride}"
            elif layer.kind == "fc":
                extra = f" ->{layer.out}"
            lines.append(f"  {layer.name:<8} {layer.kind:<8}{extra:<28} -> {'x'.join(map(str, shape))}")
        return "\n".join(lines)


def layer_output_shape(layer: Layer, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape a layer produces from an input of ``shape`` (no batch axis)."""
    if layer.kind == "conv":
        c, h, w = shape
        ho = (h + 2 * layer.pad - layer.kernel) // layer.stride + 1
        wo = (w + 2 * layer.pad - layer.kernel) // layer.stride + 1
        return (layer.out, ho, wo)
    if layer.kind == "pool":
        c, h, w = shape
        return (c, (h - layer.kernel) // layer.stride + 1, (w - layer.kernel) // layer.stride + 1)
    if layer.kind == "flatten":
        return (int(np.prod(shape)),)
    if layer.kind == "fc":
        return (layer.out,)
    return tuple(shape)  # relu, tanh, softmax keep the shape


def _conv_block(i: int, out: int, act: str, pad: int, bias: bool, pool: bool) -> list[Layer]:
    layers = [Layer(f"conv{i}", "conv", out=out, kernel=5, pad=pad, bias=bias), Layer(f"{act}{i}", act)]
    if pool:
        layers.append(Layer(f"pool{i}", "pool", kernel=2, stride=2))
    return layers


CIFAR10 = Net(
    name="cifar10",
    input_shape=(3, 32, 32),
    layers=tuple(
        _conv_block(1, 16, "relu", 2, True, True)
        + _conv_block(2, 20, "relu", 2, True, True)
        + _conv_block(3, 20, "relu", 2, True, True)
        + [Layer("flatten", "flatten"), Layer("fc", "fc", out=10), Layer("softmax", "softmax")]
    ),
    dataset="cifar10",
    report="cifar",
    workloads=(1200, 50000),
    default_images=1200,
    classes=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
)

def _ece408_layers(conv1: int, conv2: int, fc1: int) -> tuple[Layer, ...]:
    """The ECE408 project's layer stack (conv, tanh, pool, conv, fc, tanh, fc), with its channel and feature counts."""
    return (
        Layer("conv1", "conv", out=conv1, kernel=5, pad=0, bias=False),
        Layer("tanh1", "tanh"),
        Layer("pool1", "pool", kernel=2, stride=2),
        Layer("conv2", "conv", out=conv2, kernel=5, pad=0, bias=False),
        Layer("flatten", "flatten"),
        Layer("fc1", "fc", out=fc1),
        Layer("tanh2", "tanh"),
        Layer("fc2", "fc", out=10),
        Layer("softmax", "softmax"),
    )


FASHION = Net(
    name="fashion",
    input_shape=(1, 70, 70),
    layers=_ece408_layers(12, 24, 160),
    dataset="fashion",
    report="ece408",
    workloads=(100, 1000, 10000),
    default_images=10000,
    classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"),
)

# The ECE408 Spring 2019 project's own trained model (MXNet, layers new0/new1/fullyconnected0/fullyconnected1):
# Fashion's stack, smaller, on 48x48 inputs. The kit ships no weights for it (they are the course's):
# labkit.weights_io.load_mxnet_params imports its .params.
ECE408 = replace(FASHION, name="ece408", input_shape=(1, 48, 48), layers=_ece408_layers(6, 16, 140),
                 input_prep="ece408", kernels_of="fashion")

NETS = {net.name: net for net in (CIFAR10, FASHION, ECE408)}


def get_net(net: str | Net) -> Net:
    if isinstance(net, Net):
        return net
    try:
        return NETS[net]
    except KeyError:
        raise ValueError(f"unknown network {net!r}; choose one of: {', '.join(NETS)}") from None


# ------------------------------------------------------------------------------------------------ cost

FLOAT_BYTES = 4


@dataclass(frozen=True)
class Cost:
    """What one layer must do for a batch: floating-point operations (a multiply-add counts 2) and the fewest
    bytes it must move through device memory (each input, weight and output element once, float32)."""

    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOP per byte: where the layer sits on a roofline."""
        return self.flops / self.bytes if self.bytes else 0.0


def layer_cost(net: Net, name: str, batch: int = 1) -> Cost:
    """FLOPs and minimum bytes of layer ``name`` for ``batch`` images, from the spec alone."""
    layer = net.layer(name)
    in_shape = net.input_shape_of(name)
    out_shape = net.shapes()[name]
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(out_shape))
    params = sum(int(np.prod(s)) for k, s in net.weight_shapes().items() if k.startswith(f"{name}."))
    if layer.kind == "conv":
        terms = in_shape[0] * layer.kernel * layer.kernel  # multiply-adds per output element
        flops = n_out * (2 * terms + (1 if layer.bias else 0))
    elif layer.kind == "fc":
        flops = n_out * (2 * n_in + (1 if layer.bias else 0))
    elif layer.kind == "pool":
        flops = n_out * (layer.kernel * layer.kernel - 1)  # comparisons
    elif layer.kind == "softmax":
        flops = 4 * n_out  # max, subtract, exp, divide (the sum adds one more per element)
    elif layer.kind in ("relu", "tanh"):
        flops = n_out
    else:  # flatten: a reshape, no work
        return Cost(0, 0)
    return Cost(batch * flops, FLOAT_BYTES * (batch * (n_in + n_out) + params))


def net_cost(net: Net, batch: int = 1) -> dict[str, Cost]:
    """``layer_cost`` of every layer that does work, in the net's order."""
    return {layer.name: layer_cost(net, layer.name, batch) for layer in net.layers if layer.kind != "flatten"}
