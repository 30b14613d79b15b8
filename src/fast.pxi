# fast.pxi: the one decision of a tensor (_decide: its export, needs and verdict, nothing
# taken) and the fast path that executes a verdict without building a Route.

@cython.final
@cython.no_gc
@cython.freelist(8)
cdef class _Leaf:
    """One tensor's decision (a batch's leaf's, or a lone tensor's): what runs, before
    anything is taken."""
    cdef int rank            # the order it runs in, in a batch (batch.pxi, _rank)
    cdef int verdict         # a _V_* verdict; _V_ROUTE: ``route``'s executor
    cdef Py_ssize_t part, index   # its part of the batch, its index among the part's leaves
    # route: its Route (verdict _V_ROUTE); split: a split decided before, viewed again
    # (_SplitViews), or None; cap: its export (None: NumPy memory DLPack cannot describe, or a
    # jax.Array); info: its TensorInfo; prepared: a copy's memory, before anything is taken.
    cdef object route, split, cap, info, prepared
    cdef uint32_t needs


cdef inline bint _plain_scalar(v):
    """A value no walker descends into: str, bytes, a number, None."""
    tp = type(v)
    return (v is None or tp is str or tp is int or tp is float or tp is bool or tp is bytes
            or tp is complex)


cdef _decide(x, JaxTarget tg, str target, Options opts, bint aliased=False,
             Py_ssize_t index=-1, bint reuse=False, proof=None):
    """The one decision for tensor ``x`` into ``target`` (``tg`` None for "host"): its
    ``_Leaf``, its export taken from the producer but unconsumed. ``aliased``: a batch
    leaf not proven to own its memory (Need.ALIASED); ``index``: its index in a batch
    part, where a value that is not a tensor is returned as it is; ``reuse``: a split
    decided before for this header and sharding is viewed again (_SplitViews); ``proof``:
    what proved a batch leaf's memory its own (_Part.proof: a torch storage, handed on to
    the export, which then does not ask for it again)."""
    cdef _Leaf d = _Leaf.__new__(_Leaf)
    cdef PyObject* p = NULL
    cdef _TypeEntry entry = None
    d.index, d.rank = index, 2
    if _put_as_is(d, x, tg, opts, aliased):
        return d
    if not PyCapsule_CheckExact(x):
        entry = _entry_for(type(x))
        if index >= 0 and not entry.has_dlpack:   # (an exchange API counts as DLPack)
            return x   # not a tensor
        if entry.guard == GUARD_JAX and tg is not None:
            if _array_passes(x, opts, tg):
                d.verdict = _V_PASS
            else:
                d.route = route_jax_array(x, opts, tg)
            return d
    try:
        d.info = _export(x, MODE_TAKE if tg is None else MODE_VIEW,
                         None if tg is None else tg.stream_for, &p, entry, _refuser(tg, opts), proof)
    except NotDescribableError as exc:   # (nothing taken)
        d.route = route_numpy_copy(exc.with_traceback(None), tg, target, opts)
        return d
    d.cap = _take_ref(p)
    try:
        _decide_header(d, x, tg, target, opts, aliased, reuse)
        _capsule_for_route(d, tg)
        if entry is None:
            _freed_since(d, x)
    except BaseException:
        d = None   # (see _convert)
        raise
    return d


cdef int _freed_since(_Leaf d, cap) except -1:
    """Bare capsule ``cap``'s memory is unmapped: where a thread that consumed it since freed
    it, that error."""
    if d.route is not None and (<Route>d.route).problem == "unmapped":
        _peek_capsule(cap)
    return 0


cdef int _capsule_for_route(_Leaf d, JaxTarget tg) except -1:
    """A torch tensor's storage (MODE_VIEW, JAX's target) serves a batched put of a view of the
    memory, or a copy of it, as a capsule would; a route takes a capsule made over it."""
    if PyCapsule_CheckExact(d.cap) or d.verdict == _V_COPY or (
            d.verdict == _V_VIEW and _viewable_by_put(d.info, tg)):
        return 0
    d.cap = view_capsule(d.cap, d.info)
    return 0


cdef bint _put_as_is(_Leaf d, x, JaxTarget tg, Options opts, bint aliased) except -1:
    """Decide a NumPy array ``x`` from its own fields where the verdict is the batched put of
    ``x`` itself (_V_VIEW, viewable by the put): its export would go unused. Else False."""
    if type(x) is not _np_ndarray or tg is None or tg.put is None:
        return False
    # (no header made for an array the put cannot view: misaligned, or not row-major; the
    # header of a builtin dtype's then passes the rest of _viewable_by_put: one lane, whole
    # bytes, row-major strides as _numpy_header writes them, no byte_offset)
    if not cnp.PyArray_IS_C_CONTIGUOUS(x) or <uintptr_t>cnp.PyArray_DATA(x) & (tg.put_align - 1):
        return False
    cdef TensorInfo info = _ndarray_info(x)
    if info is None:
        return False
    cdef uint32_t needs = _needs_jax(info, tg, opts.readonly == "share", aliased)
    if _verdict(info, needs, tg, opts) != _V_VIEW:
        return False
    d.info = info
    d.needs = needs
    d.verdict = _V_VIEW
    return True


cdef int _decide_header(_Leaf d, x, JaxTarget tg, str target, Options opts, bint aliased,
                        bint reuse) except -1:
    cdef TensorInfo info = d.info
    if tg is None:
        d.route = route_host(info, _needs_host(info), opts.copy, x)
        return 0
    d.needs = _needs_jax(info, tg, opts.readonly == "share", aliased)
    d.verdict = _verdict(info, d.needs, tg, opts)
    if d.verdict != _V_ROUTE:
        return 0
    key = None
    if reuse and tg.put is not None:   # (a split the put viewed whole before: _SplitViews)
        key = _split_key(info, opts, aliased, tg)
        d.split = _split_views.get(key)
        if d.split is not None:
            d.needs = 0   # (viewed again: every slice as it is)
            return 0
    d.route = decide(info, tg, target, opts, x, aliased)
    if key is not None:
        _remember_split(d.route, info, key, tg)
    return 0


cdef str _leaf_warning(str text, _Leaf d, name):
    """``text`` about tensor ``d``: a batch's leaf's started by its key path (``name``: see
    _leaf_path), as an error about it is; a tensor alone's (``name`` None) as it is."""
    return text if name is None else f"{name(d.part, d.index)}: {text}"


cdef _prepare_copy(_Leaf d, JaxTarget tg, Options opts, name):
    """A _V_COPY's memory, allocated, after its narrowing warning (a filter may raise it;
    ``name``: see _prepare)."""
    cdef TensorInfo info = d.info
    cdef int dst_key = info._key()
    if d.needs & NEED_NARROW:
        dst_key, text = tg.narrow[dst_key]
        if opts.narrow == "warn":
            tg.warn(_leaf_warning(text, d, name))
    return _aligned_array(info, dst_key & 0xFF, dst_key >> 8, tg.copy_align)


cdef _split_import(cap, TensorInfo info, list parts, list devices, sharding, JaxTarget tg):
    """Consume ``cap`` into one owner and put each slice of a one-pass split on its device:
    viewed where it needs nothing but VIA_CPU, else copied in C (narrowed, warned before),
    by one batched put where it views them all, else imported and assembled. The deleter
    runs when the last view dies; a legacy capsule is imported writable."""
    cdef TensorInfo part
    cdef uint32_t n
    cdef int dst_key = info._key()
    cdef list arrays = []
    cdef bint by_put = tg.put is not None
    for part, n in parts:
        if n & NEED_NARROW:
            dst_key = tg.narrow[info._key()][0]
        if n & ~NEED_VIA_CPU == 0 and not _viewable_by_put(part, tg):
            by_put = False
    owner = take(cap)
    cdef bint writeable = info.read_only is not True
    try:
        for (part, n), device in zip(parts, devices):
            if n & ~NEED_VIA_CPU == 0:
                arrays.append(_view_of(owner, part, writeable, 0) if by_put else
                              import_capsule(tg.import_fn, view_capsule(owner, part), device,
                                             None, None, kDLCPU))
            else:
                copy = _aligned_array(part, dst_key & 0xFF, dst_key >> 8, tg.copy_align)
                _fill(copy, part)
                arrays.append(copy if by_put else _put_host(tg, copy, device, True))
                del copy
        if by_put:   # (devices: the sharding's addressable ones, in its own order)
            return tg.send(tg.sharded_aval(info.shape, _numpy_dtype(dst_key & 0xFF, dst_key >> 8),
                                          sharding), sharding, arrays, devices, True)
        return tg.assemble(info.shape, sharding, devices, arrays)
    except BaseException:
        arrays = None
        _untake(owner, cap)   # a failed split consumes nothing
        raise


# ---- a split decided before, viewed again ----------------------------------------------

@cython.final
cdef class _SplitViews:
    """A zero-copy split kept for the next tensor of this header and sharding (a loader's every
    step: deciding again costs more than the put), at its address; it holds no tensor."""
    cdef uintptr_t address    # the first tensor's
    cdef list parts, devices  # (parts: each slice's header, at the first tensor's address)
    cdef object sharding, aval   # (aval: the put's abstract value, made once)
    cdef JaxTarget tg         # the target its key names by address, held (as is its sharding)


_split_views = {}   # _split_key(...) -> _SplitViews; a module global (tests start it afresh)

cdef enum:
    _SPLIT_KEY = 9   # a split key's words before the header's shape and strides


cdef bytes _split_key(TensorInfo info, Options opts, bint aliased, JaxTarget tg):
    """What decides a split's views, as bytes: the sharding and the JAX it is for (by address:
    the entry holds both), the options a view depends on, whether x64 is on now for a 64-bit
    dtype (JAX narrows by it), and the header, its address modulo the put's alignment."""
    cdef int64_t k[_SPLIT_KEY + 2 * _MAX_NDIM]
    cdef int n = info.ndim
    cdef bint x64 = (info._bits == 64 or info._bits == 128) and tg.x64.value
    k[0] = <int64_t><uintptr_t><PyObject*>opts.sharding
    k[1] = <int64_t><uintptr_t><PyObject*>tg
    k[2] = aliased | (opts.copy is True) << 1 | (opts.copy is False) << 2 | (opts.readonly == "share") << 3
    k[3] = x64
    k[4] = info._key() | <int64_t>info._lanes << 16
    k[5] = info._dev_type
    k[6] = info.device_id
    k[7] = <int64_t>info.flags
    k[8] = info._ptr() & (tg.put_align - 1)
    memcpy(&k[_SPLIT_KEY], info._shape, n * sizeof(int64_t))
    memcpy(&k[_SPLIT_KEY + n], info._strides, n * sizeof(int64_t))
    return PyBytes_FromStringAndSize(<char*>k, (_SPLIT_KEY + 2 * n) * sizeof(int64_t))


cdef int _remember_split(Route route, TensorInfo info, bytes key, JaxTarget tg) except -1:
    """Keep ``route`` for the next tensor of split key ``key`` where it is a one-pass split
    the put views whole."""
    if route.action is not SPLIT or route.copy_bytes or route.warning is not None:
        return 0
    cdef dict f = route.facts
    parts = f.get("parts")
    if parts is None:
        return 0
    cdef TensorInfo part
    cdef uint32_t n
    for part, n in parts:
        if n & ~NEED_VIA_CPU or not _viewable_by_put(part, tg):
            return 0
    cdef _SplitViews s = _SplitViews.__new__(_SplitViews)
    s.address = info._ptr()
    s.devices = f["devices"]
    s.sharding = f["sharding"]
    s.tg = tg
    s.parts = [part for part, _ in parts]
    s.aval = tg.sharded_aval(info.shape, info.numpy_dtype, s.sharding)
    _remember(_split_views, key, s, 256)
    return 0


cdef _split_again(cap, TensorInfo info, _SplitViews s, JaxTarget tg):
    """Put ``s``'s slices, viewed at ``info``'s address, from ``cap`` (a failed put takes none)."""
    cdef uintptr_t delta = info._ptr() - s.address   # (mod 2**64: either way)
    cdef bint writeable = info.read_only is not True
    cdef TensorInfo part
    owner = take(cap)
    try:
        arrays = [_view_of(owner, part, writeable, delta) for part in s.parts]
        return tg.send(s.aval, s.sharding, arrays, s.devices, True)
    except BaseException:
        arrays = None
        _untake(owner, cap)
        raise
