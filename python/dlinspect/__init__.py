"""dlinspect: read a DLPack tensor's header without consuming it, and route it into JAX.

- ``peek(x)`` reads the device, shape, dtype, strides and flags of any DLPack capsule or
  ``__dlpack__`` producer in C, without taking the tensor.
- ``to_jax(x)`` moves a tensor, or a batch of them (a pytree), into JAX: zero-copy where
  JAX can view the memory (and, in a batch, where the batch owns it), one copy where it
  must, through host memory for a device JAX has no backend for, or an error that says
  what to do. ``plan(x)`` says which, and why, without moving anything; ``explain(x)``
  prints it. ``to_host(x)`` gives a NumPy view or copy.
- ``prefetch_to_jax(loader)`` converts a data loader's batches ahead of the training
  step; ``stack(examples)`` collates examples into memory JAX views as it is.
"""

from __future__ import annotations

try:
    from . import _core
except ImportError as exc:  # pragma: no cover - depends on how the tree was installed
    raise ImportError(
        "dlinspect's compiled extension dlinspect._core is missing: this source tree was "
        "never built, or was built for another Python. Build it with: "
        "pip install --no-build-isolation -Cbuild-dir=build -e ."
    ) from exc

from ._core import MAX_NDIM, LoaderReport, Route, TensorInfo, explain, peek, plan, to_host, to_jax
from ._tables import DLDataType, DLDataTypeCode, DLDeviceType, Need
from ._prefetch import PrefetchLoader, prefetch_to_jax
from ._stack import stack
from . import errors, testing
from .errors import *  # noqa: F403  (every error and warning: errors.__all__)

__version__ = "0.1.0"   # the package's version, read from here by the build (pyproject.toml)

__all__ = ["peek", "plan", "explain", "to_jax", "to_host", "stack", "prefetch_to_jax", "PrefetchLoader",
           "LoaderReport", "Route", "Need", "TensorInfo", "MAX_NDIM", "DLDeviceType", "DLDataTypeCode",
           "DLDataType"]
__all__ += errors.__all__
