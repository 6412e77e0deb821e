/*
 * ndx_dlpack.h - the DLPack 1.x exchange ABI, as ndx reads and writes it.
 *
 * This file declares the DLPack types under their official names and the official
 * include guard DLPACK_DLPACK_H_, so a program may include <dlpack/dlpack.h> and
 * <ndx.h> in either order: whichever comes first provides the declarations, and both
 * describe the same ABI (sizes and offsets are checked by static asserts in
 * tests/c/test_dlpack_abi.c, and against an official dlpack.h where one is available).
 *
 * Only what ndx uses is declared: versions, devices, data types, DLTensor,
 * DLManagedTensor and DLManagedTensorVersioned, and the flag bits.
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif

/** Major version of the DLPack ABI described here. A tensor with another major
 *  version has a different layout: only its deleter may be called. */
#define DLPACK_MAJOR_VERSION 1
/** Minor version of the DLPack ABI described here. */
#define DLPACK_MINOR_VERSION 3

#ifdef _WIN32
#ifdef DLPACK_EXPORTS
#define DLPACK_DLL __declspec(dllexport)
#else
#define DLPACK_DLL __declspec(dllimport)
#endif
#else
#define DLPACK_DLL
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The DLPack version a managed tensor was produced with. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/** Where a tensor's memory lives. */
#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
  kDLTrn = 18,
} DLDeviceType;

/** A device: its type and its index (0 for host memory). */
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

/** Type codes of DLDataType::code. */
typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

/** An element type: code (a DLDataTypeCode), bits per lane, lanes. */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/** A strided view of memory. `shape` and `strides` have `ndim` entries; strides
 *  count elements, not bytes; the first element is at `(char*)data + byte_offset`. */
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

/** Legacy (pre-1.0) managed tensor: no version, no flags. The consumer calls
 *  `deleter(self)` exactly once when it no longer needs the memory. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

/** The memory must not be written through this tensor. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
/** The producer copied the data for this exchange: nothing else aliases it. */
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
/** Sub-byte elements are padded to a byte each. */
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

/** Versioned managed tensor (DLPack >= 1.0). Check `version.major` before reading
 *  anything else; the consumer calls `deleter(self)` exactly once. */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif  /* DLPACK_DLPACK_H_ */
