# dlinspect's own declaration of the DLPack 1.3 C ABI, written from the specification's facts
# (not a copy of upstream `dlpack.h`): the structs in their C layout, the flag bits of
# DLManagedTensorVersioned.flags and the enum values the core names. dlinspect._tables holds
# every DLDeviceType and DLDataTypeCode value. tests/test_abi.py writes these declarations out
# as C and checks every sizeof, offsetof and value against an official header where one is
# installed. Field names are upstream's; our own constants carry a DLINSPECT_ prefix.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    DLINSPECT_DLPACK_MAJOR = 1
    DLINSPECT_DLPACK_MINOR = 3
    DLPACK_FLAG_BITMASK_READ_ONLY = 1 << 0
    DLPACK_FLAG_BITMASK_IS_COPIED = 1 << 1
    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = 1 << 2
    # DLDeviceType and DLDataTypeCode values (dlinspect._tables has them all).
    kDLCPU = 1
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLComplex = 5

cdef struct DLPackVersion:
    uint32_t major, minor

cdef struct DLDevice:
    int32_t device_type, device_id   # device_type a DLDeviceType, any int32 value readable

cdef struct c_DLDataType:   # DLDataType (the name dlinspect's Python class has)
    uint8_t code, bits   # a DLDataTypeCode; the bits of one lane
    uint16_t lanes       # 1 for scalars; > 1 for vector types

cdef struct DLTensor:
    void* data   # the allocation; the data begins byte_offset bytes in
    DLDevice device
    int32_t ndim
    c_DLDataType dtype
    int64_t *shape, *strides   # strides in elements; NULL means row-major (before 1.2)
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept nogil

cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor

# The C exchange API (DLPack 1.3), in its whole layout; the core reads the version and the
# two functions that export a Python object. The three functions it never calls are
# declared as opaque pointers (a function pointer's size and alignment: the same layout).
cdef struct DLPackExchangeAPIHeader:
    DLPackVersion version
    DLPackExchangeAPIHeader* prev_api

cdef struct DLPackExchangeAPI:
    DLPackExchangeAPIHeader header
    void* managed_tensor_allocator   # int (*)(DLTensor*, DLManagedTensorVersioned**, ...)
    int (*managed_tensor_from_py_object_no_sync)(
        void* py_object, DLManagedTensorVersioned** out) noexcept
    void* managed_tensor_to_py_object_no_sync   # int (*)(DLManagedTensorVersioned*, void**)
    int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out) noexcept   # or NULL
    void* current_work_stream   # int (*)(int32_t device_type, int32_t device_id, void**)
