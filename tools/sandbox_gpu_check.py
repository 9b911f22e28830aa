"""Check on a GPU machine that the grader's bubblewrap sandbox reaches the GPU (docs/grading.md, "Isolation").

    python tools/sandbox_gpu_check.py --out DIR [--stage 04]
    LABKIT_BWRAP=PATH/bwrap python tools/sandbox_gpu_check.py --out DIR   # bubblewrap not installed there

1. In the sandbox a job's child gets (``labkit.grading.isolation``, bubblewrap): numba.cuda sees the device, a
   kernel runs and its result is right, CuPy (where installed) compiles and runs a RawKernel; the repo's solutions
   and the network stay out of reach.
2. ``labkit grade`` of the stage's solution under ``--sandbox bwrap`` on the GPU: a pass, op time measured.

Writes DIR/sandbox_gpu.json (and DIR/grades/ of step 2); exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, socket, sys
import numpy as np
import labkit
from labkit import device
from numba import cuda
out = {"device": device.label(device.info()), "simulated": device.info().simulated}

@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1.0

a = cuda.to_device(np.arange(1000, dtype=np.float32))
add_one[8, 128](a)
out["numba_kernel_ok"] = bool(np.array_equal(a.copy_to_host(), np.arange(1000, dtype=np.float32) + 1))
try:
    import cupy as cp
    k = cp.RawKernel(r'extern "C" __global__ void twice(float* x, int n) {'
                     r' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }', "twice")
    x = cp.arange(1000, dtype=cp.float32)
    k((8,), (128,), (x, np.int32(1000)))
    out["cupy_kernel_ok"] = bool(cp.allclose(x, cp.arange(1000, dtype=cp.float32) * 2))
except ImportError:
    out["cupy_kernel_ok"] = "cupy not installed"
try:
    open(sys.argv[1]).read(1)
    out["solution_readable"] = True
except OSError:
    out["solution_readable"] = False
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    out["network"] = True
except OSError:
    out["network"] = False
print("RESULT " + json.dumps(out))
"""


def probe(scratch: Path) -> dict:
    from labkit.grading import isolation, sandbox

    bwrap, why = isolation.bwrap_usable()
    if bwrap is None:
        return {"error": why}
    sandbox.private_labkit(scratch / "lib")  # as a job's child imports it
    (scratch / "work").mkdir()
    env = isolation.child_env(dict(os.environ), str(scratch / "work"), str(scratch / "lib"))
    view = isolation.View((str(scratch / "lib"),), str(scratch / "work"), env)
    child = bwrap.spawn([sys.executable, "-c", PROBE, str(REPO / "solutions" / "04_data_transfer_padding.ipynb")],
                        view, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.proc.communicate(timeout=600)
    left = bwrap.stop(child)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    res = json.loads(lines[-1][7:]) if lines else {"error": err[-2000:]}
    res.update(sandbox=bwrap.describe(), left_running=left, devices=isolation.nvidia_devices())
    return res


def grade_solution(stage: str, out: Path) -> dict:
    from labkit import grading
    from labkit.stages import STAGES

    nb = STAGES[stage].notebook
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "solution" / "notebooks"
        folder.mkdir(parents=True)
        (folder / nb).write_bytes((REPO / "solutions" / nb).read_bytes())
        report = grading.grade(Path(tmp), stages=[stage], out=out / "grades", progress=False, sandbox="bwrap",
                               command=f"labkit grade <solution> --stages {stage} --sandbox bwrap")
    row = report["rows"][0]
    return {"status": row["status"], "score": row["score"], "max_score": row["max_score"],
            "op_time_s": row["op_time_s"], "message": row["message"], "sandbox": report["meta"]["sandbox"],
            "device": report["meta"]["device"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", default="04")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        result = {"probe": probe(Path(scratch))}
    result["grade"] = grade_solution(args.stage, args.out)
    (args.out / "sandbox_gpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    p, g = result["probe"], result["grade"]
    ok = (not p.get("error") and not p["simulated"] and p["numba_kernel_ok"] is True
          and p["cupy_kernel_ok"] in (True, "cupy not installed") and not p["solution_readable"] and not p["network"]
          and not p["left_running"] and g["status"] == "pass" and g["op_time_s"] is not None)
    print("sandbox GPU check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
