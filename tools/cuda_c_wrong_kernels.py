"""Five wrong CUDA C conv kernels, each one mistake away from a right one, checked by the kit's own check path
(``lk.check.check_layer``, through ``lk.gpu.raw_module``): on a GPU through cupy, elsewhere on the CPU emulation
of CUDA C (``labkit.cudacpu``). Each must FAIL, with a line that names what went wrong; the two right kernels they
come from must PASS. One line per kernel; ``--out DIR`` also writes ``DIR/cuda_c_wrong_kernels.json`` (device,
date, command, every line).

    python tools/cuda_c_wrong_kernels.py [--out DIR] [--layer conv2] [--seed N]

tests/test_cuda_cpu.py runs the same kernels on the CPU emulation.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import labkit as lk  # noqa: E402

# one thread per output, weights in constant memory, the padding tested in the kernel (stride 1)
CONST = r"""
extern "C" {
__constant__ float c_w[16384];

__global__ void conv_const(const float* x, const float* b, float* out, int N, int C, int H, int W, int M, int K,
                           int pad, int Ho, int Wo) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N * M * Ho * Wo) return;
    int j = t % Wo, i = (t / Wo) % Ho, m = (t / (Wo * Ho)) % M, n = t / (Wo * Ho * M);
    float acc = b[m];
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q) {
                int r = i + p - pad, s = j + q - pad;
                if (r >= 0 && r < H && s >= 0 && s < W)
                    acc += x[((n * C + c) * H + r) * W + s] * c_w[((m * C + c) * K + p) * K + q];
            }
    out[t] = acc;
}
}
"""

# a T x T tile of outputs per block; each channel's input tile with its halo staged in shared memory first
TILED = r"""
#define T 8
#define KMAX 5
extern "C" {
__global__ void conv_tiled(const float* x, const float* w, const float* b, float* out, int N, int C, int H, int W,
                           int M, int K, int pad, int Ho, int Wo) {
    __shared__ float tile[(T + KMAX - 1) * (T + KMAX - 1)];
    int n = blockIdx.z / M, m = blockIdx.z % M, i0 = blockIdx.y * T, j0 = blockIdx.x * T;
    int ti = threadIdx.y, tj = threadIdx.x, S = T + K - 1;
    float acc = b[m];
    for (int c = 0; c < C; ++c) {
        for (int k = ti * T + tj; k < S * S; k += T * T) {
            int r = i0 + k / S - pad, s = j0 + k % S - pad;
            tile[k] = (r >= 0 && r < H && s >= 0 && s < W) ? x[((n * C + c) * H + r) * W + s] : 0.0f;
        }
        __syncthreads();
        for (int p = 0; p < K; ++p)
            for (int q = 0; q < K; ++q) acc += tile[(ti + p) * S + tj + q] * w[((m * C + c) * K + p) * K + q];
        __syncthreads();
    }
    int i = i0 + ti, j = j0 + tj;
    if (i < Ho && j < Wo) out[((n * M + m) * Ho + i) * Wo + j] = acc;
}
}
"""


@dataclass(frozen=True)
class Kernel:
    name: str
    base: str  # "const" or "tiled"
    mistake: str  # what is wrong, in words ("" for the right kernels)
    old: str = ""  # the one change that makes it wrong
    new: str = ""
    expect: tuple[str, ...] = ()  # words the FAIL line names (any of them)

    @property
    def source(self) -> str:
        base = CONST if self.base == "const" else TILED
        if self.old and base.count(self.old) != 1:
            raise ValueError(f"{self.name}: the change's text is not in the {self.base} kernel once")
        return base.replace(self.old, self.new) if self.old else base


RIGHT = (Kernel("right_const", "const", ""), Kernel("right_tiled", "tiled", ""))
WRONG = (
    Kernel("missing_barrier", "tiled", "no __syncthreads() between the tile's stores and the loads that read it",
           "        __syncthreads();\n        for (int p", "        for (int p", ("NaN", "wrong", "rel. error")),
    Kernel("off_by_one_bound", "const", "the window's column loop runs K + 1 times (q <= K)",
           "for (int q = 0; q < K; ++q) {", "for (int q = 0; q <= K; ++q) {", ("wrong", "rel. error")),
    Kernel("wrong_constant_index", "const", "the constant-memory weight index swaps the window's row and column",
           "c_w[((m * C + c) * K + p) * K + q]", "c_w[((m * C + c) * K + q) * K + p]", ("wrong", "rel. error")),
    Kernel("halo_error", "tiled", "the shared tile is loaded without its halo (T x T of its (T+K-1)^2 elements)",
           "k < S * S; k += T * T", "k < T * T; k += T * T", ("NaN", "wrong", "rel. error")),
    Kernel("missing_guard", "tiled", "no test that the thread's output lies inside the map (a tile that overhangs "
           "the map writes into the next row, the next map, or past the end)", "    if (i < Ho && j < Wo) out",
           "    out", ("wrong", "out of bounds", "past the end")),
)
KERNELS = {k.name: k for k in (*RIGHT, *WRONG)}
_MODULES: dict = {}


def module(kernel: Kernel):
    if kernel.source not in _MODULES:
        _MODULES[kernel.source] = lk.gpu.raw_module(kernel.source)
    return _MODULES[kernel.source]


def layer_function(kernel: Kernel):
    """The kernel as a conv layer function of the kit's calling convention (device arrays, stride 1)."""

    def conv(x, w, b, out, pad, stride):
        assert stride == 1, "these kernels assume stride 1"
        mod = module(kernel)
        N, C, H, W = x.shape
        M, _, K, _ = w.shape
        Ho, Wo = out.shape[2], out.shape[3]
        sizes = tuple(np.int32(v) for v in (N, C, H, W, M, K, pad, Ho, Wo))
        if kernel.base == "const":
            lk.gpu.upload_constant(mod, "c_w", w)
            lk.gpu.launch_raw(mod.get_function("conv_const"), lk.gpu.blocks(out.size), lk.gpu.TPB, (x, b, out, *sizes))
        else:
            grid = (-(-Wo // 8), -(-Ho // 8), N * M)
            lk.gpu.launch_raw(mod.get_function("conv_tiled"), grid, (8, 8), (x, w, b, out, *sizes))

    conv.__name__ = kernel.name
    return conv


def check(kernel: Kernel, layer: str = "conv2", seed: int | None = None):
    """The kit's check of ``kernel`` as ``layer`` of cifar10 (device arrays): a CheckResult."""
    return lk.check.check_layer(layer_function(kernel), "cifar10", layer, arrays="device", seed=seed, quiet=True)


def verdict(kernel: Kernel, result) -> tuple[bool, str]:
    """Whether the result is what the kernel should get: PASS for the right ones, a FAIL naming the mistake."""
    line = str(result)
    if not kernel.mistake:
        return result.passed, line
    return (not result.passed) and any(word in line for word in kernel.expect), line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write cuda_c_wrong_kernels.json into this folder")
    parser.add_argument("--layer", default="conv2", help="the cifar10 conv layer to check them on (default conv2)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    why = lk.stages.unavailable(("cuda_c",))
    if why:
        print(f"cuda_c_wrong_kernels: CUDA C cannot run here: {why}", file=sys.stderr)
        return 2
    convs = lk.get_net("cifar10").conv_layers
    if args.layer not in convs:
        print(f"cuda_c_wrong_kernels: --layer {args.layer}: cifar10's conv layers are {', '.join(convs)}",
              file=sys.stderr)
        return 2
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        print(f"cuda_c_wrong_kernels: --out {args.out} is a file: give a folder", file=sys.stderr)
        return 2
    info = lk.device.info()
    where = "CPU emulation of CUDA C" if lk.gpu.cuda_c_on_cpu() else f"GPU: {info.name}"
    print(f"# {where}; the kit's check of cifar10 {args.layer}")
    rows, ok = [], True
    for kernel in KERNELS.values():
        good, line = verdict(kernel, check(kernel, args.layer, args.seed))
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {kernel.name}: {line}")
        rows.append(dict(kernel=kernel.name, mistake=kernel.mistake, line=line, as_expected=good))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = dict(device=where, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    command=" ".join(["python", "tools/cuda_c_wrong_kernels.py", *(argv or sys.argv[1:])]),
                    layer=args.layer, all_as_expected=ok, kernels=rows)
        (args.out / "cuda_c_wrong_kernels.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
