"""A stage's reference job once for a whole cluster run, not once per worker (docs/grading.md, "Several GPUs").

Where a partner times the reference in every student's turn on the student's own GPU (``partner.paired``) and the
limit is the rubric's (``limits.time_factor = 0``), a stage's reference job settles only what does not depend on the
GPU it ran on: that the solution passes its own grading, and how many of its timed predictions may differ from the
float64 ones. Each dask-cuda worker used to run its own seven: on two H100s 14 reference jobs took about 500 s of
the slots' time, a quarter of the class's (results/h100x2-2026-11-28b). Here the first worker that needs a stage's
reference measures it and the others read its result, through a Dask ``Lock`` and the metadata held by the
scheduler (so it also holds across the hosts of a Slurm cluster). The key names the run and the device's model: GPUs
of another kind measure their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable

from .job import ReferenceTiming


def _plain(timing: ReferenceTiming) -> dict:
    """The timing as msgpack-encodable values (what the scheduler's metadata holds)."""
    return json.loads(json.dumps(dataclasses.asdict(timing), default=float))


def run_key(run: str) -> list[str]:
    """Where one run's entries are in the scheduler's metadata: the parent empties it when the run ends, so a
    long-lived scheduler keeps no run's."""
    return ["labkit", run]


class SharedReferences:
    """The reference jobs of one cluster run, shared by its workers: ``get`` gives (timing, who measured it)."""

    def __init__(self, run: str, label: str, client=None):
        self.run, self.label, self._client = run, label, client

    @property
    def client(self):
        from distributed import get_client

        return self._client or get_client()

    def _key(self, stage: str, device_name: str) -> list[str]:
        model = hashlib.sha256(device_name.encode()).hexdigest()[:12]
        return [*run_key(self.run), "reference", stage, model]

    def _read(self, key: list[str]) -> tuple[ReferenceTiming, str] | None:
        value = self.client.get_metadata(key, default=None)
        return (ReferenceTiming(**value["timing"]), value["by"]) if value else None

    def get(self, stage: str, device_name: str, measure: Callable[[], ReferenceTiming]) -> tuple[ReferenceTiming, str]:
        """The stage's reference on this device model: read when a worker measured it already (or once the one
        measuring it now has), else measured here (``measure()``) and kept for the others."""
        from distributed import Lock

        key = self._key(stage, device_name)
        found = self._read(key)
        if found is not None:
            return found
        with Lock("-".join(key)):
            found = self._read(key)  # measured while this worker waited for the lock
            if found is not None:
                return found
            timing = measure()
            self.client.set_metadata(key, {"timing": _plain(timing), "by": self.label})
            return timing, self.label
