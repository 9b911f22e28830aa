"""Why one process launches kernels slower than another (issue 32's open point): fresh processes, each pinned to a
core, time the same things; the spread between processes is printed per condition.

    python tools/launch_spread.py [--processes 8] [--cores N[,M]] [--samples 15] [--conditions A,B] [--out DIR]

Each process times, 50 ms apart: 32 empty kernel launches between two CUDA events (the grader's probe), the same
launches on the host's clock, and a pure-Python loop (no GPU: the core's own speed); it reads the core's steal ticks
(a VM's host taking the core), its transparent huge pages and the core's clock. Conditions, taken in turn so that a
slow spell of the host falls on each: as the grader starts children; PYTHONHASHSEED=0 (dicts laid out the same in
every process); no transparent huge pages (PR_SET_THP_DISABLE); `setarch -R` (no address-space randomisation); both
of the first and last. If a condition's spread collapses, that is the cause; if a process is steady in itself but
unlike the others, it is the process's; if the launches follow the Python loop, it is the core's speed.
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
if os.environ.get("LABKIT_SPREAD_NOTHP"):  # PR_SET_THP_DISABLE before numba's heap is made
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)

def steal():  # this core's steal and total ticks (a VM's host taking the core away)
    try:
        for line in open("/proc/stat"):
            if line.startswith(f"cpu{core} "):
                v = [int(x) for x in line.split()[1:]]
                return v[7] if len(v) > 7 else 0, sum(v)
    except OSError:
        pass
    return 0, 0

def huge():  # kB of transparent huge pages the process got (its Python heap's TLB reach)
    try:
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None

s0 = steal()
if not os.path.exists("/dev/nvidiactl"):  # no GPU here: the simulator, for the tool's own test
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
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
samples = []  # (seconds since the first, event us, host us, loop ms), spread over about 1.5 s
t0 = time.perf_counter()
for _ in range(int(sys.argv[2])):
    ev, host = burst()
    samples.append((time.perf_counter() - t0, ev, host, loop()))
    time.sleep(0.05)
s1 = steal()
mhz = None
try:
    for block in open("/proc/cpuinfo").read().split("\n\n"):
        if f"processor\t: {core}\n" in block + "\n":
            mhz = float(next(l for l in block.splitlines() if l.startswith("cpu MHz")).split(":")[1])
except (OSError, StopIteration, ValueError):
    pass
print(json.dumps({"event_us": statistics.median(x[1] for x in samples),
                  "host_us": statistics.median(x[2] for x in samples),
                  "python_ms": statistics.median(x[3] for x in samples), "mhz": mhz, "core": core,
                  "hashseed": os.environ.get("PYTHONHASHSEED", "random"), "huge_kb": huge(),
                  "steal_ticks": s1[0] - s0[0], "ticks": s1[1] - s0[1], "wall": time.time(), "samples": samples}))
"""


def conditions() -> dict[str, tuple[list[str], dict]]:
    setarch = shutil.which("setarch")
    found = {"as the grader starts them": ([], {}), "PYTHONHASHSEED=0": ([], {"PYTHONHASHSEED": "0"}),
             "no huge pages": ([], {"LABKIT_SPREAD_NOTHP": "1"})}
    if setarch:
        found["setarch -R (no ASLR)"] = ([setarch, os.uname().machine, "-R"], {})
        found["both"] = ([setarch, os.uname().machine, "-R"], {"PYTHONHASHSEED": "0"})
    return found


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values and min(values) > 0 else float("nan")


def correlation(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def within(row: dict) -> float:
    """How much one process's own 32-launch bursts move over its life (its samples' spread)."""
    return spread([s[1] for s in row["samples"]])


def summarize(table: dict[str, list[dict]], processes: int, cores: list[int]) -> str:
    rows_all = [r for rows in table.values() for r in rows]
    lines = [f"# Launch speed between fresh processes (cores {', '.join(map(str, cores))}; {processes} processes a "
             "condition, the conditions taken in turn so that a slow spell of the host falls on all of them)", "",
             "| condition | processes | 32 launches, events (us): median, spread between processes | within a "
             "process (median) | Python loop (ms) spread | steal ticks | huge pages (kB) |", "|---|---|---|---|---|---|---|"]
    for name, rows in table.items():
        ev = [r["event_us"] for r in rows]
        huge = sorted({r["huge_kb"] for r in rows if r.get("huge_kb") is not None})
        lines.append(f"| {name} | {len(rows)} | {statistics.median(ev):.0f}, {100 * spread(ev):.0f} % | "
                     f"{100 * statistics.median(within(r) for r in rows):.0f} % | "
                     f"{100 * spread([r['python_ms'] for r in rows]):.0f} % | "
                     f"{sum(r.get('steal_ticks', 0) for r in rows)} | "
                     f"{', '.join(map(str, huge[:4])) or '-'}{' ...' if len(huge) > 4 else ''} |")
    ev = [r["event_us"] for r in rows_all]
    py = [r["python_ms"] for r in rows_all]
    lines += ["", f"Over all {len(rows_all)} processes: launches vs Python loop, correlation "
              f"{correlation(ev, py):.2f}; launches vs the order they ran in, "
              f"{correlation(ev, [r['wall'] for r in rows_all]):.2f}; launches vs huge pages, "
              f"{correlation(ev, [float(r.get('huge_kb') or 0) for r in rows_all]):.2f}. "
              "A process steady in itself (small 'within') but unlike the others is a property of the process; "
              "launches that follow the Python loop are the core's speed."]
    by_core = {}
    for r in rows_all:
        by_core.setdefault(r.get("core"), []).append(r["event_us"])
    if len(by_core) > 1:
        lines.append("By core: " + "; ".join(f"core {c}: median {statistics.median(v):.0f} us, spread "
                                              f"{100 * spread(v):.0f} %" for c, v in sorted(by_core.items())) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--cores", default=str(max(os.sched_getaffinity(0))),
                        help="comma-separated cores the processes are pinned to, in turn (default: the last)")
    parser.add_argument("--samples", type=int, default=15, help="bursts per process, 50 ms apart (default 15)")
    parser.add_argument("--conditions", default=None, help="comma-separated subset of the conditions' names")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")]
    conds = conditions()
    if args.conditions:
        conds = {k: v for k, v in conds.items() if k in args.conditions.split(",")}
    table: dict[str, list[dict]] = {name: [] for name in conds}
    for k in range(args.processes):
        for name, (prefix, env) in conds.items():
            core = cores[k % len(cores)]
            done = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(core), str(args.samples)],
                                  capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
            if done.returncode:
                print(f"{name}: a process failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            table[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"round {k + 1}/{args.processes} done", file=sys.stderr, flush=True)
    text = summarize(table, args.processes, cores)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "launch_spread.md").write_text(text)
        (args.out / "launch_spread.json").write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
