"""Build DLPack capsules with any header, and fake producers for any device.

This is how dlinspect's tests (and yours) exercise Vulkan, OpenCL, Metal, ROCm,
CUDA and pinned tensors, corrupt headers and counting deleters on a machine
that has none of those devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._core import PRODUCERS, DeleterCounter, Producer, _make_capsule, aligned_empty
from ._tables import DLDeviceType, as_device_type, dldtype_from_numpy
from ._core import FLAG_IS_COPIED, FLAG_IS_SUBBYTE_TYPE_PADDED, FLAG_READ_ONLY  # noqa: F401

__all__ = ["make_capsule", "DeleterCounter", "FakeProducer", "aligned_empty", "aligned_array"]

_HOST = (DLDeviceType.kDLCPU, 0)   # the host's device, as __dlpack_device__ and dl_device= say it


def make_capsule(data: Any = None, *, shape: Sequence[int] | None = None, dtype: Any = None,
                 device: tuple[int, int] = _HOST,
                 strides: Sequence[int] | None = None, byte_offset: int = 0,
                 versioned: bool = True, version: tuple[int, int] = (1, 3), flags: int = 0,
                 ndim: int | None = None, address: int | None = None,
                 counter: DeleterCounter | None = None, name: str | None = None,
                 null_deleter: bool = False) -> Any:
    """Build a DLPack capsule whose header says exactly what you ask.

    Parameters
    ----------
    data : buffer or None
        An object with the buffer protocol (a contiguous NumPy array...) whose
        memory becomes ``DLTensor.data``; it is kept alive until the deleter
        runs. None gives ``data = NULL``. When ``data`` is a NumPy array, the
        defaults of ``shape``, ``dtype`` and ``strides`` come from it.
    shape : sequence of int or None
        Extents, in elements. ``None`` (with no ``data``) writes ``shape = NULL``.
    dtype : numpy dtype, name, or (code, bits[, lanes])
        The ``DLDataType``. Names and dtypes go through NumPy / ml_dtypes.
    device : (int, int)
        ``(device_type, device_id)`` written into ``DLTensor.device``.
    strides : sequence of int or None
        Strides in elements; None writes ``strides = NULL`` (row-major before DLPack 1.2).
    byte_offset : int
        ``DLTensor.byte_offset``, in bytes.
    versioned : bool
        True builds a ``DLManagedTensorVersioned`` in a ``"dltensor_versioned"``
        capsule; False a legacy ``DLManagedTensor`` in a ``"dltensor"`` capsule.
    version : (int, int)
        ``DLManagedTensorVersioned.version`` (versioned only).
    flags : int
        ``DLManagedTensorVersioned.flags``: ``FLAG_READ_ONLY``, ``FLAG_IS_COPIED``,
        ``FLAG_IS_SUBBYTE_TYPE_PADDED`` (versioned only).
    ndim : int or None
        ``DLTensor.ndim``; defaults to ``len(shape)``. Any value may be forged:
        ``shape`` and ``strides`` arrays are always allocated with at least
        ``min(ndim, 1024)`` entries (padded with 1), so a reader that trusts an
        ``ndim`` up to 1024 never reads out of bounds.
    address : int or None
        A raw address for ``DLTensor.data`` instead of ``data``'s memory. The
        memory is not kept alive; use it only for headers nobody dereferences.
    counter : DeleterCounter or None
        Counts this capsule's deleter call(s).
    name : str or None
        Capsule name override (e.g. ``"used_dltensor"`` to forge a consumed capsule).
    null_deleter : bool
        Write ``deleter = NULL``; the header's memory is then never freed.

    Returns
    -------
    PyCapsule
        Owns the tensor until a consumer renames it; its destructor calls the
        deleter only while the name is still the unconsumed one (DLPack python_spec).

    Examples
    --------
    >>> import numpy as np
    >>> from dlinspect.testing import make_capsule, DeleterCounter
    >>> import dlinspect
    >>> counter = DeleterCounter()
    >>> cap = make_capsule(np.ones(4, np.float32), device=(7, 0), counter=counter)
    >>> str(dlinspect.peek(cap).device_type)
    'kDLVulkan'
    >>> del cap; counter.calls
    1
    """
    if isinstance(data, np.ndarray):
        shape = data.shape if shape is None else shape
        dtype = data.dtype if dtype is None else dtype
        if strides is None and not data.flags.c_contiguous:
            strides = _element_strides(data)
        if not (data.flags.c_contiguous or data.flags.f_contiguous) and address is None:
            address = data.ctypes.data  # first element; `data` itself is kept alive
    if isinstance(dtype, tuple):   # (code, bits[, lanes])
        code, bits, lanes = (*dtype, 1)[:3]
    else:
        code, bits, lanes = dldtype_from_numpy("float32" if dtype is None else dtype)
    shape, strides = (None if v is None else tuple(map(int, v)) for v in (shape, strides))
    return _make_capsule(data, address, shape, ndim, strides, code, bits, lanes, *device,
                         byte_offset, versioned, *version, flags, counter, name, null_deleter)


def _element_strides(arr: np.ndarray) -> tuple[int, ...]:
    return tuple(s // arr.itemsize for s in arr.strides)


class FakeProducer:
    """A DLPack producer on any device, for tests: records what it was asked.

    Parameters
    ----------
    array : numpy.ndarray
        The values; its memory is what the capsules point at.
    device : (int, int or None)
        What ``__dlpack_device__`` returns, e.g. ``(DLDeviceType.kDLVulkan, 0)``;
        a None id is returned as it is (paddlepaddle does that), and the capsule
        header then says id 0.
    capsule_device : (int, int) or None
        What the capsule header says, where it differs from ``device`` (a pinned
        torch tensor says kDLCUDAHost in ``__dlpack_device__``, kDLCPU inside).
    dtype : numpy dtype, name or (code, bits[, lanes]), optional
        Forge the header's dtype instead of the array's.
    legacy_only : bool
        Behave like an old producer: any keyword other than ``stream`` raises
        ``TypeError``, and capsules are legacy ``"dltensor"``. (Such a producer
        is an instance of a subclass, ``LegacyFakeProducer``: what a producer
        accepts is a property of its type, which dlinspect remembers.)
    read_only : bool
        Versioned capsules carry the READ_ONLY flag.
    host_copy : bool
        Honour ``dl_device=(kDLCPU, 0), copy=True`` with a host copy whose header
        has IS_COPIED set (as the array API asks a producer to), in the memory order
        of ``array`` (a transposed tensor's copy is transposed), and
        ``copy_into(out)``; False refuses both with ``BufferError``, as a producer
        without that feature does.
    copy_into : bool
        Copy into host memory it is given (``copy_into(out)``, as torch's
        ``out.copy_(x)`` and CuPy's ``x.get(out=...)`` do): a host fallback then
        makes one copy, into memory JAX views. (Such a producer is an instance of
        a subclass, ``CopyIntoFakeProducer``, which the producer table names.)
    refuse : str, Exception or None
        ``__dlpack__`` raises ``BufferError(refuse)`` (like torch for a tensor
        that requires grad), or the exception given (any type: pyarrow raises
        ``TypeError`` for an array with nulls).
    counter : DeleterCounter or None
        Shared by every capsule it serves; a new one by default.
    host_align : int
        The alignment of its host copies' memory, in bytes (a power of two up to 64): 64
        by default, as torch's and dpnp's; 16 is malloc's, which XLA:CPU does not view.
    host_values : numpy.ndarray or None
        What its host copies hold (``__dlpack__(dl_device=(kDLCPU, 0), copy=True)`` and
        ``numpy()``), where it differs from ``array``: a faulty producer whose host copy
        has another shape or dtype than its header.

    Attributes
    ----------
    calls : list of dict
        The keyword arguments of every ``__dlpack__`` call, in order.
    served : list of numpy.ndarray
        The host memory of every host copy it made (``__dlpack__`` or
        ``copy_into(out)``), to check by pointer where values ended up.
    counter : DeleterCounter
        Deleter calls of every capsule served.
    """

    def __new__(cls, *args: Any, legacy_only: bool = False, copy_into: bool = False,
                **kwargs: Any) -> "FakeProducer":
        if cls is FakeProducer and (legacy_only or copy_into):
            cls = LegacyFakeProducer if legacy_only else CopyIntoFakeProducer
        return super().__new__(cls)

    def __init__(self, array: np.ndarray, device: tuple[int, int] = _HOST, *,
                 capsule_device: tuple[int, int] | None = None, dtype: Any = None,
                 legacy_only: bool = False, read_only: bool = False, host_copy: bool = True,
                 copy_into: bool = False, refuse: str | BaseException | None = None,
                 counter: DeleterCounter | None = None, host_align: int = 64,
                 host_values: np.ndarray | None = None) -> None:
        self.array = np.asarray(array)
        self.device = (int(device[0]), None if device[1] is None else int(device[1]))
        self.capsule_device = capsule_device or (self.device[0], self.device[1] or 0)
        self.dtype, self.legacy_only, self.read_only = dtype, legacy_only, read_only
        self.host_copy, self.refuse, self.host_align = host_copy, refuse, host_align
        self.counter = counter or DeleterCounter()
        self.host_values = self.array if host_values is None else np.asarray(host_values)
        self.calls: list[dict[str, Any]] = []
        self.served: list[np.ndarray] = []

    def __dlpack_device__(self) -> tuple[DLDeviceType | int, int | None]:
        return (as_device_type(self.device[0]), self.device[1])

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if self.legacy_only and kwargs:
            raise TypeError(f"__dlpack__() got unexpected keyword argument(s) {sorted(kwargs)}")
        self.calls.append({"stream": stream, **kwargs})
        if self.refuse is not None:
            raise self.refuse if isinstance(self.refuse, BaseException) else BufferError(self.refuse)
        max_version, dl_device, copy = map(kwargs.get, ("max_version", "dl_device", "copy"))
        flags = FLAG_READ_ONLY if self.read_only else 0   # (a legacy capsule has no flags to hold them)
        arr, device = self.array, self.capsule_device
        if dl_device is not None and tuple(dl_device) != (self.device[0], self.device[1] or 0):
            if tuple(dl_device) != _HOST or not self.host_copy:
                raise BufferError(f"unsupported device requested: {tuple(dl_device)}")
            if copy is False:
                raise BufferError("a copy to the host is needed but copy=False")
            arr, device = _copy_in_its_order(self.host_values, self.host_align), _HOST
            flags = FLAG_IS_COPIED
            self.served.append(arr)
        elif copy:
            arr = np.array(self.array, copy=True)
            flags |= FLAG_IS_COPIED
        return make_capsule(arr, dtype=self.dtype, device=device,
                            versioned=max_version is not None and max_version[0] >= 1,
                            flags=flags, counter=self.counter,
                            strides=_element_strides(arr))


def _copy_in_its_order(values: np.ndarray, align: int) -> np.ndarray:
    """A copy aligned to ``align`` bytes (and no more, up to 64), its axes in the order of
    the source's memory, as NumPy's ``order="K"`` and torch's ``.cpu()`` keep them."""
    order = sorted(range(values.ndim), key=lambda axis: -abs(values.strides[axis]))
    out = aligned_empty(tuple(values.shape[axis] for axis in order), values.dtype, 64,
                        offset=align % 64).transpose(np.argsort(order).tolist())
    out[...] = values
    return out


class CopyIntoFakeProducer(FakeProducer):
    """A :class:`FakeProducer` with ``copy_into=True``: its type copies into host memory."""

    def copy_into(self, out: np.ndarray) -> None:
        """Copy the values into host array ``out`` (same shape and dtype), as a producer
        that copies device memory into host memory it is given does."""
        if not self.host_copy:
            raise BufferError("this producer does not copy to the host")
        np.copyto(out, self.array)
        self.served.append(out)


PRODUCERS[("dlinspect", "CopyIntoFakeProducer")] = Producer(into="copy_into")


class LegacyFakeProducer(FakeProducer):
    """A :class:`FakeProducer` with ``legacy_only=True``: an older producer's type."""


def aligned_array(values: Any, dtype: Any = np.float32, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``values`` whose data is ``alignment``-byte aligned.

    Parameters
    ----------
    values : array_like
        Any shape; converted with ``numpy.asarray(values, dtype)``.
    dtype : numpy dtype
        Element type (float32 by default).
    alignment : int
        In bytes; 64 is what XLA:CPU needs to view memory without a copy.

    Returns
    -------
    numpy.ndarray
        Same shape and values, memory from :func:`aligned_empty`.

    Examples
    --------
    >>> from dlinspect.testing import aligned_array
    >>> aligned_array([[1, 2], [3, 4]]).ctypes.data % 64
    0
    """
    values = np.asarray(values, dtype)
    out = aligned_empty(values.shape, values.dtype, alignment=alignment)
    out[...] = values
    return out
