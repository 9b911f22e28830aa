"""What each thread of a small launch reads and writes, recorded on the simulator for ``labkit.show`` to draw.

A layer function is called once on a small case (one image, a few channels and maps: a few blocks of threads, so a
recording takes a second or two) inside ``simcheck.watching(log=True)``, which keeps every global, shared and
constant access with its thread and barrier epoch. Each array gets a *role* (what it holds: the input, the weights,
the bias, the output, an intermediate buffer): ``labkit.draw`` gives a role the same colour in every stage.

Recording needs the simulator. On a GPU machine ``record`` runs in a child process under the simulator, on the
stage's notebook as last saved (the function found by the name the notebook bound to it), as ``labkit.counts`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np

from ..core import engine
from ..core.cases import Case
from ..core.counts import _notebook_for, _path_of, _resolve
from ..course import nbcells
from ..launch import simcheck, simulator
from ..model import reference
from ..model.layers import groups, kernel_layers
from ..model.nets import get_net
from . import cuda_record as c_record

ROLES = ("input", "weights", "bias", "buffer", "output")
COLUMNS = ("array", "flat", "bx", "by", "bz", "tx", "ty", "tz", "epoch", "store", "atomic")


@dataclass
class Launch:
    """One kernel launch of a recording: its arrays (name -> kind, shape, role) and every access as a row of
    ``COLUMNS`` (``array`` indexes ``names``)."""

    kernel: str
    grid: tuple
    block: tuple
    arrays: dict  # name -> {"kind": "global" | "shared" | "constant", "shape": [...], "role": ...}
    rows: np.ndarray  # int64, one row per access, COLUMNS

    @property
    def names(self) -> list[str]:
        return list(self.arrays)

    def to_json(self, packed: bool = False) -> dict:
        """As JSON: the rows as lists, or ``packed`` into one string (``pack_rows``)."""
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block), "arrays": self.arrays,
                "rows": pack_rows(self.rows) if packed else self.rows.tolist()}

    @classmethod
    def from_json(cls, d: dict) -> Launch:
        rows = unpack_rows(d["rows"]) if isinstance(d["rows"], str) else \
            np.asarray(d["rows"], np.int64).reshape(-1, len(COLUMNS))
        return cls(d["kernel"], tuple(d["grid"]), tuple(d["block"]), d["arrays"], rows)

    def threads(self) -> np.ndarray:
        """(bx, by, bz, tx, ty, tz) of every access."""
        return self.rows[:, 2:8]

    def writer_of(self, array: str, flat: int) -> tuple | None:
        """(block, thread) of the thread that stored into ``array[flat]`` (the first in block and thread order
        when several did, as atomics do: the simulator's thread order varies from run to run), or None."""
        a = self.names.index(array) if array in self.arrays else -1
        hit = self.rows[(self.rows[:, 0] == a) & (self.rows[:, 1] == flat) & (self.rows[:, 9] == 1)]
        if not len(hit):
            return None
        r = min(tuple(int(v) for v in row[[4, 3, 2, 7, 6, 5]]) for row in hit)  # z, y, x: the flat order
        return (r[2], r[1], r[0]), (r[5], r[4], r[3])


@dataclass
class Recording:
    """The launches one call of a layer function made on one small case, with the case's sizes."""

    name: str
    launches: list[Launch] = field(default_factory=list)
    case: dict = field(default_factory=dict)  # sizes of the case: N, C, H, W, M, K, pad, pool, act
    output: list | None = None  # the host output of the call (flat), for comparing with the reference
    expected: list | None = None

    def launch(self, kernel: str | None = None) -> Launch:
        """The launch of ``kernel`` (a name or its start), else the last launch that writes the output."""
        if not self.launches:
            raise ValueError(f"{self.name} launched no kernel on the simulator")
        if kernel is not None:
            found = [ln for ln in self.launches if ln.kernel == kernel or ln.kernel.startswith(kernel)]
            if not found:
                raise ValueError(f"{self.name} launched no kernel named {kernel!r}; it launched "
                                 f"{', '.join(sorted({ln.kernel for ln in self.launches}))}")
            return found[-1]
        writes_out = [ln for ln in self.launches if any(a["role"] == "output" for a in ln.arrays.values())]
        return (writes_out or self.launches)[-1]

    def to_json(self) -> dict:
        return {"name": self.name, "launches": [ln.to_json() for ln in self.launches], "case": self.case,
                "output": self.output, "expected": self.expected}

    @classmethod
    def from_json(cls, d: dict) -> Recording:
        return cls(d["name"], [Launch.from_json(ln) for ln in d["launches"]], d["case"], d.get("output"),
                   d.get("expected"))


# ----------------------------------------------------------------------------------- elements and threads


def first_wrong(rec: Recording) -> tuple | None:
    """(n, m, i, j) of the first output element that is wrong or unwritten, as the self-check finds it."""
    if rec.output is None:
        shape = rec.case["out"]
        return tuple(int(v) for v in np.unravel_index(0, shape))
    got = np.asarray(rec.output, np.float64)
    want = np.asarray(rec.expected, np.float64)
    scale = np.sqrt(np.mean(want ** 2)) or 1.0
    bad = ~np.isfinite(got) | (np.abs(np.nan_to_num(got) - want) > 1e-4 * scale)
    if not bad.any():
        return None
    return tuple(int(v) for v in np.unravel_index(int(np.argmax(bad)), rec.case["out"]))


def element_or_middle(rec: Recording, element) -> tuple:
    """``element``, or the middle output element of the first image and map; one outside the output is refused in
    one line that names its shape."""
    out = tuple(int(s) for s in rec.case["out"])
    if element is None:
        return (0, 0, out[2] // 2, out[3] // 2) if len(out) == 4 else tuple(s // 2 for s in out)
    element = tuple(int(v) for v in np.ravel(element))
    if len(element) != len(out) or any(not 0 <= e < s for e, s in zip(element, out)):
        names = ("n", "m", "i", "j")[:len(out)] if len(out) <= 4 else [f"i{k}" for k in range(len(out))]
        raise ValueError(f"element {element} is outside this case's output, of shape {out}: give "
                         f"({', '.join(names)}) with {', '.join(f'0 <= {n} < {s}' for n, s in zip(names, out))}")
    return element


def _in_range(value, dims: tuple, what: str, within: str) -> None:
    """Refuse a block or thread index (flat, or (x, y, z)) outside the launch's ``dims``, naming the valid range."""
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    count = int(np.prod(dims))
    if isinstance(value, (int, np.integer)):
        ok = 0 <= int(value) < count
    else:
        coords = tuple(int(v) for v in value)
        ok = 0 < len(coords) <= 3 and all(0 <= c < d for c, d in zip(coords, dims))
    if not ok:
        raise ValueError(f"{what} {value} is outside the launch's {within} {dims}: give 0..{count - 1}, or (x, y, z) "
                         f"with x < {dims[0]}, y < {dims[1]}, z < {dims[2]}")


def output_array(launch: Launch) -> str | None:
    return next((n for n in launch.names if launch.arrays[n]["role"] == "output"
                 and launch.arrays[n]["kind"] == "global"), None)


def writer(rec: Recording, launch: Launch, element) -> tuple | None:
    """(block, thread) of the thread that stored output ``element`` (n, m, i, j) last, or None."""
    name = output_array(launch)
    if name is None:
        return None
    flat = int(np.ravel_multi_index(element, rec.case["out"]))
    return launch.writer_of(name, flat)


def selection(rec: Recording, launch: Launch, element=None, block=None, thread=None, warp=None) -> tuple:
    """(block, thread, warp) for ``labkit.lessons.chosen_threads.select``: as given (each within the launch, or
    refused in one line naming the valid range), else the thread that writes ``element``."""
    if block is not None or thread is not None or warp is not None:
        _in_range(block or 0, launch.grid, "block", "grid")
        if thread is not None:
            _in_range(thread, launch.block, "thread", "block")
        warps = -(-int(np.prod(launch.block)) // 32)
        if warp is not None and not 0 <= int(warp) < warps:
            raise ValueError(f"warp {warp} is outside the block: its {int(np.prod(launch.block))} threads make "
                             f"warps 0..{warps - 1}")
        return (block or 0, thread, warp)
    who = writer(rec, launch, element_or_middle(rec, element))
    if who is None:
        return (0, 0, None)
    return (who[0], who[1], None)


# --------------------------------------------------------------------------------------------- the case


def small_case(net: str = "cifar10", layer: str = "conv2", *, fuse: tuple[str, ...] = (), channels: int = 2,
               maps: int = 2, size: tuple[int, int] | None = None, images: int = 1, seed: int = 0):
    """One image of ``layer`` with ``channels`` input channels, ``maps`` output maps and a ``size`` image (default:
    the simulator's shrunk size), fresh weights from ``seed``; ``fuse`` adds the activation and pooling after it
    (a fused group, as ``Variant.fuse`` hands them over). Returns a ``labkit.check.Case``."""
    spec = get_net(net)
    conv = spec.layer(layer)
    if conv.kind != "conv":
        raise ValueError(f"lk.show draws conv layers; {layer} of {spec.name} is a {conv.kind} layer")
    group = next(g for g in groups(kernel_layers(spec), fuse) if g[0].name == layer)
    h, w = size or simulator.layer_input_shape(spec, conv)[1:]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((images, channels, h, w)).astype(np.float32)
    fan_in = channels * conv.kernel * conv.kernel
    weights = {f"{layer}.weight": (rng.standard_normal((maps, channels, conv.kernel, conv.kernel)) /
                                   np.sqrt(fan_in)).astype(np.float32)}
    if conv.bias:
        weights[f"{layer}.bias"] = rng.standard_normal(maps).astype(np.float32)
    y = reference.layer_forward(conv, x, weights, accumulate="float64")
    for ly in group[1:]:
        y = reference.layer_forward(ly, y, {}, accumulate="float64")
    layer_arg = group if len(group) > 1 else conv
    return Case("+".join(ly.name for ly in group), layer_arg, x, weights, y.astype(np.float32))


def _sizes(case) -> dict:
    group = case.layer if isinstance(case.layer, tuple) else (case.layer,)
    conv = group[0]
    w = case.weights[f"{conv.name}.weight"]
    pool = next((ly.kernel or 2 for ly in group[1:] if ly.kind == "pool"), 0)
    act = next((ly.kind for ly in group[1:] if ly.kind in ("relu", "tanh")), "")
    n, c, h, wd = case.x.shape
    return {"N": n, "C": c, "H": h, "W": wd, "M": int(w.shape[0]), "K": int(w.shape[2]), "pad": conv.pad,
            "pool": pool, "act": act, "out": list(case.expected.shape)}


# ----------------------------------------------------------------------------------------------- roles


def _role(name: str, kind: str, shape: tuple, stores: bool, loads: bool, sizes: dict) -> str:
    """What an array holds: as the case says (``sizes["roles"]``: name -> role), else from its shape against the
    case's (global arrays of a conv case) or its name (shared, constant)."""
    shape = tuple(shape)
    given = sizes.get("roles", {}).get(name)
    if given:
        return given
    if kind == "constant":
        return "weights"
    if kind == "shared":
        low = name.lower()
        if low.startswith("w") or "wt" in low or low.endswith("w"):
            return "weights"
        if low.startswith("o") or any(s in low for s in ("out", "acc", "red", "sum", "partial")):
            return "output"
        return "input"
    if "N" not in sizes:  # not a conv case: by shape, as the case lists its arrays
        by_shape = {tuple(v): r for r, v in sizes.get("shapes", {}).items()}
        return by_shape.get(shape, "output" if stores and not loads else "buffer")
    n, c, h, w, m, k = (sizes[key] for key in ("N", "C", "H", "W", "M", "K"))
    size = int(np.prod(shape))
    if not stores and (shape == (m, c, k, k) or (size == m * c * k * k and shape != (n, c, h, w))):
        return "weights"  # a reshaped view (stage 07's M x C*K*K matrix) is still the weights
    if not stores and (shape == (n, c, h, w) or size == n * c * h * w):
        return "input"
    if shape == (m,) and not stores:
        return "bias"
    if stores and not loads and (shape == tuple(sizes["out"]) or int(np.prod(shape)) == int(np.prod(sizes["out"]))):
        return "output"
    return "buffer"


def _launch_of(sim_launch, sizes: dict) -> Launch:
    names = sorted(sim_launch.arrays)  # not the order of first access: that is the simulator's thread order
    # (an atomic add's read is part of its write: an array only added into is an output)
    index = {name: i for i, name in enumerate(names)}
    rows = np.array([(index[a], flat, *blk, *thr, ep, int(st), int(at))
                     for a, flat, blk, thr, ep, st, at in sim_launch.accesses], np.int64).reshape(-1, len(COLUMNS))
    arrays = {}
    for name in names:
        kind, shape = sim_launch.arrays[name]
        mine = rows[rows[:, 0] == index[name]]
        arrays[name] = {"kind": kind, "shape": list(shape),
                        "role": _role(name, kind, shape, bool(mine[:, 9].any()),
                                      bool(((mine[:, 9] == 0) & (mine[:, 10] == 0)).any()), sizes)}
    return Launch(sim_launch.kernel, tuple(sim_launch.grid), tuple(sim_launch.block), arrays, rows)


def record_here(fn, case, arrays: str = "device", name: str = "", shapes: dict | None = None) -> Recording:
    """Call ``fn`` on ``case`` under the simulator and keep every access of every launch it makes (CUDA C's too,
    on the CPU emulation: ``labkit.lessons.cuda_record``; ``shapes``: name -> shape of a CUDA C kernel's shared array)."""
    rec = record_call(lambda: engine.call_layer(fn, case.layer, case.x, case.weights, arrays), _sizes(case),
                      name or getattr(fn, "__name__", "fn"), shapes)
    rec.expected = np.asarray(case.expected, np.float64).ravel().tolist()
    return rec


def record_call(call, sizes: dict, name: str, shapes: dict | None = None) -> Recording:
    """Run ``call()`` under the simulator and keep every access of every launch it makes; ``sizes`` describes the
    case (``out``: the output's shape; ``roles``: array name -> role; ``shapes``: role -> shape). The output
    ``call()`` returns, if any, is kept for ``first_wrong``. A TODO stub raises NotImplementedError again unless
    some kernel ran before it (stage 07's unroll before the product); any other raise is kept as ``raised``."""
    if not simulator.active():
        raise RuntimeError("recording accesses needs the CUDA simulator (labkit.access.record runs it in a child "
                           "process on a GPU machine)")
    sizes = dict(sizes)
    got = None
    with simcheck.watching(log=True) as watch, c_record.recording(watch, shapes):
        try:
            got = call()
        except NotImplementedError as exc:
            if not watch.launches:
                raise
            sizes["stub"] = " ".join(str(exc).split())[:200]
        except Exception as exc:  # noqa: BLE001 - the picture of what ran before the raise is still worth drawing
            sizes["raised"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
    rec = Recording(name, [_launch_of(ln, sizes) for ln in watch.launches], sizes)
    rec.output = None if got is None else np.asarray(got, np.float64).ravel().tolist()
    return rec


def pack_rows(rows: np.ndarray) -> str:
    """Rows of accesses as text for a JSON file: int32, zlib, base64 (a block's rows: a few kilobytes)."""
    import base64
    import zlib

    return base64.b64encode(zlib.compress(np.ascontiguousarray(rows, np.int32).tobytes(), 9)).decode()


def unpack_rows(text: str) -> np.ndarray:
    import base64
    import zlib

    return np.frombuffer(zlib.decompress(base64.b64decode(text)), np.int32).astype(np.int64).reshape(-1, len(COLUMNS))


# ------------------------------------------------------------------------------ in a child, on a GPU machine

CASE_KEYS = ("net", "layer", "fuse", "channels", "maps", "size", "images", "seed")


def record(fn, case_args: dict, arrays: str = "device", name: str = "", stage: str | None = None,
           namespace: dict | None = None) -> Recording:
    """``record_here`` on ``small_case(**case_args)``: in this process on the simulator, else in a child process
    under the simulator that loads ``stage``'s notebook (as saved; the kit's solution when there is none) and finds
    ``fn`` by the name ``namespace`` (the notebook's) binds it to."""
    if simulator.active():
        return record_here(fn, small_case(**case_args), arrays, name)

    if stage is None:
        raise ValueError("on a GPU machine lk.show records in a child process on the simulator: say which stage's "
                         "notebook holds the function (stage='05')")
    path = fn if isinstance(fn, str) else _path_of(fn, namespace or {})
    job = {"notebook": str(_notebook_for(stage)), "function": path, "case": case_args, "arrays": arrays,
           "name": name or getattr(fn, "__name__", str(fn))}
    return _in_child(job)


def _in_child(job: dict) -> Recording:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "labkit.lessons.access"], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"recording under the simulator failed: {tail[0]}")
    return Recording.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))


def _main() -> int:
    """Child: load the notebook's kernel cells under the simulator, record the named function on the case."""
    job = json.loads(sys.stdin.read())
    fn = _resolve(nbcells.load(job["notebook"]), job["function"])
    case_args = dict(job["case"])
    if case_args.get("size") is not None:
        case_args["size"] = tuple(case_args["size"])
    case_args["fuse"] = tuple(case_args.get("fuse") or ())
    rec = record_here(fn, small_case(**case_args), job.get("arrays", "device"), job.get("name", ""))
    print(json.dumps(rec.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
