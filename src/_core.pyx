# cython: language_level=3, freethreading_compatible=False, embedsignature=True, embedsignature.format=clinic
"""dlinspect._core: the one export, the header, the options, the one verdict, the fast path.

One concern per included file, in the order of the includes below. Below the core stand
dlinspect.errors, _options (the option values' types), _tree, _tables, _words and _jaxcaps (what the installed JAX
takes, probed with the core's capsule functions, handed to it as arguments); they import
nothing of the core, and it never reaches up. Pointers: ``dlm`` a ``DLManagedTensor*``,
``dlm_ver`` a ``DLManagedTensorVersioned*``, ``t`` a ``DLTensor*``.
"""

cimport cython
from libc.stdint cimport (
    int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t, INT64_MIN, UINTPTR_MAX,
)
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memset, memcpy, memcmp
from cpython.exc cimport PyErr_Clear, PyErr_Fetch, PyErr_Restore
from cpython.dict cimport PyDict_GetItemWithError
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from cpython.type cimport PyType_Check
cimport numpy as cnp
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS
from cpython.slice cimport PySlice_AdjustIndices, PySlice_Check, PySlice_Unpack
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_release_lock, PyThread_start_new_thread, PyThread_type_lock,
)
from cpython.pycapsule cimport (
    PyCapsule_CheckExact, PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_IsValid,
    PyCapsule_New, PyCapsule_SetName,
)

from dlpack cimport *

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    object PyObject_VectorcallMethod(object name, PyObject** args, size_t nargsf, PyObject* kwnames)
    Py_ssize_t PyTuple_GET_SIZE(object t)
    bint PyIndex_Check(object o)
    ctypedef struct PyFrameObject:
        pass
    PyFrameObject* PyEval_GetFrame()   # (borrowed; NULL on a thread C started, running no Python)

cdef extern from "dlinspect/copy.h":
    ctypedef enum dl_copy_cast:
        DL_COPY_SAME
        DL_COPY_F64_F32
        DL_COPY_U64_U32
    size_t DL_COPY_PARALLEL_MIN
    void dl_copy_init() noexcept nogil
    bint dl_worth_two(int ndim, const int64_t* shape, const int64_t* strides, size_t src_size,
                      dl_copy_cast cast) noexcept nogil
    void dl_advise_huge(void* p, size_t n) noexcept nogil
    bint dl_fresh(const void* p, size_t n) noexcept nogil
    void dl_gather_part(char* dst, const char* src, int ndim, const int64_t* shape,
                        const int64_t* strides, size_t src_size, dl_copy_cast cast, int fresh,
                        int part, int nparts) noexcept nogil

cdef extern from "dlinspect/checked.h":
    bint dl_mul_overflow(int64_t a, int64_t b, int64_t* out) noexcept nogil
    bint dl_add_overflow(int64_t a, int64_t b, int64_t* out) noexcept nogil
    bint dl_mapped(uintptr_t lo, uintptr_t hi) noexcept nogil
    uintptr_t DL_USER_END

import sys as _sys
from dlinspect.errors import (
    CapsuleConsumedError, DLInspectError, DLInspectWarning, MalformedTensorError,
    NotDescribableError, NotDLPackError, NotNumericError, ProducerError,
    UnsupportedDeviceError, UnsupportedDTypeError, UnsupportedVersionError,
)
from dlinspect import _words
from dlinspect._words import first_line
import numpy as _np
from typing import NamedTuple as _NamedTuple
from numpy import dtype as _np_dtype, empty as _np_empty, ndarray as _np_ndarray

#: Largest ``ndim`` peek accepts (NumPy's NPY_MAXDIMS). Larger values raise MalformedTensorError.
MAX_NDIM = 64
cdef enum:
    _MAX_NDIM = 64
    _INLINE_NDIM = 8

# Capsule names (the array API's DLPack Python specification).
cdef const char* LEGACY = b"dltensor"
cdef const char* LEGACY_USED = b"used_dltensor"
cdef const char* VERSIONED = b"dltensor_versioned"
cdef const char* VERSIONED_USED = b"used_dltensor_versioned"
cdef const char* EXCHANGE_API = b"dlpack_exchange_api"

FLAG_READ_ONLY = DLPACK_FLAG_BITMASK_READ_ONLY
FLAG_IS_COPIED = DLPACK_FLAG_BITMASK_IS_COPIED
FLAG_IS_SUBBYTE_TYPE_PADDED = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED


cdef int _remember(dict cache, key, value, Py_ssize_t most) except -1:
    """``cache[key] = value``, the cache emptied first where it holds ``most``: the one
    bounded cache of every file below (types, abstract values, layouts, options...)."""
    if len(cache) >= most:
        cache.clear()
    cache[key] = value
    return 0


include "tables.pxi"
include "warn.pxi"
include "header.pxi"
include "capsules.pxi"
include "export.pxi"
include "target.pxi"
include "options.pxi"
include "needs.pxi"
include "shard.pxi"
include "routes.pxi"
include "put.pxi"
include "fast.pxi"
include "own.pxi"
include "report.pxi"
include "execute.pxi"
include "batch.pxi"
include "front.pxi"
