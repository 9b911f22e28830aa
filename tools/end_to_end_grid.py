"""Stage 10's whole job end to end on a grid (issue 35, point 4): CIFAR-10 bytes on the host to classes on the host,
in chunks over streams, with what each chunk costs the host and the GPU.

One process, in order, each part reported as it finishes and kept in ``OUT/e2e_grid.json`` and ``.txt``:

1. the machine's host-to-device rate: one chunk's bytes and all of them, from pinned and from pageable memory
   (CUDA events around ``lk.gpu.to_device``, medians), and device-to-host from pinned memory;
2. the grid: stage 10's pipeline (``whole_cifar10``'s ``classify_streamed``, from ``solutions/10_whole_job.py``)
   on chunks {2500, 5000, 10000, 25000, 50000} x streams {1, 2, 4} from pinned memory, in each mode of
   ``lk.whole.Job``: ``graphs`` (a chunk's launches replayed from a CUDA graph) and ``launches`` (every launch
   from Python, as before issue 35). Each cell: its first call timed apart (a capture, a compile, an allocation
   shows there), ``--warmup`` untimed calls, ``--repeat`` timed ones (CUDA events; median, quartiles, range), every
   image's class compared with ``Job.serial``'s and the numpy reference's; then one more call timed on the host
   with the time spent inside the job's steps (``host_issue_s``: when it is near the call's time the host sets the
   pace), the lane synchronizations it made, the buffers it allocated, the modules it compiled, the graphs it
   captured;
3. per-chunk timelines of ``--timeline`` cells (each chunk's upload, classes and download: when the host queued
   them, and on a GPU when its lane finished them, from events recorded on the lane), and a profile of the host's
   Python in one call of ``--profile`` cells (cProfile, ``e2e_profile.txt``);
4. whether the arrays handed to the pipeline are pinned (cupy's pointer attributes), the grid's best cell, each
   cell over the best, and whether any is above ``1.5 x`` the best (the issue's cliff).

``--quick`` runs it all on numba's CUDA simulator at toy sizes (its times measure the simulator).

    OUT=/some/folder python3 tools/end_to_end_grid.py --out "$OUT"
    python3 tools/end_to_end_grid.py --quick --out /tmp/e2e
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import (data, device, gpu, reference, simulator, stages, streams, timing, upload,  # noqa: E402
                    whole)
from labkit.ladder import bench_files  # noqa: E402

CHUNKS = (2500, 5000, 10000, 25000, 50000)
STREAMS = (1, 2, 4)
MODES = ("graphs", "launches")
#: the issue's bound: no cell more than this over the best
CLIFF = 1.5
STEPS = ("upload", "classes", "download")


def log(msg: str, lines: list[str]) -> None:
    stamp = f"[{time.perf_counter() - T0:7.1f}s] {msg}"
    print(stamp, flush=True)
    lines.append(stamp)


T0 = time.perf_counter()


def cells(text: str) -> list[tuple[int, int]]:
    """``"2500x4,10000x2"`` -> [(2500, 4), (10000, 2)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        chunk, _, count = part.partition("x")
        out.append((int(chunk), int(count)))
    return out


def on_gpu() -> bool:
    return device.info().kind == "gpu"


# ------------------------------------------------------------------------------------------------ the bus


def _copy_seconds(host: np.ndarray, dev, repeat: int) -> list[float]:
    times = []
    gpu.to_device(host, to=dev)  # warm-up (a first copy from pageable memory registers its staging)
    for _ in range(repeat):
        with timing.Timer() as t:
            gpu.to_device(host, to=dev)
        times.append(t.seconds)
    return times


def _copy_back_seconds(dev, host: np.ndarray, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        with timing.Timer() as t:
            gpu.to_host(dev, out=host)
        times.append(t.seconds)
    return times


def bus_rates(sizes: list[int], repeat: int) -> list[dict]:
    """Host-to-device seconds and GB/s of ``sizes`` bytes from pinned and from pageable memory, and
    device-to-host into pinned memory: medians of ``repeat`` (CUDA events on a GPU)."""
    rows = []
    for nbytes in sizes:
        pageable = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        pinned = streams.pinned((nbytes,), np.uint8)
        pinned[...] = pageable
        dev = gpu.buffer("e2e grid bus", (nbytes,), np.uint8)
        row = {"bytes": nbytes}
        for name, host in (("pinned", pinned), ("pageable", pageable)):
            t = _copy_seconds(host, dev, repeat)
            row[f"htod_{name}_s"] = statistics.median(t)
            row[f"htod_{name}_range"] = (min(t), max(t))
            row[f"htod_{name}_gbs"] = nbytes / statistics.median(t) / 1e9
        t = _copy_back_seconds(dev, pinned, repeat)
        row["dtoh_pinned_s"] = statistics.median(t)
        row["dtoh_pinned_gbs"] = nbytes / statistics.median(t) / 1e9
        rows.append(row)
    return rows


def is_pinned(array: np.ndarray) -> bool | None:
    """Whether ``array``'s memory is page-locked, as the driver sees it (cupy's pointer attributes); None where
    that cannot be asked (the simulator, no cupy)."""
    if not on_gpu():
        return isinstance(array, streams.SimulatedPinned)
    try:
        import cupy
    except ImportError:
        return None
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(array.ctypes.data)
    except Exception:  # noqa: BLE001 - an address the driver does not know: pageable
        return False
    return int(attrs.type) in (1, 3)  # cudaMemoryTypeHost (pinned), cudaMemoryTypeManaged


# ------------------------------------------------------------------------------------------------ the host's part


class Steps:
    """While active, the job's three steps timed on the host (``perf_counter`` around each call), with an event
    recorded on the lane after each on a GPU (``events=True``), per chunk; lane synchronizations counted."""

    def __init__(self, job: whole.Job, events: bool = False):
        self.job, self.events = job, events and on_gpu()
        self.calls: list[dict] = []
        self.syncs = 0
        self.start = None
        self.t0 = 0.0

    def __enter__(self) -> Steps:
        from numba import cuda

        for name in STEPS:
            original = getattr(whole.Job, name)

            def step(lane, *args, _name=name, _original=original):
                t0 = time.perf_counter()
                out = _original(self.job, lane, *args)
                t1 = time.perf_counter()
                ev = None
                if self.events and lane is not None:
                    ev = cuda.event(timing=True)
                    ev.record(stream=lane.numba)
                self.calls.append({"step": _name, "lane": getattr(lane, "name", None),
                                   "chunk": getattr(lane, "chunk", None), "host_start_s": t0 - self.t0,
                                   "host_s": t1 - t0, "event": ev})
                return out

            setattr(self.job, name, step)  # the instance's attribute: the pipeline calls job.upload(...)
        self._sync = streams.Lane.synchronize

        def counted(lane, _sync=self._sync):
            self.syncs += 1
            return _sync(lane)

        streams.Lane.synchronize = counted
        self.job._chunks = 0  # chunks counted from this call's first (Job.upload numbers them)
        if self.events:
            self.start = cuda.event(timing=True)
            self.start.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        streams.Lane.synchronize = self._sync
        for name in STEPS:
            self.job.__dict__.pop(name, None)

    @property
    def host_issue_s(self) -> float:
        return sum(c["host_s"] for c in self.calls)

    def timeline(self) -> list[dict]:
        """Per chunk: when the host began and ended queueing each step, and (on a GPU) when its lane finished it,
        in ms from the start."""
        from numba import cuda

        chunks: dict = {}
        for c in self.calls:
            row = chunks.setdefault(c["chunk"], {"chunk": c["chunk"], "lane": c["lane"]})
            row[f"{c['step']}_queued_ms"] = 1e3 * c["host_start_s"]
            row[f"{c['step']}_host_ms"] = 1e3 * c["host_s"]
            if c["event"] is not None:
                c["event"].synchronize()
                row[f"{c['step']}_done_ms"] = cuda.event_elapsed_time(self.start, c["event"])
        return [chunks[k] for k in sorted(chunks, key=lambda k: (k is None, k))]


_COMPILES = [0]


def count_compiles() -> None:
    """Count every CUDA C module built from here on (``lk.gpu.raw_module``: the kit's cached modules and stage
    09's tile kernels both go through it, looked up at each call)."""
    if getattr(gpu.raw_module, "counted", False):
        return
    built = gpu.raw_module

    def raw_module(*args, **kwargs):
        _COMPILES[0] += 1
        return built(*args, **kwargs)

    raw_module.counted = True
    gpu.raw_module = raw_module


def _compiled() -> int:
    return _COMPILES[0]


def run_cell(job, pipeline, raw, classes, truth: dict, chunk: int, count: int, repeat: int, warmup: int) -> dict:
    """One cell of the grid (module docstring, part 2)."""
    cell = {"chunk": chunk, "streams": count, "chunks": -(-raw.shape[0] // chunk)}
    captured, allocated, compiled = len(job._graphs), gpu.DEVICE.allocations, _compiled()
    classes[...] = -1
    t0 = time.perf_counter()
    pipeline(job, raw, classes, chunk, count)
    gpu.synchronize()
    cell["first_s"] = time.perf_counter() - t0
    cell["first_allocations"] = gpu.DEVICE.allocations - allocated
    cell["first_compiled"] = _compiled() - compiled
    cell["first_graphs_captured"] = len(job._graphs) - captured
    for name, want in truth.items():
        cell[f"differing_from_{name}"] = int(np.count_nonzero(classes != want))
    for _ in range(warmup):
        pipeline(job, raw, classes, chunk, count)
    allocated, compiled, captured = gpu.DEVICE.allocations, _compiled(), len(job._graphs)
    generation = gpu.DEVICE.generation
    times = []
    for _ in range(repeat):
        clock = timing.Clock("auto")
        with clock.section("call"):
            pipeline(job, raw, classes, chunk, count)
        times.append(clock.seconds()["call"])
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    cell.update(median_s=statistics.median(times), min_s=min(times), max_s=max(times), q1_s=q[0], q3_s=q[2],
                runs=len(times), times_s=times, allocations=gpu.DEVICE.allocations - allocated,
                compiled=_compiled() - compiled, graphs_captured=len(job._graphs) - captured,
                pool_released=gpu.DEVICE.generation != generation)
    with Steps(job) as steps:
        t0 = time.perf_counter()
        pipeline(job, raw, classes, chunk, count)
        wall = time.perf_counter() - t0
    cell.update(host_wall_s=wall, host_issue_s=steps.host_issue_s, lane_synchronizations=steps.syncs,
                replayed=bool(job.replays(job.lanes(1)[0])))
    for name, want in truth.items():
        cell[f"differing_from_{name}"] = max(cell[f"differing_from_{name}"], int(np.count_nonzero(classes != want)))
    return cell


def timeline(job, pipeline, raw, classes, chunk: int, count: int) -> dict:
    with Steps(job, events=True) as steps:
        t0 = time.perf_counter()
        pipeline(job, raw, classes, chunk, count)
        wall = time.perf_counter() - t0
    return {"chunk": chunk, "streams": count, "host_wall_ms": 1e3 * wall, "host_issue_ms": 1e3 * steps.host_issue_s,
            "lane_synchronizations": steps.syncs, "chunks": steps.timeline()}


def profile(job, pipeline, raw, classes, chunk: int, count: int, top: int = 35) -> str:
    """The host's Python in one call, by cumulative and by own time (cProfile)."""
    prof = cProfile.Profile()
    prof.enable()
    pipeline(job, raw, classes, chunk, count)
    gpu.synchronize()
    prof.disable()
    text = io.StringIO()
    for key in ("cumulative", "tottime"):
        text.write(f"--- chunks of {chunk} over {count} streams, by {key} ---\n")
        pstats.Stats(prof, stream=text).strip_dirs().sort_stats(key).print_stats(top)
    return text.getvalue()


def summary(cells_: list[dict]) -> dict:
    timed = [c for c in cells_ if "median_s" in c]
    if not timed:
        return {}
    best = min(timed, key=lambda c: c["median_s"])
    worst = max(timed, key=lambda c: c["median_s"])
    for c in timed:
        c["over_best"] = c["median_s"] / best["median_s"]
    return {"best": {k: best[k] for k in ("chunk", "streams", "median_s")},
            "worst": {k: worst[k] for k in ("chunk", "streams", "median_s")},
            "worst_over_best": worst["median_s"] / best["median_s"],
            "cells_over_cliff": [(c["chunk"], c["streams"]) for c in timed if c["over_best"] > CLIFF]}


def grid_table(mode: str, cells_: list[dict], chunks, counts) -> list[str]:
    by = {(c["chunk"], c["streams"]): c for c in cells_}
    lines = [f"mode {mode}: median ms (quartiles) x best; host issue ms / host wall ms; first call ms",
             f"{'chunk':>7} " + " ".join(f"{f'{n} stream' + ('s' if n > 1 else ''):>44}" for n in counts)]
    for chunk in chunks:
        parts = []
        for n in counts:
            c = by.get((chunk, n))
            if c is None or "median_s" not in c:
                parts.append(f"{(c or {}).get('error', '-')[:44]:>44}")
                continue
            parts.append(f"{1e3 * c['median_s']:7.3f} ({1e3 * c['q1_s']:.2f}-{1e3 * c['q3_s']:.2f}) "
                         f"x{c.get('over_best', 0):4.2f} {1e3 * c['host_issue_s']:6.2f}/{1e3 * c['host_wall_s']:6.2f} "
                         f"{1e3 * c['first_s']:6.0f}")
        lines.append(f"{chunk:>7} " + " ".join(parts))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=50000)
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS)))
    ap.add_argument("--streams", default=",".join(map(str, STREAMS)))
    ap.add_argument("--modes", default=",".join(MODES), help="graphs, launches (lk.whole.Job's graphs on, off)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeline", default="2500x4,10000x2", help="cells timed chunk by chunk (CHUNKxSTREAMS,...)")
    ap.add_argument("--profile", default="2500x4", help="cells whose host Python is profiled")
    ap.add_argument("--no-reference", action="store_true", help="compare with Job.serial only (no numpy run)")
    ap.add_argument("--notebook", type=Path, default=stages.solutions_folder() / "10_whole_job.py")
    ap.add_argument("--variant", default="whole_cifar10")
    ap.add_argument("--quick", action="store_true", help="the simulator's toy sizes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.chunks, args.streams, args.repeat, args.warmup = 3, "2,3", "1,2", 1, 0
        args.timeline, args.profile = "2x2", "2x2"
    chunks = [int(c) for c in args.chunks.split(",")]
    counts = [int(c) for c in args.streams.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    result: dict = {"device": device.label(), "simulated": device.info().simulated,
                    "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "command": "python3 tools/end_to_end_grid.py " + " ".join(argv if argv is not None else
                                                                              sys.argv[1:]),
                    "versions": bench_files.versions(), "cliff": CLIFF}
    log(f"end_to_end_grid on {result['device']}", lines)

    count_compiles()
    variant = stages.load_variants(args.notebook)[args.variant]
    if variant.pipeline is None:
        raise SystemExit(f"{args.variant} of {args.notebook} has no pipeline")
    wl = lk.workload("cifar10", args.images, target="gpu", tile=True, quiet=True)
    if simulator.active():
        raw = np.random.default_rng(35).integers(0, 256, (args.images, *wl.net.input_shape), dtype=np.uint8)
        note = f"simulated: {wl.net.name}, {args.images} random images (random weights)"
    else:
        raw = upload.stored_bytes(args.images)
        note = wl.note
    result.update(images=len(raw), bytes=int(raw.nbytes), workload=note, variant=variant.label)
    log(f"workload: {note}; {raw.nbytes / 1e6:.1f} MB of uint8", lines)

    sizes = sorted({raw.nbytes, int(raw[:min(chunks[0], len(raw))].nbytes)})
    result["bus"] = bus_rates(sizes, repeat=max(3, args.repeat))
    for r in result["bus"]:
        log(f"host to device, {r['bytes'] / 1e6:.2f} MB: pinned {r['htod_pinned_gbs']:.2f} GB/s "
            f"({1e3 * r['htod_pinned_s']:.3f} ms), pageable {r['htod_pageable_gbs']:.2f} GB/s "
            f"({1e3 * r['htod_pageable_s']:.3f} ms); device to host pinned {r['dtoh_pinned_gbs']:.2f} GB/s", lines)

    raw_pinned = streams.pinned(raw.shape, np.uint8)
    raw_pinned[...] = raw
    classes = streams.pinned((len(raw),), np.int32)
    result["pinned"] = {"raw": is_pinned(raw_pinned), "classes": is_pinned(classes),
                        "raw_chunk_slice": is_pinned(raw_pinned[chunks[0]:]), "pageable_control": is_pinned(raw)}
    log(f"pinned as the driver sees it: {result['pinned']}", lines)

    truth = {}
    serial_job = whole.Job(wl.net, variant, wl.weights, graphs=False)
    t0 = time.perf_counter()
    truth["serial"] = serial_job.serial(raw)
    log(f"Job.serial (one stream, pageable, all at once, first call): {time.perf_counter() - t0:.3f} s", lines)
    serial = []
    for _ in range(max(1, args.repeat // 2)):
        with timing.Timer() as t:
            serial_job.serial(raw)
        serial.append(t.seconds)
    result["serial_s"] = statistics.median(serial)
    log(f"Job.serial: median {1e3 * result['serial_s']:.3f} ms of {len(serial)}", lines)
    if not args.no_reference:
        t0 = time.perf_counter()
        truth["reference"] = reference.predict(reference.forward(wl.net, wl.weights, data.to_input(wl.net, raw)))
        log(f"numpy reference on the bytes: {time.perf_counter() - t0:.1f} s; Job.serial's classes differing from "
            f"it: {int(np.count_nonzero(truth['serial'] != truth['reference']))}", lines)

    result["modes"] = {}
    wanted_timeline, wanted_profile = cells(args.timeline), cells(args.profile)
    profiles = []
    for mode in modes:
        job = whole.Job(wl.net, variant, wl.weights, graphs=mode == "graphs")
        got: list[dict] = []
        for chunk in chunks:
            for count in counts:
                chunk_ = min(chunk, len(raw))
                try:
                    cell = run_cell(job, variant.pipeline, raw_pinned, classes, truth, chunk_, count, args.repeat,
                                    args.warmup)
                except Exception as exc:  # noqa: BLE001 - one broken cell must not stop the grid
                    gpu.synchronize()
                    cell = {"chunk": chunk_, "streams": count, "error": f"{type(exc).__name__}: {exc}"}
                got.append(cell)
                said = (f"{1e3 * cell['median_s']:.3f} ms (range {1e3 * cell['min_s']:.3f}-{1e3 * cell['max_s']:.3f},"
                        f" {cell['runs']} runs), first {1e3 * cell['first_s']:.1f} ms, host issue "
                        f"{1e3 * cell['host_issue_s']:.2f} of {1e3 * cell['host_wall_s']:.2f} ms, "
                        f"{cell['lane_synchronizations']} lane syncs, {cell['allocations']} allocations, "
                        f"{cell['compiled']} compiles, replayed {cell['replayed']}, differing "
                        + ", ".join(f"{k.removeprefix('differing_from_')} {v}" for k, v in cell.items()
                                    if k.startswith("differing_from_"))) if "median_s" in cell else cell["error"]
                log(f"  {mode}: chunks of {chunk_} over {count} streams: {said}", lines)
        result["modes"][mode] = {"cells": got, "summary": summary(got), "graph_note": job.graph_note}
        for line in grid_table(mode, got, [min(c, len(raw)) for c in chunks], counts):
            log(line, lines)
        s = result["modes"][mode]["summary"]
        if s:
            log(f"{mode}: best chunks of {s['best']['chunk']} over {s['best']['streams']} streams, "
                f"{1e3 * s['best']['median_s']:.3f} ms; worst {s['worst']['chunk']} x {s['worst']['streams']} at "
                f"{s['worst_over_best']:.2f} x the best; cells over {CLIFF} x: {s['cells_over_cliff'] or 'none'}",
                lines)
        result["modes"][mode]["timelines"] = []
        for chunk, count in wanted_timeline:
            chunk = min(chunk, len(raw))
            try:
                tl = timeline(job, variant.pipeline, raw_pinned, classes, chunk, count)
            except Exception as exc:  # noqa: BLE001
                gpu.synchronize()
                tl = {"chunk": chunk, "streams": count, "error": f"{type(exc).__name__}: {exc}"}
            result["modes"][mode]["timelines"].append(tl)
            if "error" not in tl:
                log(f"  {mode} timeline, chunks of {chunk} over {count}: host wall {tl['host_wall_ms']:.2f} ms, "
                    f"inside the steps {tl['host_issue_ms']:.2f} ms", lines)
                for row in tl["chunks"]:
                    log("    " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in row.items()), lines)
        for chunk, count in wanted_profile:
            try:
                profiles.append(f"=== {mode} ===\n" + profile(job, variant.pipeline, raw_pinned, classes,
                                                                   min(chunk, len(raw)), count))
            except Exception as exc:  # noqa: BLE001
                profiles.append(f"=== {mode}: chunks of {chunk} over {count}: {type(exc).__name__}: {exc}\n")
        del job
        gpu.release_buffers()  # the next mode's job starts from an empty pool
    (args.out / "e2e_profile.txt").write_text("".join(profiles))
    (args.out / "e2e_grid.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / "e2e_grid.txt").write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out / 'e2e_grid.json'}, e2e_grid.txt, e2e_profile.txt", [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
