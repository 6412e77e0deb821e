/* The `debug` backend: host operators whose kernels break their schema's promises
 * (dtype, rank, layout, aliasing, writing into an input) fail with NDX_ERROR_BACKEND
 * at the invocation's site, while the same kernels pass the default backend; built-in
 * operators pass it untouched; old-sized schemas stay accepted. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ndx_test.h"

typedef struct {
  float* wrapped; /* a buffer the "scribble" kernel writes into (the input's memory) */
} lie_state;

/* Copies input 0 into a new float32 1-d tensor (whatever the schema says). */
static ndx_error_t* k_copy_f32(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                               const ndx_args_t* args, ndx_tensor_t** outputs,
                               size_t n_outputs) {
  (void)user; (void)args; (void)n_inputs; (void)n_outputs;
  float buf[4];
  ndx_error_t* e = ndx_tensor_copy_to(inputs[0], buf, sizeof buf);
  if (e) return e;
  const int64_t shape[1] = {4};
  return ndx_tensor_from_host(buf, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &outputs[0]);
}

/* Returns its input as its output (a view: the same memory). */
static ndx_error_t* k_alias(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                            const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)args; (void)n_inputs; (void)n_outputs;
  ndx_error_t* e = ndx_tensor_retain(inputs[0]);
  if (e) return e;
  outputs[0] = (ndx_tensor_t*)inputs[0];
  return NULL;
}

/* Writes into the memory behind its input, then copies it. */
static ndx_error_t* k_scribble(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                               const ndx_args_t* args, ndx_tensor_t** outputs,
                               size_t n_outputs) {
  lie_state* s = (lie_state*)user;
  s->wrapped[2] = -1.0f;
  return k_copy_f32(user, inputs, n_inputs, args, outputs, n_outputs);
}

static void register_with(ndx_context_t* ctx, const char* name, ndx_kernel_fn_t k, void* user,
                          const int32_t* dtypes, const int32_t* ndims, const char* const* layouts,
                          uint32_t flags) {
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  s.output_dtypes = dtypes;
  s.output_ndims = ndims;
  s.output_layouts = layouts;
  s.flags = flags;
  CHECK_OK(ndx_register_op(ctx, name, &s, k, user, NULL));
}

/* Invokes `op` on `in` (SYNC_CPU) and returns the execution error (NULL if none); the
 * line of the ndx_invoke call goes to *line. */
static ndx_error_t* run(ndx_context_t* ctx, const char* op, const ndx_tensor_t* in, int* line) {
  ndx_input_t inputs[1] = {ndx_test_in(in)};
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = NDX_EVAL_SYNC_CPU;
  ndx_future_t* f = NULL;
  o.location = NDX_HERE; *line = __LINE__;
  ndx_error_t* e = ndx_invoke(ctx, op, inputs, 1, NULL, &o, &f);
  if (e) return e;
  e = ndx_future_wait(f, -1);
  ndx_future_release(f);
  return e;
}

/* `seq`: the invocation's sequence number in its context (1 for the first). */
static void expect_backend(ndx_context_t* ctx, const char* op, const ndx_tensor_t* in,
                           uint64_t seq, const char* fragment) {
  int line = 0;
  ndx_error_t* e = run(ctx, op, in, &line);
  if (CHECK(e != NULL, "%s: the debug backend reports the violation", op)) {
    CHECK_LINK(e, NDX_ERROR_BACKEND, fragment, op, seq);
    CHECK_FRAME(e, 0, "test_debug_backend.c", line, NULL, 0);
    ndx_error_free(e);
  }
}

static void expect_ok(ndx_context_t* ctx, const char* op, const ndx_tensor_t* in) {
  int line = 0;
  CHECK_OK(run(ctx, op, in, &line));
}

static void test_violations(void) {
  static float data[4] = {1, 2, 3, 4};
  const int64_t shape[1] = {4};
  lie_state st = {data};
  ndx_tensor_t* in = NULL;
  CHECK_OK(ndx_tensor_wrap_host(data, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, NULL, NULL, &in));
  ndx_tensor_t* hwc = NULL;
  {
    const int64_t s3[3] = {1, 4, 1};
    ndx_import_options_t io;
    memset(&io, 0, sizeof io);
    io.struct_size = sizeof io;
    io.layout = "HWC";
    CHECK_OK(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 3, s3, NULL, &io, &hwc));
  }

  const int32_t i32[1] = {NDX_DTYPE_INT32};
  const int32_t f32[1] = {NDX_DTYPE_FLOAT32};
  const int32_t any_dtype[1] = {-1};
  const int32_t rank2[1] = {2};
  const int32_t rank1[1] = {1};
  const char* const hwc_layout[1] = {"HWC"};

  for (int debug = 0; debug <= 1; debug++) {
    ndx_context_t* ctx = NULL;
    CHECK_OK(ndx_context_new(NULL, &ctx));
    if (debug) CHECK_OK(ndx_context_set_backend(ctx, "debug"));
    register_with(ctx, "says_int32", k_copy_f32, NULL, i32, NULL, NULL, 0);
    register_with(ctx, "says_rank2", k_copy_f32, NULL, any_dtype, rank2, NULL, 0);
    register_with(ctx, "says_hwc", k_copy_f32, NULL, NULL, NULL, hwc_layout, 0);
    register_with(ctx, "aliases", k_alias, NULL, NULL, NULL, NULL, 0);
    register_with(ctx, "may_alias", k_alias, NULL, NULL, NULL, NULL, NDX_OP_OUTPUTS_MAY_ALIAS);
    register_with(ctx, "scribbles", k_scribble, &st, NULL, NULL, NULL, 0);
    register_with(ctx, "honest", k_copy_f32, NULL, f32, rank1, NULL, 0);
    if (debug) {
      expect_backend(ctx, "says_int32", in, 1, "output 0 has dtype float32, its schema declares int32");
      expect_backend(ctx, "says_rank2", in, 2, "output 0 has shape [4], its schema declares rank 2");
      expect_backend(ctx, "says_hwc", in, 3, "output 0 has layout \"\", its schema declares \"HWC\"");
      expect_backend(ctx, "aliases", in, 4, "output 0 shares memory with input 0");
      data[2] = 3.0f;
      expect_backend(ctx, "scribbles", in, 5, "wrote into its input 0 (shape [4], dtype float32)");
    } else {
      /* The default backend trusts the kernel. */
      expect_ok(ctx, "says_int32", in);
      expect_ok(ctx, "says_rank2", in);
      expect_ok(ctx, "says_hwc", in);
      expect_ok(ctx, "aliases", in);
      data[2] = 3.0f;
      expect_ok(ctx, "scribbles", in);
    }
    data[2] = 3.0f;
    expect_ok(ctx, "may_alias", in);
    expect_ok(ctx, "honest", in);
    /* Built-in operators pass the debug backend: elementwise, reduction, image. */
    {
      ndx_input_t two[2] = {ndx_test_in(in), ndx_test_in(in)};
      ndx_future_t* f = NULL;
      CHECK_OK(ndx_invoke(ctx, "add", two, 2, NULL, NULL, &f));
      CHECK_OK(ndx_future_wait(f, -1));
      ndx_future_release(f);
      int line = 0;
      CHECK_OK(run(ctx, "sum", in, &line));
      CHECK_OK(run(ctx, "flip_horizontal", hwc, &line));
    }
    ndx_context_release(ctx);
  }
  ndx_tensor_release(hwc);
  ndx_tensor_release(in);
}

static void test_schema_versions(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_op_schema_t s;
  memset(&s, 0, sizeof s);
  s.n_inputs = 1;
  s.n_outputs = 1;
  /* A schema from before the output promises ends at `arg_types`: still accepted. */
  s.struct_size = offsetof(ndx_op_schema_t, output_dtypes);
  CHECK_OK(ndx_register_op(ctx, "old_schema", &s, k_copy_f32, NULL, NULL));
  s.struct_size = offsetof(ndx_op_schema_t, output_dtypes) - 1;
  expect_error(ndx_register_op(ctx, "too_small", &s, k_copy_f32, NULL, NULL), NDX_ERROR_VALUE,
               "schema->struct_size is");
  s.struct_size = sizeof s;
  const int32_t bad_dtype[1] = {99};
  s.output_dtypes = bad_dtype;
  expect_error(ndx_register_op(ctx, "bad_dtype", &s, k_copy_f32, NULL, NULL), NDX_ERROR_VALUE,
               "schema->output_dtypes[0] is 99");
  s.output_dtypes = NULL;
  const int32_t bad_rank[1] = {-2};
  s.output_ndims = bad_rank;
  expect_error(ndx_register_op(ctx, "bad_rank", &s, k_copy_f32, NULL, NULL), NDX_ERROR_VALUE,
               "schema->output_ndims[0] is -2");
  s.output_ndims = NULL;
  s.flags = 8;
  expect_error(ndx_register_op(ctx, "bad_flags", &s, k_copy_f32, NULL, NULL), NDX_ERROR_VALUE,
               "unknown ndx_op_flags_t bits");
  expect_error(ndx_context_set_backend(ctx, "debugg"), NDX_ERROR_VALUE,
               "expected default, noexcept, debug,");
  ndx_context_release(ctx);
}

/* Fault injection names an operator the context has: a misspelt one is refused with
 * the nearest name (it used to inject nothing, silently), a host operator only once it
 * is registered. */
static void test_injection_names_a_known_operator(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.backend = "inject_runtime_error:muul";
  ndx_context_t* ctx = NULL;
  expect_error(ndx_context_new(&o, &ctx), NDX_ERROR_VALUE, "did you mean 'mul'?");
  CHECK(ctx == NULL, "a failed ndx_context_new leaves its out-param NULL");
  CHECK_OK(ndx_context_new(NULL, &ctx));
  expect_error(ndx_context_set_backend(ctx, "inject_runtime_error:copy_f32"), NDX_ERROR_VALUE,
               "names operator 'copy_f32', which is neither a built-in nor a host operator");
  register_with(ctx, "copy_f32", k_copy_f32, NULL, NULL, NULL, NULL, 0);
  CHECK_OK(ndx_context_set_backend(ctx, "inject_runtime_error:copy_f32"));
  const float v[4] = {1, 2, 3, 4};
  const int64_t shape[1] = {4};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t));
  ndx_input_t in = {t, NULL};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "copy_f32", &in, 1, NULL, NULL, &f));
  expect_error(ndx_future_wait(f, -1), NDX_ERROR_RUNTIME,
               "injected runtime error in operator 'copy_f32'");
  ndx_future_release(f);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

int main(void) {
  test_violations();
  test_schema_versions();
  test_injection_names_a_known_operator();
  return NDX_TEST_SUMMARY("test_debug_backend");
}
