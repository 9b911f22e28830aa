"""Conv kernels for the tests: the right thread-per-output one, and the bugs a course meets (for the checks' and the
grader's tests, and for trying them on a GPU). Each has the layer convention conv(x, w, b, out, pad, stride) on
device arrays."""

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
