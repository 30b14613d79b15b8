# needs.pxi: what a TensorInfo needs to reach JAX or NumPy, as bits: the facts the verdict
# (routes.pxi) is decided from.

import functools as _functools

# Need's bits (dlinspect._tables documents each) as C constants (tests/test_abi.py checks).
cdef enum:
    NEED_DEVICE = 1 << 0
    NEED_DTYPE = 1 << 1
    NEED_LANES = 1 << 2
    NEED_LAYOUT = 1 << 3
    NEED_READ_ONLY = 1 << 4
    NEED_ALIGN = 1 << 5
    NEED_NARROW = 1 << 6
    NEED_PACKED = 1 << 7
    NEED_EMPTY = 1 << 8
    NEED_VIA_CPU = 1 << 9
    NEED_NUMPY_PUT = 1 << 10
    NEED_PERMUTED = 1 << 11
    NEED_SHAPE = 1 << 12
    NEED_ALIASED = 1 << 13
    NEED_UNMAPPED = 1 << 14


# contract: a dtype's own needs (DTYPE, NUMPY_PUT, LANES, NARROW); raises only what a probe raises.
cdef uint32_t _dtype_needs(JaxTarget tg, int code, int bits, int lanes,
                           uint64_t flags) except? 0xFFFFFFFF:
    cdef uint32_t n = 0
    if (lanes == 1 and bits < 8 and flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED   # (padded)
            or not tg._dtype_ok(code, bits)):
        # JAX's DLPack import takes no padded sub-byte data, and refuses some dtypes
        # JAX itself holds (int4 and float4 on CPU): jax.device_put copies those from NumPy.
        n |= NEED_NUMPY_PUT if lanes == 1 and tg._dtype_ok(code, bits, True) else NEED_DTYPE
    if lanes != 1:
        n |= NEED_LANES
    if (bits == 64 or bits == 128) and (code | (bits << 8)) in tg.narrow and not tg.x64.value:
        n |= NEED_NARROW
    return n


# contract: the needs of ``info`` to reach ``tg``; ``share_readonly``: readonly="share";
# ``aliased``: a batch leaf whose memory the batch is not proven to own (own.pxi); raises
# only what a dtype probe raises.
cdef uint32_t _needs_jax(TensorInfo info, JaxTarget tg, bint share_readonly,
                         bint aliased) except? 0xFFFFFFFF:
    cdef uint32_t n = _dtype_needs(tg, info._code, info._bits, info._lanes, info.flags)
    cdef bint on_cpu = True
    n |= _device_needs(info, tg, &on_cpu) | _shape_needs(info)
    if info.size == 0:
        return n | NEED_EMPTY
    n |= _layout_needs(info, tg)
    cdef bint read_only = info.flags & DLPACK_FLAG_BITMASK_READ_ONLY
    if read_only and not share_readonly:
        n |= NEED_READ_ONLY
    if aliased and not (read_only and share_readonly):   # (the caller says nothing writes it)
        n |= NEED_ALIASED
    if on_cpu and info._ptr() & (tg.cpu_align - 1):
        n |= NEED_ALIGN
    if _packed(info):
        n |= NEED_PACKED
    return n


cdef inline uint32_t _device_needs(TensorInfo info, JaxTarget tg, bint* on_cpu) except? 0xFFFFFFFF:
    """VIA_CPU, DEVICE or 0; ``on_cpu`` (left True by the caller): whether a CPU device views it."""
    cdef int32_t dt = info._dev_type
    if dt == kDLCPU and info.device_id == 0:
        return 0   # JAX always has its CPU backend
    key = (dt, info.device_id)
    if key in tg.devices:
        on_cpu[0] = key in tg.cpu_keys
        return 0
    if _dev_is(dt, _DEV_HOST):
        return NEED_VIA_CPU
    on_cpu[0] = False
    return NEED_DEVICE


cdef inline uint32_t _layout_needs(TensorInfo info, JaxTarget tg) except? 0xFFFFFFFF:
    cdef int i
    if not info._contiguous(_C_ORDER):   # (vector lanes: a trailing axis of row-major memory)
        return (NEED_PERMUTED if tg.permuted_ok and info._lanes == 1
                and info._contiguous(_ANY_ORDER) else NEED_LAYOUT)
    # Strides (extent-1 axes' too, which DLPack lets be anything) that increase somewhere:
    # jaxlib 0.4.30 infers a layout from their order that its jit refuses.
    if not tg.unit_strides_ok:
        for i in range(1, info.ndim):
            if info._strides[i - 1] < info._strides[i]:
                return NEED_LAYOUT
    return 0


cdef inline bint _packed(TensorInfo info) noexcept:
    return (info._bits * info._lanes < 8 and info.size > 1
            and not (info.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED))


cdef uint32_t _needs_host(TensorInfo info) except? 0xFFFFFFFF:
    cdef uint32_t n = _shape_needs(info)
    if not _dev_is(info._dev_type, _DEV_HOST):
        n |= NEED_DEVICE
    if _numpy_dtype(info._code, info._bits) is None:
        n |= NEED_DTYPE
    if info._lanes != 1:
        n |= NEED_LANES
    if info.size == 0:
        return n | NEED_EMPTY
    if _packed(info):
        n |= NEED_PACKED
    return n


cdef int _NUMPY_MAX_NDIM = NUMPY_MAX_NDIM


cdef uint32_t _shape_needs(TensorInfo info) noexcept:
    """NEED_SHAPE where no array can have the shape (Need.SHAPE): too many dimensions, or an
    empty tensor's nonzero extents past int64 in bytes (TensorInfo checks a nonempty one's);
    NEED_UNMAPPED where host memory's span crosses a page where this process has mapped
    nothing: asked of a bare capsule and of a nonzero byte_offset (a producer's own export
    points at its own memory, and puts no offset there)."""
    cdef int64_t nbytes = info._lanes * ((info._bits + 7) // 8)
    cdef int i
    if ((info.byte_offset or info._bare) and _dev_is(info._dev_type, _DEV_HOST)
            and not info._mapped()):
        return NEED_UNMAPPED
    if info.ndim + (info._lanes != 1) > _NUMPY_MAX_NDIM:
        return NEED_SHAPE
    for i in range(info.ndim if info.size == 0 else 0):
        if info._shape[i] and dl_mul_overflow(nbytes, info._shape[i], &nbytes):
            return NEED_SHAPE
    return 0


@_functools.cache
def physical_memory():
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return _os.sysconf("SC_PAGE_SIZE") * _os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# Physical memory in bytes (the most a copy may take; no bound where the OS does not say).
cdef int64_t _PHYSICAL_BYTES = physical_memory() or 0x7FFFFFFFFFFFFFFF


cdef bint _one_kind(list column) except -1:
    """Every array of non-empty ``column`` is a NumPy array of the first one's shape and
    dtype, a native, unstructured, non-object dtype, below NumPy's most dimensions."""
    first = column[0]
    if type(first) is not _np_ndarray or first.ndim >= _NUMPY_MAX_NDIM:
        return False   # (a batch of 65 dimensions: the caller's path says why not)
    dtype = first.dtype
    if dtype.hasobject or not dtype.isnative or dtype.names is not None:
        return False   # (np.stack packs structured dtypes)
    for a in column:
        if type(a) is not _np_ndarray or a.dtype is not dtype or a.shape != first.shape:
            return False
    return True


def stack_column(list column, Py_ssize_t alignment):
    """``np.stack(column)`` in new ``alignment``-aligned memory, a ``memcpy`` per array, where
    all are C-contiguous NumPy arrays of one shape and a native, unstructured, non-object
    dtype, within physical memory; else None (the caller's path stacks it)."""
    cdef Py_buffer src
    cdef Py_ssize_t k, n = len(column)
    if n == 0 or not _one_kind(column):
        return None
    first = column[0]
    total = first.nbytes * n   # (a Python int: no wrap past 2**63)
    if total == 0 or total > _PHYSICAL_BYTES:
        return None   # (empty: its extents may pass what NumPy holds; the caller's path)
    out = aligned_empty((n,) + first.shape, first.dtype, alignment)
    cdef char* dst = <char*>_buffer_address(out)
    for k in range(n):
        try:
            PyObject_GetBuffer(column[k], &src, PyBUF_C_CONTIGUOUS)
        except (BufferError, ValueError):   # (not C-contiguous: out is not handed back)
            return None
        with nogil:
            memcpy(dst + k * src.len, src.buf, src.len)   # (one shape, one dtype: one len)
        PyBuffer_Release(&src)
    return out


cdef uint32_t _C_COPY_NEEDS = (NEED_ALIGN | NEED_NARROW | NEED_READ_ONLY | NEED_LAYOUT | NEED_PERMUTED
                               | NEED_ALIASED)


cdef inline bint _c_copy(TensorInfo info, uint32_t n) noexcept:
    """The fast path's copy rule (put.pxi, ``_fill``): only _C_COPY_NEEDS, whole bytes, fits."""
    return not n & ~_C_COPY_NEEDS and not info._bits % 8 and info.nbytes <= _PHYSICAL_BYTES


def needs(TensorInfo info, JaxTarget target=None, bint share_readonly=False):
    """``info``'s :class:`Need` bits to JAX (``target``) or NumPy (None); 0: viewed as it is."""
    if target is None:
        return _needs_host(info)
    return _needs_jax(info, target, share_readonly, False)
