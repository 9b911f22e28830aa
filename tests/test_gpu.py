"""labkit.gpu: launch configuration, counted launches and copies, the buffer pool, poisoning, host wrappers."""

import numpy as np
import pytest

import labkit as lk
from labkit import device, gpu

from numba import cuda  # noqa: E402  (after labkit)

ON_GPU = device.is_gpu()


@cuda.jit
def fill_index(out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = t


@cuda.jit
def fill_2d(out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = i * 1000 + j


@cuda.jit
def double(x, out):
    t = cuda.grid(1)
    if t < out.size:
        out[t] = 2 * x[t]


def twice(x, out):  # a layer function on device arrays (relu's convention)
    gpu.launch(double, out.size, gpu.flat(x), gpu.flat(out))


@pytest.mark.parametrize("n,block", [(1, 128), (127, 128), (128, 128), (129, 128), (1000, 64)])
def test_blocks_cover_every_thread_and_spare_threads_are_harmless(n, block):
    assert gpu.blocks(n, block) * block >= n > (gpu.blocks(n, block) - 1) * block
    out = cuda.to_device(np.full(n, -1.0, np.float32))
    with gpu.counting() as c:
        gpu.launch(fill_index, n, out, block=block)
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(n, dtype=np.float32))
    assert (c.launches, c.blocks, c.threads) == (1, gpu.blocks(n, block), gpu.blocks(n, block) * block)
    assert c.kernels["fill_index"] == 1


def test_two_dimensional_launch(rng):
    h, w = (int(v) for v in rng.integers(3, 40, 2))
    out = cuda.device_array((h, w), np.float32)
    gpu.launch(fill_2d, (h, w), out, block=(8, 8))
    i, j = np.indices((h, w))
    np.testing.assert_array_equal(out.copy_to_host(), i * 1000 + j)


def test_copies_are_counted_with_their_bytes(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    with gpu.counting() as c:
        d = gpu.to_device(x)
        back = gpu.to_host(d)
        gpu.to_device(x * 2, to=d)
        gpu.to_host(d, out=back)
    np.testing.assert_array_equal(back, x * 2)
    assert (c.htod, c.dtoh, c.htod_bytes, c.dtoh_bytes, c.copies) == (2, 2, 2 * x.nbytes, 2 * x.nbytes, 4)


def test_buffers_are_reused_by_role_and_shape_and_poisoned_in_checks():
    a = gpu.buffer("test.a", (4, 3))
    assert gpu.buffer("test.a", (4, 3)) is a
    assert gpu.buffer("test.a", (4, 4)) is not a and gpu.buffer("test.b", (4, 3)) is not a
    assert gpu.buffer("test.u8", 7, np.uint8).dtype == np.uint8
    gpu.to_device(np.zeros((4, 3), np.float32), to=a)
    with gpu.poisoned():
        assert gpu.poisoning()
        assert np.isnan(gpu.buffer("test.a", (4, 3)).copy_to_host()).all()
        assert (gpu.buffer("test.u8", 7, np.uint8).copy_to_host() == 255).all()
    assert not gpu.poisoning()


def test_managed_buffers_refuse_more_than_the_guard_allows():
    pool = gpu.BufferPool(managed=True, share=0.5)
    m = pool.get("x", (2, 3))
    m[...] = 1.0  # host-writable: managed memory on a GPU, a numpy array on the simulator
    assert pool.get("x", (2, 3)) is m and pool.held == 24
    if ON_GPU:
        free = gpu.free_memory()
        with pytest.raises(MemoryError, match="managed memory"):
            pool.get("huge", (int(free // 4),))
    pool.release()
    assert pool.held == 0


def test_with_copies_turns_a_device_layer_into_a_host_layer(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = np.full_like(x, np.nan)
    host_twice = gpu.with_copies(twice, "relu")
    with gpu.counting() as c:
        host_twice(x, out)
    np.testing.assert_array_equal(out, 2 * x)
    assert (c.launches, c.htod, c.dtoh) == (1, 1, 1)
    assert host_twice.device_fn is twice


def test_device_function_compiles_a_python_function_once():
    def plus(a, b):
        return a + b

    assert gpu.device_function(plus) is gpu.device_function(plus)

    @cuda.jit
    def use(out):
        out[0] = PLUS(3.0, 4.0)

    global PLUS
    PLUS = gpu.device_function(plus)
    out = cuda.device_array(1, np.float32)
    use[1, 1](out)
    assert out.copy_to_host()[0] == 7.0


def test_the_kits_given_kernels_pass_their_checks():
    for kind, fn in lk.kernels.GIVEN.items():
        layer = {"relu": "relu1", "pool": "pool1", "fc": "fc", "softmax": "softmax", "tanh": "tanh1"}[kind]
        net = "fashion" if kind == "tanh" else "cifar10"
        assert lk.check_layer(fn, net, layer, arrays="device", quiet=True).passed


@cuda.jit
def untouched_stub(out):
    t = cuda.grid(1)
    if t < out.size:
        # a kernel the student has not written yet: on a GPU its `raise` would compile away, so the launch layer
        # must refuse it before it runs; here the stub's line is only a comment, so nothing else would notice
        pass  # replace this line with your code


def test_a_kernel_that_is_still_the_todo_stub_is_not_launched():
    out = cuda.to_device(np.full(5, 7.0, np.float32))
    with pytest.raises(NotImplementedError, match="untouched_stub: replace this line with your code"):
        gpu.launch(untouched_stub, out.size, out)
    gpu.launch(fill_index, out.size, out)  # a written kernel still runs
    assert out.copy_to_host().tolist() == [0, 1, 2, 3, 4]


def test_a_written_cell_is_not_taken_for_the_stub_an_earlier_cell_of_the_same_name_was():
    """A student's stub cell and the kit's written one loaded under the same cell name (the stub check reads the
    kernel's source by that name): the written one launches. CI failed when a test compiled the solution under the
    name a student notebook's stub had registered before."""
    from labkit import nbcells

    cell = ("from numba import cuda\n@cuda.jit\ndef k(out):\n    t = cuda.grid(1)\n    if t < out.size:\n"
            "        {}\n")
    name = "<99_same_name.ipynb cell 3>"
    stub: dict = {}
    nbcells.run_cell(cell.format("pass  # replace this line with your code"), name, stub)
    out = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(NotImplementedError, match="k: replace this line"):
        gpu.launch(stub["k"], out.size, out)
    written: dict = {}
    nbcells.run_cell(cell.format("out[t] = t"), name, written)
    gpu.launch(written["k"], out.size, out)
    assert out.copy_to_host().tolist() == [0, 1, 2, 3]


def test_cuda_c_source_that_is_still_the_todo_stub_is_not_compiled():
    source = 'extern "C" __global__ void k(float* out) {\n    return;  // replace this line with your code\n}'
    with pytest.raises(NotImplementedError, match="the CUDA C source: replace this line with your code"):
        gpu.raw_module(source)


class _Interface:
    """A device array as another library shows it: only ``__cuda_array_interface__``."""

    def __init__(self, pointer, shape, strides=None):
        self.__cuda_array_interface__ = {"data": (pointer, False), "shape": shape, "strides": strides,
                                         "typestr": "<f4", "version": 3}


def test_raw_kernel_arguments_are_pointers_scalars_or_refused():
    dense = gpu._raw_arg(_Interface(4096, (2, 3)), 0)
    assert isinstance(dense, np.uint64) and int(dense) == 4096
    assert int(gpu._raw_arg(_Interface(8192, (2, 3), strides=(12, 4)), 0)) == 8192  # explicit but dense strides
    assert int(gpu._raw_arg(_Interface(8192, (1, 3), strides=(999, 4)), 0)) == 8192  # a length-1 axis: any stride
    with pytest.raises(ValueError, match="argument 2 .*not C-contiguous"):
        gpu._raw_arg(_Interface(4096, (2, 3), strides=(4, 8)), 2)  # a transposed view
    with pytest.raises(TypeError, match="argument 1 is a ndarray, not a device array"):
        gpu._raw_arg(np.zeros(3, np.float32), 1)
    n = np.int32(7)
    assert gpu._raw_arg(n, 0) is n and gpu._raw_arg(5, 0) == 5


@pytest.mark.skipif(not ON_GPU, reason="numba's device arrays have pointers only on a GPU")
def test_a_numba_array_goes_to_a_raw_kernel_as_its_pointer():
    a = cuda.to_device(np.zeros((4, 5), np.float32))
    assert int(gpu._raw_arg(a, 0)) == a.__cuda_array_interface__["data"][0]
    with pytest.raises(ValueError, match="not C-contiguous"):
        gpu._raw_arg(a[:, 1:3], 0)


def test_a_raw_kernel_above_48_kb_of_shared_memory_is_allowed_it_first():
    """cudaFuncSetAttribute's job: a cupy kernel asking for more dynamic shared memory than 48 KB fails to launch
    unless its maximum was raised first; launch_raw raises it (and never lowers it)."""

    class Kernel:  # a cupy RawKernel's part that launch_raw uses
        name = "fake"
        max_dynamic_shared_size_bytes = 48 * 1024

        def __call__(self, grid, block, args, shared_mem=0):
            assert shared_mem <= self.max_dynamic_shared_size_bytes, "launched before it was allowed"
            self.launched = shared_mem

    k = Kernel()
    lk.gpu.launch_raw(k, 1, 32, (np.int32(1),), shared_bytes=100 * 1024)
    assert k.launched == k.max_dynamic_shared_size_bytes == 100 * 1024
    lk.gpu.launch_raw(k, 1, 32, (np.int32(1),), shared_bytes=60 * 1024)
    assert k.launched == 60 * 1024 and k.max_dynamic_shared_size_bytes == 100 * 1024
