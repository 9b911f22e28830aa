"""The stages of the course, the variants each stage's notebook defines, and the one rule for their labels.

A stage notebook's ``kernel``-tagged cells end with ``VARIANTS = lk.variants("04", {...})``: which function computes
which layer, CPU or GPU code, where the data lives. The bench and the grader load only those cells
(``labkit.nbcells``) and use ``VARIANTS``, so every stage is checked and timed the same way. A run's label is
``label(stage, variant)`` ("04 batched_padded") everywhere: ledger, ladder, bench, grader.

Code a student wrote in an earlier stage comes to later stages as given code: ``from_stage("02")`` loads the kernel
cells of the kit's own solution of stage 02, so a bug left in a student's stage 02 cannot break their stage 04, and
nobody writes the same kernel twice.

The kit's solution of a stage is ``solutions/NN_topic.py``, the percent-format source of the notebook
``NN_topic.ipynb`` beside it (``labkit.nbcells``): ``solution`` says which file the kit runs.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..launch.device import unavailable  # noqa: F401 - lk.stages.unavailable, as before
from ..launch.gpu import STUB_MARK  # noqa: F401 - the stub line, as before
from ..model.nets import get_net
from . import given, nbcells

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Stage:
    number: str
    notebook: str
    title: str

    @property
    def source(self) -> str:
        """The notebook's source in solutions/: ``NN_topic.py`` (jupytext's percent format)."""
        return nbcells.source_of(self.notebook).name


STAGES = {
    s.number: s
    for s in (
        Stage("00", "00_setup.ipynb", "setup: device, data, reference run"),
        Stage("01", "01_serial_baseline.ipynb", "serial baseline (numba, CPU)"),
        Stage("02", "02_kernels_vs_parallel.ipynb", "compiler-found vs explicit parallelism"),
        Stage("03", "03_managed_memory.ipynb", "managed (unified) memory"),
        Stage("04", "04_data_transfer_padding.ipynb", "data transfer, padding, batching"),
        Stage("05", "05_shared_memory.ipynb", "shared-memory tiled convolution"),
        Stage("06", "06_constant_memory.ipynb", "constant-memory weights"),
        Stage("07", "07_unroll_matmul.ipynb", "unroll (im2col) + tiled matmul"),
        Stage("08", "08_fusion.ipynb", "fused unroll + matmul, fused epilogues"),
        Stage("09", "09_per_layer_tuning.ipynb", "per-layer kernels and tuning"),
        Stage("10", "10_whole_job.ipynb", "the whole job: split-K fc, CUDA graphs, streams"),
    )
}

REFERENCE_LABEL = "numpy reference"


def label(stage: str | None, variant: str) -> str:
    """The label of a run everywhere (ledger, ladder, bench, grader): stage number, space, variant name."""
    return f"{stage} {variant}" if stage else variant


def order_key(run_label: str | None) -> tuple:
    """Course order of run labels: stages by number (a stage's variants in the order they were run), then the
    baselines (numpy reference, cuDNN, ...). Use with a stable sort."""
    head = (run_label or "").split(" ", 1)[0]
    return (0, int(head)) if head.isdigit() else (1, 0)


def speedup_baseline(labels) -> str:
    """The run every speedup is measured against: the numpy reference when it is there, else the first run in
    course order."""
    labels = list(labels)
    if REFERENCE_LABEL in labels:
        return REFERENCE_LABEL
    return sorted(labels, key=order_key)[0]


def solutions_folder() -> Path:
    """Where the kit's solution notebooks are: ``$LABKIT_SOLUTIONS`` (the grader's private copy), else the repo's."""
    return Path(os.environ.get("LABKIT_SOLUTIONS") or REPO / "solutions")


def solution(number: str, folder: str | Path | None = None) -> Path:
    """The file of the kit's solution of stage ``number`` whose code the kit runs: its source ``NN_topic.py`` in
    ``folder`` (default ``solutions_folder()``), else, in a folder of notebooks only, the notebook ``NN_topic.ipynb``.
    ``nbcells.load`` runs either, each cell under the notebook's name."""
    folder = Path(folder) if folder is not None else solutions_folder()
    source = folder / STAGES[number].source
    return source if source.is_file() else folder / STAGES[number].notebook


@dataclass(frozen=True)
class Variant:
    """One way a stage computes the network.

    ``impls`` maps a layer name ("conv1") or kind ("conv") to a function with the calling convention of
    ``labkit.layers``; layers without one run on the numpy reference (host arrays only). ``target``: "gpu" for
    numba.cuda or cupy code, "cpu" for CPU code. ``arrays``: "host" hands the functions numpy arrays (they copy
    for themselves), "device" keeps every activation on the GPU. ``per_image`` launches every layer once per image,
    as the original C study did. ``name`` and ``stage`` are set by ``variants()``.

    ``graph``: a whole call replays a CUDA graph of the forward pass (``labkit.graphs``; the bench's whole-call
    time). ``pipeline``: the stage's whole job, host bytes to host classes, ``pipeline(job, raw_pinned,
    classes_pinned, chunk, streams)`` with ``job`` a ``labkit.whole.Job`` (the bench's end-to-end rows). Both only
    for arrays='device' variants launched on the whole batch.
    """

    impls: dict[str, Callable] = field(default_factory=dict)
    target: str = "gpu"
    arrays: str = "host"
    per_image: bool = False
    nets: tuple[str, ...] = ("cifar10", "fashion")
    note: str = ""
    name: str = ""
    stage: str = ""
    # "cuda_c": CUDA C (lk.gpu.raw_module): through cupy on a GPU, else on the CPU emulation (labkit.cudacpu);
    # "cupy": cupy's own routines (cuBLAS), which need a real GPU
    requires: tuple[str, ...] = ()
    fuse: tuple[str, ...] = ()  # kinds a conv function absorbs when they follow it: "relu", "tanh", "pool"
    graph: bool = False
    pipeline: Callable | None = None

    def __post_init__(self):
        if self.target not in ("gpu", "cpu") or self.arrays not in ("host", "device"):
            raise ValueError(f"Variant: target must be gpu|cpu and arrays host|device, got {self.target}, "
                             f"{self.arrays}")
        bad = [k for k, fn in self.impls.items() if not callable(fn)]
        if bad:
            raise TypeError(f"Variant: the functions for {', '.join(bad)} are not callable")
        if self.pipeline is not None and not callable(self.pipeline):
            raise TypeError(f"Variant: pipeline is a {type(self.pipeline).__name__}, not a function")
        wants = [k for k, on in (("graph=True", self.graph), ("pipeline", self.pipeline is not None)) if on]
        if wants and (self.arrays != "device" or self.per_image or self.target != "gpu"):
            raise ValueError(f"Variant: {' and '.join(wants)}: only for target='gpu', arrays='device', "
                             f"per_image=False (the forward pass stays on the device, on the whole batch)")

    @property
    def label(self) -> str:
        return label(self.stage, self.name or "variant")

    def unavailable(self) -> str:
        """Why this variant cannot run here ("" when it can)."""
        return unavailable(self.requires)

    def runs_on(self, net: str) -> bool:
        """Whether this variant runs ``net``: one of its own nets, or a net with one of their layer stacks
        (``Net.kernels_of``: ece408 runs every stage's fashion kernels)."""
        return net in self.nets or get_net(net).kernels_of in self.nets


def variants(stage: str, named: dict[str, Variant]) -> dict[str, Variant]:
    """A stage's VARIANTS: each Variant stamped with its stage number and its name (the dict key)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    out = {}
    for name, v in named.items():
        if not isinstance(v, Variant):
            raise TypeError(f"VARIANTS[{name!r}] is a {type(v).__name__}, not a labkit.Variant")
        out[name] = replace(v, name=name, stage=stage)
    return out


def stage_of(path: str | Path) -> Stage | None:
    """The stage of a notebook or of a solution's source, by file name."""
    name = Path(path).name
    return next((s for s in STAGES.values() if name in (s.notebook, s.source)), None)


def load_variants(path: str | Path) -> dict[str, Variant]:
    """Execute a notebook's kernel cells (or a solution source's, ``.py``) and return its ``VARIANTS``."""
    ns = nbcells.load(path)
    found = ns.get("VARIANTS")
    if not isinstance(found, dict) or not found:
        raise nbcells.NotebookError(f"{Path(path).name}: the kernel cells define no VARIANTS dict (name -> "
                                    f"labkit.Variant); the last kernel cell of each stage defines it")
    for name, v in found.items():
        if not isinstance(v, Variant):
            raise nbcells.NotebookError(f"{Path(path).name}: VARIANTS[{name!r}] is a {type(v).__name__}, "
                                        f"not a labkit.Variant")
    return found


_given: dict = {}


def _released() -> bool:
    """Whether given code comes from a release's ``labkit/given/`` (a student repository, no ``$LABKIT_SOLUTIONS``)."""
    return not os.environ.get("LABKIT_SOLUTIONS") and given.manifest() is not None


def given_source(number: str) -> Path:
    """Where stage ``number``'s given code comes from, the one rule: ``$LABKIT_SOLUTIONS`` when set (the grader's
    private copy); else, in a student repository built by ``labkit release`` (``labkit/given/manifest.json``), the
    released file, or ``given.NotReleased`` for a stage whose deadline has not passed; else the repo's solutions/.
    In a solutions folder, the solution's source (``solution``: NN_topic.py, else the notebook)."""
    if _released():
        return given.path_of(number)
    return solution(number)


def from_stage(number: str) -> types.SimpleNamespace:
    """The kernel cells of the kit's solution of stage ``number``, as a namespace: given code for later stages
    (``s02 = lk.from_stage("02"); s02.conv_thread_per_output``). Loaded once per process; ``given_source`` says
    from where."""
    if number not in STAGES:
        raise ValueError(f"unknown stage {number!r}; stages are {', '.join(STAGES)}")
    path = given_source(number)
    key = (str(path), path.stat().st_mtime if path.exists() else None)
    if key not in _given:
        if not path.exists():
            raise nbcells.NotebookError(f"the kit's solution of stage {number} is missing ({path}): later stages "
                                        f"take their given code from it")
        ns = given.load(path, STAGES[number].notebook) if _released() else nbcells.load(path)
        _given[key] = types.SimpleNamespace(**{k: v for k, v in ns.items() if not k.startswith("__")})
    return _given[key]


def pending(name: str):
    """A stand-in layer function for one whose TODO is not done yet: it says so when a check calls it."""

    def not_yet(*args):
        raise NotImplementedError(f"{name}() is still the TODO stub")

    not_yet.__name__ = f"pending_{name}"
    return not_yet


def given_stage(namespace) -> str | None:
    """The stage whose solution ``namespace`` is (a ``from_stage`` result), else None."""
    for (path, _), ns in _given.items():
        if ns is namespace:
            return Path(path).name[:2]
    return None
