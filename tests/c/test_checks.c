/* Error flags through the C ABI: check operators and built-in categories under each
 * policy, in EAGER, DEFERRED and SYNC mode; the group reported by evaluate and by
 * ndx_context_take_check_errors in enqueue order with each flag's site, op, sequence
 * number and ndx_check_info_t; folding, consequences, argument validation and the
 * options struct's old size. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ndx_test.h"

static ndx_context_t* context(int32_t mode, int32_t policy, uint32_t categories) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = mode;
  o.check_policy = policy;
  o.check_categories = categories;
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(&o, &ctx));
  return ctx;
}

static ndx_tensor_t* f32s(const float* v, int64_t n) {
  return ndx_test_tensor(v, NDX_DTYPE_FLOAT32, 1, &n);
}

static ndx_tensor_t* i32s(const int32_t* v, int64_t n) {
  return ndx_test_tensor(v, NDX_DTYPE_INT32, 1, &n);
}

static ndx_tensor_t* bools(const bool* v, int64_t n) {
  return ndx_test_tensor(v, NDX_DTYPE_BOOL, 1, &n);
}

static ndx_args_t* message(const char* m) {
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_string(a, "message", m));
  return a;
}

static ndx_check_info_t info_of(const ndx_error_t* e) {
  ndx_check_info_t i;
  memset(&i, 0, sizeof i);
  i.struct_size = sizeof i;
  CHECK(ndx_error_check_info(e, &i), "a raised flag has check info: %s",
        NDX_TEST_S(ndx_error_message(e)));
  return i;
}

static void test_collect_in_enqueue_order(int32_t mode) {
  NDX_TEST_CONTEXT(mode == NDX_EVAL_DEFERRED ? "DEFERRED" : "EAGER");
  ndx_context_t* ctx = context(mode, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  const float xv[4] = {1.0f, 2.0f, 1.0f / 0.0f, 4.0f};
  ndx_tensor_t* x = f32s(xv, 4);
  ndx_input_t in1[1] = {ndx_test_in(x)};
  ndx_future_t *f1 = NULL, *f2 = NULL, *f3 = NULL;
  int l1 = __LINE__; CHECK_OK(ndx_invoke(ctx, "check_finite", in1, 1, NULL, NULL, &f1));
  ndx_tensor_t* y = ndx_test_output(f1, 0);
  ndx_input_t in2[2] = {ndx_test_in(y), ndx_test_in(y)};
  CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &f2));
  ndx_tensor_t* z = ndx_test_output(f2, 0);
  ndx_args_t* range = NULL;
  CHECK_OK(ndx_args_new(&range));
  CHECK_OK(ndx_args_set_float(range, "lo", 0.0));
  CHECK_OK(ndx_args_set_float(range, "hi", 5.0));
  ndx_input_t in3[1] = {ndx_test_in(z)};
  int l3 = __LINE__; CHECK_OK(ndx_invoke(ctx, "check_range", in3, 1, range, NULL, &f3));
  /* The computation went on: the values pass through. */
  ndx_tensor_t* w = ndx_test_output(f3, 0);
  float got[4] = {0};
  CHECK_OK(ndx_tensor_copy_to(w, got, sizeof got));
  CHECK(got[0] == 2.0f && got[3] == 8.0f, "values flow through checks: %g %g", got[0], got[3]);

  ndx_error_t* g = ndx_context_evaluate(ctx);
  if (CHECK(g != NULL, "evaluate reports the flags")) {
    CHECK_LINK(g, NDX_ERROR_CHECK, "2 checks failed (in enqueue order)", NULL, 0);
    CHECK(ndx_error_related_count(g) == 2, "two flags, got %zu", ndx_error_related_count(g));
    const ndx_error_t* a = ndx_error_related(g, 0);
    const ndx_error_t* b = ndx_error_related(g, 1);
    CHECK_LINK(a, NDX_ERROR_CHECK,
               "USER check failed: 1 of 4 elements not finite (first at flat index 2)",
               "check_finite", 1);
    CHECK_FRAME(a, 0, "test_checks.c", l1, NULL, NDX_FRAME_NATIVE);
    CHECK_LINK(b, NDX_ERROR_CHECK, "2 of 4 elements outside [0, 5] (first at flat index 2)",
               "check_range", 3);
    CHECK_LINK(b, NDX_ERROR_CHECK, "a consequence of the flag raised by #1", "check_range", 3);
    CHECK_FRAME(b, 0, "test_checks.c", l3, NULL, NDX_FRAME_NATIVE);
    ndx_check_info_t ia = info_of(a), ib = info_of(b);
    CHECK(ia.category == NDX_CHECK_USER && ia.first_index == 2 && ia.count == 1,
          "flag 1: category %u first %llu count %llu", ia.category,
          (unsigned long long)ia.first_index, (unsigned long long)ia.count);
    CHECK(ia.occurrences == 1 && ia.sample == -1 && ia.consequence_of == 0,
          "flag 1: occurrences %llu sample %lld consequence_of %llu",
          (unsigned long long)ia.occurrences, (long long)ia.sample,
          (unsigned long long)ia.consequence_of);
    CHECK(ib.count == 2 && ib.consequence_of == 1, "flag 2: count %llu consequence_of %llu",
          (unsigned long long)ib.count, (unsigned long long)ib.consequence_of);
    CHECK(!ndx_error_check_info(g, &ia), "the group itself is not a flag");
    ndx_error_free(g);
  }
  CHECK_OK(ndx_context_evaluate(ctx));
  CHECK(ndx_context_take_check_errors(ctx) == NULL, "reported once");
  ndx_args_free(range);
  ndx_tensor_release(w);
  ndx_tensor_release(z);
  ndx_tensor_release(y);
  ndx_tensor_release(x);
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_future_release(f3);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

static void test_fail_fast(void) {
  ndx_context_t* ctx = context(NDX_EVAL_EAGER, NDX_CHECKS_FAIL_FAST, NDX_CHECK_ALL);
  const bool pv[3] = {true, false, true};
  ndx_tensor_t* p = bools(pv, 3);
  ndx_input_t in[1] = {ndx_test_in(p)};
  ndx_args_t* a = message("mask is complete");
  ndx_future_t* f = NULL;
  int line = __LINE__; CHECK_OK(ndx_invoke(ctx, "check", in, 1, a, NULL, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  if (CHECK(e != NULL, "FAIL_FAST fails the invocation")) {
    CHECK_LINK(e, NDX_ERROR_CHECK,
               "USER check failed: mask is complete: 1 of 3 elements false (first at flat index 1)",
               "check", 1);
    CHECK_FRAME(e, 0, "test_checks.c", line, NULL, NDX_FRAME_NATIVE);
    ndx_check_info_t i = info_of(e);
    CHECK(i.first_index == 1 && i.count == 1, "first %llu count %llu",
          (unsigned long long)i.first_index, (unsigned long long)i.count);
    /* Failed while running: it carries a repro document, as a kernel error does. */
    size_t n = ndx_error_repro(e, NULL, 0);
    char* doc = n ? malloc(n + 1) : NULL;
    if (CHECK(doc != NULL, "a FAIL_FAST failure has a repro document")) {
      ndx_error_repro(e, doc, n + 1);
      CHECK(ndx_test_contains(doc, "\"op\": \"check\"") &&
                ndx_test_contains(doc, "\"bytes\": \"010001\""),
            "the document names the op and holds the predicate: %s", doc);
    }
    free(doc);
    ndx_error_free(e);
  }
  CHECK(ndx_context_take_check_errors(ctx) == NULL, "nothing collected under FAIL_FAST");
  CHECK_OK(ndx_context_evaluate(ctx));
  ndx_future_release(f);
  ndx_args_free(a);
  ndx_tensor_release(p);
  ndx_context_release(ctx);
}

/* A site captured from inside a callback has the callback's frame first and no
 * frame of ndx's machinery (the callback's trampoline, the worker) after it. */
static ndx_context_t* cb_ctx;
static ndx_tensor_t* cb_input;
static int cb_line;

static NDX_TEST_NOINLINE void cb_invoke_check(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  ndx_input_t in[1] = {ndx_test_in(cb_input)};
  ndx_future_t* g = NULL;
  cb_line = __LINE__; CHECK_OK(ndx_invoke(cb_ctx, "check_finite", in, 1, NULL, NULL, &g));
  ndx_future_release(g);
}

static void test_site_of_an_invoke_from_a_callback(void) {
  cb_ctx = context(NDX_EVAL_EAGER, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  CHECK_OK(ndx_context_set_capture_policy(cb_ctx, NDX_CAPTURE_NATIVE, 16));
  const float xv[2] = {1.0f, 0.0f / 0.0f};
  cb_input = f32s(xv, 2);
  ndx_input_t in[1] = {ndx_test_in(cb_input)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(cb_ctx, "neg", in, 1, NULL, NULL, &f));
  CHECK_OK(ndx_future_on_ready(f, cb_invoke_check, NULL, NULL));
  CHECK_OK(ndx_future_wait(f, -1));
  ndx_error_t* e = ndx_context_evaluate(cb_ctx);
  const ndx_error_t* flag = e ? ndx_error_related(e, 0) : NULL;
  if (CHECK(flag != NULL, "the callback's check raised a flag")) {
    CHECK_FRAME(flag, 0, "test_checks.c", cb_line, "cb_invoke_check", NDX_FRAME_NATIVE);
    for (size_t i = 0; i < ndx_error_frame_count(flag); i++) {
      ndx_frame_t fr;
      memset(&fr, 0, sizeof fr);
      fr.struct_size = sizeof fr;
      CHECK_OK(ndx_error_frame(flag, i, &fr));
      const char* fn = fr.function ? fr.function : "";
      CHECK(strncmp(fn, "ndx::", 5) != 0 && strncmp(fn, "<ndx::", 6) != 0 &&
                strstr(fn, "rayon_core::") == NULL,
            "frame %zu is ndx's machinery: %s", i, fn);
    }
  }
  ndx_error_free(e);
  ndx_future_release(f);
  ndx_tensor_release(cb_input);
  ndx_context_release(cb_ctx);
}

static void test_off_and_switching(void) {
  ndx_context_t* ctx = context(NDX_EVAL_SYNC_CPU, 0, 0);
  const bool pv[1] = {false};
  ndx_tensor_t* p = bools(pv, 1);
  ndx_input_t in[1] = {ndx_test_in(p)};
  ndx_args_t* a = message("off");
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "check", in, 1, a, NULL, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  ndx_future_release(f);
  CHECK_OK(ndx_context_evaluate(ctx));
  /* Integer division by zero without DIV: a VALUE error. */
  const int32_t nv[2] = {6, 7}, dv[2] = {3, 0};
  ndx_tensor_t *n = i32s(nv, 2), *d = i32s(dv, 2);
  ndx_input_t nd[2] = {ndx_test_in(n), ndx_test_in(d)};
  CHECK_OK(ndx_invoke(ctx, "div", nd, 2, NULL, NULL, &f));
  expect_error(ndx_future_wait(f, -1), NDX_ERROR_VALUE, "integer division by zero");
  ndx_future_release(f);
  /* With DIV collected: 0 and a flag. */
  CHECK_OK(ndx_context_set_checks(ctx, NDX_CHECKS_COLLECT, NDX_CHECK_DIV, 0));
  CHECK_OK(ndx_invoke(ctx, "div", nd, 2, NULL, NULL, &f));
  CHECK_OK(ndx_future_wait(f, -1));
  ndx_tensor_t* q = ndx_test_output(f, 0);
  int32_t qv[2] = {-1, -1};
  CHECK_OK(ndx_tensor_copy_to(q, qv, sizeof qv));
  CHECK(qv[0] == 2 && qv[1] == 0, "quotients %d %d", qv[0], qv[1]);
  ndx_future_release(f);
  CHECK_OK(ndx_invoke(ctx, "check", in, 1, a, NULL, &f));
  ndx_future_release(f);
  ndx_error_t* g = ndx_context_take_check_errors(ctx);
  if (CHECK(g != NULL, "the DIV flag is collected")) {
    CHECK(ndx_error_related_count(g) == 1, "USER is off: one flag, got %zu",
          ndx_error_related_count(g));
    CHECK_LINK(ndx_error_related(g, 0), NDX_ERROR_CHECK, "DIV check failed: 1 element divided by zero",
               "div", 3);
    ndx_error_free(g);
  }
  ndx_tensor_release(q);
  ndx_tensor_release(n);
  ndx_tensor_release(d);
  ndx_args_free(a);
  ndx_tensor_release(p);
  ndx_context_release(ctx);
}

static void test_folding_in_a_loop(void) {
  ndx_context_t* ctx = context(NDX_EVAL_DEFERRED, NDX_CHECKS_COLLECT, NDX_CHECK_USER);
  const bool pv[2] = {false, false};
  ndx_tensor_t* p = bools(pv, 2);
  ndx_input_t in[1] = {ndx_test_in(p)};
  ndx_args_t* a = message("in a loop");
  int line = 0;
  for (int i = 0; i < 8; i++) {
    ndx_future_t* f = NULL;
    line = __LINE__; CHECK_OK(ndx_invoke(ctx, "check", in, 1, a, NULL, &f));
    ndx_future_release(f);
  }
  ndx_error_t* g = ndx_context_evaluate(ctx);
  if (CHECK(g != NULL, "flags")) {
    CHECK(ndx_error_related_count(g) == 1, "folded into one, got %zu", ndx_error_related_count(g));
    const ndx_error_t* r = ndx_error_related(g, 0);
    CHECK_LINK(r, NDX_ERROR_CHECK, "raised 8 times at this site (first by #1): 16 failing", "check", 1);
    CHECK_FRAME(r, 0, "test_checks.c", line, NULL, NDX_FRAME_NATIVE);
    ndx_check_info_t i = info_of(r);
    CHECK(i.occurrences == 8 && i.count == 16, "occurrences %llu count %llu",
          (unsigned long long)i.occurrences, (unsigned long long)i.count);
    /* A caller built against a smaller ndx_check_info_t gets only its prefix. */
    ndx_check_info_t small;
    memset(&small, 0xAB, sizeof small);
    small.struct_size = offsetof(ndx_check_info_t, count);
    CHECK(ndx_error_check_info(r, &small), "prefix");
    CHECK(small.first_index == 0, "prefix field written");
    CHECK(small.count == 0xABABABABABABABABull, "nothing beyond struct_size written");
    ndx_error_free(g);
  }
  ndx_args_free(a);
  ndx_tensor_release(p);
  ndx_context_release(ctx);
}

static void test_bad_arguments(void) {
  ndx_context_t* ctx = context(0, 0, 0);
  expect_error(ndx_context_set_checks(ctx, 7, 0, 0), NDX_ERROR_VALUE,
               "argument 'policy' is 7, not an ndx_check_policy_t value");
  expect_error(ndx_context_set_checks(ctx, NDX_CHECKS_COLLECT, 0x30, 0), NDX_ERROR_VALUE,
               "unknown bits 0x30");
  expect_error(ndx_context_set_checks(NULL, NDX_CHECKS_COLLECT, 0, 0), NDX_ERROR_VALUE, "ctx");
  ndx_error_t* e = ndx_context_take_check_errors(NULL);
  CHECK_LINK(e, NDX_ERROR_VALUE, "ctx", NULL, 0);
  ndx_error_free(e);
  CHECK(!ndx_error_check_info(NULL, NULL), "NULL is not a flag");
  /* check_range validates its bounds at enqueue. */
  const float v[1] = {1};
  ndx_tensor_t* x = f32s(v, 1);
  ndx_input_t in[1] = {ndx_test_in(x)};
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_float(a, "lo", 3));
  CHECK_OK(ndx_args_set_float(a, "hi", 1));
  ndx_future_t* f = NULL;
  expect_error(ndx_invoke(ctx, "check_range", in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "needs lo <= hi, got lo=3 and hi=1");
  expect_error(ndx_invoke(ctx, "check", in, 1, NULL, NULL, &f), NDX_ERROR_TYPE,
               "needs a bool predicate, got float32");
  /* A check_shape pattern entry below -1 is named with its index. */
  {
    const int64_t pattern[3] = {1, -1, -2};
    ndx_args_t* pa = NULL;
    CHECK_OK(ndx_args_new(&pa));
    CHECK_OK(ndx_args_set_int_array(pa, "pattern", pattern, 3));
    expect_error(ndx_invoke(ctx, "check_shape", in, 1, pa, NULL, &f), NDX_ERROR_VALUE,
                 "operator 'check_shape': argument 'pattern' entry 2: pattern entries are sizes "
                 "or -1 (any), got -2");
    ndx_args_free(pa);
  }
  CHECK(f == NULL, "no future on failure");
  ndx_args_free(a);
  ndx_tensor_release(x);
  /* The options struct: an old size (ending before check_policy) is accepted, a size
   * that cuts an older field is not, unknown policies are refused. */
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = offsetof(ndx_context_options_t, check_policy);
  o.check_policy = 99; /* beyond the old size: never read */
  ndx_context_t* old = NULL;
  CHECK_OK(ndx_context_new(&o, &old));
  ndx_context_release(old);
  o.struct_size = offsetof(ndx_context_options_t, backend);
  expect_error(ndx_context_new(&o, &old), NDX_ERROR_VALUE, "opts->struct_size is");
  o.struct_size = sizeof o;
  expect_error(ndx_context_new(&o, &old), NDX_ERROR_VALUE,
               "opts->check_policy is 99, not an ndx_check_policy_t value");
  CHECK(old == NULL, "no context on failure");
  /* A caller of the older header passes that struct's sizeof, rounded up to its
   * alignment: on 64-bit targets its padding is where check_policy is now. Those
   * bytes are never the caller's: neither refused nor read as a policy. */
  {
    const size_t old_end = offsetof(ndx_context_options_t, check_policy);
    const size_t old_size = (old_end + sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t);
    const int32_t garbage[3] = {-1, 0x01010101, NDX_CHECKS_FAIL_FAST};
    for (int g = 0; g < 3; g++) {
      memset(&o, 0, sizeof o);
      o.struct_size = old_size;
      o.eval_mode = NDX_EVAL_SYNC_CPU;
      o.check_policy = garbage[g];
      old = NULL;
      if (!CHECK_OK(ndx_context_new(&o, &old))) continue;
      const bool no[1] = {false};
      ndx_tensor_t* p = bools(no, 1);
      ndx_input_t pin[1] = {ndx_test_in(p)};
      ndx_future_t* pf = NULL;
      CHECK_OK(ndx_invoke(old, "check", pin, 1, NULL, NULL, &pf));
      CHECK_OK(ndx_future_error(pf)); /* OFF: the check passes... */
      ndx_error_t* none = ndx_context_take_check_errors(old);
      CHECK(none == NULL, "...and raises nothing (padding %d)", (int)garbage[g]);
      ndx_error_free(none);
      ndx_future_release(pf);
      ndx_tensor_release(p);
      ndx_context_release(old);
    }
  }
  /* A worker count past any machine (-1 cast, say) is refused, not started. */
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.num_threads = UINT32_MAX;
  old = NULL;
  expect_error(ndx_context_new(&o, &old), NDX_ERROR_VALUE,
               "opts->num_threads is 4294967295, expected at most 4096 (0: the default)");
  CHECK(old == NULL, "no context on failure");
  ndx_context_release(ctx);
}

/* A host kernel dividing its input by zeros with a SYNC 'div' on the context `user`. */
static ndx_error_t* k_divide_there(void* user, const ndx_tensor_t* const* inputs,
                                   size_t n_inputs, const ndx_args_t* args,
                                   ndx_tensor_t** outputs, size_t n_outputs) {
  (void)n_inputs; (void)args; (void)n_outputs;
  static const int32_t zeros[3] = {0, 0, 0};
  ndx_tensor_t* z = i32s(zeros, 3);
  ndx_input_t in[2] = {ndx_test_in(inputs[0]), ndx_test_in(z)};
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = NDX_EVAL_SYNC_CPU;
  ndx_future_t* f = NULL;
  ndx_error_t* e = ndx_invoke((ndx_context_t*)user, "div", in, 2, NULL, &o, &f);
  ndx_tensor_release(z);
  if (e == NULL) e = ndx_future_error(f);
  if (e == NULL) e = ndx_future_tensor(f, 0, &outputs[0]);
  ndx_future_release(f);
  return e;
}

/* An invocation keeps its own context's checks inside another's kernel: a SYNC 'div' by
 * zero on a context without checks, from a host operator of a collecting context, fails
 * with its VALUE error (its flag was taken for the host operator's), in every mode; the
 * other way round, the inner flag is reported by the inner context. */
static void test_checks_of_an_invocation_inside_a_host_kernel(void) {
  static const int32_t kModes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                    NDX_EVAL_EAGER};
  static const int32_t a[3] = {1, 2, 3};
  for (int m = 0; m < 4; m++) {
    for (int inner_collects = 0; inner_collects < 2; inner_collects++) {
      ndx_context_t* outer =
          context(kModes[m], inner_collects ? NDX_CHECKS_OFF : NDX_CHECKS_COLLECT, 0);
      ndx_context_t* inner =
          context(NDX_EVAL_EAGER, inner_collects ? NDX_CHECKS_COLLECT : NDX_CHECKS_OFF, 0);
      ndx_op_schema_t s = ndx_test_schema(1, 1);
      CHECK_OK(ndx_register_op(outer, "divide_there", &s, k_divide_there, inner, NULL));
      ndx_tensor_t* t = i32s(a, 3);
      ndx_input_t in = ndx_test_in(t);
      ndx_future_t* f = NULL;
      CHECK_OK(ndx_invoke(outer, "divide_there", &in, 1, NULL, NULL, &f));
      if (inner_collects) {
        CHECK_OK(ndx_future_wait(f, -1));
        CHECK_OK(ndx_context_evaluate(outer));
        expect_error(ndx_context_evaluate(inner), NDX_ERROR_CHECK, "1 check failed");
      } else {
        expect_error(ndx_future_wait(f, -1), NDX_ERROR_VALUE, "integer division by zero");
        CHECK_OK(ndx_context_evaluate(outer));
        CHECK_OK(ndx_context_evaluate(inner));
      }
      ndx_future_release(f);
      ndx_tensor_release(t);
      ndx_context_release(outer);
      ndx_context_release(inner);
    }
  }
}

/* Sequence numbers are per context: a flag on data another context flagged names no
 * consequence_of (it would name an unrelated invocation of its own context, here the
 * flag itself); one downstream of a flag of the same context still does. */
static ndx_tensor_t* finite_checked(ndx_context_t* ctx, const ndx_tensor_t* t) {
  ndx_input_t in[1] = {ndx_test_in(t)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "check_finite", in, 1, NULL, NULL, &f));
  ndx_tensor_t* out = ndx_test_output(f, 0);
  ndx_future_release(f);
  return out;
}

static void expect_one_flag(ndx_context_t* ctx, uint64_t seq, uint64_t consequence_of) {
  ndx_error_t* g = ndx_context_take_check_errors(ctx);
  if (CHECK(g != NULL && ndx_error_related_count(g) == 1, "one flag")) {
    const ndx_error_t* r = ndx_error_related(g, 0);
    ndx_check_info_t i = info_of(r);
    CHECK(ndx_error_sequence(r) == seq, "flag of #%llu, got #%llu", (unsigned long long)seq,
          (unsigned long long)ndx_error_sequence(r));
    CHECK(i.consequence_of == consequence_of, "consequence_of %llu, got %llu",
          (unsigned long long)consequence_of, (unsigned long long)i.consequence_of);
  }
  ndx_error_free(g);
}

static void test_consequence_of_stays_in_its_context(void) {
  NDX_TEST_CONTEXT("consequence_of across contexts");
  ndx_context_t* a = context(NDX_EVAL_SYNC_CPU, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  ndx_context_t* b = context(NDX_EVAL_SYNC_CPU, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  const float v[2] = {1.0f, 1.0f / 0.0f};
  ndx_tensor_t* x = f32s(v, 2);
  ndx_tensor_t* y = finite_checked(a, x); /* a's #1 */
  ndx_tensor_t* z = finite_checked(b, y); /* b's #1, on data a flagged */
  expect_one_flag(a, 1, 0);
  expect_one_flag(b, 1, 0);
  ndx_tensor_t* w = finite_checked(b, z); /* b's #2, downstream of b's #1 */
  expect_one_flag(b, 2, 1);
  ndx_tensor_release(w);
  ndx_tensor_release(z);
  ndx_tensor_release(y);
  ndx_tensor_release(x);
  ndx_context_release(a);
  ndx_context_release(b);
}

/* One batch invocation failing a check in two samples is one flag (one occurrence)
 * whose count sums both; its message (the first sample's) says so too. */
static void test_flag_folded_over_samples(void) {
  NDX_TEST_CONTEXT("batch folding");
  ndx_context_t* ctx = context(NDX_EVAL_SYNC_CPU, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  const float s0[2] = {0.0f / 0.0f, 1.0f}, s1[1] = {3.0f};
  const float s2[3] = {1.0f / 0.0f, 1.0f / 0.0f, 2.0f};
  const int64_t n0 = 2, n1 = 1, n2 = 3;
  int deleted = 0;
  DLManagedTensorVersioned* m[3] = {
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, &n0, NULL, s0, sizeof s0),
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, &n1, NULL, s1, sizeof s1),
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 1, &n2, NULL, s2, sizeof s2)};
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(m, 3, NULL, &b));
  ndx_input_t in[1];
  in[0].tensor = NULL;
  in[0].batch = b;
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "check_finite", in, 1, NULL, NULL, &f));
  ndx_error_t* g = ndx_context_take_check_errors(ctx);
  if (CHECK(g != NULL && ndx_error_related_count(g) == 1, "one flag")) {
    const ndx_error_t* r = ndx_error_related(g, 0);
    ndx_check_info_t i = info_of(r);
    CHECK(i.count == 3 && i.occurrences == 1 && i.sample == 0, "count %llu occurrences %llu",
          (unsigned long long)i.count, (unsigned long long)i.occurrences);
    CHECK_STR_EQ(ndx_error_message(r),
                 "USER check failed: 1 of 2 elements not finite in sample 0 (first at flat "
                 "index 0); raised 2 times by this invocation (per sample or output): 3 failing "
                 "elements in all");
  }
  ndx_error_free(g);
  ndx_future_release(f);
  ndx_batch_release(b);
  ndx_context_release(ctx);
  CHECK(deleted == 3, "every sample's deleter ran once, got %d", deleted);
}

/* Outputs [1, NaN, inf] whatever its input. */
static ndx_error_t* k_make_nan(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                               const ndx_args_t* args, ndx_tensor_t** outputs,
                               size_t n_outputs) {
  (void)user; (void)inputs; (void)n_inputs; (void)args; (void)n_outputs;
  const float v[3] = {1.0f, 0.0f / 0.0f, 1.0f / 0.0f};
  const int64_t n = 3;
  return ndx_tensor_from_host(v, NDX_DTYPE_FLOAT32, 1, &n, NULL, NULL, &outputs[0]);
}

/* NDX_CHECK_NAN scans a host operator's float outputs as it does a built-in's: NaN made
 * from finite inputs is one flag naming the operator, at its site; from NaN inputs it
 * is not. */
static void test_nan_from_a_host_operator(void) {
  NDX_TEST_CONTEXT("NaN from a host operator");
  ndx_context_t* ctx = context(NDX_EVAL_DEFERRED, NDX_CHECKS_COLLECT, NDX_CHECK_ALL);
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  CHECK_OK(ndx_register_op(ctx, "make_nan", &s, k_make_nan, NULL, NULL));
  const float finite[1] = {2.0f}, nan[1] = {0.0f / 0.0f};
  ndx_tensor_t* a = f32s(finite, 1);
  ndx_tensor_t* b = f32s(nan, 1);
  ndx_input_t ia = ndx_test_in(a), ib = ndx_test_in(b);
  ndx_future_t *fa = NULL, *fb = NULL;
  int line = __LINE__; CHECK_OK(ndx_invoke(ctx, "make_nan", &ia, 1, NULL, NULL, &fa));
  CHECK_OK(ndx_invoke(ctx, "make_nan", &ib, 1, NULL, NULL, &fb));
  ndx_error_t* g = ndx_context_evaluate(ctx);
  CHECK(g != NULL && ndx_error_kind(g) == NDX_ERROR_CHECK, "a check group");
  if (CHECK(g != NULL && ndx_error_related_count(g) == 1, "one flag")) {
    const ndx_error_t* r = ndx_error_related(g, 0);
    CHECK_STR_EQ(ndx_error_op(r), "make_nan");
    CHECK(info_of(r).category == NDX_CHECK_NAN, "category NAN");
    CHECK(ndx_error_sequence(r) == 1, "the first invocation's flag");
    CHECK_CONTAINS(ndx_error_message(r), "output 0 has 2 NaN or infinite elements");
    ndx_frame_t fr;
    memset(&fr, 0, sizeof fr);
    fr.struct_size = sizeof fr;
    CHECK_OK(ndx_error_frame(r, 0, &fr));
    CHECK(fr.line == (uint32_t)line, "flag at line %d, got %u", line, fr.line);
  }
  ndx_error_free(g);
  ndx_future_release(fa);
  ndx_future_release(fb);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

int main(void) {
  test_collect_in_enqueue_order(NDX_EVAL_EAGER);
  test_collect_in_enqueue_order(NDX_EVAL_DEFERRED);
  test_fail_fast();
  test_site_of_an_invoke_from_a_callback();
  test_off_and_switching();
  test_folding_in_a_loop();
  test_bad_arguments();
  test_checks_of_an_invocation_inside_a_host_kernel();
  test_consequence_of_stays_in_its_context();
  test_flag_folded_over_samples();
  test_nan_from_a_host_operator();
  return NDX_TEST_SUMMARY("test_checks");
}
