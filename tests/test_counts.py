"""labkit.counts on a GPU machine: the count runs in a child under the simulator, on the stage notebook's kernel
cells, and must find there the very functions the notebook passed (bound names, or an earlier stage's given code)."""

import labkit as lk
from labkit import counts


def test_the_child_finds_bound_names_and_earlier_stages_given_code():
    s04, s07 = lk.from_stage("04"), lk.from_stage("07")
    caller = {"s04": s04, "s07": s07, "conv_unroll_tiled": s07.conv_unroll_tiled}
    assert s07.conv_unroll_tiled.__name__ != "conv_unroll_tiled"  # why a function's own name is not enough
    paths = {"04 padded": counts._path_of(s04.conv_padded, caller),
             "07 unroll + tiled": counts._path_of(s07.conv_unroll_tiled, {"s07": s07})}
    assert paths == {"04 padded": "@04.conv_padded", "07 unroll + tiled": "@07.conv_unroll_tiled"}
    assert counts._path_of(s07.conv_unroll_tiled, caller) == "conv_unroll_tiled"
    # stage 08's kernel cells do not bind s04 or s07: the child still counts both (what a GPU machine runs)
    rows = counts._in_child("08", paths, "cifar10", "conv2", {})
    assert [r.name for r in rows] == list(paths)
    assert all(r.launches >= 1 and r.totals["global load"] > 0 for r in rows)
    padded, unrolled = rows
    assert unrolled.per_output("shared load") > 0 == padded.per_output("shared load")
