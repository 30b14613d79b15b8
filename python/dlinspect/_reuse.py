"""A loader's zero-copy batches and the memory they view while they live: a source that
hands that memory over again is caught (the loaders' ``reuse=``; docs/loaders/index.md,
"Zero-copy and memory a source reuses")."""

from __future__ import annotations

import bisect
import sys
import weakref
from collections.abc import Iterator
from typing import Any

from ._core import LoaderReport, convert, warn
from ._options import Options
from .errors import MemoryReuseError

__all__ = ["ReuseGuard", "check_reuse"]

_FIX = ("To fix: make the source put every batch in new memory (a new array per batch: "
        "np.stack, torch's default collate, dlinspect.stack), or pass copy=True to copy "
        "every batch")


def check_reuse(reuse: Any) -> str:
    """``reuse`` checked: ``"error"`` or ``"copy"``."""
    if reuse not in ("error", "copy"):
        raise ValueError(f"reuse must be 'error' (raise MemoryReuseError) or 'copy' (warn, "
                         f"then copy what comes back), not {reuse!r}")
    return str(reuse)


class _Span:
    """Memory a live zero-copy leaf views: ``[start, end)`` bytes of one address space."""

    __slots__ = ("batch", "end", "key", "protected", "ref", "source", "start", "version")

    def __init__(self, start: int, end: int, batch: int, key: str, ref: Any,
                 source: Any, protected: bool) -> None:
        self.start, self.end, self.batch, self.key, self.ref = start, end, batch, key, ref
        self.source, self.protected = source, protected
        self.version = getattr(source, "_version", None)   # torch's in-place write counter

    def unchanged(self, source: Any) -> bool:
        """The same tensor handed over again, not written since: torch's counter says so,
        or it is a NumPy array marked read-only that nothing else can write (_sealed)."""
        if source is not self.source:
            return False
        if self.version is not None:
            return getattr(source, "_version", None) == self.version
        return _sealed(source)

    def name(self, what: str) -> str:
        return f"{what} {self.batch}'s leaf {self.key or '(the batch)'}"


class ReuseGuard:
    """The memory one loader's live zero-copy leaves view, per address space, sorted by
    start; a span goes when its ``jax.Array`` dies. ``protect``: a NumPy source array is
    marked read-only while JAX views it (writable again when the view dies), so that a
    source's refill through it fails in the source instead of changing a batch."""

    __slots__ = ("__weakref__", "_copying", "_dead", "_longest", "_self", "_spans", "_starts", "_warned",
                 "batches", "mode", "protect", "what")

    def __init__(self, mode: str, protect: bool, what: str = "batch") -> None:
        self.mode = mode
        self.protect = protect and mode == "error"
        self.what = what           # (grain's stage: "element")
        self.batches = 0
        self._spans: dict[Any, list[_Span]] = {}
        self._starts: dict[Any, list[int]] = {}   # per space, the spans' starts (sorted)
        self._longest: dict[Any, int] = {}        # per space, the longest span's bytes
        self._dead = False
        self._copying: set[str] = set()   # (reuse="copy") key paths copied from now on
        self._warned = False
        self._self = weakref.ref(self)

    def convert(self, batch: Any, options: Options, report: LoaderReport) -> Any:
        """``convert`` of one batch, then its zero-copy leaves checked against the memory
        the live ones view: MemoryReuseError, or with ``reuse="copy"`` copies."""
        out = convert(batch, options, None, report)
        self.batches += 1
        views = report._taken_views()
        if not views:
            return out
        if self._dead:
            self._purge()
        fresh, again = [], {}
        for key, src, arr, space, start, end, zero in views:
            hit = self._overlap(space, start, end, src)
            if hit is not None or (zero and key in self._copying):
                again[key] = (arr if zero else None, hit)
            elif zero:
                fresh.append((key, src, arr, space, start, end))
        if again:
            out = self._reused(out, again, report)
        for view in fresh:
            self._add(*view)
        return out

    def watch(self, it: Iterator[Any]) -> Iterator[Any]:
        """The source's items; its write into a protected array (NumPy's read-only
        ValueError, the write not made) raised as MemoryReuseError."""
        try:
            yield from it
        except ValueError as exc:
            if "read-only" not in str(exc) or not any(
                    span.protected and span.ref() is not None
                    for spans in self._spans.values() for span in spans):
                raise
            live = sorted({span.name(self.what) for spans in self._spans.values() for span in spans
                           if span.ref() is not None}, key=lambda n: (len(n), n))
            raise MemoryReuseError(
                f"the source wrote into memory that JAX still views zero-copy "
                f"({', '.join(live[:3]) or 'a batch handed over'}): dlinspect marks a NumPy "
                f"source array read-only while a batch views it, so the write was refused "
                f"and every {self.what} handed over holds its own values. {_FIX}, or "
                f"reuse=\"copy\" to copy only the leaves whose memory comes back.") from exc

    def _overlap(self, space: Any, start: int, end: int, src: Any) -> _Span | None:
        """The live span ``[start, end)`` overlaps, other than ``src`` itself unchanged
        (the same tensor handed over again, not written: viewed again)."""
        live = self._spans.get(space)
        if not live:
            return None
        starts = self._starts[space]
        reach = start - self._longest[space]   # a span starting before this ends by start
        j = bisect.bisect_left(starts, end) - 1
        while j >= 0 and starts[j] > reach:
            span = live[j]
            if start < span.end and span.ref() is not None and not span.unchanged(src):
                return span
            j -= 1
        return None

    def _add(self, key: str, src: Any, arr: Any, space: Any, start: int, end: int) -> None:
        protect = (self.protect and type(src).__module__ == "numpy" and src.flags.writeable)
        ref = weakref.ref(arr, _gone)
        _WATCHED[id(ref)] = (ref, self._self, src if protect else None)
        if space not in self._spans:
            self._spans[space], self._starts[space], self._longest[space] = [], [], 0
        starts = self._starts[space]
        k = bisect.bisect_right(starts, start)
        starts.insert(k, start)
        self._spans[space].insert(k, _Span(start, end, self.batches, key, ref, src, protect))
        self._longest[space] = max(self._longest[space], end - start)
        if protect:
            src.flags.writeable = False

    def _purge(self) -> None:
        self._dead = False
        for space, live in self._spans.items():
            live = self._spans[space] = [span for span in live if span.ref() is not None]
            self._starts[space] = [span.start for span in live]

    def _reused(self, out: Any, again: dict[str, tuple[Any, Any]], report: LoaderReport) -> Any:
        """Leaves whose memory a live leaf views (or that came back once before, with
        ``reuse="copy"``): MemoryReuseError, or copied, now and from now on."""
        hits = [(key, hit) for key, (_, hit) in again.items() if hit is not None]
        if hits:
            key, hit = hits[0]
            this = f"{self.what} {self.batches}'s leaf {key or '(the batch)'}"
            first = (f"{this} is memory that {hit.name(self.what)} "
                     f"still views as a JAX array, zero-copy: the source hands the same "
                     f"memory over again, so {self.what} {hit.batch} (and any {self.what} "
                     f"viewing that memory) may hold {self.what} {self.batches}'s values, even "
                     f"while JAX computed on it.")
            if self.mode == "error":
                raise MemoryReuseError(f"{first} {_FIX}, or reuse=\"copy\" to copy only the "
                                       f"leaves whose memory comes back.")
            if not self._warned:
                self._warned = True
                warn(f"{first} From now on those leaves are copied (the report: \"reused "
                     f"memory\"); the {self.what}{'es' if self.what == 'batch' else 's'} handed "
                     f"over before may still change, as "
                     f"the source goes on reusing the memory they view. {_FIX}.")
        self._copying.update(again)
        report._reused(again)
        copied = {id(arr) for arr, _ in again.values() if arr is not None}
        if not copied:
            return out
        from ._tree import flatten
        flat = flatten(out)
        return flat.unflatten([leaf.copy() if id(leaf) in copied else leaf
                               for leaf in flat.leaves])


def _sealed(arr: Any) -> bool:
    """A read-only NumPy array no write can reach: each writable object its memory comes
    from (its bases) is held by nothing but that chain (NumPy makes views of a read-only
    array read-only)."""
    if type(arr).__module__ != "numpy" or arr.flags.writeable:
        return False
    base = arr.base
    while base is not None:
        if not (getattr(base, "flags", None) is not None and not base.flags.writeable) \
                and sys.getrefcount(base) > 3:   # (this frame, the argument, its child)
            return False
        base = getattr(base, "base", None)
    return True


# Every live zero-copy leaf a guard watches: id(weakref) -> (the weakref, a weakref to
# its guard, the NumPy array marked read-only for it or None). Module-level, so that an
# array outliving its loader's epoch still has its source made writable when it dies.
_WATCHED: dict[int, tuple[Any, Any, Any]] = {}


def _gone(ref: Any) -> None:
    """A watched leaf died: its guard told, its NumPy source writable again."""
    _, guard, src = _WATCHED.pop(id(ref), (None, None, None))
    owner = guard() if guard is not None else None
    if owner is not None:
        owner._dead = True
    if src is not None:
        try:
            src.flags.writeable = True
        except ValueError:   # (its base was made read-only since: it stays so)
            pass
