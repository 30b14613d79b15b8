"""dlinspect.stack: batches born where JAX can view them (aligned for XLA:CPU, or pinned)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from . import _tree
from ._core import (aligned_empty, capsule_of, current_target, is_tensor, physical_memory,
                    stack_column, to_host)
from ._tables import NUMPY_MAX_NDIM
from ._words import type_name
from .errors import AllocationError, DLInspectError, StackError, UnsupportedDeviceError


MAX_ALIGNMENT = 1 << 30   # bytes
_CAPSULE = type(capsule_of(np.zeros(1, np.uint8)))
_SCALARS = (np.generic, int, float, complex, str, bytes)
_PASS_LIST = "To fix: pass a list of elements, e.g. stack([example_0, example_1])."
_SAME_STRUCTURE = ("a batch stacks leaves position by position, so every element needs the same "
                   "structure. To fix: give every element the same keys and nesting")


def stack(elements: Any, *, alignment: int = 0, pinned: bool = False) -> Any:
    """Stack same-structured pytrees of arrays into one batch whose leaves JAX views.

    What ``np.stack`` does leaf by leaf (grain's batching, torch's ``collate_fn``),
    with each batched leaf written once (a ``memcpy`` per element where the dtypes agree,
    NumPy's assignment where one casts) into memory aligned as XLA:CPU
    needs to import it without a copy: ``to_jax`` (and ``jax.device_put``) of the
    batch then copies nothing on CPU where ``np.stack``'s batches are copied again
    wherever ``malloc`` gave less than 64-byte alignment (it guarantees 16).

    Parameters
    ----------
    elements : iterable of pytrees
        ``n >= 1`` elements with the same structure, walked as :func:`to_jax` walks a
        batch (``jax.tree_util``'s pytrees, Mappings such as transformers'
        ``BatchEncoding``, dataclasses...). The leaves at one position are arrays of
        one shape: NumPy arrays, tensors of any DLPack producer (read as
        :func:`to_host` reads them: bfloat16 and float8 through ml_dtypes), or
        anything ``numpy.asarray`` takes (scalars, strings).
    alignment : int, keyword-only
        In bytes, 0 or a power of two up to ``2**30``. 0 (the default): what this JAX's
        CPU import needs where it was already probed in this process, else 64
        (XLA:CPU's; nothing is probed, so that a loader's worker processes do not
        start JAX backends).
    pinned : bool, keyword-only
        Write each batched leaf into page-locked ("pinned") host memory, allocated by
        torch's CUDA host allocator (``torch.empty(..., pin_memory=True)``), for a
        batch bound for a GPU: the GPU's copy engine reads pinned memory directly,
        where pageable memory is first copied into a pinned staging buffer. The
        leaves stay NumPy arrays over that memory, as aligned as ``alignment`` says;
        each keeps its block alive. Needs torch with a CUDA device.

    Returns
    -------
    pytree
        The structure of the elements (each container its own type again); each leaf
        a C-contiguous ``numpy.ndarray`` of shape ``(n,) + leaf.shape`` (in elements)
        and ``np.stack``'s dtype (native byte order) and values,
        ``alignment``-byte aligned and writable. Leaves of object dtype are
        ``np.stack``'s own (they hold references, not values JAX could view).

    Raises
    ------
    StackError
        No elements, ``elements`` not an iterable of elements (a dict is one
        element), elements of different structures (naming the first that differs
        and both structures), leaves of different shapes or of dtypes with no common
        dtype (naming the key path, the element and what was found), a leaf that is a
        DLPack capsule, or one NumPy cannot make an array of, or a batched leaf no
        NumPy array can be (over 64 dimensions, or nonzero extents past 2**63 - 1
        bytes). A ``ValueError``, as ``np.stack`` raises.
    ContainerError
        An element contains itself, nests deeper than ``dlinspect._tree.MAX_DEPTH``,
        or holds a dict whose keys do not sort (a ``TypeError``; names the element).
    AllocationError
        A batched leaf's memory cannot be had (a ``MemoryError``; names the bytes).
    ProducerError, UnsupportedDeviceError, UnsupportedDTypeError, UnsupportedShapeError
        A tensor leaf cannot be read into host memory (see :func:`to_host`); the
        message names the key path and the element.
    ValueError, TypeError
        ``alignment`` is not an int, 0 or a power of two up to ``2**30``.
    UnsupportedDeviceError
        ``pinned=True`` where torch has no CUDA device (or is not installed): no
        pinned memory can be allocated here (a ``BufferError``).

    Notes
    -----
    Use it as grain's ``MapDataset.batch(n, batch_fn=dlinspect.stack)``, as
    ``DataLoader(dataset, batch_size=n, collate_fn=dlinspect.stack)`` for NumPy
    elements in the loading process (``num_workers=0``: a batch a worker process
    makes reaches the main process pickled, in memory of the unpickler's choosing;
    torch's default collate puts worker batches in shared memory, which imports
    zero-copy), or over the examples of one batch of any Python loop. The pytree
    structure is ``jax.tree_util``'s (imported, not started: no backend).

    Examples
    --------
    >>> import numpy as np, dlinspect
    >>> batch = dlinspect.stack([{"x": np.ones(3, np.float32), "y": 1} for _ in range(4)])
    >>> batch["x"].shape, batch["y"].tolist(), batch["x"].ctypes.data % 64
    ((4, 3), [1, 1, 1, 1], 0)
    """
    align = _alignment(alignment)
    allocate = _allocator(pinned)
    items = _elements(elements)
    if type(items[0]) is np.ndarray:   # elements that are arrays: one column, no walk
        return _stack_leaf(_At(None, 0), items, align, allocate)
    first = _flatten(0, items[0])
    columns = _plain_columns(first, items)
    if columns is None:
        flats = [_flatten(k, e) if k else first for k, e in enumerate(items)]
        for k, flat in enumerate(flats):
            if flat.structure() != first.structure():
                raise StackError(
                    f"element {k} of the elements to stack has the structure {flat.describe()}, and "
                    f"element 0 {first.describe()}; {_SAME_STRUCTURE} (fill what an element lacks first).")
        columns = [list(column) for column in zip(*(flat.leaves for flat in flats))]
    return first.unflatten([_stack_leaf(_At(first, j), column, align, allocate)
                            for j, column in enumerate(columns)])


def _plain_columns(first: _tree.Flat, items: list[Any]) -> list[list[Any]] | None:
    """The leaves at each position unwalked, where element 0 is a leaf or a plain dict, list or
    tuple of leaves and every element one of its type and keys; else None (see ``_as_array``)."""
    e0 = items[0]
    tp = type(e0)
    if first.parts is not None:
        return None
    if len(first.leaves) == 1 and first.leaves[0] is e0:
        return [items]   # each element one leaf (an array, a tensor): one column
    if tp not in (dict, list, tuple) or len(first.leaves) != len(e0):
        return None
    keys: Any = sorted(e0) if tp is dict else range(len(e0))
    for leaf, key in zip(first.leaves, keys):   # (loops: generators cost more here)
        if leaf is not e0[key]:
            return None   # None values, nodes JAX walks: not one leaf per value
    for e in items:
        if type(e) is not tp or len(e) != len(e0):
            return None
    try:   # (as many keys as element 0, each of its keys: the same keys)
        return [[e[key] for e in items] for key in keys]
    except KeyError:
        return None


def _alignment(alignment: Any) -> int:
    """The caller's, or this JAX's where it was probed, else 64."""
    align = operator.index(alignment)
    if not 0 <= align <= MAX_ALIGNMENT or align & (align - 1):
        raise ValueError(f"alignment must be 0 or a power of two (bytes) up to 2**30, not {alignment}")
    if align:
        return align
    tg = current_target()
    return tg.copy_align if tg else 64


def _elements(elements: Any) -> list[Any]:
    if type(elements) is list and elements:
        return elements
    if isinstance(elements, Mapping) or (is_tensor(elements) and not isinstance(elements, np.ndarray)):
        raise StackError(f"dlinspect.stack takes a sequence of elements to stack (one example each), but "
                         f"was given one {type_name(type(elements))}. {_PASS_LIST}")
    try:
        items = list(elements)
    except TypeError:
        raise StackError(f"dlinspect.stack takes a sequence of elements to stack, but "
                         f"{type_name(type(elements))} is not iterable. {_PASS_LIST}") from None
    if not items:
        raise StackError("dlinspect.stack was given no elements, and a batch needs at least "
                         "one. To fix: pass a non-empty sequence of elements.")
    return items


def _flatten(k: int, element: Any) -> _tree.Flat:
    """A container it cannot rebuild is refused."""
    try:
        flat = _tree.flatten(element)
    except DLInspectError as exc:
        raise _in_element(exc, k, "") from None
    if flat.errors:
        index = min(flat.errors)
        raise _in_element(flat.errors[index], k, flat.keystr(index))
    return flat


def _in_element(exc: Any, k: int, path: str) -> Any:
    exc.args = (f"element {k}{' at ' + path if path else ''}: "
                f"{exc.args[0] if exc.args else ''}",) + exc.args[1:]
    return exc


class _At(NamedTuple):
    """Where a batched leaf is: position ``j`` of element 0's leaves (``first``: None where
    the elements are the leaves); its key path leads the messages about it."""

    first: _tree.Flat | None
    j: int

    def path(self) -> str:
        return self.first.keystr(self.j) if self.first else ""

    def where(self) -> str:
        path = self.path()
        return f"{path}: " if path else ""

    def there(self) -> str:
        """Where the leaf is, after its key path led the message."""
        return "there" if self.path() else "at the examples' top level"


def _stack_leaf(at: _At, column: list[Any], align: int, allocate: Callable[..., Any]) -> Any:
    # (arrays of one shape and dtype: a memcpy each, in C)
    if allocate is aligned_empty and (stacked := stack_column(column, align)) is not None:
        return stacked
    t0 = type(column[0])
    if issubclass(t0, _SCALARS) and all(type(leaf) is t0 for leaf in column):
        # Scalars of one type (labels): NumPy reads them in one call, with np.stack's dtype.
        values = np.array(column)
        if values.dtype.hasobject:
            return values
        out = _allocated(at, values.shape, values.dtype, allocate, align)
        out[...] = values
        return out
    arrays = [leaf if type(leaf) is np.ndarray else _as_array(at, k, leaf)
              for k, leaf in enumerate(column)]
    dtype = _stack_dtype(at, arrays)
    shape = (len(arrays),) + arrays[0].shape
    if dtype.hasobject:   # (references, not values: np.stack's own array)
        return _allocated(at, shape, dtype, lambda *_: np.stack(arrays))
    return np.stack(arrays, out=_allocated(at, shape, dtype, allocate, align))


def _stack_dtype(at: _At, arrays: list[np.ndarray]) -> np.dtype[Any]:
    """np.stack's dtype; StackError for different shapes, or dtypes with no common one."""
    a0 = arrays[0]
    for k, a in enumerate(arrays):
        if a.shape != a0.shape:
            raise StackError(
                f"{at.where()}element {k} has shape {a.shape} {at.there()}, "
                f"and element 0 {a0.shape}; np.stack stacks arrays of one shape. To fix: pad or "
                f"crop the examples to one shape before batching (or batch them as a list).")
    try:
        return np.result_type(*{a.dtype for a in arrays}, a0.dtype)
    except (TypeError, ValueError) as exc:
        k = next(k for k, a in enumerate(arrays) if a.dtype != a0.dtype)
        raise StackError(
            f"{at.where()}element {k} has dtype {arrays[k].dtype} {at.there()}, "
            f"and element 0 {a0.dtype}, which have no common dtype ({exc}). To fix: give the "
            f"leaf one dtype in every element (x.astype(...)) before batching.") from None


def _allocated(at: _At, shape: tuple[int, ...], dtype: np.dtype[Any],
               allocate: Callable[..., Any], align: int = 0) -> Any:
    """StackError for a shape NumPy has no array of; AllocationError."""
    nbytes = dtype.itemsize * math.prod(shape)
    total = physical_memory()
    deep = len(shape) > NUMPY_MAX_NDIM
    # (an empty batch: its nonzero extents, in bytes, past what NumPy can hold)
    if deep or (nbytes == 0 and dtype.itemsize * math.prod(filter(None, shape)) > 2**63 - 1):
        raise StackError(
            f"{at.where()}the batched leaf, {dtype} of shape {shape}, has "
            + (f"{len(shape)} dimensions (the batch's and the leaf's), and NumPy arrays have "
               f"at most {NUMPY_MAX_NDIM}" if deep else
               "no elements, but nonzero extents that multiply past 2**63 - 1 bytes, which "
               "NumPy holds no array of") + ". To fix: give that leaf fewer dimensions, or smaller extents.")
    try:
        if total and nbytes > total:   # (the one bound on a copy's size, as to_jax's)
            raise MemoryError
        return allocate(shape, dtype, align)
    except (MemoryError, ValueError):
        raise AllocationError(
            f"{at.where()}the batched leaf, {dtype} of shape {shape}, needs "
            f"{nbytes} bytes, which cannot be allocated"
            f"{f' (this machine has {total} bytes of physical memory)' if total else ''}. "
            f"To fix: stack fewer elements at a time (a smaller batch).") from None


def _as_array(at: _At, k: int, leaf: Any) -> np.ndarray:
    """A tensor as :func:`to_host` reads it, anything else as ``numpy.asarray`` takes it."""
    if k and not _tree.is_leaf(leaf):   # where element 0 has a leaf (see _plain_columns)
        raise StackError(f"{at.where()}element {k} has a {type_name(type(leaf))} "
                         f"{at.there()}, where element 0 has a leaf; {_SAME_STRUCTURE}.")
    if is_tensor(leaf):
        if type(leaf) is _CAPSULE:
            raise StackError(
                f"{at.where()}element {k} is a DLPack capsule; stacking copies the "
                f"values of arrays, and reading a capsule's would consume it, which the "
                f"caller may still need. To fix: pass the producer's array (the object "
                f"whose __dlpack__() made the capsule), or dlinspect.to_host(capsule).")
        try:
            return to_host(leaf)
        except DLInspectError as exc:
            raise _in_element(exc, k, at.path()) from None
    try:
        return np.asarray(leaf)
    except (TypeError, ValueError) as exc:
        raise StackError(
            f"{at.where()}element {k} is a {type_name(type(leaf))} that NumPy makes no array "
            f"of ({exc}). To fix: make that leaf an array (or a number) in every element.") from None


def _allocator(pinned: bool) -> Callable[..., Any]:
    """``allocate(shape, dtype, alignment)``; UnsupportedDeviceError for ``pinned`` without CUDA."""
    if not pinned:
        return aligned_empty
    try:
        import torch
        why = "" if torch.cuda.is_available() else (
            "torch has no CUDA device here (torch.cuda.is_available() is False)")
    except ImportError:
        why = "torch is not installed here"
    if why:
        raise UnsupportedDeviceError(
            f"dlinspect.stack(pinned=True) writes the batch into page-locked host memory from "
            f"torch's CUDA host allocator, and {why}, so no pinned memory can be allocated. "
            f"To fix: pinned=False (the default) where there is no GPU; pinned memory only "
            f"speeds up copies to one.")

    def allocate(shape: tuple[int, ...], dtype: np.dtype[Any], alignment: int) -> np.ndarray:
        nbytes = dtype.itemsize * math.prod(shape)
        block = torch.empty(nbytes + alignment, dtype=torch.uint8, pin_memory=True).numpy()
        start = (-block.ctypes.data) % alignment
        return block[start:start + nbytes].view(dtype).reshape(shape)
    return allocate

