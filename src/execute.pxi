# execute.pxi: the front doors (to_jax, to_host) and the executors that carry out the
# route routes.pxi decides. One decision, executed once: a tensor is exported once and
# its needs computed once (the fast path imports it right there when nothing is
# needed); otherwise the same export and needs become a Route and the executor of its
# action carries it out, one function per action (EXECUTORS). No executor calls to_jax
# or exports the caller's tensor again. A failed route leaves a caller's capsule
# unconsumed; in a batch, every leaf is decided before any is consumed.

from dlinspect import _tree
from dlinspect._options import DEFAULT as _DEFAULT, check_sharding, options as _check_options

# The defaults of to_jax's string options, compared by identity on the hot path (an
# equal string that is another object takes the checked way, with the same result).
cdef str _S_HOST = "host", _S_COPY = "copy", _S_KEEP = "keep", _S_WARN = "warn"

cdef object _TARGET = None
cdef object _TARGET_BUILDER = None


def set_target(tg):
    """Make ``tg`` the JaxTarget every route reads (None: build it again on next use);
    called by :mod:`dlinspect._jaxcaps`, which builds it."""
    global _TARGET
    _TARGET = tg


def set_target_builder(build):
    """Hand the core ``build()``, which finds out what the installed JAX takes and returns
    its JaxTarget (dlinspect._jaxcaps calls it when it is imported, as the package is):
    the core never imports upward."""
    global _TARGET_BUILDER
    _TARGET_BUILDER = build


def current_target():
    """The JaxTarget built in this process, or None: builds nothing, imports no JAX
    (what ``dlinspect.stack`` asks, so that a loader's worker processes start no JAX)."""
    return _TARGET


cdef JaxTarget _jax_target():
    """The process-wide JaxTarget, built once by what set_target_builder handed over
    (dlinspect._jaxcaps: it imports jax)."""
    global _TARGET
    if _TARGET is None:
        if _TARGET_BUILDER is None:
            import dlinspect   # noqa: F401  (the package's import hands the builder over)
        _TARGET = _TARGET_BUILDER()
    return _TARGET


# ---- the front door -------------------------------------------------------------

@cython.binding(True)
def to_jax(x, device=None, copy=None, *, sharding=None, fallback="host", readonly="copy",
           leaves="keep", narrow="warn"):
    """Move a DLPack tensor, or a pytree of them, into JAX: zero-copy where possible.

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, or pytree of them
        A tensor from any producer (NumPy, PyTorch, CuPy, JAX...), a bare capsule
        (``"dltensor"`` or ``"dltensor_versioned"``), or a batch of them: any JAX
        pytree, and the Mappings (transformers' ``BatchEncoding``...) and
        dataclasses JAX does not register, rebuilt as their own type. Leaves that
        are not tensors (str, numbers, non-numeric arrays...) are kept, the whole
        of ``x`` too when it is one (see ``leaves``).
    device : jax.Device or single-device Sharding, optional
        Destination; a device other than the source's means import, then ``device_put``.
    copy : bool or None
        Array API ``copy`` (``from_dlpack``): True always copies; False never does
        and raises ``CopyRequiredError`` naming why a copy is needed (alignment,
        strides, read-only, device transfer, dtype narrowing); None copies only
        where needed.
    sharding : jax.sharding.Sharding or pytree of them, optional
        Spread each leaf over several devices (instead of ``device``), e.g.
        ``NamedSharding(mesh, PartitionSpec("data"))`` splits the leading (batch)
        axis, ``PartitionSpec()`` replicates. A pytree of shardings is a prefix
        of ``x``'s structure, as in ``jax.device_put``. Host memory bound for
        CPU devices is split in place: each device imports its slice, zero-copy
        where the slice's memory allows (see ``plan(x, sharding=...).shards``),
        and JAX assembles the array (``jax.make_array_from_single_device_arrays``).
        Other memory goes to JAX whole, then ``jax.device_put(array, sharding)``;
        a sharding spanning several processes takes ``x`` as this process's part
        (``jax.make_array_from_process_local_data``).
    fallback : {"host", "raise"}
        For memory on a device this JAX has no backend for (OpenCL, Vulkan,
        Metal, ROCm on a CPU/CUDA JAX...): ``"host"`` asks the producer for a
        host copy (``__dlpack__(dl_device=(kDLCPU, 0), copy=True)``), then tries
        ``numpy.asarray``; ``"raise"`` raises ``UnsupportedDeviceError``, judged
        from the producer's ``__dlpack_device__`` before it is asked to export.
    leaves : {"keep", "raise"}
        A leaf that is not a numeric tensor is kept as it is, or (``"raise"``)
        raises ``NotDLPackError`` naming its key path.
    narrow : {"warn", "ok"}
        A 64-bit dtype JAX narrows with x64 off (int64 labels, say) comes with a
        ``DLInspectWarning`` (Python's filters decide where it shows: by default
        once per call site and dtype), or (``"ok"``) quietly.
    readonly : {"copy", "share"}
        Read-only memory (the versioned READ_ONLY flag, e.g. a read-only NumPy
        array) is copied by default. ``"share"`` imports it without a copy: JAX
        never writes an array it did not allocate, except through buffer
        donation, so do not donate such arrays (``jax.jit(donate_argnums=...)``).

    Returns
    -------
    jax.Array or pytree of jax.Array
        The same structure as ``x``. A vector dtype (``lanes > 1``, e.g. float32x4
        of shape ``(N,)``) arrives as a trailing axis: float32 of shape ``(N, 4)``.
        With no ``device`` or ``sharding``, each array is uncommitted, as
        ``jnp.asarray(x)``'s (on the device of the memory it views), so a jitted
        function fed both compiles once; with one, committed, as
        ``jax.device_put(x, device)``'s. One exception: a dense block in another axis
        order (``x.T``, a ``permute``; ``Need.PERMUTED``) viewed without a copy is
        committed to its device, as ``jax.dlpack.from_dlpack`` gives it, because JAX
        computes right with such a layout only on a committed array (``jax.jit``
        reads an uncommitted array's memory as row-major); a jitted function
        compiles separately for that layout. A ``jax.Array`` in ``x`` is returned as it is.

    Raises
    ------
    CopyRequiredError
        ``copy=False`` but a copy is needed (a ``ValueError``).
    UnsupportedDeviceError
        The memory cannot reach JAX (a ``BufferError``); the message names the
        device, shape, dtype, JAX platforms, what was tried and the fix.
    UnsupportedDTypeError
        JAX cannot hold the dtype (a ``BufferError``); names code, bits, lanes.
    ShardingError
        An axis does not divide evenly into the shards ``sharding`` cuts it
        into (a ``ValueError``); names the size, the shard count and the fix.
    AllocationError
        A copy the route needs cannot be allocated (a ``MemoryError``); nothing
        is consumed.
    ContainerError
        A Mapping or dataclass of the batch cannot be rebuilt around its
        converted values (a ``TypeError``).
    ProducerError
        The producer raised (requires_grad, conjugate bit, nulls in a pyarrow
        array...; any exception type, kept as ``__cause__``), or its
        ``__dlpack_device__`` and its header disagree.
    CapsuleConsumedError, MalformedTensorError, UnsupportedVersionError
        From reading the header (see :func:`peek`).

    Warns
    -----
    DLInspectWarning
        A 64-bit dtype is narrowed to 32 bits because JAX's x64 mode is off
        (the same values ``jax.dlpack.from_dlpack`` gives).

    Notes
    -----
    Follows the array API ``__dlpack__`` protocol: ``stream`` is None for CPU
    and pinned memory and JAX's consumer stream on CUDA/ROCm (never 0 on
    CUDA); ``max_version=(1, 3)`` is asked for, and a versioned capsule is
    handed to JAX through a zero-copy legacy adapter. Host memory goes into
    JAX as ``jax.device_put`` puts it (jaxlib's batched put: one call per
    tensor, a sharded one included), viewed in place where the route is
    zero-copy. On every route the producer's deleter runs exactly once: right
    after the copy for a copy; for zero-copy, once JAX lets go of the memory,
    which jaxlib does at its next call (or Python's next garbage collection)
    after the last array over it dies, as for ``jax.device_put``'s arrays. A
    route that fails leaves a caller's capsule unconsumed. ``plan(x)`` with the
    same options says what this does.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_jax({"x": np.arange(4, dtype=np.float32)})["x"].sum().item()
    6.0
    """
    cdef JaxTarget tg = _TARGET if _TARGET is not None else _jax_target()
    if (device is None and copy is None and sharding is None and fallback is _S_HOST
            and readonly is _S_COPY and leaves is _S_KEEP and narrow is _S_WARN):
        return _convert(x, tg, _DEFAULT, 0)
    opts = _check_options(device, copy, sharding, fallback, readonly, leaves, narrow)
    return _convert(x, tg, opts, opts.flags)


@cython.binding(True)
def plan(x, target="jax", *, device=None, copy=None, sharding=None, fallback="host",
         readonly="copy", leaves="keep", narrow="warn"):
    """Decide where a tensor would go, without importing or copying anything.

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, TensorInfo, or pytree of them
        The tensor (a capsule is only read, never consumed). The producer is
        asked to export it exactly as :func:`to_jax` would (the export is then
        released unconsumed), so its refusals show in the plan. A ``jax.Array``
        is not exported at all (see :func:`to_jax`).
    target : {"jax", "host"}
        Where it should go.
    device : jax.Device or single-device Sharding, optional
        Destination device for ``target="jax"``; default: the source's own.
    copy : bool or None
        Array API ``copy``: True always copies, False never (a needed copy becomes a
        ``CopyRequiredError`` route), None copies only where needed.
    sharding : jax.sharding.Sharding, optional
        Plan the split over several devices (see :func:`to_jax`); the route's
        ``shards`` then give each device's index and route, and an uneven split
        is a ``ShardingError`` route.
    fallback : {"host", "raise"}
        What to do with memory on a device JAX has no backend for: go through host
        memory, or an ``UnsupportedDeviceError`` route.
    readonly : {"copy", "share"}
        Read-only memory (versioned READ_ONLY flag) is copied by default;
        ``"share"`` imports it without a copy (see :func:`to_jax`).
    leaves : {"keep", "raise"}
        A leaf that is not a tensor (a str, a number, a NumPy array of strings...;
        the whole of ``x`` too, when it is one) gets an ``"untouched"`` route, or
        (``"raise"``) a ``NotDLPackError`` route. The batch is walked as
        :func:`to_jax` walks it (Mappings and dataclasses included).
    narrow : {"warn", "ok"}
        Whether a 64-bit dtype JAX narrows (x64 off) gets a ``warning``.

    Returns
    -------
    Route or pytree of Route
        ``kind``, ``reason``, ``needs``, ``copy_bytes``, ``jax_device``, ``error``;
        for a pytree, one Route per leaf in the same structure, each error's
        message led by its leaf's key path (``['inputs']['pixels']: ...``).
        ``to_jax(x)`` (``to_host(x)``) does exactly this: it raises ``route.error``
        when the kind is ``"error"``, and shares memory exactly when it is
        ``"zero-copy"``. A ``"host-fallback"`` route rests on the producer's answer
        to a host-copy request, which plan does not make: executing it raises
        ``UnsupportedDeviceError`` (listing what was tried) when no host copy can
        be had.

    Raises
    ------
    ValueError, TypeError
        An option outside its documented values.
    ContainerError
        The batch cannot be walked: it contains itself, nests too deep, or holds a
        dict whose keys do not sort (a container that cannot be rebuilt is an error
        route in its place).

    Notes
    -----
    A producer's refusal (any exception its ``__dlpack__`` or ``__dlpack_device__``
    raises), a corrupt or consumed header and every routing problem are returned
    as a route of kind ``"error"``, with the exception in ``error`` and ``info``
    None where no header could be read.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.plan(np.arange(6.0).reshape(2, 3)[:, :2]).kind
    'copy'
    >>> routes = dlinspect.plan({"x": np.ones(6, np.float32)[::2], "id": "a"})
    >>> routes["x"].kind, routes["id"].kind
    ('copy', 'untouched')
    """
    if target != "jax" and target != "host":
        raise ValueError(f"target must be 'jax' or 'host', not {target!r}")
    opts = _check_options(device, copy, sharding, fallback, readonly, leaves, narrow)
    tg = _jax_target() if target == "jax" else None
    if isinstance(x, TensorInfo) or is_tensor(x):
        return plan_one(x, tg, target, opts)
    flat = _tree.flatten(x)
    cdef list routes = []
    cdef Py_ssize_t i, repeated = repeated_capsule(flat.leaves)
    for i, leaf in enumerate(flat.leaves):
        if i in flat.errors:   # a container that cannot be rebuilt: its error, in its place
            route = failed(flat.errors[i], target)
        elif i == repeated:    # the same capsule twice: the second is the error
            route = failed(repeated_capsule_error(), target)
        else:
            route = (plan_one(leaf, tg, target, opts) if is_tensor(leaf)
                     else untouched(leaf, target, opts))
        if route.problem is not None:
            route.key_path = flat.keystr(i)
        routes.append(route)
    return flat.unflatten(routes)


def convert(x, opts, JaxTarget tg=None, LoaderReport report=None):
    """:func:`to_jax` with its options already made one :class:`~dlinspect._options.Options`
    (what the loaders hold and hand over for every batch); ``report``: a loader's
    :class:`LoaderReport`, which counts the batch once it is converted."""
    if tg is None:
        tg = _TARGET if _TARGET is not None else _jax_target()
    return _convert(x, tg, opts, opts.flags, report)


cdef object _convert(x, JaxTarget tg, opts, int flags, LoaderReport report=None):
    tp = type(x)
    if (tp is dict or tp is list or tp is tuple or report is not None
            or flags & _OPT_PLACED and opts.sharding is not None):
        return _convert_batch(x, tg, opts, flags, report)
    if flags & (_OPT_COPY_ALWAYS | _OPT_PLACED) and not is_tensor(x):
        return _convert_batch(x, tg, opts, flags)
    cap = got = None
    try:
        if flags & (_OPT_COPY_ALWAYS | _OPT_PLACED):
            route, cap, _ = _decide_leaf(x, tg, opts)
            return _execute(route, cap, x, tg, opts)
        try:
            got = _fast_one(x, tg, flags)
        except NotDescribableError as exc:
            return _execute(route_numpy_copy(exc, tg, "jax", opts), None, x, tg, opts)
        except NotDLPackError:
            if is_tensor(x):
                raise
            return _convert_batch(x, tg, opts, flags)   # a batch JAX does not register, or a leaf
        if type(got) is not tuple:
            return got
        cap, info, needs = got
        return _execute(route_jax(info, needs, tg, opts, x), cap, x, tg, opts)
    except BaseException:
        # The export is let go of here, with the error handled rather than pending: a
        # producer's capsule destructor may run Python code (warp's is a ctypes callback).
        cap = got = None
        raise


cdef tuple _decide_leaf(x, JaxTarget tg, opts, bint reuse=False):
    """One tensor's route into JAX, its (unconsumed) export and its header. ``reuse``
    (a batch bound for a sharding): a split decided before for the same header and
    sharding is given instead of a route (``_SplitViews``), and a new one is kept."""
    cdef _TypeEntry entry = None
    if not PyCapsule_CheckExact(x):
        entry = _entry_for(type(x))
        # (NumPy and torch arrays are never jax.Arrays: no isinstance asked of them)
        if entry.guard != GUARD_NUMPY and not entry.is_torch and isinstance(x, tg.jax.Array):
            return route_jax_array(x, opts), None, None
    cdef PyObject* p = NULL
    cdef int flags = opts.flags
    try:
        info = _export(x, MODE_TAKE, tg.stream_for, &p, entry, _refuser(tg, flags))
    except NotDescribableError as exc:
        return route_numpy_copy(exc, tg, "jax", opts), None, None
    cap = _take_ref(p)
    try:
        if reuse:
            seen = _split_seen(info, opts.sharding, flags, tg)
            if seen is not None:
                return seen, cap, info
        route = decide(info, tg, "jax", opts, x)
        if reuse:
            _remember_split(route, info, flags, tg)
        return route, cap, info
    except BaseException:
        cap = None   # (see _convert)
        raise


cdef object _execute(Route route, cap, x, JaxTarget tg, opts, bint prepared=False):
    """Carry out ``route`` (its narrowing warning first, before anything is consumed:
    ``-W error`` then leaves a caller's capsule as it was; ``prepared``: a batch's decide
    half gave it, see ``_prepare``). A tensor's new array is committed exactly where the
    caller named a device or a sharding, as ``jax.device_put`` commits, or where it
    keeps a permuted layout (Need.PERMUTED); otherwise uncommitted, as ``jnp.asarray``'s
    (put.pxi)."""
    action = route.action
    if not prepared and action is not PRODUCER_COPY and action is not RAISE:
        text = route.warning
        if text is not None:
            warn(text)
    out = EXECUTORS[action](route, cap, x, tg, opts)
    if (action in _NEW_ARRAY and not (<int>opts.flags) & _OPT_PLACED
            and not route.facts.get("keeps_layout")):
        return tg.uncommit(out)
    return out


# The actions that make a new array of a tensor's values (not a jax.Array's, which is
# returned or moved as it is; not a sharded one, always placed; not a producer's host
# copy, whose own route decides).
cdef frozenset _NEW_ARRAY = frozenset([IMPORT, HOST_COPY, HOST_VIEW, EMPTY, NUMPY_PUT,
                                       NUMPY_COPY])


cdef int _prepare(Route route, JaxTarget tg) except -1:
    """What can fail in executing ``route``, done in a batch's decide half, once every
    leaf is decided and before any is taken: its narrowing warning given (the user's
    filters may make it an exception) and a copy's memory allocated (AllocationError).
    A producer's host copy, which takes nothing of the caller's and runs first, warns
    once the copy is in hand."""
    action = route.action
    if action is PRODUCER_COPY or action is RAISE:
        return 0
    text = route.warning
    if text is not None:
        warn(text)
    if action is DEVICE_PUT or action is PROCESS_LOCAL:
        route = route.facts["whole"]
    if route.action is HOST_COPY:
        route._out = _copy_memory(route, tg)
    return 0


cdef int _raise_route(Route route) except -1:
    raise route._take_error()


def repeated_capsule(list leaves, set seen=None):
    """The index of the first leaf that is a DLPack capsule already met earlier in
    ``leaves`` (the same object twice: a capsule is consumed exactly once), or -1.
    ``seen``: ids of capsules met before ``leaves`` (earlier sub-trees), updated."""
    cdef Py_ssize_t i
    for i in range(len(leaves)):
        leaf = leaves[i]
        if PyCapsule_CheckExact(leaf):
            if seen is None:
                seen = set()
            elif id(leaf) in seen:
                return i
            seen.add(id(leaf))
    return -1


def repeated_capsule_error():
    """The error for a capsule that is a second leaf of its batch."""
    return CapsuleConsumedError(
        "this DLPack capsule is also an earlier leaf of the batch (the same object twice), "
        "and a capsule is consumed exactly once, so converting it twice could only fail "
        "after the first consumed it; nothing was consumed. To fix: pass each capsule once, "
        "or the producer object instead (its __dlpack__ makes a capsule for every leaf).")


# ---- the executors: (route, capsule, source, target, options) -> array ------------------

def _ex_import(Route route, cap, x, JaxTarget tg, opts):
    """Hand the capsule to jaxlib as it is (``copy=True`` where device memory is copied)."""
    stream = None if PyCapsule_CheckExact(x) else tg.stream_for(route.import_type,
                                                                route.info.device_id)
    arr = _import_legacy(tg.import_fn, cap, route.import_device, stream, route.import_copy,
                         route.import_type)
    return _finish(tg, arr, route, False)


def _ex_host_copy(Route route, cap, x, JaxTarget tg, opts):
    """One copy of host memory, in one pass in C without the GIL, into aligned memory
    (narrowed where JAX narrows; row-major whatever the source's layout), imported
    without a second copy; the source is taken before it is read and freed right after.
    (Vector lanes are copied by NumPy, as a trailing axis.) The memory is the one a
    batch's decide half allocated (``_prepare``), else allocated here."""
    cdef TensorInfo info = route.info
    cdef bint placed = (<int>opts.flags) & _OPT_PLACED
    out = route._out if route._out is not None else _copy_memory(route, tg)
    route._out = None
    if info._lanes != 1 or info._bits % 8:
        host = _host_copy(cap, info, out)
        return _finish(tg, _put_host(tg, host, route.import_device, placed), route)
    return _finish(tg, _copy_taken(cap, info, out, tg, route.import_device, placed), route)


cdef object _copy_memory(Route route, JaxTarget tg):
    """The memory a HOST_COPY route copies into (aligned, row-major, in the dtype JAX
    narrows to where it does; vector lanes a trailing axis), allocated before anything is
    taken: AllocationError where it cannot be."""
    cdef TensorInfo info = route.info
    narrow = route.facts.get("narrow")
    if info._lanes != 1 or info._bits % 8:
        lanes = (info._lanes,) if info._lanes != 1 else ()
        dtype = info.numpy_dtype if narrow is None else numpy_dtype(narrow[2], narrow[3])
        return _allocate(info.shape + lanes, dtype, tg.copy_align, info)
    if narrow is None:
        return _aligned_array(info, info._code, info._bits, tg.copy_align)
    return _aligned_array(info, narrow[2], narrow[3], tg.copy_align)


def _ex_host_view(Route route, cap, x, JaxTarget tg, opts):
    """Host memory viewed through NumPy (vector lanes as a trailing axis), imported."""
    view, _owner = _host_view(cap, route.info)
    return _finish(tg, _put_host(tg, view, route.import_device,
                                 (<int>opts.flags) & _OPT_PLACED), route)


def _ex_empty(Route route, cap, x, JaxTarget tg, opts):
    """A new empty array; the capsule is taken and freed (nothing of it is used).
    jaxlib's put of an empty NumPy array (``jax.device_put``'s), not ``jnp.zeros``: that
    compiles a fill, and XLA:CPU aborts the process compiling one for float6 (jaxlib
    0.12.0.1), a dtype ``jax.device_put`` takes."""
    cdef TensorInfo info = route.info
    take(cap, True, info)
    shape = info.shape + ((info._lanes,) if info._lanes != 1 else ())
    dtype = tg.jax.dtypes.canonicalize_dtype(info.numpy_dtype)
    return _put_host(tg, _np_empty(shape, dtype), route.jax_device,
                     (<int>opts.flags) & _OPT_PLACED, False)


def _ex_producer_copy(Route route, cap, x, JaxTarget tg, opts):
    """No JAX device for the memory: one copy by the producer into aligned host memory
    dlinspect allocates, which JAX views (where the producer table says how); else
    the producer's host copy (one copy where it is memory JAX can view, two where it
    is not), routed with its own header, which is in hand. That route decides whether
    the array stays committed: a host copy in a permuted order that JAX views keeps it
    (Need.PERMUTED), which an uncommitted array would lose."""
    del cap   # the device capsule is not needed: its producer frees it now
    cdef bint placed = (<int>opts.flags) & _OPT_PLACED
    out, tried = _copy_into_host(route, x, tg.copy_align)
    if out is not None:
        dest = route.jax_device
        src = dest if dest.platform == "cpu" else tg.cpu_device
        arr = _put_host(tg, out, src, placed)
        return arr if src == dest or placed else tg.uncommit(tg.jax.device_put(arr, dest))
    host_cap, host_info, host = _host_from_producer(x, route.info, "jax", tried)
    # The narrowing warning is for the caller's tensor, given once the host copy is in
    # hand (a failed host copy raises its own error, not the warning).
    if route.warning is not None:
        warn(route.warning)
    quiet = opts.quiet(route.jax_device)
    if host_cap is None:   # a NumPy array from the producer's own method
        inner, host_cap = _numpy_route(host, tg, quiet)
    else:
        inner = route_jax(host_info, _needs_jax(host_info, tg, opts.readonly == "share"), tg,
                          quiet, host_cap)
        host = host_cap
    arr = _execute(inner, host_cap, host, tg, quiet)
    return arr if placed or inner.facts.get("keeps_layout") else tg.uncommit(arr)


def _ex_numpy_put(Route route, cap, x, JaxTarget tg, opts):
    """A dtype JAX holds but does not import (int4...): a NumPy array of dlinspect's own
    (unpacked where packed), put into JAX as ``jax.device_put`` puts it (which copies
    these dtypes): the producer's memory is freed here, not when jaxlib lets go of it."""
    host = (_unpack_subbyte(cap, route.info) if route._needs & NEED_PACKED
            else _np.array(_host_view(cap, route.info)[0]))
    return _put_host(tg, host, route.jax_device, (<int>opts.flags) & _OPT_PLACED, False)


def _ex_numpy_copy(Route route, cap, x, JaxTarget tg, opts):
    """NumPy memory DLPack cannot describe: one copy by NumPy into native, C-ordered,
    aligned memory (narrowed where JAX narrows), which JAX views; under a multi-device
    sharding, that copy is then split as any host array is."""
    narrow = route.facts.get("narrow")
    host = _native_copy(x, None if narrow is None else numpy_dtype(narrow[2], narrow[3]),
                        tg.copy_align)
    if "spread" in route.facts:
        inner, inner_cap, _ = _decide_leaf(host, tg, opts)
        return _execute(inner, inner_cap, host, tg, opts)
    return _finish(tg, _put_host(tg, host, route.import_device,
                                 (<int>opts.flags) & _OPT_PLACED), route)


def _ex_split(Route route, cap, x, JaxTarget tg, opts):
    """Host memory bound for CPU devices: one owner for the whole tensor, each device
    imports its slice as decided (in one pass in C where every slice is viewed or
    copied in C; else by each slice's own route); JAX assembles the array. The
    producer's deleter runs when the last shard dies. A legacy capsule cannot say
    read-only and is imported as writable, as ``to_jax`` does."""
    cdef TensorInfo info = route.info
    f = route.facts
    if "parts" in f:   # decided for one pass (its shards' words, if asked for, change nothing)
        devices = f["devices"]
        return _split_import(cap, info, f["parts"], devices, f["sharding"], tg)
    else:
        owner = take(cap, info.read_only is True, info)
        devices, arrays = [], []
        for dev, _, shard in route._shards:
            part = view_capsule(owner, shard.info)
            devices.append(dev)
            arrays.append(EXECUTORS[shard.action](shard, part, part, tg, opts))
    return tg.assemble(info.shape, f["sharding"], devices, arrays)


def _ex_spread(Route route, cap, x, JaxTarget tg, opts):
    """Memory JAX takes whole, then spreads over the sharding's devices."""
    whole = route.facts["whole"]
    arr = EXECUTORS[whole.action](whole, cap, x, tg, opts)
    if route.action is PROCESS_LOCAL:
        return tg.jax.make_array_from_process_local_data(opts.sharding, arr)
    return tg.jax.device_put(arr, opts.sharding)


def _ex_pass(Route route, cap, x, JaxTarget tg, opts):
    return x


def _ex_array_put(Route route, cap, x, JaxTarget tg, opts):
    return tg.jax.device_put(x, route.facts["where"])


def _ex_array_copy(Route route, cap, x, JaxTarget tg, opts):
    return x.copy()   # (typed PRNG key arrays too, which jnp.array refuses)


def _ex_raise(Route route, cap, x, tg, opts):
    _raise_route(route)


#: One executor per action of a JAX route (routes.pxi).
EXECUTORS = {
    IMPORT: _ex_import, HOST_COPY: _ex_host_copy, HOST_VIEW: _ex_host_view, EMPTY: _ex_empty,
    PRODUCER_COPY: _ex_producer_copy, NUMPY_PUT: _ex_numpy_put, NUMPY_COPY: _ex_numpy_copy,
    SPLIT: _ex_split, DEVICE_PUT: _ex_spread, PROCESS_LOCAL: _ex_spread, PASS: _ex_pass,
    ARRAY_PUT: _ex_array_put, ARRAY_COPY: _ex_array_copy, RAISE: _ex_raise,
}


cdef object _finish(JaxTarget tg, arr, Route route, bint narrowed=True):
    if not narrowed and route._needs & NEED_NARROW:
        canon = tg.jax.dtypes.canonicalize_dtype(arr.dtype)   # device memory: JAX narrows
        arr = tg.jnp.asarray(arr, dtype=canon)
    if route.jax_device is not None and route.jax_device != route.import_device:
        arr = tg.jax.device_put(arr, route.jax_device)
    return arr


cdef tuple _numpy_route(arr, JaxTarget tg, opts):
    """A NumPy array dlinspect holds (a producer's host copy) into JAX: its own route and
    capsule (None where DLPack cannot describe it: NumPy copies it)."""
    try:
        cap = numpy_capsule(arr)
    except NotDescribableError as exc:
        return route_numpy_copy(exc, tg, "jax", opts), None
    cdef TensorInfo info = _peek_capsule(cap)
    return route_jax(info, _needs_jax(info, tg, opts.readonly == "share"), tg, opts, cap), cap


cdef tuple _copy_into_host(Route route, x, Py_ssize_t align):
    """The producer's copy into aligned host memory dlinspect allocates (``into`` of the
    producer table): ``(array, [])``, or ``(None, what was tried)``."""
    if route.facts.get("into") is None:
        return None, []
    info = route.info
    out = _allocate(info.shape, info.numpy_dtype, align, info)
    failure = export_host_copy_into(x, out)
    return (out, []) if failure is None else (None, [failure])


cdef tuple _host_from_producer(x, TensorInfo info, str target, list tried):
    """A host copy of x's values: ``(capsule, its TensorInfo, None)`` from the producer's
    ``__dlpack__``, else ``(None, None, ndarray)`` from its own method or the array
    protocol, checked against the header (ProducerError where its shape or dtype is
    another); or UnsupportedDeviceError listing what was tried (after ``tried``)."""
    got, host_info = export_host_copy(x)
    if isinstance(host_info, TensorInfo):
        if host_info.shape != info.shape or host_info.dtype != info.dtype:
            raise _copy_mismatch(x, info, host_info.shape, host_info.dtype_name)
        return got, host_info, None
    if got is not None:
        lanes = (info._lanes,) if info._lanes != 1 else ()
        want = info.numpy_dtype
        if got.shape != info.shape + lanes or (want is not None and got.dtype != want):
            raise _copy_mismatch(x, info, got.shape, got.dtype.name)
        return None, None, got
    words = _words()
    raise UnsupportedDeviceError(
        f"{words.describe(info)} could not be brought to host memory. Tried: "
        f"{'; '.join(tried + host_info)}. To fix: "
        f"{words.device_fix(info._dev_type, target, False)}.")


cdef object _copy_mismatch(x, TensorInfo info, shape, str dtype):
    return ProducerError(
        f"{_type_name(x)}'s host copy has shape {tuple(shape)} and dtype {dtype}, but the "
        f"header it exported says shape {info.shape} and dtype {info.dtype_name}: the "
        f"producer is at fault, and nothing of that copy was used. To fix: "
        f"{_words().device_fix(info._dev_type, 'host', False)}.")


# ---- host memory -----------------------------------------------------------

cdef tuple _host_view(cap, TensorInfo info, read_only=None):
    """Consume ``cap`` into a NumPy view of its memory (and the owner that frees it).

    Vector lanes become a trailing axis. ``read_only`` None: a legacy capsule,
    which cannot say, gives a read-only view, as NumPy does.
    """
    if read_only is None:
        read_only = info.read_only is not False
    owner = take(cap, read_only, info)
    return _np.asarray(owner).view(info.numpy_dtype), owner


cdef object _host_copy(cap, TensorInfo info, out=None):
    """One copy of host memory by NumPy into ``out`` (C order; vector lanes a trailing
    axis; its dtype may narrow, as JAX's x64 mode does), or into a fresh 64-byte aligned
    array; frees the source. The copy is allocated before ``cap`` is consumed
    (AllocationError leaves it as it was)."""
    if out is None:
        lanes = (info._lanes,) if info._lanes != 1 else ()
        out = _allocate(info.shape + lanes, info.numpy_dtype, 64, info)
    view, owner = _host_view(cap, info)
    _copy_values(out, view)
    del view, owner  # the producer's deleter runs here, right after the copy
    return out


cdef object _native_copy(arr, dtype=None, Py_ssize_t alignment=64):
    """NumPy memory DLPack cannot describe (byte order, byte strides), copied by NumPy
    into native byte order, C order, ``alignment``-byte aligned (``dtype``: cast on the
    way, for JAX's x64 narrowing)."""
    out = _allocate(arr.shape, arr.dtype.newbyteorder("=") if dtype is None else dtype,
                    alignment, None)
    _copy_values(out, arr)
    return out


cdef int _copy_values(out, src) except -1:
    # NumPy's cast: swaps bytes, gathers strides; float64 -> float32 overflow is inf
    # and integers wrap, as in JAX's narrowing.
    if out.dtype == src.dtype:
        _np.copyto(out, src)
        return 0
    with _np.errstate(over="ignore", invalid="ignore"):
        _np.copyto(out, src, casting="unsafe")
    return 0


cdef object _allocate(shape, dtype, Py_ssize_t alignment, TensorInfo info):
    """``aligned_empty``, with a failed allocation as AllocationError naming the bytes."""
    try:
        return aligned_empty(shape, dtype, alignment)
    except MemoryError:
        nbytes = 1
        for extent in shape:
            nbytes *= extent
        nbytes *= _np_dtype(dtype).itemsize
        words = _words()
        what = words.describe(info) if info is not None else (
            f"a {_np_dtype(dtype).name} NumPy array of shape {shape}")
        raise words.allocation_error(nbytes, what, physical_memory()) from None


cdef object _unpack_subbyte(cap, TensorInfo info):
    """Copy a packed sub-byte tensor (int4, float4...) into one element per byte."""
    owner = take(cap, True, info)
    cdef int bits = info._bits
    raw = _np.asarray(ByteView(owner, info._nbytes))
    shifts = _np.arange(8 // bits, dtype=_np.uint8) * bits
    # Element i sits at bits [i*bits, (i+1)*bits) of the little-endian bit stream.
    vals = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[: info._size]
    shape = info.shape
    if info._code == kDLInt:   # sign-extend, then convert by value
        half = 1 << (bits - 1)
        return ((vals.astype(_np.int8) ^ half) - half).astype(info.numpy_dtype).reshape(shape)
    if info._code == kDLUInt:  # convert by value
        return vals.astype(info.numpy_dtype).reshape(shape)
    # Floating sub-byte types: ml_dtypes keeps the bit pattern in the low bits of a byte.
    return vals.view(info.numpy_dtype).reshape(shape).copy()


# ---- host --------------------------------------------------------------------

@cython.binding(True)
def to_host(x, copy=None):
    """A NumPy array of a DLPack tensor's values, zero-copy for host memory.

    Parameters
    ----------
    x : object with ``__dlpack__`` or DLPack capsule
        The tensor.
    copy : bool or None
        True always copies; False never does (``CopyRequiredError`` where the
        memory is not host-accessible or packed sub-byte data must be
        unpacked); None copies only where needed.

    Returns
    -------
    numpy.ndarray
        Views the producer's memory for kDLCPU, kDLCUDAHost, kDLROCMHost and
        kDLCUDAManaged, including bfloat16, float8 and int4 (through
        ml_dtypes), which ``numpy.from_dlpack`` refuses. A vector dtype
        (``lanes > 1``) is a trailing axis: float32x4 of shape ``(N,)`` gives
        float32 of shape ``(N, 4)``. Not writeable when the source is read-only
        (a legacy capsule cannot say, so it is read-only, as NumPy does). Device
        memory goes through the producer's host copy (``dl_device=(kDLCPU, 0),
        copy=True``), else ``numpy.asarray(x)``.

    Raises
    ------
    UnsupportedDeviceError
        No host copy could be had (a ``BufferError``).
    UnsupportedDTypeError
        No NumPy dtype exists for the tensor's dtype here (a ``BufferError``).
    CopyRequiredError
        ``copy=False`` but a copy is needed (a ``ValueError``).
    ProducerError, CapsuleConsumedError, MalformedTensorError, UnsupportedVersionError
        From the export and the header (see :func:`peek`).

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_host(np.arange(3.0)).tolist()
    [0.0, 1.0, 2.0]
    """
    opts = _check_options(copy=copy)
    cdef PyObject* p = NULL
    try:
        info = _export(x, MODE_TAKE, None, &p)
    except NotDescribableError as exc:
        return _host_execute(route_numpy_copy(exc, None, "host", opts), None, x)
    cap = _take_ref(p)
    try:
        return _host_execute(route_host(info, _needs_host(info), copy, x), cap, x)
    except BaseException:
        cap = None   # (see _convert)
        raise


cdef object _host_execute(Route route, cap, x):
    return HOST_EXECUTORS[route.action](route, cap, x)


def _host_raise(Route route, cap, x):
    _raise_route(route)


def _host_producer_copy(Route route, cap, x):
    del cap
    out, tried = _copy_into_host(route, x, 64)
    if out is not None:
        return out
    host_cap, host_info, host = _host_from_producer(x, route.info, "host", tried)
    if host_cap is None:
        return host
    return _host_execute(route_host(host_info, _needs_host(host_info), None, host_cap),
                         host_cap, host_cap)


def _host_empty(Route route, cap, x):
    cdef TensorInfo info = route.info
    take(cap, True, info)
    lanes = (info._lanes,) if info._lanes != 1 else ()
    return _np_empty(info.shape + lanes, info.numpy_dtype)


def _host_unpack(Route route, cap, x):
    return _unpack_subbyte(cap, route.info)


def _host_copy_out(Route route, cap, x):
    return _host_copy(cap, route.info)


def _host_view_out(Route route, cap, x):
    return _host_view(cap, route.info)[0]


def _host_numpy_copy(Route route, cap, x):
    return _native_copy(x)


#: One executor per action of a host route.
HOST_EXECUTORS = {
    RAISE: _host_raise, PRODUCER_COPY: _host_producer_copy, EMPTY: _host_empty,
    UNPACK: _host_unpack, HOST_COPY: _host_copy_out, HOST_VIEW: _host_view_out,
    NUMPY_COPY: _host_numpy_copy,
}
