"""Run the self-checks of the kit's solutions (or of a submitted notebook) under compute-sanitizer's memcheck on a GPU.

The checks hand every layer its inputs inside NaN margins (``labkit.engine.IN_GUARD``), so a kernel that reads a
little past an input reads NaN and fails; a read or write further out, past those margins and out of the
allocation, is what memcheck reports. (A read that stays inside the allocation, a window across an image's edge
into the next row, is invisible to memcheck: the value check and the margins catch that one.)

    python tools/memcheck.py --out OUT [--stages 05 06 07 08 09] [--notebook PATH]

writes ``OUT/memcheck.log`` (compute-sanitizer's report) and ``OUT/checks.txt`` (the check lines); exits non-zero
when memcheck found an error or a check failed. Needs a GPU and compute-sanitizer (CUDA toolkit) on PATH or under
$CUDA_HOME/bin.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "compute-sanitizer"
    return str(candidate) if candidate.is_file() else None


def inner(stages: list[str], notebook: str | None, out: Path) -> int:
    """The checks themselves (run under the sanitizer)."""
    import labkit as lk
    from labkit import check
    from labkit.stages import STAGES, load_variants, solutions_folder

    paths = [Path(notebook)] if notebook else [solutions_folder() / STAGES[s].notebook for s in stages]
    lines, failed = [], 0
    done: dict = {}
    for path in paths:
        for variant in load_variants(path).values():
            if variant.target != "gpu":
                continue
            for r in check.check_variant(variant, quiet=True, done=done):
                lines.append(f"{variant.label}: {r}")
                failed += not r.passed and "skipped" not in r.detail
    (out / "checks.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} checks, {failed} failed; device: {lk.device.label()}")
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for memcheck.log and checks.txt")
    ap.add_argument("--stages", nargs="+", default=["02", "04", "05", "06", "07", "08", "09"])
    ap.add_argument("--notebook", help="a submitted stage notebook instead of the kit's solutions")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.inner:
        return inner(args.stages, args.notebook, args.out)
    tool = sanitizer()
    if tool is None:
        print("compute-sanitizer not found (on PATH or under $CUDA_HOME/bin): install the CUDA toolkit on this GPU "
              "machine, or set CUDA_HOME", file=sys.stderr)
        return 2
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("NUMBA_ENABLE_CUDASIM=1 is set: memcheck needs the kernels on the GPU; unset it", file=sys.stderr)
        return 2
    command = [tool, "--tool", "memcheck", "--error-exitcode", "99", "--log-file", str(args.out / "memcheck.log"),
               sys.executable, str(Path(__file__).resolve()), "--inner", "--out", str(args.out),
               "--stages", *args.stages] + (["--notebook", args.notebook] if args.notebook else [])
    rc = subprocess.run(command, cwd=REPO).returncode
    if rc == 99:
        print(f"memcheck found errors: {args.out / 'memcheck.log'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
