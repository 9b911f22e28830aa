"""Workloads: which network, weights and images a run uses, chosen for the machine at hand.

On a GPU (or for CPU code) a workload is the real network with the kit's trained weights and real images. GPU
kernels under the CUDA simulator get the simulator's shrunk network (``labkit.simulator``), random weights and a
couple of synthetic images, because every simulated thread runs as Python. Every choice is stated in ``note`` and
printed, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..launch import simulator
from ..model import data
from ..model.nets import Net, get_net
from ..model.weights_io import load_weights, random_weights


@dataclass
class Workload:
    net: Net
    weights: dict[str, np.ndarray]
    x: np.ndarray  # network-ready float32 inputs (N, C, H, W)
    labels: np.ndarray | None  # None for synthetic inputs
    simulated: bool  # GPU kernels run on the CUDA simulator
    synthetic: bool
    note: str

    @property
    def images(self) -> int:
        return len(self.x)

    def first(self, n: int) -> Workload:
        """The same workload on its first ``n`` images."""
        labels = None if self.labels is None else self.labels[:n]
        return Workload(self.net, self.weights, self.x[:n], labels, self.simulated, self.synthetic,
                        f"{self.note} (first {min(n, self.images)})")

    def __str__(self) -> str:
        return self.note


def workload(net: str | Net, images: int | None = None, *, target: str = "gpu", weights=None,
             split: str | None = None, allow_synthetic: bool = True, tile: bool = False,
             quiet: bool = False) -> Workload:
    """Pick what to run. ``target`` is "gpu" for numba.cuda kernels and "cpu" for CPU code (numba, numpy).

    ``weights``: None for the kit's shipped weights, a path (.npz or the C study's folder), or a dict.
    ``tile``: when fewer images exist than asked for (a partial copy of the data), repeat the ones there are,
    and say so: timing needs the count, accuracy is then over repeated images.
    """
    net = get_net(net)
    images = images or net.default_images
    data.check_fits(net, images)
    if target not in ("gpu", "cpu"):
        raise ValueError(f"target must be 'gpu' or 'cpu', not {target!r}")
    n = simulator.images(images, target)
    if simulator.shrinks(target):
        small = simulator.net(net)
        x = np.random.default_rng(0).uniform(-0.5, 0.5, (n, *small.input_shape)).astype(np.float32)
        note = (f"simulated: {small.name} (input {'x'.join(map(str, small.input_shape))}, random weights), {n} "
                f"synthetic images instead of {images} (the CUDA simulator runs every thread in Python)")
        return _announce(Workload(small, random_weights(small, seed=0), x, None, True, True, note), quiet)
    w = weights if isinstance(weights, dict) else load_weights(net, weights)
    try:
        try:
            x, stored = data.load_inputs(net, n, split)
            note = f"{net.name}: {n} {net.dataset} {stored.split} images from {stored.source}"
        except data.DataError as short:
            if not tile or isinstance(short, data.DataNotFound):
                raise
            x, stored = data.load_inputs(net, None, split)
            have = len(x)
            reps = -(-n // have)
            x = np.concatenate([x] * reps)[:n]
            stored.labels = np.concatenate([stored.labels] * reps)[:n]
            note = (f"{net.name}: {n} inputs = the {have} {net.dataset} {stored.split} images found in "
                    f"{stored.source}, repeated (only {have} are here)")
        labels, synthetic = stored.labels, False
    except data.DataNotFound as exc:
        if not allow_synthetic:
            raise
        x, labels, synthetic = data.to_input(net, data.synthetic(net, n)), None, True
        note = f"{net.name}: {n} SYNTHETIC images (no data: {exc})"
    if n != images:
        note += f" (LABKIT_QUICK: {n} instead of {images})"
    return _announce(Workload(net, w, x, labels, False, synthetic, note), quiet)


def _announce(wl: Workload, quiet: bool) -> Workload:
    if not quiet:
        print(f"Workload: {wl.note}")
    return wl
