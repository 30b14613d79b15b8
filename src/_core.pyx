# cython: language_level=3, freethreading_compatible=False
"""dlinspect._core: read DLPack headers in place, build capsules, adapt layouts.

Pointer names follow one scheme throughout: ``dlm`` is a ``DLManagedTensor*``,
``dlm_ver`` a ``DLManagedTensorVersioned*``, ``t`` the inner ``DLTensor*``.
Every header field is untrusted (see ``_fill``).
"""

cimport cython
import re as _re
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t, INT64_MAX
from libc.stdlib cimport malloc, free
from libc.string cimport strcmp, memset, memcpy
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_ANY_CONTIGUOUS
from cpython.pycapsule cimport (
    PyCapsule_CheckExact, PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_IsValid,
    PyCapsule_New, PyCapsule_SetName,
)

from dlpack cimport *

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    object PyObject_VectorcallMethod(object name, PyObject** args, size_t nargsf, PyObject* kwnames)
    PyObject* PyErr_Occurred()
    void PyErr_Clear()
    Py_ssize_t PyTuple_GET_SIZE(object t)
    void PyErr_WriteUnraisable(object obj)

from dlinspect.errors import (
    CapsuleConsumedError, MalformedTensorError, NotDLPackError, ProducerError,
    UnsupportedVersionError,
)
from dlinspect._enums import DLDataType as _PyDLDataType, as_device_type, device_name
from dlinspect import _dtypes
from numpy import ndarray as _np_ndarray

#: Largest ``ndim`` peek accepts (NumPy's NPY_MAXDIMS). Larger values raise MalformedTensorError.
MAX_NDIM = 64
cdef enum:
    _MAX_NDIM = 64
    _INLINE_NDIM = 8

cdef const char* LEGACY = DLINSPECT_CAPSULE_LEGACY
cdef const char* LEGACY_USED = DLINSPECT_CAPSULE_LEGACY_USED
cdef const char* VERSIONED = DLINSPECT_CAPSULE_VERSIONED
cdef const char* VERSIONED_USED = DLINSPECT_CAPSULE_VERSIONED_USED
cdef const char* EXCHANGE_API = DLINSPECT_CAPSULE_EXCHANGE_API

CAPSULE_LEGACY = DLINSPECT_CAPSULE_LEGACY.decode()
CAPSULE_VERSIONED = DLINSPECT_CAPSULE_VERSIONED.decode()
FLAG_READ_ONLY = <uint64_t>DLPACK_FLAG_BITMASK_READ_ONLY
FLAG_IS_COPIED = <uint64_t>DLPACK_FLAG_BITMASK_IS_COPIED
FLAG_IS_SUBBYTE_TYPE_PADDED = <uint64_t>DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
ABI_VERSION = (DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR)

# Where a TensorInfo's header came from.
cdef enum Source:
    SRC_LEGACY = 0       # a "dltensor" capsule
    SRC_VERSIONED = 1    # a "dltensor_versioned" capsule
    SRC_EXCHANGE = 2     # the DLPack 1.3 C exchange API; no capsule was made

_SOURCE_NAMES = ("dltensor", "dltensor_versioned", "exchange_api")
cdef tuple _MAX_VERSION = (DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR)
cdef tuple _KW_MAX_VERSION = ("max_version",)
cdef str _S_DLPACK = "__dlpack__"
cdef str _S_DLPACK_DEVICE = "__dlpack_device__"


cdef inline bint _host_accessible(int32_t device_type) noexcept nogil:
    return device_type == kDLCPU or device_type == kDLCUDAHost or \
        device_type == kDLROCMHost or device_type == kDLCUDAManaged


cdef inline int64_t _abs64(int64_t v) noexcept nogil:
    return -v if v < 0 else v


@cython.freelist(32)
@cython.final
cdef class TensorInfo:
    """What a DLPack header says about a tensor, read without consuming it.

    Made by :func:`dlinspect.peek`; immutable, picklable, cheap to create.
    Shapes and strides are copied out of the producer's memory, so the info
    stays valid after the tensor is freed.

    Attributes
    ----------
    device_type : DLDeviceType or int
        The device, from ``__dlpack_device__`` when the producer has it, else from
        the header. Unknown values are kept as plain ints.
    device_id : int
        The producer's device ordinal.
    device : tuple of (DLDeviceType or int, int)
        ``(device_type, device_id)``, in the form ``__dlpack_device__`` returns.
    capsule_device : tuple or None
        The header's own ``(device_type, device_id)`` where it differs from
        ``device`` (a pinned torch tensor: kDLCUDAHost outside, kDLCPU inside).
    ndim : int
        Number of dimensions, ``0 <= ndim <= MAX_NDIM``.
    shape : tuple of int
        Extents, ``ndim`` entries, in elements.
    strides : tuple of int
        Strides in elements, as DLPack defines them; filled in row-major order
        when the header has NULL strides (see ``strides_null``).
    byte_strides : tuple of int
        ``strides`` times ``itemsize``, in bytes.
    strides_null : bool
        The header had ``strides == NULL`` (allowed before DLPack 1.2).
    dtype : DLDataType
        ``(code, bits, lanes)``.
    dtype_name : str
        NumPy / ml_dtypes name: ``"float32"``, ``"bool"``, ``"bfloat16"``,
        ``"float8_e4m3fn"``, ``"int4"``; ``"float32x4"`` for 4 lanes.
    numpy_dtype : numpy.dtype or None
        The element dtype where NumPy (or ml_dtypes, when installed) has one.
    itemsize : int
        Bytes per element as the DLPack header computes it: ``(bits*lanes + 7) // 8``.
    size : int
        Number of elements (product of ``shape``).
    nbytes : int
        Bytes the elements occupy. Sub-byte types (bits*lanes < 8) are packed,
        ``ceil(size*bits*lanes/8)``, unless the IS_SUBBYTE_TYPE_PADDED flag is set.
    byte_offset : int
        The header's ``byte_offset``, in bytes.
    data_ptr : int
        ``data + byte_offset``: the address of the first element.
    alignment : int
        Largest power of two, up to 4096, dividing ``data_ptr`` (4096 for NULL).
    version : tuple of (int, int) or None
        ``(major, minor)`` of a versioned capsule; None for legacy capsules and
        the exchange API.
    flags : int
        The versioned header's ``flags`` (0 where there is no flags field).
    read_only : bool or None
        READ_ONLY flag of a versioned capsule; None where the source cannot say.
    is_copied : bool or None
        IS_COPIED flag of a versioned capsule; None where the source cannot say.
    capsule_name : str or None
        ``"dltensor"`` or ``"dltensor_versioned"``; None when no capsule was made.
    source : str
        ``"dltensor"``, ``"dltensor_versioned"`` or ``"exchange_api"``.
    is_c_contiguous, is_f_contiguous : bool
        NumPy's rules: extent-1 dimensions ignored; zero-size tensors are contiguous.
    is_compact : bool
        The strides are a permutation of a dense layout (C order, F order, a
        transpose...); what JAX imports without a copy.
    has_broadcast : bool
        Some dimension of extent > 1 has stride 0.
    has_negative_strides : bool
        Some dimension of extent > 1 has a negative stride.
    host_accessible : bool
        The device is kDLCPU, kDLCUDAHost, kDLROCMHost or kDLCUDAManaged.
    """

    cdef int32_t _dev_type, _dev_id, _cap_dev_type, _cap_dev_id
    cdef int32_t _ndim
    cdef uint8_t _code, _bits
    cdef uint16_t _lanes
    cdef uint64_t _byte_offset
    cdef uintptr_t _data
    cdef int64_t _size, _nbytes
    cdef int _ver_major, _ver_minor
    cdef uint64_t _flags
    cdef bint _strides_null
    cdef Source _source
    cdef int64_t* _shape
    cdef int64_t* _strides
    cdef int64_t _inline[2 * _INLINE_NDIM]

    def __dealloc__(self):
        if self._shape != self._inline:
            free(self._shape)     # NULL (never filled) or malloc'd by _alloc
        self._shape = NULL

    def __init__(self, *args, **kwargs):
        raise TypeError("TensorInfo is made by dlinspect.peek(); it has no public constructor")

    cdef int _alloc(self, int32_t ndim) except -1:
        # contract: called once, by _new_info, before any other use.
        if ndim > _INLINE_NDIM:
            self._shape = <int64_t*>malloc(2 * ndim * sizeof(int64_t))
            if self._shape == NULL:
                raise MemoryError()
            self._strides = self._shape + ndim
        else:
            self._shape = self._inline
            self._strides = self._inline + _INLINE_NDIM
        return 0

    # -- identity --------------------------------------------------------
    @property
    def device_type(self):
        return as_device_type(self._dev_type)

    @property
    def device_id(self):
        return self._dev_id

    @property
    def device(self):
        return (as_device_type(self._dev_type), self._dev_id)

    @property
    def capsule_device(self):
        if self._cap_dev_type == self._dev_type and self._cap_dev_id == self._dev_id:
            return None
        return (as_device_type(self._cap_dev_type), self._cap_dev_id)

    @property
    def host_accessible(self):
        return _host_accessible(self._dev_type)

    # -- geometry --------------------------------------------------------
    @property
    def ndim(self):
        return self._ndim

    @property
    def shape(self):
        return tuple([self._shape[i] for i in range(self._ndim)])

    @property
    def strides(self):
        return tuple([self._strides[i] for i in range(self._ndim)])

    @property
    def byte_strides(self):
        cdef int64_t item = self._itemsize()
        return tuple([self._strides[i] * item for i in range(self._ndim)])

    @property
    def strides_null(self):
        return self._strides_null

    @property
    def size(self):
        return self._size

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def itemsize(self):
        return self._itemsize()

    cdef inline int64_t _itemsize(self) noexcept:
        return (<int64_t>self._bits * self._lanes + 7) // 8

    # -- dtype -----------------------------------------------------------
    @property
    def dtype(self):
        return _PyDLDataType(self._code, self._bits, self._lanes)

    @property
    def dtype_name(self):
        return _dtypes.dtype_name(self._code, self._bits, self._lanes)

    @property
    def numpy_dtype(self):
        return _dtypes.numpy_dtype(self._code, self._bits, self._lanes)

    # -- memory ----------------------------------------------------------
    @property
    def byte_offset(self):
        return self._byte_offset

    @property
    def data_ptr(self):
        return <uintptr_t>(self._data + <uintptr_t>self._byte_offset)

    @property
    def alignment(self):
        cdef uintptr_t p = self._data + <uintptr_t>self._byte_offset
        cdef uintptr_t a = 1
        if p == 0:
            return 4096
        while a < 4096 and (p & a) == 0:
            a <<= 1
        return a

    # -- versioned header ------------------------------------------------
    @property
    def version(self):
        if self._source != SRC_VERSIONED:
            return None
        return (self._ver_major, self._ver_minor)

    @property
    def flags(self):
        return self._flags

    @property
    def read_only(self):
        if self._source != SRC_VERSIONED:
            return None
        return (self._flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0

    @property
    def is_copied(self):
        if self._source != SRC_VERSIONED:
            return None
        return (self._flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0

    @property
    def capsule_name(self):
        if self._source == SRC_EXCHANGE:
            return None
        return _SOURCE_NAMES[self._source]

    @property
    def source(self):
        return _SOURCE_NAMES[self._source]

    # -- layout predicates -----------------------------------------------
    @property
    def is_c_contiguous(self):
        cdef int64_t expected = 1
        cdef int i
        if self._size == 0:
            return True
        for i in range(self._ndim - 1, -1, -1):
            if self._shape[i] == 1:
                continue
            if self._strides[i] != expected:
                return False
            expected *= self._shape[i]
        return True

    @property
    def is_f_contiguous(self):
        cdef int64_t expected = 1
        cdef int i
        if self._size == 0:
            return True
        for i in range(self._ndim):
            if self._shape[i] == 1:
                continue
            if self._strides[i] != expected:
                return False
            expected *= self._shape[i]
        return True

    @property
    def is_compact(self):
        return self._is_compact()

    cdef bint _is_compact(self) noexcept:
        # Dimensions of extent > 1, ordered by stride, must each have a stride
        # equal to the product of the extents of the faster ones.
        cdef int64_t expected = 1
        cdef int i, j, n = 0
        cdef int order[_MAX_NDIM]
        if self._size == 0:
            return True
        for i in range(self._ndim):
            if self._shape[i] == 1:
                continue
            if self._strides[i] <= 0:
                return False
            j = n
            while j > 0 and self._strides[order[j - 1]] > self._strides[i]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = i
            n += 1
        for j in range(n):
            if self._strides[order[j]] != expected:
                return False
            expected *= self._shape[order[j]]
        return True

    cdef bint _plain(self, uintptr_t min_align, int max_bits) noexcept:
        """True when JAX can view this tensor as it is: one lane of at most
        ``max_bits`` bits, not read-only, compact, non-empty, data aligned to
        ``min_align`` bytes (the to_jax fast path; plan() decides the rest)."""
        if self._lanes != 1 or self._bits > max_bits or self._size == 0:
            return False
        if self._flags & DLPACK_FLAG_BITMASK_READ_ONLY:
            return False
        if ((self._data + <uintptr_t>self._byte_offset) & (min_align - 1)) != 0:
            return False
        return self._is_compact()

    @property
    def has_broadcast(self):
        cdef int i
        for i in range(self._ndim):
            if self._shape[i] > 1 and self._strides[i] == 0:
                return True
        return False

    @property
    def has_negative_strides(self):
        cdef int i
        for i in range(self._ndim):
            if self._shape[i] > 1 and self._strides[i] < 0:
                return True
        return False

    # -- presentation ----------------------------------------------------
    def _layout_word(self):
        if self.is_c_contiguous:
            return "C-contiguous"
        if self.is_f_contiguous:
            return "F-contiguous"
        if self.is_compact:
            return "compact"
        words = []
        if self.has_broadcast:
            words.append("broadcast")
        if self.has_negative_strides:
            words.append("negative-strides")
        return "+".join(words) or "strided"

    def __repr__(self):
        extra = []
        cap = self.capsule_device
        if cap is not None:
            extra.append(f" capsule_device={device_name(cap[0], cap[1])}")
        if self.read_only:
            extra.append(" read-only")
        return (f"<TensorInfo {device_name(self._dev_type, self._dev_id)} "
                f"{self.dtype_name}[{', '.join(map(str, self.shape))}] "
                f"strides={self.strides} {self._layout_word()} {self._nbytes} B "
                f"align={self.alignment}{''.join(extra)}>")

    def to_dict(self):
        """All attributes as a dict of plain Python values (for logs and JSON)."""
        cap = self.capsule_device
        return {
            "device_type": device_name(self._dev_type), "device_id": self._dev_id,
            "capsule_device": None if cap is None else [device_name(cap[0]), cap[1]],
            "ndim": self._ndim, "shape": list(self.shape), "strides": list(self.strides),
            "byte_strides": list(self.byte_strides), "strides_null": self._strides_null,
            "dtype": list(self.dtype), "dtype_name": self.dtype_name,
            "itemsize": self.itemsize, "size": self._size, "nbytes": self._nbytes,
            "byte_offset": self._byte_offset, "data_ptr": self.data_ptr,
            "alignment": self.alignment,
            "version": None if self.version is None else list(self.version),
            "flags": self._flags, "read_only": self.read_only, "is_copied": self.is_copied,
            "capsule_name": self.capsule_name, "source": self.source,
            "is_c_contiguous": self.is_c_contiguous, "is_f_contiguous": self.is_f_contiguous,
            "is_compact": self.is_compact, "has_broadcast": self.has_broadcast,
            "has_negative_strides": self.has_negative_strides,
            "host_accessible": self.host_accessible,
        }

    def _state(self):
        return (self._dev_type, self._dev_id, self._cap_dev_type, self._cap_dev_id,
                self.shape, self.strides, self._strides_null, self._code, self._bits,
                self._lanes, self._byte_offset, self._data, self._ver_major,
                self._ver_minor, self._flags, <int>self._source)

    def __reduce__(self):
        return (_rebuild_info, (self._state(),))

    def __eq__(self, other):
        if not isinstance(other, TensorInfo):
            return NotImplemented
        return self._state() == (<TensorInfo>other)._state()

    def __hash__(self):
        return hash(self._state())


def _rebuild_info(state):
    """Unpickle a TensorInfo: rebuild the header it describes and read it again."""
    (dev_type, dev_id, cap_dev_type, cap_dev_id, shape, strides, strides_null, code, bits,
     lanes, byte_offset, data, ver_major, ver_minor, flags, source) = state
    cdef DLTensor t
    cdef int64_t shape_buf[_MAX_NDIM]
    cdef int64_t strides_buf[_MAX_NDIM]
    cdef int i
    cdef TensorInfo info
    if len(shape) > _MAX_NDIM or len(strides) != len(shape):
        raise MalformedTensorError(f"cannot unpickle a TensorInfo with ndim={len(shape)}")
    for i in range(len(shape)):
        shape_buf[i] = shape[i]
        strides_buf[i] = strides[i]
    t.data = <void*><uintptr_t>data
    t.device.device_type = cap_dev_type
    t.device.device_id = cap_dev_id
    t.ndim = len(shape)
    t.dtype.code = code
    t.dtype.bits = bits
    t.dtype.lanes = lanes
    t.shape = shape_buf
    t.strides = NULL if strides_null else strides_buf
    t.byte_offset = byte_offset
    info = _new_info(&t, <Source>source, flags)
    info._ver_major = ver_major
    info._ver_minor = ver_minor
    info._dev_type = dev_type
    info._dev_id = dev_id
    return info


# contract: never returns None; raises MalformedTensorError naming the bad field.
cdef TensorInfo _new_info(const DLTensor* t, Source source, uint64_t flags):
    """Copy and validate one DLTensor header into a new TensorInfo."""
    cdef TensorInfo info = TensorInfo.__new__(TensorInfo)
    cdef int32_t ndim = t.ndim
    cdef int i
    cdef int64_t extent, stride, size = 1, span = 0, bits_total, nbytes
    cdef bint zero = False

    if ndim < 0 or ndim > _MAX_NDIM:
        raise MalformedTensorError(
            f"DLTensor.ndim is {ndim}; it must be between 0 and {_MAX_NDIM} "
            f"(dlinspect.MAX_NDIM). The producer wrote a corrupt header.")
    if t.shape == NULL and ndim > 0:
        raise MalformedTensorError(
            f"DLTensor.shape is NULL but DLTensor.ndim is {ndim}; shape may be NULL "
            f"only when ndim is 0. The producer wrote a corrupt header.")
    info._alloc(ndim)
    info._ndim = ndim
    info._source = source
    info._flags = flags
    info._dev_type = info._cap_dev_type = t.device.device_type
    info._dev_id = info._cap_dev_id = t.device.device_id
    info._code = t.dtype.code
    info._bits = t.dtype.bits
    info._lanes = t.dtype.lanes
    info._byte_offset = t.byte_offset
    info._data = <uintptr_t>t.data
    info._strides_null = t.strides == NULL and ndim > 0

    for i in range(ndim):
        extent = t.shape[i]
        if extent < 0:
            raise MalformedTensorError(
                f"DLTensor.shape[{i}] is {extent}; extents must be >= 0. "
                f"The producer wrote a corrupt header.")
        info._shape[i] = extent
        if extent == 0:
            zero = True
    if zero:
        size = 0   # whatever the other extents: an empty tensor
    else:
        for i in range(ndim):
            if __builtin_mul_overflow(size, info._shape[i], &size):
                raise MalformedTensorError(
                    f"DLTensor.shape {_shape_text(t.shape, ndim)} holds more than 2**63-1 "
                    f"elements. The producer wrote a corrupt header.")
    if t.data == NULL and size > 0:
        raise MalformedTensorError(
            f"DLTensor.data is NULL but the shape {_shape_text(t.shape, ndim)} holds {size} "
            f"element(s); only zero-size tensors may have NULL data. The producer wrote a "
            f"corrupt header.")
    if t.strides == NULL:
        stride = 1
        for i in range(ndim - 1, -1, -1):
            info._strides[i] = stride
            # Bounded by size when size > 0; an empty tensor's nonzero extents may
            # multiply past int64 (e.g. (2**62, 0, 2**62)): its outer strides are
            # then never used to address anything and are written as 0.
            if info._shape[i] > 0 and __builtin_mul_overflow(stride, info._shape[i], &stride):
                stride = 0
    else:
        memcpy(info._strides, t.strides, ndim * sizeof(int64_t))
    info._size = size

    bits_total = <int64_t>t.dtype.bits * t.dtype.lanes
    if bits_total < 8 and not (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED):
        if __builtin_mul_overflow(size, bits_total, &nbytes):
            raise MalformedTensorError(
                f"{size} elements of {bits_total} bits overflow int64. "
                f"The producer wrote a corrupt header.")
        nbytes = (nbytes + 7) // 8
    elif __builtin_mul_overflow(size, (bits_total + 7) // 8, &nbytes):
        raise MalformedTensorError(
            f"DLTensor.shape {_shape_text(t.shape, ndim)} times {(bits_total + 7) // 8} "
            f"bytes per element overflows int64. The producer wrote a corrupt header.")
    info._nbytes = nbytes

    if size > 0:
        # The byte span the strides reach must fit in int64 as well.
        for i in range(ndim):
            if (info._strides[i] == INT64_MIN_VALUE
                    or __builtin_mul_overflow(info._shape[i] - 1, _abs64(info._strides[i]), &stride)
                    or __builtin_add_overflow(span, stride, &span)):
                raise MalformedTensorError(
                    f"DLTensor.strides {_shape_text(info._strides, ndim)} with shape "
                    f"{_shape_text(info._shape, ndim)} reach past 2**63-1 elements. "
                    f"The producer wrote a corrupt header.")
        if __builtin_mul_overflow(span, (bits_total + 7) // 8, &span):
            raise MalformedTensorError(
                f"DLTensor.strides {_shape_text(info._strides, ndim)} span more than "
                f"2**63-1 bytes. The producer wrote a corrupt header.")
    return info


cdef extern from *:
    """
    #define INT64_MIN_VALUE INT64_MIN
    """
    int64_t INT64_MIN_VALUE
    bint __builtin_mul_overflow(int64_t a, int64_t b, int64_t* out) noexcept nogil
    bint __builtin_add_overflow(int64_t a, int64_t b, int64_t* out) noexcept nogil


cdef str _shape_text(const int64_t* values, int32_t n):
    return "(" + ", ".join([str(values[i]) for i in range(n)]) + ("," if n == 1 else "") + ")"


# contract: returns a new TensorInfo or raises; never renames the capsule, never calls a deleter.
cdef TensorInfo _peek_capsule(object cap):
    cdef TensorInfo info
    cdef const char* name = PyCapsule_GetName(cap)
    cdef DLManagedTensorVersioned* dlm_ver
    cdef DLManagedTensor* dlm
    if name != NULL and strcmp(name, VERSIONED) == 0:
        dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, name)
        if dlm_ver.version.major != 1:
            raise UnsupportedVersionError(
                f"the capsule holds a DLManagedTensorVersioned of DLPack version "
                f"{dlm_ver.version.major}.{dlm_ver.version.minor}; dlinspect reads major "
                f"version 1 only, so no field past 'flags' was read. Ask the producer for "
                f"__dlpack__(max_version=(1, {DLINSPECT_DLPACK_MINOR})).")
        info = _new_info(&dlm_ver.dl_tensor, SRC_VERSIONED, dlm_ver.flags)
        info._ver_major = dlm_ver.version.major
        info._ver_minor = dlm_ver.version.minor
        return info
    if name != NULL and strcmp(name, LEGACY) == 0:
        dlm = <DLManagedTensor*>PyCapsule_GetPointer(cap, name)
        return _new_info(&dlm.dl_tensor, SRC_LEGACY, 0)
    _raise_bad_capsule(cap, name)


cdef int _raise_bad_capsule(object cap, const char* name) except -1:
    if name != NULL and (strcmp(name, LEGACY_USED) == 0 or strcmp(name, VERSIONED_USED) == 0):
        raise CapsuleConsumedError(
            f"the DLPack capsule is named {name.decode()!r}: a consumer already took "
            f"the tensor (a capsule is consumed exactly once), so nothing in it was read. "
            f"Call the producer's __dlpack__() again for a fresh capsule.")
    shown = "no name" if name == NULL else f"the name {name.decode(errors='replace')!r}"
    raise NotDLPackError(
        f"a PyCapsule with {shown} is not a DLPack tensor; expected 'dltensor' or "
        f"'dltensor_versioned'. Pass the array itself or the capsule its __dlpack__() returns.")


# ---- per-type lookups: exchange API table, protocol methods ----------------

cdef class _TypeEntry:
    cdef const DLPackExchangeAPI* api
    cdef bint has_dlpack
    cdef bint has_device

cdef dict _type_cache = {}


cdef _TypeEntry _entry_for(object tp):
    cdef PyObject* hit = PyDict_GetItemWithError(_type_cache, tp)
    if hit != NULL:
        return <_TypeEntry>hit
    cdef _TypeEntry entry = _TypeEntry.__new__(_TypeEntry)
    entry.api = NULL
    api_obj = getattr(tp, "__dlpack_c_exchange_api__", None)
    cdef const DLPackExchangeAPI* api
    if api_obj is not None and PyCapsule_CheckExact(api_obj) and \
            PyCapsule_IsValid(api_obj, EXCHANGE_API):
        api = <const DLPackExchangeAPI*>PyCapsule_GetPointer(api_obj, EXCHANGE_API)
        if api.header.version.major == 1 and api.dltensor_from_py_object_no_sync != NULL:
            entry.api = api
    entry.has_dlpack = hasattr(tp, "__dlpack__")
    # numpy.ndarray fills its capsule's device and answers __dlpack_device__ from
    # one function (array_get_dl_device in numpy's dlpack.c): they cannot
    # disagree, so the second call (about 40 ns) is skipped for it alone.
    entry.has_device = hasattr(tp, "__dlpack_device__") and tp is not _np_ndarray
    _type_cache[tp] = entry
    return entry


def exchange_api_version(tp):
    """``(major, minor)`` of the DLPack C exchange API a type offers, or None.

    None also where the table exists but peek cannot use it (major version
    other than 1, or no ``dltensor_from_py_object_no_sync``).
    """
    cdef _TypeEntry entry = _entry_for(tp)
    if entry.api == NULL:
        return None
    return (entry.api.header.version.major, entry.api.header.version.minor)


cdef object _call_dlpack(object obj):
    """``obj.__dlpack__(max_version=(1, 3))``, retrying bare on TypeError (older producers)."""
    cdef PyObject* args[2]
    args[0] = <PyObject*>obj
    args[1] = <PyObject*>_MAX_VERSION
    try:
        return PyObject_VectorcallMethod(_S_DLPACK, args, 1, <PyObject*>_KW_MAX_VERSION)
    except TypeError:
        return obj.__dlpack__()


cdef int _device_of(object obj, int32_t* dev_type, int32_t* dev_id) except -1:
    cdef PyObject* args[1]
    cdef tuple pair
    args[0] = <PyObject*>obj
    try:
        dev = PyObject_VectorcallMethod(_S_DLPACK_DEVICE, args, 1, NULL)
    except (BufferError, RuntimeError, ValueError) as exc:
        raise producer_error(obj, exc) from exc
    # Checked before indexing: this module is compiled without bounds checks.
    if type(dev) is tuple and PyTuple_GET_SIZE(dev) == 2:
        pair = <tuple>dev
        if isinstance(pair[0], int) and isinstance(pair[1], int):
            try:
                dev_type[0] = pair[0]
                dev_id[0] = pair[1]
                return 0
            except OverflowError:
                pass
    raise MalformedTensorError(
        f"{type(obj).__name__}.__dlpack_device__() returned {dev!r}; the array API requires "
        f"a (device_type, device_id) tuple of two ints (int32).")


@cython.binding(False)
@cython.always_allow_keywords(False)
def peek(obj):
    """Read a DLPack tensor's header without consuming it.

    Parameters
    ----------
    obj : PyCapsule or object with ``__dlpack__``
        A capsule named ``"dltensor"`` (``DLManagedTensor``) or
        ``"dltensor_versioned"`` (``DLManagedTensorVersioned``), or an array
        from any producer (NumPy, PyTorch, JAX, CuPy...).

    Returns
    -------
    TensorInfo
        Device, shape and strides (in elements), dtype, flags and layout facts.

    Raises
    ------
    CapsuleConsumedError
        The capsule is named ``used_dltensor[_versioned]`` (a ``ValueError``);
        nothing in it is dereferenced.
    UnsupportedVersionError
        A versioned capsule with major version other than 1 (a ``BufferError``);
        nothing past ``flags`` is read.
    MalformedTensorError
        A corrupt header: ``ndim`` outside ``[0, MAX_NDIM]``, NULL ``shape`` with
        ``ndim > 0``, a negative extent, or sizes overflowing int64 (a ``BufferError``).
    NotDLPackError
        ``obj`` is neither a DLPack capsule nor has ``__dlpack__`` (a ``TypeError``).
    ProducerError
        The producer's ``__dlpack__`` raised ``BufferError``; its reason is kept.

    Notes
    -----
    A capsule is read in place: it is never renamed and its deleter is never
    called, so any consumer can take it afterwards (DLPack python_spec,
    "consumed exactly once"). For objects whose type has the DLPack 1.3 C
    exchange API (``type(obj).__dlpack_c_exchange_api__``, e.g. ``torch.Tensor``),
    the header is filled on the stack by ``dltensor_from_py_object_no_sync``
    and no capsule is made; the device is then the one that API reports.
    Otherwise ``obj.__dlpack__(max_version=(1, 3))`` is called (bare
    ``__dlpack__()`` on ``TypeError``, for older producers), the capsule is read
    and released normally; ``__dlpack_device__()``, where present, gives the
    device, and the header's own device is kept as ``capsule_device``.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> info = dlinspect.peek(np.zeros((3, 4), np.float32))
    >>> info.shape, info.strides, info.dtype_name, info.is_c_contiguous
    ((3, 4), (4, 1), 'float32', True)
    """
    cdef DLTensor t
    cdef _TypeEntry entry
    cdef int32_t dev_type, dev_id
    cdef TensorInfo info
    if PyCapsule_CheckExact(obj):
        return _peek_capsule(obj)
    entry = _entry_for(type(obj))
    if entry.api != NULL:
        memset(&t, 0, sizeof(DLTensor))
        try:
            _fill_exchange(entry.api, obj, &t)
        except (BufferError, RuntimeError, ValueError) as exc:
            raise producer_error(obj, exc) from exc
        return _new_info(&t, SRC_EXCHANGE, 0)
    if not entry.has_dlpack:
        raise NotDLPackError(
            f"an object of type {type(obj).__module__}.{type(obj).__qualname__} is neither a "
            f"DLPack capsule nor has __dlpack__; pass a tensor from a DLPack producer "
            f"(NumPy, PyTorch, JAX, CuPy...) or the capsule its __dlpack__() returns.")
    try:
        cap = _call_dlpack(obj)
    except (BufferError, RuntimeError, ValueError) as exc:
        raise producer_error(obj, exc) from exc
    if not PyCapsule_CheckExact(cap):
        raise NotDLPackError(
            f"{type(obj).__name__}.__dlpack__() returned {type(cap).__name__}, not a PyCapsule.")
    info = _peek_capsule(cap)
    if entry.has_device:
        _device_of(obj, &dev_type, &dev_id)
        info._dev_type = dev_type
        info._dev_id = dev_id
    return info


# contract: returns 0, or -1 with a Python error set (the producer's, or ours if it set none).
cdef int _fill_exchange(const DLPackExchangeAPI* api, object obj, DLTensor* t) except -1:
    if api.dltensor_from_py_object_no_sync(<void*>obj, t) == 0:
        return 0
    if PyErr_Occurred() == NULL:
        raise ProducerError(
            f"{type(obj).__name__}'s DLPack exchange API failed without setting an error.")
    return -1


_METHOD = _re.compile(r"\.\w+\(\)")  # ".detach()" in a hint
_HINTS = (
    ("requires_grad", "call .detach() first (the tensor takes part in autograd)"),
    ("gradient", "call .detach() first (the tensor takes part in autograd)"),
    ("conjugate", "call .resolve_conj() first (the conjugate bit is set lazily)"),
    ("conj", "call .resolve_conj() first (the conjugate bit is set lazily)"),
    ("negative bit", "call .resolve_neg() first"),
    ("sparse", "call .to_dense() first (DLPack describes strided tensors only)"),
    ("have storage", "call .to_dense() first (DLPack describes strided tensors only)"),
    ("strided", "call .to_dense() or .contiguous() first (DLPack describes strided tensors only)"),
    ("readonly", "pass the array to dlinspect, which asks for a versioned capsule, or copy it"),
    ("only supports signed/unsigned integers",
     "NumPy exports no other dtype (e.g. ml_dtypes bfloat16); dlinspect.to_jax, to_host and "
     "plan take such arrays, or pass x.view(np.uint16)"),
    ("dtype", "convert it to a numeric dtype first (DLPack has no string or object types)"),
    ("read-only", "pass the array to dlinspect, which asks for a versioned capsule, or copy it"),
)


def producer_error(obj, BaseException exc):
    """A ProducerError that keeps the producer's reason and adds what to do."""
    # First line only: C++ producers append a stack trace (kept in __cause__).
    reason = (str(exc) or type(exc).__name__).split("\n")[0].rstrip()
    if not reason.endswith((".", "!", "?")):
        reason += "."
    low = reason.lower()
    todo = next((hint for key, hint in _HINTS if key in low),
                "convert the tensor with its own library first (e.g. .cpu(), .contiguous())")
    method = _METHOD.search(todo)
    fix = "" if method and method.group(0) in reason else f" To fix: {todo}."
    return ProducerError(
        f"{type(obj).__module__}.{type(obj).__qualname__}.__dlpack__() refused to export "
        f"the tensor: {reason}{fix}")


# ---- capsules that dlinspect owns: factory and adapters --------------------

cdef void _owned_capsule_destructor(object cap) noexcept:
    # Called with the GIL held. Frees the tensor only while nobody consumed it.
    cdef DLManagedTensor* dlm
    cdef DLManagedTensorVersioned* dlm_ver
    if PyCapsule_IsValid(cap, LEGACY):
        dlm = <DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY)
        if dlm.deleter != NULL:
            dlm.deleter(dlm)
    elif PyCapsule_IsValid(cap, VERSIONED):
        dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
        if dlm_ver.deleter != NULL:
            dlm_ver.deleter(dlm_ver)


cdef class DeleterCounter:
    """Counts the calls of the deleters of capsules made by ``make_capsule``.

    Attributes
    ----------
    calls : int
        How many deleters attached to this counter have run.
    """
    cdef readonly Py_ssize_t calls

    def __repr__(self):
        return f"<DeleterCounter calls={self.calls}>"


ctypedef struct _FactoryCtx:
    PyObject* owner        # buffer exporter kept alive, or NULL
    Py_buffer view
    bint has_view
    PyObject* counter      # DeleterCounter, or NULL
    int64_t* shape
    int64_t* strides


cdef void _factory_release(_FactoryCtx* ctx) noexcept nogil:
    if ctx == NULL:
        return
    if not Py_IsInitialized():
        return                     # interpreter gone: leak rather than crash
    with gil:
        if ctx.counter != NULL:
            (<DeleterCounter>ctx.counter).calls += 1
            Py_XDECREF(ctx.counter)
        if ctx.has_view:
            PyBuffer_Release(&ctx.view)
        Py_XDECREF(ctx.owner)
    free(ctx.shape)
    free(ctx.strides)
    free(ctx)


cdef void _factory_deleter(DLManagedTensor* dlm) noexcept nogil:
    _factory_release(<_FactoryCtx*>dlm.manager_ctx)
    free(dlm)


cdef void _factory_deleter_ver(DLManagedTensorVersioned* dlm_ver) noexcept nogil:
    _factory_release(<_FactoryCtx*>dlm_ver.manager_ctx)
    free(dlm_ver)


cdef int64_t* _int64_array(object values, Py_ssize_t n) except? NULL:
    # n entries (n >= len(values)); entries past len(values) are 1.
    cdef int64_t* out = <int64_t*>malloc((n if n > 0 else 1) * sizeof(int64_t))
    cdef Py_ssize_t i
    if out == NULL:
        raise MemoryError()
    for i in range(n):
        out[i] = 1
    try:
        for i in range(len(values)):
            out[i] = values[i]
    except BaseException:
        free(out)
        raise
    return out


def _make_capsule(data, address, shape, ndim, strides, int code, int bits, int lanes,
                  int device_type, int device_id, uint64_t byte_offset, bint versioned,
                  int version_major, int version_minor, uint64_t flags, counter,
                  name, bint null_deleter):
    """Build a capsule with any header; see dlinspect.testing.make_capsule."""
    cdef _FactoryCtx* ctx = <_FactoryCtx*>malloc(sizeof(_FactoryCtx))
    cdef DLTensor* t
    cdef DLManagedTensor* dlm = NULL
    cdef DLManagedTensorVersioned* dlm_ver = NULL
    cdef Py_ssize_t n_alloc
    cdef int32_t nd
    if ctx == NULL:
        raise MemoryError()
    memset(ctx, 0, sizeof(_FactoryCtx))
    try:
        nd = len(shape) if ndim is None else ndim
        n_alloc = max(min(nd, _FORGE_NDIM_BACKED), len(shape) if shape is not None else 0,
                      len(strides) if strides is not None else 0)
        if shape is not None:
            ctx.shape = _int64_array(shape, n_alloc)
        if strides is not None:
            ctx.strides = _int64_array(strides, n_alloc)
        if data is not None:
            if address is None:
                PyObject_GetBuffer(data, &ctx.view, PyBUF_ANY_CONTIGUOUS)
                ctx.has_view = True
            Py_INCREF(data)
            ctx.owner = <PyObject*>data
        if counter is not None:
            if not isinstance(counter, DeleterCounter):
                raise TypeError("counter must be a dlinspect.testing.DeleterCounter")
            Py_INCREF(counter)
            ctx.counter = <PyObject*>counter
        if versioned:
            dlm_ver = <DLManagedTensorVersioned*>malloc(sizeof(DLManagedTensorVersioned))
            if dlm_ver == NULL:
                raise MemoryError()
            memset(dlm_ver, 0, sizeof(DLManagedTensorVersioned))
            dlm_ver.version.major = version_major
            dlm_ver.version.minor = version_minor
            dlm_ver.flags = flags
            dlm_ver.manager_ctx = ctx
            if not null_deleter:
                dlm_ver.deleter = _factory_deleter_ver
            t = &dlm_ver.dl_tensor
        else:
            dlm = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
            if dlm == NULL:
                raise MemoryError()
            memset(dlm, 0, sizeof(DLManagedTensor))
            dlm.manager_ctx = ctx
            if not null_deleter:
                dlm.deleter = _factory_deleter
            t = &dlm.dl_tensor
        if address is not None:
            t.data = <void*><uintptr_t>address
        elif ctx.has_view:
            t.data = ctx.view.buf
        t.device.device_type = device_type
        t.device.device_id = device_id
        t.ndim = nd
        t.dtype.code = code
        t.dtype.bits = bits
        t.dtype.lanes = lanes
        t.shape = ctx.shape
        t.strides = ctx.strides
        t.byte_offset = byte_offset
        if name is None:
            cname = VERSIONED if versioned else LEGACY
        else:
            cname = _static_name(name)
        cap = PyCapsule_New(<void*>dlm_ver if versioned else <void*>dlm, cname,
                            _owned_capsule_destructor)
    except BaseException:
        _factory_release(ctx)
        free(dlm)
        free(dlm_ver)
        raise
    # With null_deleter the context is never released (a deliberate, small leak):
    # the header must keep pointing at live memory for as long as anyone reads it.
    return cap


#: make_capsule backs a forged ndim with at most this many shape/stride entries.
cdef Py_ssize_t _FORGE_NDIM_BACKED = 1024

# Capsule names must outlive the capsule: keep every forged name interned here.
cdef dict _names = {}

cdef const char* _static_name(str name) except NULL:
    data = _names.get(name)
    if data is None:
        data = name.encode()
        _names[name] = data
    return <const char*>(<bytes>data)


# ---- versioned -> legacy adapter (JAX imports "dltensor" only) --------------

cdef void _adapter_deleter(DLManagedTensor* dlm) noexcept nogil:
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>dlm.manager_ctx
    free(dlm)
    if dlm_ver != NULL and dlm_ver.deleter != NULL:
        dlm_ver.deleter(dlm_ver)


cdef void _free_only_deleter(DLManagedTensor* dlm) noexcept nogil:
    free(dlm)


def legacy_from_versioned(cap, int device_type=-1):
    """Wrap a "dltensor_versioned" capsule in a zero-copy "dltensor" capsule.

    Consumes ``cap`` (renames it ``used_dltensor_versioned``). The returned
    capsule holds a ``DLManagedTensor`` sharing the same ``DLTensor`` fields;
    its deleter calls the versioned deleter exactly once. ``device_type``, when
    given, replaces the header's device type (for a pinned tensor whose
    capsule says kDLCPU). Undo with :func:`restore_versioned` while the new
    capsule is still unconsumed.
    """
    if not PyCapsule_IsValid(cap, VERSIONED):
        _raise_bad_capsule(cap, PyCapsule_GetName(cap) if PyCapsule_CheckExact(cap) else NULL)
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
    cdef DLManagedTensor* dlm = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
    if dlm == NULL:
        raise MemoryError()
    dlm.dl_tensor = dlm_ver.dl_tensor
    if device_type >= 0:
        dlm.dl_tensor.device.device_type = device_type
    dlm.manager_ctx = dlm_ver
    dlm.deleter = _adapter_deleter
    try:
        out = PyCapsule_New(dlm, LEGACY, _owned_capsule_destructor)
    except BaseException:
        free(dlm)
        raise
    PyCapsule_SetName(cap, VERSIONED_USED)
    return out


def restore_versioned(adapter, original):
    """Undo :func:`legacy_from_versioned` after a failed import.

    ``adapter`` must still be named "dltensor" (unconsumed). ``original`` gets
    its "dltensor_versioned" name back and owns the tensor again; the adapter is
    neutralised so that it frees only its own struct.
    """
    if not PyCapsule_IsValid(adapter, LEGACY) or not PyCapsule_IsValid(original, VERSIONED_USED):
        return False
    cdef DLManagedTensor* dlm = <DLManagedTensor*>PyCapsule_GetPointer(adapter, LEGACY)
    if dlm.deleter != _adapter_deleter:
        return False
    dlm.manager_ctx = NULL
    dlm.deleter = _free_only_deleter
    PyCapsule_SetName(original, VERSIONED)
    return True


def capsule_name(cap):
    """The name of a PyCapsule as str (None for an unnamed one)."""
    cdef const char* name = PyCapsule_GetName(cap)
    return None if name == NULL else name.decode(errors="replace")


# ---- host views: keep a consumed tensor alive behind a NumPy array ----------

cdef class HostOwner:
    """Owns one consumed DLPack tensor; its deleter runs when this object dies.

    Exposes ``__array_interface__`` (version 3) over the tensor's bytes so that
    ``numpy.asarray`` can view them without a copy; ``typestr`` is an unsigned
    integer of the element's size, for the caller to ``.view()`` as the real dtype.
    """
    cdef DLManagedTensor* dlm
    cdef DLManagedTensorVersioned* dlm_ver
    cdef readonly object info
    cdef readonly bint read_only

    def __dealloc__(self):
        if self.dlm != NULL and self.dlm.deleter != NULL:
            self.dlm.deleter(self.dlm)
        if self.dlm_ver != NULL and self.dlm_ver.deleter != NULL:
            self.dlm_ver.deleter(self.dlm_ver)

    @property
    def __array_interface__(self):
        info = self.info
        return {
            "version": 3,
            "shape": info.shape,
            "typestr": f"|u{info.itemsize}" if info.itemsize in (1, 2, 4, 8) else f"|V{info.itemsize}",
            "data": (info.data_ptr, bool(self.read_only)),
            "strides": info.byte_strides,
        }


def take(cap, bint read_only):
    """Consume a DLPack capsule into a :class:`HostOwner` (renames it ``used_*``)."""
    cdef HostOwner owner = HostOwner.__new__(HostOwner)
    cdef const char* name = PyCapsule_GetName(cap) if PyCapsule_CheckExact(cap) else NULL
    owner.info = _peek_capsule(cap)
    owner.read_only = read_only
    if name != NULL and strcmp(name, VERSIONED) == 0:
        owner.dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
        PyCapsule_SetName(cap, VERSIONED_USED)
    else:
        owner.dlm = <DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY)
        PyCapsule_SetName(cap, LEGACY_USED)
    return owner


def peek_exported(cap, int32_t device_type, int32_t device_id):
    """Peek a capsule a producer just exported, with the device its
    ``__dlpack_device__`` reported (the header's own is kept as capsule_device)."""
    cdef TensorInfo info = _peek_capsule(cap)
    info._dev_type = device_type
    info._dev_id = device_id
    return info


def take_bytes(HostOwner owner, Py_ssize_t nbytes):
    """A read-only uint8 NumPy-compatible view of the first ``nbytes`` of an owner's data."""
    return _ByteView(owner, nbytes)


cdef class _ByteView:
    cdef readonly HostOwner owner
    cdef Py_ssize_t nbytes

    def __cinit__(self, HostOwner owner, Py_ssize_t nbytes):
        self.owner = owner
        self.nbytes = nbytes

    @property
    def __array_interface__(self):
        return {"version": 3, "shape": (self.nbytes,), "typestr": "|u1",
                "data": (self.owner.info.data_ptr, True)}


def as_legacy(cap):
    """``cap`` itself if it is a "dltensor" capsule; a zero-copy legacy adapter
    (see :func:`legacy_from_versioned`, which consumes ``cap``) if versioned."""
    if PyCapsule_IsValid(cap, LEGACY):
        return cap
    return legacy_from_versioned(cap)


# ---- to_jax's fast path ----------------------------------------------------

cdef class JaxFastPath:
    """What to_jax's fast path needs from the installed JAX, fixed at start-up.

    Built by ``dlinspect._jax.JaxCaps.fast_path``. ``import_fn(capsule,
    device, stream, copy, dl_device_type)`` imports a "dltensor" capsule (jaxlib's
    own function, or a wrapper over the public API); ``ok_dtypes`` holds
    ``code | bits << 8`` of the one-lane dtypes JAX was found to import and is
    filled by the dtype probe; ``x64.value`` is JAX's ``jax_enable_x64``.
    ``check_pinned``: JAX has a backend for pinned host memory, so a kDLCPU
    header from the exchange API (which says kDLCPU for a pinned torch tensor)
    is not enough and ``__dlpack_device__`` is asked. ``narrow`` maps the
    ``code | bits << 8`` key of a 64-bit dtype to ``(key of the 32-bit dtype JAX
    narrows it to with x64 off, warning text)``; ``warn(text)`` emits that
    warning (a DLInspectWarning at the caller's line). ``guard_for(type)`` gives,
    once per type with the exchange API, None or a ``guard(x)`` that is True when
    the producer's ``__dlpack__`` would export ``x`` as it is: then the tensor
    is taken through ``managed_tensor_from_py_object_no_sync`` instead of the
    Python ``__dlpack__`` (the C API does not make the producer's refusals).
    """
    cdef object import_fn, cpu_device, x64, warn, guard_for
    cdef set ok_dtypes
    cdef dict narrow, guards
    cdef uintptr_t cpu_align
    cdef bint check_pinned

    def __cinit__(self, import_fn, cpu_device, uintptr_t cpu_align, x64, set ok_dtypes,
                  bint check_pinned, dict narrow=None, warn=None, guard_for=None):
        if cpu_align == 0 or (cpu_align & (cpu_align - 1)) != 0:
            raise ValueError(f"cpu_align must be a power of two, not {cpu_align}")
        self.import_fn = import_fn
        self.cpu_device = cpu_device
        self.cpu_align = cpu_align
        self.x64 = x64
        self.ok_dtypes = ok_dtypes
        self.check_pinned = check_pinned
        self.narrow = {} if narrow is None else narrow
        self.warn = warn
        self.guard_for = guard_for
        self.guards = {}


ctypedef int (*_ManagedFromPy)(void* py_object, DLManagedTensorVersioned** out) noexcept


cdef object _owning_export(object x, const DLPackExchangeAPI* api):
    """Take ``x`` through the exchange API's ``managed_tensor_from_py_object_no_sync``
    into a "dltensor_versioned" capsule; None where the API declines."""
    cdef DLManagedTensorVersioned* dlm_ver = NULL
    cdef _ManagedFromPy take_fn = <_ManagedFromPy>api.managed_tensor_from_py_object_no_sync
    if take_fn == NULL or take_fn(<void*>x, &dlm_ver) != 0 or dlm_ver == NULL:
        PyErr_Clear()  # the general route asks __dlpack__ and reports its reason
        return None
    try:
        return PyCapsule_New(dlm_ver, VERSIONED, _owned_capsule_destructor)
    except BaseException:
        if dlm_ver.deleter != NULL:
            dlm_ver.deleter(dlm_ver)
        raise


cdef tuple _NOT_FAST = (None, None)
cdef object _MISSING = object()
# Larger tensors are copied by NumPy on the general route: its copy and cast are
# faster there (vectorised, huge pages) and release the GIL in the same way.
cdef int64_t _COPY_MAX_BYTES = 1 << 20


cdef void _free_block_deleter(DLManagedTensor* dlm) noexcept nogil:
    free(dlm)   # header, shape, strides and data are one allocation


cdef object _aligned_copy(TensorInfo info, int dst_code, int dst_bits):
    """A "dltensor" capsule owning a 64-byte aligned copy of ``info``'s (compact)
    memory: the bytes as they are when (dst_code, dst_bits) is the source's dtype,
    else each element cast as NumPy's unsafe cast and JAX's x64 narrowing do
    (integers wrap, floats round to nearest, IEEE)."""
    cdef int32_t ndim = info._ndim
    cdef int64_t n = info._size, i
    cdef size_t head = sizeof(DLManagedTensor) + 2 * <size_t>ndim * sizeof(int64_t)
    cdef size_t dst_bytes = <size_t>n * (dst_bits // 8)
    cdef char* block = <char*>malloc(head + 64 + dst_bytes)
    if block == NULL:
        raise MemoryError()
    cdef DLManagedTensor* dlm = <DLManagedTensor*>block
    cdef int64_t* shape = <int64_t*>(block + sizeof(DLManagedTensor))
    cdef char* dst = block + head + ((64 - (<uintptr_t>(block + head) & 63)) & 63)
    cdef const char* src = <const char*>(info._data + <uintptr_t>info._byte_offset)
    memcpy(shape, info._shape, ndim * sizeof(int64_t))
    memcpy(shape + ndim, info._strides, ndim * sizeof(int64_t))
    cdef double d
    cdef uint64_t u
    # Compact memory: the elements form one dense block, cast in memory order;
    # the copy keeps the source's strides. The source may be misaligned for its
    # type (DLPack allows it): each element is loaded with memcpy.
    cdef bint floating = info._code == kDLComplex or info._code == kDLFloat
    cdef int64_t count = 2 * n if info._code == kDLComplex else n
    cdef bint same = dst_code == info._code and dst_bits == info._bits
    with nogil:
        if same:
            memcpy(dst, src, dst_bytes)
        elif floating:
            for i in range(count):
                memcpy(&d, src + 8 * i, 8)
                (<float*>dst)[i] = <float>d
        else:
            for i in range(count):   # kDLInt / kDLUInt: keep the low 32 bits
                memcpy(&u, src + 8 * i, 8)
                (<uint32_t*>dst)[i] = <uint32_t>u
    memset(dlm, 0, sizeof(DLManagedTensor))
    dlm.dl_tensor.data = dst
    dlm.dl_tensor.device.device_type = kDLCPU
    dlm.dl_tensor.device.device_id = 0
    dlm.dl_tensor.ndim = ndim
    dlm.dl_tensor.dtype.code = dst_code
    dlm.dl_tensor.dtype.bits = dst_bits
    dlm.dl_tensor.dtype.lanes = 1
    dlm.dl_tensor.shape = shape
    dlm.dl_tensor.strides = shape + ndim
    dlm.manager_ctx = NULL
    dlm.deleter = _free_block_deleter
    try:
        return PyCapsule_New(dlm, LEGACY, _owned_capsule_destructor)
    except BaseException:
        free(block)
        raise


@cython.binding(False)
def fast_to_jax(x, JaxFastPath fp, bint may_copy=False):
    """Import ``x`` into JAX's CPU device when nothing needs deciding.

    Takes kDLCPU memory (device id 0) that is compact, aligned to XLA:CPU's
    alignment, writable, non-empty, of a dtype JAX keeps as it is: no copy.
    Exports once (``__dlpack__(max_version=(1, 3))``), validates the header as
    :func:`peek` does, adapts a versioned capsule to a legacy one, and calls
    ``fp.import_fn``. With ``may_copy`` (``copy=None``), compact, writable
    tensors of at most 1 MiB that are only misaligned, or only need JAX's x64
    narrowing, are copied in C into aligned memory (cast where narrowing, with
    the DLInspectWarning) and the source is freed at once.

    Returns
    -------
    jax.Array, or tuple
        The array; else ``(capsule, TensorInfo)`` when ``x`` was exported (or is
        a capsule) but needs the general route, or ``(None, None)`` when nothing
        was exported (not a DLPack object, or memory not on the CPU).

    Raises
    ------
    ProducerError, MalformedTensorError, UnsupportedVersionError, CapsuleConsumedError
        As :func:`peek`; and whatever the import raises, with a versioned capsule
        given back its name (unconsumed).
    """
    cdef DLTensor t
    cdef _TypeEntry entry
    cdef int32_t dev_type = -1, dev_id = 0
    cdef TensorInfo info
    cdef bint asked = False
    cap = None
    if PyCapsule_CheckExact(x):
        cap = x
    else:
        entry = _entry_for(type(x))
        if not entry.has_dlpack:
            return _NOT_FAST
        if entry.api != NULL and not fp.check_pinned:
            # The exchange API fills the header on the stack: the device, cheaply.
            memset(&t, 0, sizeof(DLTensor))
            if entry.api.dltensor_from_py_object_no_sync(<void*>x, &t) != 0:
                PyErr_Clear()  # the general route asks __dlpack__ and reports its reason
                return _NOT_FAST
            if t.device.device_type != kDLCPU:
                return _NOT_FAST
            guard = fp.guards.get(type(x), _MISSING)
            if guard is _MISSING:
                guard = fp.guards[type(x)] = (fp.guard_for(type(x)) if fp.guard_for is not None
                                              else None)
            if guard is not None:
                if not guard(x):   # refused or lazily negated: the general route says why
                    return _NOT_FAST
                cap = _owning_export(x, entry.api)
                if cap is None:
                    return _NOT_FAST
        elif entry.has_device:
            _device_of(x, &dev_type, &dev_id)
            if dev_type != kDLCPU:
                return _NOT_FAST
            asked = True
        if cap is None:
            try:
                cap = _call_dlpack(x)
            except (BufferError, RuntimeError, ValueError) as exc:
                if type(x) is _np_ndarray:  # e.g. bfloat16, which NumPy will not export:
                    return _NOT_FAST        # the general route makes the capsule itself
                raise producer_error(x, exc) from exc
            if not PyCapsule_CheckExact(cap):
                return _NOT_FAST
    info = _peek_capsule(cap)
    if asked:
        info._dev_type = dev_type
        info._dev_id = dev_id
    key = info._code | (info._bits << 8)
    if info._dev_type != kDLCPU or info._dev_id != 0 or key not in fp.ok_dtypes:
        return (cap, info)
    cdef int max_bits = 64 if fp.x64.value else 32
    if not info._plain(fp.cpu_align, max_bits):
        if may_copy and info._lanes == 1 and info._size > 0 and info._bits % 8 == 0 \
                and info._nbytes <= _COPY_MAX_BYTES \
                and not (info._flags & DLPACK_FLAG_BITMASK_READ_ONLY) and info._is_compact():
            if info._bits <= max_bits:       # only misaligned
                return _copy_and_import(cap, info, fp, key, None)
            if key in fp.narrow:             # x64 off: only narrowing (and maybe alignment)
                dst_key, text = fp.narrow[key]
                return _copy_and_import(cap, info, fp, dst_key, text)
        return (cap, info)
    if info._source == SRC_LEGACY:
        return fp.import_fn(cap, fp.cpu_device, None, None, <int>kDLCPU)
    legacy = legacy_from_versioned(cap)
    try:
        return fp.import_fn(legacy, fp.cpu_device, None, None, <int>kDLCPU)
    except BaseException:
        restore_versioned(legacy, cap)
        raise


cdef object _copy_and_import(object cap, TensorInfo info, JaxFastPath fp, object dst_key,
                             object text):
    """Copy host memory into aligned memory (cast to ``dst_key``'s dtype, warning
    ``text``, where JAX narrows), import the copy, and free the source right away
    (consuming ``cap``)."""
    if dst_key not in fp.ok_dtypes:
        return (cap, info)
    if text is not None:
        fp.warn(text)   # before consuming: -W error leaves the capsule as it was
    copy = _aligned_copy(info, dst_key & 0xFF, dst_key >> 8)
    arr = fp.import_fn(copy, fp.cpu_device, None, None, <int>kDLCPU)
    del copy
    owner = take(cap, True)   # consume the source; its deleter runs right here
    del owner
    return arr
