"""``prefetch_to_jax``: a loader whose batches arrive as JAX arrays, converted ahead."""

from __future__ import annotations

import atexit
import queue
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from ._execute import to_jax
from ._plan import check_options
from ._warn import collecting, warn
from .errors import DLInspectWarning

__all__ = ["prefetch_to_jax", "PrefetchLoader"]

_BATCH, _FAILED, _DONE = 0, 1, 2
_POLL_S = 0.05  # how often a blocked worker looks at the stop flag
_JOIN_S = 5.0   # how long stopping waits for a worker stuck in the source's next()

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
    one. Not thread-safe: one consumer per epoch.

    Attributes
    ----------
    source : iterable
        The batches' source, e.g. a ``torch.utils.data.DataLoader``.
    size : int
        Batches converted ahead of the consumer.
    thread : bool
        Whether batches are converted on a background thread (see
        :func:`prefetch_to_jax`, ``thread``).
    options : dict
        The :func:`to_jax` options for every batch.
    """

    def __init__(self, source: Iterable[Any], size: int, thread: bool, options: dict[str, Any],
                 progress: bool) -> None:
        self.source = source
        self.size = size
        self.thread = thread
        self.options = options
        self._progress = progress

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the source of this PrefetchLoader ({type(self.source).__name__}) "
                            f"has no len()") from None

    def __iter__(self) -> Iterator[Any]:
        bar = _progress_bar(self.source) if self._progress else None
        it = iter(self.source)
        if not self.thread:
            return _inline(it, bar, self.options)
        from jax._src.config import enable_x64
        # The caller's x64 mode (thread-local under jax.enable_x64), for the worker.
        return _prefetch(it, self.size, bar, self.options, bool(enable_x64.value))

    def __repr__(self) -> str:
        return (f"<PrefetchLoader of {type(self.source).__name__}, size={self.size}, "
                f"thread={self.thread}>")


def prefetch_to_jax(iterable: Iterable[Any], size: int = 2, *, device: Any = None,
                    sharding: Any = None, copy: bool | None = None, fallback: str = "host",
                    readonly: str = "copy", leaves: str = "keep", thread: bool = True,
                    progress: bool = False) -> PrefetchLoader:
    """A loader yielding each batch of ``iterable`` as JAX arrays, converted ahead.

    Parameters
    ----------
    iterable : iterable of pytrees of tensors
        Batches: a ``torch.utils.data.DataLoader``, a list, anything whose items
        :func:`to_jax` takes. Each ``iter()`` of the returned loader calls
        ``iter(iterable)`` again, so a DataLoader gives one epoch per pass; a
        generator, which cannot start again, gives its items once.
    size : int
        How many converted batches may wait ahead of the consumer (>= 1). Each
        holds its memory (for zero-copy batches, the producer's) until yielded
        and dropped.
    device, sharding, copy, fallback, readonly, leaves
        Passed to :func:`to_jax` for every batch; ``sharding`` (e.g.
        ``NamedSharding(mesh, PartitionSpec("data"))``) spreads each batch over
        several devices along its leading axis, and under ``jax.distributed`` a
        sharding spanning the processes takes each process's batch as its part.
    thread : bool
        True (the default): a worker thread takes items from ``iterable`` and
        converts them, up to ``size`` ahead, while the consumer works. False:
        each batch is converted on the consumer's thread when it is asked for
        (a plain ``to_jax`` loop, nothing ahead): faster when the source is
        quick and nothing else waits, as on a CPU-only JAX (see the README's
        loader figures).
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
    blocked inside ``next()`` of a slow source is waited for up to 5 s; past
    that it is left to finish (a daemon thread), with a ``DLInspectWarning``.
    Live workers are stopped and joined at interpreter exit. The worker converts
    under the caller's x64 mode at the time of ``iter()`` (``jax.enable_x64`` is
    thread-local).

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
    check_options("jax", fallback, readonly, copy, leaves)
    if progress:
        _progress_bar(None)   # tqdm missing: say so now, not at the first epoch
    return PrefetchLoader(iterable, size, bool(thread),
                          dict(device=device, sharding=sharding, copy=copy, fallback=fallback,
                               readonly=readonly, leaves=leaves), progress)


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


def _inline(it: Iterator[Any], bar: Any, options: dict[str, Any]) -> Iterator[Any]:
    try:
        for batch in it:
            out = to_jax(batch, **options)
            del batch
            if bar is not None:
                bar.update(1)
            yield out
            del out
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        if bar is not None:
            bar.close()


def _prefetch(it: Iterator[Any], size: int, bar: Any, options: dict[str, Any],
              x64: bool) -> Iterator[Any]:
    ready: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        from jax._src.config import enable_x64
        try:
            with enable_x64(x64):
                for batch in it:
                    # Warnings (x64 narrowing) are kept with the batch and emitted on
                    # the consumer's thread, at the consumer's line.
                    collecting.messages = []
                    converted = to_jax(batch, **options)
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
            yield batch
            del batch
    finally:
        stop.set()
        _drain(ready)            # frees batches waiting ahead; unblocks a waiting put
        if threading.current_thread() is not worker:  # (a GC pass may finalize us there)
            worker.join(_JOIN_S)
        _drain(ready)
        if worker.is_alive():
            warnings.warn(
                f"prefetch_to_jax stopped, but its source has been inside next() for over "
                f"{_JOIN_S:g} s; its worker thread is left to finish that call (a daemon "
                f"thread) and the source is not closed.", DLInspectWarning, stacklevel=2)
        else:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if bar is not None:
            bar.close()


def _drain(q: queue.Queue[Any], empty: type[Exception] = queue.Empty) -> None:
    # `empty` bound at definition: at interpreter exit the queue module's globals
    # may already be gone when a live generator is finalized.
    while True:
        try:
            q.get_nowait()
        except empty:
            return
