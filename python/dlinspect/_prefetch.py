"""``prefetch_to_jax``: a loader whose batches arrive as JAX arrays, converted ahead."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import inspect
import operator
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ._core import LoaderReport, Options, check_options, collecting, convert_next, jax_target, warn
from ._options import Fallback, Leaves, Narrow, ReadOnly
from ._words import type_name
from .errors import SourceExhaustedError


_END = object()  # the source has no more batches
_POLL_S = 0.05  # how often a blocked worker looks at the stop flag
_JOIN_S = 5.0   # how long stopping waits for a worker stuck in the source's next()
_PROBE = 4      # thread=None: batches timed before deciding
_OVERLAP_S = 0.0005


@atexit.register
def _stop_all() -> None:
    # Workers still running are stopped and joined: a daemon thread killed inside jaxlib
    # during finalization aborts the process.
    live = [t for t in threading.enumerate() if isinstance(t, _Worker)]
    for worker in live:
        worker.stop.set()
    for worker in live:
        worker.join(_JOIN_S)


def loader_options(sizes: dict[str, Any], least: int, *to_jax: Any) -> Options:
    """Checked (ValueError): each of ``sizes`` an int >= ``least``, and to_jax's options."""
    for name, size in sizes.items():
        if type(size) is not int or size < least:
            raise ValueError(f"{name} must be an int >= {least} (held ahead), not {size!r}")
    return check_options(*to_jax)


@dataclasses.dataclass(slots=True, eq=False)
class Kept:
    """A converted batch and the warnings its conversion kept, for the consumer's thread
    (an object, not a tuple: grain's statistics walk tuples as pytrees)."""

    out: Any
    messages: list[str]

    def emit(self) -> Any:
        for message in self.messages:
            warn(message, True)
        return self.out


def converted(it: Iterator[Any], options: Options, report: LoaderReport) -> Any:
    """The next item of ``it`` converted, its warnings kept (:class:`Kept`), or ``_END``. The
    item goes from the source into the conversion with no variable of ours between: the
    proof that a batch owns its memory counts the references to it (dlinspect._core,
    convert_next)."""
    before = getattr(collecting, "messages", None)
    messages: list[str] = []
    collecting.messages = messages
    try:
        out = convert_next(it, options, report, _END)
    finally:
        collecting.messages = before
    return _END if out is _END else Kept(out, messages)


class PrefetchLoader:
    """Batches of a source as JAX arrays, one epoch per ``iter()``: what :func:`prefetch_to_jax` returns.

    Each ``iter()`` starts a new pass over the source (``iter(source)``), with its
    own worker thread where one is used; ``len()`` is the source's, where it has
    one. Not thread-safe: one consumer per epoch. A source that is an iterator
    (``iter(source) is source``: a generator, tf.data's ``as_numpy_iterator()``)
    gives one epoch (the one that exhausts it, or stops early and closes it); a new
    ``iter()``, or one over a generator another loop finished, raises
    ``SourceExhaustedError`` instead of giving an epoch of no batches.

    Attributes
    ----------
    source : iterable
        The batches' source, e.g. a ``torch.utils.data.DataLoader``.
    size : int
        Batches converted ahead of the consumer.
    thread : bool or None
        Whether batches are converted on a background thread: True, False, or
        None, decided per epoch from the first batches' timings (see
        :func:`prefetch_to_jax`, ``thread``).
    options : Options
        The :func:`to_jax` options for every batch, checked once.
    report : LoaderReport
        Per key path, the bytes the batches handed over in the latest epoch begun
        imported zero-copy and copied, and why (``print(loader.report)``; an epoch
        still running alongside keeps its own); one ``DLInspectWarning`` per loader
        where a leaf is copied in every batch for a reason the user can remove.
    """

    def __init__(self, source: Iterable[Any], size: int, thread: bool | None,
                 options: Options, progress: bool) -> None:
        self.source, self.size, self.thread, self.options = source, size, thread, options
        self._progress = progress
        self.report = LoaderReport(at_delivery=True)
        self._spent = False   # an epoch over a one-shot source (an iterator) has begun

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the source of this PrefetchLoader ({type(self.source).__name__}) "
                            f"has no len()") from None

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.source)
        if it is self.source:   # one pass only (an epoch stopped early closes it, too)
            # (a generator another loop already finished, this loader's or any other's)
            finished = inspect.isgenerator(it) and inspect.getgeneratorstate(it) == inspect.GEN_CLOSED
            if self._spent or finished:
                raise SourceExhaustedError(
                    f"the source of this PrefetchLoader, a {type_name(type(self.source))}, "
                    f"is an iterator that has given all its items in an earlier "
                    f"{'epoch' if self._spent else 'loop (it is finished)'}, so a new "
                    f"epoch over it would have no batches. To fix: pass what starts "
                    f"again on every iter() (the DataLoader or tf.data.Dataset itself, a "
                    f"list), or call prefetch_to_jax on a new iterator per epoch.")
            self._spent = True
        bar = _progress_bar(self.source) if self._progress else None
        self.report = self.report._next_epoch()
        # The caller's x64 mode (thread-local under jax.enable_x64), for a worker.
        return _epoch(it, self.options, self.report, bar, self.size, self.thread,
                      bool(jax_target().x64.value))

    def __repr__(self) -> str:
        return (f"<PrefetchLoader of {type(self.source).__name__}, size={self.size}, "
                f"thread={self.thread}>")


def prefetch_to_jax(iterable: Iterable[Any], size: int = 2, *, device: Any = None,
                    sharding: Any = None, copy: bool | None = None, fallback: Fallback = "host",
                    readonly: ReadOnly = "copy", leaves: Leaves = "keep", narrow: Narrow = "warn",
                    thread: bool | None = None, progress: bool = False) -> PrefetchLoader:
    """A loader yielding each batch of ``iterable`` as JAX arrays, converted ahead.

    Parameters
    ----------
    iterable : iterable of pytrees of tensors
        Batches: a ``torch.utils.data.DataLoader``, a list, anything whose items
        :func:`to_jax` takes. Each ``iter()`` of the returned loader calls
        ``iter(iterable)`` again: a DataLoader gives one epoch per pass, a generator
        its items once (a second epoch over it raises ``SourceExhaustedError``).
    size : int
        How many converted batches may wait ahead of the consumer (>= 1), each holding
        its memory (a zero-copy batch's: the producer's) until dropped.
    device, sharding, copy, fallback, readonly, leaves, narrow
        Passed to :func:`to_jax` for every batch (``narrow="ok"``: int64 labels
        narrowed with x64 off, without a warning per batch); ``sharding`` (e.g.
        ``NamedSharding(mesh, PartitionSpec("data"))``) spreads each batch over
        several devices along its leading axis, and under ``jax.distributed`` a
        sharding spanning the processes takes each process's batch as its part.
    thread : bool or None
        True: a worker thread takes items from ``iterable`` and converts them, up
        to ``size`` ahead, while the consumer works. False: each batch is loaded
        and converted on the consumer's thread when asked for (a plain ``to_jax``
        loop). None (the default): False when the batches go to JAX CPU devices
        (the jitted step then keeps the host's cores busy, and a worker thread only
        competes with it: measured slower, BENCHMARKS.md's loader suite); elsewhere
        each epoch times its first 4 batches on the consumer's thread, and a worker
        thread takes over only when loading a batch and the consumer's own work
        between batches both take over 0.5 ms (medians): work to overlap that is
        worth more than handing each batch across threads under the GIL.
    progress : bool
        Show a tqdm progress bar (``pip install tqdm``) per epoch, with a total
        when ``len(iterable)`` exists.

    Returns
    -------
    PrefetchLoader
        Iterable, one epoch per ``iter()``, with ``len()`` where ``iterable`` has
        one; each batch has the structure of the input batch, tensors as
        ``jax.Array``, other leaves as they were.

    Raises
    ------
    ValueError
        ``size < 1`` or an invalid ``fallback`` / ``readonly`` / ``leaves``.
    ImportError
        ``progress=True`` without tqdm installed.
    SourceExhaustedError
        At ``iter()`` of a loader whose source is an iterator an earlier epoch
        went over (a ``RuntimeError``).
    Exception
        While iterating: whatever ``iterable`` or the conversion raised,
        re-raised (same object, same traceback) when the consumer reaches the
        batch where it happened; the batches before it are yielded first.
        Errors about one leaf of a batch name its key path.

    Warns
    -----
    DLInspectWarning
        Stopping early while the source is stuck in ``next()`` for over 5 s.

    Notes
    -----
    Each batch is converted as :func:`to_jax` converts a batch, bare tensors
    included: a leaf is imported zero-copy only where nothing but the batch holds
    its memory when it is taken (a new array or tensor per batch: torch's collate,
    ``np.stack``, :func:`dlinspect.stack`); a leaf the source still holds (a buffer
    it refills, a ring of them, another view of its memory) is copied, from the
    first batch, so batches kept across steps keep their values
    (``loader.report``: ``"aliased"``; docs/loaders/index.md, "Zero-copy and memory
    a source keeps"). A source that writes ahead of what it has handed over (a
    pinning thread refilling one buffer) changes a batch before any consumer sees it.

    When the consumer stops early (``break``, an exception, or closing the
    epoch's iterator), the worker is told to stop, converted batches still
    waiting are dropped (their producers' deleters run), the worker thread is
    joined, and the source's iterator is closed if it has ``close()``. A worker
    blocked inside ``next()`` of a slow source is waited for up to 5 s, then left
    to finish (a daemon thread), with a ``DLInspectWarning``. Live workers are
    stopped and joined at interpreter exit. The worker converts under the caller's
    x64 mode at ``iter()`` (``jax.enable_x64`` is thread-local).

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> batches = [{"x": np.full((2, 3), i, np.float32), "id": f"b{i}"} for i in range(3)]
    >>> loader = dlinspect.prefetch_to_jax(batches)
    >>> len(loader), [float(b["x"].sum()) for b in loader]
    (3, [0.0, 6.0, 12.0])
    >>> [b["id"] for b in loader]          # a second epoch
    ['b0', 'b1', 'b2']
    """
    opts = loader_options({"size": size}, 1, device, copy, sharding, fallback, readonly, leaves,
                          narrow)
    if progress:
        _progress_bar(None)   # tqdm missing: say so now, not at the first epoch
    return PrefetchLoader(iterable, size, None if thread is None else bool(thread), opts,
                          progress)


def _progress_bar(iterable: Any) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError("prefetch_to_jax(progress=True) draws its progress bar with tqdm, "
                          "which is not installed; install it with: pip install tqdm") from exc
    if iterable is None:
        return None
    return tqdm(total=operator.length_hint(iterable) or None, unit="batch", desc="prefetch_to_jax")


def _batches(it: Iterator[Any], options: Options, report: LoaderReport) -> Iterator[Kept]:
    """Each item of ``it`` converted (:func:`converted`), until the source ends."""
    while (item := converted(it, options, report)) is not _END:
        yield item


def _epoch(it: Iterator[Any], options: Options, report: LoaderReport, bar: Any, size: int,
           thread: bool | None, x64: bool) -> Iterator[Any]:
    """One epoch, converted on the consumer's thread or by a worker (see ``thread``)."""
    # The one delivery, whichever thread draws (a generator: a leaked StopIteration raises).
    batches = _batches(it, options, report)
    worker = _Worker(batches, size, x64) if thread else None
    timings: list[tuple[float, float]] = []   # (loading, the consumer's work meanwhile)
    # Held here: a generator still alive at interpreter exit is finalized after the
    # modules' globals are gone, when its `finally` below can do nothing (the atexit
    # hook has stopped and joined the worker already).
    finalizing = sys.is_finalizing
    try:
        while True:
            start = time.perf_counter()
            if worker and worker.pid != os.getpid():   # (a fork's child has one thread)
                raise RuntimeError(
                    f"this prefetch_to_jax epoch began in process {worker.pid}, whose worker "
                    f"thread does not run in this one ({os.getpid()}, forked from it "
                    f"mid-epoch), so it cannot go on here. To fix: begin a new epoch in this "
                    f"process (iter(loader) again), or fork before the epoch begins.")
            item: Any = next(batches, _END) if worker is None else worker.ready.get()
            if isinstance(item, BaseException):   # what the worker raised, at this batch
                raise item
            if item is _END:
                return
            if bar is not None:
                bar.update(1)
            report._delivered()
            handed = time.perf_counter()
            yield item.emit()
            del item
            if thread is None and len(timings) < _PROBE:
                timings.append((handed - start, time.perf_counter() - handed))
                if len(timings) == _PROBE and not _on_cpu(options) and min(
                        map(statistics.median, zip(*timings))) > _OVERLAP_S:
                    worker = _Worker(batches, size, x64)
    finally:
        if not finalizing():
            _end(worker, it, bar)


def _on_cpu(options: Options) -> bool:
    import jax
    # (no place named: where to_jax puts host memory, JAX's default device or else the CPU's)
    where = options.sharding or options.device or jax_target().default_device
    return where is None or all(d.platform == "cpu" for s in jax.tree_util.tree_leaves(where)
                                for d in getattr(s, "device_set", [s]))


class _Worker(threading.Thread):
    """Converts ahead under the caller's x64 mode; what it raises is raised at that batch."""

    def __init__(self, batches: Iterator[Any], size: int, x64: bool) -> None:
        super().__init__(name="dlinspect-prefetch", daemon=True)
        self.batches, self.x64 = batches, x64
        self.ready: queue.Queue[Any] = queue.Queue(maxsize=size)   # Kept, _END or an exception
        self.stop = threading.Event()
        self.pid = os.getpid()
        self.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            with contextlib.suppress(queue.Full):
                self.ready.put(item, timeout=_POLL_S)
                return True
        return False

    def run(self) -> None:
        try:
            with jax_target().x64(self.x64):
                for item in self.batches:
                    if not self._put(item):
                        return
        except BaseException as exc:  # handed to the consumer, raised at this batch
            self._put(exc)
            return
        self._put(_END)


def _end(worker: _Worker | None, it: Iterator[Any], bar: Any) -> None:
    if worker:
        worker.stop.set()
        _drain(worker.ready)          # frees batches waiting ahead; unblocks a waiting put
        if threading.current_thread() is not worker:  # (a GC pass may finalize us there)
            worker.join(_JOIN_S)
        _drain(worker.ready)
    if worker and worker.pid != os.getpid():
        pass   # (a forked child's: the source is inside the parent's worker, not closed here)
    elif worker and worker.is_alive():
        warn(f"prefetch_to_jax stopped, but its source has been inside next() for over "
             f"{_JOIN_S:g} s; its worker thread is left to finish that call (a daemon "
             f"thread) and the source is not closed.", True)
    elif callable(close := getattr(it, "close", None)):
        close()
    if bar is not None:
        bar.close()


def _drain(q: queue.Queue[Any], empty: type[Exception] = queue.Empty) -> None:
    # Asked q.empty() first: at interpreter exit, when a live generator is finalized, the
    # queue module's globals may be gone, and get_nowait's own `raise Empty` then fails
    # (a TypeError printed as ignored); `empty` is bound here for the same reason.
    while not q.empty():
        try:
            q.get_nowait()
        except empty:
            return
