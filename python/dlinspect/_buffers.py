"""Host memory at a chosen alignment (for dlinspect's copies, its probes and tests)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["aligned_empty"]


def aligned_empty(shape: Sequence[int], dtype: Any = np.float32, alignment: int = 64,
                  offset: int = 0) -> np.ndarray:
    """A C-contiguous NumPy array whose data sits ``offset`` bytes past an ``alignment`` boundary.

    Parameters
    ----------
    shape : sequence of int
        Extents, in elements.
    dtype : numpy dtype
        Element type (ml_dtypes ones included).
    alignment : int
        In bytes, a power of two; 64 is what XLA:CPU needs to view memory without a copy.
    offset : int
        Bytes past the boundary: ``aligned_empty((3, 4), offset=16)`` is 16-byte but
        not 64-byte aligned, the misaligned case of XLA:CPU's zero-copy import.

    Returns
    -------
    numpy.ndarray
        Uninitialised; owns its memory.
    """
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    raw = np.empty(nbytes + alignment + offset, np.uint8)
    start = (-raw.ctypes.data) % alignment + offset
    return raw[start:start + nbytes].view(dt).reshape(tuple(shape))
