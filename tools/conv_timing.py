"""Issue 24's conv timings: per conv layer, stage 09's tuned direct kernel beside the kit's given convs one step past
it: Winograd's F(2, 5) (``labkit.winograd``) and the 3xTF32 tensor-core conv (``labkit.tensor_cores``).

For every conv layer of cifar10 (50000 and 1200 images), fashion (10000) and ece408 (10000), as stage 10 calls it
(fused with its activation and pool), the stage-09 tuned function (its committed per-layer choice) and each
configuration (``CONFIGS``) of the kinds ``--kernels`` names. Each is checked first: its output against numpy's
float64 conv on the first ``CHECK_IMAGES`` images (relative error of the norm, as the kit's checks, at most 1e-5) and,
on every image, against the direct kernel's output; then timed with CUDA events around each call after warm-up
calls (median and range of ``--repeat``). Inputs and weights are seeded random numbers of the layer's shapes. The
fastest that passed is printed per layer; ``--out DIR`` writes ``DIR/conv_timing.json``; ``--save`` records, per
workload and layer, the fastest tensor-core configuration that passed or none where the direct kernel won, in
``results/tensor_cores.json`` (stage 10 reads it: ``lk.tensor_cores.tuned``); ``--save-from JSON`` records them from
a GPU run's file. Exit status 1 when a check failed.
``--explore`` times a grid of configurations (``explore_configs``) on every layer instead, with each kernel's
registers and spilled bytes (``DIR/conv_explore.json``).

``--quick`` (no GPU: the simulator and the CPU emulation of CUDA C) runs the layers of the shrunk nets on 3 images,
for correctness only.

    python3 tools/conv_timing.py --kernels tc --out results/some-folder
    python3 tools/conv_timing.py --quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import device, gpu, layers, reference, stages, tensor_cores, winograd  # noqa: E402
from labkit.nets import get_net, layer_output_shape as output_shape  # noqa: E402

MAX_REL_ERROR = 1e-5
CHECK_IMAGES = 64
WORKLOADS = WORKLOADS_ALL = (("cifar10", 50000), ("cifar10", 1200), ("fashion", 10000), ("ece408", 10000))
QUICK = (("cifar10", 3), ("fashion", 3))
FUSE = ("relu", "tanh", "pool")
#: the given convs a run can time beside the direct kernel: their module, its conv function and its kernel's name
KINDS = {"winograd": (winograd, "conv_winograd", "wino_conv"), "tc": (tensor_cores, "conv_split3", "conv_split3")}


def given_conv(kind: str):
    """The kind's conv function, looked up at each call (a test may replace it)."""
    mod, name, _ = KINDS[kind]
    return lambda *a, **k: getattr(mod, name)(*a, **k)


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ (the kit's check), infinite where anything is not finite."""
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def expected(x: np.ndarray, w: np.ndarray, b: np.ndarray, group) -> np.ndarray:
    y = x.astype(np.float64)
    params = {f"{group[0].name}.weight": w.astype(np.float64), f"{group[0].name}.bias": b.astype(np.float64)}
    for layer in group:
        y = reference.layer_forward(layer, y, params)
    return y


def direct_impls(net: str) -> dict:
    """Stage 09's tuned functions for ``net`` (its committed per-layer choice): fashion's for ece408."""
    kernels_of = get_net(net).kernels_of or net
    variants = stages.load_variants(stages.solutions_folder() / "09_per_layer_tuning.ipynb")
    return variants[f"tuned_{kernels_of}"].impls


def conv_groups(net):
    """(group, its input's shape (C, H, W)) of every conv group as stage 10 fuses them (relu, tanh, pool)."""
    shape, out = tuple(net.input_shape), []
    for group in layers.groups(list(net.layers), FUSE):
        if group[0].kind == "conv":
            out.append((group, shape))
        for layer in group:
            shape = output_shape(layer, shape)
    return out


def group_shape(group, shape):
    for layer in group:
        shape = output_shape(layer, shape)
    return shape


def layer_inputs(images: int, group, shape, rng, bias: bool = True):
    """Seeded inputs in [0, 1), weights of the conv's fan-in, biases (or zeros), and the group's output shape."""
    conv = group[0]
    x = rng.random((images, *shape), dtype=np.float32)
    w = (rng.standard_normal((conv.out, shape[0], conv.kernel, conv.kernel), dtype=np.float32)
         / np.sqrt(shape[0] * conv.kernel ** 2)).astype(np.float32)
    b = (0.1 * rng.standard_normal(conv.out)).astype(np.float32) if bias else np.zeros(conv.out, np.float32)
    return x, w, b, (images, *group_shape(group, shape))


DIRECT = "09 tuned (direct)"


def candidates(net_name: str, group, kinds=tuple(KINDS)) -> list[tuple[str, object]]:
    impls = direct_impls(net_name)
    rows = [(DIRECT, layers.impl_for(impls, group[0]))]
    for kind in kinds:
        fn = given_conv(kind)
        rows += [(f"{kind} {name}", lambda *a, fn=fn, name=name: fn(*a, config=name))
                 for name in KINDS[kind][0].CONFIGS]
    return rows


def run(quick: bool, repeat: int, warmup: int, say=print, kinds=tuple(KINDS)) -> tuple[list[dict], list[str], dict]:
    rows, failures, choices = [], [], {}
    for net_name, images in QUICK if quick else WORKLOADS:
        net = lk.simulator.net(net_name) if quick else get_net(net_name)
        rng = np.random.default_rng(images)
        choice = choices.setdefault(net_name, {}).setdefault(str(images), {})
        for group, shape in conv_groups(net):
            conv = group[0]
            x, w, b, shape_out = layer_inputs(images, group, shape, rng)
            want = expected(x[:CHECK_IMAGES], w, b, group)
            pad, stride = conv.pad, conv.stride
            act, pool = layers.fused_codes(group)
            xd, wd, bd = gpu.to_device(x), gpu.to_device(w), gpu.to_device(b)
            out = gpu.to_device(np.zeros(shape_out, np.float32))
            say(f"{net_name} {conv.name}, {images} images: {x.shape[1:]} -> {shape_out[1:]}")
            direct_out, best = None, None
            for label, fn in candidates(net_name, group, kinds):
                row = {"net": net_name, "images": images, "layer": conv.name, "kernel": label}
                rows.append(row)
                try:
                    gpu.poison(out)
                    fn(xd, wd, bd, out, pad, stride, act, pool)
                    got = gpu.as_host(out)
                    row["rel_error"] = err = rel_error(got[:CHECK_IMAGES], want)
                    if direct_out is None:
                        direct_out = got
                    else:
                        row["rel_error_direct"] = rel_error(got, direct_out.astype(np.float64))
                    worst = max(err, row.get("rel_error_direct", 0.0))
                    if worst > MAX_REL_ERROR:
                        failures.append(f"{net_name} {images} {conv.name} {label}: relative error {worst:.2e}")
                        say(f"  {label:<24} CHECK FAILED: relative error {worst:.2e} (at most {MAX_REL_ERROR:g})")
                        continue
                    if not quick:
                        m = lk.measure(fn, xd, wd, bd, out, pad, stride, act, pool, warmup=warmup, repeat=repeat)
                        row["time"] = {"median_ms": 1e3 * m.median, "min_ms": 1e3 * min(m.times),
                                       "max_ms": 1e3 * max(m.times), "runs": len(m.times)}
                        if best is None or m.median < best[1]:
                            best = (label, m.median)
                except Exception as exc:  # noqa: BLE001 - one failing kernel must not hide the others
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    failures.append(f"{net_name} {images} {conv.name} {label}: {row['error']}")
                    say(f"  {label:<24} ERROR {row['error']}")
                    continue
                t = row.get("time")
                say(f"  {label:<24} rel err {err:.1e}" + (f"  {t['median_ms']:8.3f} ms (range {t['min_ms']:.3f}-"
                                                           f"{t['max_ms']:.3f}, {t['runs']} runs)" if t else
                                                           "  (checked)"))
            if best is not None:
                choice[conv.name] = None if best[0] == DIRECT else best[0]
            del xd, wd, bd, out
            gpu.release_buffers()
    return rows, failures, choices


#: ``--explore``: every conv layer of the issue's workloads under a grid of configurations
def explore_configs(kind: str) -> list:
    if kind == "winograd":
        return [winograd.Config(f"mg{mg} t{threads} minb{minb}", mg=mg, threads=threads, min_blocks=minb)
                for mg in (4, 8, 16) for threads in (128, 256) for minb in (1, 2)]
    kept = ["w4 mt2 i1 apre f16", "w8 mt2 i1 m1 apre f16", "w8 mt1 i2 apre f16"]
    breg = [f"w{w} mt{mt} i{i} apre f16 breg" for w, mt, i in ((4, 1, 1), (4, 2, 1), (4, 4, 1), (8, 1, 1), (8, 2, 1),
                                                              (4, 1, 2), (4, 2, 2), (8, 1, 2))]
    names = kept + breg
    return [tensor_cores.config_named(n) for n in names + [f"{n} kperm" for n in names]]


def explore(repeat: int, warmup: int, say=print, kinds=tuple(KINDS)) -> list[dict]:
    """Every configuration of ``explore_configs`` on every conv layer of ``WORKLOADS``: registers, spills, time."""
    rows = []
    for net_name, images, group, shape in ((n, i, g, s) for n, i in WORKLOADS for g, s in conv_groups(get_net(n))):
        conv, layer = group[0], group[0].name
        x, w, b, shape_out = layer_inputs(images, group, shape, np.random.default_rng(images), bias=False)
        act, pool = layers.fused_codes(group)
        xd, wd, bd = gpu.to_device(x), gpu.to_device(w), gpu.to_device(b)
        out = gpu.to_device(np.zeros(shape_out, np.float32))
        direct = layers.impl_for(direct_impls(net_name), conv)
        direct(xd, wd, bd, out, conv.pad, 1, act, pool)
        ref = gpu.as_host(out).astype(np.float64)
        m = lk.measure(direct, xd, wd, bd, out, conv.pad, 1, act, pool, warmup=warmup, repeat=repeat)
        say(f"{net_name} {layer} {images}: direct {1e3 * m.median:.3f} ms")
        rows.append({"net": net_name, "images": images, "layer": layer, "kernel": "09 tuned (direct)",
                     "median_ms": 1e3 * m.median})
        for kind, cfg in ((k, c) for k in kinds for c in explore_configs(k)):
            mod, _, kernel_name = KINDS[kind]
            fn = given_conv(kind)
            row = {"net": net_name, "images": images, "layer": layer, "kernel": f"{kind} {cfg.name}"}
            rows.append(row)
            try:
                p = mod.plan_for(xd, wd, conv.pad, 1, act, pool, cfg)
                gpu.poison(out)
                fn(xd, wd, bd, out, conv.pad, 1, act, pool, config=cfg)
                err = rel_error(gpu.as_host(out), ref)
                k = mod.module(p.macros()).get_function(kernel_name)
                attrs = getattr(k, "attributes", {}) or {}
                row.update(rel_error=err, regs=attrs.get("num_regs"), local=attrs.get("local_size_bytes"))
                m = lk.measure(fn, xd, wd, bd, out, conv.pad, 1, act, pool, config=cfg, warmup=warmup,
                               repeat=repeat)
                row["median_ms"] = 1e3 * m.median
                say(f"  {row['kernel']:<28} regs {row['regs']} local {row['local']} err {err:.1e}  "
                    f"{1e3 * m.median:8.3f} ms")
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                say(f"  {row['kernel']:<28} ERROR {row['error']}")
        del xd, wd, bd, out
        gpu.release_buffers()
    return rows


def save_choices(rows: list[dict], stamp: dict, path: Path | None = None) -> dict:
    """Per workload, the fastest of the direct kernel and the tensor-core configurations that passed (relative
    error at most MAX_REL_ERROR), into the store ``lk.tensor_cores.tuned`` reads."""
    best: dict = {}
    for row in rows:
        ms = row.get("median_ms", row.get("time", {}).get("median_ms"))
        ok = row.get("rel_error", 0.0) <= MAX_REL_ERROR and row.get("rel_error_direct", 0.0) <= MAX_REL_ERROR
        label = next((p for p in tensor_cores.LABELS if row["kernel"].startswith(p)), None)
        if ms is None or not ok or not (row["kernel"] == DIRECT or label):
            continue
        entry = best.setdefault((row["net"], row["images"]), {"choice": {}, "medians_ms": {}})
        name = DIRECT if row["kernel"] == DIRECT else row["kernel"].removeprefix(label)
        entry["medians_ms"].setdefault(row["layer"], {})[name] = round(ms, 5)
    for entry in best.values():
        for layer, medians in entry["medians_ms"].items():
            fastest = min(medians, key=medians.get)
            entry["choice"][layer] = None if fastest == DIRECT else fastest
    return tensor_cores.save_choices([{"net": net, "images": images, **stamp, **entry}
                                      for (net, images), entry in best.items()], path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the shrunk nets on 3 images, correctness only")
    ap.add_argument("--kernels", default="tc,winograd",
                    help=f"the given convs to time beside the direct kernel, comma-separated: {', '.join(KINDS)}")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, help="folder for conv_timing.json (conv_explore.json with --explore)")
    ap.add_argument("--explore", action="store_true", help="a grid of configurations on every layer")
    ap.add_argument("--workloads", metavar="NET:IMAGES,...",
                    help="only these of the issue's workloads, e.g. cifar10:50000 (default: all four)")
    ap.add_argument("--save", action="store_true",
                    help="record the quickest tensor-core configuration per layer (or none) in "
                         "results/tensor_cores.json")
    ap.add_argument("--save-from", type=Path, metavar="JSON",
                    help="record them from a GPU run's conv_timing.json or conv_explore.json instead of running")
    args = ap.parse_args(argv)
    if args.save_from:
        try:
            data = json.loads(args.save_from.read_text())
            stamp = {k: data[k] for k in ("date", "device", "command")}
        except (OSError, ValueError, KeyError) as exc:
            print(f"conv_timing: cannot read a run from {args.save_from}: {exc}", file=sys.stderr)
            return 2
        saved = save_choices(data["rows"], stamp)
        print(f"{tensor_cores.STORE.name}: {len(saved['entries'])} entries; from {args.save_from.name}: "
              + json.dumps({f"{e['net']} {e['images']}": e["choice"] for e in saved["entries"]
                            if e["command"] == stamp["command"]}))
        return 0
    kinds = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        print(f"conv_timing: unknown --kernels {', '.join(unknown) or '(none)'}; choose from {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    if args.workloads:
        global WORKLOADS
        wanted = {tuple(w.split(":")) for w in args.workloads.split(",")}
        WORKLOADS = tuple(w for w in WORKLOADS if (w[0], str(w[1])) in wanted)
        if not WORKLOADS:
            print(f"conv_timing: no workload among {args.workloads}; choose from "
                  + ", ".join(f"{n}:{i}" for n, i in WORKLOADS_ALL), file=sys.stderr)
            return 2
    info = device.info()
    if not args.quick and info.kind != "gpu":
        print("conv_timing: no GPU here; --quick checks the kernels on the shrunk nets", file=sys.stderr)
        return 2
    print(f"device: {info.name}; CUDA C: {'CPU emulation' if gpu.cuda_c_on_cpu() else 'cupy'}")
    stamp = {"date": dt.datetime.now().isoformat(timespec="seconds"), "device": info.name,
             "command": "python3 tools/conv_timing.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.explore:
        rows = explore(args.repeat, args.warmup, kinds=kinds)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "conv_explore.json").write_text(json.dumps({**stamp, "rows": rows}, indent=1) + "\n")
        if args.save:
            save_choices(rows, stamp)
        return 0
    rows, failures, choices = run(args.quick, args.repeat, args.warmup, kinds=kinds)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {**stamp, "quick": args.quick, "repeat": args.repeat, "warmup": args.warmup,
                "max_rel_error": MAX_REL_ERROR, "rows": rows, "failures": failures, "choices": choices}
        (args.out / "conv_timing.json").write_text(json.dumps(data, indent=1) + "\n")
    if args.save and not args.quick:
        save_choices(rows, stamp)
    print(f"{len(rows)} rows, {len(failures)} failed" + "".join(f"\n  {f}" for f in failures))
    print("fastest per layer (a given conv's configuration, or null for the direct kernel): " + json.dumps(choices))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
