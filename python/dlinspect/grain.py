"""``dlinspect.grain``: grain's ``device_put`` stage, with :func:`dlinspect.to_jax` inside.

grain (Google's data loader for JAX) ends a pipeline with ``grain.experimental.device_put``;
:func:`device_put` here is that stage, built from the same grain building blocks
(``ThreadPrefetchIterDataset`` and ``IterDataset.map``), with ``jax.device_put`` replaced
by :func:`dlinspect.to_jax`. grain is imported when :func:`device_put` is first called,
never by ``import dlinspect`` nor by importing this module.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any

from ._core import LoaderReport, Options, jax_target
from ._options import Fallback, Leaves, Narrow, ReadOnly, is_device
from ._prefetch import _END, Kept, converted, loader_options
from ._words import type_name

__all__ = ["device_put"]


def device_put(ds: Any, device: Any = None, *, sharding: Any = None, cpu_buffer_size: int = 4,
               device_buffer_size: int = 2, copy: bool | None = None,
               fallback: Fallback = "host", readonly: ReadOnly = "copy", leaves: Leaves = "keep",
               narrow: Narrow = "warn") -> Any:
    """Put each element of a grain dataset into JAX through :func:`dlinspect.to_jax`, prefetching.

    The stage ``grain.experimental.device_put(ds, device, cpu_buffer_size=...,
    device_buffer_size=...)`` builds, at the same place in a pipeline and with the
    same two buffers: a thread prefetching up to ``cpu_buffer_size`` elements of
    ``ds`` on the host, then :func:`dlinspect.to_jax` of each element on a second
    thread holding up to ``device_buffer_size`` converted elements ahead.

    Parameters
    ----------
    ds : grain.IterDataset or grain.MapDataset
        The pipeline, typically ending in ``.batch(n)`` (a ``MapDataset`` is made an
        ``IterDataset`` by ``ds.to_iter_dataset()``). Each element is a pytree (dict,
        tuple, list, dataclass, Mapping...) of arrays of shape ``(n, ...)``: NumPy
        arrays from ``np.stack``, grain's ``SharedMemoryArray`` from worker processes
        (``ds.mp_prefetch(...)``), or any DLPack tensor. A ``grain.DataLoader`` is not
        a dataset: iterate it through :func:`dlinspect.prefetch_to_jax` (one epoch per
        ``iter()``; ``len()`` raises ``TypeError``, as a DataLoader has no length).
    device : jax.Device, jax.sharding.Sharding, pytree of them, or None
        Where each element goes, as in ``jax.device_put`` (and grain's
        ``device_put``): a device, a single-device sharding (that device), or, taken
        as ``sharding=``, a sharding over several devices or a pytree of shardings
        and devices, a prefix of the element's structure. None: JAX's default device.
    sharding : jax.sharding.Sharding or pytree of them, optional
        Spread each leaf over several devices, as :func:`dlinspect.to_jax`'s
        ``sharding=`` (``NamedSharding(mesh, PartitionSpec("data"))`` splits the
        leading, batch, axis: ``n`` must divide evenly). Not with a ``device``.
    cpu_buffer_size : int
        Elements of ``ds`` prefetched on the host by a thread (>= 0; 0: no
        thread, elements are produced when the conversion asks for them).
    device_buffer_size : int
        Converted elements held ahead of the consumer by a second thread (>= 0;
        0: no thread, each element converted on the consumer's thread when asked
        for, after the host buffer); each holds its memory (a zero-copy leaf's: the
        batch's own) until consumed and dropped. Worth keeping on JAX CPU devices
        too, although the conversion is only a view or one copy in C: without it,
        it shares the consumer's thread with the step's dispatch
        (``benchmarks/bench_grain.py --variants`` times both, into a jitted step).
    copy, fallback, readonly, leaves, narrow
        Passed to :func:`dlinspect.to_jax` for every element: ``copy=False``
        never copies (``CopyRequiredError`` naming the reason and the key path);
        ``readonly="share"`` views read-only memory; ``leaves="raise"`` refuses
        leaves that are not tensors (grain's string arrays, Python numbers);
        ``narrow="ok"`` narrows 64-bit leaves with x64 off without a warning.

    Returns
    -------
    grain.IterDataset
        The pipeline with the stage appended: each element has the structure
        of ``ds``'s, its tensors as ``jax.Array`` (a leaf of shape ``(n, ...)``
        keeps its shape; 64-bit dtypes narrowed to 32 bits with x64 off), every
        other leaf as it was. Iterating it gives grain's ``DatasetIterator``,
        with ``get_state``/``set_state`` as the source's (checkpointing works as
        through grain's ``device_put``); each ``iter()`` is a new epoch. Its
        ``report`` is a :class:`~dlinspect._core.LoaderReport` of every element
        converted (all epochs; ``report.new_epoch()`` starts again): per key path,
        the bytes imported zero-copy and copied by reason, and one
        ``DLInspectWarning`` where a leaf is copied in every element for a reason
        the user can remove.

    Raises
    ------
    ImportError
        grain is not installed (``pip install grain``), or too old to have
        ``IterDataset`` and ``experimental.ThreadPrefetchIterDataset``.
    TypeError
        ``ds`` is not a grain ``IterDataset`` or ``MapDataset`` (a
        ``grain.DataLoader`` or any other iterable: the message names
        :func:`dlinspect.prefetch_to_jax`); ``device`` is not a device, sharding
        or pytree of them.
    ValueError
        A buffer size that is not an int >= 0, an invalid ``fallback`` / ``readonly`` /
        ``leaves`` / ``narrow`` / ``copy``, or ``device`` with ``sharding``.
    DLInspectError
        While iterating, at the element where it happened (earlier elements are
        yielded first): what :func:`dlinspect.to_jax` raises for that element
        (``CopyRequiredError``, ``ShardingError``, ``ProducerError``...), its
        message starting with the leaf's key path (``['image']``), as
        ``jax.tree_util.keystr`` writes it. Exceptions of ``ds`` itself are
        grain's, re-raised as grain re-raises them.

    Warns
    -----
    DLInspectWarning
        A 64-bit leaf narrowed with x64 off (unless ``narrow="ok"``), emitted on
        the consumer's thread, at the line that iterates the dataset.

    Notes
    -----
    A leaf is imported zero-copy only where JAX can view its memory and nothing but the
    element holds it when it is taken (see :func:`dlinspect.to_jax`): the
    ``jax.Array`` then reads the batch's memory, which it keeps alive. grain's
    ``np.stack`` in this process gives memory only 16-byte aligned for sure
    (``malloc``'s), which XLA:CPU does not view, so those leaves are copied once, in C,
    into 64-byte aligned memory (viewed where they happen to be 64-byte aligned), as
    ``jax.device_put`` views and copies the same memory; ``batch_fn=dlinspect.stack``
    makes every batch viewable. Batches from worker processes (``mp_prefetch``, a
    ``DataLoader`` with ``worker_count > 0``) are shared memory the worker mapped
    too, and an element grain's host buffer thread (``cpu_buffer_size > 0``) still
    holds when it is handed over (the last of an epoch, at least) is held elsewhere:
    both are copied (``copy=False`` views them).

    On a second thread (``device_buffer_size > 0``) the conversion runs under
    JAX's x64 mode as the caller saw it when ``device_put`` was called
    (``jax.enable_x64`` is thread-local). With several JAX processes, a
    ``sharding`` spanning them takes each process's element as its part.

    Examples
    --------
    A pipeline of 256 images and labels per batch, into a jitted step::

        import grain, dlinspect.grain
        ds = (grain.MapDataset.source(source).shuffle(seed=0).batch(256)
              .to_iter_dataset())
        for batch in dlinspect.grain.device_put(ds, narrow="ok"):
            params, loss = step(params, batch["image"], batch["label"])
    """
    ds, prefetch = _iter_dataset(ds)
    device, sharding = _placement(device, sharding)
    opts = loader_options({"cpu_buffer_size": cpu_buffer_size,
                           "device_buffer_size": device_buffer_size}, 0,
                          device, copy, sharding, fallback, readonly, leaves, narrow)
    if cpu_buffer_size:
        ds = prefetch(ds, prefetch_buffer_size=cpu_buffer_size)
    to_jax = _ToJax(opts, jax_target(), bool(device_buffer_size))
    ds = _stage_type()(ds, to_jax)
    if device_buffer_size:
        ds = prefetch(ds, prefetch_buffer_size=device_buffer_size).map(Kept.emit)
    ds.report = to_jax.report
    return ds


@functools.cache
def _stage_type() -> type:
    """The stage as a grain dataset, with its iterator (grain's classes, imported by now):
    as grain's own map, but the element goes from the parent iterator into the conversion
    with no variable between, as the proof that it owns its memory needs (prefetch_to_jax's
    ``converted``); state and checkpoints are the parent's."""
    grain = importlib.import_module("grain")

    class Stage:   # what both hold: the parent and the conversion
        def __init__(self, parent: Any, to_jax: _ToJax) -> None:
            super().__init__(parent)  # type: ignore[call-arg]
            self._to_jax = to_jax

        def __str__(self) -> str:
            return f"{type(self).__name__}({self._to_jax!r})"

    class ToJaxIterator(Stage, grain.DatasetIterator):   # type: ignore[misc, name-defined, unused-ignore]
        def __next__(self) -> Any:
            return self._to_jax.next_of(self._parent)

        def get_state(self) -> Any:
            return self._parent.get_state()

        def set_state(self, state: Any) -> None:
            self._parent.set_state(state)

    class ToJaxDataset(Stage, grain.IterDataset):   # type: ignore[misc, name-defined, unused-ignore]
        def __iter__(self) -> Any:
            return ToJaxIterator(iter(self._parent), self._to_jax)

    return ToJaxDataset


class _ToJax:
    """``to_jax`` of each element, its warnings kept (``threaded``) or shown. ``device=`` the CPU
    device, where it is JAX's default, is converted as ``device=None``, the batch fast path
    (the general route costs about 60 µs more per leaf), and a leaf then elsewhere moved there."""

    __slots__ = ("context", "move_to", "options", "report", "threaded", "x64")

    def __init__(self, options: Options, tg: Any, threaded: bool) -> None:
        self.threaded, self.move_to = threaded, None
        if tg.default_device is None and options.device == tg.cpu_device and options.copy is None:
            # Only where copy=None: with copy=False a move must raise CopyRequiredError,
            # and copy=True takes the general route anyway.
            self.move_to = options.device
            options = options.replaced(device=None)
        self.options, self.report = options, LoaderReport()
        self.x64 = bool(tg.x64.value)
        self.context = tg.x64 if threaded else contextlib.nullcontext

    def next_of(self, parent: Any) -> Any:
        """The next element of grain iterator ``parent``, converted; StopIteration at its end."""
        with self.context(self.x64):
            item = converted(parent, self.options, self.report)
        if item is _END:
            raise StopIteration
        if self.move_to:
            item.out = _move(item.out, self.move_to)
        return item if self.threaded else item.emit()

    def __repr__(self) -> str:
        given = self.options.given()
        return f"dlinspect.to_jax({', '.join(given)})" if given else "dlinspect.to_jax"


def _move(out: Any, device: Any) -> Any:
    from ._tree import flatten
    tg, flat = jax_target(), flatten(out)
    moved = [tg.jax.device_put(x, device) if isinstance(x, tg.array_type) and x.devices() != {device}
             else x for x in flat.leaves]
    return flat.unflatten(moved) if any(a is not b for a, b in zip(moved, flat.leaves)) else out


def _iter_dataset(ds: Any) -> tuple[Any, Any]:
    """``ds`` as a grain IterDataset, and ThreadPrefetchIterDataset; ImportError, TypeError."""
    try:
        grain = importlib.import_module("grain")   # (mypy needs no grain installed)
    except ImportError as exc:
        raise ImportError("dlinspect.grain needs grain, which is not installed: pip install grain") from exc
    prefetch = getattr(getattr(grain, "experimental", None), "ThreadPrefetchIterDataset", None)
    if prefetch is None or not hasattr(grain, "IterDataset"):
        raise ImportError(f"dlinspect.grain needs grain.IterDataset and "
                          f"grain.experimental.ThreadPrefetchIterDataset, which grain "
                          f"{getattr(grain, '__version__', '?')} "
                          f"lacks: pip install -U grain")
    if isinstance(ds, grain.IterDataset):
        return ds, prefetch
    if isinstance(ds, grain.MapDataset):
        return ds.to_iter_dataset(), prefetch
    if isinstance(ds, getattr(grain, "DataLoader", ())):
        raise TypeError("dlinspect.grain.device_put takes a grain IterDataset or MapDataset; a "
                        "grain.DataLoader is not a dataset: convert its batches with "
                        "dlinspect.prefetch_to_jax(loader, ...) (same options), or build the "
                        "pipeline as a dataset (grain.MapDataset.source(...)...batch(n), "
                        ".mp_prefetch(...) for worker processes).")
    raise TypeError(f"dlinspect.grain.device_put takes a grain IterDataset or MapDataset, not "
                    f"{type_name(type(ds))}; for any other iterable of batches use "
                    f"dlinspect.prefetch_to_jax(iterable, ...).")


def _placement(device: Any, sharding: Any) -> tuple[Any, Any]:
    if device is None or sharding is not None or is_device(device):
        return device, sharding          # (both given: check_options says so)
    if hasattr(device, "device_set") and len(device.device_set) == 1:   # a one-device Sharding
        return device, None
    import jax
    from jax.sharding import Sharding, SingleDeviceSharding
    leaves = jax.tree_util.tree_leaves(device)
    if not leaves or not all(isinstance(x, Sharding) or is_device(x) for x in leaves):
        raise TypeError(f"device must be a jax.Device, a jax.sharding.Sharding or a pytree of "
                        f"them (as jax.device_put takes), not {device!r}")
    return None, jax.tree_util.tree_map(
        lambda x: SingleDeviceSharding(x) if is_device(x) else x, device)
