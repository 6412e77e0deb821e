/* CUDA discovery through the C ABI, on any machine: where no driver can be loaded (CI)
 * the device count is 0 and every CUDA request fails with NDX_ERROR_CUDA saying so;
 * where one is, a device id past the count is refused naming how many there are.
 * Computing on a CUDA tensor of a missing device fails at ndx_invoke, pointing at the
 * invoking line; the imported tensor's deleter still runs once. */
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "ndx_test.h"

static void test_discovery(void) {
  int32_t n = ndx_cuda_device_count();
  CHECK(n >= 0, "count %d", n);
  if (n == 0) {
    printf("test_cuda: no usable CUDA driver here; checking the refusals\n");
    ndx_error_t* e = ndx_cuda_device_check(0);
    CHECK(e != NULL && ndx_error_kind(e) == NDX_ERROR_CUDA, "device 0 refused");
    if (e) {
      const char* m = ndx_error_message(e);
      CHECK(ndx_test_contains(m, "libcuda.so could not be loaded") ||
                ndx_test_contains(m, "cuInit failed") ||
                ndx_test_contains(m, "NDX_CUDA_DISABLE"),
            "reason: %s", m);
      CHECK_STR_EQ(ndx_error_kind_name(ndx_error_kind(e)), "CudaError");
    }
    ndx_error_free(e);
  } else {
    CHECK_OK(ndx_cuda_device_check(n - 1));
    char want[96];
    snprintf(want, sizeof want, "device %d does not exist, %d device", n + 3, n);
    expect_error(ndx_cuda_device_check(n + 3), NDX_ERROR_CUDA, want);
  }
  expect_error(ndx_cuda_device_check(-1), NDX_ERROR_CUDA, "");
}

static void test_invoke_on_a_missing_device(void) {
  int deleted = 0;
  const float v[2] = {1, 2};
  const int64_t shape[1] = {2};
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, shape, NULL, v, sizeof v);
  m->dl_tensor.device.device_type = kDLCUDA;
  m->dl_tensor.device.device_id = 9;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_input_t in[2] = {ndx_test_in(t), ndx_test_in(t)};
  ndx_future_t* f = NULL;
  int line = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f);
  CHECK(f == NULL, "no future");
  CHECK_LINK(e, NDX_ERROR_CUDA, "input 0 lives in CUDA memory (kDLCUDA:9), but ", "add", 0);
  if (ndx_cuda_device_count() > 0) {
    CHECK_CONTAINS(ndx_error_message(e), "device 9 does not exist");
  }
  CHECK_FRAME(e, 0, "test_cuda.c", line, NULL, NDX_FRAME_NATIVE);
  ndx_error_free(e);
  ndx_context_release(ctx);
  ndx_tensor_release(t);
  CHECK(deleted == 1, "deleter ran once (%d)", deleted);
}

/* The import stream: ignored for host memory (a garbage value is never touched);
 * device-0 CUDA memory with the legacy default stream imports on every machine (with
 * a driver an event is recorded on stream 0; without one nothing can be pending); the
 * export stream orders the consumer, or nothing with NDX_STREAM_NO_SYNC. */
static void test_streams(void) {
  int deleted = 0;
  const float v[3] = {1, 2, 3};
  const int64_t shape[1] = {3};
  ndx_import_options_t o = ndx_test_options(NULL, false);
  o.stream = (void*)(uintptr_t)0x1234;
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, shape, NULL, v, sizeof v);
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &o, &t));
  DLManagedTensorVersioned* out = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned_stream(t, (void*)(uintptr_t)0x1234, &out));
  if (out) {
    CHECK(((const float*)out->dl_tensor.data)[2] == 3.0f, "exported values");
    out->deleter(out);
  }
  ndx_tensor_release(t);
  CHECK(deleted == 1, "host tensor deleted once");

  deleted = 0;
  m = ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, shape, NULL, v, sizeof v);
  m->dl_tensor.device.device_type = kDLCUDA;
  o.stream = NULL;
  t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &o, &t));
  void* streams[2] = {NULL, NDX_STREAM_NO_SYNC};
  for (int i = 0; i < 2; i++) {
    out = NULL;
    CHECK_OK(ndx_tensor_to_dlpack_versioned_stream(t, streams[i], &out));
    if (out) {
      CHECK(out->dl_tensor.device.device_type == kDLCUDA, "still CUDA memory");
      out->deleter(out);
    }
  }
  ndx_tensor_release(t);
  CHECK(deleted == 1, "CUDA tensor deleted once");

  out = (DLManagedTensorVersioned*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_to_dlpack_versioned_stream(NULL, NULL, &out), NDX_ERROR_VALUE,
               "argument 'tensor' is NULL");
  CHECK(out == NULL, "out reset");
}

int main(void) {
  test_discovery();
  test_streams();
  test_invoke_on_a_missing_device();
  return NDX_TEST_SUMMARY("test_cuda");
}
