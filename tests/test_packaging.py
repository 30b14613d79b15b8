"""The declared support range, the CI stacks, and the tables README.md and docs/ show of them
and of the published benchmark run, agree."""

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


def _block(path: Path, name: str) -> str:
    """The generated block ``name`` of a Markdown file, as written there."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    blocks = figures.blocks(path.read_text(encoding="utf-8"))
    assert name in blocks, f"{path.relative_to(ROOT)} has no generated block {name!r}"
    return blocks[name]


@pytest.mark.parametrize("page", ["README.md", "docs/reliability.md"])
def test_stacks_tables_are_the_ci_stacks(page):
    """What CI tests is shown as .ci/stacks.json says: one row per stack, its Python and
    every pin, and no other stack."""
    table = _block(ROOT / page, "stacks")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    stacks = {name: stack for name, stack in STACKS.items() if not name.startswith("_")}
    assert [row.split("|")[1].strip() for row in rows] == list(stacks), rows
    for row, (name, stack) in zip(rows, stacks.items()):
        cells = [c.strip() for c in row.split("|")]
        assert cells[2] == stack["python"], (name, row)
        assert cells[3] == ", ".join(p.replace("==", " ") for p in stack["pins"]), (name, row)
        assert f"scripts/stack.sh {name}" in row


def test_minimums_written_in_prose_are_the_declared_ones():
    """"Python 3.11 or newer", "torch 2.3 or newer" in README and docs are what
    pyproject.toml declares."""
    python = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    torch = _minimums()["torch"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    seen = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for name, version in re.findall(r"\b(Python|torch) (\d+\.\d+(?:\.\d+)?) or newer", text):
            seen += 1
            assert version == (python if name == "Python" else torch), (page.name, name, version)
    assert seen >= 3


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
    compare = _block(ROOT / "README.md", "compare")
    line = next(line for line in compare.splitlines() if line.startswith("| per call, 32×32"))
    shown = [float(v) for v in re.findall(r"([0-9.]+) µs", line)]
    expected = [rows["from_dlpack(x)"], rows["from_dlpack(x16)"], rows["to_jax(x)"],
                rows["to_jax(x16)"]]
    assert shown == [float(f"{v:.3g}") for v in expected], (shown, expected)
    speed = _block(ROOT / "README.md", "speed")
    assert (f"| 32×32 float32 torch tensor | `jax.dlpack.from_dlpack` | "
            f"{rows['from_dlpack(t)']:.3g} µs | {rows['to_jax(t)']:.3g} µs |") in speed
    assert f"{rows['tree_map(from_dlpack, d)']:.3g} µs" in speed
    assert results["versions"]["jax"] in speed and results["machine"] in speed


def test_bench_estimates_are_the_published_runs_seconds():
    """What `dlinspect bench` says a full run of each suite takes is the time that suite
    took in the published run (rounded up, within 20%), not a guess: an estimate of 30 min
    for a suite that took an hour is a wrong promise."""
    from dlinspect.bench import TYPICAL_SECONDS
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8"))
    assert not results["quick"]
    for name, suite in results["suites"].items():
        took = suite["seconds"]
        assert took <= TYPICAL_SECONDS[name][1] <= 1.2 * took + 10, (name, took)


def test_generated_blocks_are_their_sources():
    """Every generated block of README.md and docs/ is what scripts/figures.py renders from
    its source file (benchmarks/results.json, .ci/stacks.json, pyproject.toml,
    scripts/interop.sh, benchmarks/gpu/), not figures typed in by hand."""
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "figures.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, ("README.md or docs/ differ from their sources: "
                                  "run python scripts/figures.py", proc.stderr)


def test_figures_check_finds_a_changed_figure():
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    speed = figures.blocks(readme)["speed"]
    tampered = readme.replace(speed, speed.replace(" µs |", "1 µs |", 1))
    assert tampered != readme and figures.rendered(tampered) == readme


EXPECTED_BLOCKS = {
    "README.md": {"compare", "speed", "requirements", "stacks", "setup"},
    "docs/performance.md": {"run", "per-call", "copies", "loader", "pipelines", "summary"},
    "docs/reliability.md": {"stacks", "producers"},
    "docs/getting-started.md": {"requirements", "setup"},
    "docs/gpu.md": {"gpu", "tpu"},
    "docs/loaders/grain.md": {"pip-grain"},
    "docs/loaders/huggingface.md": {"pip-hf"},
    "docs/loaders/ray.md": {"pip-ray"},
    "docs/loaders/tfdata.md": {"pip-tensorflow"},
}


def test_every_figure_is_in_a_generated_block():
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    for page, names in EXPECTED_BLOCKS.items():
        assert set(figures.blocks((ROOT / page).read_text(encoding="utf-8"))) == names, page
    pips = {f"pip-{name}" for name in figures.interop_pins()}   # a loader page's install line
    for path in figures.markdown_files():   # every block has its renderer
        assert set(figures.blocks(path.read_text(encoding="utf-8"))) <= set(figures.BLOCKS) | pips


def test_pipelines_table_is_the_loaders_run():
    """The Performance page's pipelines table shows every pipeline and method of
    benchmarks/loaders.json, the command that wrote it, and says so when it was a quick
    run; a pipeline that could not run is named with the reason."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    report = json.loads((ROOT / "benchmarks" / "loaders.json").read_text(encoding="utf-8"))
    table = _block(ROOT / "docs" / "performance.md", "pipelines")
    assert f"`{figures.loader_command(report)}`" in table
    assert ("A quick run (`--quick`" in table) == report["quick"]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    shown = [cells for cells in (row.split(" | ") for row in rows)]
    expected = [(method, pipe["baseline"] == method) for pipe in report["pipelines"].values()
                for method in pipe["methods"]]
    assert [(c[1].split("`")[1], c[1].endswith("(own path)")) for c in shown] == expected
    assert [c[0].lstrip("| ") for c in shown if c[0].lstrip("| ")] == list(report["pipelines"])
    for name, why in report["skipped"].items():
        assert f"{name} ({why})" in table


def test_pipelines_spread_rule():
    """A figure whose rounds spread over more than 25% of its median, and a ratio whose
    quartiles straddle 1.0, is shown with its quartiles; a steady one bare."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    assert figures.with_spread(1.40, 1.35, 1.45, ratio=True) == "1.40"
    assert figures.with_spread(1.04, 0.98, 1.10, ratio=True) == "1.04 (0.98–1.10)"
    assert figures.with_spread(1.60, 1.20, 1.70, ratio=True) == "1.60 (1.20–1.70)"
    assert figures.with_spread(0.95, 0.90, 0.99, ratio=True) == "0.95"
    assert figures.with_spread(412.0, 380.0, 450.0) == "412"
    assert figures.with_spread(412.0, 300.0, 450.0) == "412 (300–450)"
    assert figures.with_spread(1200.0, 1100.0, 1250.0) == "1,200"


def test_pipelines_without_a_run(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    assert "No run of `benchmarks/bench_loaders.py`" in figures.pipelines("", tmp_path / "x.json")


def test_gpu_results_are_rendered_when_committed(tmp_path):
    """Without a committed run the GPU page says so; with one (scripts/gpu_bench.py's JSON
    and the tests' log, as scripts/gpu_check.sh writes them) it shows its figures."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import figures
    assert "No run of the GPU check is recorded" in figures.gpu("", tmp_path)
    report = {"versions": {"python": "3.12.3", "jax": "0.10.2", "torch": "2.13.0",
                           "dlinspect": "0.1.0"},
              "devices": ["cuda:0"],
              "per_call_us": {"to_jax(t)": 4.5, "from_dlpack(t)": 30.25},
              "ratios": {"to_jax(t) / from_dlpack(t)": 4.5 / 30.25},
              "loop_batches_per_s": {"to_jax loop": 812.0,
                                     "prefetch_to_jax(thread=True)": 790.5}}
    (tmp_path / "gpu-bench.json").write_text(json.dumps(report), encoding="utf-8")
    (tmp_path / "gpu-tests.log").write_text("....\n==== 21 passed in 40.1s ====\n",
                                            encoding="utf-8")
    page = figures.gpu("", tmp_path)
    assert "No run" not in page and "cuda:0" in page and "21 passed in 40.1s" in page
    assert "| `from_dlpack(t)` | 30.2 |" in page and "| to_jax loop | 812 |" in page


def test_version_is_written_once():
    """The version is written in python/dlinspect/__init__.py only; the build reads it
    there, so the installed metadata and dlinspect.__version__ agree."""
    import importlib.metadata

    import dlinspect
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert importlib.metadata.version("dlinspect") == dlinspect.__version__


def test_the_declared_license_is_the_license_file():
    """pyproject.toml declares Apache-2.0, and LICENSE is its text (the wheel and the sdist
    carry it: scripts/wheel.sh checks both)."""
    import tomllib
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert declared["project"]["license"] == "Apache-2.0"
    assert "Apache License" in text and "Version 2.0, January 2004" in text
