"""What every peer suite checks of one conversion (tests/peers)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import dlinspect
from dlinspect import DLInspectWarning

#: The numeric dtypes NumPy exports through DLPack: what NumPy's test_dtype_passthrough
#: round-trips, and JAX's tests' numpy_dtypes.
NUMPY_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                np.complex128]


def to_jax_checked(x: Any, src_ptr: int | None, **kw: Any) -> tuple[Any, Any]:
    """``to_jax(x, **kw)`` against ``plan(x, **kw)``: the error type it names, a warning
    exactly when it has one, shared memory (with ``src_ptr``, where given) exactly when it
    is "zero-copy". Returns ``(route, array or None)``."""
    route = dlinspect.plan(x, **kw)
    if route.kind == "error":
        with pytest.raises(type(route.error)):
            dlinspect.to_jax(x, **kw)
        return route, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DLInspectWarning)
        y = dlinspect.to_jax(x, **kw)
    assert any(w.category is DLInspectWarning for w in caught) == (route.warning is not None)
    if y.size and src_ptr is not None:
        assert (y.unsafe_buffer_pointer() == src_ptr) == (route.kind == "zero-copy"), route
    return route, y
