"""Routing: ``plan`` decides where a tensor can go, ``to_jax`` / ``to_host`` take it there.

The flow is one-way (see DESIGN.md): the header is read (``peek``), a pure
decision is made from it (``_decide``), and only then is anything imported or
copied (``_execute``). A failed route leaves a caller's capsule unconsumed.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import warnings
from typing import Any

import numpy as np

from . import _core
from ._core import TensorInfo, peek, peek_exported, producer_error
from ._enums import DLDeviceType as D
from ._dtypes import dldtype_from_numpy
from ._enums import device_name
from .errors import (
    CopyRequiredError,
    MalformedTensorError,
    ProducerError,
    DLInspectWarning,
    NotDLPackError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
)

__all__ = ["Route", "plan", "explain", "to_jax", "to_host"]

ZERO_COPY, COPY, HOST_FALLBACK, ERROR = "zero-copy", "copy", "host-fallback", "error"
_MAX_VERSION = _core.ABI_VERSION
_HOST_DEVICE = (int(D.kDLCPU), 0)

# What execute does (internal; Route.kind is the public word for it).
_IMPORT = "import"                  # hand the capsule to JAX as it is
_HOST_COPY = "host-copy"            # copy host memory into a C-order, aligned array, import that
_PRODUCER_COPY = "producer-copy"    # ask the producer for a host copy, then route that
_RAISE = "raise"


class Route:
    """Where a tensor goes and why: the result of :func:`plan`.

    Attributes
    ----------
    kind : str
        ``"zero-copy"`` (JAX or NumPy views the producer's memory),
        ``"copy"`` (a copy on a device JAX has: strides, alignment, read-only,
        dtype narrowing, device transfer or ``copy=True``), ``"host-fallback"``
        (the memory is on a device this JAX has no backend for: it goes through
        host memory), or ``"error"``.
    zero_copy : bool
        No byte of the tensor is copied (kind ``"zero-copy"``; a pinned or
        managed host tensor on a JAX without its platform is viewed by the CPU
        backend, also ``"zero-copy"``).
    reason : str
        One sentence: why this route.
    copy_bytes : int
        Bytes the route copies, counted on the source tensor (0 for zero-copy).
    jax_device : jax.Device or None
        The device the array ends up on (None for ``target="host"`` and errors).
    error : Exception or None
        The exception executing the route raises (kind ``"error"`` only).
    warning : str or None
        A warning executing the route emits (64-bit narrowing with x64 off).
    info : TensorInfo
        The header the decision was made from.
    target : str
        ``"jax"`` or ``"host"``.
    shards : tuple of (jax.Device, tuple of slice, Route)
        With ``plan(x, sharding=...)`` and host memory bound for CPU devices:
        each device's index into ``x`` (as
        ``Sharding.addressable_devices_indices_map`` gives it) and that slice's
        own route. Empty otherwise.
    """

    __slots__ = ("kind", "zero_copy", "reason", "copy_bytes", "jax_device", "error", "warning",
                 "info", "target", "shards", "_action", "_import_type", "_import_device",
                 "_import_copy")

    def __init__(self, kind: str, reason: str, info: TensorInfo, target: str, *,
                 copy_bytes: int = 0, jax_device: Any = None, error: Exception | None = None,
                 warning: str | None = None, action: str = _IMPORT, import_type: int = 1,
                 import_device: Any = None, import_copy: bool | None = None,
                 shards: tuple[Any, ...] = ()) -> None:
        self.kind = kind
        self.reason = reason
        self.info = info
        self.target = target
        self.copy_bytes = copy_bytes
        self.zero_copy = copy_bytes == 0 and kind != ERROR and action != _PRODUCER_COPY
        self.jax_device = jax_device
        self.error = error
        self.warning = warning
        self.shards = shards
        self._action = action
        self._import_type = import_type
        self._import_device = import_device
        self._import_copy = import_copy

    def __repr__(self) -> str:
        return f"<Route {self.kind} to {self.target}: {self.reason}>"


def _describe(info: TensorInfo) -> str:
    return (f"a {info.dtype_name} tensor of shape {info.shape} on "
            f"{device_name(info.device_type, info.device_id)}")


def _error(info: TensorInfo, target: str, exc: Exception) -> Route:
    return Route(ERROR, str(exc).split(". ")[0] + ".", info, target, error=exc, action=_RAISE)


def _platform_list(c: Any) -> str:
    return ", ".join(sorted(set(b.platform for b in c.jax.devices()))) or "none"


_PINNED_PLATFORM: dict[int, str] = {D.kDLCUDAHost: "cuda", D.kDLCUDAManaged: "cuda",
                                    D.kDLROCMHost: "rocm"}
_PLUGINS: dict[int, str] = {
    D.kDLCUDA: "jax[cuda12]", D.kDLCUDAHost: "jax[cuda12]", D.kDLROCM: "the jax ROCm plugin",
    D.kDLROCMHost: "the jax ROCm plugin", D.kDLOneAPI: "the Intel jax plugin"}


def _device_fix(info: TensorInfo) -> str:
    dt = int(info.device_type)
    plugin = _PLUGINS.get(dt)
    parts = ["move it to host memory first (torch: t.cpu())"]
    if plugin:
        parts.append(f"install {plugin}")
    parts.append('or keep fallback="host" (the default) so dlinspect goes through host memory')
    return ", ".join(parts)


@functools.lru_cache(maxsize=64)
def _narrowing_text(name: str, to: np.dtype) -> tuple[str, str]:
    """(warning, reason) for JAX's x64 narrowing of ``name`` to ``to``."""
    narrowed = to.name
    return (f"{name} is narrowed to {narrowed} because JAX's x64 mode is off (values may "
            f"change, as jax.dlpack.from_dlpack does); to keep 64 bits, call "
            f'jax.config.update("jax_enable_x64", True) first.',
            f"JAX narrows {name} to {narrowed} with x64 off")


# ---- the decision (pure) ---------------------------------------------------------

def _decide_jax(info: TensorInfo, c: Any, device: Any, copy: bool | None, fallback: str,
                readonly: str, has_producer: bool) -> Route:
    target = "jax"
    dt = int(info.device_type)
    code, bits, lanes = info.dtype
    problem = c.dtype_problem(code, bits, lanes)
    if problem is not None:
        return _error(info, target, UnsupportedDTypeError(
            f"{_describe(info)} has DLDataType(code={code}, bits={bits}, lanes={lanes}) "
            f"({info.dtype_name}), which JAX cannot hold: {problem}. Convert it with its own "
            f"library first (e.g. t.float() or t.view(torch.uint8)), or use dlinspect.to_host."))
    src_dev = c.device_for(dt, info.device_id)
    import_type = dt
    host_view = False
    if src_dev is None:
        if info.host_accessible:
            # Pinned / managed host memory, no backend for its platform: the CPU can read it.
            src_dev, import_type, host_view = c.cpu_device(), int(D.kDLCPU), True
        else:
            tried = "nothing (fallback='raise')"
            exc_args = (f"{_describe(info)} cannot go to JAX: this JAX has no backend for "
                        f"{device_name(dt)} (platforms here: {_platform_list(c)}).")
            if fallback == "raise" or not has_producer:
                if not has_producer and fallback != "raise":
                    tried = "nothing: a bare capsule has no producer to ask for a host copy"
                return _error(info, target, UnsupportedDeviceError(
                    f"{exc_args} Tried: {tried}. To fix: {_device_fix(info)}"
                    + ("; pass the producer object instead of its capsule." if not has_producer else ".")))
            if copy is False:
                return _error(info, target, CopyRequiredError(
                    f"{exc_args} Going through host memory needs a copy, but copy=False. "
                    f"To fix: pass copy=None, or move the tensor to host memory yourself."))
            return Route(HOST_FALLBACK,
                         f"{device_name(dt)} has no JAX backend here; the producer is asked for a "
                         f"host copy (dl_device=(kDLCPU, 0), copy=True), else numpy.asarray.",
                         info, target, copy_bytes=info.nbytes, jax_device=c.cpu_device() if device is None else device,
                         action=_PRODUCER_COPY)
    if (device is not None and device != src_dev and info.host_accessible
            and getattr(device, "platform", None) == "cpu"
            and c.platforms.get(import_type) == "cpu"):
        src_dev = device  # host memory: every CPU device views it as it is
    dest = src_dev if device is None else device
    needs: list[str] = []
    if not info.is_compact:
        what = ("broadcast (stride 0)" if info.has_broadcast else
                "negative strides" if info.has_negative_strides else "gaps between elements")
        needs.append(f"strides {info.strides} for shape {info.shape} have {what}, which JAX "
                     f"cannot view")
    if info.read_only and readonly != "share":
        needs.append("the producer marked it read-only (pass readonly='share' to import it "
                     "without a copy)")
    if (info.host_accessible and info.alignment < c.cpu_alignment and info.size > 0
            and c.platforms.get(import_type) == "cpu"):
        needs.append(f"its data pointer {info.data_ptr:#x} is {info.alignment}-byte aligned and "
                     f"XLA:CPU views only {c.cpu_alignment}-byte aligned memory")
    narrowed = c.narrowed(info.numpy_dtype)
    warning = None
    if narrowed is not None:
        warning, need = _narrowing_text(info.dtype_name, narrowed)
        needs.append(need)
    if dest != src_dev:
        needs.append(f"it moves from {src_dev} to {dest}")
    if copy is False and needs:
        fixes = ["pass copy=None"]
        if not info.is_compact:
            fixes.append("make it contiguous first (numpy.ascontiguousarray, t.contiguous())")
        if any("aligned" in n for n in needs):
            fixes.append(f"allocate {c.cpu_alignment}-byte aligned memory "
                         f"(dlinspect.testing.aligned_empty; torch tensors are)")
        if narrowed is not None:
            fixes.append('jax.config.update("jax_enable_x64", True)')
        if info.read_only and readonly != "share":
            fixes.append("readonly='share'")
        return _error(info, target, CopyRequiredError(
            f"{_describe(info)} needs a copy, but copy=False: {'; '.join(needs)}. To fix: "
            f"{', or '.join(fixes)}."))
    # Layout, read-only and alignment problems (the first three checks) need a
    # copy of the bytes themselves; narrowing and device moves happen after import,
    # except that host memory is narrowed by the copy itself (one pass; NumPy's
    # cast gives the values JAX's does: wrap-around for integers, IEEE rounding).
    bytes_copy = (len(needs) > (narrowed is not None) + (dest != src_dev)
                  or (narrowed is not None and info.host_accessible))
    if copy:
        needs.append("copy=True was asked for")
        bytes_copy = True
    if not info.is_compact and not info.host_accessible:
        return _error(info, target, UnsupportedDeviceError(
            f"{_describe(info)} has strides {info.strides}, which JAX cannot import, and its "
            f"memory is not host-accessible for dlinspect to copy. To fix: make it contiguous "
            f"with its own library first (torch: t.contiguous())."))
    packed = bits * lanes < 8 and not (info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED)
    if packed and bytes_copy and info.host_accessible and info.size > 1:
        return _error(info, target, UnsupportedDTypeError(
            f"{_describe(info)} packs {bits * lanes}-bit elements and needs a copy "
            f"({'; '.join(needs)}), but dlinspect copies packed sub-byte data only into NumPy "
            f"(dlinspect.to_host unpacks it). To fix: give JAX aligned, contiguous memory, or "
            f"unpack it with its own library first."))
    if not needs and info.size == 0 and info.host_accessible:
        # Nothing to view: JAX gets a new empty array (jaxlib refuses even an
        # empty view of a pointer that is not 64-byte aligned).
        return Route(ZERO_COPY, "The tensor is empty: JAX gets a new empty array; no byte "
                     "is copied.", info, target, jax_device=dest, action=_HOST_COPY,
                     import_type=import_type, import_device=src_dev)
    if not needs:
        reason = (f"{device_name(dt)} memory is host memory: JAX's CPU backend views it without "
                  f"a copy (no {_PINNED_PLATFORM.get(dt, 'device')} backend here)." if host_view
                  else f"JAX views the producer's memory on {dest}.")
        return Route(ZERO_COPY, reason, info, target, jax_device=dest, import_type=import_type,
                     import_device=src_dev)
    kind = COPY
    # Host memory is copied by dlinspect (so the producer's deleter runs right
    # after); device memory is copied by JAX's importer (copy=True).
    return Route(kind, f"A copy is needed: {'; '.join(needs)}.", info, target,
                 copy_bytes=info.nbytes, jax_device=dest, warning=warning,
                 action=_HOST_COPY if bytes_copy and info.host_accessible else _IMPORT,
                 import_type=import_type, import_device=src_dev,
                 import_copy=True if bytes_copy else None)


def _decide_host(info: TensorInfo, copy: bool | None, has_producer: bool) -> Route:
    target = "host"
    if info.numpy_dtype is None:
        return _error(info, target, UnsupportedDTypeError(
            f"{_describe(info)} has DLDataType(code={info.dtype.code}, bits={info.dtype.bits}, "
            f"lanes={info.dtype.lanes}), which has no NumPy dtype here (install ml_dtypes for "
            f"bfloat16, float8, float4/6 and int4). To fix: convert it with its own library first."))
    packed = info.dtype.bits * info.dtype.lanes < 8 and not (info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED)
    if info.host_accessible:
        if packed and info.size > 1:
            bits = info.dtype.bits * info.dtype.lanes
            if 8 % bits or not info.is_c_contiguous:
                return _error(info, target, UnsupportedDTypeError(
                    f"{_describe(info)} packs {bits}-bit elements "
                    f"{'across byte boundaries' if 8 % bits else f'with strides {info.strides}'}; "
                    f"dlinspect unpacks only C-contiguous 1-, 2- and 4-bit data. To fix: ask the "
                    f"producer for padded storage, or unpack with its own library."))
            if copy is False:
                return _error(info, target, CopyRequiredError(
                    f"{_describe(info)} packs {info.dtype.bits}-bit elements, while NumPy stores "
                    f"one per byte: unpacking needs a copy, but copy=False. To fix: pass copy=None."))
            return Route(COPY, f"{info.dtype.bits}-bit elements are packed; NumPy holds one per "
                         f"byte, so they are unpacked into a copy.", info, target,
                         copy_bytes=info.nbytes, action=_HOST_COPY)
        if copy:
            return Route(COPY, "copy=True was asked for.", info, target, copy_bytes=info.nbytes,
                         action=_HOST_COPY)
        return Route(ZERO_COPY, f"NumPy views the {device_name(int(info.device_type))} memory "
                     f"directly.", info, target)
    exc_head = f"{_describe(info)} is not in host memory."
    if not has_producer:
        return _error(info, target, UnsupportedDeviceError(
            f"{exc_head} A bare capsule has no producer to ask for a host copy. To fix: pass the "
            f"producer object itself, or {_device_fix(info)}."))
    if copy is False:
        return _error(info, target, CopyRequiredError(
            f"{exc_head} Bringing it to the host needs a copy, but copy=False. To fix: pass copy=None."))
    return Route(HOST_FALLBACK, f"{device_name(int(info.device_type))} memory is not host-accessible; "
                 f"the producer is asked for a host copy (dl_device=(kDLCPU, 0), copy=True).",
                 info, target, copy_bytes=info.nbytes, action=_PRODUCER_COPY)


def _check_options(target: str, fallback: str, readonly: str, copy: Any = None) -> None:
    if copy is not None and copy is not True and copy is not False:
        raise ValueError(f"copy must be None, True or False, not {copy!r}")
    if target not in ("jax", "host"):
        raise ValueError(f"target must be 'jax' or 'host', not {target!r}")
    if fallback not in ("host", "raise"):
        raise ValueError(f"fallback must be 'host' or 'raise', not {fallback!r}")
    if readonly not in ("copy", "share"):
        raise ValueError(f"readonly must be 'copy' or 'share', not {readonly!r}")


def _single_device(device: Any) -> Any:
    if device is None:
        return None
    if not hasattr(device, "device_set"):
        if not (hasattr(device, "platform") and hasattr(device, "id")):
            raise TypeError(f"device must be a jax.Device or a single-device sharding, not "
                            f"{device!r}; e.g. device=jax.devices('cpu')[0].")
        return device
    devices = device.device_set
    if len(devices) != 1:
        raise ValueError(f"to_jax takes a jax.Device or a single-device sharding; this sharding "
                         f"spans {len(devices)} devices.")
    return next(iter(devices))


def plan(x: Any, target: str = "jax", *, device: Any = None, copy: bool | None = None,
         sharding: Any = None, fallback: str = "host", readonly: str = "copy") -> Route:
    """Decide where a tensor would go, without importing or copying anything.

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, or TensorInfo
        The tensor (a capsule is only read, never consumed).
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

    Returns
    -------
    Route
        ``kind``, ``reason``, ``copy_bytes``, ``jax_device``, ``error``.

    Raises
    ------
    DLInspectError
        Only what :func:`peek` raises for an unreadable header; every routing
        problem is returned as a route of kind ``"error"``.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.plan(np.arange(6.0).reshape(2, 3)[:, :2]).kind
    'copy'
    """
    _check_options(target, fallback, readonly, copy)
    has_producer = not _is_capsule(x)
    c = None
    if target == "jax":
        from ._jax import caps
        c = caps()
    if isinstance(x, TensorInfo):
        info = x
    else:
        # The same export to_jax makes, so the producer's own refusals show in the plan.
        try:
            _, info, _ = _read(x, c)
        except ProducerError as exc:
            info = peek(x)
            return _error(info, target, exc)
    if c is None:
        return _decide_host(info, copy, has_producer)
    if sharding is not None:
        from . import _shard
        if device is not None:
            raise ValueError("plan takes device= or sharding=, not both; pass one of them.")
        if not _shard.plain_device(_check_sharding(sharding)):
            return _shard.decide(info, c, sharding, copy, fallback, readonly, has_producer)
        device = sharding
    return _decide_jax(info, c, _single_device(device), copy, fallback, readonly, has_producer)


def explain(x: Any, target: str = "jax", **options: Any) -> str:
    """The header and the route, in a few readable lines.

    Takes the same arguments as :func:`plan`; reads, never consumes.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> print(dlinspect.explain(np.ones(3, np.float32), target="host"))  # doctest: +ELLIPSIS
    <TensorInfo kDLCPU:0 float32[3] ...>
    route to host: zero-copy
      NumPy views the kDLCPU memory directly.
    """
    route = plan(x, target, **options)
    info = route.info
    lines = [repr(info), f"route to {route.target}: {route.kind}"
             + (f" ({route.copy_bytes} B copied)" if route.copy_bytes else "")]
    if route.error is None:  # (an error's message says it all, below)
        lines.append(f"  {route.reason}")
    if route.jax_device is not None:
        lines.append(f"  JAX device: {route.jax_device}")
    for dev, index, shard in route.shards:
        lines.append(f"  shard {_index_text(index)} -> {dev}: {shard.kind}"
                     + (f" ({shard.copy_bytes} B copied)" if shard.copy_bytes else ""))
    if route.warning:
        lines.append(f"  warning: {route.warning}")
    if route.error is not None:
        lines.append(f"  error: {type(route.error).__name__}: {route.error}")
    return "\n".join(lines)


def _index_text(index: tuple[slice, ...]) -> str:
    parts = [":" if sl == slice(None) else
             f"{'' if sl.start is None else sl.start}:{'' if sl.stop is None else sl.stop}"
             + (f":{sl.step}" if sl.step not in (None, 1) else "") for sl in index]
    return f"[{', '.join(parts)}]"


# ---- execution ---------------------------------------------------------------

_CAPSULE_TYPE = type(np.empty(0).__dlpack__())


def _is_capsule(x: Any) -> bool:
    return type(x) is _CAPSULE_TYPE


def _is_tensor(x: Any) -> bool:
    return type(x) is _CAPSULE_TYPE or hasattr(x, "__dlpack__")


def _export(x: Any, stream: Any = None, **kwargs: Any) -> Any:
    """``x.__dlpack__(stream=..., max_version=(1, 3), **kwargs)``; older producers retried bare.

    A NumPy array of a dtype NumPy will not export (the ml_dtypes bfloat16,
    float8, int4...) gets a capsule made by dlinspect over the same memory.
    A torch tensor with the lazy negative bit is refused: torch exports such a
    tensor without applying it, so its values would arrive negated.
    """
    _refuse_lazy_negation(x)
    if type(x) is np.ndarray and not kwargs and _numpy_cannot_export(x):
        return _capsule_of(x, read_only=not x.flags.writeable)
    try:
        try:
            cap = x.__dlpack__(stream=stream, max_version=_MAX_VERSION, **kwargs)
        except TypeError:
            if kwargs:
                raise
            cap = x.__dlpack__() if stream is None else x.__dlpack__(stream=stream)
    except (BufferError, RuntimeError, ValueError) as exc:
        raise producer_error(x, exc) from exc
    if type(cap) is not _CAPSULE_TYPE:
        raise NotDLPackError(f"{type(x).__name__}.__dlpack__() returned "
                             f"{type(cap).__name__}, not a PyCapsule.")
    return cap


def _device_of(x: Any) -> tuple[int, int] | None:
    get = getattr(x, "__dlpack_device__", None)
    if get is None:
        return None
    try:
        dev = get()
    except (BufferError, RuntimeError, ValueError) as exc:
        raise producer_error(x, exc) from exc
    if (type(dev) is tuple and len(dev) == 2 and all(isinstance(v, int) for v in dev)
            and all(-2**31 <= v < 2**31 for v in dev)):
        return (int(dev[0]), int(dev[1]))
    raise MalformedTensorError(
        f"{type(x).__name__}.__dlpack_device__() returned {dev!r}; the array API requires a "
        f"(device_type, device_id) tuple of two ints (int32).")


def _aligned_like(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _host_view(cap: Any, info: TensorInfo, read_only: bool | None = None) -> tuple[np.ndarray, Any]:
    """Consume ``cap`` into a NumPy view of its memory (and the owner that frees it).

    ``read_only`` None: a legacy capsule, which cannot say, gives a read-only
    view, as NumPy does.
    """
    if read_only is None:
        read_only = info.read_only is not False
    owner = _core.take(cap, read_only)
    dtype = info.numpy_dtype
    assert dtype is not None  # routes reaching here were decided with a NumPy dtype
    if info.size == 0:
        return np.empty(info.shape, dtype), owner
    raw = np.asarray(owner)
    return raw.view(dtype), owner


def _unpack_subbyte(cap: Any, info: TensorInfo) -> np.ndarray:
    """Copy a packed sub-byte tensor (int4, float4...) into one element per byte."""
    owner = _core.take(cap, True)
    try:
        bits = info.dtype.bits
        raw = np.asarray(_core.take_bytes(owner, info.nbytes))
        shifts = np.arange(8 // bits, dtype=np.uint8) * bits
        # Element i sits at bits [i*bits, (i+1)*bits) of the little-endian bit stream.
        vals = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[: info.size]
        if info.dtype.code == 0:  # kDLInt: sign-extend, then convert by value
            half = 1 << (bits - 1)
            return ((vals.astype(np.int8) ^ half) - half).astype(info.numpy_dtype).reshape(info.shape)
        if info.dtype.code == 1:  # kDLUInt: convert by value
            return vals.astype(info.numpy_dtype).reshape(info.shape)
        # Floating sub-byte types: ml_dtypes keeps the bit pattern in the low bits of a byte.
        return vals.view(info.numpy_dtype).reshape(info.shape).copy()  # type: ignore[arg-type]
    finally:
        del owner


def _host_copy(cap: Any, info: TensorInfo, dtype: np.dtype | None = None) -> np.ndarray:
    """One copy of host memory into a fresh C-order, 64-byte aligned array; frees the source.

    ``dtype``: cast to it on the way (JAX's x64 narrowing).
    """
    view, owner = _host_view(cap, info)
    out = _aligned_like(info.shape, view.dtype if dtype is None else dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # float64 -> float32 overflow is inf, as in JAX
        np.copyto(out, view, casting="unsafe")
    del view, owner  # the producer's deleter runs here, right after the copy
    return out


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


def _refuse_lazy_negation(x: Any) -> None:
    """torch exports a tensor with the lazy negative bit without applying it."""
    is_neg = getattr(x, "is_neg", None)
    if is_neg is not None and callable(is_neg) and is_neg() is True:
        raise ProducerError(
            f"{type(x).__module__}.{type(x).__qualname__} has the lazy negative bit set (e.g. "
            f"t.conj().imag), which its __dlpack__ exports without applying: the values would "
            f"arrive negated. To fix: call .resolve_neg() first.")


def _numpy_cannot_export(x: np.ndarray) -> bool:
    """A NumPy array whose dtype DLPack has a code for but NumPy refuses to export."""
    if x.dtype.kind in "biufc" or not x.dtype.isnative:
        return False
    try:
        dldtype_from_numpy(x.dtype)
    except ValueError:
        return False
    return True


def _capsule_of(arr: np.ndarray, read_only: bool = False) -> Any:
    """A "dltensor_versioned" capsule viewing host array ``arr`` (which it keeps alive).

    Made by dlinspect rather than ``arr.__dlpack__()``, which NumPy refuses for
    the ml_dtypes types (bfloat16, float8...).
    """
    item = arr.itemsize
    strides = None if arr.flags.c_contiguous else tuple(st // item for st in arr.strides)
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    return _core._make_capsule(arr, arr.ctypes.data, arr.shape, None, strides, code, bits, lanes,
                               int(D.kDLCPU), 0, 0, True, _MAX_VERSION[0], _MAX_VERSION[1],
                               _core.FLAG_READ_ONLY if read_only else 0, None, None, False)


def _import_numpy(c: Any, arr: np.ndarray, device: Any) -> Any:
    """Import a NumPy array (ours, C order) onto ``device`` without a further copy if aligned."""
    return _import_capsule(c, _capsule_of(arr), device, int(D.kDLCPU), None, None)


def _import_capsule(c: Any, cap: Any, device: Any, dl_device_type: int, copy: bool | None,
                    stream: Any) -> Any:
    legacy = _core.as_legacy(cap)
    try:
        return c.import_capsule(legacy, device, stream, copy, dl_device_type)
    except BaseException:
        if legacy is not cap:
            _core.restore_versioned(legacy, cap)
        raise


def warn(message: str) -> None:
    """A DLInspectWarning attributed to the first caller outside dlinspect and jax
    (through jax.tree_util, a pytree's leaves are converted inside jax's frames).

    On a thread collecting warnings (``prefetch_to_jax``'s worker) the message is
    kept for the consumer's thread to emit instead.
    """
    collected = getattr(_collecting, "messages", None)
    if collected is not None:
        collected.append(message)
        return
    level, frame = 2, sys._getframe(1)
    frame_or_none: Any = frame
    while frame_or_none is not None and _internal(frame_or_none.f_code.co_filename):
        level, frame_or_none = level + 1, frame_or_none.f_back
    warnings.warn(message, DLInspectWarning, stacklevel=level)


_collecting = threading.local()
_HERE = os.path.dirname(__file__) + os.sep
_JAX_HERE: str | None = None


def _internal(filename: str) -> bool:
    global _JAX_HERE
    if filename.startswith(_HERE):
        return True
    if _JAX_HERE is None:
        jax = sys.modules.get("jax")
        jax_file = getattr(jax, "__file__", None)
        if jax_file is None:
            return False
        _JAX_HERE = os.path.dirname(jax_file) + os.sep
    return filename.startswith(_JAX_HERE)


def _finish(c: Any, arr: Any, route: Route) -> Any:
    if route.warning is not None:
        arr = c.canonicalize(arr)
    if route.jax_device is not None and route.jax_device != route._import_device:
        arr = c.jax.device_put(arr, route.jax_device)
    return arr


def _execute_jax(c: Any, route: Route, cap: Any, x: Any, copy: bool | None, stream: Any,
                 fallback: str, readonly: str, quiet: bool = False) -> Any:
    action = route._action
    if action is _RAISE:
        _raise(route)
    if route.warning is not None and not quiet:
        # Before anything is consumed: a warning turned into an error (-W error)
        # leaves a caller's capsule as it was, like any failed route.
        warn(route.warning)
    if action is _IMPORT:
        arr = _import_capsule(c, cap, route._import_device, route._import_type,
                              copy if route.kind == ZERO_COPY else route._import_copy, stream)
        return _finish(c, arr, route)
    if action is _HOST_COPY:
        narrow = c.narrowed(route.info.numpy_dtype) if route.warning is not None else None
        host = _host_copy(cap, route.info, narrow)
        return _finish(c, _import_numpy(c, host, route._import_device), route)
    # _PRODUCER_COPY: the device has no JAX backend; go through host memory.
    del cap  # the device capsule is not needed: its producer frees it now
    host_obj = _host_from_producer(x, route.info)
    return _one_to_jax(host_obj, route.jax_device, None, fallback, readonly, quiet)


def _host_from_producer(x: Any, info: TensorInfo) -> Any:
    """A host tensor with x's values: the producer's host copy, else numpy.asarray(x)."""
    tried = []
    try:
        cap = _export(x, None, dl_device=_HOST_DEVICE, copy=True)
        host_info = peek(cap)
        if host_info.host_accessible:
            return cap
        tried.append(f"__dlpack__(dl_device=(kDLCPU, 0), copy=True) returned memory on "
                     f"{device_name(int(host_info.device_type))}")
    except Exception as exc:  # TypeError (old producer), BufferError (cannot), ...
        tried.append(f"__dlpack__(dl_device=(kDLCPU, 0), copy=True) raised "
                     f"{type(exc).__name__}: {exc}")
    try:
        arr = np.asarray(x)
        if arr.dtype != object:
            return arr
        tried.append("numpy.asarray gave an object array (the producer has no __array__)")
    except Exception as exc:
        tried.append(f"numpy.asarray raised {type(exc).__name__}: {exc}")
    raise UnsupportedDeviceError(
        f"{_describe(info)} could not be brought to host memory. Tried: {'; '.join(tried)}. "
        f"To fix: {_device_fix(info)}.")


def _read(x: Any, c: Any) -> tuple[Any, TensorInfo, Any]:
    """Export ``x`` once (stream chosen for JAX when ``c`` is given) and read its header.

    Returns ``(capsule, info, stream)``; a bare capsule is read, not consumed.
    """
    tp = type(x)
    if tp is _CAPSULE_TYPE:
        return x, peek(x), None
    if not hasattr(x, "__dlpack__") or isinstance(x, type):
        raise NotDLPackError(
            f"expected a tensor (an object with __dlpack__) or a DLPack capsule; got an object "
            f"of type {tp.__module__}.{tp.__qualname__}. (to_jax also walks dicts, lists and "
            f"tuples of tensors; plan, explain and to_host take one tensor.)")
    # numpy.ndarray answers __dlpack_device__ from the same field as its header.
    dev = None if tp is np.ndarray else _device_of(x)
    stream = None
    if c is not None and dev is not None and dev[0] in (D.kDLCUDA, D.kDLROCM):
        stream = c.stream_for(dev[0], c.device_for(dev[0], dev[1]))
    cap = _export(x, stream)
    info = peek(cap) if dev is None else peek_exported(cap, dev[0], dev[1])
    return cap, info, stream


def _one_to_jax(x: Any, device: Any, copy: bool | None, fallback: str, readonly: str,
                quiet: bool = False) -> Any:
    c = _caps if _caps is not None else _load_caps()
    if device is None and copy is not True:
        # Fast path (C): aligned, compact, writable CPU memory in a dtype JAX keeps.
        got = _core.fast_to_jax(x, c._fast if c._fast is not None else c.fast_path(), copy is None)
        if type(got) is not tuple:
            return got
        if got[0] is not None:
            return _from_fast_export(c, x, got, copy, fallback, readonly)
    cap, info, stream = _read(x, c)
    return _general_to_jax(c, x, cap, info, stream, device, copy, fallback, readonly, quiet)


def _general_to_jax(c: Any, x: Any, cap: Any, info: TensorInfo, stream: Any, device: Any,
                    copy: bool | None, fallback: str, readonly: str, quiet: bool = False) -> Any:
    """Decide and execute the route of a tensor already exported (``cap``) and read."""
    route = _decide_jax(info, c, device, copy, fallback, readonly, type(x) is not _CAPSULE_TYPE)
    return _execute_jax(c, route, cap, x, copy, stream, fallback, readonly, quiet)


def _from_fast_export(c: Any, x: Any, got: tuple[Any, TensorInfo], copy: bool | None,
                      fallback: str, readonly: str) -> Any:
    """The general route of what ``_core.fast_to_jax`` exported but could not import:
    CPU memory (or a bare capsule), so no stream, and no device was asked for."""
    _refuse_lazy_negation(x)  # exported without _export's checks
    return _general_to_jax(c, x, got[0], got[1], None, None, copy, fallback, readonly)


_caps = None


def _load_caps() -> Any:
    global _caps
    from ._jax import caps
    _caps = caps()
    return _caps


def to_jax(x: Any, device: Any = None, copy: bool | None = None, *, sharding: Any = None,
           fallback: str = "host", readonly: str = "copy") -> Any:
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
        The same structure as ``x``.

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
        The producer refused to export (requires_grad, conjugate bit...).
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
    caller's capsule unconsumed.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_jax({"x": np.arange(4, dtype=np.float32)})["x"].sum().item()
    6.0
    """
    if fallback != "host" or readonly != "copy" or (copy is not None and copy is not True
                                                     and copy is not False):
        _check_options("jax", fallback, readonly, copy)
    if sharding is not None:
        return _to_jax_sharded(x, device, sharding, copy, fallback, readonly)
    if device is not None:
        device = _single_device(device)
    elif copy is not True:
        # The fast path, inlined from _one_to_jax: one Python frame less per call.
        c = _caps if _caps is not None else _load_caps()
        got = _core.fast_to_jax(x, c._fast if c._fast is not None else c.fast_path(), copy is None)
        if type(got) is not tuple:
            return got
        if got[0] is not None:
            return _from_fast_export(c, x, got, copy, fallback, readonly)
        if _is_tensor(x):
            cap, info, stream = _read(x, c)
            return _general_to_jax(c, x, cap, info, stream, device, copy, fallback, readonly)
    if _is_tensor(x):
        return _one_to_jax(x, device, copy, fallback, readonly)
    from jax import tree_util
    return tree_util.tree_map(lambda leaf: _one_to_jax(leaf, device, copy, fallback, readonly),
                              x, is_leaf=_is_tensor)


def _to_jax_sharded(x: Any, device: Any, sharding: Any, copy: bool | None, fallback: str,
                    readonly: str) -> Any:
    if device is not None:
        raise ValueError("to_jax takes device= or sharding=, not both; pass one of them.")
    from jax import tree_util
    from jax.sharding import Sharding
    from . import _shard
    c = _caps if _caps is not None else _load_caps()

    def one(leaf: Any, s: Any) -> Any:
        if s is None:  # default placement, as in jax.device_put
            return _one_to_jax(leaf, None, copy, fallback, readonly)
        if _shard.plain_device(_check_sharding(s)):
            return _one_to_jax(leaf, _single_device(s), copy, fallback, readonly)
        return _shard.to_jax_sharded(leaf, c, s, copy, fallback, readonly)

    def subtree(s: Any, sub: Any) -> Any:
        if _is_tensor(sub):
            return one(sub, s)
        return tree_util.tree_map(lambda leaf: one(leaf, s), sub, is_leaf=_is_tensor)

    if sharding is None or isinstance(sharding, Sharding):
        return subtree(sharding, x)
    # A pytree of shardings, a prefix of x's structure (as jax.device_put takes).
    is_leaf = lambda s: s is None or isinstance(s, Sharding)  # noqa: E731
    try:
        tree_util.tree_map(lambda s, sub: None, sharding, x, is_leaf=is_leaf)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"sharding= must be a jax.sharding.Sharding or a pytree of them whose structure is "
            f"a prefix of the batch's: {str(exc).splitlines()[0]}") from None
    return tree_util.tree_map(subtree, sharding, x, is_leaf=is_leaf)


def _check_sharding(s: Any) -> Any:
    from jax.sharding import Sharding
    if not isinstance(s, Sharding):
        raise TypeError(f"sharding must be a jax.sharding.Sharding (or, for to_jax, a pytree of "
                        f"them), not {type(s).__name__}; e.g. NamedSharding(mesh, "
                        f"PartitionSpec('data')).")
    return s


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
        ml_dtypes), which ``numpy.from_dlpack`` refuses. Not writeable when the
        source is read-only (a legacy capsule cannot say, so it is read-only,
        as NumPy does). Device memory goes through the producer's host copy
        (``dl_device=(kDLCPU, 0), copy=True``).

    Raises
    ------
    UnsupportedDeviceError
        No host copy could be had (a ``BufferError``).
    UnsupportedDTypeError
        No NumPy dtype exists for the tensor's dtype here (a ``BufferError``).
    CopyRequiredError
        ``copy=False`` but a copy is needed (a ``ValueError``).

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.to_host(np.arange(3.0)).tolist()
    [0.0, 1.0, 2.0]
    """
    if copy is not None and copy is not True and copy is not False:
        _check_options("host", "host", "copy", copy)
    is_cap = type(x) is _CAPSULE_TYPE
    cap, info, _ = _read(x, None)
    route = _decide_host(info, copy, not is_cap)
    action = route._action
    if action is _RAISE:
        _raise(route)
    if action is _PRODUCER_COPY:
        del cap
        host = _host_from_producer(x, info)
        return host if isinstance(host, np.ndarray) else to_host(host)
    packed = info.dtype.bits * info.dtype.lanes < 8 and not (info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED)
    if packed and info.size > 1:
        return _unpack_subbyte(cap, info)
    if action is _HOST_COPY:
        return _host_copy(cap, info)
    view, _owner = _host_view(cap, info)
    return view
