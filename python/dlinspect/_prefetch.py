"""``prefetch_to_jax``: a loader whose batches arrive as JAX arrays, converted ahead."""

from __future__ import annotations

import atexit
import contextlib
import inspect
import queue
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from ._core import LoaderReport, collecting, warn
from ._options import Fallback, Leaves, Narrow, Options, ReadOnly, options as check_options
from ._reuse import ReuseGuard, check_reuse
from .errors import DLInspectWarning, SourceExhaustedError

__all__ = ["prefetch_to_jax", "PrefetchLoader"]

_BATCH, _FAILED, _DONE = 0, 1, 2
_POLL_S = 0.05  # how often a blocked worker looks at the stop flag
_JOIN_S = 5.0   # how long stopping waits for a worker stuck in the source's next()
# thread=None off JAX CPU devices: the first _PROBE batches timed, a worker if both medians > _OVERLAP_S.
_PROBE = 4
_OVERLAP_S = 0.0005

# Workers still running, stopped and joined at interpreter exit: a daemon thread
# killed inside jaxlib during finalization aborts the process.
_live: set[tuple[threading.Thread, threading.Event]] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        live = list(_live)
    for _, stop in live:
        stop.set()
    for worker, _ in live:
        worker.join(_JOIN_S)


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
    reuse : str
        ``"error"`` or ``"copy"``: what a source that reuses memory gets (see
        :func:`prefetch_to_jax`).
    report : LoaderReport
        Per key path, the bytes the batches handed over in the latest epoch begun
        imported zero-copy and copied, and why (``print(loader.report)``; an epoch
        still running alongside keeps its own); one ``DLInspectWarning`` per loader
        where a leaf is copied in every batch for a reason the user can remove.
    """

    def __init__(self, source: Iterable[Any], size: int, thread: bool | None,
                 options: Options, progress: bool, reuse: str = "error") -> None:
        self.source = source
        self.reuse = reuse
        self.size = size
        self.thread = thread
        self.options = options
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
        it: Iterator[Any] = iter(self.source)
        if it is self.source:   # one pass only (an epoch stopped early closes it, too)
            # (a generator another loop already finished, this loader's or any other's)
            finished = (inspect.isgenerator(it)
                        and inspect.getgeneratorstate(it) == inspect.GEN_CLOSED)
            if self._spent or finished:
                tp = type(self.source)
                raise SourceExhaustedError(
                    f"the source of this PrefetchLoader, a {tp.__module__}.{tp.__qualname__}, "
                    f"is an iterator that has given all its items in an earlier "
                    f"{'epoch' if self._spent else 'loop (it is finished)'}, so a new "
                    f"epoch over it would have no batches. To fix: pass what starts "
                    f"again on every iter() (the DataLoader or tf.data.Dataset itself, a "
                    f"list), or call prefetch_to_jax on a new iterator per epoch.")
            self._spent = True
        bar = _progress_bar(self.source) if self._progress else None
        self.report = report = self.report._next_epoch()
        guard = ReuseGuard(self.reuse, protect=True)
        it = guard.watch(it)
        if self.thread is False:
            return _inline(it, bar, self.options, report, guard)
        from ._jaxcaps import target
        # The caller's x64 mode (thread-local under jax.enable_x64), for the worker.
        x64 = bool(target().x64.value)
        if self.thread is None:
            return _auto(it, self.size, bar, self.options, x64, report, guard)
        return _prefetch(it, self.size, bar, self.options, x64, report, guard)

    def __repr__(self) -> str:
        return (f"<PrefetchLoader of {type(self.source).__name__}, size={self.size}, "
                f"thread={self.thread}, reuse={self.reuse!r}>")


def prefetch_to_jax(iterable: Iterable[Any], size: int = 2, *, device: Any = None,
                    sharding: Any = None, copy: bool | None = None, fallback: Fallback = "host",
                    readonly: ReadOnly = "copy", leaves: Leaves = "keep", narrow: Narrow = "warn",
                    thread: bool | None = None, progress: bool = False,
                    reuse: str = "error") -> PrefetchLoader:
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
    reuse : {"error", "copy"}
        What to do about a source that hands over memory a batch it gave earlier still
        views zero-copy (a buffer refilled in place): ``"error"`` (the default) raises
        ``MemoryReuseError``; ``"copy"`` gives one ``DLInspectWarning`` and from then
        on copies the leaves whose memory came back (``loader.report``: ``"reused
        memory"``). A NumPy array a live batch views is marked read-only meanwhile
        (``"error"``), so that a source's write into it fails before any batch changes.
        See docs/loaders/index.md, "Zero-copy and memory a source reuses".

    Returns
    -------
    PrefetchLoader
        Iterable, one epoch per ``iter()``, with ``len()`` where ``iterable`` has
        one; each batch has the structure of the input batch, tensors as
        ``jax.Array``, other leaves as they were.

    Raises
    ------
    ValueError
        ``size < 1`` or an invalid ``fallback`` / ``readonly`` / ``leaves`` / ``reuse``.
    ImportError
        ``progress=True`` without tqdm installed.
    SourceExhaustedError
        At ``iter()`` of a loader whose source is an iterator an earlier epoch
        went over (a ``RuntimeError``).
    MemoryReuseError
        While iterating, with ``reuse="error"``: the source wrote into, or handed over
        again, memory a live batch views (a ``BufferError``; names the batches, their
        key paths and the fix).
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
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1 (batches converted ahead), not {size!r}")
    opts = check_options(device, copy, sharding, fallback, readonly, leaves, narrow)
    if progress:
        _progress_bar(None)   # tqdm missing: say so now, not at the first epoch
    return PrefetchLoader(iterable, size, None if thread is None else bool(thread), opts,
                          progress, check_reuse(reuse))


def _progress_bar(iterable: Any) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError("prefetch_to_jax(progress=True) draws its progress bar with tqdm, "
                          "which is not installed; install it with: pip install tqdm") from exc
    if iterable is None:
        return None
    try:
        total = len(iterable)
    except TypeError:
        total = None
    return tqdm(total=total, unit="batch", desc="prefetch_to_jax")


def _auto(it: Iterator[Any], size: int, bar: Any, options: Options, x64: bool,
          report: LoaderReport, guard: ReuseGuard) -> Iterator[Any]:
    """The first batches on the consumer's thread, timed; then a worker thread only if
    both sides have work to overlap (see ``_OVERLAP_S``)."""
    load: list[float] = []
    consume: list[float] = []
    try:
        for _ in range(_PROBE):
            start = time.perf_counter()
            batch = next(it, _END)
            if batch is _END:
                _close(it, bar)
                return
            out = guard.convert(batch, options, report)
            del batch
            load.append(time.perf_counter() - start)
            if bar is not None:
                bar.update(1)
            handed = time.perf_counter()
            report._delivered()
            yield out
            consume.append(time.perf_counter() - handed)   # the consumer's work meanwhile
            del out
    except BaseException:
        _close(it, bar)
        raise
    threaded = (not _on_cpu(options)
                and min(statistics.median(load), statistics.median(consume)) > _OVERLAP_S)
    yield from (_prefetch(it, size, bar, options, x64, report, guard) if threaded
                else _inline(it, bar, options, report, guard))


_END = object()


def _on_cpu(options: Options) -> bool:
    """Whether the batches go to JAX CPU devices (the step then runs on the host's cores)."""
    import jax
    where = options.sharding or options.device
    if where is None:
        return jax.default_backend() == "cpu"
    return all(d.platform == "cpu" for s in jax.tree_util.tree_leaves(where)
               for d in (s.device_set if hasattr(s, "device_set") else [s]))


def _close(it: Iterator[Any] | None, bar: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
    if bar is not None:
        bar.close()


def _inline(it: Iterator[Any], bar: Any, options: Options,
            report: LoaderReport, guard: ReuseGuard) -> Iterator[Any]:
    try:
        for batch in it:
            out = guard.convert(batch, options, report)
            del batch
            if bar is not None:
                bar.update(1)
            report._delivered()
            yield out
            del out
    finally:
        _close(it, bar)


def _prefetch(it: Iterator[Any], size: int, bar: Any, options: Options, x64: bool,
              report: LoaderReport, guard: ReuseGuard) -> Iterator[Any]:
    ready: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=size)
    stop = threading.Event()
    # Held here: a generator still alive at interpreter exit is finalized after the
    # modules' globals are gone, when its `finally` below can do nothing (the atexit
    # hook has stopped and joined the worker already).
    finalizing = sys.is_finalizing

    def put(item: tuple[int, Any]) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=_POLL_S)
                return True
        return False

    def work() -> None:
        from ._jaxcaps import target
        context = target().x64_context
        try:
            with context(x64) if context is not None else contextlib.nullcontext():
                for batch in it:
                    # Warnings (x64 narrowing) are kept with the batch and emitted on
                    # the consumer's thread, at the consumer's line.
                    collecting.messages = []
                    converted = guard.convert(batch, options, report)
                    if stop.is_set() or not put((_BATCH, (converted, collecting.messages))):
                        return
                    del batch
        except BaseException as exc:  # handed to the consumer, raised at this batch
            put((_FAILED, exc))
            return
        finally:
            with _live_lock:
                _live.discard(entry)
        put((_DONE, None))

    worker = threading.Thread(target=work, name="dlinspect-prefetch", daemon=True)
    entry = (worker, stop)
    with _live_lock:
        _live.add(entry)
    worker.start()
    try:
        while True:
            kind, value = ready.get()
            if kind == _DONE:
                return
            if kind == _FAILED:
                raise value
            batch, messages = value
            for message in messages:
                warn(message)
            if bar is not None:
                bar.update(1)
            del value
            report._delivered()
            yield batch
            del batch
    finally:
        if not finalizing():
            _stop(ready, stop, worker, it, bar)


def _stop(ready: queue.Queue[tuple[int, Any]], stop: threading.Event,
          worker: threading.Thread, it: Iterator[Any], bar: Any) -> None:
    """End a prefetch: stop and join its worker, free the batches it held, close the
    source (unless it is stuck inside next()) and the progress bar."""
    stop.set()
    _drain(ready)            # frees batches waiting ahead; unblocks a waiting put
    if threading.current_thread() is not worker:  # (a GC pass may finalize us there)
        worker.join(_JOIN_S)
    _drain(ready)
    stuck = worker.is_alive()
    if stuck:
        warnings.warn(
            f"prefetch_to_jax stopped, but its source has been inside next() for over "
            f"{_JOIN_S:g} s; its worker thread is left to finish that call (a daemon "
            f"thread) and the source is not closed.", DLInspectWarning, stacklevel=3)
    _close(None if stuck else it, bar)


def _drain(q: queue.Queue[Any], empty: type[Exception] = queue.Empty) -> None:
    # Asked q.empty() first: at interpreter exit, when a live generator is finalized, the
    # queue module's globals may be gone, and get_nowait's own `raise Empty` then fails
    # (a TypeError printed as ignored); `empty` is bound here for the same reason.
    while not q.empty():
        try:
            q.get_nowait()
        except empty:
            return
