/*
 * bench_invoke.c - per-invocation overheads of ndx measured from C through the real
 * ABI (libndx.so), printed from one run. Build: the CMake target `bench_invoke`
 * (not a test: timings are never asserted). Run: ./build/bench_invoke. Also times a
 * bulk import of 1024 host DLPack tensors as one batch.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ndx.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void check(ndx_error_t* e, const char* what) {
  if (e) {
    fprintf(stderr, "%s failed: %s\n", what, ndx_error_message(e));
    ndx_error_free(e);
    exit(1);
  }
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

#define ROUNDS 15
#define BULK 1024

/* The deleter of the benchmark's DLPack tensors: their memory is static. */
static void keep(DLManagedTensorVersioned* m) { (void)m; }

/* Median over ROUNDS of the mean time per iteration of `body`. */
#define BENCH(result, iters, setup, body, teardown)                  \
  do {                                                               \
    double samples_[ROUNDS];                                         \
    for (int r_ = 0; r_ < ROUNDS; ++r_) {                            \
      setup;                                                         \
      double t0_ = now_ns();                                         \
      for (int i_ = 0; i_ < (iters); ++i_) {                         \
        body;                                                        \
      }                                                              \
      samples_[r_] = (now_ns() - t0_) / (iters);                     \
      teardown;                                                      \
    }                                                                \
    qsort(samples_, ROUNDS, sizeof(double), cmp);                    \
    (result) = samples_[ROUNDS / 2];                                 \
  } while (0)

static ndx_context_t* make_context(int32_t mode, int32_t policy) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = mode;
  o.capture_policy = policy;
  ndx_context_t* ctx = NULL;
  check(ndx_context_new(&o, &ctx), "ndx_context_new");
  return ctx;
}

int main(void) {
  float data[16];
  for (int i = 0; i < 16; ++i) data[i] = (float)i;
  int64_t shape[1] = {16};
  ndx_tensor_t* t = NULL;
  check(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t), "from_host");
  ndx_input_t in[2] = {{t, NULL}, {t, NULL}};
  ndx_invoke_options_t here = {.struct_size = sizeof here, .location = NDX_HERE};
  enum { N = 2000 };
  static ndx_future_t* futures[N];
  double deferred_off, deferred_here, deferred_native, sync_cpu, eager, poll;

  printf("ndx %s: per-invocation overheads from C (ns, median of %d rounds; 16-element f32 add)\n",
         ndx_version_string(), ROUNDS);

  ndx_context_t* ctx = NULL;
#define DEFERRED_CASE(result, policy, opts)                                                   \
  BENCH(result, N, ctx = make_context(NDX_EVAL_DEFERRED, policy),                            \
        check(ndx_invoke(ctx, "add", in, 2, NULL, opts, &futures[i_]), "invoke"),            \
        for (int k = 0; k < N; ++k) ndx_future_release(futures[k]);                          \
        ndx_context_release(ctx))
  DEFERRED_CASE(deferred_off, NDX_CAPTURE_OFF, NULL);
  DEFERRED_CASE(deferred_here, NDX_CAPTURE_OFF, &here);
  DEFERRED_CASE(deferred_native, NDX_CAPTURE_NATIVE, NULL);
  printf("  deferred enqueue, capture OFF (caller frame)      %8.0f\n", deferred_off);
  printf("  deferred enqueue, NDX_HERE location               %8.0f\n", deferred_here);
  printf("  deferred enqueue, capture NATIVE (16 frames)      %8.0f\n", deferred_native);

  ctx = make_context(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF);
  BENCH(sync_cpu, N, (void)0, {
    ndx_future_t* f = NULL;
    check(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f), "invoke");
    ndx_future_release(f);
  }, (void)0);
  ndx_context_release(ctx);
  printf("  sync_cpu invoke (runs the add inline)             %8.0f\n", sync_cpu);

  ctx = make_context(NDX_EVAL_EAGER, NDX_CAPTURE_OFF);
  BENCH(eager, 500, (void)0, {
    ndx_future_t* f = NULL;
    check(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f), "invoke");
    check(ndx_future_wait(f, -1), "wait");
    ndx_future_release(f);
  }, (void)0);
  printf("  eager enqueue -> ready (invoke + wait)            %8.0f\n", eager);

  ndx_future_t* done = NULL;
  check(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &done), "invoke");
  check(ndx_future_wait(done, -1), "wait");
  volatile int32_t sink = 0;
  BENCH(poll, 100000, (void)0, sink += ndx_future_poll(done), (void)0);
  (void)sink;
  printf("  poll (completed future)                           %8.1f\n", poll);
  ndx_future_release(done);
  ndx_context_release(ctx);
  ndx_tensor_release(t);

  /* Bulk import of BULK host DLPack tensors as one batch, and its release. */
  static float bulk_data[BULK][16];
  static int64_t bulk_shape[1] = {16};
  static DLManagedTensorVersioned bulk[BULK];
  static DLManagedTensorVersioned* bulk_ptrs[BULK];
  for (int i = 0; i < BULK; i++) {
    memset(&bulk[i], 0, sizeof bulk[i]);
    bulk[i].version.major = DLPACK_MAJOR_VERSION;
    bulk[i].version.minor = DLPACK_MINOR_VERSION;
    bulk[i].deleter = keep;
    bulk[i].dl_tensor.data = bulk_data[i];
    bulk[i].dl_tensor.device.device_type = kDLCPU;
    bulk[i].dl_tensor.ndim = 1;
    bulk[i].dl_tensor.dtype.code = kDLFloat;
    bulk[i].dl_tensor.dtype.bits = 32;
    bulk[i].dl_tensor.dtype.lanes = 1;
    bulk[i].dl_tensor.shape = bulk_shape;
    bulk_ptrs[i] = &bulk[i];
  }
  double bulk_import;
  BENCH(bulk_import, 200, (void)0, {
    ndx_batch_t* b = NULL;
    check(ndx_batch_from_dlpack_versioned(bulk_ptrs, BULK, NULL, &b), "bulk import");
    ndx_batch_release(b);
  }, (void)0);
  printf("  bulk import of %d host tensors + release (us)   %8.1f\n", BULK, bulk_import / 1e3);
  return 0;
}
