"""Exceptions and warnings raised by dlinspect.

Every exception derives from :class:`DLInspectError` and also from the built-in
type the array API standard prescribes for that situation (``BufferError``,
``ValueError`` or ``TypeError``; see the array API's ``from_dlpack`` and
``__dlpack__`` specifications), so code written as ``except BufferError`` keeps
working when it switches to dlinspect.
"""

from __future__ import annotations

__all__ = [
    "DLInspectError",
    "NotDLPackError",
    "CapsuleConsumedError",
    "UnsupportedVersionError",
    "MalformedTensorError",
    "UnsupportedDeviceError",
    "UnsupportedDTypeError",
    "CopyRequiredError",
    "ProducerError",
    "ShardingError",
    "DLInspectWarning",
]


class DLInspectError(Exception):
    """Base class of every error dlinspect raises."""


class NotDLPackError(DLInspectError, TypeError):
    """The object is neither a DLPack capsule nor has ``__dlpack__``.

    A ``TypeError``, as the array API prescribes for objects without the protocol.
    """


class CapsuleConsumedError(DLInspectError, ValueError):
    """The capsule is named ``used_dltensor`` or ``used_dltensor_versioned``.

    A consumer already took the tensor (DLPack python_spec, "consumed exactly
    once"); nothing inside the capsule is read.
    """


class UnsupportedVersionError(DLInspectError, BufferError):
    """A ``DLManagedTensorVersioned`` whose ``version.major`` is not 1.

    Per the DLPack ABI rules, no field past ``flags`` is read.
    """


class MalformedTensorError(DLInspectError, BufferError):
    """A header field holds a value no valid tensor can have.

    Examples: ``ndim`` negative or above :data:`dlinspect.MAX_NDIM`, a NULL
    ``shape`` with ``ndim > 0``, a negative extent, or an element count or byte
    span that overflows int64.
    """


class UnsupportedDeviceError(DLInspectError, BufferError):
    """The tensor's memory cannot reach the requested target from its device."""


class UnsupportedDTypeError(DLInspectError, BufferError):
    """The target cannot hold the tensor's ``DLDataType`` (code, bits, lanes)."""


class CopyRequiredError(DLInspectError, ValueError):
    """``copy=False`` was asked for, but the route needs a copy.

    A ``ValueError``, as the array API's ``from_dlpack`` prescribes.
    """


class ProducerError(DLInspectError, BufferError):
    """The producer's ``__dlpack__`` refused to export the tensor.

    The message keeps the producer's own reason and adds what to do; the
    producer's exception is chained as ``__cause__``.
    """


class ShardingError(DLInspectError, ValueError):
    """A tensor cannot be split over a ``jax.sharding.Sharding`` as asked.

    Raised when an axis (usually the batch axis) does not divide evenly by the
    number of shards the sharding cuts it into; the message gives the axis
    size, the shard count and what to do. A ``ValueError``, as JAX raises for
    the same case.
    """


class DLInspectWarning(UserWarning):
    """A route changed the data in a way the caller may not expect (e.g. narrowing)."""
