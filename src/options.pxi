# options.pxi: the caller's options, checked once into one object every decision reads.

from typing import get_args as _get_args
from dlinspect import _options as _options_module

# The options, in to_jax's order; the values of each string one: dlinspect._options's type.
cdef tuple _FIELDS = ("device", "copy", "sharding", "fallback", "readonly", "leaves", "narrow")
cdef dict _CHOICES = {name: _get_args(getattr(_options_module, kind)) for name, kind in zip(
    _FIELDS[3:], ("Fallback", "ReadOnly", "Leaves", "Narrow"))}


@cython.final
cdef class Options:
    """The options of :func:`to_jax` (:func:`plan`, a loader), checked by :func:`check_options`.

    ``device`` is the one destination device (a single-device sharding resolved), never
    with ``sharding``; ``committed``: the caller named a device or a sharding, so the array
    is committed there (a default device chosen for the caller leaves it uncommitted). The
    string options hold the checked values themselves (``"share"``...), compared by value.
    """
    cdef readonly object device, copy, sharding
    cdef readonly str fallback, readonly, leaves, narrow
    cdef readonly bint committed

    def __init__(self, device=None, copy=None, sharding=None, str fallback="host",
                 str readonly="copy", str leaves="keep", str narrow="warn", committed=None):
        self.device = device
        self.copy = copy
        self.sharding = sharding
        self.fallback = fallback
        self.readonly = readonly
        self.leaves = leaves
        self.narrow = narrow
        if committed is None:
            committed = device is not None or sharding is not None
        self.committed = committed

    def replaced(self, **changes):
        """A copy with ``changes`` (committed follows device and sharding unless given)."""
        return Options(**{name: getattr(self, name) for name in _FIELDS} | changes)

    def placed(self, device=None, sharding=None):
        """Onto ``device`` or ``sharding``, committed there (None and None: nowhere named)."""
        return self.replaced(device=device, sharding=sharding)

    def unplaced(self, device):
        """Onto ``device`` with no device named: JAX's default device, the array uncommitted."""
        return self.replaced(device=device, committed=False)

    def quiet(self, device):
        """What a producer's host copy (one tensor: ``leaves`` is not asked) is routed with:
        onto ``device``, with no host fallback of its own and no second narrowing warning."""
        return self.replaced(device=device, sharding=None, copy=None, fallback="raise",
                             narrow="ok")

    def given(self):
        """``name=value`` of each option not at its default, in the order of to_jax's."""
        return [f"{name}={getattr(self, name)!r}" for name in _FIELDS
                if getattr(self, name) != getattr(DEFAULT, name)]

    def __repr__(self):
        return f"Options({', '.join(self.given())})"

    def __reduce__(self):
        return Options, tuple(getattr(self, name) for name in _FIELDS + ("committed",))


#: Every option at its default (to_jax's fast path compares by identity).
DEFAULT = Options()

cdef dict _made = {}   # options checked before, by what was passed


def check_options(device=None, copy=None, sharding=None, fallback="host", readonly="copy",
            leaves="keep", narrow="warn"):
    """The checked :class:`Options`, the same object for the same arguments (a loop passing
    ``sharding=`` checks it once). ValueError for a value outside its choices, TypeError
    for a ``device`` that is no ``jax.Device`` or one-device sharding."""
    # (type(copy) in the key: copy=1 equals copy=True, and is refused)
    key = (device, copy, type(copy), sharding, fallback, readonly, leaves, narrow)
    try:
        made = _made.get(key)
    except TypeError:   # a pytree of shardings: checked each time
        made = key = None
    if made is not None:
        return made
    if copy is not None and type(copy) is not bool:
        raise ValueError(f"copy must be None, True or False, not {copy!r}")
    for name, value in zip(_CHOICES, (fallback, readonly, leaves, narrow)):
        if value not in _CHOICES[name]:
            allowed = " or ".join(repr(c) for c in _CHOICES[name])
            raise ValueError(f"{name} must be {allowed}, not {value!r}")
    if sharding is not None and device is not None:
        raise ValueError("pass device= or sharding=, not both: one of them.")
    made = Options(_options_module.single_device(device), copy, sharding, fallback, readonly,
                   leaves, narrow)
    if key is not None:
        _remember(_made, key, made, 64)
    return made

