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
    """A DLInspectWarning attributed to the first caller outside dlinspect and jax
    (through jax.tree_util, a pytree's leaves are converted inside jax's frames).

    On a thread collecting warnings the message is kept instead.
    """
    collected = getattr(collecting, "messages", None)
    if collected is not None:
        collected.append(message)
        return
    level, frame = 2, sys._getframe(1)
    frame_or_none: Any = frame
    while frame_or_none is not None and _internal(frame_or_none.f_code.co_filename):
        level, frame_or_none = level + 1, frame_or_none.f_back
    warnings.warn(message, DLInspectWarning, stacklevel=level)


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
