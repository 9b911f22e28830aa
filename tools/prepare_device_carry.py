"""Prepare what tools/device_run.sh needs on a lent GPU machine that has no package registry.

.whl/     wheels for Python 3.12 x86_64: numpy<2.5 (numba needs it) and the pure-Python packages missing there
.gpudata/ data_batch_1 of CIFAR-10 and the Fashion-MNIST test set, copied from LABKIT_DATA (both folders are
          ignored by git: data never enters the repository)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = ["numpy==2.4.6", "pooch", "nbformat", "fastjsonschema", "jsonschema", "referencing", "rpds-py",
          "jsonschema-specifications", "jupyter_core", "traitlets", "platformdirs"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any"]
DATA = ["cifar-10-batches-bin/data_batch_1.bin", "fashion-mnist/t10k-images-idx3-ubyte.gz",
        "fashion-mnist/t10k-labels-idx1-ubyte.gz"]


def main() -> int:
    whl = REPO / ".whl"
    whl.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(whl)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS, check=True)
    src = Path(os.environ.get("LABKIT_DATA") or REPO.parent / "shared" / "datasets")
    for rel in DATA:
        dst = REPO / ".gpudata" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst)
    size = sum(p.stat().st_size for d in (whl, REPO / ".gpudata") for p in d.rglob("*") if p.is_file())
    print(f"carry ready: {size / 2**20:.1f} MiB in .whl/ and .gpudata/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
