"""The floor of stage 10's whole call on each workload (issue 35, point 1; ``labkit.floors``): per layer group the
method its variant issues, its useful multiply-adds and compulsory bytes, their times at the device's measured unit
rate and copy bandwidth, which one bounds it; the sum, beside the fp32 floor (the net's FLOPs at the FMA peak).

The rates are the device's (``results/unit_rates.json`` from ``tools/mma_rates.py --save``, else a committed
``results/*/mma_rates.json`` with ``labkit.ceilings``' bandwidth, said in the source line); ``--device`` names a
device on a machine without its GPU. Nothing is timed here: ``labkit bench`` puts each whole call beside its floor.

    python3 tools/floor_table.py [--device "NVIDIA H100 80GB HBM3"] [--workloads cifar10:50000,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from labkit import ceilings, device, floors, stages  # noqa: E402
from labkit.nets import get_net, net_cost  # noqa: E402

#: the issue's six workloads
WORKLOADS = "cifar10:50000,cifar10:1200,cifar10:128,fashion:10000,fashion:1000,ece408:10000"


def table(device_name: str, workloads: list[tuple[str, int]], variants: dict) -> tuple[list[str], list[dict]]:
    rates = floors.rates_for(device_name)
    if rates is None:
        raise SystemExit(f"floor_table: no unit rates for {device_name!r}: run tools/mma_rates.py --save on it, or "
                         f"commit its mma_rates.json under results/")
    roof = ceilings.for_device(device_name)
    lines = [f"device: {device_name}; {rates.source}",
             "rates: " + ", ".join(f"{floors.UNIT_WORDS[u]} {rates.macs[u] / 1e12:.1f} T multiply-adds/s"
                                   for u in floors.UNITS) + f"; copy {rates.bandwidth / 1e12:.2f} TB/s"]
    rows = []
    for net_name, images in workloads:
        net = get_net(net_name)
        fp32 = sum(c.flops for c in net_cost(net, images).values()) / roof.flops if roof else None
        for name, variant in variants.items():
            if not variant.runs_on(net_name):
                continue
            fl = floors.net_floor(net, images, rates, floors.variant_methods(net, variant, images), variant.fuse)
            lines += ["", f"== {net_name} x {images}, {variant.label}: floor {1e3 * fl.seconds:.4f} ms"
                      + (f"; fp32 floor {1e3 * fp32:.4f} ms ({roof.source})" if fp32 else ""), fl.table()]
            rows.append({"net": net_name, "images": images, "variant": variant.label, "floor_s": fl.seconds,
                         "fp32_floor_s": fp32, "bounds": fl.bounds(), "rates_source": rates.source,
                         "groups": [{"layers": g.layers, "method": str(g.method), "useful_macs": g.macs,
                                     "bytes": g.bytes, "compute_s": g.compute_s, "memory_s": g.memory_s,
                                     "bound": g.bound} for g in fl.groups]})
    return lines, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="the device's name (default: this machine's GPU)")
    ap.add_argument("--workloads", default=WORKLOADS)
    ap.add_argument("--notebook", type=Path, default=stages.solutions_folder() / "10_whole_job.py")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    name = args.device or device.label()
    workloads = [(w.split(":")[0], int(w.split(":")[1])) for w in args.workloads.split(",") if w]
    lines, rows = table(name, workloads, stages.load_variants(args.notebook))
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "floor_table.txt").write_text("\n".join(lines) + "\n")
        (args.out / "floor_table.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
