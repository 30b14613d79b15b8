# report.pxi: what a loader's conversions copied, per key path, and why (LoaderReport).

#: Batches a loader converts before its report looks for a copy made in every one.
ADVISE_AFTER = 8
#: Bytes per batch below which a leaf's copy is not worth a warning (cheaper than the call).
ADVISE_MIN_BYTES = 64 * 1024

# The Need bits a copy can come from, in the words of the report.
cdef tuple _REASONS = (
    (NEED_DEVICE, "foreign device"), (NEED_DTYPE | NEED_NUMPY_PUT | NEED_PACKED, "dtype"),
    (NEED_LANES, "vector lanes"), (NEED_LAYOUT, "strides"), (NEED_PERMUTED, "permuted order"),
    (NEED_READ_ONLY, "read-only"), (NEED_ALIGN, "alignment"), (NEED_NARROW, "narrowing"),
    (NEED_ALIASED, "aliased"),
)
# Why a copy with one reason is made, and what removes it, where the user can.
cdef dict _REMEDIES = {
    "alignment": ("its memory is not aligned as XLA:CPU needs to view it",
                  "make the batches with dlinspect.stack, which writes them where JAX views "
                  "them (grain: .batch(n, batch_fn=dlinspect.stack); a torch DataLoader "
                  "without workers: collate_fn=dlinspect.stack)"),
    "read-only": ("its memory is read-only and JAX arrays are writable (by donation)",
                  'pass readonly="share" where the producer never rewrites a batch it has '
                  'handed over (Ray, tf.data\'s as_numpy_iterator(), pyarrow): see '
                  'to_jax\'s readonly'),
    "strides": ("its strides are not ones JAX can view",
                "make each batch contiguous where it is made (np.ascontiguousarray, "
                "t.contiguous()): the copy is then made once there, or not at all"),
    "aliased": ("something besides the batch holds its memory (a buffer the source refills, "
                "a ring of them, another array or tensor over it) or the batch itself (a "
                "wrapping generator such as tqdm's, a tuple enumerate or zip keeps), so a view "
                "might change after the handover",
                "hand the loader to prefetch_to_jax itself (progress=True for a progress bar), "
                "from a source that puts every batch in new memory (np.stack, torch's default "
                "collate, dlinspect.stack) and keeps no reference to it; or, where the source "
                "never writes a batch it has handed over, pass copy=False"),
    "permuted order": ("its memory is in a permuted (transposed) order and JAX arrays are "
                       "row-major",
                       "convert the row-major batch and permute it in JAX, inside the jitted "
                       "step (jnp.transpose), where XLA fuses it"),
}


cdef str _copy_reason(uint32_t needs, bint forced):
    """The reasons a leaf with ``needs`` is copied, joined ("alignment, narrowing"), or None."""
    words = ["copy=True"] if forced else []
    if needs & NEED_DEVICE:    # a host copy whatever the memory's layout
        needs &= NEED_DEVICE | NEED_NARROW | NEED_DTYPE
    if needs & (NEED_LAYOUT | NEED_PERMUTED):   # gathered: its start's alignment and its
        needs &= ~(NEED_ALIGN | NEED_READ_ONLY)   # flag are moot
    words += [word for bits, word in _REASONS if needs & bits]
    return ", ".join(words) or None


def route_reason(Route route, bint forced):
    """Why ``route`` copies, in a loader report's words ("alignment, aliased"), or None: it
    copies nothing (``forced``: copy=True was asked for)."""
    if not route.copy_bytes:
        return None
    if route.action is NUMPY_COPY:
        return "byte order or byte strides"
    # A route without a header names no need (a jax.Array's); where none is named (but
    # copy=True): moved to another device, or spread over a sharding's devices.
    reason = _copy_reason(route._needs, forced)
    return reason or ("sharding" if route.jax_device is None else "device move")


cdef class LoaderReport:
    """What a loader's conversions imported zero-copy and what they copied, and why,
    per key path, over the current epoch: ``PrefetchLoader.report``.

    Counts the bytes of each tensor leaf as its route found them (the source's bytes,
    as ``Route.copy_bytes`` counts them): imported zero-copy, or copied for its reasons
    (``"alignment"``, ``"read-only"``, ``"narrowing"``, ``"strides"``, ``"permuted
    order"``, ``"foreign device"``, ``"dtype"``, ``"copy=True"``, ``"aliased"``: memory the
    batch is not proven to own, see :class:`~dlinspect.Need`; several joined with ", "
    where one copy serves them all).
    ``prefetch_to_jax`` counts a batch once it is handed to the user (batches converted
    ahead and never asked for do not count), each
    epoch in a report of its own; ``dlinspect.grain.device_put`` counts an element once
    it is converted; a failed batch not at all. ``str(report)`` is a table, :meth:`as_dict`
    the same figures. What a recipe copied before dlinspect saw the batch (``stack`` of
    Arrow data, say) is the recipe's, not the report's.

    After the first ``ADVISE_AFTER`` (8) batches of an epoch, a leaf copied in every one
    of them only for reasons the user can remove (alignment, read-only, strides, a
    permuted order, aliased memory: one, or several together, as memory-mapped read-only batches at a
    small alignment are), of at least ``ADVISE_MIN_BYTES`` (64 KiB) a batch, gets one
    ``DLInspectWarning`` per loader, naming the fix of each reason.

    Attributes
    ----------
    batches : int
        Batches counted this epoch.

    Notes
    -----
    A loader makes its own: ``LoaderReport(at_delivery=True)`` counts a converted batch
    only when the loader says it was handed over, the default as soon as it is converted.
    """

    cdef public Py_ssize_t batches
    cdef dict _leaves     # key path -> [batches, zero-copy bytes, {reason: [bytes, batches]}]
    # _pending: (part, leaf index in it, bytes, reason or None) of the batch; _staged:
    # converted batches' rows (key, bytes, reason), not yet handed over.
    cdef list _pending, _staged
    cdef bint _warned, _at_delivery

    def __init__(self, *, bint at_delivery=False):
        self.new_epoch()
        self._at_delivery = at_delivery

    def new_epoch(self):
        """Start the counts again (a new epoch); the one warning stays given."""
        self.batches = 0
        self._leaves = {}
        self._pending = []
        self._staged = []

    def _next_epoch(self):
        """A new report for the loader's next epoch (one still running counts into its own)."""
        cdef LoaderReport nxt = LoaderReport(at_delivery=self._at_delivery)
        nxt._warned = self._warned
        return nxt

    def _delivered(self):
        """The oldest converted batch was handed to the user: count it."""
        if self._staged:
            self._count(self._staged.pop(0))

    cdef int _note(self, Py_ssize_t k, Py_ssize_t i, route, info, uint32_t needs,
                   bint forced) except -1:
        """Leaf ``i`` of the batch's part ``k``: copied where its route copies (``forced``:
        copy=True); without a route (the fast path's, a split viewed again): where ``needs``
        asks for anything but a view."""
        # (``info`` is the route's; None: NumPy memory DLPack cannot describe, or a jax.Array)
        reason = _copy_reason(needs, False) if route is None else route_reason(route, forced)
        self._pending.append((k, i, route.copy_bytes if info is None else info.nbytes, reason))
        return 0

    cdef int _end(self, path) except -1:
        """The batch converted (``path(k, i)``: leaf ``i`` of part ``k``'s key path): counted
        now, or when it is handed over (``at_delivery``)."""
        rows = [(path(k, i), nbytes, reason) for k, i, nbytes, reason in self._pending]
        self._pending = []
        if self._at_delivery:
            self._staged.append(rows)
        else:
            self._count(rows)
        return 0

    cdef int _count(self, list rows) except -1:
        for key, nbytes, reason in rows:
            entry = self._leaves.setdefault(key, [0, 0, {}])
            entry[0] += 1
            if reason is None:
                entry[1] += nbytes
            else:
                got = entry[2].setdefault(reason, [0, 0])
                got[0] += nbytes
                got[1] += 1
        self.batches += 1
        if not self._warned and self.batches == ADVISE_AFTER:
            text = self._advice()
            if text is not None:
                self._warned = True
                warn(text)
        return 0

    cdef _advice(self):
        """The one warning: the first leaf copied in every batch, ADVISE_MIN_BYTES a batch or
        more, for reasons the user can all remove; each reason's fix named."""
        for key, (n, _, copied) in self._leaves.items():
            times = sum(t for _, t in copied.values())
            nbytes = sum(b for b, _ in copied.values())
            if times != self.batches or nbytes // times < ADVISE_MIN_BYTES:
                continue
            reasons = list(dict.fromkeys(part for joined in copied
                                         for part in joined.split(", ")))
            if not all(reason in _REMEDIES for reason in reasons):
                continue
            why = "; ".join(_REMEDIES[reason][0] for reason in reasons)
            fix = "; and ".join(_REMEDIES[reason][1] for reason in reasons)
            return (f"{key or 'the batch'}: copied in every one of the first "
                    f"{self.batches} batches of the epoch ({nbytes // times} bytes each): "
                    f"{why}. To fix: {fix}. (One warning per loader; loader.report counts "
                    f"every leaf.)")
        return None

    def as_dict(self):
        """``{key path: {"batches": n, "zero_copy_bytes": b, "copied_bytes": {reason: b}}}``
        (bytes in total over the epoch; the key path as ``jax.tree_util.keystr`` writes
        it, "" for a batch that is one tensor)."""
        return {key: {"batches": n, "zero_copy_bytes": zero,
                      "copied_bytes": {r: b for r, (b, _) in copied.items()}}
                for key, (n, zero, copied) in self._leaves.items()}

    def __str__(self):
        rows = [("leaf", "batches (this epoch)", "zero-copy bytes", "copied bytes (why)")]
        for key, (n, zero, copied) in sorted(self._leaves.items()):
            why = "; ".join(f"{b} ({r})" for r, (b, _) in copied.items()) or "0"
            rows.append((key or "(the batch)", str(n), str(zero), why))
        widths = [max(len(r[c]) for r in rows) for c in range(3)] + [0]   # (the last as it is)
        return "\n".join("  ".join(map(str.ljust, r, widths)) for r in rows)

    def __repr__(self):
        return f"<LoaderReport of {self.batches} batches, {len(self._leaves)} leaves>"
