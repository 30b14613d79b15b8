"""``to_jax`` and ``to_host``: carry out the route :mod:`dlinspect._plan` decides.

One decision, executed once. A tensor is exported once and its needs computed
once (in C, ``_core.to_jax_fast`` imports it right there when nothing is needed);
otherwise the same export and needs become a :class:`~dlinspect._words.Route`, and
the executor of its action carries it out: one function per action, in
:data:`EXECUTORS`. No executor calls ``to_jax`` or exports the caller's tensor
again. A failed route leaves a caller's capsule unconsumed; in a batch, every leaf
is decided before any is consumed.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import _core, _plan, _shard, _tree, _words
from ._core import DLDeviceType as D, TensorInfo, aligned_empty, numpy_dtype
from . import _jaxcaps
from ._options import DEFAULT, Options, options as _options
from ._words import Route
from ._warn import warn
from .errors import NotDescribableError, NotDLPackError, UnsupportedDeviceError

__all__ = ["to_jax", "to_host", "EXECUTORS"]

_CPU = int(D.kDLCPU)
_CONTAINERS = (dict, list, tuple)
_is_tensor = _core.is_tensor
Executor = Callable[[Route, Any, Any, Any, Options], Any]


# ---- the executors: (route, capsule, source, target, options) -> array ------------------

def _import(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """Hand the capsule to jaxlib as it is (``copy=True`` where device memory is copied)."""
    info = route.info
    stream = None if _core.is_capsule(x) else tg.stream_for(route.import_type, info.device_id)
    arr = _core.import_capsule(tg.import_fn, cap, route.import_device, stream,
                               route.import_copy, route.import_type)
    return _finish(tg, arr, route, narrowed=False)


def _host_copy_import(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """One copy of host memory into C-order, aligned memory (narrowed where JAX
    narrows), imported without a second copy."""
    info = route.info
    narrow = route.facts.get("narrow")
    host = _host_copy(cap, info, None if narrow is None else numpy_dtype(narrow[2], narrow[3]),
                      tg.copy_align)
    return _finish(tg, _import_host(tg, host, route.import_device, False), route)


def _host_view_import(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """Host memory viewed through NumPy (vector lanes as a trailing axis), imported."""
    view, _owner = _host_view(cap, route.info)
    return _finish(tg, _import_host(tg, view, route.import_device, not view.flags.writeable),
                   route)


def _empty(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """A new empty array; the capsule is taken and freed (nothing of it is used).
    ``jax.device_put`` of an empty NumPy array, not ``jnp.zeros``: that compiles a fill,
    and XLA:CPU aborts the process compiling one for float6 (jaxlib 0.12.0.1), a dtype
    ``jax.device_put`` takes."""
    info = route.info
    _core.take(cap, True, info)
    shape = info.shape + ((info.dtype.lanes,) if info.dtype.lanes != 1 else ())
    dtype = tg.jax.dtypes.canonicalize_dtype(info.numpy_dtype)
    return tg.jax.device_put(np.empty(shape, dtype), route.jax_device)


def _producer_copy(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """No JAX device for the memory: one copy by the producer into aligned host memory
    dlinspect allocates, which JAX views (where the producer table says how); else
    the producer's host copy (one copy where it is memory JAX can view, two where it
    is not), routed with its own header, which is in hand."""
    del cap   # the device capsule is not needed: its producer frees it now
    out, tried = _copy_into(route, x, tg.copy_align)
    if out is not None:
        dest = route.jax_device
        src = dest if dest.platform == "cpu" else tg.cpu_device
        arr = _import_host(tg, out, src, False)
        return arr if src == dest else tg.jax.device_put(arr, dest)
    host_cap, host_info, host = _host_from_producer(x, route.info, "jax", tried)
    # The narrowing warning is for the caller's tensor, given once the host copy is in
    # hand (a failed host copy raises its own error, not the warning).
    if route.warning is not None:
        warn(route.warning)
    quiet = Options(route.jax_device, None, None, "raise", opts.readonly, "keep", "ok")
    if host_cap is None:   # a NumPy array from the producer's own method
        return _numpy_array(host, tg, quiet)
    inner = _plan.route_jax(host_info, _core.needs(host_info, tg, opts.share_readonly), tg,
                            quiet, host_cap)
    return execute(inner, host_cap, host_cap, tg, quiet)


def _numpy_put(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """A dtype JAX holds but does not import (int4...): a NumPy array of dlinspect's
    own for ``jax.device_put`` (which keeps its input in a reference cycle until the
    next collection, measured on jax 0.10: the producer's memory is freed here)."""
    info = route.info
    host = (_unpack_subbyte(cap, info) if route.needs & _plan.Need.PACKED
            else np.array(_host_view(cap, info)[0]))
    return tg.jax.device_put(host, route.jax_device)


def _numpy_copy(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """NumPy memory DLPack cannot describe: one copy by NumPy into native, C-ordered,
    aligned memory (narrowed where JAX narrows), which JAX views."""
    narrow = route.facts.get("narrow")
    host = _native_copy(x, None if narrow is None else numpy_dtype(narrow[2], narrow[3]),
                        tg.copy_align)
    return _finish(tg, _import_host(tg, host, route.import_device, False), route)


def _split(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """Host memory bound for CPU devices: one owner for the whole tensor, each device
    imports its slice by the route already decided for it; JAX assembles the array.
    The producer's deleter runs when the last shard dies. A legacy capsule cannot say
    read-only and is imported as writable, as ``to_jax`` does."""
    info = route.info
    owner = _core.take(cap, info.read_only is True, info)
    arrays = []
    for dev, _, shard in route.shards:
        part = _core.view_capsule(owner, shard.info)
        arrays.append(EXECUTORS[shard.action](shard, part, part, tg, opts))
    return tg.assemble(info.shape, opts.sharding, [dev for dev, _, _ in route.shards], arrays)


def _spread(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """Memory JAX takes whole, then spreads over the sharding's devices."""
    whole = route.facts["whole"]
    arr = EXECUTORS[whole.action](whole, cap, x, tg, opts)
    if route.action is _plan.PROCESS_LOCAL:
        return tg.jax.make_array_from_process_local_data(opts.sharding, arr)
    return tg.jax.device_put(arr, opts.sharding)


def _array_pass(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    return x


def _array_put(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    return tg.jax.device_put(x, route.facts["where"])


def _array_copy(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    return x.copy()   # (typed PRNG key arrays too, which jnp.array refuses)


def _raise_route(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    _raise(route)


#: One executor per action of :mod:`dlinspect._plan` (JAX target).
EXECUTORS: dict[str, Executor] = {
    _plan.IMPORT: _import, _plan.HOST_COPY: _host_copy_import,
    _plan.HOST_VIEW: _host_view_import, _plan.EMPTY: _empty,
    _plan.PRODUCER_COPY: _producer_copy, _plan.NUMPY_PUT: _numpy_put,
    _plan.NUMPY_COPY: _numpy_copy, _plan.SPLIT: _split, _plan.DEVICE_PUT: _spread,
    _plan.PROCESS_LOCAL: _spread, _plan.PASS: _array_pass, _plan.ARRAY_PUT: _array_put,
    _plan.ARRAY_COPY: _array_copy, _plan.RAISE: _raise_route,
}


def execute(route: Route, cap: Any, x: Any, tg: Any, opts: Options) -> Any:
    """Carry out ``route`` (its narrowing warning first, before anything is consumed:
    ``-W error`` then leaves a caller's capsule as it was)."""
    action = route.action
    if action is not _plan.PRODUCER_COPY and action is not _plan.RAISE:
        text = route.warning
        if text is not None:
            warn(text)
    return EXECUTORS[action](route, cap, x, tg, opts)


def _finish(tg: Any, arr: Any, route: Route, narrowed: bool = True) -> Any:
    if not narrowed and route.needs & _plan.Need.NARROW:
        canon = tg.jax.dtypes.canonicalize_dtype(arr.dtype)   # device memory: JAX narrows
        arr = tg.jnp.asarray(arr, dtype=canon)
    if route.jax_device is not None and route.jax_device != route.import_device:
        arr = tg.jax.device_put(arr, route.jax_device)
    return arr


def _import_host(tg: Any, arr: np.ndarray, device: Any, read_only: bool) -> Any:
    """Import host array ``arr`` onto ``device``, viewing it where JAX can."""
    return _core.import_capsule(tg.import_fn, _core.capsule_of(arr, read_only), device, None,
                                None, _CPU)


def _numpy_array(arr: np.ndarray, tg: Any, opts: Options) -> Any:
    """A NumPy array dlinspect holds (a producer's host copy) into JAX: its own route."""
    try:
        cap = _core.numpy_capsule(arr)
    except NotDescribableError as exc:   # DLPack cannot describe it: NumPy copies it
        return execute(_plan.route_numpy_copy(exc, tg, "jax", opts), None, arr, tg, opts)
    info = _core.peek(cap)
    route = _plan.route_jax(info, _core.needs(info, tg, opts.share_readonly), tg, opts, cap)
    return execute(route, cap, cap, tg, opts)


def _copy_into(route: Route, x: Any, align: int) -> tuple[Any, list[str]]:
    """The producer's copy into aligned host memory dlinspect allocates (``into`` of the
    producer table): ``(array, [])``, or ``(None, what was tried)``."""
    into = route.facts.get("into")
    if into is None:
        return None, []
    info = route.info
    out = _allocate(info.shape, info.numpy_dtype, align, info)
    failure = _core.export_host_copy_into(x, out)
    return (out, []) if failure is None else (None, [failure])


def _host_from_producer(x: Any, info: TensorInfo, target: str,
                        tried: list[str] | None = None) -> tuple[Any, Any, Any]:
    """A host copy of x's values: ``(capsule, its TensorInfo, None)`` from the producer's
    ``__dlpack__``, else ``(None, None, ndarray)`` from its own method or the array
    protocol; or UnsupportedDeviceError listing what was tried (after ``tried``)."""
    got, host_info = _core.export_host_copy(x)
    if isinstance(host_info, TensorInfo):
        return got, host_info, None
    if got is not None:
        return None, None, got
    assert host_info is not None   # what was tried, in words
    raise UnsupportedDeviceError(
        f"{_words.describe(info)} could not be brought to host memory. Tried: "
        f"{'; '.join((tried or []) + host_info)}. To fix: "
        f"{_words.device_fix(int(info.device_type), target, False)}.")


def _raise(route: Route) -> None:
    """Raise ``route.error`` without a reference cycle (error -> traceback -> the
    caller's frame -> route -> error) that would keep the capsule, and the
    producer's memory, alive until the next garbage collection."""
    error = route.error
    route._error, route.problem = None, None
    try:
        raise error  # type: ignore[misc]
    finally:
        del error


# ---- host memory -----------------------------------------------------------

def _host_view(cap: Any, info: TensorInfo, read_only: bool | None = None) -> tuple[np.ndarray, Any]:
    """Consume ``cap`` into a NumPy view of its memory (and the owner that frees it).

    Vector lanes become a trailing axis. ``read_only`` None: a legacy capsule,
    which cannot say, gives a read-only view, as NumPy does.
    """
    if read_only is None:
        read_only = info.read_only is not False
    owner = _core.take(cap, read_only, info)
    dtype = info.numpy_dtype
    assert dtype is not None  # routes reaching here were decided with a NumPy dtype
    return np.asarray(owner).view(dtype), owner


def _host_copy(cap: Any, info: TensorInfo, dtype: np.dtype | None = None,
               alignment: int = 64) -> np.ndarray:
    """One copy of host memory into a fresh C-order, ``alignment``-byte aligned array;
    frees the source. ``dtype``: cast to it on the way (JAX's x64 narrowing). The
    copy is allocated before ``cap`` is consumed (AllocationError leaves it as it was)."""
    lanes = (info.dtype.lanes,) if info.dtype.lanes != 1 else ()
    out = _allocate(info.shape + lanes, info.numpy_dtype if dtype is None else dtype,
                    alignment, info)
    view, owner = _host_view(cap, info)
    _copy_values(out, view)
    del view, owner  # the producer's deleter runs here, right after the copy
    return out


def _native_copy(arr: np.ndarray, dtype: np.dtype | None = None,
                 alignment: int = 64) -> np.ndarray:
    """NumPy memory DLPack cannot describe (byte order, byte strides), copied by NumPy
    into native byte order, C order, ``alignment``-byte aligned (``dtype``: cast on the
    way, for JAX's x64 narrowing)."""
    out = _allocate(arr.shape, arr.dtype.newbyteorder("=") if dtype is None else dtype,
                    alignment, None)
    _copy_values(out, arr)
    return out


def _copy_values(out: np.ndarray, src: np.ndarray) -> None:
    # NumPy's cast: swaps bytes, gathers strides; float64 -> float32 overflow is inf
    # and integers wrap, as in JAX's narrowing.
    if out.dtype == src.dtype:
        np.copyto(out, src)
        return
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, src, casting="unsafe")


def _allocate(shape: tuple[int, ...], dtype: Any, alignment: int,
              info: TensorInfo | None) -> np.ndarray:
    """``aligned_empty``, with a failed allocation as AllocationError naming the bytes."""
    try:
        return aligned_empty(shape, dtype, alignment)
    except MemoryError:
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        what = _words.describe(info) if info is not None else (
            f"a {np.dtype(dtype).name} NumPy array of shape {shape}")
        raise _words.allocation_error(nbytes, what, _plan.physical_memory()) from None


def _unpack_subbyte(cap: Any, info: TensorInfo) -> np.ndarray:
    """Copy a packed sub-byte tensor (int4, float4...) into one element per byte."""
    owner = _core.take(cap, True, info)
    try:
        bits = info.dtype.bits
        raw = np.asarray(_core.ByteView(owner, info.nbytes))
        shifts = np.arange(8 // bits, dtype=np.uint8) * bits
        # Element i sits at bits [i*bits, (i+1)*bits) of the little-endian bit stream.
        vals = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[: info.size]
        if info.dtype.code == 0:  # kDLInt: sign-extend, then convert by value
            half = 1 << (bits - 1)
            return ((vals.astype(np.int8) ^ half) - half).astype(info.numpy_dtype).reshape(info.shape)
        if info.dtype.code == 1:  # kDLUInt: convert by value
            return vals.astype(info.numpy_dtype).reshape(info.shape)
        # Floating sub-byte types: ml_dtypes keeps the bit pattern in the low bits of a byte.
        dtype = info.numpy_dtype
        assert dtype is not None   # a route with a NumPy dtype leads here
        return vals.view(dtype).reshape(info.shape).copy()
    finally:
        del owner


# ---- deciding, before anything is consumed ---------------------------------------

def _decide(x: Any, tg: Any, opts: Options) -> tuple[Route, Any]:
    """One tensor's route into JAX and its (unconsumed) export."""
    if isinstance(x, tg.jax.Array):
        return _plan.route_jax_array(x, opts), None
    try:
        cap, info = _core.export(x, tg.stream_for)
    except NotDescribableError as exc:
        return _plan.route_numpy_copy(exc, tg, "jax", opts), None
    return _plan.decide(info, tg, "jax", opts, x), cap


def _route_pending(x: Any, cap: Any, info: Any, needs: int, tg: Any, opts: Options) -> Route:
    """The route of an export the fast path did not finish (``info`` is the
    NotDescribableError where NumPy memory has no header)."""
    if cap is None:
        return _plan.route_numpy_copy(info, tg, "jax", opts)
    return _plan.route_jax(info, needs, tg, opts, x)


# ---- the public functions ----------------------------------------------------

def to_jax(x: Any, device: Any = None, copy: bool | None = None, *, sharding: Any = None,
           fallback: str = "host", readonly: str = "copy", leaves: str = "keep",
           narrow: str = "warn") -> Any:
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
        ``numpy.asarray``; ``"raise"`` raises ``UnsupportedDeviceError``.
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
    handed to JAX through a zero-copy legacy adapter. On every route the
    producer's deleter runs exactly once: when the jax.Array dies for
    zero-copy, right after the copy otherwise. A route that fails leaves a
    caller's capsule unconsumed. ``plan(x)`` with the same options says what
    this does.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_jax({"x": np.arange(4, dtype=np.float32)})["x"].sum().item()
    6.0
    """

    tg = _jaxcaps.TARGET
    if tg is None:
        tg = _jaxcaps.target()
    if (device is None and copy is None and sharding is None and fallback == "host"
            and readonly == "copy" and leaves == "keep" and narrow == "warn"
            and type(x) not in _CONTAINERS):
        # The fast path: one call into the core for one tensor, no option to read.
        try:
            got = _to_jax_fast(x, tg, True, False, True)
        except (NotDescribableError, NotDLPackError):
            return _to_jax(x, tg, DEFAULT)
        if type(got) is not tuple:
            return got
        return _to_jax(x, tg, DEFAULT, got)
    return _to_jax(x, tg, _options(device, copy, sharding, fallback, readonly, leaves, narrow))


_to_jax_fast = _core.to_jax_fast


def _to_jax(x: Any, tg: Any, opts: Options, got: Any = None) -> Any:
    """``to_jax`` past its fast path (``got``: what the fast path left to finish)."""
    if got is None and opts.sharding is None and opts.device is None \
            and opts.copy is not True and type(x) not in _CONTAINERS:
        try:
            got = _to_jax_fast(x, tg, opts.copy is None, opts.share_readonly,
                               opts.warn_narrowing)
        except NotDescribableError as exc:
            got = (None, exc, 0)
        except NotDLPackError:
            if _is_tensor(x):
                raise
            return _tree_to_jax(x, tg, opts)
        if type(got) is not tuple:
            return got
    if got is not None:
        route = _route_pending(x, got[0], got[1], got[2], tg, opts)
        return execute(route, got[0], x, tg, opts)
    if opts.sharding is not None:
        return _to_jax_sharded(x, tg, opts)
    return _tree_to_jax(x, tg, opts)


def _tree_to_jax(x: Any, tg: Any, opts: Options) -> Any:
    """Every leaf of a batch (walked once by :mod:`dlinspect._tree`), decided before
    any is consumed: a leaf whose route fails leaves the others (bare capsules too)
    as they were. The fast path over all leaves in one call into the core; the
    general route for the rest; errors name the leaf's key path."""
    flat = _tree.flatten(x)
    leaves = flat.leaves
    i = -1
    try:
        if opts.leaves == "raise":
            for i, leaf in enumerate(leaves):
                if not _is_tensor(leaf):
                    raise _plan.untouched(leaf, "jax", opts).error   # type: ignore[misc]
        decided = []
        if opts.device is None and opts.copy is not True:
            out, pending = _core.to_jax_many(leaves, tg, opts.copy is None,
                                             opts.share_readonly, opts.warn_narrowing)
            for i, cap, info, needs, fast in pending:
                route = None if fast else _route_pending(leaves[i], cap, info, needs, tg, opts)
                if route is not None and route.problem is not None:
                    _raise(route)
                decided.append((i, route, cap, info, needs))
        else:
            out = list(leaves)
            for i, leaf in enumerate(leaves):
                if _is_tensor(leaf):
                    route, cap = _decide(leaf, tg, opts)
                    if route.problem is not None:
                        _raise(route)
                    decided.append((i, route, cap, None, 0))
        # The general routes first (a copy may still fail for want of memory), then the
        # leaves the fast path takes as they are.
        for i, route, cap, info, needs in sorted(decided, key=lambda d: d[1] is None):
            out[i] = (_core.import_fast(cap, info, needs, tg, opts.warn_narrowing,
                                        _core.is_capsule(leaves[i]))
                      if route is None else execute(route, cap, leaves[i], tg, opts))
    except Exception as exc:
        index = getattr(exc, "_dlinspect_leaf", i)
        if index >= 0:
            _words.name_leaf(exc, flat.keystr(index))
        raise
    return flat.unflatten(out)


def _to_jax_sharded(x: Any, tg: Any, opts: Options) -> Any:
    """Each leaf onto its sharding, decided once per leaf before any leaf is consumed:
    host memory split in place, every slice viewed by its device, where each slice
    needs nothing (the one decision, made in C for the slices); else its route."""
    tree_util = tg.jax.tree_util
    Sharding = tg.jax.sharding.Sharding
    sharding = opts.sharding

    def subtree(prefix: tuple[Any, ...], s: Any, sub: Any) -> Any:
        leaf_opts = Options(None, opts.copy, s, opts.fallback, opts.readonly, opts.leaves,
                            opts.narrow)
        split = s is not None and not _shard.plain_device(_plan.check_sharding(s))
        if s is not None and not split:
            leaf_opts = opts.with_device(next(iter(s.device_set)))
        flat = _tree.flatten(sub)
        leaves = flat.leaves
        decided: list[Any] = []
        i = -1
        try:
            for i, leaf in enumerate(leaves):
                if not _is_tensor(leaf):
                    if opts.leaves == "raise":
                        raise _plan.untouched(leaf, "jax", opts).error   # type: ignore[misc]
                    continue
                item = _decide_split(leaf, tg, s, leaf_opts) if split else None
                if item is None:
                    whole, cap = _decide(leaf, tg, leaf_opts)
                    if whole.problem is not None:
                        _raise(whole)
                    item = (whole, cap, None, None)
                decided.append((i, *item))
            out = list(leaves)
            for i, route, cap, info, parts in decided:
                if route is None:   # every slice viewed, or small ones copied in C
                    lay = _shard.layout(s, info.shape)
                    arrays = _core.split_import(cap, info, parts, lay.devices, tg,
                                                leaf_opts.warn_narrowing)
                    out[i] = tg.assemble(info.shape, s, lay.devices, arrays)
                else:
                    out[i] = execute(route, cap, leaves[i], tg, leaf_opts)
        except Exception as exc:
            if i >= 0:
                _words.name_leaf(exc, tree_util.keystr(prefix) + flat.keystr(i))
            raise
        return flat.unflatten(out)

    if isinstance(sharding, Sharding):
        return subtree((), sharding, x)
    # A pytree of shardings, a prefix of x's structure (as jax.device_put takes).
    is_leaf = lambda s: s is None or isinstance(s, Sharding)  # noqa: E731
    try:
        tree_util.tree_map(lambda s, sub: None, sharding, x, is_leaf=is_leaf)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"sharding= must be a jax.sharding.Sharding or a pytree of them whose structure is "
            f"a prefix of the batch's: {str(exc).splitlines()[0]}") from None
    return tree_util.tree_map_with_path(subtree, sharding, x, is_leaf=is_leaf)


def _decide_split(leaf: Any, tg: Any, s: Any, opts: Options) -> Any:
    """``(None, capsule, TensorInfo, slices)`` when host memory splits over ``s`` with
    every slice viewed as it is or, with ``copy=None``, small slices copied in C
    (``_core.split_parts``); else ``(route, capsule, None,
    None)`` from the general decision; None for a leaf the general path takes whole."""
    if isinstance(leaf, tg.jax.Array):
        return None
    try:
        cap, info = _core.export(leaf, tg.stream_for)
    except NotDescribableError as exc:
        # NumPy's one copy (native, C-ordered, aligned) first; then that copy is split.
        route = _plan.route_numpy_copy(exc, tg, "jax", opts)
        if route.problem is not None:
            _raise(route)
        return None if opts.copy is False else _decide_split(
            _native_copy(leaf, None, tg.copy_align), tg, s, opts)
    lay = _shard.layout(s, info.shape)
    if lay.split and opts.copy is not True:
        parts = _core.split_parts(info, tg, lay.indices, opts.share_readonly,
                                  opts.copy is None)
        if parts is not None:
            return (None, cap, info, parts)
    route = _plan.decide(info, tg, "jax", opts, leaf)
    if route.problem is not None:
        _raise(route)
    return (route, cap, None, None)


# ---- host ------------------------------------------------------------------

def to_host(x: Any, copy: bool | None = None) -> np.ndarray:
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

    opts = _options(copy=copy)
    try:
        cap, info = _core.export(x)
    except NotDescribableError as exc:
        route = _plan.route_numpy_copy(exc, None, "host", opts)
        if route.problem is not None:
            _raise(route)
        return _native_copy(x)
    route = _plan.route_host(info, _core.needs(info), copy, x)
    return HOST_EXECUTORS[route.action](route, cap, x)


def _host_raise(route: Route, cap: Any, x: Any) -> np.ndarray:
    _raise(route)
    raise AssertionError   # (unreachable)


def _host_producer_copy(route: Route, cap: Any, x: Any) -> np.ndarray:
    del cap
    out, tried = _copy_into(route, x, 64)
    if out is not None:
        return out
    host_cap, host_info, host = _host_from_producer(x, route.info, "host", tried)
    if host_cap is None:
        return host
    inner = _plan.route_host(host_info, _core.needs(host_info), None, host_cap)
    return HOST_EXECUTORS[inner.action](inner, host_cap, host_cap)


def _host_empty(route: Route, cap: Any, x: Any) -> np.ndarray:
    info = route.info
    _core.take(cap, True, info)
    lanes = (info.dtype.lanes,) if info.dtype.lanes != 1 else ()
    return np.empty(info.shape + lanes, info.numpy_dtype)


#: One executor per action of a host route.
HOST_EXECUTORS: dict[str, Callable[[Route, Any, Any], np.ndarray]] = {
    _plan.RAISE: _host_raise, _plan.PRODUCER_COPY: _host_producer_copy,
    _plan.EMPTY: _host_empty,
    _plan.UNPACK: lambda route, cap, x: _unpack_subbyte(cap, route.info),
    _plan.HOST_COPY: lambda route, cap, x: _host_copy(cap, route.info),
    _plan.HOST_VIEW: lambda route, cap, x: _host_view(cap, route.info)[0],
}
