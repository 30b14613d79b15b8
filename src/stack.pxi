# Batches born where JAX can view them: dlinspect.stack writes each batched leaf once,
# into memory aligned as XLA:CPU needs to view it (a loader's np.stack gives malloc's
# 16 bytes, and every such batch is then copied a second time on its way into JAX), or,
# for a GPU, into page-locked (pinned) host memory, which the GPU copies from directly.

def stack(elements, *, Py_ssize_t alignment=0, bint pinned=False):
    """Stack same-structured pytrees of arrays into one batch whose leaves JAX views.

    What ``np.stack`` does leaf by leaf (grain's batching, torch's ``collate_fn``),
    with each batched leaf written once, by NumPy, into memory aligned as XLA:CPU
    needs to import it without a copy: ``to_jax`` (and ``jax.device_put``) of the
    batch then copies nothing on CPU where ``np.stack``'s batches are copied again
    wherever ``malloc`` gave less than 64-byte alignment.

    Parameters
    ----------
    elements : sequence of pytrees
        ``n >= 1`` elements with the same ``jax.tree_util`` structure; the leaves at
        one position are arrays (or anything ``numpy.asarray`` takes: tensors, scalars,
        strings) of one shape.
    alignment : int, keyword-only
        In bytes, a power of two. 0 (the default): what this JAX's CPU import needs
        where it was already probed in this process, else 64 (XLA:CPU's; nothing is
        probed, so that a loader's worker processes do not start JAX backends).
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
        The structure of the elements; each leaf a C-contiguous ``numpy.ndarray`` of
        shape ``(n,) + leaf.shape`` (elements) and ``np.stack``'s dtype and values,
        ``alignment``-byte aligned and writable. Leaves of object dtype are
        ``np.stack``'s own (they hold references, not values JAX could view).

    Raises
    ------
    StackError
        No elements, elements of different structures (naming the first that
        differs and both structures), or leaves of different shapes (naming the key
        path, the element and both shapes). A ``ValueError``, as ``np.stack`` raises.
    ValueError
        ``alignment`` is not 0 or a power of two.
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
    if alignment < 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be 0 or a power of two (bytes), not {alignment}")
    cdef Py_ssize_t align = alignment or (_TARGET.copy_align if _TARGET is not None else 64)
    allocate = _pinned_allocator() if pinned else aligned_empty
    tree_util = _options_module.jax_module("jax.tree_util")
    items = list(elements)
    if not items:
        raise StackError("dlinspect.stack was given no elements, and a batch needs at least "
                         "one. To fix: pass a non-empty sequence of elements.")
    first, treedef = tree_util.tree_flatten(items[0])
    columns = [[leaf] for leaf in first]
    cdef Py_ssize_t k, j
    for k in range(1, len(items)):
        leaves, other = tree_util.tree_flatten(items[k])
        if other != treedef:
            raise StackError(
                f"element {k} of the elements to stack has the structure {other}, and "
                f"element 0 {treedef}; a batch stacks leaves position by position, so every "
                f"element needs the same structure. To fix: give every element the same "
                f"keys and nesting (fill what an element lacks before batching).")
        for j in range(len(leaves)):
            columns[j].append(leaves[j])
    paths = None
    out = []
    for j in range(len(columns)):
        try:
            out.append(_stack_leaf(columns[j], align, allocate))
        except _StackShapes as exc:
            if paths is None:
                paths = [p for p, _ in tree_util.tree_flatten_with_path(items[0])[0]]
            k, shape, shape0 = exc.args
            where = tree_util.keystr(tuple(paths[j]))
            raise StackError(
                f"{where + ': ' if where else ''}element {k} has shape {shape} there, "
                f"and element 0 {shape0}; np.stack stacks arrays of one shape. To fix: pad "
                f"or crop the examples to one shape before batching (or batch them as a "
                f"list).") from None
    return tree_util.tree_unflatten(treedef, out)


class _StackShapes(Exception):
    """(element index, its shape, element 0's shape): words added with the key path."""


cdef object _stack_leaf(list column, Py_ssize_t align, allocate):
    arrays = [_np.asanyarray(x) for x in column]
    a0 = arrays[0]
    shape0, dt = a0.shape, a0.dtype
    cdef bint same = True
    cdef Py_ssize_t k
    for k in range(1, len(arrays)):
        a = arrays[k]
        if a.shape != shape0:
            raise _StackShapes(k, a.shape, shape0)
        if a.dtype != dt:
            same = False
    if not same:   # np.stack's own dtype rule, then one copy into aligned memory
        joined = _np.stack(arrays)
        if joined.dtype.hasobject:
            return joined
        out = allocate(joined.shape, joined.dtype, align)
        _np.copyto(out, joined)
        return out
    if dt.hasobject:
        return _np.stack(arrays)
    out = allocate((len(arrays),) + shape0, dt, align)
    _np.stack(arrays, out=out)
    return out


def _pinned_allocator():
    """``allocate(shape, dtype, alignment)``: an uninitialised C-ordered NumPy array in
    page-locked host memory from torch's CUDA host allocator, ``alignment``-byte
    aligned; or UnsupportedDeviceError where torch has no CUDA device."""
    try:
        import torch
        ready = torch.cuda.is_available()
    except ImportError:
        torch, ready = None, False
    if not ready:
        raise UnsupportedDeviceError(
            "dlinspect.stack(pinned=True) writes the batch into page-locked host memory "
            "from torch's CUDA host allocator, and " + (
                "torch is not installed here" if torch is None else
                "torch has no CUDA device here (torch.cuda.is_available() is False)") +
            ", so no pinned memory can be allocated. To fix: pinned=False (the default) "
            "where there is no GPU; pinned memory only speeds up copies to one.")

    def allocate(shape, dtype, Py_ssize_t alignment):
        dt = _np_dtype(dtype)
        nbytes = dt.itemsize
        for extent in shape:
            nbytes *= extent
        block = torch.empty(nbytes + alignment, dtype=torch.uint8, pin_memory=True).numpy()
        start = (-block.ctypes.data) % alignment
        return block[start:start + nbytes].view(dt).reshape(shape)
    return allocate
