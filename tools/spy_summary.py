"""Where a process's processor time went, from ``py-spy record --format raw`` (collapsed stacks): each function's
share of the samples, by itself and with what it called, and the labkit functions' inclusive shares.

    python3 tools/spy_summary.py RAW.txt[.gz] [--top 25]

A stack is counted once per function it holds (recursion counted once). py-spy samples only threads that are
running (without ``--idle``), so the shares are of the time the process spent on processors.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import sys
from pathlib import Path

FRAME = re.compile(r"(.*) \((.*?)(:\d+)?\)$")


def read(path: Path) -> tuple[int, collections.Counter, collections.Counter]:
    """(samples, by itself: frame -> samples, with its callees: function (file) -> samples)."""
    opener = gzip.open if path.suffix == ".gz" else open
    total, alone, inclusive = 0, collections.Counter(), collections.Counter()
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.rstrip()
            if not line or " " not in line:
                continue
            stack, count = line.rsplit(" ", 1)
            n = int(count)
            total += n
            frames = stack.split(";")
            alone[frames[-1]] += n
            seen = set()
            for frame in frames:
                m = FRAME.match(frame)
                key = f"{m.group(1)} ({m.group(2)})" if m else frame
                if key not in seen and not key.startswith("thread ("):
                    seen.add(key)
                    inclusive[key] += n
    return total, alone, inclusive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if not args.raw.is_file():
        print(f"spy_summary: no file {args.raw}", file=sys.stderr)
        return 2
    total, alone, inclusive = read(args.raw)
    if not total:
        print(f"spy_summary: no samples in {args.raw}", file=sys.stderr)
        return 2
    print(f"{total} samples of running threads ({args.raw.name})\n\nby itself:")
    for frame, n in alone.most_common(args.top):
        print(f"{100 * n / total:5.1f} %  {frame[:140]}")
    print("\nlabkit's functions, with what they called:")
    for key, n in [kv for kv in inclusive.most_common() if "labkit" in kv[0]][:args.top]:
        print(f"{100 * n / total:5.1f} %  {key[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
