"""Weights files: the kit's shipped ``.npz`` files (float16-stored large layers upcast on load), any ``.npz`` that
fits a spec, the original C study's text format, and the ECE408 project's MXNet ``.params`` file. Every figure the
kit computes comes from weights as loaded here.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from .data import search_roots
from .nets import Net, get_net

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"  # labkit/weights/

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
    """Load weights for ``net`` as float32: the kit's shipped file by default, an ``.npz``, a folder of
    the C study's text files (``layer1_conv.txt`` ...), or an MXNet ``.params`` file (``ece408``). float16-stored
    layers are upcast here, so every figure the kit computes comes from the weights as loaded. A net whose weights
    the kit does not ship (``NOT_SHIPPED``: ece408) loads, when no path is given, the course's file from the data
    search roots (``course_weights``), else raises FileNotFoundError with its ``NOT_SHIPPED`` line."""
    net = get_net(net)
    if path is None and net.name in NOT_SHIPPED:
        path = course_weights(net.name)
        if path is None:
            raise FileNotFoundError(NOT_SHIPPED[net.name])
    path = Path(path) if path is not None else shipped_weights_path(net)
    if path.is_dir():
        if net.name != "cifar10":  # the C study's text weights are cifar10's: a folder can hold nothing else
            raise FileNotFoundError(_folder_hint(path, net))
        return load_c_study_weights(path, net)
    if path.suffix == ".params" and path.is_file():
        return load_mxnet_params(path, net)
    if not path.exists():
        raise FileNotFoundError(
            f"no weights at {path}. Pass an .npz file, a folder with the C study's layerN_*.txt files, or (ece408) "
            f"the ECE408 project's .params file"
            + ("; the shipped weights are made by `python tools/train_weights.py`" if path.parent == WEIGHTS_DIR
               else "")
        )
    not_npz = _not_npz(path)
    if not_npz:
        raise ValueError(not_npz)
    try:
        with np.load(path, allow_pickle=False) as data:
            weights = {k: data[k] for k in data.files if not k.startswith("_")}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        # never pass on numpy's advice to load with allow_pickle: a weights file holds plain arrays
        why = "it holds Python objects, not plain arrays" if "pickle" in str(exc) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{path} is not a readable .npz weights file ({why}); pass the file again (a complete "
                         f"copy), or leave --weights out to use the kit's own") from None
    return validate_weights(net, weights, source=str(path))


_WEIGHTS_KINDS = "an .npz file, a folder of the C study's layerN_*.txt files (cifar10), or the ECE408 .params file"


def _not_npz(path: Path) -> str:
    """Why ``path`` is not an .npz file, from its first bytes (an .npz is a zip archive), or "" when it may be one.
    Said before numpy reads it: numpy takes anything else for pickled data and advises loading it unsafely."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if head.startswith(b"PK"):
        return ""
    if head.startswith(b"\x93NUMPY"):
        what = "a single .npy array; weights are an .npz of named arrays (numpy.savez)"
    elif head.lstrip()[:1] in (b"{", b"["):
        try:
            doc = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            doc = None
        if isinstance(doc, dict) and "nodes" in doc and "arg_nodes" in doc:
            params = sorted(path.parent.glob("*.params"))
            where = f" ({params[0]} beside it)" if params else ""
            return (f"{path} is an MXNet symbol file: the network's structure, no weights. The weights are in the "
                    f".params file saved with it{where}: pass that with --net ece408")
        what = "a JSON file"
    elif b"\0" not in head[:1024]:
        what = "a text file"
    else:
        what = "a file of another kind"
    return f"{path} is not an .npz weights file: it is {what}. Pass {_WEIGHTS_KINDS}"


def _folder_hint(folder: Path, net: Net) -> str:
    """What to pass instead of a folder, for a net whose weights are one file."""
    files = sorted([*folder.glob("*.params"), *folder.glob("*.npz")])
    if files:
        return f"{folder} is a folder: for --net {net.name} pass the weights file in it, e.g. {files[0]}"
    one = "the ECE408 project's .params file" if net.name == "ece408" else "an .npz file"
    return f"{folder} is a folder and holds no weights file (.npz or .params): for --net {net.name} pass {one}"


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
        files = sorted([*folder.glob("*.params"), *folder.glob("*.npz")])
        other = f" (it holds {files[0].name}: pass that file itself)" if files else ""
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}; a C-study weights folder holds "
                                f"{', '.join(C_STUDY_FILES.values())}{other}")
    weights = {}
    for layer, fname in C_STUDY_FILES.items():
        if layer == "fc":
            w, b = read_c_fc(folder / fname, net.input_shape_of("flatten"))
        else:
            w, b = read_c_conv(folder / fname)
        weights[f"{layer}.weight"], weights[f"{layer}.bias"] = w, b
    return validate_weights(net, weights, source=str(folder))


# ------------------------------------------------------------------------ the ECE408 project's MXNet .params

#: nets whose trained weights the kit does not ship, and where to get them (one line, the error without them)
NOT_SHIPPED = {
    "ece408": ("labkit ships no weights for ece408 (the ECE408 course's trained model, licence unknown) and found "
               "none: it looks for ece408-model/ece408-sp19-0002.params (the course data folder's copy) under the "
               "data search roots ($LABKIT_DATA, the repository's data/, the user cache). Get "
               "models/ece408-0002.params from github.com/illinois-impact/ece408_mxnet_docker (branch 2019sp) and save "
               "it as that file, or load it with --weights PATH/ece408-sp19-0002.params (weights=PATH in Python)"),
}

#: where the course's data folder keeps the weights the kit does not ship (under a data search root)
COURSE_WEIGHTS = {"ece408": "ece408-model/ece408-sp19-0002.params"}


def course_weights(net: str) -> Path | None:
    """The course's weights file for ``net`` (``COURSE_WEIGHTS``) in the first data search root that has it
    (``labkit.data.search_roots``: $LABKIT_DATA, the repository's data/, the user cache), or None."""
    rel = COURSE_WEIGHTS.get(net)
    if rel is None:
        return None
    return next((root / rel for _, root in search_roots() if (root / rel).is_file()), None)


#: MXNet argument names of each importable net -> the kit's weight keys
MXNET_NAMES = {
    "ece408": {"new0_weight": "conv1.weight", "new1_weight": "conv2.weight",
               "fullyconnected0_weight": "fc1.weight", "fullyconnected0_bias": "fc1.bias",
               "fullyconnected1_weight": "fc2.weight", "fullyconnected1_bias": "fc2.bias"},
}

MXNET_LIST_MAGIC = 0x112  # kMXAPINDArrayListMagic
MXNET_NDARRAY_MAGIC = 0xF993FAC9  # NDARRAY_V2_MAGIC
MXNET_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<f8"), 2: np.dtype("<f2")}  # mshadow type flags


class _Reader:
    """Little-endian reads from a byte string; running past the end is one clear error."""

    def __init__(self, blob: bytes, source: str):
        self.blob, self.pos, self.source = blob, 0, source

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.blob):
            raise ValueError(f"{self.source} is truncated: it ends at byte {len(self.blob)} while reading {what} "
                             f"(at byte {self.pos}, {n} bytes); fetch the .params file again")
        out = self.blob[self.pos:self.pos + n]
        self.pos += n
        return out

    def num(self, fmt: str, what: str) -> int:
        dt = np.dtype(fmt)
        return int(np.frombuffer(self.take(dt.itemsize, what), dt)[0])


def read_mxnet_params(path: str | Path) -> dict[str, np.ndarray]:
    """An MXNet NDArray list file (``mx.nd.save``, e.g. ``model-0002.params``) as {name: array}, names as stored
    (``arg:new0_weight``). Dense arrays of float32/float64/float16 only. Format (little-endian): uint64 0x112,
    uint64 0, uint64 count; per array uint32 0xF993FAC9, int32 storage type (0 dense), uint32 ndim, int64
    dims[ndim], int32 dev_type, int32 dev_id, int32 dtype, raw data; then uint64 count and per name uint64 length
    and its bytes."""
    path = Path(path)
    src = str(path)
    r = _Reader(path.read_bytes(), src)
    if len(r.blob) < 24 or r.num("<u8", "the header") != MXNET_LIST_MAGIC:
        raise ValueError(f"{src} is not an MXNet NDArray list (.params) file: it does not start with the list "
                         f"magic 0x112 (mx.nd.save writes it)")
    if r.num("<u8", "the header") != 0:
        raise ValueError(f"{src}: the reserved header field of an MXNet .params file must be 0; not an NDArray list")
    count = r.num("<u8", "the array count")
    if count > len(r.blob) // 32:  # each array takes at least 32 bytes (header, context, dtype, name length)
        raise ValueError(f"{src} is truncated, or not an MXNet .params file: its header promises {count} arrays in "
                         f"{len(r.blob)} bytes")
    arrays = []
    for i in range(count):
        what = f"array {i}"
        magic = r.num("<u4", f"{what}'s magic")
        if magic != MXNET_NDARRAY_MAGIC:
            raise ValueError(f"{src}: {what} starts with 0x{magic:X}, not the NDArray magic 0x{MXNET_NDARRAY_MAGIC:X} "
                             f"(only MXNet's v2 dense format is read)")
        stype = r.num("<i4", f"{what}'s storage type")
        if stype != 0:
            raise ValueError(f"{src}: {what} has storage type {stype} (sparse); only dense arrays (0) are read")
        ndim = r.num("<u4", f"{what}'s ndim")
        if ndim == 0 or ndim > 32:
            raise ValueError(f"{src}: {what} claims {ndim} dimensions; not a model's weights (an empty NDArray, or "
                             f"not an NDArray list file)")
        shape = tuple(r.num("<i8", f"{what}'s shape") for _ in range(ndim))
        if any(d < 0 for d in shape):
            raise ValueError(f"{src}: {what} has shape {shape} with a negative size; not an NDArray list file")
        r.take(8, f"{what}'s context")  # dev_type, dev_id: where it lived, irrelevant here
        flag = r.num("<i4", f"{what}'s dtype")
        if flag not in MXNET_DTYPES:
            raise ValueError(f"{src}: {what} has dtype flag {flag}; only float32 (0), float64 (1) and float16 (2) "
                             f"are read")
        dt = MXNET_DTYPES[flag]
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        raw = r.take(size * dt.itemsize, f"{what}'s {size} values")
        arrays.append(np.frombuffer(raw, dt).reshape(shape))
    n_names = r.num("<u8", "the name count")
    if n_names != count:
        raise ValueError(f"{src}: {count} arrays but {n_names} names; the kit needs every array named")
    names = []
    for i in range(n_names):
        length = r.num("<u8", f"name {i}'s length")
        raw = r.take(length, f"name {i}")
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"{src}: name {i} is not UTF-8 text; not an NDArray list file") from None
    if r.pos != len(r.blob):
        raise ValueError(f"{src}: {len(r.blob) - r.pos} stray bytes after the last name; not a complete .params file")
    if len(set(names)) != len(names):
        raise ValueError(f"{src}: a name appears twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return dict(zip(names, arrays))


def load_mxnet_params(path: str | Path, net: str | Net = "ece408") -> dict[str, np.ndarray]:
    """Import an MXNet ``.params`` file (the ECE408 project's ``ece408-0002.params``) as the kit's weights,
    float32, checked against the spec. Names map as ``MXNET_NAMES`` says (``arg:new0_weight`` -> ``conv1.weight``
    ...); MXNet's layouts are the kit's (conv [M, C, K, K], fc [out, in], flatten C,H,W), so nothing is permuted."""
    net = get_net(net)
    path = Path(path)
    if net.name not in MXNET_NAMES:
        raise ValueError(f"{path}: an MXNet .params file can be imported for {', '.join(MXNET_NAMES)} only, "
                         f"not {net.name!r}")
    names = MXNET_NAMES[net.name]
    stored = read_mxnet_params(path)
    plain = {plain_name(k): v for k, v in stored.items()}
    unexpected = sorted(k for k in stored if plain_name(k) not in names)
    missing = sorted(set(names) - set(plain))
    if unexpected or missing:
        raise ValueError(f"{path} does not hold the {net.name} model: unexpected arrays {unexpected or 'none'}, "
                         f"missing {['arg:' + m for m in missing] or 'none'}")
    expected = net.weight_shapes()
    weights = {}
    for mx_name, key in names.items():
        arr = plain[mx_name]
        if arr.shape != expected[key]:
            raise ValueError(f"{path}: arg:{mx_name} has shape {arr.shape}; {net.name}'s {key} needs {expected[key]}")
        weights[key] = arr
    return validate_weights(net, weights, source=str(path))


def plain_name(name: str) -> str:
    """An MXNet array name without its ``arg:``/``aux:`` prefix."""
    return name.split(":", 1)[1] if name.startswith(("arg:", "aux:")) else name
