"""The caller's wishes, checked once: one object instead of loose parameters."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Options", "DEFAULT", "options", "single_device"]

_CHOICES = {"fallback": ("host", "raise"), "readonly": ("copy", "share"),
            "leaves": ("keep", "raise"), "narrow": ("warn", "ok")}


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """What the caller of :func:`~dlinspect.to_jax`, :func:`~dlinspect.plan` or
    :func:`~dlinspect.prefetch_to_jax` asked for (see ``to_jax`` for each meaning).

    Attributes
    ----------
    device : jax.Device or None
        The one destination device (a single-device sharding is resolved to it).
    copy : bool or None
        The array API's ``copy``.
    sharding : jax.sharding.Sharding, pytree of them, or None
        Spread over several devices (never together with ``device``).
    fallback : {"host", "raise"}
    readonly : {"copy", "share"}
    leaves : {"keep", "raise"}
    narrow : {"warn", "ok"}
        64-bit dtypes JAX narrows with x64 off: with a DLInspectWarning, or quietly.
    """

    device: Any = None
    copy: bool | None = None
    sharding: Any = None
    fallback: str = "host"
    readonly: str = "copy"
    leaves: str = "keep"
    narrow: str = "warn"

    @property
    def share_readonly(self) -> bool:
        return self.readonly == "share"

    @property
    def warn_narrowing(self) -> bool:
        return self.narrow == "warn"

    def with_device(self, device: Any) -> Options:
        """The same wishes, for one device (a shard's, a leaf's sharding)."""
        return dataclasses.replace(self, device=device, sharding=None)


#: No option given: what every call without keywords uses (checked once, here).
DEFAULT = Options()


def options(device: Any = None, copy: Any = None, sharding: Any = None, fallback: str = "host",
            readonly: str = "copy", leaves: str = "keep", narrow: str = "warn") -> Options:
    """Check the options and make them one object.

    Raises
    ------
    ValueError
        An option outside its documented values, or ``device`` together with ``sharding``.
    TypeError
        ``device`` is neither a ``jax.Device`` nor a single-device sharding.
    """
    if copy is not None and copy is not True and copy is not False:
        raise ValueError(f"copy must be None, True or False, not {copy!r}")
    given = {"fallback": fallback, "readonly": readonly, "leaves": leaves, "narrow": narrow}
    for name, value in given.items():
        if value not in _CHOICES[name]:
            allowed = " or ".join(repr(c) for c in _CHOICES[name])
            raise ValueError(f"{name} must be {allowed}, not {value!r}")
    if sharding is not None and device is not None:
        raise ValueError("pass device= or sharding=, not both: one of them.")
    if (device is None and copy is None and sharding is None and fallback == "host"
            and readonly == "copy" and leaves == "keep" and narrow == "warn"):
        return DEFAULT
    return Options(single_device(device), copy, sharding, fallback, readonly, leaves, narrow)


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
