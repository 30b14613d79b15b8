"""The one decision (``_core.needs``) made into a route of facts.

``route_jax`` and ``route_host`` turn a header's needs and the caller's
:class:`~dlinspect._options.Options` into a :class:`Route`: its kind, the action
that carries it out, the needs, the bytes it copies, the devices, and, for an error,
the problem and the facts it rests on. No words are written here:
:mod:`dlinspect._words` turns a route into its reason, its error and its warning.
``to_jax`` and ``to_host`` (in :mod:`dlinspect._execute`) carry out exactly the route
these functions return. Nothing here imports or copies.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from . import _core, _shard
from ._core import TensorInfo
from ._words import Route
from ._facts import (  # noqa: F401  (the actions, one executor each in _execute)
    ARRAY_COPY, ARRAY_PUT, COPY, DEVICE_PUT, EMPTY, ERROR, HOST_COPY, HOST_FALLBACK, HOST_VIEW,
    IMPORT, KEEP, NUMPY_COPY, NUMPY_PUT, PASS, PROCESS_LOCAL, PRODUCER_COPY, RAISE, SPLIT, UNPACK,
    ZERO_COPY, Need,
)
from ._core import DLDeviceType as D, dldtype_from_numpy
from ._jaxcaps import jax_module
from ._options import DEFAULT, Options
from .errors import NotDescribableError

__all__ = ["Need", "Route", "route_jax", "route_host", "route_numpy_copy", "route_sharded",
           "route_jax_array", "untouched", "decide"]

# The need bits as plain ints: an IntFlag operation costs a microsecond, and routes test
# several per tensor.
(_DEVICE, _DTYPE, _LANES, _LAYOUT, _READ_ONLY, _ALIGN, _NARROW, _PACKED, _EMPTY, _VIA_CPU,
 _NUMPY_PUT) = (int(Need[name]) for name in (
    "DEVICE", "DTYPE", "LANES", "LAYOUT", "READ_ONLY", "ALIGN", "NARROW", "PACKED", "EMPTY",
    "VIA_CPU", "NUMPY_PUT"))


def fail(problem: str, info: TensorInfo | None, target: str, needs: int = 0,
         **facts: Any) -> Route:
    """A route of kind "error": ``problem`` and the facts its error is worded from."""
    return Route(ERROR, RAISE, info, target, needs=needs, problem=problem, **facts)


def failed(exc: Exception, target: str, info: TensorInfo | None = None) -> Route:
    """A route of kind "error" whose error is ``exc`` (a producer's refusal, a header's
    fault: raised by the export, worded there), without its traceback (it would hold
    the caller's frame, and so the capsule, in a cycle until the next collection)."""
    return fail("raised", info, target, cause=exc.with_traceback(None))


@functools.lru_cache(maxsize=1)
def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _fits(route: Route) -> Route:
    """Every copy a route plans fits in physical memory, else an AllocationError route
    (one rule for every route function)."""
    total = physical_memory()
    if route.copy_bytes and total is not None and route.copy_bytes > total:
        return fail("allocation", route.info, route.target, route.needs,
                    nbytes=route.copy_bytes, total=total)
    return route


def _lanes_share_bytes(info: TensorInfo) -> bool:
    """Vector lanes narrower than a byte share bytes: no trailing axis can hold them."""
    _, bits, lanes = info.dtype
    return lanes != 1 and bits % 8 != 0


def _unpackable(info: TensorInfo) -> bool:
    bits = info.dtype.bits * info.dtype.lanes
    return bool(bits) and 8 % bits == 0 and info.is_c_contiguous


# ---- JAX -------------------------------------------------------------------

def route_jax(info: TensorInfo, needs: int, tg: Any, opts: Options, source: Any) -> Route:
    """The route of a tensor with header ``info`` and ``needs`` into JAX (pure).

    ``source``: what the caller passed (a producer; a bare capsule, which has no
    producer to ask for a host copy; or a TensorInfo).
    """
    return _fits(_route_jax(info, needs, tg, opts, source))


def _route_jax(info: TensorInfo, needs: int, tg: Any, opts: Options, source: Any) -> Route:
    t = "jax"
    dt, device, copy = int(info.device_type), opts.device, opts.copy
    if _lanes_share_bytes(info):   # the memory's structure first: no dtype helps it
        return fail("lanes-share-bytes", info, t, needs)
    if needs & _DTYPE:
        code, bits, lanes = info.dtype
        held = lanes == 1 and (bits < 8 or tg.dtype_problem(code, bits) is not None)
        return fail("dtype", info, t, needs, why=tg.dtype_problem(code, bits, held),
                    host_ok=not _core.needs(info) & _DTYPE)
    narrow = _narrowing(info, needs, tg, opts)
    host = info.host_accessible
    if needs & _EMPTY:
        dest = device or tg.device_for(dt, info.device_id) or tg.cpu_device
        return Route(ZERO_COPY, EMPTY, info, t, needs=needs, jax_device=dest, narrow=narrow)
    if needs & _DEVICE or (needs & _LANES and not host):
        return _route_through_host(info, needs, tg, opts, source, narrow)
    if needs & _LAYOUT and not host:
        return fail("layout-not-host", info, t, needs)
    if needs & _NUMPY_PUT:
        return _route_numpy_put(info, needs, tg, opts)
    via_cpu = bool(needs & _VIA_CPU)
    src = tg.cpu_device if via_cpu else tg.device_for(dt, info.device_id)
    if (device is not None and device != src and host and src.platform == "cpu"
            and getattr(device, "platform", None) == "cpu"):
        src = device   # host memory: every CPU device views it as it is
    dest = src if device is None else device
    import_type = int(D.kDLCPU) if via_cpu else dt
    blocking = needs & (_LAYOUT | _READ_ONLY | _ALIGN | _NARROW)
    facts = dict(src=src, dest=dest, align=tg.cpu_align, narrow=narrow,
                 permuted=info.is_compact)
    if copy is False and (blocking or dest != src):
        return fail("copy-forbidden", info, t, needs, **facts)
    # Layout, read-only and alignment need a copy of the bytes themselves; narrowing
    # and device moves happen after import, except that host memory is narrowed by the
    # copy itself (one pass; NumPy's cast gives JAX's values: wrap-around, IEEE rounding).
    bytes_copy = bool(needs & (_LAYOUT | _READ_ONLY | _ALIGN)
                      or (needs & _NARROW and host)) or bool(copy)
    if needs & _PACKED and bytes_copy:
        return fail("packed-copy", info, t, needs, copy_true=bool(copy), **facts)
    if not (blocking or dest != src or copy):
        action = HOST_VIEW if needs & _LANES else IMPORT
        return Route(ZERO_COPY, action, info, t, needs=needs, jax_device=dest,
                     import_type=import_type, import_device=src, **facts)
    # Host memory is copied by dlinspect (the producer's deleter runs right after);
    # device memory by JAX's importer (copy=True).
    action = HOST_COPY if (bytes_copy or needs & _LANES) and host else IMPORT
    return Route(COPY, action, info, t, needs=needs, copy_bytes=info.nbytes, jax_device=dest,
                 import_type=import_type, import_device=src,
                 import_copy=True if bytes_copy else None, copy_true=bool(copy), **facts)


def _narrowing(info: TensorInfo, needs: int, tg: Any, opts: Options) -> Any:
    """``(code, bits)`` JAX narrows the dtype to, where it does and the caller wants to
    hear of it (``narrow="warn"``); else None."""
    if not needs & _NARROW:
        return None
    code, bits, _ = info.dtype
    ncode, nbits, _ = tg.narrowing(code, bits)
    return (code, bits, ncode, nbits, opts.warn_narrowing)


def _route_numpy_put(info: TensorInfo, needs: int, tg: Any, opts: Options) -> Route:
    """A dtype JAX holds but does not import through DLPack, in host memory: a NumPy
    view (sub-byte elements unpacked into one per byte where packed), copied by
    ``jax.device_put``."""
    t = "jax"
    if needs & _PACKED and not _unpackable(info):
        return fail("unpack", info, t, needs)
    code, bits, _ = info.dtype
    padded = bool(info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED)
    refusal = None if padded else tg.dtype_problem(code, bits)
    if opts.copy is False:
        return fail("copy-forbidden", info, t, needs, put=True, refusal=refusal)
    dest = opts.device or (tg.cpu_device if needs & _VIA_CPU
                           else tg.device_for(int(info.device_type), info.device_id))
    return Route(COPY, NUMPY_PUT, info, t, needs=needs, copy_bytes=info.nbytes,
                 jax_device=dest, refusal=refusal)


def route_numpy_copy(exc: NotDescribableError, tg: Any, target: str,
                     opts: Options = DEFAULT) -> Route:
    """NumPy memory DLPack cannot describe (byte order, strides; see
    :class:`~dlinspect.NotDescribableError`): one copy by NumPy into native,
    C-ordered, aligned memory (into JAX's narrowed dtype where x64 is off), or the error."""
    arr = exc.array
    facts = dict(array=arr, why=exc.why)
    if opts.copy is False:
        return fail("copy-forbidden", None, target, numpy_copy=True, **facts)
    if target == "host":
        return _fits(Route(COPY, NUMPY_COPY, None, target, copy_bytes=arr.nbytes, **facts))
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    needs = _core.dtype_needs(code, bits, lanes, tg)
    if needs & (_DTYPE | _NUMPY_PUT):
        return fail("numpy-dtype", None, target, needs, dtype=(code, bits, lanes),
                    jax_why=tg.dtype_problem(code, bits), **facts)
    narrow = None
    if needs & _NARROW:
        ncode, nbits, _ = tg.narrowing(code, bits)
        narrow = (code, bits, ncode, nbits, opts.warn_narrowing)
    device = opts.device
    src = device if device is not None and device.platform == "cpu" else tg.cpu_device
    return _fits(Route(COPY, NUMPY_COPY, None, target, needs=needs, copy_bytes=arr.nbytes,
                       jax_device=device or src, import_device=src, narrow=narrow, **facts))


def _route_through_host(info: TensorInfo, needs: int, tg: Any, opts: Options, source: Any,
                        narrow: Any) -> Route:
    """Memory JAX has no device for (or vector lanes in device memory): the producer's
    host copy, else the array protocol; or the error that says why not."""
    t = "jax"
    facts = dict(platforms=tg.platforms, lanes_only=not needs & _DEVICE)
    bare = _core.is_capsule(source)
    if opts.fallback == "raise" or bare:
        return fail("no-device", info, t, needs, bare=bare, **facts)
    if opts.copy is False:
        return fail("copy-forbidden", info, t, needs, through_host=True, **facts)
    return Route(HOST_FALLBACK, PRODUCER_COPY, info, t, needs=needs, copy_bytes=info.nbytes,
                 jax_device=tg.cpu_device if opts.device is None else opts.device,
                 methods=tuple(_core.host_methods(source)), into=_copy_into(info, needs, source),
                 narrow=narrow, **facts)


def _copy_into(info: TensorInfo, needs: int, source: Any) -> str | None:
    """How the producer copies into aligned host memory dlinspect allocates (the one
    copy of a host fallback), where it can and the copy is the whole conversion:
    same dtype (no narrowing), one lane, a NumPy dtype to allocate; else None."""
    if needs & (_NARROW | _LANES) or info.numpy_dtype is None:
        return None
    return _core.host_into(source)


# ---- NumPy -----------------------------------------------------------------

def route_host(info: TensorInfo, needs: int, copy: bool | None, source: Any) -> Route:
    """The route of a tensor with header ``info`` and ``needs`` into NumPy (pure)."""
    return _fits(_route_host(info, needs, copy, source))


def _route_host(info: TensorInfo, needs: int, copy: bool | None, source: Any) -> Route:
    t = "host"
    # What the memory's structure rules out comes first: it holds whatever dtypes exist.
    if _lanes_share_bytes(info):
        return fail("lanes-share-bytes", info, t, needs)
    if needs & _PACKED and not _unpackable(info):
        return fail("unpack", info, t, needs)
    if needs & _DTYPE:
        return fail("host-dtype", info, t, needs)
    if needs & _EMPTY:
        return Route(ZERO_COPY, EMPTY, info, t, needs=needs)
    if needs & _DEVICE:
        if _core.is_capsule(source):
            return fail("no-device", info, t, needs, bare=True)
        if copy is False:
            return fail("copy-forbidden", info, t, needs, through_host=True)
        return Route(HOST_FALLBACK, PRODUCER_COPY, info, t, needs=needs,
                     copy_bytes=info.nbytes, methods=tuple(_core.host_methods(source)),
                     into=_copy_into(info, needs, source))
    if needs & _PACKED:
        if copy is False:
            return fail("copy-forbidden", info, t, needs)
        return Route(COPY, UNPACK, info, t, needs=needs, copy_bytes=info.nbytes)
    if copy:
        return Route(COPY, HOST_COPY, info, t, needs=needs, copy_bytes=info.nbytes)
    return Route(ZERO_COPY, HOST_VIEW, info, t, needs=needs)


# ---- sharded ---------------------------------------------------------------

def route_sharded(info: TensorInfo, needs: int, tg: Any, sharding: Any, opts: Options,
                  source: Any) -> Route:
    """The route of a tensor onto a multi-device ``sharding`` (pure)."""
    t = "jax"
    lay = _shard.layout(sharding, info.shape)
    if lay.uneven is not None:
        return fail("uneven", info, t, needs, sharding=sharding, uneven=lay.uneven)
    if (lay.split and info.host_accessible
            and not needs & (_DTYPE | _LANES | _PACKED | _NUMPY_PUT)):
        shards = []
        for dev, idx in zip(lay.devices, lay.indices):
            part = info.sliced(idx)
            shards.append((dev, idx, route_jax(part, _core.needs(part, tg, opts.share_readonly),
                                               tg, opts.with_device(dev), source)))
        return _combine(info, needs, tuple(shards))
    whole = route_jax(info, needs, tg, opts.with_device(None), source)
    if whole.kind == ERROR:
        return whole
    nd = len(sharding.device_set)
    if opts.copy is False:
        return fail("copy-forbidden", info, t, needs, spread=True, local=lay.local, ndevices=nd)
    return Route(COPY, DEVICE_PUT if lay.local else PROCESS_LOCAL, info, t, needs=needs,
                 copy_bytes=whole.copy_bytes + info.nbytes, whole=whole, local=lay.local,
                 ndevices=nd, narrow=whole.facts.get("narrow"))


def _combine(info: TensorInfo, needs: int, shards: tuple[Any, ...]) -> Route:
    for dev, index, route in shards:
        if route.kind == ERROR:   # the caller's tensor first, then which shard and why
            return fail("shard", info, "jax", needs, shards=shards, shard=(dev, index, route))
    copying = next(((d, r) for d, _, r in shards if not r.zero_copy), None)
    return Route(ZERO_COPY if copying is None else COPY, SPLIT, info, "jax", needs=needs,
                 copy_bytes=sum(r.copy_bytes for _, _, r in shards), shards=shards,
                 copying=copying,
                 narrow=next((r.facts.get("narrow") for _, _, r in shards
                              if r.facts.get("narrow")), None))


# ---- jax.Array and leaves that are not tensors --------------------------------

def route_jax_array(x: Any, opts: Options) -> Route:
    """The route of a ``jax.Array`` (typed PRNG key arrays too): no DLPack round trip,
    only ``device_put`` or a copy; a deleted or donated one is an error route."""
    t = "jax"
    dead = _core.jax_array_problem(x)
    if dead is not None:
        return failed(dead, t)
    try:
        nbytes = x.nbytes
    except Exception:   # typed PRNG keys on jax 0.4: "Cannot call abstract method nbytes"
        nbytes = 0
    if opts.copy is True:
        return Route(COPY, ARRAY_COPY, None, t, copy_bytes=nbytes, jax_array=x)
    sharding = None if opts.sharding is None else check_sharding(opts.sharding)
    want = sharding if sharding is not None else opts.device
    if want is None:
        return Route(ZERO_COPY, PASS, None, t, jax_array=x)
    if sharding is not None:
        there = x.sharding.is_equivalent_to(sharding, x.ndim)
    else:
        there = x.devices() == {want} and getattr(x.sharding, "memory_kind", None) in (
            None, want.default_memory().kind)
    if there:
        return Route(ZERO_COPY, PASS, None, t, jax_device=opts.device, jax_array=x, where=want)
    if opts.copy is False:
        return fail("copy-forbidden", None, t, jax_array=x, where=want)
    return Route(COPY, ARRAY_PUT, None, t, copy_bytes=nbytes, jax_device=opts.device,
                 jax_array=x, where=want)


def untouched(leaf: Any, target: str, opts: Options) -> Route:
    """The route of a pytree leaf that is not a tensor."""
    if opts.leaves == "raise":
        return fail("not-a-tensor", None, target, leaf_type=type(leaf))
    return Route("untouched", KEEP, None, target, leaf_type=type(leaf))


def check_sharding(s: Any) -> Any:
    """``s`` if it is a ``jax.sharding.Sharding``, else a TypeError saying what is."""
    if not isinstance(s, jax_module("jax.sharding").Sharding):
        raise TypeError(f"sharding must be a jax.sharding.Sharding (or, for to_jax, a pytree of "
                        f"them), not {type(s).__name__}; e.g. NamedSharding(mesh, "
                        f"PartitionSpec('data')).")
    return s


def decide(info: TensorInfo, tg: Any, target: str, opts: Options, source: Any = None) -> Route:
    """The route of a header to ``target``: ``needs``, then the route (pure)."""
    if target == "host":
        return route_host(info, _core.needs(info), opts.copy, source)
    needs = _core.needs(info, tg, opts.share_readonly)
    sharding = opts.sharding
    if sharding is not None and not _shard.plain_device(check_sharding(sharding)):
        return route_sharded(info, needs, tg, sharding, opts, source)
    if sharding is not None:
        opts = opts.with_device(next(iter(sharding.device_set)))
    return route_jax(info, needs, tg, opts, source)
