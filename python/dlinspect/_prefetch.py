"""``prefetch_to_jax``: convert batches into JAX on a background thread, a few ahead."""

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

__all__ = ["prefetch_to_jax"]

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


def prefetch_to_jax(iterable: Iterable[Any], size: int = 2, *, device: Any = None,
                    sharding: Any = None, copy: bool | None = None, fallback: str = "host",
                    readonly: str = "copy", progress: bool = False) -> Iterator[Any]:
    """Yield each batch of ``iterable`` as JAX arrays, converted ahead on a background thread.

    Parameters
    ----------
    iterable : iterable of pytrees of tensors
        Batches: a ``torch.utils.data.DataLoader``, a generator of dicts of NumPy
        arrays, anything whose items :func:`to_jax` takes.
    size : int
        How many converted batches may wait ahead of the consumer (>= 1). Each
        holds its memory (for zero-copy batches, the producer's) until yielded
        and dropped.
    device, sharding, copy, fallback, readonly
        Passed to :func:`to_jax` for every batch; ``sharding`` (e.g.
        ``NamedSharding(mesh, PartitionSpec("data"))``) spreads each batch over
        several devices along its leading axis.
    progress : bool
        Show a tqdm progress bar (``pip install tqdm``), with a total when
        ``len(iterable)`` exists.

    Yields
    ------
    pytree of jax.Array
        The batches, in order, with the structure of the input batches.

    Raises
    ------
    Exception
        Whatever ``iterable`` or the conversion raised, re-raised (same object,
        same traceback) when the consumer reaches the batch where it happened;
        the batches before it are yielded first.
    ValueError
        ``size < 1`` or an invalid ``fallback`` / ``readonly``.
    ImportError
        ``progress=True`` without tqdm installed.

    Warns
    -----
    DLInspectWarning
        Stopping early while the source is stuck in ``next()`` for over 5 s.

    Notes
    -----
    The worker thread takes items from ``iterable`` and calls :func:`to_jax`
    on them; the consumer's thread only waits. When the consumer stops early
    (``break``, an exception, or closing the generator), the worker is told to
    stop, converted batches still waiting are dropped (their producers'
    deleters run), the worker thread is joined, and ``iterable``'s iterator is
    closed if it has ``close()``. A worker blocked inside ``next()`` of a
    slow ``iterable`` is waited for up to 5 s; past that it is left to finish
    (a daemon thread), with a ``DLInspectWarning``. Live workers are stopped
    and joined at interpreter exit. The worker converts under the caller's
    x64 mode at the time of the call (``jax.enable_x64`` is thread-local).
    One consumer at a time: the returned generator is not thread-safe.

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> batches = ({"x": np.full((2, 3), i, np.float32)} for i in range(3))
    >>> [float(b["x"].sum()) for b in dlinspect.prefetch_to_jax(batches)]
    [0.0, 6.0, 12.0]
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an int >= 1 (batches converted ahead), not {size!r}")
    check_options("jax", fallback, readonly, copy)
    bar = _progress_bar(iterable) if progress else None
    from jax._src.config import enable_x64
    return _prefetch(iter(iterable), size, bar,
                     dict(device=device, sharding=sharding, copy=copy, fallback=fallback,
                          readonly=readonly),
                     # The caller's x64 mode (thread-local under jax.enable_x64), for the worker.
                     bool(enable_x64.value))


def _progress_bar(iterable: Iterable[Any]) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError("prefetch_to_jax(progress=True) draws its progress bar with tqdm, "
                          "which is not installed; install it with: pip install tqdm") from exc
    try:
        total = len(iterable)  # type: ignore[arg-type]
    except TypeError:
        total = None
    return tqdm(total=total, unit="batch", desc="prefetch_to_jax")


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


def _drain(q: queue.Queue[Any]) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return
