"""The facts a route is made of: its kinds, its actions, the needs (no words, no logic).

Shared by :mod:`dlinspect._plan` (which decides), :mod:`dlinspect._words` (which words
a route) and :mod:`dlinspect._execute` (one executor per action).
"""

from __future__ import annotations

import enum

from . import _core

__all__ = ["Need"]

ZERO_COPY, COPY, HOST_FALLBACK, ERROR = "zero-copy", "copy", "host-fallback", "error"


class Need(enum.IntFlag):
    """What a tensor needs to reach its target: the bits of ``Route.needs``.

    Computed by one function in the core (``dlinspect._core.needs``) from the
    header (:class:`TensorInfo`) and what the installed JAX takes; ``plan``,
    ``to_jax`` and ``to_host`` all act on the same answer.
    """

    DEVICE = _core.NEED_BITS["DEVICE"]
    """No JAX device here for the memory's device (or, for NumPy, not host memory)."""
    DTYPE = _core.NEED_BITS["DTYPE"]
    """The target cannot hold one lane's DLDataType (code, bits)."""
    LANES = _core.NEED_BITS["LANES"]
    """A vector dtype (lanes > 1): the lanes become a trailing axis."""
    LAYOUT = _core.NEED_BITS["LAYOUT"]
    """Strides JAX cannot view: gaps, broadcast (stride 0) or negative strides."""
    READ_ONLY = _core.NEED_BITS["READ_ONLY"]
    """The READ_ONLY flag is set and the caller did not pass ``readonly="share"``."""
    ALIGN = _core.NEED_BITS["ALIGN"]
    """``data + byte_offset`` is below XLA:CPU's zero-copy alignment."""
    NARROW = _core.NEED_BITS["NARROW"]
    """A 64-bit dtype that JAX narrows to 32 bits with x64 off."""
    PACKED = _core.NEED_BITS["PACKED"]
    """Packed sub-byte elements (bits * lanes < 8, more than one element)."""
    EMPTY = _core.NEED_BITS["EMPTY"]
    """No elements: nothing to view or copy."""
    VIA_CPU = _core.NEED_BITS["VIA_CPU"]
    """Pinned or managed host memory with no JAX backend for its platform: JAX's CPU
    backend views it (no copy)."""
    NUMPY_PUT = _core.NEED_BITS["NUMPY_PUT"]
    """A dtype JAX holds but its DLPack import does not take: sub-byte elements (int4,
    uint4, int2, float4...; packed, or padded one per byte with
    ``IS_SUBBYTE_TYPE_PADDED``), and any dtype a jaxlib's import refuses.
    ``jax.device_put`` copies them from a NumPy (ml_dtypes) view."""


# What executing a route does (Route.kind is the public word for it); the executors of
# dlinspect._execute, one per action.
IMPORT = "import"                  # hand the capsule to JAX as it is (maybe copy=True)
HOST_COPY = "host-copy"            # copy host memory into a C-order aligned array, import that
HOST_VIEW = "host-view"            # view host memory through NumPy (lanes as an axis), import
UNPACK = "unpack"                  # packed sub-byte host memory into one element per byte
EMPTY = "empty"                    # a new empty array; the capsule is taken and freed
PRODUCER_COPY = "producer-copy"    # ask the producer for a host copy, then route that
NUMPY_PUT = "numpy-put"            # a NumPy view (unpacked if packed), then jax.device_put
NUMPY_COPY = "numpy-copy"          # NumPy memory DLPack cannot describe: NumPy copies it
RAISE = "raise"
PASS = "pass"                      # a jax.Array where it was asked to be: returned as it is
ARRAY_PUT = "array-put"            # a jax.Array elsewhere: jax.device_put
ARRAY_COPY = "array-copy"          # a jax.Array with copy=True: its own copy
KEEP = "keep"                      # a pytree leaf that is not a tensor: left as it is
SPLIT = "split"                    # one host view, each device imports its slice
DEVICE_PUT = "device-put"          # to_jax whole, then jax.device_put(array, sharding)
PROCESS_LOCAL = "process-local"    # to_jax whole, then make_array_from_process_local_data
