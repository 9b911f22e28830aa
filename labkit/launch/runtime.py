"""Process-wide settings labkit applies once, at import, so no notebook has to.

- numba's OpenMP threads otherwise spin-wait between parallel regions, which starves every other process on a
  shared laptop or CI core (a ``prange`` stage then looks many times slower than it is): they sleep instead.
  This must be set before numba starts its thread pool, so it is set when labkit is imported.
- numba's low-occupancy warnings fire on every small launch (one image, a tiny simulated grid) and bury the
  self-check lines; occupancy is taught with measurements instead. Its note that ``parallel=True`` found nothing
  to parallelize is shown once per function (stage 02 asks the student to read it), not on every call.
- On a machine with no CUDA driver at all (a laptop), the CUDA simulator is switched on before numba is imported,
  so GPU kernels run (shrunk, labelled as simulated) instead of failing; ``NUMBA_ENABLE_CUDASIM=0`` set by hand
  keeps it off. Under the simulator its block manager sleeps between polls instead of spinning
  (``labkit.simulator.be_polite``).
"""

from __future__ import annotations

import os
import warnings

from . import simulator
from .device import simulator_requested, use_simulator_if_no_gpu

_applied = False


def apply() -> None:
    """Apply the settings (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True

    if os.environ.get("NUMBA_ENABLE_CUDASIM", "").strip() != "0":
        use_simulator_if_no_gpu()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    from numba.core.errors import NumbaPerformanceWarning

    warnings.simplefilter("ignore", NumbaPerformanceWarning)
    warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU under-utilization")
    warnings.filterwarnings("once", message=r"(?s).*parallel=True")

    if simulator_requested():
        simulator.be_polite()
