# put.pxi: host memory into JAX through jaxlib's batched put (jax.device_put's own call),
# else the DLPack import. The array is committed exactly where the caller named a device or
# a sharding (jax.device_put's rule), else uncommitted as jnp.asarray's (JaxTarget.uncommit),
# so that a jitted function fed both compiles once.

from cpython.object cimport PyTypeObject
import atexit as _atexit

cdef extern from "numpy/arrayobject.h":
    # (numpy's own .pxd leaves it out) Steals a reference to ``descr``.
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.dtype descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)

cnp.import_array()


cdef class _Block:
    """Owns one ``malloc``'d block (dlinspect's copy), freed with the last array over it."""
    cdef void* ptr

    def __dealloc__(self):
        free(self.ptr)


# contract: a NumPy array of ``descr`` over ``data`` (strides in elements; NULL: row-major,
# as NumPy writes them), kept by ``base``.
cdef _ndarray(base, void* data, int32_t ndim, const int64_t* shape,
              const int64_t* strides, int64_t itemsize, cnp.dtype descr, bint writeable):
    cdef cnp.npy_intp dims[_MAX_NDIM], steps[_MAX_NDIM]
    cdef int32_t i
    for i in range(ndim):
        dims[i] = <cnp.npy_intp>shape[i]
        # An extent-1 dimension may carry any stride (DLPack allows it): NumPy never
        # steps along it, and 0 keeps it within NumPy's range.
        if strides != NULL:
            steps[i] = 0 if shape[i] <= 1 else <cnp.npy_intp>(strides[i] * itemsize)
    Py_INCREF(descr)   # PyArray_NewFromDescr steals it
    arr = PyArray_NewFromDescr(<PyTypeObject*>cnp.ndarray, descr, ndim, dims,
                               steps if strides != NULL else NULL, data,
                               cnp.NPY_ARRAY_WRITEABLE if writeable else 0, NULL)
    cnp.set_array_base(arr, base)
    return arr


# A view of ``info``'s memory ``delta`` bytes on (a split viewed again), one lane an element.
cdef _view_of(owner, TensorInfo info, bint writeable, uintptr_t delta):
    return _ndarray(owner, <void*>(info._ptr() + delta), info.ndim, info._shape, info._strides,
                    info._bits // 8, _numpy_dtype(info._code, info._bits), writeable)


cdef _aligned_array(TensorInfo info, int dst_code, int dst_bits, uintptr_t align):
    """A new uninitialised row-major array, ``align``-aligned; AllocationError naming the bytes."""
    cdef size_t nbytes = <size_t>info.size * (dst_bits // 8)
    cdef _Block block = _Block.__new__(_Block)
    block.ptr = malloc(nbytes + align)
    if block.ptr == NULL:
        raise _words.allocation_error(nbytes, _words.describe(info), physical_memory())
    cdef char* data = <char*>block.ptr
    data += (align - (<uintptr_t>data & (align - 1))) & (align - 1)
    return _ndarray(block, data, info.ndim, info._shape, NULL, dst_bits // 8,
                    _numpy_dtype(dst_code, dst_bits), True)


cdef _copy_taken(cap, TensorInfo info, out, JaxTarget tg, device, bint committed):
    """Copy ``cap``'s memory into ``out`` and put that on ``device``: ``cap`` is taken before it
    is read (another thread would free it mid-copy), freed after, unconsumed after a failure."""
    owner = take(cap)
    try:
        _fill(out, info)
        arr = _put_host(tg, out, device, committed)
    except BaseException:
        _untake(owner, cap)
        raise
    del owner   # the producer's deleter runs here
    return arr


cdef struct _Half:   # the worker's part of one copy: dl_gather_part's arguments
    char* dst
    const char* src
    int ndim
    const int64_t* shape
    const int64_t* strides
    size_t size
    dl_copy_cast cast
    bint fresh


cdef struct _Worker:   # one C thread that copies the first half of a large copy
    _Half job
    # busy: held by the copy that uses the worker; go: released to hand the worker its job;
    # done: released by the worker when its half is written.
    PyThread_type_lock busy, go, done
    # pid: the process it was started in; failed_pid: a process where it could not be started
    # or was stopped (not tried again).
    long pid, failed_pid
    bint stop   # the job handed over is to end the thread (interpreter exit)


cdef _Worker _worker
_worker.pid = _worker.failed_pid = -1


def cgroup_cpus(str root="/sys/fs/cgroup"):
    """The CPUs the CPU quota of this process's cgroup allows (cgroup v2's ``cpu.max``, else
    v1's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), rounded up; None where none is set."""
    for names in (("cpu.max",), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        words = []   # (v2: quota and period in one file; v1: one file each)
        try:
            for name in names:
                with open(f"{root}/{name}") as f:
                    words += f.read().split()
        except (OSError, ValueError):
            continue
        if len(words) == 2 and words[0] not in ("max", "-1"):
            return max(1, -(-int(words[0]) // int(words[1])))
        return None
    return None


def copy_threads():
    """The threads a large copy runs on (1 or 2): ``DLINSPECT_COPY_THREADS`` where it is set
    to 1 or 2; else 2 where this process may use two CPUs or more (its CPU affinity and its
    cgroup's CPU quota), else 1."""
    asked = _os.environ.get("DLINSPECT_COPY_THREADS")
    if asked in ("1", "2"):
        return int(asked)
    cpus = len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else _os.cpu_count() or 1
    return 2 if min(cpus, cgroup_cpus() or cpus) >= 2 else 1


cdef int _COPY_THREADS = copy_threads()
dl_copy_init()   # (the last-level cache's size: from what size rows stream)


cdef void _worker_loop(void* unused) noexcept nogil:
    cdef _Half* job = &_worker.job
    while True:
        PyThread_acquire_lock(_worker.go, WAIT_LOCK)
        if _worker.stop:
            PyThread_release_lock(_worker.done)
            return
        dl_gather_part(job.dst, job.src, job.ndim, job.shape, job.strides, job.size, job.cast,
                       job.fresh, 0, 2)
        PyThread_release_lock(_worker.done)


cdef bint _worker_started():
    """Whether the worker runs in this process (started on first use, and again in a forked
    child, which inherits no thread); False: no thread or lock, and a copy runs whole."""
    cdef long pid = _os.getpid()
    if _worker.pid == pid or _worker.failed_pid == pid:
        return _worker.pid == pid
    cdef PyThread_type_lock locks[3]
    cdef int i
    for i in range(3):
        locks[i] = PyThread_allocate_lock()
    if locks[0] != NULL and locks[1] != NULL and locks[2] != NULL:
        PyThread_acquire_lock(locks[1], WAIT_LOCK)
        PyThread_acquire_lock(locks[2], WAIT_LOCK)
        _worker.busy, _worker.go, _worker.done = locks[0], locks[1], locks[2]
        _worker.stop = False
        if PyThread_start_new_thread(_worker_loop, NULL) != -1:
            _worker.pid = pid
            return True
    for i in range(3):   # no thread: the locks freed, and the copies of this process whole
        if locks[i] != NULL:
            PyThread_free_lock(locks[i])
    _worker.failed_pid = pid
    return False


def _stop_worker():
    """At interpreter exit: the worker (of this process) ends, after any copy in flight."""
    if _worker.pid != _os.getpid():
        return
    with nogil:
        PyThread_acquire_lock(_worker.busy, WAIT_LOCK)
        _worker.stop = True
        PyThread_release_lock(_worker.go)
        PyThread_acquire_lock(_worker.done, WAIT_LOCK)   # (it has left its loop)
    _worker.failed_pid, _worker.pid = _worker.pid, -1   # (not started again)


_atexit.register(_stop_worker)


cdef int _fill(out, TensorInfo info) except -1:
    """Copy ``info``'s host memory into ``out`` (row-major, its shape) in C without the GIL
    (include/dlinspect/copy.h): the bytes as they are, or narrowed as NumPy's unsafe cast and
    JAX's x64 mode do. From DL_COPY_PARALLEL_MIN bytes, with two threads (copy_threads), a
    worker thread copies one half of a transposing copy (dl_worth_two). The memory must be
    the caller's while this runs."""
    cdef char* dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef size_t dst_size = cnp.PyArray_ITEMSIZE(<cnp.ndarray>out)
    cdef size_t dst_bytes = <size_t>info.size * dst_size
    cdef size_t src_size = info._bits // 8
    cdef dl_copy_cast cast = DL_COPY_SAME
    if dst_size != src_size:   # x64 narrowing: 64-bit parts to 32-bit ones
        cast = (DL_COPY_F64_F32 if info._code == kDLComplex or info._code == kDLFloat
                else DL_COPY_U64_U32)
    cdef const char* src = <const char*>info._ptr()
    cdef bint halves = (dst_bytes >= DL_COPY_PARALLEL_MIN and _COPY_THREADS > 1
                        and dl_worth_two(info.ndim, info._shape, info._strides, src_size, cast)
                        and _worker_started() and PyThread_acquire_lock(_worker.busy, NOWAIT_LOCK))
    cdef bint fresh
    with nogil:   # (not halves: small, or the worker copies another thread's half)
        fresh = dl_fresh(dst, dst_bytes)
        dl_advise_huge(dst, dst_bytes)
        if halves:
            _worker.job = _Half(dst, src, info.ndim, info._shape, info._strides, src_size, cast,
                                fresh)
            PyThread_release_lock(_worker.go)
        dl_gather_part(dst, src, info.ndim, info._shape, info._strides, src_size, cast, fresh,
                       halves, 1 + halves)
        if halves:
            PyThread_acquire_lock(_worker.done, WAIT_LOCK)   # (its half written)
            PyThread_release_lock(_worker.busy)
    return 0


cdef inline bint _viewable_by_put(TensorInfo info, JaxTarget tg) noexcept:
    """Whether jaxlib's batched put views this host memory in place (else the DLPack import)."""
    return (tg.put is not None and info._lanes == 1 and info._bits % 8 == 0
            and info._contiguous(_C_ORDER) and not info._ptr() & (tg.put_align - 1))


cdef _put_host(JaxTarget tg, arr, device, bint committed, bint view=True):
    """A host array dlinspect holds into JAX: viewed (``view``) by the batched put or else the
    DLPack import; otherwise as ``jax.device_put`` takes it (sub-byte dtypes, empty arrays)."""
    cdef cnp.ndarray a = arr
    cdef int64_t dims[_MAX_NDIM]
    cdef int i
    view = view and getattr(device, "platform", "cpu") == "cpu"   # (an accelerator: a copy)
    if tg.put is not None and (not view or (
            cnp.PyArray_IS_C_CONTIGUOUS(a)
            and not <uintptr_t>cnp.PyArray_DATA(a) & (tg.put_align - 1))):
        for i in range(a.ndim):
            dims[i] = a.shape[i]
        return tg.send(tg.aval(a.ndim, dims, a.dtype), tg.single(device), [arr], [device], committed)
    if view:
        out = import_capsule(tg.import_fn, capsule_of(arr, not cnp.PyArray_ISWRITEABLE(a)),
                             device, None, None, kDLCPU)
    else:
        out = tg.jax.device_put(arr, device)
    return out if committed else tg.uncommit(out)


cdef _put_view(JaxTarget tg, cap, x, TensorInfo info):
    """Host memory that needs nothing, viewed uncommitted on JAX's CPU device: a NumPy array
    as it is (its export released now), other memory taken (its deleter runs when the last
    array over it dies)."""
    aval = tg.aval(info.ndim, info._shape, _numpy_dtype(info._code, info._bits))
    device = tg.cpu_device
    if type(x) is _np_ndarray:
        return tg.send(aval, tg.single(device), [x], [device], False)
    owner = take(cap)
    try:
        return tg.send(aval, tg.single(device),
                      [_view_of(owner, info,
                                info._flag(DLPACK_FLAG_BITMASK_READ_ONLY) is not True, 0)],
                      [device], False)
    except BaseException:
        _untake(owner, cap)   # a failed put consumes nothing
        raise
