"""The rubric: the shipped ``labkit/rubric.toml`` with an instructor's file read on top, every key checked.

Checked before any job starts, because a typo in a rubric would otherwise show up as a wrong score for every
student. Sizes that follow from the machine (the simulator's batch sizes and image counts) are not rubric keys:
they come from ``labkit.simulator``, the one place that sets them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..course.stages import STAGES
from ..course.tasks import own_phases
from ..model.nets import NETS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEFAULT_RUBRIC = Path(__file__).resolve().parent.parent / "rubric.toml"
SECTIONS = {
    "limits": {"time_s": (int, float), "sim_time_s": (int, float), "time_factor": (int, float),
               "min_time_s": (int, float), "memory_mb": int, "max_file_mb": int},
    "checks": {"batches": list, "tol": (int, float), "own_kernel": bool, "own_layers": list},
    "accuracy": {"images": int, "per_image": int},
    "timing": {"images": int, "warmup": int, "repeat": int, "attempts": int, "slow_core": (int, float),
               "paired": str},
    "points": {"correctness": (int, float), "accuracy": (int, float), "op_time": (int, float),
               "technique": (int, float)},
    "technique": {"memory": str, "net": str, "layer": str, "min_fraction": (int, float), "variant": str},
    "op_time": {"full_at_ratio": (int, float), "zero_at_ratio": (int, float), "requires_accuracy": bool,
                "when_not_measured": str},
}
OPTIONAL = {("checks", "batches"), ("checks", "own_layers"), ("accuracy", "per_image"), ("timing", "attempts"),
            ("timing", "slow_core"), ("technique", "variant")}
# absent: labkit.check.BATCHES; ["conv"]; every image; one attempt; 0.15; the timed variant
OWN_LAYERS = ("conv", "fc")  # layer kinds a stage may name as its own work (checks.own_layers)
STAGE_KEYS = {"variants": list, "timed_variant": str, "tasks": dict}  # tasks: a task's own points (labkit.tasks)
PAIRED = ("gpu", "always", "never")
NOT_MEASURED = ("exclude", "full", "zero")


class GradeError(Exception):
    """The grader's own problem (bad arguments, unreadable rubric, broken reference): the run cannot go on."""


class RubricError(GradeError):
    pass


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


def _check_values(where: str, label: str, r: dict) -> None:
    batches = r["checks"].get("batches")
    if batches is not None and (not batches or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                                        for b in batches)):
        raise RubricError(f"{where} ({label}): checks.batches must be a list of batch sizes >= 1")
    own = r["checks"].get("own_layers", ["conv"])
    if not own or not all(kind in OWN_LAYERS for kind in own):
        raise RubricError(f"{where} ({label}): checks.own_layers must list layer kinds among "
                          f"{', '.join(OWN_LAYERS)} (the stage's own work), e.g. [\"conv\"]")
    op = r["op_time"]
    if op["when_not_measured"] not in NOT_MEASURED:
        raise RubricError(f"{where} ({label}): op_time.when_not_measured must be one of {', '.join(NOT_MEASURED)}")
    if not 0 < op["full_at_ratio"] < op["zero_at_ratio"]:
        raise RubricError(f"{where} ({label}): need 0 < op_time.full_at_ratio < op_time.zero_at_ratio")
    if r["timing"]["repeat"] < 1 or r["timing"]["warmup"] < 0 or r["timing"]["images"] < 1 \
            or r["accuracy"]["images"] < 1 or r["accuracy"].get("per_image", 0) < 0:
        raise RubricError(f"{where} ({label}): image counts and timing.repeat must be >= 1, warmup >= 0")
    if r["timing"].get("attempts", 1) < 1 or not r["timing"].get("slow_core", 0.15) > -1:
        raise RubricError(f"{where} ({label}): timing.attempts must be >= 1 and timing.slow_core more than -1 "
                          f"(0.15: time again when the core ran 15 % slower than the fastest seen)")
    if r["timing"].get("paired", "gpu") not in PAIRED:
        raise RubricError(f"{where} ({label}): timing.paired must be one of {', '.join(PAIRED)} (the reference "
                          f"timed in each student's turn: on a GPU, always, or never)")
    memory = r["technique"]["memory"]
    if memory not in ("", "shared", "constant"):
        raise RubricError(f"{where} ({label}): technique.memory must be \"shared\", \"constant\" or \"\" (none)")
    if not 0 <= r["technique"]["min_fraction"] <= 1:
        raise RubricError(f"{where} ({label}): technique.min_fraction must be between 0 and 1")
    if memory:
        net = NETS.get(r["technique"]["net"])
        if net is None or r["technique"]["layer"] not in net.conv_layers:
            raise RubricError(f"{where} ({label}): technique.net and technique.layer must name a conv layer of a "
                              f"net (e.g. net = \"cifar10\", layer = \"conv2\")")
    if r["limits"]["time_s"] <= 0 or r["limits"]["sim_time_s"] <= 0 or r["limits"]["min_time_s"] <= 0:
        raise RubricError(f"{where} ({label}): time limits must be positive")
    if r["limits"]["time_factor"] < 0:
        raise RubricError(f"{where} ({label}): limits.time_factor must be 0 (the limit as given) or more")


def _check_tasks(where: str, number: str, table: dict) -> None:
    """``[stage."NN".tasks]``: points for the stage's tasks that have checks of their own."""
    names = [t.name for t in own_phases(number)]
    for name, points in table.items():
        if name not in names:
            raise RubricError(f"{where}: stage.\"{number}\".tasks.{name}: stage {number} has no task {name!r} graded "
                              f"apart" + (f" (it has {', '.join(names)})" if names else " (it has none)"))
        if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
            raise RubricError(f"{where}: stage.\"{number}\".tasks.{name} must be a number of points >= 0")


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
    missing = [f"{s}.{k}" for s, keys in SECTIONS.items() for k in keys
               if k not in raw.get(s, {}) and (s, k) not in OPTIONAL]
    if missing:
        raise RubricError(f"{where}: missing {', '.join(missing)}")
    if not isinstance(stages, dict):
        raise RubricError(f"{where}: [stage] must hold tables named by stage number, e.g. [stage.\"04\"]")
    for number, table in stages.items():
        if number not in STAGES:
            raise RubricError(f"{where}: [stage.\"{number}\"] names no stage; stages are {', '.join(STAGES)}")
        if not isinstance(table, dict):
            raise RubricError(f"{where}: [stage.\"{number}\"] must be a table")
        for key, value in table.items():
            if key in SECTIONS:
                _validate_section(f"{where} [stage.\"{number}\"]", key, value)
            elif key in STAGE_KEYS:
                if not isinstance(value, STAGE_KEYS[key]):
                    raise RubricError(f"{where}: stage.\"{number}\".{key} has the wrong type ({value!r})")
                if key == "tasks":
                    _check_tasks(where, number, value)
            else:
                raise RubricError(f"{where}: unknown key stage.\"{number}\".{key}")
    rubric = Rubric(raw, stages, sources)
    _check_values(where, "defaults", rubric.base)
    for number in stages:
        _check_values(where, f"stage {number}", rubric.for_stage(number))
    return rubric


def op_time_fraction(ratio: float, full_at: float, zero_at: float) -> float:
    """1 at or below ``full_at``, 0 at or above ``zero_at``, linear in between."""
    if ratio <= full_at:
        return 1.0
    if ratio >= zero_at:
        return 0.0
    return (zero_at - ratio) / (zero_at - full_at)
