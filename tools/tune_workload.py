"""Stage 09's autotuner on one more workload: its candidates (stage 09's ``candidates``), each conv layer of NET at
IMAGES images, checked then timed (``lk.tune.tune``), the table printed; ``--save`` adds the choice to
``results/tuning.json`` for this device, which ``s09.tuned(NET, IMAGES)`` then returns (stage 10's variants choose
their convs per workload size with it). Needs a GPU (on the simulator ``lk.tune`` only checks).

    python3 tools/tune_workload.py cifar10 1200 --save
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import labkit as lk  # noqa: E402  (sets up numba: the simulator when there is no GPU)
from labkit import device  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("net", choices=sorted(lk.nets.NETS))
    ap.add_argument("images", type=int)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--save", action="store_true", help="add the choice to results/tuning.json for this device")
    args = ap.parse_args(argv)
    if device.info().kind != "gpu":
        print("tune_workload: no GPU here: the tuner only checks on the simulator, there is nothing to time; run it "
              "on a CUDA machine (docs/gpu.md says how)",
              file=sys.stderr)
        return 2
    s09 = lk.stages.from_stage("09")
    spec = lk.get_net(args.net)
    tuning = lk.tune.tune({ly: s09.candidates(ly) for ly in spec.conv_layers}, args.net, args.images,
                          repeat=args.repeat, save=args.save, quiet=True)
    print(f"== {args.net}, {args.images} images, {device.label()}")
    print(tuning.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
