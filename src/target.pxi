# target.pxi: the installed JAX as the core reads it (JaxTarget, built by dlinspect._jaxcaps).

cdef enum:
    _RECENT_AVALS = 8


ctypedef struct _AvalSlot:
    PyObject* aval      # a reference owned by the JaxTarget, or NULL
    PyObject* descr     # the NumPy dtype (a reference owned too)
    int32_t ndim
    int64_t shape[_INLINE_NDIM]


@cython.final
cdef class JaxTarget:
    """The installed JAX, built once per process by ``dlinspect._jaxcaps.JaxCaps.target``,
    whose docstrings say what each keyword is (``dlinspect doctor``: how each was resolved).
    ``put``, jaxlib's batched put: None where it does not view aligned row-major memory."""
    cdef readonly object jax, jnp, import_fn, cpu_device, x64, warn, default_device
    cdef readonly object stream_for, array_type, platforms, assemble, put, uncommit, row_major
    cdef readonly bint permuted_ok, unit_strides_ok, direct
    cdef readonly uintptr_t cpu_align, copy_align, put_align
    cdef object probe, hold, make_aval, make_single, _cpu_single
    cdef dict devices, narrow, bad, _avals, _singles
    # The last few abstract values, in C (a loader sends the same shapes), asked before the dict.
    cdef _AvalSlot _recent[_RECENT_AVALS]
    cdef int _next_slot
    cdef set cpu_keys
    # Each dtype probe's answer by ``code | bits << 8 | held << 16`` (0 not asked, 1 taken,
    # 2 refused: reason in ``bad``); a table, not a set: the hot path asks it for every tensor.
    # (All 0 to start: a new object's memory is zeroed.)
    cdef uint8_t _known[1 << 17]

    def __init__(self, *, jax, jnp, import_fn, bint direct, cpu_device, uintptr_t cpu_align,
                 x64, dict devices, platforms, set cpu_keys, probe, hold,
                 dict narrow, warn, stream_for, array_type, bint permuted_ok, assemble,
                 put=None, uintptr_t put_align=64, make_aval=None, make_single=None,
                 uncommit=None, bint unit_strides_ok=True, row_major=None, default_device=None):
        for name, align in (("cpu_align", cpu_align), ("put_align", put_align)):
            if not align or align & (align - 1):
                raise ValueError(f"{name} must be a power of two, not {align}")
        self.jax = jax
        self.jnp = jnp
        self.import_fn = import_fn
        self.direct = direct
        self.cpu_device = cpu_device
        self.cpu_align = cpu_align
        self.default_device = default_device
        self.x64 = x64
        self.devices = devices
        self.cpu_keys = cpu_keys
        self.platforms = frozenset(platforms)
        self.probe = probe
        self.hold = hold
        self.narrow = narrow
        self.warn = warn
        self.stream_for = stream_for
        self.array_type = array_type
        self.assemble = assemble
        self.permuted_ok = permuted_ok
        self.unit_strides_ok = unit_strides_ok
        self.put = put if make_aval and make_single else None
        self.put_align = put_align
        self.make_aval = make_aval
        self.make_single = make_single
        self.uncommit = uncommit or _same
        self.row_major = row_major or (lambda arr: True)
        self.copy_align = max(cpu_align, 64, put_align if self.put else 0)
        self.bad = {}
        self._avals = {}
        self._singles = {}

    cdef send(self, aval, sharding, list xs, list devices, bint committed):
        """``put`` as an explicit transfer, as jax.device_put's is: where jax.transfer_guard
        refuses it as implicit ("disallow"), the same arrays are put again as explicit (a
        guard that refuses explicit transfers too then refuses it still)."""
        try:
            return self.put(aval, sharding, xs, devices, committed)
        except Exception as exc:
            if "Disallowed host-to-device transfer" not in str(exc):
                raise
        with _sys.modules["jax._src.config"].explicit_device_put_scope():
            return self.put(aval, sharding, xs, devices, committed)

    def __dealloc__(self):
        cdef int i
        for i in range(_RECENT_AVALS):
            Py_XDECREF(self._recent[i].aval)
            Py_XDECREF(self._recent[i].descr)

    cdef aval(self, int32_t ndim, const int64_t* shape, descr):
        """The abstract value of a host array (cached: the last few in C, the rest in a dict)."""
        cdef int i
        cdef _AvalSlot* slot
        if ndim <= _INLINE_NDIM:
            for i in range(_RECENT_AVALS):
                slot = &self._recent[i]   # (an empty one's descr: NULL, never an object's)
                if (slot.ndim == ndim and slot.descr == <PyObject*>descr
                        and memcmp(slot.shape, shape, ndim * sizeof(int64_t)) == 0):
                    return <object>slot.aval
        got = self.sharded_aval(tuple([shape[i] for i in range(ndim)]), descr, None)
        cdef PyObject *old_aval, *old_descr
        if ndim <= _INLINE_NDIM:
            slot = &self._recent[self._next_slot]
            self._next_slot = (self._next_slot + 1) % _RECENT_AVALS
            old_aval = slot.aval
            old_descr = slot.descr
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

    cdef sharded_aval(self, tuple shape, descr, sharding):
        """``jax.device_put``'s abstract value over ``sharding`` (None: one device), cached."""
        key = (shape, descr, sharding)
        got = self._avals.get(key)
        if got is None:
            got = self.make_aval(shape, descr, sharding)
            _remember(self._avals, key, got, 1024)
        return got

    cdef device_of(self, TensorInfo info):
        """The JAX device of ``info``'s memory; the CPU device where JAX has none for it
        (host memory: Need.VIA_CPU)."""
        return self.devices.get((info._dev_type, info.device_id)) or self.cpu_device

    cdef single(self, device):
        if device is self.cpu_device and self._cpu_single is not None:   # (the hot path's)
            return self._cpu_single
        got = self._singles.get(device)
        if got is None:
            got = self._singles[device] = self.make_single(device)
            if device is self.cpu_device:
                self._cpu_single = got
        return got

    cdef bint _dtype_ok(self, int code, int bits, bint held=False) except -1:
        # held: JAX holds the (sub-byte) dtype as an array, not through DLPack.
        cdef int key = (code & 0xFF) | ((bits & 0xFF) << 8) | held << 16
        if self._known[key]:
            return self._known[key] == 1
        reason = (self.hold if held else self.probe)(code, bits)
        if reason is not None:
            self.bad[key] = reason
        self._known[key] = 1 if reason is None else 2
        return reason is None

    def dtype_problem(self, int code, int bits, bint held=False):
        """None where JAX imports one lane of ``(code, bits)`` (``held``: holds it); else why."""
        return None if self._dtype_ok(code, bits, held) else self.bad[code | bits << 8 | held << 16]

    def refuse_device(self, x, int device_type, int device_id):
        """``fallback="raise"``: UnsupportedDeviceError before the export for a device JAX lacks."""
        if _dev_is(device_type, _DEV_HOST) or (device_type, device_id) in self.devices:
            return
        raise UnsupportedDeviceError(_words.not_asked(x, device_type, device_id, self.platforms))

def _same(arr):
    return arr
