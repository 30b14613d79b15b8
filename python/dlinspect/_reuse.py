"""A loader's zero-copy batches and the memory they view while they live: a source that
hands that memory over again is caught (the loaders' ``reuse=``; docs/loaders/index.md,
"Zero-copy and memory a source reuses")."""

from __future__ import annotations

import bisect
import dataclasses
import operator
import sys
import weakref
from collections.abc import Generator, Iterator
from typing import Any

from ._core import LoaderReport, collecting, convert, warn
from ._options import Options, options as check_options
from .errors import MemoryReuseError

__all__ = ["ReuseGuard", "Kept", "loader_options"]

_FIX = ("To fix: make the source put every batch in new memory (a new array per batch: np.stack, "
        "torch's default collate, dlinspect.stack), or pass copy=True to copy every batch")
_OR_COPY = ', or reuse="copy" to copy only the leaves whose memory comes back.'
_START = operator.attrgetter("start")


def loader_options(sizes: dict[str, Any], least: int, reuse: Any, *to_jax: Any) -> Options:
    """Checked (ValueError): each of ``sizes`` an int >= ``least``, ``reuse``, and to_jax's."""
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < least:
            raise ValueError(f"{name} must be an int >= {least} (held ahead), not {size!r}")
    if reuse not in ("error", "copy"):
        raise ValueError(f"reuse must be 'error' (raise MemoryReuseError) or 'copy' (warn, "
                         f"then copy what comes back), not {reuse!r}")
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


class _Span:
    """``[start, end)`` bytes of one address space a live zero-copy leaf views."""

    __slots__ = ("batch", "end", "key", "protected", "ref", "source", "start", "version")

    def __init__(self, start: int, end: int, batch: int, key: str, ref: Any,
                 source: Any, protected: bool) -> None:
        self.start, self.end, self.batch, self.key, self.ref = start, end, batch, key, ref
        self.source, self.protected = source, protected
        self.version = getattr(source, "_version", None)   # torch's in-place write counter

    def unchanged(self, source: Any) -> bool:
        """The same tensor handed over again, not written since (torch's counter, or _sealed)."""
        if source is not self.source:
            return False
        if self.version is not None:
            return getattr(source, "_version", None) == self.version
        return _sealed(source)


def _leaf(what: str, batch: int, key: str) -> str:
    return f"{what} {batch}'s leaf {key or '(the batch)'}"


class ReuseGuard:
    """The memory one loader's live zero-copy leaves view, per address space, by start. ``protect``:
    a NumPy source array is read-only while viewed, so a refill fails instead of changing a batch."""

    __slots__ = ("__weakref__", "_copying", "_dead", "_longest", "_spans", "_warned",
                 "batches", "mode", "options", "protect", "report", "what")

    def __init__(self, mode: str, options: Options, report: LoaderReport, protect: bool,
                 what: str = "batch") -> None:
        self.mode, self.options, self.report = mode, options, report
        self.protect = protect and mode == "error"
        self.what = what           # (grain's stage: "element")
        self.batches, self._dead, self._warned = 0, False, False
        self._spans: dict[Any, list[_Span]] = {}   # per space, by start
        self._longest: dict[Any, int] = {}        # per space, the longest span's bytes
        self._copying: set[str] = set()   # (reuse="copy") key paths copied from now on

    def convert(self, batch: Any) -> Kept:
        """One batch converted, its warnings kept, its zero-copy leaves checked against the
        live ones: MemoryReuseError, or with ``reuse="copy"`` copies."""
        before = getattr(collecting, "messages", None)
        messages: list[str] = []
        collecting.messages = messages
        try:
            out = self._check(convert(batch, self.options, None, self.report))
        finally:
            collecting.messages = before
        return Kept(out, messages)

    def _check(self, out: Any) -> Any:
        self.batches += 1
        views = self.report._taken_views()
        if views and self._dead:
            self._purge()
        fresh, again = [], {}
        for key, src, arr, space, start, end, zero in views:
            if (hit := self._overlap(space, start, end, src)) is not None:
                self._say(key, hit)   # MemoryReuseError, or (reuse="copy") the one warning
            if hit is not None or (zero and key in self._copying):
                again[key] = arr if zero else None
            elif zero:
                fresh.append((key, src, arr, space, start, end))
        if again:
            out = self._reused(out, again)
        for view in fresh:
            self._add(*view)
        return out

    def watch(self, it: Iterator[Any]) -> Generator[Any, None, None]:
        """The source's items; its write into a protected array raised as MemoryReuseError."""
        try:
            yield from it
        except ValueError as exc:
            live = [span for spans in self._spans.values() for span in spans
                    if span.ref() is not None]
            if "read-only" not in str(exc) or not any(span.protected for span in live):
                raise
            names = sorted({_leaf(self.what, span.batch, span.key) for span in live},
                           key=lambda n: (len(n), n))
            raise MemoryReuseError(
                f"the source wrote into memory that JAX still views zero-copy "
                f"({', '.join(names[:3])}): dlinspect marks a NumPy source array read-only "
                f"while a batch views it, so the write was refused and every {self.what} "
                f"handed over holds its own values. {_FIX}{_OR_COPY}") from exc

    def _overlap(self, space: Any, start: int, end: int, src: Any) -> _Span | None:
        """The live span ``[start, end)`` overlaps, other than ``src`` itself unchanged."""
        if not (live := self._spans.get(space)):
            return None
        reach = start - self._longest[space]   # a span starting before this ends by start
        j = bisect.bisect_left(live, end, key=_START) - 1
        while j >= 0 and live[j].start > reach:
            span = live[j]
            if start < span.end and span.ref() is not None and not span.unchanged(src):
                return span
            j -= 1
        return None

    def _add(self, key: str, src: Any, arr: Any, space: Any, start: int, end: int) -> None:
        protect = (self.protect and type(src).__module__ == "numpy" and src.flags.writeable)
        ref = weakref.ref(arr, _gone)
        _WATCHED[id(ref)] = (ref, weakref.ref(self), src if protect else None)
        bisect.insort(self._spans.setdefault(space, []),
                      _Span(start, end, self.batches, key, ref, src, protect), key=_START)
        self._longest[space] = max(self._longest.get(space, 0), end - start)
        if protect:
            src.flags.writeable = False

    def _purge(self) -> None:
        self._dead = False
        for space, live in self._spans.items():
            self._spans[space] = [span for span in live if span.ref() is not None]

    def _reused(self, out: Any, again: dict[str, Any]) -> Any:
        """``again`` (key path -> the zero-copy array, or None): copied now and from now on."""
        self._copying.update(again)
        self.report._reused(again)
        if not (copied := {id(arr) for arr in again.values() if arr is not None}):
            return out
        from ._tree import flatten
        flat = flatten(out)
        return flat.unflatten([leaf.copy() if id(leaf) in copied else leaf for leaf in flat.leaves])

    def _say(self, key: str, hit: _Span) -> None:
        """MemoryReuseError, or (``reuse="copy"``) the loader's one warning."""
        what, n = self.what, self.batches
        first = (f"{_leaf(what, n, key)} is memory that {_leaf(what, hit.batch, hit.key)} "
                 f"still views as a JAX array, zero-copy: the source hands the same memory "
                 f"over again, so {what} {hit.batch} (and any {what} viewing that memory) may "
                 f"hold {what} {n}'s values, even while JAX computed on it.")
        if self.mode == "error":
            raise MemoryReuseError(f"{first} {_FIX}{_OR_COPY}")
        if not self._warned:
            self._warned = True
            warn(f"{first} From now on those leaves are copied (the report: \"reused "
                 f"memory\"); the {what}{'es' if what == 'batch' else 's'} handed over before "
                 f"may still change, as the source goes on reusing the memory they view. {_FIX}.")


def _sealed(arr: Any) -> bool:
    """Read-only, and no writable base held but by the chain (views of it are read-only)."""
    if type(arr).__module__ != "numpy" or arr.flags.writeable:
        return False
    base = arr.base
    while base is not None:
        writeable = getattr(getattr(base, "flags", None), "writeable", True)
        if writeable and sys.getrefcount(base) > 3:   # (this frame, the argument, its child)
            return False
        base = getattr(base, "base", None)
    return True


# Every live zero-copy leaf a guard watches: id(weakref) -> (the weakref, a weakref to
# its guard, the NumPy array marked read-only for it or None). Module-level, so that an
# array outliving its loader's epoch still has its source made writable when it dies.
_WATCHED: dict[int, tuple[Any, Any, Any]] = {}


def _gone(ref: Any) -> None:
    _, guard, src = _WATCHED.pop(id(ref), (None, None, None))
    if guard is not None and (owner := guard()) is not None:
        owner._dead = True
    if src is not None:
        try:   # (a plain try: at interpreter exit this module's globals may be gone)
            src.flags.writeable = True
        except ValueError:   # (its base was made read-only since: it stays so)
            pass
