"""labkit.data: registry, lookup order, pooch download (against a local HTTP server), loaders on the real data and on
partial / broken files, and network inputs (normalisation, bilinear resize against independent references)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import socket
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

import labkit.data as data
from labkit.data import (CIFAR_RECORD, DATASETS, DataError, DataNotFound, Images, Remote, bilinear_matrix, fetch,
                         find, load_cifar10, load_fashion, read_cifar_batch, read_idx, resize_bilinear, search_roots,
                         synthetic, to_input)

CIFAR = "cifar-10-batches-bin"
FASHION = "fashion-mnist"
# the official data_batch_1 class counts (the data set README of cifar-10-batches-bin lists them)
BATCH1_CLASS_COUNTS = [1005, 974, 1032, 1016, 999, 937, 1030, 1001, 1025, 981]


# ------------------------------------------------------------------------------------------------ helpers


def cifar_bytes(rng, n: int) -> bytes:
    """``n`` random valid CIFAR-10 records (label 0..9, then 3072 pixel bytes)."""
    rec = rng.integers(0, 256, size=(n, CIFAR_RECORD), dtype=np.uint8)
    rec[:, 0] = rng.integers(0, 10, size=n)
    return rec.tobytes()


def idx_bytes(arr: np.ndarray) -> bytes:
    magic = {1: 2049, 3: 2051}[arr.ndim]
    head = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return head + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def write_gz(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(payload)
    return path


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Three empty lookup roots (LABKIT_DATA, repository data/, user cache) in tmp; the real data and the user's
    cache cannot be found."""
    env, repo, cache = tmp_path / "env", tmp_path / "repo-data", tmp_path / "user-cache"
    for p in (env, repo, cache):
        p.mkdir()
    monkeypatch.setenv("LABKIT_DATA", str(env))
    monkeypatch.setattr(data, "REPO_DATA", repo)
    monkeypatch.setattr(data, "user_cache", lambda: cache)
    return env, repo, cache


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """A folder served over HTTP on 127.0.0.1 (a free port) for the test's duration: yields (folder, base URL)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# ------------------------------------------------------------------------------------------- registry


def test_registry_names_official_files():
    cifar, fashion = DATASETS["cifar10"], DATASETS["fashion"]
    assert list(cifar.files) == [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    assert cifar.archive and cifar.remotes[0].url.endswith("/cifar-10-binary.tar.gz")
    assert cifar.remotes[0].md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert not fashion.archive
    assert {r.url.rsplit("/", 1)[-1]: r.md5 for r in fashion.remotes} == fashion.files
    with pytest.raises(ValueError, match="cifar10"):
        data.get_dataset("mnist")


def test_registry_md5_matches_real_files(cifar_root, fashion_root, need):
    need(*(f"{ds.folder}/{name}" for ds in DATASETS.values() for name, md5 in ds.files.items() if md5))
    for ds, root in ((DATASETS["cifar10"], cifar_root), (DATASETS["fashion"], fashion_root)):
        for name, expected in ds.files.items():
            if expected is not None:
                assert md5(root / ds.folder / name) == expected, name


# ------------------------------------------------------------------------------------ CIFAR-10, real data


def test_cifar_first_images_match_raw_bytes(cifar_root):
    raw = (cifar_root / CIFAR / "data_batch_1.bin").read_bytes()[:5 * CIFAR_RECORD]
    got = load_cifar10(5)
    assert got.images.dtype == np.uint8 and got.images.shape == (5, 3, 32, 32)
    assert got.labels.dtype == np.int64 and got.labels.shape == (5,)
    assert got.dataset == "cifar10" and got.split == "train" and not got.synthetic
    for i in range(5):
        rec = raw[i * CIFAR_RECORD:(i + 1) * CIFAR_RECORD]
        assert got.labels[i] == rec[0]
        assert got.images[i].tobytes() == rec[1:]  # R plane, G plane, B plane, each row-major 32x32
        assert got.images[i, 1, 3, 7] == rec[1 + 1024 + 3 * 32 + 7]
    x, y = read_cifar_batch(cifar_root / CIFAR / "data_batch_1.bin", limit=5)
    assert np.array_equal(x, got.images) and np.array_equal(y, got.labels)


def test_cifar_1200_train_images(cifar_root):
    got = load_cifar10(1200)
    assert len(got) == 1200 and got.images.shape == (1200, 3, 32, 32)
    raw = np.frombuffer((cifar_root / CIFAR / "data_batch_1.bin").read_bytes()[:1200 * CIFAR_RECORD], np.uint8)
    raw = raw.reshape(1200, CIFAR_RECORD)
    assert np.array_equal(got.labels, raw[:, 0])
    assert np.array_equal(got.images.reshape(1200, -1), raw[:, 1:])


def test_cifar_full_training_set(cifar_root, need):
    need(*(f"{CIFAR}/data_batch_{i}.bin" for i in range(1, 6)))
    got = load_cifar10()
    assert got.images.shape == (50000, 3, 32, 32) and got.labels.shape == (50000,)
    assert np.bincount(got.labels[:10000], minlength=10).tolist() == BATCH1_CLASS_COUNTS
    assert np.bincount(got.labels, minlength=10).tolist() == [5000] * 10
    # official order across batch files: image 10000 is the first record of data_batch_2
    with open(cifar_root / CIFAR / "data_batch_2.bin", "rb") as f:
        rec = f.read(CIFAR_RECORD)
    assert got.labels[10000] == rec[0] and got.images[10000].tobytes() == rec[1:]
    # the well-known per-channel means (README: 0.49140 0.48216 0.44653)
    means = got.images.mean(axis=(0, 2, 3), dtype=np.float64) / 255
    assert np.allclose(means, [0.49140, 0.48216, 0.44653], atol=1e-5)


def test_cifar_partial_test_batch(cifar_root, need):
    need(f"{CIFAR}/test_batch.bin")
    got = load_cifar10(split="test")
    assert len(got) == 1000 and got.split == "test"
    raw = (cifar_root / CIFAR / "test_batch.bin").read_bytes()
    assert got.labels[999] == raw[999 * CIFAR_RECORD]
    assert len(load_cifar10(1000, "test")) == 1000
    with pytest.raises(DataError, match=r"1001.*only 1000") as exc:
        load_cifar10(1001, "test")
    assert "partial" in str(exc.value)


@pytest.mark.parametrize("n", [0, -1, -5000])
def test_cifar_n_must_be_positive(cifar_root, n):
    with pytest.raises(ValueError, match="at least 1"):
        load_cifar10(n)


def test_cifar_bad_split():
    with pytest.raises(ValueError, match="split"):
        load_cifar10(3, "valid")


# ----------------------------------------------------------------------------------- Fashion, real data


def test_fashion_test_set(fashion_root):
    got = load_fashion()
    assert got.images.shape == (10000, 1, 28, 28) and got.images.dtype == np.uint8
    assert got.labels.dtype == np.int64 and got.labels.shape == (10000,)
    assert set(got.labels.tolist()) == set(range(10))
    assert np.bincount(got.labels).tolist() == [1000] * 10
    with gzip.open(fashion_root / FASHION / "t10k-images-idx3-ubyte.gz") as f:
        raw = f.read(16 + 2 * 784)
    assert np.frombuffer(raw[16:], np.uint8).tobytes() == got.images[:2].tobytes()
    with gzip.open(fashion_root / FASHION / "t10k-labels-idx1-ubyte.gz") as f:
        assert list(f.read(8 + 20)[8:]) == got.labels[:20].tolist()
    assert len(load_fashion(7)) == 7
    with pytest.raises(DataError, match="only 10000"):
        load_fashion(10001)
    with pytest.raises(ValueError):
        load_fashion(0)


def test_fashion_train_set(fashion_root, need):
    need(f"{FASHION}/train-images-idx3-ubyte.gz", f"{FASHION}/train-labels-idx1-ubyte.gz")
    got = load_fashion(split="train")
    assert got.images.shape == (60000, 1, 28, 28) and got.labels.shape == (60000,)
    assert np.bincount(got.labels).tolist() == [6000] * 10
    with pytest.raises(ValueError, match="split"):
        load_fashion(split="valid")


def test_load_dispatch(cifar_root, fashion_root):
    assert data.load("cifar10", 2).split == "train"
    assert data.load("fashion", 2).split == "test"
    with pytest.raises(ValueError):
        data.load("imagenet", 2)


# ---------------------------------------------------------------------------- partial and broken files


def test_partial_batch_file_loads(roots, rng):
    env, _, _ = roots
    folder = env / CIFAR
    folder.mkdir()
    payload = cifar_bytes(rng, 7)
    (folder / "data_batch_1.bin").write_bytes(payload)
    got = load_cifar10()
    assert len(got) == 7 and got.source == data.shown(folder) == "$LABKIT_DATA/cifar-10-batches-bin"
    raw = np.frombuffer(payload, np.uint8).reshape(7, CIFAR_RECORD)
    assert np.array_equal(got.labels, raw[:, 0]) and np.array_equal(got.images.reshape(7, -1), raw[:, 1:])
    assert len(load_cifar10(3)) == 3
    with pytest.raises(DataError, match=r"only 7"):
        load_cifar10(8)


def test_train_images_stop_at_a_partial_or_missing_batch(roots, rng):
    """Images are the first n in official order: nothing after a partial batch file or a missing one."""
    env, _, _ = roots
    folder = env / CIFAR
    folder.mkdir()
    (folder / "data_batch_1.bin").write_bytes(cifar_bytes(rng, 7))
    (folder / "data_batch_2.bin").write_bytes(cifar_bytes(rng, 5))  # not images 7..11 of the training set
    assert len(load_cifar10()) == 7
    with pytest.raises(DataError, match="only 7"):
        load_cifar10(8)


def test_train_images_stop_at_a_missing_batch(roots, cifar_root, rng, need):
    need(f"{CIFAR}/data_batch_1.bin")
    env, _, _ = roots
    folder = env / CIFAR
    folder.mkdir()
    (folder / "data_batch_1.bin").symlink_to(cifar_root / CIFAR / "data_batch_1.bin")  # complete, official
    (folder / "data_batch_3.bin").write_bytes(cifar_bytes(rng, 4))  # batch 2 missing: not images 10000..10003
    assert len(load_cifar10()) == 10000
    with pytest.raises(DataError, match="only 10000"):
        load_cifar10(10001)


def test_truncated_batch_file(roots, rng):
    env, _, _ = roots
    folder = env / CIFAR
    folder.mkdir()
    (folder / "data_batch_1.bin").write_bytes(cifar_bytes(rng, 3)[:2 * CIFAR_RECORD + 1000])
    with pytest.raises(DataError, match="truncated"):
        load_cifar10()
    with pytest.raises(DataError, match="truncated"):
        read_cifar_batch(folder / "data_batch_1.bin")


def test_bad_label_byte(tmp_path, rng):
    payload = bytearray(cifar_bytes(rng, 2))
    payload[CIFAR_RECORD] = 10
    (tmp_path / "x.bin").write_bytes(bytes(payload))
    with pytest.raises(DataError, match="label"):
        read_cifar_batch(tmp_path / "x.bin")


def test_corrupt_complete_batch_fails_checksum(roots, cifar_root, rng, need):
    need(f"{CIFAR}/data_batch_1.bin")
    env, _, _ = roots
    folder = env / CIFAR
    folder.mkdir()
    buf = bytearray((cifar_root / CIFAR / "data_batch_1.bin").read_bytes())
    rec = int(rng.integers(0, 10000))
    pos = rec * CIFAR_RECORD + 1 + int(rng.integers(0, 3072))  # a pixel byte: the labels stay valid
    buf[pos] ^= 0x01
    (folder / "data_batch_1.bin").write_bytes(bytes(buf))
    del buf
    with pytest.raises(DataError, match="checksum") as exc:
        load_cifar10(1)
    assert "labkit data fetch cifar10" in str(exc.value)
    with pytest.raises(DataError, match="checksum"):
        read_cifar_batch(folder / "data_batch_1.bin")


def test_truncated_gz_idx(tmp_path, rng):
    imgs = rng.integers(0, 256, size=(20, 28, 28), dtype=np.uint8)
    good = write_gz(tmp_path / "good-images-idx3-ubyte.gz", idx_bytes(imgs))
    assert np.array_equal(read_idx(good), imgs)
    blob = good.read_bytes()
    bad = tmp_path / "bad-images-idx3-ubyte.gz"
    bad.write_bytes(blob[:len(blob) // 2])
    with pytest.raises(DataError, match="truncated"):
        read_idx(bad)
    bad.write_bytes(b"not gzip at all, just text")
    with pytest.raises(DataError):
        read_idx(bad)


def test_idx_header_promises_more_than_it_holds(tmp_path, rng):
    labels = rng.integers(0, 10, size=50, dtype=np.uint8)
    payload = idx_bytes(labels)
    short = bytearray(payload[:-10])  # header says 50 labels, 40 follow
    write_gz(tmp_path / "short-labels-idx1-ubyte.gz", bytes(short))
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "short-labels-idx1-ubyte.gz")
    imgs = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    plain = tmp_path / "plain-images-idx3-ubyte"
    plain.write_bytes(idx_bytes(imgs)[:-1])  # plain (not gzip) idx, one byte short
    with pytest.raises(DataError, match="promises"):
        read_idx(plain)
    plain.write_bytes(idx_bytes(imgs))
    assert np.array_equal(read_idx(plain), imgs)
    (tmp_path / "magic").write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 12)
    with pytest.raises(DataError, match="magic"):
        read_idx(tmp_path / "magic")


def test_truncated_real_fashion_file(roots, fashion_root):
    env, _, _ = roots
    folder = env / FASHION
    folder.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        blob = (fashion_root / FASHION / name).read_bytes()
        (folder / name).write_bytes(blob[:-100] if "labels" in name else blob)
    with pytest.raises(DataError):
        load_fashion()


def test_fashion_labels_file_missing(roots, fashion_root):
    env, _, _ = roots
    (env / FASHION).mkdir()
    (env / FASHION / "t10k-images-idx3-ubyte.gz").symlink_to(fashion_root / FASHION / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataNotFound, match="t10k-labels-idx1-ubyte.gz"):
        load_fashion()


@pytest.mark.parametrize("name, loader, hint", [
    ("cifar10", lambda: load_cifar10(1), "labkit data fetch cifar10"),
    ("fashion", lambda: load_fashion(1), "labkit data fetch fashion"),
])
def test_not_found_names_every_folder_and_the_command(roots, name, loader, hint):
    env, repo, cache = roots
    folder = DATASETS[name].folder
    for call in (lambda: find(name), loader):
        with pytest.raises(DataNotFound) as exc:
            call()
        msg = str(exc.value)
        for root in (env, repo, cache):
            assert str(root / folder) in msg
        assert hint in msg
        assert isinstance(exc.value, FileNotFoundError) and isinstance(exc.value, DataError)
    assert data.available(name) is False


# ------------------------------------------------------------------------------------------ lookup order


def test_lookup_order(roots, monkeypatch, rng):
    env, repo, cache = roots
    for n, root in ((1, env), (2, repo), (3, cache)):
        (root / CIFAR).mkdir()
        (root / CIFAR / "data_batch_1.bin").write_bytes(cifar_bytes(rng, n))
    assert [label for label, _ in search_roots()] == ["$LABKIT_DATA", "repository data/", "user cache"]
    assert [p for _, p in search_roots()] == [env, repo, cache]
    assert find("cifar10") == env / CIFAR and len(load_cifar10()) == 1
    (env / CIFAR / "data_batch_1.bin").unlink()
    assert find("cifar10") == repo / CIFAR and len(load_cifar10()) == 2
    (repo / CIFAR / "data_batch_1.bin").unlink()
    assert find("cifar10") == cache / CIFAR and len(load_cifar10()) == 3
    assert data.available("cifar10")
    # a folder holding only the test batch is found for the test split, not for the training split
    (env / CIFAR / "test_batch.bin").write_bytes(cifar_bytes(rng, 4))
    assert find("cifar10", "test_batch.bin") == env / CIFAR
    assert len(load_cifar10(split="test")) == 4 and len(load_cifar10()) == 3


def test_lookup_without_labkit_data(roots, monkeypatch, rng):
    env, repo, cache = roots
    monkeypatch.delenv("LABKIT_DATA")
    assert [label for label, _ in search_roots()] == ["repository data/", "user cache"]
    for n, root in ((2, repo), (3, cache)):
        (root / CIFAR).mkdir()
        (root / CIFAR / "data_batch_1.bin").write_bytes(cifar_bytes(rng, n))
    assert find("cifar10") == repo / CIFAR
    assert data.default_download_root() in (repo, cache)
    monkeypatch.setenv("LABKIT_DATA", str(env))
    assert data.default_download_root() == env


def test_default_download_root_in_a_checkout(roots, monkeypatch, tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "data").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.delenv("LABKIT_DATA")
    monkeypatch.setattr(data, "REPO_DATA", checkout / "data")
    assert data.default_download_root() == checkout / "data"
    (checkout / "pyproject.toml").unlink()
    assert data.default_download_root() == roots[2]


# --------------------------------------------------------------------------------- download (pooch, local)


def make_cifar_archive(path: Path, rng, counts: dict[str, int]) -> dict[str, bytes]:
    contents = {name: cifar_bytes(rng, n) for name, n in counts.items()}
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in contents.items():
            info = tarfile.TarInfo(f"{CIFAR}/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return contents


def test_fetch_cifar_from_local_server(http_root, roots, rng):
    served, base = http_root
    env, _, _ = roots
    counts = {name: i + 2 for i, name in enumerate(DATASETS["cifar10"].files)}
    contents = make_cifar_archive(served / "cifar-10-binary.tar.gz", rng, counts)
    remote = Remote(f"{base}/cifar-10-binary.tar.gz", md5(served / "cifar-10-binary.tar.gz"))
    folder = fetch("cifar10", root=env, progress=False, remotes=(remote,))
    assert folder == env / CIFAR
    assert tree(env) == [CIFAR] + [f"{CIFAR}/{n}" for n in sorted(counts)]  # no archive, no temp folders
    for name, payload in contents.items():
        assert (folder / name).read_bytes() == payload
    got = load_cifar10(split="test")
    assert len(got) == counts["test_batch.bin"]
    raw = np.frombuffer(contents["test_batch.bin"], np.uint8).reshape(-1, CIFAR_RECORD)
    assert np.array_equal(got.labels, raw[:, 0]) and np.array_equal(got.images.reshape(len(raw), -1), raw[:, 1:])
    assert len(load_cifar10()) == counts["data_batch_1.bin"]
    # everything present: a second fetch does not download (the server's archive is gone)
    (served / "cifar-10-binary.tar.gz").unlink()
    assert fetch("cifar10", root=env, progress=False, remotes=(remote,)) == folder


def test_fetch_cifar_bad_checksum_leaves_nothing(http_root, tmp_path, rng):
    served, base = http_root
    make_cifar_archive(served / "cifar-10-binary.tar.gz", rng, dict.fromkeys(DATASETS["cifar10"].files, 2))
    root = tmp_path / "dl"
    root.mkdir()
    url = f"{base}/cifar-10-binary.tar.gz"
    with pytest.raises(DataError, match="checksum") as exc:
        fetch("cifar10", root=root, progress=False, remotes=(Remote(url, "0" * 32),))
    assert url in str(exc.value)
    assert tree(root) == []


def test_fetch_fashion_from_local_server(http_root, tmp_path, rng):
    served, base = http_root
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, size=(6, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, size=6, dtype=np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, size=(4, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, size=4, dtype=np.uint8),
    }
    assert set(arrays) == set(DATASETS["fashion"].files)
    remotes = tuple(Remote(f"{base}/{name}", md5(write_gz(served / name, idx_bytes(a)))) for name, a in arrays.items())
    root = tmp_path / "dl"
    root.mkdir()
    folder = fetch("fashion", root=root, progress=False, remotes=remotes)
    assert folder == root / FASHION
    assert tree(root) == [FASHION] + [f"{FASHION}/{n}" for n in sorted(arrays)]
    for name, a in arrays.items():
        assert (folder / name).read_bytes() == (served / name).read_bytes()
        assert np.array_equal(read_idx(folder / name), a)


def test_fetch_fashion_bad_checksum_leaves_nothing(http_root, tmp_path, rng):
    served, base = http_root
    remotes = []
    for i, name in enumerate(DATASETS["fashion"].files):
        arr = rng.integers(0, 10, size=5, dtype=np.uint8)
        good = md5(write_gz(served / name, idx_bytes(arr)))
        remotes.append(Remote(f"{base}/{name}", good if i != 2 else "f" * 32))  # third one wrong: two downloaded
    root = tmp_path / "dl"
    root.mkdir()
    with pytest.raises(DataError, match="checksum") as exc:
        fetch("fashion", root=root, progress=False, remotes=tuple(remotes))
    assert remotes[2].url in str(exc.value)
    assert tree(root) == []


def test_fetch_server_unreachable(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/cifar-10-binary.tar.gz"
    root = tmp_path / "dl"
    root.mkdir()
    with pytest.raises(DataError) as exc:
        fetch("cifar10", root=root, progress=False, remotes=(Remote(url, "0" * 32),))
    assert url in str(exc.value)
    assert "checksum" not in str(exc.value)
    assert tree(root) == []


# ------------------------------------------------------------------------------------------- network inputs


def test_to_input_cifar_is_byte_over_255_minus_half():
    every = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16).repeat(3, axis=1)
    got = to_input("cifar10", every)
    assert got.dtype == np.float32 and got.shape == (1, 3, 16, 16)
    # the original C code: image[n][j] = (float)data[i] / 255.0 - 0.5  (double arithmetic, one rounding to float)
    want = np.array([np.float32(b / 255.0 - 0.5) for b in range(256)], np.float32).reshape(16, 16)
    for c in range(3):
        assert np.array_equal(got[0, c], want)
    assert got.min() == np.float32(-0.5) and got.max() == np.float32(0.5)


def test_to_input_cifar_real_images(cifar_root):
    imgs = load_cifar10(3)
    x = to_input("cifar10", imgs)
    assert x.dtype == np.float32 and x.shape == (3, 3, 32, 32) and x.flags.c_contiguous
    want = (imgs.images.astype(np.float64) / 255.0 - 0.5).astype(np.float32)
    assert np.array_equal(x, want)
    assert np.array_equal(to_input("cifar10", imgs.images), x)
    xs, got = data.load_inputs("cifar10", 3)
    assert np.array_equal(xs, x) and np.array_equal(got.images, imgs.images)


def bilinear_loop(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Per-pixel half-pixel-centre bilinear with clamped edges, written like torch's CPU kernel
    (interpolate(mode="bilinear", align_corners=False)): independent of labkit's matrix formulation."""
    h, w = img.shape
    out = np.empty((out_h, out_w), np.float64)
    for i in range(out_h):
        sy = max((i + 0.5) * h / out_h - 0.5, 0.0)
        y0 = int(sy)
        y1 = y0 + 1 if y0 < h - 1 else y0
        ly = sy - y0
        for j in range(out_w):
            sx = max((j + 0.5) * w / out_w - 0.5, 0.0)
            x0 = int(sx)
            x1 = x0 + 1 if x0 < w - 1 else x0
            lx = sx - x0
            out[i, j] = ((1 - ly) * ((1 - lx) * img[y0, x0] + lx * img[y0, x1])
                         + ly * ((1 - lx) * img[y1, x0] + lx * img[y1, x1]))
    return out


@pytest.mark.parametrize("h, w, size", [(28, 28, 70), (5, 7, 3), (4, 4, 11), (9, 3, 4), (1, 1, 5), (6, 6, 6),
                                        (7, 5, 2), (3, 8, 13)])
def test_resize_bilinear_against_loop(rng, h, w, size):
    x = rng.random((2, 3, h, w))
    got = resize_bilinear(x, size)
    assert got.dtype == np.float32 and got.shape == (2, 3, size, size)
    for n in range(2):
        for c in range(3):
            np.testing.assert_allclose(got[n, c], bilinear_loop(x[n, c], size, size), rtol=0, atol=1e-6)
    if size == h == w:
        np.testing.assert_allclose(got, x, rtol=0, atol=1e-6)


def test_bilinear_matrix_rows_sum_to_one():
    for n_in, n_out in ((28, 70), (70, 28), (5, 3), (1, 4)):
        m = bilinear_matrix(n_in, n_out)
        assert m.shape == (n_out, n_in) and (m >= 0).all()
        np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("h, w, size", [(28, 28, 70), (5, 7, 3), (4, 4, 11), (9, 3, 4), (7, 5, 2)])
def test_resize_bilinear_matches_scipy(rng, h, w, size):
    ndimage = pytest.importorskip("scipy.ndimage")
    x = rng.random((2, 3, h, w))
    # grid_mode=True: half-pixel centres (the whole pixel extent is zoomed); mode="nearest": edges clamped
    want = ndimage.zoom(x, (1, 1, size / h, size / w), order=1, mode="nearest", grid_mode=True)
    assert want.shape == (2, 3, size, size)
    np.testing.assert_allclose(resize_bilinear(x, size), want, rtol=0, atol=1e-6)


def test_resize_bilinear_upsampling_matches_pillow(rng):
    Image = pytest.importorskip("PIL.Image")
    x = rng.random((28, 28)).astype(np.float32)
    want = np.asarray(Image.fromarray(x, mode="F").resize((70, 70), Image.BILINEAR))  # upsampling: no antialias
    np.testing.assert_allclose(resize_bilinear(x[None, None], 70)[0, 0], want, rtol=0, atol=1e-6)


def test_to_input_fashion(rng):
    x = rng.integers(0, 256, size=(3, 1, 28, 28), dtype=np.uint8)
    got = to_input("fashion", x)
    assert got.dtype == np.float32 and got.shape == (3, 1, 70, 70)
    for n in range(3):
        want = bilinear_loop(x[n, 0].astype(np.float32) / np.float32(255.0), 70, 70)
        np.testing.assert_allclose(got[n, 0], want, rtol=0, atol=1e-6)
    assert got.min() >= 0 and got.max() <= 1
    assert to_input("fashion", x[:0]).shape == (0, 1, 70, 70)


@pytest.mark.parametrize("value", [0, 1, 128, 255])
def test_to_input_fashion_constant_stays_constant(value):
    x = np.full((2, 1, 28, 28), value, np.uint8)
    got = to_input("fashion", x)
    assert np.array_equal(got, np.full((2, 1, 70, 70), np.float32(value) / np.float32(255.0), np.float32))


def test_to_input_fashion_real_images(fashion_root):
    imgs = load_fashion(2)
    got = to_input("fashion", imgs)
    assert got.shape == (2, 1, 70, 70)
    want = bilinear_loop(imgs.images[1, 0].astype(np.float32) / np.float32(255.0), 70, 70)
    np.testing.assert_allclose(got[1, 0], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("net", ["cifar10", "fashion"])
def test_to_input_requires_uint8(net):
    shape = (1, 3, 32, 32) if net == "cifar10" else (1, 1, 28, 28)
    with pytest.raises(ValueError, match="uint8"):
        to_input(net, np.zeros(shape, np.float32))
    with pytest.raises(ValueError, match="uint8"):
        to_input(net, np.zeros(shape, np.int64))


# ----------------------------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize("net, shape", [("cifar10", (3, 32, 32)), ("fashion", (1, 28, 28))])
def test_synthetic(net, shape):
    s = synthetic(net, 5, seed=3)
    assert isinstance(s, Images) and s.synthetic and s.labels is None
    assert s.images.dtype == np.uint8 and s.images.shape == (5, *shape)
    assert s.dataset == net and s.split == "synthetic" and "synthetic" in s.source
    assert np.array_equal(synthetic(net, 5, seed=3).images, s.images)
    assert not np.array_equal(synthetic(net, 5, seed=4).images, s.images)
    assert s.images.min() < 30 and s.images.max() > 225  # spans the byte range
    x = to_input(net, s)
    assert x.dtype == np.float32 and x.shape[0] == 5
