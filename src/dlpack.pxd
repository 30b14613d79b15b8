# Cython declarations of include/dlinspect/dlpack.h (dlinspect's own DLPack 1.3 header).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef extern from "dlinspect/dlpack.h" nogil:
    const char *DLINSPECT_CAPSULE_LEGACY, *DLINSPECT_CAPSULE_LEGACY_USED
    const char *DLINSPECT_CAPSULE_VERSIONED, *DLINSPECT_CAPSULE_VERSIONED_USED
    const char *DLINSPECT_CAPSULE_EXCHANGE_API
    int DLINSPECT_DLPACK_MAJOR, DLINSPECT_DLPACK_MINOR
    uint64_t DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED
    uint64_t DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED

    # The enum values the core names (dlinspect._tables has them all, and a DLDataType: c_ here).
    enum: kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged
    enum: kDLInt, kDLUInt, kDLFloat, kDLComplex

    ctypedef struct DLPackVersion:
        uint32_t major, minor

    ctypedef struct DLDevice:
        int32_t device_type, device_id

    ctypedef struct c_DLDataType "DLDataType":
        uint8_t code, bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        c_DLDataType dtype
        int64_t *shape, *strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept nogil

    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor

    # The exchange API as far as the core reads it (the C header has every field).
    ctypedef struct DLPackExchangeAPIHeader:
        DLPackVersion version

    ctypedef struct DLPackExchangeAPI:
        DLPackExchangeAPIHeader header
        int (*managed_tensor_from_py_object_no_sync)(
            void* py_object, DLManagedTensorVersioned** out) noexcept
        int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out) noexcept
