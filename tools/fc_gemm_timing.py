"""Issue 24's fc timings: the kit's fc kernels beside cuBLAS on the two fc1 layers that matter.

Fashion's fc1 (20184 -> 160) and ECE408's fc1 (5184 -> 140), at 10000 and 1000 images, each with the kit's given
``lk.kernels.fc``, its numba register tiles ``lk.gemm.fc_tiles``, every configuration of the CUDA C SGEMM
``lk.gemm_cuda.fc_cuda`` (``CONFIGS``, with the plan it picks), every configuration of the tensor cores' fc
``lk.fc_tensor_cores.fc_split3`` (with its plan, and on a GPU its registers and spills a thread) and torch's
``F.linear`` (cuBLAS, TF32 off) for reference. Each is checked against numpy's float64 product first (max |error| / max |result| at most 1e-4), then
timed: CUDA events around each call, warm-up calls first, median and range of 20. One line a row; ``--out DIR``
writes ``DIR/fc_gemm_timing.json``. The exit status is 1 when a check failed.

``--quick`` (the simulator and the CPU emulation of CUDA C, no GPU) runs tiny odd shapes for correctness only.

    python3 tools/fc_gemm_timing.py --out results/some-folder
    python3 tools/fc_gemm_timing.py --quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import cudnn, device, gemm, gemm_cuda, gpu, kernels  # noqa: E402
from labkit.ops import fc_tensor_cores  # noqa: E402

MAX_REL_ERROR = 1e-4
#: (layer, inputs, outputs): the two fc1 layers of issue 24
LAYERS = [("fashion fc1", 20184, 160), ("ece408 fc1", 5184, 140)]
IMAGES = (10000, 1000)
#: the quick run's shapes: odd images, K a multiple of 4 (float4 loads) or of nothing, 13 and 10 outputs
QUICK = [("toy 52 -> 13", 52, 13, 19), ("toy 37 -> 10", 37, 10, 5)]


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (NaN anywhere: infinite)."""
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))




def summary(seconds: list[float], flop: float) -> dict:
    median = statistics.median(seconds)
    return {"median_ms": 1e3 * median, "min_ms": 1e3 * min(seconds), "max_ms": 1e3 * max(seconds),
            "runs": len(seconds), "tflops": flop / median / 1e12}


def kit_rows(N: int, K: int, OUT: int) -> list[tuple[str, object]]:
    """(label, layer function) of the kit's kernels for this shape, each CUDA C configuration with its plan."""
    rows = [("lk.kernels.fc", kernels.fc), (f"lk.gemm.fc_tiles ({gemm.plan(N, K, OUT)})", gemm.fc_tiles)]
    for name in gemm_cuda.CONFIGS:
        p = gemm_cuda.plan(N, K, OUT, name, vec=K % 4 == 0)
        rows.append((f"lk.gemm_cuda.fc_cuda[{p}]", lambda *a, name=name: gemm_cuda.fc_cuda(*a, config=name)))
    for name in fc_tensor_cores.CONFIGS:
        p = fc_tensor_cores.plan(N, K, OUT, name, vec=K % 4 == 0)
        rows.append((f"lk.fc_tensor_cores.fc_split3[{p}]{registers(p)}",
                     lambda *a, name=name: fc_tensor_cores.fc_split3(*a, config=name)))
    return rows


def registers(p) -> str:
    """', R registers, S bytes spilled' of a plan's compiled kernel on a GPU (cupy's attributes); '' elsewhere."""
    if gpu.cuda_c_on_cpu():
        return ""
    k = fc_tensor_cores.module(p.macros()).get_function("fc_split3")
    return f", {k.num_regs} registers, {k.local_size_bytes} bytes spilled"


def torch_linear(x, w, b, repeat: int, warmup: int):
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    xt, wt, bt = (torch.from_numpy(a).cuda() for a in (x, w, b))
    got = {}

    def call():
        got["y"] = F.linear(xt, wt, bt)

    seconds = lk.measure(call, warmup=warmup, repeat=repeat).times
    y = got["y"].cpu().numpy()
    del xt, wt, bt, got
    torch.cuda.empty_cache()
    return seconds, y


def run(quick: bool, repeat: int, warmup: int, say=print) -> tuple[list[dict], list[str]]:
    """Every row: checked, then timed (not on ``quick``). Returns (rows, failures)."""
    rows, failures = [], []
    cases = QUICK if quick else [(name, K, OUT, n) for name, K, OUT in LAYERS for n in IMAGES]
    for name, K, OUT, N in cases:
        rng = np.random.default_rng(N + K)
        x = rng.standard_normal((N, K), dtype=np.float32)
        w = (rng.standard_normal((OUT, K), dtype=np.float32) / np.sqrt(K)).astype(np.float32)
        b = rng.standard_normal(OUT, dtype=np.float32)
        want = x.astype(np.float64) @ w.astype(np.float64).T + b
        flop = 2.0 * N * K * OUT
        say(f"{name}, {N} images ({flop / 1e9:.2f} GFLOP)")
        xd, wd, bd = gpu.to_device(x), gpu.to_device(w), gpu.to_device(b)
        out = gpu.to_device(np.zeros((N, OUT), np.float32))
        for label, fn in kit_rows(N, K, OUT):
            row = {"layer": name, "images": N, "inputs": K, "outputs": OUT, "kernel": label}
            rows.append(row)
            try:
                gpu.poison(out)
                fn(xd, wd, bd, out)
                row["rel_error"] = err = rel_error(gpu.as_host(out), want)
                if err > MAX_REL_ERROR:
                    failures.append(f"{name} {N} {label}: relative error {err:.2e}")
                    say(f"  {label:<100} CHECK FAILED: relative error {err:.2e} (at most {MAX_REL_ERROR:g})")
                    continue
                if not quick:
                    row["time"] = summary(lk.measure(fn, xd, wd, bd, out, warmup=warmup, repeat=repeat).times, flop)
            except Exception as exc:  # noqa: BLE001 - one failing kernel must not hide the others
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                failures.append(f"{name} {N} {label}: {row['error']}")
                say(f"  {label:<100} ERROR {row['error']}")
                continue
            say(f"  {label:<100} rel err {err:.1e}" + (f"  {line(row['time'])}" if "time" in row else "  (checked)"))
        if not quick and cudnn.available():
            seconds, y = torch_linear(x, w, b, repeat, warmup)
            row = {"layer": name, "images": N, "inputs": K, "outputs": OUT, "kernel": "torch F.linear (cuBLAS)",
                   "rel_error": rel_error(y, want), "time": summary(seconds, flop)}
            rows.append(row)
            say(f"  {'torch F.linear (cuBLAS, TF32 off)':<100} rel err {row['rel_error']:.1e}  {line(row['time'])}")
        elif not quick:
            say("  torch F.linear: skipped (no PyTorch with a usable GPU here)")
        del xd, wd, bd, out
        gpu.release_buffers()
    return rows, failures


def line(t: dict) -> str:
    return f"{t['median_ms']:8.3f} ms (range {t['min_ms']:.3f}-{t['max_ms']:.3f}, {t['runs']} runs) {t['tflops']:6.2f} TFLOP/s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, correctness only (the simulator)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, help="folder for fc_gemm_timing.json")
    args = ap.parse_args(argv)
    info = device.info()
    if not args.quick and info.kind != "gpu":
        print("fc_gemm_timing: no GPU here; --quick checks the kernels on tiny shapes", file=sys.stderr)
        return 2
    print(f"device: {info.name}; CUDA C: {'CPU emulation' if gpu.cuda_c_on_cpu() else 'cupy'}")
    rows, failures = run(args.quick, args.repeat, args.warmup)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"date": dt.datetime.now().isoformat(timespec="seconds"), "device": info.name, "quick": args.quick,
                "repeat": args.repeat, "warmup": args.warmup, "max_rel_error": MAX_REL_ERROR, "rows": rows,
                "failures": failures}
        (args.out / "fc_gemm_timing.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(rows)} rows, {len(failures)} failed" + "".join(f"\n  {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
