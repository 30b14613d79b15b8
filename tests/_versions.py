"""What the installed stack offers, for tests that must hold on every supported version.

The project supports Python >= 3.11 with numpy >= 1.26, jax/jaxlib >= 0.4.30, torch >= 2.3
and ml_dtypes >= 0.4 (pyproject.toml); older libraries lack features the newest have, and
the tests adapt to what is here instead of assuming the newest API.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from typing import Any

import numpy as np

#: NumPy exports versioned capsules (``max_version``, READ_ONLY) from 2.1 on; before, only
#: legacy "dltensor" capsules, and read-only arrays not at all.
NUMPY_VERSIONED = np.lib.NumpyVersion(np.__version__) >= "2.1.0"
#: numpy.from_dlpack takes "dltensor_versioned" capsules from 2.1 on.
NUMPY_TAKES_VERSIONED = NUMPY_VERSIONED


def enable_x64(on: bool = True) -> Any:
    """``jax.enable_x64(on)`` (jax >= 0.4.31) or its older home."""
    import jax
    fn = getattr(jax, "enable_x64", None)
    if fn is None:
        from jax.experimental import enable_x64 as fn_old, disable_x64
        return fn_old() if on else disable_x64()
    return fn(on)


def torch_exchange_api() -> bool:
    """torch.Tensor offers the DLPack C exchange API (torch >= 2.9 or so)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return "__dlpack_c_exchange_api__" in vars(torch.Tensor)


def torch_exports_float8() -> bool:
    """torch's __dlpack__ exports float8 (newer torch; 2.3 refuses)."""
    import torch
    with contextlib.suppress(Exception):
        torch.zeros(1, dtype=torch.float8_e4m3fn).__dlpack__()
        return True
    return False


def torch_exports_versioned() -> bool:
    """torch's __dlpack__ takes ``max_version`` and exports versioned capsules (torch >= 2.4;
    2.3 raises TypeError for the keyword and exports legacy capsules only)."""
    import torch
    try:
        torch.zeros(1).__dlpack__(max_version=(1, 0))
    except TypeError:
        return False
    return True


def torch_use_count(t: Any) -> int | None:
    """What holds ``t``'s memory, where torch says it (``Tensor._use_count``, torch >= 2.4),
    else None: the references to its tensor (a capsule's managed tensor holds one) plus those
    to its storage's Python object (torch keeps one per storage while it is held: a host
    view's base, which a zero-copy import of a torch tensor is)."""
    fn = getattr(t, "_use_count", None)
    return None if fn is None else fn() + sys.getrefcount(t.untyped_storage())


def ml_dtypes_has(name: str) -> bool:
    import ml_dtypes
    return hasattr(ml_dtypes, name)
