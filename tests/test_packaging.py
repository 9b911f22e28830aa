"""pyproject.toml and environment.yml must ask for the same packages with the same pins."""

import re
import sys
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$")


def _parse(req: str) -> tuple[str, str]:
    req = req.split(";")[0].strip()
    m = NAME.match(req)
    return m.group(1).lower().replace("_", "-"), m.group(3).replace(" ", "")


# what the conda environment holds besides the core: the students' JupyterLab, the test tools, the course staff's
# cluster grading (dask-cuda where it installs: Linux, Python 3.11+)
ENV_EXTRAS = ("lab", "dev", "cluster")


def _pyproject() -> dict[str, str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [r for r in meta["dependencies"] if "python_version" not in r]  # back-ports are pip-only
    for extra in ENV_EXTRAS:
        reqs += meta["optional-dependencies"][extra]
    return dict(_parse(r) for r in reqs)


def _environment() -> dict[str, str]:
    """conda's packages, and those its ``pip:`` section installs (a package conda-forge names differently) but
    the kit itself (``-e .``)."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    deps = [d for d in env["dependencies"] if isinstance(d, str)]
    deps = [d for d in deps if not d.startswith(("python", "pip")) or d.startswith("python-")]
    pip = [d for section in env["dependencies"] if isinstance(section, dict) for d in section.get("pip", [])]
    deps += [d for d in pip if not d.startswith(("-", "."))]
    return dict(_parse(d) for d in deps)


def test_same_packages_and_pins():
    py, conda = _pyproject(), _environment()
    assert set(py) == set(conda), f"only in pyproject: {set(py) - set(conda)}; only in environment.yml: " \
                                  f"{set(conda) - set(py)}"
    diff = {k: (py[k], conda[k]) for k in py if py[k] != conda[k]}
    assert not diff, f"pins differ (pyproject, environment.yml): {diff}"


def test_numpy_pinned_below_2_5_for_numba():
    spec = _pyproject()["numpy"]
    assert "<2.5" in spec, f"numpy must stay below 2.5 while numba needs it; pyproject says {spec!r}"


@pytest.mark.parametrize("extra,cupy", [("cuda12", "cupy-cuda12x"), ("cuda13", "cupy-cuda13x")])
def test_gpu_extras_match_cuda_major(extra, cupy):
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [_parse(r)[0] for r in meta["optional-dependencies"][extra]]
    assert cupy in names and "numba-cuda" in names
    assert any(f"[cu{extra[-2:]}]" in r for r in meta["optional-dependencies"][extra])


def test_students_get_jupyterlab_from_the_lab_extra_the_readme_installs():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "jupyterlab" in [_parse(r)[0] for r in meta["optional-dependencies"]["lab"]]
    readme = (REPO / "README.md").read_text()
    assert re.search(r'pip install -e "\.\[[a-z,]*\blab\b[a-z,]*\]".*labkit lab', readme), \
        "the README's student command installs the lab extra and runs labkit lab"
