# capsules.pxi: capsules dlinspect owns (host views, the test factory, the
# versioned->legacy adapter, aligned copies) and HostOwner, which owns a consumed
# tensor. Nothing here calls a producer.

cdef void _owned_capsule_destructor(object cap) noexcept:
    # Called with the GIL held. Frees the tensor only while nobody consumed it.
    if PyCapsule_IsValid(cap, LEGACY):
        _delete(<DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY), NULL)
    elif PyCapsule_IsValid(cap, VERSIONED):
        _delete(NULL, <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED))


cdef void _delete(DLManagedTensor* dlm, DLManagedTensorVersioned* dlm_ver) noexcept:
    # Runs the deleters given; an error pending meanwhile is set aside (a producer's
    # deleter may run Python code).
    cdef PyObject *err_type, *err_value, *err_tb
    PyErr_Fetch(&err_type, &err_value, &err_tb)
    if dlm != NULL and dlm.deleter != NULL:
        dlm.deleter(dlm)
    if dlm_ver != NULL and dlm_ver.deleter != NULL:
        dlm_ver.deleter(dlm_ver)
    PyErr_Restore(err_type, err_value, err_tb)


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
    cdef size_t size = sizeof(DLManagedTensorVersioned) if versioned else sizeof(DLManagedTensor)
    cdef void* managed = NULL   # a zeroed DLManagedTensorVersioned (or legacy DLManagedTensor)
    cdef DLManagedTensorVersioned* dlm_ver
    cdef DLManagedTensor* dlm
    cdef DLTensor* t
    cdef void* ptr = NULL
    if ctx == NULL:
        raise MemoryError()
    memset(ctx, 0, sizeof(_FactoryCtx))
    try:
        nd = _fill_factory_ctx(ctx, data, address, shape, ndim, strides, counter)
        managed = malloc(size)
        if managed == NULL:
            raise MemoryError()
        memset(managed, 0, size)
        dlm_ver, dlm = <DLManagedTensorVersioned*>managed, <DLManagedTensor*>managed
        if versioned:
            dlm_ver.version = DLPackVersion(version_major, version_minor)
            dlm_ver.flags, dlm_ver.manager_ctx = flags, ctx
            if not null_deleter:
                dlm_ver.deleter = _factory_deleter_ver
            t = &dlm_ver.dl_tensor
        else:
            dlm.manager_ctx = ctx
            if not null_deleter:
                dlm.deleter = _factory_deleter
            t = &dlm.dl_tensor
        if address is not None:
            ptr = <void*><uintptr_t>address
        elif ctx.has_view:
            ptr = ctx.view.buf
        t[0] = DLTensor(ptr, DLDevice(device_type, device_id), nd, c_DLDataType(code, bits, lanes),
                        ctx.shape, ctx.strides, byte_offset)
        cname = (VERSIONED if versioned else LEGACY) if name is None else _static_name(name)
        cap = PyCapsule_New(managed, cname, _owned_capsule_destructor)
    except BaseException:
        _factory_release(ctx)
        free(managed)
        raise
    # With null_deleter the context is never released (a deliberate, small leak):
    # the header must keep pointing at live memory for as long as anyone reads it.
    return cap


cdef int32_t _fill_factory_ctx(_FactoryCtx* ctx, data, address, shape, ndim, strides,
                               counter) except? -1:
    """The factory's context: shape and strides arrays (backing a forged ``ndim``), the
    buffer viewed and the objects kept alive. Returns the header's ``ndim``."""
    cdef int32_t nd = len(shape) if ndim is None else ndim
    cdef Py_ssize_t n_alloc = max(min(nd, _FORGE_NDIM_BACKED),
                                  len(shape) if shape is not None else 0,
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
    return nd


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


# ---- NumPy memory: described only where DLPack says exactly what it is -------

cdef enum NumpyForm:
    NP_EXACT = 0        # a DLPack header describes the memory exactly
    NP_COPY = 1         # numeric, but byte order or byte strides DLPack cannot express:
                        # only a copy (NumPy's own, which swaps and gathers) is right
    NP_NOT_NUMERIC = 2  # str, bytes, object, datetime, structured: no DLPack type
    NP_NO_CODE = 3      # numeric, but DLPack has no code for it (e.g. longdouble)


cdef tuple _numpy_form(object arr):
    """``(NumpyForm, why)`` of ndarray ``arr``; ``why`` says in words what DLPack lacks."""
    dt = arr.dtype
    try:
        dldtype_from_numpy(dt)
    except ValueError:
        if dt.kind in "biufc" or str(getattr(dt.type, "__module__", "")).startswith("ml_dtypes"):
            return (NP_NO_CODE, f"DLPack has no type code for {dt.name}")
        return (NP_NOT_NUMERIC, f"DLPack has no type for dtype {dt.str} ({dt.name}): no "
                                f"string, bytes, object, date/time or structured types")
    if not dt.isnative:
        order = "big" if dt.byteorder == ">" else "little"
        return (NP_COPY, f"its dtype {dt.str} is {order}-endian, not this machine's byte "
                         f"order, and DLPack data follows native byte order only")
    item = dt.itemsize
    if arr.size > 1:
        for extent, stride in zip(arr.shape, arr.strides):
            if extent > 1 and stride % item:
                return (NP_COPY, f"its byte strides {arr.strides} include {stride}, which is "
                                 f"not a multiple of its {item}-byte elements, and DLPack "
                                 f"counts strides in whole elements")
    return (NP_EXACT, None)


cdef str _type_name(object obj):
    tp = type(obj)
    return f"{tp.__module__}.{tp.__qualname__}"


cdef object _numpy_error(object x, int form, str why):
    """The error for NumPy array ``x`` that DLPack cannot describe exactly."""
    what = f"a {_type_name(x)} of dtype {x.dtype.str} ({x.dtype.name}) and shape {x.shape}"
    if form == NP_NOT_NUMERIC:
        return NotNumericError(
            f"{what} is not a numeric tensor: {why}. Inside a batch it is a "
            f"leaf kept as it is (leaves='keep').")
    if form == NP_COPY:
        exc = NotDescribableError(
            f"{what} cannot be described by DLPack: {why}, so NumPy refused "
            f"to export it and dlinspect gives it no header. to_host and to_jax copy it into "
            f"native, C-ordered memory (copy=None); peek and copy=False cannot. To fix: "
            f"x = numpy.ascontiguousarray(x, dtype=x.dtype.newbyteorder('=')).")
        exc.array = x
        exc.why = why
        return exc
    return UnsupportedDTypeError(
        f"{what} cannot be exported: {why} (DLDataTypeCode), so NumPy refused "
        f"to export it and dlinspect has no header to give. To fix: convert it first, e.g. "
        f"x.astype(numpy.float32).")


def capsule_of(arr, bint read_only=False):
    """A "dltensor_versioned" capsule viewing host array ``arr`` (kept alive by it) on
    ``(kDLCPU, 0)``, owning the view until a consumer renames it; ``read_only`` sets the
    READ_ONLY flag. ValueError (saying why) where DLPack cannot describe ``arr`` exactly
    (``_numpy_form``); ml_dtypes dtypes, which ``ndarray.__dlpack__`` refuses, are
    described (sub-byte ones, one element per byte, flagged IS_SUBBYTE_TYPE_PADDED)."""
    form, why = _numpy_form(arr)
    if form != NP_EXACT:
        raise ValueError(f"DLPack cannot describe this array exactly: {why}")
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    cdef uint64_t flags = DLPACK_FLAG_BITMASK_READ_ONLY if read_only else 0
    if bits * lanes < 8:
        flags |= DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED   # one element per byte
    cdef int64_t shape[_MAX_NDIM], strides[_MAX_NDIM]
    cdef int32_t i, ndim = arr.ndim
    cdef int64_t row = 1
    item = arr.itemsize
    # An axis of extent 1 may carry any stride (NumPy gives some 0); the header gets the
    # row-major one, from which JAX infers the row-major layout (jaxlib 0.4.30 takes a
    # stride-0 axis for the minor one: a layout its own jit then refuses).
    for i in range(ndim - 1, -1, -1):
        shape[i], stride = arr.shape[i], arr.strides[i]
        if shape[i] <= 1:
            strides[i] = row
        else:   # (not a whole number of elements only in an empty array: 0)
            strides[i] = stride // item if stride % item == 0 else 0
            row *= shape[i]
    return _view_capsule(arr, <void*><uintptr_t>arr.ctypes.data, ndim, shape, strides, code,
                         bits, lanes, flags, kDLCPU, 0)


def numpy_capsule(arr, refusal=None):
    """A capsule over NumPy array ``arr`` where DLPack describes it exactly (read-only
    arrays flagged: what stands in for NumPy's refused export, ml_dtypes dtypes and
    read-only arrays on NumPy < 2.1); else the error the export raises for such an array
    (NotDescribableError, NotNumericError, UnsupportedDTypeError), chained to NumPy's
    ``refusal`` where DLPack has no code for the dtype."""
    form, why = _numpy_form(arr)
    if form == NP_EXACT:
        return capsule_of(arr, not arr.flags.writeable)
    raise _numpy_error(arr, form, why) from (refusal if form == NP_NO_CODE else None)


def view_capsule(owner, TensorInfo info):
    """A "dltensor_versioned" capsule over memory ``owner`` keeps alive, as ``info``
    describes it (a slice of the owner's tensor: ``TensorInfo.sliced``), flags kept."""
    return _view_capsule(owner, <void*>info._ptr(), info.ndim, info._shape, info._strides,
                         info._code, info._bits, info._lanes,
                         info.flags & (DLPACK_FLAG_BITMASK_READ_ONLY
                                        | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED),
                         info._cap_dev_type, info._cap_dev_id)


def header_capsule(owner, uintptr_t address, shape, strides, int code, int bits, int lanes,
                   int device_type=kDLCPU, int device_id=0, uint64_t flags=0):
    """A "dltensor_versioned" capsule with the header given, over memory ``owner`` keeps
    alive: for dlinspect's own probes of what JAX takes (a forged dtype, a permuted
    layout, another device type). ``shape`` and ``strides`` in elements."""
    if len(shape) > _MAX_NDIM or len(strides) != len(shape):
        raise ValueError("shape and strides of one length, at most MAX_NDIM")
    return _make_capsule(owner, address, shape, None, strides, code, bits, lanes, device_type,
                         device_id, 0, True, DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR,
                         flags, None, None, False)


cdef void _view_deleter(DLManagedTensorVersioned* dlm_ver) noexcept nogil:
    if Py_IsInitialized():        # interpreter gone: leak the reference rather than crash
        with gil:
            Py_XDECREF(<PyObject*>dlm_ver.manager_ctx)
    free(dlm_ver)                 # header, shape and strides are one allocation


# contract: a new "dltensor_versioned" capsule whose deleter drops one reference to
# ``owner`` (taken here); raises MemoryError with nothing leaked.
cdef object _view_capsule(object owner, void* data, int32_t ndim, const int64_t* shape,
                          const int64_t* strides, int code, int bits, int lanes,
                          uint64_t flags, int32_t dev_type, int32_t dev_id):
    cdef size_t head = sizeof(DLManagedTensorVersioned)
    cdef char* block = <char*>malloc(head + 2 * <size_t>ndim * sizeof(int64_t) + 1)
    if block == NULL:
        raise MemoryError()
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>block
    cdef int64_t* dims = <int64_t*>(block + head)
    memcpy(dims, shape, ndim * sizeof(int64_t))
    memcpy(dims + ndim, strides, ndim * sizeof(int64_t))
    Py_INCREF(owner)
    dlm_ver[0] = DLManagedTensorVersioned(
        DLPackVersion(DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR), <void*>owner, _view_deleter,
        flags, DLTensor(data, DLDevice(dev_type, dev_id), ndim, c_DLDataType(code, bits, lanes),
                        dims, dims + ndim, 0))
    try:
        return PyCapsule_New(dlm_ver, VERSIONED, _owned_capsule_destructor)
    except BaseException:
        Py_XDECREF(<PyObject*>owner)
        free(block)
        raise


# ---- versioned -> legacy adapter (JAX imports "dltensor" only) --------------

cdef void _adapter_deleter(DLManagedTensor* dlm) noexcept nogil:
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>dlm.manager_ctx
    free(dlm)
    if dlm_ver != NULL and dlm_ver.deleter != NULL:
        dlm_ver.deleter(dlm_ver)


cdef void _free_only_deleter(DLManagedTensor* dlm) noexcept nogil:
    free(dlm)


cpdef object import_capsule(object import_fn, object cap, object device, object stream,
                            object copy, int dl_device_type):
    """``import_fn`` on a "dltensor" capsule; a "dltensor_versioned" ``cap`` goes through a
    zero-copy "dltensor" adapter, which consumes it (renamed ``used_dltensor_versioned``: the
    adapter's deleter calls the versioned one exactly once). jaxlib renames a capsule only on
    success: on failure ``cap`` gets its name back and owns the tensor again, and the
    unconsumed adapter frees only itself."""
    if PyCapsule_IsValid(cap, LEGACY):
        return import_fn(cap, device, stream, copy, dl_device_type)
    if not PyCapsule_IsValid(cap, VERSIONED):   # another thread took it since it was read
        _raise_bad_capsule(cap, PyCapsule_GetName(cap) if PyCapsule_CheckExact(cap) else NULL)
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
    cdef DLManagedTensor* dlm = <DLManagedTensor*>malloc(sizeof(DLManagedTensor))
    if dlm == NULL:
        raise MemoryError()
    dlm.dl_tensor = dlm_ver.dl_tensor
    dlm.manager_ctx = dlm_ver
    dlm.deleter = _adapter_deleter
    try:
        legacy = PyCapsule_New(dlm, LEGACY, _owned_capsule_destructor)
    except BaseException:
        free(dlm)
        raise
    PyCapsule_SetName(cap, VERSIONED_USED)
    try:
        return import_fn(legacy, device, stream, copy, dl_device_type)
    except BaseException:
        if (PyCapsule_IsValid(legacy, LEGACY) and PyCapsule_IsValid(cap, VERSIONED_USED)
                and dlm.deleter == _adapter_deleter):   # the adapter unconsumed: undone
            dlm.manager_ctx = NULL
            dlm.deleter = _free_only_deleter
            PyCapsule_SetName(cap, VERSIONED)
        raise


# ---- host views: keep a consumed tensor alive behind a NumPy array ----------

cdef class HostOwner:
    """Owns one consumed DLPack tensor (its deleter runs when this object dies): the base
    of the NumPy arrays over its memory (put.pxi, ``_ndarray``)."""
    cdef DLManagedTensor* dlm
    cdef DLManagedTensorVersioned* dlm_ver

    def __dealloc__(self):
        _delete(self.dlm, self.dlm_ver)


def take(cap):
    """Consume a DLPack capsule into a :class:`HostOwner` (renames it ``used_*``)."""
    cdef HostOwner owner = HostOwner.__new__(HostOwner)
    cdef const char* name = PyCapsule_GetName(cap) if PyCapsule_CheckExact(cap) else NULL
    if name != NULL and strcmp(name, VERSIONED) == 0:
        owner.dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
        PyCapsule_SetName(cap, VERSIONED_USED)
    elif name != NULL and strcmp(name, LEGACY) == 0:
        owner.dlm = <DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY)
        PyCapsule_SetName(cap, LEGACY_USED)
    else:   # another thread took it since its header was read
        _raise_bad_capsule(cap, name)
    return owner


cdef int _untake(HostOwner owner, object cap) except -1:
    """Undo :func:`take` after the step it was for failed: ``cap`` gets its name back and
    owns the tensor again; ``owner`` then owns nothing (its death runs no deleter)."""
    if owner.dlm_ver != NULL:
        owner.dlm_ver = NULL
        PyCapsule_SetName(cap, VERSIONED)
    elif owner.dlm != NULL:
        owner.dlm = NULL
        PyCapsule_SetName(cap, LEGACY)
    return 0


# ---- aligned memory, and aligned copies made without the GIL -----------------

def aligned_empty(shape, dtype=None, Py_ssize_t alignment=64, Py_ssize_t offset=0):
    """A C-contiguous NumPy array whose data sits ``offset`` bytes past an ``alignment`` boundary.

    Parameters
    ----------
    shape : sequence of int
        Extents, in elements.
    dtype : numpy dtype
        Element type (ml_dtypes ones included); default float32.
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
    dt = _np_dtype("float32" if dtype is None else dtype)
    shape = tuple(shape)
    nbytes = dt.itemsize
    for extent in shape:
        nbytes *= extent
    raw = _np_empty(nbytes + alignment + offset, "uint8")
    start = (-<Py_ssize_t>_buffer_address(raw)) % alignment + offset
    return _np_ndarray(shape, dt, raw, start)


cdef size_t _buffer_address(obj) except? 0:
    """The address of a contiguous buffer's first byte (without NumPy's ``.ctypes``)."""
    cdef Py_buffer view
    PyObject_GetBuffer(obj, &view, PyBUF_ANY_CONTIGUOUS)
    cdef size_t address = <size_t>view.buf
    PyBuffer_Release(&view)
    return address
