"""The one pytree walker: how every entry point (plan, explain, to_jax, sharded to_jax,
prefetch) finds the leaves of a batch and puts the batch back together.

A batch is walked as JAX walks a pytree (``jax.tree_util``: dict, list, tuple,
namedtuple, None and every registered node type), and further into the containers
PyTorch and Hugging Face loaders make that JAX does not register:

- any ``collections.abc.Mapping`` (transformers' ``BatchEncoding`` and
  ``BatchFeature`` are ``UserDict`` subclasses; ``dict`` subclasses), rebuilt as
  ``type(m)(dict_of_values)``, as accelerate's ``send_to_device`` does;
- dataclass instances, rebuilt with ``dataclasses.replace`` over their ``init``
  fields (the other fields are left to the class).

Everything else is a leaf: tensors (see :func:`dlinspect._core.is_tensor`) and
whatever is not a tensor (str, bytes, numbers, non-numeric NumPy arrays...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._options import jax_module
from .errors import ContainerError

__all__ = ["Flat", "flatten"]

_LEAF, _MAPPING, _DATACLASS = 0, 1, 2
_kinds: dict[type, int] = {}
_KINDS_MAX = 1024


def _classify(tp: type) -> int:
    if hasattr(tp, "__dlpack__") or hasattr(tp, "__dlpack_c_exchange_api__"):
        kind = _LEAF              # a tensor, whatever else it is
    elif issubclass(tp, Mapping):
        kind = _MAPPING
    elif dataclasses.is_dataclass(tp):
        kind = _DATACLASS
    else:
        kind = _LEAF
    if len(_kinds) >= _KINDS_MAX:
        _kinds.clear()
    _kinds[tp] = kind
    return kind


def _tree_util() -> Any:
    return jax_module("jax.tree_util")


class Flat:
    """A pytree flattened once: its leaves, how to put it back, each leaf's key path.

    Attributes
    ----------
    leaves : list
        The leaves, in ``jax.tree_util`` order, with the leaves of unregistered
        Mapping and dataclass containers in place of the container.
    """

    __slots__ = ("x", "leaves", "treedef", "parts")

    def __init__(self, x: Any, leaves: list[Any], treedef: Any, parts: list[Any] | None):
        self.x = x
        self.leaves = leaves
        self.treedef = treedef
        # None: no leaf of jax's flattening is a container. Else one entry per jax
        # leaf: None (a leaf), or (kind, container, keys, names, [Flat per child]).
        self.parts = parts

    def unflatten(self, values: list[Any]) -> Any:
        """The pytree with ``values`` (one per leaf) in place of the leaves.

        Raises
        ------
        ContainerError
            A Mapping that cannot be built from a dict, or a dataclass that
            ``dataclasses.replace`` cannot rebuild (a ``TypeError``).
        """
        if self.parts is None:
            return self.treedef.unflatten(values)
        outer, pos = [], 0
        for part in self.parts:
            if part is None:
                outer.append(values[pos])
                pos += 1
                continue
            kind, obj, _, names, subs = part
            new = []
            for sub in subs:
                n = len(sub.leaves)
                new.append(sub.unflatten(values[pos:pos + n]))
                pos += n
            outer.append(_rebuild(kind, obj, names, new))
        return self.treedef.unflatten(outer)

    def key_path(self, index: int) -> tuple[Any, ...]:
        """The ``jax.tree_util`` key path of leaf ``index``."""
        tree_util = _tree_util()
        paths = [path for path, _ in tree_util.tree_flatten_with_path(self.x)[0]]
        if self.parts is None:
            return tuple(paths[index])
        pos = 0
        for path, part in zip(paths, self.parts):
            if part is None:
                if pos == index:
                    return tuple(path)
                pos += 1
                continue
            for key, sub in zip(part[2], part[4]):
                n = len(sub.leaves)
                if index < pos + n:
                    return tuple(path) + (key,) + sub.key_path(index - pos)
                pos += n
        raise IndexError(index)

    def keystr(self, index: int) -> str:
        """``jax.tree_util.keystr`` of leaf ``index``'s key path (``['x']['pixels']``)."""
        return _tree_util().keystr(self.key_path(index))


def flatten(x: Any) -> Flat:
    """Flatten batch ``x`` once (see this module's doc for what is walked)."""
    tree_util = _tree_util()
    outer, treedef = tree_util.tree_flatten(x)
    get = _kinds.get
    for leaf in outer:
        kind = get(type(leaf))
        if kind is None:
            kind = _classify(type(leaf))
        if kind:
            break
    else:
        return Flat(x, outer, treedef, None)
    leaves: list[Any] = []
    parts: list[Any] = []
    for leaf in outer:
        kind = _kinds.get(type(leaf))
        if kind is None:
            kind = _classify(type(leaf))
        if kind == _LEAF:
            parts.append(None)
            leaves.append(leaf)
            continue
        keys: list[Any]
        if kind == _MAPPING:
            names = list(leaf.keys())
            keys = [tree_util.DictKey(k) for k in names]
            subs = [flatten(leaf[k]) for k in names]
        else:
            names = [f.name for f in dataclasses.fields(leaf) if f.init]
            keys = [tree_util.GetAttrKey(n) for n in names]
            subs = [flatten(getattr(leaf, n)) for n in names]
        for sub in subs:
            leaves.extend(sub.leaves)
        parts.append((kind, leaf, keys, names, subs))
    return Flat(x, leaves, treedef, parts)


def _rebuild(kind: int, obj: Any, names: list[Any], values: list[Any]) -> Any:
    tp = type(obj)
    try:
        if kind == _MAPPING:
            return tp(dict(zip(names, values)))
        return dataclasses.replace(obj, **dict(zip(names, values)))
    except Exception as exc:
        how = (f"{tp.__qualname__}(dict)" if kind == _MAPPING
               else "dataclasses.replace")
        raise ContainerError(
            f"a {tp.__module__}.{tp.__qualname__} in the batch cannot be rebuilt around its "
            f"converted values with {how} ({type(exc).__name__}: {exc}). To fix: register "
            f"it as a JAX pytree (jax.tree_util.register_pytree_with_keys), or pass a dict."
        ) from exc
