/*
 * dlinspect's own declaration of the DLPack 1.3 C ABI, written from the specification's
 * facts (not a copy of upstream `dlpack.h`); tests/test_abi.py checks every sizeof,
 * offsetof and enum value against an official header where one is installed. The names
 * are upstream's (so the two headers cannot share a translation unit); our own macros
 * carry a DLINSPECT_ prefix.
 */
#ifndef DLINSPECT_DLPACK_H_
#define DLINSPECT_DLPACK_H_

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLINSPECT_DLPACK_MAJOR 1
#define DLINSPECT_DLPACK_MINOR 3

/* Python capsule names (array API / DLPack python_spec). */
#define DLINSPECT_CAPSULE_LEGACY "dltensor"
#define DLINSPECT_CAPSULE_LEGACY_USED "used_dltensor"
#define DLINSPECT_CAPSULE_VERSIONED "dltensor_versioned"
#define DLINSPECT_CAPSULE_VERSIONED_USED "used_dltensor_versioned"
#define DLINSPECT_CAPSULE_EXCHANGE_API "dlpack_exchange_api"

/* Bits of DLManagedTensorVersioned.flags. */
#define DLPACK_FLAG_BITMASK_READ_ONLY ((uint64_t)1 << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED ((uint64_t)1 << 1)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED ((uint64_t)1 << 2)

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef enum {
  kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLOpenCL = 4, kDLVulkan = 7, kDLMetal = 8,
  kDLVPI = 9, kDLROCM = 10, kDLROCMHost = 11, kDLExtDev = 12, kDLCUDAManaged = 13,
  kDLOneAPI = 14, kDLWebGPU = 15, kDLHexagon = 16, kDLMAIA = 17, kDLTrn = 18
} DLDeviceType;

typedef struct {
  int32_t device_type; /* a DLDeviceType; an int32_t so unknown values are representable */
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLOpaqueHandle = 3, kDLBfloat = 4, kDLComplex = 5,
  kDLBool = 6, kDLFloat8_e3m4 = 7, kDLFloat8_e4m3 = 8, kDLFloat8_e4m3b11fnuz = 9,
  kDLFloat8_e4m3fn = 10, kDLFloat8_e4m3fnuz = 11, kDLFloat8_e5m2 = 12, kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14, kDLFloat6_e2m3fn = 15, kDLFloat6_e3m2fn = 16, kDLFloat4_e2m1fn = 17
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* a DLDataTypeCode */
  uint8_t bits;   /* bits of one lane */
  uint16_t lanes; /* 1 for scalars; > 1 for vector types */
} DLDataType;

typedef struct {
  void *data;           /* start of the allocation; the data begins at data + byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;       /* ndim extents; may be NULL only when ndim == 0 */
  int64_t *strides;     /* ndim strides in elements; NULL means row-major (allowed before 1.2) */
  uint64_t byte_offset;
} DLTensor;

/* Legacy (pre-1.0). */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* 1.0+: everything up to and including `flags` keeps its place across major versions. */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* ---- 1.3 C exchange API (type attribute __dlpack_c_exchange_api__) ---- */

typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  int (*managed_tensor_allocator)(
      DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
      void (*SetError)(void *error_ctx, const char *kind, const char *message));
  int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out_py_object);
  int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out); /* may be NULL */
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_current_stream);
} DLPackExchangeAPI;

#ifdef __cplusplus
}
#endif
#endif /* DLINSPECT_DLPACK_H_ */
