"""Conv kernels for the tests: the right thread-per-output one, and the bugs a course meets (for the checks' and the
grader's tests, and for trying them on a GPU). Each has the layer convention conv(x, w, b, out, pad, stride) on
device arrays; the split-K fc at the end has fc(x, w, b, out)."""

import math

from numba import cuda, float32

from labkit import gpu


@cuda.jit(device=True)
def _output_element(x, w, b, n, m, i, j, pad, stride):
    """out[n, m, i, j]: the bias plus every input channel's window, inputs outside the image counted as zero."""
    _, C, H, W = x.shape
    K = w.shape[2]
    acc = b[m]
    for c in range(C):
        for p in range(K):
            for q in range(K):
                r, col = i * stride + p - pad, j * stride + q - pad
                if 0 <= r < H and 0 <= col < W:
                    acc += x[n, c, r, col] * w[m, c, p, q]
    return acc


@cuda.jit
def _thread_per_output(x, w, b, out, pad, stride, limit):
    M = w.shape[0]
    Ho, Wo = out.shape[2], out.shape[3]
    t = cuda.grid(1)
    if t < limit:
        j, i, m, n = t % Wo, (t // Wo) % Ho, (t // (Wo * Ho)) % M, t // (Wo * Ho * M)
        out[n, m, i, j] = _output_element(x, w, b, n, m, i, j, pad, stride)


def device_conv(x, w, b, out, pad, stride):
    """Right: one thread per output element, bounds tested (no padded copy)."""
    gpu.launch(_thread_per_output, out.size, x, w, b, out, pad, stride, out.size)


def conv_no_guard(x, w, b, out, pad, stride):
    """No guard: the spare threads of the last block write past the end of out (a GPU does not check bounds)."""
    gpu.launch(_thread_per_output, out.size, x, w, b, out, pad, stride, 2 ** 31 - 1)


def conv_short_grid(x, w, b, out, pad, stride):
    """The grid stops one output row short: the last row of the last map of the last image is never written."""
    gpu.launch(_thread_per_output, out.size, x, w, b, out, pad, stride, out.size - out.shape[3])


@cuda.jit
def _adds_per_output(x, w, b, out, pad, stride):
    M = w.shape[0]
    Ho, Wo = out.shape[2], out.shape[3]
    t = cuda.grid(1)
    if t < out.size:
        j, i, m, n = t % Wo, (t // Wo) % Ho, (t // (Wo * Ho)) % M, t // (Wo * Ho * M)
        out[n, m, i, j] += _output_element(x, w, b, n, m, i, j, pad, stride)


def conv_adds_onto_out(x, w, b, out, pad, stride):
    """Each thread adds its sum onto out (``+=``) that nothing zeroed first: onto the check's NaN poison."""
    gpu.launch(_adds_per_output, out.size, x, w, b, out, pad, stride)


@cuda.jit
def _zero(out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = 0.0


@cuda.jit
def _channel_partial_sums(x, w, b, out, pad, stride, atomic):
    """One thread per (output element, input channel), each adding its channel's share into out."""
    N, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    t = cuda.grid(1)
    if t < N * M * Ho * Wo * C:
        c, e = t % C, t // C
        j, i, m, n = e % Wo, (e // Wo) % Ho, (e // (Wo * Ho)) % M, e // (Wo * Ho * M)
        acc = b[m] if c == 0 else float32(0.0)
        for p in range(K):
            for q in range(K):
                r, col = i * stride + p - pad, j * stride + q - pad
                if 0 <= r < H and 0 <= col < W:
                    acc += x[n, c, r, col] * w[m, c, p, q]
        if atomic:
            cuda.atomic.add(out, (n, m, i, j), acc)
        else:
            out[n, m, i, j] += acc


def conv_channel_race(x, w, b, out, pad, stride):
    """The channel race: plain += from C threads into one element."""
    gpu.launch(_zero, out.size, gpu.flat(out))
    gpu.launch(_channel_partial_sums, out.size * x.shape[1], x, w, b, out, pad, stride, False)


def conv_channel_atomic(x, w, b, out, pad, stride):
    """The same sums through cuda.atomic.add: correct (and slow)."""
    gpu.launch(_zero, out.size, gpu.flat(out))
    gpu.launch(_channel_partial_sums, out.size * x.shape[1], x, w, b, out, pad, stride, True)


@cuda.jit
def _four_images_per_block_row(x, w, b, out, pad, stride):
    N, M = x.shape[0], w.shape[0]
    Ho, Wo = out.shape[2], out.shape[3]
    e = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if e < M * Ho * Wo:
        j, i, m = e % Wo, (e // Wo) % Ho, e // (Wo * Ho)
        for k in range(4):
            n = cuda.blockIdx.y * 4 + k
            if n < N:
                out[n, m, i, j] = _output_element(x, w, b, n, m, i, j, pad, stride)


def conv_grid_bug(x, w, b, out, pad, stride):
    """Four images per block row, but the grid's y is N // 4 (rounded down, at least 1): right for batches 1 to 4
    and every multiple of 4, wrong for 5 or 17."""
    N, M, Ho, Wo = out.shape
    gpu.launch_grid(_four_images_per_block_row, (gpu.blocks(M * Ho * Wo), max(N // 4, 1)), gpu.TPB,
                    x, w, b, out, pad, stride)


@cuda.jit
def _partial_sums_but_plane_1(x, w, part, kchunk):
    """Block z adds inputs z * kchunk .. (z + 1) * kchunk into plane z of the partial sums; the bug: block z = 1
    returns, so plane 1 keeps whatever the buffer held."""
    N, K = x.shape
    o, n, z = cuda.grid(1), cuda.blockIdx.y, cuda.blockIdx.z
    if o < w.shape[0] and z != 1:
        acc = float32(0.0)
        for k in range(z * kchunk, min((z + 1) * kchunk, K)):
            acc += x[n, k] * w[o, k]
        part[z, n, o] = acc


@cuda.jit
def _sum_planes(part, b, out):
    S, N, OUT = part.shape
    t = cuda.grid(1)
    if t < N * OUT:
        n, o = t // OUT, t % OUT
        total = b[o]
        for z in range(S):
            total += part[z, n, o]
        out[n, o] = total


def fc_split_k_plane_1_unwritten(x, w, b, out, splits=3):
    """A split-K fc (stage 10's shape of it) whose reduction reads a plane of partial sums no block wrote: the
    planes come from the kit's pool, which a check fills with NaN."""
    N, K = x.shape
    kchunk = math.ceil(K / splits)
    part = gpu.buffer("test split-K partial sums", (math.ceil(K / kchunk), N, w.shape[0]))
    gpu.launch_grid(_partial_sums_but_plane_1, (gpu.blocks(w.shape[0], 32), N, part.shape[0]), 32, x, w, part, kchunk)
    gpu.launch(_sum_planes, N * w.shape[0], part, b, out)


#: outputs left NaN for each cause the engine's diagnosis tells apart (``labkit.engine.NanCauses``): the kernel and
#: the layer of cifar10 it computes
NAN_BUGS = {"unwritten": (conv_short_grid, "conv1"), "added": (conv_adds_onto_out, "conv1"),
            "read": (fc_split_k_plane_1_unwritten, "fc")}


# ------------------------------------------------------------------ the stages' own kernels, one line wrong

def patched_stage(stage: str, old: str, new: str, solutions=None) -> dict:
    """The kernel cells of the kit's solution of ``stage`` with ``old`` replaced by ``new`` (it must occur exactly
    once, so a solution that changed fails the test that relies on it instead of testing nothing), executed in a
    fresh namespace as ``labkit.nbcells.load`` executes them."""
    from pathlib import Path

    from labkit import nbcells, stages

    path = Path(solutions or stages.solutions_folder()) / stages.STAGES[stage].notebook
    cells = nbcells.tagged_cells(nbcells.read(path))
    found = [i for i, (_, src) in enumerate(cells) if old in src]
    total = sum(src.count(old) for _, src in cells)
    if total != 1:
        raise AssertionError(f"{path.name}: {old!r} occurs {total} times in the kernel cells, not once")
    ns = {"__name__": f"patched_{stage}"}
    for k, (index, src) in enumerate(cells):
        if k == found[0]:
            src = src.replace(old, new)
        nbcells.run_cell(src, f"<patched {path.name} cell {index}>", ns)
    return ns


#: kernels of the stages wrong only past a boundary that one tile, one block row or a few images never reach: (stage,
#: variant, the solution's text, the wrong text, what is wrong, the case of ``labkit.simulator.CASES`` that crosses
#: that boundary). Each is the stage's solution with that one edit.
BOUNDARY_BUGS = {
    "02 block per map, one pass of the block": (
        "02", "gpu_block_per_map",
        "for e in range(cuda.threadIdx.x, Ho * Wo, cuda.blockDim.x):",
        "for e in range(cuda.threadIdx.x, min(Ho * Wo, cuda.blockDim.x), cuda.blockDim.x):",
        "a block's threads cover one pass of a map (a map of more pixels than threads is left unwritten)", "tiles"),
    "02 grid capped at 32 images": (
        "02", "gpu_block_per_map",
        "(conv_block_per_map_kernel, (M, N),", "(conv_block_per_map_kernel, (M, min(N, 32)),",
        "grid y capped at 32 images", "images"),
    "04 pad launch capped at 32 images": (
        "04", "batched_padded",
        "lk.gpu.launch(pad_kernel, xp.size, x, xp, pad)",
        "lk.gpu.launch(pad_kernel, min(N, 32) * C * (H + 2 * pad) * (W + 2 * pad), x, xp, pad)",
        "the pad kernel's launch covers at most 32 images", "images"),
    "04 pad launch capped at 64 images": (
        "04", "batched_padded",
        "lk.gpu.launch(pad_kernel, xp.size, x, xp, pad)",
        "lk.gpu.launch(pad_kernel, min(N, 64) * C * (H + 2 * pad) * (W + 2 * pad), x, xp, pad)",
        "the pad kernel's launch covers at most 64 images", "images"),
    "05 tile loader without the column offset": (
        "05", "tiled_16",
        "r, q = row0 + e // IN - pad, col0 + e % IN - pad",
        "r, q = row0 + e // IN - pad, e % IN - pad",
        "the input tile is loaded from the first tile column whatever the block's column", "tiles"),
    "05 grid capped at 32 images": (
        "05", "tiled_8",
        "(tiles, M, N), (T, T)", "(tiles, M, min(N, 32)), (T, T)",
        "grid z capped at 32 images", "images"),
    "05 grid capped at 64 images": (
        "05", "tiled_8",
        "(tiles, M, N), (T, T)", "(tiles, M, min(N, 64)), (T, T)",
        "grid z capped at 64 images", "images"),
    "07 unroll without its last, smaller chunk": (
        "07", "unroll_tiled",
        "for n0 in range(0, N, chunk):", "for n0 in range(0, N - N % chunk, chunk):",
        "the images of a last chunk smaller than the others are never unrolled nor multiplied", "images"),
    "07 matmul without the M-tile offset": (
        "07", "unroll_tiled",
        "m, col, n = cuda.blockIdx.y * T + ty,", "m, col, n = ty,",
        "every block row computes the first tile of output maps", "output maps"),
    "07 matmul without the K remainder": (
        "07", "unroll_tiled",
        "for k0 in range(0, KK, T):", "for k0 in range(0, KK - T + 1, T):",
        "the K loop stops at the last whole tile", "output maps"),
    "08 implicit GEMM without the M-tile offset": (
        "08", "implicit_gemm",
        "m, col, n = cuda.blockIdx.y * T + ty,", "m, col, n = ty,",
        "every block row computes the first tile of output maps", "output maps"),
    "09 pooled kernel without the block offset": (
        "09", "pooled",
        "t = cuda.grid(1)\n        if t < N * Ho * Wo:", "t = cuda.threadIdx.x\n        if t < N * Ho * Wo:",
        "the thread index within its block taken for the global one: the second block redoes the first", "tiles"),
}
