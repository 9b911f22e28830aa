"""The datasets the kit knows: where each is published (official URLs and md5 sums), its files and its folder as the
extracted archives lay it out. ``labkit.data`` looks them up, fetches and loads them.
"""

from __future__ import annotations

from dataclasses import dataclass

CIFAR_RECORD = 3073  # 1 label byte + 3 x 1024 pixel bytes


@dataclass(frozen=True)
class Remote:
    url: str
    md5: str


@dataclass(frozen=True)
class Dataset:
    """One dataset of the registry: the folder it lives in, its files and where they come from."""

    name: str
    folder: str
    files: dict[str, str | None]  # file name -> md5 of the complete official file (None: cannot be checked)
    remotes: tuple[Remote, ...]
    archive: bool  # True: the remote is one .tar.gz that extracts to ``folder``
    fetch_hint: str


DATASETS = {
    "cifar10": Dataset(
        name="cifar10",
        folder="cifar-10-batches-bin",
        files={
            "data_batch_1.bin": "5dd7e06a14cb22eb9f671a540d1b7c25",
            "data_batch_2.bin": "5ea93a67294ea407fff1d09f752e9692",
            "data_batch_3.bin": "942cd6a4bcdd0dd3c604fbe906cb4421",
            "data_batch_4.bin": "ae636b3ba5c66a11e91e8cb52e771fcb",
            "data_batch_5.bin": "53f37980c15c3d472c316c40844f3f0d",
            "test_batch.bin": None,  # official md5 not published per file; partial copies exist
        },
        remotes=(Remote("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                        "c32a1d4ab5d03f1284b67883e8d87530"),),
        archive=True,
        fetch_hint="labkit data fetch cifar10",
    ),
    "fashion": Dataset(
        name="fashion",
        folder="fashion-mnist",
        files={
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        remotes=tuple(
            Remote(f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{f}", md5)
            for f, md5 in (
                ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
                ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
                ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
            )
        ),
        archive=False,
        fetch_hint="labkit data fetch fashion",
    ),
}
