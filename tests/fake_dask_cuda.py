"""A stand-in for dask-cuda where there is no GPU (CI): ``LocalCUDACluster`` takes dask-cuda's arguments and starts
what it starts, one Dask worker process per GPU named in ``CUDA_VISIBLE_DEVICES``, ``threads_per_worker`` threads
each, every worker with ``CUDA_VISIBLE_DEVICES`` rotated so that its own GPU comes first (dask-cuda's
``cuda_visible_devices``), but none of its GPU set-up (no NVML, no CUDA context, no CPU affinity).

``install(monkeypatch)`` puts it in ``sys.modules["dask_cuda"]``; ``made`` keeps the arguments of every cluster made.
"""

from __future__ import annotations

import copy
import sys
import types

from distributed import LocalCluster

made: list[dict] = []


class LocalCUDACluster(LocalCluster):
    def __init__(self, CUDA_VISIBLE_DEVICES=None, n_workers=None, threads_per_worker=1, **kwargs):
        self.devices = [str(d) for d in CUDA_VISIBLE_DEVICES]
        n_workers = len(self.devices) if n_workers is None else n_workers
        made.append({"CUDA_VISIBLE_DEVICES": list(CUDA_VISIBLE_DEVICES), "n_workers": n_workers,
                     "threads_per_worker": threads_per_worker, **kwargs})
        super().__init__(n_workers=0, threads_per_worker=threads_per_worker, processes=True, **kwargs)
        self.scale(n_workers)
        self.sync(self._correct_state)

    def new_worker_spec(self):
        name = min(set(self.devices) - set(self.worker_spec))
        i = self.devices.index(name)
        spec = copy.deepcopy(self.new_spec)
        spec["options"]["env"] = {"CUDA_VISIBLE_DEVICES": ",".join(self.devices[i:] + self.devices[:i])}
        return {name: spec}


def install(monkeypatch) -> list[dict]:
    module = types.ModuleType("dask_cuda")
    module.LocalCUDACluster = LocalCUDACluster
    monkeypatch.setitem(sys.modules, "dask_cuda", module)
    made.clear()
    return made
