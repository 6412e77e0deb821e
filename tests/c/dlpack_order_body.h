/* The body shared by dlpack_order_a.c and dlpack_order_b.c: included after ndx.h and
 * an official dlpack.h (in the order the including file chose, named by NDX_ORDER),
 * it checks that the declarations are usable and match the ABI ndx expects. */

#include <stddef.h>
#include <stdio.h>

#if defined(__cplusplus)
#define CHECK(cond, name) static_assert(cond, #cond)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define CHECK(cond, name) _Static_assert(cond, #cond)
#else
#define CHECK(cond, name) typedef char ndx_check_##name[(cond) ? 1 : -1]
#endif

CHECK(DLPACK_MAJOR_VERSION == 1, major);
CHECK(sizeof(DLPackVersion) == 8, version_size);
CHECK(sizeof(DLDevice) == 8, device_size);
CHECK(sizeof(DLDataType) == 4, dtype_size);
CHECK(sizeof(DLTensor) == 48, tensor_size);
CHECK(offsetof(DLTensor, byte_offset) == 40, tensor_byte_offset);
CHECK(sizeof(DLManagedTensor) == 64, managed_size);
CHECK(offsetof(DLManagedTensor, deleter) == 56, managed_deleter);
CHECK(sizeof(DLManagedTensorVersioned) == 80, versioned_size);
CHECK(offsetof(DLManagedTensorVersioned, flags) == 24, versioned_flags);
CHECK(offsetof(DLManagedTensorVersioned, dl_tensor) == 32, versioned_tensor);
CHECK(kDLCPU == 1, cpu);
CHECK(kDLCUDA == 2, cuda);
CHECK(kDLFloat == 2, float_code);
CHECK(DLPACK_FLAG_BITMASK_READ_ONLY == 1, read_only);
CHECK(DLPACK_FLAG_BITMASK_IS_COPIED == 2, is_copied);

static int deleted = 0;

static void delete_versioned(DLManagedTensorVersioned* self) {
  (void)self;
  deleted += 1;
}

int main(void) {
  int64_t shape[2] = {2, 3};
  float data[6] = {0};
  DLManagedTensorVersioned m;
  m.version.major = DLPACK_MAJOR_VERSION;
  m.version.minor = DLPACK_MINOR_VERSION;
  m.manager_ctx = NULL;
  m.deleter = delete_versioned;
  m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  m.dl_tensor.data = data;
  m.dl_tensor.device.device_type = kDLCPU;
  m.dl_tensor.device.device_id = 0;
  m.dl_tensor.ndim = 2;
  m.dl_tensor.dtype.code = (uint8_t)kDLFloat;
  m.dl_tensor.dtype.bits = 32;
  m.dl_tensor.dtype.lanes = 1;
  m.dl_tensor.shape = shape;
  m.dl_tensor.strides = NULL;
  m.dl_tensor.byte_offset = 0;
  m.deleter(&m);

  printf("ndx %s with DLPack %d.%d (" NDX_ORDER ")\n", ndx_version_string(), DLPACK_MAJOR_VERSION,
         DLPACK_MINOR_VERSION);
  return (deleted == 1 && ndx_version() != 0) ? 0 : 1;
}
