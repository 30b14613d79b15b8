"""Sharded import: one tensor split over the devices of a ``jax.sharding.Sharding``.

Host memory bound for CPU devices is consumed once into one owner and each
device imports its own slice of it (``Sharding.addressable_devices_indices_map``):
zero-copy where that slice's memory allows (slices of a C-contiguous batch
along axis 0 are contiguous; their alignment decides), and JAX assembles the
global array (``jax.make_array_from_single_device_arrays``). Anything else goes
to JAX whole (``to_jax``), and JAX's own runtime spreads it: ``jax.device_put``
for a sharding this process addresses fully, ``jax.make_array_from_process_local_data``
for one spanning several processes (then ``x`` is this process's part).
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._core import TensorInfo
from ._route import (
    _CAPSULE_TYPE, _RAISE, COPY, ERROR, ZERO_COPY, CopyRequiredError, Route, _capsule_of,
    _decide_jax, _describe, _error, _general_to_jax, _host_view, _one_to_jax, _raise, _read, warn,
)
from .errors import ShardingError

# What executing a sharded route does.
_SPLIT = "split"                    # one host view, each device imports its slice
_DEVICE_PUT = "device-put"          # to_jax whole, then jax.device_put(array, sharding)
_PROCESS_LOCAL = "process-local"    # to_jax whole, then make_array_from_process_local_data


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


def slice_info(info: TensorInfo, index: tuple[slice, ...]) -> TensorInfo:
    """The header of ``x[index]`` (basic slices only) for a tensor whose header is ``info``.

    Same data pointer; ``byte_offset``, shape and strides (in elements) change.
    The result is validated as :func:`dlinspect.peek` validates a header.
    """
    state = list(info._state())
    shape, strides = list(state[4]), list(state[5])
    offset = state[10]
    for axis, sl in enumerate(index):
        start, stop, step = sl.indices(shape[axis])
        count = len(range(start, stop, step))
        if count:
            offset += start * strides[axis] * info.itemsize
        shape[axis], strides[axis] = count, strides[axis] * step
    if offset < 0:  # negative strides: the slice starts before data; move data instead
        state[11], offset = state[11] + offset, 0
    state[4], state[5], state[6], state[10] = tuple(shape), tuple(strides), False, offset
    return _core._rebuild_info(tuple(state))


def plain_device(sharding: Any) -> bool:
    """A SingleDeviceSharding in the device's default memory: the same as ``device=``."""
    from jax.sharding import SingleDeviceSharding
    return type(sharding) is SingleDeviceSharding and default_memory(sharding)


def default_memory(sharding: Any) -> bool:
    """True when ``sharding`` puts arrays in each device's default memory (not pinned_host...)."""
    kind = getattr(sharding, "memory_kind", None)
    return kind is None or all(kind == d.default_memory().kind for d in sharding.device_set)


def _split_on_host(info: TensorInfo, sharding: Any, devices: Any) -> bool:
    """Host memory, CPU devices in their default memory, whole bytes per element:
    slice a host view."""
    return (info.host_accessible and info.numpy_dtype is not None
            and info.dtype.bits * info.dtype.lanes % 8 == 0
            and all(d.platform == "cpu" for d in devices) and default_memory(sharding))


def spans_processes(sharding: Any) -> bool:
    """True when ``sharding`` has devices this process cannot address (multi-process)."""
    return not sharding.is_fully_addressable


def decide(info: TensorInfo, c: Any, sharding: Any, copy: bool | None, fallback: str,
           readonly: str, has_producer: bool) -> Route:
    """The route of ``info`` onto ``sharding`` (pure: imports and copies nothing)."""
    target = "jax"
    local = not spans_processes(sharding)
    if local:
        problem = uneven(info.shape, sharding)
        if problem is not None:
            return _error(info, target, ShardingError(f"{_describe(info)} cannot be sharded: {problem}"))
        index_map = sharding.addressable_devices_indices_map(info.shape)
        if _split_on_host(info, sharding, index_map):
            shards = tuple((dev, idx, _decide_jax(slice_info(info, idx), c, dev, copy, fallback,
                                                  readonly, has_producer))
                           for dev, idx in index_map.items())
            return _combine(info, shards)
    whole = _decide_jax(info, c, None, copy, fallback, readonly, has_producer)
    if whole.kind == ERROR:
        return whole
    n = len(sharding.device_set)
    how = (f"JAX's device_put spreads it over the {n} devices of the sharding" if local else
           "jax.make_array_from_process_local_data spreads this process's part over its devices")
    if copy is False:
        return _error(info, target, CopyRequiredError(
            f"{_describe(info)} needs a copy, but copy=False: it is not host memory bound for CPU "
            f"devices, so {how}, which copies. To fix: pass copy=None."))
    return Route(COPY, f"{whole.reason} Then {how}.", info, target,
                 copy_bytes=whole.copy_bytes + info.nbytes, warning=whole.warning,
                 action=_DEVICE_PUT if local else _PROCESS_LOCAL)


def _combine(info: TensorInfo, shards: tuple[Any, ...]) -> Route:
    for dev, _, route in shards:
        if route.kind == ERROR:
            return Route(ERROR, f"The shard for {dev}: {route.reason}", info, "jax",
                         error=route.error, action=_RAISE, shards=shards)
    views = sum(route.zero_copy for _, _, route in shards)
    reason = f"{views} of {len(shards)} shards are views of the producer's memory"
    first_copy = next((d, r) for d, _, r in shards if not r.zero_copy) if views < len(shards) else None
    if first_copy is not None:
        reason += f"; the shard for {first_copy[0]}: {first_copy[1].reason}"
    else:
        reason += "."
    return Route(ZERO_COPY if first_copy is None else COPY, reason, info, "jax",
                 copy_bytes=sum(r.copy_bytes for _, _, r in shards),
                 warning=next((r.warning for _, _, r in shards if r.warning), None),
                 action=_SPLIT, shards=shards)


def to_jax_sharded(x: Any, c: Any, sharding: Any, copy: bool | None, fallback: str,
                   readonly: str) -> Any:
    """One tensor onto ``sharding``: see the module docstring."""
    cap, info, stream = _read(x, c)
    route = decide(info, c, sharding, copy, fallback, readonly, type(x) is not _CAPSULE_TYPE)
    action = route._action
    if action is _RAISE:
        _raise(route)
    if action is _SPLIT:
        # One owner for the whole tensor: the producer's deleter runs when the
        # last shard (or view) dies. A legacy capsule cannot say read-only and
        # is imported as writable, as to_jax does.
        if route.warning is not None:
            warn(route.warning)  # before consuming: -W error leaves a capsule as it was
        read_only = info.read_only is True
        view, _ = _host_view(cap, info, read_only=read_only)
        del cap
        # view[idx, ...]: an array even for a 0-d leaf (view[()] is a scalar).
        arrays = [_one_to_jax(_capsule_of(view[(*idx, ...)], read_only), dev, copy, fallback,
                              readonly, quiet=True)
                  for dev, idx, _ in route.shards]
        return c.jax.make_array_from_single_device_arrays(info.shape, sharding, arrays)
    whole = _general_to_jax(c, x, cap, info, stream, None, copy, fallback, readonly)
    if action is _PROCESS_LOCAL:
        return c.jax.make_array_from_process_local_data(sharding, whole)
    return c.jax.device_put(whole, sharding)
