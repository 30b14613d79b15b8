"""Shared fixtures: optional producers are skipped, with a reason, where missing.

How deep a run goes. ``python -m pytest`` is the quick run: it leaves out the tests marked
``slow`` (pyproject.toml's addopts, ``-m 'not slow'``) and the property tests of
test_agreement.py and test_computations.py draw a tenth of their examples. CI's full run
(.ci/run) selects every test (``-m ''``) and sets DLINSPECT_AGREEMENT_SCALE=1, every
example; its version stacks and sanitizer set 0.25.
"""

from __future__ import annotations

import os

# JAX on CPU only, quietly, for every test process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The property tests' depth, unless the run sets it (test modules read it when imported,
# the subprocess suites inherit it).
QUICK_SCALE = "0.1"
os.environ.setdefault("DLINSPECT_AGREEMENT_SCALE", QUICK_SCALE)

import pytest


@pytest.fixture(scope="session", autouse=True)
def _cpu_is_the_default():
    """The suite's routes are a CPU machine's. Where JAX's default device is an accelerator
    (scripts/tpu_check.sh sets JAX_PLATFORMS=tpu,cpu), the CPU is made JAX's default
    device; the accelerator's own routes are scripts/tpu_check.py's."""
    if os.environ["JAX_PLATFORMS"] == "cpu":
        return
    import jax
    jax.config.update("jax_default_device", jax.devices("cpu")[0])


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")


@pytest.fixture(scope="session")
def jax():
    return pytest.importorskip("jax", reason="jax is not installed (pip install jax)")


@pytest.fixture(scope="session")
def ml_dtypes():
    return pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")


@pytest.fixture(params=["direct", "public"])
def import_path(request):
    """Run a test through jaxlib's import function and through jax.dlpack.from_dlpack."""
    from dlinspect import _core as djax
    djax.force_public_api(request.param == "public")
    assert djax.jax_caps().direct == (request.param == "direct")
    yield request.param
    djax.force_public_api(False)
