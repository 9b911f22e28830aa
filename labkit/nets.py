"""Network specs and weights I/O.

A network is a declarative list of layers, so the reference forward pass, the self-checks, the timing report
and the grader work for any spec, not only the two the kit ships. Shapes are NCHW float32 everywhere;
conv weights are ``[M, C, K, K]`` (out, in, row, col) and fc weights ``[out, in]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WEIGHTS_DIR = Path(__file__).with_name("weights")

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
                  default_images=2)
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

FASHION = Net(
    name="fashion",
    input_shape=(1, 70, 70),
    layers=(
        Layer("conv1", "conv", out=12, kernel=5, pad=0, bias=False),
        Layer("tanh1", "tanh"),
        Layer("pool1", "pool", kernel=2, stride=2),
        Layer("conv2", "conv", out=24, kernel=5, pad=0, bias=False),
        Layer("flatten", "flatten"),
        Layer("fc1", "fc", out=160),
        Layer("tanh2", "tanh"),
        Layer("fc2", "fc", out=10),
        Layer("softmax", "softmax"),
    ),
    dataset="fashion",
    report="ece408",
    workloads=(100, 1000, 10000),
    default_images=10000,
    classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
             "Ankle boot"),
)

NETS = {net.name: net for net in (CIFAR10, FASHION)}


def get_net(net: str | Net) -> Net:
    if isinstance(net, Net):
        return net
    try:
        return NETS[net]
    except KeyError:
        raise ValueError(f"unknown network {net!r}; choose one of: {', '.join(NETS)}") from None


# --------------------------------------------------------------------------------------------------- weights


def validate_weights(net: Net, weights: dict[str, np.ndarray], source: str = "weights") -> dict[str, np.ndarray]:
    """Check keys and shapes against the spec; return float32 contiguous copies."""
    expected = net.weight_shapes()
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{source} do not fit network {net.name!r}: missing {missing or 'none'}, unexpected {extra or 'none'}. "
            f"Expected keys: {', '.join(expected)}"
        )
    out = {}
    for key, shape in expected.items():
        arr = np.asarray(weights[key])
        if arr.shape != shape:
            raise ValueError(f"{source}: {key} has shape {arr.shape}, network {net.name!r} needs {shape}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{source}: {key} has dtype {arr.dtype}; weights must be floating point")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{source}: {key} holds NaN or infinite values")
        out[key] = arr
    return out


def shipped_weights_path(net: str | Net) -> Path:
    return WEIGHTS_DIR / f"{get_net(net).name}.npz"


def load_weights(net: str | Net, path: str | Path | None = None) -> dict[str, np.ndarray]:
    """Load weights for ``net`` as float32: the kit's shipped file by default, an ``.npz``, or a folder of
    the C study's text files (``layer1_conv.txt`` ...). float16-stored layers are upcast here, so every
    figure the kit computes comes from the weights as loaded."""
    net = get_net(net)
    path = Path(path) if path is not None else shipped_weights_path(net)
    if path.is_dir():
        return load_c_study_weights(path, net)
    if not path.exists():
        raise FileNotFoundError(
            f"no weights at {path}. Pass an .npz file or a folder with the C study's layerN_*.txt files"
            + ("; the shipped weights are made by `python tools/train_weights.py`" if path.parent == WEIGHTS_DIR
               else "")
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            weights = {k: data[k] for k in data.files if not k.startswith("_")}
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a readable .npz weights file ({exc})") from None
    return validate_weights(net, weights, source=str(path))


def save_weights(path: str | Path, net: str | Net, weights: dict[str, np.ndarray],
                 float16_above: int | None = None) -> Path:
    """Save weights as ``.npz``; arrays with more than ``float16_above`` elements are stored as float16."""
    net = get_net(net)
    weights = validate_weights(net, weights)
    stored = {}
    for key, arr in weights.items():
        if float16_above is not None and arr.size > float16_above:
            arr = arr.astype(np.float16)
        stored[key] = arr
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **stored)
    return path


def random_weights(net: str | Net, seed: int = 0) -> dict[str, np.ndarray]:
    """He-scaled random weights: for tests and for running without trained weights."""
    net = get_net(net)
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in net.weight_shapes().items():
        if key.endswith(".bias"):
            out[key] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[key] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return out


def weights_info(net: str | Net) -> dict:
    """The record written beside the shipped weights (recipe, seed, accuracy), or {} if absent."""
    path = shipped_weights_path(net).with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------------------- the C study's text format

C_STUDY_FILES = {"conv1": "layer1_conv.txt", "conv2": "layer4_conv.txt", "conv3": "layer7_conv.txt",
                 "fc": "layer10_fc.txt"}


def _read_numbers(path: Path) -> np.ndarray:
    try:
        return np.array(path.read_text().split(), dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{path}: not a whitespace-separated list of numbers ({exc})") from None


def read_c_conv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One conv file: header ``K K D F``, weights in order (filter, x, y, depth), then F biases."""
    path = Path(path)
    nums = _read_numbers(path)
    if nums.size < 4:
        raise ValueError(f"{path}: too short for a conv layer file (need the header 'K K D F')")
    k1, k2, d, f = (int(v) for v in nums[:4])
    if k1 != k2:
        raise ValueError(f"{path}: header says a {k1}x{k2} kernel; only square kernels are supported")
    n = k1 * k2 * d * f
    if nums.size != 4 + n + f:
        raise ValueError(f"{path}: header '{k1} {k2} {d} {f}' needs {n} weights + {f} biases, "
                         f"file holds {nums.size - 4} numbers")
    w = nums[4:4 + n].reshape(f, k1, k1, d).transpose(0, 3, 2, 1)  # (f, x, y, d) -> (f, d, y, x)
    return np.ascontiguousarray(w, dtype=np.float32), nums[4 + n:].astype(np.float32)


def read_c_fc(path: str | Path, in_shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The fc file: header ``IN OUT``, weights (output, row, column, depth), then OUT biases.
    The C code flattens its input as H,W,C; the kit flattens C,H,W, so the columns are permuted here."""
    path = Path(path)
    nums = _read_numbers(path)
    c, h, w = in_shape
    n_in, n_out = (int(v) for v in nums[:2])
    if n_in != c * h * w:
        raise ValueError(f"{path}: header says {n_in} inputs, the network's fc layer takes {c}x{h}x{w}={c*h*w}")
    if nums.size != 2 + n_in * n_out + n_out:
        raise ValueError(f"{path}: header '{n_in} {n_out}' needs {n_in * n_out} weights + {n_out} biases, "
                         f"file holds {nums.size - 2} numbers")
    wt = nums[2:2 + n_in * n_out].reshape(n_out, h, w, c).transpose(0, 3, 1, 2).reshape(n_out, n_in)
    return np.ascontiguousarray(wt, dtype=np.float32), nums[2 + n_in * n_out:].astype(np.float32)


def load_c_study_weights(folder: str | Path, net: str | Net = "cifar10") -> dict[str, np.ndarray]:
    """Import the original C/OpenACC study's text weights (``layer1_conv.txt`` ... ``layer10_fc.txt``)."""
    net = get_net(net)
    folder = Path(folder)
    if net.name != "cifar10":
        raise ValueError(f"the C study's text weights describe the cifar10 network, not {net.name!r}")
    missing = [name for name in C_STUDY_FILES.values() if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}; a C-study weights folder holds "
                                f"{', '.join(C_STUDY_FILES.values())}")
    weights = {}
    for layer, fname in C_STUDY_FILES.items():
        if layer == "fc":
            w, b = read_c_fc(folder / fname, net.input_shape_of("flatten"))
        else:
            w, b = read_c_conv(folder / fname)
        weights[f"{layer}.weight"], weights[f"{layer}.bias"] = w, b
    return validate_weights(net, weights, source=str(folder))
