# own.pxi: whether a batch owns its memory. Before anything is exported or taken, reference
# counts prove that nothing outside the batch (and the calling code's own variables) can
# write a tensor leaf's memory while a JAX array views it; a leaf not proven is copied
# (Need.ALIASED). A tensor given alone follows DLPack's consumer contract instead (the
# result shares its memory, as jax.dlpack.from_dlpack's does) and is not asked about here.
#
# What proves it, object by object from the batch down (containers, tensor leaves, the
# arrays a leaf's memory belongs to): its references are the slots of the batch that hold
# it, the caller's own references, and nothing else. The containers walked are the ones
# whose slots can be counted: dicts, lists and tuples (subclasses and namedtuples too), a
# UserDict's (transformers' BatchEncoding), a dataclass's or a SimpleNamespace's __dict__
# (the __dict__ counted too); a leaf inside any other container (a pytree node
# registered with JAX, another Mapping) or inside an object with a finalizer (__del__ may
# hand the memory back to a source as the batch dies) is not met, so not proven. A
# tensor with a finalizer is not proven either. For the memory:
# - NumPy: every array on the leaf's base chain is held only by the chain (or the caller),
#   and the chain ends in an array that owns its data; any other object on it (bytes, mmap,
#   memoryview, a capsule) proves nothing, but a torch tensor proven itself does (t.numpy()
#   where torch keeps the storage resizable; 2.13 marks it NumPy's: copied);
# - torch: its storage (and the one Python object torch keeps for it) is held by this tensor
#   alone and is torch's own allocation
#   (resizable, not shared) or shared host memory torch received from another process (a
#   DataLoader worker's batch); borrowed memory (from_numpy, from_dlpack, frombuffer), a
#   file's (from_file) and memory this process shares (share_memory_()) are none of these;
# - a subclass of either that overrides __dlpack__ (or torch's _base): nothing is proven,
#   its export may be another tensor's memory; any other producer, or a bare capsule: nothing.
# An object a weak reference reaches (weakref.ref, a WeakValueDictionary) proves nothing:
# whoever holds the reference gets the object back while the batch keeps it alive.
# A jax.Array is immutable and needs no proof.

from cpython.ref cimport Py_REFCNT
from cpython.object cimport Py_TYPE

cdef extern from "Python.h":
    object PyFrame_GetLocals(PyFrameObject* frame)   # (a module's or class body's: its namespace)
    object PyFrame_GetGlobals(PyFrameObject* frame)
    object PyFrame_GetCode(PyFrameObject* frame)
    int PyFrame_GetLasti(PyFrameObject* frame)
    int PY_VERSION_HEX

cdef extern from "dlinspect/frames.h":
    Py_ssize_t dl_frame_refs(PyObject* frame, PyObject* obj) noexcept
    bint dl_weakly_held(PyObject* obj) noexcept

import dataclasses as _dataclasses
import dis as _dis
import sysconfig as _sysconfig
from collections import UserDict as _UserDict
from types import SimpleNamespace as _SimpleNamespace

# Counts are exact only with the GIL: a free-threaded build splits and defers them.
cdef bint _EXACT_COUNTS = not _sysconfig.get_config_var("Py_GIL_DISABLED")
# The references a Python caller's stack holds to the argument of its call into C: one up to
# 3.13; 3.14 may lend the caller's own (borrowed), so none is assumed there (a strong one
# then counts as another holder: a copy, never a view of memory someone else holds).
cdef Py_ssize_t _STACK_REFS = 1 if PY_VERSION_HEX < 0x030E0000 else 0
# f(*args, **kwargs): the argument is held by a tuple, maybe the source's (_call_refs).
cdef int _CALL_FUNCTION_EX = _dis.opmap["CALL_FUNCTION_EX"]
cdef int _CO_OPTIMIZED = 0x1

# The references this module's own def functions hold to an argument while they run (Cython
# >= 3.1 holds one as it parses arguments, 3.0 none): measured once (_core_held).
cdef Py_ssize_t _CORE_HELD = -1

# torch's storage use count of a tensor alone, measured once (builds differ), and its counter;
# what a view's base held by that view alone shows: its references and its use count.
cdef Py_ssize_t _torch_alone = -1
# the references to a storage's Python object held by torch and one variable, measured once:
# torch keeps one such object per storage, shared by whoever asks for it.
cdef Py_ssize_t _torch_storage_refs = -1
cdef object _torch_use_count = None
cdef tuple _torch_private = None


cdef inline _key(v):
    """``v``'s address turned right by 4 bits: unique as ``id(v)`` is, without the builtin's
    audit event, and with the bits that differ low (objects are 16 bytes apart, and a dict
    of addresses would probe its first slots again and again)."""
    cdef size_t a = <size_t><void*>v
    return <Py_ssize_t>((a >> 4) | (a << (8 * sizeof(size_t) - 4)))


@cython.final
@cython.freelist(4)
cdef class _Owners:
    """One proof's walk: the leaves met, and the objects whose references need counting."""
    # the key of each tensor leaf met, once per slot that holds it, from the first object
    # counted on (the leaves a counted object leads to are met after it)
    cdef list leaves
    # the key of each leaf whose memory is proven its own -> a torch tensor's storage (held
    # through the batch: its export finds it made, the base of a view), or True
    cdef dict owned
    # key -> [object, slots holding it, references the walk's own lists hold, keys of the
    # leaves it leads to, walked]: each object met whose references are not one slot's
    # alone (None until one is met).
    cdef dict counted
    cdef list lists      # the walk's own lists of a container's values (held until counted)
    cdef bint deep       # the batch nests past MAX_DEPTH (its walk raises ContainerError)

    cdef list entry(self, v):
        """``v``'s entry in ``counted``, held by one slot more."""
        if self.counted is None:
            self.counted = {}
        key = _key(v)
        cdef list entry = self.counted.get(key)
        if entry is None:
            entry = [v, 0, 0, [], False]
            self.counted[key] = entry
        entry[1] += 1
        return entry

    cdef int child(self, v, Py_ssize_t listed, Py_ssize_t depth) except -1:
        """``v`` in one slot of its parent, held by that slot, ``listed`` of the walk's lists
        and the caller's loop variable; counted where that is not all, or where a weak
        reference reaches it (an object met twice always is)."""
        if _plain_scalar(v):
            return 0
        cdef list entry = None
        if Py_REFCNT(v) != 2 + listed or dl_weakly_held(<PyObject*>v):
            entry = self.entry(v)
            entry[2] += listed
            if entry[4]:   # met before: its leaves once more, walked once
                self.leaves.extend(entry[3])
                return 0
            entry[4] = True
        cdef Py_ssize_t start = len(self.leaves)
        self.node(v, depth)
        if entry is not None:
            (<list>entry[3]).extend(self.leaves[start:])
        return 0

    cdef int node(self, v, Py_ssize_t depth) except -1:
        cdef int guard = _tensor_guard(v)
        if guard != _NOT_A_TENSOR:
            holder = self.memory(v, guard)
            if holder is not None:
                self.owned[_key(v)] = holder
            if self.counted is not None:   # (what a counted container leads to)
                self.leaves.append(_key(v))
            return 0
        if depth > _tree.MAX_DEPTH:
            self.deep = True
            return 0
        tp = type(v)
        if tp is dict:
            for item in (<dict>v).values():
                self.child(item, 0, depth + 1)
            return 0
        if tp is list or tp is tuple:
            for item in v:
                if not _plain_scalar(item):   # (a batch's string ids: nothing to prove)
                    self.child(item, 0, depth + 1)
            return 0
        values = _slots(v)
        if values is None:
            return 0
        if self.lists is None:
            self.lists = []
        self.lists.append(values)
        for item in <list>values:
            self.child(item, 1, depth + 1)
        return 0

    cdef memory(self, x, int guard):
        """Where tensor ``x``'s memory is proven its own (its base chain counted on the way),
        its storage for a torch tensor, else True; None where not proven. ``guard``: its
        _tensor_guard (a bare capsule proves nothing)."""
        if guard == GUARD_JAX:
            return True
        # (a subclass's export may not be the memory proven; a finalizer, __del__, may hand
        # the memory back to a source as the batch dies)
        if type(x) is not _np_ndarray and (not _entry_for(type(x)).own_export
                                           or Py_TYPE(x).tp_finalize != NULL):
            return None
        if guard == GUARD_TORCH:
            return _torch_owns(x)
        if self.chain(x):   # (NumPy's: no other type passes own_export)
            return True
        return None

    cdef bint chain(self, leaf) except -1:
        """Each array on ``leaf``'s base chain held only by it (no weak reference either:
        the view JAX keeps holds the array alive for it); the last owns its data."""
        arr, key = leaf, None
        cdef list entry
        cdef _TypeEntry producer
        cdef PyObject* p
        while True:
            if dl_weakly_held(<PyObject*>arr):   # (a source's weakref.ref reaches it again)
                return False
            if not cnp.PyArray_Check(arr):
                producer = _entry_for(type(arr))
                return (producer.guard == GUARD_TORCH and producer.own_export
                        and _torch_owns(arr) is not None)
            p = cnp.PyArray_BASE(<cnp.ndarray>arr)
            if p == NULL:
                return cnp.PyArray_CHKFLAGS(<cnp.ndarray>arr, cnp.NPY_ARRAY_OWNDATA)
            base = <object>p
            if Py_REFCNT(base) != 2:   # (its child's base, and ``base``)
                if key is None:
                    key = _key(leaf)
                entry = self.entry(base)
                (<list>entry[3]).append(key)
            arr = base


cdef list _slots(v):
    """The values of a container that is no plain dict, list or tuple, each as a slot of it
    holds it (a new list), or None: a container whose slots cannot be counted, a leaf, or
    one with a finalizer (its __del__ may hand the memory back to a source)."""
    if Py_TYPE(v).tp_finalize != NULL:
        return None
    if isinstance(v, dict):
        return list((<dict>v).values())   # (the dict's own storage, whatever its subclass says)
    if isinstance(v, list):
        return (<list>v)[:]
    if isinstance(v, tuple):
        return list((<tuple>v)[:])
    if isinstance(v, (_UserDict, _SimpleNamespace)) or _dataclasses.is_dataclass(v):
        # (its __dict__, counted as a slot's value is: a source may keep it, vars(batch))
        own = getattr(v, "__dict__", None)
        return None if own is None else [own]
    return None


cdef _torch_owns(t):
    """A torch tensor's storage where it, and the Python object torch keeps for it, are held
    by the tensor alone (or with the base it is a view of, which nothing else holds) and is
    torch's own, or shared memory another process handed over (_received); else None."""
    try:
        if not _torch_measured():
            return None
        calls = _torch_methods()
        storage = calls[0](t)
        # (its storage object kept, strongly or weakly: a pool's, t.storage(), a tensor made
        # over it with set_(), a view JAX holds)
        if Py_REFCNT(storage) != _torch_storage_refs or dl_weakly_held(<PyObject*>storage):
            return None
        uses = _torch_use_count(storage._cdata)
        if uses != _torch_alone and not (uses == _torch_alone + 1 and _private_base(t)):
            return None
        if calls[1](storage) and storage.device.type == "cpu":   # (CUDA's always says so)
            return None if calls[2](storage) or not _received(storage) else storage
        if calls[2](storage):
            return storage
    except Exception:   # (a tensor without storage: its export says why)
        pass
    return None


cdef bint _torch_measured() except -1:
    """Whether torch's counts for a tensor alone are known: measured once per process (builds
    differ), where no torch function or dispatch mode sees, and may keep, its tensors. A
    torch that does not say its storages' use count raises: nothing is proven."""
    global _torch_alone, _torch_use_count, _torch_private, _torch_storage_refs
    if _torch_alone >= 0:
        return True
    torch = _sys.modules["torch"]
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return False
    _torch_use_count = torch._C._storage_Use_Count
    alone = torch.empty(1)   # (held here as a leaf is, its storage too)
    storage = _torch_methods()[0](alone)
    _torch_storage_refs = Py_REFCNT(storage)
    _torch_alone = _torch_use_count(storage._cdata)
    _torch_private = _base_holders(torch.empty(2)[:1])
    return True


cdef bint _received(storage) except -1:
    """Host memory ``storage`` shares with other processes, not resizable, is memory
    torch.multiprocessing received from another process, which let go of it (a DataLoader
    worker's batch): in torch's cache of the storages it sent and received. Memory this
    process shares (``share_memory_()``: resizable, sent or not; a fork's children write
    it) or maps from a file (``from_file``: not in the cache) is not."""
    cache = _sys.modules["torch.multiprocessing.reductions"].shared_cache   # (import torch's)
    cdata = storage._cdata
    return any([ref.cdata == cdata for ref in list(cache.values())])


cdef bint _private_base(t) except -1:
    """``t`` is a view (reshape, a slice) of a tensor no one but ``t`` holds: the second
    holder of its storage (torch keeps a view's base alive; a view of a view has the first
    base as its own), held as the base of a new view is."""
    holders = _base_holders(t)
    return holders is not None and holders == _torch_private


cdef tuple _base_holders(t):
    """The references to ``t``'s base and its use count, as held here (None: not a view, a
    base a weak reference reaches, or a torch whose tensors do not say their use count,
    torch 2.3's: no view is proven)."""
    base = t._base
    if base is None or dl_weakly_held(<PyObject*>base) or not hasattr(base, "_use_count"):
        return None
    return (Py_REFCNT(base), base._use_count())


cdef Py_ssize_t _call_refs() except -1:
    """The references the innermost Python frame's call into the core holds to the batch
    it passes: its stack's. None for ``f(*a, **kw)``: its tuple may be a fresh one or a
    source's (``f(*source.args)``), and an empty ``**kw`` unpacks no array: uncounted, so
    the leaves are copied, never shared by mistake."""
    cdef PyFrameObject* f = PyEval_GetFrame()
    if f == NULL or PY_VERSION_HEX >= 0x030E0000:
        return _STACK_REFS
    cdef Py_ssize_t at = PyFrame_GetLasti(f)
    cdef bytes code = PyFrame_GetCode(f).co_code
    if 0 <= at < len(code) and code[at] == _CALL_FUNCTION_EX:
        return 0
    return _STACK_REFS


cdef Py_ssize_t _unexplained(obj, Py_ssize_t extra) except? -1:
    """``extra`` references to ``obj`` less those the calling code's own variables hold: the
    variables of the innermost Python frame, the one calling the core (its locals and
    cells, not an enclosing function's free variables; a module's namespace, not a class
    body's or exec's own, which are a class's or a source's). A frame further up is not the
    caller's: a source that calls back with its buffer (``source(callback)``) holds it
    there, as a helper's caller holds its batch; a generator a source runs is suspended,
    off the stack."""
    cdef PyFrameObject* f = PyEval_GetFrame()
    if f == NULL:   # (a thread C started, running no Python)
        return extra
    if PyFrame_GetCode(f).co_flags & _CO_OPTIMIZED:   # a function's (frames.h)
        return extra - dl_frame_refs(<PyObject*>f, <PyObject*>obj)
    names = PyFrame_GetLocals(f)
    if names is not PyFrame_GetGlobals(f):   # a class body's or exec's: a source's namespace
        return extra
    return extra - sum([v is obj for v in names.values()])


cdef dict _prove(x, Py_ssize_t held, bint own_frame):
    """The keys of batch ``x``'s tensor leaves proven to own their memory (_Owners.owned);
    ``held``:
    the references the core's caller holds to ``x`` (a Python caller's stack, or a loader's
    variable); ``own_frame``: the calling frame's variables are the caller's own."""
    cdef dict owned = {}
    # (counts not exact; the batch itself held elsewhere, or reached by a weak reference)
    if not _EXACT_COUNTS or dl_weakly_held(<PyObject*>x) or (Py_REFCNT(x) != held and (
            not own_frame or _unexplained(x, Py_REFCNT(x) - held) != 0)):
        return owned
    cdef _Owners w = _Owners.__new__(_Owners)
    w.leaves, w.owned = [], owned
    w.node(x, 0)
    if w.deep:
        return {}
    if w.counted is None:
        return owned
    cdef list entry
    cdef Py_ssize_t extra
    for entry in w.counted.values():
        obj = entry[0]
        # (the entry and ``obj`` hold two references)
        extra = Py_REFCNT(obj) - 2 - entry[1] - entry[2]
        if extra > 0 and own_frame:
            extra = _unexplained(obj, extra)
        if extra != 0 or dl_weakly_held(<PyObject*>obj):
            for key in <list>entry[3]:
                owned.pop(key, None)
    return owned


def _held_probe(x, y=None, *, z=None):
    """The references to ``x`` while a def function of this module runs (_core_held)."""
    return Py_REFCNT(x)


cdef Py_ssize_t _core_held() except -1:
    """The references the core holds to an argument of to_jax, plan or explain."""
    global _CORE_HELD
    if _CORE_HELD < 0:
        probe = object()   # (held by this variable alone)
        _CORE_HELD = _held_probe(probe) - 1
    return _CORE_HELD


cdef dict _owned(x, Options opts, Py_ssize_t held):
    """The proof's answer for batch ``x`` under ``opts`` (see _prove), or None where none is
    asked: ``copy`` given, or a tensor a Python caller gives alone (DLPack's consumer
    contract). ``held``: the references a loader holds to ``x``; -1: a Python caller's call,
    its stack's reference and its frame's variables the caller's own."""
    if opts.copy is not None:
        return None
    if held >= 0:
        return _prove(x, held, False)
    if is_tensor(x):
        return None
    return _prove(x, _call_refs() + _core_held(), True)
