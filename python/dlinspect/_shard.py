"""How a ``jax.sharding.Sharding`` cuts a tensor: pure geometry, no imports or copies.

The sharded route itself is decided and carried out in the core (``route_sharded`` in
src/routes.pxi, the SPLIT executor in src/execute.pxi).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._options import jax_module

__all__ = ["Layout", "layout", "tiling", "uneven", "plain_device", "default_memory",
           "spans_processes"]


class Layout(NamedTuple):
    """How a sharding cuts a tensor of one shape (asked of JAX once per pair)."""

    local: bool               # every device is this process's
    uneven: tuple[Any, ...] | None   # why it does not split evenly (see uneven), or None
    devices: list[Any]        # this process's devices, in JAX's order
    indices: list[Any]        # each device's tuple of slices
    split: bool               # local, even, CPU devices in default memory: host memory is
                              # split in place, each device viewing its slice


_layouts: dict[tuple[Any, tuple[int, ...]], Layout] = {}


def layout(sharding: Any, shape: tuple[int, ...]) -> Layout:
    """The :class:`Layout` of ``shape`` under ``sharding`` (cached: a loader sends the
    same batch shape every step)."""
    key = (sharding, shape)
    got = _layouts.get(key)
    if got is not None:
        return got
    local = not spans_processes(sharding)
    bad = uneven(shape, sharding) if local else None
    index_map = sharding.addressable_devices_indices_map(shape) if bad is None else {}
    split = (local and bad is None and all(d.platform == "cpu" for d in index_map)
             and default_memory(sharding))
    if len(_layouts) >= 256:
        _layouts.clear()
    got = _layouts[key] = Layout(local, bad, list(index_map), list(index_map.values()), split)
    return got


def tiling(sharding: Any, ndim: int) -> tuple[int, ...]:
    """How many shards ``sharding`` cuts each of ``ndim`` axes into (JAX's own answer)."""
    n = len(sharding.device_set)
    # Every per-axis shard count divides the device count, so a shape of n
    # along each axis splits evenly, and n / shard extent is that count.
    return tuple(n // extent for extent in sharding.shard_shape((n,) * ndim))


def uneven(shape: tuple[int, ...], sharding: Any) -> tuple[Any, ...] | None:
    """Why ``sharding`` cannot split ``shape`` evenly, as facts, or None:
    ``("ndim", ndim, jax's words)`` when the sharding has more axes than the tensor,
    ``("axis", axis, size, shard count, device count)`` for an axis that does not divide."""
    try:
        counts = tiling(sharding, len(shape))
    except (ValueError, TypeError, IndexError) as exc:
        return ("ndim", len(shape), (str(exc).splitlines() or [""])[0])
    for axis, (size, count) in enumerate(zip(shape, counts)):
        if size % count:
            return ("axis", axis, size, count, len(sharding.device_set))
    return None


def plain_device(sharding: Any) -> bool:
    """A SingleDeviceSharding in the device's default memory: the same as ``device=``."""
    single = jax_module("jax.sharding").SingleDeviceSharding
    return type(sharding) is single and default_memory(sharding)


def default_memory(sharding: Any) -> bool:
    """True when ``sharding`` puts arrays in each device's default memory (not pinned_host...)."""
    kind = getattr(sharding, "memory_kind", None)
    return kind is None or all(kind == d.default_memory().kind for d in sharding.device_set)


def spans_processes(sharding: Any) -> bool:
    """True when ``sharding`` has devices this process cannot address (multi-process)."""
    return not sharding.is_fully_addressable
