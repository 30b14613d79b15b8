"""DLPack 1.3 enums (``DLDeviceType``, ``DLDataTypeCode``), ``DLDataType``, and the device
table: what dlinspect knows of each device type, read by the core and by Python.

A new device type is one line in ``include/dlinspect/dlpack.h`` (and ``src/dlpack.pxd``),
one member of :class:`DLDeviceType` and one row of :data:`DEVICES`; ``tests/test_abi.py``
keeps the enums here in step with the header.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["DLDeviceType", "DLDataTypeCode", "DLDataType", "Device", "DEVICES",
           "as_device_type", "device_name"]


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


class Device(NamedTuple):
    """What dlinspect knows of one ``DLDeviceType`` (a row of :data:`DEVICES`)."""

    host: bool = False
    """Host-accessible memory: NumPy views it and JAX's CPU backend imports it."""
    pinned: bool = False
    """Pinned host memory, which a producer may export with a kDLCPU header."""
    platform: str | None = None
    """The JAX platform its memory belongs to (None: none JAX has)."""
    jax_maps: bool = True
    """jax's own DLDeviceType map names the platform (its ``from_dlpack`` takes it there)."""
    stream: bool = False
    """``__dlpack__`` takes the consumer's stream (CUDA, ROCm): array API *stream*."""
    to_host: str = "torch: t.cpu()"
    """How its own libraries move a tensor to host memory (the fix words)."""
    plugin: str | None = None
    """What JAX needs to take the memory where it is (the fix words)."""


_D = DLDeviceType
#: The device table: every DLDeviceType dlinspect treats other than "a device JAX may
#: have a backend for" (the default row).
DEVICES: dict[int, Device] = {
    _D.kDLCPU: Device(host=True, platform="cpu"),
    _D.kDLCUDA: Device(platform="cuda", stream=True, plugin="jax[cuda12]"),
    _D.kDLCUDAHost: Device(host=True, pinned=True, platform="cuda", plugin="jax[cuda12]"),
    _D.kDLCUDAManaged: Device(host=True, platform="cuda", jax_maps=False,
                              plugin="jax[cuda12]"),
    _D.kDLROCM: Device(platform="rocm", stream=True, plugin="the jax ROCm plugin"),
    _D.kDLROCMHost: Device(host=True, pinned=True, platform="rocm",
                           plugin="the jax ROCm plugin"),
    _D.kDLOneAPI: Device(platform="oneapi", to_host="dpnp: dpnp.asnumpy(x)",
                         plugin="the Intel jax plugin"),
    _D.kDLMetal: Device(to_host="torch: t.cpu(); mlx: np.array(a)"),
}
#: The row of a device type not in :data:`DEVICES`.
OTHER_DEVICE = Device()


_DEVICE_BY_VALUE = {m.value: m for m in DLDeviceType}


def as_device_type(value: int) -> DLDeviceType | int:
    """The ``DLDeviceType`` member for ``value``, or ``value`` itself when unknown."""
    return _DEVICE_BY_VALUE.get(value, value)


def device_name(device_type: int, device_id: int | None = None) -> str:
    """``"kDLVulkan:0"`` style name; unknown types print as ``"DLDeviceType(42)"``."""
    member = _DEVICE_BY_VALUE.get(int(device_type))
    name = member.name if member is not None else f"DLDeviceType({int(device_type)})"
    return name if device_id is None else f"{name}:{device_id}"
