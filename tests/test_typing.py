"""mypy passes over the package (with the stubs of the compiled extension) and a typed example."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.mark.slow
def test_mypy():
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy)")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success" in proc.stdout


def test_stub_matches_the_extension():
    """Every public name of the compiled module is declared in _core.pyi, and the reverse."""
    import ast

    import dlinspect._core as core
    with open(os.path.join(ROOT, "python", "dlinspect", "_core.pyi"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.id for n in tree.body if isinstance(n, (ast.AnnAssign, ast.Assign))
                 for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)
                 if isinstance(t, ast.Name)}
    declared |= {a.asname for n in tree.body if isinstance(n, ast.ImportFrom)   # re-exports
                 for a in n.names if a.asname == a.name}
    public = {n for n in dir(core) if not n.startswith("_") and
              getattr(getattr(core, n), "__module__", "dlinspect._core") == "dlinspect._core"}
    assert public - declared == set()
    assert {n for n in declared - {"Capsule"} if not n.startswith("_")} - set(dir(core)) == set()


@pytest.mark.slow
def test_mypy_refuses_what_the_options_and_results_do_not_allow(tmp_path):
    """A string option outside its values, and an attribute the result has not, are type
    errors: the options are Literal types, to_jax of a tensor is a jax.Array and plan of
    one a Route."""
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy)")
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "import numpy as np\nimport dlinspect\nx = np.ones(3)\n"
        'dlinspect.to_jax(x, readonly="shar")\n'
        "dlinspect.to_jax(x).no_such_attribute\n"
        "dlinspect.plan(x).no_such_attribute\n"
        'dlinspect.prefetch_to_jax([x], narrow="quiet")\n', encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file",
                           os.path.join(ROOT, "pyproject.toml"), str(wrong)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert [int(line.split(":")[1]) for line in lines] == [4, 5, 6, 7], proc.stdout
    assert '"Array" has no attribute' in proc.stdout and '"Route" has no attribute' in proc.stdout
