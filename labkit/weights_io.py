"""Weights files: the kit's shipped ``.npz`` files (float16-stored large layers upcast on load), any ``.npz`` that
fits a spec, and the original C study's text format. Every figure the kit computes comes from weights as loaded here.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from .nets import Net, get_net

WEIGHTS_DIR = Path(__file__).with_name("weights")

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
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable .npz weights file ({type(exc).__name__}: {exc}); pass the file "
                         f"again (a complete copy), or leave --weights out to use the kit's own") from None
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
