"""Runs the hypothesis fuzz suite (tests/fuzz/) in a subprocess: a crash there fails
this test instead of the whole run. At least 20,000 cases in the regular run;
DLINSPECT_FUZZ_EXAMPLES_SCALE=10 (for example) runs ten times as many."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install hypothesis)")

HERE = Path(__file__).parent


def test_fuzz_suite(tmp_path):
    report = tmp_path / "fuzz.json"
    scale = float(os.environ.get("DLINSPECT_FUZZ_EXAMPLES_SCALE", "1"))
    env = dict(os.environ, DLINSPECT_FUZZ="1", DLINSPECT_FUZZ_REPORT=str(report),
               JAX_PLATFORMS="cpu", DLINSPECT_FUZZ_EXAMPLES_SCALE=str(scale))
    proc = subprocess.run(
        # -s: a crash's report (segfault, sanitizer) reaches this process's output
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(HERE / "fuzz")],
        cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, (f"fuzz subprocess exited {proc.returncode} (a negative code "
                                  f"is a signal: a crash)\n" + proc.stdout[-6000:] + proc.stderr[-3000:])
    counts = json.loads(report.read_text())
    assert sum(counts.values()) >= 20_000 * scale, counts
    print(counts)
