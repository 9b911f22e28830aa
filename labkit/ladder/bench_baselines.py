"""The ladder's baselines, timed on the workloads of the stages' rows: the numpy reference on the CPU, and cuDNN
through PyTorch where it is installed with a GPU, in fp32 and as stage 10's peer (``cudnn.PEER``). Apart from the
run of the stages' variants (``labkit.bench``), which hands them its workloads and the reference's runs on them."""

from __future__ import annotations

import numpy as np

from ..course import stages
from . import bench_whole, cudnn
from .bench_table import row_numbers

REFERENCE_STAGE = stages.REFERENCE_LABEL


def baselines(net: str, n: int, reference_of, ledger, command, repeat) -> list[dict]:
    """numpy reference on the CPU, and cuDNN through PyTorch where it is installed with a GPU."""
    rows = []
    wl, r = reference_of(net, n, "cpu")
    ref_pred = r.predictions
    ledger.record(r.report, command=command)
    rows.append({"stage": REFERENCE_STAGE, "variant": "reference", "net": net, "images": n, "target": "cpu",
                 "checks": "-", **row_numbers(r.report, wl.net), "accuracy": r.report.accuracy,
                 "predictions_equal": True, "simulated": False, "workload": wl.note})
    if cudnn.available():
        rep, preds = cudnn.time_forward(wl, repeat=max(repeat, 5))
        ledger.record(rep, command=command)
        row = {"stage": rep.stage, "variant": "cudnn", "net": net, "images": n, "target": "gpu",
               "checks": "-", **row_numbers(rep, wl.net), "accuracy": rep.accuracy,
               "predictions_equal": bool(np.array_equal(preds, ref_pred)), "simulated": False,
               "workload": wl.note}
        try:  # the whole torch forward and the copy of its output to the host, in this process, as the kit's
            seconds, _ = cudnn.whole_call(wl, repeat=max(repeat, 5))
            row.update(whole_call_s=float(np.median(seconds)), whole_call_range=(min(seconds), max(seconds)),
                       whole_call_runs=len(seconds), whole_call_how=CUDNN_WHOLE_CALL,
                       **bench_whole.floor(wl.net, n, float(np.median(seconds))))
        except Exception as exc:  # noqa: BLE001 - the per-layer row stays
            row["whole_call_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
        rows.append(_peer(wl, n, ref_pred, ledger, command, repeat))
    return rows


def _peer(wl, n: int, ref_pred, ledger, command, repeat) -> dict:
    """cuDNN as stage 10's peer (``cudnn.PEER``: fp16, channels_last), in the same process as its fp32 row: its
    layers timed one by one, its whole call a CUDA graph replay and the probabilities copied to the host; the
    predictions compared with the numpy reference's (``predictions_differing``: fp16 may move a few). The fp32
    floor's fraction only: the units' floor (``labkit.floors``) is the kit's fp32-accurate one."""
    row = {"stage": cudnn.stage_label(_torch_version(), cudnn.PEER), "variant": "cudnn_peer", "net": wl.net.name,
           "images": n, "target": "gpu", "checks": "-", "simulated": False, "workload": wl.note}
    try:
        rep, preds = cudnn.time_forward(wl, repeat=max(repeat, 5), precision=cudnn.PEER)
        ledger.record(rep, command=command)
        row.update(stage=rep.stage, **row_numbers(rep, wl.net), accuracy=rep.accuracy,
                   predictions_equal=bool(np.array_equal(preds, ref_pred)),
                   predictions_differing=int(np.count_nonzero(preds != ref_pred)))
        seconds, _ = cudnn.peer_call(wl, repeat=max(repeat, 5))
        whole = float(np.median(seconds))
        row.update(whole_call_s=whole, whole_call_range=(min(seconds), max(seconds)), whole_call_runs=len(seconds),
                   whole_call_how=cudnn.PEER_WHOLE_CALL,
                   **{k: v for k, v in bench_whole.floor(wl.net, n, whole).items() if not k.startswith("limit")})
    except Exception as exc:  # noqa: BLE001 - one line in the row; the ladder goes on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return row


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "not installed"


CUDNN_WHOLE_CALL = "torch forward (launches + output copy to host)"
