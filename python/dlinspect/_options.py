"""What the core's options are made of, below the core: the values of each string option
(for type checkers: the core's ``options()`` checks them at run time), the device a
``device=`` names, and the modules of JAX imported on first use."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Literal, Protocol


# The values of each string option.
Target = Literal["jax", "host"]
Fallback = Literal["host", "raise"]
ReadOnly = Literal["copy", "share"]
Leaves = Literal["keep", "raise"]
Narrow = Literal["warn", "ok"]


class SupportsDLPack(Protocol):
    """A DLPack producer: anything with ``__dlpack__`` (array API), whose every
    parameter has a default, as the array API asks."""

    def __dlpack__(self) -> Any: ...


def single_device(device: Any) -> Any:
    """The one ``jax.Device`` of ``device`` (a Device or a single-device Sharding)."""
    if device is None or is_device(device):
        return device
    if isinstance(device, str):   # ("cuda", "cpu:0": torch's way, not JAX's)
        platforms = sorted({d.platform for d in jax_module("jax").devices()})
        raise TypeError(f"device must be a jax.Device or a single-device sharding, not the "
                        f"string {device!r}: JAX names a device by its object, and this JAX's "
                        f"devices are {', '.join(platforms)} ones (jax.devices()); e.g. "
                        f"device=jax.devices()[0].")
    if not hasattr(device, "device_set"):
        raise TypeError(f"device must be a jax.Device or a single-device sharding, not "
                        f"{device!r}; e.g. device=jax.devices()[0] or jax.devices('cpu')[0].")
    devices = device.device_set
    if len(devices) != 1:
        raise ValueError(f"to_jax takes a jax.Device or a single-device sharding; this sharding "
                         f"spans {len(devices)} devices.")
    return next(iter(devices))


def is_device(x: Any) -> bool:
    """A ``jax.Device`` (by its attributes: no sharding, which has a ``device_set``)."""
    return hasattr(x, "platform") and hasattr(x, "id") and not hasattr(x, "device_set")


def jax_module(name: str) -> Any:
    """Imported on first use, then a dict lookup (an import in a function costs µs per call)."""
    return sys.modules.get(name) or importlib.import_module(name)


def check_sharding(s: Any) -> Any:
    if not isinstance(s, jax_module("jax.sharding").Sharding):
        raise TypeError(f"sharding must be a jax.sharding.Sharding (or a pytree of them), not "
                        f"{type(s).__name__}; e.g. NamedSharding(mesh, PartitionSpec('data')).")
    return s
