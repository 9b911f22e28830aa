"""Datasets: registry (official URLs and md5 sums), lookup, download, loaders, and network-ready inputs.

Lookup order for a dataset's folder: ``$LABKIT_DATA``, then ``data/`` in the repository, then the user cache.
Each root is laid out like the extracted archives: ``cifar-10-batches-bin/data_batch_1.bin`` and
``fashion-mnist/t10k-images-idx3-ubyte.gz``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..outputs import OutputError, writable_folder
from .datasets import CIFAR_RECORD, DATASETS, Dataset, Remote  # noqa: F401 - data.DATASETS, as before
from .nets import Net, get_net
from .resize import bilinear_matrix, resize_bilinear, resize_constant_uint8  # noqa: F401 - data.resize_bilinear

REPO_DATA = Path(__file__).resolve().parents[2] / "data"


class DataError(Exception):
    """Data missing, truncated or corrupt: the message says what and what to do."""


class DataNotFound(DataError, FileNotFoundError):
    pass


def get_dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def _pooch():
    """pooch, imported quietly: it imports tqdm.auto, which warns in a notebook without ipywidgets (and then
    falls back to the plain text bar, which is all we need)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import pooch
    return pooch


def user_cache() -> Path:
    return Path(_pooch().os_cache("labkit"))


def data_env() -> Path | None:
    """The folder ``$LABKIT_DATA`` names, or None when it is unset."""
    value = os.environ.get("LABKIT_DATA", "").strip()
    return Path(value).expanduser() if value else None


def root_state(root: Path) -> str:
    """Why a search root holds nothing, when it is not a folder: "does not exist", "is a file, not a folder";
    "" for a folder."""
    return "" if root.is_dir() else "is a file, not a folder" if root.exists() else "does not exist"


def env_problem() -> str:
    """What is wrong with ``$LABKIT_DATA`` and what to do, or "" when it is unset or a folder."""
    env = data_env()
    if env is None or env.is_dir():
        return ""
    if env.exists():
        return (f"LABKIT_DATA={env} is a file, not a folder: point it at the folder that holds the data sets "
                f"(cifar-10-batches-bin/, fashion-mnist/)")
    return f"LABKIT_DATA={env} does not exist: fix the variable, or create the folder"


def search_roots() -> list[tuple[str, Path]]:
    """Where datasets are looked for, in order, each with the reason it is searched."""
    roots = []
    if data_env() is not None:
        roots.append(("$LABKIT_DATA", data_env()))
    roots.append(("repository data/", REPO_DATA))
    roots.append(("user cache", user_cache()))
    return roots


_ROOT_NAMES = {"$LABKIT_DATA": "$LABKIT_DATA", "repository data/": "data", "user cache": "<user cache>"}


def shown(path: str | Path) -> str:
    """A data path as outputs show it: relative to the search root it lies under (``$LABKIT_DATA/fashion-mnist``),
    so stored notebook outputs and reports never carry one machine's absolute paths."""
    path = Path(path)
    for label, root in search_roots():
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        return f"{_ROOT_NAMES[label]}/{rel.as_posix()}" if str(rel) != "." else _ROOT_NAMES[label]
    return str(path)


def default_download_root() -> Path:
    """``$LABKIT_DATA`` if set, else ``data/`` when running from a checkout, else the user cache."""
    if os.environ.get("LABKIT_DATA"):
        return Path(os.environ["LABKIT_DATA"]).expanduser()
    if (REPO_DATA.parent / "pyproject.toml").exists():
        return REPO_DATA
    return user_cache()


def find(name: str, file: str | None = None) -> Path:
    """The folder holding dataset ``name`` (``file`` in it, if given; else any of its files: a partial copy counts),
    or one clear error."""
    ds = get_dataset(name)
    need = file or next(iter(ds.files))
    looked = []
    for label, root in search_roots():
        folder = root / ds.folder
        if (folder / need).is_file() or (file is None and any((folder / f).is_file() for f in ds.files)):
            return folder
        looked.append(f"{folder} ({label}{', which ' + root_state(root) if root_state(root) else ''})")
    hint = f" {env_problem()}." if env_problem() else ""
    raise DataNotFound(
        f"{name}: {need} not found. Looked in: {'; '.join(looked)}.{hint} "
        f"Fetch it with `{ds.fetch_hint}` (needs internet), or point LABKIT_DATA at a folder that holds "
        f"{ds.folder}/."
    )


def find_folder(folder: str) -> Path | None:
    """A folder of other reference files (e.g. ``cnn-cifar10-weights``) in the first search root that has it."""
    for _, root in search_roots():
        if (root / folder).is_dir():
            return root / folder
    return None


def available(name: str) -> bool:
    try:
        find(name)
        return True
    except DataNotFound:
        return False


# -------------------------------------------------------------------------------------------- download


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, root: str | Path | None = None, progress: bool = True,
          remotes: tuple[Remote, ...] | None = None) -> Path:
    """Download dataset ``name`` (pooch: md5-checked, with a progress bar) into ``root`` and return its folder.

    ``remotes`` overrides the registry's URLs (tests serve an archive from 127.0.0.1). A bad checksum raises
    DataError and leaves no partial files behind.
    """
    pooch = _pooch()
    ds = get_dataset(name)
    if root is None and env_problem():
        problem, _, todo = env_problem().partition(": ")
        raise DataError(f"{problem}, so there is nowhere to download {name} to: {todo}; or pass --root")
    root = Path(root) if root is not None else default_download_root()

    try:
        writable_folder(root, "the download folder")
    except OutputError as exc:
        raise DataError(f"{exc} (--root, or LABKIT_DATA, says where data goes)") from None
    folder = root / ds.folder
    if all((folder / f).is_file() for f in ds.files):
        return folder
    remotes = remotes or ds.remotes
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        fetched = []
        for remote in remotes:
            fname = remote.url.rstrip("/").rsplit("/", 1)[-1]
            try:
                fetched.append(Path(pooch.retrieve(remote.url, known_hash=f"md5:{remote.md5}", fname=fname,
                                                   path=tmp, progressbar=progress)))
            except ValueError as exc:  # pooch: hash mismatch
                raise DataError(f"{name}: download of {remote.url} failed its checksum ({exc}). Nothing was "
                                f"kept; try again, or download it by hand and check its md5 {remote.md5}.") from None
            except Exception as exc:  # network errors come in many types (requests, urllib3, OSError)
                raise DataError(f"{name}: could not download {remote.url}: {exc.__class__.__name__}: {exc}. "
                                f"Check the connection, or copy the data into {root}/{ds.folder}/ by hand.") from None
        staged = tmp / "staged"
        if ds.archive:
            with tarfile.open(fetched[0]) as tar:
                tar.extractall(staged, filter="data")
            src = staged / ds.folder
            if not src.is_dir():
                raise DataError(f"{name}: the archive from {remotes[0].url} holds no {ds.folder}/ folder")
        else:
            src = staged / ds.folder
            src.mkdir(parents=True)
            for path in fetched:
                shutil.move(str(path), src / path.name)
        folder.mkdir(parents=True, exist_ok=True)
        for item in src.iterdir():
            os.replace(item, folder / item.name)  # same file system: atomic per file
    return folder


# --------------------------------------------------------------------------------------------- loaders


@dataclass
class Images:
    """A slice of a dataset as stored: uint8 images (N, C, H, W), int64 labels (N,) and where they came from.
    ``labels`` is None for synthetic inputs."""

    images: np.ndarray
    labels: np.ndarray | None
    dataset: str
    split: str
    source: str
    synthetic: bool = False

    def __len__(self) -> int:
        return len(self.images)


@lru_cache(maxsize=None)
def _checked(path: Path, size: int, mtime: float) -> None:
    """Verify a complete official file against its md5 once per process (partial files cannot be)."""
    ds = next(d for d in DATASETS.values() if path.name in d.files)
    expected = ds.files[path.name]
    if expected and _md5(path) != expected:
        raise DataError(f"{path} fails its checksum (md5 {expected} expected): the file is corrupt. Delete it and "
                        f"run `{ds.fetch_hint}` again.")


def _verify(path: Path, complete: bool = True) -> None:
    if complete:
        st = path.stat()
        _checked(path, st.st_size, st.st_mtime)


def cifar_batch_files(split: str) -> list[str]:
    if split == "train":
        return [f"data_batch_{i}.bin" for i in range(1, 6)]
    if split == "test":
        return ["test_batch.bin"]
    raise ValueError(f"CIFAR-10 split must be 'train' or 'test', not {split!r}")


def read_cifar_batch(path: str | Path, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch file: (uint8 images N x 3 x 32 x 32, int64 labels). Partial files are fine."""
    path = Path(path)
    size = path.stat().st_size
    if size % CIFAR_RECORD:
        raise _mid_record(path, size)
    count = size // CIFAR_RECORD
    _verify(path, complete=count == 10000)
    n = count if limit is None else min(limit, count)
    raw = np.fromfile(path, dtype=np.uint8, count=n * CIFAR_RECORD).reshape(n, CIFAR_RECORD)
    labels = raw[:, 0].astype(np.int64)
    if labels.size and labels.max() > 9:
        raise DataError(f"{path}: label byte {labels.max()} is not a CIFAR-10 class (0..9); not a CIFAR-10 binary batch")
    return np.ascontiguousarray(raw[:, 1:].reshape(n, 3, 32, 32)), labels


def _mid_record(path: Path, size: int) -> DataError:
    return DataError(f"{path} is truncated mid-record: {size} bytes is not a multiple of the {CIFAR_RECORD}-byte "
                     f"record ({size // CIFAR_RECORD} whole records, then {size % CIFAR_RECORD} stray bytes). "
                     f"Fetch the file again (labkit data fetch cifar10).")


def _take(n: int | None, have: int, name: str, split: str, where: str, partial: str = "") -> int:
    """``n`` (all ``have`` when None), or one line saying how many there are; ``partial`` names the file that
    ends early."""
    if n is None:
        return have
    if n < 1:
        raise ValueError(f"asked for {n} images; ask for at least 1")
    if have == 0:
        raise DataError(f"asked for {n} {name} {split} images but {where} holds none"
                        + (f" ({partial} is empty)" if partial else "") + ": fetch the data again")
    if n > have:
        raise DataError(f"asked for {n} {name} {split} images but only {have} exist in {where}. Ask for at most "
                        f"{have}" + (f" (this copy of {partial} is partial)" if partial else "") + ".")
    return n


def load_cifar10(n: int | None = None, split: str = "train") -> Images:
    """The first ``n`` images of the CIFAR-10 split, in official order across batch files."""
    files = cifar_batch_files(split)
    folder = find("cifar10", files[0])
    # Official order: the images after a missing or partial batch file are unknown, so count only the batch files
    # up to the first missing one and up to (including) the first partial one.
    # A file truncated mid-record cannot be read at all: refused when the images asked for reach into it.
    paths, have, partial = [], 0, ""
    for f in files:
        if not (folder / f).is_file():
            break
        size = (folder / f).stat().st_size
        if size % CIFAR_RECORD:
            if n is None or n > have:
                raise _mid_record(folder / f, size)
            break
        paths.append(folder / f)
        count = size // CIFAR_RECORD
        have += count
        if count < 10000:
            partial = f
            break
    n = _take(n, have, "CIFAR-10", split, str(folder), partial)
    images, labels, left = [], [], n
    for path in paths:
        if left == 0:
            break
        x, y = read_cifar_batch(path, limit=left)
        images.append(x)
        labels.append(y)
        left -= len(y)
    return Images(np.concatenate(images), np.concatenate(labels), "cifar10", split, shown(folder))


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (gzip or plain): magic 2049 labels (N,) or 2051 images (N, rows, cols), uint8."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (EOFError, gzip.BadGzipFile, OSError) as exc:
        raise DataError(f"{path} is corrupt or truncated ({exc}). Delete it and fetch it again.") from None
    magic = int.from_bytes(data[:4], "big")
    ndim = {2049: 1, 2051: 3}.get(magic)
    if ndim is None:
        raise DataError(f"{path}: magic number {magic} is not an IDX label (2049) or image (2051) file")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    need = int(np.prod(dims))
    if len(data) - start != need:
        raise DataError(f"{path} is truncated: its header promises {need} bytes of data ({dims}), "
                        f"it holds {len(data) - start}. Fetch it again.")
    return np.frombuffer(data, dtype=np.uint8, offset=start).reshape(dims)


def load_fashion(n: int | None = None, split: str = "test") -> Images:
    """The first ``n`` Fashion-MNIST images of the split, as stored (uint8, N x 1 x 28 x 28)."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"Fashion-MNIST split must be 'train' or 'test', not {split!r}")
    img_name, lbl_name = f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"
    folder = find("fashion", img_name)
    for name in (img_name, lbl_name):
        if not (folder / name).is_file():
            raise DataNotFound(f"{folder} has {img_name} but not {name}; run `labkit data fetch fashion`")
        _verify(folder / name)
    images, labels = read_idx(folder / img_name), read_idx(folder / lbl_name)
    if len(images) != len(labels):
        raise DataError(f"{folder}: {len(images)} images but {len(labels)} labels")
    n = _take(n, len(images), "Fashion-MNIST", split, str(folder))
    return Images(np.ascontiguousarray(images[:n, None]), labels[:n].astype(np.int64), "fashion", split,
                  shown(folder))


def load(dataset: str, n: int | None = None, split: str | None = None) -> Images:
    if dataset == "cifar10":
        return load_cifar10(n, split or "train")
    if dataset == "fashion":
        return load_fashion(n, split or "test")
    raise ValueError(f"unknown dataset {dataset!r}; choose one of: {', '.join(DATASETS)}")


def synthetic(net: str | Net, n: int, seed: int = 0) -> Images:
    """Random uint8 images in the dataset's stored shape, for runs without data. No labels."""
    net = get_net(net)
    shape = (3, 32, 32) if net.dataset == "cifar10" else (1, 28, 28)
    rng = np.random.default_rng(seed)
    return Images(rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), None, net.dataset, "synthetic",
                  f"synthetic (numpy seed {seed})", synthetic=True)


# ------------------------------------------------------------------------------------ network inputs

_CIFAR_LUT = (np.arange(256, dtype=np.float64) / 255.0 - 0.5).astype(np.float32)


def to_input(net: str | Net, images: np.ndarray | Images) -> np.ndarray:
    """Network-ready float32 NCHW tensor from stored uint8 images.

    cifar10: pixel = byte/255 - 0.5 (as the original C code). fashion: byte/255, 28x28 -> 70x70 bilinear.
    ece408 (``Net.input_prep == "ece408"``): 28x28 -> 48x48 as the ECE408 project made its inputs
    (``resize_constant_uint8``), the uint8 value 0..255 as float32, no normalisation.
    """
    net = get_net(net)
    x = images.images if isinstance(images, Images) else np.asarray(images)
    if x.dtype != np.uint8:
        raise ValueError(f"to_input expects the stored uint8 images, got {x.dtype}")
    if net.input_prep == "ece408":
        out = [resize_constant_uint8(x[i:i + 2000], net.input_shape[1:]).astype(np.float32)
               for i in range(0, len(x), 2000)]  # bounded memory for 60000 images
        return np.concatenate(out) if out else np.zeros((0, *net.input_shape), np.float32)
    if net.input_prep:
        raise ValueError(f"{net.name}: no input preparation {net.input_prep!r}; known: '' (the dataset's), 'ece408'")
    if net.dataset == "cifar10":
        # as the C code's float = (double)byte / 255.0 - 0.5: one rounding to float32 (float32 arithmetic would
        # round twice and be 1 ulp off for half the byte values)
        return _CIFAR_LUT[x]
    if net.dataset == "fashion":
        out = []
        for i in range(0, len(x), 2000):  # bounded memory for 60000 images
            out.append(resize_bilinear(x[i:i + 2000].astype(np.float32) / np.float32(255.0), net.input_shape[1]))
        return np.concatenate(out) if out else np.zeros((0, *net.input_shape), np.float32)
    raise ValueError(f"no input preparation for dataset {net.dataset!r}")


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(net: str | Net, n: int) -> None:
    """Refuse, in one line, an image count whose network inputs alone would take more than half of the RAM."""
    net = get_net(net)
    if n < 1:
        raise DataError(f"asked for {n} images; ask for at least 1")
    need = n * int(np.prod(net.input_shape)) * 5  # float32 inputs and the stored uint8 images
    ram = physical_memory()
    if ram and need > ram / 2:
        raise DataError(f"{n} images of {net.name} take {need / 1e9:.1f} GB as network inputs, more than half of "
                        f"this machine's {ram / 1e9:.1f} GB: ask for fewer (its workloads are "
                        f"{', '.join(map(str, net.workloads))})")


def load_inputs(net: str | Net, n: int, split: str | None = None) -> tuple[np.ndarray, Images]:
    """``n`` network-ready inputs of the net's workload and the stored images they came from."""
    net = get_net(net)
    images = load(net.dataset, n, split)
    return to_input(net, images), images
