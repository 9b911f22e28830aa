"""labkit.conv_banks: on every conv layer of the kit's nets (and odd shapes) the conflict-free layout's loads each hit
32 banks where the natural order's do not; every k is taken exactly once, a zero-weight slot reads a pixel the
output reads anyway, and the multi-channel layers need no more k steps than before."""

import pytest

from labkit import conv_banks, nets

SHAPES = sorted({(*net.input_shape_of(name), layer.pad) for net in nets.NETS.values() for name in net.conv_layers
                 for layer in [net.layer(name)]} | {(5, 9, 7, 1), (2, 6, 13, 2), (7, 11, 5, 0)})


@pytest.mark.parametrize("ks", [16, 8], ids=["f16", "tf32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_load_hits_32_banks_and_every_k_is_taken_once(shape, ks):
    c, h, w, pad = shape
    free, natural = conv_banks.conflict_free(c, h, w, pad, ks), conv_banks.natural(c, h, w, pad, ks)
    assert set(conv_banks.bank_ways(free, ks)) == {1}
    assert sorted(s for s in free.slots if s < free.K) == list(range(c * 25))
    assert len(free.slots) % ks == 0 and free.row >= w + 2 * pad and free.channel >= (h + 2 * pad) * free.row
    reads = {free.offset(k) for k in range(free.K)}
    assert all(free.reads(s) in reads for s in range(len(free.slots)))
    if c > 2:  # an eighth more slots at most, and a step's rounding (one channel: 3 steps for 2)
        assert len(free.slots) <= len(natural.slots) * 9 // 8 + ks
    if shape[:3] in {(3, 32, 32), (16, 16, 16), (20, 8, 8), (12, 33, 33), (6, 22, 22)}:  # the kit's layers
        assert max(conv_banks.bank_ways(natural, ks)) > 1
        if ks == 16:  # the split stage 10 uses: no step more
            assert len(free.slots) == len(natural.slots)


def test_the_natural_order_is_the_kernels_order_without_the_option():
    lay = conv_banks.natural(3, 32, 32, 2, 16)
    assert (lay.row, lay.channel) == (36, 36 * 36)
    assert lay.slots[:75] == tuple(range(75)) and set(lay.slots[75:]) == {75} and lay.reads(79) == 0
    assert sum(conv_banks.bank_ways(lay, 16)) / 20 > 3  # cifar10's conv1: nearly four lanes a bank on average
