# target.pxi: the installed JAX as the core reads it, one object (JaxTarget): its
# devices, what its DLPack import takes (probed once by dlinspect._jaxcaps, which
# builds it and hands it over), its narrowing with x64 off, its zero-copy alignment,
# and the caches of its abstract values and shardings. The decision (needs.pxi) and
# every route read it; nothing here decides.

cdef enum:
    _RECENT_AVALS = 8


ctypedef struct _AvalSlot:
    PyObject* aval      # a reference owned by the JaxTarget, or NULL
    PyObject* descr     # the NumPy dtype (a reference owned too)
    int32_t ndim
    int64_t shape[_INLINE_NDIM]


@cython.final
cdef class JaxTarget:
    """The installed JAX, as the decision and every route read it: the one object.

    Built once per process by ``dlinspect._jaxcaps``, whose probes and private symbols
    each attribute comes from (``dlinspect doctor`` reports how each was resolved);
    everything is given as keywords.

    Attributes
    ----------
    jax, jnp : module
    import_fn : callable
        ``import_fn(capsule, device, stream, copy, dl_device_type)`` imports a "dltensor"
        capsule: jaxlib's own function where ``direct``, else the public API's.
    cpu_device : jax.Device
        Where kDLCPU:0 memory is imported.
    cpu_align, copy_align : int
        The alignment in bytes (a power of two) at which XLA:CPU views memory without a
        copy (probed); dlinspect's copies are aligned to it, to at least 64 bytes, and to
        ``put_align``.
    x64, x64_context
        ``x64.value``: ``jax_enable_x64`` as the calling thread sees it; ``x64_context(on)``
        sets it for the calling thread (a worker converts under its caller's mode), or None.
    devices, cpu_keys, platforms
        ``(device_type, device_id)`` to ``jax.Device`` for every DLPack device this JAX
        has; the keys of CPU devices; the platforms this process can address.
    probe, hold : callable
        ``probe(code, bits)``/``hold(code, bits)``: None if JAX's DLPack import takes one
        lane of that dtype / JAX holds it from NumPy (asked only where the import refuses
        it), else the reason; each asked once per dtype.
    narrow : dict
        ``code | bits << 8`` of a 64-bit dtype to that of the dtype JAX narrows it to with
        x64 off and the DLInspectWarning text.
    warn, stream_for, array_type
        ``warn(text)``: a DLInspectWarning at the caller's line; ``stream_for(device_type,
        device_id)``: the ``stream`` for ``__dlpack__`` of CUDA/ROCm memory;
        ``jax.Array``'s concrete type, whose objects are not exported at all.
    permuted_ok, unit_strides_ok : bool
        JAX computes right with a permuted dense layout (jaxlib < 0.8 reads it as
        row-major), or with extent-1 axes of other strides than row-major ones (jaxlib
        0.4.30 infers a layout its jit refuses), imported without a copy (probed).
    assemble, uncommit, row_major : callable
        ``assemble(shape, sharding, devices, arrays)``: one sharded array from
        single-device arrays in the order of ``devices``; ``uncommit(array)``: the DLPack
        import's committed array, uncommitted (as it is where this JAX cannot);
        ``row_major(array)``: a committed array is in JAX's default layout (True where
        this JAX does not say).
    put, put_align, make_aval, make_single
        jaxlib's batched put, ``put(aval, sharding, arrays, devices, committed)`` (what
        ``jax.device_put`` calls; None where a probe finds it does not view aligned
        row-major memory in place or gives another array, or the public API is forced),
        the alignment it views at, ``make_aval(shape, dtype, sharding=None)`` and
        ``make_single(device)`` (both cached here).
    """
    cdef readonly object jax, jnp, import_fn, cpu_device, x64, x64_context, warn
    cdef readonly object stream_for, array_type, platforms, assemble, put, uncommit, row_major
    cdef readonly bint permuted_ok, unit_strides_ok, direct
    cdef readonly uintptr_t cpu_align, copy_align, put_align
    cdef object probe, hold, make_aval, make_single
    cdef dict devices, narrow, bad, _avals, _singles
    # The last few abstract values asked for, by shape and dtype, in C (a loader sends the
    # same shapes every step): asked before the dict, which holds the rest.
    cdef _AvalSlot _recent[_RECENT_AVALS]
    cdef int _next_slot
    cdef set cpu_keys
    # What each dtype probe found, by ``code | bits << 8 | held << 16``: 0 not asked
    # yet, 1 taken, 2 refused (reason in ``bad``). A table, not a set: the hot path
    # asks it for every tensor.
    cdef uint8_t _known[1 << 17]

    def __init__(self, *, jax, jnp, import_fn, bint direct, cpu_device, uintptr_t cpu_align,
                 x64, x64_context, dict devices, platforms, set cpu_keys, probe, hold,
                 dict narrow, warn, stream_for, array_type, bint permuted_ok, assemble,
                 put=None, uintptr_t put_align=64, make_aval=None, make_single=None,
                 uncommit=None, bint unit_strides_ok=True, row_major=None):
        for name, align in (("cpu_align", cpu_align), ("put_align", put_align)):
            if align == 0 or (align & (align - 1)) != 0:
                raise ValueError(f"{name} must be a power of two, not {align}")
        self.jax = jax
        self.jnp = jnp
        self.import_fn = import_fn
        self.direct = direct
        self.cpu_device = cpu_device
        self.cpu_align = cpu_align
        self.copy_align = cpu_align if cpu_align > 64 else 64
        self.x64 = x64
        self.x64_context = x64_context
        self.devices = devices
        self.platforms = frozenset(platforms)
        self.cpu_keys = cpu_keys
        self.probe = probe
        self.hold = hold
        self.narrow = narrow
        self.warn = warn
        self.stream_for = stream_for
        self.array_type = array_type
        self.permuted_ok = permuted_ok
        self.unit_strides_ok = unit_strides_ok
        self.assemble = assemble
        self.put = put if make_aval is not None and make_single is not None else None
        self.put_align = put_align
        self.make_aval = make_aval
        self.make_single = make_single
        self.uncommit = uncommit if uncommit is not None else _same
        self.row_major = row_major if row_major is not None else lambda arr: True
        if self.put is not None and put_align > self.copy_align:
            self.copy_align = put_align
        memset(self._known, 0, sizeof(self._known))
        self.bad = {}
        self._avals = {}
        self._singles = {}

    def __dealloc__(self):
        cdef int i
        for i in range(_RECENT_AVALS):
            Py_XDECREF(self._recent[i].aval)
            Py_XDECREF(self._recent[i].descr)

    cdef object aval(self, int32_t ndim, const int64_t* shape, object descr):
        """The abstract value of a host array of ``shape`` (``ndim`` extents) and NumPy
        dtype ``descr`` (cached: the last few in C, the rest in a dict)."""
        cdef int i
        cdef _AvalSlot* slot
        if ndim <= _INLINE_NDIM:
            for i in range(_RECENT_AVALS):
                slot = &self._recent[i]
                if (slot.aval != NULL and slot.ndim == ndim and slot.descr == <PyObject*>descr
                        and memcmp(slot.shape, shape, ndim * sizeof(int64_t)) == 0):
                    return <object>slot.aval
        got = self.sharded_aval(tuple([shape[i] for i in range(ndim)]), descr, None)
        cdef PyObject* old_aval
        cdef PyObject* old_descr
        if ndim <= _INLINE_NDIM:
            slot = &self._recent[self._next_slot]
            self._next_slot = (self._next_slot + 1) % _RECENT_AVALS
            old_aval, old_descr = slot.aval, slot.descr
            Py_INCREF(got)
            Py_INCREF(descr)
            slot.aval = <PyObject*>got
            slot.descr = <PyObject*>descr
            slot.ndim = ndim
            memcpy(slot.shape, shape, ndim * sizeof(int64_t))
            # The slot is whole before anything is let go of (another thread may read it).
            Py_XDECREF(old_aval)
            Py_XDECREF(old_descr)
        return got

    cdef object sharded_aval(self, tuple shape, object descr, sharding):
        """The abstract value ``jax.device_put`` gives an array of ``shape`` and ``descr``
        put over ``sharding`` (its mesh included; None: one device), cached."""
        key = (shape, descr, sharding)
        got = self._avals.get(key)
        if got is None:
            if len(self._avals) >= 1024:
                self._avals.clear()
            got = self._avals[key] = self.make_aval(shape, descr, sharding)
        return got

    cdef object single(self, device):
        """``device``'s SingleDeviceSharding (cached)."""
        got = self._singles.get(device)
        if got is None:
            got = self._singles[device] = self.make_single(device)
        return got

    cdef bint _dtype_ok(self, int code, int bits, bint held=False) except -1:
        # held: JAX holds the (sub-byte) dtype as an array, not through DLPack.
        cdef int key = (code & 0xFF) | ((bits & 0xFF) << 8) | ((held != 0) << 16)
        if self._known[key]:
            return self._known[key] == 1
        reason = (self.hold if held else self.probe)(code, bits)
        if reason is None:
            self._known[key] = 1
            return True
        self.bad[key] = reason
        self._known[key] = 2
        return False

    def dtype_problem(self, int code, int bits, bint held=False):
        """None if JAX's DLPack import takes one lane of ``(code, bits)`` (``held``:
        if JAX holds that dtype from NumPy); else the reason."""
        if self._dtype_ok(code, bits, held):
            return None
        return self.bad[code | (bits << 8) | (held << 16)]

    def device_for(self, int device_type, int device_id):
        """The ``jax.Device`` JAX imports this DLPack device's memory onto, or None."""
        return self.devices.get((device_type, device_id))

    def refuse_device(self, x, int device_type, int device_id):
        """``fallback="raise"``'s judgement of a producer's device before it is asked to
        export (``__dlpack_device__``'s answer): an UnsupportedDeviceError naming the
        device where JAX has no device for it and the memory is not host memory."""
        if ((device_type == kDLCPU and device_id == 0) or (device_type, device_id) in self.devices
                or _host_accessible(device_type)):
            return
        raise UnsupportedDeviceError(_words().not_asked(x, device_type, device_id,
                                                        self.platforms))

    def narrowing(self, int code, int bits):
        """``(code, bits, warning)`` JAX narrows this 64-bit dtype to with x64 off, or None."""
        got = self.narrow.get(code | (bits << 8))
        return None if got is None else (got[0] & 0xFF, got[0] >> 8, got[1])


def _same(arr):
    return arr
