/* Repro documents through the C ABI: a real kernel failure (integer division by
 * zero) carries a document naming the op, inputs and site; ndx_repro_run replays it to
 * the same error kind and message; a dependent finds the document in its cause chain;
 * the byte cap and malformed documents give clear errors. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ndx_test.h"

static char* repro_of(const ndx_error_t* e) {
  size_t n = ndx_error_repro(e, NULL, 0);
  if (n == 0) return NULL;
  char* doc = (char*)malloc(n + 1);
  CHECK(ndx_error_repro(e, doc, n + 1) == n, "same length twice");
  return doc;
}

static void test_replay_of_a_kernel_failure(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  const int32_t nv[3] = {5, 6, 7}, dv[3] = {1, 0, 2};
  const int64_t n = 3;
  ndx_tensor_t* a = ndx_test_tensor(nv, NDX_DTYPE_INT32, 1, &n);
  ndx_tensor_t* b = ndx_test_tensor(dv, NDX_DTYPE_INT32, 1, &n);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t* f = NULL;
  int line = __LINE__; CHECK_OK(ndx_invoke(ctx, "mod", in, 2, NULL, NULL, &f));
  ndx_tensor_t* q = ndx_test_output(f, 0);
  ndx_input_t in2[1] = {ndx_test_in(q)};
  ndx_future_t* g = NULL;
  CHECK_OK(ndx_invoke(ctx, "sum", in2, 1, NULL, NULL, &g));
  ndx_error_t* e = ndx_future_wait(f, -1);
  ndx_error_t* dep = ndx_future_wait(g, -1);
  CHECK_LINK(e, NDX_ERROR_VALUE, "integer modulo by zero (output element 1)", "mod", 1);
  char* doc = repro_of(e);
  char* dep_doc = repro_of(dep);
  if (CHECK(doc != NULL, "a kernel failure has a repro document")) {
    CHECK_CONTAINS(doc, "\"op\": \"mod\"");
    CHECK_CONTAINS(doc, "\"bytes\": \"050000000600000007000000\"");
    CHECK_CONTAINS(doc, "\"mode\": \"eager\"");
    CHECK_CONTAINS(doc, "test_repro.c");
    char at[32];
    snprintf(at, sizeof at, "\"line\": %d", line);
    CHECK_CONTAINS(doc, at);
    CHECK(dep_doc != NULL && strcmp(doc, dep_doc) == 0, "the dependent finds the same document");
    /* Replayed on another context, it fails the same way. */
    ndx_context_t* other = NULL;
    CHECK_OK(ndx_context_new(NULL, &other));
    ndx_future_t* r = NULL;
    CHECK_OK(ndx_repro_run(other, doc, &r));
    ndx_error_t* again = ndx_future_wait(r, -1);
    CHECK_LINK(again, NDX_ERROR_VALUE, "integer modulo by zero (output element 1)", "mod", 1);
    ndx_error_free(again);
    ndx_future_release(r);
    ndx_context_release(other);
  }
  /* Small buffers get a truncated, terminated prefix and the full length. */
  char small[8];
  size_t need = ndx_error_repro(e, small, sizeof small);
  CHECK(need > sizeof small && small[7] == '\0' && small[0] == '{', "snprintf-like");
  CHECK(ndx_error_repro(NULL, NULL, 0) == 0, "NULL has none");
  /* No document: the empty text, still NUL-terminated (snprintf-like). */
  char none[16] = "untouched";
  CHECK(ndx_error_repro(NULL, none, sizeof none) == 0 && none[0] == '\0' && none[1] == 'n',
        "NULL: the empty text");
  ndx_error_t* plain = ndx_error_new(NDX_ERROR_VALUE, "no document", NULL);
  memcpy(none, "untouched", 10);
  CHECK(ndx_error_repro(plain, none, sizeof none) == 0 && none[0] == '\0' && none[1] == 'n',
        "an error without a document: the empty text");
  ndx_error_free(plain);
  free(dep_doc);
  free(doc);
  ndx_error_free(e);
  ndx_error_free(dep);
  ndx_future_release(f);
  ndx_future_release(g);
  ndx_tensor_release(q);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

static void test_cap_and_bad_documents(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  o.repro_max_bytes = -1; /* metadata only */
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(&o, &ctx));
  const int32_t v[1] = {1}, z[1] = {0};
  const int64_t n = 1;
  ndx_tensor_t* a = ndx_test_tensor(v, NDX_DTYPE_INT32, 1, &n);
  ndx_tensor_t* b = ndx_test_tensor(z, NDX_DTYPE_INT32, 1, &n);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "div", in, 2, NULL, NULL, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  char* doc = repro_of(e);
  if (CHECK(doc != NULL, "metadata-only document")) {
    CHECK_CONTAINS(doc, "\"bytes\": null");
    ndx_future_t* r = NULL;
    expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE, "inputs[0] has no bytes");
    CHECK(r == NULL, "no future on failure");
  }
  /* With the cap raised, the same failure carries its bytes. */
  CHECK_OK(ndx_context_set_repro_max_bytes(ctx, 64));
  ndx_future_t* f2 = NULL;
  CHECK_OK(ndx_invoke(ctx, "div", in, 2, NULL, NULL, &f2));
  ndx_error_t* e2 = ndx_future_wait(f2, -1);
  char* doc2 = repro_of(e2);
  CHECK(doc2 && ndx_test_contains(doc2, "\"bytes\": \"01000000\""), "bytes within the cap");
  /* The setter's 0 is metadata only (the options field's 0 is the 1 MiB default). */
  CHECK_OK(ndx_context_set_repro_max_bytes(ctx, 0));
  ndx_future_t* f3 = NULL;
  CHECK_OK(ndx_invoke(ctx, "div", in, 2, NULL, NULL, &f3));
  ndx_error_t* e3 = ndx_future_wait(f3, -1);
  char* doc3 = repro_of(e3);
  CHECK(doc3 && ndx_test_contains(doc3, "\"bytes\": null") &&
            !ndx_test_contains(doc3, "01000000"),
        "set_repro_max_bytes(0) records metadata only");
  free(doc3);
  ndx_error_free(e3);
  ndx_future_release(f3);
  ndx_future_t* r = NULL;
  expect_error(ndx_repro_run(ctx, "not json", &r), NDX_ERROR_VALUE, "repro document: not valid JSON");
  expect_error(ndx_repro_run(ctx, "{\"ndx_repro\": 1}", &r), NDX_ERROR_VALUE,
               "the document has no \"op\"");
  expect_error(ndx_repro_run(ctx, NULL, &r), NDX_ERROR_VALUE, "argument 'json' is NULL");
  /* A bad input shape is named as the document's field, not as an "output". */
  expect_error(ndx_repro_run(ctx,
                             "{\"ndx_repro\": 1, \"op\": \"neg\", \"args\": [], \"mode\": "
                             "\"sync_cpu\", \"inputs\": [{\"dtype\": \"int8\", \"shape\": [-1, 3], "
                             "\"bytes\": \"00\"}]}",
                             &r),
               NDX_ERROR_VALUE, "repro document: inputs[0].shape[0] is -1");
  CHECK(r == NULL, "no future");
  free(doc);
  free(doc2);
  ndx_error_free(e);
  ndx_error_free(e2);
  ndx_future_release(f);
  ndx_future_release(f2);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

/* "Errors of invocations that failed while running carry one": an injected runtime
 * failure too. */
static void test_injected_runtime_error_has_a_document(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  CHECK_OK(ndx_context_set_backend(ctx, "inject_runtime_error:neg"));
  const int32_t v[3] = {5, 6, 7};
  const int64_t n = 3;
  ndx_tensor_t* a = ndx_test_tensor(v, NDX_DTYPE_INT32, 1, &n);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, NULL, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  CHECK_LINK(e, NDX_ERROR_RUNTIME, "injected runtime error in operator 'neg'", "neg", 1);
  char* doc = repro_of(e);
  CHECK(doc != NULL, "the injected failure carries a repro document");
  CHECK_CONTAINS(doc, "\"op\": \"neg\"");
  CHECK_CONTAINS(doc, "inject_runtime_error:neg");
  CHECK_CONTAINS(doc, "injected runtime error in operator 'neg'");
  free(doc);
  ndx_error_free(e);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

/* A document attached to a bug report is hostile: its inputs get an imported tensor's
 * limits, and a huge declared size with little data is refused before anything is
 * allocated, each naming the document's field. */
static void test_hostile_inputs(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_future_t* r = NULL;
  char doc[1024];
  /* 70 dimensions of size 1: `sum` reduces them away, so no output refuses them. */
  char shape[256] = "[1";
  for (int i = 1; i < 70; i++) strcat(shape, ",1");
  strcat(shape, "]");
  snprintf(doc, sizeof doc,
           "{\"ndx_repro\": 1, \"op\": \"sum\", \"args\": [], \"mode\": \"sync_cpu\", "
           "\"inputs\": [{\"dtype\": \"int8\", \"shape\": %s, \"bytes\": \"07\"}]}",
           shape);
  expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE,
               "repro document: inputs[0].shape has 70 dimensions, expected at most 64");
  CHECK(r == NULL, "no future");
  static const char* const layouts[][2] = {
      {"\"HWC\"", "inputs[0]: layout \"HWC\" has 3 letters but the tensor has ndim 2"},
      {"\"HH\"", "inputs[0]: layout \"HH\" names dimension 'H' twice"},
      {"\"H W\"", "inputs[0]: layout \"H W\" must consist of ASCII letters"},
      {"5", "inputs[0].layout is not a string"},
  };
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    snprintf(doc, sizeof doc,
             "{\"ndx_repro\": 1, \"op\": \"neg\", \"args\": [], \"mode\": \"sync_cpu\", "
             "\"inputs\": [{\"dtype\": \"int8\", \"shape\": [1, 1], \"layout\": %s, "
             "\"bytes\": \"07\"}]}",
             layouts[i][0]);
    expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE, layouts[i][1]);
    CHECK(r == NULL, "no future");
  }
  static const char* const sizes[][3] = {
      /* A petabyte declared, one int16 carried: a ValueError, not a MemoryError. */
      {"[1125899906842624]", "\"0100\"",
       "repro document: inputs[0].bytes has 4 hexadecimal digits, expected 4503599627370496"},
      {"[2]", "\"0100\"", "inputs[0].bytes has 4 hexadecimal digits, expected 8"},
      {"[1]", "\"01zz\"", "inputs[0].bytes is not hexadecimal"},
      {"[1]", "5", "inputs[0].bytes is not a string of hexadecimal digits"},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    snprintf(doc, sizeof doc,
             "{\"ndx_repro\": 1, \"op\": \"neg\", \"args\": [], \"mode\": \"sync_cpu\", "
             "\"inputs\": [{\"dtype\": \"int16\", \"shape\": %s, \"bytes\": %s}]}",
             sizes[i][0], sizes[i][1]);
    expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE, sizes[i][2]);
    CHECK(r == NULL, "no future");
  }
  ndx_context_release(ctx);
}

/* An argument set twice is refused naming both entries; a document listing 100,000
 * arguments is read in one pass (it was quadratic: about a minute). */
static void test_arguments_are_distinct(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_future_t* r = NULL;
  const char* head =
      "{\"ndx_repro\": 1, \"op\": \"sum\", \"mode\": \"sync_cpu\", \"inputs\": [{\"dtype\": "
      "\"int8\", \"shape\": [2], \"bytes\": \"0102\"}], \"args\": [";
  char doc[512];
  snprintf(doc, sizeof doc,
           "%s{\"name\": \"axes\", \"type\": \"ints\", \"value\": [0]}, {\"name\": \"keepdims\", "
           "\"type\": \"bool\", \"value\": true}, {\"name\": \"axes\", \"type\": \"ints\", "
           "\"value\": [5]}]}",
           head);
  expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE,
               "repro document: args[2] sets 'axes' again (args[0] set it first)");
  CHECK(r == NULL, "no future");
  enum { N = 100000 };
  size_t cap = strlen(head) + (size_t)N * 64 + 8, len = strlen(head);
  char* big = (char*)malloc(cap);
  memcpy(big, head, len);
  for (int i = 0; i < N; i++)
    len += (size_t)snprintf(big + len, cap - len, "%s{\"name\": \"a%d\", \"type\": \"int\", \"value\": %d}",
                            i ? ", " : "", i, i);
  snprintf(big + len, cap - len, "]}");
  expect_error(ndx_repro_run(ctx, big, &r), NDX_ERROR_VALUE,
               "operator 'sum' has no argument 'a0' (it takes: axes, keepdims)");
  CHECK(r == NULL, "no future");
  free(big);
  ndx_context_release(ctx);
}

/* What a replay refuses says how to get it right: a host operator is registered first, a
 * float is a number or "nan", "inf", "-inf". */
static void test_replay_errors_say_what_is_accepted(void) {
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_future_t* r = NULL;
  const char* unknown =
      "{\"ndx_repro\": 1, \"op\": \"my_host_op\", \"args\": [], \"mode\": \"sync_cpu\", "
      "\"inputs\": [{\"dtype\": \"float32\", \"shape\": [1], \"bytes\": \"0000c07f\"}]}";
  expect_error(ndx_repro_run(ctx, unknown, &r), NDX_ERROR_VALUE,
               "operator 'my_host_op' is unknown on this context: a host operator must be "
               "registered (ndx_register_op) before its failures replay");
  CHECK(r == NULL, "no future");
  const char* nan =
      "{\"ndx_repro\": 1, \"op\": \"clamp\", \"args\": [{\"name\": \"lo\", \"type\": \"float\", "
      "\"value\": \"NaN\"}], \"mode\": \"sync_cpu\", \"inputs\": [{\"dtype\": \"float32\", "
      "\"shape\": [1], \"bytes\": \"0000c07f\"}]}";
  expect_error(ndx_repro_run(ctx, nan, &r), NDX_ERROR_VALUE,
               "args[0] ('lo') has a value that is not float (numbers, or \"nan\", \"inf\" and "
               "\"-inf\")");
  CHECK(r == NULL, "no future");
  /* An argument type or a dtype name the reader does not know is named. */
  const struct {
    const char *type, *value, *says;
  } unknown_args[2] = {
      {"complex", "float64", "repro document: args[0] has unknown type 'complex'"},
      {"dtype", "float128", "repro document: args[0]: unknown dtype 'float128'"}};
  for (int k = 0; k < 2; k++) {
    char doc[512];
    snprintf(doc, sizeof doc,
             "{\"ndx_repro\": 1, \"op\": \"cast\", \"args\": [{\"name\": \"dtype\", "
             "\"type\": \"%s\", \"value\": \"%s\"}], \"mode\": \"sync_cpu\", \"inputs\": "
             "[{\"dtype\": \"float32\", \"shape\": [1], \"bytes\": \"0000c07f\"}]}",
             unknown_args[k].type, unknown_args[k].value);
    expect_error(ndx_repro_run(ctx, doc, &r), NDX_ERROR_VALUE, unknown_args[k].says);
    CHECK(r == NULL, "no future");
  }
  /* Two "op" keys: refused, not the last one replayed. */
  const char* twice =
      "{\"ndx_repro\": 1, \"op\": \"sqrt\", \"op\": \"neg\", \"args\": [], \"mode\": "
      "\"sync_cpu\", \"inputs\": [{\"dtype\": \"float32\", \"shape\": [1], \"bytes\": "
      "\"0000c07f\"}]}";
  expect_error(ndx_repro_run(ctx, twice, &r), NDX_ERROR_VALUE,
               "repro document: key \"op\" appears twice in one object");
  CHECK(r == NULL, "no future");
  ndx_context_release(ctx);
}

/* A provider naming one host frame, bug.py:5 in replay. */
static size_t bug_py_frame(void* user, ndx_host_frame_t* frames, size_t capacity) {
  (void)user;
  if (capacity == 0) return 0;
  frames[0].function = "replay";
  frames[0].file = "bug.py";
  frames[0].line = 5;
  return 1;
}

/* A refused document names the host caller under HOST capture (it carried ndx's
 * native frames only). */
static void test_refused_document_names_host_caller(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.capture_policy = NDX_CAPTURE_HOST;
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(&o, &ctx));
  CHECK_OK(ndx_context_set_frame_provider(ctx, bug_py_frame, NULL, NULL));
  ndx_future_t* r = NULL;
  ndx_error_t* e = ndx_repro_run(ctx, "not json", &r);
  ndx_frame_t fr;
  CHECK(ndx_error_frame_count(e) == 1, "%zu frames", ndx_error_frame_count(e));
  if (CHECK(ndx_test_get_frame(e, 0, &fr), "frame 0")) {
    CHECK_STR_EQ(fr.file, "bug.py");
    CHECK(fr.line == 5, "line %u", (unsigned)fr.line);
  }
  expect_error(e, NDX_ERROR_VALUE, "repro document: not valid JSON");
  CHECK(r == NULL, "no future");
  ndx_context_release(ctx);
}

int main(void) {
  test_replay_of_a_kernel_failure();
  test_cap_and_bad_documents();
  test_injected_runtime_error_has_a_document();
  test_hostile_inputs();
  test_arguments_are_distinct();
  test_replay_errors_say_what_is_accepted();
  test_refused_document_names_host_caller();
  return NDX_TEST_SUMMARY("test_repro");
}
