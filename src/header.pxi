# header.pxi: TensorInfo, a DLTensor header copied out and validated field by field.

# Where a TensorInfo's header came from.
cdef enum Source:
    SRC_LEGACY = 0       # a "dltensor" capsule
    SRC_VERSIONED = 1    # a "dltensor_versioned" capsule
    SRC_EXCHANGE = 2     # the DLPack 1.3 C exchange API; no capsule was made
    SRC_NDARRAY = 3      # a NumPy array's own fields, as its export gives them; no capsule was made

_SOURCE_NAMES = ("dltensor", "dltensor_versioned", "exchange_api", "ndarray")

# TensorInfo.to_dict's keys, in order: the attributes of that name.
_DICT_FIELDS = (
    "device_type device_id capsule_device ndim shape strides byte_strides strides_null dtype "
    "dtype_name itemsize size nbytes byte_offset data_ptr alignment version flags read_only "
    "is_copied capsule_name source is_c_contiguous is_f_contiguous is_compact has_broadcast "
    "has_negative_strides host_accessible").split()

cdef enum:   # TensorInfo._contiguous's orders
    _F_ORDER = 0
    _C_ORDER = 1
    _ANY_ORDER = 2


@cython.freelist(32)
@cython.final
cdef class TensorInfo:
    """What a DLPack header says about a tensor, read without consuming it.

    Made by :func:`dlinspect.peek`; immutable, picklable, cheap to create.
    Shapes and strides are copied out of the producer's memory, so the info
    stays valid after the tensor is freed. Every derived integer is exact (a
    header whose sizes overflow int64 raises ``MalformedTensorError`` instead).

    Attributes
    ----------
    device_type : DLDeviceType or int
        The device, from ``__dlpack_device__`` when the producer has it (reconciled
        with the header, see Notes), else from the header. Unknown values are
        kept as plain ints.
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
        ``strides`` times ``itemsize``, in bytes (exact Python ints).
    strides_null : bool
        The header had ``strides == NULL`` (allowed before DLPack 1.2).
    dtype : DLDataType
        ``(code, bits, lanes)``.
    dtype_name : str
        NumPy / ml_dtypes name: ``"float32"``, ``"bool"``, ``"bfloat16"``,
        ``"float8_e4m3fn"``, ``"int4"``; ``"float32x4"`` for 4 lanes.
    numpy_dtype : numpy.dtype or None
        The dtype of one lane where NumPy (or ml_dtypes, when installed) has
        one; a vector type (``lanes > 1``) becomes a trailing axis of this dtype
        in :func:`dlinspect.to_host`.
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
        READ_ONLY flag of a versioned capsule (a NumPy array read without one: not
        writeable); None where the source cannot say.
    is_copied : bool or None
        IS_COPIED flag of a versioned capsule; None where the source cannot say.
    capsule_name : str or None
        ``"dltensor"`` or ``"dltensor_versioned"``; None when no capsule was made.
    source : str
        ``"dltensor"``, ``"dltensor_versioned"``, ``"exchange_api"``, or ``"ndarray"``
        (the header :func:`to_jax` and :func:`plan` read from a NumPy array's own fields
        where JAX takes the array itself: no export).
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

    Notes
    -----
    Device reconciliation (array API ``__dlpack_device__``; DLPack python_spec):
    the producer's ``__dlpack_device__`` and the header must name the same
    device, with one documented exception, pinned host memory reported as
    kDLCUDAHost/kDLROCMHost with a kDLCPU header. A device id that is not an int
    (paddlepaddle returns ``(kDLCPU, None)``) is taken from the header when the
    types agree. Any other disagreement is a ``ProducerError`` naming both.
    """

    cdef readonly int32_t device_id, ndim
    cdef readonly int64_t size, nbytes, itemsize
    cdef readonly uint64_t byte_offset, flags
    cdef readonly bint strides_null
    cdef int32_t _dev_type, _cap_dev_type, _cap_dev_id
    cdef uint8_t _code, _bits
    cdef uint16_t _lanes
    cdef uintptr_t _data
    cdef int64_t _below, _above   # bytes the elements reach before _ptr(), and from it on
    cdef bint _bare               # read from a bare capsule: no producer vouches for its pointer
    cdef uint32_t _ver_major, _ver_minor
    cdef Source _source
    cdef int64_t* _shape
    cdef int64_t* _strides
    cdef int64_t _inline[2 * _INLINE_NDIM]

    def __dealloc__(self):
        if self._shape != self._inline:
            free(self._shape)     # NULL (never filled) or malloc'd by _alloc

    def __init__(self, *args, **kwargs):
        raise TypeError("TensorInfo is made by dlinspect.peek(); it has no public constructor")

    cdef int _alloc(self, int32_t ndim) except -1:
        # contract: called once, by _new_info, before any other use.
        self._shape = self._inline   # (shape, then strides: ndim entries each)
        if ndim > _INLINE_NDIM:
            self._shape = <int64_t*>malloc(2 * ndim * sizeof(int64_t))
            if self._shape == NULL:
                raise MemoryError()
        self._strides = self._shape + ndim
        return 0

    cdef inline uintptr_t _ptr(self) noexcept:
        return self._data + <uintptr_t>self.byte_offset   # checked not to wrap in _new_info

    cdef bint _mapped(self) noexcept:
        """Every page from the first to the last byte its elements reach is memory this
        process has mapped (host memory a copy reads: a forged pointer, offset or stride
        fails here, not there)."""
        return self.size == 0 or dl_mapped(self._ptr() - <uintptr_t>self._below,
                                           self._ptr() + <uintptr_t>self._above - 1)

    cdef inline int _key(self) noexcept:
        """``code | bits << 8``: one lane's dtype, as the JAX target's tables key it."""
        return self._code | (self._bits << 8)

    @property
    def device_type(self):
        return as_device_type(self._dev_type)

    @property
    def device(self):
        return self.device_type, self.device_id

    @property
    def capsule_device(self):
        if self._cap_dev_type == self._dev_type and self._cap_dev_id == self.device_id:
            return None
        return as_device_type(self._cap_dev_type), self._cap_dev_id

    @property
    def host_accessible(self):
        return _dev_is(self._dev_type, _DEV_HOST)

    @property
    def shape(self):
        return tuple([self._shape[i] for i in range(self.ndim)])

    cdef tuple _host_shape(self):
        """``shape`` and, for a vector dtype, a trailing axis of ``lanes`` (NumPy's form)."""
        return self.shape + ((self._lanes,) if self._lanes != 1 else ())

    @property
    def strides(self):
        return tuple([self._strides[i] for i in range(self.ndim)])

    @property
    def byte_strides(self):
        # Python ints: an extent-1 dimension may carry any stride, e.g. 2**62.
        return tuple([stride * self.itemsize for stride in self.strides])

    @property
    def dtype(self):
        return DLDataType(self._code, self._bits, self._lanes)

    @property
    def dtype_name(self):
        return dtype_name(*self.dtype)

    @property
    def numpy_dtype(self):
        return _numpy_dtype(self._code, self._bits)

    @property
    def data_ptr(self):
        return self._ptr()

    @property
    def alignment(self):
        cdef uintptr_t p = self._ptr()
        return min(p & (~p + 1), 4096) if p else 4096   # (p's lowest set bit)

    @property
    def version(self):
        return (self._ver_major, self._ver_minor) if self._source == SRC_VERSIONED else None

    @property
    def read_only(self):
        return self._flag(DLPACK_FLAG_BITMASK_READ_ONLY)

    @property
    def is_copied(self):
        return self._flag(DLPACK_FLAG_BITMASK_IS_COPIED)

    cdef _flag(self, uint64_t bit):
        if self._source in (SRC_VERSIONED, SRC_NDARRAY):
            return self.flags & bit != 0   # (Python's precedence: & first)
        return None

    @property
    def capsule_name(self):
        return self.source if self._source < SRC_EXCHANGE else None

    @property
    def source(self):
        return _SOURCE_NAMES[self._source]

    @property
    def is_c_contiguous(self):
        return self._contiguous(_C_ORDER)

    @property
    def is_f_contiguous(self):
        return self._contiguous(_F_ORDER)

    @property
    def is_compact(self):
        return self._contiguous(_ANY_ORDER)

    cdef bint _contiguous(self, int order) noexcept:
        """Dense: the axes of extent > 1 in ``order`` (or by stride), strided by the faster ones."""
        cdef int64_t expected = 1
        cdef int i, j, k, n = 0
        cdef int axes[_MAX_NDIM]   # the axes of extent > 1 in order (_ANY_ORDER: by stride)
        if self.size == 0:
            return True
        for k in range(self.ndim):
            i = self.ndim - 1 - k if order == _C_ORDER else k
            if self._shape[i] == 1:
                continue
            if self._strides[i] <= 0:   # (never the dense stride: the sizes fit int64)
                return False
            j = n
            while order == _ANY_ORDER and j > 0 and self._strides[axes[j - 1]] > self._strides[i]:
                axes[j] = axes[j - 1]
                j -= 1
            axes[j] = i
            n += 1
        for j in range(n):
            if self._strides[axes[j]] != expected:
                return False
            expected *= self._shape[axes[j]]
        return True

    @property
    def has_broadcast(self):
        return self._any_stride(False)

    @property
    def has_negative_strides(self):
        return self._any_stride(True)

    cdef bint _any_stride(self, bint negative) noexcept:
        """Some axis of extent > 1 has a negative stride (``negative``), else stride 0."""
        cdef int i
        for i in range(self.ndim):
            if self._shape[i] > 1 and (self._strides[i] < 0 if negative else self._strides[i] == 0):
                return True
        return False

    def sliced(self, index):
        """The header of ``x[index]``, for basic slices, without touching memory.

        Parameters
        ----------
        index : tuple of slice
            At most ``ndim`` slices (``Sharding.addressable_devices_indices_map``
            gives such tuples); missing trailing axes are taken whole.

        Returns
        -------
        TensorInfo
            Same device, dtype, flags and source; shape and strides (in elements)
            of the slice; the first element's address moved by the slice's start
            (into ``byte_offset``, or into ``data`` when a negative stride would
            make the offset negative). Validated as :func:`dlinspect.peek`
            validates a header.

        Raises
        ------
        TypeError
            An entry of ``index`` is not a slice.
        ValueError
            ``index`` has more entries than ``ndim``.
        """
        cdef int64_t shape_buf[_MAX_NDIM], strides_buf[_MAX_NDIM]
        cdef Py_ssize_t i, n, start, stop, step, count
        cdef int64_t move, delta = 0
        cdef uint64_t offset = self.byte_offset
        cdef uintptr_t data = self._data
        index = tuple(index)   # (a tuple: itself)
        n = PyTuple_GET_SIZE(index)
        if n > self.ndim:
            raise ValueError(f"an index of {n} slices for a tensor of {self.ndim} dimensions")
        memcpy(shape_buf, self._shape, self.ndim * sizeof(int64_t))
        memcpy(strides_buf, self._strides, self.ndim * sizeof(int64_t))
        for i, sl in enumerate(index):
            if not PySlice_Check(sl):
                raise TypeError(f"TensorInfo.sliced takes slices, not {type(sl).__name__}")
            PySlice_Unpack(sl, &start, &stop, &step)
            count = PySlice_AdjustIndices(self._shape[i], &start, &stop, step)
            # Exact: the header's byte span fits int64 (validated), and a slice stays in it.
            if count and (dl_mul_overflow(start, self._strides[i], &move)
                          or dl_mul_overflow(move, self.itemsize, &move)
                          or dl_add_overflow(delta, move, &delta)):
                raise MalformedTensorError(f"slice {i} of {index} passes 2**63-1 bytes")
            shape_buf[i] = count
            if dl_mul_overflow(self._strides[i], step, &strides_buf[i]):
                raise MalformedTensorError(f"slice {i} of {index} strides past 2**63-1")
        if delta == INT64_MIN:
            raise MalformedTensorError(f"the slices {index} move the data by -2**63 bytes")
        if delta >= 0 or offset >= <uint64_t>(-delta):
            offset += <uint64_t>delta   # (mod 2**64: a negative delta is taken off)
        else:   # a negative stride: the slice starts before `data`; move data instead
            data -= <uintptr_t>(<uint64_t>(-delta) - offset)
            offset = 0
        return _made_info(data, self._cap_dev_type, self._cap_dev_id, self.ndim, self._code,
                          self._bits, self._lanes, shape_buf, strides_buf, offset, self._source,
                          self.flags, self._ver_major, self._ver_minor, self._dev_type,
                          self.device_id)

    cdef str _layout_word(self):
        if self.is_c_contiguous:
            return "C-contiguous"
        if self.is_f_contiguous:
            return "F-contiguous"
        if self.is_compact:
            return "compact"
        odd = [word for word, on in (("broadcast", self.has_broadcast),
                                     ("negative-strides", self.has_negative_strides)) if on]
        return "+".join(odd) or "strided"

    def __repr__(self):
        cap = self.capsule_device
        return (f"<TensorInfo {device_name(self._dev_type, self.device_id)} "
                f"{self.dtype_name}[{', '.join(map(str, self.shape))}] "
                f"strides={self.strides} {self._layout_word()} {self.nbytes} B align={self.alignment}"
                f"{'' if cap is None else f' capsule_device={device_name(cap[0], cap[1])}'}"
                f"{' read-only' if self.read_only else ''}>")

    def to_dict(self):
        """All attributes as a dict of plain Python values (for logs and JSON)."""
        out = {name: getattr(self, name) for name in _DICT_FIELDS}
        for name, value in out.items():
            if isinstance(value, tuple):   # shape, strides, dtype, version...: lists
                out[name] = list(value)
        cap = self.capsule_device
        out["device_type"] = device_name(self._dev_type)
        out["capsule_device"] = None if cap is None else [device_name(cap[0]), cap[1]]
        return out

    def _state(self):
        # For pickling and equality only.
        return (self._dev_type, self.device_id, self._cap_dev_type, self._cap_dev_id,
                self.shape, self.strides, self.strides_null, self._code, self._bits,
                self._lanes, self.byte_offset, self._data, self._ver_major,
                self._ver_minor, self.flags, self._source)

    def __reduce__(self):
        return _rebuild_info, (self._state(),)

    def __eq__(self, other):
        if not isinstance(other, TensorInfo):
            return NotImplemented
        return self._state() == other._state()

    def __hash__(self):
        return hash(self._state())


def _rebuild_info(state):
    """Unpickle a TensorInfo: rebuild the header it describes and read it again."""
    (dev_type, dev_id, cap_dev_type, cap_dev_id, shape, strides, strides_null, code, bits,
     lanes, byte_offset, data, ver_major, ver_minor, flags, source) = state
    cdef int64_t shape_buf[_MAX_NDIM], strides_buf[_MAX_NDIM]
    cdef Py_ssize_t i, ndim = len(shape)
    if ndim > _MAX_NDIM or len(strides) != ndim:
        raise MalformedTensorError(f"cannot unpickle a TensorInfo with ndim={ndim}")
    for i in range(ndim):
        shape_buf[i] = shape[i]
        strides_buf[i] = strides[i]
    return _made_info(data, cap_dev_type, cap_dev_id, ndim, code, bits, lanes, shape_buf,
                      NULL if strides_null else strides_buf, byte_offset, <Source>source, flags,
                      ver_major, ver_minor, dev_type, dev_id)


# contract: the TensorInfo of the header these fields make, validated as _new_info
# validates every header (a slice's, an unpickled one's); the device reconciled as given.
cdef TensorInfo _made_info(uintptr_t data, int32_t cap_dev_type, int32_t cap_dev_id,
                           int32_t ndim, int code, int bits, int lanes, int64_t* shape,
                           int64_t* strides, uint64_t byte_offset, Source source,
                           uint64_t flags, uint32_t ver_major, uint32_t ver_minor, int32_t dev_type,
                           int32_t dev_id):
    cdef DLTensor t = DLTensor(<void*>data, DLDevice(cap_dev_type, cap_dev_id), ndim,
                               c_DLDataType(code, bits, lanes), shape, strides, byte_offset)
    cdef TensorInfo info = _new_info(&t, source, flags)
    info._ver_major = ver_major
    info._ver_minor = ver_minor
    info._dev_type = dev_type
    info.device_id = dev_id
    return info


cdef _corrupt(str fault):
    return MalformedTensorError(f"{fault} The producer wrote a corrupt header.")


# contract: never returns None; raises MalformedTensorError naming the bad field.
cdef TensorInfo _new_info(const DLTensor* t, Source source, uint64_t flags):
    """Copy and validate one DLTensor header (every field untrusted) into a new TensorInfo."""
    cdef int32_t ndim = t.ndim
    if ndim < 0 or ndim > _MAX_NDIM:
        raise _corrupt(f"DLTensor.ndim is {ndim}; it must be between 0 and {_MAX_NDIM} "
                       f"(dlinspect.MAX_NDIM).")
    if t.shape == NULL and ndim > 0:
        raise _corrupt(f"DLTensor.shape is NULL but DLTensor.ndim is {ndim}; shape may be NULL "
                       f"only when ndim is 0.")
    if t.byte_offset > <uint64_t>(UINTPTR_MAX - <uintptr_t>t.data):
        raise _corrupt(f"DLTensor.data {<uintptr_t>t.data:#x} plus DLTensor.byte_offset "
                       f"{t.byte_offset} passes the end of the address space.")
    if t.dtype.lanes == 0:
        raise _corrupt(f"DLDataType.lanes is 0 (code={t.dtype.code}, bits={t.dtype.bits}); "
                       f"every element has at least one lane.")
    cdef TensorInfo info = TensorInfo.__new__(TensorInfo)
    info._alloc(ndim)
    info.ndim = ndim
    info._source = source
    info.flags = flags
    info._dev_type = info._cap_dev_type = t.device.device_type
    info.device_id = info._cap_dev_id = t.device.device_id
    info._code = t.dtype.code
    info._bits = t.dtype.bits
    info._lanes = t.dtype.lanes
    info.byte_offset = t.byte_offset
    info._data = <uintptr_t>t.data
    info.strides_null = t.strides == NULL and ndim > 0
    info.size = _read_shape(info, t)
    _read_strides(info, t)
    _count_bytes(info, <int64_t>t.dtype.bits * t.dtype.lanes)
    # Host memory's elements lie between address 0 and the end of user addresses.
    cdef uintptr_t p = info._ptr()
    if info.size and _dev_is(info._dev_type, _DEV_HOST) and (
            p < <uintptr_t>info._below or p >= DL_USER_END or <uint64_t>info._above > DL_USER_END - p):
        raise _corrupt(f"DLTensor.data plus byte_offset puts the first element at {p:#x}, and its "
                       f"elements reach from {info._below} bytes before it to {info._above} bytes "
                       f"after it: outside this process's address space (user addresses end at "
                       f"{DL_USER_END:#x}), so no byte of it is memory.")
    return info


cdef int64_t _read_shape(TensorInfo info, const DLTensor* t) except -1:
    """Copy the extents; return the elements they hold (0 for a zero extent), int64/NULL checked."""
    cdef int32_t i, ndim = t.ndim
    cdef int64_t size = 1
    cdef bint zero = False
    for i in range(ndim):
        # (the copy is what is checked: a producer's thread may write its header meanwhile)
        info._shape[i] = t.shape[i]
        if info._shape[i] < 0:
            raise _corrupt(f"DLTensor.shape[{i}] is {info._shape[i]}; extents must be >= 0.")
        zero |= info._shape[i] == 0
    if zero:
        return 0
    for i in range(ndim):
        if dl_mul_overflow(size, info._shape[i], &size):
            raise _corrupt(f"DLTensor.shape {info.shape} holds more than 2**63-1 elements.")
    if t.data == NULL:
        raise _corrupt(f"DLTensor.data is NULL but the shape {info.shape} holds "
                       f"{size} element(s); only zero-size tensors may have NULL data.")
    return size


cdef void _read_strides(TensorInfo info, const DLTensor* t) noexcept:
    """Copy the strides, NULL ones (before DLPack 1.2) written out row-major: 0 past int64, as
    an empty tensor's outer ones may be (``(2**62, 0, 2**62)``), which address nothing."""
    cdef int32_t i
    cdef int64_t stride = 1
    if t.strides != NULL:
        memcpy(info._strides, t.strides, t.ndim * sizeof(int64_t))
        return
    for i in range(t.ndim - 1, -1, -1):
        info._strides[i] = stride
        if info._shape[i] > 0 and dl_mul_overflow(stride, info._shape[i], &stride):
            stride = 0


cdef inline bint _to_bytes(int64_t elements, int64_t bits_total, bint packed,
                           int64_t* out) noexcept:
    """``elements`` in bytes (sub-byte packed ones share bytes: their bits rounded up into
    bytes); True where that overflows int64."""
    if not packed:
        return dl_mul_overflow(elements, (bits_total + 7) // 8, out)
    if dl_mul_overflow(elements, bits_total, out):
        return True
    out[0] = out[0] // 8 + (out[0] % 8 != 0)   # (+ 7 could overflow)
    return False


cdef int _count_bytes(TensorInfo info, int64_t bits_total) except -1:
    """Set itemsize and nbytes (sub-byte packed unless flagged padded); check the strides'
    span and set the bytes it reaches before the first element and from it on."""
    cdef int32_t i
    cdef int64_t reach, stride, span = 0, below = 0
    cdef bint packed = bits_total < 8 and not (info.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
    info.itemsize = (bits_total + 7) // 8
    if _to_bytes(info.size, bits_total, packed, &info.nbytes):
        raise _corrupt(f"DLTensor.shape {info.shape} of {bits_total}-bit elements holds more "
                       f"than 2**63-1 bytes.")
    if info.size == 0:
        return 0
    for i in range(info.ndim):
        stride = info._strides[i]
        if (stride == INT64_MIN
                or dl_mul_overflow(info._shape[i] - 1, -stride if stride < 0 else stride, &reach)
                or dl_add_overflow(span, reach, &span)):
            raise _corrupt(f"DLTensor.strides {info.strides} with shape {info.shape} reach "
                           f"past 2**63-1 elements.")
        if stride < 0:
            below += reach
    # (from the first element on: up to the last one, and its own bytes)
    if (dl_add_overflow(span - below, 1, &span) or _to_bytes(span, bits_total, packed, &info._above)
            or _to_bytes(below, bits_total, packed, &info._below)):
        raise _corrupt(f"DLTensor.strides {info.strides} span more than 2**63-1 bytes.")
    return 0


# contract: returns a new TensorInfo or raises; never renames the capsule, never calls a deleter.
cdef TensorInfo _peek_capsule(cap):
    cdef TensorInfo info
    cdef DLManagedTensorVersioned* dlm_ver
    if PyCapsule_IsValid(cap, VERSIONED):
        dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
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
    if PyCapsule_IsValid(cap, LEGACY):
        return _new_info(&(<DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY)).dl_tensor, SRC_LEGACY, 0)
    _raise_bad_capsule(cap)


cdef int _raise_bad_capsule(cap) except -1:
    """The error of ``cap``, which holds no tensor to read: consumed, or not DLPack's."""
    name = capsule_name(cap) if PyCapsule_CheckExact(cap) else None
    if PyCapsule_IsValid(cap, LEGACY_USED) or PyCapsule_IsValid(cap, VERSIONED_USED):
        raise CapsuleConsumedError(
            f"the DLPack capsule is named {name!r}: a consumer already took "
            f"the tensor (a capsule is consumed exactly once), so nothing in it was read. "
            f"Call the producer's __dlpack__() again for a fresh capsule.")
    shown = "no name" if name is None else f"the name {name!r}"
    raise NotDLPackError(
        f"a PyCapsule with {shown} is not a DLPack tensor; expected 'dltensor' or "
        f"'dltensor_versioned'. Pass the array itself or the capsule its __dlpack__() returns.")


def capsule_name(cap):
    cdef const char* name = PyCapsule_GetName(cap)
    return None if name == NULL else name.decode(errors="replace")
