"""The words of a route (reason, error, warning, ``explain``'s lines), from the facts the
core's decision put in it; nothing here decides or parses a message. An error is three parts:
``subject`` (the tensor), the first sentence (what was found) and the rest (what to do); a
``reason`` is the first two. Below the core: it imports nothing of it.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from . import _tables as T
from ._tables import NUMPY_MAX_NDIM, DLDataTypeCode as Code, Need, device_name, device_row, dtype_name
from .errors import (AllocationError, CopyRequiredError, DLInspectError, MalformedTensorError,
                     NotDLPackError, ShardingError, UnsupportedDeviceError, UnsupportedDTypeError,
                     UnsupportedShapeError)

def first_line(exc: BaseException, typed: bool = True) -> str:
    """The first line of ``exc``'s message, after ``"TypeName: "`` where ``typed``."""
    line = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {line}" if typed else line


def type_name(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def into_call(into: str) -> str:
    return "out.copy_(x)" if into == "torch" else f"x.{into}(out)"


INSTALL_JAX = "pip install 'dlinspect[jax]'"

Parts = tuple[type[Exception], str, str, str]
_RELAYOUT = ("the jax.Array keeps another layout than JAX's row-major one (as jax.dlpack.from_dlpack "
             "gives a transpose), and jax.device_put moves such an array wrong")


def describe(info: Any) -> str:
    """``"a float32 tensor of shape (2, 3) on kDLCPU:0"`` (``"an int64 ..."``)."""
    return (f"{'an' if info.dtype_name[:1] in 'aeio' else 'a'} {info.dtype_name} tensor of shape "
            f"{info.shape} on {device_name(info.device_type, info.device_id)}")


@functools.lru_cache(maxsize=64)
def narrowing_text(name: str, narrowed: str) -> tuple[str, str]:
    """(warning, reason) for JAX's x64 narrowing of dtype ``name`` to ``narrowed``."""
    return (f"{name} is narrowed to {narrowed} because JAX's x64 mode is off (an integer "
            f"keeps its low 32 bits: 2**40 + 5 becomes 5; a float past float32's range becomes "
            f"inf, the others are rounded; as jax.dlpack.from_dlpack does); to keep 64 bits, call "
            f'jax.config.update("jax_enable_x64", True) first; where {narrowed} is what you '
            f'want, pass narrow="ok" to narrow without this warning.',
            f"JAX narrows {name} to {narrowed} with x64 off")


def device_fix(device_type: int, target: str, bare_capsule: bool) -> str:
    """What to do about memory on ``device_type`` that could not reach ``target``; never
    an option that just failed (``fallback="host"`` is for ``to_jax`` with a producer)."""
    row = device_row(device_type)
    parts = [f"move it to host memory with its own library first ({row.to_host})"]
    if bare_capsule:
        parts.append("or pass the producer object instead of its capsule, so dlinspect can "
                     "ask it for a host copy")
    if target == "jax" and row.plugin:
        parts.append(f"or install {row.plugin} so JAX can take the memory where it is")
    return ", ".join(parts)


def allocation_error(nbytes: int, what: str, total: int | None) -> AllocationError:
    return AllocationError(" ".join(_allocation(nbytes, what, total)[2:]))


def _allocation(nbytes: int, what: str, total: int | None) -> Parts:
    have = f"; this machine has {total} bytes of physical memory" if total else ""
    return (AllocationError, "", f"{what} needs a copy of {nbytes} bytes, which cannot be "
            f"allocated{have}; nothing was consumed.", "To fix: copy a smaller part (slice it "
            "first), or make it contiguous with its own library where it fits.")


def name_leaf(exc: Any, path: str) -> Any:
    """``exc`` named by a leaf's key path: a DLInspectError's message starts with it (and
    ``key_path`` holds it); any other exception gets a note."""
    if not path or getattr(exc, "key_path", None):   # (a DLInspectError is named once)
        return exc
    if isinstance(exc, DLInspectError):
        exc.key_path = path  # type: ignore[attr-defined]
        exc.args = (f"{path}: {exc.args[0] if exc.args else ''}",) + exc.args[1:]
    else:
        exc.add_note(f"(dlinspect: while converting the pytree leaf {path})")
    return exc


def _dtype_text(info: Any) -> str:
    return f"{info.dtype!r} ({info.dtype_name})"   # DLDataType(code=2, bits=32, lanes=1)


def _strides_word(info: Any) -> str:
    if info.is_c_contiguous:   # row-major but for an extent-1 axis (unit_strides_ok)
        return ("a stride on an axis of extent 1 other than the row-major one, from which "
                "this jaxlib (0.4) infers a layout its own jit refuses")
    if info.is_compact:   # a jaxlib < 0.8, which reads every layout as row-major
        return "a permuted (transposed) order, which this jaxlib (older than 0.8) reads as row-major"
    if info.has_broadcast:
        return "broadcast (stride 0)"
    if info.has_negative_strides:
        return "negative strides"
    return "gaps between elements"


#: Why a JAX route copies, per need: (the reason, the fix), from the route.
_COPY_NEEDS = {
    Need.LAYOUT: lambda r: (
        f"strides {r.info.strides} for shape {r.info.shape} have {_strides_word(r.info)}"
        + ("" if r.facts.get("permuted") else ", which JAX cannot view"),
        "make it contiguous first (numpy.ascontiguousarray, t.contiguous())"),
    Need.PERMUTED: lambda r: (
        f"strides {r.info.strides} for shape {r.info.shape} are a permuted (transposed) order, "
        f"and the arrays JAX hands out are row-major (a view in this order would be an array "
        f"pinned to its device, which jax.device_put then moves with its values scrambled)",
        "import the row-major tensor it is a view of and permute it in JAX "
        "(to_jax(a).T for a.T, jnp.transpose(to_jax(t), axes) for t.permute(axes))"),
    Need.READ_ONLY: lambda r: (
        "the producer marked it read-only " + (
            "(pass readonly='share' to import it without a copy)" if _only_read_only(r) else
            "(readonly='share' lifts this reason, not the others)"), "readonly='share'"),
    Need.ALIGN: lambda r: (
        f"its data pointer {r.info.data_ptr:#x} is {r.info.alignment}-byte aligned and "
        f"XLA:CPU views only {r.facts['align']}-byte aligned memory",
        f"make batches with dlinspect.stack, or allocate {r.facts['align']}-byte aligned memory "
        f"(dlinspect.testing.aligned_empty; torch tensors are)"),
    Need.NARROW: lambda r: (narrowing_warning(r.facts["narrow"], True),
                         'jax.config.update("jax_enable_x64", True)'),
    Need.ALIASED: lambda r: (
        "the batch is not shown to own its memory: something outside the batch holds it and "
        "could write it while a view lives (the source's variable, attribute or list, another "
        "array or tensor over the same memory), or holds the batch (the tuple enumerate or zip "
        "keeps, a wrapping generator such as tqdm's, a helper's caller), or its producer "
        "proves nothing (to view it: new memory per batch, np.stack or torch's collate, "
        "converted where the loop unpacks it)",
        "convert where the loop takes the batch, unpacked there (for x, y in loader: "
        "to_jax((x, y)); for step, (x, y) in enumerate(loader) keeps a tuple), from a source "
        "that hands over new memory for every batch (np.stack, torch's default collate, "
        "dlinspect.stack); or pass copy=False where nothing writes a batch once handed over"),
}


def _only_read_only(route: Any) -> bool:
    """Read-only memory is the one reason the route copies: sharing it copies nothing."""
    f = route.facts
    return (sum(bool(route.needs & need) for need in _COPY_NEEDS) == 1   # (READ_ONLY's own)
            and f["dest"] == f["src"] and not f.get("copy_true"))


def _copy_reasons(route: Any) -> tuple[list[str], list[str]]:
    """Why a JAX route copies (or would), and the fix for each."""
    f = route.facts
    found = [words(route) for need, words in _COPY_NEEDS.items() if route.needs & need]
    reasons, fixes = [r for r, _ in found], [fix for _, fix in found]
    if f["dest"] != f["src"]:
        reasons.append(f"it moves from {f['src']} to {f['dest']}")
    if f.get("copy_true"):
        reasons.append("copy=True was asked for")
    return reasons, fixes


def _lanes_text(info: Any) -> str:
    return (f"its {info.dtype.lanes} lanes become a trailing axis of {info.numpy_dtype} "
            f"(shape {info.shape + (info.dtype.lanes,)})")


def _numpy_put_words(route: Any) -> str:
    how = ("unpacked into one element per byte, then copied by jax.device_put"
           if route.needs & Need.PACKED else "viewed by NumPy (one element per byte) and "
           "copied by jax.device_put")
    refusal = route.facts["refusal"] or "it takes no padded sub-byte data"
    return (f"JAX holds {route.info.dtype_name} arrays, but its DLPack import does not take "
            f"them ({refusal}), so the elements are {how}")


_VIA_HOST = ', or pass fallback="host" so dlinspect goes through host memory'


def _no_jax_device(what: str, device_type: int, device_id: int, platforms: Any) -> str:
    return (f"{what} cannot go to JAX: this JAX has no device for {device_name(device_type, device_id)}"
            f" (platforms here: {', '.join(sorted(platforms)) or 'none'}).")


def _no_device_head(route: Any) -> str:
    info = route.info
    if route.facts.get("lanes_only"):
        return (f"{describe(info)} has {info.dtype.lanes} lanes, which JAX holds only as a "
                f"trailing axis of host memory.")
    return _no_jax_device(describe(info), info.device_type, info.device_id, route.facts["platforms"])


def not_asked(x: Any, device_type: int, device_id: int, platforms: Any) -> str:
    """``fallback="raise"``'s error for a producer whose ``__dlpack_device__`` JAX has no device for."""
    what = f"a {type_name(type(x))} on {device_name(device_type, device_id)}"
    return (f"{_no_jax_device(what, device_type, device_id, platforms)} Tried: nothing "
            f"(fallback='raise'; the producer was not asked to export). To fix: "
            f"{device_fix(device_type, 'jax', False)}{_VIA_HOST}.")


def _array_head(f: dict[str, Any]) -> str:
    """A NumPy array (facts "array") or a jax.Array (facts "jax_array") a route has no header of."""
    arr, kind = (f["array"], "NumPy array") if "array" in f else (f["jax_array"], "jax.Array")
    return f"a {arr.dtype.name} {kind} of shape {arr.shape} ({arr.dtype.str})"


def _spread_words(f: dict[str, Any]) -> str:
    """The step that copies after the import, for a tensor spread over a sharding."""
    return (f"JAX's device_put copies it over the {f['ndevices']} devices of the sharding"
            if f["local"] else
            "jax.make_array_from_process_local_data copies this process's part onto its devices")


def _index_text(index: tuple[slice, ...]) -> str:
    parts = [f"{'' if sl.start is None else sl.start}:{'' if sl.stop is None else sl.stop}"
             + (f":{sl.step}" if sl.step not in (None, 1) else "") for sl in index]
    return f"[{', '.join(parts)}]"


def _where(f: dict[str, Any]) -> str:
    where = f["where"]
    return f"the sharding {where}" if hasattr(where, "device_set") else str(where)


def _subject(route: Any) -> str:
    return describe(route.info) if route.info else ""


def _lanes_share_bytes(route: Any) -> Parts:
    info = route.info
    return (UnsupportedDTypeError, _subject(route),
            f"has {_dtype_text(info)}: {info.dtype.lanes} lanes of {info.dtype.bits} bits share each byte, "
            f"so they cannot become an axis of {'JAX' if route.target == 'jax' else 'NumPy'} elements.",
            "To fix: unpack it with its own library first (e.g. torch: view the bytes as uint8).")


def _shape(route: Any) -> Parts:
    info = route.info
    into = "NumPy" if route.target == "host" else "JAX"
    lanes = info.dtype[2] != 1
    if info.ndim + lanes > NUMPY_MAX_NDIM:
        why = (f"it has {info.ndim} dimensions" + (", and its vector lanes one more" if lanes else "")
               + f", and the NumPy arrays it goes through hold at most {NUMPY_MAX_NDIM}")
        fix = "reshape it to fewer dimensions with its own library first"
    else:
        why = (f"it has no elements, but its nonzero extents multiply past 2**63 - 1 bytes, "
               f"which no {into} array can have (NumPy refuses one, XLA aborts on one)")
        fix = "make the empty tensor with smaller extents (any one zero extent makes it empty)"
    return (UnsupportedShapeError, _subject(route), f"cannot go to {into}: {why}; nothing was "
            f"consumed.", f"To fix: {fix}.")


def _widen(route: Any) -> str:
    """"convert it to complex64 first (t.to(torch.complex64))": the narrowest standard dtype."""
    code, bits, _ = route.info.dtype
    if code == Code.kDLOpaqueHandle:   # no values an array type could hold: no dtype helps
        return ("read it with the library that made it: an opaque handle's bytes mean "
                "nothing as numbers, and no dtype conversion gives them a meaning")
    kind = {Code.kDLComplex: "complex", Code.kDLInt: "int", Code.kDLUInt: "uint"}.get(code, "float")
    wide = f"{kind}{max(bits * 2, 64)}" if kind == "complex" else f"{kind}{max(bits, 32)}"
    return f"convert it to {wide} first ({route.facts['astype'].format(wide)})"


def _dtype(route: Any) -> Parts:
    return (UnsupportedDTypeError, _subject(route),
            f"has {_dtype_text(route.info)}, which JAX cannot hold: {route.facts['why']}.",
            f"To fix: {_widen(route)}" + (", or take it as NumPy with dlinspect.to_host."
                                          if route.facts["host_ok"] else "."))


def _host_dtype(route: Any) -> Parts:
    info = route.info
    # (a row of the dtype table NumPy has no dtype for here is one of ml_dtypes')
    hint = (" (NumPy has no such dtype; ml_dtypes provides it: pip install -U ml_dtypes)"
            if info.dtype[:2] in T.DTYPES else "")
    return (UnsupportedDTypeError, _subject(route),
            f"has {_dtype_text(info)}, which has no NumPy dtype here{hint}.",
            f"To fix: {_widen(route)}.")


def _numpy_dtype(route: Any) -> Parts:
    f = route.facts
    return (UnsupportedDTypeError, _array_head(f),
            f"has {T.DLDataType(*f['dtype'])!r}, which JAX cannot "
            f"hold: {f['jax_why']}.", "To fix: convert it with NumPy first (x.astype(...)).")


def _layout_not_host(route: Any) -> Parts:
    return (UnsupportedDeviceError, _subject(route),
            f"has strides {route.info.strides}, which JAX cannot import, and its memory is "
            f"not host-accessible for dlinspect to copy.",
            "To fix: make it contiguous with its own library first"
            + (f" ({route.facts['contiguous']})." if route.facts.get("contiguous") else "."))


def _no_device(route: Any) -> Parts:
    dt, bare, t = route.info.device_type, route.facts["bare"], route.target
    if t == "host":
        return (UnsupportedDeviceError, _subject(route),
                "is not in host memory. A bare capsule has no producer to ask for a host "
                "copy.", f"To fix: {device_fix(dt, t, True)}.")
    tried = ("nothing: a bare capsule has no producer to ask for a host copy" if bare
             else "nothing (fallback='raise')")
    fix = device_fix(dt, t, bare) + ("" if bare else _VIA_HOST)
    return (UnsupportedDeviceError, "", _no_device_head(route), f"Tried: {tried}. To fix: {fix}.")


def _packed_copy(route: Any) -> Parts:
    return (UnsupportedDTypeError, _subject(route),
            f"packs {route.info.dtype.bits * route.info.dtype.lanes}-bit elements and needs a "
            f"copy ({'; '.join(_copy_reasons(route)[0])}), but dlinspect copies packed sub-byte "
            f"data only into NumPy (dlinspect.to_host unpacks it).", "To fix: give JAX aligned, "
            "contiguous memory, or unpack it with its own library first.")


def _unpack(route: Any) -> Parts:
    info = route.info
    bits = info.dtype.bits * info.dtype.lanes
    where = f"with strides {info.strides}" if bits and 8 % bits == 0 else "across byte boundaries"
    return (UnsupportedDTypeError, _subject(route),
            f"packs {bits}-bit elements {where}; dlinspect unpacks only C-contiguous 1-, 2- "
            f"and 4-bit data.", "To fix: ask the producer for padded storage (one element "
            "per byte), or unpack with its own library.")


def _shard(route: Any) -> Parts:
    dev, index, shard = route.facts["shard"]
    _, _, first, rest = PROBLEMS[shard.problem](shard)
    return (type(shard.error), _subject(route),
            f"cannot be sharded as asked: its shard {_index_text(index)} for {dev} (shape "
            f"{shard.info.shape}) {first}", rest)


def _leaf_kind(facts: dict[str, Any]) -> str:
    """A leaf that is not a tensor: its type, and the dtype of an array DLPack has no type for."""
    dtype = facts.get("leaf_dtype")
    text = type_name(facts["leaf_type"])
    if dtype is None:
        return text
    return f"{text} of dtype {dtype} that DLPack has no type for"


def _not_a_tensor(route: Any) -> Parts:
    return (NotDLPackError, "",
            f"a leaf of type {_leaf_kind(route.facts)} is not a tensor, and "
            f"leaves='raise' was asked for.", "To fix: pass leaves='keep' to leave "
            "non-tensor leaves as they are, or take it out of the batch.")


def _copy_forbidden(route: Any) -> Parts:
    f, subject, fixes, refused = route.facts, _subject(route), [], "needs a copy, but copy=False"
    if f.get("numpy_copy"):
        subject = _array_head(f)
        found = f"cannot be described by DLPack ({f['why']}), so only a copy gives its values, but copy=False"
        fixes = ["make it native and C-ordered first: numpy.ascontiguousarray(x, "
                 "dtype=x.dtype.newbyteorder('='))"]
    elif "jax_array" in f:
        subject = ""
        found = (f"{_RELAYOUT}, so it is copied into row-major order, but copy=False" if f["relayout"]
                 else f"a jax.Array on {', '.join(map(str, f['jax_array'].devices()))} must move to "
                      f"{_where(f)}, which copies, but copy=False")
    elif f.get("through_host") and route.target == "host":
        found = f"is not in host memory. Bringing it to the host {refused}"
    elif f.get("through_host"):
        subject, found = "", f"{_no_device_head(route)} Going through host memory {refused}"
        fixes = ["move the tensor to host memory yourself"]
    elif route.target == "host":   # packed sub-byte data unpacked into NumPy
        found = (f"packs {route.info.dtype.bits * route.info.dtype.lanes}-bit elements, while NumPy "
                 f"stores one per byte: unpacking {refused}")
    elif f.get("put"):
        found = f"{refused}: {_numpy_put_words(route)}"
    elif f.get("spread"):
        found = f"{refused}: it is not host memory bound for CPU devices, so {_spread_words(f)}, which copies"
    else:
        reasons, fixes = _copy_reasons(route)
        found = f"{refused}: {'; '.join(reasons)}"
    return CopyRequiredError, subject, f"{found}.", f"To fix: {', or '.join(['pass copy=None'] + fixes)}."


def _uneven(route: Any) -> Parts:
    f = route.facts
    subject = _subject(route) or _array_head(f)
    u = f["uneven"]
    if u[0] == "ndim":
        _, ndim, why = u
        return (ShardingError, subject, f"cannot be sharded: {f['sharding']} does not fit a tensor "
                f"of {ndim} dimensions ({why}). To fix: give this leaf a PartitionSpec with at "
                f"most {ndim} entries, e.g. PartitionSpec() to replicate it.", "")
    _, axis, size, count, ndevices = u
    where = "the batch axis (axis 0)" if axis == 0 else f"axis {axis}"
    return (ShardingError, subject, f"cannot be sharded: {where} has {size} elements, which do not "
            f"split evenly into the {count} shards the sharding cuts it into ({ndevices} devices). To "
            f"fix: make it a multiple of {count} (e.g. DataLoader(..., drop_last=True), or pad the "
            f"last batch), or replicate this leaf with PartitionSpec().", "")


def _unmapped(route: Any) -> Parts:
    return (MalformedTensorError, _subject(route),
            f"starts at {route.info.data_ptr:#x} (DLTensor.data plus byte_offset), and the bytes "
            f"its elements span reach memory this process has not mapped: a copy would read bytes "
            f"that are not there, so nothing was read or consumed. The producer wrote a "
            f"corrupt header.", "To fix: report the header to the producer's maintainers.")


#: The words of every problem an error route carries, as Parts ("raised": the producer's
#: or the header's own error, worded where it was raised).
PROBLEMS = {
    "lanes-share-bytes": _lanes_share_bytes, "dtype": _dtype, "host-dtype": _host_dtype,
    "numpy-dtype": _numpy_dtype, "layout-not-host": _layout_not_host, "no-device": _no_device,
    "copy-forbidden": _copy_forbidden, "packed-copy": _packed_copy, "unpack": _unpack,
    "uneven": _uneven, "shard": _shard,
    "allocation": lambda r: _allocation(r.facts["nbytes"], _subject(r) or "the tensor", r.facts["total"]),
    "not-a-tensor": _not_a_tensor, "shape": _shape, "unmapped": _unmapped,
}


def error(route: Any) -> Exception | None:
    """The exception executing ``route`` raises (None unless its kind is "error")."""
    if route.problem is None:
        return None
    if route.problem == "raised":
        exc = route.facts["cause"]
    else:
        cls, subject, first, rest = PROBLEMS[route.problem](route)
        exc = cls(" ".join(filter(None, (subject, first, rest))))
        if route.problem == "shard":
            exc.__cause__ = route.facts["shard"][2].error
    return name_leaf(exc, route.key_path)


def _array_put(route: Any) -> str:
    f = route.facts
    if route.zero_copy:
        return f"It already is a jax.Array on {_where(f)}: committed there (jax.device_put)."
    moves = "" if f["where"] is None else f", then moves to {_where(f)} (jax.device_put)"
    if f.get("relayout"):
        return f"A copy is needed: {_RELAYOUT}; JAX copies it into row-major order{moves}."
    if f.get("copy_true"):
        return f"copy=True was asked for: JAX copies the jax.Array{moves}."
    return f"A copy is needed: the jax.Array moves to {_where(f)} (jax.device_put)."


def _producer_copy(route: Any) -> str:
    f = route.facts
    where = device_name(route.info.device_type)
    # How a host copy is asked for, in the order the executor tries.
    steps = [f"the producer copies it into aligned host memory dlinspect allocates "
             f"({into_call(f['into'])}), which is viewed"] if f.get("into") else []
    steps += ["the producer is asked for a host copy (__dlpack__(dl_device=(kDLCPU, 0), "
              "copy=True))"] + [f"its own x.{name}()" for name in f["methods"]]
    words = ", else ".join(steps + ["numpy.asarray(x)"])
    if route.target == "host":
        return f"{where} memory is not host-accessible: {words}."
    narrowed = f" ({narrowing_warning(f['narrow'], True)})" if f.get("narrow") else ""
    peak = "" if f.get("into") else (", viewed where it can be, else copied once more "
                                     "(two copies at peak)")
    return f"{where} memory: {words}; JAX imports that{narrowed}{peak}."


def _numpy_copy(route: Any) -> str:
    f = route.facts
    words = f"{f['why']}; NumPy copies it into native, C-ordered memory"
    if route.target == "host":
        return f"A copy is needed: {words}."
    narrowed = f" ({narrowing_warning(f['narrow'], True)})" if f.get("narrow") else ""
    then = (f"that copy is then split over the {f['spread']} devices of the sharding"
            if "spread" in f else "JAX views that copy")
    return f"A copy is needed: {words}{narrowed}; {then}."


def _split(route: Any) -> str:
    shards = route.shards
    views = sum(r.zero_copy for _, _, r in shards)
    text = f"{views} of {len(shards)} shards are views of the producer's memory"
    copying = next(((d, r) for d, _, r in shards if not r.zero_copy), None)
    return text + ("." if copying is None else f"; the shard for {copying[0]}: {copying[1].reason}")


def _spread(route: Any) -> str:
    f, whole = route.facts, route.facts["whole"]
    if whole.zero_copy:
        return (f"A copy is needed: JAX first views the producer's memory, then "
                f"{_spread_words(f)} (the one copy).")
    return f"Two copies: {whole.reason[0].lower()}{whole.reason[1:-1]}; then {_spread_words(f)}."


def _host_lanes(info: Any) -> str:
    return f"; its {info.dtype.lanes} lanes are a trailing axis" if info.dtype.lanes != 1 else ""


#: What a zero-copy route of a tensor given alone adds (plan(x) of one tensor).
_SHARED_ALONE = (" A tensor given alone shares its memory with the result, as "
                 "jax.dlpack.from_dlpack does (DLPack's consumer contract): a later write to it "
                 "shows there; copy=True copies it (a leaf of a batch is shared only where the "
                 "batch alone holds its memory).")


def _jax_words(route: Any) -> str:   # (host memory put onto an accelerator: a copy)
    if not route.zero_copy:
        reasons = _copy_reasons(route)[0] + ([_lanes_text(route.info)]
                                             if route.needs & Need.LANES else [])
        return f"A copy is needed: {'; '.join(reasons)}."
    return _view_words(route) + (_SHARED_ALONE if route.facts.get("alone") else "")


def _view_words(route: Any) -> str:
    info = route.info
    if route.needs & Need.LANES:
        text = _lanes_text(info)
        return f"{text[0].upper()}{text[1:]}; JAX views the producer's memory on {route.facts['dest']}."
    if route.needs & Need.VIA_CPU:
        dt = info.device_type
        return (f"{device_name(dt)} memory is host memory: JAX's CPU backend views it without "
                f"a copy (no {device_row(dt).platform or 'device'} backend here).")
    return f"JAX views the producer's memory on {route.facts['dest']}."


#: The one sentence of a route that is not an error, by its action.
REASONS = {
    T.KEEP: lambda route: f"Not a tensor ({_leaf_kind(route.facts)}): left as it is.",
    T.PASS: lambda route: (f"It already is a jax.Array on {_where(route.facts)}: returned as it is."
                           if route.facts.get("where") is not None else
                           "It already is a jax.Array: returned as it is (no DLPack round trip)."),
    T.ARRAY_PUT: _array_put,
    T.ARRAY_COPY: lambda route: "copy=True was asked for: JAX copies the jax.Array.",
    T.EMPTY: lambda route: ("The tensor is empty: JAX gets a new empty array; no byte is copied."
                            if route.target == "jax" else
                            "The tensor is empty: NumPy gets a new empty array."),
    T.PRODUCER_COPY: _producer_copy,
    T.NUMPY_PUT: lambda route: f"A copy is needed: {_numpy_put_words(route)}.",
    T.NUMPY_COPY: _numpy_copy, T.SPLIT: _split, T.DEVICE_PUT: _spread, T.PROCESS_LOCAL: _spread,
    T.UNPACK: lambda route: (f"{route.info.dtype.bits * route.info.dtype.lanes}-bit elements are "
                             f"packed; NumPy holds one per byte, so they are unpacked into a copy."),
    T.HOST_COPY: lambda route: (f"copy=True was asked for{_host_lanes(route.info)}."
                                if route.target == "host" else _jax_words(route)),
    T.HOST_VIEW: lambda route: (f"NumPy views the {device_name(route.info.device_type)} "
                                f"memory directly{_host_lanes(route.info)}."
                                if route.target == "host" else _jax_words(route)),
    T.IMPORT: _jax_words,
}


def reason(route: Any) -> str:
    """One sentence: why ``route`` (for an error, what was found; led by its key path)."""
    if route.problem is None:
        return REASONS[route.action](route)
    if route.problem == "raised":
        text = str(route.facts["cause"])
    else:
        _, subject, first, _ = PROBLEMS[route.problem](route)
        text = f"{subject} {first}" if subject else first
    return f"{route.key_path}: {text}" if route.key_path else text


def narrowing_warning(narrow: tuple[int, int, int, int, bool], reason: bool = False) -> str:
    """The DLInspectWarning's text (``reason``: the route's few words instead); ``narrow``:
    ``(code, bits, narrowed code, narrowed bits, warn)``."""
    code, bits, ncode, nbits, _ = narrow
    return narrowing_text(dtype_name(code, bits), dtype_name(ncode, nbits))[reason]


def explain_tree(flat: Any) -> str:
    """``explain``'s text for a :class:`dlinspect._tree.Flat` of routes."""
    from jax.tree_util import keystr
    blocks: list[str] = []
    # A run of untouched leaves under one parent, for one reason, is one line.
    for run, group in itertools.groupby(zip(flat.key_paths(), flat.leaves), lambda leaf: (
            leaf[1].action == T.KEEP and (leaf[0][:-1], leaf[1].reason))):
        leaves = list(group)
        if not run:
            blocks.extend(f"{keystr(path)}:\n  " + explain_one(route, None).replace("\n", "\n  ")
                          for path, route in leaves)
            continue
        first = keystr(leaves[0][0])
        _, reason = run   # (their parent's path, the reason)
        blocks.append(f"{first}: untouched ({reason})" if len(leaves) == 1 else
                      f"{first} .. {keystr(leaves[-1][0])}: {len(leaves)} leaves untouched ({reason})")
    if not blocks:   # (None, {}, []: JAX's pytrees without leaves)
        return ("<no leaves: a pytree without any (None, an empty dict, list or tuple), "
                "returned as it is>")
    return "\n".join(blocks)


def _head(route: Any, x: Any) -> str:
    if route.info:
        return repr(route.info)
    if "jax_array" in route.facts and route.error is None:
        return "<jax.Array>" if x is None else (
            f"<jax.Array {x.dtype}[{', '.join(map(str, x.shape))}] on "
            f"{', '.join(map(str, x.devices()))}>")
    if route.action == T.KEEP:
        return "<not a tensor>"
    if route.action == T.NUMPY_COPY or route.facts.get("numpy_copy"):
        return "<no DLPack header: DLPack cannot describe this NumPy memory>"
    if isinstance(route.error, UnsupportedDeviceError):
        return "<no header: not exported (fallback='raise' judged the device first)>"
    return "<no header: the export failed>"


def explain_one(route: Any, x: Any) -> str:
    """``explain``'s lines for one route (``x``: the tensor, for a jax.Array's head)."""
    lines = [_head(route, x), f"route to {route.target}: {route.kind}"
             + (f" ({route.copy_bytes} B copied)" if route.copy_bytes else "")]
    if route.error is None:  # (an error's message says it all, below)
        lines.append(f"  {route.reason}")
    if route.jax_device:
        lines.append(f"  JAX device: {route.jax_device}")
    for dev, index, shard in route.shards:
        lines.append(f"  shard {_index_text(index)} -> {dev}: {shard.kind}"
                     + (f" ({shard.copy_bytes} B copied)" if shard.copy_bytes else ""))
    if route.warning:
        lines.append(f"  warning: {route.warning}")
    if route.error:
        lines.append(f"  error: {type(route.error).__name__}: {route.error}")
    return "\n".join(lines)
