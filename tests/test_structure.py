"""The package's structure (docs/design.md, "Layout"): the import contract (import-linter's layers and acyclic
siblings, configured in pyproject.toml), imports of labkit's own modules at module level, the bounds on the size of
modules and functions, the layout table of the design page, and the old module names that notebooks and submissions
use (``labkit.about.MOVED``)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import labkit
from labkit import about

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "labkit"

#: the bounds (issue 34): modules at labkit/'s root, lines of the largest module and function, labkit modules
#: imported inside functions
ROOT_MODULES, MODULE_LINES, FUNCTION_LINES, FUNCTION_IMPORTS = 12, 500, 60, 25
#: labkit modules a function may import late, by (file, module), with the reason. Any other late import of a labkit
#: module hides a circle, or a dependency the layers do not show; numba.cuda and heavy optional packages (cupy,
#: torch, matplotlib, distributed) are not labkit's and may stay late.
_RELEASE = "a student release leaves it out (leave_out.LEAVE_OUT): the command says so in one line"
LATE_IMPORTS: dict[tuple[str, str], str] = {
    ("labkit/cli.py", "labkit.grading"): _RELEASE,
    ("labkit/cli.py", "labkit.ladder.bench"): _RELEASE,
    ("labkit/cli.py", "labkit.ladder.benchdoc"): _RELEASE,
    ("labkit/cli.py", "labkit.course.release"): _RELEASE,
    ("labkit/lessons/scene_cases.py", "labkit.core.whole"): "a student release up to milestone 04 leaves it out: "
                                                            "only stage 10's pipeline picture needs it",
    ("labkit/core/whole.py", "labkit.core.job_graphs"): "a student release leaves it out (stage 10's task 2): "
                                                        "there Job launches every time",
}
#: modules and functions still above the bounds, each held at its length today: a ceiling that may only go down
#: (split one and take it off this list; a new one over the bound fails)
LONG_MODULES = {
}
LONG_FUNCTIONS = {
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(modules: dict[str, Path], name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The labkit modules (or packages) an import statement of module ``name`` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "labkit"]
    if node.level:
        base = name.split(".") if modules[name].name == "__init__.py" else name.split(".")[:-1]
        target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "labkit":
        return []
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]


def _function_imports() -> list[str]:
    """"labkit/x/y.py:LINE -> labkit.z" for each labkit module imported inside a function."""
    modules, found = _modules(), []
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        inner = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if id(node) in inner:
                found += [f"{path.relative_to(REPO)}:{node.lineno} -> {t}" for t in _targets(modules, name, node)]
    return sorted(set(found))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _functions() -> dict[str, int]:
    out = {}
    for path in _modules().values():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(REPO)}:{fn.name}"
                out[key] = max(out.get(key, 0), fn.end_lineno - fn.lineno + 1)
    return out


# ------------------------------------------------------------------------------------------- the contract


def test_the_import_contract_is_kept():
    """import-linter (the dev extra) checks pyproject.toml's contracts: labkit in layers, no circle at any depth."""
    try:
        import importlinter.cli  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed: it is in the dev extra (pip install -e '.[dev]')")
    run = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                          "sys.exit(lint_imports_command())"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"Contracts: (\d+) kept, 0 broken", run.stdout), run.stdout[-2000:]


def test_the_contract_names_every_layer_of_the_design():
    """The layers contract lists the design's layers, top to bottom, and nothing else (exhaustive)."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    assert layers["exhaustive"] and layers["containers"] == ["labkit"]
    named = {part.strip() for layer in layers["layers"] for part in layer.split("|")}
    children = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | \
        {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert named == children


def test_labkit_modules_are_imported_at_module_level():
    late = [line for line in _function_imports()
            if (line.split(":")[0], line.split(" -> ")[1]) not in LATE_IMPORTS]
    assert not late, "imports of labkit modules inside functions (move them to the top of the module, or break " \
                     "the circle they hide):\n" + "\n".join(late)


# --------------------------------------------------------------------------------------------- the bounds


def test_the_package_keeps_its_bounds():
    root = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(root) <= ROOT_MODULES, root
    assert len(_function_imports()) <= FUNCTION_IMPORTS
    assert len(LATE_IMPORTS) <= FUNCTION_IMPORTS


def test_no_module_grows_past_its_ceiling():
    lines = {str(p.relative_to(REPO)): _lines(p) for p in _modules().values()}
    over = {m: n for m, n in lines.items() if n > LONG_MODULES.get(m, MODULE_LINES)}
    assert not over, f"modules over {MODULE_LINES} lines (or over their ceiling in LONG_MODULES): {over}"
    gone = {m: n for m, n in LONG_MODULES.items() if lines.get(m, 0) <= MODULE_LINES}
    assert not gone, f"within the bound now: take these off LONG_MODULES: {gone}"


def test_no_function_grows_past_its_ceiling():
    lengths = _functions()
    over = {f: n for f, n in lengths.items() if n > LONG_FUNCTIONS.get(f, FUNCTION_LINES)}
    assert not over, f"functions over {FUNCTION_LINES} lines (or over their ceiling in LONG_FUNCTIONS): {over}"
    gone = {f: n for f, n in LONG_FUNCTIONS.items() if lengths.get(f, 0) <= FUNCTION_LINES}
    assert not gone, f"within the bound now: take these off LONG_FUNCTIONS: {gone}"


# ------------------------------------------------------------------------------------ the design's table


def _layout_table() -> list[tuple[str, str]]:
    """docs/design.md's table of layers: (concern, path) rows."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("## 4. Layout", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\|[^|\n]*\| *([^|\n]+?) *\| *`([^`]+)` *\|$", section, re.M)


def test_every_path_the_design_names_exists():
    rows = _layout_table()
    assert len(rows) >= 10, rows
    missing = [path for _, path in rows if not (REPO / path).exists()]
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_every_subpackage_and_root_module_is_in_the_design():
    named = {path.rstrip("/") for _, path in _layout_table()}
    children = {str(p.relative_to(REPO)) for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | \
        {str(p.parent.relative_to(REPO)) for p in PACKAGE.glob("*/__init__.py")}
    assert children <= named, children - named


# -------------------------------------------------------------------------------------------- old names


@pytest.mark.parametrize("old", sorted(about.MOVED))
def test_every_old_module_name_is_the_moved_module(old):
    """lk.gpu, from labkit import gpu, import labkit.gpu: one module object, so a patch through either name is seen
    through both."""
    moved = importlib.import_module(f"labkit.{about.MOVED[old]}")
    assert importlib.import_module(f"labkit.{old}") is moved
    assert sys.modules[f"labkit.{old}"] is moved
    if old != "show":  # lk.show is the function; its module is labkit.show all the same
        assert getattr(labkit, old) is moved
    assert about.old_name(moved.__name__) == f"labkit.{old}"
    exec(f"from labkit.{old} import __name__ as got", scope := {})
    assert scope["got"] == moved.__name__


def test_old_names_of_submodules_and_the_surface():
    from labkit.cudacpu.compiler import find_compiler
    from labkit.gpu import launch

    import labkit.simulator

    assert find_compiler is labkit.launch.cudacpu.compiler.find_compiler
    assert launch is labkit.launch.gpu.launch and labkit.simulator.threads is labkit.launch.simulator.threads
    assert callable(labkit.show) and callable(labkit.show.failure) and labkit.from_stage is labkit.stages.from_stage
    with pytest.raises(AttributeError):
        labkit.no_such_module  # noqa: B018


def test_every_subpackage_is_installed():
    """pyproject.toml's package list names every package under labkit/ (an editable install hides a missing one)."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py")
             if "__pycache__" not in p.parts}
    assert listed == found


#: class names that several modules define with one meaning: each of the kit's own kernels has its compile-time
#: choices (Config) and a layer's launch of it (Plan)
SHARED_CLASS_NAMES = {"Config": "a kernel's compile-time choices", "Plan": "how a layer launches the kernel"}


def test_one_meaning_per_class_name():
    """A public class name names one thing in the package (the review found three classes called Job); a name that
    several kernels share for the same role is listed above with that role."""
    where: dict[str, list[str]] = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(name)
    twice = {c: m for c, m in where.items() if len(m) > 1 and c not in SHARED_CLASS_NAMES}
    assert not twice, f"class names defined in more than one module: {twice}"
    gone = [c for c in SHARED_CLASS_NAMES if len(where.get(c, ())) < 2]
    assert not gone, f"take these off SHARED_CLASS_NAMES: {gone}"
