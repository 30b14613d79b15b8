# fast.pxi: to_jax's fast path: one export and its needs, then an import or one copy in C.

@cython.final
cdef class _Leaf:
    """One tensor leaf of a batch's plan (batch.pxi): its decision, its copy's memory."""
    cdef int rank            # the order it runs in (batch.pxi, _rank)
    cdef Py_ssize_t part, index   # its part of the batch, its index among the part's leaves
    # route: its Route, None where the fast path imports it; split: a split decided before,
    # viewed again (_SplitViews), or None; cap: its export (None: NumPy memory DLPack cannot
    # describe); info: its TensorInfo (or the NotDescribableError); prepared: the copy's
    # memory (_prepare_copy), before anything is taken.
    cdef object route, split, cap, info, prepared
    cdef uint32_t needs
    cdef bint fast           # the fast path's import takes it


cdef _Leaf _new_leaf(Py_ssize_t i, cap, info, uint32_t needs, bint fast):
    cdef _Leaf leaf = _Leaf.__new__(_Leaf)
    leaf.index, leaf.cap, leaf.info, leaf.needs, leaf.fast, leaf.rank = i, cap, info, needs, fast, 2
    return leaf


cdef inline bint _plain_scalar(v):
    """A value no walker descends into: str, bytes, a number, None."""
    tp = type(v)
    return (v is None or tp is str or tp is int or tp is float or tp is bool or tp is bytes
            or tp is complex)


cdef void _mark_leaf(BaseException exc, Py_ssize_t i) noexcept:
    try:
        exc._dlinspect_leaf = i
    except BaseException:
        PyErr_Clear()


# Whether the fast path takes a header (else the general route): host memory imported as it
# is onto the CPU device or copied in C (_c_copy), unless JAX's default device is set (put on
# it: the general route); other memory imported as it is onto the JAX device of its own DLPack
# device (CUDA, ROCm, pinned host memory on a JAX that has their platform).
cdef bint _fast_takes(TensorInfo info, uint32_t n, int flags, JaxTarget tg) except -1:
    if info._dev_type == kDLCPU and info.device_id == 0:
        return tg.default_device is None and (
            n == 0 or not flags & _OPT_COPY_NEVER and _c_copy(info, n))
    key = (info._dev_type, info.device_id)
    return n == 0 and key in tg.devices and (tg.default_device is None or key not in tg.cpu_keys)


cdef object _import_fast(object cap, TensorInfo info, uint32_t n, JaxTarget tg, int flags,
                         object x, object out=None):
    # out: the copy's memory where a batch allocated it (_prepare_copy); uncommitted (put.pxi)
    if n == 0:
        if info._dev_type == kDLCPU and info.device_id == 0:
            if _viewable_by_put(info, tg):
                return _put_view(tg, cap, x, info, tg.cpu_device)
            arr = import_capsule(tg.import_fn, cap, tg.cpu_device, None, None, kDLCPU)
        else:
            # The consumer's stream, as the export asked the producer (array API
            # __dlpack__): none for a bare capsule, whose producer was never asked.
            stream = (None if PyCapsule_CheckExact(x)
                      else tg.stream_for(info._dev_type, info.device_id))
            arr = import_capsule(tg.import_fn, cap, tg.devices[(info._dev_type, info.device_id)],
                                 stream, None, info._dev_type)
        return tg.uncommit(arr)
    if out is None:
        out = _prepare_copy(info, n, tg, flags)
    return _copy_taken(cap, info, out, tg, tg.cpu_device, False)


cdef object _prepare_copy(TensorInfo info, uint32_t n, JaxTarget tg, int flags):
    """``_prepare`` for the fast path's copy: warned, and its memory allocated and returned."""
    cdef int dst_key = info._key()
    if n & NEED_NARROW:
        dst_key, text = tg.narrow[dst_key]
        if not flags & _OPT_QUIET_NARROW:
            tg.warn(text)
    return _aligned_array(info, dst_key & 0xFF, dst_key >> 8, tg.copy_align)


cpdef object to_jax_fast(object x, JaxTarget tg, int flags=0, Py_ssize_t leaf=-1):
    """One tensor's array; else ``(capsule, TensorInfo, needs)`` for the general route, the
    capsule unconsumed (no capsule: NumPy memory DLPack cannot describe, its error in place of
    the header; neither: a ``jax.Array`` in another layout than row-major); a row-major
    ``jax.Array`` as it is. ``leaf``, a batch's leaf index: nothing taken, its ``_Leaf``
    instead (``x`` itself where it is kept, not a tensor)."""
    cdef PyObject* p = NULL
    cdef _TypeEntry entry = None
    cdef TensorInfo info
    cdef uint32_t n
    if not PyCapsule_CheckExact(x):
        entry = _entry_for(type(x))
        if leaf >= 0 and not entry.has_dlpack and entry.api == NULL:
            return x   # not a tensor
        if entry.guard == GUARD_JAX:   # (a dead one refused)
            _refuse_dead_array(x)
            return x if _row_major_array(x, tg) else _general(leaf, None, None, 0)
    try:
        info = _export(x, MODE_TAKE, tg.stream_for, &p, entry, _refuser(tg, flags))
        cap = _take_ref(p)
        n = _needs_jax(info, tg, flags)
        if not _fast_takes(info, n, flags, tg):
            return _general(leaf, cap, info, n)
        if leaf >= 0:
            return _new_leaf(leaf, cap, info, n, True)
    except NotDescribableError as exc:   # (from the export: nothing taken)
        return _general(leaf, None, exc, 0)
    except BaseException:
        cap = None   # (see _convert)
        raise
    return _import_fast(cap, info, n, tg, flags, x)


cdef object _general(Py_ssize_t i, cap, info, uint32_t needs):
    """A tensor for the general route: batch leaf ``i``'s ``_Leaf``, else to_jax_fast's tuple."""
    return (cap, info, needs) if i < 0 else _new_leaf(i, cap, info, needs, False)


cdef object _fast_route(x, cap, info, uint32_t needs, JaxTarget tg, opts):
    """The general route of a tensor the fast path does not take (``to_jax_fast``'s tuple)."""
    if cap is not None:
        return route_jax(info, needs, tg, opts, x)
    if info is None:   # a jax.Array in another layout than row-major
        return route_jax_array(x, opts, tg)
    return route_numpy_copy(info, tg, "jax", opts)   # NumPy memory DLPack cannot describe


cdef object _split_import(object cap, TensorInfo info, list parts, list devices, sharding,
                          JaxTarget tg):
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
                arrays.append(_view_of(owner, part, writeable) if by_put else
                              import_capsule(tg.import_fn, view_capsule(owner, part), device,
                                             None, None, kDLCPU))
            else:
                copy = _aligned_array(part, dst_key & 0xFF, dst_key >> 8, tg.copy_align)
                _fill(copy, part)
                arrays.append(copy if by_put else _put_host(tg, copy, device, True))
                del copy
        if by_put:   # (devices: the sharding's addressable ones, in its own order)
            return tg.put(tg.sharded_aval(info.shape, _numpy_dtype(dst_key & 0xFF, dst_key >> 8),
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
    cdef TensorInfo whole     # the first tensor's header
    cdef list parts, devices  # (parts: each slice's header, at the first tensor's address)
    cdef object sharding, aval   # (aval: the put's abstract value, made once)
    cdef cnp.dtype descr
    cdef int flags            # the options' bits it was decided under (_split_flags)
    cdef JaxTarget tg         # the JAX it was decided for (a new target decides afresh)


_split_views = {}   # _split_hash(...) -> _SplitViews; a module global (tests start it afresh)


cdef inline uint64_t _mix(uint64_t h, uint64_t v) noexcept:
    return (h ^ v) * <uint64_t>1099511628211ULL   # FNV-1a's step, a word at a time


cdef Py_hash_t _split_hash(TensorInfo info, object sharding, int flags,
                           uintptr_t mask) noexcept:
    """The hash of what decides a split's views (``_same_split`` checks a match)."""
    cdef uint64_t h = <uint64_t>14695981039346656037ULL
    cdef int i
    h = _mix(h, <uint64_t><uintptr_t><PyObject*>sharding)
    h = _mix(h, <uint64_t>flags | (<uint64_t>info._key() << 32))
    h = _mix(h, info.flags)
    h = _mix(h, <uint64_t>info._dev_type | (<uint64_t><uint32_t>info.device_id << 32))
    h = _mix(h, info._ptr() & mask)
    for i in range(info.ndim):
        h = _mix(_mix(h, <uint64_t>info._shape[i]), <uint64_t>info._strides[i])
    return <Py_hash_t>(h >> 1)


cdef bint _same_split(_SplitViews s, TensorInfo info, object sharding, int flags,
                      JaxTarget tg) noexcept:
    """Whether ``s`` was decided for this header, sharding, options and JAX, at an address
    the same modulo the put's alignment (what ``_split_hash`` hashes)."""
    cdef TensorInfo w = s.whole
    cdef int i
    if (s.sharding is not sharding or s.tg is not tg or s.flags != flags or w.ndim != info.ndim
            or w._key() != info._key() or w._lanes != info._lanes or w.flags != info.flags
            or w._dev_type != info._dev_type or w.device_id != info.device_id
            or (w._ptr() ^ info._ptr()) & (tg.put_align - 1)):
        return False
    for i in range(info.ndim):
        if w._shape[i] != info._shape[i] or w._strides[i] != info._strides[i]:
            return False
    return True


cdef int _split_flags(TensorInfo info, int flags, JaxTarget tg) except? -1:
    """The options' bits and, for a 64-bit dtype, whether x64 is on now (JAX narrows by it)."""
    if (info._bits == 64 or info._bits == 128) and tg.x64.value:
        return flags | (1 << 30)
    return flags


cdef _SplitViews _split_seen(TensorInfo info, object sharding, int flags, JaxTarget tg):
    if tg.put is None:
        return None
    flags = _split_flags(info, flags, tg)
    s = _split_views.get(_split_hash(info, sharding, flags, tg.put_align - 1))
    if s is not None and _same_split(<_SplitViews>s, info, sharding, flags, tg):
        return s
    return None


cdef int _remember_split(Route route, TensorInfo info, int flags, JaxTarget tg) except -1:
    """Keep ``route`` for the next tensor where it is a one-pass split the put views whole."""
    if route.action is not SPLIT or route.copy_bytes or route.warning is not None or tg.put is None:
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
    flags = _split_flags(info, flags, tg)
    cdef _SplitViews s = _SplitViews.__new__(_SplitViews)
    s.whole, s.devices, s.sharding, s.flags = info, f["devices"], f["sharding"], flags
    s.parts = [part for part, _ in parts]
    s.descr = _numpy_dtype(info._code, info._bits)
    s.tg = tg
    s.aval = tg.sharded_aval(info.shape, s.descr, s.sharding)
    if len(_split_views) >= 256:
        _split_views.clear()
    _split_views[_split_hash(info, s.sharding, flags, tg.put_align - 1)] = s
    return 0


cdef object _split_again(object cap, TensorInfo info, _SplitViews s, JaxTarget tg):
    """Put ``s``'s slices, viewed at ``info``'s address, from ``cap`` (a failed put takes none)."""
    cdef uintptr_t delta = info._ptr() - s.whole._ptr()   # (mod 2**64: either way)
    cdef bint writeable = info.read_only is not True
    cdef TensorInfo part
    owner = take(cap)
    try:
        arrays = [_ndarray(owner, <void*>(part._ptr() + delta), part.ndim, part._shape,
                           part._strides, part._bits // 8, s.descr, writeable)
                  for part in s.parts]
        return tg.put(s.aval, s.sharding, arrays, s.devices, True)
    except BaseException:
        arrays = None
        _untake(owner, cap)
        raise
