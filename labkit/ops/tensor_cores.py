"""A 5 x 5 conv on the tensor cores at fp32's accuracy (3xTF32), in CUDA C: the kit's conv one step past FMA.

Stage 09's direct register tiles run cifar10's convs at about 60 per cent of an H100's fp32 FMA peak, and Winograd's
fewer multiplies did not pay here (``labkit.winograd``). The tensor cores multiply TF32 numbers (fp32 with a
10-bit mantissa) several times faster than the FMA units; alone they would round every product to about 1e-3. The
3xTF32 split (used by CUTLASS for fp32 GEMMs) keeps fp32's accuracy: each fp32 value is its TF32 rounding plus the
TF32 rounding of what is left,

    a = a_big + a_small,     a * b  ~  a_big * b_big + a_big * b_small + a_small * b_big

with fp32 accumulation; the dropped a_small * b_small is about 2^-22 of the product. Inputs, weights, sums and
outputs stay fp32; ``tests/test_tensor_cores.py`` bounds the error against float64 beside the direct kernel's.

The conv is an implicit GEMM: D[pixel, map] = sum over k = (channel, row, column) of A[pixel, k] W[map, k], A read
straight from the input window in shared memory (no im2col array). A warp owns ``mt`` tiles of 16 pixels and every
map (in tiles of 8: ``mma.sync.m16n8k8``), three MMAs per 8 k's. A block stages ``imgs`` padded input images and the
weights (in the order of the MMA's B fragment) once, then walks its pixel tiles. With a 2 x 2 pool, a tile's 16
pixels are four pool windows laid out so that each thread holds two of a window's four sums and its neighbour
lane the other two: one shuffle pools them, and the pooled output goes out with its bias and activation.

On a machine without a GPU it runs on the CPU emulation of CUDA C (``labkit.cudacpu``): TF32 rounding and the
warp's MMA and shuffle are emulated in the source (a warp's fragments meet in shared memory), the rest is the same
code.

Measured on an H100 (``results/h100-2026-11-26d``, ``tools/conv_timing.py --kernels tc``; ``tools/mma_rates.py``):
``mma.sync`` multiplies TF32 at 162 T multiply-adds a second and fp16 at 325 T, against the FMA units' 32 T. Three
TF32 products an fp32 one leave 1.7 times the FMA rate, and the 3xTF32 conv ran at 0.42 to 1.33 times stage 09's
direct register tiles per layer, with errors of 1e-6 to 4e-6 (its fp32 sums are not rounded as FMA's are). The fp16
split (``f16``; ``apre``: the staged images split once, a word holding a value's two halves) leaves 3.4 times and
ran up to 1.5 times the direct kernels' speed on the layers with many channels (cifar10's conv2 3.33 ms against
5.02, fashion's conv2 2.08 against 3.13), with errors of 1e-7 to 8e-7; the one-channel first layers stay direct.

What held it back then was the staging, not the multiplies (``results/h100-2026-11-26e``): padding the staged rows
(``kperm``) made cifar10's conv3 1.6 times slower though it took no more multiplies. A group's images are now staged
into the windows' interiors only (the borders are zeroed once a block), with float4 loads and four of them in flight a
thread: cifar10's conv1, conv2 and conv3 at 50000 images went from 2.71, 3.40 and 1.40 ms to 2.15, 2.40 and 0.88
(the direct kernels: 2.99, 5.03, 1.57). ``kperm`` (``labkit.conv_banks``: loads that hit 32 banks) then helps on
conv1 only (2.15 against 2.20).
``tools/conv_timing.py --save`` records per workload and layer the quickest configuration or none
(``results/tensor_cores.json``); ``tuned`` gives stage 10 the layers that have one.

The CUDA C source is ``labkit.ops.tensor_cores_source``'s (``SOURCE``); here its plans, its launch and the recorded
choices.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..launch import device, gpu
from ..measuring.ledger import repo_root
from ..model import layers
from . import conv_banks
from .tensor_cores_source import SOURCE

R = 5


@dataclass(frozen=True)
class Config:
    """How a block works: ``warps`` warps of ``mt`` 16-pixel tiles each at a time, over ``imgs`` staged images;
    ``minb`` blocks a multiprocessor should hold (the register budget ``__launch_bounds__`` gives); ``round``: the
    TF32 parts rounded to nearest (a conversion instruction each), else toward zero (one AND; each part's error
    twice as large); ``bpre``, ``apre``: the weights' (the staged images') parts split once into shared memory
    (twice the room) instead of at every use; ``f16``: the split into fp16 halves instead (``mma.sync`` m16n8k16,
    twice TF32's rate; the weights split once; ``round`` and ``bpre`` do not apply; with ``apre`` the staged
    images are split once into words of two halves, big and small, which byte permutes pair up; ``breg``: with
    f16 and at most 8 k steps, the weights' fragments held in registers for the block's whole run); ``kperm``:
    the staged rows and channels padded and the k's taken in an order whose loads hit 32 banks
    (``labkit.conv_banks``)."""

    name: str
    warps: int = 4
    mt: int = 2
    imgs: int = 1
    minb: int = 2
    round: int = 1
    bpre: int = 0
    apre: int = 0
    f16: int = 0
    breg: int = 0
    kperm: int = 0


#: the configurations a GPU run compares (``tools/conv_timing.py``): the default (TF32 parts rounded to nearest), and
#: the fastest of the H100 grids on some layer (``results/h100-2026-11-26d/conv_explore*.json``,
#: ``results/h100-2026-11-26e/conv_explore_stage*.json``)
CONFIGS = {c.name: c for c in (
    Config("w4 mt2 i1"),
    Config("w4 mt4 i1 r0 bpre", mt=4, round=0, bpre=1),
    Config("w8 mt2 i1 r0 bpre", warps=8, round=0, bpre=1),
    Config("w4 mt2 i2 r0", imgs=2, round=0),
    Config("w8 mt2 i2 f16", warps=8, imgs=2, f16=1),
    Config("w8 mt1 i1 f16", warps=8, mt=1, f16=1),
    Config("w4 mt1 i2 f16", mt=1, imgs=2, f16=1),
    Config("w4 mt1 i1 apre f16 breg kperm", mt=1, apre=1, f16=1, breg=1, kperm=1),
)}
DEFAULT = "w4 mt2 i1"
#: per workload and layer, the configuration that beat the direct kernel in a recorded GPU run (or none where none
#: did): ``tools/conv_timing.py --save``/``--save-from`` writes it, ``tuned`` reads it
STORE = repo_root() / "results" / "tensor_cores.json"
#: the kind's label in the timing tool's rows (``tf32x3`` in the runs before the fp16 split was added)
LABELS = ("tc ", "tf32x3 ")
#: shared memory a block may have on an H100 (227 KB of the multiprocessor's 228)
SHARED_LIMIT = 227 * 1024
#: at most this many blocks a multiprocessor in a grid; a block takes the next staged group until none is left
BLOCKS_PER_SM = 16


@dataclass(frozen=True)
class Plan(layers.Conv5x5):
    config: Config

    @property
    def ks(self) -> int:
        return 16 if self.config.f16 else 8

    @functools.cached_property
    def layout(self) -> conv_banks.Layout:
        order = conv_banks.conflict_free if self.config.kperm else conv_banks.natural
        return order(self.C, self.H, self.W, self.pad, self.ks, R)

    @property
    def shared_bytes(self) -> int:
        c, lay = self.config, self.layout
        ksteps, nt = len(lay.slots) // self.ks, -(-self.M // 8)
        return 4 * (ksteps * nt * 32 * (4 if c.bpre or c.f16 else 2) + len(lay.slots)
                    + c.imgs * self.C * lay.channel * (2 if c.apre and not c.f16 else 1))

    def macros(self) -> tuple[str, ...]:
        c, lay = self.config, self.layout
        values = dict(C=self.C, M=self.M, H=self.H, W=self.W, PAD=self.pad, R=R, ACT=self.act,
                      P=2 if self.pool else 1, WARPS=c.warps, MT=c.mt, IMGS=c.imgs, MINB=c.minb, ROUND=c.round,
                      BPRE=c.bpre, APRE=c.apre, F16=c.f16, BREG=c.breg, SROW=lay.row, SCH=lay.channel,
                      NSLOTS=len(lay.slots))
        if c.kperm:
            values["KSLOTS"] = ",".join(map(str, lay.slots))
        return tuple(f"-D{k}={v}" for k, v in values.items())


def module(macros: tuple[str, ...]):
    """The compiled source for one plan (a cupy RawModule on a GPU, else the CPU emulation's)."""
    return gpu.kit_module(SOURCE, macros)


def plan_for(x, w, pad: int, stride: int, act: int, pool: int, config: str | Config = DEFAULT) -> Plan:
    """The plan of a call, or a one-line refusal of what the kernel does not do."""
    c = config_named(config) if isinstance(config, str) else config
    p = Plan(**vars(layers.conv5x5("conv_split3", x, w, pad, stride, act, pool)), config=c)
    if p.shared_bytes > SHARED_LIMIT:
        raise ValueError(f"conv_split3: {c.imgs} staged image(s) and the weights need {p.shared_bytes} bytes of "
                         f"shared memory a block, over {SHARED_LIMIT}: use a configuration with fewer images")
    return p


def conv_split3(x, w, b, out, pad: int, stride: int = 1, act: int = 0, pool: int = 0,
                config: str | Config = DEFAULT) -> None:
    """A conv layer function (the fused conv convention: device arrays x (N, C, H, W), w (M, C, 5, 5), b (M,),
    out) on the tensor cores, with the split its configuration names (TF32 or fp16 halves)."""
    p = plan_for(x, w, pad, stride, act, pool, config)
    kernel = module(p.macros()).get_function("conv_split3")
    n = int(x.shape[0])
    groups = -(-n // p.config.imgs)
    grid = max(1, min(groups, BLOCKS_PER_SM * gpu.multiprocessors()))
    shared = 0 if gpu.cuda_c_on_cpu() else p.shared_bytes  # the emulation's shared array has its size in the source
    gpu.launch_raw(kernel, grid, 32 * p.config.warps, (x, w, b, out, np.int32(n)), shared_bytes=shared)


def config_named(name: str) -> Config:
    """A configuration by its name: one of ``CONFIGS``, or ``w<warps> mt<tiles> i<images> [m<minb>] [r<round>]
    [bpre] [apre] [f16] [breg] [kperm]``."""
    if name in CONFIGS:
        return CONFIGS[name]
    found = re.fullmatch(r"w(\d+) mt(\d+) i(\d+)(?: m(\d))?(?: r([01]))?( bpre)?( apre)?( f16)?( breg)?( kperm)?",
                         name.strip())
    if not found:
        raise ValueError(f"tensor_cores: no configuration {name!r}; name one of {', '.join(CONFIGS)} or "
                         f"'w<warps> mt<tiles> i<images> [m<blocks>] [r<0|1>] [bpre] [apre] [f16] [breg] [kperm]'")
    w, mt, i, minb, r, *flags = found.groups()
    bpre, apre, f16, breg, kperm = (int(bool(f)) for f in flags)
    return Config(name, warps=int(w), mt=int(mt), imgs=int(i), minb=int(minb or 2), round=int(r or 1),
                  bpre=bpre, apre=apre, f16=f16, breg=breg, kperm=kperm)


def save_choices(entries: list[dict], path: Path | None = None) -> dict:
    """Write ``entries`` (net, images, device, date, command, choice, medians_ms) into the store, each replacing
    the entry of its net, images and device."""
    path = path or STORE
    data = json.loads(path.read_text()) if path.exists() else {"entries": []}
    keys = {(e["net"], e["images"], e["device"]) for e in entries}
    data["entries"] = [e for e in data["entries"] if (e["net"], e["images"], e["device"]) not in keys] + entries
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def stored(net: str, images: int) -> dict | None:
    """The recorded choice for ``net`` at ``images``: this device's when there is one, else the newest."""
    if not STORE.exists():
        return None
    entries = [e for e in json.loads(STORE.read_text())["entries"] if e["net"] == net and e["images"] == images]
    return ([e for e in entries if e["device"] == device.label()] or entries or [None])[-1]


def layers_on_tensor_cores(net: str, images: int) -> list[str]:
    """The conv layers of ``net`` at ``images`` that the recorded run gave to the tensor cores."""
    kept = stored(net, images)
    return [layer for layer, name in (kept or {}).get("choice", {}).items() if name]


def tuned(net: str, images: int) -> dict:
    """``{layer: conv}`` for the layers where the recorded run found a configuration faster than the direct kernel
    (the others are left to the caller's); nothing where CUDA C cannot run here (no GPU and no C++ compiler)."""
    kept = stored(net, images)
    if not kept or device.unavailable(("cuda_c",)):
        return {}
    out = {}
    for layer in layers_on_tensor_cores(net, images):
        name = kept["choice"][layer]
        config = config_named(name)

        def conv(x, w, b, o, pad, stride=1, act=0, pool=0, config=config):
            conv_split3(x, w, b, o, pad, stride, act, pool, config=config)

        conv.__name__ = f"conv_split3_{re.sub(r'[^0-9a-z]+', '_', name)}"
        conv.tensor_core_config = config  # what it issues, for the floor of its units (labkit.floors)
        out[layer] = conv
    return out
