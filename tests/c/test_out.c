/* Out tensors through the C ABI: results land in caller memory (wrapped, so the test
 * reads its own array) in SYNC_CPU, EAGER and DEFERRED, also at an address the dtype
 * is not aligned to; a strided out view is written element by element; an input may
 * be its own out tensor; mismatches are refused at ndx_invoke naming the out tensor; a
 * host operator, which infers nothing, fails its future on a mismatch, and its outputs
 * land in their out tensors whatever order it made them in; a sample's out tensor may
 * be another sample's input; batch_to_tensor stacks tensors into an out tensor; an
 * options struct from an older header (no out fields) is still accepted; an out
 * tensor's deleter has run once the context release that follows the wait returned. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ndx_test.h"

static ndx_tensor_t* wrap(float* data, int32_t ndim, const int64_t* shape,
                          const int64_t* strides) {
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_wrap_host(data, NDX_DTYPE_FLOAT32, ndim, shape, strides, NULL, NULL,
                                NULL, &t));
  return t;
}

static ndx_output_t out_of(const ndx_tensor_t* t) {
  ndx_output_t o = {t, NULL};
  return o;
}

static ndx_invoke_options_t with_outputs(const ndx_output_t* outs, size_t n) {
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.outputs = outs;
  o.n_outputs = n;
  return o;
}

static const int32_t MODES[3] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_EAGER, NDX_EVAL_DEFERRED};
static const char* const MODE_NAMES[3] = {"SYNC_CPU", "EAGER", "DEFERRED"};

/* A new context evaluating in `mode` (NULL, with the failure counted, on an error). */
static ndx_context_t* context_in(int32_t mode) {
  ndx_context_options_t co;
  memset(&co, 0, sizeof co);
  co.struct_size = sizeof co;
  co.eval_mode = mode;
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(&co, &ctx));
  return ctx;
}

static void test_modes(void) {
  for (int m = 0; m < 3; m++) {
    NDX_TEST_CONTEXT(MODE_NAMES[m]);
    ndx_context_t* ctx = context_in(MODES[m]);
    const float av[4] = {1, 2, 3, 4}, bv[2] = {10, 20};
    const int64_t sa[2] = {2, 2}, sb[1] = {2};
    ndx_tensor_t* a = ndx_test_tensor(av, NDX_DTYPE_FLOAT32, 2, sa);
    ndx_tensor_t* b = ndx_test_tensor(bv, NDX_DTYPE_FLOAT32, 1, sb);
    float buf[4] = {0, 0, 0, 0};
    ndx_tensor_t* out = wrap(buf, 2, sa, NULL);
    ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
    ndx_output_t outs[1] = {out_of(out)};
    ndx_invoke_options_t o = with_outputs(outs, 1);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "mul", in, 2, NULL, &o, &f));
    if (MODES[m] == NDX_EVAL_DEFERRED) {
      CHECK(buf[0] == 0.0f, "deferred work has not written yet");
    }
    CHECK_OK(ndx_future_wait(f, -1));
    const float want[4] = {10, 40, 30, 80};
    CHECK(memcmp(buf, want, sizeof want) == 0, "buf = %g %g %g %g", buf[0], buf[1], buf[2],
          buf[3]);
    ndx_tensor_t* r = ndx_test_output(f, 0);
    float got[4] = {0};
    CHECK_OK(ndx_tensor_copy_to(r, got, sizeof got));
    CHECK(memcmp(got, want, sizeof want) == 0, "the future's output reads the same");
    ndx_tensor_release(r);
    ndx_future_release(f);
    ndx_tensor_release(out);
    ndx_tensor_release(a);
    ndx_tensor_release(b);
    ndx_context_release(ctx);
  }
  NDX_TEST_CONTEXT(NULL);
}

/* An out tensor at an address its dtype is not aligned to gets the result: the kernel
 * does not write there through typed slices that need alignment (a caught panic, an
 * INTERNAL failure, before); the result is copied in. */
static void test_misaligned(void) {
  for (int m = 0; m < 3; m++) {
    NDX_TEST_CONTEXT(MODE_NAMES[m]);
    ndx_context_t* ctx = context_in(MODES[m]);
    const float av[3] = {1, -2, 3};
    const int64_t n3 = 3;
    ndx_tensor_t* a = ndx_test_tensor(av, NDX_DTYPE_FLOAT32, 1, &n3);
    uint32_t buf[4] = {0, 0, 0, 0};
    unsigned char* at = (unsigned char*)buf + 1;
    ndx_tensor_t* out = NULL;
    CHECK_OK(ndx_tensor_wrap_host(at, NDX_DTYPE_FLOAT32, 1, &n3, NULL, NULL, NULL, NULL, &out));
    ndx_input_t in[1] = {ndx_test_in(a)};
    ndx_output_t outs[1] = {out_of(out)};
    ndx_invoke_options_t o = with_outputs(outs, 1);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    const float want[3] = {-1, 2, -3};
    CHECK(memcmp(at, want, sizeof want) == 0, "the result is in the misaligned buffer");
    ndx_future_release(f);
    ndx_tensor_release(out);
    ndx_tensor_release(a);
    ndx_context_release(ctx);
  }
  NDX_TEST_CONTEXT(NULL);
}

static void test_strided_and_in_place(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  /* Column 1 of a 3 x 2 buffer receives neg(x). */
  const float xv[3] = {1, 2, 3};
  const int64_t n3[1] = {3}, stride2[1] = {2};
  ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 1, n3);
  float grid[6] = {0, 0, 0, 0, 0, 0};
  ndx_tensor_t* col = wrap(grid + 1, 1, n3, stride2);
  ndx_input_t in[1] = {ndx_test_in(x)};
  ndx_output_t outs[1] = {out_of(col)};
  ndx_invoke_options_t o = with_outputs(outs, 1);
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, &o, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  const float want[6] = {0, -1, 0, -2, 0, -3};
  CHECK(memcmp(grid, want, sizeof want) == 0, "grid = %g %g %g %g %g %g", grid[0], grid[1],
        grid[2], grid[3], grid[4], grid[5]);
  ndx_future_release(f);

  /* y = y * y, in place. */
  float yv[3] = {2, 3, 4};
  ndx_tensor_t* y = wrap(yv, 1, n3, NULL);
  ndx_input_t in2[2] = {ndx_test_in(y), ndx_test_in(y)};
  ndx_output_t outs2[1] = {out_of(y)};
  o = with_outputs(outs2, 1);
  CHECK_OK(ndx_invoke(ctx, "mul", in2, 2, NULL, &o, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  CHECK(yv[0] == 4 && yv[1] == 9 && yv[2] == 16, "yv = %g %g %g", yv[0], yv[1], yv[2]);
  ndx_future_release(f);
  ndx_tensor_release(y);
  ndx_tensor_release(col);
  ndx_tensor_release(x);
  ndx_context_release(ctx);
}

static void test_refusals(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  const float xv[4] = {1, 2, 3, 4};
  const int64_t s22[2] = {2, 2}, s4[1] = {4}, bad_strides[2] = {1, 0};
  ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 2, s22);
  float buf[4] = {0};
  ndx_tensor_t* flat = wrap(buf, 1, s4, NULL);
  ndx_tensor_t* overlapping = wrap(buf, 2, s22, bad_strides);
  ndx_import_options_t ro = ndx_test_options(NULL, true);
  ndx_tensor_t* read_only = NULL;
  CHECK_OK(ndx_tensor_wrap_host(buf, NDX_DTYPE_FLOAT32, 2, s22, NULL, NULL, NULL, &ro,
                                &read_only));
  ndx_input_t in[1] = {ndx_test_in(x)};
  ndx_future_t* f = (ndx_future_t*)&f; /* must be reset to NULL */
  ndx_output_t outs[1] = {out_of(flat)};
  ndx_invoke_options_t o = with_outputs(outs, 1);
  expect_error(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "operator 'abs': outputs[0] is float32 [4], expected float32 [2, 2]");
  CHECK(f == NULL, "no future on a call-time error");
  outs[0] = out_of(overlapping);
  expect_error(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "outputs[0] has strides [1, 0] for shape [2, 2]");
  outs[0] = out_of(read_only);
  expect_error(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "outputs[0] is read-only");
  ndx_output_t two[2] = {out_of(flat), {NULL, NULL}};
  o = with_outputs(two, 2);
  expect_error(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "2 out tensors given, but it has 1 output");
  CHECK(buf[0] == 0 && buf[3] == 0, "refused calls wrote nothing");
  ndx_tensor_release(read_only);
  ndx_tensor_release(overlapping);
  ndx_tensor_release(flat);
  ndx_tensor_release(x);
  ndx_context_release(ctx);
}

/* A host kernel returning a float32 [3] tensor whatever its input. */
static ndx_error_t* k_three(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                            const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)inputs; (void)n_inputs; (void)args; (void)n_outputs;
  const float v[3] = {7, 8, 9};
  const int64_t n = 3;
  return ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, &n, NULL, NULL, &outputs[0]);
}

static void test_host_operator(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  CHECK_OK(ndx_register_op(ctx, "three", &s, k_three, NULL, NULL));
  const float xv[1] = {0};
  const int64_t n1 = 1, n2 = 2, n3 = 3;
  ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 1, &n1);
  ndx_input_t in[1] = {ndx_test_in(x)};
  float good[3] = {0}, small[2] = {0};
  ndx_tensor_t* fits = wrap(good, 1, &n3, NULL);
  ndx_tensor_t* too_small = wrap(small, 1, &n2, NULL);
  ndx_output_t outs[1] = {out_of(fits)};
  ndx_invoke_options_t o = with_outputs(outs, 1);
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "three", in, 1, NULL, &o, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  CHECK(good[0] == 7 && good[2] == 9, "copied into the out tensor");
  ndx_future_release(f);
  outs[0] = out_of(too_small);
  int line = __LINE__; CHECK_OK(ndx_invoke(ctx, "three", in, 1, NULL, &o, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  CHECK_LINK(e, NDX_ERROR_VALUE, "output 0 is float32 [3], but its out tensor is float32 [2]",
             "three", 2);
  CHECK_FRAME(e, 0, "test_out.c", line, NULL, NDX_FRAME_NATIVE);
  ndx_error_free(e);
  ndx_future_release(f);
  ndx_tensor_release(too_small);
  ndx_tensor_release(fits);
  ndx_tensor_release(x);
  ndx_context_release(ctx);
}

/* A host kernel with two float32 [3] outputs that makes output 1 before output 0. */
static ndx_error_t* k_second_first(void* user, const ndx_tensor_t* const* inputs,
                                   size_t n_inputs, const ndx_args_t* args,
                                   ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)inputs; (void)n_inputs; (void)args; (void)n_outputs;
  const float first[3] = {1, 2, 3}, second[3] = {4, 5, 6};
  const int64_t n = 3;
  ndx_error_t* e = ndx_tensor_from_host(second, NDX_DTYPE_FLOAT32, 1, &n, NULL, NULL,
                                        &outputs[1]);
  if (e) return e;
  return ndx_tensor_from_host(first, NDX_DTYPE_FLOAT32, 1, &n, NULL, NULL, &outputs[0]);
}

/* Each output lands in its own out tensor, whatever order the kernel made them in. */
static void test_host_outputs_made_out_of_order(void) {
  for (int m = 0; m < 3; m++) {
    ndx_context_t* ctx = context_in(MODES[m]);
    ndx_op_schema_t s = ndx_test_schema(1, 2);
    CHECK_OK(ndx_register_op(ctx, "two", &s, k_second_first, NULL, NULL));
    const float xv[1] = {0};
    const int64_t n1 = 1, n3 = 3;
    ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 1, &n1);
    ndx_input_t in[1] = {ndx_test_in(x)};
    float first[3] = {0}, second[3] = {0};
    ndx_tensor_t* o0 = wrap(first, 1, &n3, NULL);
    ndx_tensor_t* o1 = wrap(second, 1, &n3, NULL);
    ndx_output_t outs[2] = {out_of(o0), out_of(o1)};
    ndx_invoke_options_t o = with_outputs(outs, 2);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "two", in, 1, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(first[0] == 1 && first[1] == 2 && first[2] == 3, "output 0 in its out tensor");
    CHECK(second[0] == 4 && second[1] == 5 && second[2] == 6, "output 1 in its out tensor");
    ndx_future_release(f);
    ndx_tensor_release(o0);
    ndx_tensor_release(o1);
    ndx_tensor_release(x);
    ndx_context_release(ctx);
  }
}

/* An out tensor for one output of a host kernel is not lent to the kernel's allocations:
 * output 1, made first, took the out tensor of output 0 (same dtype and shape), stayed a
 * view of it and was overwritten with output 0 - both outputs read {1, 2, 3}. */
static void test_host_other_output_not_in_an_out_tensor(void) {
  for (int m = 0; m < 3; m++) {
    ndx_context_t* ctx = context_in(MODES[m]);
    ndx_op_schema_t s = ndx_test_schema(1, 2);
    CHECK_OK(ndx_register_op(ctx, "two", &s, k_second_first, NULL, NULL));
    const float xv[1] = {0};
    const int64_t n1 = 1, n3 = 3;
    ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 1, &n1);
    ndx_input_t in[1] = {ndx_test_in(x)};
    float first[3] = {0};
    ndx_tensor_t* o0 = wrap(first, 1, &n3, NULL);
    ndx_output_t outs[2] = {out_of(o0), {NULL, NULL}};
    ndx_invoke_options_t o = with_outputs(outs, 2);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "two", in, 1, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    ndx_tensor_t* r1 = NULL;
    CHECK_OK(ndx_future_tensor(f, 1, &r1));
    float v1[3] = {0};
    CHECK_OK(ndx_tensor_copy_to(r1, v1, sizeof v1));
    CHECK(v1[0] == 4 && v1[1] == 5 && v1[2] == 6, "output 1 keeps its values: %g %g %g", v1[0],
          v1[1], v1[2]);
    CHECK(first[0] == 1 && first[1] == 2 && first[2] == 3, "output 0 in its out tensor");
    ndx_tensor_release(r1);
    ndx_future_release(f);
    ndx_tensor_release(o0);
    ndx_tensor_release(x);
    ndx_context_release(ctx);
  }
}

/* A batch of two float32 [2] samples over caller memory at `a` and `b`. */
static ndx_batch_t* batch_over(float* a, float* b) {
  const int64_t n2 = 2;
  const float zeros[2] = {0, 0};
  DLManagedTensorVersioned* v[2] = {
      ndx_test_versioned(NULL, NDX_TEST_DL_F32, 1, &n2, NULL, zeros, sizeof zeros),
      ndx_test_versioned(NULL, NDX_TEST_DL_F32, 1, &n2, NULL, zeros, sizeof zeros)};
  v[0]->dl_tensor.data = a;
  v[1]->dl_tensor.data = b;
  ndx_batch_t* batch = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, NULL, &batch));
  return batch;
}

/* An out tensor or batch must hold data: the output of an invocation that failed is
 * refused with that failure's message, a pending batch output like a pending tensor; a
 * batch for a tensor output is a type error, as ndx_future_batch of a tensor output
 * (and ndx_future_tensor of a batch output) is. Refused calls write nothing. */
static void test_failed_pending_and_mismatched_outputs(void) {
  ndx_context_t* ctx = context_in(NDX_EVAL_SYNC_CPU);
  const int32_t nv[2] = {1, 2}, dv[2] = {1, 0};
  const int64_t s2[1] = {2};
  ndx_tensor_t* n = ndx_test_tensor(nv, NDX_DTYPE_INT32, 1, s2);
  ndx_tensor_t* d = ndx_test_tensor(dv, NDX_DTYPE_INT32, 1, s2);
  ndx_input_t nd[2] = {ndx_test_in(n), ndx_test_in(d)};
  ndx_future_t* failed = NULL;
  CHECK_OK(ndx_invoke(ctx, "div", nd, 2, NULL, NULL, &failed));
  expect_error(ndx_future_wait(failed, -1), NDX_ERROR_VALUE, "integer division by zero");
  ndx_tensor_t* failed_out = NULL;
  CHECK_OK(ndx_future_tensor(failed, 0, &failed_out));
  ndx_output_t outs[1] = {out_of(failed_out)};
  ndx_invoke_options_t o = with_outputs(outs, 1);
  ndx_future_t* f = (ndx_future_t*)&f; /* must be reset to NULL */
  expect_error(ndx_invoke(ctx, "neg", nd, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "opts->outputs[0] is the output of 'div' (#1), which failed: integer "
               "division by zero (output element 1)");
  CHECK(f == NULL, "no future on a call-time error");

  float a0[2] = {1, -2}, a1[2] = {-3, 4}, o0[2] = {0, 0}, o1[2] = {0, 0};
  ndx_batch_t* in_batch = batch_over(a0, a1);
  ndx_batch_t* out_batch = batch_over(o0, o1);
  ndx_input_t bin[1] = {{NULL, in_batch}};
  ndx_invoke_options_t deferred;
  memset(&deferred, 0, sizeof deferred);
  deferred.struct_size = sizeof deferred;
  deferred.mode = NDX_EVAL_DEFERRED;
  ndx_future_t* pending_f = NULL;
  CHECK_OK(ndx_invoke(ctx, "abs", bin, 1, NULL, &deferred, &pending_f));
  ndx_batch_t* pending = NULL;
  CHECK_OK(ndx_future_batch(pending_f, 0, &pending));
  outs[0].tensor = NULL;
  outs[0].batch = pending;
  expect_error(ndx_invoke(ctx, "neg", bin, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "opts->outputs[0] is the output of 'abs' (#2), which is still pending");
  ndx_tensor_t* as_tensor = (ndx_tensor_t*)&as_tensor;
  expect_error(ndx_future_tensor(pending_f, 0, &as_tensor), NDX_ERROR_TYPE,
               "output 0 of 'abs' (#2) is a batch; use ndx_future_batch");
  CHECK(as_tensor == NULL, "no tensor for a batch output");

  outs[0].batch = out_batch;
  expect_error(ndx_invoke(ctx, "neg", nd, 1, NULL, &o, &f), NDX_ERROR_TYPE,
               "outputs[0] is a batch, but output 0 is a tensor");
  CHECK(o0[0] == 0 && o0[1] == 0 && o1[0] == 0 && o1[1] == 0, "refused calls wrote nothing");
  ndx_future_t* g = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", nd, 1, NULL, NULL, &g));
  ndx_batch_t* as_batch = (ndx_batch_t*)&as_batch;
  expect_error(ndx_future_batch(g, 0, &as_batch), NDX_ERROR_TYPE,
               "output 0 of 'neg' (#3) is a tensor; use ndx_future_tensor");
  CHECK(as_batch == NULL, "no batch for a tensor output");

  ndx_future_release(g);
  ndx_batch_release(pending);
  ndx_future_release(pending_f);
  ndx_batch_release(out_batch);
  ndx_batch_release(in_batch);
  ndx_tensor_release(failed_out);
  ndx_future_release(failed);
  ndx_tensor_release(d);
  ndx_tensor_release(n);
  ndx_context_release(ctx);
}

/* A host kernel returning its input (retained). */
static ndx_error_t* k_pass(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                           const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)n_inputs; (void)args; (void)n_outputs;
  __atomic_fetch_add((int*)user, 1, __ATOMIC_SEQ_CST);
  ndx_error_t* e = ndx_tensor_retain(inputs[0]);
  if (e == NULL) outputs[0] = (ndx_tensor_t*)inputs[0];
  return e;
}

/* An out batch of the wrong number of samples for a per-sample host operator is refused
 * at ndx_invoke naming it, as for a built-in operator, and nothing is written. It was
 * taken, and the invocation failed in its future with "sample index 2 is out of range
 * for a batch of 2 samples" (naming neither the out batch nor the count expected). */
static void test_host_out_batch_of_the_wrong_length(void) {
  for (int m = 0; m < 3; m++) {
    NDX_TEST_CONTEXT(MODE_NAMES[m]);
    ndx_context_t* ctx = context_in(MODES[m]);
    ndx_op_schema_t s = ndx_test_schema(1, 1);
    int calls = 0;
    CHECK_OK(ndx_register_op(ctx, "pass", &s, k_pass, &calls, NULL));
    const int64_t n2 = 2;
    const float ones[2] = {1, 1};
    DLManagedTensorVersioned* v[3];
    for (int k = 0; k < 3; k++) {
      v[k] = ndx_test_versioned(NULL, NDX_TEST_DL_F32, 1, &n2, NULL, ones, sizeof ones);
    }
    ndx_batch_t* in_batch = NULL;
    CHECK_OK(ndx_batch_from_dlpack_versioned(v, 3, NULL, &in_batch));
    float a[2] = {0, 0}, b[2] = {0, 0};
    ndx_batch_t* out_batch = batch_over(a, b);
    ndx_input_t in[1] = {{NULL, in_batch}};
    ndx_output_t outs[1] = {{NULL, out_batch}};
    ndx_invoke_options_t o = with_outputs(outs, 1);
    ndx_future_t* f = NULL;
    expect_error(ndx_invoke(ctx, "pass", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
                 "operator 'pass': outputs[0] is a batch of 2 samples, expected 3");
    CHECK(f == NULL, "no future");
    ndx_future_release(f);
    CHECK_OK(ndx_context_evaluate(ctx));
    CHECK(__atomic_load_n(&calls, __ATOMIC_SEQ_CST) == 0, "the kernel ran %d times", calls);
    CHECK(a[0] == 0 && a[1] == 0 && b[0] == 0 && b[1] == 0, "nothing written");
    ndx_batch_release(out_batch);
    ndx_batch_release(in_batch);
    ndx_context_release(ctx);
    NDX_TEST_CONTEXT(NULL);
  }
}

/* Per-sample runs where one sample's out tensor is another sample's input: every
 * input is read before anything is written, as NumPy would compute it. */
static void test_batch_out_over_another_samples_input(void) {
  for (int m = 0; m < 3; m++) {
    ndx_context_t* ctx = context_in(MODES[m]);
    /* neg over the two halves of one buffer, each written over the other half. */
    float buf[4] = {1, 2, 3, 4};
    ndx_batch_t* in = batch_over(buf, buf + 2);
    ndx_batch_t* out = batch_over(buf + 2, buf);
    ndx_input_t ins[1] = {{NULL, in}};
    ndx_output_t outs[1] = {{NULL, out}};
    ndx_invoke_options_t o = with_outputs(outs, 1);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "neg", ins, 1, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(buf[0] == -3 && buf[1] == -4 && buf[2] == -1 && buf[3] == -2,
          "swapped halves: %g %g %g %g", buf[0], buf[1], buf[2], buf[3]);
    ndx_future_release(f);
    ndx_batch_release(in);
    ndx_batch_release(out);
    /* A tensor every sample reads, overwritten by sample 0's out tensor. */
    float shared[2] = {10, 20}, x[4] = {1, 2, 3, 4}, second[2] = {0, 0};
    const int64_t n2 = 2;
    ndx_tensor_t* t = wrap(shared, 1, &n2, NULL);
    in = batch_over(x, x + 2);
    out = batch_over(shared, second);
    ndx_input_t ins2[2] = {{NULL, in}, ndx_test_in(t)};
    outs[0].batch = out;
    CHECK_OK(ndx_invoke(ctx, "add", ins2, 2, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(shared[0] == 11 && shared[1] == 22 && second[0] == 13 && second[1] == 24,
          "shared input: %g %g, %g %g", shared[0], shared[1], second[0], second[1]);
    ndx_future_release(f);
    ndx_batch_release(in);
    ndx_batch_release(out);
    ndx_tensor_release(t);
    ndx_context_release(ctx);
  }
}

static void test_batch_to_tensor(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  const float av[2] = {1, 2}, bv[2] = {3, 4};
  const int64_t n2 = 2, s22[2] = {2, 2};
  ndx_tensor_t* a = ndx_test_tensor(av, NDX_DTYPE_FLOAT32, 1, &n2);
  ndx_tensor_t* b = ndx_test_tensor(bv, NDX_DTYPE_FLOAT32, 1, &n2);
  float buf[4] = {0};
  ndx_tensor_t* out = wrap(buf, 2, s22, NULL);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_output_t outs[1] = {out_of(out)};
  ndx_invoke_options_t o = with_outputs(outs, 1);
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "batch_to_tensor", in, 2, NULL, &o, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  CHECK(buf[0] == 1 && buf[1] == 2 && buf[2] == 3 && buf[3] == 4, "stacked rows");
  ndx_future_release(f);
  ndx_tensor_release(out);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

static void test_old_options_struct(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  const float xv[2] = {-1, 2};
  const int64_t n2 = 2;
  ndx_tensor_t* x = ndx_test_tensor(xv, NDX_DTYPE_FLOAT32, 1, &n2);
  ndx_input_t in[1] = {ndx_test_in(x)};
  ndx_invoke_options_t o;
  memset(&o, 0xff, sizeof o); /* the fields an old caller lacks hold garbage */
  o.struct_size = offsetof(ndx_invoke_options_t, outputs);
  o.location.file = NULL;
  o.mode = 0;
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  ndx_future_release(f);
  o.struct_size = offsetof(ndx_invoke_options_t, mode);
  expect_error(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &f), NDX_ERROR_VALUE,
               "opts->struct_size is");
  ndx_tensor_release(x);
  ndx_context_release(ctx);
}

static int n_out_freed;
static void count_out_free(void* data, void* user) {
  (void)data;
  (void)user;
  __atomic_fetch_add(&n_out_freed, 1, __ATOMIC_SEQ_CST);
}

/* Once the caller waited for an EAGER invocation, released everything it holds and
 * released the context, the out tensor's deleter has run: the worker that finished the
 * invocation let go of it before ndx_context_release returned. */
static void test_deleter_ran_when_the_context_release_returns(void) {
  for (int i = 0; i < 300; i++) {
    ndx_context_t* ctx = context_in(NDX_EVAL_EAGER);
    static float av[4096], buf[4096];
    for (int k = 0; k < 4096; k++) av[k] = (float)k;
    memset(buf, 0, sizeof buf);
    const int64_t shape[1] = {4096};
    ndx_tensor_t* a = ndx_test_tensor(av, NDX_DTYPE_FLOAT32, 1, shape);
    ndx_tensor_t* out = NULL;
    CHECK_OK(ndx_tensor_wrap_host(buf, NDX_DTYPE_FLOAT32, 1, shape, NULL, count_out_free,
                                  NULL, NULL, &out));
    ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
    ndx_output_t outs[1] = {out_of(out)};
    ndx_invoke_options_t o = with_outputs(outs, 1);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, &o, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    ndx_future_release(f);
    ndx_tensor_release(out);
    ndx_tensor_release(a);
    ndx_context_release(ctx);
    int freed = __atomic_load_n(&n_out_freed, __ATOMIC_SEQ_CST);
    if (freed != i + 1) {
      CHECK(0, "run %d: the out tensor's deleter ran %d times by the time "
               "ndx_context_release returned, want %d", i, freed, i + 1);
      return;
    }
    CHECK(buf[4095] == 8190.0f, "the add wrote its out tensor (buf[4095] = %g)", buf[4095]);
  }
}

int main(void) {
  test_modes();
  test_misaligned();
  test_strided_and_in_place();
  test_refusals();
  test_failed_pending_and_mismatched_outputs();
  test_host_operator();
  test_host_outputs_made_out_of_order();
  test_host_other_output_not_in_an_out_tensor();
  test_batch_out_over_another_samples_input();
  test_host_out_batch_of_the_wrong_length();
  test_batch_to_tensor();
  test_old_options_struct();
  test_deleter_ran_when_the_context_release_returns();
  return NDX_TEST_SUMMARY("test_out");
}
