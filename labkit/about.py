"""What labkit is, for every module of it: its one version (pyproject.toml reads it here) and the old names of the
modules that moved into subpackages (``MOVED``; ``labkit/__init__.py`` makes ``labkit.gpu`` and the rest resolve
to them). The bottom of the package's layers: it imports nothing of labkit, so any module may import it.
"""

from __future__ import annotations

__version__ = "0.2.0"

#: every module that moved into a subpackage, by its old name: ``labkit.<old>`` is ``labkit.<new>``
MOVED = {
    # the model: specs, layers, the reference, data, weights
    "nets": "model.nets", "layers": "model.layers", "reference": "model.reference", "data": "model.data",
    "weights_io": "model.weights_io",
    # the launch layer
    "device": "launch.device", "runtime": "launch.runtime", "gpu": "launch.gpu", "streams": "launch.streams",
    "stream_order": "launch.stream_order", "simulator": "launch.simulator", "simcheck": "launch.simcheck",
    "freed": "launch.freed", "cudacpu": "launch.cudacpu",
    # measuring one run
    "timing": "measuring.timing", "report": "measuring.report", "ledger": "measuring.ledger",
    "profile": "measuring.profile",
    # the course
    "stages": "course.stages", "tasks": "course.tasks", "nbcells": "course.nbcells", "given": "course.given",
    "release": "course.release", "leave_out": "course.leave_out", "answer_shapes": "course.answer_shapes",
    # the kit's own kernels
    "kernels": "ops.kernels", "gemm": "ops.gemm", "gemm_cuda": "ops.gemm_cuda",
    "fc_tensor_cores": "ops.fc_tensor_cores", "mma_source": "ops.mma_source", "winograd": "ops.winograd",
    "tensor_cores": "ops.tensor_cores", "conv_banks": "ops.conv_banks", "const_kernels": "ops.const_kernels",
    # the engine and what runs on it
    "engine": "core.engine", "check": "core.check", "workloads": "core.workloads", "whole": "core.whole",
    "upload": "core.upload", "graphs": "core.graphs", "counts": "core.counts",
    "job_graphs": "core.job_graphs",
    # the ladder and the committed results
    "bench": "ladder.bench", "bench_whole": "ladder.bench_whole", "benchdoc": "ladder.benchdoc",
    "ceilings": "ladder.ceilings", "cudnn": "ladder.cudnn", "measured": "ladder.measured", "plots": "ladder.plots",
    "unfinished": "ladder.unfinished", "tune": "ladder.tune", "floors": "ladder.floors",
    # the notebooks' helpers
    "notebook": "lessons.notebook", "show": "lessons.show", "draw": "lessons.draw", "access": "lessons.access",
    "tile_steps": "lessons.tile_steps", "precision": "lessons.precision",
}


PACKAGE = __name__.rpartition(".")[0]  # "labkit"


def new_name(fullname: str) -> str | None:
    """``labkit.gpu`` -> ``labkit.launch.gpu``, ``labkit.cudacpu.compiler`` -> ``labkit.launch.cudacpu.compiler``;
    None for a name that did not move."""
    head, _, rest = fullname.partition(".")
    if head != PACKAGE or not rest:
        return None
    first, _, tail = rest.partition(".")
    if first not in MOVED:
        return None
    return f"{PACKAGE}.{MOVED[first]}" + (f".{tail}" if tail else "")


_OLD = {f"{PACKAGE}.{new}": f"{PACKAGE}.{old}" for old, new in MOVED.items()}


def old_name(module: str) -> str:
    """``labkit.core.counts`` -> ``labkit.counts``: a moved module (or a name inside it) as notebooks and submissions
    know it; the grader's messages name what a student patched or called this way."""
    for new, old in _OLD.items():
        if module == new or module.startswith(new + "."):
            return old + module[len(new):]
    return module
