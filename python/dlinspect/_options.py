"""The caller's wishes, checked once into one object the core reads (below the core)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Literal, Protocol, get_args

__all__ = ["Options", "DEFAULT", "options", "single_device", "is_device", "jax_module",
           "check_sharding", "SupportsDLPack", "Target", "Fallback", "ReadOnly", "Leaves", "Narrow"]

# The values of each string option, for type checkers (checked at run time by options()).
Target = Literal["jax", "host"]
Fallback = Literal["host", "raise"]
ReadOnly = Literal["copy", "share"]
Leaves = Literal["keep", "raise"]
Narrow = Literal["warn", "ok"]


class SupportsDLPack(Protocol):
    """A DLPack producer: anything with ``__dlpack__`` (array API), whose every
    parameter has a default, as the array API asks."""

    def __dlpack__(self) -> Any: ...


_CHOICES = {"fallback": get_args(Fallback), "readonly": get_args(ReadOnly),
            "leaves": get_args(Leaves), "narrow": get_args(Narrow)}

# The bits of Options.flags: what the core reads of the options, as one int (0: every default).
COPY_ALWAYS = 1       # copy=True
COPY_NEVER = 2        # copy=False
PLACED = 4            # device= or sharding= given
SHARE_READONLY = 8    # readonly="share"
QUIET_NARROW = 16     # narrow="ok"
FALLBACK_RAISE = 32   # fallback="raise"
LEAVES_RAISE = 64     # leaves="raise"


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """Built by :func:`options`, which checks it. ``device``: the one destination device (a
    single-device sharding resolved), never with ``sharding``; ``flags``: the core's bits."""

    device: Any = None
    copy: bool | None = None
    sharding: Any = None
    fallback: Fallback = "host"
    readonly: ReadOnly = "copy"
    leaves: Leaves = "keep"
    narrow: Narrow = "warn"
    flags: int = dataclasses.field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        flags = ((COPY_ALWAYS if self.copy is True else COPY_NEVER if self.copy is False else 0)
                 | (PLACED if self.device is not None or self.sharding is not None else 0)
                 | (SHARE_READONLY if self.readonly == "share" else 0)
                 | (QUIET_NARROW if self.narrow == "ok" else 0)
                 | (FALLBACK_RAISE if self.fallback == "raise" else 0)
                 | (LEAVES_RAISE if self.leaves == "raise" else 0))
        object.__setattr__(self, "flags", flags)

    def placed(self, device: Any = None, sharding: Any = None) -> Options:
        return dataclasses.replace(self, device=device, sharding=sharding)

    def unplaced(self, device: Any) -> Options:
        """Onto ``device`` with no device named: JAX's default device, the array uncommitted."""
        out = dataclasses.replace(self, device=device)
        object.__setattr__(out, "flags", self.flags)
        return out

    def quiet(self, device: Any) -> Options:
        """What a producer's host copy is routed with: onto ``device``, with no host
        fallback of its own, no non-tensor leaves and no second narrowing warning."""
        return dataclasses.replace(self, device=device, sharding=None, copy=None,
                                   fallback="raise", leaves="keep", narrow="ok")


DEFAULT = Options()


_made: dict[tuple[Any, ...], Options] = {}   # options checked before, by what was passed


def options(device: Any = None, copy: Any = None, sharding: Any = None,
            fallback: Fallback = "host", readonly: ReadOnly = "copy", leaves: Leaves = "keep",
            narrow: Narrow = "warn") -> Options:
    """The same object for the same options (a loop passing ``sharding=`` checks it once).
    ValueError, or TypeError for a ``device`` that is no ``jax.Device`` or one-device sharding."""
    # (type(copy) in the key: copy=1 equals copy=True, and is refused)
    key: tuple[Any, ...] | None = (device, copy, type(copy), sharding, fallback, readonly,
                                   leaves, narrow)
    try:
        made = _made.get(key)   # type: ignore[arg-type]
    except TypeError:           # a pytree of shardings: checked each time
        made = key = None
    if made is not None:
        return made
    if copy is not None and copy is not True and copy is not False:
        raise ValueError(f"copy must be None, True or False, not {copy!r}")
    for name, value in zip(_CHOICES, (fallback, readonly, leaves, narrow)):
        if value not in _CHOICES[name]:
            allowed = " or ".join(repr(c) for c in _CHOICES[name])
            raise ValueError(f"{name} must be {allowed}, not {value!r}")
    if sharding is not None and device is not None:
        raise ValueError("pass device= or sharding=, not both: one of them.")
    made = Options(single_device(device), copy, sharding, fallback, readonly, leaves, narrow)
    if key is not None:
        if len(_made) >= 64:
            _made.clear()
        _made[key] = made
    return made


def single_device(device: Any) -> Any:
    """The one ``jax.Device`` of ``device`` (a Device or a single-device Sharding)."""
    if device is None or is_device(device):
        return device
    if not hasattr(device, "device_set"):
        raise TypeError(f"device must be a jax.Device or a single-device sharding, not "
                        f"{device!r}; e.g. device=jax.devices('cpu')[0].")
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
