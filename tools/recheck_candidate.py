"""Check one stage-09 tuning candidate on one conv layer many times (fresh random inputs each time): a candidate the
tuner saw FAIL once and PASS under another name with the same compiled kernel is either racy or was failed by
something else; this prints every check's line.

    python3 tools/recheck_candidate.py cifar10 conv2 "09 tiles weights_in=shared tpb=128 split=3 rows=4" --times 20
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("net")
    ap.add_argument("layer")
    ap.add_argument("candidate")
    ap.add_argument("--times", type=int, default=20)
    args = ap.parse_args(argv)
    s09 = lk.stages.from_stage("09")
    by_name = {c.name: c for c in s09.candidates(args.layer)}
    by_name.update({c.name: c for c in s09.tile_candidates(every=True)})
    if args.candidate not in by_name:
        print(f"recheck_candidate: no candidate {args.candidate!r}; candidates: {', '.join(by_name)}", file=sys.stderr)
        return 2
    c = by_name[args.candidate]
    spec = lk.get_net(args.net)
    group = lk.tune._group_of(spec, args.layer, c.fused)
    failed = 0
    for i in range(args.times):
        result = lk.check.check_group(c.fn, spec, group, arrays="device", quiet=True, seed=i)
        failed += not result.passed
        print(f"{i:3d} {result}")
    print(f"{failed} of {args.times} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
