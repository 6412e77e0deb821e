/* Tests of the error object (ndx_error_*): kinds and names, messages, ownership of
 * causes, clones, the cause chain, the Python-style traceback text, NULL-safety of the
 * accessors, ndx_error_frame's argument checks, native capture sites (frame 0 is the C
 * line that called into ndx) and the panic boundary.
 *
 * CMake compiles this at -O0 and at -O2 (both with -g) and runs the -O0 build under
 * valgrind, which proves that causes handed to ndx_error_new are freed with the error
 * that owns them. NDX_TEST_HOOKS comes from CMake (the ndx::ndx target's interface
 * definitions) when the library is built with the cargo feature test-hooks; without
 * it the panic-boundary case is skipped. */
#define _POSIX_C_SOURCE 200809L /* pthread attributes: the long-chain test's small stack */
#include "ndx_test.h"

static const char* const kind_names[13] = {
    NULL,           "ValueError",    "TypeError",      "IndexError",    "RuntimeError",
    "MemoryError",  "NotImplementedError", "CudaError", "TimeoutError", "CancelledError",
    "CheckError",   "BackendError",  "InternalError",
};

/* Frame `index` of `e` (zeroed on failure, which is reported). */
static ndx_frame_t frame_of(const ndx_error_t* e, size_t index) {
  ndx_frame_t f;
  memset(&f, 0, sizeof f);
  f.struct_size = sizeof f;
  CHECK_OK(ndx_error_frame(e, index, &f));
  return f;
}

static NDX_TEST_NOINLINE void test_version(void) {
  CHECK(ndx_version() == NDX_VERSION_MAJOR * 10000u + NDX_VERSION_MINOR * 100u +
                             NDX_VERSION_PATCH,
        "ndx_version() = %u", (unsigned)ndx_version());
  CHECK_STR_EQ(ndx_version_string(), NDX_VERSION_STRING);
}

static NDX_TEST_NOINLINE void test_kind_names(void) {
  for (int32_t k = 1; k <= 12; k++) {
    CHECK_STR_EQ(ndx_error_kind_name(k), kind_names[k]);
  }
  CHECK(ndx_error_kind_name(0) == NULL, "kind 0 has no name");
  CHECK(ndx_error_kind_name(13) == NULL, "kind 13 has no name");
  CHECK(ndx_error_kind_name(-1) == NULL, "kind -1 has no name");
  CHECK(ndx_error_kind_name(INT32_MIN) == NULL, "kind INT32_MIN has no name");
}

static NDX_TEST_NOINLINE void test_new_every_kind(void) {
  for (int32_t k = 1; k <= 12; k++) {
    char msg[64];
    snprintf(msg, sizeof msg, "message of kind %d", (int)k);
    ndx_error_t* e = ndx_error_new(k, msg, NULL);
    if (!CHECK(e != NULL, "ndx_error_new(%d) returned NULL", (int)k)) continue;
    CHECK(ndx_error_kind(e) == k, "kind %d, expected %d", (int)ndx_error_kind(e), (int)k);
    CHECK_STR_EQ(ndx_error_message(e), msg);
    CHECK(ndx_error_cause(e) == NULL, "no cause");
    CHECK(ndx_error_related_count(e) == 0, "no related errors");
    CHECK(ndx_error_related(e, 0) == NULL, "related(0) of an error without related is NULL");
    CHECK(ndx_error_op(e) == NULL, "not from an invocation: op is NULL");
    CHECK(ndx_error_sequence(e) == 0, "not from an invocation: sequence is 0");
    ndx_error_free(e);
  }
}

static NDX_TEST_NOINLINE void test_message_is_copied(void) {
  char buf[32];
  strcpy(buf, "original text");
  ndx_error_t* e = ndx_error_new(NDX_ERROR_RUNTIME, buf, NULL);
  memset(buf, 'X', sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  CHECK_STR_EQ(ndx_error_message(e), "original text");
  CHECK(ndx_error_message(e) != buf, "the message is ndx's own copy");
  ndx_error_free(e);

  /* Invalid UTF-8 is replaced, not fatal; the valid parts survive. */
  ndx_error_t* u = ndx_error_new(NDX_ERROR_VALUE, "bad \xff byte", NULL);
  CHECK(ndx_error_kind(u) == NDX_ERROR_VALUE, "kind kept");
  CHECK_CONTAINS(ndx_error_message(u), "bad ");
  CHECK_CONTAINS(ndx_error_message(u), " byte");
  CHECK(!ndx_test_contains(ndx_error_message(u), "\xff"), "the invalid byte is replaced");
  ndx_error_free(u);

  /* The empty message is a message. */
  ndx_error_t* empty = ndx_error_new(NDX_ERROR_INDEX, "", NULL);
  CHECK(ndx_error_kind(empty) == NDX_ERROR_INDEX, "kind kept for an empty message");
  CHECK_STR_EQ(ndx_error_message(empty), "");
  ndx_error_free(empty);
}

static NDX_TEST_NOINLINE void test_invalid_kind_and_null_message(void) {
  /* Invalid kinds: a VALUE error saying so. */
  const int32_t bad[] = {0, 13, -1, 1000};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char frag[64];
    snprintf(frag, sizeof frag, "kind %d is not an ndx_error_kind_t value", (int)bad[i]);
    ndx_error_t* e = ndx_error_new(bad[i], "ignored", NULL);
    CHECK(e != NULL, "never NULL");
    expect_error(e, NDX_ERROR_VALUE, frag);
  }

  /* A NULL message: VALUE. */
  expect_error(ndx_error_new(NDX_ERROR_RUNTIME, NULL, NULL), NDX_ERROR_VALUE,
               "argument 'message' is NULL");

  /* Both wrong: still VALUE (the kind is reported first). */
  expect_error(ndx_error_new(99, NULL, NULL), NDX_ERROR_VALUE, "kind 99");

  /* The cause passes to the new error on the failure paths too (valgrind proves it is
   * freed with it) and is reachable through ndx_error_cause. */
  ndx_error_t* cause = ndx_error_new(NDX_ERROR_TYPE, "the cause", NULL);
  ndx_error_t* e = ndx_error_new(0, "x", cause);
  CHECK(ndx_error_kind(e) == NDX_ERROR_VALUE, "invalid kind -> VALUE");
  CHECK(ndx_error_cause(e) != NULL, "still carries the cause");
  CHECK_STR_EQ(ndx_error_message(ndx_error_cause(e)), "the cause");
  ndx_error_free(e);

  cause = ndx_error_new(NDX_ERROR_TYPE, "cause of a NULL message", NULL);
  e = ndx_error_new(NDX_ERROR_RUNTIME, NULL, cause);
  CHECK(ndx_error_kind(e) == NDX_ERROR_VALUE, "NULL message -> VALUE");
  CHECK_STR_EQ(ndx_error_message(ndx_error_cause(e)), "cause of a NULL message");
  ndx_error_free(e);
}

static NDX_TEST_NOINLINE void test_cause_chain(void) {
  ndx_error_t* root = ndx_error_new(NDX_ERROR_VALUE, "root", NULL);
  ndx_error_t* mid = ndx_error_new(NDX_ERROR_TYPE, "middle", root);
  ndx_error_t* top = ndx_error_new(NDX_ERROR_RUNTIME, "top", mid);
  /* root and mid now belong to top: only top is freed, and the pointers passed in
   * must not be used again (ndx may move the errors: no identity is promised). */
  root = mid = NULL;
  const ndx_error_t* c1 = ndx_error_cause(top);
  const ndx_error_t* c2 = ndx_error_cause(c1);
  CHECK(c1 != NULL && c2 != NULL, "two causes");
  CHECK(ndx_error_cause(c2) == NULL, "the root has no cause");
  CHECK(ndx_error_cause(top) == c1, "the borrowed cause is stable while top lives");
  CHECK(ndx_error_kind(c1) == NDX_ERROR_TYPE && ndx_error_kind(c2) == NDX_ERROR_VALUE,
        "kinds along the chain");
  CHECK_STR_EQ(ndx_error_message(c1), "middle");
  CHECK_STR_EQ(ndx_error_message(c2), "root");
  ndx_error_free(top);
}

static NDX_TEST_NOINLINE void test_clone_is_independent(void) {
  ndx_error_t* cause = ndx_error_new(NDX_ERROR_VALUE, "root bad", NULL);
  ndx_error_t* e = ndx_error_new(NDX_ERROR_RUNTIME, "outer failed", cause);
  size_t frames = ndx_error_frame_count(e);
  ndx_frame_t f0 = frame_of(e, 0);
  uint32_t line0 = f0.line;
  size_t ip0 = f0.ip;
  size_t text_len = ndx_error_format(e, NULL, 0);

  ndx_error_t* c = ndx_error_clone(e);
  CHECK(c != NULL && c != e, "a new object");
  CHECK(ndx_error_message(c) != ndx_error_message(e), "the message is copied");
  ndx_error_free(e); /* the clone must not depend on the original */

  CHECK(ndx_error_kind(c) == NDX_ERROR_RUNTIME, "kind");
  CHECK_STR_EQ(ndx_error_message(c), "outer failed");
  const ndx_error_t* cc = ndx_error_cause(c);
  CHECK(cc != NULL, "the chain is cloned");
  CHECK_STR_EQ(ndx_error_message(cc), "root bad");
  CHECK(ndx_error_kind(cc) == NDX_ERROR_VALUE, "cause kind");
  CHECK(ndx_error_frame_count(c) == frames, "same frames: %zu vs %zu",
        ndx_error_frame_count(c), frames);
  ndx_frame_t g0 = frame_of(c, 0);
  CHECK(g0.line == line0 && g0.ip == ip0, "same frame 0");
  CHECK_STR_EQ(g0.function, "test_clone_is_independent");
  CHECK(ndx_error_format(c, NULL, 0) == text_len, "same traceback length");

  /* A clone of a clone, and the two freed in either order. */
  ndx_error_t* c2 = ndx_error_clone(c);
  ndx_error_free(c);
  CHECK_STR_EQ(ndx_error_message(ndx_error_cause(c2)), "root bad");
  ndx_error_free(c2);

  CHECK(ndx_error_clone(NULL) == NULL, "clone(NULL) is NULL");
}

/* A cause chain as long as host code cares to make: 20000 links, cloned, walked and
 * freed on a thread with a 256 KiB stack (freeing or cloning one stack frame per link
 * overflowed it and killed the process). */
typedef struct {
  size_t links, walked, text_len;
  int root_ok, clone_ok, text_ok;
} long_chain_t;

static void* long_chain_main(void* arg) {
  long_chain_t* r = (long_chain_t*)arg;
  ndx_error_t* e = NULL;
  char msg[32];
  for (size_t i = 0; i < r->links; i++) {
    snprintf(msg, sizeof msg, "link %zu", i);
    e = ndx_error_new(NDX_ERROR_VALUE, msg, e);
  }
  ndx_error_t* copy = ndx_error_clone(e);
  r->clone_ok = copy != NULL && copy != e;
  ndx_error_free(e);
  r->walked = ndx_test_chain_length(copy);
  const ndx_error_t* root = ndx_test_chain_link(copy, r->links - 1);
  r->root_ok = root != NULL && strcmp(ndx_error_message(root), "link 0") == 0;
  /* The traceback prints 32 links at each end and says how many it left out. */
  r->text_len = ndx_error_format(copy, NULL, 0);
  char* text = (char*)malloc(r->text_len + 1);
  if (text) {
    ndx_error_format(copy, text, r->text_len + 1);
    char note[128];
    snprintf(note, sizeof note, "[... %zu more links of this chain of %zu left out", r->links - 64,
             r->links);
    snprintf(msg, sizeof msg, "ValueError: link %zu\n", r->links - 1);
    const char* root_at = strstr(text, "ValueError: link 0\n");
    const char* note_at = strstr(text, note);
    r->text_ok = root_at && note_at && root_at < note_at && ndx_test_ends_with(text, msg) &&
                 strstr(text, "ValueError: link 31\n") && !strstr(text, "ValueError: link 32\n");
    free(text);
  }
  ndx_error_free(copy);
  return NULL;
}

static NDX_TEST_NOINLINE void test_long_cause_chain(void) {
  long_chain_t r = {20000, 0, 0, 0, 0, 0};
  if (!ndx_test_run_on_small_stack(long_chain_main, &r, 256 * 1024)) return;
  CHECK(r.clone_ok, "the chain was cloned");
  CHECK(r.walked == r.links, "the clone has %zu links, expected %zu", r.walked, r.links);
  CHECK(r.root_ok, "the root cause of the clone is the first error made");
  CHECK(r.text_ok, "the traceback shows both ends and the count left out");
  CHECK(r.text_len < 64 * 1024, "the traceback of %zu links is %zu bytes", r.links, r.text_len);
}

static NDX_TEST_NOINLINE void test_null_safety(void) {
  CHECK(ndx_error_message(NULL) == NULL, "message(NULL)");
  CHECK(ndx_error_kind(NULL) == 0, "kind(NULL)");
  CHECK(ndx_error_frame_count(NULL) == 0, "frame_count(NULL)");
  CHECK(ndx_error_cause(NULL) == NULL, "cause(NULL)");
  CHECK(ndx_error_related_count(NULL) == 0, "related_count(NULL)");
  CHECK(ndx_error_related(NULL, 0) == NULL, "related(NULL, 0)");
  CHECK(ndx_error_op(NULL) == NULL, "op(NULL)");
  CHECK(ndx_error_sequence(NULL) == 0, "sequence(NULL)");
  char buf[8] = "intact";
  CHECK(ndx_error_format(NULL, buf, sizeof buf) == 0, "format(NULL) is 0");
  CHECK(buf[0] == '\0' && buf[1] == 'n', "format(NULL) writes the empty text, NUL-terminated");
  CHECK(ndx_error_format(NULL, NULL, 0) == 0, "format(NULL, NULL, 0) is 0");
  ndx_error_free(NULL);
  CHECK(1, "ndx_error_free(NULL) returned");
}

/* A failed ndx_error_frame never leaves a stale frame behind: with a usable `out`
 * (non-NULL, struct_size large enough) every field after struct_size reads zero, as
 * the header's "out-params are NULL/0 on error" promises. */
static NDX_TEST_NOINLINE void test_frame_cleared_on_failure(void) {
  ndx_error_t* e = ndx_error_new(NDX_ERROR_RUNTIME, "with frames", NULL);
  size_t count = ndx_error_frame_count(e);
  ndx_frame_t f;
  memset(&f, 0, sizeof f);
  f.struct_size = sizeof f;
  CHECK_OK(ndx_error_frame(e, 0, &f));
  CHECK(f.function != NULL && f.ip != 0, "frame 0 is filled");
  expect_error(ndx_error_frame(e, count, &f), NDX_ERROR_INDEX, "out of range");
  CHECK(f.struct_size == sizeof f, "struct_size kept: %zu", f.struct_size);
  CHECK(f.function == NULL && f.file == NULL, "stale strings after an index error");
  CHECK(f.line == 0 && f.column == 0 && f.ip == 0 && (int)f.origin == 0,
        "stale numbers after an index error: line %u ip %zu", f.line, f.ip);

  CHECK_OK(ndx_error_frame(e, 0, &f));
  expect_error(ndx_error_frame(NULL, 0, &f), NDX_ERROR_VALUE, "argument 'error' is NULL");
  CHECK(f.function == NULL && f.ip == 0, "stale frame after a NULL error");
  ndx_error_free(e);
}

static NDX_TEST_NOINLINE void test_frame_arguments(void) {
  ndx_error_t* e = ndx_error_new(NDX_ERROR_RUNTIME, "with frames", NULL);
  size_t count = ndx_error_frame_count(e);
  CHECK(count >= 2, "at least the caller and main: %zu", count);

  ndx_frame_t f;
  memset(&f, 0, sizeof f);
  f.struct_size = sizeof f;
  expect_error(ndx_error_frame(NULL, 0, &f), NDX_ERROR_VALUE, "argument 'error' is NULL");
  expect_error(ndx_error_frame(e, 0, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");

  f.struct_size = sizeof f - 1;
  expect_error(ndx_error_frame(e, 0, &f), NDX_ERROR_VALUE, "struct_size");
  f.struct_size = 0;
  expect_error(ndx_error_frame(e, 0, &f), NDX_ERROR_VALUE, "sizeof(ndx_frame_t)");
  CHECK(f.function == NULL && f.line == 0, "nothing written on a struct_size error");

  f.struct_size = sizeof f;
  expect_error(ndx_error_frame(e, count, &f), NDX_ERROR_INDEX, "out of range");
  expect_error(ndx_error_frame(e, (size_t)-1, &f), NDX_ERROR_INDEX, "out of range");

  /* A caller built against a later, larger ndx_frame_t: ndx fills what it knows and
   * leaves the rest (and struct_size) alone. */
  struct {
    ndx_frame_t frame;
    unsigned char tail[16];
  } big;
  memset(&big, 0xAB, sizeof big);
  big.frame.struct_size = sizeof big;
  CHECK_OK(ndx_error_frame(e, 0, &big.frame));
  CHECK(big.frame.struct_size == sizeof big, "struct_size kept: %zu", big.frame.struct_size);
  CHECK_STR_EQ(big.frame.function, "test_frame_arguments");
  int tail_intact = 1;
  for (size_t i = 0; i < sizeof big.tail; i++) {
    if (big.tail[i] != 0xAB) tail_intact = 0;
  }
  CHECK(tail_intact, "bytes past sizeof(ndx_frame_t) untouched");
  ndx_error_free(e);
}

/* ---- native capture sites ------------------------------------------------------------
 *
 * Frame 0 of an error is the return address of the call into ndx: the C function and
 * line that called ndx_error_new (or the API function that failed). Two things at -O2
 * can move it:
 *  - inlining: make_error_here would vanish into its caller. NDX_TEST_NOINLINE (noipa
 *    on GCC) keeps its frame and its name (no .isra/.constprop clone).
 *  - a tail call: `return ndx_error_new(...);` may compile to a jump, so that
 *    make_error_here's frame is gone when ndx unwinds; the return address ndx finds is
 *    then in make_error_here's *caller*, so frame 0 becomes the caller's caller of
 *    ndx_error_new, at the line that called make_error_here (GCC 12 does this at -O2).
 *    make_error_here avoids it by reading the result back from a volatile local, so
 *    the call is never in tail position.
 * test_tail_call below shows the second effect where it is deterministic: with a
 * `musttail` attribute (clang, GCC >= 15) the tail call is guaranteed, and at -O0 it
 * never happens. Elsewhere (-O2 without musttail) either outcome is accepted, and a
 * tail call must then point at the calling line. */

static NDX_TEST_NOINLINE ndx_error_t* make_error_here(int* line) {
  *line = __LINE__ + 1;
  ndx_error_t* volatile e = ndx_error_new(NDX_ERROR_RUNTIME, "made here", NULL);
  return e; /* not a tail call: the volatile store and load come after the call */
}

static int frame_named(const ndx_error_t* e, const char* function) {
  size_t n = ndx_error_frame_count(e);
  for (size_t i = 0; i < n; i++) {
    ndx_frame_t f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    ndx_error_t* err = ndx_error_frame(e, i, &f);
    if (err) {
      ndx_error_free(err);
      return -1;
    }
    if (ndx_test_str_eq(f.function, function)) return (int)i;
  }
  return -1;
}

static NDX_TEST_NOINLINE void test_native_frames(void) {
  int line = 0;
  int call_line = __LINE__ + 1;
  ndx_error_t* e = make_error_here(&line);
  CHECK(e != NULL, "made");
  size_t count = ndx_error_frame_count(e);
  CHECK(count >= 3 && count <= 16, "frames: make_error_here, test_native_frames, main, ...: %zu",
        count);

  ndx_frame_t f0 = frame_of(e, 0);
  CHECK_STR_EQ(f0.function, "make_error_here");
  CHECK_ENDS_WITH(f0.file, "test_errors.c");
  CHECK(f0.line == (uint32_t)line, "frame 0 line %u, expected %d", (unsigned)f0.line, line);
  CHECK(f0.origin == NDX_FRAME_NATIVE, "native origin");
  CHECK(f0.ip != 0, "native frames have an ip");

  ndx_frame_t f1 = frame_of(e, 1);
  CHECK_STR_EQ(f1.function, "test_native_frames");
  CHECK_ENDS_WITH(f1.file, "test_errors.c");
  CHECK(f1.line == (uint32_t)call_line, "frame 1 line %u, expected %d", (unsigned)f1.line,
        call_line);
  CHECK(f1.origin == NDX_FRAME_NATIVE && f1.ip != 0 && f1.ip != f0.ip, "distinct native frame");

  CHECK(frame_named(e, "main") >= 2, "main is further out");

  /* No frame of ndx itself, of the unwinder or of the Rust runtime; every frame is a
   * real native frame (a return address, as ndx_frame_t documents for native frames). */
  for (size_t i = 0; i < count; i++) {
    ndx_frame_t f = frame_of(e, i);
    const char* fn = f.function ? f.function : "";
    CHECK(f.origin == NDX_FRAME_NATIVE && f.ip != 0,
          "frame %zu (%s): origin %d, ip %#zx: a native frame without a return address", i,
          NDX_TEST_S(f.function), (int)f.origin, f.ip);
    CHECK(strncmp(fn, "ndx_", 4) != 0 && strncmp(fn, "ndx::", 5) != 0 &&
              strncmp(fn, "backtrace::", 11) != 0 && strncmp(fn, "std::", 5) != 0 &&
              strncmp(fn, "core::", 6) != 0,
          "frame %zu is %s", i, fn);
  }

  /* Asking again returns the same cached strings. */
  ndx_frame_t again = frame_of(e, 0);
  CHECK(again.function == f0.function && again.file == f0.file, "frames are cached");

  /* The traceback prints them outermost first ("most recent call last"). */
  size_t n = ndx_error_format(e, NULL, 0);
  char* text = (char*)malloc(n + 1);
  if (CHECK(text != NULL, "malloc")) {
    ndx_error_format(e, text, n + 1);
    const char* p_main = strstr(text, ", in main");
    const char* p_test = strstr(text, ", in test_native_frames");
    const char* p_here = strstr(text, ", in make_error_here");
    const char* p_msg = strstr(text, "RuntimeError: made here");
    CHECK(p_main && p_test && p_here && p_msg && p_main < p_test && p_test < p_here &&
              p_here < p_msg,
          "order main < test_native_frames < make_error_here < message:\n%s", NDX_TEST_S(text));
    /* The make_error_here line names the recorded line:
     *   File ".../test_errors.c", line N[, column C], in make_error_here */
    if (p_here) {
      const char* start = p_here;
      while (start > text && start[-1] != '\n') start--;
      char expect[64], line_text[512];
      snprintf(expect, sizeof expect, "test_errors.c\", line %d,", line);
      size_t len = (size_t)(p_here - start);
      if (len >= sizeof line_text) len = sizeof line_text - 1;
      memcpy(line_text, start, len);
      line_text[len] = '\0';
      CHECK_CONTAINS(line_text, expect);
    }
    CHECK_CONTAINS(text, "test_errors.c\", line ");
    free(text);
  }
  ndx_error_free(e);
}

/* A failing API call: frame 0 is the C line that made the call. */
static NDX_TEST_NOINLINE void test_failed_call_site(void) {
  int32_t n = 77;
  int line = __LINE__ + 1;
  ndx_error_t* e = ndx_tensor_ndim(NULL, &n);
  CHECK(n == 0, "out reset on error");
  CHECK(ndx_error_kind(e) == NDX_ERROR_VALUE, "kind %d", (int)ndx_error_kind(e));
  CHECK_CONTAINS(ndx_error_message(e), "argument 'tensor' is NULL");
  ndx_frame_t f0 = frame_of(e, 0);
  CHECK_STR_EQ(f0.function, "test_failed_call_site");
  CHECK_ENDS_WITH(f0.file, "test_errors.c");
  CHECK(f0.line == (uint32_t)line, "frame 0 line %u, expected %d", (unsigned)f0.line, line);
  ndx_frame_t f1 = frame_of(e, 1);
  CHECK_STR_EQ(f1.function, "main");
  ndx_error_free(e);

  /* Same for an error raised deep inside the library (a validation error). */
  int64_t shape[1] = {-5};
  ndx_tensor_t* t = NULL;
  line = __LINE__ + 1;
  e = ndx_tensor_from_host(NULL, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &t);
  CHECK(t == NULL, "no tensor");
  CHECK_CONTAINS(ndx_error_message(e), "shape[0] is -5");
  f0 = frame_of(e, 0);
  CHECK_STR_EQ(f0.function, "test_failed_call_site");
  CHECK(f0.line == (uint32_t)line, "frame 0 line %u, expected %d", (unsigned)f0.line, line);
  ndx_error_free(e);
}

/* The cause keeps its own site. */
static NDX_TEST_NOINLINE void test_cause_site(void) {
  int root_line = __LINE__ + 1;
  ndx_error_t* root = ndx_error_new(NDX_ERROR_VALUE, "root", NULL);
  int outer_line = __LINE__ + 1;
  ndx_error_t* outer = ndx_error_new(NDX_ERROR_RUNTIME, "outer", root);
  ndx_frame_t fo = frame_of(outer, 0);
  ndx_frame_t fr = frame_of(ndx_error_cause(outer), 0);
  CHECK(fo.line == (uint32_t)outer_line, "outer frame 0 line %u, expected %d",
        (unsigned)fo.line, outer_line);
  CHECK(fr.line == (uint32_t)root_line, "cause frame 0 line %u, expected %d",
        (unsigned)fr.line, root_line);
  CHECK_STR_EQ(fo.function, "test_cause_site");
  CHECK_STR_EQ(fr.function, "test_cause_site");
  ndx_error_free(outer);
}

#if defined(__has_attribute)
#if __has_attribute(musttail)
#define NDX_TEST_HAVE_MUSTTAIL 1
#endif
#endif

/* Same signature as ndx_error_new, as clang's musttail requires. */
static NDX_TEST_NOINLINE ndx_error_t* make_error_tail(int32_t kind, const char* message,
                                                      ndx_error_t* cause) {
#if defined(NDX_TEST_HAVE_MUSTTAIL)
  __attribute__((musttail)) return ndx_error_new(kind, message, cause);
#else
  return ndx_error_new(kind, message, cause);
#endif
}

static NDX_TEST_NOINLINE void test_tail_call(void) {
  int call_line = __LINE__ + 1;
  ndx_error_t* volatile e = make_error_tail(NDX_ERROR_RUNTIME, "tail", NULL);
  ndx_frame_t f0 = frame_of(e, 0);
  int tail_called = ndx_test_str_eq(f0.function, "test_tail_call");
  int not_tail = ndx_test_str_eq(f0.function, "make_error_tail");
#if defined(NDX_TEST_HAVE_MUSTTAIL)
  /* Guaranteed tail call: frame 0 is the caller's caller, at the line that called
   * make_error_tail. */
  CHECK(tail_called, "musttail: frame 0 is %s", NDX_TEST_S(f0.function));
#elif !defined(__OPTIMIZE__)
  /* -O0: no tail calls. */
  CHECK(not_tail, "-O0: frame 0 is %s", NDX_TEST_S(f0.function));
#else
  CHECK(tail_called || not_tail, "frame 0 is %s", NDX_TEST_S(f0.function));
#endif
  if (tail_called) {
    CHECK(f0.line == (uint32_t)call_line, "tail call: frame 0 line %u, expected %d",
          (unsigned)f0.line, call_line);
  }
  ndx_error_free(e);
}

static NDX_TEST_NOINLINE void test_format(void) {
  ndx_error_t* cause = ndx_error_new(NDX_ERROR_VALUE, "root bad", NULL);
  ndx_error_t* e = ndx_error_new(NDX_ERROR_RUNTIME, "outer failed", cause);

  size_t n = ndx_error_format(e, NULL, 0);
  CHECK(n > 0, "length %zu", n);
  char sentinel = '#';
  CHECK(ndx_error_format(e, &sentinel, 0) == n, "cap 0 returns the length");
  CHECK(sentinel == '#', "cap 0 writes nothing");

  char* text = (char*)malloc(n + 2);
  if (!CHECK(text != NULL, "malloc")) {
    ndx_error_free(e);
    return;
  }
  memset(text, 'Z', n + 2);
  CHECK(ndx_error_format(e, text, n + 1) == n, "full text");
  CHECK(strlen(text) == n, "NUL-terminated at n: strlen %zu, n %zu", strlen(text), n);
  CHECK(text[n + 1] == 'Z', "nothing written past cap");

  CHECK_CONTAINS(text, "Traceback (most recent call last):");
  const char* root = strstr(text, "ValueError: root bad");
  const char* sep =
      strstr(text, "The above exception was the direct cause of the following exception:");
  const char* outer = strstr(text, "RuntimeError: outer failed");
  CHECK(root && sep && outer && root < sep && sep < outer,
        "root cause, separator, outer error in that order:\n%s", NDX_TEST_S(text));
  const char* tb1 = strstr(text, "Traceback (most recent call last):");
  const char* tb2 = tb1 ? strstr(tb1 + 1, "Traceback (most recent call last):") : NULL;
  CHECK(tb1 && tb2 && tb1 < root && root < tb2 && tb2 < outer,
        "each link has its own traceback:\n%s", NDX_TEST_S(text));
  CHECK(n >= 1 && text[n - 1] == '\n', "ends with a newline");
  CHECK(ndx_test_ends_with(text, "RuntimeError: outer failed\n"), "outer error last:\n%s",
        NDX_TEST_S(text));
  CHECK_CONTAINS(text, "in test_format");

  /* Truncation: at most cap - 1 characters, NUL-terminated, the prefix of the text. */
  char small[16];
  memset(small, 'Z', sizeof small);
  CHECK(ndx_error_format(e, small, 10) == n, "returns the full length when truncating");
  CHECK(strlen(small) == 9, "9 characters + NUL: %zu", strlen(small));
  CHECK(strncmp(small, text, 9) == 0, "a prefix of the full text");
  CHECK(small[10] == 'Z', "nothing written past cap");

  char one[2] = {'Z', 'Z'};
  CHECK(ndx_error_format(e, one, 1) == n, "cap 1");
  CHECK(one[0] == '\0' && one[1] == 'Z', "cap 1 writes only the NUL");

  /* NULL buffer with a non-zero cap: nothing written, length returned. */
  CHECK(ndx_error_format(e, NULL, 100) == n, "NULL buf returns the length");

  /* A cut inside a multi-byte character ends before it: the text stays valid UTF-8.
   * "\xc3\xa9" is U+00E9 and "\xf0\x9f\x98\x80" U+1F600. */
  {
    ndx_error_t* u = ndx_error_new(NDX_ERROR_VALUE, "caf\xc3\xa9 \xf0\x9f\x98\x80!", NULL);
    size_t un = ndx_error_format(u, NULL, 0);
    char* ut = malloc(un + 1);
    ndx_error_format(u, ut, un + 1);
    const char* chars[2] = {"\xc3\xa9", "\xf0\x9f\x98\x80"};
    for (int c = 0; c < 2; c++) {
      size_t start = (size_t)(strstr(ut, chars[c]) - ut), len = strlen(chars[c]);
      for (size_t at = 1; at < len; at++) {
        char cut[256];
        memset(cut, 'Z', sizeof cut);
        CHECK(ndx_error_format(u, cut, start + at + 1) == un, "returns the full length");
        CHECK(strlen(cut) == start && strncmp(cut, ut, start) == 0,
              "a cut %zu bytes into character %d ends before it (%zu bytes kept)", at, c,
              strlen(cut));
      }
    }
    free(ut);
    ndx_error_free(u);
  }

  /* Exactly n bytes: the last character is cut for the NUL. */
  memset(text, 'Z', n + 2);
  CHECK(ndx_error_format(e, text, n) == n, "cap n");
  CHECK(strlen(text) == n - 1, "cap n holds n - 1 characters");

  free(text);
  ndx_error_free(e);

  /* An error without a cause: no separator. */
  ndx_error_t* single = ndx_error_new(NDX_ERROR_INDEX, "lonely", NULL);
  char buf[4096];
  size_t m = ndx_error_format(single, buf, sizeof buf);
  CHECK(m < sizeof buf, "fits");
  CHECK(!ndx_test_contains(buf, "direct cause"), "no separator without a cause");
  CHECK(ndx_test_ends_with(buf, "IndexError: lonely\n"), "%s", NDX_TEST_S(buf));
  ndx_error_free(single);
}

static NDX_TEST_NOINLINE void test_panic_boundary(void) {
#if defined(NDX_TEST_HOOKS)
  ndx_error_t* e = ndx_test_panic("boom");
  CHECK(e != NULL, "a panic is an error, not an abort");
  CHECK(ndx_error_kind(e) == NDX_ERROR_INTERNAL, "kind %d", (int)ndx_error_kind(e));
  CHECK_CONTAINS(ndx_error_message(e), "panic in ndx_test_panic: boom");
  ndx_frame_t f0 = frame_of(e, 0);
  CHECK_STR_EQ(f0.function, "test_panic_boundary");
  CHECK_ENDS_WITH(f0.file, "test_errors.c");
  ndx_error_free(e);

  /* Still alive, and the library still works (twice more, and a normal call). */
  expect_error(ndx_test_panic("again"), NDX_ERROR_INTERNAL, "panic in ndx_test_panic: again");
  expect_error(ndx_test_panic(NULL), NDX_ERROR_VALUE, "argument 'message' is NULL");
  ndx_error_t* ok = ndx_error_new(NDX_ERROR_RUNTIME, "after the panic", NULL);
  CHECK_STR_EQ(ndx_error_message(ok), "after the panic");
  ndx_error_free(ok);
#else
  printf("test_errors: NDX_TEST_HOOKS not defined, panic-boundary test skipped\n");
#endif
}

int main(void) {
  test_version();
  test_kind_names();
  test_new_every_kind();
  test_message_is_copied();
  test_invalid_kind_and_null_message();
  test_cause_chain();
  test_clone_is_independent();
  test_long_cause_chain();
  test_null_safety();
  test_frame_arguments();
  test_frame_cleared_on_failure();
  test_native_frames();
  test_failed_call_site();
  test_cause_site();
  test_tail_call();
  test_format();
  test_panic_boundary();
  return NDX_TEST_SUMMARY("test_errors");
}
