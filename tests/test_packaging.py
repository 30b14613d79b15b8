"""The declared support range, the CI stacks and the README's "Tested with" table agree."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project needs 3.11
    pytest.skip("tomllib needs Python 3.11", allow_module_level=True)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
STACKS = json.loads((ROOT / ".ci" / "stacks.json").read_text(encoding="utf-8"))


def _minimums() -> dict[str, str]:
    """The lowest version pyproject allows for each project it names (``name>=x``)."""
    project = PYPROJECT["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    out: dict[str, str] = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec)
        if m:
            name = m.group(1).lower().replace("-", "_")
            assert out.get(name, m.group(2)) == m.group(2), f"{name}: two minimums"
            out[name] = m.group(2)
    return out


def test_oldest_stack_is_exactly_the_declared_minimums():
    oldest = dict(p.split("==") for p in STACKS["oldest"]["pins"])
    minimums = _minimums()
    for name, version in oldest.items():
        declared = minimums[name.lower().replace("-", "_")]
        # the pin is a release of exactly that minimum, e.g. >=2.3 tested as 2.3.1
        assert tuple(map(int, version.split(".")[:len(declared.split("."))])) == \
            tuple(map(int, declared.split("."))), (name, version, declared)
    assert PYPROJECT["project"]["requires-python"] == f">={STACKS['oldest']['python']}"
    # every minimum, the test tools' too, is what the oldest stack installs
    pinned = {name.lower().replace("-", "_") for name in oldest}
    assert set(minimums) - pinned == set(), set(minimums) - pinned


def test_readme_tested_with_lists_every_stack():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Tested with", 1)[1].split("\n## ", 1)[0]
    for name, stack in STACKS.items():
        if name.startswith("_"):
            continue
        row = next((line for line in section.splitlines() if line.startswith(f"| {name} ")), None)
        assert row is not None, f"README 'Tested with' has no row for {name}"
        assert f"Python {stack['python']}" in row
        for pin in stack["pins"]:
            dist, version = pin.split("==")
            assert f"{dist} {version}" in row, (name, pin, row)


def test_wheel_build_configuration():
    cibw = PYPROJECT["tool"]["cibuildwheel"]
    assert cibw["build"] == "cp311-* cp312-* cp313-*" and "smoke.py" in cibw["test-command"]
    workflow = (ROOT / ".github" / "workflows" / "wheels.yml").read_text(encoding="utf-8")
    assert "pypa/cibuildwheel" in workflow and "windows" in workflow and "macos" in workflow


def test_readme_figures_are_the_published_run():
    """The README's per-call figures are those of benchmarks/results.json (the run that
    wrote BENCHMARKS.md), not figures typed in by hand."""
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    rows = {r["name"]: r["median"] for r in results["suites"]["to_jax"]["rows"]}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines()
                if line.startswith("| per call, 32×32 float32 NumPy"))
    shown = [float(v) for v in re.findall(r"([0-9.]+) µs", line)]
    expected = [rows["from_dlpack(x)"], rows["from_dlpack(x16)"], rows["to_jax(x)"],
                rows["to_jax(x16)"]]
    assert shown == [float(f"{v:.3g}") for v in expected], (shown, expected)


def test_readme_summary_is_the_published_run():
    """The README's table of every benchmark target is rendered from
    benchmarks/results.json (python scripts/figures.py), not typed in by hand."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "figures.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, ("README.md's figures differ from benchmarks/results.json: "
                                  "run python scripts/figures.py", proc.stderr)


def test_version_is_written_once():
    """The version is written in python/dlinspect/__init__.py only; the build reads it
    there, so the installed metadata and dlinspect.__version__ agree."""
    import importlib.metadata

    import dlinspect
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert importlib.metadata.version("dlinspect") == dlinspect.__version__
