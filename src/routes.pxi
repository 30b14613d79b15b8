# routes.pxi: the one decision made into a Route of facts; pure (dlinspect._words words it).

import pickle as _pickle

from dlinspect._options import check_sharding

# What a route is, in the public word (Route.kind).
ZERO_COPY, COPY, HOST_FALLBACK, ERROR, UNTOUCHED = (
    "zero-copy", "copy", "host-fallback", "error", "untouched")

# Route.action (dlinspect._tables says each): one executor each in execute.pxi (EXECUTORS: a
# JAX route's, HOST_EXECUTORS: a host route's; KEEP: a leaf that is not a tensor, kept).
from dlinspect._tables import (
    ARRAY_COPY, ARRAY_PUT, DEVICE_PUT, EMPTY, HOST_COPY, HOST_VIEW, IMPORT, KEEP, NUMPY_COPY,
    NUMPY_PUT, PASS, PROCESS_LOCAL, PRODUCER_COPY, RAISE, SPLIT, UNPACK,
)

cdef class Route:
    """Where a tensor goes and why: the result of :func:`dlinspect.plan`.

    Attributes
    ----------
    kind : str
        ``"zero-copy"`` (JAX or NumPy views the producer's memory; an empty
        tensor, which has none, is zero-copy too), ``"copy"`` (a copy on a device
        JAX has: strides, alignment, read-only, dtype narrowing, device transfer
        or ``copy=True``), ``"host-fallback"`` (the memory is on a device this
        JAX has no backend for: it goes through host memory), ``"error"``, or,
        for a pytree leaf that is not a tensor, ``"untouched"`` (left as it is).
    zero_copy : bool
        No byte of the tensor is copied.
    reason : str
        One sentence: why this route.
    needs : Need
        What the decision found the tensor needs (0 for a plain tensor).
    copy_bytes : int
        Bytes the route copies, counted on the source tensor (0 for zero-copy).
    jax_device : jax.Device or None
        The device the array ends up on (None for ``target="host"``, errors, a
        sharding, and a ``jax.Array`` returned as it is with no device asked: it
        stays where it is).
    error : Exception or None
        The exception executing the route raises (kind ``"error"`` only): a
        producer's refusal, a corrupt header, or why the target cannot take it.
    warning : str or None
        A warning executing the route emits (64-bit narrowing with x64 off, unless
        ``narrow="ok"``).
    info : TensorInfo or None
        The header the decision was made from (None when the producer refused to
        export, the header could not be read, or NumPy memory has none: see ``error``).
    target : str
        ``"jax"`` or ``"host"``.
    shards : tuple of (jax.Device, tuple of slice, Route)
        With ``plan(x, sharding=...)`` and host memory bound for CPU devices:
        each device's index into ``x`` (as ``Sharding.addressable_devices_indices_map``
        gives it) and that slice's own route. Empty otherwise.
    problem : str or None
        For kind ``"error"``: what blocked the route, as a fact ("dtype",
        "copy-forbidden", "no-device"...), a key for programs; ``error`` and
        ``reason`` say it in words.
    facts : dict
        What the words of this route rest on (the option that blocked it, the
        reasons for a copy, JAX's own reason for a dtype...).
    key_path : str
        The pytree key path of the leaf this route is for, in a batch's plan
        (``['inputs']['pixels']``); empty for a single tensor.

    Notes
    -----
    A Route pickles (to log a plan from a loader's worker process): kind, action,
    header, needs, bytes, key path, reason, warning and error travel as they are;
    ``jax_device`` and each shard's device are found again by platform and id in
    the process that unpickles it (None where it has no such device); of ``facts``
    only numbers, text and containers of them travel.
    """

    cdef readonly str kind, action, target
    cdef readonly object info, jax_device, import_device, import_copy, problem, facts, copy_bytes
    cdef readonly int import_type
    cdef uint32_t _needs
    cdef public str key_path
    cdef object _shards, _error, _reason
    cdef object _out   # a copy's memory, allocated before anything is taken (_prepare)

    def __init__(self, str kind, str action, info, str target, needs=0, *, copy_bytes=0,
                 jax_device=None, import_device=None, int import_type=kDLCPU,
                 import_copy=None, shards=(), problem=None, **facts):
        self.kind = kind
        self.action = action
        self._needs = needs
        self.info = info
        self.target = target
        self.copy_bytes = copy_bytes
        self.jax_device = jax_device
        self._shards = shards
        self.import_device = import_device   # where jaxlib imports it
        self.import_type = import_type       # dl_device_type handed to jaxlib
        self.import_copy = import_copy
        self.problem = problem
        self.facts = facts
        self.key_path = ""

    @property
    def needs(self):
        return Need(self._needs)

    @property
    def zero_copy(self):
        return self.kind == ZERO_COPY

    @property
    def shards(self):
        if self._shards is None:   # a split decided in one pass: each slice's route, worded
            self._shards = _shard_routes(self.facts)
        return self._shards

    @property
    def reason(self):
        if self._reason is None:
            self._reason = _words.reason(self)
        return self._reason

    @property
    def error(self):
        if self._error is None and self.problem is not None:
            self._error = _words.error(self)
        return self._error

    @property
    def warning(self):
        # (narrow[4]: narrow="warn"; an error route does not warn)
        narrow = self.facts.get("narrow") if self.problem is None else None
        return _words.narrowing_warning(narrow) if narrow and narrow[4] else None

    def __repr__(self):
        return f"<Route {self.kind} to {self.target}: {self.reason}>"

    def __reduce__(self):   # (see Notes: a plan a loader's worker logs travels)
        kw = dict(copy_bytes=self.copy_bytes, import_type=self.import_type,
                  jax_device=_device_ref(self.jax_device),
                  import_device=_device_ref(self.import_device),
                  shards=tuple((_device_ref(d), idx, r) for d, idx, r in self.shards),
                  **{k: v for k, v in self.facts.items() if _plain(v)})
        return (_restored_route, ((self.kind, self.action, self.info, self.target, self._needs),
                                  kw, self.key_path, self.reason, _picklable_error(self.error)))


def _plain(value):
    if value is None or isinstance(value, (int, float, str)):   # (bool is an int)
        return True
    if isinstance(value, (tuple, list, frozenset)):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and _plain(tuple(value.items()))   # (its keys and values)


def _picklable_error(error):
    try:
        _pickle.dumps(error)
    except Exception:
        return DLInspectError(str(error))
    return error


def _device_ref(device):
    return None if device is None else (device.platform, device.id)


def _found_device(ref):
    try:
        return next(d for d in _sys.modules["jax"].devices(ref[0]) if d.id == ref[1])
    except Exception:   # no ref (None), no jax imported here, no such platform or device
        return None


def _restored_route(tuple args, dict kw, str key_path, reason, error):
    """Unpickle a Route (see Route's Notes)."""
    kw["shards"] = tuple((_found_device(d), idx, r) for d, idx, r in kw["shards"])
    for name in ("jax_device", "import_device"):
        kw[name] = _found_device(kw[name])
    cdef Route route = Route(*args, **kw)
    route.key_path = key_path
    route._reason = reason
    route._error = error
    route.problem = None if error is None else "raised"
    return route


def fail(str problem, info, str target, needs=0, **facts):
    """A route of kind "error": ``problem`` and the facts its error is worded from."""
    return Route(ERROR, RAISE, info, target, needs, problem=problem, **facts)


def failed(BaseException exc, str target):
    """A route of kind "error" whose error is ``exc`` (raised by the export: no header), without
    its traceback (it would hold the caller's frame, and so the capsule, in a cycle)."""
    return fail("raised", None, target, cause=exc.with_traceback(None))


cdef Route _fits(Route route):
    if route.copy_bytes > _PHYSICAL_BYTES:
        return fail("allocation", route.info, route.target, route._needs,
                    nbytes=route.copy_bytes, total=physical_memory())
    return route


cdef bint _unpackable(TensorInfo info):
    cdef int bits = info._bits * info._lanes
    return bits and 8 % bits == 0 and info._contiguous(_C_ORDER)


# Verdicts: how the fast path executes a decision without a Route (route_jax dresses the same
# verdict in a Route's facts and words: plan says what runs); 0, the Route's executor.
cdef enum:
    _V_ROUTE = 0
    _V_VIEW = 1   # imported as it is onto the device of its memory, uncommitted
    _V_COPY = 2   # host memory copied in C onto the CPU device, uncommitted
    _V_PASS = 3   # a row-major jax.Array, returned as it is


cdef int _verdict(TensorInfo info, uint32_t n, JaxTarget tg, Options opts) except -1:
    """The verdict route_jax gives first: host memory on the CPU device, with no default
    device set, viewed as it is or copied in C (_c_copy); memory of a device JAX has, that
    needs nothing, imported there as it is; all of it uncommitted, with no device named and
    copy not True. Else _V_ROUTE: the rest of route_jax decides."""
    if opts.committed or opts.copy is True:
        return _V_ROUTE
    if info._dev_type == kDLCPU and info.device_id == 0:
        if tg.default_device is not None:
            return _V_ROUTE
        if n == 0:
            return _V_VIEW
        if opts.copy is None and _c_copy(info, n):
            return _V_COPY
        return _V_ROUTE
    key = (info._dev_type, info.device_id)
    if n == 0 and key in tg.devices and (tg.default_device is None or key not in tg.cpu_keys):
        return _V_VIEW
    return _V_ROUTE


cpdef Route route_jax(TensorInfo info, uint32_t needs, JaxTarget tg, Options opts, source):
    """The route of header ``info`` into JAX (pure); ``source``: what the caller passed. The
    verdict first (fast.pxi): what the fast path runs without a Route, dressed in the facts
    of the import it is."""
    narrow = _narrowing(info._code, info._bits, needs, tg, opts)
    host = _dev_is(info._dev_type, _DEV_HOST)
    if _verdict(info, needs, tg, opts) != _V_ROUTE:
        return _route_import(info, needs, tg, opts, narrow, host)
    opts = _default_place(info, tg, opts)
    # What rules the tensor out whatever its memory, then where it is, then how JAX takes it.
    ruled_out = _ruled_out(info, needs, "jax")
    if ruled_out is not None:
        return ruled_out
    if needs & NEED_DTYPE:
        held = info._lanes == 1 and (info._bits < 8 or not tg._dtype_ok(info._code, info._bits))
        return fail("dtype", info, "jax", needs, why=tg.dtype_problem(info._code, info._bits, held),
                    host_ok=not _needs_host(info) & NEED_DTYPE,
                    astype=_producer_row(type(source)).astype)
    if needs & NEED_EMPTY:
        return Route(ZERO_COPY, EMPTY, info, "jax", needs,
                     jax_device=opts.device or tg.device_of(info), narrow=narrow)
    if needs & NEED_DEVICE or (needs & NEED_LANES and not host):
        return _route_through_host(info, needs, "jax", opts.copy, source, opts.fallback == "raise",
                                   opts.device or tg.cpu_device, platforms=tg.platforms,
                                   lanes_only=not needs & NEED_DEVICE, narrow=narrow)
    if needs & NEED_LAYOUT and not host:
        return fail("layout-not-host", info, "jax", needs,
                    contiguous=_producer_row(type(source)).contiguous)
    if _by_numpy_put(needs, host):
        return _fits(_route_numpy_put(info, needs, tg, opts))
    return _fits(_route_import(info, needs, tg, opts, narrow, host))


cdef Route _ruled_out(TensorInfo info, uint32_t needs, str target):
    """The error of a header no target takes, whatever its dtype: a shape no array has
    (Need.SHAPE), memory that is not there (Need.UNMAPPED), vector lanes that share bytes;
    else None."""
    if needs & NEED_SHAPE:
        return fail("shape", info, target, needs)
    if needs & NEED_UNMAPPED:
        return fail("unmapped", info, target, needs)
    # Vector lanes narrower than a byte share bytes: no trailing axis can hold them (the
    # memory's structure: no dtype helps it).
    if info._lanes != 1 and info._bits % 8 != 0:
        return fail("lanes-share-bytes", info, target, needs)
    return None


cdef inline bint _by_numpy_put(uint32_t needs, bint host) noexcept:
    """A dtype JAX's import does not take, or packed host memory that must be copied (aliased):
    NumPy's view, unpacked, put by JAX (a byte copy cannot unpack it)."""
    return needs & NEED_NUMPY_PUT or (host and needs & NEED_PACKED and needs & NEED_ALIASED)


cdef Options _default_place(TensorInfo info, JaxTarget tg, Options opts):
    """``opts``; with no place named, memory a CPU device would hold goes where ``jnp.asarray``
    puts it: JAX's default device where that is not the CPU device (uncommitted)."""
    if tg.default_device is None or opts.device is not None or opts.sharding is not None:
        return opts
    key = (info._dev_type, info.device_id)
    return opts.unplaced(tg.default_device) if key not in tg.devices or key in tg.cpu_keys else opts


cdef Route _route_import(TensorInfo info, uint32_t needs, JaxTarget tg, Options opts, narrow,
                         bint host):
    """Memory JAX has a device for: imported as it is, copied first, or the copy=False error."""
    copy = opts.copy
    src, dest, into, import_type, moved = _import_devices(info, needs, tg, opts.device, host)
    if moved:   # the put copies it there, whatever its alignment or write flag (aliased
        needs &= ~(NEED_ALIGN | NEED_READ_ONLY)   # memory is copied first: the put reads later)
    blocking = needs & _C_COPY_NEEDS   # (what blocks a view: what a copy of the bytes resolves)
    facts = dict(src=src, dest=dest, align=tg.cpu_align, narrow=narrow,
                 permuted=info._contiguous(_ANY_ORDER), copy_true=copy is True)
    cdef bint stays = not blocking and dest == src   # (viewed as it is, unless copy=True)
    if copy is False and not stays:
        return fail("copy-forbidden", info, "jax", needs, **facts)
    # Layout, read-only and alignment need a copy of the bytes; narrowing and device moves
    # happen after import, but host memory is narrowed by its copy (NumPy's cast: JAX's values).
    cdef bint bytes_copy = copy or (blocking if host else blocking & ~NEED_NARROW)
    if needs & NEED_PACKED and bytes_copy:
        return fail("packed-copy", info, "jax", needs, **facts)
    cdef bint view = stays and not copy
    action = _import_action(needs, view, bytes_copy, host, moved)
    # JAX's import keeps a permuted order as the layout: a device copy makes it row-major.
    cdef bint relayout = action is IMPORT and needs & NEED_PERMUTED
    return Route(ZERO_COPY if view else COPY, action, info, "jax", needs,
                 copy_bytes=0 if view else info.nbytes, jax_device=dest, import_device=into,
                 import_type=import_type, import_copy=True if bytes_copy and not relayout else None,
                 relayout=relayout, **facts)


cdef tuple _import_devices(TensorInfo info, uint32_t needs, JaxTarget tg, device, bint host):
    """``(src, dest, into, import_type, moved)``: the JAX device that imports the memory (host
    memory bound for a CPU device: that one, which views it as it is), the one the array ends
    on (``device``), the one dlinspect puts it on (host memory bound for an accelerator,
    ``moved``: that one, one transfer), and the device type handed to jaxlib."""
    src = tg.device_of(info)   # (device memory of a device JAX lacks went through the host)
    dest = device or src
    if dest != src and host and src.platform == "cpu" and dest.platform == "cpu":
        src = dest
    moved = host and dest != src and dest.platform != "cpu"   # (pinned memory's own: imported)
    return (src, dest, dest if moved else src, kDLCPU if needs & NEED_VIA_CPU else info._dev_type,
            moved)


cdef str _import_action(uint32_t needs, bint view, bint bytes_copy, bint host, bint moved):
    """How memory JAX has a device for gets there: viewed (vector lanes through NumPy),
    copied by dlinspect (host memory), put from a view (host memory bound for an
    accelerator), or imported (a device copy by JAX's importer)."""
    if moved and not bytes_copy:
        return HOST_VIEW
    if view:
        return HOST_VIEW if needs & NEED_LANES else IMPORT
    return HOST_COPY if (bytes_copy or needs & NEED_LANES) and host else IMPORT


cdef _narrowing(int code, int bits, uint32_t needs, JaxTarget tg, Options opts):
    """``(code, bits, narrowed code, narrowed bits, warn)`` where JAX narrows; else None."""
    if not needs & NEED_NARROW:
        return None
    cdef int key = tg.narrow[code | (bits << 8)][0]   # (code | bits << 8 of the narrow dtype)
    return code, bits, key & 0xFF, key >> 8, opts.narrow == "warn"


cdef Route _route_numpy_put(TensorInfo info, uint32_t needs, JaxTarget tg, Options opts):
    """A dtype JAX holds but does not import, in host memory: a NumPy view (unpacked) put by JAX."""
    if needs & NEED_PACKED and not _unpackable(info):
        return fail("unpack", info, "jax", needs)
    refusal = (None if info.flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
               else tg.dtype_problem(info._code, info._bits))
    if opts.copy is False:
        return fail("copy-forbidden", info, "jax", needs, put=True, refusal=refusal)
    return Route(COPY, NUMPY_PUT, info, "jax", needs, copy_bytes=info.nbytes,
                 jax_device=opts.device or tg.device_of(info), refusal=refusal)


def route_numpy_copy(exc, JaxTarget tg, str target, Options opts):
    """NumPy memory DLPack cannot describe: NumPy's one copy (narrowed where JAX narrows)."""
    arr = exc.array
    facts = dict(array=arr, why=exc.why)
    if opts.copy is False:
        return fail("copy-forbidden", None, target, numpy_copy=True, **facts)
    if target == "host":
        return _fits(Route(COPY, NUMPY_COPY, None, target, copy_bytes=arr.nbytes, **facts))
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    cdef uint32_t needs = _dtype_needs(tg, code, bits, lanes, 0)
    if needs & (NEED_DTYPE | NEED_NUMPY_PUT):
        return fail("numpy-dtype", None, target, needs, dtype=(code, bits, lanes),
                    jax_why=tg.dtype_problem(code, bits), **facts)
    opts = _leaf_options(opts)   # (a single-device sharding: its device)
    sharding = opts.sharding
    device = opts.device or tg.default_device
    if sharding is not None:
        uneven = layout(sharding, arr.shape).uneven
        if uneven is not None:
            return fail("uneven", None, target, needs, sharding=sharding, uneven=uneven, **facts)
        facts["spread"] = len(sharding.device_set)
        device = None
    src = device if device and device.platform == "cpu" else tg.cpu_device
    return _fits(Route(COPY, NUMPY_COPY, None, target, needs, copy_bytes=arr.nbytes,
                       jax_device=device or src, import_device=src,
                       narrow=_narrowing(code, bits, needs, tg, opts), **facts))


def _route_through_host(TensorInfo info, uint32_t needs, str target, copy, source, bint refuse,
                        jax_device=None, **facts):
    """Memory ``target`` has no device for (JAX: or lanes in device memory): the producer's
    host copy, onto ``jax_device``, or the error (``refuse``: fallback="raise")."""
    bare = PyCapsule_CheckExact(source)
    if refuse or bare:
        return fail("no-device", info, target, needs, bare=bare, **facts)
    if copy is False:
        return fail("copy-forbidden", info, target, needs, through_host=True, **facts)
    # The producer's ``into`` where its copy is the whole conversion (no narrowing, one lane).
    into = (None if needs & (NEED_NARROW | NEED_LANES) or info.numpy_dtype is None
            else _entry_for(type(source)).into)
    return _fits(Route(HOST_FALLBACK, PRODUCER_COPY, info, target, needs,
                       copy_bytes=info.nbytes, jax_device=jax_device,
                       methods=tuple(host_methods(source)), into=into, **facts))


cpdef Route route_host(TensorInfo info, uint32_t needs, copy, source):
    """The route into NumPy (pure): what the memory's structure rules out first (any dtype)."""
    ruled_out = _ruled_out(info, needs, "host")
    if ruled_out is not None:
        return ruled_out
    if needs & NEED_PACKED and not _unpackable(info):
        return fail("unpack", info, "host", needs)
    if needs & NEED_DTYPE:
        return fail("host-dtype", info, "host", needs, astype=_producer_row(type(source)).astype)
    if needs & NEED_EMPTY:
        return Route(ZERO_COPY, EMPTY, info, "host", needs)
    if needs & NEED_DEVICE:
        return _route_through_host(info, needs, "host", copy, source, False)
    if needs & NEED_PACKED and copy is False:
        return fail("copy-forbidden", info, "host", needs)
    if needs & NEED_PACKED or copy:
        return _fits(Route(COPY, UNPACK if needs & NEED_PACKED else HOST_COPY, info, "host",
                           needs, copy_bytes=info.nbytes))
    return Route(ZERO_COPY, HOST_VIEW, info, "host", needs)


# ---- sharded: one decision per leaf ----------------------------------------

def route_sharded(TensorInfo info, uint32_t needs, JaxTarget tg, sharding, Options opts, source):
    """The route onto a multi-device ``sharding`` (pure): host memory for CPU devices split in
    place, in one pass where C views or copies every slice (``facts["parts"]``)."""
    ruled_out = _ruled_out(info, needs, "jax")
    if ruled_out is not None:
        return ruled_out
    lay = layout(sharding, info.shape)
    if lay.uneven is not None:
        return fail("uneven", info, "jax", needs, sharding=sharding, uneven=lay.uneven)
    if (lay.split and _dev_is(info._dev_type, _DEV_HOST)
            and not needs & (NEED_DTYPE | NEED_LANES | NEED_PACKED | NEED_NUMPY_PUT)):
        return _route_split(info, needs, tg, lay, opts, source)
    whole = route_jax(info, needs, tg, opts, source)   # (where it is: not JAX's default device)
    if whole.kind == ERROR:
        return whole
    nd = len(sharding.device_set)
    if opts.copy is False:
        return fail("copy-forbidden", info, "jax", needs, spread=True, local=lay.local, ndevices=nd)
    return Route(COPY, DEVICE_PUT if lay.local else PROCESS_LOCAL, info, "jax", needs,
                 copy_bytes=whole.copy_bytes + info.nbytes, whole=whole, local=lay.local,
                 ndevices=nd, narrow=whole.facts.get("narrow"))


cdef Route _route_split(TensorInfo info, uint32_t needs, JaxTarget tg, lay, Options opts, source):
    """Each slice's header and needs (a slice of an aliased tensor is aliased: ``needs``, the
    whole tensor's), then one pass where C views or copies every slice, else a route each."""
    cdef list parts = []
    cdef TensorInfo part
    cdef uint32_t n
    cdef bint share = opts.readonly == "share", aliased = needs & NEED_ALIASED
    cdef bint one_pass = opts.copy is not True
    copy_bytes = 0
    for index in lay.indices:
        part = info.sliced(index)
        n = _needs_jax(part, tg, share, aliased)
        if n & ~NEED_VIA_CPU:
            copy_bytes += part.nbytes
            one_pass = one_pass and opts.copy is None and _c_copy(part, n & ~NEED_VIA_CPU)
        parts.append((part, n))
    # One pass: every slice viewed or copied in C (its shards' routes worded only if asked).
    facts = dict(parts=parts, devices=lay.devices, indices=lay.indices, tg=tg, opts=opts,
                 source=source)
    shards = None
    if not one_pass:   # a route each
        shards = _shard_routes(facts)
        for dev, index, route in shards:
            if route.kind == ERROR:   # the caller's tensor first, then which shard and why
                return fail("shard", info, "jax", needs, shards=shards, shard=(dev, index, route))
        copy_bytes = sum(r.copy_bytes for _, _, r in shards)   # (0: every shard a view)
        facts = {}
    split = Route(ZERO_COPY if copy_bytes == 0 else COPY, SPLIT, info, "jax", needs,
                  copy_bytes=copy_bytes, shards=shards, sharding=opts.sharding,
                  narrow=_narrowing(info._code, info._bits, needs, tg, opts), **facts)
    return _fits(split) if one_pass else split   # (each shard's own route is fitted)


cdef tuple _shard_routes(dict f):
    """Each slice's route, from a split's facts: its parts, devices, indices, target, options."""
    return tuple([(dev, index, route_jax(part, n, f["tg"], f["opts"].placed(dev), f["source"]))
                  for dev, index, (part, n) in zip(f["devices"], f["indices"], f["parts"])])


# ---- jax.Array and leaves that are not tensors --------------------------------

cdef bint _array_passes(x, Options opts, JaxTarget tg) except -1:
    """The verdict of a ``jax.Array`` the fast path returns as it is: alive, row-major, with no
    device or sharding named and copy not True."""
    return (not opts.committed and opts.copy is not True and not _deleted(x)
            and _row_major_array(x, tg))


def route_jax_array(x, Options opts, JaxTarget tg):
    """A ``jax.Array``'s route: as it is (what _array_passes, the fast path's verdict, lets
    pass ends there too), ``device_put`` or a copy (into row-major first where it is not:
    ``jax.device_put`` moves it wrong); a deleted or donated one is an error route."""
    try:
        _refuse_dead_array(x)
    except ProducerError as exc:
        return failed(exc, "jax")
    try:
        nbytes = x.nbytes
    except Exception:   # typed PRNG keys on jax 0.4: "Cannot call abstract method nbytes"
        nbytes = 0
    if opts.copy is True and not opts.committed:   # (a device or sharding named: put there)
        return Route(COPY, ARRAY_COPY, None, "jax", copy_bytes=nbytes, jax_array=x)
    want = opts.device
    if opts.sharding is not None:
        want = check_sharding(opts.sharding)
        bad = layout(want, x.shape).uneven
        if bad is not None:
            return fail("uneven", None, "jax", jax_array=x, sharding=want, uneven=bad)
    cdef bint relayout = not _row_major_array(x, tg)
    facts = dict(jax_array=x, where=want, relayout=relayout, copy_true=opts.copy is True)
    if _already_there(x, want) and not relayout and opts.copy is not True:
        # where it was asked to be: as it is, committed there as jax.device_put commits
        action = PASS if want is None or getattr(x, "_committed", True) else ARRAY_PUT
        return Route(ZERO_COPY, action, None, "jax", jax_device=opts.device, **facts)
    if opts.copy is False:
        return fail("copy-forbidden", None, "jax", **facts)
    return Route(COPY, ARRAY_PUT, None, "jax", copy_bytes=nbytes, jax_device=opts.device, **facts)


cdef bint _already_there(x, want) except -1:
    """A jax.Array is where ``want`` (None, a device or a sharding that fits it) puts it."""
    if want is None:
        return True
    sharding = getattr(x, "sharding", None)   # (a tracer's, inside jax.jit: none)
    if sharding is None:
        return False
    if hasattr(want, "device_set"):
        return sharding.is_equivalent_to(want, x.ndim)
    return sharding.device_set == {want} and getattr(sharding, "memory_kind", None) in (
        None, want.default_memory().kind)


cdef bint _row_major_array(x, JaxTarget tg) except -1:
    """A jax.Array is in JAX's default (row-major) layout: every uncommitted one is."""
    return not getattr(x, "_committed", False) or tg.row_major(x)


def untouched(leaf, str target, Options opts):
    """The route of a pytree leaf that is not a tensor; None for None (JAX's empty subtree:
    no leaf, at any depth)."""
    if leaf is None:
        return None
    tp = type(leaf)
    # (an array whose dtype DLPack has no type for: that dtype, said)
    dtype = getattr(leaf, "dtype", None) if hasattr(tp, "__dlpack__") else None
    if opts.leaves == "raise":
        return fail("not-a-tensor", None, target, leaf_type=tp, leaf_dtype=dtype)
    return Route(UNTOUCHED, KEEP, None, target, leaf_type=tp, leaf_dtype=dtype)


def decide(TensorInfo info, tg, str target, Options opts, source=None, bint aliased=False):
    """The route of a header to ``target``: ``needs``, then the route (pure); ``aliased``: a
    batch leaf whose memory the batch is not proven to own."""
    if target == "host":
        return route_host(info, _needs_host(info), opts.copy, source)
    cdef uint32_t needs = _needs_jax(info, tg, opts.readonly == "share", aliased)
    sharding = opts.sharding
    if sharding is not None and not _is_plain_device(sharding):
        return route_sharded(info, needs, tg, sharding, opts, source)
    return route_jax(info, needs, tg, _leaf_options(opts), source)


cdef Options _leaf_options(Options opts):
    """``opts`` placed on the one device of a single-device sharding (as ``device=``)."""
    sharding = opts.sharding
    if sharding is not None and _is_plain_device(sharding):
        return opts.placed(next(iter(sharding.device_set)))
    return opts


cdef inline _refuser(tg, Options opts):
    """What judges a producer's device before its export: JAX's, with fallback="raise"."""
    if tg is None or opts.fallback != "raise":
        return None
    return tg.refuse_device
