"""``plan`` and ``explain``: the routes of a tensor or a batch, decided without
importing or copying anything (the core decides, :mod:`dlinspect._words` words,
:mod:`dlinspect._tree` walks the batch)."""

from __future__ import annotations

from typing import Any

from . import _tree, _words
from ._core import Route, TensorInfo, failed, is_tensor, plan_one, repeated_capsule
from ._core import repeated_capsule_error, untouched
from ._options import options as make_options

__all__ = ["plan", "explain"]


def plan(x: Any, target: str = "jax", *, device: Any = None, copy: bool | None = None,
         sharding: Any = None, fallback: str = "host", readonly: str = "copy",
         leaves: str = "keep", narrow: str = "warn") -> Any:
    """Decide where a tensor would go, without importing or copying anything.

    Parameters
    ----------
    x : object with ``__dlpack__``, DLPack capsule, TensorInfo, or pytree of them
        The tensor (a capsule is only read, never consumed). The producer is
        asked to export it exactly as :func:`to_jax` would (the export is then
        released unconsumed), so its refusals show in the plan. A ``jax.Array``
        is not exported at all (see :func:`to_jax`).
    target : {"jax", "host"}
        Where it should go.
    device : jax.Device or single-device Sharding, optional
        Destination device for ``target="jax"``; default: the source's own.
    copy : bool or None
        Array API ``copy``: True always copies, False never (a needed copy becomes a
        ``CopyRequiredError`` route), None copies only where needed.
    sharding : jax.sharding.Sharding, optional
        Plan the split over several devices (see :func:`to_jax`); the route's
        ``shards`` then give each device's index and route, and an uneven split
        is a ``ShardingError`` route.
    fallback : {"host", "raise"}
        What to do with memory on a device JAX has no backend for: go through host
        memory, or an ``UnsupportedDeviceError`` route.
    readonly : {"copy", "share"}
        Read-only memory (versioned READ_ONLY flag) is copied by default;
        ``"share"`` imports it without a copy (see :func:`to_jax`).
    leaves : {"keep", "raise"}
        A leaf that is not a tensor (a str, a number, a NumPy array of strings...;
        the whole of ``x`` too, when it is one) gets an ``"untouched"`` route, or
        (``"raise"``) a ``NotDLPackError`` route. The batch is walked as
        :func:`to_jax` walks it (Mappings and dataclasses included).
    narrow : {"warn", "ok"}
        Whether a 64-bit dtype JAX narrows (x64 off) gets a ``warning``.

    Returns
    -------
    Route or pytree of Route
        ``kind``, ``reason``, ``needs``, ``copy_bytes``, ``jax_device``, ``error``;
        for a pytree, one Route per leaf in the same structure, each error's
        message led by its leaf's key path (``['inputs']['pixels']: ...``).
        ``to_jax(x)`` (``to_host(x)``) does exactly this: it raises ``route.error``
        when the kind is ``"error"``, and shares memory exactly when it is
        ``"zero-copy"``. A ``"host-fallback"`` route rests on the producer's answer
        to a host-copy request, which plan does not make: executing it raises
        ``UnsupportedDeviceError`` (listing what was tried) when no host copy can
        be had.

    Raises
    ------
    ValueError, TypeError
        An option outside its documented values.
    ContainerError
        A Mapping or dataclass of the batch cannot be rebuilt (see :func:`to_jax`).

    Notes
    -----
    A producer's refusal (any exception its ``__dlpack__`` or ``__dlpack_device__``
    raises), a corrupt or consumed header and every routing problem are returned
    as a route of kind ``"error"``, with the exception in ``error`` and ``info``
    None where no header could be read.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> dlinspect.plan(np.arange(6.0).reshape(2, 3)[:, :2]).kind
    'copy'
    >>> routes = dlinspect.plan({"x": np.ones(6, np.float32)[::2], "id": "a"})
    >>> routes["x"].kind, routes["id"].kind
    ('copy', 'untouched')
    """
    if target not in ("jax", "host"):
        raise ValueError(f"target must be 'jax' or 'host', not {target!r}")
    opts = make_options(device, copy, sharding, fallback, readonly, leaves, narrow)
    tg = None
    if target == "jax":
        from ._jaxcaps import target as jax_target
        tg = jax_target()
    if isinstance(x, TensorInfo) or is_tensor(x):
        return plan_one(x, tg, target, opts)
    flat = _tree.flatten(x)
    routes = []
    repeated = {i for i in [repeated_capsule(flat.leaves)] if i >= 0}
    for i, leaf in enumerate(flat.leaves):
        if i in flat.errors:   # a container that cannot be rebuilt: its error, in its place
            route = failed(flat.errors[i], target)
        elif i in repeated:    # the same capsule twice: the second is the error
            route = failed(repeated_capsule_error(), target)
        else:
            route = (plan_one(leaf, tg, target, opts) if is_tensor(leaf)
                     else untouched(leaf, target, opts))
        if route.problem is not None:
            route.key_path = flat.keystr(i)
        routes.append(route)
    return flat.unflatten(routes)


def explain(x: Any, target: str = "jax", **options: Any) -> str:
    """The header and the route, in a few readable lines (one block per pytree leaf).

    Takes the same arguments as :func:`plan`; reads, never consumes.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> print(dlinspect.explain(np.ones(3, np.float32), target="host"))  # doctest: +ELLIPSIS
    <TensorInfo kDLCPU:0 float32[3] ...>
    route to host: zero-copy
      NumPy views the kDLCPU memory directly.
    """
    routes = plan(x, target, **options)
    if isinstance(routes, Route):
        return _words.explain_one(routes, x)
    return _words.explain_tree(_tree.flatten(routes))
