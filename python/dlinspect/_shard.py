"""How a ``jax.sharding.Sharding`` cuts a tensor: pure geometry, no imports or copies.

The sharded route itself is planned in :mod:`dlinspect._plan` (``plan_sharded``) and
carried out in :mod:`dlinspect._execute`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tiling", "uneven", "plain_device", "default_memory", "spans_processes"]


def tiling(sharding: Any, ndim: int) -> tuple[int, ...]:
    """How many shards ``sharding`` cuts each of ``ndim`` axes into (JAX's own answer)."""
    n = len(sharding.device_set)
    # Every per-axis shard count divides the device count, so a shape of n
    # along each axis splits evenly, and n / shard extent is that count.
    return tuple(n // extent for extent in sharding.shard_shape((n,) * ndim))


def uneven(shape: tuple[int, ...], sharding: Any) -> str | None:
    """Why ``sharding`` cannot split ``shape`` evenly, or None."""
    try:
        counts = tiling(sharding, len(shape))
    except (ValueError, TypeError, IndexError) as exc:
        return (f"{sharding} does not fit a tensor of {len(shape)} dimensions "
                f"({str(exc).splitlines()[0]}). To fix: give this leaf a PartitionSpec with at "
                f"most {len(shape)} entries, e.g. PartitionSpec() to replicate it.")
    for axis, (size, count) in enumerate(zip(shape, counts)):
        if size % count:
            where = "the batch axis (axis 0)" if axis == 0 else f"axis {axis}"
            return (f"{where} has {size} elements, which do not split evenly into the {count} "
                    f"shards the sharding cuts it into ({len(sharding.device_set)} devices). To "
                    f"fix: make it a multiple of {count} (e.g. DataLoader(..., drop_last=True), "
                    f"or pad the last batch), or replicate this leaf with PartitionSpec().")
    return None


def plain_device(sharding: Any) -> bool:
    """A SingleDeviceSharding in the device's default memory: the same as ``device=``."""
    from jax.sharding import SingleDeviceSharding
    return type(sharding) is SingleDeviceSharding and default_memory(sharding)


def default_memory(sharding: Any) -> bool:
    """True when ``sharding`` puts arrays in each device's default memory (not pinned_host...)."""
    kind = getattr(sharding, "memory_kind", None)
    return kind is None or all(kind == d.default_memory().kind for d in sharding.device_set)


def spans_processes(sharding: Any) -> bool:
    """True when ``sharding`` has devices this process cannot address (multi-process)."""
    return not sharding.is_fully_addressable
