"""The self-checks must pass correct code and catch each kind of wrong code with a useful line."""

import numpy as np
import pytest

import labkit as lk
from labkit import check, device, gpu, simulator

from numba import cuda  # noqa: E402  (after labkit, which makes a late NUMBA_ENABLE_CUDASIM count)

ON_GPU = device.is_gpu()


def good_conv(x, w, b, out, pad, stride):
    out[...] = lk.conv2d(x, w, b, pad, stride, accumulate="float64")


def good_relu(x, out):
    out[...] = np.maximum(x, 0)


@cuda.jit
def _relu_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out.reshape(x.size)[i] = max(x.reshape(x.size)[i], 0.0)


def gpu_relu(x, out):  # device arrays in, device arrays out
    gpu.launch(_relu_kernel, x.size, x, out, block=64)


@pytest.mark.parametrize("net,layer", [("cifar10", "conv1"), ("cifar10", "conv3"), ("fashion", "conv2")])
def test_correct_conv_passes_on_every_batch_size(net, layer):
    r = check.check_layer(good_conv, net, layer, quiet=True)
    assert r.passed and r.error < 1e-6 and r.batches == check.default_batches()
    assert str(r).startswith(f"{layer}: PASS (rel. error")


def test_cpu_target_checks_the_real_sizes():
    seen = []

    def spy(x, w, b, out, pad, stride):
        seen.append((x.shape, w.shape))
        good_conv(x, w, b, out, pad, stride)

    assert check.check_layer(spy, "cifar10", "conv2", target="cpu", batches=(3,), quiet=True)
    # the batch, then again on new arrays where its own were (labkit.freed: no other batch had its weights' shapes)
    assert seen == [((3, 16, 16, 16), (20, 16, 5, 5))] * 2


def test_gpu_target_is_shrunk_under_the_simulator_with_distinct_channel_counts():
    seen = []

    def spy(x, w, b, out, pad, stride):
        seen.append((x.shape, w.shape))
        good_conv(x, w, b, out, pad, stride)

    r = check.check_layer(spy, "cifar10", "conv2", quiet=True)
    (xs, ws), *_ = seen
    if ON_GPU:  # a real GPU checks the real layer at the real batch sizes
        assert (xs[1:], ws) == ((16, 16, 16), (20, 16, 5, 5)) and r.batches == (*check.BATCHES, *simulator.BATCHES)
    else:
        assert r.batches == simulator.BATCHES and any(b > 4 and b % 2 for b in r.batches)
        assert xs[1] == ws[1] and ws[0] != ws[1], "M must differ from C so swapped indices fail"
        assert xs[2] != xs[3], "non-square images catch swapped row/column indices"


def test_inputs_are_fresh_on_every_call():
    firsts = []

    def spy(x, out):
        firsts.append(float(x.flat[0]))
        good_relu(x, out)

    check.check_layer(spy, "cifar10", "relu1", quiet=True)
    check.check_layer(spy, "cifar10", "relu1", quiet=True)
    assert len(set(firsts)) == len(firsts)


def test_a_seed_reproduces_a_case():
    a, b = [], []
    check.check_layer(lambda x, out: (a.append(x.copy()), good_relu(x, out)), "cifar10", "relu1", seed=7, quiet=True)
    check.check_layer(lambda x, out: (b.append(x.copy()), good_relu(x, out)), "cifar10", "relu1", seed=7, quiet=True)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


def test_unwritten_elements_are_caught_and_located():
    def lazy(x, w, b, out, pad, stride):
        full = lk.conv2d(x, w, b, pad, stride, accumulate="float64")
        flat = out.reshape(len(out), -1)
        flat[:, :-1] = full.reshape(len(out), -1)[:, :-1]  # the last element of every image never written

    r = check.check_layer(lazy, "cifar10", "conv1", quiet=True)
    assert not r.passed and "unwritten (still NaN)" in r.detail
    assert "out[0, " in r.detail and "[seed " in str(r)
    assert "TODO stub" not in r.detail


def test_a_kernel_that_writes_nothing_is_told_it_may_still_be_the_stub():
    r = check.check_layer(lambda x, out: None, "cifar10", "relu1", quiet=True)
    assert not r.passed and "nothing was written" in r.detail and "TODO stub" in r.detail


def test_a_kernel_launched_into_another_array_is_told_so():
    def elsewhere(x, out):
        tmp = cuda.device_array(out.shape, np.float32)
        gpu_relu(x, tmp)

    r = check.check_layer(elsewhere, "cifar10", "relu1", arrays="device", quiet=True)
    assert not r.passed and "1 kernel launch ran" in r.detail and "another array" in r.detail
    assert "TODO stub" not in r.detail


#: what the line of each kind of NaN output (``buggy_kernels.NAN_BUGS``) must say
NAN_WORDS = {"unwritten": ["is unwritten (still NaN), expected"],
             "added": ["is NaN although your kernel wrote it, expected", "it added onto out's initial contents",
                       "`+=` with no first write: start the sum from 0 or from the bias, and write it with `=`"],
             "read": ["is NaN although your kernel wrote it, expected", "it read data that was never written",
                      "a plane of partial sums"]}


@pytest.mark.parametrize("kind", ["unwritten", "added", "read"])
def test_nan_outputs_are_told_by_their_cause(kind):
    """The engine re-runs a layer whose output holds NaN on two finite fills of out: fills that come back were
    never written, values moving with the fill were added onto it, NaN left were read from the kit's NaN-poisoned
    buffers. Only the first may say that nothing was written (all three outputs here are NaN, or nearly)."""
    from buggy_kernels import NAN_BUGS

    fn, layer = NAN_BUGS[kind]
    r = check.check_layer(fn, "cifar10", layer, arrays="device", quiet=True)
    nan = int(r.detail.split(" of ")[0])
    assert not r.passed and r.nan is not None and getattr(r.nan, kind) == nan > 0, (r.nan, r.detail)
    assert r.nan.unwritten + r.nan.written == nan
    assert all(w in r.detail for w in NAN_WORDS[kind]), r.detail
    assert ("still NaN" in r.detail) == (kind == "unwritten") and "nothing was written" not in r.detail, r.detail


def test_nhwc_values_written_into_an_nchw_out_get_the_layout_hint():
    def nhwc(x, w, b, out, pad, stride):
        y = lk.conv2d(x, w, b, pad, stride, accumulate="float64")
        out.reshape(-1)[...] = y.transpose(0, 2, 3, 1).reshape(-1)

    r = check.check_layer(nhwc, "cifar10", "conv2", target="cpu", batches=(2,), quiet=True)
    assert not r.passed and "NHWC" in r.detail and "out[n, m, i, j]" in r.detail


def test_off_by_one_halo_is_caught_with_the_first_wrong_element():
    def shifted(x, w, b, out, pad, stride):
        out[...] = lk.conv2d(np.roll(x, 1, axis=3), w, b, pad, stride)

    r = check.check_layer(shifted, "cifar10", "conv1", quiet=True)
    assert not r.passed and r.error > 1e-2
    assert "first wrong element" in r.detail and "expected" in r.detail


def test_swapped_channel_indices_are_caught():
    def swapped(x, w, b, out, pad, stride):
        m, c = w.shape[:2]
        wt = np.ascontiguousarray(w.reshape(-1)[: m * c * 25].reshape(c, m, 5, 5).transpose(1, 0, 2, 3))
        out[...] = lk.conv2d(x, wt, b, pad, stride)

    assert not check.check_layer(swapped, "cifar10", "conv2", quiet=True).passed


def test_a_raising_function_gives_one_line_naming_the_error():
    def broken(x, out):
        raise IndexError("index 9 is out of bounds for axis 2 with size 9")

    r = check.check_layer(broken, "cifar10", "relu1", quiet=True)
    assert not r.passed and "relu1 raised IndexError: index 9 is out of bounds" in str(r)
    assert "\n" not in str(r)


def test_a_todo_stub_says_not_implemented_and_names_the_function():
    def todo(x, out):
        raise NotImplementedError("replace this line with your code")

    line = str(check.check_layer(todo, "cifar10", "relu1", quiet=True))
    assert "not implemented yet: todo() is still the TODO stub" in line


def test_wrong_layout_and_dtype_get_clear_messages():
    expected = np.zeros((2, 16, 8, 6), np.float32)
    r = check.compare("conv1", np.zeros((2, 8, 6, 16), np.float32), expected)
    assert not r.passed and "NHWC" in r.detail and "NCHW" in r.detail
    r = check.compare("conv1", np.zeros((2, 16, 8, 6), np.float64), expected)
    assert not r.passed and "float64" in r.detail and "float32" in r.detail
    r = check.compare("conv1", [1, 2], expected)
    assert not r.passed and "list" in r.detail


def test_device_arrays_path_with_a_real_numba_kernel():
    r = check.check_layer(gpu_relu, "cifar10", "relu2", arrays="device", quiet=True)
    assert r.passed, str(r)


def test_host_kernel_that_forgets_to_copy_back_fails():
    def forgot(x, out):
        d_out = cuda.device_array_like(out)
        _relu_kernel[(x.size + 63) // 64, 64](cuda.to_device(x), d_out)  # result never copied into out

    r = check.check_layer(forgot, "cifar10", "relu1", quiet=True)
    assert not r.passed and "unwritten" in r.detail


def test_check_network_chains_the_layers_through_the_engine():
    assert check.check_network(lk.Variant({"conv": good_conv}, target="cpu"), "cifar10", quiet=True).passed

    def first_image_only(x, w, b, out, pad, stride):
        out[:1] = lk.conv2d(x[:1], w, b, pad, stride)

    r = check.check_network(lk.Variant({"conv": first_image_only}, target="cpu"), "cifar10", quiet=True)
    assert not r.passed and "not finite at batch size 3" in r.detail


def test_check_network_poisons_the_intermediates_a_layer_never_writes():
    def no_conv2(x, w, b, out, pad, stride):
        if w.shape[1] != 16:  # conv2 is the only layer with 16 input maps: it leaves its output alone
            good_conv(x, w, b, out, pad, stride)

    r = check.check_network(lk.Variant({"conv": no_conv2}, target="cpu"), "cifar10", batches=(1,), quiet=True)
    assert not r.passed and "not finite at batch size 1" in r.detail


def test_not_callable_and_flatten_are_refused():
    with pytest.raises(TypeError, match="conv1"):
        check.check_layer(None, "cifar10", "conv1")
    with pytest.raises(ValueError, match="flatten is a reshape"):
        check.check_layer(lambda x, out: None, "cifar10", "flatten")
    with pytest.raises(KeyError, match="conv9"):
        check.check_layer(good_relu, "cifar10", "conv9")


def test_check_variant_checks_each_layer_it_computes_at_the_batches_asked():
    seen = []

    def spy(x, w, b, out, pad, stride):
        seen.append(x.shape[0])
        good_conv(x, w, b, out, pad, stride)

    variant = lk.Variant({"conv": spy, "relu": good_relu}, target="cpu")
    results = lk.check_variant(variant, "cifar10", quiet=True, batches=(1, 3))
    assert [r.name for r in results] == ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3", "cifar10 forward"]
    assert all(r.passed for r in results) and seen == [1, 3] * 3 + [1] * 3 + [3] * 3  # layers, then the chain


def test_check_variant_covers_each_net_and_reuses_shared_results():
    calls = []

    def relu(x, out):
        calls.append(1)
        good_relu(x, out)

    def tanh(x, out):
        out[...] = np.tanh(x)

    done = {}
    v = lk.Variant({"relu": relu, "tanh": tanh}, target="cpu", nets=("cifar10", "fashion"))
    names = [r.name for r in lk.check_variant(v, quiet=True, done=done)]
    assert names == ["relu1", "relu2", "relu3", "cifar10 forward", "fashion tanh1", "fashion forward"]
    first = len(calls)
    again = lk.check_variant(v, quiet=True, done=done, network=False)
    assert len(calls) == first and all(again)  # shared functions are not checked twice


def test_a_grid_right_only_for_some_batch_sizes_fails_at_an_odd_one():
    """Four images per block row with grid y = N // 4: batches 1 to 4 pass, 5 (simulator) or 17 leave images
    unwritten. Run on an H100 too (results/h100-2026-11-23/bugs.txt)."""
    from buggy_kernels import conv_grid_bug

    r = lk.check_layer(conv_grid_bug, "cifar10", "conv2", arrays="device", quiet=True)
    odd = (simulator.BATCHES if device.is_simulated() else check.BATCHES)[-1]  # 67 or 17: a grid row's misses
    assert not r.passed and "unwritten (still NaN)" in r.detail and f"at batch size {odd}" in r.detail, str(r)
    assert f"first out[{odd // 4 * 4}, " in r.detail, r.detail


def test_a_kernel_without_a_guard_fails_even_where_a_gpu_checks_no_bounds():
    """Fashion's conv1 has 12 x 66 x 66 outputs per image, not a multiple of the block: the last block's spare
    threads write past the end of out. The simulator raises at the first such index; a GPU writes there unseen,
    and the check finds the values in the NaN guard after out (labkit.engine.OUT_GUARD)."""
    from buggy_kernels import conv_no_guard, device_conv

    r = lk.check_layer(conv_no_guard, "fashion", "conv1", arrays="device", quiet=True)
    assert not r.passed and "out of bounds" in r.detail, str(r)
    assert lk.check_layer(device_conv, "fashion", "conv1", arrays="device", quiet=True).passed


@pytest.mark.skipif(ON_GPU, reason="writes past the end through the simulator's host array (the GPU test is above)")
@pytest.mark.parametrize("value", [1.0, np.nan])  # NaN: what a spare thread writes after reading an input's margin
def test_values_written_past_the_end_of_out_are_found_by_the_guard(value):
    """What a GPU does with an unguarded thread, done here by hand: right values in out, three more after its end.
    The simulator's own bounds checks cannot see this write; only the guard after out can."""
    from buggy_kernels import device_conv

    def spills(x, w, b, out, pad, stride):
        device_conv(x, w, b, out, pad, stride)
        flat = out._ary.reshape(-1)  # the simulator's numpy view; its memory goes on into the guard
        np.lib.stride_tricks.as_strided(flat, shape=(flat.size + 3,))[flat.size:] = value

    r = lk.check_layer(spills, "cifar10", "conv2", arrays="device", quiet=True)
    assert not r.passed and "3 value(s) written out of bounds, past the end of out" in r.detail, str(r)


def test_a_sum_that_cancels_is_judged_against_its_terms_and_a_missing_term_still_fails():
    """After a ReLU a case can keep only outputs that are small differences of large terms: fp32 rounding of a
    correct kernel is then large next to the output itself (1.5e-5 on an H100) but tiny next to the terms, which is
    what ``magnitude`` measures against; a missing term stays far above the tolerance either way."""
    from labkit.check import compare, magnitude
    from labkit.nets import Layer

    rng = np.random.default_rng(5)
    layer = Layer("fc", "fc", out=1)
    x = rng.standard_normal((1, 400)).astype(np.float32)
    w = (rng.standard_normal((1, 400)) / 20).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    b = (-exact[0] + 0.0065).astype(np.float32)  # the output: 0.0065 left of terms ~ 0.04 each
    weights = {"fc.weight": w, "fc.bias": b}
    expected = (exact + b.astype(np.float64)).astype(np.float32)
    terms = (x[0] * w[0]).astype(np.float32)
    rounded = np.float32(0)
    for t in terms[::-1]:  # one fp32 summation order among many
        rounded = np.float32(rounded + t)
    got = np.array([[rounded + b[0]]], np.float32)
    scale = magnitude(layer, x, weights)
    assert scale.shape == expected.shape and (scale >= np.abs(expected)).all()
    own = compare("fc", got, expected)  # against the output's own size: rounding looks like an error
    fair = compare("fc", got, expected, scale=scale)
    assert fair.passed and fair.error < 1e-6 and own.error > fair.error * 100
    missing = np.array([[rounded - terms[7] + b[0]]], np.float32)
    assert not compare("fc", missing, expected, scale=scale).passed
