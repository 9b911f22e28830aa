"""Why one process launches kernels slower than another (issue 32's open point): fresh processes, one after another,
each pinned to the same core, time the same things; the spread between processes is printed per condition.

    python tools/launch_spread.py [--processes 8] [--core N] [--out DIR]

Each process times (medians of 15): 32 empty kernel launches between two CUDA events (the grader's probe), the same
launches timed on the host, and a pure-Python loop (no GPU: the core's own speed), and reads the core's clock from
/proc/cpuinfo. Conditions: as the grader starts children; PYTHONHASHSEED=0 (dicts laid out the same in every
process); `setarch -R` (no address-space randomisation); both. If a condition's launch spread collapses, that is the
cause; if the Python loop spreads as much as the launches, the core itself (its clock, a neighbour on the host) is.
On a machine without a GPU (the simulator) it still runs, for the tool's own test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, statistics, sys, time
core = int(sys.argv[1])
os.sched_setaffinity(0, {core})
from numba import cuda

@cuda.jit
def empty():
    pass

def burst():
    start, end = cuda.event(), cuda.event()  # timing events by default
    t = time.perf_counter()
    start.record()
    for _ in range(32):
        empty[1, 1]()
    end.record()
    end.synchronize()
    host = (time.perf_counter() - t) * 1e6
    elapsed = getattr(cuda, "event_elapsed_time", None)  # the simulator has none: its host time stands in
    return (elapsed(start, end) * 1e3 if elapsed else host), host

def loop():
    t, acc = time.perf_counter(), 0
    for i in range(200_000):
        acc += i & 7
    return (time.perf_counter() - t) * 1e3

empty[1, 1]()
cuda.synchronize()
for _ in range(5):
    burst()
runs = [burst() for _ in range(15)]
mhz = None
try:
    for block in open("/proc/cpuinfo").read().split("\n\n"):
        if f"processor\t: {core}\n" in block + "\n":
            mhz = float(next(l for l in block.splitlines() if l.startswith("cpu MHz")).split(":")[1])
except (OSError, StopIteration, ValueError):
    pass
print(json.dumps({"event_us": statistics.median(r[0] for r in runs), "host_us": statistics.median(r[1] for r in runs),
                  "python_ms": statistics.median(loop() for _ in range(15)), "mhz": mhz,
                  "hashseed": os.environ.get("PYTHONHASHSEED", "random")}))
"""


def conditions() -> dict[str, tuple[list[str], dict]]:
    setarch = shutil.which("setarch")
    found = {"as the grader starts them": ([], {}), "PYTHONHASHSEED=0": ([], {"PYTHONHASHSEED": "0"})}
    if setarch:
        found["setarch -R (no ASLR)"] = ([setarch, os.uname().machine, "-R"], {})
        found["both"] = ([setarch, os.uname().machine, "-R"], {"PYTHONHASHSEED": "0"})
    return found


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values and min(values) > 0 else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    table: dict[str, list[dict]] = {}
    for name, (prefix, env) in conditions().items():
        table[name] = []
        for _ in range(args.processes):
            done = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(args.core)], capture_output=True,
                                  text=True, env={**os.environ, **env}, timeout=300)
            if done.returncode:
                print(f"{name}: a process failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            table[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = [f"# Launch speed between fresh processes (core {args.core}, {args.processes} processes a condition)", "",
             "| condition | 32 launches, events (us): median, spread | host (us) spread | Python loop (ms) spread "
             "| core MHz seen |", "|---|---|---|---|---|"]
    for name, rows in table.items():
        ev = [r["event_us"] for r in rows]
        mhz = sorted({round(r["mhz"]) for r in rows if r["mhz"]})
        lines.append(f"| {name} | {statistics.median(ev):.0f}, {100 * spread(ev):.0f} % | "
                     f"{100 * spread([r['host_us'] for r in rows]):.0f} % | "
                     f"{100 * spread([r['python_ms'] for r in rows]):.0f} % | {', '.join(map(str, mhz)) or '-'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "launch_spread.md").write_text(text)
        (args.out / "launch_spread.json").write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
