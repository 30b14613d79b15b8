"""DLPack 1.3 enums: ``DLDeviceType`` and ``DLDataTypeCode``, and ``DLDataType``."""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["DLDeviceType", "DLDataTypeCode", "DLDataType", "as_device_type", "device_name"]


class DLDeviceType(enum.IntEnum):
    """Device types of DLPack 1.3 (``DLDeviceType`` in ``dlpack.h``).

    A member prints as its specification name, e.g. ``kDLVulkan``.
    """

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

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


class DLDataTypeCode(enum.IntEnum):
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

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


class DLDataType(NamedTuple):
    """A ``DLDataType``: type ``code``, ``bits`` per lane and ``lanes`` per element."""

    code: int
    bits: int
    lanes: int = 1


_DEVICE_BY_VALUE = {m.value: m for m in DLDeviceType}


def as_device_type(value: int) -> DLDeviceType | int:
    """The ``DLDeviceType`` member for ``value``, or ``value`` itself when unknown."""
    return _DEVICE_BY_VALUE.get(value, value)


def device_name(device_type: int, device_id: int | None = None) -> str:
    """``"kDLVulkan:0"`` style name; unknown types print as ``"DLDeviceType(42)"``."""
    member = _DEVICE_BY_VALUE.get(int(device_type))
    name = member.name if member is not None else f"DLDeviceType({int(device_type)})"
    return name if device_id is None else f"{name}:{device_id}"
