"""The order of a 5 x 5 conv's k's and the padded layout of its staged images, chosen so that each of a warp's
implicit-GEMM loads from shared memory (``labkit.tensor_cores``) hits 32 different banks.

In the tensor cores' conv a load instruction reads, for 8 consecutive pixels (a fragment's rows) and 4 lanes' k's,
the word at ``pixel + offset(k)``, ``offset(k) = c * channel + p * row + q`` for k = (c, p, q). Shared memory has 32
banks of 4-byte words; two lanes on one bank at different words wait for each other. With the window's own strides
and k in its natural order, the 4 lanes' 8-word runs overlap: 2.5 to 3.9 words a bank on the kit's layers
(``bank_ways``).

A load is conflict-free when its 4 offsets are one residue modulo 8 and differ modulo 32: then the 4 runs of 8 words
tile the 32 banks. Two things make that possible. The rows and channels of a staged image are padded to strides of
8 or 24 modulo 32, so that ``offset(k) % 8 == q % 8`` and the p's and c's spread k's over the four quarters. And the
k's are given to the MMA's slots in an order (any order is the same sum) that puts 4 k's of one residue and
different quarters into each load; where a residue's quarters run short, a slot of weight zero reads a pixel of the
right bank that the output reads anyway (so an input's NaN reaches nothing new).

Measured on an H100 (``results/h100-2026-11-26e/conv_explore_stage*.txt``): it pays on cifar10's conv1 at 50000
images only (2.154 ms against 2.203); elsewhere it is slower (conv2 2.59 against 2.40 ms, conv3 1.20 against 0.88;
the padded window takes more shared memory a block, up to twice on conv3, which was not measured apart). The
conflicts were not what held the kernel back; its staging was. ``tools/conv_timing.py`` keeps ``kperm`` only where
it was the quickest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

BANKS = 32
#: the consecutive pixels (a fragment's rows g = 0..7) of one load
ROWS = 8


@dataclass(frozen=True)
class Layout:
    """Where a staged image's words lie (``row``, ``channel``: strides in words) and which k each MMA slot takes
    (``slots[s] < K``: that k; ``K + k``: weight zero, reading where k reads)."""

    row: int
    channel: int
    K: int
    slots: tuple[int, ...]

    def offset(self, k: int, r: int = 5) -> int:
        return k // (r * r) * self.channel + k % (r * r) // r * self.row + k % r

    def reads(self, s: int, r: int = 5) -> int:
        """Where slot ``s`` reads, from a pixel's place in the staged window."""
        return self.offset(self.slots[s] % self.K, r)


def lane_slots(ks: int) -> list[list[int]]:
    """A k step's loads, each as the slot that lane t = 0..3 takes: m16n8k16's A fragment holds k = 2t, 2t + 1,
    2t + 8, 2t + 9 (four loads); m16n8k8's k = t, t + 4 (two)."""
    starts = (0, 1, 8, 9) if ks == 16 else (0, 4)
    return [[s + (2 * t if ks == 16 else t) for t in range(4)] for s in starts]


def _stride(at_least: int) -> int:
    """The smallest stride from ``at_least`` that is 8 or 24 modulo 32."""
    s = at_least
    while s % BANKS not in (8, 24):
        s += 1
    return s


def natural(C: int, H: int, W: int, pad: int, ks: int, r: int = 5) -> Layout:
    """The window's own strides and k in order, zero weights past K (what the kernel does without ``kperm``)."""
    K = C * r * r
    ww, wh = W + 2 * pad, H + 2 * pad
    steps = -(-K // ks)
    return Layout(ww, wh * ww, K, tuple(range(K)) + (K,) * (steps * ks - K))


def conflict_free(C: int, H: int, W: int, pad: int, ks: int, r: int = 5) -> Layout:
    """Padded strides and a slot order whose loads each hit 32 banks (``bank_ways`` is 1), with as few k steps as
    the natural order where the residues allow (the kit's layers)."""
    K = C * r * r
    ww, wh = W + 2 * pad, H + 2 * pad
    row = _stride(ww)
    channel = _stride(wh * row)
    plain = Layout(row, channel, K, ())
    quarters: dict[int, list[list[int]]] = defaultdict(lambda: [[] for _ in range(BANKS // ROWS)])
    for k in range(K):
        o = plain.offset(k, r) % BANKS
        quarters[o % ROWS][o // ROWS].append(k)
    groups = []
    for _, kept in sorted(quarters.items()):
        spare = [q[0] if q else None for q in kept]
        fallback = next(k for k in spare if k is not None)
        while any(kept):
            groups.append([q.pop(0) if q else K + (fallback if s is None else s) for q, s in zip(kept, spare)])
    loads = lane_slots(ks)
    while len(groups) % len(loads):
        groups.append([K + (k % K) for k in groups[0]])
    slots = [0] * (len(groups) * 4)
    for i, group in enumerate(groups):
        step, load = divmod(i, len(loads))
        for t, k in enumerate(group):
            slots[step * ks + loads[load][t]] = k
    return Layout(row, channel, K, tuple(slots))


def bank_ways(layout: Layout, ks: int, r: int = 5) -> list[int]:
    """For each load of a k step, the most lanes that meet on one bank (1: conflict-free) when a fragment's 8 rows
    are 8 consecutive pixels."""
    ways = []
    for step in range(len(layout.slots) // ks):
        for load in lane_slots(ks):
            count = [0] * BANKS
            for s in load:
                o = layout.reads(step * ks + s, r)
                for g in range(ROWS):
                    count[(g + o) % BANKS] += 1
            ways.append(max(count))
    return ways
