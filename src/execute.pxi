# execute.pxi: one executor per action of a Route (EXECUTORS, HOST_EXECUTORS); none exports
# the caller's tensor again or calls to_jax. A failed route leaves a capsule unconsumed.

cdef _run(_Leaf d, x, JaxTarget tg, Options opts, bint prepared=False):
    """Execute decision ``d`` of tensor ``x``: by its verdict, its split, or its Route,
    ``_prepare``d first unless a batch did (``prepared``: _run_batch prepared it before
    anything was taken); a new array is committed only where a device or a sharding was
    named (put.pxi)."""
    if d.verdict == _V_PASS:
        return x
    if d.split is not None:
        return _split_again(d.cap, d.info, d.split, tg)
    if not prepared:
        _prepare(d, tg, opts)
    cdef Route route = d.route   # (None but for _V_ROUTE)
    if route is not None:
        action = route.action
        out = EXECUTORS[action](route, d.cap, x, tg, opts)
        if action in _NEW_ARRAY and not opts.committed:
            return tg.uncommit(out)
        return out
    cdef TensorInfo info = d.info
    if d.verdict == _V_COPY:
        return _copy_taken(d.cap, info, d.prepared, tg, tg.cpu_device, False)
    if info._dev_type == kDLCPU and info.device_id == 0 and _viewable_by_put(info, tg):
        return _put_view(tg, d.cap, x, info)
    # The consumer's stream, as the export asked the producer (array API __dlpack__): none
    # for a bare capsule, whose producer was never asked, nor for memory that takes none.
    stream = None
    if _dev_is(info._dev_type, _DEV_STREAM) and not PyCapsule_CheckExact(x):
        stream = tg.stream_for(info._dev_type, info.device_id)
    return tg.uncommit(import_capsule(tg.import_fn, d.cap, tg.device_of(info), stream, None,
                                      info._dev_type))


def to_jax_fast(x, JaxTarget tg, Options opts=DEFAULT):
    """(For tests) the array where the fast path takes ``x`` by its verdict; else
    ``(capsule, TensorInfo, needs)`` of the export, unconsumed."""
    cdef _Leaf d = _decide(x, tg, "jax", opts)
    if d.verdict == _V_ROUTE:
        return d.cap, d.info, d.needs
    return _run(d, x, tg, opts)


# The actions that make a new array of a tensor's values (uncommitted where not placed).
cdef frozenset _NEW_ARRAY = frozenset([IMPORT, HOST_COPY, HOST_VIEW, EMPTY, NUMPY_PUT, NUMPY_COPY])


cdef int _prepare(_Leaf d, JaxTarget tg, Options opts, name=None) except -1:
    """Before anything is taken, what can fail: the narrowing warning (a filter may raise it;
    ``name``: a batch's leaf -> its key path, which starts it) and a copy's memory
    (AllocationError): a _V_COPY's (``d.prepared``), a HOST_COPY route's (``Route._out``); a
    producer's host copy warns once it is in hand."""
    cdef Route route = d.route
    if d.verdict == _V_COPY:
        d.prepared = _prepare_copy(d, tg, opts, name)
    if route is None or route.action is PRODUCER_COPY:   # (an error route warns of nothing,
        return 0                                         # and takes no memory)
    if route.warning is not None:
        warn(_leaf_warning(route.warning, d, name))
    route = route.facts.get("whole", route)   # (a spread's: the route of the whole tensor)
    if route.action is HOST_COPY:
        route._out = _copy_memory(route, tg)
    return 0


cdef int _raise_route(Route route) except -1:
    """Raise the route's error, let go of by the route (no cycle: error -> traceback -> the
    caller's frame -> route -> error, which would keep the capsule alive)."""
    error = route.error
    route._error = None
    route.problem = None
    raise error


def repeated_capsule(list leaves, set seen not None):
    """The index of the first leaf that is a capsule met before (in ``leaves``, or by id in
    ``seen``, earlier sub-trees', updated), or -1: a capsule is consumed exactly once."""
    cdef Py_ssize_t i
    for i, leaf in enumerate(leaves):
        if PyCapsule_CheckExact(leaf):
            if id(leaf) in seen:
                return i
            seen.add(id(leaf))
    return -1


def repeated_capsule_error():
    return CapsuleConsumedError(
        "this DLPack capsule is also an earlier leaf of the batch (the same object twice), "
        "and a capsule is consumed exactly once, so converting it twice could only fail "
        "after the first consumed it; nothing was consumed. To fix: pass each capsule once, "
        "or the producer object instead (its __dlpack__ makes a capsule for every leaf).")


def _ex_import(Route route, cap, x, JaxTarget tg, Options opts):
    """Hand the capsule to jaxlib as it is (``copy=True`` where device memory is copied)."""
    stream = None if PyCapsule_CheckExact(x) else tg.stream_for(route.import_type, route.info.device_id)
    arr = import_capsule(tg.import_fn, cap, route.import_device, stream, route.import_copy,
                         route.import_type)
    if route.facts["relayout"]:   # device memory in a permuted order: made row-major there
        arr = arr.copy()
    if route._needs & NEED_NARROW:   # device memory: JAX narrows
        arr = tg.jnp.asarray(arr, dtype=tg.jax.dtypes.canonicalize_dtype(arr.dtype))
    return _finish(tg, arr, route)


def _ex_host_copy(Route route, cap, x, JaxTarget tg, Options opts):
    """One copy in C, no GIL (lanes: NumPy), into ``_prepare``'s memory; the source taken first."""
    cdef TensorInfo info = route.info
    out = route._out if route._out is not None else _copy_memory(route, tg)
    route._out = None
    if info._lanes != 1 or info._bits % 8:
        return _finish(tg, _host_copy(cap, info, out), route, opts)
    return _finish(tg, _copy_taken(cap, info, out, tg, route.import_device, opts.committed), route)


cdef _copy_memory(Route route, JaxTarget tg):
    """A HOST_COPY's aligned row-major memory (narrowed; lanes a last axis), or AllocationError."""
    cdef TensorInfo info = route.info
    narrow = route.facts["narrow"]
    code, bits = (info._code, info._bits) if narrow is None else narrow[2:4]
    if info._lanes != 1 or info._bits % 8:
        return _allocate(info._host_shape(), _numpy_dtype(code, bits), tg.copy_align, info)
    return _aligned_array(info, code, bits, tg.copy_align)


def _ex_host_view(Route route, cap, x, JaxTarget tg, Options opts):
    """A NumPy view, put (vector lanes; onto an accelerator: one transfer), or nothing taken."""
    view = _host_view(cap, route.info)
    try:
        return _finish(tg, view, route, opts)
    except BaseException:
        _untake(<HostOwner>view.base, cap)
        raise


def _ex_empty(Route route, cap, x, JaxTarget tg, Options opts):
    """A new empty array put as ``jax.device_put`` puts one: ``jnp.zeros`` compiles a fill,
    and XLA:CPU aborts the process compiling one for float6 (jaxlib 0.12.0.1)."""
    host = _np_empty((<TensorInfo>route.info)._host_shape(),
                     tg.jax.dtypes.canonicalize_dtype(route.info.numpy_dtype))
    out = _put_host(tg, host, route.jax_device, opts.committed, False)
    take(cap)   # (consumed once put: a refused put consumes nothing)
    return out


def _ex_producer_copy(Route route, cap, x, JaxTarget tg, Options opts):
    """No JAX device for it: the producer's copy into memory JAX views, else its host copy."""
    del cap   # the device capsule is not needed: its producer frees it now
    host, into = _producer_host(route, x, tg.copy_align)
    if into:   # (dlinspect's own memory, row-major: put as it is)
        return _put_host(tg, host, route.jax_device, opts.committed)
    # (the caller's narrowing warning, once the copy is in hand: see _prepare)
    if route.warning is not None:
        warn(route.warning)
    quiet = opts.quiet(route.jax_device)
    arr = _run(_decide(host, tg, "jax", quiet), host, tg, quiet)
    return arr if opts.committed else tg.uncommit(arr)


def _ex_numpy_put(Route route, cap, x, JaxTarget tg, Options opts):
    """A dtype JAX holds but does not import: a NumPy copy put by JAX (the source freed here)."""
    host = (_unpack_subbyte(cap, route.info) if route._needs & NEED_PACKED
            else _np.array(_host_view(cap, route.info)))
    return _put_host(tg, host, route.jax_device, opts.committed, False)


def _ex_numpy_copy(Route route, cap, x, JaxTarget tg, Options opts):
    """NumPy memory DLPack cannot describe: NumPy's copy, viewed by JAX or split if sharded."""
    narrow = route.facts["narrow"]
    host = _native_copy(x, None if narrow is None else numpy_dtype(*narrow[2:4]), tg.copy_align)
    if "spread" in route.facts:
        return _run(_decide(host, tg, "jax", opts), host, tg, opts)
    return _finish(tg, host, route, opts)


def _ex_split(Route route, cap, x, JaxTarget tg, Options opts):
    """Host memory split over CPU devices: one owner, freed with the last shard; JAX assembles."""
    f = route.facts
    if "parts" in f:   # decided for one pass (its shards' words, if asked for, change nothing)
        return _split_import(cap, route.info, f["parts"], f["devices"], f["sharding"], tg)
    owner = take(cap)
    arrays = []
    try:
        for _, _, shard in route._shards:
            part = view_capsule(owner, shard.info)
            arrays.append(EXECUTORS[shard.action](shard, part, part, tg, opts))
        return tg.assemble(route.info.shape, f["sharding"], [d for d, _, _ in route._shards],
                           arrays)
    except BaseException:
        arrays = part = None
        _untake(owner, cap)   # a failed split consumes nothing
        raise


def _ex_spread(Route route, cap, x, JaxTarget tg, Options opts):
    whole = route.facts["whole"]
    arr = EXECUTORS[whole.action](whole, cap, x, tg, opts)
    if route.action is PROCESS_LOCAL:
        return tg.jax.make_array_from_process_local_data(opts.sharding, arr)
    return tg.jax.device_put(arr, opts.sharding)


def _ex_array_put(Route route, cap, x, JaxTarget tg, Options opts):
    """A jax.Array made row-major or copied as copy=True asks (a copy on its device), then put
    where asked (committed)."""
    f = route.facts
    if f["relayout"] or f["copy_true"]:
        x = _array_copy(x, tg)
    return x if f["where"] is None else tg.jax.device_put(x, f["where"])


cdef _array_copy(x, JaxTarget tg):
    """A jax.Array's own copy, row-major (typed PRNG key arrays too, which jnp.array
    refuses); one in another layout on a JAX that computes nothing with it (jaxlib 0.4.30:
    not even a copy) goes through host memory."""
    if tg.permuted_ok or _row_major_array(x, tg):
        return x.copy()
    return tg.jax.device_put(_np.asarray(x), x.sharding)


#: One executor per action of a JAX route: (route, capsule, source, target, options) -> array.
EXECUTORS = {
    IMPORT: _ex_import, HOST_COPY: _ex_host_copy, EMPTY: _ex_empty,
    HOST_VIEW: _ex_host_view,
    PRODUCER_COPY: _ex_producer_copy, NUMPY_PUT: _ex_numpy_put, NUMPY_COPY: _ex_numpy_copy,
    SPLIT: _ex_split, DEVICE_PUT: _ex_spread, PROCESS_LOCAL: _ex_spread,
    PASS: lambda route, cap, x, tg, opts: x, ARRAY_PUT: _ex_array_put,
    ARRAY_COPY: lambda route, cap, x, tg, opts: _array_copy(x, tg),
    RAISE: lambda route, cap, x, tg, opts: _raise_route(route),
}


cdef _finish(JaxTarget tg, arr, Route route, Options opts=None):
    """``arr`` (host memory dlinspect holds, put where the route imports it first where
    ``opts`` is given) moved to the device the route ends on."""
    if opts is not None:
        arr = _put_host(tg, arr, route.import_device, opts.committed)
    if route.jax_device and route.jax_device != route.import_device:
        arr = tg.jax.device_put(arr, route.jax_device)
    return arr


cdef tuple _producer_host(Route route, x, Py_ssize_t align):
    """The producer's host copy of ``route``'s tensor: ``(array, True)`` where it copied into
    memory dlinspect allocates (its row's ``into``); else ``(copy, False)``, export_host_copy's
    (a capsule or an ndarray), checked against the header (ProducerError); else
    UnsupportedDeviceError listing what was tried."""
    cdef TensorInfo info = route.info
    into = route.facts["into"]
    tried = []
    if into is not None:
        out = _allocate(info.shape, info.numpy_dtype, align, info)
        tried = _producer_copy_into(x, into, out)
        if not tried:
            return out, True
    got, host_info = export_host_copy(x)
    if got is None:
        raise UnsupportedDeviceError(
            f"{_words.describe(info)} could not be brought to host memory. Tried: "
            f"{'; '.join(tried + host_info)}. To fix: "
            f"{_words.device_fix(info._dev_type, route.target, False)}.")
    want = info.numpy_dtype
    if isinstance(host_info, TensorInfo):   # (a capsule)
        if host_info.shape != info.shape or host_info.dtype != info.dtype:
            raise _copy_mismatch(x, info, host_info.shape, host_info.dtype_name)
    elif got.shape != info._host_shape() or (want is not None and got.dtype != want):
        raise _copy_mismatch(x, info, got.shape, got.dtype.name)
    return got, False


cdef _copy_mismatch(x, TensorInfo info, shape, str dtype):
    return ProducerError(
        f"{_type_name(x)}'s host copy has shape {tuple(shape)} and dtype {dtype}, but the "
        f"header it exported says shape {info.shape} and dtype {info.dtype_name}: the "
        f"producer is at fault, and nothing of that copy was used. To fix: "
        f"{_words.device_fix(info._dev_type, 'host', False)}.")


cdef _host_view(cap, TensorInfo info):
    """Consume ``cap`` into a NumPy view (vector lanes a trailing axis) whose base owns the
    tensor; read-only where the header says so or cannot say (legacy), as NumPy does."""
    cdef int64_t shape[_MAX_NDIM + 1], strides[_MAX_NDIM + 1]
    cdef int64_t lane = info.itemsize // info._lanes   # (a vector dtype's: whole bytes)
    cdef int32_t i, n = info.ndim
    for i in range(n):   # (strides in lanes)
        shape[i] = info._shape[i]
        strides[i] = info._strides[i] * info._lanes if info._shape[i] > 1 else 0
    shape[n] = info._lanes
    strides[n] = 1
    descr = _numpy_dtype(info._code, info._bits)
    if descr is None:   # (no NumPy dtype: unsigned integers of a lane's size)
        descr = _np_dtype(f"|u{lane}" if lane in (1, 2, 4, 8) else f"|V{lane}")
    return _ndarray(take(cap), <void*>info._ptr(), n + (info._lanes != 1), shape, strides,
                    lane, descr, info.read_only is False)


cdef _host_copy(cap, TensorInfo info, out=None):
    """NumPy's copy of host memory into ``out`` (else a new 64-byte aligned array, allocated
    before ``cap`` is consumed: an AllocationError leaves it as it was); frees the source."""
    if out is None:
        out = _allocate(info._host_shape(), info.numpy_dtype, 64, info)
    view = _host_view(cap, info)
    _copy_values(out, view)
    del view   # the producer's deleter runs here, right after the copy
    return out


cdef _native_copy(arr, dtype=None, Py_ssize_t alignment=64):
    """NumPy's copy of ``arr``: native byte order, C order, aligned (``dtype``: cast, for x64)."""
    out = _allocate(arr.shape, arr.dtype.newbyteorder("=") if dtype is None else dtype, alignment, None)
    _copy_values(out, arr)
    return out


cdef int _copy_values(out, src) except -1:
    # NumPy's cast swaps bytes, gathers strides and narrows as JAX does (overflow: inf; wraps).
    with _np.errstate(over="ignore", invalid="ignore"):
        _np.copyto(out, src, casting="unsafe")
    return 0


cdef _allocate(shape, dtype, Py_ssize_t alignment, TensorInfo info):
    try:
        return aligned_empty(shape, dtype, alignment)
    except MemoryError:
        nbytes = _math.prod(shape) * _np_dtype(dtype).itemsize
        what = _words.describe(info) if info is not None else (
            f"a {_np_dtype(dtype).name} NumPy array of shape {shape}")
        raise _words.allocation_error(nbytes, what, physical_memory()) from None


cdef _unpack_subbyte(cap, TensorInfo info):
    """Copy a packed sub-byte tensor (int4, float4...) into one element per byte."""
    cdef int bits = info._bits
    cdef int64_t span[2]   # (the bytes, one apart)
    span[0] = info.nbytes
    span[1] = 1
    raw = _ndarray(take(cap), <void*>info._ptr(), 1, span, span + 1, 1, _numpy_dtype(kDLUInt, 8), False)
    shifts = _np.arange(8 // bits, dtype=_np.uint8) * bits
    # Element i sits at bits [i*bits, (i+1)*bits) of the little-endian bit stream.
    vals = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[: info.size].reshape(info.shape)
    if info._code == kDLInt:   # sign-extend, then convert by value
        half = 1 << (bits - 1)
        return ((vals.astype(_np.int8) ^ half) - half).astype(info.numpy_dtype)
    # Unsigned and floating sub-byte types: ml_dtypes keeps the bit pattern in the low bits of
    # a byte (an unsigned one's value, as a cast by value gives it).
    return vals.view(info.numpy_dtype).copy()


def _host_producer_copy(Route route, cap, x):
    del cap
    out = _producer_host(route, x, 64)[0]
    if not PyCapsule_CheckExact(out):
        return out
    cdef _Leaf d = _decide(out, None, "host", DEFAULT)
    return HOST_EXECUTORS[d.route.action](d.route, d.cap, out)


def _host_empty(Route route, cap, x):
    take(cap)
    return _np_empty((<TensorInfo>route.info)._host_shape(), route.info.numpy_dtype)


#: One executor per action of a host route: (route, capsule, source) -> array.
HOST_EXECUTORS = {
    RAISE: lambda route, cap, x: _raise_route(route),
    PRODUCER_COPY: _host_producer_copy, EMPTY: _host_empty,
    UNPACK: lambda route, cap, x: _unpack_subbyte(cap, route.info),
    HOST_COPY: lambda route, cap, x: _host_copy(cap, route.info),
    HOST_VIEW: lambda route, cap, x: _host_view(cap, route.info),
    NUMPY_COPY: lambda route, cap, x: _native_copy(x),
}
