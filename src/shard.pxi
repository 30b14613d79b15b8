# shard.pxi: how a jax.sharding.Sharding cuts a tensor: pure geometry, asked of JAX once.

class Layout(_NamedTuple):
    """How a sharding cuts a tensor of one shape (asked of JAX once per pair)."""

    local: bool               # every device is this process's
    uneven: object            # why it does not split evenly (see uneven), or None
    devices: list             # this process's devices, in JAX's order
    indices: list             # each device's tuple of slices
    split: bool               # local, even, CPU devices in default memory: host memory is
                              # split in place, each device viewing its slice


_layouts = {}   # (sharding, shape) -> Layout; a module global (tests start it afresh)


def layout(sharding, shape):
    """The :class:`Layout` of ``shape`` under ``sharding`` (cached: a loader's every step)."""
    key = (sharding, shape)
    got = _layouts.get(key)
    if got is not None:
        return got
    local = not spans_processes(sharding)
    bad = uneven(shape, sharding) if local else None
    index_map = sharding.addressable_devices_indices_map(shape) if bad is None else {}
    split = (local and bad is None and all(d.platform == "cpu" for d in index_map)
             and default_memory(sharding))
    got = Layout(local, bad, list(index_map), list(index_map.values()), split)
    _remember(_layouts, key, got, 256)
    return got


def uneven(shape, sharding):
    """Why ``sharding`` cannot split ``shape`` evenly, or None: ``("ndim", ndim, jax's words)``,
    or ``("axis", axis, size, shard count, device count)`` for an axis that does not divide."""
    try:
        # The shards per axis, JAX's own answer: each count divides the device count n, so
        # a shape of n along each axis splits evenly, and n / shard extent is that count.
        if len(getattr(sharding, "spec", ())) > len(shape):   # (jax's device_put refuses it)
            raise ValueError(f"its PartitionSpec has {len(sharding.spec)} entries")
        n = len(sharding.device_set)
        counts = [n // extent for extent in sharding.shard_shape((n,) * len(shape))]
    except (ValueError, TypeError, IndexError) as exc:
        return "ndim", len(shape), first_line(exc, False)
    for axis, (size, count) in enumerate(zip(shape, counts)):
        if size % count:
            return "axis", axis, size, count, n
    return None


_plain_devices = {}   # id(sharding) -> (sharding, _is_plain_device of it); a module global


cdef bint _is_plain_device(sharding) except -1:
    """A SingleDeviceSharding in default memory (as ``device=``), remembered per object."""
    got = _plain_devices.get(id(sharding))
    if got is not None and (<tuple>got)[0] is sharding:
        return (<tuple>got)[1]
    single = _options_module.jax_module("jax.sharding").SingleDeviceSharding
    plain = type(check_sharding(sharding)) is single and default_memory(sharding)
    _remember(_plain_devices, id(sharding), (sharding, plain), 256)
    return plain


def default_memory(sharding):
    """True when ``sharding`` puts arrays in each device's default memory (not pinned_host...)."""
    kind = getattr(sharding, "memory_kind", None)
    return kind is None or all(kind == d.default_memory().kind for d in sharding.device_set)


def spans_processes(sharding):
    """True when ``sharding`` has devices this process cannot address (multi-process)."""
    return not sharding.is_fully_addressable
