"""``to_jax`` and ``to_host``: carry out the route :mod:`dlinspect._plan` decides.

One tensor: ``_core.to_jax_fast`` exports it once, computes its needs and
imports it when nothing is needed; otherwise the same export and the same needs
become a :class:`~dlinspect._plan.Route` (``route_jax``), and the route is
executed here. A failed route leaves a caller's capsule unconsumed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core, _plan, _shard, _tree
from ._buffers import aligned_empty
from ._core import TensorInfo
from ._dtypes import dldtype_from_numpy, numpy_dtype
from ._enums import DLDeviceType as D
from ._jaxcaps import JaxCaps, caps
from ._messages import describe, device_fix
from ._plan import Route
from ._warn import warn
from .errors import NotDescribableError, NotDLPackError, UnsupportedDeviceError

__all__ = ["to_jax", "to_host"]

_CPU = int(D.kDLCPU)
_caps: JaxCaps | None = None


def _jax_caps() -> JaxCaps:
    global _caps
    if _caps is None:
        _caps = caps()
    return _caps


_is_tensor = _core.is_tensor
_CONTAINERS = (dict, list, tuple)


# ---- one tensor into JAX ---------------------------------------------------------

def _one_to_jax(x: Any, device: Any, copy: bool | None, fallback: str, readonly: str,
                quiet: bool = False) -> Any:
    c = _caps if _caps is not None else _jax_caps()
    tg = c._target if c._target is not None else c.target
    if device is None and copy is not True and not quiet:   # (the fast path warns itself)
        try:
            got = _core.to_jax_fast(x, tg, copy is None, readonly == "share")
        except NotDescribableError as exc:
            got = (None, exc, 0)
        if type(got) is not tuple:
            return got
        route = _route_pending(c, x, got[0], got[1], got[2], None, copy, fallback, readonly)
        return _execute_jax(c, route, got[0], x, fallback, readonly, quiet)
    route, cap = _decide(c, x, device, copy, fallback, readonly)
    return _execute_jax(c, route, cap, x, fallback, readonly, quiet)


def _decide(c: JaxCaps, x: Any, device: Any, copy: bool | None, fallback: str,
            readonly: str) -> tuple[Route, Any]:
    """One tensor's route into JAX and its (unconsumed) export: nothing is consumed yet."""
    if isinstance(x, c.jax.Array):
        return _plan.route_jax_array(x, device, copy), None
    try:
        cap, info = _core.export(x, c.stream_for)
    except NotDescribableError as exc:
        return _plan.route_numpy_copy(exc, c, "jax", device, copy), None
    needs = _core.needs(info, c.target, readonly == "share")
    return _plan.route_jax(info, needs, c, device, copy, fallback, readonly, x), cap


def _route_pending(c: JaxCaps, x: Any, cap: Any, info: Any, needs: int, device: Any,
                   copy: bool | None, fallback: str, readonly: str) -> Route:
    """The route of an export the fast path did not finish (``info`` is the
    NotDescribableError where NumPy memory has no header)."""
    if cap is None:
        return _plan.route_numpy_copy(info, c, "jax", device, copy)
    return _plan.route_jax(info, needs, c, device, copy, fallback, readonly, x)


def _execute_array(c: JaxCaps, route: Route, x: Any, sharding: Any = None) -> Any:
    """A jax.Array's route: as it is, device_put, or a copy."""
    if route.action is _plan.RAISE:
        _raise(route)
    if route.action is _plan.PASS:
        return x
    if route.action is _plan.DEVICE_PUT:
        return c.jax.device_put(x, sharding if sharding is not None else route.jax_device)
    return x.copy()   # (typed PRNG key arrays too, which jnp.array refuses)


def _execute_jax(c: JaxCaps, route: Route, cap: Any, x: Any, fallback: str, readonly: str,
                 quiet: bool = False) -> Any:
    action = route.action
    if action is _plan.RAISE:
        _raise(route)
    if isinstance(x, c.jax.Array):
        return _execute_array(c, route, x)
    info: TensorInfo = route.info  # type: ignore[assignment]
    if route.warning is not None and not quiet and action is not _plan.PRODUCER_COPY:
        # Before anything is consumed: a warning turned into an error (-W error)
        # leaves a caller's capsule as it was, like any failed route.
        warn(route.warning)
    if action is _plan.NUMPY_COPY:
        narrow = None
        if route.warning is not None:
            code, bits, _ = dldtype_from_numpy(x.dtype)
            ncode, nbits, _ = c.target.narrowing(code, bits)
            narrow = numpy_dtype(ncode, nbits)
        host = _native_copy(x, narrow, c.target.copy_align)
        return _finish(c, _import_host(c, host, route.import_device, False), route, narrowed=True)
    if action is _plan.NUMPY_PUT:
        # A NumPy array of our own for jax.device_put, which keeps its input in a reference
        # cycle until the next garbage collection (measured on jax 0.10): the producer's
        # memory is freed here, right after the copy, not then.
        host = (_unpack_subbyte(cap, info) if route.needs & _plan.Need.PACKED
                else np.array(_host_view(cap, info)[0]))
        return c.jax.device_put(host, route.jax_device)
    if action is _plan.IMPORT:
        stream = None if _core.is_capsule(x) else c.stream_for(route.import_type, info.device_id)
        arr = _core.import_capsule(c.import_fn, cap, route.import_device, stream,
                                   route.import_copy, route.import_type)
        return _finish(c, arr, route)
    if action is _plan.HOST_COPY:
        narrow = None
        if route.warning is not None:
            code, bits, _ = info.dtype
            ncode, nbits, _ = c.target.narrowing(code, bits)
            narrow = numpy_dtype(ncode, nbits)
        host = _host_copy(cap, info, narrow, c.target.copy_align)
        return _finish(c, _import_host(c, host, route.import_device, False), route,
                       narrowed=True)
    if action is _plan.HOST_VIEW:
        view, _owner = _host_view(cap, info)
        return _finish(c, _import_host(c, view, route.import_device, not view.flags.writeable),
                       route)
    if action is _plan.EMPTY:
        _core.take(cap, True)   # taken and freed: nothing of it is used
        shape = info.shape + ((info.dtype.lanes,) if info.dtype.lanes != 1 else ())
        dtype = c.jax.dtypes.canonicalize_dtype(info.numpy_dtype)
        return c.jnp.zeros(shape, dtype, device=route.jax_device)
    # PRODUCER_COPY: no JAX device for the memory; go through host memory. Its route's
    # narrowing warning is for the tensor the caller passed, given once the host copy
    # is in hand (a failed host copy raises its own error, not the warning).
    del cap  # the device capsule is not needed: its producer frees it now
    host = _host_from_producer(x, info, "jax")
    if route.warning is not None and not quiet:
        warn(route.warning)
    return _one_to_jax(host, route.jax_device, None, fallback, readonly, quiet=True)


def _finish(c: JaxCaps, arr: Any, route: Route, narrowed: bool = False) -> Any:
    if route.warning is not None and not narrowed:
        arr = c.canonicalize(arr)   # device memory narrowed after import, as JAX does
    if route.jax_device is not None and route.jax_device != route.import_device:
        arr = c.jax.device_put(arr, route.jax_device)
    return arr


def _import_host(c: JaxCaps, arr: np.ndarray, device: Any, read_only: bool) -> Any:
    """Import host array ``arr`` onto ``device``, viewing it where JAX can."""
    return _core.import_capsule(c.import_fn, _core.capsule_of(arr, read_only), device, None,
                                None, _CPU)


def _host_from_producer(x: Any, info: TensorInfo, target: str) -> Any:
    """A host tensor with x's values: the producer's host copy, else numpy.asarray(x)."""
    got, host_info = _core.export_host_copy(x)
    if got is not None:
        return got
    raise UnsupportedDeviceError(
        f"{describe(info)} could not be brought to host memory. Tried: {'; '.join(host_info)}. "
        f"To fix: {device_fix(int(info.device_type), target, False)}.")


def _raise(route: Route) -> None:
    """Raise ``route.error`` without a reference cycle (error -> traceback -> the
    caller's frame -> route -> error) that would keep the capsule, and the
    producer's memory, alive until the next garbage collection."""
    error = route.error
    route.error = None
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
    owner = _core.take(cap, read_only)
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
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(out, src, casting="unsafe")


def _allocate(shape: tuple[int, ...], dtype: Any, alignment: int,
              info: TensorInfo | None) -> np.ndarray:
    """``aligned_empty``, with a failed allocation as AllocationError naming the bytes."""
    try:
        return aligned_empty(shape, dtype, alignment)
    except MemoryError:
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        what = describe(info) if info is not None else (
            f"a {np.dtype(dtype).name} NumPy array of shape {shape}")
        raise _plan.allocation_error(nbytes, what) from None


def _unpack_subbyte(cap: Any, info: TensorInfo) -> np.ndarray:
    """Copy a packed sub-byte tensor (int4, float4...) into one element per byte."""
    owner = _core.take(cap, True)
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


# ---- the public functions ----------------------------------------------------

def to_jax(x: Any, device: Any = None, copy: bool | None = None, *, sharding: Any = None,
           fallback: str = "host", readonly: str = "copy", leaves: str = "keep") -> Any:
    """Move a DLPack tensor, or a pytree of them, into JAX: zero-copy where possible.

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, or pytree of them
        A tensor from any producer (NumPy, PyTorch, CuPy, JAX...), a bare capsule
        (``"dltensor"`` or ``"dltensor_versioned"``), or a dict / list / tuple /
        namedtuple of them (walked with ``jax.tree_util``).
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
    if (fallback != "host" or readonly != "copy" or leaves != "keep"
            or (copy is not None and copy is not True and copy is not False)):
        _plan.check_options("jax", fallback, readonly, copy, leaves)
    if sharding is not None:
        return _to_jax_sharded(x, device, sharding, copy, fallback, readonly, leaves)
    if device is None and copy is not True and type(x) not in _CONTAINERS:
        # The fast path, inlined from _one_to_jax: one Python frame less per call.
        c = _caps if _caps is not None else _jax_caps()
        tg = c._target if c._target is not None else c.target
        try:
            got = _core.to_jax_fast(x, tg, copy is None, readonly == "share")
        except NotDescribableError as exc:
            got = (None, exc, 0)
        except NotDLPackError:
            if _is_tensor(x):
                raise
            return _tree_to_jax(x, None, copy, fallback, readonly, leaves)
        if type(got) is not tuple:
            return got
        route = _route_pending(c, x, got[0], got[1], got[2], None, copy, fallback, readonly)
        return _execute_jax(c, route, got[0], x, fallback, readonly)
    return _tree_to_jax(x, _plan.single_device(device), copy, fallback, readonly, leaves)


def _tree_to_jax(x: Any, device: Any, copy: bool | None, fallback: str, readonly: str,
                 leaves: str) -> Any:
    """Every leaf of a batch (walked once by :mod:`dlinspect._tree`): the fast path over
    all leaves in one call into the core, the general route for the rest; errors name
    the leaf's key path. A leaf that is not a tensor is kept (``leaves="keep"``), the
    whole of ``x`` included when it is one."""
    flat = _tree.flatten(x)
    leaves_in = flat.leaves
    c = _caps if _caps is not None else _jax_caps()
    tg = c._target if c._target is not None else c.target
    i = -1
    try:
        if leaves == "raise":
            for i, leaf in enumerate(leaves_in):
                if not _is_tensor(leaf):
                    raise _plan.not_a_tensor(leaf)
        # Every leaf is decided before any is consumed: a leaf whose route fails leaves
        # the others (bare capsules included) as they were.
        decided = []
        if device is None and copy is not True:
            out, pending = _core.to_jax_many(leaves_in, tg, copy is None, readonly == "share")
            for i, cap, info, needs, fast in pending:
                route = None if fast else _route_pending(c, leaves_in[i], cap, info, needs,
                                                         None, copy, fallback, readonly)
                if route is not None and route.action is _plan.RAISE:
                    _raise(route)
                decided.append((i, route, cap, info, needs))
        else:
            out = list(leaves_in)
            for i, leaf in enumerate(leaves_in):
                if _is_tensor(leaf):
                    route, cap = _decide(c, leaf, device, copy, fallback, readonly)
                    if route.action is _plan.RAISE:
                        _raise(route)
                    decided.append((i, route, cap, None, 0))
        # The general routes first (a copy may still fail for want of memory), then the
        # leaves the fast path takes as they are.
        for i, route, cap, info, needs in sorted(decided, key=lambda d: d[1] is None):
            out[i] = (_core.import_fast(cap, info, needs, tg) if route is None else
                      _execute_jax(c, route, cap, leaves_in[i], fallback, readonly))
    except Exception as exc:
        index = getattr(exc, "_dlinspect_leaf", i)
        if index >= 0:
            _plan.name_leaf(exc, flat.keystr(index))
        raise
    return flat.unflatten(out)


# ---- sharded -----------------------------------------------------------------

def _to_jax_sharded(x: Any, device: Any, sharding: Any, copy: bool | None, fallback: str,
                    readonly: str, leaves: str) -> Any:
    if device is not None:
        raise ValueError("to_jax takes device= or sharding=, not both; pass one of them.")
    from jax import tree_util
    from jax.sharding import Sharding

    def one(leaf: Any, s: Any) -> Any:
        if not _is_tensor(leaf):
            if leaves == "raise":
                raise _plan.not_a_tensor(leaf)
            return leaf
        if s is None:  # default placement, as in jax.device_put
            return _one_to_jax(leaf, None, copy, fallback, readonly)
        if _shard.plain_device(_plan.check_sharding(s)):
            return _one_to_jax(leaf, _plan.single_device(s), copy, fallback, readonly)
        return _one_sharded(leaf, s, copy, fallback, readonly)

    def subtree(prefix: tuple[Any, ...], s: Any, sub: Any) -> Any:
        flat = _tree.flatten(sub)
        out = []
        for i, leaf in enumerate(flat.leaves):
            try:
                out.append(one(leaf, s))
            except Exception as exc:
                _plan.name_leaf(exc, tree_util.keystr(prefix) + flat.keystr(i))
                raise
        return flat.unflatten(out)

    if sharding is None or isinstance(sharding, Sharding):
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


def _one_sharded(x: Any, sharding: Any, copy: bool | None, fallback: str, readonly: str) -> Any:
    """One tensor onto a multi-device ``sharding`` (see ``_plan.route_sharded``)."""
    c = _jax_caps()
    if isinstance(x, c.jax.Array):
        return _execute_array(c, _plan.route_jax_array(x, None, copy, sharding), x, sharding)
    try:
        cap, info = _core.export(x, c.stream_for)
    except NotDescribableError as exc:
        # NumPy's one copy (native, C-ordered, aligned), then that copy is split.
        route = _plan.route_numpy_copy(exc, c, "jax", None, copy)
        if route.action is _plan.RAISE:
            _raise(route)
        return _one_sharded(_native_copy(x, None, c.target.copy_align), sharding, None,
                            fallback, readonly)
    needs = _core.needs(info, c.target, readonly == "share")
    route = _plan.route_sharded(info, needs, c, sharding, copy, fallback, readonly,
                                x)
    action = route.action
    if action is _plan.RAISE:
        _raise(route)
    if action is _plan.SPLIT:
        # One owner for the whole tensor: the producer's deleter runs when the
        # last shard (or view) dies. A legacy capsule cannot say read-only and
        # is imported as writable, as to_jax does.
        if route.warning is not None:
            warn(route.warning)  # before consuming: -W error leaves a capsule as it was
        read_only = info.read_only is True
        view, _ = _host_view(cap, info, read_only=read_only)
        del cap
        # view[idx, ...]: an array even for a 0-d leaf (view[()] is a scalar).
        arrays = [_one_to_jax(_core.capsule_of(view[(*idx, ...)], read_only), dev, copy,
                              fallback, readonly, quiet=True)
                  for dev, idx, _ in route.shards]
        return c.jax.make_array_from_single_device_arrays(info.shape, sharding, arrays)
    whole_route = _plan.route_jax(info, needs, c, None, copy, fallback, readonly,
                                  x)
    whole = _execute_jax(c, whole_route, cap, x, fallback, readonly)
    if action is _plan.PROCESS_LOCAL:
        return c.jax.make_array_from_process_local_data(sharding, whole)
    return c.jax.device_put(whole, sharding)


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
    if copy is not None and copy is not True and copy is not False:
        _plan.check_options("host", "host", "copy", copy)
    try:
        cap, info = _core.export(x)
    except NotDescribableError as exc:
        route = _plan.route_numpy_copy(exc, None, "host", None, copy)
        if route.action is _plan.RAISE:
            _raise(route)
        return _native_copy(x)
    route = _plan.route_host(info, _core.needs(info), copy, x)
    action = route.action
    if action is _plan.RAISE:
        _raise(route)
    if action is _plan.PRODUCER_COPY:
        del cap
        host = _host_from_producer(x, info, "host")
        return host if isinstance(host, np.ndarray) else to_host(host)
    if action is _plan.EMPTY:
        _core.take(cap, True)
        lanes = (info.dtype.lanes,) if info.dtype.lanes != 1 else ()
        return np.empty(info.shape + lanes, info.numpy_dtype)
    if action is _plan.UNPACK:
        return _unpack_subbyte(cap, info)
    if action is _plan.HOST_COPY:
        return _host_copy(cap, info)
    view, _owner = _host_view(cap, info)
    return view
