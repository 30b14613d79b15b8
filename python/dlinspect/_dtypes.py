"""Names and NumPy dtypes for DLPack ``DLDataType`` triples (code, bits, lanes)."""

from __future__ import annotations

import functools

import numpy as np

from ._enums import DLDataTypeCode as C

__all__ = ["dtype_name", "numpy_dtype", "dldtype_from_numpy"]

_FIXED_NAMES: dict[tuple[int, int], str] = {
    (C.kDLBfloat, 16): "bfloat16",
    (C.kDLBool, 8): "bool",
    (C.kDLFloat8_e3m4, 8): "float8_e3m4",
    (C.kDLFloat8_e4m3, 8): "float8_e4m3",
    (C.kDLFloat8_e4m3b11fnuz, 8): "float8_e4m3b11fnuz",
    (C.kDLFloat8_e4m3fn, 8): "float8_e4m3fn",
    (C.kDLFloat8_e4m3fnuz, 8): "float8_e4m3fnuz",
    (C.kDLFloat8_e5m2, 8): "float8_e5m2",
    (C.kDLFloat8_e5m2fnuz, 8): "float8_e5m2fnuz",
    (C.kDLFloat8_e8m0fnu, 8): "float8_e8m0fnu",
    (C.kDLFloat6_e2m3fn, 6): "float6_e2m3fn",
    (C.kDLFloat6_e3m2fn, 6): "float6_e3m2fn",
    (C.kDLFloat4_e2m1fn, 4): "float4_e2m1fn",
}
_PREFIX: dict[int, str] = {C.kDLInt: "int", C.kDLUInt: "uint", C.kDLFloat: "float", C.kDLComplex: "complex"}
# Names NumPy itself knows; the rest come from ml_dtypes when it is installed.
_NUMPY_NAMES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64", "complex64", "complex128"]
)


@functools.lru_cache(maxsize=None)
def dtype_name(code: int, bits: int, lanes: int = 1) -> str:
    """The NumPy / ml_dtypes name of a ``DLDataType``.

    Parameters
    ----------
    code, bits, lanes : int
        The three fields of ``DLDataType`` (DLPack ``dlpack.h``, ``DLDataType``).

    Returns
    -------
    str
        ``"float32"``, ``"bool"``, ``"bfloat16"``, ``"float8_e4m3fn"``, ``"int4"``...;
        a vector type (``lanes > 1``) is ``"float32x4"``; an opaque handle is
        ``"opaque64"``; an unknown code is ``"DLDataType(code=42, bits=8)"``.
    """
    base = _FIXED_NAMES.get((code, bits))
    if base is None:
        if code in _PREFIX:
            base = f"{_PREFIX[code]}{bits}"
        elif code == C.kDLOpaqueHandle:
            base = f"opaque{bits}"
        elif code == C.kDLBool:
            base = f"bool{bits}"
        else:
            try:
                base = f"{C(code).name}[bits={bits}]"
            except ValueError:
                base = f"DLDataType(code={code}, bits={bits})"
    return base if lanes == 1 else f"{base}x{lanes}"


@functools.lru_cache(maxsize=None)
def numpy_dtype(code: int, bits: int, lanes: int = 1) -> np.dtype | None:
    """The NumPy dtype of one element, or None where none exists.

    bfloat16, float8, float6, float4, int4/uint4 and int2/uint2 come from
    ``ml_dtypes`` when it is installed; vector types (``lanes > 1``) and opaque
    handles have no NumPy dtype.
    """
    if lanes != 1:
        return None
    name = dtype_name(code, bits, 1)
    if name in _NUMPY_NAMES:
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        return None
    scalar = getattr(ml_dtypes, name, None)
    return None if scalar is None else np.dtype(scalar)


def dldtype_from_numpy(dtype: object) -> tuple[int, int, int]:
    """The ``(code, bits, lanes)`` of a NumPy (or ml_dtypes) dtype.

    Raises
    ------
    ValueError
        If DLPack has no code for the dtype (object, string, datetime...).
    """
    return _dldtype_of(np.dtype(dtype))  # type: ignore[call-overload]


@functools.lru_cache(maxsize=256)
def _dldtype_of(dt: np.dtype) -> tuple[int, int, int]:
    name = dt.name
    for (code, bits), fixed in _FIXED_NAMES.items():
        if fixed == name:
            return (int(code), bits, 1)
    kinds = {"i": C.kDLInt, "u": C.kDLUInt, "f": C.kDLFloat, "c": C.kDLComplex}
    if dt.kind in kinds and name in _NUMPY_NAMES:
        return (int(kinds[dt.kind]), dt.itemsize * 8, 1)
    for prefix, code in (("uint", C.kDLUInt), ("int", C.kDLInt)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return (int(code), int(name[len(prefix):]), 1)
    raise ValueError(f"DLPack has no type code for dtype {name!r}")
