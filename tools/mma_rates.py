"""The arithmetic rates a kernel of this kit can reach on this GPU: fp32 FMA, and ``mma.sync`` on TF32 (m16n8k8)
and on fp16 (m16n8k16), both with fp32 sums, in multiply-adds a second; and the device's copy bandwidth.

Each is a loop of independent operations in registers (eight accumulators a thread, no memory traffic), 8 blocks of
256 threads a multiprocessor, timed with CUDA events around the launch after a warm-up, median of ``--repeat``.
This is what decides whether a 3xTF32 product (three TF32 MMAs) or a split fp16 one (three fp16 MMAs) can beat the
FMA units (``labkit/ops/tensor_cores.py``). The copy bandwidth is a device-to-device copy of ``--copy-mib`` MiB
(``cudaMemcpyAsync``), its bytes read and written over its time, median of ``--repeat``. Together they are what
``labkit.floors`` bounds a forward call with; ``--save`` keeps them as this device's in ``results/unit_rates.json``.
Needs a GPU with cupy.

    python3 tools/mma_rates.py --out results/some-folder [--save]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SOURCE = r"""
extern "C" __global__ void ffma(float* out, int iters) {
    float a[8], b = 1.0001f, c = 0.9999f;
    for (int i = 0; i < 8; ++i) a[i] = threadIdx.x * 1e-3f + i;
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] = fmaf(a[i], b, c);
    float s = 0;
    for (int i = 0; i < 8; ++i) s += a[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void tf32(float* out, int iters) {
    float d[8][4] = {};
    unsigned a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 ^ 5, b1 = a0 ^ 7;
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    float s = 0;
    for (int i = 0; i < 8; ++i) s += d[i][0] + d[i][1] + d[i][2] + d[i][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void f16(float* out, int iters) {
    float d[8][4] = {};
    unsigned a0 = 0x3c003c00u ^ threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 ^ 5, b1 = a0 ^ 7;
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                "{%0,%1,%2,%3};" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    float s = 0;
    for (int i = 0; i < 8; ++i) s += d[i][0] + d[i][1] + d[i][2] + d[i][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""

#: multiply-adds one warp makes per loop iteration: 32 threads x 32 FMAs; 8 MMAs of 16 x 8 x 8 or 16 x 8 x 16
PER_WARP_ITER = {"ffma": 32 * 32, "tf32": 8 * 16 * 8 * 8, "f16": 8 * 16 * 8 * 16}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--iters", type=int, default=4096)
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the device-to-device copy (MiB)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--save", action="store_true", help="keep the rates and bandwidth as this device's in "
                                                        "results/unit_rates.json (labkit.floors reads them)")
    args = ap.parse_args(argv)
    try:
        import cupy as cp
    except ImportError:
        print("mma_rates: needs a GPU with cupy", file=sys.stderr)
        return 2
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = props["multiProcessorCount"]
    mod = cp.RawModule(code=SOURCE)
    blocks, threads = 8 * sms, 256
    out = cp.zeros(blocks * threads, cp.float32)
    rows = {}
    for name, per in PER_WARP_ITER.items():
        fn = mod.get_function(name)
        fn((blocks,), (threads,), (out, cp.int32(args.iters)))
        times = []
        for _ in range(args.repeat):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn((blocks,), (threads,), (out, cp.int32(args.iters)))
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        times.sort()
        median = times[len(times) // 2]
        macs = per * (blocks * threads // 32) * args.iters
        rows[name] = {"median_s": median, "tmacs": macs / median / 1e12, "min_s": times[0], "max_s": times[-1]}
        print(f"{name:5} {macs / median / 1e12:7.1f} T multiply-adds/s ({2 * macs / median / 1e12:6.1f} TFLOP/s), "
              f"median {1e3 * median:.3f} ms of {args.repeat}")
    copy = copy_bandwidth(cp, args.copy_mib << 20, args.repeat)
    print(f"copy  {copy['bandwidth'] / 1e12:7.3f} TB/s device to device ({args.copy_mib} MiB read + written, median "
          f"{1e3 * copy['median_s']:.3f} ms of {args.repeat})")
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    measured = {"device": name, "sms": sms, "rows": rows, "copy": copy, "date": dt.date.today().isoformat(),
                "command": "python3 tools/mma_rates.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mma_rates.json").write_text(json.dumps(measured, indent=1) + "\n")
    if args.save:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from labkit import floors

        floors.save(measured)
        print(f"saved as {name}'s rates in {floors.STORE}")
    return 0


def copy_bandwidth(cp, nbytes: int, repeat: int) -> dict:
    """A device-to-device copy of ``nbytes``: its bytes read and written over its median time (CUDA events)."""
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    dst.data.copy_from_device_async(src.data, src.nbytes)  # warm-up
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        dst.data.copy_from_device_async(src.data, src.nbytes)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    times.sort()
    median = times[len(times) // 2]
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return {"bytes": 2 * nbytes, "median_s": median, "min_s": times[0], "max_s": times[-1],
            "bandwidth": 2 * nbytes / median}


if __name__ == "__main__":
    sys.exit(main())
