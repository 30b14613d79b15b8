"""Small helpers shared by the routing tests."""

from __future__ import annotations

import numpy as np

from dlinspect.testing import aligned_array


def aligned(values, dtype=np.float32):
    """A 64-byte aligned copy of ``values``."""
    return aligned_array(values, dtype)


def buffer_pointer(arr):
    """Where a single-device jax.Array's data lives."""
    return arr.addressable_data(0).unsafe_buffer_pointer()


def target():
    """The installed JAX's JaxTarget."""
    from dlinspect._core import jax_caps as caps
    return caps().target


def read_only(x):
    """``x``, made read-only."""
    x.flags.writeable = False
    return x


def jax_lets_go():
    """One JAX call: after it, the host memory of every array that died before it is let
    go of. jaxlib drops its reference to host memory it views (arrays of jax.device_put
    and dlinspect.to_jax alike) at its next call, not at the moment the array dies; only
    then does the producer's deleter run."""
    import jax
    jax.device_put(0)


class Fresh:
    """A loader's source that makes every batch when asked and keeps none of them
    (``make(i)`` for ``i < n``, again each epoch), as torch's collate does: what
    dlinspect imports zero-copy. A list of batches keeps them, and so is copied."""

    def __init__(self, make, n):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __iter__(self):
        return (self.make(i) for i in range(self.n))
