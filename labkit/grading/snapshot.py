"""What the grader's child relies on, saved before any student code exists: put back before every call into the
student's code, and compared after every one of them (docs/grading.md, "Tampering").

``restore()`` makes a patch made by a student's cell harmless; ``changes()`` names it, so that it is reported
(status ``tampered``) instead of silently undone: a conv that swaps ``labkit.layers.impl_for`` in the middle of a
pass would otherwise skip the later layers of that pass before the next restore.
"""

from __future__ import annotations

import types

from ..about import old_name

#: names that change without anyone patching anything: warnings' registry of a module
IGNORED = frozenset({"__warningregistry__"})


def _label(obj, name: str) -> str:
    if isinstance(obj, types.ModuleType):
        return f"the grade worker's {name}" if obj.__name__ == "__main__" else f"{old_name(obj.__name__)}.{name}"
    return f"{old_name(str(obj.__module__))}.{obj.__qualname__}.{name}"


class Snapshot:
    """Every attribute of the given modules and classes as it is now. ``prune``: attributes added later are removed
    (a module global can shadow a builtin); packages are not pruned (importing a submodule adds an attribute)."""

    def __init__(self, namespaces: list[tuple[object, bool]]):
        self.saved = [(obj, dict(vars(obj)), prune) for obj, prune in namespaces]

    def restore(self) -> None:
        for obj, attrs, prune in self.saved:
            now = vars(obj)
            for name, value in attrs.items():
                if name not in now or now[name] is not value:
                    setattr(obj, name, value)
            if prune:
                for name in [n for n in now if n not in attrs]:
                    delattr(obj, name)

    def changes(self) -> list[str]:
        """What differs from the snapshot: "labkit.layers.impl_for", "time.perf_counter" (replaced or removed),
        "labkit.engine.shortcut (added)"; submodules imported since are not changes."""
        out = []
        for obj, attrs, _ in self.saved:
            now = vars(obj)
            for name, value in attrs.items():
                if name in IGNORED:
                    continue
                if name not in now:
                    out.append(f"{_label(obj, name)} (removed)")
                elif now[name] is not value:
                    out.append(_label(obj, name))
            for name, value in now.items():
                if name in attrs or name in IGNORED:
                    continue
                if isinstance(value, types.ModuleType):
                    continue  # `import labkit.cudnn` adds labkit.cudnn: an import, not a patch
                out.append(f"{_label(obj, name)} (added)")
        return out
