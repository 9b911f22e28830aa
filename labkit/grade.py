"""``labkit grade``: score students' stage notebooks for correctness, accuracy and op time, safely.

The grader (this module, the parent) never executes student code. For every (student, stage) it

1. draws fresh random inputs (``labkit.check.layer_case``: every layer each graded variant implements, at the
   rubric's batch sizes, odd ones included) and takes the real-image workloads, whose reference predictions it
   computed itself;
2. starts ``python -m labkit.grade_worker`` in a fresh temporary folder, in its own process group, with a wall-time
   limit and a memory limit, and sends it the job (JSON on stdin) and the inputs (an ``.npz`` file); the child
   gets private copies of the student's notebook and of the reference solution, loads only their ``kernel``-tagged
   cells with a freshly imported ``labkit``, and sends RAW outputs back through a pipe (see ``grade_worker``);
3. compares every output with the reference here (``labkit.check.compare``), so nothing the student's cells do in
   the child (patching ``labkit.check``, the timer, ...) can turn a wrong answer into a pass;
4. scores with the rubric (``labkit/rubric.toml``), and after each job verifies that labkit's own files and the
   reference solutions are unchanged on disk (restoring them, and failing the job, if a submission wrote to them).

A crash, a raise, a syntax error, an infinite loop (the process group is killed at the time limit), NaN outputs
or a missing stage become one row with a clear message; the run always goes on to the next submission.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import hashlib
import io
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

import numpy as np

from . import data, nbcells, reference
from .check import CheckResult, compare, layer_case, network_case
from .grade_worker import HEADER, MAGIC
from .nets import Net, get_net, load_c_study_weights, load_weights, random_weights
from .stages import SOLUTIONS, STAGES, Stage
from .workloads import Workload, workload

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PACKAGE = Path(__file__).resolve().parent
DEFAULT_RUBRIC = PACKAGE / "rubric.toml"
SECTIONS = {
    "limits": {"time_s": (int, float), "sim_time_s": (int, float), "memory_mb": int, "max_file_mb": int},
    "checks": {"batches": list, "sim_batches": list, "tol": (int, float)},
    "accuracy": {"images": int, "sim_images": int},
    "timing": {"images": int, "warmup": int, "repeat": int},
    "points": {"correctness": (int, float), "accuracy": (int, float), "op_time": (int, float)},
    "op_time": {"full_at_ratio": (int, float), "zero_at_ratio": (int, float), "requires_accuracy": bool,
                "when_not_measured": str},
}
STAGE_KEYS = {"variants": list, "timed_variant": str}
NOT_MEASURED = ("exclude", "full", "zero")
MAX_FRAME = 4 << 30

CSV_FIELDS = ["student", "stage", "status", "passed", "score", "max_score", "correctness_points", "accuracy_points",
              "op_time_points", "error", "accuracy", "reference_accuracy", "op_time_s", "reference_op_time_s",
              "ratio", "message", "notebook", "seed", "seconds"]


class GradeError(Exception):
    """The grader's own problem (bad arguments, unreadable rubric, broken reference): the run cannot go on."""


class RubricError(GradeError):
    pass


# ---------------------------------------------------------------------------------------------------- rubric


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise RubricError(f"cannot read the rubric {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RubricError(f"the rubric {path} is not valid TOML: {exc}") from None


def _validate_section(where: str, name: str, table) -> None:
    if not isinstance(table, dict):
        raise RubricError(f"{where}: [{name}] must be a table")
    for key, value in table.items():
        if key not in SECTIONS[name]:
            raise RubricError(f"{where}: unknown key {name}.{key}; [{name}] takes {', '.join(SECTIONS[name])}")
        want = SECTIONS[name][key]
        if isinstance(value, bool) and want is not bool:
            raise RubricError(f"{where}: {name}.{key} must be a number, not {value!r}")
        if not isinstance(value, want):
            raise RubricError(f"{where}: {name}.{key} has the wrong type ({value!r})")


@dataclasses.dataclass
class Rubric:
    """The merged rubric: ``base`` sections for every stage, ``stages`` overrides per stage number."""

    base: dict
    stages: dict
    sources: list[str]

    def for_stage(self, number: str) -> dict:
        merged = _merge(self.base, {k: v for k, v in self.stages.get(number, {}).items() if k in SECTIONS})
        merged.update({k: v for k, v in self.stages.get(number, {}).items() if k in STAGE_KEYS})
        return merged

    def to_dict(self) -> dict:
        return {**self.base, "stage": self.stages, "sources": self.sources}


def load_rubric(path: str | Path | None = None) -> Rubric:
    """The shipped rubric, with ``path`` (if given) read on top of it; every key is checked."""
    raw = _read_toml(DEFAULT_RUBRIC)
    sources = [str(DEFAULT_RUBRIC)]
    if path is not None:
        raw = _merge(raw, _read_toml(Path(path)))
        sources.append(str(path))
    where = " + ".join(sources)
    stages = raw.pop("stage", {})
    for name, table in raw.items():
        if name not in SECTIONS:
            raise RubricError(f"{where}: unknown section [{name}]; known: {', '.join(SECTIONS)}, stage.\"NN\"")
        _validate_section(where, name, table)
    missing = [f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys if k not in raw.get(s, {})]
    if missing:
        raise RubricError(f"{where}: missing {', '.join(missing)}")
    if not isinstance(stages, dict):
        raise RubricError(f"{where}: [stage] must hold tables named by stage number, e.g. [stage.\"04\"]")
    for number, table in stages.items():
        if number not in STAGES:
            raise RubricError(f"{where}: [stage.\"{number}\"] names no stage; stages are {', '.join(STAGES)}")
        for key, value in table.items():
            if key in SECTIONS:
                _validate_section(f"{where} [stage.\"{number}\"]", key, value)
            elif key in STAGE_KEYS:
                if not isinstance(value, STAGE_KEYS[key]):
                    raise RubricError(f"{where}: stage.\"{number}\".{key} has the wrong type ({value!r})")
            else:
                raise RubricError(f"{where}: unknown key stage.\"{number}\".{key}")
    rubric = Rubric(raw, stages, sources)
    for number in [None, *stages]:
        r = rubric.for_stage(number) if number else rubric.base
        label = f"stage {number}" if number else "defaults"
        for key in ("batches", "sim_batches"):
            if not r["checks"][key] or not all(isinstance(b, int) and b >= 1 for b in r["checks"][key]):
                raise RubricError(f"{where} ({label}): checks.{key} must be a list of batch sizes >= 1")
        op = r["op_time"]
        if op["when_not_measured"] not in NOT_MEASURED:
            raise RubricError(f"{where} ({label}): op_time.when_not_measured must be one of {', '.join(NOT_MEASURED)}")
        if not 0 < op["full_at_ratio"] < op["zero_at_ratio"]:
            raise RubricError(f"{where} ({label}): need 0 < op_time.full_at_ratio < op_time.zero_at_ratio")
        if r["timing"]["repeat"] < 1 or r["timing"]["warmup"] < 0 or r["timing"]["images"] < 1 \
                or r["accuracy"]["images"] < 1 or r["accuracy"]["sim_images"] < 1:
            raise RubricError(f"{where} ({label}): image counts and timing.repeat must be >= 1, warmup >= 0")
        if r["limits"]["time_s"] <= 0 or r["limits"]["sim_time_s"] <= 0:
            raise RubricError(f"{where} ({label}): time limits must be positive")
    return rubric


def op_time_fraction(ratio: float, full_at: float, zero_at: float) -> float:
    """1 at or below ``full_at``, 0 at or above ``zero_at``, linear in between."""
    if ratio <= full_at:
        return 1.0
    if ratio >= zero_at:
        return 0.0
    return (zero_at - ratio) / (zero_at - full_at)


# ------------------------------------------------------------------------------------------------ submissions


@dataclasses.dataclass
class Submission:
    student: str
    root: Path | None
    notebooks: dict[str, Path]  # stage number -> notebook
    notes: dict[str, str] = dataclasses.field(default_factory=dict)


def _find_notebook(folder: Path, stage: Stage) -> tuple[Path | None, str]:
    candidates = [p for p in folder.rglob(stage.notebook) if ".ipynb_checkpoints" not in p.parts]
    if not candidates:
        candidates = [p for p in folder.rglob(f"{stage.number}_*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    if not candidates:
        return None, ""
    candidates.sort(key=lambda p: (p.parent.name != "notebooks", len(p.parts), str(p)))
    note = f"{len(candidates)} candidates; graded {candidates[0].relative_to(folder)}" if len(candidates) > 1 else ""
    return candidates[0], note


def find_submissions(path: Path, stages: list[Stage]) -> list[Submission]:
    """A folder of student folders (each with notebooks/ or the .ipynb files), one student's folder, or one .ipynb."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".ipynb":
            raise GradeError(f"{path} is not a notebook (.ipynb) or a folder of submissions")
        stage = next((s for s in STAGES.values() if s.notebook == path.name), None) or next(
            (s for s in STAGES.values() if path.name.startswith(s.number + "_")), None)
        if stage is None:
            raise GradeError(f"cannot tell which stage {path.name} is: name it like "
                             f"{STAGES['01'].notebook}")
        student = path.parent.parent.name if path.parent.name == "notebooks" else path.parent.name
        return [Submission(student or path.stem, None, {stage.number: path})]
    if not path.is_dir():
        raise GradeError(f"no submissions at {path}")
    direct = [p for p in path.glob("*.ipynb") if any(p.name.startswith(s.number + "_") for s in STAGES.values())]
    roots = [path] if direct or (path / "notebooks").is_dir() else sorted(
        p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not roots:
        raise GradeError(f"{path} holds no student folders and no stage notebooks")
    subs = []
    for root in roots:
        sub = Submission(root.name, root, {})
        for stage in stages:
            nb, note = _find_notebook(root, stage)
            if nb is not None:
                sub.notebooks[stage.number] = nb
            if note:
                sub.notes[stage.number] = note
        subs.append(sub)
    return subs


# -------------------------------------------------------------------------------------------------- stages


def _defines_variants(path: Path) -> bool:
    try:
        return any("VARIANTS" in src for _, src in nbcells.tagged_cells(nbcells.read(path)))
    except nbcells.NotebookError:
        return False


def select_stages(numbers: list[str] | None, solutions: Path) -> list[Stage]:
    if not numbers:
        chosen = [s for s in STAGES.values() if (solutions / s.notebook).exists()
                  and _defines_variants(solutions / s.notebook)]
        if not chosen:
            raise GradeError(f"no stage notebook with VARIANTS in {solutions}")
        return chosen
    chosen = []
    for n in numbers:
        n = n.zfill(2)
        if n not in STAGES:
            raise GradeError(f"unknown stage {n!r}; stages are {', '.join(STAGES)}")
        sol = solutions / STAGES[n].notebook
        if not sol.exists():
            raise GradeError(f"no reference solution for stage {n}: {sol} is missing (see --solutions)")
        if not _defines_variants(sol):
            raise GradeError(f"stage {n} ({sol.name}) defines no VARIANTS: there is nothing to grade")
        chosen.append(STAGES[n])
    return chosen


def _child_env(extra: dict | None = None, lib: Path | None = None) -> dict:
    """The grader's environment (NUMBA_ENABLE_CUDASIM included), importing labkit from ``lib`` (a private copy)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(lib or PACKAGE.parent), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def describe_stage(solution: Path, timeout: float = 600) -> dict:
    """What the reference solution's VARIANTS declare, asked of a child process (the parent imports no kernels)."""
    with tempfile.TemporaryDirectory(prefix="labkit-describe-") as tmp:
        out = Path(tmp) / "describe.json"
        try:
            proc = subprocess.run([sys.executable, "-m", "labkit.grade_worker", "--describe", str(solution), "--json",
                                   str(out)], cwd=tmp, env=_child_env(), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise GradeError(f"the reference solution {solution} did not load within {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise GradeError(f"the reference solution {solution} does not load:\n{tail}")
        return json.loads(out.read_text())


@dataclasses.dataclass
class StagePlan:
    stage: Stage
    solution: Path
    rubric: dict
    contract: dict  # graded variant -> {target, arrays, per_image, nets, layers}
    timed: str
    measured: bool  # op time is measured (CPU code, or GPU code on a real GPU)
    not_measured_why: str
    time_limit: float


def plan_stage(stage: Stage, solutions: Path, rubric: Rubric, gpu: bool, simulated: bool) -> StagePlan:
    solution = solutions / stage.notebook
    desc = describe_stage(solution)
    r = rubric.for_stage(stage.number)
    order = desc["order"]
    names = r.get("variants") or order
    unknown = [n for n in names if n not in desc["variants"]]
    if unknown:
        raise GradeError(f"rubric: stage {stage.number} grades variants {unknown}, which {solution.name} does not "
                         f"define (it defines {', '.join(order)})")
    timed = r.get("timed_variant") or names[-1]
    if timed not in names:
        raise GradeError(f"rubric: stage {stage.number} times variant {timed!r}, which is not graded ({names})")
    contract = {n: desc["variants"][n] for n in names}
    target = contract[timed]["target"]
    measured, why = True, ""
    if target == "gpu" and not gpu:
        measured, why = False, "simulated" if simulated else "no GPU"
    tnet = contract[timed]["nets"][0]
    if not any(get_net(tnet).layer(n).kind == "conv" for n in contract[timed]["layers"][tnet]):
        measured, why = False, "the timed variant has no conv function"
    sim_stage = simulated and any(c["target"] == "gpu" for c in contract.values())
    limit = r["limits"]["sim_time_s"] if sim_stage else r["limits"]["time_s"]
    return StagePlan(stage, solution, r, contract, timed, measured, why, float(limit))


# ------------------------------------------------------------------------------------------- reference data


class References:
    """Real-image workloads and the reference's predictions on them, computed once per run in the parent."""

    def __init__(self, simulated: bool):
        self.simulated = simulated
        self._cache: dict = {}
        self._weights: dict = {}
        self.weight_sources: dict[str, str] = {}
        self._lock = threading.Lock()

    def weights(self, net: Net) -> dict:
        if net.name not in self._weights:
            try:
                w, src = load_weights(net), "shipped weights"
            except FileNotFoundError:
                folder = data.find_folder("cnn-cifar10-weights") if net.name == "cifar10" else None
                if folder is not None:
                    w, src = load_c_study_weights(folder, net), f"the C study's weights ({folder})"
                else:
                    w, src = random_weights(net, seed=0), "RANDOM weights (no shipped weights found)"
            self._weights[net.name] = w
            self.weight_sources[net.name] = src
        return self._weights[net.name]

    def get(self, net_name: str, images: int, target: str) -> tuple[Workload, np.ndarray, float | None]:
        key = (net_name, images, target)
        with self._lock:
            if key not in self._cache:
                net = get_net(net_name)
                wl = workload(net, images, target=target, weights=self.weights(net), tile=True, quiet=True)
                pred = reference.predict(reference.forward(wl.net, wl.weights, wl.x))
                acc = None if wl.labels is None else reference.accuracy(pred, wl.labels)
                self._cache[key] = (wl, pred, acc)
            return self._cache[key]


def _net_dict(net: Net) -> dict:
    return dataclasses.asdict(net)


# --------------------------------------------------------------------------------------------------- guard


class Guard:
    """Checksums of the files a job's child must not change: its private copy of labkit and of the reference
    solution. ``changed()`` names the ones that differ (the job folder is deleted afterwards, so nothing is
    restored, and nothing outside the job folder is ever written)."""

    def __init__(self, paths):
        self.files = {Path(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths if Path(p).is_file()}

    def changed(self) -> list[str]:
        out = []
        for path, digest in self.files.items():
            try:
                same = hashlib.sha256(path.read_bytes()).hexdigest() == digest
            except OSError:
                same = False
            if not same:
                out.append(path.name)
        return out


def private_labkit(dest: Path) -> list[Path]:
    """Copy labkit's sources into ``dest/labkit`` (the child imports this copy: PYTHONPATH comes before the
    installed package), so nothing a child does to its labkit reaches the grader or another job."""
    pkg = dest / "labkit"
    pkg.mkdir(parents=True)
    copied = []
    for f in PACKAGE.iterdir():
        if f.is_file() and f.suffix in (".py", ".toml", ".cfg"):
            shutil.copyfile(f, pkg / f.name)
            copied.append(pkg / f.name)
    return copied


# ------------------------------------------------------------------------------------------------ one job


@dataclasses.dataclass
class JobOutcome:
    """What came back from one child, judged by the parent."""

    device: str = ""
    phase: str = "starting"
    load_error: str | None = None
    problems: dict = dataclasses.field(default_factory=dict)
    checks: dict = dataclasses.field(default_factory=dict)  # case id -> CheckResult
    checks_done: bool = False
    accuracy: dict = dataclasses.field(default_factory=dict)  # accuracy id -> dict
    accuracy_done: bool = False
    reference_runs: list | None = None
    timing_runs: list | None = None
    timing_error: str | None = None
    done: bool = False
    grader_error: str | None = None
    protocol_error: str | None = None
    timed_out: bool = False
    memory_exceeded: bool = False
    returncode: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0
    notes: list = dataclasses.field(default_factory=list)


def _parse_frames(buf: bytearray) -> tuple[list[tuple[dict, bytes]], str | None]:
    """Complete frames at the front of ``buf`` (consumed); an error string if the stream is not frames."""
    frames = []
    while len(buf) >= HEADER.size:
        magic, hlen, plen = HEADER.unpack_from(buf)
        if magic != MAGIC or hlen > (16 << 20) or plen > MAX_FRAME:
            return frames, "the result channel carried bytes that are not the grader's frames"
        end = HEADER.size + hlen + plen
        if len(buf) < end:
            break
        try:
            meta = json.loads(bytes(buf[HEADER.size:HEADER.size + hlen]))
            if not isinstance(meta, dict) or not isinstance(meta.get("type"), str):
                raise ValueError("not a message")
        except ValueError:
            return frames, "the result channel carried a malformed message"
        frames.append((meta, bytes(buf[HEADER.size + hlen:end])))
        del buf[:end]
    return frames, None


def _npz(payload: bytes, key: str) -> np.ndarray | None:
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            return z[key] if key in z.files else None
    except Exception:  # noqa: BLE001 - anything unreadable is judged as missing
        return None


def _proc_table() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every process, from /proc (empty where there is none)."""
    rows = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                rows.append((int(entry), int(fields[1]), int(fields[2])))
            except (OSError, ValueError, IndexError):
                continue
    return rows


def _descendants(pid: int, table=None) -> list[int]:
    parents: dict[int, list[int]] = {}
    for child, ppid, _ in table if table is not None else _proc_table():
        parents.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return total / 1024


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child, every process of its process group (a session of its own) and every descendant, even
    one that left the group: named one by one, so nothing else on the machine is touched."""
    table = _proc_table()
    victims = {pid for pid, _, pgid in table if pgid == proc.pid} | set(_descendants(proc.pid, table))
    if proc.returncode is None:
        victims.add(proc.pid)
    if not table and proc.returncode is None:  # no /proc (macOS): the group, while its leader is surely ours
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Job:
    """One (student, stage): build inputs, run the child, judge what comes back."""

    def __init__(self, plan: StagePlan, refs: References, student: str, notebook: Path, seed: int, gpu: bool,
                 simulated: bool):
        self.plan, self.refs, self.student, self.notebook, self.seed = plan, refs, student, notebook, seed
        self.gpu, self.simulated = gpu, simulated
        self.cases: dict[int, dict] = {}
        self.acc_items: dict[str, dict] = {}
        self.outcome = JobOutcome()
        self.conv_layers: list[str] = []
        self.memory_guard = "none"
        self.tampered: list[str] = []
        self.lib = Path()

    # ---- inputs
    def build(self, folder: Path) -> dict:
        plan, r = self.plan, self.plan.rubric
        rng = np.random.default_rng(self.seed)
        arrays: dict[str, np.ndarray] = {}
        nets: dict[str, dict] = {}
        cases, workloads, accuracy = [], {}, []

        def put_weights(prefix: str, weights: dict) -> dict:
            names = {}
            for i, (k, v) in enumerate(weights.items()):
                arrays[f"{prefix}.w{i}"] = np.ascontiguousarray(v, dtype=np.float32)
                names[k] = f"{prefix}.w{i}"
            return names

        def put_workload(net_name: str, images: int, target: str) -> str:
            wl, pred, acc = self.refs.get(net_name, images, target)
            key = f"wl_{net_name}_{images}_{target}"
            if key not in workloads:
                nets[wl.net.name] = _net_dict(wl.net)
                arrays[f"{key}.x"] = np.ascontiguousarray(wl.x, dtype=np.float32)
                workloads[key] = {"net": wl.net.name, "x": f"{key}.x", "weights": put_weights(key, wl.weights)}
            return key

        for vname, spec in plan.contract.items():
            sim_gpu = self.simulated and spec["target"] == "gpu"
            batches = r["checks"]["sim_batches"] if sim_gpu else r["checks"]["batches"]
            images = r["accuracy"]["sim_images"] if sim_gpu else r["accuracy"]["images"]
            for net_name in spec["nets"]:
                for layer_name in spec["layers"][net_name]:
                    for b in batches:
                        case = layer_case(net_name, layer_name, b, rng, target=spec["target"])
                        cid = len(cases)
                        arrays[f"c{cid}.x"] = case.x
                        cases.append({"id": cid, "variant": vname, "net": net_name, "batch": b,
                                      "layer": dataclasses.asdict(case.layer), "x": f"c{cid}.x",
                                      "weights": put_weights(f"c{cid}", case.weights),
                                      "out_shape": list(case.expected.shape)})
                        self.cases[cid] = {"variant": vname, "net": net_name, "layer": layer_name, "batch": b,
                                           "expected": case.expected}
                if spec.get("network"):  # a whole-network function fn(x, weights, out): fresh random weights too
                    for b in batches:
                        case = network_case(net_name, b, rng, target=spec["target"])
                        cid = len(cases)
                        arrays[f"c{cid}.x"] = case.x
                        cases.append({"id": cid, "variant": vname, "net": net_name, "batch": b, "layer": None,
                                      "name": case.name, "x": f"c{cid}.x",
                                      "weights": put_weights(f"c{cid}", case.weights),
                                      "out_shape": list(case.expected.shape)})
                        self.cases[cid] = {"variant": vname, "net": net_name, "layer": case.name, "batch": b,
                                           "expected": case.expected}
                key = put_workload(net_name, images, spec["target"])
                aid = f"{vname}/{net_name}"
                accuracy.append({"id": aid, "variant": vname, "workload": key})
                self.acc_items[aid] = {"variant": vname, "net": net_name, "key": (net_name, images, spec["target"])}
        timing = None
        if plan.measured:
            spec = plan.contract[plan.timed]
            net_name = spec["nets"][0]
            key = put_workload(net_name, r["timing"]["images"], spec["target"])
            conv = [n for n in spec["layers"][net_name] if get_net(net_name).layer(n).kind == "conv"]
            timing = {"variant": plan.timed, "workload": key, "warmup": r["timing"]["warmup"],
                      "repeat": r["timing"]["repeat"], "conv_layers": conv}
            self.conv_layers = conv
        np.savez(folder / "inputs.npz", **arrays)
        memory_guard = "none"
        if r["limits"]["memory_mb"] > 0:
            memory_guard = "rss" if self.gpu else "rlimit"
        self.memory_guard = memory_guard
        return {"inputs": str(folder / "inputs.npz"), "nets": nets, "workloads": workloads, "cases": cases,
                "accuracy": accuracy, "timing": timing,
                "contract": {n: {k: s[k] for k in ("target", "arrays", "per_image")} for n, s in
                             plan.contract.items()},
                "memory_mb": r["limits"]["memory_mb"], "memory_guard": memory_guard,
                "max_file_mb": r["limits"]["max_file_mb"]}

    # ---- judging, message by message
    def _case(self, meta: dict, payload: bytes) -> None:
        cid = meta.get("id")
        if cid not in self.cases:
            self.outcome.protocol_error = f"a result for an unknown case {cid!r}"
            return
        c = self.cases[cid]
        if meta.get("skipped"):
            return
        if meta.get("error"):
            res = CheckResult(c["layer"], False, detail=str(meta["error"]), seed=self.seed)
        else:
            got = _npz(payload, "out")
            if got is None:
                res = CheckResult(c["layer"], False, detail="no output array came back", seed=self.seed)
            else:
                res = compare(c["layer"], got, c["expected"], self.plan.rubric["checks"]["tol"], batch=c["batch"])
                res.seed = self.seed
                res.batches = (c["batch"],)
        self.outcome.checks[cid] = res

    def _accuracy(self, meta: dict, payload: bytes) -> None:
        aid = meta.get("id")
        if aid not in self.acc_items:
            self.outcome.protocol_error = f"an accuracy result for an unknown run {aid!r}"
            return
        item = self.acc_items[aid]
        wl, ref_pred, ref_acc = self.refs.get(*item["key"])
        res = {"variant": item["variant"], "net": item["net"], "images": wl.images, "simulated": wl.simulated,
               "synthetic": wl.synthetic, "reference_accuracy": ref_acc, "accuracy": None, "mismatches": None,
               "passed": False, "message": ""}
        if meta.get("error"):
            res["message"] = str(meta["error"])
        else:
            probs = _npz(payload, "probs")
            classes = len(wl.net.classes) or 10
            if probs is None or probs.ndim != 2 or probs.shape[0] != wl.images:
                shape = None if probs is None else probs.shape
                res["message"] = (f"the {wl.net.name} forward pass returned {shape} instead of "
                                  f"({wl.images}, {classes}) class probabilities")
            elif not np.all(np.isfinite(probs)):
                bad = int((~np.isfinite(probs)).any(axis=1).sum())
                res["message"] = (f"the {wl.net.name} forward pass gave NaN/inf probabilities for {bad} of "
                                  f"{wl.images} images (a layer left outputs unwritten?)")
            else:
                pred = reference.predict(probs)
                res["mismatches"] = int((pred != ref_pred).sum())
                if wl.labels is not None:
                    res["accuracy"] = reference.accuracy(pred, wl.labels)
                    res["passed"] = int((pred == wl.labels).sum()) == int((ref_pred == wl.labels).sum())
                else:
                    res["passed"] = res["mismatches"] == 0
                if not res["passed"]:
                    acc = (f" (accuracy {100 * res['accuracy']:.2f} % vs the reference's {100 * ref_acc:.2f} %)"
                           if res["accuracy"] is not None else "")
                    res["message"] = (f"variant {item['variant']!r}: predictions differ from the reference's on "
                                      f"{res['mismatches']} of {wl.images} {wl.net.name} images{acc}")
        self.outcome.accuracy[aid] = res

    def _checks_passed(self) -> bool:
        o = self.outcome
        return not o.problems and len(o.checks) == len(self.cases) and all(r.passed for r in o.checks.values())

    def _accuracy_passed(self) -> bool:
        o = self.outcome
        return len(o.accuracy) == len(self.acc_items) and all(a["passed"] for a in o.accuracy.values())

    def _runs(self, meta: dict) -> list | None:
        runs = meta.get("runs")
        ok = isinstance(runs, list) and runs and all(
            isinstance(run, dict) and all(isinstance(run.get(n), (int, float)) and np.isfinite(run.get(n))
                                          and run.get(n) >= 0 for n in self.conv_layers) for run in runs)
        if not ok:
            self.outcome.protocol_error = "timing results without the conv layers' times"
            return None
        return runs

    def handle(self, meta: dict, payload: bytes, answer) -> None:
        o, kind = self.outcome, meta["type"]
        if kind == "hello":
            o.device = str(meta.get("device", ""))
            if not Path(str(meta.get("labkit", ""))).resolve().is_relative_to(self.lib.resolve()):
                o.grader_error = (f"the grading process imported labkit from {meta.get('labkit')}, not from its "
                                  f"private copy in {self.lib}")
        elif kind in ("phase", "start"):
            o.phase = str(meta.get("what", ""))[:200]
        elif kind == "reference":
            o.reference_runs = self._runs(meta)
        elif kind == "load_error":
            o.load_error = str(meta.get("message", ""))[:2000]
        elif kind == "loaded":
            o.problems = {str(k): str(v) for k, v in (meta.get("problems") or {}).items()}
            for name, declared in (meta.get("variants") or {}).items():
                spec = self.plan.contract.get(name, {})
                differ = [f"{k}={spec[k]!r} (your VARIANTS says {declared.get(k)!r})"
                          for k in ("target", "arrays", "per_image") if k in spec and declared.get(k) != spec[k]]
                if differ:
                    o.notes.append(f"variant {name!r} graded as the stage declares it: {', '.join(differ)}")
        elif kind == "case":
            self._case(meta, payload)
        elif kind == "checks_done":
            o.checks_done = True
            answer("continue" if self._checks_passed() else "stop")
        elif kind == "accuracy":
            self._accuracy(meta, payload)
        elif kind == "accuracy_done":
            o.accuracy_done = True
            req = self.plan.rubric["op_time"]["requires_accuracy"]
            answer("continue" if self.plan.measured and (self._accuracy_passed() or not req) else "stop")
        elif kind == "timing":
            if meta.get("error"):
                o.timing_error = str(meta["error"])
            else:
                o.timing_runs = self._runs(meta)
        elif kind == "grader_error":
            o.grader_error = str(meta.get("message", ""))
        elif kind == "done":
            o.done = True
        else:
            o.protocol_error = f"an unknown message {kind!r} on the result channel"

    # ---- running
    def run(self) -> JobOutcome:
        o = self.outcome
        start = time.monotonic()
        folder = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
        try:
            (folder / "student").mkdir()
            (folder / "reference").mkdir()
            (folder / "work").mkdir()
            student_nb = folder / "student" / self.notebook.name
            shutil.copyfile(self.notebook, student_nb)
            reference_nb = folder / "reference" / self.plan.solution.name
            shutil.copyfile(self.plan.solution, reference_nb)
            self.lib = folder / "lib"
            guard = Guard([*private_labkit(self.lib), reference_nb])
            job = self.build(folder)
            job.update(student_notebook=str(student_nb), reference_notebook=str(reference_nb))
            self._run_child(job, folder)
            self.tampered = guard.changed()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        o.seconds = time.monotonic() - start
        return o

    def _run_child(self, job: dict, folder: Path) -> None:
        o = self.outcome
        rfd, wfd = os.pipe()
        job["fd"] = wfd
        out = open(folder / "stdout.txt", "wb")
        err = open(folder / "stderr.txt", "wb")
        env = _child_env({"NUMBA_CACHE_DIR": str(folder / "work" / "numba-cache")}, lib=folder / "lib")
        try:
            proc = subprocess.Popen([sys.executable, "-m", "labkit.grade_worker"], stdin=subprocess.PIPE, stdout=out,
                                    stderr=err, cwd=folder / "work", env=env, pass_fds=(wfd,),
                                    start_new_session=True)
        finally:
            os.close(wfd)
            out.close()
            err.close()

        def answer(cmd: str) -> None:
            try:
                proc.stdin.write((cmd + "\n").encode())
                proc.stdin.flush()
            except OSError:
                pass

        answer(json.dumps(job))
        deadline = time.monotonic() + self.plan.time_limit
        buf = bytearray()
        eof = False
        next_rss = 0.0
        limit_mb = self.plan.rubric["limits"]["memory_mb"]
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    o.timed_out = True
                    break
                if eof:
                    try:
                        proc.wait(timeout=min(0.5, deadline - now))
                        break
                    except subprocess.TimeoutExpired:
                        if o.done:  # results are complete; a thread the student left running keeps it alive
                            break
                        continue
                ready, _, _ = select.select([rfd], [], [], min(0.5, deadline - now))
                if ready:
                    chunk = os.read(rfd, 1 << 20)
                    if not chunk:
                        eof = True
                        continue
                    buf += chunk
                    frames, bad = _parse_frames(buf)
                    for meta, payload in frames:
                        self.handle(meta, payload, answer)
                    if bad:
                        o.protocol_error = bad
                        break
                    if o.protocol_error or o.done:
                        eof = True
                if self.memory_guard == "rss" and limit_mb > 0 and now >= next_rss:
                    next_rss = now + 1.0
                    if _rss_mb([proc.pid, *_descendants(proc.pid)]) > limit_mb:
                        o.memory_exceeded = True
                        break
        finally:
            os.close(rfd)
            _kill_tree(proc)
            try:
                proc.stdin.close()
            except OSError:
                pass
            o.returncode = proc.returncode
            try:
                o.stderr_tail = (folder / "stderr.txt").read_text(errors="replace")[-4000:]
            except OSError:
                pass

    # ---- the row
    def row(self) -> dict:
        o, plan, r = self.outcome, self.plan, self.plan.rubric
        pts = r["points"]
        op = r["op_time"]
        row = _empty_row(self.student, plan.stage, r, plan)
        row.update(notebook=str(self.notebook), seed=self.seed, seconds=round(o.seconds, 2), device=o.device)
        details = row["details"]
        details["checks"] = [f"[{self.cases[cid]['variant']}] {res}" for cid, res in sorted(o.checks.items())]
        details["accuracy_runs"] = list(o.accuracy.values())
        # the largest relative error over the compared outputs; none when an output was missing, not finite or
        # the wrong shape (the message says which), since a maximum over the others would look like a pass
        errors = [res.error for res in o.checks.values()]
        row["error"] = max(errors) if errors and all(np.isfinite(e) for e in errors) else None

        failing = list(dict.fromkeys((self.cases[cid]["variant"], res.name) for cid, res in sorted(o.checks.items())
                                     if not res.passed))
        first_fail = next((res for _, res in sorted(o.checks.items()) if not res.passed), None)
        correct = self._checks_passed() and not o.load_error
        acc_ok = correct and self._accuracy_passed()

        # accuracy figures of the timed variant's first net (or the first accuracy run)
        main = o.accuracy.get(f"{plan.timed}/{plan.contract[plan.timed]['nets'][0]}") or next(
            iter(o.accuracy.values()), None)
        if main is not None:
            row["reference_accuracy"] = main["reference_accuracy"]
            if main["simulated"]:
                row["accuracy"] = "n/a (simulated)"
            elif main["synthetic"]:
                row["accuracy"] = "n/a (synthetic inputs)"
            else:
                row["accuracy"] = main["accuracy"]

        # op time
        ratio = None
        if o.timing_runs and o.reference_runs:
            conv = self.conv_layers
            st = median(sum(run[n] for n in conv) for run in o.timing_runs)
            rt = median(sum(run[n] for n in conv) for run in o.reference_runs)
            row["op_time_s"], row["reference_op_time_s"] = st, rt
            ratio = st / rt if rt > 0 else None
            row["ratio"] = ratio
            details["op_time_runs"] = {"student": o.timing_runs, "reference": o.reference_runs}
        elif not plan.measured:
            row["op_time_s"] = f"not measured ({plan.not_measured_why})"

        # status and message, most fundamental problem first
        msg = []
        tail = _last_line(o.stderr_tail)
        if o.grader_error:
            row["status"], msg = "grader-error", [o.grader_error]
        elif o.load_error:
            row["status"], msg = "error", [o.load_error]
        elif o.problems:
            row["status"], msg = "fail", list(o.problems.values())
        elif first_fail is not None:
            row["status"] = "fail"
            msg = [str(first_fail)]
            if len(plan.contract) > 1:
                msg[0] = f"variant {failing[0][0]!r}: {msg[0]}"
            if len(failing) > 1:
                names = [layer if len(plan.contract) == 1 else f"{v}:{layer}" for v, layer in failing[1:]]
                more = f" and {len(names) - 6} more" if len(names) > 6 else ""
                msg.append("also failing: " + ", ".join(names[:6]) + more)
        elif correct and not acc_ok and o.accuracy_done:
            row["status"] = "fail"
            msg = [a["message"] for a in o.accuracy.values() if not a["passed"]][:2]
        if o.timed_out or o.memory_exceeded or o.protocol_error or (not o.done and not o.grader_error):
            if o.timed_out:
                why = (f"time limit ({plan.time_limit:.0f} s) reached while {_gerund(o.phase)}: an infinite loop, "
                       f"or too slow for the limit")
                status = "timeout"
            elif o.memory_exceeded:
                why = f"memory limit ({r['limits']['memory_mb']} MB resident) exceeded while {_gerund(o.phase)}"
                status = "error"
            elif o.protocol_error:
                why = f"{o.protocol_error} while {_gerund(o.phase)}"
                status = "error"
            else:
                why = (f"the grading process ended unexpectedly ({_exit_text(o.returncode)}) while "
                       f"{_gerund(o.phase)}" + (f"; last stderr line: {tail}" if tail else ""))
                status = "error"
            if row["status"] in ("", "pass"):
                row["status"] = status
            msg.append(why)
        tampered = self.tampered
        if tampered:
            row["status"] = "tampered"
            msg.insert(0, f"the submission changed the grader's files on disk ({', '.join(tampered)}): stage scored 0")

        # score: correctness gates everything
        max_score = pts["correctness"] + pts["accuracy"] + pts["op_time"]
        op_points = 0.0
        if not plan.measured and op["when_not_measured"] == "exclude":
            max_score -= pts["op_time"]
        c_points = float(pts["correctness"]) if correct else 0.0
        a_points = float(pts["accuracy"]) if acc_ok else 0.0
        op_allowed = correct and (acc_ok or not op["requires_accuracy"])
        if op_allowed and plan.measured and ratio is not None:
            op_points = pts["op_time"] * op_time_fraction(ratio, op["full_at_ratio"], op["zero_at_ratio"])
        elif op_allowed and not plan.measured and op["when_not_measured"] == "full":
            op_points = float(pts["op_time"])
        if tampered:
            c_points = a_points = op_points = 0.0
        row.update(correctness_points=c_points, accuracy_points=a_points, op_time_points=round(op_points, 2),
                   score=round(c_points + a_points + op_points, 2), max_score=max_score)
        row["passed"] = bool(correct and acc_ok and not tampered)
        if not row["status"]:
            row["status"] = "pass" if row["passed"] else "fail"
        if row["status"] == "pass":
            msg = ["all checks pass"]
            msg.append("accuracy equals the reference's" if main and main["accuracy"] is not None
                       else "predictions equal the reference's")
            if ratio is not None:
                msg.append(f"op time {ratio:.2f}x the reference's")
            elif o.timing_error:
                msg.append(f"op time not scored: {o.timing_error}")
            elif not plan.measured:
                policy = {"exclude": "not counted", "full": "given in full", "zero": "not given"}[
                    op["when_not_measured"]]
                msg.append(f"op time not measured ({plan.not_measured_why}): op-time points {policy}")
        elif o.timing_error:
            msg.append(f"op time: {o.timing_error}")
        row["message"] = "; ".join(m for m in [*msg, *o.notes] if m)
        return row


def _gerund(phase: str) -> str:
    phase = phase or "starting"
    if phase.startswith(("loading", "timing", "starting")):
        return phase
    return f"running {phase}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _empty_row(student: str, stage: Stage, r: dict, plan: StagePlan | None) -> dict:
    pts = r["points"]
    max_score = pts["correctness"] + pts["accuracy"] + pts["op_time"]
    if plan is not None and not plan.measured and r["op_time"]["when_not_measured"] == "exclude":
        max_score -= pts["op_time"]
    return {"student": student, "stage": stage.number, "status": "", "passed": False, "score": 0.0,
            "max_score": max_score, "correctness_points": 0.0, "accuracy_points": 0.0, "op_time_points": 0.0,
            "error": None, "accuracy": None, "reference_accuracy": None, "op_time_s": None,
            "reference_op_time_s": None, "ratio": None, "message": "", "notebook": "", "seed": None,
            "seconds": 0.0, "device": "", "details": {}}


# ---------------------------------------------------------------------------------------------------- run


def grade(submissions: str | Path, stages: list[str] | None = None, rubric: str | Path | None = None,
          solutions: str | Path | None = None, out: str | Path = "grades", jobs: int = 1, seed: int | None = None,
          progress: bool = True, command: str | None = None) -> dict:
    """Grade every submission for every selected stage; write ``grades.csv`` and ``grades.json`` under ``out``.

    Returns ``{"meta": ..., "rows": [...]}``. Raises ``GradeError`` only for the grader's own problems.
    """
    from tqdm import tqdm  # plain text bar: works in a terminal and in a notebook without ipywidgets

    from . import device

    device.use_simulator_if_no_gpu()
    dinfo = device.info()
    gpu, simulated = dinfo.kind == "gpu", dinfo.simulated
    rub = load_rubric(rubric)
    solutions = Path(solutions) if solutions else SOLUTIONS
    if not solutions.is_dir():
        raise GradeError(f"no solutions folder at {solutions}")
    submissions = Path(submissions)
    if submissions.is_file() and not stages:
        found = find_submissions(submissions, list(STAGES.values()))
        stages = list(found[0].notebooks)
    chosen = select_stages(stages, solutions)
    subs = find_submissions(submissions, chosen)
    if jobs < 1:
        raise GradeError("--jobs must be at least 1")
    plans = {s.number: plan_stage(s, solutions, rub, gpu, simulated) for s in chosen}
    if dinfo.kind == "cpu":
        needs_gpu = [n for n, p in plans.items() if any(c["target"] == "gpu" for c in p.contract.values())]
        if needs_gpu:
            raise GradeError(f"stages {', '.join(needs_gpu)} have GPU code, and there is no GPU here and the CUDA "
                             f"simulator is off: run with NUMBA_ENABLE_CUDASIM=1, or grade on a GPU machine")
    refs = References(simulated)
    run_seed = int(np.random.SeedSequence(seed).entropy % (2 ** 63)) if seed is None else int(seed)
    seeds = np.random.SeedSequence(run_seed).generate_state(len(subs) * len(chosen) + 1, dtype=np.uint32)

    # the reference data every job shares, prepared before any child starts
    for plan in plans.values():
        for spec in plan.contract.values():
            sim_gpu = simulated and spec["target"] == "gpu"
            for net_name in spec["nets"]:
                refs.get(net_name, plan.rubric["accuracy"]["sim_images" if sim_gpu else "images"], spec["target"])
        if plan.measured:
            spec = plan.contract[plan.timed]
            refs.get(spec["nets"][0], plan.rubric["timing"]["images"], spec["target"])

    tasks = []
    for i, sub in enumerate(subs):
        for j, stage in enumerate(chosen):
            tasks.append((i, sub, stage, int(seeds[i * len(chosen) + j])))
    rows: dict[tuple[int, str], dict] = {}
    left = {i: len(chosen) for i in range(len(subs))}
    bar = tqdm(total=len(subs), desc="grading", unit="submission", disable=not progress, file=sys.stderr)
    lock = threading.Lock()

    def one(task) -> None:
        i, sub, stage, job_seed = task
        plan = plans[stage.number]
        nb = sub.notebooks.get(stage.number)
        if nb is None:
            row = _empty_row(sub.student, stage, plan.rubric, plan)
            where = sub.root or submissions
            row.update(status="missing", seed=job_seed,
                       message=f"missing stage: no {stage.notebook} in {where}"
                               + (" (looked in notebooks/ and every folder below)" if sub.root else ""))
        else:
            job = Job(plan, refs, sub.student, nb, job_seed, gpu, simulated)
            try:
                job.run()
                row = job.row()
            except Exception as exc:  # noqa: BLE001 - the grader's own failure for one job: record it, go on
                import traceback

                row = _empty_row(sub.student, stage, plan.rubric, plan)
                row.update(status="grader-error", notebook=str(nb), seed=job_seed,
                           message=f"grader error: {type(exc).__name__}: {exc}",
                           details={"traceback": traceback.format_exc(limit=8)})
            if sub.notes.get(stage.number):
                row["message"] += f" [{sub.notes[stage.number]}]"
        with lock:
            rows[(i, stage.number)] = row
            left[i] -= 1
            if left[i] == 0:
                bar.update()
                bar.set_postfix_str(sub.student[:20])

    started = time.monotonic()
    if jobs == 1:
        for task in tasks:
            one(task)
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, tasks))
    bar.close()
    ordered = [rows[(i, s.number)] for i in range(len(subs)) for s in chosen]
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(["labkit", *sys.argv[1:]]),
        "device": device.label(dinfo), "simulated": simulated, "gpu": gpu,
        "memory_guard": _memory_guard_text(rub, gpu),
        "stages": [s.number for s in chosen], "students": len(subs), "seed": run_seed,
        "rubric": rub.to_dict(), "weights": refs.weight_sources, "solutions": str(solutions),
        "python": platform.python_version(), "seconds": round(time.monotonic() - started, 1),
        "timed_variants": {n: p.timed for n, p in plans.items()},
        "op_time": {n: ("measured" if p.measured else f"not measured ({p.not_measured_why})")
                    for n, p in plans.items()},
    }
    report = {"meta": meta, "rows": ordered}
    write_reports(Path(out), report)
    return report


def _memory_guard_text(rub: Rubric, gpu: bool) -> str:
    mb = rub.base["limits"]["memory_mb"]
    if mb <= 0:
        return "none (limits.memory_mb = 0)"
    if gpu:
        return (f"resident-memory watchdog at {mb} MB (RLIMIT_AS is not used on a GPU: CUDA reserves more address "
                f"space than any sensible limit)")
    return f"address-space limit (RLIMIT_AS) of {mb} MB"


def _csv_value(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def write_reports(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "grades.json").write_text(json.dumps(report, indent=1, default=_json_default))
    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in report["rows"]:
            w.writerow({k: _csv_value(row.get(k)) for k in CSV_FIELDS})


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (Path, tuple)):
        return str(o)
    return str(o)


def summary_table(report: dict) -> str:
    """Students x stages: score/max and status, totals; then one line per problem."""
    rows = report["rows"]
    stages = report["meta"]["stages"]
    students = list(dict.fromkeys(r["student"] for r in rows))
    by = {(r["student"], r["stage"]): r for r in rows}
    w = max([7, *map(len, students)])
    head = f"{'student':<{w}}  " + "  ".join(f"{'stage ' + s:<20}" for s in stages) + f"  {'total':>13}"
    lines = [head, "-" * len(head)]
    for st in students:
        cells, total, most = [], 0.0, 0.0
        for s in stages:
            r = by[(st, s)]
            total += r["score"]
            most += r["max_score"]
            cells.append(f"{r['score']:>6.1f}/{r['max_score']:<4g} {r['status']:<8}")
        lines.append(f"{st:<{w}}  " + "  ".join(f"{c:>20}" for c in cells) + f"  {f'{total:.1f}/{most:g}':>13}")
    problems = [r for r in rows if r["status"] != "pass"]
    if problems:
        lines += ["", "problems:"]
        lines += [f"  {r['student']} {r['stage']}: {r['message']}" for r in problems]
    m = report["meta"]
    lines += ["", f"device: {m['device']}; op time: "
              + ", ".join(f"stage {k} {v}" for k, v in m["op_time"].items())
              + f"; memory guard: {m['memory_guard']}; seed {m['seed']}"]
    return "\n".join(lines)

