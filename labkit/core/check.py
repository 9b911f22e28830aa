"""Self-checks for student kernels: fresh random inputs, poisoned outputs, several batch sizes, one line each.

Every check calls the student's function through the engine (``labkit.engine``) with the calling convention of
``labkit.layers``, on inputs drawn fresh for every call (the seed is printed on failure, to reproduce it), with the
output and every pooled buffer filled with NaN first, at several batch sizes, odd ones included. The answer is the
float64 reference's. GPU code on the CUDA simulator is checked on the simulator's shrunk problem
(``labkit.simulator``); CPU code always at the real sizes.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

from ..course.stages import Variant
from ..launch import freed, gpu, simcheck, simulator
from ..launch.cudacpu import LABEL, NAN_HINT
from ..model.layers import SIGNATURES, groups, impl_for, kernel_layers
from ..model.nets import Layer, Net, get_net
from . import counts, engine
from .cases import (  # noqa: F401
    BATCHES,
    DEFAULT_TOL,
    NETWORK_BATCHES,
    Case,
    answer,
    default_batches,
    fresh_seed,
    group_case,
    kept_from_earlier,
    layer_case,
    magnitude,
    network_case,
    weighted,
)


@dataclass
class CheckResult:
    """Outcome of one check; ``str()`` is the one fixed-format line a notebook prints."""

    name: str
    passed: bool
    error: float = float("nan")
    tol: float = DEFAULT_TOL
    batches: tuple[int, ...] = ()
    detail: str = ""
    seed: int | None = None
    shapes: dict = field(default_factory=dict)
    note: str = ""  # a PASS that is not about values (a technique check) says what it found instead
    given: str = ""  # where the checked code came from when it is not the notebook's own ("stage 02", "the kit")
    emulated: str = ""  # "CPU emulation of CUDA C" when the check ran CUDA C on the CPU (labkit.cudacpu)
    nan: engine.NanCauses | None = None  # why the output held NaN (engine.checked_call), when it did

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self._line() + (f" [{self.emulated}]" if self.emulated else "")

    def _line(self) -> str:
        if self.passed and self.note:
            return f"{self.name}: PASS ({self.note})"
        if self.passed:
            return (f"{self.name}: PASS (rel. error {self.error:.1e} <= {self.tol:.0e}, "
                    f"batches {' '.join(map(str, self.batches))})")
        err = f"rel. error {self.error:.1e} > {self.tol:.0e}; " if np.isfinite(self.error) else ""
        seed = f" [seed {self.seed}]" if self.seed is not None else ""
        return f"{self.name}: FAIL ({err}{self.detail}){seed}"


def _fmt_index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _layout_hint(got: np.ndarray, expected: np.ndarray) -> str:
    """Name the layout mistake when the values are right but in NHWC order inside an NCHW ``out``."""
    if got.ndim != 4 or not np.isfinite(got).all():
        return ""
    n, c, h, w = expected.shape
    nhwc = got.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    scale = float(np.abs(expected).max()) or 1.0
    if np.allclose(nhwc, expected, rtol=1e-4, atol=1e-5 * scale):
        return (" — the right values in NHWC order (batch, row, column, channel); the kit's layout is NCHW "
                "(batch, channel, row, column): out[n, m, i, j]")
    return ""


#: what the kernel did to the NaN elements it wrote (``engine.NanCauses``), and where to look
ADDED = ("added onto {out}'s initial contents (`+=` with no first write: start the sum from 0 or from the bias, "
         "and write it with `=`)")
READ = ("read data that was never written (an unwritten buffer: a plane of partial sums, a pad border, or past the "
        "end of an input)")


def nan_detail(nan: engine.NanCauses | None, out_name: str, expected: str, launches: int | None,
               everything: bool) -> str:
    """The rest of compare's line after "first out[i]" when that element is NaN: each cause the engine's diagnosis
    found (``engine.checked_call``) in one clause, the self-check's and the grader's words alike. ``everything``:
    every element of out is NaN. Without a diagnosis (a whole net's output) it claims no cause."""
    if nan is None:
        return f" is NaN (never written, or computed from data never written), {expected}"
    added, read = ADDED.format(out=out_name), READ
    if not nan.written:
        hint = ""
        if everything and launches:
            hint = (f"; nothing was written into {out_name}, although {launches} kernel launch"
                    f"{'es' * (launches != 1)} ran: does the kernel write into another array (a copy, a "
                    f"buffer of its own), or return before writing?")
        elif everything:
            hint = (f"; nothing was written into {out_name}: is the function still the TODO stub, is its kernel "
                    f"never launched, or does it write into another array?")
        return f" is unwritten (still NaN), {expected}{hint}"
    if not nan.unwritten and not (nan.added and nan.read):
        return f" is NaN although your kernel wrote it, {expected} — it {added if nan.added else read}"
    parts = [f"{nan.unwritten} were never written"] if nan.unwritten else []
    parts += [f"{nan.added} were written by your kernel, which {added}"] if nan.added else []
    parts += [f"{nan.read} were written by your kernel, which {read}"] if nan.read else []
    return f" is NaN, {expected} — of its {nan.unwritten + nan.written} NaN, {'; '.join(parts)}"


def compare(name: str, got, expected: np.ndarray, tol: float = DEFAULT_TOL, batch: int | None = None,
            out_name: str = "out", launches: int | None = None, scale: np.ndarray | None = None,
            nan: engine.NanCauses | None = None) -> CheckResult:
    """Compare an output with the reference: layout, dtype, NaN elements, then the relative error
    ‖got − expected‖/‖expected‖, or ‖got − expected‖/‖scale‖ where ``scale`` (``magnitude``) says how large the
    terms of each output were; on failure, say where the first wrong element is. ``launches``, when known, is
    how many kernels the call launched: it tells a stub from a kernel that wrote into another array. ``nan``: the
    engine's diagnosis of the NaN elements (``engine.checked_call``), worded by ``nan_detail``."""
    where = f" at batch size {batch}" if batch is not None else ""
    if not isinstance(got, np.ndarray):
        if hasattr(got, "copy_to_host") or hasattr(got, "get"):
            got = gpu.as_host(got)
        else:
            return CheckResult(name, False, detail=f"{out_name} is a {type(got).__name__}, expected a float32 array "
                                                   f"of shape {expected.shape}")
    if got.shape != expected.shape:
        hint = ""
        if got.ndim == 4 and got.shape == (expected.shape[0], expected.shape[2], expected.shape[3], expected.shape[1]):
            hint = " — that is NHWC; the kit's layout is NCHW (batch, channel, row, column)"
        return CheckResult(name, False, detail=f"{out_name} has shape {got.shape}, expected {expected.shape}{where}{hint}")
    if got.dtype != np.float32:
        return CheckResult(name, False, detail=f"{out_name} has dtype {got.dtype}, expected float32{where}")
    bad = ~np.isfinite(got)
    if bad.any():
        idx = np.argwhere(bad)[0]
        want = f"expected {expected[tuple(idx)]:.6g}"
        rest = (nan_detail(nan, out_name, want, launches, bool(np.isnan(got).all()))
                if np.isnan(got[tuple(idx)]) else f" is {got[tuple(idx)]}, {want}")
        return CheckResult(name, False, detail=f"{int(bad.sum())} of {got.size} elements not finite{where}; first "
                                               f"{out_name}{_fmt_index(idx)}{rest}", nan=nan)
    exp64 = expected.astype(np.float64)
    diff = got.astype(np.float64) - exp64
    norm = max(np.linalg.norm(exp64), np.linalg.norm(scale) if scale is not None else 0.0)
    error = float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff))
    if error <= tol:
        return CheckResult(name, True, error, tol)
    scale = np.sqrt(np.mean(exp64 ** 2)) or 1.0
    wrong = np.abs(diff) > tol * 10 * scale
    idx = np.argwhere(wrong)[0] if wrong.any() else np.unravel_index(np.argmax(np.abs(diff)), diff.shape)
    return CheckResult(name, False, error, tol,
                       detail=f"first wrong element{where}: {out_name}{_fmt_index(idx)} = {got[tuple(idx)]:.6g}, "
                              f"expected {expected[tuple(idx)]:.6g}; {int(wrong.sum())} of {got.size} elements off"
                              f"{_layout_hint(got, expected)}")


# -------------------------------------------------------------------------------------------- running

_LIBRARY_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(np.__file__).rsplit(os.sep, 1)[0])


def _is_student_frame(filename: str) -> bool:
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def describe_failure(exc: BaseException, name: str) -> str:
    """A raise in student code becomes one line naming the line of the student's code it came from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_student_frame(f.filename)]
    if isinstance(exc, NotImplementedError):
        stub = (f"{frames[-1].name}() is still the TODO stub" if frames else str(exc)
                if str(exc).endswith("TODO stub") else "a function it calls is still a TODO stub")
        return f"not implemented yet: {stub}"
    where = f" (line {frames[-1].lineno}: {frames[-1].line.strip()})" if frames and frames[-1].line else ""
    return f"{name} raised {type(exc).__name__}: {' '.join(str(exc).split())}{where}"


def _run_case(name: str, case: Case, call: Callable[[], np.ndarray | engine.LayerCall], batch: int, tol: float,
              watch_races: bool = True) -> CheckResult:
    """Run one case; on the simulator every launch is also watched for races and missing barriers, which fail
    the check even when the values come out right (the simulator hides what a GPU would show). A layer's call
    returns the engine's ``LayerCall``: its output and why it holds NaN."""
    with gpu.counting() as counts, simcheck.watching() if watch_races else nullcontext(simcheck.Watch()) as watch:
        try:
            got = call()
        except Exception as exc:  # noqa: BLE001 - any student error becomes a FAIL line, not a traceback wall
            return CheckResult(name, False, detail=describe_failure(exc, case.name))
    if watch.conflicts:
        launch = watch.conflicts[0]
        return CheckResult(name, False, detail=f"data race at batch size {batch}: {launch.describe()}")
    got, nan = (got.out, got.nan) if isinstance(got, engine.LayerCall) else (got, None)
    return compare(name, got, case.expected, tol, batch=batch, launches=counts.launches, scale=case.scale, nan=nan)


def _check(make_case: Callable, call: Callable, name: str, batches, tol, seed, quiet,
           watch_races: bool = True, pair: freed.Pair | None = None) -> CheckResult:
    """Each batch's case in turn, to the first failure. With ``pair`` (the function the calls go through) one case
    gets its arrays where an earlier case's, freed just before, were (``_Landing``): the first whose weights have an
    earlier one's shapes, or else the first batch once more after them."""
    seed = fresh_seed(seed)
    rng = np.random.default_rng(seed)
    result = CheckResult(name, False, detail="no batch sizes to check")
    emulated = gpu.emulated_launches()
    landing = _Landing(pair)
    for n in batches:
        case = make_case(n, rng)
        result = landing.run(name, case, call, n, tol, watch_races)
        result.seed = seed
        result.shapes = {"input": case.x.shape[1:]}
        if not result.passed:
            break
        result.batches = tuple(batches)
    if result.passed and landing.pending:  # no two batches' weights had one shape: the first batch once more
        case = make_case(batches[0], rng)
        result = landing.run(name, case, call, batches[0], tol, watch_races)
        result.seed, result.shapes = seed, {"input": case.x.shape[1:]}
        result.batches = tuple(batches) if result.passed else ()
    if gpu.emulated_launches() > emulated:
        result.emulated = LABEL
        if not result.passed and result.nan is not None and result.nan.read:
            result.detail += NAN_HINT
    if not quiet:
        print(result)
    return result


class _Landing:
    """Which call of a check lands where an earlier one's arrays were (``freed.Pair``): each case's arrays are kept
    by its weights' shapes until a later case's weights have the same shapes; that case's are handed over at their
    addresses, freed just before. A kernel or result kept by id() of a freed array then answers with the earlier
    case's weights, and the failing line says so (``kept_from_earlier``)."""

    def __init__(self, pair: freed.Pair | None):
        self.pair = pair
        self.kept: dict = {}  # weights' shapes -> the case whose call's arrays are kept
        self.pending = pair is not None

    def run(self, name: str, case: Case, call: Callable, batch: int, tol: float, watch_races: bool) -> CheckResult:
        earlier = None
        if self.pending:
            shapes = tuple(np.shape(w) for w in case.weights.values())
            earlier = self.kept.get(shapes)
            if earlier is None:
                self.kept[shapes] = case
                self.pair.keep(shapes)
            else:
                self.pending = False
                self.pair.land(shapes)
        outputs = []
        result = _run_case(name, case, lambda: outputs.append(call(case)) or outputs[-1], batch, tol, watch_races)
        if earlier is not None and not result.passed and outputs:
            got = getattr(outputs[-1], "out", outputs[-1])  # a layer's call returns the output and its NaN diagnosis
            result.detail += kept_from_earlier(case.layer, (earlier.x, earlier.weights), (case.x, case.weights),
                                               gpu.as_host(got), tol)
        return result


def check_layer(fn: Callable, net: str | Net, layer: str, *, target: str = "gpu",
                batches: tuple[int, ...] | None = None, tol: float = DEFAULT_TOL, seed: int | None = None,
                arrays: str = "host", quiet: bool = False) -> CheckResult:
    """Check a function for one layer of ``net`` against the float64 reference (fresh inputs every call,
    NaN-poisoned output, several batch sizes). ``arrays="device"`` hands it device arrays."""
    net = get_net(net)
    spec = net.layer(layer)
    if not callable(fn):
        raise TypeError(f"check_layer needs the function for {layer} ({SIGNATURES.get(spec.kind)}), got {fn!r}")
    if arrays not in ("host", "device"):
        raise ValueError(f"arrays must be 'host' or 'device', not {arrays!r}")
    pair = freed.Pair(fn) if weighted(spec) else None
    return _check(lambda n, rng: layer_case(net, layer, n, rng, target),
                  lambda case: engine.checked_call(pair or fn, case.layer, case.x, case.weights, arrays),
                  layer, tuple(batches or default_batches(target)), tol, seed, quiet, pair=pair)


def check_group(fn: Callable, net: str | Net, group: tuple[Layer, ...], *, target: str = "gpu",
                batches: tuple[int, ...] | None = None, tol: float = DEFAULT_TOL, seed: int | None = None,
                arrays: str = "host", quiet: bool = False) -> CheckResult:
    """Check a fused conv function (``fn(x, w, b, out, pad, stride, act, pool)``) on a conv group: the conv, its
    activation and its pooling, against the float64 reference through all three."""
    net = get_net(net)
    name = "+".join(ly.name for ly in group)
    pair = freed.Pair(fn) if weighted(group) else None
    return _check(lambda n, rng: group_case(net, group, n, rng, target),
                  lambda case: engine.checked_call(pair or fn, case.layer, case.x, case.weights, arrays),
                  name, tuple(batches or default_batches(target)), tol, seed, quiet, pair=pair)


def check_network(variant: Variant, net: str | Net, *, batches: tuple[int, ...] | None = None,
                  tol: float = DEFAULT_TOL, seed: int | None = None, quiet: bool = False) -> CheckResult:
    """Check a variant's whole forward pass, chained by the engine as every run chains it, against the reference
    on fresh random inputs and weights (the shrunk net for GPU code on the simulator). Every intermediate is
    poisoned: a layer that leaves an image or a map unwritten fails here even if its own check passed."""
    if not isinstance(variant, Variant):
        raise TypeError(f"check_network needs a labkit.Variant, got {type(variant).__name__}")
    name = get_net(net).name

    held = freed.Held()  # each batch's weights put where the batch before's, freed, were (labkit.freed)

    def call(case: Case) -> np.ndarray:
        prepared = engine.prepare(case.net, variant, case.x, case.weights)
        prepared.weights = dict(zip(prepared.weights, held.swap(list(prepared.weights.values()))))
        return engine.forward(case.net, variant, prepared, check=True)

    default = simulator.NETWORK_BATCHES if simulator.shrinks(variant.target) else NETWORK_BATCHES
    # every function was watched for races in its own check; the chain is about what passes between layers
    return _check(lambda n, rng: network_case(net, n, rng, variant.target), call, f"{name} forward",
                  tuple(batches or default), tol, seed, quiet, watch_races=False)


def check_variant(variant: Variant, net: str | Net | None = None, quiet: bool = False,
                  batches: tuple[int, ...] | None = None, network: bool = True,
                  done: dict | None = None) -> list[CheckResult]:
    """Check every function of a variant on the layers it computes, then (``network``) its whole forward pass.

    Without ``net``, every net the variant runs: the first in full, the others only for the layer kinds the first
    did not cover (fashion's tanh, say) and their own forward pass. ``done`` carries results across calls, keyed
    by (net, layer, arrays, target, function): a function that several variants share, such as given code, is
    checked once and its result reused without a second line."""
    nets = [get_net(net)] if net is not None else [get_net(n) for n in variant.nets]
    why = variant.unavailable()
    if why:
        result = CheckResult(variant.label, False, detail=f"skipped: {why}")
        if not quiet:
            print(f"{variant.label}: SKIPPED ({why})")
        return [result]
    done = {} if done is None else done
    covered: set = set()
    results = []
    for spec in nets:
        layer_results = []
        for group in groups(kernel_layers(spec), variant.fuse):
            layer = group[0]
            fn = impl_for(variant.impls, layer)
            if fn is None:
                continue
            fn_id = id(getattr(fn, "device_fn", fn))
            kinds = "+".join(ly.kind for ly in group)
            if spec is not nets[0] and (kinds, fn_id) in covered:
                continue
            covered.add((kinds, fn_id))
            key = (spec.name, tuple(ly.name for ly in group), variant.arrays, variant.target, fn_id)
            if key not in done:
                if len(group) > 1:
                    r = check_group(fn, spec, group, target=variant.target, arrays=variant.arrays, quiet=True,
                                    batches=batches)
                else:
                    r = check_layer(fn, spec, layer.name, target=variant.target, arrays=variant.arrays,
                                    quiet=True, batches=batches)
                if spec is not nets[0]:
                    r.name = f"{spec.name} {r.name}"
                r.given = origin(fn, variant.stage) or ""
                drawable = variant.target == "gpu" and layer.kind == "conv" and not r.emulated
                if not r.passed and drawable and " element" in r.detail:
                    r.detail += (f"; to see the thread that wrote it, yours vs the spec: lk.show.failure(VARIANTS"
                                 f"[{variant.name!r}], {spec.name!r}, {layer.name!r})")
                if not quiet:
                    print(r)
                done[key] = r
            layer_results.append(done[key])
        results += layer_results
        if network and layer_results and all(results):  # a chain is worth checking once its layers pass
            r = check_network(variant, spec, quiet=quiet, batches=batches)
            origins = [origin(fn, variant.stage) for fn in variant.impls.values()]
            r.given = ", ".join(sorted(set(origins))) if all(origins) else ""
            results.append(r)
    return results


_NOTEBOOK_CELL = re.compile(r"^<(\d\d)_\w+\.ipynb cell \d+>$")


def origin(fn: Callable, stage: str | None = None) -> str | None:
    """Where a layer function comes from, when it is not the checked notebook's own code: "the kit" (labkit's
    layers and wrappers around them), "stage NN" (the given code of another stage, ``lk.from_stage``); None for the
    code of the notebook of ``stage`` (the student's). Wrappers are followed to what they wrap (``device_fn``)."""
    seen = 0
    while hasattr(fn, "device_fn") and fn.device_fn is not fn and seen < 8:
        fn, seen = fn.device_fn, seen + 1
    fn = getattr(fn, "py_func", fn)
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None), "__code__", None)
    if code is None:
        return None
    name = code.co_filename
    m = _NOTEBOOK_CELL.match(name)
    if m:
        return None if m.group(1) == stage else f"stage {m.group(1)}"
    if os.path.abspath(name).startswith(_LIBRARY_DIRS[0] + os.sep):
        return "the kit"
    return None


def given_summary(results: list[CheckResult]) -> str:
    """One line for the checks of given code that passed: where the code came from and how many checks passed
    ("given code (stage 02, the kit): 7 layers and 2 forward passes PASS"); "" when there are none."""
    passed = [r for r in results if r.given and r.passed]
    if not passed:
        return ""
    where = sorted({part for r in passed for part in r.given.split(", ")}, key=lambda w: (w == "the kit", w))
    where = [w.replace("the kit", "the kit's layers") for w in where]
    forward = sum(1 for r in passed if r.name.endswith(" forward"))
    layers = len(passed) - forward
    counts = [f"{layers} layer{'s' * (layers != 1)}"] if layers else []
    counts += [f"{forward} forward pass{'es' * (forward != 1)}"] if forward else []
    return f"given code ({', '.join(where)}): {' and '.join(counts)} PASS"


MEMORY_WORDS = {"shared": "shared memory", "constant": "constant memory"}


def check_technique(fn: Callable, net: str | Net, layer: str, memory: str, *, arrays: str = "device",
                    quiet: bool = False) -> CheckResult:
    """Does ``fn`` use the memory its stage is about ("shared" or "constant")? On the simulator: its kernels load
    from that memory (counted by ``labkit.simcheck``); on a GPU: a kernel it launched has that memory in its
    compiled resources (numba's per-kernel sizes, or a cupy RawKernel's attributes). Values are checked elsewhere."""
    if memory not in MEMORY_WORDS:
        raise ValueError(f"memory must be one of {', '.join(MEMORY_WORDS)}, not {memory!r}")
    net = get_net(net)
    name = f"{layer} uses {MEMORY_WORDS[memory]}"
    try:
        if simulator.active():
            c = counts.count_layer(fn, net.name, layer, arrays)
            loads = c.per_output(f"{memory} load")
            result = CheckResult(name, loads > 0, note=f"{loads:.1f} {MEMORY_WORDS[memory]} loads per output "
                                                       f"element, counted on the simulator")
        else:
            case = layer_case(net, layer, 1, np.random.default_rng(0), target="gpu")
            with gpu.counting() as launched:
                engine.call_layer(fn, case.layer, case.x, case.weights, arrays)
            use = {k: gpu.memory_use(obj).get(memory, 0) for k, obj in launched.launched.items()}
            used = {k: v for k, v in use.items() if v > 0}
            result = CheckResult(name, bool(used), note=", ".join(f"{k}: {v} bytes" for k, v in used.items()))
    except Exception as exc:  # noqa: BLE001 - a raise is the value check's business; say it here in one line
        return CheckResult(name, False, detail=describe_failure(exc, layer))
    if not result.passed:
        result.detail = (f"its kernels use no {MEMORY_WORDS[memory]}: this stage asks for kernels that stage their "
                         f"data in {MEMORY_WORDS[memory]}")
    if not quiet:
        print(result)
    return result
