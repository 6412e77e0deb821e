/* Compile-time checks that ndx_dlpack.h (as included by ndx.h) describes the DLPack 1.x
 * ABI: sizes and offsets of every struct, enum values and flag bits, on an LP64 target.
 * Built as C11 (for _Static_assert); main() only proves the program links. */
#include <stddef.h>
#include <stdint.h>

#include "ndx.h"

#define CHECK(cond) _Static_assert(cond, #cond)

CHECK(DLPACK_MAJOR_VERSION == 1);

CHECK(sizeof(DLPackVersion) == 8);
CHECK(offsetof(DLPackVersion, major) == 0);
CHECK(offsetof(DLPackVersion, minor) == 4);

CHECK(sizeof(DLDeviceType) == 4);
CHECK(sizeof(DLDevice) == 8);
CHECK(offsetof(DLDevice, device_type) == 0);
CHECK(offsetof(DLDevice, device_id) == 4);

CHECK(sizeof(DLDataType) == 4);
CHECK(offsetof(DLDataType, code) == 0);
CHECK(offsetof(DLDataType, bits) == 1);
CHECK(offsetof(DLDataType, lanes) == 2);

CHECK(sizeof(DLTensor) == 48);
CHECK(offsetof(DLTensor, data) == 0);
CHECK(offsetof(DLTensor, device) == 8);
CHECK(offsetof(DLTensor, ndim) == 16);
CHECK(offsetof(DLTensor, dtype) == 20);
CHECK(offsetof(DLTensor, shape) == 24);
CHECK(offsetof(DLTensor, strides) == 32);
CHECK(offsetof(DLTensor, byte_offset) == 40);

CHECK(sizeof(DLManagedTensor) == 64);
CHECK(offsetof(DLManagedTensor, dl_tensor) == 0);
CHECK(offsetof(DLManagedTensor, manager_ctx) == 48);
CHECK(offsetof(DLManagedTensor, deleter) == 56);

/* 32-byte header followed by the 48-byte DLTensor. */
CHECK(sizeof(DLManagedTensorVersioned) == 80);
CHECK(offsetof(DLManagedTensorVersioned, version) == 0);
CHECK(offsetof(DLManagedTensorVersioned, manager_ctx) == 8);
CHECK(offsetof(DLManagedTensorVersioned, deleter) == 16);
CHECK(offsetof(DLManagedTensorVersioned, flags) == 24);
CHECK(offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

CHECK(kDLCPU == 1);
CHECK(kDLCUDA == 2);
CHECK(kDLCUDAHost == 3);
CHECK(kDLCUDAManaged == 13);

CHECK(kDLInt == 0);
CHECK(kDLUInt == 1);
CHECK(kDLFloat == 2);
CHECK(kDLBfloat == 4);
CHECK(kDLBool == 6);

CHECK(DLPACK_FLAG_BITMASK_READ_ONLY == 1);
CHECK(DLPACK_FLAG_BITMASK_IS_COPIED == 2);

int main(void) {
  return ndx_version() == 0 ? 1 : 0;
}
