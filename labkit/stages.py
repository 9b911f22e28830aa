"""The stages of the course and the variants each stage's notebook defines.

A stage notebook's ``kernel``-tagged cells end by defining ``VARIANTS``: a dict of name -> ``Variant``
(which student function computes which layer, CPU or GPU code, where the data lives). The bench and the
grader load only those cells (``labkit.nbcells``) and use ``VARIANTS``, so every stage is checked and timed
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import nbcells
from .check import CheckResult, check_layer, impl_for
from .nets import Net, get_net

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"


@dataclass(frozen=True)
class Stage:
    number: str
    notebook: str
    title: str


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
    )
}


@dataclass(frozen=True)
class Variant:
    """One way a stage computes the network.

    ``impls`` maps a layer name ("conv1") or kind ("conv") to a function with the calling convention of
    ``labkit.check``; layers without one run on the numpy reference (host arrays only).
    """

    impls: dict[str, Callable] = field(default_factory=dict)
    target: str = "gpu"  # "gpu": numba.cuda / cupy code; "cpu": CPU code
    arrays: str = "host"  # "device": activations stay on the GPU between layers
    per_image: bool = False  # launch every layer once per image, as the original C study did
    nets: tuple[str, ...] = ("cifar10",)
    note: str = ""

    def __post_init__(self):
        if self.target not in ("gpu", "cpu") or self.arrays not in ("host", "device"):
            raise ValueError(f"Variant: target must be gpu|cpu and arrays host|device, got {self.target}, "
                             f"{self.arrays}")
        bad = [k for k, fn in self.impls.items() if not callable(fn)]
        if bad:
            raise TypeError(f"Variant: the functions for {', '.join(bad)} are not callable")


def stage_of(path: str | Path) -> Stage | None:
    name = Path(path).name
    return next((s for s in STAGES.values() if s.notebook == name), None)


def load_variants(path: str | Path) -> dict[str, Variant]:
    """Execute a notebook's kernel cells and return its ``VARIANTS``."""
    ns = nbcells.load(path)
    variants = ns.get("VARIANTS")
    if not isinstance(variants, dict) or not variants:
        raise nbcells.NotebookError(f"{Path(path).name}: the kernel cells define no VARIANTS dict "
                                    f"(name -> labkit.Variant); the last kernel cell of each stage defines it")
    for name, v in variants.items():
        if not isinstance(v, Variant):
            raise nbcells.NotebookError(f"{Path(path).name}: VARIANTS[{name!r}] is a {type(v).__name__}, "
                                        f"not a labkit.Variant")
    return variants


def check_variant(variant: Variant, net: str | Net, quiet: bool = False,
                  batches: tuple[int, ...] | None = None) -> list[CheckResult]:
    """Check every function of a variant on the layers it computes (fresh inputs, several batch sizes;
    ``batches`` overrides the sizes ``check_layer`` picks)."""
    net = get_net(net)
    results = []
    for layer in net.layers:
        fn = impl_for(variant.impls, layer)
        if fn is None or layer.kind == "flatten":
            continue
        results.append(check_layer(fn, net, layer.name, target=variant.target, arrays=variant.arrays,
                                   quiet=quiet, batches=batches))
    return results
