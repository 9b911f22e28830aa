"""The result channel between the grader (parent) and its child, and the words both sides use on it.

The kinds of message are defined once, here, and imported by both processes: a kind renamed on one side then
fails at once on the other (``Kind("...")`` raises) instead of never matching again.

A frame is ``MAGIC``, ``HEADER`` (uint32 length of a JSON header, uint64 length of an optional ``.npz`` payload),
then the two; the header's ``"type"`` is a ``Kind``. The child writes frames on a pipe the parent opened (never
stdout, where a student's prints go); the parent answers one ``Answer`` line on the child's stdin after the
loading, after each check (stop: the rest of a failing layer is skipped), after the checks and after the accuracy
runs. (The child keeps its stdin for these answers; the student's code gets an empty one.)
"""

from __future__ import annotations

import enum
import io
import json
import struct

import numpy as np

MAGIC = b"LKG1"
HEADER = struct.Struct("<4sIQ")
MAX_HEADER = 16 << 20
MAX_PAYLOAD = 4 << 30


class Kind(str, enum.Enum):
    """What a frame says, in the order a job sends them."""

    HELLO = "hello"  # started: device, pid, and where labkit was imported from (its private copy)
    PHASE = "phase"  # what it does now (loading, timing the reference): for a timeout's message
    REFERENCE = "reference"  # the reference solution's timed passes
    LOAD_ERROR = "load_error"  # the student's kernel cells did not load: nothing else follows
    LOADED = "loaded"  # the student's VARIANTS as found, what is wrong with them, what the own-kernels scan found;
    # the parent answers: continue to the checks, or stop
    START = "start"  # one call into the student's code begins (names it for a timeout's message)
    CASE = "case"  # a check's raw output (or the error it raised, or a race); the parent answers continue/stop
    CHECKS_DONE = "checks_done"  # the parent answers: continue to the accuracy runs, or stop
    TECHNIQUE = "technique"  # does the timed variant's conv use the stage's memory (labkit.check.check_technique)
    ACCURACY = "accuracy"  # one accuracy run's class probabilities
    ACCURACY_DONE = "accuracy_done"  # the parent answers: continue to the timing, or stop
    TIMING = "timing"  # the student's timed passes (and each pass's predictions)
    TAMPERED = "tampered"  # the snapshot differed after a call into the student's code: what changed, and when
    GRADER_ERROR = "grader_error"  # the child's own failure (or the reference's): not the student's fault
    DONE = "done"  # the last frame

    def __str__(self) -> str:
        return self.value


class Answer(str, enum.Enum):
    CONTINUE = "continue"
    STOP = "stop"

    def __str__(self) -> str:
        return self.value


def encode(kind: Kind, meta: dict | None = None, arrays: dict[str, np.ndarray] | None = None, *,
           _savez=np.savez, _dumps=json.dumps) -> bytes:
    """One frame. (numpy and json are bound when this module is imported, before any student code runs.)"""
    head = _dumps({**(meta or {}), "type": Kind(kind).value}, default=str).encode()
    payload = b""
    if arrays:
        buf = io.BytesIO()
        _savez(buf, **arrays)
        payload = buf.getvalue()
    return HEADER.pack(MAGIC, len(head), len(payload)) + head + payload


def parse(buf: bytearray) -> tuple[list[tuple[Kind, dict, bytes]], str | None]:
    """Complete frames at the front of ``buf`` (consumed); an error string if the stream is not frames."""
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
