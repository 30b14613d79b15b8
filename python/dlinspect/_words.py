"""A route and its words: one module turns a route's facts (decided in
:mod:`dlinspect._plan`) into its reason, its error and its warning (and ``explain``'s
lines). Nothing here decides; nothing parses a message.

An error's text is built from three parts: the tensor it is about (``subject``), the
first sentence (what was found and why it cannot go there) and the rest (what to do).
A route's ``reason`` is the subject and the first sentence; a shard's error inside a
sharded tensor's error is its first sentence and the rest, after the whole tensor.
"""

from __future__ import annotations

import functools
from typing import Any

from ._core import TensorInfo

from . import _facts as P
from ._core import device_name, device_row, dtype_name
from ._facts import Need
from .errors import (
    AllocationError,
    CopyRequiredError,
    DLInspectError,
    NotDLPackError,
    ShardingError,
    UnsupportedDeviceError,
    UnsupportedDTypeError,
)

__all__ = ["Route", "reason", "error", "warning", "explain_one", "explain_tree", "describe", "narrowing_text",
           "device_fix", "allocation_error", "name_leaf", "INSTALL_JAX"]

#: The one install hint for everything that needs jax.
INSTALL_JAX = "pip install 'dlinspect[jax]'"

_SUBBYTE_NAMES = ("bfloat16", "float8", "float6", "float4", "int4", "uint4", "int2", "uint2")


# ---- the route ---------------------------------------------------------------

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
        "copy-forbidden", "no-device"...); :mod:`dlinspect._words` words it.
    facts : dict
        What the words of this route rest on (the option that blocked it, the
        reasons for a copy, JAX's own reason for a dtype...).
    """

    __slots__ = ("kind", "action", "_needs", "info", "target", "copy_bytes", "jax_device",
                 "import_device", "import_type", "import_copy", "shards", "problem", "facts",
                 "key_path", "_error", "_reason")

    def __init__(self, kind: str, action: str, info: TensorInfo | None, target: str, *,
                 needs: int = 0, copy_bytes: int = 0, jax_device: Any = None,
                 import_device: Any = None, import_type: int = 1,
                 import_copy: bool | None = None, shards: tuple[Any, ...] = (),
                 problem: str | None = None, **facts: Any) -> None:
        self.kind = kind
        self.action = action             # what _execute does
        self._needs = int(needs)
        self.info: Any = info           # TensorInfo, or None (see the class's doc)
        self.target = target
        self.copy_bytes = copy_bytes
        self.jax_device = jax_device
        self.import_device = import_device   # where jaxlib imports it
        self.import_type = import_type       # dl_device_type handed to jaxlib
        self.import_copy = import_copy
        self.shards = shards
        self.problem = problem
        self.facts = facts
        self.key_path = ""
        self._error: Exception | None = None
        self._reason: str | None = None

    @property
    def needs(self) -> Need:
        return Need(self._needs)

    @property
    def zero_copy(self) -> bool:
        return self.kind == P.ZERO_COPY

    @property
    def reason(self) -> str:
        if self._reason is None:
            self._reason = reason(self)
        return self._reason

    @property
    def error(self) -> Exception | None:
        if self._error is None and self.problem is not None:
            self._error = error(self)
        return self._error

    @property
    def warning(self) -> str | None:
        return warning(self)

    def __repr__(self) -> str:
        return f"<Route {self.kind} to {self.target}: {self.reason}>"


# ---- shared phrases ------------------------------------------------------------

def describe(info: Any) -> str:
    """``"a float32 tensor of shape (2, 3) on kDLCPU:0"`` (``"an int64 ..."``)."""
    name = info.dtype_name
    article = "an" if name[:1] in "aeio" else "a"   # an int64, a uint8, a float32
    return (f"{article} {name} tensor of shape {info.shape} on "
            f"{device_name(info.device_type, info.device_id)}")


@functools.lru_cache(maxsize=64)
def narrowing_text(name: str, narrowed: str) -> tuple[str, str]:
    """(warning, reason) for JAX's x64 narrowing of dtype ``name`` to ``narrowed``."""
    return (f"{name} is narrowed to {narrowed} because JAX's x64 mode is off (values may "
            f"change, as jax.dlpack.from_dlpack does); to keep 64 bits, call "
            f'jax.config.update("jax_enable_x64", True) first.',
            f"JAX narrows {name} to {narrowed} with x64 off")


def device_fix(device_type: int, target: str, bare_capsule: bool) -> str:
    """What to do about memory on ``device_type`` that could not reach ``target``.

    Never sends the user to an option that just failed: ``fallback="host"`` is named
    only for ``to_jax`` with a producer (a bare capsule has none to ask).
    """
    row = device_row(int(device_type))
    parts = [f"move it to host memory with its own library first ({row.to_host})"]
    if bare_capsule:
        parts.append("or pass the producer object instead of its capsule, so dlinspect can "
                     "ask it for a host copy")
    if target == "jax" and row.plugin:
        parts.append(f"or install {row.plugin} so JAX can take the memory where it is")
    return ", ".join(parts)


def allocation_error(nbytes: int, what: str, total: int | None) -> AllocationError:
    """The error for a copy of ``nbytes`` that cannot be allocated (plan and execution)."""
    return AllocationError(" ".join(_allocation_words(nbytes, what, total)))


def _allocation_words(nbytes: int, what: str, total: int | None) -> tuple[str, str]:
    have = f"; this machine has {total} bytes of physical memory" if total else ""
    return (f"{what} needs a copy of {nbytes} bytes, which cannot be allocated{have}; nothing "
            f"was consumed.", "To fix: copy a smaller part (slice it first), or make it "
            "contiguous with its own library where it fits.")


def name_leaf(exc: Any, path: str) -> Any:
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


def _dtype_text(info: Any) -> str:
    code, bits, lanes = info.dtype
    return f"DLDataType(code={code}, bits={bits}, lanes={lanes}) ({info.dtype_name})"


def _strides_word(info: Any) -> str:
    if info.is_compact:   # only on a jaxlib that reads every layout as row-major (< 0.8)
        return "a permuted (transposed) order, which this jaxlib reads as row-major"
    return ("broadcast (stride 0)" if info.has_broadcast else
            "negative strides" if info.has_negative_strides else "gaps between elements")


def _narrowed(facts: dict[str, Any]) -> str:
    code, bits, ncode, nbits, _ = facts["narrow"]
    return narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[1]


def _host_copy_words(methods: tuple[str, ...], into: str | None = None) -> str:
    """How a host copy is asked for, in the order the executor tries."""
    steps = [f"the producer copies it into aligned host memory dlinspect allocates "
             f"({'out.copy_(x)' if into == 'torch' else f'x.{into}(out)'}), which is viewed"
             ] if into else []
    steps += ["the producer is asked for a host copy (__dlpack__(dl_device=(kDLCPU, 0), "
              "copy=True))"]
    steps += [f"its own x.{name}()" for name in methods]
    return ", else ".join(steps + ["numpy.asarray(x)"])


def _copy_reasons(route: Any) -> tuple[list[str], list[str]]:
    """Why a JAX route copies (or would), with the fix for each: from its needs, its
    devices and ``copy=True``."""
    info, needs, f = route.info, route.needs, route.facts
    reasons: list[str] = []
    fixes: list[str] = []
    if needs & Need.LAYOUT:
        reasons.append(f"strides {info.strides} for shape {info.shape} have "
                       f"{_strides_word(info)}" + ("" if f.get("permuted") else
                                                    ", which JAX cannot view"))
        fixes.append("make it contiguous first (numpy.ascontiguousarray, t.contiguous())")
    if needs & Need.READ_ONLY:
        reasons.append("the producer marked it read-only (pass readonly='share' to import it "
                       "without a copy)")
        fixes.append("readonly='share'")
    if needs & Need.ALIGN:
        align = f["align"]
        reasons.append(f"its data pointer {info.data_ptr:#x} is {info.alignment}-byte aligned "
                       f"and XLA:CPU views only {align}-byte aligned memory")
        fixes.append(f"allocate {align}-byte aligned memory (dlinspect.testing.aligned_empty; "
                     f"torch tensors are)")
    if needs & Need.NARROW:
        reasons.append(_narrowed(f))
        fixes.append('jax.config.update("jax_enable_x64", True)')
    if f["dest"] != f["src"]:
        reasons.append(f"it moves from {f['src']} to {f['dest']}")
    if f.get("copy_true"):
        reasons.append("copy=True was asked for")
    return reasons, fixes


def _lanes_text(info: Any) -> str:
    lanes = info.dtype.lanes
    return (f"its {lanes} lanes become a trailing axis of {info.numpy_dtype} "
            f"(shape {info.shape + (lanes,)})")


def _numpy_put_words(route: Any) -> str:
    f = route.facts
    how = ("unpacked into one element per byte, then copied by jax.device_put"
           if route.needs & Need.PACKED else "viewed by NumPy (one element per byte) and "
           "copied by jax.device_put")
    refusal = f["refusal"] or "it takes no padded sub-byte data"
    return (f"JAX holds {route.info.dtype_name} arrays, but its DLPack import does not take "
            f"them ({refusal}), so the elements are {how}")


def _no_device_head(route: Any) -> str:
    info, f = route.info, route.facts
    if f.get("lanes_only"):
        return (f"{describe(info)} has {info.dtype.lanes} lanes, which JAX holds only as a "
                f"trailing axis of host memory.")
    platforms = ", ".join(sorted(f["platforms"])) or "none"
    return (f"{describe(info)} cannot go to JAX: this JAX has no device for "
            f"{device_name(int(info.device_type), info.device_id)} (platforms here: {platforms}).")


def _numpy_head(f: dict[str, Any]) -> str:
    arr = f["array"]
    return f"a {arr.dtype.name} NumPy array of shape {arr.shape} ({arr.dtype.str})"


def _spread_words(f: dict[str, Any]) -> str:
    """The step that copies after the import, for a tensor spread over a sharding."""
    return (f"JAX's device_put copies it over the {f['ndevices']} devices of the sharding"
            if f["local"] else
            "jax.make_array_from_process_local_data copies this process's part onto its "
            "devices")


def _index_text(index: tuple[slice, ...]) -> str:
    parts = [":" if sl == slice(None) else
             f"{'' if sl.start is None else sl.start}:{'' if sl.stop is None else sl.stop}"
             + (f":{sl.step}" if sl.step not in (None, 1) else "") for sl in index]
    return f"[{', '.join(parts)}]"


def _where(f: dict[str, Any]) -> str:
    where = f["where"]
    return f"the sharding {where}" if hasattr(where, "device_set") else str(where)


# ---- errors: (type, subject, first sentence, what to do) ----------------------------

def _parts(route: Any) -> tuple[type[Exception], str, str, str]:
    """The error of an error route, in parts (see the module's doc)."""
    p, info, f, t = route.problem, route.info, route.facts, route.target
    subject = describe(info) if info is not None else ""
    if p == "lanes-share-bytes":
        code, bits, lanes = info.dtype
        return (UnsupportedDTypeError, subject,
                f"has {_dtype_text(info)}: {lanes} lanes of {bits} bits share each byte, so they "
                f"cannot become an axis of {'JAX' if t == 'jax' else 'NumPy'} elements.",
                "To fix: unpack it with its own library first (e.g. torch: view the bytes as "
                "uint8).")
    if p == "dtype":
        return (UnsupportedDTypeError, subject,
                f"has {_dtype_text(info)}, which JAX cannot hold: {f['why']}.",
                "To fix: convert it with its own library first (e.g. t.float() or "
                "t.view(torch.uint8))"
                + (", or take it as NumPy with dlinspect.to_host." if f["host_ok"] else "."))
    if p == "host-dtype":
        name = info.dtype_name
        hint = (" (NumPy has no such dtype; ml_dtypes provides it: pip install -U ml_dtypes)"
                if name.startswith(_SUBBYTE_NAMES) else "")
        return (UnsupportedDTypeError, subject,
                f"has {_dtype_text(info)}, which has no NumPy dtype here{hint}.",
                "To fix: convert it with its own library first.")
    if p == "numpy-dtype":
        code, bits, lanes = f["dtype"]
        return (UnsupportedDTypeError, _numpy_head(f),
                f"has DLDataType(code={code}, bits={bits}, lanes={lanes}), which JAX cannot "
                f"hold: {f['jax_why']}.", "To fix: convert it with NumPy first (x.astype(...)).")
    if p == "layout-not-host":
        return (UnsupportedDeviceError, subject,
                f"has strides {info.strides}, which JAX cannot import, and its memory is not "
                f"host-accessible for dlinspect to copy.",
                "To fix: make it contiguous with its own library first (torch: t.contiguous()).")
    if p == "no-device":
        dt, bare = int(info.device_type), f["bare"]
        if t == "host":
            return (UnsupportedDeviceError, subject,
                    "is not in host memory. A bare capsule has no producer to ask for a host "
                    "copy.", f"To fix: {device_fix(dt, t, True)}.")
        tried = ("nothing: a bare capsule has no producer to ask for a host copy" if bare
                 else "nothing (fallback='raise')")
        fix = device_fix(dt, t, bare)
        if not bare:
            fix += ', or pass fallback="host" so dlinspect goes through host memory'
        return (UnsupportedDeviceError, "", _no_device_head(route),
                f"Tried: {tried}. To fix: {fix}.")
    if p == "copy-forbidden":
        return _copy_forbidden(route, subject)
    if p == "packed-copy":
        bits = info.dtype.bits * info.dtype.lanes
        return (UnsupportedDTypeError, subject,
                f"packs {bits}-bit elements and needs a copy ({'; '.join(_copy_reasons(route)[0])}"
                f"), but dlinspect copies packed sub-byte data only into NumPy (dlinspect.to_host "
                f"unpacks it).", "To fix: give JAX aligned, contiguous memory, or unpack it with "
                "its own library first.")
    if p == "unpack":
        bits = info.dtype.bits * info.dtype.lanes
        where = (f"with strides {info.strides}" if bits and 8 % bits == 0
                 else "across byte boundaries")
        return (UnsupportedDTypeError, subject,
                f"packs {bits}-bit elements {where}; dlinspect unpacks only C-contiguous 1-, 2- "
                f"and 4-bit data.", "To fix: ask the producer for padded storage (one element "
                "per byte), or unpack with its own library.")
    if p == "allocation":
        first, rest = _allocation_words(f["nbytes"], subject or "the tensor", f["total"])
        return AllocationError, "", first, rest
    if p == "uneven":
        return ShardingError, subject, f"cannot be sharded: {_uneven_words(f)}", ""
    if p == "shard":
        dev, index, shard = f["shard"]
        _, _, first, rest = _parts(shard)
        return (type(shard.error), subject,
                f"cannot be sharded as asked: its shard {_index_text(index)} for {dev} (shape "
                f"{shard.info.shape}) {first}", rest)
    if p == "not-a-tensor":
        tp = f["leaf_type"]
        return (NotDLPackError, "",
                f"a leaf of type {tp.__module__}.{tp.__qualname__} is not a tensor, and "
                f"leaves='raise' was asked for.", "To fix: pass leaves='keep' to leave "
                "non-tensor leaves as they are, or take it out of the batch.")
    raise AssertionError(f"a route problem without words: {p!r}")


def _copy_forbidden(route: Any, subject: str) -> tuple[type[Exception], str, str, str]:
    f, t = route.facts, route.target
    if f.get("numpy_copy"):
        return (CopyRequiredError, _numpy_head(f),
                f"cannot be described by DLPack ({f['why']}), so only a copy gives its values, "
                f"but copy=False.", "To fix: pass copy=None, or make it native and C-ordered "
                "first: numpy.ascontiguousarray(x, dtype=x.dtype.newbyteorder('=')).")
    if "jax_array" in f:
        devices = ", ".join(map(str, f["jax_array"].devices()))
        return (CopyRequiredError, "", f"a jax.Array on {devices} must move to {_where(f)}, "
                f"which copies, but copy=False.", "To fix: pass copy=None.")
    if f.get("through_host"):
        if t == "host":
            return (CopyRequiredError, subject, "is not in host memory. Bringing it to the host "
                    "needs a copy, but copy=False.", "To fix: pass copy=None.")
        return (CopyRequiredError, "", f"{_no_device_head(route)} Going through host memory "
                f"needs a copy, but copy=False.", "To fix: pass copy=None, or move the tensor "
                "to host memory yourself.")
    if f.get("put"):
        return (CopyRequiredError, subject, f"needs a copy, but copy=False: "
                f"{_numpy_put_words(route)}.", "To fix: pass copy=None.")
    if f.get("spread"):
        return (CopyRequiredError, subject, f"needs a copy, but copy=False: it is not host "
                f"memory bound for CPU devices, so {_spread_words(f)}, which copies.",
                "To fix: pass copy=None.")
    if t == "host":   # packed sub-byte data unpacked into NumPy
        bits = route.info.dtype.bits * route.info.dtype.lanes
        return (CopyRequiredError, subject, f"packs {bits}-bit elements, while NumPy stores one "
                f"per byte: unpacking needs a copy, but copy=False.", "To fix: pass copy=None.")
    reasons, fixes = _copy_reasons(route)
    return (CopyRequiredError, subject, f"needs a copy, but copy=False: {'; '.join(reasons)}.",
            f"To fix: {', or '.join(['pass copy=None'] + fixes)}.")


def _uneven_words(f: dict[str, Any]) -> str:
    sharding, u = f["sharding"], f["uneven"]
    if u[0] == "ndim":
        _, ndim, why = u
        return (f"{sharding} does not fit a tensor of {ndim} dimensions ({why}). To fix: give "
                f"this leaf a PartitionSpec with at most {ndim} entries, e.g. PartitionSpec() "
                f"to replicate it.")
    _, axis, size, count, ndevices = u
    where = "the batch axis (axis 0)" if axis == 0 else f"axis {axis}"
    return (f"{where} has {size} elements, which do not split evenly into the {count} shards "
            f"the sharding cuts it into ({ndevices} devices). To fix: make it a multiple of "
            f"{count} (e.g. DataLoader(..., drop_last=True), or pad the last batch), or "
            f"replicate this leaf with PartitionSpec().")


def error(route: Any) -> Exception | None:
    """The exception executing ``route`` raises (None unless its kind is "error")."""
    if route.problem is None:
        return None
    if route.problem == "raised":
        exc = route.facts["cause"]
    else:
        cls, subject, first, rest = _parts(route)
        exc = cls(" ".join(s for s in (subject, first, rest) if s))
        if route.problem == "shard":
            exc.__cause__ = route.facts["shard"][2].error
    return name_leaf(exc, route.key_path)


# ---- reasons -------------------------------------------------------------------

def reason(route: Any) -> str:
    """One sentence: why ``route`` (for an error, what was found; led by its key path)."""
    text = _reason(route)
    return f"{route.key_path}: {text}" if route.key_path and route.problem else text


def _reason(route: Any) -> str:
    a, info, f, t = route.action, route.info, route.facts, route.target
    if route.problem == "raised":
        return str(f["cause"])
    if route.problem == "shard":
        dev, index, shard = f["shard"]
        return f"The shard {_index_text(index)} for {dev}: {shard.reason}"
    if route.problem is not None:
        _, subject, first, _ = _parts(route)
        return f"{subject} {first}" if subject else first
    if a == P.KEEP:
        tp = f["leaf_type"]
        return f"Not a tensor ({tp.__module__}.{tp.__qualname__}): left as it is."
    if "jax_array" in f:
        if a == P.ARRAY_COPY:
            return "copy=True was asked for: JAX copies the jax.Array."
        if a == P.PASS:
            return (f"It already is a jax.Array on {_where(f)}: returned as it is." if "where"
                    in f else "It already is a jax.Array: returned as it is (no DLPack round "
                    "trip).")
        return f"A copy is needed: the jax.Array moves to {_where(f)} (jax.device_put)."
    if a == P.EMPTY:
        return ("The tensor is empty: JAX gets a new empty array; no byte is copied." if t == "jax"
                else "The tensor is empty: NumPy gets a new empty array.")
    if a == P.PRODUCER_COPY:
        where = device_name(int(info.device_type))
        words = _host_copy_words(f["methods"], f.get("into"))
        if t == "host":
            return f"{where} memory is not host-accessible: {words}."
        narrowed = f" ({_narrowed(f)})" if f.get("narrow") else ""
        return f"{where} memory: {words}; JAX imports that{narrowed}."
    if a == P.NUMPY_PUT:
        return f"A copy is needed: {_numpy_put_words(route)}."
    if a == P.NUMPY_COPY:
        words = f"{f['why']}; NumPy copies it into native, C-ordered memory"
        if t == "host":
            return f"A copy is needed: {words}."
        narrowed = f" ({_narrowed(f)})" if f.get("narrow") else ""
        return f"A copy is needed: {words}{narrowed}; JAX views that copy."
    if a == P.SPLIT:
        views = sum(r.zero_copy for _, _, r in route.shards)
        text = f"{views} of {len(route.shards)} shards are views of the producer's memory"
        copying = f["copying"]
        return text + ("." if copying is None else f"; the shard for {copying[0]}: "
                       f"{copying[1].reason}")
    if a in (P.DEVICE_PUT, P.PROCESS_LOCAL):
        whole = f["whole"]
        if whole.zero_copy:
            return (f"A copy is needed: JAX first views the producer's memory, then "
                    f"{_spread_words(f)} (the one copy).")
        return (f"Two copies: {whole.reason[0].lower()}{whole.reason[1:-1]}; then "
                f"{_spread_words(f)}.")
    if t == "host":
        lanes = f"; its {info.dtype.lanes} lanes are a trailing axis" if info.dtype.lanes != 1 else ""
        if a == P.UNPACK:
            bits = info.dtype.bits * info.dtype.lanes
            return (f"{bits}-bit elements are packed; NumPy holds one per byte, so they are "
                    f"unpacked into a copy.")
        if a == P.HOST_COPY:
            return f"copy=True was asked for{lanes}."
        return f"NumPy views the {device_name(int(info.device_type))} memory directly{lanes}."
    # JAX, the main routes
    as_axis = bool(route.needs & P.Need.LANES)
    if route.kind == P.ZERO_COPY:
        if as_axis:
            text = _lanes_text(info)
            return (f"{text[0].upper()}{text[1:]}; JAX views the producer's memory on "
                    f"{f['dest']}.")
        if route.needs & P.Need.VIA_CPU:
            dt = int(info.device_type)
            return (f"{device_name(dt)} memory is host memory: JAX's CPU backend views it "
                    f"without a copy (no {device_row(dt).platform or 'device'} "
                    f"backend here).")
        return f"JAX views the producer's memory on {f['dest']}."
    reasons = _copy_reasons(route)[0] + ([_lanes_text(info)] if as_axis else [])
    return f"A copy is needed: {'; '.join(reasons)}."


def warning(route: Any) -> str | None:
    """The DLInspectWarning executing ``route`` emits: 64-bit narrowing with x64 off."""
    narrow = route.facts.get("narrow") if route.problem is None else None
    if not narrow or not narrow[4]:
        return None
    code, bits, ncode, nbits, _ = narrow
    return narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[0]


# ---- explain -------------------------------------------------------------------

def explain_tree(flat: Any) -> str:
    """``explain``'s text for a batch's routes (a :class:`dlinspect._tree.Flat` of them)."""
    blocks = []
    for i, route in enumerate(flat.leaves):
        key = flat.keystr(i)
        if route.action is P.KEEP:
            blocks.append(f"{key}: untouched ({route.reason})")
        else:
            blocks.append(f"{key}:\n  " + explain_one(route, None).replace("\n", "\n  "))
    return "\n".join(blocks)


def explain_one(route: Any, x: Any) -> str:
    """``explain``'s lines for one route (``x``: the tensor, for a jax.Array's head)."""
    if route.info is not None:
        head = repr(route.info)
    elif "jax_array" in route.facts and route.error is None:
        head = "<jax.Array>" if x is None else (
            f"<jax.Array {x.dtype}[{', '.join(map(str, x.shape))}] on "
            f"{', '.join(map(str, x.devices()))}>")
    elif route.action is P.KEEP:
        head = "<not a tensor>"
    elif route.action is P.NUMPY_COPY or route.facts.get("numpy_copy"):
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
