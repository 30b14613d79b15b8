# front.pxi: the front doors (to_jax, plan, explain, to_host) and the JaxTarget they read.

from dlinspect import _jaxcaps, _tree

# to_jax's string defaults, compared by identity on the hot path (an equal string: checked).
cdef str _S_HOST = "host", _S_COPY = "copy", _S_KEEP = "keep", _S_WARN = "warn"

cdef object _TARGET = None, _CAPS = None
cdef object _CAPS_LOCK = _threading.RLock()   # (re-entered: jax_target, jax_caps)


def _unlock_in_child():
    """A forked child has only the thread that forked: a lock another thread held at the
    fork would be held forever there, so the child gets a new one (a set-up left half done
    is None, and built again)."""
    global _CAPS_LOCK
    _CAPS_LOCK = _threading.RLock()


if hasattr(_os, "register_at_fork"):   # (not on Windows, which does not fork)
    _os.register_at_fork(after_in_child=_unlock_in_child)


def jax_caps():
    """The process-wide :class:`dlinspect._jaxcaps.JaxCaps` (what the installed JAX takes,
    probed once with the core's own capsules); imports jax on first call: ImportError with
    the install command where jax is not installed."""
    global _CAPS
    with _CAPS_LOCK:
        if _CAPS is None:
            _CAPS = _jaxcaps.JaxCaps(_jaxcaps.CoreTools(
                JaxTarget, aligned_empty, capsule_of, header_capsule, import_capsule,
                stream_of, warn))
    return _CAPS


def jax_target():
    """The process-wide JaxTarget every route reads (built on first use, as jax_caps; to_jax
    and convert_next read ``_TARGET`` first, inline)."""
    global _TARGET
    if _TARGET is None:
        with _CAPS_LOCK:   # built once, however many threads ask first
            _TARGET = _TARGET if _TARGET is not None else jax_caps().target
    return _TARGET


def set_target(tg):
    """Make ``tg`` the JaxTarget every route reads (None: built again on next use)."""
    global _TARGET
    _TARGET = tg


def force_public_api(bint on=True):
    """Route every JAX import through the public ``jax.dlpack.from_dlpack`` (the fallback,
    for tests); ``DLINSPECT_JAX_PUBLIC_API=1`` does the same at start-up."""
    with _CAPS_LOCK:   # (a build in flight hands back no target of the other import)
        jax_caps()._set_direct(on, "forced by dlinspect._core.force_public_api()")
        set_target(None)   # rebuilt with the import function chosen there


def current_target():
    """The JaxTarget built in this process, or None: builds nothing, imports no JAX
    (what ``dlinspect.stack`` asks, so that a loader's worker processes start no JAX)."""
    return _TARGET


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
        Destination, committed there. None: where ``jnp.asarray`` puts it, uncommitted:
        device memory JAX has a device for stays on it; other memory goes to JAX's default
        device (``jax_default_device``, else ``jax.devices()[0]``, read once per process),
        viewed in place when that is a CPU device, else copied onto it.
    copy : bool or None
        Array API ``copy`` (``from_dlpack``): True always copies; False never does and
        raises ``CopyRequiredError`` naming why a copy is needed (alignment, strides,
        read-only, device transfer, dtype narrowing); None only where needed.
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
        raises ``NotDLPackError`` naming its key path. None is no leaf (JAX's empty
        subtree): kept at any depth, whichever is asked.
    narrow : {"warn", "ok"}
        A 64-bit dtype JAX narrows with x64 off (int64 labels, say) comes with a
        ``DLInspectWarning`` (Python's filters decide where it shows: by default
        once per call site and dtype), or (``"ok"``) quietly.
    readonly : {"copy", "share"}
        Read-only memory (the versioned READ_ONLY flag, e.g. a read-only NumPy
        array) is copied by default. ``"share"`` imports it without a copy, a batch
        leaf whose memory the batch is not proven to own too: the caller says that
        nothing writes read-only memory while the result lives (Arrow's buffers and
        memory-mapped dataset files are never written). JAX never writes an array it
        did not allocate, except through buffer donation, so do not donate such
        arrays (``jax.jit(donate_argnums=...)``).

    Returns
    -------
    jax.Array or pytree of jax.Array
        The same structure as ``x``. A vector dtype (``lanes > 1``, e.g. float32x4
        of shape ``(N,)``) arrives as a trailing axis: float32 of shape ``(N, 4)``.
        Every array is in JAX's default, row-major layout, as ``jnp.asarray``'s:
        a tensor in another axis order (``x.T``, a ``permute``; ``Need.PERMUTED``)
        is copied into it. With no ``device`` or ``sharding``, each array is
        uncommitted, as ``jnp.asarray(x)``'s (on the device of the memory it views),
        so a jitted function fed both compiles once; with one, committed, as
        ``jax.device_put(x, device)``'s. A ``jax.Array`` in ``x`` is returned as it
        is; with ``device`` or ``sharding``, committed there as ``jax.device_put``
        commits it (moved where it is elsewhere). One in another layout (what
        ``jax.dlpack.from_dlpack`` makes of a transpose, which ``jax.device_put``
        moves wrong) is first copied into row-major order on its device. Inside
        ``jax.jit``, ``vmap`` or ``grad`` a traced value is JAX's own too, and is
        returned as it is (or put, or copied, as asked), as ``jnp.asarray`` does.

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
        A copy the route needs cannot be had (a ``MemoryError``); nothing is consumed.
    ContainerError
        A container of the batch cannot be rebuilt around its converted values
        (a ``TypeError``), found before anything is taken: each container is
        rebuilt with its own values, and with JAX arrays where its tensors stand.
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
    same options says what this does. Under ``jax.transfer_guard("disallow")``
    it is an explicit transfer, as ``jax.device_put`` is ("disallow_explicit"
    refuses it).

    Zero-copy shares the producer's memory, so who else can write it decides. A
    leaf of a batch (any container) is imported zero-copy only where reference
    counts prove, before anything is taken, that nothing but the batch and the
    variables of the function calling it holds its memory (a NumPy array owning
    its data, a torch tensor alone on storage torch allocated). A variable of a
    function further up the stack, and the tuple of a call made with ``*args`` or
    ``**options``, may be a source's: their leaves are copied (convert where the
    loop is; pass options by name). A leaf not proven is copied, so that a source
    refilling memory it hands over again cannot change a batch kept. A tensor
    given alone, ``to_jax(x)``, follows DLPack's consumer contract as
    ``jax.dlpack.from_dlpack(x)`` does: the result shares ``x``'s memory, and a
    later write to ``x`` shows in it (``copy=True`` copies it). ``copy=False``
    imports every leaf it can zero-copy, proven or not.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_jax({"x": np.arange(4, dtype=np.float32)})["x"].sum().item()
    6.0
    """
    cdef Options opts = DEFAULT
    if not (device is None and copy is None and sharding is None and fallback is _S_HOST
            and readonly is _S_COPY and leaves is _S_KEEP and narrow is _S_WARN):
        opts = check_options(device, copy, sharding, fallback, readonly, leaves, narrow)
    return _convert(x, _TARGET if _TARGET is not None else jax_target(), opts)


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
        Where it should go. ``"host"`` takes one tensor, as :func:`to_host` does:
        anything else gets the error route of what ``to_host`` raises for it.
    device : jax.Device or single-device Sharding, optional
        Destination device for ``target="jax"``; default: as :func:`to_jax`'s.
    copy : bool or None
        Array API ``copy``: True always copies, False never (a needed copy becomes a
        ``CopyRequiredError`` route), None copies only where needed.
    sharding : jax.sharding.Sharding or pytree of them, optional
        Plan the split over several devices (see :func:`to_jax`); the route's
        ``shards`` then give each device's index and route, and an uneven split
        is a ``ShardingError`` route. A pytree of shardings is matched against the
        batch as :func:`to_jax` matches it (a ValueError where it does not fit).
    fallback : {"host", "raise"}
        What to do with memory on a device JAX has no backend for: go through host
        memory, or an ``UnsupportedDeviceError`` route.
    readonly : {"copy", "share"}
        Read-only memory (versioned READ_ONLY flag) is copied by default;
        ``"share"`` imports it without a copy (see :func:`to_jax`).
    leaves : {"keep", "raise"}
        For ``target="jax"``: a leaf that is not a tensor (a str, a number, a NumPy
        array of strings...; the whole of ``x`` too) gets an ``"untouched"`` route, or
        (``"raise"``) a ``NotDLPackError`` route. The batch is walked as
        :func:`to_jax` walks it (Mappings and dataclasses included); None is no leaf
        and stays None in the routes.
    narrow : {"warn", "ok"}
        Whether a 64-bit dtype JAX narrows (x64 off) gets a ``warning``.

    Returns
    -------
    Route or pytree of Route
        ``kind``, ``reason``, ``needs``, ``copy_bytes``, ``jax_device``, ``error``;
        for a pytree, one Route per leaf in the same structure, each error's
        message led by its leaf's key path (``['inputs']['pixels']: ...``).
        ``to_jax(x)`` (``to_host(x)``) does exactly this: it raises ``route.error`` when
        the kind is ``"error"``, and shares memory exactly when it is ``"zero-copy"``. A
        ``"host-fallback"`` route rests on a host copy plan does not ask the producer
        for: executing it raises ``UnsupportedDeviceError`` (listing what was tried)
        when none can be had.

    Raises
    ------
    ValueError, TypeError
        An option outside its documented values.
    ContainerError
        The batch cannot be walked: it contains itself, nests too deep, or holds a
        dict whose keys do not sort (a container that cannot be rebuilt is an error
        route in its place); or (``target="jax"``) a container of it refuses the JAX
        arrays :func:`to_jax` would put in it, as ``to_jax`` raises it.

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
    return _plan(x, target, check_options(device, copy, sharding, fallback, readonly, leaves, narrow))


cdef _plan(x, target, Options opts):
    """:func:`plan` with its options checked (``explain``'s too: ``x`` is held as to_jax's)."""
    if target != "jax" and target != "host":
        raise ValueError(f"target must be 'jax' or 'host', not {target!r}")
    # (target="host": to_host's one tensor, whatever x is)
    cdef JaxTarget tg = jax_target() if target == "jax" else None
    if tg is None or isinstance(x, TensorInfo) or is_tensor(x) and (
            opts.sharding is None or isinstance(opts.sharding, tg.jax.sharding.Sharding)):
        route = _plan_one(x, tg, target, opts)
        if tg is not None and not isinstance(x, TensorInfo):   # (its reason says it is shared)
            route.facts["alone"] = True
        return route
    owned = _owned(x, opts, -1)   # (first: nothing of dlinspect's holds a part of x yet)
    parts, where = _parts(x, tg, opts, True, owned)
    seen = set()
    for part in parts:
        _plan_part(part, tg, seen)
    return _rebuild_parts(parts, where, tg)


cdef _plan_one(x, tg, str target, Options opts, bint aliased=False):
    """The route of one tensor (a producer, a capsule, a TensorInfo, a jax.Array): its
    decision (``_decide``, as :func:`to_jax` decides), dressed, its export released
    unconsumed; ``aliased``: a batch leaf not proven to own its memory."""
    if isinstance(x, TensorInfo):
        return decide(x, tg, target, opts, None, aliased)
    cdef _Leaf d
    try:
        d = _decide(x, tg, target, opts, aliased)
        if d.route is not None:
            return d.route
        if d.verdict == _V_PASS:
            return route_jax_array(x, opts, tg)
        return decide(d.info, tg, target, opts, x, aliased)   # (a verdict's: route_jax dresses it)
    except DLInspectError as exc:
        return failed(exc, target)


cdef int _plan_part(_Part part, JaxTarget tg, set seen) except -1:
    """Every leaf's route into JAX of one part, in ``part.out``: each decided as to_jax decides it."""
    flat = part.flat
    errors = {} if flat is None else flat.errors
    if flat is not None:   # (to_jax's check: a container refusing JAX arrays)
        _check_rebuild(flat, [i for i, leaf in enumerate(part.leaves)
                              if i not in errors and is_tensor(leaf)], tg)
    cdef Py_ssize_t i, repeated = repeated_capsule(part.leaves, seen)
    part.out = []
    for i, leaf in enumerate(part.leaves):
        if i in errors:   # a container that cannot be rebuilt: its error, in its place
            route = failed(errors[i], "jax")
        elif i == repeated:    # the same capsule twice: the second is the error
            route = failed(repeated_capsule_error(), "jax")
        else:
            route = (_plan_one(leaf, tg, "jax", part.opts, part.aliased(leaf))
                     if is_tensor(leaf) else untouched(leaf, "jax", part.opts))
        if route is not None and route.problem is not None:
            route.key_path = part.keystr(i)
        part.out.append(route)
    return 0


def convert_next(it, opts, LoaderReport report, end):
    """The next item of iterator ``it`` (a loader's source) converted as :func:`to_jax` converts
    a batch, with its options one ``Options``; ``report`` counts it; ``end`` where ``it`` has
    no more. The item is held by this function alone while the proof counts its references
    (own.pxi): a bare tensor is a batch of one leaf here."""
    cdef JaxTarget tg = _TARGET if _TARGET is not None else jax_target()
    x = next(it, end)
    if x is end:
        return end
    return _convert_batch(x, tg, opts, report, 1)


cdef _convert(x, JaxTarget tg, Options opts):
    """The one engine's entry: a lone tensor decided and run here, anything else as a batch."""
    tp = type(x)
    if tp is dict or tp is list or tp is tuple or opts.sharding is not None or not is_tensor(x):
        return _convert_batch(x, tg, opts)
    try:
        d = _decide(x, tg, "jax", opts)
        return _run(d, x, tg, opts)
    except BaseException:
        # The export is let go of here, with the error handled rather than pending: a
        # producer's capsule destructor may run Python code (warp's is a ctypes callback).
        d = None
        raise


@cython.binding(True)
def explain(x, target="jax", *, device=None, copy=None, sharding=None, fallback="host",
            readonly="copy", leaves="keep", narrow="warn"):
    """The header and the route, in a few readable lines (one block per pytree leaf).

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, TensorInfo, or pytree of them
        What :func:`plan` takes; a capsule is read, never consumed.
    target : {"jax", "host"}
        Where it should go, as for :func:`plan`.
    device, copy, sharding, fallback, readonly, leaves, narrow
        :func:`plan`'s options.

    Returns
    -------
    str
        For one tensor: the header (``<TensorInfo ...>``: device, dtype, shape,
        strides in elements, layout, bytes, alignment in bytes, flags), the route's
        kind and the bytes it copies, its reason or its error, the JAX device and
        any warning. For a batch: one such block per leaf under its key path, runs
        of untouched leaves folded into one line; for a pytree without leaves (None, an
        empty dict), one line saying so.

    Raises
    ------
    ValueError, TypeError, ContainerError
        What :func:`plan` raises: an option outside its values, a batch that cannot be
        walked. A producer's refusal or a bad header is an error route, not raised.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> print(dlinspect.explain(np.ones(3, np.float32), target="host"))  # doctest: +ELLIPSIS
    <TensorInfo kDLCPU:0 float32[3] ...>
    route to host: zero-copy
      NumPy views the kDLCPU memory directly.
    """
    routes = _plan(x, target, check_options(device, copy, sharding, fallback, readonly, leaves,
                                            narrow))
    if isinstance(routes, Route):
        return _words.explain_one(routes, x)
    return _words.explain_tree(_tree.flatten(routes))


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
    cdef _Leaf d = _decide(x, None, "host", check_options(copy=copy))
    try:
        return HOST_EXECUTORS[d.route.action](d.route, d.cap, x)
    except BaseException:
        d = None   # (see _convert)
        raise
