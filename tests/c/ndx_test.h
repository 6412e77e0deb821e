/* ndx_test.h - a tiny shared harness for the C tests of ndx.
 *
 *   CHECK(cond, fmt, ...)       counts a pass or a failure; a failure prints file:line,
 *                               the condition and the formatted message. Evaluates to
 *                               1 when cond holds, so `if (CHECK(...))` guards follow-ups.
 *   CHECK_OK(expr)              expr is an ndx call returning ndx_error_t*: passes when
 *                               it is NULL, otherwise prints the traceback and frees it.
 *   expect_error(e, kind, frag) passes when e is an error of `kind` whose message
 *                               contains `frag` (frag may be NULL); always frees e.
 *   CHECK_STR_EQ / CHECK_CONTAINS / CHECK_ENDS_WITH  string checks (NULL-safe).
 *   NDX_TEST_SUMMARY(name)      prints "name: P passed, F failed", yields main's status.
 *   CHECK_LINK(e, kind, frag, op, seq)   one link of an error chain (not freed): kind,
 *                               message fragment, ndx_error_op (NULL: none), sequence.
 *   CHECK_FRAME(e, i, file_suffix, line, function, origin)   frame i of e (NULL/0: any).
 *   ndx_test_chain_length / ndx_test_chain_link / ndx_test_get_frame   chain and frames.
 *   ndx_test_new_context(opts)  a context, or abort.
 *   ndx_test_tensor / ndx_test_in / ndx_test_output   host tensors, inputs, outputs.
 *   ndx_test_schema(n_inputs, n_outputs)   a host operator schema, other fields zero.
 *   ndx_test_watchdog_start/_phase/_stop   turns a hang into a failure (POSIX tests only).
 *   ndx_test_run_on_small_stack(fn, arg, bytes)   fn on a thread with a small stack (POSIX).
 *
 * DLPack producer: ndx_test_versioned() / ndx_test_legacy() build a heap-allocated
 * managed tensor that owns malloc'd shape, strides and data. Its deleter frees all of
 * them (whatever the test has since pointed the DLTensor fields at) and increments the
 * int counter stored in manager_ctx, so a test can assert that the deleter ran exactly
 * 0 or 1 times. A test that keeps ownership (an import that failed) releases the tensor
 * itself with ndx_test_drop_versioned() / ndx_test_drop_legacy().
 *
 * Everything is static (functions static inline), so each test is one translation unit
 * and no unused-function warning fires under -Wall -Wextra -Werror.
 */
#ifndef NDX_TEST_H
#define NDX_TEST_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndx.h"

/* A function that is never inlined, cloned or otherwise changed by interprocedural
 * optimisation, so that it keeps its own frame and name at -O2. */
#if defined(__GNUC__) && !defined(__clang__)
#define NDX_TEST_NOINLINE __attribute__((noipa))
#else
#define NDX_TEST_NOINLINE __attribute__((noinline))
#endif

#if defined(__GNUC__) || defined(__clang__)
#define NDX_TEST_PRINTF(fmt_index, first_arg) \
  __attribute__((format(printf, fmt_index, first_arg)))
#else
#define NDX_TEST_PRINTF(fmt_index, first_arg)
#endif

static int ndx_test_passed_ = 0;
static int ndx_test_failed_ = 0;
/* A label printed after every failure until changed (NULL: none), e.g. the mode a
 * parameterised test runs in: NDX_TEST_CONTEXT("mode EAGER"). */
static const char* ndx_test_context_ = NULL;
#define NDX_TEST_CONTEXT(label) (ndx_test_context_ = (label))

static inline int ndx_test_check_(int ok, const char* file, int line, const char* cond,
                                  const char* fmt, ...) NDX_TEST_PRINTF(5, 6);

static inline int ndx_test_check_(int ok, const char* file, int line, const char* cond,
                                  const char* fmt, ...) {
  if (ok) {
    ndx_test_passed_++;
    return 1;
  }
  ndx_test_failed_++;
  fprintf(stderr, "%s:%d: CHECK failed: %s", file, line, cond);
  if (fmt && fmt[0]) {
    va_list ap;
    va_start(ap, fmt);
    fputs(": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  if (ndx_test_context_) fprintf(stderr, " [%s]", ndx_test_context_);
  fputc('\n', stderr);
  fflush(stderr);
  return 0;
}

/* CHECK(cond, fmt, args...): the message is mandatory and must not be empty (an empty
 * format string trips -Wformat-zero-length under -Wall -Werror). */
#define CHECK(cond, ...) ndx_test_check_((cond) ? 1 : 0, __FILE__, __LINE__, #cond, __VA_ARGS__)

/* Prints an error's full traceback to stderr. */
static inline void ndx_test_print_error(const ndx_error_t* e) {
  size_t n = ndx_error_format(e, NULL, 0);
  char* text = (char*)malloc(n + 1);
  if (!text) {
    fprintf(stderr, "    (out of memory formatting the error)\n");
    return;
  }
  ndx_error_format(e, text, n + 1);
  fprintf(stderr, "    ---- ndx error ----\n%s    -------------------\n", text);
  free(text);
}

static inline int ndx_test_check_ok_(ndx_error_t* e, const char* file, int line,
                                     const char* expr) {
  if (e == NULL) {
    ndx_test_passed_++;
    return 1;
  }
  ndx_test_failed_++;
  fprintf(stderr, "%s:%d: CHECK_OK failed: %s returned an error (%s: %s)\n", file, line, expr,
          ndx_error_kind_name(ndx_error_kind(e)) ? ndx_error_kind_name(ndx_error_kind(e)) : "?",
          ndx_error_message(e) ? ndx_error_message(e) : "(null)");
  if (ndx_test_context_) fprintf(stderr, "    [%s]\n", ndx_test_context_);
  ndx_test_print_error(e);
  ndx_error_free(e);
  fflush(stderr);
  return 0;
}

/* CHECK_OK(ndx call): the call must succeed (return NULL). Frees any error. */
#define CHECK_OK(expr) ndx_test_check_ok_((expr), __FILE__, __LINE__, #expr)

static inline int ndx_test_expect_error_(ndx_error_t* e, int kind, const char* fragment,
                                         const char* file, int line, const char* expr) {
  int ok = 1;
  if (e == NULL) {
    fprintf(stderr, "%s:%d: expect_error failed: %s succeeded; expected %s containing \"%s\"\n",
            file, line, expr, ndx_error_kind_name(kind) ? ndx_error_kind_name(kind) : "?",
            fragment ? fragment : "");
    ndx_test_failed_++;
    fflush(stderr);
    return 0;
  }
  const char* msg = ndx_error_message(e);
  if (ndx_error_kind(e) != kind) {
    fprintf(stderr, "%s:%d: expect_error failed: %s: kind %d (%s), expected %d (%s); message: %s\n",
            file, line, expr, (int)ndx_error_kind(e),
            ndx_error_kind_name(ndx_error_kind(e)) ? ndx_error_kind_name(ndx_error_kind(e)) : "?",
            kind, ndx_error_kind_name(kind) ? ndx_error_kind_name(kind) : "?",
            msg ? msg : "(null)");
    ok = 0;
  }
  if (msg == NULL || (fragment && strstr(msg, fragment) == NULL)) {
    fprintf(stderr, "%s:%d: expect_error failed: %s: message \"%s\" lacks \"%s\"\n", file,
            line, expr, msg ? msg : "(null)", fragment ? fragment : "");
    ok = 0;
  }
  if (ok) {
    ndx_test_passed_++;
  } else {
    ndx_test_failed_++;
    fflush(stderr);
  }
  ndx_error_free(e);
  return ok;
}

/* expect_error(e, kind, fragment): e must be an error of `kind` whose message contains
 * `fragment` (NULL: any message). Frees e in every case. */
#define expect_error(e, kind, fragment) \
  ndx_test_expect_error_((e), (kind), (fragment), __FILE__, __LINE__, #e)

static inline int ndx_test_str_eq(const char* a, const char* b) {
  return a != NULL && b != NULL && strcmp(a, b) == 0;
}

static inline int ndx_test_contains(const char* haystack, const char* needle) {
  return haystack != NULL && needle != NULL && strstr(haystack, needle) != NULL;
}

static inline int ndx_test_ends_with(const char* s, const char* suffix) {
  if (s == NULL || suffix == NULL) return 0;
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static inline const char* ndx_test_s(const char* p) { return p ? p : "(null)"; }
#define NDX_TEST_S(p) ndx_test_s(p)

/* String checks: each argument is evaluated once. */
static inline int ndx_test_str_check_(int which, const char* a, const char* b, const char* file,
                                      int line, const char* ea, const char* eb) {
  static const char* const verb[3] = {"equal", "contain", "end with"};
  int ok = which == 0 ? ndx_test_str_eq(a, b)
           : which == 1 ? ndx_test_contains(a, b)
                        : ndx_test_ends_with(a, b);
  return ndx_test_check_(ok, file, line, ea, "\"%s\" does not %s %s = \"%s\"", ndx_test_s(a),
                         verb[which], eb, ndx_test_s(b));
}
#define CHECK_STR_EQ(a, b) ndx_test_str_check_(0, (a), (b), __FILE__, __LINE__, #a, #b)
#define CHECK_CONTAINS(s, frag) ndx_test_str_check_(1, (s), (frag), __FILE__, __LINE__, #s, #frag)
#define CHECK_ENDS_WITH(s, suf) ndx_test_str_check_(2, (s), (suf), __FILE__, __LINE__, #s, #suf)

/* Compares n int64 values; prints both arrays on a mismatch. */
static inline int ndx_test_i64_eq_(const int64_t* a, const int64_t* b, int n, const char* file,
                                   int line, const char* what) {
  int ok = (n == 0) || (a != NULL && b != NULL);
  for (int i = 0; ok && i < n; i++) {
    if (a[i] != b[i]) ok = 0;
  }
  if (ok) {
    ndx_test_passed_++;
    return 1;
  }
  ndx_test_failed_++;
  fprintf(stderr, "%s:%d: CHECK failed: %s: got [", file, line, what);
  for (int i = 0; a && i < n; i++) fprintf(stderr, "%s%lld", i ? ", " : "", (long long)a[i]);
  fprintf(stderr, "], expected [");
  for (int i = 0; b && i < n; i++) fprintf(stderr, "%s%lld", i ? ", " : "", (long long)b[i]);
  fprintf(stderr, "]\n");
  fflush(stderr);
  return 0;
}
#define CHECK_I64_ARRAY(actual, expected, n) \
  ndx_test_i64_eq_((actual), (expected), (n), __FILE__, __LINE__, #actual " == " #expected)

/* Prints the summary line and returns main's exit status. */
static inline int ndx_test_summary_(const char* name) {
  printf("%s: %d passed, %d failed\n", name, ndx_test_passed_, ndx_test_failed_);
  fflush(stdout);
  return ndx_test_failed_ == 0 ? 0 : 1;
}
#define NDX_TEST_SUMMARY(name) ndx_test_summary_(name)

/* ---- DLPack helpers ------------------------------------------------------------------ */

static inline DLDataType ndx_test_dl_dtype(uint8_t code, uint8_t bits, uint16_t lanes) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = lanes;
  return t;
}
#define NDX_TEST_DL_F32 ndx_test_dl_dtype(kDLFloat, 32, 1)
#define NDX_TEST_DL_I32 ndx_test_dl_dtype(kDLInt, 32, 1)

/* What the producer allocated, remembered apart from the DLTensor fields (which tests
 * overwrite to make invalid tensors). */
typedef struct {
  int64_t* shape;
  int64_t* strides;
  void* data;
} ndx_test_allocs;

typedef struct {
  DLManagedTensorVersioned managed; /* first: the deleter casts self back */
  ndx_test_allocs allocs;
} ndx_test_versioned_block;

typedef struct {
  DLManagedTensor managed; /* first: the deleter casts self back */
  ndx_test_allocs allocs;
} ndx_test_legacy_block;

static inline void ndx_test_free_allocs(ndx_test_allocs* a) {
  free(a->shape);
  free(a->strides);
  free(a->data);
}

static inline void ndx_test_versioned_deleter(DLManagedTensorVersioned* self) {
  if (self == NULL) return;
  int* counter = (int*)self->manager_ctx;
  ndx_test_versioned_block* block = (ndx_test_versioned_block*)self;
  ndx_test_free_allocs(&block->allocs);
  free(block);
  if (counter) (*counter)++;
}

static inline void ndx_test_legacy_deleter(DLManagedTensor* self) {
  if (self == NULL) return;
  int* counter = (int*)self->manager_ctx;
  ndx_test_legacy_block* block = (ndx_test_legacy_block*)self;
  ndx_test_free_allocs(&block->allocs);
  free(block);
  if (counter) (*counter)++;
}

/* Fills a CPU DLTensor that owns fresh copies of shape, strides (NULL: none) and
 * `data_bytes` bytes of data (copied from `init` when not NULL, else zeroed; no data
 * when data_bytes is 0). Aborts on allocation failure (tests cannot go on). */
static inline void ndx_test_fill(DLTensor* dl, ndx_test_allocs* allocs, DLDataType dtype,
                                 int32_t ndim, const int64_t* shape, const int64_t* strides,
                                 const void* init, size_t data_bytes) {
  size_t n = ndim > 0 ? (size_t)ndim : 1;
  allocs->shape = (int64_t*)calloc(n, sizeof(int64_t));
  allocs->strides = strides ? (int64_t*)calloc(n, sizeof(int64_t)) : NULL;
  allocs->data = data_bytes ? calloc(1, data_bytes) : NULL;
  if (!allocs->shape || (strides && !allocs->strides) || (data_bytes && !allocs->data)) {
    fprintf(stderr, "ndx_test: out of memory\n");
    abort();
  }
  for (int32_t i = 0; i < ndim; i++) {
    allocs->shape[i] = shape[i];
    if (strides) allocs->strides[i] = strides[i];
  }
  if (init && data_bytes) memcpy(allocs->data, init, data_bytes);
  dl->data = allocs->data;
  dl->device.device_type = kDLCPU;
  dl->device.device_id = 0;
  dl->ndim = ndim;
  dl->dtype = dtype;
  dl->shape = ndim > 0 ? allocs->shape : NULL;
  dl->strides = allocs->strides;
  dl->byte_offset = 0;
}

/* A versioned (1.x) producer tensor on the CPU; `counter` counts its deleter's calls. */
static inline DLManagedTensorVersioned* ndx_test_versioned(int* counter, DLDataType dtype,
                                                           int32_t ndim, const int64_t* shape,
                                                           const int64_t* strides,
                                                           const void* init,
                                                           size_t data_bytes) {
  ndx_test_versioned_block* b = (ndx_test_versioned_block*)calloc(1, sizeof(*b));
  if (!b) {
    fprintf(stderr, "ndx_test: out of memory\n");
    abort();
  }
  b->managed.version.major = DLPACK_MAJOR_VERSION;
  b->managed.version.minor = DLPACK_MINOR_VERSION;
  b->managed.manager_ctx = counter;
  b->managed.deleter = ndx_test_versioned_deleter;
  b->managed.flags = 0;
  ndx_test_fill(&b->managed.dl_tensor, &b->allocs, dtype, ndim, shape, strides, init,
                data_bytes);
  return &b->managed;
}

/* A legacy producer tensor on the CPU; `counter` counts its deleter's calls. */
static inline DLManagedTensor* ndx_test_legacy(int* counter, DLDataType dtype, int32_t ndim,
                                               const int64_t* shape, const int64_t* strides,
                                               const void* init, size_t data_bytes) {
  ndx_test_legacy_block* b = (ndx_test_legacy_block*)calloc(1, sizeof(*b));
  if (!b) {
    fprintf(stderr, "ndx_test: out of memory\n");
    abort();
  }
  b->managed.manager_ctx = counter;
  b->managed.deleter = ndx_test_legacy_deleter;
  ndx_test_fill(&b->managed.dl_tensor, &b->allocs, dtype, ndim, shape, strides, init,
                data_bytes);
  return &b->managed;
}

/* Releases a tensor the test still owns (the import failed): calls its deleter, which
 * bumps the counter. */
static inline void ndx_test_drop_versioned(DLManagedTensorVersioned* t) {
  if (t) t->deleter(t);
}
static inline void ndx_test_drop_legacy(DLManagedTensor* t) {
  if (t) t->deleter(t);
}

/* Import options with struct_size set. */
static inline ndx_import_options_t ndx_test_options(const char* layout, bool read_only) {
  ndx_import_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof(ndx_import_options_t);
  o.layout = layout;
  o.read_only = read_only;
  return o;
}

/* ---- error chains and frames ------------------------------------------------------- */

/* The number of links of e's cause chain (e itself included); 0 for NULL. */
static inline size_t ndx_test_chain_length(const ndx_error_t* e) {
  size_t n = 0;
  for (; e != NULL; e = ndx_error_cause(e)) n++;
  return n;
}

/* Link `i` of e's cause chain (0: e itself), or NULL. */
static inline const ndx_error_t* ndx_test_chain_link(const ndx_error_t* e, size_t i) {
  for (; e != NULL && i > 0; i--) e = ndx_error_cause(e);
  return e;
}

/* Frame `index` of `e` into *out (zeroed first); 1 on success, 0 (nothing counted) when
 * ndx_error_frame fails. */
static inline int ndx_test_get_frame(const ndx_error_t* e, size_t index, ndx_frame_t* out) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  ndx_error_t* err = ndx_error_frame(e, index, out);
  if (err) {
    ndx_error_free(err);
    memset(out, 0, sizeof *out);
    return 0;
  }
  return 1;
}

static inline int ndx_test_frame_check_(const ndx_error_t* e, size_t index,
                                        const char* file_suffix, int line,
                                        const char* function, int origin, const char* file,
                                        int src_line, const char* what) {
  ndx_frame_t f;
  int ok = ndx_test_get_frame(e, index, &f);
  const char* problem = ok ? NULL : "no such frame";
  if (ok && file_suffix && !ndx_test_ends_with(f.file, file_suffix)) problem = "file";
  if (ok && !problem && line > 0 && f.line != (uint32_t)line) problem = "line";
  if (ok && !problem && function && !ndx_test_str_eq(f.function, function)) problem = "function";
  if (ok && !problem && origin != 0 && f.origin != origin) problem = "origin";
  if (ok && !problem && origin == NDX_FRAME_HOST && f.ip != 0) problem = "ip of a host frame";
  if (ok && !problem && origin == NDX_FRAME_NATIVE && f.ip == 0) problem = "ip of a native frame";
  return ndx_test_check_(problem == NULL, file, src_line, what,
                         "frame %zu of %zu (%s): got %s:%u in %s (origin %d), expected "
                         "*%s:%d in %s (origin %d) [op %s #%llu: %s]",
                         index, ndx_error_frame_count(e), problem ? problem : "ok",
                         ndx_test_s(f.file), (unsigned)f.line, ndx_test_s(f.function),
                         (int)f.origin, ndx_test_s(file_suffix), line, ndx_test_s(function),
                         origin, ndx_test_s(ndx_error_op(e)),
                         (unsigned long long)ndx_error_sequence(e),
                         ndx_test_s(ndx_error_message(e)));
}

/* CHECK_FRAME(e, index, file_suffix, line, function, origin): frame `index` of e exists,
 * its file ends with file_suffix (NULL: any), its line is `line` (0: any), its function
 * is `function` (NULL: any) and its origin is `origin` (0: any; a host frame must have
 * ip 0, a native one a non-zero ip). Does not free e. */
#define CHECK_FRAME(e, index, file_suffix, line, function, origin)                          \
  ndx_test_frame_check_((e), (index), (file_suffix), (line), (function), (origin), __FILE__, \
                        __LINE__, "frame " #index " of " #e)

static inline int ndx_test_link_check_(const ndx_error_t* e, int kind, const char* fragment,
                                       const char* op, uint64_t seq, const char* file,
                                       int line, const char* what) {
  const char* problem = NULL;
  if (e == NULL) problem = "no error";
  else if (ndx_error_kind(e) != kind) problem = "kind";
  else if (fragment && !ndx_test_contains(ndx_error_message(e), fragment)) problem = "message";
  else if (op ? !ndx_test_str_eq(ndx_error_op(e), op) : ndx_error_op(e) != NULL) problem = "op";
  else if (ndx_error_sequence(e) != seq) problem = "sequence";
  return ndx_test_check_(problem == NULL, file, line, what,
                         "%s: got %s \"%s\" op %s #%llu, expected %s containing \"%s\" op %s #%llu",
                         problem ? problem : "ok",
                         ndx_test_s(ndx_error_kind_name(ndx_error_kind(e))),
                         ndx_test_s(ndx_error_message(e)), ndx_test_s(ndx_error_op(e)),
                         (unsigned long long)ndx_error_sequence(e),
                         ndx_test_s(ndx_error_kind_name(kind)), ndx_test_s(fragment),
                         ndx_test_s(op), (unsigned long long)seq);
}

/* CHECK_LINK(e, kind, fragment, op, seq): e (not freed) is an error of `kind` whose
 * message contains `fragment` (NULL: any), whose ndx_error_op is `op` (NULL: must be
 * NULL) and whose ndx_error_sequence is `seq`. */
#define CHECK_LINK(e, kind, fragment, op, seq) \
  ndx_test_link_check_((e), (kind), (fragment), (op), (seq), __FILE__, __LINE__, #e)

/* ---- contexts ---------------------------------------------------------------------- */

/* A new context with options `o` (aborts on failure: tests cannot go on). */
static inline ndx_context_t* ndx_test_new_context(const ndx_context_options_t* o) {
  ndx_context_t* ctx = NULL;
  ndx_error_t* e = ndx_context_new(o, &ctx);
  if (e != NULL || ctx == NULL) {
    fprintf(stderr, "ndx_context_new failed: %s\n", ndx_test_s(ndx_error_message(e)));
    abort();
  }
  return ctx;
}

/* ---- host tensors ------------------------------------------------------------------ */

/* A new compact host tensor copied from `data` (aborts on failure: tests cannot go on). */
static inline ndx_tensor_t* ndx_test_tensor(const void* data, int32_t dtype, int32_t ndim,
                                            const int64_t* shape) {
  ndx_tensor_t* t = NULL;
  ndx_error_t* e = ndx_tensor_from_host(data, dtype, ndim, shape, NULL, NULL, &t);
  if (e != NULL || t == NULL) {
    fprintf(stderr, "ndx_test: ndx_tensor_from_host failed: %s\n",
            ndx_test_s(ndx_error_message(e)));
    abort();
  }
  return t;
}

/* An input entry for a tensor. */
static inline ndx_input_t ndx_test_in(const ndx_tensor_t* t) {
  ndx_input_t in;
  in.tensor = t;
  in.batch = NULL;
  return in;
}

/* A host operator schema of `n_inputs` and `n_outputs`, every other field zero. */
static inline ndx_op_schema_t ndx_test_schema(size_t n_inputs, size_t n_outputs) {
  ndx_op_schema_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.n_inputs = n_inputs;
  s.n_outputs = n_outputs;
  return s;
}

/* Output `index` of a future as a new tensor reference, or NULL (reported). */
static inline ndx_tensor_t* ndx_test_output(const ndx_future_t* f, size_t index) {
  ndx_tensor_t* t = NULL;
  ndx_error_t* e = ndx_future_tensor(f, index, &t);
  if (e) {
    ndx_test_check_ok_(e, __FILE__, __LINE__, "ndx_future_tensor");
    return NULL;
  }
  return t;
}

/* ---- watchdog (POSIX tests only) -------------------------------------------------------
 *
 * ndx_test_watchdog_start(seconds, name): if one phase of the test lasts more than
 * `seconds` (the time from the start or the latest ndx_test_watchdog_phase call to the next
 * such call or ndx_test_watchdog_stop()), a thread prints "name: watchdog: ... hang in
 * PHASE", the summary line with one more failure, and ends the process with status 1 - a
 * hang becomes a failure instead of stalling the test run. Timing phases, not the whole
 * run, keeps a slow run (under valgrind, on a loaded machine) from reading as a hang.
 * ndx_test_watchdog_phase(text) names what the test is doing (a string literal or other
 * static string). Available when the test defines _POSIX_C_SOURCE >= 200809L before
 * including this header (link Threads::Threads). */
#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t ndx_test_wd_mu_ = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ndx_test_wd_cv_ = PTHREAD_COND_INITIALIZER;
static int ndx_test_wd_stop_ = 0;
static int ndx_test_wd_seconds_ = 0;
static unsigned long ndx_test_wd_phases_ = 0; /* phases begun, under the mutex */
static struct timespec ndx_test_wd_since_;      /* when the current one began, likewise */
static const char* ndx_test_wd_name_ = "test";
static const char* volatile ndx_test_wd_phase_ = "start";
static pthread_t ndx_test_wd_thread_;
static int ndx_test_wd_started_ = 0;

static inline void ndx_test_watchdog_phase(const char* phase) {
  pthread_mutex_lock(&ndx_test_wd_mu_);
  ndx_test_wd_phase_ = phase;
  ndx_test_wd_phases_++;
  clock_gettime(CLOCK_REALTIME, &ndx_test_wd_since_);
  pthread_mutex_unlock(&ndx_test_wd_mu_);
}

static inline void* ndx_test_watchdog_main_(void* arg) {
  (void)arg;
  pthread_mutex_lock(&ndx_test_wd_mu_);
  int timed_out = 0;
  while (!ndx_test_wd_stop_ && !timed_out) {
    /* The deadline of the current phase; a new phase since moves it. */
    unsigned long phases = ndx_test_wd_phases_;
    struct timespec deadline = ndx_test_wd_since_;
    deadline.tv_sec += ndx_test_wd_seconds_;
    while (!ndx_test_wd_stop_ && !timed_out && phases == ndx_test_wd_phases_) {
      int rc = pthread_cond_timedwait(&ndx_test_wd_cv_, &ndx_test_wd_mu_, &deadline);
      timed_out = rc != 0 && !ndx_test_wd_stop_ && phases == ndx_test_wd_phases_;
    }
  }
  pthread_mutex_unlock(&ndx_test_wd_mu_);
  if (timed_out) {
    fprintf(stderr, "%s: watchdog: a phase not finished after %d s: a hang in %s\n",
            ndx_test_wd_name_, ndx_test_wd_seconds_, ndx_test_wd_phase_);
    printf("%s: %d passed, %d failed\n", ndx_test_wd_name_, ndx_test_passed_,
           ndx_test_failed_ + 1);
    fflush(stdout);
    fflush(stderr);
    _exit(1);
  }
  return NULL;
}

static inline void ndx_test_watchdog_start(int seconds, const char* name) {
  ndx_test_wd_seconds_ = seconds;
  clock_gettime(CLOCK_REALTIME, &ndx_test_wd_since_);
  ndx_test_wd_name_ = name;
  ndx_test_wd_started_ =
      pthread_create(&ndx_test_wd_thread_, NULL, ndx_test_watchdog_main_, NULL) == 0;
  if (!ndx_test_wd_started_) fprintf(stderr, "%s: could not start the watchdog thread\n", name);
}

static inline void ndx_test_watchdog_stop(void) {
  pthread_mutex_lock(&ndx_test_wd_mu_);
  ndx_test_wd_stop_ = 1;
  pthread_cond_broadcast(&ndx_test_wd_cv_);
  pthread_mutex_unlock(&ndx_test_wd_mu_);
  if (ndx_test_wd_started_) pthread_join(ndx_test_wd_thread_, NULL);
  ndx_test_wd_started_ = 0;
}

/* Runs fn(arg) on a new thread with a `stack_bytes` stack and joins it: a recursion
 * one frame per element overflows there with few elements. 1 when it ran (a failed
 * pthread_create is reported as a failure). */
static inline int ndx_test_run_on_small_stack(void* (*fn)(void*), void* arg,
                                              size_t stack_bytes) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  pthread_t t;
  int rc = pthread_create(&t, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  if (!CHECK(rc == 0, "pthread_create: %d", rc)) return 0;
  pthread_join(t, NULL);
  return 1;
}
#endif

/* A sentinel for out-params that must be reset on error. */
#define NDX_TEST_BOGUS_PTR ((void*)(uintptr_t)0x5a5a5a5a)

#endif /* NDX_TEST_H */
