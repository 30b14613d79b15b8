# tables.pxi: C-speed forms of dlinspect._tables' rows: device bits, NumPy dtypes cached.

from dlinspect._tables import (
    DEVICES, NUMPY_MAX_NDIM, DLDataType, Need, as_device_type, device_name, dldtype_from_numpy,
    dtype_name, numpy_dtype,
)

# The rows' booleans as bits per DLDeviceType below 64, for the C paths.
cdef enum:
    _DEV_HOST = 1
    _DEV_PINNED = 2
    _DEV_STREAM = 4
cdef uint8_t _DEVICE_BITS[64]   # (static C arrays: zeros where no row says otherwise)
cdef int _DEFAULT_STREAM[64]
for _value, _row in DEVICES.items():
    _DEVICE_BITS[_value] = _DEV_HOST * _row.host | _DEV_PINNED * _row.pinned | _DEV_STREAM * _row.stream
    _DEFAULT_STREAM[_value] = _row.default_stream
del _value, _row


cdef inline bint _dev_is(int32_t device_type, int bit) noexcept nogil:
    return 0 <= device_type < 64 and (_DEVICE_BITS[device_type] & bit) != 0


def stream_of(int device_type, jax_device):
    """``__dlpack__``'s ``stream`` for memory bound for ``jax_device``: None where it takes none,
    else the one JAX waits on, 0 made ``default_stream`` (CUDA forbids 0; 1: legacy default)."""
    if not _dev_is(device_type, _DEV_STREAM) or jax_device is None:
        return None
    try:
        stream = jax_device.get_stream_for_external_ready_events()
    except Exception:
        return None
    return _DEFAULT_STREAM[device_type] if stream == 0 else int(stream)


# numpy_dtype's answers by ``code | bits << 8``, borrowed from _tables' cache (never emptied).
cdef PyObject* _numpy_by_key[1 << 16]


cdef inline _numpy_dtype(int code, int bits):
    cdef int key = (code & 0xFF) | ((bits & 0xFF) << 8)
    cdef PyObject* got = _numpy_by_key[key]
    if got != NULL:
        return <object>got
    found = numpy_dtype(code, bits)
    _numpy_by_key[key] = <PyObject*>found
    return found
