"""Self-checks for student kernels: fresh random inputs, poisoned outputs, several batch sizes, one line.

Every student layer function follows one calling convention per layer kind (the kit's timing runner and
the grader call it the same way). The function writes its result into ``out``, which arrives filled
with NaN, so an element the kernel never writes shows up as a failure:

    conv     fn(x, w, b, out, pad, stride)   x (N,C,H,W), w (M,C,K,K), b (M,) (zeros if the layer has none)
    fc       fn(x, w, b, out)                x (N,IN), w (OUT,IN), b (OUT,)
    pool     fn(x, out, kernel, stride)      max pooling
    relu     fn(x, out)
    tanh     fn(x, out)
    softmax  fn(x, out)                      over axis 1
    network  fn(x, weights, out)             x (N,C,H,W) network input, out (N,classes) probabilities

With ``arrays="device"`` the arrays are numba device arrays (the data stays on the GPU); with the default
``"host"`` they are numpy arrays and the wrapper does its own copies.

Under the CUDA simulator each thread runs as Python, so checks run on a shrunk copy of the problem (fewer
maps, small odd image sizes): a kernel that reads its sizes from the arrays it is given passes both.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import reference
from .nets import Layer, Net, base_name, get_net, random_weights

SIGNATURES = {
    "conv": "fn(x, w, b, out, pad, stride)",
    "fc": "fn(x, w, b, out)",
    "pool": "fn(x, out, kernel, stride)",
    "relu": "fn(x, out)",
    "tanh": "fn(x, out)",
    "softmax": "fn(x, out)",
    "network": "fn(x, weights, out)",
}

# float32 kernels land far below this against a float64 reference (conv sums of a few hundred terms: ~1e-7);
# a wrong index or a missed term lands far above it.
DEFAULT_TOL = 1e-5
FULL_BATCHES = (1, 3, 8, 17)  # odd sizes catch kernels that assume a multiple of the block size
SIM_BATCHES = (1, 3)
SIM_MAX_CHANNELS = 4
SIM_FEATURES = 37


def simulated() -> bool:
    from .device import info

    return info().simulated


# ------------------------------------------------------------------------------------------ calling


def layer_args(layer: Layer, x, weights: dict, out) -> tuple:
    """The positional arguments a student function of this layer's kind receives."""
    if layer.kind in ("conv", "fc"):
        w = weights[f"{layer.name}.weight"]
        b = weights.get(f"{layer.name}.bias")
        if b is None:
            b = np.zeros(w.shape[0], np.float32) if isinstance(w, np.ndarray) else _device_zeros(w.shape[0])
        return (x, w, b, out, layer.pad, layer.stride) if layer.kind == "conv" else (x, w, b, out)
    if layer.kind == "pool":
        return (x, out, layer.kernel, layer.stride)
    if layer.kind in ("relu", "tanh", "softmax"):
        return (x, out)
    raise ValueError(f"layer {layer.name!r} of kind {layer.kind!r} takes no student function")


def call_layer(fn: Callable, layer: Layer, x, weights: dict, out):
    """Call a student function with the convention of its layer kind."""
    return fn(*layer_args(layer, x, weights, out))


def _device_zeros(n: int):
    from numba import cuda

    return cuda.to_device(np.zeros(n, np.float32))


# ------------------------------------------------------------------------------------------ comparing


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

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            return (f"{self.name}: PASS (rel. error {self.error:.1e} <= {self.tol:.0e}, "
                    f"batches {' '.join(map(str, self.batches))})")
        err = f"rel. error {self.error:.1e} > {self.tol:.0e}; " if np.isfinite(self.error) else ""
        seed = f" [seed {self.seed}]" if self.seed is not None else ""
        return f"{self.name}: FAIL ({err}{self.detail}){seed}"


def _fmt_index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def impl_for(impls: dict, layer: Layer) -> Callable | None:
    """The function a stage gives for ``layer``: the one registered under its name, else under its kind."""
    return impls.get(layer.name) or impls.get(layer.kind)


def to_host(a) -> np.ndarray:
    """A numpy array from a host array, a numba device array or a cupy array."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return a.get()


def compare(name: str, got, expected: np.ndarray, tol: float = DEFAULT_TOL, batch: int | None = None,
            out_name: str = "out") -> CheckResult:
    """Compare an output with the reference: layout, dtype, unwritten (NaN) elements, then the relative error
    ‖got − expected‖/‖expected‖; on failure, say where the first wrong element is."""
    where = f" at batch size {batch}" if batch is not None else ""
    if not isinstance(got, np.ndarray):
        if hasattr(got, "copy_to_host") or hasattr(got, "get"):
            got = to_host(got)
        else:
            return CheckResult(name, False, detail=f"{out_name} is a {type(got).__name__}, expected a float32 array "
                                                   f"of shape {expected.shape}")
    if got.shape != expected.shape:
        hint = ""
        if got.ndim == 4 and sorted(got.shape) == sorted(expected.shape) and \
                got.shape == (expected.shape[0], expected.shape[2], expected.shape[3], expected.shape[1]):
            hint = " — that is NHWC; the kit's layout is NCHW (batch, channel, row, column)"
        return CheckResult(name, False, detail=f"{out_name} has shape {got.shape}, expected {expected.shape}{where}{hint}")
    if got.dtype != np.float32:
        return CheckResult(name, False, detail=f"{out_name} has dtype {got.dtype}, expected float32{where}")
    bad = ~np.isfinite(got)
    if bad.any():
        idx = np.argwhere(bad)[0]
        what = "unwritten (still NaN)" if np.isnan(got[tuple(idx)]) else f"{got[tuple(idx)]}"
        # On a real GPU a `raise` inside a kernel is dropped, so a TODO stub kernel just writes nothing.
        hint = ("; nothing was written: is the kernel still the TODO stub, or never launched?"
                if np.isnan(got).all() else "")
        return CheckResult(name, False, detail=f"{int(bad.sum())} of {got.size} elements not finite{where}; first "
                                               f"{out_name}{_fmt_index(idx)} is {what}, expected "
                                               f"{expected[tuple(idx)]:.6g}{hint}")
    exp64 = expected.astype(np.float64)
    diff = got.astype(np.float64) - exp64
    norm = np.linalg.norm(exp64)
    error = float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff))
    if error <= tol:
        return CheckResult(name, True, error, tol)
    scale = np.sqrt(np.mean(exp64 ** 2)) or 1.0
    wrong = np.abs(diff) > tol * 10 * scale
    idx = np.argwhere(wrong)[0] if wrong.any() else np.unravel_index(np.argmax(np.abs(diff)), diff.shape)
    return CheckResult(name, False, error, tol,
                       detail=f"first wrong element{where}: {out_name}{_fmt_index(idx)} = {got[tuple(idx)]:.6g}, "
                              f"expected {expected[tuple(idx)]:.6g}; {int(wrong.sum())} of {got.size} elements off")


# ------------------------------------------------------------------------------------------ checking


def _fresh_seed(seed: int | None) -> int:
    return int(np.random.SeedSequence(seed).entropy % (2 ** 32)) if seed is None else int(seed)


def check_net(net: str | Net) -> Net:
    """The net a check runs on: the real one on a GPU or CPU, a shrunk copy under the CUDA simulator."""
    net = get_net(net)
    if not simulated():
        return net
    h = 8 if net.layers[0].pad else 16
    w = 8 if net.layers[0].pad else 14
    return net.scaled((h, w), SIM_MAX_CHANNELS)


def _layer_input_shape(net: Net, layer: Layer, sim: bool) -> tuple[int, ...]:
    """Input shape (no batch) for a layer check: the real one, or a shrunk one under the simulator."""
    shape = net.input_shape_of(layer.name)
    if not sim:
        return shape
    if len(shape) == 3:
        c, h, w = shape
        c = min(c, SIM_MAX_CHANNELS)
        k = layer.kernel or 2
        h, w = (max(k + 4, 7), max(k + 2, 6)) if not layer.pad else (7, 6)
        shape = (c, h, w)
    else:
        shape = (min(shape[0], SIM_FEATURES),)
    return shape


def _layer_weights(layer: Layer, in_shape: tuple[int, ...], rng, sim: bool) -> dict[str, np.ndarray]:
    if layer.kind == "conv":
        # under the simulator M != C on purpose: a kernel that mixes up the two indices fails
        shape = (min(layer.out, SIM_MAX_CHANNELS + 1) if sim else layer.out, in_shape[0], layer.kernel,
                 layer.kernel)
    elif layer.kind == "fc":
        shape = (layer.out, in_shape[0])
    else:
        return {}
    fan_in = int(np.prod(shape[1:]))
    w = {f"{layer.name}.weight": (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)}
    if layer.bias:
        w[f"{layer.name}.bias"] = rng.standard_normal(shape[0]).astype(np.float32)
    return w


def _inputs(layer_kind: str, shape: tuple[int, ...], rng) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return x * 3 if layer_kind == "softmax" else x


def _to_device(arrays: str, x):
    if arrays == "host":
        return x
    from numba import cuda

    if isinstance(x, dict):
        return {k: cuda.to_device(v) for k, v in x.items()}
    return cuda.to_device(x)


_LIBRARY_DIRS = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(np.__file__).rsplit(os.sep, 1)[0])


def _is_student_frame(filename: str) -> bool:
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def _run_student(fn: Callable, args: tuple, name: str) -> str | None:
    """Call the student's function; a raise becomes one message naming the line in the student's code."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - any student error becomes a FAIL line, not a traceback wall
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_student_frame(f.filename)]
        where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames and frames[-1].line else ""
        if isinstance(exc, NotImplementedError):
            return f"not implemented yet: {name} raised NotImplementedError{where}"
        return f"{name} raised {type(exc).__name__}: {exc}{where}"
    return None


@dataclass
class Case:
    """One test case: inputs, weights and the float64 reference's answer (as float32)."""

    name: str
    layer: Layer | None  # None: the whole network
    x: np.ndarray
    weights: dict[str, np.ndarray]
    expected: np.ndarray

    def poisoned_out(self) -> np.ndarray:
        return np.full(self.expected.shape, np.nan, np.float32)

    def args(self, arrays: str = "host") -> tuple[tuple, object]:
        """(arguments for the student's function, the out array in them) with out poisoned."""
        x, w, out = _to_device(arrays, self.x), _to_device(arrays, self.weights), _to_device(arrays, self.poisoned_out())
        return (layer_args(self.layer, x, w, out) if self.layer is not None else (x, w, out)), out


def layer_case(net: str | Net, layer: str, batch: int, rng, target: str = "gpu") -> Case:
    """Fresh random inputs and weights for one layer (shrunk under the simulator when ``target="gpu"``)."""
    net = get_net(net)
    spec = net.layer(layer)
    if spec.kind == "flatten":
        raise ValueError("flatten is a reshape, not a kernel: there is nothing to check")
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target must be 'gpu' or 'cpu', not {target!r}")
    sim = simulated() and target == "gpu"
    in_shape = _layer_input_shape(net, spec, sim)
    x = _inputs(spec.kind, (batch, *in_shape), rng)
    weights = _layer_weights(spec, in_shape, rng, sim)
    expected = reference.layer_forward(spec, x, weights, accumulate="float64").astype(np.float32)
    return Case(spec.name, spec, x, weights, expected)


def network_case(net: str | Net, batch: int, rng, target: str = "gpu") -> Case:
    """Fresh random inputs and weights for the whole network (a shrunk net under the simulator)."""
    net = check_net(net) if target == "gpu" else get_net(net)
    weights = random_weights(net, seed=int(rng.integers(2 ** 31)))
    x = rng.uniform(-0.5, 0.5, (batch, *net.input_shape)).astype(np.float32)
    expected = reference.forward(net, weights, x, accumulate="float64")
    return Case(base_name(net), None, x, weights, expected)


def default_batches(target: str = "gpu") -> tuple[int, ...]:
    return SIM_BATCHES if simulated() and target == "gpu" else FULL_BATCHES


def _check(fn: Callable, make_case: Callable, name: str, batches, tol, seed, arrays, quiet) -> CheckResult:
    if arrays not in ("host", "device"):
        raise ValueError(f"arrays must be 'host' or 'device', not {arrays!r}")
    seed = _fresh_seed(seed)
    rng = np.random.default_rng(seed)
    result = None
    for n in batches:
        case = make_case(n, rng)
        args, out = case.args(arrays)
        problem = _run_student(fn, args, case.name)
        if problem:
            result = CheckResult(case.name, False, detail=problem, seed=seed)
            break
        got = out.copy_to_host() if arrays == "device" else out
        result = compare(case.name, got, case.expected, tol, batch=n)
        result.seed = seed
        result.shapes = {"input": case.x.shape[1:]}
        if not result.passed:
            break
        result.batches = tuple(batches)
    if not quiet:
        print(result)
    return result


def check_layer(fn: Callable, net: str | Net, layer: str, *, target: str = "gpu",
                batches: tuple[int, ...] | None = None, tol: float = DEFAULT_TOL, seed: int | None = None,
                arrays: str = "host", quiet: bool = False) -> CheckResult:
    """Check a student function for one layer of ``net`` against the float64 reference.

    Fresh random inputs and weights on every call (the seed is printed on failure to reproduce it),
    ``out`` poisoned with NaN, several batch sizes including odd ones. ``target="gpu"`` (numba.cuda code)
    shrinks the problem under the CUDA simulator; ``target="cpu"`` always checks the real layer sizes.
    """
    net = get_net(net)
    spec = net.layer(layer)
    if not callable(fn):
        raise TypeError(f"check_layer needs the function for {layer} ({SIGNATURES.get(spec.kind)}), got {fn!r}")
    return _check(fn, lambda n, rng: layer_case(net, layer, n, rng, target), layer,
                  tuple(batches or default_batches(target)), tol, seed, arrays, quiet)


def check_network(fn: Callable, net: str | Net, *, target: str = "gpu", batches: tuple[int, ...] | None = None,
                  tol: float = DEFAULT_TOL, seed: int | None = None, arrays: str = "host",
                  quiet: bool = False) -> CheckResult:
    """Check a whole-network function ``fn(x, weights, out)`` (out: class probabilities) against the reference
    on fresh random inputs and fresh random weights (a shrunk network under the simulator)."""
    if not callable(fn):
        raise TypeError(f"check_network needs {SIGNATURES['network']}, got {fn!r}")
    return _check(fn, lambda n, rng: network_case(net, n, rng, target), get_net(net).name,
                  tuple(batches or default_batches(target)), tol, seed, arrays, quiet)


def check_layers(impls: dict[str, Callable], net: str | Net, **kwargs) -> bool:
    """Check several layers (name -> function); print one line each; True when all pass."""
    return all([bool(check_layer(fn, net, name, **kwargs)) for name, fn in impls.items()])
