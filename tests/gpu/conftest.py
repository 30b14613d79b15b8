"""GPU tests: skipped without a CUDA device (run them with scripts/gpu_check.sh)."""

from __future__ import annotations

import pytest


def _cuda() -> str | None:
    """Why the CUDA tests cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import jax
        if not jax.devices("cuda"):
            return "this jax has no CUDA devices"
    except Exception as exc:   # jax without its CUDA plugin: "Unknown backend cuda"
        return f"this jax has no CUDA backend ({type(exc).__name__})"
    return None


def pytest_collection_modifyitems(config, items):
    why = _cuda()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"{why}: the GPU checks need one (scripts/gpu_check.sh)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
