"""The suites that run in a subprocess of their own, each a folder beside this file:

- tests/fuzz/: the hypothesis fuzz suite (a crash there fails this test instead of the
  whole run). At least 20,000 cases in the regular run; DLINSPECT_FUZZ_EXAMPLES_SCALE=10
  (for example) runs ten times as many.
- tests/multidevice/: the tests that need 4 forced CPU devices (the device count never
  leaks into the rest of the suite).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install jax)")

pytestmark = pytest.mark.slow   # minutes each: CI's full run has them (.ci/run)

HERE = Path(__file__).parent


def _pytest(folder: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # -s: a crash's report (segfault, sanitizer) reaches this process's output
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(HERE / folder)],
        cwd=HERE.parent, env=dict(os.environ, JAX_PLATFORMS="cpu", **env), capture_output=True,
        text=True, timeout=timeout)


def test_fuzz_suite(tmp_path):
    pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install hypothesis)")
    report = tmp_path / "fuzz.json"
    scale = float(os.environ.get("DLINSPECT_FUZZ_EXAMPLES_SCALE", "1"))
    proc = _pytest("fuzz", {"DLINSPECT_FUZZ": "1", "DLINSPECT_FUZZ_REPORT": str(report),
                            "DLINSPECT_FUZZ_EXAMPLES_SCALE": str(scale)}, 3600)
    assert proc.returncode == 0, (f"fuzz subprocess exited {proc.returncode} (a negative code "
                                  f"is a signal: a crash)\n" + proc.stdout[-6000:] + proc.stderr[-3000:])
    counts = json.loads(report.read_text())
    assert sum(counts.values()) >= 20_000 * scale, counts
    print(counts)


def test_multidevice_suite():
    proc = _pytest("multidevice", {"DLINSPECT_MULTIDEVICE": "1",
                                   "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, 1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
    # Skips only where the installed jaxlib makes a case moot (jaxlib 0.4 views any alignment).
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("aligned memory" in line for line in skips), skips
