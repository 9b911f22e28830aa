"""Notebook 10's lesson on the tensor cores' split (labkit.lessons.precision): the fp16 parts of a value hold what the
kernel's split holds, the figure draws them, and one layer computed three ways is compared with float64 on a poisoned
output (CPU emulation of the tensor cores' CUDA C here; the real layer on a GPU)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import labkit as lk  # noqa: E402
from labkit.lessons import precision  # noqa: E402


def test_big_and_small_fp16_parts_hold_the_value_to_fp32s_last_bits():
    rng = np.random.default_rng(7)
    # within fp16's normal range for both parts (a layer's values; fp16 ends at 65504, and its subnormals below
    # 6.1e-5 hold fewer bits)
    a = (rng.choice([-1.0, 1.0], 20000) * np.exp(rng.uniform(-4, 4, 20000))).astype(np.float32)
    big, small = precision.split_fp16(a)
    assert big.dtype == np.float16 and small.dtype == np.float16
    rel = np.abs(precision.joined(big, small) - a.astype(np.float64)) / np.abs(a)
    alone = np.abs(big.astype(np.float64) - a) / np.abs(a)
    assert rel.max() <= 2.0 ** -22  # two 11-bit parts: 22 of fp32's 24 bits
    assert np.median(alone) > 2.0 ** -14 > 2.0 ** -20 > np.median(rel)  # the small part is what holds the rest


def test_the_figure_draws_the_value_and_its_two_parts():
    fig, (a, big, small) = precision.draw_split(0.1)
    assert abs(a - np.float32(0.1)) == 0 and abs(big + small - a) < 2.0 ** -22 * a
    assert len(fig.axes[0].patches) == 24 + 11 + 11  # every significant bit of the three rows, one cell each
    fig, (a, big, small) = precision.draw_split(0.5)  # fp16 holds 0.5 exactly: nothing left
    assert small == 0 and "nothing left" in " ".join(t.get_text() for t in fig.axes[0].texts)


def test_one_layer_three_ways_against_float64():
    s09 = lk.from_stage("09")
    rows = precision.three_ways(s09.conv_pooled, images=2, repeat=1)
    assert [r.name for r in rows] == list(precision.WAYS)
    assert all(np.isfinite(r.error) and r.error < 1e-5 and r.low <= r.seconds <= r.high for r in rows), rows
    assert "fp16 split" in precision.table(rows)


def test_a_way_that_writes_nothing_shows_as_no_answer():
    rows = precision.three_ways(lambda *args: None, images=2, repeat=1)
    assert rows[0].error == float("inf") and np.isfinite(rows[1].error)


@pytest.mark.parametrize("name", ["precision"])
def test_the_lesson_is_left_out_of_releases_before_the_tensor_cores(name):
    from labkit.course import leave_out

    entry = next(e for e in leave_out.LEAVE_OUT if e.name == name)
    assert entry.out_of("09") and not entry.out_of("10")
