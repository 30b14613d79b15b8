# export.pxi: the only code that talks to producers (__dlpack__, __dlpack_device__, the C
# exchange API, the array protocol), and guards them. A producer's exception becomes a
# ProducerError keeping its words; its device is reconciled with the header's first.

import re as _re

cdef tuple _MAX_VERSION = (DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR)
cdef tuple _KW_MV = ("max_version",)
cdef tuple _KW_MV_S = ("max_version", "stream")
cdef tuple _KW_MV_DEV_COPY = ("max_version", "dl_device", "copy")
cdef tuple _HOST_DEVICE = (1, 0)    # (kDLCPU, 0)
cdef object _TRUE = True            # (a bare True cast to PyObject* would be the C int 1)


# ---- the producer table: one row per producer quirk -------------------------

cdef enum Guard:
    GUARD_NONE = 0
    GUARD_NUMPY = 1      # NumPy's refused exports, described where DLPack says what they are
    GUARD_TORCH = 2      # the lazy negative bit (exported unapplied); the exchange-API take
    GUARD_TF = 3         # tf.string/variant/resource: TensorFlow's __dlpack__ aborts the process
    GUARD_JAX = 4        # a jax.Array: not a foreign tensor; a deleted or donated one is refused
    GUARD_NO_DLPACK = 5  # no DLPack form (ragged, sparse): refused, never kept as a leaf
    GUARD_PYARROW = 6    # non-numeric pyarrow arrays are not tensors

# Refusal hints (pattern, what to do), tried in order on the producer's words: the row's, then these.
_GENERIC_HINTS = (
    ("requires_grad|gradient", "call .detach() first (the tensor takes part in autograd; for a "
     "dict of them, as a model's parameters: {k: v.detach() for k, v in d.items()})"),
    ("readonly|read-only", "copy it first (e.g. x.copy()): the producer cannot export read-only memory"),
    ("dtype", "convert it to a numeric dtype first (DLPack has no string or object types)"),
    ("device", "move it to host memory with its own library first"),
)
_TORCH_HINTS = (
    ("device type meta", "a meta tensor has a shape and a dtype but no data, so there is "
     "nothing to move or view; make a tensor that has data first, e.g. "
     "torch.zeros_like(t, device=\"cpu\")"),
    ("device", "move it to host memory first: t.cpu()"),
    ("quint|qint|quantiz", "call .dequantize() first (DLPack has no quantized types)"),
    ("conj", "call .resolve_conj() first (the conjugate bit is set lazily)"),   # conjugate too
    ("negative bit", "call .resolve_neg() first"),
    ("sparse|have storage", "call .to_dense() first (DLPack describes strided tensors only)"),
    ("strided", "call .to_dense() or .contiguous() first (DLPack describes strided tensors only)"),
)
_PYARROW_HINTS = (
    ("null", "fill or drop the missing values first (pyarrow: arr.fill_null(0) or arr.drop_null())"),
    ("boolean", "cast it to a numeric type first (pyarrow stores booleans as bits: arr.cast('uint8'))"),
    ("datatype|not compatible with dlpack",
     "convert it to a numeric type first (pyarrow: arr.cast('int32'))"),
)


class Producer(_NamedTuple):
    """One row of :data:`PRODUCERS`: what dlinspect knows of one producer's tensor type."""

    guard: int = GUARD_NONE   # the guard run before any export (Guard)
    hints: tuple = ()         # (pattern, what to do) pairs searched in its own refusals
    fix: object = None        # a tensor type with no DLPack form (refused): what to do instead
    # How it copies device memory into host memory dlinspect gives it ("torch": out.copy_(x);
    # another string: the method x.NAME(out)): a host fallback's one copy, into memory JAX views.
    into: object = None
    # (module, expression): how dlinspect doctor finds the tensor type (the module as m).
    doctor: object = None
    # how it converts a tensor to another dtype ({}: the dtype's name), for advice
    astype: str = "xp.astype(x, xp.{})"
    other: str = "convert the tensor with its own library first"   # where no hint matches
    contiguous: str = ""      # how it makes a contiguous copy of a tensor ("": unknown)


_LOADER_FIX = ("it is a data loader, not a batch: iterate it through "
               "dlinspect.prefetch_to_jax(loader), which converts each batch it gives")
_SPARSE_FIX = "make it dense with x.toarray(), or take x.data and its index arrays apart"
_COLUMNS_FIX = ("take its columns as arrays, {{name: x.column(name).to_numpy() for name in x.{}}} "
                "(Ray: batch_format='numpy')")

#: The one list of producers: ``(top-level package, class name in the type's MRO)`` to its
#: :class:`Producer` row; a type takes its most derived class's row (a ``jax.Array``, a
#: virtual base on some jaxlib versions, is found by ``issubclass``).
PRODUCERS = {
    ("numpy", "ndarray"): Producer(GUARD_NUMPY, doctor=("numpy", "m.ndarray"),
                                   astype="x.astype(numpy.{})"),
    ("torch", "Tensor"): Producer(GUARD_TORCH, _TORCH_HINTS, into="torch",
                                  doctor=("torch", "m.Tensor"), astype="t.to(torch.{})",
                                  contiguous="t.contiguous()", other="convert it with torch "
                                  "first (t.cpu(), t.contiguous(), t.to(dtype))"),
    ("jax", "Array"): Producer(GUARD_JAX, (
        ("dlpack equivalent", "take it as NumPy with numpy.asarray(x), or convert it "
         "first with x.astype(jax.numpy.int8)"),), doctor=("jax", "type(m.numpy.zeros(1))"),
        astype="x.astype(jax.numpy.{})", other="take it as NumPy with numpy.asarray(x)"),
    ("cupy", "ndarray"): Producer(doctor=("cupy", "m.ndarray"), astype="x.astype(cupy.{})",
                                  contiguous="cupy.ascontiguousarray(x)", other="convert it "
                                  "with CuPy first (cupy.asnumpy(x), cupy.ascontiguousarray(x))"),
    ("tensorflow", "EagerTensor"): Producer(GUARD_TF, astype="tf.cast(x, tf.{})",
                                            doctor=("tensorflow", "type(m.constant(1.0))"),
                                            other="take it as NumPy with x.numpy()"),
    ("tensorflow", "RaggedTensor"): Producer(
        GUARD_NO_DLPACK, fix="make it dense with x.to_tensor() (pads the rows), or take "
        "x.flat_values and x.row_splits apart"),
    ("tensorflow", "SparseTensor"): Producer(
        GUARD_NO_DLPACK, fix="make it dense with tf.sparse.to_dense(x), or take x.indices "
        "and x.values apart"),
    ("tensorflow", "Variable"): Producer(
        GUARD_NO_DLPACK, fix="pass its value, x.read_value() (a tf.Tensor), or "
        "tf.convert_to_tensor(x)"),
    ("scipy", "spmatrix"): Producer(GUARD_NO_DLPACK, fix=_SPARSE_FIX),
    ("scipy", "_spbase"): Producer(GUARD_NO_DLPACK, fix=_SPARSE_FIX),
    ("pyarrow", "Table"): Producer(GUARD_NO_DLPACK, fix=_COLUMNS_FIX.format("column_names")),
    ("pyarrow", "RecordBatch"): Producer(GUARD_NO_DLPACK, fix=_COLUMNS_FIX.format("schema.names")),
    ("pandas", "DataFrame"): Producer(
        GUARD_NO_DLPACK, fix="take its columns as arrays, {c: x[c].to_numpy() for c in x} "
        "(Ray: batch_format='numpy'; datasets: with_format('numpy'))"),
    ("pandas", "Series"): Producer(GUARD_NO_DLPACK, fix="take its values: x.to_numpy()"),
    ("pyarrow", "Array"): Producer(GUARD_PYARROW, _PYARROW_HINTS,
                                   doctor=("pyarrow", "type(m.array([1], m.int64()))")),
    ("pyarrow", "ChunkedArray"): Producer(
        GUARD_PYARROW, _PYARROW_HINTS, fix="join its chunks first: x.combine_chunks() (one "
        "pyarrow Array, which has __dlpack__)"),
    ("warp", "array"): Producer(doctor=("warp", "m.array"), other="take it as NumPy with x.numpy()"),
    ("mlx", "array"): Producer(doctor=("mlx.core", "m.array"), astype="a.astype(mlx.core.{})",
                               other="take it as NumPy with numpy.array(a)"),
    ("paddle", "Tensor"): Producer(doctor=("paddle", "m.Tensor"), astype="x.astype(paddle.{})",
                                   other="take it as NumPy with x.numpy()"),
    ("array_api_strict", "Array"): Producer(doctor=("array_api_strict", "type(m.asarray([1]))")),
    ("tvm_ffi", "Tensor"): Producer(doctor=("tvm_ffi", "m.Tensor")),
    ("dpnp", "ndarray"): Producer(doctor=("dpnp", "m.ndarray"), astype="x.astype(dpnp.{})",
                                  contiguous="dpnp.ascontiguousarray(x)",
                                  other="take it as NumPy with dpnp.asnumpy(x)"),
    # Loaders: what a user meant to convert is each batch they give.
    **dict.fromkeys([("torch", "DataLoader"), ("grain", "DataLoader"), ("grain", "MapDataset"),
                     ("grain", "IterDataset"), ("grain", "DatasetIterator"),
                     ("tensorflow", "DatasetV2")], Producer(GUARD_NO_DLPACK, fix=_LOADER_FIX)),
    ("datasets", "Dataset"): Producer(GUARD_NO_DLPACK, fix=(
        "it is a dataset, not a batch: iterate its batches through dlinspect.prefetch_to_jax("
        "ds.with_format('numpy').iter(batch_size=n))")),
}


# ---- per-type facts, looked up once per type -------------------------------

cdef class _TypeEntry:
    cdef const DLPackExchangeAPI* api
    cdef Guard guard               # the producer table's guard for this type
    # api_owner: the "dlpack_exchange_api" capsule that owns *api; fix (GUARD_NO_DLPACK): what
    # to do instead; into: how the producer copies into given host memory, or None.
    cdef object api_owner, fix, into
    # has_device: ask __dlpack_device__ (not exactly numpy.ndarray's: the same source as its
    # header); own_export: its export is of the memory its fields say, where the ownership
    # proof looks (_exports_own);
    # ask_device_on_cpu: exchange API: a kDLCPU header may be pinned host memory;
    # bare_only: its __dlpack__ refused max_version once: an older producer.
    cdef bint has_dlpack, has_device, own_export, ask_device_on_cpu, bare_only

cdef dict _types = {}
_TYPES = _types   # the same table, for tests (its size; emptied where a type changes)
#: Most types remembered at once; past it the table starts again (types made in a loop).
TYPES_MAX = 256


cdef _producer_row(tp):   # (a row of defaults where the table has none)
    jax = _sys.modules.get("jax")
    # (a tracer, a value inside jax.jit, vmap or grad, is JAX's own too, where jax.core
    # still names its class)
    tracer = getattr(getattr(jax, "core", None), "Tracer", ())
    if jax is not None and isinstance(tp, type) and issubclass(tp, (jax.Array, tracer)):
        return PRODUCERS[("jax", "Array")]
    for cls in getattr(tp, "__mro__", ()):
        row = PRODUCERS.get((str(getattr(cls, "__module__", "")).partition(".")[0],
                             cls.__name__))
        if row is not None:
            return row
    return Producer()


cdef bint _exports_own(tp, Guard guard) except -1:
    """Whether ``tp`` is NumPy's or torch's array type, or a subclass that overrides none of
    what the ownership proof reads: a subclass's ``__dlpack__`` may hand over another
    tensor's memory, its ``_base`` another base, and its ``__torch_function__`` or
    ``__torch_dispatch__`` answer torch's own ``__dlpack__`` (nn.Parameter's disables it)."""
    if guard == GUARD_NUMPY:
        return getattr(tp, "__dlpack__", None) is _np_ndarray.__dlpack__
    if guard != GUARD_TORCH:
        return False
    torch = _sys.modules["torch"]
    tensor = torch.Tensor
    function = getattr(tp.__torch_function__, "__func__", tp.__torch_function__)
    return (getattr(tp, "__dlpack__", None) is tensor.__dlpack__
            and getattr(tp, "_base", None) is tensor._base
            and tp.__torch_dispatch__ is tensor.__torch_dispatch__
            and function in (tensor.__torch_function__.__func__,
                             torch._C._disabled_torch_function_impl))


cdef _TypeEntry _entry_for(tp):
    cdef PyObject* hit = PyDict_GetItemWithError(_types, tp)
    if hit != NULL:
        return <_TypeEntry>hit
    cdef _TypeEntry entry = _TypeEntry.__new__(_TypeEntry)
    cdef const DLPackExchangeAPI* api
    # Only a type that defines the table itself: a subclass may override __dlpack__,
    # and the table's functions expect objects of the type that owns it.
    api_obj = getattr(tp, "__dict__", {}).get("__dlpack_c_exchange_api__")
    if PyCapsule_IsValid(api_obj, EXCHANGE_API):   # (None is no capsule)
        api = <const DLPackExchangeAPI*>PyCapsule_GetPointer(api_obj, EXCHANGE_API)
        if (api.header.version.major == 1 and api.dltensor_from_py_object_no_sync != NULL
                and api.managed_tensor_from_py_object_no_sync != NULL):
            entry.api = api
            entry.api_owner = api_obj
    row = _producer_row(tp)
    entry.guard, entry.fix, entry.into = row.guard, row.fix, row.into
    # A tensor type without __dlpack__ (typed PRNG keys, ragged...) is still a tensor, and so
    # is one with the exchange API only.
    entry.has_dlpack = (hasattr(tp, "__dlpack__") or entry.fix is not None
                        or entry.guard == GUARD_JAX or entry.api != NULL)
    entry.own_export = _exports_own(tp, entry.guard)
    entry.has_device = hasattr(tp, "__dlpack_device__") and tp is not _np_ndarray
    entry.ask_device_on_cpu = entry.api != NULL and _pinned_possible(entry)
    _remember(_types, tp, entry, TYPES_MAX)
    return entry


cdef bint _pinned_possible(_TypeEntry entry):
    """Whether the producer may hand out pinned memory, which the exchange API calls kDLCPU."""
    try:
        return entry.guard != GUARD_TORCH or bool(_sys.modules["torch"].cuda.is_available())
    except Exception:
        return True


def exchange_api_version(tp):
    """``(major, minor)`` of the exchange API ``tp`` defines itself, where usable; else None."""
    cdef _TypeEntry entry = _entry_for(tp)
    if entry.api == NULL:
        return None
    return (entry.api.header.version.major, entry.api.header.version.minor)


cdef _producer_error(obj, BaseException exc, str what):
    """A ProducerError of the producer's reason and what to do (its row's hints, then generic)."""
    # First line only: C++ producers append a stack trace (kept in __cause__).
    reason = first_line(exc, False).rstrip() or type(exc).__name__
    if not reason.endswith((".", "!", "?")):
        reason += "."
    low = reason.lower()
    row = _producer_row(type(obj))
    todo = next((hint for key, hint in row.hints + _GENERIC_HINTS if _re.search(key, low)), row.other)
    # (a hint whose every call the producer's reason names already adds nothing)
    methods = _re.findall(r"\.\w+\(\)", todo)   # ".detach()" in a hint
    fix = "" if methods and all([m in reason for m in methods]) else f" To fix: {todo}."
    return ProducerError(f"{_type_name(obj)}.{what} raised {type(exc).__name__}: {reason}{fix}")


ctypedef struct _Asked:
    # The device a producer reported (__dlpack_device__, or the exchange API's header);
    # asked: a device was reported, the header is reconciled with it; id_known: False where
    # the producer said None for the id (paddle).
    int32_t dev_type, dev_id
    bint asked, id_known


# contract: fills ``out`` (id_known False for a None id; asked) or raises ProducerError
# (the producer raised) or MalformedTensorError (not a device pair).
cdef int _ask_device(x, _Asked* out) except -1:
    cdef PyObject* args[1]
    args[0] = <PyObject*>x
    try:
        dev = PyObject_VectorcallMethod("__dlpack_device__", args, 1, NULL)
    except Exception as exc:
        raise _producer_error(x, exc, "__dlpack_device__()") from exc
    if type(dev) is tuple and PyTuple_GET_SIZE(dev) == 2:
        kind, ordinal = <tuple>dev
        if PyIndex_Check(kind) and (ordinal is None or PyIndex_Check(ordinal)):
            try:
                out.dev_type, out.dev_id = kind, (out.dev_id if ordinal is None else ordinal)
                out.asked, out.id_known = True, ordinal is not None
                return 0
            except OverflowError:
                pass
    raise MalformedTensorError(
        f"{_type_name(x)}.__dlpack_device__() returned {dev!r}; the array API requires "
        f"a (device_type, device_id) tuple of two ints (int32). The producer is at fault: "
        f"report it to its maintainers, or move the tensor to NumPy with its own library.")


cdef _call_dlpack(x, _TypeEntry entry, stream, bint host_copy):
    """``x.__dlpack__(max_version=(1, 3)[, stream][, dl_device=(kDLCPU, 0), copy=True])``,
    again without the new keywords only where its TypeError is about them (an older
    producer: numpy < 2.1, torch < 2.4; no host copy asked), its type remembered for that."""
    cdef PyObject* args[4]
    cdef tuple names = _KW_MV
    if not entry.bare_only or host_copy:
        args[0] = <PyObject*>x
        args[1] = <PyObject*>_MAX_VERSION
        if host_copy:
            args[2] = <PyObject*>_HOST_DEVICE
            args[3] = <PyObject*>_TRUE
            names = _KW_MV_DEV_COPY
        elif stream is not None:
            args[2] = <PyObject*>stream
            names = _KW_MV_S
        try:
            return PyObject_VectorcallMethod("__dlpack__", args, 1, <PyObject*>names)
        except Exception as exc:
            # (not a TypeError about the tensor itself: pyarrow's nulls)
            if (host_copy or not isinstance(exc, TypeError)
                    or not ("keyword" in str(exc) or "max_version" in str(exc))):
                raise _producer_error(x, exc, "__dlpack__()") from exc
        entry.bare_only = True
    try:
        return x.__dlpack__() if stream is None else x.__dlpack__(stream=stream)
    except Exception as exc:
        raise _producer_error(x, exc, "__dlpack__()") from exc


cdef _torch_take(x, _TypeEntry entry):
    """A host torch tensor that does not require grad (_api_header) taken through the exchange
    API where ``__dlpack__`` would export it as it is (the API makes none of its refusals:
    requires_grad, the conjugate bit); else None (CUDA memory takes a stream; the API calls
    pinned memory kDLCPU)."""
    cdef DLManagedTensorVersioned* dlm_ver = NULL
    if (entry.api.managed_tensor_from_py_object_no_sync(<void*>x, &dlm_ver) != 0
            or dlm_ver == NULL):
        PyErr_Clear()
        return None
    cap = None
    try:
        if _torch_on_host(x, entry, &dlm_ver.dl_tensor):
            cap = PyCapsule_New(dlm_ver, VERSIONED, _owned_capsule_destructor)
    finally:
        if cap is None and dlm_ver.deleter != NULL:   # not kept, or an error: released
            dlm_ver.deleter(dlm_ver)
    return cap


cdef TensorInfo _torch_view(x, _TypeEntry entry, PyObject** cap_out, storage):
    """MODE_VIEW: the header of a host torch tensor _torch_take would take, read through the
    exchange API without making a managed tensor; *cap_out is the tensor's storage, which
    keeps the memory alive as the base of a view (a later ``x.set_()`` cannot free it): the
    ``storage`` the batch's proof found, else asked for. Else None."""
    cdef DLTensor t
    if entry.api.dltensor_from_py_object_no_sync(<void*>x, &t) != 0:
        PyErr_Clear()
        return None
    if not _torch_on_host(x, entry, &t):
        return None
    if storage is None or storage is True:
        storage = x.untyped_storage()
    return _handing(_new_info(&t, SRC_EXCHANGE, 0), storage, cap_out)


cdef bint _torch_on_host(x, _TypeEntry entry, const DLTensor* t) except -1:
    """Torch tensor ``x`` of header ``t`` is in host memory that is not pinned, without the
    conjugate bit: what __dlpack__ would export as it is."""
    cdef _Asked dev
    if t.device.device_type != kDLCPU or (t.dtype.code == kDLComplex and x.is_conj()):
        return False
    if entry.ask_device_on_cpu:
        _ask_device(x, &dev)
        return dev.dev_type == kDLCPU
    return True


# torch's methods the guard and a batch's proof (own.pxi) call on each leaf, taken from
# its classes once (a call then skips the lookup through torch.Tensor's and
# UntypedStorage's classes): (untyped_storage, is_shared, resizable, is_neg).
cdef tuple _torch_calls = None


cdef tuple _torch_methods():
    global _torch_calls
    if _torch_calls is None:
        torch = _sys.modules["torch"]
        _torch_calls = (torch.Tensor.untyped_storage, torch.UntypedStorage.is_shared,
                        torch.UntypedStorage.resizable, torch.Tensor.is_neg)
    return _torch_calls


# tf.DType names TensorFlow's __dlpack__ aborts the process on (GUARD_TF).
cdef frozenset _TF_NOT_NUMERIC = frozenset(["string", "variant", "resource"])


# contract: returns 0 or raises NotDLPackError or the guard's error (see Guard); runs before
# any export.
cdef int _guard(x, _TypeEntry entry, Mode mode) except -1:
    cdef Guard g = entry.guard
    if not entry.has_dlpack:
        raise NotDLPackError(
            f"an object of type {_type_name(x)} is neither a DLPack capsule nor has "
            f"__dlpack__; pass a tensor from a DLPack producer (NumPy, PyTorch, JAX, "
            f"CuPy...) or the capsule its __dlpack__() returns.")
    if g == GUARD_TORCH and mode != MODE_PEEK and _torch_methods()[3](x):
        raise ProducerError(
            f"{_type_name(x)} has the lazy negative bit set (e.g. t.conj().imag), which its "
            f"__dlpack__ exports without applying: the values would arrive negated. To fix: "
            f"call .resolve_neg() first.")
    elif g == GUARD_TF and x.dtype.name in _TF_NOT_NUMERIC:
        raise NotNumericError(
            f"a {_type_name(x)} of dtype tf.{x.dtype.name} and shape {tuple(x.shape)} is not a "
            f"numeric tensor: DLPack has no {x.dtype.name} type (and TensorFlow's __dlpack__ "
            f"aborts the process on it, so dlinspect does not call it). Inside a batch it "
            f"is a leaf kept as it is (leaves='keep').")
    elif g == GUARD_JAX:
        _refuse_dead_array(x)
        if not hasattr(type(x), "__dlpack__"):
            raise NotDLPackError(
                f"a {_type_name(x)} (e.g. a typed PRNG key array) has no DLPack form. It "
                f"already is a jax.Array: to_jax returns it as it is; for its raw bits use "
                f"jax.random.key_data(x).")
    elif g == GUARD_PYARROW and not _pyarrow_numeric(x):
        raise NotNumericError(
            f"a {_type_name(x)} of type {x.type} is not a numeric tensor: DLPack has no such "
            f"type. Inside a batch it is a leaf kept as it is (leaves='keep').")
    if entry.fix is not None:
        raise ProducerError(
            f"a {_type_name(x)} has no DLPack form (DLPack describes dense, strided tensors "
            f"only), so it cannot be converted, and dlinspect does not pass it over as a "
            f"non-tensor leaf. To fix: {entry.fix}.")
    return 0


cdef bint _pyarrow_numeric(x) except -1:
    """Integers, floats, booleans and decimals (DLPack carries the first two)."""
    pa = _sys.modules.get("pyarrow")
    t = getattr(x, "type", None)
    if pa is None or t is None:
        return True    # (a look-alike of pyarrow's class: its export decides)
    types = pa.types
    return (types.is_integer(t) or types.is_floating(t) or types.is_boolean(t)
            or types.is_decimal(t))


cdef int _refuse_dead_array(x) except -1:
    if _deleted(x):
        raise ProducerError(
            f"the {_type_name(x)} was deleted or donated (x.delete(), or passed to a jitted "
            f"function with donate_argnums), so its memory is gone and it cannot be read, "
            f"moved or converted. To fix: pass an array that is still alive (keep x.copy() "
            f"before donating x).")
    return 0


cdef bint _deleted(x) except -1:
    """A jax.Array deleted or donated; never a tracer (inside jax.jit, vmap or grad), whose
    is_deleted() raises: it has no buffer to lose."""
    try:
        return x.is_deleted()
    except Exception:
        return False


cpdef inline bint is_tensor(x) except -1:
    """Whether ``x`` is a pytree leaf to convert (not a class, nor a non-numeric array)."""
    return _tensor_guard(x) != _NOT_A_TENSOR


cdef int _NOT_A_TENSOR = -1
cdef int _CAPSULE = -2


cdef int _tensor_guard(x) except -3:
    """``x``'s producer row's Guard where it is a tensor (_CAPSULE: a bare capsule), else
    _NOT_A_TENSOR (a class, a non-numeric array, no DLPack at all)."""
    if PyCapsule_CheckExact(x):
        return _CAPSULE
    if PyType_Check(x):
        return _NOT_A_TENSOR
    if type(x) is _np_ndarray and _numpy_key(x):   # (the hot path's: no table)
        return GUARD_NUMPY
    cdef _TypeEntry entry = _entry_for(type(x))
    if not entry.has_dlpack:
        return _NOT_A_TENSOR
    cdef bint numeric = True
    if entry.guard == GUARD_NUMPY:
        numeric = (<cnp.ndarray>x).descr.kind in b"biufc" or _numpy_form(x)[0] != NP_NOT_NUMERIC
    elif entry.guard == GUARD_TF:
        numeric = x.dtype.name not in _TF_NOT_NUMERIC
    elif entry.guard == GUARD_PYARROW:
        numeric = _pyarrow_numeric(x)
    return entry.guard if numeric else _NOT_A_TENSOR


cdef int _reconcile(TensorInfo info, x, const _Asked* dev, _TypeEntry entry) except -1:
    """Set ``info``'s device from ``__dlpack_device__``'s, checked against the header
    (TensorInfo, Notes); a jax.Array's own header's (jaxlib says id 0 for every CPU device)."""
    cdef int32_t hdr_type = info._cap_dev_type, hdr_id = info._cap_dev_id, dev_id = dev.dev_id
    if dev.dev_type == hdr_type or (_dev_is(dev.dev_type, _DEV_PINNED) and hdr_type == kDLCPU):
        if not dev.id_known or entry.guard == GUARD_JAX:
            dev_id = hdr_id
        if dev_id == hdr_id or dev.dev_type != hdr_type:
            info._dev_type = dev.dev_type
            info.device_id = dev_id
            return 0
    said = device_name(dev.dev_type, dev_id if dev.id_known else None)
    raise ProducerError(
        f"{_type_name(x)}.__dlpack_device__() says {said}, but the header of the capsule "
        f"its __dlpack__() returned says {device_name(hdr_type, hdr_id)}; DLPack requires "
        f"them to agree (the one exception: pinned host memory reported as kDLCUDAHost or "
        f"kDLROCMHost with a kDLCPU header). dlinspect read nothing from the tensor's memory. "
        f"To fix: move the tensor to host memory with its own library (torch: t.cpu()), and "
        f"report the disagreement to the producer's maintainers.")


cdef enum Mode:
    MODE_PEEK = 0        # the header only: the exchange API may fill it without a capsule
    MODE_TAKE = 1        # an owning capsule for a consumer
    MODE_HOST_COPY = 2   # an owning capsule of a host copy (dl_device=(kDLCPU, 0), copy=True)
    # as MODE_TAKE, but a host torch tensor's header is read through the exchange API and no
    # capsule made: *cap_out is its storage (_torch_view), for a view or a copy of the memory
    # (fast.pxi makes a capsule over it where a route takes one)
    MODE_VIEW = 3


cdef inline TensorInfo _handing(TensorInfo info, cap, PyObject** cap_out):
    Py_INCREF(cap)
    cap_out[0] = <PyObject*>cap
    return info


# contract: returns the TensorInfo and sets *cap_out to a new reference to the capsule
# (left NULL only in MODE_PEEK through the exchange API; an out-parameter: peek is on the
# hot path); a bare capsule is read, never consumed; on a raise *cap_out is untouched.
# ``stream_for``: a consumer's, which takes the capsule (None for a peek and a host copy);
# ``refuse_device`` judges the reported device before the export (fallback="raise");
# ``proof``: what the batch's proof found for ``x`` (a torch storage: MODE_VIEW's owner).
cdef TensorInfo _export(x, Mode mode, stream_for, PyObject** cap_out,
                        _TypeEntry entry=None, refuse_device=None, proof=None):
    if PyCapsule_CheckExact(x):
        info = _peek_capsule(x)
        info._bare = True
        return _handing(info, x, cap_out)
    if entry is None:
        entry = _entry_for(type(x))
    _guard(x, entry, mode)
    cdef _Asked dev = _Asked(0, 0, False, True)
    if entry.api != NULL and mode != MODE_HOST_COPY:   # (a host copy: __dlpack__'s keywords)
        info = _api_header(x, entry, mode, &dev, cap_out, proof)
        if info is not None:
            return info
    if not dev.asked and entry.has_device and mode != MODE_HOST_COPY:
        _ask_device(x, &dev)
    if refuse_device is not None and dev.asked:   # fallback="raise": judged before the export
        refuse_device(x, dev.dev_type, dev.dev_id)
    cap = _dlpack_capsule(x, entry, mode, stream_for, &dev)
    info = _peek_capsule(cap)
    if dev.asked:   # (never for a host copy: its header is the copy's)
        _reconcile(info, x, &dev, entry)
    return _handing(info, cap, cap_out)


cdef TensorInfo _api_header(x, _TypeEntry entry, Mode mode, _Asked* dev, PyObject** cap_out,
                            proof):
    """The header through the DLPack C exchange API: a taken torch tensor's, or the TensorInfo
    in MODE_PEEK; else None (then ``__dlpack__``), with the device in ``dev`` where the API
    said it (``dev`` untouched where the API refuses: ``__dlpack__`` says why). Never for a
    host copy."""
    if mode != MODE_PEEK and entry.guard == GUARD_TORCH:
        # The API skips every refusal of __dlpack__: taken only for torch, whose refusals
        # dlinspect checks itself (paddle's __dlpack__ refuses tensors that require grad); one
        # that requires grad is left to __dlpack__, which refuses it in its own words.
        if x.requires_grad:
            return None
        if mode == MODE_VIEW:
            return _torch_view(x, entry, cap_out, proof)
        cap = _torch_take(x, entry)
        return None if cap is None else _handing(_peek_capsule(cap), cap, cap_out)
    cdef DLTensor t
    memset(&t, 0, sizeof(DLTensor))
    if entry.api.dltensor_from_py_object_no_sync(<void*>x, &t) != 0:
        PyErr_Clear()
        return None
    dev.dev_type, dev.dev_id, dev.asked = t.device.device_type, t.device.device_id, True
    if dev.dev_type == kDLCPU and entry.ask_device_on_cpu:
        _ask_device(x, dev)   # pinned memory says kDLCPU here
    if mode != MODE_PEEK:
        return None
    info = _new_info(&t, SRC_EXCHANGE, 0)
    _reconcile(info, x, dev, entry)
    return info


cdef _dlpack_capsule(x, _TypeEntry entry, Mode mode, stream_for, _Asked* dev):
    """``__dlpack__``'s capsule (the consumer's stream where needed), or numpy_capsule's."""
    stream = None
    if stream_for is not None and dev.asked and _dev_is(dev.dev_type, _DEV_STREAM):
        stream = stream_for(dev.dev_type, dev.dev_id)
    try:
        cap = _call_dlpack(x, entry, stream, mode == MODE_HOST_COPY)
    except ProducerError as exc:
        # (numpy_capsule stands in for NumPy's own export only)
        if entry.guard != GUARD_NUMPY or not entry.own_export or mode == MODE_HOST_COPY:
            raise
        cap = numpy_capsule(x, exc)
    if not PyCapsule_CheckExact(cap):
        raise ProducerError(
            f"{_type_name(x)}.__dlpack__() returned {type(cap).__name__}, not a PyCapsule. "
            f"The producer is at fault: convert the tensor with its own library (e.g. to "
            f"NumPy) first.")
    return cap


cdef inline _take_ref(PyObject* p):   # (a new reference, handed over; NULL: None)
    if p == NULL:
        return None
    obj = <object>p
    Py_XDECREF(p)
    return obj


@cython.binding(False)
@cython.always_allow_keywords(False)
def peek(obj, /):
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
        ``ndim > 0``, a negative extent, or sizes overflowing int64; or a
        ``__dlpack_device__`` that is not a pair of ints (a ``BufferError``).
    NotDLPackError
        ``obj`` is neither a DLPack capsule nor has ``__dlpack__`` (a ``TypeError``).
    ProducerError
        The producer raised (any exception type; its words are kept and the
        original is the ``__cause__``), or its ``__dlpack_device__`` and header
        disagree (a ``BufferError``).

    Notes
    -----
    A capsule is read in place: it is never renamed and its deleter is never
    called, so any consumer can take it afterwards (DLPack python_spec,
    "consumed exactly once"). For objects whose type defines the DLPack 1.3 C
    exchange API (``__dlpack_c_exchange_api__``, e.g. ``torch.Tensor``), the
    header is filled on the stack by ``dltensor_from_py_object_no_sync`` and no
    capsule is made. Otherwise ``obj.__dlpack__(max_version=(1, 3))`` is called
    (again without the keyword only when its ``TypeError`` is about keywords,
    for older producers), the capsule is read and released normally.
    ``__dlpack_device__()``, where present, gives the device after it is
    reconciled with the header's (see :class:`TensorInfo`); NumPy arrays that
    NumPy cannot export (ml_dtypes dtypes, read-only arrays on NumPy < 2.1) are
    described by a capsule dlinspect makes over the same memory.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> info = dlinspect.peek(np.zeros((3, 4), np.float32))
    >>> info.shape, info.strides, info.dtype_name, info.is_c_contiguous
    ((3, 4), (4, 1), 'float32', True)
    """
    cdef PyObject* cap = NULL
    info = _export(obj, MODE_PEEK, None, &cap)
    Py_XDECREF(cap)
    return info


def export(x, stream_for=None):
    """Export ``x`` once for a consumer: ``(capsule, TensorInfo)`` (a bare capsule read, not
    consumed); ``stream_for(device_type, device_id)``: the ``stream`` for CUDA/ROCm memory."""
    cdef PyObject* cap = NULL
    info = _export(x, MODE_TAKE, stream_for, &cap)
    return (_take_ref(cap), info)


#: Public "to host" methods producers document, tried in this order after the DLPack
#: host copy (dpnp, cupy, mxnet: asnumpy; torch, tensorflow, paddle, tvm-ffi: numpy).
HOST_METHODS = ("asnumpy", "numpy")


def host_methods(x):
    return [name for name in HOST_METHODS if callable(getattr(type(x), name, None))]


cdef list _producer_copy_into(x, into, out):
    """The producer's copy of ``x`` into ``out`` (its row's ``into``): [], or [what failed]."""
    try:
        if into == "torch":
            flat = out.reshape(-1).view("uint8")
            _sys.modules["torch"].from_numpy(flat).view(x.dtype).view(x.shape).copy_(x)
        else:
            getattr(x, into)(out)
    except Exception as exc:
        return [f"{_words.into_call(into)} raised {first_line(exc)}"]
    return []


def export_host_copy(x):
    """A host copy of ``x``: ``(capsule, TensorInfo)`` from ``__dlpack__``, else ``(ndarray,
    None)`` from :data:`HOST_METHODS` or ``numpy.asarray``; else ``(None, what was tried)``."""
    cdef TensorInfo info
    cdef PyObject* p = NULL
    tried = []
    try:
        info = _export(x, MODE_HOST_COPY, None, &p)
        cap = _take_ref(p)
        if info.host_accessible:
            return (cap, info)
        tried.append(f"__dlpack__(dl_device=(kDLCPU, 0), copy=True) returned memory on "
                     f"{device_name(info._dev_type)}")
    except ProducerError as exc:
        tried.append(f"__dlpack__(dl_device=(kDLCPU, 0), copy=True) raised "
                     f"{first_line(exc.__cause__ or exc)}")
    for name in host_methods(x) + [None]:   # None: numpy.asarray, last
        what = f"x.{name}()" if name else "numpy.asarray"
        try:
            arr = getattr(x, name)() if name else _np.asarray(x)
        except Exception as exc:
            tried.append(f"{what} raised {first_line(exc)}")
            continue
        if isinstance(arr, _np_ndarray) and arr.dtype != object:
            return (arr, None)
        tried.append(f"{what} gave {type(arr).__name__}, not a numeric NumPy array" if name
                     else "numpy.asarray gave an object array (the producer has no __array__)")
    return (None, tried)
