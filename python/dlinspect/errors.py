"""Exceptions and warnings raised by dlinspect.

Every exception derives from :class:`DLInspectError` and also from the built-in
type the array API standard prescribes for that situation (``BufferError``,
``ValueError`` or ``TypeError``; see the array API's ``from_dlpack`` and
``__dlpack__`` specifications), so code written as ``except BufferError`` keeps
working when it switches to dlinspect.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DLInspectError", "NotDLPackError", "NotNumericError", "CapsuleConsumedError",
           "UnsupportedVersionError", "MalformedTensorError", "UnsupportedDeviceError",
           "UnsupportedDTypeError", "UnsupportedShapeError", "CopyRequiredError", "ProducerError",
           "NotDescribableError", "ShardingError", "ContainerError", "SourceExhaustedError",
           "StackError", "AllocationError", "DLInspectWarning"]


class DLInspectError(Exception):
    """Base class of every error dlinspect raises."""


class NotDLPackError(DLInspectError, TypeError):
    """The object is neither a DLPack capsule nor has ``__dlpack__``.

    A ``TypeError``, as the array API prescribes for objects without the protocol.
    """


class NotNumericError(NotDLPackError):
    """An array whose dtype is not numeric, so it is not a DLPack tensor.

    NumPy arrays of kinds ``U`` (str), ``S`` (bytes), ``O`` (object), ``M`` and
    ``m`` (datetime64, timedelta64) and ``V`` (structured and raw void, other
    than the ml_dtypes types), and TensorFlow tensors of dtype ``tf.string``,
    ``tf.variant`` or ``tf.resource``: DLPack's ``DLDataTypeCode`` has no code
    for them. Inside a batch such an array is a leaf kept as it is
    (``leaves="keep"``); alone, :func:`dlinspect.peek`, :func:`dlinspect.to_host`
    and ``leaves="raise"`` raise this. A ``TypeError``, as for any object without
    the protocol.
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


class UnsupportedShapeError(DLInspectError, BufferError):
    """No array of the target can have the tensor's shape, though DLPack describes it.

    More than :data:`dlinspect.MAX_NDIM` (64) dimensions once vector lanes are a
    trailing axis, or an empty tensor whose nonzero extents multiply, in bytes, past
    2**63 - 1 (NumPy refuses such an array; XLA aborts the process on one).
    """


class CopyRequiredError(DLInspectError, ValueError):
    """``copy=False`` was asked for, but the route needs a copy.

    A ``ValueError``, as the array API's ``from_dlpack`` prescribes.
    """


class ProducerError(DLInspectError, BufferError):
    """The producer's ``__dlpack__`` refused to export the tensor.

    The message keeps the producer's own reason and adds what to do; the
    producer's exception is chained as ``__cause__``.
    """


class NotDescribableError(ProducerError):
    """NumPy memory that DLPack cannot describe exactly, so no header is given for it.

    DLPack's ``DLDataType`` follows native byte order and ``DLTensor.strides``
    count whole elements (``dlpack.h``), so a byte-swapped array
    (``dtype(">f4")`` on a little-endian machine) or one whose byte strides are
    not multiples of its item size (a field of a packed record array) has no
    true header. NumPy refuses to export them; dlinspect does not make up a
    header either. :func:`dlinspect.to_host` and :func:`dlinspect.to_jax` copy
    such arrays into native, C-ordered memory with NumPy (``copy=None``);
    :func:`dlinspect.peek` and ``copy=False`` raise this error.

    Attributes
    ----------
    array : numpy.ndarray
        The array.
    why : str
        What DLPack cannot say about it, in words.
    """

    array: Any = None
    why: str = ""


class ShardingError(DLInspectError, ValueError):
    """A tensor cannot be split over a ``jax.sharding.Sharding`` as asked.

    Raised when an axis (usually the batch axis) does not divide evenly by the
    number of shards the sharding cuts it into; the message gives the axis
    size, the shard count and what to do. A ``ValueError``, as JAX raises for
    the same case.
    """


class ContainerError(DLInspectError, TypeError):
    """A batch that cannot be walked, or a container of it that cannot be rebuilt.

    dlinspect rebuilds a ``collections.abc.Mapping`` that JAX does not register
    as ``type(m)(dict_of_values)`` (as accelerate's ``send_to_device`` does), a
    dataclass as a copy with its fields set, a tuple or list subclass as
    ``type(x)(values)``; each is tried with its own values before anything is
    converted, and a type whose constructor takes no dict (say) raises this,
    naming the type, its key path and how to fix it. A batch that contains itself,
    nests deeper than 200 containers or holds a dict whose keys do not sort raises
    it too, naming where. A ``TypeError``.
    """


class StackError(DLInspectError, ValueError):
    """The elements given to :func:`dlinspect.stack` do not stack into one batch: none,
    different pytree structures, or leaves of different shapes at one key path (the
    message names which). A ``ValueError``, as ``np.stack`` raises."""


class SourceExhaustedError(DLInspectError, RuntimeError):
    """A loader's source is an iterator an earlier epoch went over, and a new epoch
    was started over it.

    :func:`~dlinspect.prefetch_to_jax` calls ``iter(source)`` for every epoch; an
    iterator (a generator, tf.data's ``as_numpy_iterator()``) returns itself and,
    once exhausted (or closed by an epoch stopped early), would give an epoch of no
    batches without a word. The message names the source and the fix (pass what
    starts again: the DataLoader, the ``tf.data.Dataset`` itself, a list). A ``RuntimeError``.
    """


class AllocationError(DLInspectError, MemoryError):
    """The memory for a copy the route needs cannot be had.

    Raised before anything is consumed: the size of every copy is known from the
    header, so the destination is allocated (or refused, when it is larger than this
    machine's physical memory) first. The message names the bytes needed. A
    ``MemoryError``, as NumPy raises for the same case.
    """


class DLInspectWarning(UserWarning):
    """A route changed the data in a way the caller may not expect (e.g. narrowing)."""
