"""The ``labkit`` command: info, data, run (the main job), and the course tools built on them."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import outputs
from .about import __version__, old_name
from .core import engine
from .core.workloads import Workload
from .course.stages import solutions_folder
from .launch import device
from .launch.device import describe
from .lessons.lab import is_root, lab_folder
from .measuring.ledger import Ledger, LedgerError, repo_root
from .measuring.report import format_report, format_throughput
from .model import data as data_mod
from .model import weights_io
from .model.nets import NETS, get_net
from .model.weights_io import COURSE_WEIGHTS, NOT_SHIPPED, course_weights


class _Group(click.Group):
    """In a student release, a command whose module the release leaves out (``labkit bench``, ``labkit grade``:
    docs/releases.md) says so in one line, not with a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ImportError as exc:  # ModuleNotFoundError ("labkit.bench"), or "cannot import name 'bench'"
            name = exc.name or ""
            if not isinstance(exc, ModuleNotFoundError) and "cannot import name '" in str(exc):
                name += "." + str(exc).split("cannot import name '")[1].split("'")[0]
            if not name.startswith("labkit."):
                raise
            name = old_name(name)  # labkit.ladder.bench: labkit.bench, as the student's notebooks name it
            raise click.ClickException(f"{name} is not in this copy of the kit: a student release leaves out the "
                                       f"maintainers' tools (docs/releases.md)") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="labkit")  # the one version (pyproject.toml reads it)
def main():
    """CNN-on-GPU course lab kit."""


@main.command()
def info():
    """What hardware and software this machine has, and what that means for the course."""

    click.echo(describe())
    click.echo("")
    if data_mod.env_problem():  # the data lines below would only say "not found"
        click.echo(f"data: {data_mod.env_problem()}")
    for name, ds in data_mod.DATASETS.items():
        try:
            click.echo(f"data {name}: {data_mod.find(name)}")
        except data_mod.DataNotFound:
            click.echo(f"data {name}: not found (run `{ds.fetch_hint}`)")
    for net in COURSE_WEIGHTS:  # the models the kit does not ship: found, or where to get them
        found = course_weights(net)
        click.echo(f"model {net}: {found}" if found else f"model {net}: not found; {NOT_SHIPPED[net]}")


@main.group()
def data():
    """Find and download the datasets."""


@data.command("fetch")
@click.argument("names", nargs=-1, type=click.Choice([*data_mod.DATASETS, "all"]))
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to download into (default: $LABKIT_DATA, else data/ in the repo, else the user cache).")
def data_fetch(names, root):
    """Download datasets with their published md5 sums checked (default: all)."""
    names = [n for n in data_mod.DATASETS] if not names or "all" in names else list(names)
    failed = False
    for name in names:
        try:
            folder = data_mod.fetch(name, root=root)
            click.echo(f"{name}: ready in {folder}")
        except data_mod.DataError as exc:
            click.echo(f"{name}: {exc}", err=True)
            failed = True
    sys.exit(1 if failed else 0)


@data.command("where")
def data_where():
    """Where datasets are looked for, in order, and what is found there."""
    if data_mod.data_env() is None:
        click.echo(f"{'$LABKIT_DATA':<18} (unset: set it to a folder holding the data sets to look there first)")
    for label, root in data_mod.search_roots():
        found = [n for n, ds in data_mod.DATASETS.items() if (root / ds.folder).is_dir()]
        state = ("has " + ", ".join(found)) if found else "(nothing)" if root.is_dir() \
            else f"({data_mod.root_state(root)})"
        click.echo(f"{label:<18} {root}  {state}")


def _inputs_or_synthetic(net, images: int, download: bool, synthetic: bool):
    """Real images if present (downloading them when allowed), else synthetic ones, said in one line."""
    if synthetic:
        return data_mod.to_input(net, data_mod.synthetic(net, images)), None, "synthetic inputs (--synthetic)"
    try:
        x, stored = data_mod.load_inputs(net, images)
        return x, stored.labels, f"{stored.split} images from {stored.source}"
    except data_mod.DataNotFound as exc:
        if download:
            click.echo(f"{net.dataset} not found locally; downloading it (use --no-download to skip).")
            try:
                data_mod.fetch(net.dataset)
                x, stored = data_mod.load_inputs(net, images)
                return x, stored.labels, f"{stored.split} images from {stored.source}"
            except data_mod.DataError as dl:
                click.echo(f"Download failed: {dl}")
        click.echo(f"No {net.dataset} data, so running on SYNTHETIC inputs (accuracy n/a). {exc}")
        return data_mod.to_input(net, data_mod.synthetic(net, images)), None, "SYNTHETIC inputs (no data)"


@main.command()
@click.option("--net", "net_name", type=click.Choice(list(NETS)), default="cifar10", show_default=True)
@click.option("--images", type=click.IntRange(min=1), default=None,
              help="Images to run (default: 1200 for cifar10, 10000 for fashion and ece408).")
@click.option("--weights", type=click.Path(exists=True, path_type=Path), default=None,
              help="An .npz file, a folder of the C study's layerN_*.txt files, or the ECE408 project's MXNet "
                   ".params file for --net ece408 (default: the kit's own; for ece408, of which none is shipped, "
                   "ece408-model/ece408-sp19-0002.params under $LABKIT_DATA or the other data folders).")
@click.option("--download/--no-download", default=True, show_default=True,
              help="Download the dataset if it is not found locally.")
@click.option("--synthetic", is_flag=True, help="Run on synthetic inputs even if data is present.")
@click.option("--record", "ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append the per-layer times to this results ledger (JSON lines).")
def run(net_name, images, weights, download, synthetic, ledger):
    """The main job: the reference forward pass with the report in the network's original format."""
    net = get_net(net_name)
    images = images or net.default_images
    try:
        if ledger:  # checked before the run: a report is never followed by a traceback
            outputs.writable_file(ledger, "--record")
            Ledger(ledger).check(device.label())
    except (outputs.OutputError, LedgerError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        data_mod.check_fits(net, images)
        w = weights_io.load_weights(net, weights)
        x, labels, source = _inputs_or_synthetic(net, images, download, synthetic)
    except (ValueError, FileNotFoundError, data_mod.DataError) as exc:
        raise click.ClickException(str(exc)) from None
    course = weights_io.course_weights(net.name) if weights is None else None
    wsrc = weights or (data_mod.shown(course) if course else "the kit's own (labkit/weights/)")
    click.echo(f"{net.name}: {len(x)} {source}; weights {wsrc}")
    wl = Workload(net, w, x, labels, simulated=False, synthetic=labels is None, note=source)
    result = engine.run(wl, warmup=False, quiet=True)
    click.echo(format_report(result.report))
    click.echo("")
    click.echo(format_throughput(result.report))
    if ledger:
        command, recorded = " ".join(["labkit", *sys.argv[1:]]), []
        outputs.write_or_fallback(ledger.parent, lambda folder: recorded.append(Ledger(
            folder / ledger.name).record(result.report, command=command)), "ledger lines")
        click.echo(f"recorded {len(recorded[-1])} lines in {recorded[-1].path}")


def _csv_list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@main.command()
@click.option("--stages", default=None, help="Stage numbers, comma-separated (default: every stage with VARIANTS).")
@click.option("--nets", default=None, help="Networks, comma-separated (default: each variant's own; ece408 runs every "
              "stage's fashion kernels, with the course's weights found as ece408-model/ece408-sp19-0002.params under "
              "$LABKIT_DATA or the other data folders).")
@click.option("--images", default=None, help="Image counts, comma-separated (e.g. 1200,50000; default: each net's own "
              "workloads: 1200,50000 for cifar10 and 100,1000,10000 for fashion and ece408).")
@click.option("--notebooks", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Folder of stage notebooks (default: solutions/, whose notebooks run from their sources, "
                   "NN_topic.py).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for ledger.jsonl, bench.csv, bench.json, summary.md and plots (default: results/scratch); "
                   "one that holds results is refused unless --force or --append.")
@click.option("--force", is_flag=True, help="Replace the results already in --out (its ledger, tables and plots).")
@click.option("--append", is_flag=True, help="Add this run's rows to the results already in --out (the same device's "
              "only; rows measured again are replaced).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs per variant after the warm-up; per-layer medians are reported.")
@click.option("--budget", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds of timed runs per row: no further run starts once a row's runs add up to this (at least "
                   "one runs; the table's runs column says how many did).")
@click.option("--per-image-max", type=click.IntRange(min=1), default=1200, show_default=True,
              help="Largest image count for per-image variants (a stage left with no row on a net, as stage 01, "
                   "keeps its first variant's at the net's smallest size).")
@click.option("--cpu-max", type=click.IntRange(min=1), default=1200, show_default=True,
              help="Largest image count for CPU variants.")
@click.option("--slow-max-gflop", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="CPU and per-image variants run only on workloads of at most this much forward work (GFLOP, from "
                   "the spec; a skipped row says its own).")
@click.option("--skip", default=None, help="Variant names to leave out, comma-separated (shell patterns, e.g. "
              "'cpu_prange_reduction' or '02 cpu_*'); they are listed as skipped.")
@click.option("--no-baselines", is_flag=True, help="Skip the numpy reference and cuDNN rows.")
@click.option("--random-weights", is_flag=True, help="A net whose weights the kit does not ship and cannot find "
              "(ece408) runs on seeded random weights of the same shapes, and each of its rows says so: its times "
              "hold, its accuracy means nothing (predictions are still compared with the reference's).")
def bench(stages, nets, images, notebooks, out, force, append, repeat, budget, per_image_max, cpu_max, slow_max_gflop,
          skip, no_baselines, random_weights):
    """The speed ladder: check and time every variant of every stage, with the numpy and cuDNN baselines."""
    from .ladder import bench as bench_mod  # a release may leave it out (LEAVE_OUT)

    counts = _image_counts(images)
    folder = notebooks or solutions_folder()
    try:
        chosen = bench_mod.validate(_csv_list(stages), _csv_list(nets), counts, folder, random_weights)
        out = bench_mod.prepare_out(out, force=force, append=append)
        rows = bench_mod.bench(chosen, _csv_list(nets), counts, folder, out, repeat,
                               bench_mod.Limits(per_image_max, cpu_max, slow_gflop=slow_max_gflop, budget_s=budget),
                               baselines=not no_baselines,
                               skip=_csv_list(skip), append=append, random_weights=random_weights)
    except bench_mod.BenchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(bench_mod.table(rows))
    plots = sum(1 for pattern in bench_mod.OUTPUT_PLOTS for _ in rows.folder.glob(pattern))
    click.echo(f"\nwrote ledger.jsonl, bench.json, bench.csv, summary.md and {plots} plots "
               f"{'(this run added) ' if append else ''}in {rows.folder}")


def _image_counts(images: str | None) -> tuple[int, ...] | None:
    """``--images``: whole numbers of at least 1, comma-separated."""
    if not images:
        return None
    try:
        counts = tuple(int(v) for v in _csv_list(images))
    except ValueError:
        raise click.BadParameter(f"takes whole numbers separated by commas, not {images!r}",
                                 param_hint="--images") from None
    bad = [n for n in counts if n < 1]
    if bad or not counts:
        raise click.BadParameter(f"image counts must be at least 1, not {bad[0] if bad else images!r}",
                                 param_hint="--images")
    return counts


@main.command()
@click.argument("submissions", type=click.Path(exists=True, path_type=Path))
@click.option("--stages", default=None,
              help="Stage numbers, comma-separated, e.g. 01,04 (default: every stage whose solution has VARIANTS; "
                   "for a single notebook, its own stage).")
@click.option("--students", default=None,
              help="Only these student folders, comma-separated (re-grade them: their rows replace theirs in the "
                   "report already in --out).")
@click.option("--rubric", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A rubric TOML read on top of the shipped labkit/rubric.toml.")
@click.option("--solutions", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder of reference solution notebooks (default: solutions/ of this checkout).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("grades"), show_default=True,
              help="Folder for grades.csv, grades.json and the Gradescope results.json files; one that holds a report "
                   "is refused unless --merge or --force.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Submissions graded at the same time (one process each). Keep 1 when timing matters.")
@click.option("--gpus", default=None,
              help="'all' or GPU indices (0,2): one Dask worker per GPU through dask-cuda (the cluster extra), each job "
                   "pinned to its worker's GPU; --jobs N spreads N jobs over them. Same as --cluster cuda:0,2.")
@click.option("--cluster", default=None,
              help="Grade on a Dask cluster: local[:N], cuda[:0,2] (this machine's GPUs, dask-cuda), slurm:N "
                   "(dask-jobqueue) or a scheduler address.")
@click.option("--merge/--no-merge", default=None,
              help="Update the report in --out, replacing only the graded rows (default: with --students or --stages).")
@click.option("--force", is_flag=True, help="Write into an --out that already holds files, replacing its report.")
@click.option("--seed", type=int, default=None, help="Seed of the random test inputs (default: fresh; recorded).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--sandbox", type=click.Choice(["auto", "bwrap", "apptainer", "docker"]), default="auto",
              show_default=True, help="Where student code runs: bubblewrap, Apptainer or Docker (the last two take the "
                                      "course's image in LABKIT_SANDBOX_IMAGE); auto: bubblewrap where it works.")
@click.option("--unsandboxed", is_flag=True,
              help="Run student code without a sandbox (as your user, seeing your files): only code you trust.")
@click.option("--cache", "cache_dir", type=click.Path(path_type=Path), default=None,
              help="Folder of the reference jobs kept across runs (default: the user's cache folder, or "
                   "$LABKIT_CACHE); a stage whose solution, rubric, device and versions match one there is not "
                   "timed again.")
@click.option("--no-cache", is_flag=True, help="Run every stage's reference job, and keep none.")
def grade(submissions, stages, students, rubric, solutions, out, jobs, gpus, cluster, merge, force, seed, no_progress,
          sandbox, unsandboxed, cache_dir, no_cache):
    """Grade student notebooks: correctness, accuracy and op time per stage, into CSV, JSON and Gradescope reports.

    SUBMISSIONS is a folder with one sub-folder per student (each holding notebooks/ or the .ipynb files),
    one student's folder, or a single notebook. Student code runs only in sandboxed child processes (--sandbox),
    with time and memory limits. Without a CUDA driver it runs on the CUDA simulator (unless NUMBA_ENABLE_CUDASIM=0).
    """
    from . import grading  # a release may leave it out (LEAVE_OUT)

    if rubric is not None and not rubric.is_file():
        raise click.BadParameter(f"no rubric file at {rubric}", param_hint="--rubric")
    if grading.simulator_if_no_driver() == "too-late":  # docs/grading.md: no CUDA driver means the simulator
        raise click.ClickException("no CUDA driver here, and numba.cuda was imported before labkit could switch on "
                                   "the CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 before starting Python")
    if stages is not None and not _csv_list(stages):
        raise click.BadParameter("takes stage numbers separated by commas, e.g. 01,04", param_hint="--stages")
    if students is not None and not _csv_list(students):
        raise click.BadParameter("takes student folder names separated by commas", param_hint="--students")
    if cache_dir is not None and no_cache:
        raise click.UsageError("--cache and --no-cache do not go together: name a cache folder, or none")
    _grades_out(out, merge if merge is not None else bool(_csv_list(students) or _csv_list(stages)), force)
    try:
        report = grading.grade(submissions, _csv_list(stages), rubric, solutions, out, jobs, seed,
                               progress=not no_progress, command=" ".join(["labkit", *sys.argv[1:]]),
                               students=_csv_list(students), gpus=gpus, cluster=cluster, merge=merge,
                               sandbox=sandbox, unsandboxed=unsandboxed,
                               cache=False if no_cache else cache_dir if cache_dir is not None else True)
    except grading.GradeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(grading.summary_table(report))
    gs = "results.json" if report["meta"].get("single_submission") and report["meta"]["students"] == 1 \
        else "gradescope/<student>/results.json"
    out = Path(report["meta"].get("written_to") or out)  # a fallback folder, where --out failed at the end
    click.echo(f"\nwrote {out / 'grades.csv'}, {out / 'grades.json'} and {out / gs}")
    again = grading.regrade_command(report, submissions, out)
    if again:  # the grader's own faults, never a student's: the run is not done
        n = sum(r["status"] == "grader-error" for r in report["rows"])
        click.echo(f"\n{n} row{'s are' if n > 1 else ' is'} the grader's own error, not the student's; grade "
                   f"{'them' if n > 1 else 'it'} again with:\n  {again}", err=True)
        sys.exit(3)


def _grades_out(out: Path, merge: bool, force: bool) -> None:
    """Refuse, before any grading, an --out that cannot be written, or one holding files the run would replace or
    mix with: a report unless it is merged into (--merge) or replaced (--force), other files unless --force."""
    try:
        outputs.writable_folder(out, "--out")
    except outputs.OutputError as exc:
        raise click.ClickException(str(exc)) from None
    held = outputs.contents(out)
    if not held or force or (merge and "grades.json" in held):
        return
    if "grades.json" in held:
        raise click.ClickException(f"--out {out} already holds a report (grades.json): pass --merge to update its "
                                   f"rows, --force to replace it, or name a new folder")
    raise click.ClickException(f"--out {out} is not empty ({outputs.listed(held)}) and holds no report: name a new "
                               f"or empty folder, or pass --force to write into it")


@main.command()
@click.argument("ledgers", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for summary.md and the ladder plots; one that holds files is refused unless --force.")
@click.option("--force", is_flag=True, help="Replace the summary and ladder plots already in --out.")
def ladder(ledgers, out, force):
    """Summarize recorded runs (ledger files of `labkit bench`) as a table and ladder plots."""
    from .ladder import bench as bench_mod  # a release may leave it out (LEAVE_OUT)

    try:
        for path in ledgers:
            if Ledger(path).first_line("name a ledger.jsonl that labkit wrote") is None:
                raise LedgerError(f"{path} holds no runs: name a ledger that `labkit bench` or `labkit run --record` "
                                  f"wrote")
        outputs.writable_folder(out, "--out")
    except (LedgerError, outputs.OutputError) as exc:
        raise click.ClickException(str(exc)) from None
    held = outputs.contents(out)
    if held and not force:
        raise click.ClickException(f"--out {out} already holds {outputs.listed(held)}: pass --force to replace the "
                                   f"summary and plots, or name a new folder")
    for old in [out / "summary.md", *out.glob("ladder_*.png")] if held else []:
        old.unlink(missing_ok=True)
    rows = bench_mod.summarize(list(ledgers), out, " ".join(["labkit", *sys.argv[1:]]))
    click.echo(bench_mod.table(rows))


@main.command("bench-doc")
@click.argument("folders", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--doc", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The page to write (default: docs/BENCHMARKS.md of this checkout).")
@click.option("--img-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the plots are copied (default: img/bench/ beside the page).")
def bench_doc(folders, doc, img_dir):
    """Write the benchmarks page from `labkit bench` output folders (each holding bench.json and its plots)."""
    from .ladder import benchdoc  # a release may leave it out (LEAVE_OUT)

    doc = doc or repo_root() / "docs" / "BENCHMARKS.md"
    try:
        benchdoc.render(list(folders), doc, img_dir or doc.parent / "img" / "bench")
    except benchdoc.BenchDocError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"could not write the page: {exc}") from None
    click.echo(f"wrote {doc} from {len(folders)} bench folder{'s' if len(folders) > 1 else ''}")



@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--upto", default=None, help="The milestone: its stage number, e.g. 05 (the notebooks of stages 00 to "
              "05, the given code of 00 to 04).")
@click.option("--verify", "verify_only", is_flag=True,
              help="Only search OUT (a built release) for solution text of its milestone and later stages.")
@click.option("--git", "commit", is_flag=True,
              help="Commit the release in OUT (git init when it is new; the next commit of an earlier release).")
@click.option("--force", is_flag=True, help="Replace a release of a later milestone in OUT (its later stages go).")
def release(out, upto, verify_only, commit, force):
    """Build the student repository of a milestone in OUT: no solution of that stage or later, anywhere.

    Run it in the instructor's repository (the one holding solutions/); docs/releases.md says how to publish it.
    """
    from .course import release as release_mod  # a release may leave it out (LEAVE_OUT)

    if not verify_only and not upto:
        raise click.BadParameter("give the milestone's stage number, e.g. --upto 05", param_hint="--upto")
    upto = upto.zfill(2) if upto else None
    try:
        if verify_only:
            result = release_mod.verify(out, upto)
        else:
            result = release_mod.build(upto, out, git=commit, force=force)
            click.echo(f"wrote the release of milestone {upto} to {out}: "
                       f"{len(release_mod.file_list(out))} files{' (committed)' if commit else ''}")
    except release_mod.ReleaseError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.report())
    if not result.clean:
        sys.exit(1)


# ---------------------------------------------------------------------------------------------- labkit lab


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--notebooks", "folder", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Folder to open (default: notebooks/ here, else the kit checkout's notebooks/).")
@click.argument("jupyter_args", nargs=-1, type=click.UNPROCESSED)
def lab(folder, jupyter_args):
    """Check the device and the data, then start JupyterLab on the course notebooks.

    Other arguments go to JupyterLab as they are, e.g. `labkit lab --no-browser --port 8890`.
    """
    folder = (folder or lab_folder()).resolve()
    books = sorted(p.name for p in folder.glob("*.ipynb"))
    if not books:
        raise click.ClickException(f"--notebooks {folder} holds no notebooks (.ipynb): name the folder that holds "
                                   f"the course's notebooks (notebooks/ in your clone of the kit)")
    first = "00_setup.ipynb" if "00_setup.ipynb" in books else books[0]
    args = list(jupyter_args)
    if is_root() and not any(a.startswith(("--allow-root", "--ServerApp.allow_root")) for a in args):
        click.echo("Running as root (as in many containers), which JupyterLab refuses without --allow-root: passing "
                   "it (run `labkit lab` as another user where you can).")
        args.append("--allow-root")
    try:
        from jupyterlab.labapp import LabApp
    except ImportError:
        raise click.ClickException("JupyterLab is not installed: in your clone of the kit, run "
                                   "pip install -e \".[lab]\"") from None
    # Checked in a child process: probing a GPU makes a CUDA context, which the server would otherwise hold.
    import subprocess

    subprocess.run([sys.executable, "-c", "from labkit.lessons.lab import lab_check; lab_check()"], check=False)
    click.echo(f"Starting JupyterLab on {folder} (start with {first}; Ctrl+C stops the server).")
    sys.stdout.flush()
    LabApp.launch_instance(argv=[f"--ServerApp.root_dir={folder}", *args])


if __name__ == "__main__":
    main()
