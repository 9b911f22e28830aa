"""The device's ceilings for a roofline: fp32 FLOP/s and memory bandwidth, measured by labkit on a GPU.

``measure()`` runs two kernels on the device in hand: a device-to-device copy (bandwidth = bytes read + bytes
written over the time) and a kernel that does nothing but independent fp32 fused multiply-adds. Measured ceilings
are kept in ``results/ceilings.json`` by device name, with the date; without a measurement the datasheet value is
used, labelled as such. Nothing here is typed in except that labelled datasheet table.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

import numpy as np

from ..launch import device
from ..measuring.ledger import repo_root
from ..measuring.timing import measure as timed
from . import measured

STORE = repo_root() / "results" / "ceilings.json"

#: vendor datasheet figures (fp32 non-tensor FLOP/s, memory bandwidth B/s), used only when nothing was measured
DATASHEET = {
    "NVIDIA H100 80GB HBM3": (66.9e12, 3.35e12),
    "NVIDIA H200": (66.9e12, 4.8e12),
    "Tesla V100-PCIE-32GB": (14.0e12, 0.90e12),
}


@dataclass(frozen=True)
class Ceilings:
    device: str
    flops: float  # fp32 FLOP/s
    bandwidth: float  # bytes/s
    source: str  # "measured by labkit, <date>" or "datasheet"

    @property
    def ridge(self) -> float:
        """FLOP per byte at which a kernel stops being memory-bound."""
        return self.flops / self.bandwidth


def _stored() -> dict:
    return json.loads(STORE.read_text()) if STORE.exists() else {}


def for_device(name: str) -> Ceilings | None:
    """Measured ceilings of ``name`` if committed, else its datasheet values, else None."""
    stored = _stored().get(name)
    if stored:
        return Ceilings(name, stored["flops"], stored["bandwidth"], f"measured by labkit, {stored['date']}")
    if name in DATASHEET:
        flops, bw = DATASHEET[name]
        return Ceilings(name, flops, bw, "datasheet")
    return None


def measure(save: bool = False, repeat: int = 20) -> Ceilings:
    """Measure this GPU's ceilings (median of ``repeat`` timed runs after a warm-up, CUDA events)."""
    from numba import cuda, float32


    if device.info().kind != "gpu":
        raise RuntimeError("ceilings can only be measured on a real GPU")
    n = 1 << 28  # 1 GiB of float32
    src = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
    dst = cuda.device_array(n, np.float32)
    copy = timed(dst.copy_to_device, src, warmup=2, repeat=repeat)
    bandwidth = 2 * src.nbytes / copy.median

    iters = 4096

    @cuda.jit
    def fma(out, a, b):
        t = cuda.grid(1)
        x0, x1, x2, x3 = float32(t), float32(t + 1), float32(t + 2), float32(t + 3)
        x4, x5, x6, x7 = float32(t + 4), float32(t + 5), float32(t + 6), float32(t + 7)
        # one FFMA each (cuda.fma), with literal operands: with the registers a and b in every instruction an H200
        # measured 33.8 of its 66.9 TFLOP/s, below what the kit's own conv kernels reach (probably register-bank
        # conflicts; in this form an H100 measured 30.0 of 66.9, still below the kit's tuned conv, so no measured
        # ceilings are committed)
        for _ in range(iters):
            x0 = cuda.fma(x0, float32(0.999), float32(0.001))
            x1 = cuda.fma(x1, float32(0.999), float32(0.001))
            x2 = cuda.fma(x2, float32(0.999), float32(0.001))
            x3 = cuda.fma(x3, float32(0.999), float32(0.001))
            x4 = cuda.fma(x4, float32(0.999), float32(0.001))
            x5 = cuda.fma(x5, float32(0.999), float32(0.001))
            x6 = cuda.fma(x6, float32(0.999), float32(0.001))
            x7 = cuda.fma(x7, float32(0.999), float32(0.001))
        out[t] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + a * b

    dev = cuda.get_current_device()
    threads = dev.MULTIPROCESSOR_COUNT * 2048 * 4
    out = cuda.device_array(threads, np.float32)
    run = timed(lambda: fma[threads // 256, 256](out, np.float32(0.999), np.float32(0.001)), warmup=2, repeat=repeat)
    flops = threads * iters * 8 * 2 / run.median
    name = device.label()
    date = dt.date.today().isoformat()
    if save:
        stored = _stored()
        stored[name] = {"flops": flops, "bandwidth": bandwidth, "date": date,
                        "how": f"labkit.ceilings.measure(): 1 GiB device-to-device copy (read + write bytes) and "
                               f"{threads} threads x {iters} x 8 independent fp32 FMAs; medians of {repeat}"}
        STORE.parent.mkdir(parents=True, exist_ok=True)
        STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return Ceilings(name, flops, bandwidth, f"measured by labkit, {date}")


def describe(c: Ceilings | None) -> str:
    if c is None:
        return "no ceilings known for this device (run labkit.ceilings.measure(save=True) on it)"
    return (f"{c.device}: {c.flops / 1e12:.1f} TFLOP/s fp32, {c.bandwidth / 1e12:.2f} TB/s, ridge at "
            f"{c.ridge:.1f} FLOP/byte ({c.source})")


def current() -> Ceilings | None:
    """This GPU's ceilings; on a machine without one, those of the GPU the kit's newest committed results ran on."""
    if device.info().kind == "gpu":
        return for_device(device.label())
    res = measured.latest()
    return for_device(res.device) if res is not None else None
