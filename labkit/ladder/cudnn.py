"""The bar to beat: the same forward pass through PyTorch (cuDNN, fp32, TF32 off), timed layer by layer.

Only where PyTorch is installed with a usable GPU; labkit never needs it otherwise. ``precision`` runs the same
pass with TF32 allowed or in half precision, to measure what the faster paths the kit does not take would cost in
predictions (``precision_paths``).

The peer stage 10 is judged against (issue 35) is cuDNN at its fastest for this net: fp16 with the activations and
conv weights channels_last, the whole forward captured once in a CUDA graph (``peer_call``: each call a replay and
the class probabilities copied to the host, as the kit's graph variant's whole call is); ``time_forward`` with
``PEER`` times the same arithmetic layer by layer.
"""

from __future__ import annotations

from statistics import median

import numpy as np

from ..core.workloads import Workload
from ..launch import device
from ..measuring.report import RunReport
from ..measuring.timing import Clock
from ..model import reference


def available() -> bool:
    if device.info().simulated or device.info().kind != "gpu":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _layer_fn(layer, weights):
    import torch
    import torch.nn.functional as F

    if layer.kind == "conv":
        w = weights[f"{layer.name}.weight"]
        b = weights.get(f"{layer.name}.bias")
        return lambda x: F.conv2d(x, w, b, stride=layer.stride, padding=layer.pad)
    if layer.kind == "fc":
        w, b = weights[f"{layer.name}.weight"], weights.get(f"{layer.name}.bias")
        return lambda x: F.linear(x, w, b)
    if layer.kind == "pool":
        return lambda x: F.max_pool2d(x, layer.kernel, layer.stride)
    return {"relu": torch.relu, "tanh": torch.tanh, "flatten": lambda x: x.reshape(x.shape[0], -1),
            "softmax": lambda x: torch.softmax(x, dim=1)}[layer.kind]


PRECISIONS = ("fp32", "tf32", "fp16")
#: fp16 with the activations and conv weights in channels_last memory format: cuDNN's fastest path for these nets
PEER = "fp16-channels-last"
PEER_LABEL = "fp16, channels_last"
PEER_WHOLE_CALL = "torch CUDA graph replay, fp16 channels_last (+ probabilities copied to the host)"


def _peer_tensors(wl: Workload, dev) -> tuple[dict, object]:
    """The workload's weights and input on the device in fp16, the 4-d ones (conv weights, the images)
    channels_last."""
    import torch

    def put(a):
        t = torch.from_numpy(np.ascontiguousarray(a)).to(dev, torch.float16)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    return {k: put(v) for k, v in wl.weights.items()}, put(wl.x)


def time_forward(wl: Workload, repeat: int = 10, warmup: int = 3,
                 precision: str = "fp32") -> tuple[RunReport, np.ndarray]:
    """Per-layer median times (CUDA events) of the whole batch on the GPU, and the predictions. ``precision``:
    "fp32" (TF32 off: the bench's baseline), "tf32" (TF32 allowed in convolutions and matrix products) or "fp16"
    (inputs and weights in half precision)."""
    if precision not in (*PRECISIONS, PEER):
        raise ValueError(f"precision must be one of {', '.join((*PRECISIONS, PEER))}, not {precision!r}")
    import torch

    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    if precision == PEER:
        weights, x0 = _peer_tensors(wl, dev)
    else:
        dtype = torch.float16 if precision == "fp16" else torch.float32
        weights = {k: torch.from_numpy(v).to(dev, dtype) for k, v in wl.weights.items()}
        x0 = torch.from_numpy(wl.x).to(dev, dtype)
    fns = [(layer.name, _layer_fn(layer, weights)) for layer in wl.net.layers]
    times: dict[str, list[float]] = {name: [] for name, _ in fns}
    with torch.inference_mode():
        for i in range(warmup + repeat):
            y = x0
            for name, fn in fns:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                y = fn(y)
                end.record()
                end.synchronize()
                if i >= warmup:
                    times[name].append(start.elapsed_time(end) / 1e3)
        probs = y.float().cpu().numpy()
    times.pop("flatten", None)
    totals = [sum(times[name][i] for name in times) for i in range(repeat)]
    preds = reference.predict(probs)
    acc = None if wl.labels is None else reference.accuracy(preds, wl.labels)
    report = RunReport(net=wl.net.name, images=wl.images,
                              layer_seconds={k: median(v) for k, v in times.items()}, accuracy=acc,
                              device=device.label(), simulated=False, synthetic=wl.synthetic,
                              stage=stage_label(torch.__version__, precision),
                              method="cuda-events", runs=repeat,
                       total_range=(min(totals), max(totals)))
    return report, preds


def whole_call(wl: Workload, repeat: int = 10, warmup: int = 3,
               budget_s: float | None = None) -> tuple[list[float], np.ndarray]:
    """Seconds of each whole forward call through PyTorch (fp32, TF32 off) and the predictions: CUDA events
    (``timing.Clock``, as the kit's whole calls are timed) around every layer's launch and the copy of the class
    probabilities to the host. ``budget_s``: no further call once the timed ones add up to this (at least one)."""
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    weights = {k: torch.from_numpy(v).to(dev) for k, v in wl.weights.items()}
    fns = [_layer_fn(layer, weights) for layer in wl.net.layers]
    x = torch.from_numpy(np.ascontiguousarray(wl.x)).to(dev)
    got = {}

    def call():
        y = x
        for fn in fns:
            y = fn(y)
        got["probs"] = y.cpu().numpy()

    with torch.inference_mode():
        seconds = _timed_calls(call, warmup, repeat, budget_s)
    del x, weights
    torch.cuda.empty_cache()
    return seconds, reference.predict(got["probs"])


def _timed_calls(call, warmup: int, repeat: int, budget_s: float | None) -> list[float]:
    """Seconds of each timed ``call()`` (CUDA events, ``timing.Clock``, as the kit's whole calls are timed) after
    ``warmup`` untimed ones; none after the timed ones add up to ``budget_s`` (at least one)."""
    seconds: list[float] = []
    for i in range(warmup + repeat):
        if budget_s is not None and seconds and sum(seconds) >= budget_s:
            break
        clock = Clock("auto")
        with clock.section("whole"):
            call()
        if i >= warmup:
            seconds.append(clock.seconds()["whole"])
    return seconds


def stage_label(torch_version: str, precision: str = "fp32") -> str:
    """The bench's stage label of a cuDNN row: "cuDNN (PyTorch X)" for fp32, with the precision after it else."""
    return f"cuDNN (PyTorch {torch_version})" + ("" if precision == "fp32" else
                                                 f", {PEER_LABEL}" if precision == PEER else f", {precision}")


def peer_call(wl: Workload, repeat: int = 10, warmup: int = 3,
              budget_s: float | None = None) -> tuple[list[float], np.ndarray]:
    """Seconds of each whole call of the peer (``PEER``: fp16, channels_last, cuDNN's autotuned algorithms) and
    its predictions: the forward pass captured once in a CUDA graph (``torch.cuda.graph``, after warm-up passes on
    a side stream), each call a replay and the fp32 class probabilities copied to the host, timed as the kit's
    whole calls are (``timing.Clock``: CUDA events). ``budget_s``: no further call once the timed ones add up to
    this (at least one)."""
    import torch

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    weights, x = _peer_tensors(wl, dev)
    fns = [_layer_fn(layer, weights) for layer in wl.net.layers]

    def forward():
        y = x
        for fn in fns:
            y = fn(y)
        return y.float()

    got = {}
    with torch.no_grad():  # a graph captured under no_grad, as PyTorch's examples do
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # cuDNN picks its algorithms and the allocator its blocks before the capture
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        recorded = torch.cuda.CUDAGraph()
        with torch.cuda.graph(recorded):
            probs = forward()

        def call():
            recorded.replay()
            got["probs"] = probs.cpu().numpy()  # waits for the replay, as the kit's download does

        seconds = _timed_calls(call, warmup, repeat, budget_s)
    del recorded, probs, x, weights
    torch.cuda.empty_cache()
    return seconds, reference.predict(got["probs"])


def precision_paths(wl: Workload, reference_predictions: np.ndarray, repeat: int = 10) -> list[dict]:
    """The cuDNN pass in fp32, with TF32 and in fp16 on one workload: median total and conv seconds, and how many
    images' predictions differ from the numpy reference's (what a faster path would cost; the kit stays fp32)."""
    rows = []
    for precision in PRECISIONS:
        report, preds = time_forward(wl, repeat=repeat, precision=precision)
        conv = sum(s for name, s in report.layer_seconds.items() if wl.net.layer(name).kind == "conv")
        rows.append({"precision": precision, "net": wl.net.name, "images": wl.images, "total_s": report.total,
                     "conv_s": conv, "accuracy": report.accuracy,
                     "predictions_differing": int(np.count_nonzero(preds != reference_predictions))})
    return rows
