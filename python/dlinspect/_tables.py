"""The tables dlinspect reads, beside the DLPack enums they are keyed by; below the core.

A new device type is one row of ``_DEVICE_ROWS`` (and its member of DLDeviceType); a new
dtype one row of ``_DTYPE_ROWS`` (and its member of DLDataTypeCode; a new float8/6/4 code
needs only that member, whose name gives the row). These enums are the one declaration of
the values (src/dlpack.pxd names the few the core tests); tests/test_abi.py checks them
against an official dlpack.h and keeps :class:`Need`'s bits in step with the C ones.
"""

from __future__ import annotations

import enum
import functools
import re
from typing import Any, NamedTuple

import numpy


class _SpecNamed(enum.IntEnum):
    """An IntEnum whose members print as their specification name (``kDLVulkan``)."""

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


class Device(NamedTuple):
    host: bool = False        # host-accessible: NumPy views it, JAX's CPU backend imports it
    pinned: bool = False      # pinned host memory, which a producer may export as kDLCPU
    platform: Any = None      # the JAX platform its memory belongs to (None: none JAX has)
    jax_maps: bool = True     # jax's own DLDeviceType map names it (its from_dlpack takes it)
    stream: bool = False      # __dlpack__ takes the consumer's stream (array API, *stream*)
    default_stream: int = 0   # CUDA: 1 (the array API gives 0 no meaning there); ROCm: 0
    to_host: str = "torch: t.cpu()"   # the fix words: how its libraries move it to the host,
    plugin: Any = None                # and what JAX needs to take the memory where it is


OTHER_DEVICE = Device()

_CUDA_PLUGIN = "jax[cuda12]"
_ROCM_PLUGIN = "the jax ROCm plugin"


class DLDeviceType(_SpecNamed):
    """Device types of DLPack 1.3 (``DLDeviceType`` in ``dlpack.h``).

    A member prints as its specification name, e.g. ``kDLVulkan``."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18


_D = DLDeviceType
_DEVICE_ROWS = {
    _D.kDLCPU: Device(host=True, platform="cpu"),
    _D.kDLCUDA: Device(platform="cuda", stream=True, default_stream=1, plugin=_CUDA_PLUGIN),
    _D.kDLCUDAHost: Device(host=True, pinned=True, platform="cuda", plugin=_CUDA_PLUGIN),
    _D.kDLMetal: Device(to_host="torch: t.cpu(); mlx: np.array(a)"),
    _D.kDLROCM: Device(platform="rocm", stream=True, plugin=_ROCM_PLUGIN),
    _D.kDLROCMHost: Device(host=True, pinned=True, platform="rocm", plugin=_ROCM_PLUGIN),
    _D.kDLCUDAManaged: Device(host=True, platform="cuda", jax_maps=False, plugin=_CUDA_PLUGIN),
    _D.kDLOneAPI: Device(platform="oneapi", to_host="dpnp: dpnp.asnumpy(x)",
                         plugin="the Intel jax plugin"),
}

DEVICES = {m: _DEVICE_ROWS.get(m, OTHER_DEVICE) for m in DLDeviceType}
_DEVICE_BY_VALUE = {int(m): m for m in DLDeviceType}


def device_row(device_type: int) -> Device:
    return DEVICES.get(device_type, OTHER_DEVICE)  # type: ignore[call-overload]


def as_device_type(value: int) -> Any:
    return _DEVICE_BY_VALUE.get(value, value)


def device_name(device_type: int, device_id: int | None = None) -> str:
    """``"kDLVulkan:0"`` style name; unknown types print as ``"DLDeviceType(42)"``."""
    member = _DEVICE_BY_VALUE.get(device_type)
    name = member.name if member else f"DLDeviceType({int(device_type)})"
    return name if device_id is None else f"{name}:{device_id}"


class DLDataTypeCode(_SpecNamed):
    """Type codes of DLPack 1.3 (``DLDataTypeCode``, stored in ``DLDataType.code``)."""

    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLOpaqueHandle = 3
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6
    kDLFloat8_e3m4 = 7
    kDLFloat8_e4m3 = 8
    kDLFloat8_e4m3b11fnuz = 9
    kDLFloat8_e4m3fn = 10
    kDLFloat8_e4m3fnuz = 11
    kDLFloat8_e5m2 = 12
    kDLFloat8_e5m2fnuz = 13
    kDLFloat8_e8m0fnu = 14
    kDLFloat6_e2m3fn = 15
    kDLFloat6_e3m2fn = 16
    kDLFloat4_e2m1fn = 17


class DLDataType(NamedTuple):
    """A ``DLDataType``: type ``code``, ``bits`` per lane and ``lanes`` per element."""

    code: int
    bits: int
    lanes: int = 1


class DType(NamedTuple):
    name: str      # the NumPy / ml_dtypes name ("float32", "bfloat16", "int4")
    numpy: bool    # NumPy has it itself (False: ml_dtypes provides it, where installed)
    x64_narrow: Any = None   # (code, bits) JAX narrows it to with x64 off (jax.numpy's rule)


_C = DLDataTypeCode
# Names of codes whose width varies (also for a (code, bits) with no row).
_CODE_PREFIX: dict[int, str] = {_C.kDLInt: "int", _C.kDLUInt: "uint", _C.kDLFloat: "float",
                _C.kDLComplex: "complex", _C.kDLOpaqueHandle: "opaque", _C.kDLBool: "bool"}
# NumPy's own widths of each code: the widest (64 bits, complex128) JAX narrows to the next.
_NUMPY_WIDTHS = {_C.kDLInt: (8, 16, 32, 64), _C.kDLUInt: (8, 16, 32, 64), _C.kDLFloat: (16, 32, 64),
                 _C.kDLComplex: (64, 128)}
# One row per (code, bits) with a NumPy or ml_dtypes dtype (ml_dtypes': numpy=False).
_DTYPE_ROWS = (
    (_C.kDLBool, 8, DType("bool", True)),
    *((code, bits, DType(f"{_CODE_PREFIX[code]}{bits}", True,
                         (code, bits // 2) if bits == widths[-1] else None))
      for code, widths in _NUMPY_WIDTHS.items() for bits in widths),
    (_C.kDLBfloat, 16, DType("bfloat16", False)),
    *((code, bits, DType(f"{_CODE_PREFIX[code]}{bits}", False))
      for code in (_C.kDLInt, _C.kDLUInt) for bits in (4, 2)),
    *((code, int(code.name[8]), DType(code.name[3:].lower(), False))   # kDLFloat8_e4m3fn...
      for code in _C if code >= _C.kDLFloat8_e3m4),
)

DTYPES = {(int(code), bits): row for code, bits, row in _DTYPE_ROWS}
_DTYPE_BY_NAME = {row.name: (int(code), bits, 1) for code, bits, row in _DTYPE_ROWS}
_DATA_TYPE_CODES = set(DLDataTypeCode)   # (an int finds its member: they hash alike)


@functools.lru_cache(maxsize=4096)
def dtype_name(code: int, bits: int, lanes: int = 1) -> str:
    """The NumPy / ml_dtypes name (``"bfloat16"``); ``"float32x4"`` for 4 lanes,
    ``"DLDataType(code=42, bits=8)"`` for an unknown code."""
    if lanes != 1:
        return f"{dtype_name(code, bits)}x{lanes}"
    row = DTYPES.get((code, bits))
    if row:
        return row.name
    if code in _CODE_PREFIX:
        return f"{_CODE_PREFIX[code]}{bits}"
    if code in _DATA_TYPE_CODES:
        return f"{DLDataTypeCode(code).name}[bits={bits}]"
    return f"DLDataType(code={code}, bits={bits})"


@functools.cache   # (never emptied: the core borrows its values)
def numpy_dtype(code: int, bits: int) -> Any:
    """The dtype of one lane of ``(code, bits)``; None for opaque handles and ml_dtypes' types
    without ml_dtypes."""
    row = DTYPES.get((code, bits))
    if row and row.numpy:
        return numpy.dtype(row.name)
    try:   # ml_dtypes' types, by the name dtype_name gives
        import ml_dtypes
    except ImportError:
        return None
    scalar = getattr(ml_dtypes, dtype_name(code, bits), None)
    return None if scalar is None else numpy.dtype(scalar)


def dldtype_from_numpy(dtype: Any) -> tuple[int, int, int]:
    """ValueError where DLPack has no code for the dtype (object, string, datetime...)."""
    name = numpy.dtype(dtype).name
    if found := _DTYPE_BY_NAME.get(name):
        return found
    if integer := re.fullmatch(r"(u?)int(\d+)", name):   # ml_dtypes' other widths
        return (_C.kDLUInt if integer[1] else _C.kDLInt, int(integer[2]), 1)
    raise ValueError(f"DLPack has no type code for dtype {name!r}")


#: The most dimensions a NumPy array has here (NPY_MAXDIMS: 64, 32 before NumPy 2).
NUMPY_MAX_NDIM = 64 if int(numpy.__version__.split(".")[0]) >= 2 else 32


class Need(enum.IntFlag):
    """What a tensor needs to reach its target: the bits of ``Route.needs``.

    Computed by one function in the core (``dlinspect._core.needs``) from the
    header (:class:`TensorInfo`) and what the installed JAX takes; ``plan``,
    ``to_jax`` and ``to_host`` all act on the same answer.
    """

    DEVICE = 1 << 0
    """No JAX device here for the memory's device (or, for NumPy, not host memory)."""
    DTYPE = 1 << 1
    """The target cannot hold one lane's DLDataType (code, bits)."""
    LANES = 1 << 2
    """A vector dtype (lanes > 1): the lanes become a trailing axis."""
    LAYOUT = 1 << 3
    """Strides JAX cannot view: gaps, broadcast (stride 0) or negative strides; on a
    jaxlib that computes them wrongly, any order but row-major, extent-1 axes' included."""
    READ_ONLY = 1 << 4
    """The READ_ONLY flag is set and the caller did not pass ``readonly="share"``."""
    ALIGN = 1 << 5
    """``data + byte_offset`` is below XLA:CPU's zero-copy alignment."""
    NARROW = 1 << 6
    """A 64-bit dtype that JAX narrows to 32 bits with x64 off."""
    PACKED = 1 << 7
    """Packed sub-byte elements (bits * lanes < 8, more than one element)."""
    EMPTY = 1 << 8
    """No elements: nothing to view or copy."""
    VIA_CPU = 1 << 9
    """Pinned or managed host memory with no JAX backend for its platform: JAX's CPU
    backend views it (no copy)."""
    NUMPY_PUT = 1 << 10
    """A dtype JAX holds but its DLPack import does not take: sub-byte elements (int4,
    uint4, int2, float4...; packed, or padded one per byte with
    ``IS_SUBBYTE_TYPE_PADDED``), and any dtype a jaxlib's import refuses.
    ``jax.device_put`` copies them from a NumPy (ml_dtypes) view."""
    PERMUTED = 1 << 11
    """A permutation of a row-major layout (a transpose, F order, ``permute``): copied
    into row-major order, as ``jnp.asarray`` gives it (host memory by a transpose in
    cache tiles; device memory imported in its layout, then copied on its device). JAX
    views such memory only as an array committed to its device that keeps the layout
    (what ``jax.dlpack.from_dlpack`` gives), and jaxlib moves that array wrong:
    ``jax.device_put`` to another device reads its buffer as row-major. Every array
    dlinspect hands out is row-major."""
    SHAPE = 1 << 12
    """A shape no array can have: more dimensions than NumPy holds
    (``NUMPY_MAX_NDIM``: 64, 32 before NumPy 2) once vector lanes are a trailing axis, or
    an empty tensor's nonzero extents whose product, in bytes, passes 2**63 - 1 (NumPy
    refuses such an array, and XLA aborts the process)."""
    ALIASED = 1 << 13
    """A leaf of a batch whose memory the batch is not proven to own: something outside
    the batch (the source's variable or attribute, a list of buffers, another array or
    tensor over the same memory) holds it, or its producer gives no proof. A view would
    change when that holder writes, so it is copied. Asked of batches only (a tensor
    given alone shares its memory, DLPack's consumer contract) and only with
    ``copy=None``; see docs/loaders/index.md, "Zero-copy and memory a source keeps"."""
    UNMAPPED = 1 << 14
    """Host memory whose span (first to last byte its elements reach) crosses a page this
    process has not mapped (a corrupt header: a forged pointer, ``byte_offset`` or stride):
    reading it would crash, so nothing is read; ``MalformedTensorError``. Asked of a bare
    capsule's header and of a nonzero ``byte_offset`` (a producer's own export points at its
    own memory)."""


# What executing a route does (Route.action): one executor each in the core's execute.pxi.
IMPORT = "import"                  # hand the capsule to JAX as it is (maybe copy=True)
HOST_COPY = "host-copy"            # copy host memory into a C-order aligned array, import that
HOST_VIEW = "host-view"            # view host memory through NumPy (lanes as an axis), import
UNPACK = "unpack"                  # packed sub-byte host memory into one element per byte
EMPTY = "empty"                    # a new empty array; the capsule is taken and freed
PRODUCER_COPY = "producer-copy"    # ask the producer for a host copy, then route that
NUMPY_PUT = "numpy-put"            # a NumPy view (unpacked if packed), then jax.device_put
NUMPY_COPY = "numpy-copy"          # NumPy memory DLPack cannot describe: NumPy copies it
RAISE = "raise"
PASS = "pass"                      # a jax.Array where it was asked to be: returned as it is
ARRAY_PUT = "array-put"            # a jax.Array elsewhere: jax.device_put
ARRAY_COPY = "array-copy"          # a jax.Array with copy=True: its own copy
KEEP = "keep"                      # a pytree leaf that is not a tensor: left as it is
SPLIT = "split"                    # host memory split in place: each device imports its slice
DEVICE_PUT = "device-put"          # JAX takes it whole, then jax.device_put(array, sharding)
PROCESS_LOCAL = "process-local"    # JAX takes it whole, then make_array_from_process_local_data
