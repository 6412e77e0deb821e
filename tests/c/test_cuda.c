/* CUDA discovery through the C ABI, on any machine: where no driver can be loaded (CI)
 * the device count is 0 and every CUDA request fails with NDX_ERROR_CUDA saying so;
 * where one is, a device id past the count is refused naming how many there are.
 * Computing on a CUDA tensor of a missing device fails at ndx_invoke, pointing at the
 * invoking line; the imported tensor's deleter still runs once. With a device (a GPU,
 * or the emulated driver of tests/cuda_emu first in LD_LIBRARY_PATH), operators run
 * there; the debug backend's device case needs NDX_TEST_HOOKS (the library built with
 * the cargo feature test-hooks, CMake's default) and is skipped without it. */
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "ndx_test.h"

/* Invokes to_device on `t` in `ctx`: the device tensor (the caller releases it and
 * `*up`). */
static ndx_tensor_t* upload(ndx_context_t* ctx, ndx_tensor_t* t, ndx_future_t** up) {
  ndx_input_t in[1] = {ndx_test_in(t)};
  *up = NULL;
  CHECK_OK(ndx_invoke(ctx, "to_device", in, 1, NULL, NULL, up));
  ndx_tensor_t* d = NULL;
  CHECK_OK(ndx_future_tensor(*up, 0, &d));
  return d;
}

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
  ndx_error_t* imported = ndx_tensor_from_dlpack_versioned(m, NULL, &t);
  if (ndx_cuda_device_count() > 0) {
    /* With a driver the import orders after the producer's stream on device 9, which
     * does not exist: refused there, and the tensor stays with its owner. */
    expect_error(imported, NDX_ERROR_CUDA, "device 9 does not exist");
    CHECK(t == NULL && deleted == 0, "nothing taken");
    m->deleter(m);
    return;
  }
  CHECK_OK(imported);
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_input_t in[2] = {ndx_test_in(t), ndx_test_in(t)};
  ndx_future_t* f = NULL;
  int line = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f);
  CHECK(f == NULL, "no future");
  CHECK_LINK(e, NDX_ERROR_CUDA, "input 0 lives in CUDA memory (kDLCUDA:9), but ", "add", 0);
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

/* to_device: refused at ndx_invoke, at the invoking line, where there is no device;
 * a round trip host -> device -> add -> host where there is one. */
static void test_to_device(void) {
  const float v[3] = {1.5f, -2.0f, 3.25f};
  const int64_t shape[1] = {3};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t));
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_input_t in[1] = {ndx_test_in(t)};
  ndx_future_t* f = NULL;
  if (ndx_cuda_device_count() == 0) {
    int line = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "to_device", in, 1, NULL, NULL, &f);
    CHECK(f == NULL, "no future");
    CHECK_LINK(e, NDX_ERROR_CUDA, "operator 'to_device': ", "to_device", 0);
    CHECK_FRAME(e, 0, "test_cuda.c", line, NULL, NDX_FRAME_NATIVE);
    ndx_error_free(e);
  } else {
    ndx_tensor_t* d = upload(ctx, t, &f);
    DLDevice dev;
    CHECK_OK(ndx_tensor_device(d, &dev));
    CHECK(dev.device_type == kDLCUDA && dev.device_id == 0, "on kDLCUDA:0");
    ndx_input_t two[2] = {ndx_test_in(d), ndx_test_in(d)};
    ndx_future_t* g = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", two, 2, NULL, NULL, &g));
    ndx_tensor_t* s = NULL;
    CHECK_OK(ndx_future_tensor(g, 0, &s));
    /* The add's output lives on the device: an out tensor (host memory) is refused at
     * ndx_invoke, not written through a failed copy later. */
    float sink[3] = {0, 0, 0};
    ndx_tensor_t* o = NULL;
    CHECK_OK(ndx_tensor_wrap_host(sink, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, NULL, NULL,
                                  &o));
    ndx_output_t outs[1] = {{o, NULL}};
    ndx_invoke_options_t io;
    memset(&io, 0, sizeof io);
    io.struct_size = sizeof io;
    io.outputs = outs;
    io.n_outputs = 1;
    ndx_future_t* refused = NULL;
    expect_error(ndx_invoke(ctx, "add", two, 2, NULL, &io, &refused), NDX_ERROR_NOT_IMPLEMENTED,
                 "operator 'add': outputs[0] is given, but the invocation runs on kDLCUDA:0");
    CHECK(refused == NULL, "no future");
    CHECK(sink[0] == 0.0f, "nothing written");
    ndx_tensor_release(o);
    /* int32 + float32 promotes to float64, which has no CUDA kernel: named with the
     * inputs' dtypes. */
    const int32_t iv[3] = {1, 2, 3};
    ndx_tensor_t* it = NULL;
    CHECK_OK(ndx_tensor_from_host(iv, NDX_DTYPE_INT32, 1, shape, NULL, NULL, &it));
    ndx_future_t* iup = NULL;
    ndx_tensor_t* di = upload(ctx, it, &iup);
    ndx_input_t mixed[2] = {ndx_test_in(di), ndx_test_in(d)};
    ndx_future_t* none = NULL;
    expect_error(ndx_invoke(ctx, "add", mixed, 2, NULL, NULL, &none), NDX_ERROR_NOT_IMPLEMENTED,
                 "operator 'add': no CUDA kernel for float64 on kDLCUDA:0 (int32 and float32 "
                 "promote to it)");
    CHECK(none == NULL, "no future");
    ndx_tensor_release(di);
    ndx_future_release(iup);
    ndx_tensor_release(it);
    ndx_input_t back[1] = {ndx_test_in(s)};
    ndx_future_t* h = NULL;
    CHECK_OK(ndx_invoke(ctx, "to_host", back, 1, NULL, NULL, &h));
    ndx_tensor_t* r = NULL;
    CHECK_OK(ndx_future_tensor(h, 0, &r));
    float got[3] = {0, 0, 0};
    CHECK_OK(ndx_tensor_copy_to(r, got, sizeof got));
    CHECK(got[0] == 3.0f && got[1] == -4.0f && got[2] == 6.5f, "values %g %g %g", got[0],
          got[1], got[2]);
    ndx_tensor_release(d);
    ndx_tensor_release(s);
    ndx_tensor_release(r);
    ndx_future_release(g);
    ndx_future_release(h);
  }
  ndx_future_release(f);
  ndx_context_release(ctx);
  ndx_tensor_release(t);
}

/* inject_accuracy_error:add perturbs an add computed on the device as on the host:
 * every output element is 1 more. Needs a device. */
static void test_accuracy_fault_on_the_device(void) {
  if (ndx_cuda_device_count() == 0) return;
  const float v[3] = {1.0f, 2.0f, 3.0f};
  const int64_t shape[1] = {3};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t));
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  CHECK_OK(ndx_context_set_backend(ctx, "inject_accuracy_error:add"));
  ndx_future_t* up = NULL;
  ndx_tensor_t* d = upload(ctx, t, &up);
  ndx_input_t two[2] = {ndx_test_in(d), ndx_test_in(d)};
  ndx_future_t* sum = NULL;
  CHECK_OK(ndx_invoke(ctx, "add", two, 2, NULL, NULL, &sum));
  ndx_tensor_t* s = NULL;
  CHECK_OK(ndx_future_tensor(sum, 0, &s));
  ndx_input_t back[1] = {ndx_test_in(s)};
  ndx_future_t* down = NULL;
  CHECK_OK(ndx_invoke(ctx, "to_host", back, 1, NULL, NULL, &down));
  ndx_tensor_t* r = NULL;
  CHECK_OK(ndx_future_tensor(down, 0, &r));
  float got[3] = {0, 0, 0};
  CHECK_OK(ndx_tensor_copy_to(r, got, sizeof got));
  CHECK(got[0] == 3.0f && got[1] == 5.0f && got[2] == 7.0f, "perturbed %g %g %g", got[0],
        got[1], got[2]);
  ndx_tensor_release(d);
  ndx_tensor_release(s);
  ndx_tensor_release(r);
  ndx_future_release(up);
  ndx_future_release(sum);
  ndx_future_release(down);
  ndx_context_release(ctx);
  ndx_tensor_release(t);
}

#if defined(NDX_TEST_HOOKS)
/* The debug backend checks runs on the device too. The built-in kernels keep their
 * promises, so the test hook makes one run misbehave as a faulty kernel would: the
 * debug backend fails it with NDX_ERROR_BACKEND at the invoking line (SYNC_CPU and
 * EAGER); the default backend trusts it. Needs a device. */
static void test_debug_backend_on_the_device(void) {
  if (ndx_cuda_device_count() == 0) return;
  const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int64_t shape[2] = {2, 4};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 2, shape, NULL, NULL, &t));
  static const struct {
    ndx_test_cuda_fault_t fault;
    const char* op;
    const char* fragment;
  } cases[] = {
      {NDX_TEST_CUDA_FAULT_WRITES_INPUT, "add",
       "debug backend: operator 'add' wrote into its input 0 (shape [2, 4], dtype float32)"},
      {NDX_TEST_CUDA_FAULT_ALIASES_INPUT, "sum",
       "debug backend: operator 'sum' output 0 shares memory with input 0"},
      {NDX_TEST_CUDA_FAULT_WRONG_DTYPE, "add",
       "debug backend: operator 'add' output 0 has dtype int32, its schema declares float32"},
      {NDX_TEST_CUDA_FAULT_WRONG_SHAPE, "add",
       "debug backend: operator 'add' output 0 has shape [8], its schema declares shape [2, 4]"},
      {NDX_TEST_CUDA_FAULT_WRONG_LAYOUT, "add",
       "debug backend: operator 'add' output 0 has layout \"WW\", its schema declares \"\""},
  };
  const int32_t modes[2] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_EAGER};
  for (int m = 0; m < 2; m++) {
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      for (int debug = 0; debug <= 1; debug++) {
        ndx_context_options_t o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.eval_mode = modes[m];
        o.backend = debug ? "debug" : "default";
        ndx_context_t* ctx = NULL;
        CHECK_OK(ndx_context_new(&o, &ctx));
        ndx_future_t* up = NULL;
        ndx_tensor_t* d = upload(ctx, t, &up);
        ndx_input_t two[2] = {ndx_test_in(d), ndx_test_in(d)};
        size_t n_in = strcmp(cases[c].op, "add") == 0 ? 2 : 1;
        CHECK_OK(ndx_test_cuda_fault(cases[c].op, cases[c].fault));
        ndx_invoke_options_t io;
        memset(&io, 0, sizeof io);
        io.struct_size = sizeof io;
        ndx_future_t* f = NULL;
        io.location = NDX_HERE; int line = __LINE__;
        CHECK_OK(ndx_invoke(ctx, cases[c].op, two, n_in, NULL, &io, &f));
        ndx_error_t* e = ndx_future_wait(f, -1);
        if (debug) {
          if (CHECK(e != NULL, "mode %d, fault %d: reported", (int)modes[m], (int)cases[c].fault)) {
            CHECK_LINK(e, NDX_ERROR_BACKEND, cases[c].fragment, cases[c].op, 2);
            CHECK_FRAME(e, 0, "test_cuda.c", line, NULL, 0);
          }
        } else {
          CHECK(e == NULL, "mode %d, fault %d: the default backend trusts the kernel",
                (int)modes[m], (int)cases[c].fault);
        }
        ndx_error_free(e);
        ndx_future_release(f);
        ndx_tensor_release(d);
        ndx_future_release(up);
        ndx_context_release(ctx);
      }
    }
  }
  ndx_tensor_release(t);
}
#endif

/* The context's default device for to_device: a negative id refused at
 * ndx_context_new, a missing one at the to_device invocation. */
static void test_context_device(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.cuda_device = -1;
  ndx_context_t* ctx = NULL;
  expect_error(ndx_context_new(&o, &ctx), NDX_ERROR_VALUE,
               "opts->cuda_device is -1, not a CUDA device id (0 or more)");
  CHECK(ctx == NULL, "no context");
  int32_t n = ndx_cuda_device_count();
  o.cuda_device = n + 4;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  CHECK_OK(ndx_context_new(&o, &ctx));
  const float v[2] = {1, 2};
  const int64_t shape[1] = {2};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t));
  ndx_input_t in[1] = {ndx_test_in(t)};
  ndx_future_t* f = NULL;
  char want[96];
  if (n > 0) {
    snprintf(want, sizeof want, "operator 'to_device': device %d does not exist", n + 4);
  } else {
    snprintf(want, sizeof want, "operator 'to_device': ");
  }
  expect_error(ndx_invoke(ctx, "to_device", in, 1, NULL, NULL, &f), NDX_ERROR_CUDA, want);
  CHECK(f == NULL, "no future");
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

int main(void) {
  test_discovery();
  test_context_device();
  test_accuracy_fault_on_the_device();
#if defined(NDX_TEST_HOOKS)
  test_debug_backend_on_the_device();
#endif
  test_to_device();
  test_streams();
  test_invoke_on_a_missing_device();
  return NDX_TEST_SUMMARY("test_cuda");
}
