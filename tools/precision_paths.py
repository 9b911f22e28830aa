"""What the faster paths the kit does not take would cost: cuDNN's forward pass in fp32, with TF32 allowed and in
fp16, timed (CUDA events) and its predictions compared with the numpy reference's on the bench's largest workloads.
The kit stays fp32; this says how many images a faster path would change. Needs a GPU and PyTorch.

    python tools/precision_paths.py --out results/MY-GPU/precision_paths.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from labkit import cudnn, engine  # noqa: E402
from labkit.workloads import workload  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    if not cudnn.available():
        print("precision_paths: needs a GPU and PyTorch with CUDA (labkit info says what this machine has)")
        return 1
    rows = []
    for net, n in (("cifar10", 50000), ("fashion", 10000)):
        wl = workload(net, n, tile=True, quiet=True)
        truth = engine.run(wl, None, quiet=True).predictions
        rows += [dict(r, workload=wl.note) for r in cudnn.precision_paths(wl, truth)]
    for r in rows:
        print(f"{r['net']:8s} {r['images']:6d} {r['precision']:5s} total {r['total_s'] * 1e3:8.3f} ms  conv "
              f"{r['conv_s'] * 1e3:8.3f} ms  predictions differing from the reference: {r['predictions_differing']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
