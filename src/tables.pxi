# tables.pxi: the tables the core reads, one per axis, beside the DLPack enums they
# are keyed by. A new device type is one row of _DEVICE_ROWS (and its value in
# include/dlinspect/dlpack.h and src/dlpack.pxd); a new dtype one row of _DTYPE_ROWS
# (and its DLDataTypeCode there). tests/test_abi.py keeps the enums in step with the
# header. Nothing here decides; needs.pxi and the routes read these rows.

import enum as _enum
from typing import NamedTuple as _NamedTuple


class _SpecNamed(_enum.IntEnum):
    """An IntEnum whose members print as their specification name (``kDLVulkan``)."""

    def __str__(self):
        return self.name

    __repr__ = __str__


class Device(_NamedTuple):
    """What dlinspect knows of one ``DLDeviceType``: a row of :data:`DEVICES`."""

    host: bool = False        # host-accessible: NumPy views it, JAX's CPU backend imports it
    pinned: bool = False      # pinned host memory, which a producer may export as kDLCPU
    platform: object = None   # the JAX platform its memory belongs to (None: none JAX has)
    jax_maps: bool = True     # jax's own DLDeviceType map names it (its from_dlpack takes it)
    stream: bool = False      # __dlpack__ takes the consumer's stream (array API, *stream*)
    # The stream that means the device's default stream (CUDA: 1, as the array API gives
    # 0 no meaning there; ROCm: 0).
    default_stream: int = 0
    # The fix words: how its own libraries move a tensor to host memory; what JAX needs
    # to take the memory where it is.
    to_host: str = "torch: t.cpu()"
    plugin: object = None


#: The row of every device type without one of its own.
OTHER_DEVICE = Device()

_CUDA_PLUGIN = "jax[cuda12]"
_ROCM_PLUGIN = "the jax ROCm plugin"

# (value, name, row): every DLDeviceType of DLPack 1.3, in the header's order.
_DEVICE_ROWS = (
    (kDLCPU, "kDLCPU", Device(host=True, platform="cpu")),
    (kDLCUDA, "kDLCUDA", Device(platform="cuda", stream=True, default_stream=1,
                                plugin=_CUDA_PLUGIN)),
    (kDLCUDAHost, "kDLCUDAHost", Device(host=True, pinned=True, platform="cuda",
                                        plugin=_CUDA_PLUGIN)),
    (kDLOpenCL, "kDLOpenCL", OTHER_DEVICE), (kDLVulkan, "kDLVulkan", OTHER_DEVICE),
    (kDLMetal, "kDLMetal", Device(to_host="torch: t.cpu(); mlx: np.array(a)")),
    (kDLVPI, "kDLVPI", OTHER_DEVICE),
    (kDLROCM, "kDLROCM", Device(platform="rocm", stream=True, plugin=_ROCM_PLUGIN)),
    (kDLROCMHost, "kDLROCMHost", Device(host=True, pinned=True, platform="rocm",
                                        plugin=_ROCM_PLUGIN)),
    (kDLExtDev, "kDLExtDev", OTHER_DEVICE),
    (kDLCUDAManaged, "kDLCUDAManaged", Device(host=True, platform="cuda", jax_maps=False,
                                              plugin=_CUDA_PLUGIN)),
    (kDLOneAPI, "kDLOneAPI", Device(platform="oneapi", to_host="dpnp: dpnp.asnumpy(x)",
                                    plugin="the Intel jax plugin")),
    (kDLWebGPU, "kDLWebGPU", OTHER_DEVICE), (kDLHexagon, "kDLHexagon", OTHER_DEVICE),
    (kDLMAIA, "kDLMAIA", OTHER_DEVICE), (kDLTrn, "kDLTrn", OTHER_DEVICE),
)

DLDeviceType = _SpecNamed("DLDeviceType", [(name, value) for value, name, _ in _DEVICE_ROWS],
                          module=__name__, qualname="DLDeviceType")
DLDeviceType.__doc__ = """Device types of DLPack 1.3 (``DLDeviceType`` in ``dlpack.h``).

A member prints as its specification name, e.g. ``kDLVulkan``."""

#: The device table: ``DLDeviceType`` value to its :class:`Device` row.
DEVICES = {DLDeviceType(value): row for value, _, row in _DEVICE_ROWS}

cdef dict _DEVICE_BY_VALUE = {int(m): m for m in DLDeviceType}

# The rows' booleans as bits per DLDeviceType below 64, for the C paths (_host_accessible:
# the row's ``host``, _pinned: ``pinned``, _takes_stream: ``stream``).
cdef enum:
    _DEV_HOST = 1
    _DEV_PINNED = 2
    _DEV_STREAM = 4
cdef uint8_t _DEVICE_BITS[64]
cdef int _DEFAULT_STREAM[64]
memset(_DEVICE_BITS, 0, sizeof(_DEVICE_BITS))
memset(_DEFAULT_STREAM, 0, sizeof(_DEFAULT_STREAM))
for _value, _, _row in _DEVICE_ROWS:
    _DEVICE_BITS[_value] = ((_DEV_HOST if _row.host else 0) | (_DEV_PINNED if _row.pinned else 0)
                            | (_DEV_STREAM if _row.stream else 0))
    _DEFAULT_STREAM[_value] = _row.default_stream
del _value, _, _row


cdef inline bint _host_accessible(int32_t device_type) noexcept nogil:
    return 0 <= device_type < 64 and (_DEVICE_BITS[device_type] & _DEV_HOST) != 0


cdef inline bint _pinned(int32_t device_type) noexcept nogil:
    return 0 <= device_type < 64 and (_DEVICE_BITS[device_type] & _DEV_PINNED) != 0


cdef inline bint _takes_stream(int32_t device_type) noexcept nogil:
    return 0 <= device_type < 64 and (_DEVICE_BITS[device_type] & _DEV_STREAM) != 0


def device_row(device_type):
    """The :class:`Device` row of ``device_type`` (:data:`OTHER_DEVICE` when it has none)."""
    return DEVICES.get(device_type, OTHER_DEVICE)


def as_device_type(value):
    """The ``DLDeviceType`` member for ``value``, or ``value`` itself when unknown."""
    return _DEVICE_BY_VALUE.get(value, value)


def device_name(device_type, device_id=None):
    """``"kDLVulkan:0"`` style name; unknown types print as ``"DLDeviceType(42)"``."""
    member = _DEVICE_BY_VALUE.get(int(device_type))
    name = member.name if member is not None else f"DLDeviceType({int(device_type)})"
    return name if device_id is None else f"{name}:{device_id}"


def stream_of(int device_type, jax_device):
    """The ``stream`` to pass to ``__dlpack__`` for memory of ``device_type`` bound for
    ``jax_device`` (array API ``__dlpack__``, *stream*): None where the device takes no
    stream (CPU, pinned host, devices JAX has no backend for); else the stream JAX
    waits on, where 0 becomes the device's ``default_stream`` (on CUDA 0 is not
    allowed and 1 is the legacy default stream)."""
    if not _takes_stream(device_type) or jax_device is None:
        return None
    try:
        stream = jax_device.get_stream_for_external_ready_events()
    except Exception:
        return None
    return _DEFAULT_STREAM[device_type] if stream == 0 else int(stream)


# Every DLDataTypeCode of DLPack 1.3, in the header's order: their values are 0, 1, 2...
DLDataTypeCode = _SpecNamed("DLDataTypeCode", [(name, value) for value, name in enumerate((
    "kDLInt", "kDLUInt", "kDLFloat", "kDLOpaqueHandle", "kDLBfloat", "kDLComplex", "kDLBool",
    "kDLFloat8_e3m4", "kDLFloat8_e4m3", "kDLFloat8_e4m3b11fnuz", "kDLFloat8_e4m3fn",
    "kDLFloat8_e4m3fnuz", "kDLFloat8_e5m2", "kDLFloat8_e5m2fnuz", "kDLFloat8_e8m0fnu",
    "kDLFloat6_e2m3fn", "kDLFloat6_e3m2fn", "kDLFloat4_e2m1fn"))], module=__name__,
    qualname="DLDataTypeCode")
DLDataTypeCode.__doc__ = (
    """Type codes of DLPack 1.3 (``DLDataTypeCode``, stored in ``DLDataType.code``).""")


class DLDataType(_NamedTuple):
    """A ``DLDataType``: type ``code``, ``bits`` per lane and ``lanes`` per element."""

    code: int
    bits: int
    lanes: int = 1


class DType(_NamedTuple):
    """What dlinspect knows of one lane's ``(code, bits)``: a row of :data:`DTYPES`."""

    name: str      # the NumPy / ml_dtypes name ("float32", "bfloat16", "int4")
    numpy: bool    # NumPy has it itself (False: ml_dtypes provides it, where installed)
    # (code, bits) JAX narrows it to when x64 is off (jax.numpy's documented rule: 64-bit
    # integers and floats to 32 bits, complex128 to complex64), else None.
    x64_narrow: object = None


# One row per (code, bits) with a NumPy or ml_dtypes dtype.
_DTYPE_ROWS = (
    (kDLBool, 8, DType("bool", True)),
    (kDLInt, 8, DType("int8", True)), (kDLInt, 16, DType("int16", True)),
    (kDLInt, 32, DType("int32", True)), (kDLInt, 64, DType("int64", True, (kDLInt, 32))),
    (kDLUInt, 8, DType("uint8", True)), (kDLUInt, 16, DType("uint16", True)),
    (kDLUInt, 32, DType("uint32", True)), (kDLUInt, 64, DType("uint64", True, (kDLUInt, 32))),
    (kDLFloat, 16, DType("float16", True)), (kDLFloat, 32, DType("float32", True)),
    (kDLFloat, 64, DType("float64", True, (kDLFloat, 32))),
    (kDLComplex, 64, DType("complex64", True)),
    (kDLComplex, 128, DType("complex128", True, (kDLComplex, 64))),
    (kDLBfloat, 16, DType("bfloat16", False)),
    (kDLInt, 4, DType("int4", False)), (kDLInt, 2, DType("int2", False)),
    (kDLUInt, 4, DType("uint4", False)), (kDLUInt, 2, DType("uint2", False)),
    (kDLFloat8_e3m4, 8, DType("float8_e3m4", False)),
    (kDLFloat8_e4m3, 8, DType("float8_e4m3", False)),
    (kDLFloat8_e4m3b11fnuz, 8, DType("float8_e4m3b11fnuz", False)),
    (kDLFloat8_e4m3fn, 8, DType("float8_e4m3fn", False)),
    (kDLFloat8_e4m3fnuz, 8, DType("float8_e4m3fnuz", False)),
    (kDLFloat8_e5m2, 8, DType("float8_e5m2", False)),
    (kDLFloat8_e5m2fnuz, 8, DType("float8_e5m2fnuz", False)),
    (kDLFloat8_e8m0fnu, 8, DType("float8_e8m0fnu", False)),
    (kDLFloat6_e2m3fn, 6, DType("float6_e2m3fn", False)),
    (kDLFloat6_e3m2fn, 6, DType("float6_e3m2fn", False)),
    (kDLFloat4_e2m1fn, 4, DType("float4_e2m1fn", False)),
)

#: The dtype table: ``(code, bits)`` of one lane to its :class:`DType` row.
DTYPES = {(code, bits): row for code, bits, row in _DTYPE_ROWS}
cdef dict _DTYPE_BY_NAME = {row.name: (code, bits) for code, bits, row in _DTYPE_ROWS}
# Names of codes whose width varies, for a (code, bits) with no row.
cdef dict _CODE_PREFIX = {kDLInt: "int", kDLUInt: "uint", kDLFloat: "float",
                          kDLComplex: "complex", kDLOpaqueHandle: "opaque", kDLBool: "bool"}
cdef dict _names_cache = {}
cdef dict _numpy_cache = {}


def dtype_name(int code, int bits, int lanes=1):
    """The NumPy / ml_dtypes name of a ``DLDataType``: ``"float32"``, ``"bool"``,
    ``"bfloat16"``, ``"float8_e4m3fn"``, ``"int4"``...; ``"float32x4"`` for a vector type
    (``lanes > 1``), ``"opaque64"`` for an opaque handle, ``"DLDataType(code=42, bits=8)"``
    for an unknown code."""
    key = (code, bits, lanes)
    name = _names_cache.get(key)
    if name is not None:
        return name
    row = DTYPES.get((code, bits))
    if row is not None:
        name = row.name
    elif code in _CODE_PREFIX:
        name = f"{_CODE_PREFIX[code]}{bits}"
    else:
        try:
            name = f"{DLDataTypeCode(code).name}[bits={bits}]"
        except ValueError:
            name = f"DLDataType(code={code}, bits={bits})"
    if lanes != 1:
        name = f"{name}x{lanes}"
    if len(_names_cache) < 4096:
        _names_cache[key] = name
    return name


# numpy_dtype's answers by ``code | bits << 8``, borrowed from _numpy_cache (never emptied):
# the hot path's lookup, one load.
cdef PyObject* _numpy_by_key[1 << 16]


cdef inline object _numpy_dtype(int code, int bits):
    """:func:`numpy_dtype` of one lane (None where NumPy has none)."""
    cdef int key = (code & 0xFF) | ((bits & 0xFF) << 8)
    cdef PyObject* got = _numpy_by_key[key]
    if got != NULL:
        return <object>got
    found = numpy_dtype(code, bits, 1)
    _numpy_by_key[key] = <PyObject*>found   # kept alive by _numpy_cache
    return found


def numpy_dtype(int code, int bits, int lanes=1):
    """The NumPy dtype of one element, or None where none exists (vector types, opaque
    handles); bfloat16, float8/6/4, int4/uint4, int2/uint2 from ``ml_dtypes`` if installed."""
    if lanes != 1:
        return None
    key = code | (bits << 8)
    if key in _numpy_cache:
        return _numpy_cache[key]
    row = DTYPES.get((code, bits))
    found = None
    if row is not None and row.numpy:
        found = _np_dtype(row.name)
    elif code != kDLOpaqueHandle:   # ml_dtypes' types, by the name dtype_name gives
        try:
            import ml_dtypes
        except ImportError:
            ml_dtypes = None
        scalar = getattr(ml_dtypes, dtype_name(code, bits), None)
        found = None if scalar is None else _np_dtype(scalar)
    _numpy_cache[key] = found
    return found


def dldtype_from_numpy(dtype):
    """The ``(code, bits, lanes)`` of a NumPy (or ml_dtypes) dtype; ValueError where DLPack
    has no code for it (object, string, datetime...)."""
    name = _np_dtype(dtype).name
    got = _DTYPE_BY_NAME.get(name)
    if got is not None:
        return (got[0], got[1], 1)
    for prefix, code in (("uint", kDLUInt), ("int", kDLInt)):   # ml_dtypes' other widths
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return (code, int(name[len(prefix):]), 1)
    raise ValueError(f"DLPack has no type code for dtype {name!r}")
