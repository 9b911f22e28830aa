"""The channel between the grader (parent) and its child, and every object that crosses it, defined once here and
imported by both processes.

Parent -> child: a ``JobSpec`` (JSON, one line on the child's stdin; its arrays in an ``.npz`` file), then one
``Answer`` line after the loading, after each check (stop: the rest of a failing layer is skipped), after the checks
and after the accuracy runs. Child -> parent: frames on a pipe the parent opened (never stdout, where a student's
prints go), each a message dataclass below (``Hello``, ``CaseResult``, ...) with optional arrays. A variant crosses
in one form only, ``VariantSpec``: what the stage's solution declares (the parent never imports a kernel).

A frame is ``MAGIC``, ``HEADER`` (uint32 length of a JSON header, uint64 length of an optional ``.npz`` payload),
then the two; the header's ``"type"`` is a ``Kind``. ``to_json``/``from_json`` are the one conversion, shared by
both sides: a message renamed on one side fails at once on the other (``Kind("...")`` raises) instead of never
matching again, and a field of the wrong type is refused when it is read (``ProtocolError``).
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import struct
import typing
from typing import ClassVar

import numpy as np

MAGIC = b"LKG1"
#: the file in a job's scratch folder that holds the name of the kernel the child launched last on a GPU: a job that
#: hangs in a kernel sends nothing more, and its row names the kernel from there
LAST_LAUNCH = ".labkit_last_launch"
HEADER = struct.Struct("<4sIQ")
MAX_HEADER = 16 << 20
MAX_PAYLOAD = 4 << 30


class Kind(str, enum.Enum):
    """What a frame says, in the order a job sends them."""

    HELLO = "hello"  # started: device, pid, where labkit was imported from (its private copy), the versions it
    # imports (a probe child sends this frame and DONE only: labkit.grading.child_start.probe)
    PHASE = "phase"  # what it does now (loading, timing the reference): for a timeout's message; a phase's start
    LOAD_ERROR = "load_error"  # the student's kernel cells did not load: nothing else follows
    LOADED = "loaded"  # the student's VARIANTS as found, what is wrong with them, what the own-kernels scan found;
    # the parent answers: continue to the checks, or stop
    START = "start"  # one call into the student's code begins (names it for a timeout's message)
    CASE = "case"  # a check's raw output (or the error it raised, or a race); the parent answers continue/stop
    CHECKS_DONE = "checks_done"  # the parent answers: continue to the accuracy runs, or stop
    TASK = "task"  # one call of a task the grader checks on its own (stage 10's graph replay, its pipeline): raw
    # results; the parent answers continue/stop (a failing task's other calls are skipped)
    TECHNIQUE = "technique"  # how the timed variant's conv uses the stage's memory (labkit.check.check_technique)
    ACCURACY = "accuracy"  # one accuracy run's class probabilities
    ACCURACY_DONE = "accuracy_done"  # the parent answers: continue to the timing, or stop
    TURN = "turn"  # the timed phase asks for its turn (labkit.grading.turns: every other job stopped); the parent
    # answers once it holds it
    PASS = "pass"  # a timed pass asks for its images: the parent writes them only now, and answers
    TIMING = "timing"  # the student's timed passes (and each pass's predictions)
    TAMPERED = "tampered"  # the snapshot differed after a call into the student's code: what changed, and when
    GRADER_ERROR = "grader_error"  # the child's own failure (or the reference's): not the student's fault
    DONE = "done"  # the last frame

    def __str__(self) -> str:
        return self.value


class Answer(str, enum.Enum):
    CONTINUE = "continue"
    STOP = "stop"
    SKIP = "skip"  # after the accuracy runs: no timing, but the phases after it (the technique) still

    def __str__(self) -> str:
        return self.value


class ProtocolError(ValueError):
    """A message whose fields are missing or of the wrong type."""


# ------------------------------------------------------------------------------------------ records


def _convert(tp, value, where: str):
    """``value`` (from JSON) as the annotated type ``tp``: nested records, lists, tuples, dicts, optionals."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return value
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if isinstance(tp, type) and issubclass(tp, Record):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return tp.from_json(value)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        item = args[0] if args else typing.Any
        out = [_convert(item, v, where) for v in value]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        kt, vt = args or (typing.Any, typing.Any)
        return {k: _convert(vt, v, where) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"{where}: expected a number, got {value!r:.40}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {value!r:.40}")
        return value
    return value


class Record:
    """A dataclass that crosses the pipe: ``to_json()`` (plain JSON types) and ``from_json(d)`` (checked)."""

    def to_json(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    @classmethod
    def from_json(cls, d: dict):
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                kwargs[f.name] = _convert(hints[f.name], d[f.name], f"{cls.__name__}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{cls.__name__}: no {f.name!r}")
        return cls(**kwargs)


# ------------------------------------------------------------------------------------ parent -> child


@dataclasses.dataclass
class VariantSpec(Record):
    """A graded variant as the solution declares it (``worker --describe``), whatever a student's ``VARIANTS`` says."""

    name: str
    target: str
    arrays: str
    per_image: bool
    nets: tuple[str, ...]
    layers: dict[str, list[str]]  # net -> the layers this variant has a function for
    own: dict[str, list[str]] | None = None  # net -> the layers whose function is the notebook's own (not given
    # code of the kit or of an earlier stage): those are checked layer by layer; None: every layer
    fuse: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    note: str = ""
    unavailable: str = ""  # why it cannot run here ("" when it can)

    def differences(self, declared: dict) -> list[str]:
        """How a student's own declaration (``LoadedVariant``-style dict) differs in what the grading depends on."""
        return [f"{k}={getattr(self, k)!r} (your VARIANTS says {declared.get(k)!r})"
                for k in ("target", "arrays", "per_image") if k in declared and declared.get(k) != getattr(self, k)]


@dataclasses.dataclass
class CaseSpec(Record):
    """One check: a layer (``layer``: its fields) or the whole net (``net``) of a variant, on arrays in the npz."""

    id: int
    variant: str
    batch: int
    what: str  # "conv1", "cifar10 forward"
    net_name: str
    x: str
    weights: dict[str, str]  # weight name -> array key
    layer: dict | None = None
    net: str | None = None
    # an earlier case of the same function whose input arrays (x, w, b; a net's weights) the child keeps until this
    # case, then frees and puts this case's where they were (labkit.freed): what was kept by their id() answers wrong
    lands_on: int | None = None


@dataclasses.dataclass
class TaskCallSpec(Record):
    """One call of a task with a check of its own (``labkit.tasks``): ``graph`` calls ``function(variant, wl,
    lane)()`` on the images ``x``; ``pipeline`` runs ``function(job, raw, classes, chunk, streams)`` on ``images``
    bytes drawn from ``seed`` (``labkit.whole.run_pipeline``; the grader draws the same bytes for its answers).
    ``variant`` names given code ("09 tuned_cifar10"); ``net`` the net (shrunk on the simulator)."""

    id: int
    task: str
    check: str
    function: str
    variant: str
    net: str
    weights: dict[str, str]
    x: str = ""
    images: int = 0
    seed: int = 0
    chunk: int = 0
    streams: int = 0
    fresh_call: bool = True  # graph: a new function(variant, wl, lane) before this call (else the last one replayed)


@dataclasses.dataclass
class WorkloadSpec(Record):
    net: str
    x: str
    weights: dict[str, str]


@dataclasses.dataclass
class AccuracySpec(Record):
    id: str
    variant: str
    workload: str


@dataclasses.dataclass
class TimingSpec(Record):
    """``warmup`` untimed passes on one image, then ``repeat`` timed ones, pass k on images the parent writes to
    ``pass_inputs.format(attempt=a, k=k)`` only when the pass asks (``PassImages``): nothing earlier reaches them."""

    variant: str
    workload: str  # the weights (and the warm-up image) come from here
    warmup: int
    repeat: int
    attempts: int = 1  # turns at most: the parent answers each attempt with another (a slow core) or enough
    pass_inputs: str = ""


@dataclasses.dataclass
class TechniqueSpec(Record):
    memory: str
    net: str
    layer: str
    min_fraction: float = 0.0  # of the conv's loads that must come from that memory (simulator counts)
    variant: str = ""  # whose conv is looked at (the plan names it: rubric technique.variant, else the timed one)


@dataclasses.dataclass
class JobSpec(Record):
    """Everything one child is told: the notebook it grades, the checks, accuracy runs and timed passes."""

    stage: str
    notebook: str
    inputs: str
    variants: dict[str, VariantSpec]
    nets: dict[str, dict]
    workloads: dict[str, WorkloadSpec]
    fd: int = -1
    timed: str = ""
    cases: list[CaseSpec] = dataclasses.field(default_factory=list)
    accuracy: list[AccuracySpec] = dataclasses.field(default_factory=list)
    timing: TimingSpec | None = None
    technique: TechniqueSpec | None = None
    tasks: list[TaskCallSpec] = dataclasses.field(default_factory=list)
    tuning: str = ""  # the tuning choices (results/tuning.json) the grader read: the child reads the same
    own_layers: list[str] = dataclasses.field(default_factory=lambda: ["conv"])  # kinds scanned and traced
    memory_mb: int = 0
    memory_guard: str = "none"
    max_file_mb: int = 0


# ------------------------------------------------------------------------------------ child -> parent


@dataclasses.dataclass
class Message(Record):
    """A frame's header; ``KIND`` says which."""

    KIND: ClassVar[Kind]


def _message(kind: Kind):
    def register(cls):
        cls.KIND = kind
        MESSAGES[kind] = cls
        return cls

    return register


MESSAGES: dict[Kind, type] = {}


@_message(Kind.HELLO)
@dataclasses.dataclass
class Hello(Message):
    device: str
    kind: str
    simulated: bool
    pid: int
    labkit: str  # where the child imported labkit from
    # the versions of numpy, numba, numba-cuda, cupy and labkit the child imports, and the folders they come from
    # (labkit.grading.environment.imported): the parent compares them with its own before anything is graded
    versions: dict[str, str | None] = dataclasses.field(default_factory=dict)
    origins: dict[str, str] = dataclasses.field(default_factory=dict)


@_message(Kind.PHASE)
@dataclasses.dataclass
class Phase(Message):
    what: str
    step: str = ""  # the job's phase that begins now (labkit.grading.phases.PHASES): where its seconds go


@_message(Kind.START)
@dataclasses.dataclass
class Start(Message):
    what: str


@_message(Kind.LOAD_ERROR)
@dataclasses.dataclass
class LoadError(Message):
    message: str
    forbidden: list[str] = dataclasses.field(default_factory=list)


@_message(Kind.LOADED)
@dataclasses.dataclass
class Loaded(Message):
    variants: dict[str, dict]  # name -> the student's own declaration (target, arrays, per_image, impls)
    problems: dict[str, str]
    forbidden: list[str]


@dataclasses.dataclass
class Trace(Record):
    """What the traced conv calls of one check did: library routines, launches by whose kernels."""

    calls: int
    library: list[list[str]]  # [layer, routine]
    without_own_launch: list[str]
    launches: dict[str, int]
    given_only: list[str] = dataclasses.field(default_factory=list)  # launched given kernels, none of the student's


@_message(Kind.CASE)
@dataclasses.dataclass
class CaseResult(Message):
    id: int
    skipped: bool = False
    error: str | None = None
    race: str | None = None
    launches: int | None = None
    trace: Trace | None = None
    # the output's NaN elements by cause, as labkit.engine.NanCauses counts them (re-runs on finite fills of out);
    # None where the output held no NaN or the diagnosis claimed nothing
    nan_unwritten: int | None = None  # never written
    nan_added: int | None = None  # added onto out's initial contents
    nan_read: int | None = None  # computed from data never written


@_message(Kind.CHECKS_DONE)
@dataclasses.dataclass
class ChecksDone(Message):
    emulated: int = 0  # CUDA C launches the checks ran on the CPU emulation (labkit.cudacpu)


@_message(Kind.TECHNIQUE)
@dataclasses.dataclass
class Technique(Message):
    passed: bool
    line: str
    fraction: float | None = None


@_message(Kind.ACCURACY)
@dataclasses.dataclass
class AccuracyResult(Message):
    id: str
    error: str | None = None
    trace: Trace | None = None


@_message(Kind.ACCURACY_DONE)
@dataclasses.dataclass
class AccuracyDone(Message):
    pass


@_message(Kind.TASK)
@dataclasses.dataclass
class TaskResult(Message):
    """One task call's raw result (the array ``out``: probabilities or classes), or the error it raised."""

    id: int
    error: str | None = None
    skipped: bool = False


@_message(Kind.TURN)
@dataclasses.dataclass
class Turn(Message):
    what: str = "timing"


@_message(Kind.PASS)
@dataclasses.dataclass
class PassImages(Message):
    """Pass ``k`` of timing attempt ``attempt`` asks for its images."""
    attempt: int = 0
    k: int = 0


@_message(Kind.TIMING)
@dataclasses.dataclass
class Timing(Message):
    """The timed passes: per pass, each layer's seconds and the whole pass's (``"pass"``); the arrays ``probK``."""
    runs: list[dict[str, float]] = dataclasses.field(default_factory=list)
    method: str = ""
    error: str | None = None
    trace: Trace | None = None
    quiet_s: float = 0.0  # on a GPU, how long the turn waited for work the stopped jobs had queued to drain
    probe: dict = dataclasses.field(default_factory=dict)  # the probes' samples, before and after (``timed``)
    attempt: int = 0  # of the timing's attempts (``timed``, ``attempts``)


@_message(Kind.TAMPERED)
@dataclasses.dataclass
class Tampered(Message):
    what: list[str]
    count: int
    when: str


@_message(Kind.GRADER_ERROR)
@dataclasses.dataclass
class GraderError(Message):
    message: str
    traceback: str = ""
    resource: bool = False  # the grader's own machinery ran out of a resource (threads): a retry may pass


@_message(Kind.DONE)
@dataclasses.dataclass
class Done(Message):
    pass


# ------------------------------------------------------------------------------------------- frames


def encode(message: Message, arrays: dict[str, np.ndarray] | None = None, *, _savez=np.savez,
           _dumps=json.dumps) -> bytes:
    """One frame. (numpy and json are bound when this module is imported, before any student code runs.)"""
    head = _dumps({**message.to_json(), "type": message.KIND.value}, default=str).encode()
    payload = b""
    if arrays:
        buf = io.BytesIO()
        _savez(buf, **arrays)
        payload = buf.getvalue()
    return HEADER.pack(MAGIC, len(head), len(payload)) + head + payload


def parse(buf: bytearray) -> tuple[list[tuple[Kind, dict, bytes]], str | None]:
    """Complete frames at the front of ``buf`` (consumed); an error string if the stream is not frames. Each
    frame's header becomes its message with ``decode``."""
    frames = []
    while len(buf) >= HEADER.size:
        magic, hlen, plen = HEADER.unpack_from(buf)
        if magic != MAGIC or hlen > MAX_HEADER or plen > MAX_PAYLOAD:
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
        try:
            kind = Kind(meta["type"])
        except ValueError:
            return frames, f"an unknown message {meta['type'][:40]!r} on the result channel"
        frames.append((kind, meta, bytes(buf[HEADER.size + hlen:end])))
        del buf[:end]
    return frames, None


def decode(kind: Kind, meta: dict) -> Message:
    """A frame's header as its message; ``ProtocolError`` when a field is missing or of the wrong type."""
    return MESSAGES[Kind(kind)].from_json(meta)


def read_array(payload: bytes, key: str) -> np.ndarray | None:
    """The array ``key`` of a frame's payload; None when it is missing or unreadable."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            return z[key] if key in z.files else None
    except Exception:  # noqa: BLE001 - anything unreadable is judged as missing
        return None


def read_answer(stdin) -> Answer:
    """The parent's next answer; anything else (end of input included) means stop."""
    try:
        return Answer(stdin.readline().strip())
    except ValueError:
        return Answer.STOP
