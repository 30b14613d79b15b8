# warn.pxi: DLInspectWarning at the user's line, or kept for another thread to emit.

import os as _os
import threading as _threading
import warnings as _warnings

#: ``collecting.messages``: a list on a thread that keeps its warnings for another
#: thread to emit (``prefetch_to_jax``'s worker); absent elsewhere.
collecting = _threading.local()

# dlinspect's own Python files (an editable install keeps the extension elsewhere).
_HERE = _os.path.dirname(_sys.modules["dlinspect"].__file__) + _os.sep


def warn(message, bint at_consumer=False):
    """A DLInspectWarning at the first caller outside dlinspect and jax (``at_consumer``: and
    grain, the line that iterates a loader), or kept on a collecting thread; once shown where
    the filters hide repeats, not warned there again while they stay as they were (a loader's
    step warns once)."""
    if (collected := getattr(collecting, "messages", None)) is not None:
        collected.append(message)
        return
    # The innermost Python frame (compiled functions have none) is stacklevel 1; ours, jax's pass.
    files = [getattr(_sys.modules.get(name), "__file__", None) for name in ("jax", "grain")[:1 + at_consumer]]
    ours = (_HERE,) + tuple(_os.path.dirname(file) + _os.sep for file in files if file)
    level = 1
    frame_or_none = <object><PyObject*>PyEval_GetFrame() if PyEval_GetFrame() is not NULL else None
    while frame_or_none is not None and frame_or_none.f_code.co_filename.startswith(ours):
        level += 1
        frame_or_none = frame_or_none.f_back
    # (no frame outside: warned, never remembered, a key of None)
    key = None if frame_or_none is None else (frame_or_none.f_code, frame_or_none.f_lineno, message)
    filters = _warnings.filters
    seen = _shown.get(key)
    if seen and seen[0] is filters and seen[1] == len(filters):
        return
    _warnings.warn(message, DLInspectWarning, stacklevel=level)
    if key is not None and _repeats_hidden(frame_or_none, message):
        _remember(_shown, key, (filters, len(filters)), 1024)


# (code, line, message) -> (the filters list, whose identity is the test, and its length)
_shown = {}


def _repeats_hidden(frame, message):
    """Whether Python's filters show this warning at most once at ``frame``'s line
    (the first matching filter's action is not "always"; "error" raised already)."""
    module = frame.f_globals.get("__name__", "<string>")
    for action, msg, category, mod, lineno in _warnings.filters:
        if ((msg is None or msg.match(message)) and issubclass(DLInspectWarning, category)
                and (mod is None or mod.match(module))
                and (lineno == 0 or lineno == frame.f_lineno)):
            return action != "always"
    return True

