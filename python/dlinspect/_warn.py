"""DLInspectWarning, attributed to the user's line, or kept for another thread to emit."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

from .errors import DLInspectWarning

__all__ = ["warn", "collecting"]

#: ``collecting.messages``: a list on a thread that keeps its warnings for another
#: thread to emit (``prefetch_to_jax``'s worker); absent elsewhere.
collecting = threading.local()

_HERE = os.path.dirname(__file__) + os.sep
_jax_here: str | None = None


def warn(message: str) -> None:
    """A DLInspectWarning attributed to the first caller outside dlinspect and jax.

    Shown as Python's filters say (by default once per call site and message, that is,
    per dtype narrowed): a message already shown at a call site whose filter hides
    repeats is not handed to ``warnings.warn`` again while the filters stay as they
    were (a loader's step warns once, not every batch). On a thread collecting
    warnings the message is kept instead.
    """
    collected = getattr(collecting, "messages", None)
    if collected is not None:
        collected.append(message)
        return
    level, frame = 2, sys._getframe(1)
    frame_or_none: Any = frame
    while frame_or_none is not None and _internal(frame_or_none.f_code.co_filename):
        level, frame_or_none = level + 1, frame_or_none.f_back
    if frame_or_none is None:
        warnings.warn(message, DLInspectWarning, stacklevel=level)
        return
    key = (frame_or_none.f_code, frame_or_none.f_lineno, message)
    filters = warnings.filters
    seen = _shown.get(key)
    if seen is not None and seen[0] is filters and seen[1] == len(filters):
        return
    warnings.warn(message, DLInspectWarning, stacklevel=level)
    if _repeats_hidden(frame_or_none, message):
        if len(_shown) >= 1024:
            _shown.clear()
        _shown[key] = (filters, len(filters))


# (code, line, message) -> the filters list (kept: its identity is the test) and its
# length when the warning was shown there.
_shown: dict[tuple[Any, int, str], tuple[Any, int]] = {}


def _repeats_hidden(frame: Any, message: str) -> bool:
    """Whether Python's filters show this warning at most once at ``frame``'s line
    (the first matching filter's action is not "always"; "error" raised already)."""
    module = frame.f_globals.get("__name__", "<string>")
    for action, msg, category, mod, lineno in warnings.filters:
        if ((msg is None or msg.match(message)) and issubclass(DLInspectWarning, category)
                and (mod is None or mod.match(module))
                and (lineno == 0 or lineno == frame.f_lineno)):
            return action != "always"
    return True


def _internal(filename: str) -> bool:
    global _jax_here
    if filename.startswith(_HERE):
        return True
    if _jax_here is None:
        jax_file = getattr(sys.modules.get("jax"), "__file__", None)
        if jax_file is None:
            return False
        _jax_here = os.path.dirname(jax_file) + os.sep
    return filename.startswith(_jax_here)
