"""The one pytree walker: how every entry point (plan, explain, to_jax, sharded to_jax,
prefetch) finds the leaves of a batch and puts the batch back together.

A batch is walked as JAX walks a pytree, and further into the containers PyTorch and
Hugging Face loaders make that JAX does not register, each rebuilt as its own type around
the converted values, keeping every other value it had (docs/loaders/index.md has the
table): a ``Mapping`` as ``type(m)(dict_of_values)`` (as accelerate's ``send_to_device``),
a dataclass as a copy with every field (``init=False`` ones too) set, not running
``__init__`` again, a tuple or list subclass that is no namedtuple as ``type(x)(values)``,
a ``SimpleNamespace`` as ``type(x)(**values)``. Everything else is a leaf, a tensor or not
(:func:`dlinspect._core.is_tensor`). Each container is rebuilt once with its own values
while the batch is walked, so one that cannot be rebuilt is found before any leaf is
converted: it becomes a leaf with its ContainerError (:attr:`Flat.errors`). What no walk
ends: see :func:`flatten`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
from collections.abc import Mapping
from typing import Any

from ._options import jax_module
from .errors import ContainerError

__all__ = ["Flat", "flatten", "is_leaf", "text_leaf", "MAX_DEPTH"]

#: The deepest a batch may nest (containers inside containers).
MAX_DEPTH = 200

_LEAF, _MAPPING, _DATACLASS, _SEQUENCE, _NAMESPACE = 0, 1, 2, 3, 4
_DICT_KEY, _SEQUENCE_KEY, _ATTR_KEY = 0, 1, 2   # a key as (kind, name): see _where
_KEY_KIND = {_MAPPING: _DICT_KEY, _DATACLASS: _ATTR_KEY, _SEQUENCE: _SEQUENCE_KEY,
             _NAMESPACE: _ATTR_KEY}
_kinds: dict[type, int] = {}
_KINDS_MAX = 1024
_FIX = ("register it as a JAX pytree (jax.tree_util.register_pytree_with_keys), or pass a "
        "dict")


def _tensor_type(tp: type) -> bool:
    """A tensor type (``__dlpack__`` or the C exchange API): a leaf, whatever else it is."""
    return hasattr(tp, "__dlpack__") or hasattr(tp, "__dlpack_c_exchange_api__")


def _classify(tp: type) -> int:
    if _tensor_type(tp):
        kind = _LEAF
    elif issubclass(tp, Mapping):
        kind = _MAPPING
    elif dataclasses.is_dataclass(tp):
        kind = _DATACLASS
    elif issubclass(tp, (tuple, list)):   # jax walks exact tuples, lists and namedtuples
        kind = _SEQUENCE
    elif issubclass(tp, types.SimpleNamespace):
        kind = _NAMESPACE
    else:
        kind = _LEAF
    if len(_kinds) >= _KINDS_MAX:
        _kinds.clear()
    _kinds[tp] = kind
    return kind


def _kind(tp: type) -> int:
    kind = _kinds.get(tp)
    return _classify(tp) if kind is None else kind


_tree_util = functools.partial(jax_module, "jax.tree_util")


class Flat:
    """A pytree flattened once: its ``leaves`` (in ``jax.tree_util`` order, the leaves of a
    container JAX does not register in its place), how to put it back, each leaf's key
    path; ``errors``: by index, leaves that are containers which cannot be rebuilt (their
    messages do not yet name the key path: see :meth:`keystr`)."""

    __slots__ = ("x", "leaves", "treedef", "parts", "errors", "is_leaf")

    def __init__(self, x: Any, leaves: list[Any], treedef: Any, parts: list[Any] | None,
                 errors: dict[int, ContainerError], is_leaf: Any = None):
        self.x = x
        self.is_leaf = is_leaf   # text_leaf where lists of plain scalars are one leaf each
        self.leaves = leaves
        self.treedef = treedef
        # None: no leaf of jax's flattening is a container. Else one entry per jax
        # leaf: None (a leaf), or (kind, container, keys, names, [Flat per child]).
        self.parts = parts
        self.errors = errors

    def unflatten(self, values: list[Any]) -> Any:
        """The pytree with ``values`` (one per leaf) in place of the leaves; ContainerError
        where a container cannot be rebuilt (in a walked batch only a constructor failing
        for the new values: see :attr:`errors`)."""
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

    def check_rebuild(self, values: list[Any]) -> None:
        """Rebuild the batch with ``values`` in place of its leaves (arrays of the
        conversion's type where tensors stand) and let the result go: what the conversion's
        own rebuild will meet, tried before any leaf is taken. ContainerError where a
        container refuses them, naming its type, its key path and what it raised."""
        try:
            self.unflatten(values)
        except Exception as exc:
            swap = dict(zip(map(id, self.leaves), values))
            path, tp, cause = _refusal(self.x, lambda v: swap.get(id(v), v), self.is_leaf) or (
                (), type(self.x), exc)
            raise ContainerError(
                f"the {tp.__module__}.{tp.__qualname__} at {_where(path)} refuses the arrays the "
                f"conversion gives ({type(cause).__name__}: {cause}); nothing was converted. "
                f"To fix: let {tp.__qualname__} hold jax.Array values (its constructor, or "
                f"its pytree unflatten), or pass a dict.") from cause

    def key_paths(self) -> list[tuple[Any, ...]]:
        """The ``jax.tree_util`` key path of every leaf, in leaf order."""
        paths = [tuple(path) for path, _ in
                 _tree_util().tree_flatten_with_path(self.x, is_leaf=self.is_leaf)[0]]
        if self.parts is None:
            return paths
        out: list[tuple[Any, ...]] = []
        for path, part in zip(paths, self.parts):
            if part is None:
                out.append(path)
                continue
            for key, sub in zip(part[2], part[4]):
                out.extend(path + (key,) + p for p in sub.key_paths())
        return out

    def structure(self) -> tuple[Any, ...]:
        """What two batches must share to be stacked leaf by leaf: JAX's treedef, and for
        each container JAX does not walk, its type, its keys and the structure inside."""
        if self.parts is None:
            return (self.treedef,)
        return (self.treedef, tuple(
            None if part is None else
            (type(part[1]), tuple(part[3]), tuple(sub.structure() for sub in part[4]))
            for part in self.parts))

    def describe(self) -> str:
        """The structure in words: JAX's treedef, and each container it does not walk
        with its type and keys."""
        text = str(self.treedef)
        inner = [f"{type(part[1]).__qualname__} with keys {list(part[3])}"
                 for part in self.parts or () if part is not None]
        return text + (f" holding {', '.join(inner)}" if inner else "")

    def keystr(self, index: int) -> str:
        """``jax.tree_util.keystr`` of leaf ``index``'s key path (``['x']['pixels']``)."""
        return _tree_util().keystr(self.key_paths()[index])


def flatten(x: Any, text_lists: bool = False) -> Flat:
    """Flatten batch ``x`` once (see this module's doc for what is walked). ``text_lists``:
    a list or tuple of plain scalars (:func:`text_leaf`) is one leaf (a list as a new
    list), as the conversions take it; :func:`~dlinspect.plan` walks into it.

    ContainerError (naming where) for a batch that nests deeper than :data:`MAX_DEPTH`,
    contains itself, or holds a dict whose keys do not sort (JAX sorts a dict's keys to
    walk it): looked for before JAX walks the batch, as jaxlib's walk of such a batch
    fails leaving the interpreter unable to go on.
    """
    is_leaf = text_leaf if text_lists else None
    level = _one_level(x, text_lists)
    if level:   # no container among the leaves JAX finds: nothing more to walk
        outer, treedef = _tree_util().tree_flatten(x, is_leaf=is_leaf)
        if level == _WITH_TEXT:
            outer = [list(v) if type(v) is list else v for v in outer]
        return Flat(x, outer, treedef, None, {}, is_leaf)
    if _kind(type(x)) != _LEAF:   # (a leaf: a tensor, scalar or node JAX walks; nothing to check)
        unwalkable = _unwalkable(x)
        if unwalkable is not None:
            raise unwalkable
    return _flatten(x, is_leaf)


#: The types of plain scalars: no walker descends into them.
_PLAIN_TYPES = frozenset({str, bytes, int, float, bool, complex, type(None)})


def text_leaf(v: Any) -> bool:
    """``v`` is a list or tuple of plain scalars only (a batch's string ids): nothing in
    it is a tensor or a container, so a conversion keeps it whole."""
    tp = type(v)
    return (tp is list or tp is tuple) and set(map(type, v)) <= _PLAIN_TYPES


def is_leaf(v: Any) -> bool:
    """``v`` is one leaf of a batch as :func:`flatten` finds it: not None (an empty node
    to JAX), not a container walked here, not a node type registered with JAX."""
    return v is not None and _kind(type(v)) == _LEAF and _tree_util().all_leaves([v])


_WITH_TEXT = 2


def _one_level(x: Any, text_lists: bool = False) -> int:
    """``x`` is a dict (with keys that sort), list or tuple of leaves only (with
    ``text_lists``, lists of plain scalars count as leaves: 2 where there is one): no
    walk of it can fail to end, so it needs no looking for cycles (what a loader's batch
    mostly is). 0 where it is not."""
    tp = type(x)
    if tp is dict:
        try:
            sorted(x)
        except TypeError:
            return 0
        values = x.values()
    elif tp is list or tp is tuple:
        values = x
    else:
        return 0
    kinds = _kinds
    level = 1
    for v in values:
        kind = kinds.get(type(v))
        if kind is None:
            kind = _classify(type(v))
        if kind != _LEAF:
            if not (text_lists and text_leaf(v)):
                return 0
            level = _WITH_TEXT
    return level


def _flatten(x: Any, is_leaf: Any = None) -> Flat:
    outer, treedef = _tree_util().tree_flatten(x, is_leaf=is_leaf)
    if is_leaf is not None:   # (a list JAX gives as a leaf is one is_leaf kept whole)
        outer = [list(v) if type(v) is list else v for v in outer]
    if all(_leaf_kind(tp, is_leaf) == _LEAF for tp in set(map(type, outer))):
        return Flat(x, outer, treedef, None, {}, is_leaf)
    leaves: list[Any] = []
    parts: list[Any] = []
    errors: dict[int, ContainerError] = {}
    for leaf in outer:
        kind = _leaf_kind(type(leaf), is_leaf)
        part = None if kind == _LEAF else _container(kind, leaf, is_leaf)
        if isinstance(part, ContainerError):
            errors[len(leaves)] = part
            part = None
        parts.append(part)
        if part is None:
            leaves.append(leaf)
            continue
        for sub in part[4]:
            errors.update((len(leaves) + i, e) for i, e in sub.errors.items())
            leaves.extend(sub.leaves)
    return Flat(x, leaves, treedef, parts, errors, is_leaf)


def _leaf_kind(tp: type, is_leaf: Any) -> int:
    """:func:`_kind`, where a list or tuple ``is_leaf`` (:func:`text_leaf`) kept whole is a leaf."""
    return _LEAF if is_leaf is not None and (tp is list or tp is tuple) else _kind(tp)


def _container(kind: int, obj: Any, is_leaf: Any = None) -> Any:
    """``(kind, obj, keys, names, subs)`` of a container JAX does not walk, or the
    ContainerError that says it cannot be rebuilt (tried with its own values)."""
    names, values = _named_values(kind, obj)
    try:
        _rebuild(kind, obj, names, values)
    except ContainerError as exc:
        return exc
    keys = [_jax_key((_KEY_KIND[kind], n)) for n in names]
    return (kind, obj, keys, names, [_flatten(v, is_leaf) for v in values])


def _named_values(kind: int, obj: Any) -> tuple[list[Any], list[Any]]:
    """The names (keys, indices, fields, attributes) of a container JAX does not walk,
    and its values."""
    if kind == _MAPPING:
        names = list(obj.keys())
        return names, [obj[k] for k in names]
    if kind == _SEQUENCE:
        return list(range(len(obj))), list(obj)
    # a dataclass's fields, a namespace's attributes
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
            f"a {tp.__module__}.{tp.__qualname__} in the batch cannot be rebuilt around its "
            f"converted values with {how} ({type(exc).__name__}: {exc}); nothing was "
            f"converted. To fix: {_FIX}.") from exc


def _refusal(x: Any, swap: Any, is_leaf: Any,
             path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], type, Any] | None:
    """``(path, type, exception)`` of the innermost container of ``x`` that refuses to be
    rebuilt with each of its values ``v`` as ``swap(v)``, or None (the search behind
    :meth:`Flat.check_rebuild`'s error; ``path`` as :func:`_where` takes it)."""
    pairs, treedef = _tree_util().tree_flatten_with_path(   # one level of JAX's walk
        x, is_leaf=lambda n: n is not x or (is_leaf is not None and is_leaf(n)))
    kind = _kind(type(x))
    if not (treedef.num_leaves == 1 and pairs[0][1] is x):   # a node JAX walks
        keys = [_raw_key(p[0]) for p, _ in pairs]
        values = [v for _, v in pairs]
        rebuild = treedef.unflatten
    elif kind != _LEAF:   # a container walked here
        names, values = _named_values(kind, x)
        keys = [(_KEY_KIND[kind], n) for n in names]
        rebuild = functools.partial(_rebuild, kind, x, names)
    else:
        return None   # a leaf
    for key, value in zip(keys, values):
        found = _refusal(value, swap, is_leaf, path + (key,))
        if found is not None:
            return found
    try:
        rebuild([swap(v) for v in values])
    except Exception as exc:
        return path, type(x), exc.__cause__ if isinstance(exc, ContainerError) else exc
    return None


def _raw_key(key: Any) -> tuple[int, Any]:
    """A jax key as ``(kind, name)`` (see :func:`_where`)."""
    for kind, attr in ((_DICT_KEY, "key"), (_SEQUENCE_KEY, "idx"), (_ATTR_KEY, "name")):
        if hasattr(key, attr):
            return kind, getattr(key, attr)
    return _SEQUENCE_KEY, str(key)


def _unwalkable(x: Any) -> ContainerError | None:
    """The ContainerError of a batch no walk of which ends (see :func:`flatten`), else None.
    One pass over the containers, without recursion; leaves are not looked at."""
    on_path: list[int] = []          # the containers from the top to where the walk is
    keys: list[Any] = []             # the key of each of them in its parent: (kind, name),
                                     # made a jax key only to name where a walk cannot end
    stack: list[tuple[Any, Any, int]] = [(x, None, 0)]
    while stack:
        node, key, depth = stack.pop()
        del on_path[depth:], keys[depth:]
        path = tuple(keys[1:]) + ((key,) if depth else ())
        if id(node) in on_path:
            return ContainerError(
                f"the batch contains itself: {_where(path)} is one of the containers it is "
                f"in (a reference cycle), so no walk of it ends; nothing was converted. To "
                f"fix: pass a batch without the cycle.")
        if depth > MAX_DEPTH:
            return ContainerError(
                f"the batch nests more than {MAX_DEPTH} containers deep (at {_where(path)}); "
                f"nothing was converted. To fix: pass a flatter batch (a dict or list of "
                f"tensors).")
        children = _children(node, path)
        if isinstance(children, ContainerError):
            return children
        on_path.append(id(node))
        keys.append(key)
        stack.extend((child, k, depth + 1) for k, child in reversed(children)
                     if not (type(child) in _PLAIN_TYPES or _tensor_type(type(child))))
    return None


def _where(raw: tuple[Any, ...]) -> str:
    """A key path (of ``(kind, name)`` pairs) in words, as ``jax.tree_util.keystr``
    writes it, its middle left out when it is long."""
    tree_util = _tree_util()
    if not raw:
        return "the top of the batch"
    path = tuple(map(_jax_key, raw))
    if len(path) <= 8:
        return tree_util.keystr(path)
    return (f"{tree_util.keystr(path[:4])}...{tree_util.keystr(path[-2:])}, "
            f"{len(path)} levels down")


def _jax_key(raw: tuple[int, Any]) -> Any:
    """A ``(kind, name)`` key as the jax key it stands for."""
    return getattr(_tree_util(), ("DictKey", "SequenceKey", "GetAttrKey")[raw[0]])(raw[1])


def _children(node: Any, path: tuple[Any, ...]) -> Any:
    """``[((kind, name), child)]`` of a container (``[]`` for anything else), or the
    ContainerError of a dict whose keys do not sort."""
    kind = _kind(type(node))
    if kind == _LEAF or (kind == _SEQUENCE and set(map(type, node)) <= _PLAIN_TYPES):
        return []   # (a list of plain scalars: a batch's string ids, nothing inside)
    if kind != _MAPPING:
        names, values = _named_values(kind, node)
        return [((_KEY_KIND[kind], n), v) for n, v in zip(names, values)]
    try:
        names = sorted(node) if type(node) is dict else list(node)
    except TypeError:
        kinds = sorted({type(k).__name__ for k in node})
        return ContainerError(
            f"the dict at {_where(path)} has keys of several types ({', '.join(kinds)}), which "
            f"do not sort, and JAX sorts a dict's keys to walk it; nothing was "
            f"converted. To fix: give its keys one type (e.g. str(key)).")
    return [((_DICT_KEY, k), node[k]) for k in names]
