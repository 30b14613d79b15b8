"""``plan`` and ``explain``: the answer of the one decision (``_core.needs``), in words.

``route_jax`` and ``route_host`` turn a header's needs and the caller's options
into a :class:`Route`; ``to_jax`` and ``to_host`` (in :mod:`dlinspect._execute`)
carry out exactly the route these functions return, so ``plan(x)`` says what
``to_jax(x)`` then does. Nothing here imports or copies.
"""

from __future__ import annotations

import enum
import functools
import os
from typing import Any, Callable, TypeVar

from . import _core
from ._core import TensorInfo
from ._dtypes import dldtype_from_numpy, dtype_name
from ._enums import DLDeviceType as D
from ._enums import device_name
from ._messages import describe, device_fix, narrowing_text
from . import _shard, _tree
from .errors import (
    AllocationError,
    CopyRequiredError,
    DLInspectError,
    NotDescribableError,
    NotDLPackError,
    ShardingError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
)

__all__ = ["Need", "Route", "plan", "explain"]

ZERO_COPY, COPY, HOST_FALLBACK, ERROR = "zero-copy", "copy", "host-fallback", "error"
E = TypeVar("E", bound=BaseException)


class Need(enum.IntFlag):
    """What a tensor needs to reach its target: the bits of ``Route.needs``.

    Computed by one function in the core (``dlinspect._core.needs``) from the
    header (:class:`TensorInfo`) and what the installed JAX takes; ``plan``,
    ``to_jax`` and ``to_host`` all act on the same answer.
    """

    DEVICE = _core.NEED_BITS["DEVICE"]
    """No JAX device here for the memory's device (or, for NumPy, not host memory)."""
    DTYPE = _core.NEED_BITS["DTYPE"]
    """The target cannot hold one lane's DLDataType (code, bits)."""
    LANES = _core.NEED_BITS["LANES"]
    """A vector dtype (lanes > 1): the lanes become a trailing axis."""
    LAYOUT = _core.NEED_BITS["LAYOUT"]
    """Strides JAX cannot view: gaps, broadcast (stride 0) or negative strides."""
    READ_ONLY = _core.NEED_BITS["READ_ONLY"]
    """The READ_ONLY flag is set and the caller did not pass ``readonly="share"``."""
    ALIGN = _core.NEED_BITS["ALIGN"]
    """``data + byte_offset`` is below XLA:CPU's zero-copy alignment."""
    NARROW = _core.NEED_BITS["NARROW"]
    """A 64-bit dtype that JAX narrows to 32 bits with x64 off."""
    PACKED = _core.NEED_BITS["PACKED"]
    """Packed sub-byte elements (bits * lanes < 8, more than one element)."""
    EMPTY = _core.NEED_BITS["EMPTY"]
    """No elements: nothing to view or copy."""
    VIA_CPU = _core.NEED_BITS["VIA_CPU"]
    """Pinned or managed host memory with no JAX backend for its platform: JAX's CPU
    backend views it (no copy)."""
    NUMPY_PUT = _core.NEED_BITS["NUMPY_PUT"]
    """A dtype JAX holds but its DLPack import does not take: sub-byte elements (int4,
    uint4, int2, float4...; packed, or padded one per byte with
    ``IS_SUBBYTE_TYPE_PADDED``), and any dtype a jaxlib's import refuses.
    ``jax.device_put`` copies them from a NumPy (ml_dtypes) view."""


# What executing a route does (Route.kind is the public word for it).
IMPORT = "import"                  # hand the capsule to JAX as it is (maybe copy=True)
HOST_COPY = "host-copy"            # copy host memory into a C-order aligned array, import that
HOST_VIEW = "host-view"            # view host memory through NumPy (lanes as an axis), import
UNPACK = "unpack"                  # packed sub-byte host memory into one element per byte
EMPTY = "empty"                    # a new empty array; the capsule is taken and freed
PRODUCER_COPY = "producer-copy"    # ask the producer for a host copy, then route that
RAISE = "raise"
PASS = "pass"                      # a jax.Array where it was asked to be: returned as it is
KEEP = "keep"                      # a pytree leaf that is not a tensor: left as it is
SPLIT = "split"                    # one host view, each device imports its slice
DEVICE_PUT = "device-put"          # to_jax whole, then jax.device_put(array, sharding)
PROCESS_LOCAL = "process-local"    # to_jax whole, then make_array_from_process_local_data
NUMPY_PUT = "numpy-put"            # a NumPy view (unpacked if packed), then jax.device_put
NUMPY_COPY = "numpy-copy"          # NumPy memory DLPack cannot describe: NumPy copies it


class Route:
    """Where a tensor goes and why: the result of :func:`plan`.

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
        The device the array ends up on (None for ``target="host"`` and errors).
    error : Exception or None
        The exception executing the route raises (kind ``"error"`` only): a
        producer's refusal, a corrupt header, or why the target cannot take it.
    warning : str or None
        A warning executing the route emits (64-bit narrowing with x64 off).
    info : TensorInfo or None
        The header the decision was made from (None when the producer refused to
        export or the header could not be read: see ``error``).
    target : str
        ``"jax"`` or ``"host"``.
    shards : tuple of (jax.Device, tuple of slice, Route)
        With ``plan(x, sharding=...)`` and host memory bound for CPU devices:
        each device's index into ``x`` (as ``Sharding.addressable_devices_indices_map``
        gives it) and that slice's own route. Empty otherwise.
    """

    __slots__ = ("kind", "zero_copy", "reason", "needs", "copy_bytes", "jax_device", "error",
                 "warning", "info", "target", "shards", "action", "import_type",
                 "import_device", "import_copy")

    def __init__(self, kind: str, reason: str, info: TensorInfo | None, target: str, *,
                 needs: int = 0, copy_bytes: int = 0, jax_device: Any = None,
                 error: Exception | None = None, warning: str | None = None,
                 action: str = IMPORT, import_type: int = 1, import_device: Any = None,
                 import_copy: bool | None = None, shards: tuple[Any, ...] = ()) -> None:
        self.kind = kind
        self.reason = reason
        self.needs = Need(needs)
        self.info = info
        self.target = target
        self.copy_bytes = copy_bytes
        self.zero_copy = kind == ZERO_COPY
        self.jax_device = jax_device
        self.error = error
        self.warning = warning
        self.shards = shards
        self.action = action             # what _execute does (private)
        self.import_type = import_type   # dl_device_type handed to jaxlib
        self.import_device = import_device
        self.import_copy = import_copy

    def __repr__(self) -> str:
        return f"<Route {self.kind} to {self.target}: {self.reason}>"


def error_route(exc: Exception, info: TensorInfo | None, target: str, needs: int = 0) -> Route:
    """A route of kind "error" whose execution raises ``exc``."""
    return Route(ERROR, str(exc).split(". ")[0] + ".", info, target, needs=needs, error=exc,
                 action=RAISE)


def _platforms(c: Any) -> str:
    return ", ".join(sorted(c.platforms)) or "none"


def _strides_word(info: TensorInfo) -> str:
    if info.is_compact:   # only on a jaxlib that reads every layout as row-major (< 0.8)
        return "a permuted (transposed) order, which this jaxlib reads as row-major"
    return ("broadcast (stride 0)" if info.has_broadcast else
            "negative strides" if info.has_negative_strides else "gaps between elements")


def _dtype_text(info: TensorInfo) -> str:
    code, bits, lanes = info.dtype
    return f"DLDataType(code={code}, bits={bits}, lanes={lanes}) ({info.dtype_name})"


def _lanes_problem(info: TensorInfo, target: str) -> UnsupportedDTypeError | None:
    """Vector lanes narrower than a byte share bytes: no trailing axis can hold them."""
    code, bits, lanes = info.dtype
    if lanes == 1 or bits % 8 == 0:
        return None
    return UnsupportedDTypeError(
        f"{describe(info)} has {_dtype_text(info)}: {lanes} lanes of {bits} bits share each "
        f"byte, so they cannot become an axis of {'JAX' if target == 'jax' else 'NumPy'} "
        f"elements. To fix: unpack it with its own library first (e.g. torch: view the "
        f"bytes as uint8).")


@functools.lru_cache(maxsize=1)
def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def allocation_error(nbytes: int, what: str) -> AllocationError:
    """The error for a copy of ``nbytes`` that cannot be allocated (plan and execution)."""
    total = physical_memory()
    have = f"; this machine has {total} bytes of physical memory" if total else ""
    return AllocationError(
        f"{what} needs a copy of {nbytes} bytes, which cannot be allocated{have}; nothing was "
        f"consumed. To fix: copy a smaller part (slice it first), or make it contiguous with "
        f"its own library where it fits.")


R = TypeVar("R", bound=Callable[..., "Route"])


def memory_checked(route_fn: R) -> R:
    """Every copy a route plans fits in physical memory, else the route is an
    ``AllocationError`` (one rule for every route function it wraps)."""
    @functools.wraps(route_fn)
    def checked(*args: Any, **kwargs: Any) -> Route:
        route = route_fn(*args, **kwargs)
        total = physical_memory()
        if route.copy_bytes and total is not None and route.copy_bytes > total:
            what = describe(route.info) if route.info is not None else "the tensor"
            return error_route(allocation_error(route.copy_bytes, what), route.info,
                               route.target, route.needs)
        return route
    return checked  # type: ignore[return-value]


# ---- JAX -------------------------------------------------------------------

@memory_checked
def route_jax(info: TensorInfo, needs: int, c: Any, device: Any, copy: bool | None,
              fallback: str, readonly: str, source: Any) -> Route:
    """The route of a tensor with header ``info`` and ``needs`` into JAX (pure).

    ``device``: the destination (None: where the memory is); ``source``: what the
    caller passed (a producer; a bare capsule, which has no producer to ask for a host
    copy; or a TensorInfo).
    """
    target = "jax"
    dt = int(info.device_type)
    problem = _lanes_problem(info, target)   # the memory's structure first: no dtype helps it
    if problem is not None:
        return error_route(problem, info, target, needs)
    if needs & Need.DTYPE:
        code, bits, lanes = info.dtype
        host_ok = not (_core.needs(info) & Need.DTYPE) and _lanes_problem(info, "host") is None
        held = lanes == 1 and (bits < 8 or c.target.dtype_problem(code, bits) is not None)
        why = c.target.dtype_problem(code, bits, held)
        return error_route(UnsupportedDTypeError(
            f"{describe(info)} has {_dtype_text(info)}, which JAX cannot hold: {why}. To fix: "
            f"convert it with its own library first (e.g. t.float() or t.view(torch.uint8))"
            + (", or take it as NumPy with dlinspect.to_host." if host_ok else ".")),
            info, target, needs)
    host = info.host_accessible
    if needs & Need.EMPTY:
        dest = device or c.target.device_for(dt, info.device_id) or c.cpu_device()
        warning = c.target.narrowing(*info.dtype[:2])[2] if needs & Need.NARROW else None
        return Route(ZERO_COPY, "The tensor is empty: JAX gets a new empty array; no byte "
                     "is copied.", info, target, needs=needs, jax_device=dest, action=EMPTY,
                     warning=warning)
    if needs & Need.DEVICE or (needs & Need.LANES and not host):
        return _route_through_host(info, needs, c, device, copy, fallback, source)
    if needs & Need.LAYOUT and not host:
        return error_route(UnsupportedDeviceError(
            f"{describe(info)} has strides {info.strides}, which JAX cannot import, and its "
            f"memory is not host-accessible for dlinspect to copy. To fix: make it contiguous "
            f"with its own library first (torch: t.contiguous())."), info, target, needs)

    if needs & Need.NUMPY_PUT:
        return _route_numpy_put(info, needs, c, device, copy)

    via_cpu = bool(needs & Need.VIA_CPU)
    src = c.cpu_device() if via_cpu else c.target.device_for(dt, info.device_id)
    import_type = int(D.kDLCPU) if via_cpu else dt
    if (device is not None and device != src and host and src.platform == "cpu"
            and getattr(device, "platform", None) == "cpu"):
        src = device   # host memory: every CPU device views it as it is
    dest = src if device is None else device

    reasons: list[str] = []
    fixes: list[str] = []
    if needs & Need.LAYOUT:
        reasons.append(f"strides {info.strides} for shape {info.shape} have "
                       f"{_strides_word(info)}" + ("" if info.is_compact else
                                                    ", which JAX cannot view"))
        fixes.append("make it contiguous first (numpy.ascontiguousarray, t.contiguous())")
    if needs & Need.READ_ONLY:
        reasons.append("the producer marked it read-only (pass readonly='share' to import it "
                       "without a copy)")
        fixes.append("readonly='share'")
    if needs & Need.ALIGN:
        align = c.target.cpu_align
        reasons.append(f"its data pointer {info.data_ptr:#x} is {info.alignment}-byte aligned "
                       f"and XLA:CPU views only {align}-byte aligned memory")
        fixes.append(f"allocate {align}-byte aligned memory (dlinspect.testing.aligned_empty; "
                     f"torch tensors are)")
    warning = None
    if needs & Need.NARROW:
        code, bits, _ = info.dtype
        ncode, nbits, warning = c.target.narrowing(code, bits)
        why = narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[1]
        reasons.append(why)
        fixes.append('jax.config.update("jax_enable_x64", True)')
    if dest != src:
        reasons.append(f"it moves from {src} to {dest}")
    if copy is False and reasons:
        return error_route(CopyRequiredError(
            f"{describe(info)} needs a copy, but copy=False: {'; '.join(reasons)}. To fix: "
            f"{', or '.join(['pass copy=None'] + fixes)}."), info, target, needs)
    # Layout, read-only and alignment need a copy of the bytes themselves;
    # narrowing and device moves happen after import, except that host memory is
    # narrowed by the copy itself (one pass; NumPy's cast gives the values JAX's
    # does: wrap-around for integers, IEEE rounding).
    bytes_copy = bool(needs & (Need.LAYOUT | Need.READ_ONLY | Need.ALIGN)
                      or (needs & Need.NARROW and host))
    if copy:
        reasons.append("copy=True was asked for")
        bytes_copy = True
    if needs & Need.PACKED and bytes_copy:
        bits = info.dtype.bits * info.dtype.lanes
        return error_route(UnsupportedDTypeError(
            f"{describe(info)} packs {bits}-bit elements and needs a copy "
            f"({'; '.join(reasons)}), but dlinspect copies packed sub-byte data only into NumPy "
            f"(dlinspect.to_host unpacks it). To fix: give JAX aligned, contiguous memory, or "
            f"unpack it with its own library first."), info, target, needs)
    lanes = info.dtype.lanes
    lanes_text = (f"its {lanes} lanes become a trailing axis of {info.numpy_dtype} "
                  f"(shape {info.shape + (lanes,)})" if needs & Need.LANES else "")
    if not reasons:
        if needs & Need.LANES:
            return Route(ZERO_COPY, f"{lanes_text[0].upper()}{lanes_text[1:]}; JAX views the "
                         f"producer's memory on {dest}.", info, target, needs=needs,
                         jax_device=dest, action=HOST_VIEW, import_device=src)
        reason = (f"{device_name(dt)} memory is host memory: JAX's CPU backend views it without "
                  f"a copy (no {_PINNED_PLATFORM.get(dt, 'device')} backend here)." if via_cpu
                  else f"JAX views the producer's memory on {dest}.")
        return Route(ZERO_COPY, reason, info, target, needs=needs, jax_device=dest,
                     import_type=import_type, import_device=src)
    if lanes_text:
        reasons.append(lanes_text)
    # Host memory is copied by dlinspect (the producer's deleter runs right after);
    # device memory by JAX's importer (copy=True).
    return Route(COPY, f"A copy is needed: {'; '.join(reasons)}.", info, target, needs=needs,
                 copy_bytes=info.nbytes, jax_device=dest, warning=warning,
                 action=HOST_COPY if (bytes_copy or needs & Need.LANES) and host else IMPORT,
                 import_type=import_type, import_device=src,
                 import_copy=True if bytes_copy else None)


def _route_numpy_put(info: TensorInfo, needs: int, c: Any, device: Any,
                     copy: bool | None) -> Route:
    """A dtype JAX holds but does not import through DLPack, in host memory: a NumPy
    view (sub-byte elements unpacked into one per byte where packed), copied by
    ``jax.device_put``."""
    target = "jax"
    name = info.dtype_name
    if needs & Need.PACKED:
        problem = _unpack_problem(info)
        if problem is not None:
            return error_route(problem, info, target, needs)
    how = ("unpacked into one element per byte, then copied by jax.device_put"
           if needs & Need.PACKED else "viewed by NumPy (one element per byte) and copied by "
           "jax.device_put")
    code, bits, _ = info.dtype
    refusal = ("it takes no padded sub-byte data" if info.flags & _core.FLAG_IS_SUBBYTE_TYPE_PADDED
               else c.target.dtype_problem(code, bits))
    why = (f"JAX holds {name} arrays, but its DLPack import does not take them ({refusal}), "
           f"so the elements are {how}")
    if copy is False:
        return error_route(CopyRequiredError(
            f"{describe(info)} needs a copy, but copy=False: {why}. To fix: pass copy=None."),
            info, target, needs)
    dest = device or (c.cpu_device() if needs & Need.VIA_CPU
                      else c.target.device_for(int(info.device_type), info.device_id))
    return Route(COPY, f"A copy is needed: {why}.", info, target, needs=needs,
                 copy_bytes=info.nbytes, jax_device=dest, action=NUMPY_PUT)


def _unpack_problem(info: TensorInfo) -> UnsupportedDTypeError | None:
    """Why packed sub-byte data cannot be unpacked by dlinspect, or None."""
    bits = info.dtype.bits * info.dtype.lanes
    if bits and 8 % bits == 0 and info.is_c_contiguous:
        return None
    where = f"with strides {info.strides}" if bits and 8 % bits == 0 else "across byte boundaries"
    return UnsupportedDTypeError(
        f"{describe(info)} packs {bits}-bit elements {where}; dlinspect unpacks only "
        f"C-contiguous 1-, 2- and 4-bit data. To fix: ask the producer for padded storage "
        f"(one element per byte), or unpack with its own library.")


@memory_checked
def route_numpy_copy(exc: NotDescribableError, c: Any, target: str, device: Any = None,
                     copy: bool | None = None) -> Route:
    """NumPy memory DLPack cannot describe (byte order, strides; see
    :class:`~dlinspect.NotDescribableError`): one copy by NumPy into native,
    C-ordered, aligned memory (into JAX's narrowed dtype where x64 is off), or the error."""
    arr = exc.array
    head = f"a {arr.dtype.name} NumPy array of shape {arr.shape} ({arr.dtype.str})"
    if copy is False:
        return error_route(CopyRequiredError(
            f"{head} cannot be described by DLPack ({exc.why}), so only a copy gives its values, "
            f"but copy=False. To fix: pass copy=None, or make it native and C-ordered first: "
            f"numpy.ascontiguousarray(x, dtype=x.dtype.newbyteorder('='))."), None, target)
    words = f"{exc.why}; NumPy copies it into native, C-ordered memory"
    if target == "host":
        return Route(COPY, f"A copy is needed: {words}.", None, target,
                     copy_bytes=arr.nbytes, action=NUMPY_COPY)
    code, bits, lanes = dldtype_from_numpy(arr.dtype)
    needs = _core.dtype_needs(code, bits, lanes, c.target)
    if needs & (Need.DTYPE | Need.NUMPY_PUT):
        return error_route(UnsupportedDTypeError(
            f"{head} has DLDataType(code={code}, bits={bits}, lanes={lanes}), which JAX cannot "
            f"hold: {c.target.dtype_problem(code, bits)}. To fix: convert it with NumPy first "
            f"(x.astype(...))."), None, target, needs)
    warning = None
    if needs & Need.NARROW:
        ncode, nbits, warning = c.target.narrowing(code, bits)
        words += f" ({narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[1]})"
    src = device if device is not None and device.platform == "cpu" else c.cpu_device()
    return Route(COPY, f"A copy is needed: {words}; JAX views that copy.", None, target,
                 needs=needs, copy_bytes=arr.nbytes, jax_device=device or src,
                 warning=warning, action=NUMPY_COPY, import_device=src)


_PINNED_PLATFORM: dict[int, str] = {D.kDLCUDAHost: "cuda", D.kDLCUDAManaged: "cuda",
                                    D.kDLROCMHost: "rocm"}


def _route_through_host(info: TensorInfo, needs: int, c: Any, device: Any, copy: bool | None,
                        fallback: str, source: Any) -> Route:
    """Memory JAX has no device for (or vector lanes in device memory): the producer's
    host copy, else the array protocol; or the error that says why not."""
    target = "jax"
    dt = int(info.device_type)
    if needs & Need.DEVICE:
        head = (f"{describe(info)} cannot go to JAX: this JAX has no device for "
                f"{device_name(dt, info.device_id)} (platforms here: {_platforms(c)}).")
    else:
        head = (f"{describe(info)} has {info.dtype.lanes} lanes, which JAX holds only as a "
                f"trailing axis of host memory.")
    bare = _core.is_capsule(source)
    if fallback == "raise" or bare:
        tried = ("nothing: a bare capsule has no producer to ask for a host copy" if bare
                 else "nothing (fallback='raise')")
        fix = device_fix(dt, target, bare)
        if not bare:
            fix += ', or pass fallback="host" so dlinspect goes through host memory'
        return error_route(UnsupportedDeviceError(f"{head} Tried: {tried}. To fix: {fix}."),
                           info, target, needs)
    if copy is False:
        return error_route(CopyRequiredError(
            f"{head} Going through host memory needs a copy, but copy=False. To fix: pass "
            f"copy=None, or move the tensor to host memory yourself."), info, target, needs)
    warning, narrowed = None, ""
    if needs & Need.NARROW:   # the host copy is narrowed when it is imported, as JAX does
        code, bits, _ = info.dtype
        ncode, nbits, warning = c.target.narrowing(code, bits)
        narrowed = f" ({narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[1]})"
    return Route(HOST_FALLBACK,
                 f"{device_name(dt)} memory: {_host_copy_words(source)}; JAX imports that"
                 f"{narrowed}.", info, target, needs=needs, copy_bytes=info.nbytes,
                 jax_device=c.cpu_device() if device is None else device, warning=warning,
                 action=PRODUCER_COPY)


def _host_copy_words(source: Any) -> str:
    """How a host copy is asked for, in the order :func:`_core.export_host_copy` tries."""
    steps = ["the producer is asked for a host copy (__dlpack__(dl_device=(kDLCPU, 0), "
             "copy=True))"]
    steps += [f"its own x.{name}()" for name in _core.host_methods(source)]
    return ", else ".join(steps + ["numpy.asarray(x)"])


# ---- NumPy -----------------------------------------------------------------

@memory_checked
def route_host(info: TensorInfo, needs: int, copy: bool | None, source: Any) -> Route:
    """The route of a tensor with header ``info`` and ``needs`` into NumPy (pure)."""
    target = "host"
    # What the memory's structure rules out comes first: it holds whatever dtypes exist.
    problem = _lanes_problem(info, target)
    if problem is not None:
        return error_route(problem, info, target, needs)
    bits = info.dtype.bits * info.dtype.lanes
    if needs & Need.PACKED:
        problem = _unpack_problem(info)
        if problem is not None:
            return error_route(problem, info, target, needs)
    if needs & Need.DTYPE:
        name = info.dtype_name
        hint = ""
        if any(name.startswith(p) for p in ("bfloat16", "float8", "float6", "float4", "int4",
                                            "uint4", "int2", "uint2")):
            hint = (" (NumPy has no such dtype; ml_dtypes provides it: pip install -U "
                    "ml_dtypes)")
        return error_route(UnsupportedDTypeError(
            f"{describe(info)} has {_dtype_text(info)}, which has no NumPy dtype here{hint}. "
            f"To fix: convert it with its own library first."), info, target, needs)
    if needs & Need.EMPTY:
        return Route(ZERO_COPY, "The tensor is empty: NumPy gets a new empty array.", info,
                     target, needs=needs, action=EMPTY)
    if needs & Need.DEVICE:
        head = f"{describe(info)} is not in host memory."
        if _core.is_capsule(source):
            return error_route(UnsupportedDeviceError(
                f"{head} A bare capsule has no producer to ask for a host copy. To fix: "
                f"{device_fix(int(info.device_type), target, True)}."), info, target, needs)
        if copy is False:
            return error_route(CopyRequiredError(
                f"{head} Bringing it to the host needs a copy, but copy=False. To fix: pass "
                f"copy=None."), info, target, needs)
        return Route(HOST_FALLBACK, f"{device_name(int(info.device_type))} memory is not "
                     f"host-accessible: {_host_copy_words(source)}.", info,
                     target, needs=needs, copy_bytes=info.nbytes, action=PRODUCER_COPY)
    if needs & Need.PACKED:
        if copy is False:
            return error_route(CopyRequiredError(
                f"{describe(info)} packs {bits}-bit elements, while NumPy stores one per byte: "
                f"unpacking needs a copy, but copy=False. To fix: pass copy=None."),
                info, target, needs)
        return Route(COPY, f"{bits}-bit elements are packed; NumPy holds one per byte, so they "
                     f"are unpacked into a copy.", info, target, needs=needs,
                     copy_bytes=info.nbytes, action=UNPACK)
    lanes = (f"; its {info.dtype.lanes} lanes are a trailing axis"
             if needs & Need.LANES else "")
    if copy:
        return Route(COPY, f"copy=True was asked for{lanes}.", info, target, needs=needs,
                     copy_bytes=info.nbytes, action=HOST_COPY)
    return Route(ZERO_COPY, f"NumPy views the {device_name(int(info.device_type))} memory "
                 f"directly{lanes}.", info, target, needs=needs, action=HOST_VIEW)


# ---- sharded ---------------------------------------------------------------

def route_sharded(info: TensorInfo, needs: int, c: Any, sharding: Any, copy: bool | None,
                  fallback: str, readonly: str, source: Any) -> Route:
    """The route of a tensor onto a multi-device ``sharding`` (pure)."""
    target = "jax"
    local = not _shard.spans_processes(sharding)
    if local:
        problem = _shard.uneven(info.shape, sharding)
        if problem is not None:
            return error_route(ShardingError(f"{describe(info)} cannot be sharded: {problem}"),
                               info, target, needs)
        index_map = sharding.addressable_devices_indices_map(info.shape)
        if (info.host_accessible
                and not needs & (Need.DTYPE | Need.LANES | Need.PACKED | Need.NUMPY_PUT)
                and info.numpy_dtype is not None
                and all(d.platform == "cpu" for d in index_map) and _shard.default_memory(sharding)):
            share = readonly == "share"
            shards = []
            for dev, idx in index_map.items():
                part = info.sliced(idx)
                shards.append((dev, idx, route_jax(part, _core.needs(part, c.target, share), c,
                                                   dev, copy, fallback, readonly, source)))
            return _combine(info, needs, tuple(shards))
    whole = route_jax(info, needs, c, None, copy, fallback, readonly, source)
    if whole.kind == ERROR:
        return whole
    n = len(sharding.device_set)
    how = (f"JAX's device_put spreads it over the {n} devices of the sharding" if local else
           "jax.make_array_from_process_local_data spreads this process's part over its devices")
    if copy is False:
        return error_route(CopyRequiredError(
            f"{describe(info)} needs a copy, but copy=False: it is not host memory bound for CPU "
            f"devices, so {how}, which copies. To fix: pass copy=None."), info, target, needs)
    return Route(COPY, f"{whole.reason} Then {how}.", info, target, needs=needs,
                 copy_bytes=whole.copy_bytes + info.nbytes, warning=whole.warning,
                 action=DEVICE_PUT if local else PROCESS_LOCAL)


def _combine(info: TensorInfo, needs: int, shards: tuple[Any, ...]) -> Route:
    for dev, index, route in shards:
        if route.kind == ERROR:
            # The caller's tensor first, then which shard and why (in the same error type).
            shard = route.error
            why, head = str(shard), describe(route.info)
            why = why[len(head):].lstrip() if why.startswith(head) else f"cannot go: {why}"
            error = type(shard)(f"{describe(info)} cannot be sharded as asked: its shard "
                                f"{_index_text(index)} for {dev} (shape {route.info.shape}) {why}")
            error.__cause__ = shard
            return Route(ERROR, f"The shard {_index_text(index)} for {dev}: {route.reason}",
                         info, "jax", needs=needs, error=error, action=RAISE, shards=shards)
    views = sum(route.zero_copy for _, _, route in shards)
    reason = f"{views} of {len(shards)} shards are views of the producer's memory"
    first_copy = next(((d, r) for d, _, r in shards if not r.zero_copy), None)
    reason += "." if first_copy is None else f"; the shard for {first_copy[0]}: {first_copy[1].reason}"
    return Route(ZERO_COPY if first_copy is None else COPY, reason, info, "jax", needs=needs,
                 copy_bytes=sum(r.copy_bytes for _, _, r in shards),
                 warning=next((r.warning for _, _, r in shards if r.warning), None),
                 action=SPLIT, shards=shards)


# ---- options ---------------------------------------------------------------

def check_options(target: str, fallback: str, readonly: str, copy: Any = None,
                  leaves: str = "keep") -> None:
    """Raise ValueError for an option outside its documented values."""
    if copy is not None and copy is not True and copy is not False:
        raise ValueError(f"copy must be None, True or False, not {copy!r}")
    if target not in ("jax", "host"):
        raise ValueError(f"target must be 'jax' or 'host', not {target!r}")
    if fallback not in ("host", "raise"):
        raise ValueError(f"fallback must be 'host' or 'raise', not {fallback!r}")
    if readonly not in ("copy", "share"):
        raise ValueError(f"readonly must be 'copy' or 'share', not {readonly!r}")
    if leaves not in ("keep", "raise"):
        raise ValueError(f"leaves must be 'keep' or 'raise', not {leaves!r}")


def name_leaf(exc: E, path: str) -> E:
    """``exc``, its message led by the pytree key path of the leaf it is about.

    A DLInspectError's message starts with the path (``['inputs']['pixels']: ...``)
    and it gets a ``key_path`` attribute; any other exception gets a note. The
    empty path (the whole input is the leaf) changes nothing.
    """
    if not path:
        return exc
    if isinstance(exc, DLInspectError):
        if not getattr(exc, "key_path", None):
            exc.key_path = path  # type: ignore[attr-defined]
            exc.args = (f"{path}: {exc.args[0] if exc.args else ''}",) + exc.args[1:]
    elif hasattr(exc, "add_note"):
        exc.add_note(f"(dlinspect: while converting the pytree leaf {path})")
    return exc


def not_a_tensor(leaf: Any) -> NotDLPackError:
    """The error for a pytree leaf that is not a tensor, with ``leaves="raise"``."""
    return NotDLPackError(
        f"a leaf of type {type(leaf).__module__}.{type(leaf).__qualname__} is not a tensor, "
        f"and leaves='raise' was asked for. To fix: pass leaves='keep' to leave non-tensor "
        f"leaves as they are, or take it out of the batch.")


def untouched(leaf: Any, target: str, leaves: str, path: str) -> Route:
    """The route of a pytree leaf that is not a tensor."""
    if leaves == "raise":
        return error_route(name_leaf(not_a_tensor(leaf), path), None, target)
    what = f"{type(leaf).__module__}.{type(leaf).__qualname__}"
    return Route("untouched", f"Not a tensor ({what}): left as it is.", None, target,
                 action=KEEP)


def route_jax_array(x: Any, device: Any, copy: bool | None, sharding: Any = None) -> Route:
    """The route of a ``jax.Array`` (typed PRNG key arrays too): no DLPack round trip,
    only ``device_put`` or a copy; a deleted or donated one is an error route."""
    target = "jax"
    dead = _core.jax_array_problem(x)
    if dead is not None:
        return error_route(dead, None, target)
    if copy is True:
        return Route(COPY, "copy=True was asked for: JAX copies the jax.Array.", None, target,
                     copy_bytes=x.nbytes, action=IMPORT)
    want = sharding if sharding is not None else device
    if want is None:
        return Route(ZERO_COPY, "It already is a jax.Array: returned as it is (no DLPack "
                     "round trip).", None, target, action=PASS)
    if sharding is not None:
        there = x.sharding.is_equivalent_to(sharding, x.ndim)
        where = f"the sharding {sharding}"
    else:
        there = x.devices() == {device} and getattr(x.sharding, "memory_kind", None) in (
            None, device.default_memory().kind)
        where = str(device)
    if there:
        return Route(ZERO_COPY, f"It already is a jax.Array on {where}: returned as it is.",
                     None, target, jax_device=device, action=PASS)
    if copy is False:
        return error_route(CopyRequiredError(
            f"a jax.Array on {', '.join(map(str, x.devices()))} must move to {where}, which "
            f"copies, but copy=False. To fix: pass copy=None."), None, target)
    return Route(COPY, f"A copy is needed: the jax.Array moves to {where} (jax.device_put).",
                 None, target, copy_bytes=x.nbytes, jax_device=device, action=DEVICE_PUT)


def single_device(device: Any) -> Any:
    """The one ``jax.Device`` of ``device`` (a Device or a single-device Sharding)."""
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


def check_sharding(s: Any) -> Any:
    """``s`` if it is a ``jax.sharding.Sharding``, else a TypeError saying what is."""
    from jax.sharding import Sharding
    if not isinstance(s, Sharding):
        raise TypeError(f"sharding must be a jax.sharding.Sharding (or, for to_jax, a pytree of "
                        f"them), not {type(s).__name__}; e.g. NamedSharding(mesh, "
                        f"PartitionSpec('data')).")
    return s


def decide(info: TensorInfo, c: Any, target: str, *, device: Any = None, copy: bool | None = None,
           sharding: Any = None, fallback: str = "host", readonly: str = "copy",
           source: Any = None) -> Route:
    """The route of a header to ``target``: ``needs``, then the words (pure)."""
    if target == "host":
        return route_host(info, _core.needs(info), copy, source)
    needs = _core.needs(info, c.target, readonly == "share")
    if sharding is not None and not _shard.plain_device(check_sharding(sharding)):
        return route_sharded(info, needs, c, sharding, copy, fallback, readonly, source)
    if sharding is not None:
        device = sharding
    return route_jax(info, needs, c, single_device(device), copy, fallback, readonly, source)


def plan(x: Any, target: str = "jax", *, device: Any = None, copy: bool | None = None,
         sharding: Any = None, fallback: str = "host", readonly: str = "copy",
         leaves: str = "keep") -> Any:
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
        A leaf that is not a tensor (a str, a number, None's absence of leaves, a
        NumPy array of strings...; the whole of ``x`` too, when it is one) gets an
        ``"untouched"`` route, or (``"raise"``) a ``NotDLPackError`` route. The batch
        is walked as :func:`to_jax` walks it (Mappings and dataclasses included).

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
        A Mapping or dataclass of the batch cannot be rebuilt (see :func:`to_jax`).

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
    check_options(target, fallback, readonly, copy, leaves)
    if sharding is not None and device is not None:
        raise ValueError("plan takes device= or sharding=, not both; pass one of them.")
    c = None
    if target == "jax":
        from ._jaxcaps import caps
        c = caps()
    options = dict(device=device, copy=copy, sharding=sharding, fallback=fallback,
                   readonly=readonly)
    if isinstance(x, TensorInfo) or is_tensor(x):
        return _plan_one(x, c, target, options)
    flat = _tree.flatten(x)
    routes = []
    for i, leaf in enumerate(flat.leaves):
        if not is_tensor(leaf):
            routes.append(untouched(leaf, target, leaves,
                                    flat.keystr(i) if leaves == "raise" else ""))
            continue
        route = _plan_one(leaf, c, target, options)
        if route.error is not None:
            key = flat.keystr(i)
            name_leaf(route.error, key)
            route.reason = f"{key}: {route.reason}"
        routes.append(route)
    return flat.unflatten(routes)


#: Whether dlinspect takes an object as a tensor (see ``_core.is_tensor``).
is_tensor = _core.is_tensor


def _plan_one(x: Any, c: Any, target: str, options: dict[str, Any]) -> Route:
    if c is not None and isinstance(x, c.jax.Array):
        device = options["device"]
        return route_jax_array(x, None if device is None else single_device(device),
                               options["copy"], None if options["sharding"] is None
                               else check_sharding(options["sharding"]))
    if isinstance(x, TensorInfo):
        info = x
    else:
        try:
            cap, info = _core.export(x, None if c is None else c.stream_for)
        except NotDescribableError as exc:
            device = options["device"]
            return route_numpy_copy(exc.with_traceback(None), c, target,
                                    None if device is None else single_device(device),
                                    options["copy"])
        except DLInspectError as exc:
            # Without its traceback: it would hold this frame, and so the capsule, in a
            # cycle until the next garbage collection.
            return error_route(exc.with_traceback(None), None, target)
        del cap   # released unconsumed (a bare capsule stays the caller's)
    return decide(info, c, target, source=x, **options)


def explain(x: Any, target: str = "jax", **options: Any) -> str:
    """The header and the route, in a few readable lines (one block per pytree leaf).

    Takes the same arguments as :func:`plan`; reads, never consumes.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> print(dlinspect.explain(np.ones(3, np.float32), target="host"))  # doctest: +ELLIPSIS
    <TensorInfo kDLCPU:0 float32[3] ...>
    route to host: zero-copy
      NumPy views the kDLCPU memory directly.
    """
    routes = plan(x, target, **options)
    if isinstance(routes, Route):
        return _explain_one(routes, x)
    flat = _tree.flatten(routes)
    blocks = []
    for i, route in enumerate(flat.leaves):
        key = flat.keystr(i)
        if route.action is KEEP:
            blocks.append(f"{key}: untouched ({route.reason})")
        else:
            blocks.append(f"{key}:\n  " + _explain_one(route, None).replace("\n", "\n  "))
    return "\n".join(blocks)


def _explain_one(route: Route, x: Any) -> str:
    if route.info is not None:
        head = repr(route.info)
    elif route.action in (PASS, DEVICE_PUT, IMPORT) and route.error is None:
        head = "<jax.Array>" if x is None else (
            f"<jax.Array {x.dtype}[{', '.join(map(str, x.shape))}] on "
            f"{', '.join(map(str, x.devices()))}>")
    elif route.action is KEEP:
        head = "<not a tensor>"
    elif route.action is NUMPY_COPY:
        head = "<no DLPack header: DLPack cannot describe this NumPy memory>"
    else:
        head = "<no header: the export failed>"
    lines = [head, f"route to {route.target}: {route.kind}"
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
