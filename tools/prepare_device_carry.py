"""Prepare what tools/device_run.sh needs on a lent GPU machine that has no package registry.

.whl/     wheels for Python 3.12 x86_64: numpy<2.5 (numba needs it) and the pure-Python packages missing there;
          with --notebooks also nbclient and ipykernel (less debugpy and jedi, which they import only if present)
          so that tools/execute_solutions.py --gpu can run the notebooks there
.gpudata/ data_batch_1 of CIFAR-10 and (unless --cifar-only) the Fashion-MNIST test set, copied from LABKIT_DATA
          (both folders are ignored by git: data never enters the repository)

A call carries 64 MiB in all (working tree included): --notebooks --cifar-only keeps it under that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = ["numpy==2.4.6", "pooch", "nbformat", "fastjsonschema", "jsonschema", "referencing", "rpds-py",
          "jsonschema-specifications", "jupyter_core", "traitlets", "platformdirs"]
KERNEL_WHEELS = ["nbclient", "ipykernel", "ipython", "jupyter_client", "comm", "matplotlib-inline", "nest-asyncio2",
                 "pyzmq", "tornado", "prompt_toolkit", "wcwidth", "stack_data", "executing", "asttokens", "pure_eval",
                 "pexpect", "ptyprocess", "ipython-pygments-lexers"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any"]
DATA = ["cifar-10-batches-bin/data_batch_1.bin", "fashion-mnist/t10k-images-idx3-ubyte.gz",
        "fashion-mnist/t10k-labels-idx1-ubyte.gz"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", action="store_true", help="add the wheels that run notebooks (nbclient, ipykernel)")
    parser.add_argument("--cifar-only", action="store_true", help="leave the Fashion-MNIST files out of .gpudata/")
    args = parser.parse_args(argv)
    whl = REPO / ".whl"
    shutil.rmtree(whl, ignore_errors=True)
    shutil.rmtree(REPO / ".gpudata", ignore_errors=True)
    whl.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(whl)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS + (KERNEL_WHEELS if args.notebooks else []), check=True)
    src = Path(os.environ.get("LABKIT_DATA") or REPO.parent / "shared" / "datasets")
    for rel in DATA:
        if args.cifar_only and rel.startswith("fashion"):
            continue
        dst = REPO / ".gpudata" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst)
    size = sum(p.stat().st_size for d in (whl, REPO / ".gpudata") for p in d.rglob("*") if p.is_file())
    print(f"carry ready: {size / 2**20:.1f} MiB in .whl/ and .gpudata/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
