"""labkit.upload: the uint8 path converts on the device to exactly the float32 input the CPU prepares."""

import numpy as np

import labkit as lk
from labkit import data, upload


def test_bytes_converted_on_the_device_give_the_cpu_prepared_input_and_the_same_predictions():
    from numba import cuda

    raw = upload.stored_bytes(3)
    assert raw.dtype == np.uint8 and raw.shape == (3, 3, 32, 32)
    flat = cuda.to_device(np.full(raw.size, np.nan, np.float32))
    lk.gpu.launch(upload.bytes_to_input, raw.size, cuda.to_device(raw.reshape(-1)),
                  cuda.to_device(data._CIFAR_LUT), flat)
    assert np.array_equal(flat.copy_to_host().reshape(raw.shape), data.to_input("cifar10", raw))


def test_end_to_end_times_both_paths():
    def zero_conv(x, w, b, out, pad, stride):  # cheap on the simulator: this test is about the two upload paths
        out.copy_to_device(np.zeros(out.shape, np.float32))

    variant = lk.Variant({**lk.kernels.GIVEN, "conv": zero_conv}, arrays="device")
    r = upload.end_to_end(variant, images=2, repeat=2)
    assert r["float32_bytes"] == 4 * r["uint8_bytes"] == 4 * 2 * 3 * 32 * 32
    assert r["float32_upload_s"] > 0 and r["uint8_upload_s"] > 0 and r["predictions_equal"] is True
    assert r["inputs_equal"] is True
    assert r["uint8_upload_range"][0] <= r["uint8_upload_s"] <= r["uint8_upload_range"][1]


def test_end_to_end_catches_a_bytes_path_that_makes_another_input(monkeypatch):
    """A zero conv makes both paths' predictions agree whatever the input is: the input comparison must not."""
    from labkit import whole

    def zero_conv(x, w, b, out, pad, stride):
        out.copy_to_device(np.zeros(out.shape, np.float32))

    real = whole.input_table
    monkeypatch.setattr(whole, "input_table", lambda net: real(net)[::-1].copy())  # a reversed byte table
    r = upload.end_to_end(lk.Variant({**lk.kernels.GIVEN, "conv": zero_conv}, arrays="device"), images=2, repeat=1)
    assert r["predictions_equal"] is True and r["inputs_equal"] is False
