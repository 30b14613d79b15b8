"""The one pytree walker of every entry point: a batch walked as JAX walks a pytree, and into
the containers JAX does not register (docs/loaders/index.md has the table), each rebuilt as
its own type (:func:`_rebuild`; a dataclass as a copy, ``__init__`` not run again). Each
container is rebuilt once with its own values during the walk, so one that cannot be is found
before any leaf is converted (:attr:`Flat.errors`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from collections.abc import Mapping
from typing import Any

from ._options import jax_module
from ._words import type_name
from .errors import ContainerError


MAX_DEPTH = 200   # containers inside containers

_LEAF, _MAPPING, _DATACLASS, _SEQUENCE, _NAMESPACE = 0, 1, 2, 3, 4
# By the kind of a container, JAX's class of the keys of its values (a key as (kind of its
# container, name): see _where).
_JAX_KEYS = ("", "DictKey", "GetAttrKey", "SequenceKey", "GetAttrKey")
_kinds: dict[type, int] = {}
_KINDS_MAX = 1024
_PLAIN_TYPES = frozenset({str, bytes, int, float, bool, complex, type(None)})
_WITH_TEXT = 2   # _one_level: leaves, lists of plain scalars among them


def _kind_of(tp: type) -> int:
    # A tensor type (__dlpack__ or the C exchange API) is a leaf, whatever else it is.
    if hasattr(tp, "__dlpack__") or hasattr(tp, "__dlpack_c_exchange_api__"):
        return _LEAF
    if issubclass(tp, Mapping):
        return _MAPPING
    if dataclasses.is_dataclass(tp):
        return _DATACLASS
    if issubclass(tp, (tuple, list)):   # jax walks exact ones and namedtuples
        return _SEQUENCE
    if issubclass(tp, types.SimpleNamespace):
        return _NAMESPACE
    return _LEAF


def _kind(tp: type) -> int:
    kind = _kinds.get(tp)
    if kind is None:
        kind = _kind_of(tp)
        if len(_kinds) >= _KINDS_MAX:
            _kinds.clear()
        _kinds[tp] = kind
    return kind


_tree_util = functools.partial(jax_module, "jax.tree_util")


@dataclasses.dataclass(slots=True, eq=False)
class Flat:
    """A pytree flattened once (an unregistered container's leaves in its place); ``errors``: by
    leaf index, containers that cannot be rebuilt (their messages do not yet name the path)."""

    x: Any
    leaves: list[Any]
    treedef: Any
    # None: no leaf of jax's flattening is a container. Else one entry per jax
    # leaf: None (a leaf), or (kind, container, names, [Flat per child]).
    parts: list[Any] | None
    errors: dict[int, ContainerError]
    is_leaf: Any   # text_leaf where lists of plain scalars are one leaf each, else None

    def unflatten(self, values: list[Any]) -> Any:
        """ContainerError where a container cannot be rebuilt around ``values``."""
        if self.parts is None:
            return self.treedef.unflatten(values)
        it, outer = iter(values), []
        for part in self.parts:
            if part is None:
                outer.append(next(it))
                continue
            kind, obj, names, subs = part
            new = [sub.unflatten([next(it) for _ in sub.leaves]) for sub in subs]
            outer.append(_rebuild(kind, obj, names, new))
        return self.treedef.unflatten(outer)

    def check_rebuild(self, values: list[Any]) -> None:
        """Rebuild the batch around ``values`` (the conversion's array type where tensors
        stand) before any leaf is taken; ContainerError naming a container that refuses them."""
        try:
            self.unflatten(values)
        except Exception as exc:
            swap = dict(zip(map(id, self.leaves), values))
            path, tp, cause = _refusal(self.x, lambda v: swap.get(id(v), v), self.is_leaf) or (
                (), type(self.x), exc)
            raise ContainerError(
                f"the {type_name(tp)} at {_keystr(path)} refuses the arrays the conversion gives "
                f"({type(cause).__name__}: {cause}); nothing was converted. To fix: let "
                f"{tp.__qualname__} hold jax.Array values (its constructor, or its pytree "
                f"unflatten), or pass a dict.") from cause

    def key_paths(self) -> list[tuple[Any, ...]]:
        pairs = _tree_util().tree_leaves_with_path(self.x, is_leaf=self.is_leaf)
        out: list[tuple[Any, ...]] = []
        for (path, _), part in zip(pairs, self.parts or [None] * len(pairs)):
            if part is None:
                out.append(path)
                continue
            for name, sub in zip(part[2], part[3]):
                key = _jax_key(part[0], name)
                out.extend(path + (key,) + p for p in sub.key_paths())
        return out

    def structure(self) -> tuple[Any, ...]:
        """What two batches must share to be stacked leaf by leaf: JAX's treedef, and for
        each container JAX does not walk, its type, its keys and the structure inside."""
        return (self.treedef, tuple(
            None if part is None else
            (type(part[1]), tuple(part[2]), tuple(sub.structure() for sub in part[3]))
            for part in self.parts or ()))

    def describe(self) -> str:
        inner = [f"{type(part[1]).__qualname__} with keys {list(part[2])}"
                 for part in self.parts or () if part is not None]
        return str(self.treedef) + (f" holding {', '.join(inner)}" if inner else "")

    def keystr(self, index: int) -> str:
        return _tree_util().keystr(self.key_paths()[index])


def flatten(x: Any, text_lists: bool = False) -> Flat:
    """``text_lists``: a list or tuple of plain scalars (:func:`text_leaf`) is one leaf (a
    list as a new list), as the conversions take it; ``plan`` walks into it. ContainerError
    for a batch deeper than :data:`MAX_DEPTH`, that contains itself, or holds a dict whose
    keys do not sort: looked for first, as jaxlib's walk of one leaves the interpreter
    unable to go on."""
    level = _one_level(x, text_lists)
    # (one level of leaves, or a leaf: a tensor, scalar or node JAX walks; nothing to check)
    if not level and _kind(type(x)) != _LEAF:
        _check_walkable(x)
    return _flatten(x, text_leaf if text_lists else None, level)


def text_leaf(v: Any) -> bool:
    """``v`` is a list or tuple of plain scalars only (a batch's string ids), kept whole."""
    return type(v) in (list, tuple) and set(map(type, v)) <= _PLAIN_TYPES


def is_leaf(v: Any) -> bool:
    """Not None (an empty node to JAX), no container walked here or registered with JAX."""
    return v is not None and _kind(type(v)) == _LEAF and _tree_util().all_leaves([v])


def _one_level(x: Any, text_lists: bool) -> int:
    """1 where ``x`` is a dict (keys that sort), list or tuple of leaves only (2: with a
    :func:`text_leaf` among them), whose walk needs no looking for cycles; else 0."""
    tp = type(x)
    if tp is dict:
        try:
            sorted(x)
        except TypeError:
            return 0
        values = x.values()
    elif tp in (list, tuple):
        values = x
    else:
        return 0
    level = 1
    for v in values:
        if _kind(type(v)) != _LEAF:
            if not (text_lists and text_leaf(v)):
                return 0
            level = _WITH_TEXT
    return level


def _flatten(x: Any, is_leaf: Any, level: int = 0) -> Flat:
    """``level``: :func:`_one_level`'s answer, where no container among the leaves JAX finds
    needs walking (and no list is kept whole where it is 1)."""
    outer, treedef = _tree_util().tree_flatten(x, is_leaf=is_leaf)
    if is_leaf and level != 1:   # (a list JAX gives as a leaf is one is_leaf kept whole)
        outer = [list(v) if type(v) is list else v for v in outer]
    if level or all(_leaf_kind(tp, is_leaf) == _LEAF for tp in set(map(type, outer))):
        return Flat(x, outer, treedef, None, {}, is_leaf)
    leaves: list[Any] = []
    parts: list[Any] = []
    errors: dict[int, ContainerError] = {}
    for leaf in outer:
        kind = _leaf_kind(type(leaf), is_leaf)
        part = None
        if kind != _LEAF:
            try:
                part = _container(kind, leaf, is_leaf)
            except ContainerError as exc:   # (it refuses its own values: kept whole, as a leaf)
                errors[len(leaves)] = exc
        parts.append(part)
        if part is None:
            leaves.append(leaf)
            continue
        for sub in part[3]:
            errors.update((len(leaves) + i, e) for i, e in sub.errors.items())
            leaves.extend(sub.leaves)
    return Flat(x, leaves, treedef, parts, errors, is_leaf)


def _leaf_kind(tp: type, is_leaf: Any) -> int:
    return _LEAF if is_leaf and tp in (list, tuple) else _kind(tp)


def _container(kind: int, obj: Any, is_leaf: Any) -> Any:
    """``(kind, obj, names, subs)``; ContainerError where it cannot be rebuilt around its own
    values."""
    names, values = _named_values(kind, obj)
    _rebuild(kind, obj, names, values)
    return (kind, obj, names, [_flatten(v, is_leaf) for v in values])


def _named_values(kind: int, obj: Any) -> tuple[list[Any], list[Any]]:
    if kind == _MAPPING:
        names = list(obj)
        return names, [obj[k] for k in names]
    if kind == _SEQUENCE:
        return list(range(len(obj))), list(obj)
    names = [f.name for f in dataclasses.fields(obj)] if kind == _DATACLASS else list(vars(obj))
    return names, [getattr(obj, n) for n in names]


def _rebuild(kind: int, obj: Any, names: list[Any], values: list[Any]) -> Any:
    tp = type(obj)
    try:
        if kind == _MAPPING:
            return tp(dict(zip(names, values)))
        if kind == _SEQUENCE:
            return tp(values)
        if kind == _NAMESPACE:
            return tp(**dict(zip(names, values)))
        new = copy.copy(obj)
        for name, value in zip(names, values):
            object.__setattr__(new, name, value)
        return new
    except Exception as exc:
        how = {_MAPPING: f"{tp.__qualname__}(dict)", _SEQUENCE: f"{tp.__qualname__}(values)",
               _NAMESPACE: f"{tp.__qualname__}(**values)"}.get(kind, "a copy with its fields set")
        raise ContainerError(
            f"a {type_name(tp)} in the batch cannot be rebuilt around its converted values with {how} "
            f"({type(exc).__name__}: {exc}); nothing was converted. To fix: register it as a JAX "
            f"pytree (jax.tree_util.register_pytree_with_keys), or pass a dict.") from exc


def _refusal(x: Any, swap: Any, is_leaf: Any,
             path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], type, Any] | None:
    """``(path, type, exception)`` of the innermost container refusing its values' ``swap(v)``
    (``path``: JAX's keys), or None."""
    pairs, treedef = _tree_util().tree_flatten_with_path(   # one level of JAX's walk
        x, is_leaf=lambda n: n is not x or (is_leaf is not None and is_leaf(n)))
    kind = _kind(type(x))
    if not (treedef.num_leaves == 1 and pairs[0][1] is x):   # a node JAX walks
        keys = [p[0] for p, _ in pairs]
        values = [v for _, v in pairs]
        rebuild = treedef.unflatten
    elif kind != _LEAF:   # a container walked here
        names, values = _named_values(kind, x)
        keys = [_jax_key(kind, n) for n in names]
        rebuild = functools.partial(_rebuild, kind, x, names)
    else:
        return None   # a leaf
    for key, value in zip(keys, values):
        found = _refusal(value, swap, is_leaf, path + (key,))
        if found:
            return found
    try:
        rebuild([swap(v) for v in values])
    except Exception as exc:
        return path, type(x), exc.__cause__ if isinstance(exc, ContainerError) else exc
    return None


def _check_walkable(x: Any) -> None:
    """ContainerError for a batch no walk of which ends; no recursion."""
    on_path: list[int] = []          # the containers from the top to where the walk is
    stack: list[tuple[Any, tuple[Any, ...]]] = [(x, ())]   # (node, its (kind, name) path)
    while stack:
        node, path = stack.pop()
        del on_path[len(path):]
        if id(node) in on_path:
            raise ContainerError(
                f"the batch contains itself: {_where(path)} is one of the containers it is "
                f"in (a reference cycle), so no walk of it ends; nothing was converted. To "
                f"fix: pass a batch without the cycle.")
        if len(path) > MAX_DEPTH:
            raise ContainerError(
                f"the batch nests more than {MAX_DEPTH} containers deep (at {_where(path)}); nothing "
                f"was converted. To fix: pass a flatter batch (a dict or list of tensors).")
        on_path.append(id(node))
        stack.extend((child, path + (k,)) for k, child in reversed(_children(node, path))
                     if _kind(type(child)) != _LEAF)   # (containers only: a leaf has nothing inside)


def _where(raw: tuple[Any, ...]) -> str:
    """:func:`_keystr` of ``(kind, name)`` pairs."""
    return _keystr(tuple(_jax_key(*pair) for pair in raw))


def _keystr(path: tuple[Any, ...]) -> str:
    """``jax.tree_util.keystr`` of JAX's keys, its middle left out when long."""
    tree_util = _tree_util()
    if not path:
        return "the top of the batch"
    if len(path) <= 8:
        return tree_util.keystr(path)
    return f"{tree_util.keystr(path[:4])}...{tree_util.keystr(path[-2:])}, {len(path)} levels down"


def _jax_key(kind: int, name: Any) -> Any:
    return getattr(_tree_util(), _JAX_KEYS[kind])(name)


def _children(node: Any, path: tuple[Any, ...]) -> Any:
    """``[((kind, name), child)]`` of a container (the walk pushes no leaf); a dict's
    ContainerError: unsortable keys."""
    kind = _kind(type(node))
    if text_leaf(node):
        return []   # (a list of plain scalars: a batch's string ids, nothing inside)
    try:
        if type(node) is dict:
            sorted(node)
    except TypeError:
        kinds = sorted({type(k).__name__ for k in node})
        raise ContainerError(
            f"the dict at {_where(path)} has keys of several types ({', '.join(kinds)}), which "
            f"do not sort, and JAX sorts a dict's keys to walk it; nothing was "
            f"converted. To fix: give its keys one type (e.g. str(key)).") from None
    names, values = _named_values(kind, node)
    return [((kind, n), v) for n, v in zip(names, values)]
