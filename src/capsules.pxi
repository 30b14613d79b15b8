# capsules.pxi: capsules dlinspect owns (host views, the test factory, the versioned->legacy
# adapter) and HostOwner, which owns a consumed tensor. Nothing here calls a producer.

import math as _math

cdef void _owned_capsule_destructor(cap) noexcept:
    # Called with the GIL held. Frees the tensor only while nobody consumed it.
    if PyCapsule_IsValid(cap, LEGACY):
        _delete(<DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY), NULL)
    elif PyCapsule_IsValid(cap, VERSIONED):
        _delete(NULL, <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED))


cdef void _delete(DLManagedTensor* dlm, DLManagedTensorVersioned* dlm_ver) noexcept:
    # A pending error is set aside meanwhile: a producer's deleter may run Python code.
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


cdef class _Held:
    """What a ``_make_capsule`` capsule keeps until its deleter runs: data, view, counter."""
    cdef object data
    cdef DeleterCounter counter
    cdef Py_buffer view

    def __dealloc__(self):
        PyBuffer_Release(&self.view)   # (nothing where no buffer was viewed)
        if self.counter is not None:
            self.counter.calls += 1


cdef void _release(void* block, void* keep) noexcept nogil:
    if Py_IsInitialized():        # interpreter gone: leak the reference rather than crash
        with gil:
            Py_XDECREF(<PyObject*>keep)
    free(block)                   # header, shape and strides are one allocation


cdef void _own_deleter(DLManagedTensor* dlm) noexcept nogil:
    _release(dlm, dlm.manager_ctx)


cdef void _own_deleter_ver(DLManagedTensorVersioned* dlm_ver) noexcept nogil:
    _release(dlm_ver, dlm_ver.manager_ctx)


cdef _capsule(keep, const DLTensor* t, Py_ssize_t n, uint64_t flags, bint versioned=True,
              const char* name=NULL, uint32_t major=DLINSPECT_DLPACK_MAJOR,
              uint32_t minor=DLINSPECT_DLPACK_MINOR, bint null_deleter=False):
    """The one way dlinspect builds a capsule (``t`` and its ``n`` extents and strides in one
    block), whose deleter drops the reference to ``keep`` taken here; MemoryError leaks nothing.
    The test factory's forgeries: another ``name`` or version (``major``, ``minor``), and
    ``null_deleter``: no deleter, so the block is never freed nor ``keep`` dropped (a deliberate,
    small leak: the header must keep pointing at live memory for as long as anyone reads it)."""
    cdef size_t head = sizeof(DLManagedTensorVersioned) if versioned else sizeof(DLManagedTensor)
    cdef char* block = <char*>calloc(1, head + 2 * <size_t>n * sizeof(int64_t) + 1)
    if block == NULL:
        raise MemoryError()
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>block
    cdef DLManagedTensor* dlm = <DLManagedTensor*>block
    cdef DLTensor* dl = &dlm_ver.dl_tensor if versioned else &dlm.dl_tensor
    cdef int64_t* dims = <int64_t*>(block + head)
    dl[0] = t[0]
    dl.shape = NULL if t.shape == NULL else <int64_t*>memcpy(dims, t.shape, n * sizeof(int64_t))
    dl.strides = (NULL if t.strides == NULL
                  else <int64_t*>memcpy(dims + n, t.strides, n * sizeof(int64_t)))
    if versioned:
        dlm_ver.version = DLPackVersion(major, minor)
        dlm_ver.manager_ctx = <void*>keep
        dlm_ver.deleter = NULL if null_deleter else &_own_deleter_ver
        dlm_ver.flags = flags
    else:
        dlm.manager_ctx = <void*>keep
        dlm.deleter = NULL if null_deleter else &_own_deleter
    if name == NULL:
        name = VERSIONED if versioned else LEGACY
    try:
        cap = PyCapsule_New(block, name, _owned_capsule_destructor)
    except BaseException:
        free(block)
        raise
    Py_INCREF(keep)
    return cap


def _make_capsule(data, address, shape, ndim, strides, int code, int bits, int lanes,
                  int device_type, int device_id, uint64_t byte_offset, bint versioned,
                  uint32_t version_major, uint32_t version_minor, uint64_t flags,
                  DeleterCounter counter, str name, bint null_deleter):
    """Build a capsule with any header; see dlinspect.testing.make_capsule."""
    cdef _Held held = _Held.__new__(_Held)
    ext = shape or ()
    steps = strides or ()
    cdef int32_t nd = len(ext) if ndim is None else ndim
    # Extents (row 0) and strides (row 1), padded with 1 to back a forged ``ndim`` (up to
    # _FORGE_NDIM_BACKED entries): a reader that trusts it reads no further.
    cdef Py_ssize_t n = max(min(nd, _FORGE_NDIM_BACKED), len(ext), len(steps))
    cdef cnp.ndarray dims = _np.ones((2, n), _np.int64)
    dims[0, :len(ext)] = ext
    dims[1, :len(steps)] = steps
    cdef int64_t* p = <int64_t*>cnp.PyArray_DATA(dims)
    held.data = data
    if data is not None and address is None:
        PyObject_GetBuffer(data, &held.view, PyBUF_ANY_CONTIGUOUS)
        address = <uintptr_t>held.view.buf
    cdef DLTensor t = DLTensor(<void*><uintptr_t>(address or 0), DLDevice(device_type, device_id),
                               nd, c_DLDataType(code, bits, lanes), p, p + n, byte_offset)
    t.shape = NULL if shape is None else p
    t.strides = NULL if strides is None else p + n
    cdef bytes cname = None if name is None else _names.setdefault(name, name.encode())
    cap = _capsule(held, &t, n, flags, versioned, NULL if name is None else <const char*>cname,
                   version_major, version_minor, null_deleter)
    held.counter = counter   # (last: a capsule that failed to be made counts no call)
    return cap


#: make_capsule backs a forged ndim with at most this many shape/stride entries.
cdef Py_ssize_t _FORGE_NDIM_BACKED = 1024
# Capsule names must outlive the capsule: keep every forged name interned here.
cdef dict _names = {}


# ---- NumPy memory: described only where DLPack says exactly what it is -------

cdef enum:   # a NumPy array's form
    NP_EXACT = 0        # a DLPack header describes the memory exactly
    NP_COPY = 1         # numeric, but byte order or byte strides DLPack cannot express:
                        # only a copy (NumPy's own, which swaps and gathers) is right
    NP_NOT_NUMERIC = 2  # str, bytes, object, datetime, structured: no DLPack type
    NP_NO_CODE = 3      # numeric, but DLPack has no code for it (e.g. longdouble)


cdef tuple _numpy_form(arr):
    """``(form, why)`` of ndarray ``arr`` (NP_*); ``why`` says in words what DLPack lacks."""
    dt = arr.dtype
    try:
        dldtype_from_numpy(dt)
    except ValueError:
        if dt.kind in "biufc" or str(getattr(dt.type, "__module__", "")).startswith("ml_dtypes"):
            return NP_NO_CODE, f"DLPack has no type code for {dt.name}"
        return (NP_NOT_NUMERIC, f"DLPack has no type for dtype {dt.str} ({dt.name}): no "
                                f"string, bytes, object, date/time or structured types")
    if not dt.isnative:
        order = "big" if dt.byteorder == ">" else "little"
        return (NP_COPY, f"its dtype {dt.str} is {order}-endian, not this machine's byte "
                         f"order, and DLPack data follows native byte order only")
    if arr.size > 1:
        for extent, stride in zip(arr.shape, arr.strides):
            if extent > 1 and stride % dt.itemsize:
                return (NP_COPY, f"its byte strides {arr.strides} include {stride}, which is "
                                 f"not a multiple of its {dt.itemsize}-byte elements, and DLPack "
                                 f"counts strides in whole elements")
    return NP_EXACT, None


cdef str _type_name(obj):
    tp = type(obj)
    return f"{tp.__module__}.{tp.__qualname__}"


def capsule_of(arr, bint read_only=False):
    """A versioned capsule viewing ``arr`` (ml_dtypes too), or ValueError saying why not."""
    form, why = _numpy_form(arr)
    if form != NP_EXACT:
        raise ValueError(f"DLPack cannot describe this array exactly: {why}")
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    cdef uint64_t flags = DLPACK_FLAG_BITMASK_READ_ONLY if read_only else 0
    if bits * lanes < 8:
        flags |= DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED   # one element per byte
    cdef int64_t shape[_MAX_NDIM], strides[_MAX_NDIM]
    cdef DLTensor t
    _numpy_header(arr, c_DLDataType(code, bits, lanes), &t, shape, strides)
    return _capsule(arr, &t, t.ndim, flags)


cdef bint _numpy_header(cnp.ndarray a, c_DLDataType dtype, DLTensor* t, int64_t* shape,
                        int64_t* strides) noexcept:
    """``t``: ``a``'s header as ``dtype`` (``shape``, ``strides``: its arrays, MAX_NDIM long,
    at most that many dimensions). False where a stride holds part of an element."""
    cdef int32_t i, ndim = cnp.PyArray_NDIM(a)
    cdef int64_t row = 1, item = cnp.PyArray_ITEMSIZE(a)
    # An extent-1 axis may carry any stride (NumPy gives some 0): the header gets the row-major
    # one (jaxlib 0.4.30 takes a stride-0 axis for the minor one, a layout its jit refuses).
    for i in range(ndim - 1, -1, -1):
        shape[i] = cnp.PyArray_DIMS(a)[i]
        strides[i] = cnp.PyArray_STRIDES(a)[i] // item
        if shape[i] <= 1:
            strides[i] = row
        elif cnp.PyArray_STRIDES(a)[i] % item == 0:
            row *= shape[i]
        elif cnp.PyArray_SIZE(a):
            return False
        else:
            strides[i] = 0   # (an empty array's: it addresses nothing)
    t[0] = DLTensor(cnp.PyArray_DATA(a), DLDevice(kDLCPU, 0), ndim, dtype, shape, strides, 0)
    return True


# DLPack's ``code | bits << 8`` by the type number of a builtin NumPy dtype (0: none here).
cdef uint16_t _KEY_OF_NUM[32]
for _char in "?bBhHiIlLqQefdFD":
    _code, _bits, _ = dldtype_from_numpy(_char)
    _KEY_OF_NUM[_np_dtype(_char).num] = _code | _bits << 8
del _char, _code, _bits, _


cdef inline int _numpy_key(cnp.ndarray a) noexcept:
    """``a``'s dtype as DLPack's ``code | bits << 8`` where it is a builtin one; else 0."""
    cdef int num = cnp.PyArray_TYPE(a)
    return _KEY_OF_NUM[num] if 0 <= num < 32 else 0


cdef TensorInfo _ndarray_info(cnp.ndarray a):
    """``a``'s header read from its fields without an export (source "ndarray"); None where
    NumPy's export must judge it: a dtype not builtin or not native, a stride of part of an
    element."""
    cdef int key = _numpy_key(a)   # (NumPy's dimensions are at most MAX_NDIM: 64, 32 before 2.0)
    if key == 0 or not cnp.PyArray_ISNOTSWAPPED(a):
        return None
    cdef int64_t shape[_MAX_NDIM], strides[_MAX_NDIM]
    cdef DLTensor t
    if not _numpy_header(a, c_DLDataType(key & 0xFF, key >> 8, 1), &t, shape, strides):
        return None
    return _new_info(&t, SRC_NDARRAY, 0 if cnp.PyArray_ISWRITEABLE(a) else DLPACK_FLAG_BITMASK_READ_ONLY)


def numpy_capsule(arr, refusal=None):
    """A capsule standing in for NumPy's refused export (ml_dtypes; read-only on NumPy < 2.1),
    or the export's error for ``arr`` (chained to ``refusal`` where DLPack has no code)."""
    form, why = _numpy_form(arr)
    if form == NP_EXACT:
        return capsule_of(arr, not arr.flags.writeable)
    what = f"a {_type_name(arr)} of dtype {arr.dtype.str} ({arr.dtype.name}) and shape {arr.shape}"
    if form == NP_NOT_NUMERIC:
        raise NotNumericError(f"{what} is not a numeric tensor: {why}. Inside a batch it is a "
                              f"leaf kept as it is (leaves='keep').") from None
    if form == NP_COPY:
        exc = NotDescribableError(
            f"{what} cannot be described by DLPack: {why}, so NumPy refused "
            f"to export it and dlinspect gives it no header. to_host and to_jax copy it into "
            f"native, C-ordered memory (copy=None); peek and copy=False cannot. To fix: "
            f"x = numpy.ascontiguousarray(x, dtype=x.dtype.newbyteorder('=')).")
        exc.array = arr
        exc.why = why
        raise exc from None
    raise UnsupportedDTypeError(   # (NP_NO_CODE: chained to NumPy's refusal)
        f"{what} cannot be exported: {why} (DLDataTypeCode), so NumPy refused "
        f"to export it and dlinspect has no header to give. To fix: convert it first, "
        f"e.g. x.astype(numpy.float32).") from refusal


def view_capsule(owner, TensorInfo info):
    """A "dltensor_versioned" capsule over ``owner``'s memory as ``info`` (a slice) says it."""
    cdef DLTensor t = DLTensor(<void*>info._ptr(), DLDevice(info._cap_dev_type, info._cap_dev_id),
                               info.ndim, c_DLDataType(info._code, info._bits, info._lanes),
                               info._shape, info._strides, 0)
    return _capsule(owner, &t, info.ndim,   # (the flags that say what the memory holds)
                    info.flags & (DLPACK_FLAG_BITMASK_READ_ONLY | DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED))


def header_capsule(owner, uintptr_t address, shape, strides, int code, int bits, int lanes,
                   int device_type=kDLCPU, int device_id=0, uint64_t flags=0):
    """A "dltensor_versioned" capsule of the header given (in elements) over ``owner``'s memory."""
    if len(shape) > _MAX_NDIM or len(strides) != len(shape):
        raise ValueError("shape and strides of one length, at most MAX_NDIM")
    return _make_capsule(owner, address, shape, None, strides, code, bits, lanes, device_type,
                         device_id, 0, True, DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR,
                         flags, None, None, False)


# ---- versioned -> legacy adapter (JAX imports "dltensor" only) --------------

cdef void _adapter_deleter(DLManagedTensor* dlm) noexcept nogil:
    cdef DLManagedTensorVersioned* dlm_ver = <DLManagedTensorVersioned*>dlm.manager_ctx
    free(dlm)
    if dlm_ver != NULL and dlm_ver.deleter != NULL:
        dlm_ver.deleter(dlm_ver)


cpdef import_capsule(import_fn, cap, device, stream, copy, int dl_device_type):
    """``import_fn`` on a "dltensor" capsule; a "dltensor_versioned" ``cap`` goes through a
    zero-copy adapter that consumes it (its deleter calls the versioned one exactly once).
    jaxlib renames a capsule only on success: on failure ``cap`` gets its name back and owns
    the tensor again, the unconsumed adapter freeing only itself."""
    if PyCapsule_IsValid(cap, LEGACY):
        return import_fn(cap, device, stream, copy, dl_device_type)
    if not PyCapsule_IsValid(cap, VERSIONED):   # another thread took it since it was read
        _raise_bad_capsule(cap)
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
            dlm.manager_ctx = NULL   # (then its deleter frees only itself)
            PyCapsule_SetName(cap, VERSIONED)
        raise


# ---- host views: keep a consumed tensor alive behind a NumPy array ----------

cdef class HostOwner:
    """Owns one consumed tensor (its deleter runs when this dies): the base of views over it."""
    cdef DLManagedTensor* dlm
    cdef DLManagedTensorVersioned* dlm_ver

    def __dealloc__(self):
        _delete(self.dlm, self.dlm_ver)


cpdef take(cap):
    """Consume a DLPack capsule into a :class:`HostOwner` (renames it ``used_*``); a torch
    tensor's storage read in MODE_VIEW is the owner itself."""
    if not PyCapsule_CheckExact(cap):
        return cap
    cdef HostOwner owner = HostOwner.__new__(HostOwner)
    if PyCapsule_IsValid(cap, VERSIONED):
        owner.dlm_ver = <DLManagedTensorVersioned*>PyCapsule_GetPointer(cap, VERSIONED)
        PyCapsule_SetName(cap, VERSIONED_USED)
    elif PyCapsule_IsValid(cap, LEGACY):
        owner.dlm = <DLManagedTensor*>PyCapsule_GetPointer(cap, LEGACY)
        PyCapsule_SetName(cap, LEGACY_USED)
    else:   # another thread took it since its header was read
        _raise_bad_capsule(cap)
    return owner


cdef int _untake(taken, cap) except -1:
    """Undo :func:`take` after a failed step: ``cap`` owns the tensor again, ``taken`` nothing."""
    if taken is cap:   # (a storage: nothing was taken)
        return 0
    cdef HostOwner owner = taken
    PyCapsule_SetName(cap, VERSIONED if owner.dlm_ver != NULL else LEGACY)   # (take took one)
    owner.dlm = NULL
    owner.dlm_ver = NULL
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
    raw = _np_empty(dt.itemsize * _math.prod(shape) + alignment + offset, "uint8")
    return _np_ndarray(shape, dt, raw, (-<Py_ssize_t>_buffer_address(raw)) % alignment + offset)


cdef size_t _buffer_address(obj) except? 0:
    """The address of a contiguous buffer's first byte (without NumPy's ``.ctypes``)."""
    cdef Py_buffer view
    PyObject_GetBuffer(obj, &view, PyBUF_ANY_CONTIGUOUS)
    cdef size_t address = <size_t>view.buf
    PyBuffer_Release(&view)
    return address
