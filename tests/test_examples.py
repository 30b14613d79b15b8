"""The example scripts run as a user runs them, and the training one learns."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install jax)")
pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")

pytestmark = pytest.mark.slow   # trainings in subprocesses: CI's full run has them (.ci/run)

ROOT = Path(__file__).parents[1]


def run_example(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def accuracy(out: str) -> float:
    match = re.search(r"test accuracy: ([0-9.]+)", out)
    assert match, out
    return float(match.group(1))


@pytest.fixture(scope="module")
def single_device_accuracy():
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install 'dlinspect[examples]')")
    out = run_example("examples/train_digits.py")
    assert "route to jax: zero-copy" in out
    return accuracy(out)


def test_train_digits_learns(single_device_accuracy):
    assert single_device_accuracy > 0.9  # chance is 0.1


def test_train_digits_data_parallel_with_workers(single_device_accuracy):
    out = run_example("examples/train_digits.py", "--devices", "4", "--workers", "2")
    assert "devices: 4" in out and "4 of 4 shards are views" in out
    assert abs(accuracy(out) - single_device_accuracy) <= 0.02


def test_train_digits_two_processes(single_device_accuracy):
    out = run_example("examples/train_digits.py", "--processes", "2")
    assert "devices: 2 (2 process(es))" in out
    assert abs(accuracy(out) - single_device_accuracy) <= 0.03


def test_demo_runs():
    out = run_example("examples/demo.py")
    assert "kDLVulkan" in out


def test_train_digits_feeds_jax_without_copies(monkeypatch):
    """What the README says of the main example: every batch its DataLoader makes, and its
    test set, go into JAX without a copy (plan and the conversion agree)."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install 'dlinspect[examples]')")
    import dlinspect
    from torch.utils.data import DataLoader
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import train_digits
    train, test = train_digits.load_digits_split()
    for images, labels in DataLoader(train, batch_size=train_digits.BATCH, shuffle=True, drop_last=True):
        assert [route.kind for route in dlinspect.plan((images, labels))] == ["zero-copy"] * 2
        got = dlinspect.to_jax((images, labels))
        assert got[0].unsafe_buffer_pointer() == images.data_ptr()
        assert got[1].unsafe_buffer_pointer() == labels.data_ptr()
    for x in (test.images, test.labels):
        assert dlinspect.plan(x).kind == "zero-copy"
        assert dlinspect.to_jax(x).unsafe_buffer_pointer() == x.data_ptr()
