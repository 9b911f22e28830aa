"""What ``labkit lab`` does before it starts JupyterLab: find the notebooks a student works on, and say what the
machine and the data mean for them (the facts of the notebooks' first cell, ``lk.hello``), each with what to do
about it; and whether it runs as root, which JupyterLab refuses without ``--allow-root``. The command itself is
``labkit.cli``'s."""

from __future__ import annotations

from pathlib import Path

import click

from ..launch import device
from ..model import data as data_mod


def lab_folder() -> Path:
    """The notebooks a student works on: ``notebooks/`` here (the clone's root), else the kit checkout's own."""
    for folder in (Path.cwd() / "notebooks", Path(__file__).resolve().parents[2] / "notebooks"):
        if folder.is_dir() and any(folder.glob("*.ipynb")):
            return folder
    raise click.ClickException("no notebooks/ folder here: run `labkit lab` in your clone of the kit (the folder "
                               "that holds notebooks/), or name the folder with --notebooks")


def lab_check() -> None:
    """What `labkit lab` says before JupyterLab starts: what the machine is and whether the data is there, each
    with what to do about it (the same facts as the notebooks' first cell, ``lk.hello``)."""
    d = device.info()
    if d.kind == "gpu":
        click.echo(f"Machine: {d.name}: the notebooks run their kernels on this GPU, timings are real.")
    elif d.kind == "simulator":
        click.echo("Machine: no GPU, so the notebooks run GPU kernels on numba's CUDA simulator: results are checked "
                   "on shrunk problems, timings are not meaningful, plots show the kit's committed GPU results.")
    else:
        click.echo("Machine: no GPU and no CUDA simulator: only the CPU stages run (set NUMBA_ENABLE_CUDASIM=1 "
                   "before `labkit lab` to run GPU kernels on the simulator).")
    if d.driver is not None:  # a driver, but no working GPU stack, or one to confirm: device's own advice
        for note in d.notes:
            if "extra" in note or "driver" in note:
                click.echo(f"  {note}")
    missing = []
    for name, ds in data_mod.DATASETS.items():
        try:
            click.echo(f"Data: {name} in {data_mod.shown(data_mod.find(name))}")
        except data_mod.DataNotFound:
            missing.append(name)
            click.echo(f"Data: {name} is missing: run `{ds.fetch_hint}` (needs internet), or set LABKIT_DATA to a "
                       f"folder that holds {ds.folder}/ before `labkit lab`")
    if missing:
        click.echo("Until then the notebooks run on synthetic inputs (accuracy n/a); `labkit data where` says where "
                   "labkit looks.")


def is_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0
