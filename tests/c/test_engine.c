/* Tests of the execution engine through the C API: contexts, eval modes, ndx_invoke,
 * futures (poll, wait, error, outputs, on_ready, cancel), host operators, backends and
 * capture sites.
 *
 * The heart is a matrix: every eval mode (SYNC_CPU, SYNC_FULL, DEFERRED, EAGER) x every
 * way an invocation can fail (a kernel error, an injected runtime error, an injected
 * compile error, a dependency failure two levels deep, a host operator's error with its
 * own cause, a timeout) x four ways of recording the site (capture policy OFF or NATIVE,
 * each without options - the native caller frame - and with NDX_HERE). Each run checks
 * the error's kind, message, operator, sequence number, cause chain and frame 0: the file
 * and line of the ndx_invoke call (recorded with __LINE__ on that very line by INVOKE).
 *
 * Then: success values, metadata of pending outputs, the first poll submitting DEFERRED
 * work, ndx_context_evaluate reporting unobserved failures once, cancellation, releasing
 * a context with pending or running work (callbacks exactly once, finished before the
 * release returns), host operators chained on pending host-operator outputs (nothing
 * forced at invoke; an upstream failure travels in the future), the host operator's
 * user_free, on_ready exactly once, the noexcept and inject_accuracy_error backends, and
 * EAGER work never running on the caller's thread.
 *
 * CMake compiles this at -O0 and -O2 (both -g) and runs the -O0 build under valgrind.
 * Case functions are NDX_TEST_NOINLINE so that their frames and names survive -O2. A
 * watchdog (120 s a test) turns a hang into a failure naming the test that hung. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>

#include "ndx_test.h"

#define THIS_FILE "test_engine.c"
#define MS 1000000LL /* nanoseconds */

static pthread_t main_thread;

/* ---- small utilities ------------------------------------------------------------------ */

static void sleep_ms(int ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int load_int(const int* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void inc_int(int* p) { __atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST); }

/* Waits (up to `limit_ms`) until *p >= value; returns whether it got there. */
static int spin_until(const int* p, int value, int limit_ms) {
  double end = now_ms() + limit_ms;
  while (load_int(p) < value) {
    if (now_ms() > end) return 0;
    sleep_ms(1);
  }
  return 1;
}

static const int32_t kModes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                  NDX_EVAL_EAGER};

static const char* mode_name(int32_t mode) {
  switch (mode) {
    case NDX_EVAL_SYNC_CPU: return "SYNC_CPU";
    case NDX_EVAL_SYNC_FULL: return "SYNC_FULL";
    case NDX_EVAL_DEFERRED: return "DEFERRED";
    case NDX_EVAL_EAGER: return "EAGER";
    default: return "?";
  }
}

static int is_sync(int32_t mode) {
  return mode == NDX_EVAL_SYNC_CPU || mode == NDX_EVAL_SYNC_FULL;
}

/* A context with the given mode, capture policy and backend (NULL: default). The first
 * context of the process sizes the shared pool: 4 workers. */
static ndx_context_t* make_ctx(int32_t mode, int32_t policy, const char* backend) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = mode;
  o.capture_policy = policy;
  o.num_threads = 4;
  o.backend = backend;
  return ndx_test_new_context(&o);
}

/* Invokes `op` on one source line: stores that line in `line` and passes
 * `{.struct_size = sizeof o, .location = NDX_HERE}` as options when `here`, NULL
 * otherwise. Use it on ONE line. */
#define INVOKE(line, here, ctx, op, inputs, n, args, out)                                   \
  ((line) = __LINE__,                                                                        \
   ndx_invoke((ctx), (op), (inputs), (n), (args),                                            \
              (here) ? &(ndx_invoke_options_t){.struct_size = sizeof(ndx_invoke_options_t),     \
                                             .location = NDX_HERE}                         \
                     : NULL,                                                                 \
              (out)))

/* Options overriding the mode only. */
static ndx_invoke_options_t mode_opts(int32_t mode) {
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = mode;
  return o;
}

/* ---- data -------------------------------------------------------------------------------- */

static const int64_t kShape23[2] = {2, 3};
static const int32_t kA[6] = {6, 7, -7, 8, 9, 10};
static const int32_t kBZero[6] = {2, 0, 2, 4, 3, 5};   /* element 1 divides by zero */
static const int32_t kBOk[6] = {2, 3, 2, 4, 3, 5};
static const int32_t kAdivBOk[6] = {3, 2, -4, 2, 3, 2}; /* floor division */

static ndx_tensor_t* t_i32(const int32_t* v) { return ndx_test_tensor(v, NDX_DTYPE_INT32, 2, kShape23); }

/* Copies t's data into `out` (n elements of `elem` bytes) and checks the byte size. */
static int read_data(const ndx_tensor_t* t, void* out, size_t n, size_t elem) {
  size_t nbytes = 0;
  if (!CHECK_OK(ndx_tensor_nbytes(t, &nbytes))) return 0;
  if (!CHECK(nbytes == n * elem, "nbytes %zu, expected %zu", nbytes, n * elem)) return 0;
  return CHECK_OK(ndx_tensor_copy_to(t, out, n * elem));
}

static void check_i32(const ndx_tensor_t* t, const int32_t* expected, int n) {
  int32_t got[16];
  int64_t g[16], x[16];
  if (!read_data(t, got, (size_t)n, sizeof(int32_t))) return;
  for (int i = 0; i < n; i++) {
    g[i] = got[i];
    x[i] = expected[i];
  }
  CHECK_I64_ARRAY(g, x, n);
}

static void check_i64(const ndx_tensor_t* t, const int64_t* expected, int n) {
  int64_t got[16];
  if (!read_data(t, got, (size_t)n, sizeof(int64_t))) return;
  CHECK_I64_ARRAY(got, expected, n);
}

static void check_f32(const ndx_tensor_t* t, const float* expected, int n) {
  float got[16];
  if (!read_data(t, got, (size_t)n, sizeof(float))) return;
  int ok = 1;
  for (int i = 0; i < n; i++) ok &= got[i] == expected[i];
  CHECK(ok, "float values differ (first: %g vs %g)", (double)got[0], (double)expected[0]);
}

static void check_meta(const ndx_tensor_t* t, int32_t dtype, int32_t ndim, const int64_t* shape) {
  int32_t d = 0, nd = -1;
  const int64_t* s = NULL;
  CHECK_OK(ndx_tensor_dtype(t, &d));
  CHECK(d == dtype, "dtype %d (%s), expected %d (%s)", (int)d, NDX_TEST_S(ndx_dtype_name(d)),
        (int)dtype, NDX_TEST_S(ndx_dtype_name(dtype)));
  CHECK_OK(ndx_tensor_ndim(t, &nd));
  if (!CHECK(nd == ndim, "ndim %d, expected %d", (int)nd, (int)ndim)) return;
  CHECK_OK(ndx_tensor_shape(t, &s));
  if (ndim > 0) CHECK_I64_ARRAY(s, shape, ndim);
}

/* ---- host operators ---------------------------------------------------------------------- */

typedef struct {
  int started;     /* kernel entered (atomic) */
  int calls;       /* kernel finished (atomic) */
  int sleep_ms;    /* sleeps this long first */
  pthread_t thread; /* the thread of the last call (written before `calls`) */
} host_state;

static ndx_error_t* copy_tensor(const ndx_tensor_t* in, ndx_tensor_t** out) {
  int32_t dtype = 0, ndim = 0;
  const int64_t* shape = NULL;
  size_t nbytes = 0;
  ndx_error_t* e;
  if ((e = ndx_tensor_dtype(in, &dtype)) != NULL) return e;
  if ((e = ndx_tensor_ndim(in, &ndim)) != NULL) return e;
  if ((e = ndx_tensor_shape(in, &shape)) != NULL) return e;
  if ((e = ndx_tensor_nbytes(in, &nbytes)) != NULL) return e;
  void* buf = malloc(nbytes ? nbytes : 1);
  if (!buf) return ndx_error_new(NDX_ERROR_MEMORY, "test: out of memory", NULL);
  if ((e = ndx_tensor_copy_to(in, buf, nbytes)) == NULL) {
    e = ndx_tensor_from_host(buf, dtype, ndim, shape, NULL, NULL, out);
  }
  free(buf);
  return e;
}

/* "identity"-like host operator: copies its input, after sleeping s->sleep_ms. */
static ndx_error_t* k_copy(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                           const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  host_state* s = (host_state*)user;
  (void)args;
  (void)n_inputs;
  (void)n_outputs;
  inc_int(&s->started);
  if (s->sleep_ms > 0) sleep_ms(s->sleep_ms);
  s->thread = pthread_self();
  ndx_error_t* e = copy_tensor(inputs[0], &outputs[0]);
  inc_int(&s->calls);
  return e;
}

static int host_fail_line; /* the line of the ndx_error_new calls in host_fail_kernel */

/* A host operator that fails with its own cause. */
static NDX_TEST_NOINLINE ndx_error_t* host_fail_kernel(void* user, const ndx_tensor_t* const* inputs,
                                                       size_t n_inputs, const ndx_args_t* args,
                                                       ndx_tensor_t** outputs, size_t n_outputs) {
  host_state* s = (host_state*)user;
  (void)inputs; (void)n_inputs; (void)args; (void)outputs; (void)n_outputs;
  s->thread = pthread_self();
  inc_int(&s->calls);
  host_fail_line = __LINE__; ndx_error_t* volatile e = ndx_error_new(NDX_ERROR_RUNTIME, "host failed", ndx_error_new(NDX_ERROR_INDEX, "root cause", NULL));
  return e; /* not a tail call */
}

/* A gate: the kernel blocks until the test opens it (or 5 s pass: then timed_out). */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
  int timed_out;
  int entered; /* atomic */
  int calls;   /* atomic */
  pthread_t thread;
} gate_t;

static void gate_init(gate_t* g) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
}

static void gate_open(gate_t* g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(gate_t* g) {
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
}

static ndx_error_t* k_gate(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                           const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  gate_t* g = (gate_t*)user;
  (void)args; (void)n_inputs; (void)n_outputs;
  inc_int(&g->entered);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 5;
  pthread_mutex_lock(&g->mu);
  while (!g->open) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT) {
      g->timed_out = 1;
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
  g->thread = pthread_self();
  ndx_error_t* e = copy_tensor(inputs[0], &outputs[0]);
  inc_int(&g->calls);
  return e;
}

static void register_op(ndx_context_t* ctx, const char* name, ndx_kernel_fn_t kernel, void* user) {
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  CHECK_OK(ndx_register_op(ctx, name, &s, kernel, user, NULL));
}

/* ---- on_ready callbacks -------------------------------------------------------------------- */

typedef struct {
  int fired; /* atomic */
  int freed; /* atomic */
  int status;
  int on_main;
} cb_state;

static void cb_record(void* user, const ndx_future_t* f) {
  cb_state* s = (cb_state*)user;
  s->status = ndx_future_poll(f);
  s->on_main = pthread_equal(pthread_self(), main_thread) ? 1 : 0;
  inc_int(&s->fired);
}

static void cb_free(void* user) { inc_int(&((cb_state*)user)->freed); }

/* Counts without asking anything of the future (a poll would observe a failure). */
static void cb_count_only(void* user, const ndx_future_t* f) {
  (void)f;
  inc_int(&((cb_state*)user)->fired);
}

/* ---- the error matrix ---------------------------------------------------------------------- */

typedef struct {
  int32_t mode;
  int32_t policy; /* NDX_CAPTURE_OFF or NDX_CAPTURE_NATIVE */
  int here;       /* NDX_HERE options */
  char label[96];
} run_t;

/* Checks the frames of an invocation's error: frame 0 is the ndx_invoke call at `line` in
 * `function` (native, or the NDX_HERE location: a host frame); with NATIVE capture of a
 * DEFERRED or EAGER invocation the frames go on outwards (frame 1: run_case); otherwise
 * the caller frame is the only one. */
static void check_site(const ndx_error_t* e, const run_t* r, int line, const char* function) {
  int deep = r->policy == NDX_CAPTURE_NATIVE && !is_sync(r->mode);
  size_t n = ndx_error_frame_count(e);
  if (deep) {
    CHECK(n >= 3, "deep capture: %zu frames (expected the caller, run_case, main, ...)", n);
  } else {
    CHECK(n == 1, "caller frame only: %zu frames", n);
  }
  CHECK_FRAME(e, 0, THIS_FILE, line, function, r->here ? NDX_FRAME_HOST : NDX_FRAME_NATIVE);
  if (deep && n >= 2) CHECK_FRAME(e, 1, THIS_FILE, 0, "run_case", NDX_FRAME_NATIVE);
}

/* Right after ndx_invoke of work that will end `expected` (READY/FAILED): SYNC modes are
 * complete already; DEFERRED has not run (ndx_future_error neither submits nor blocks). */
static void check_after_invoke(const run_t* r, const ndx_future_t* f, int expected) {
  if (is_sync(r->mode)) {
    int st = ndx_future_poll(f);
    CHECK(st == expected, "%s: status %d right after ndx_invoke, expected %d", r->label, st,
          expected);
  } else if (r->mode == NDX_EVAL_DEFERRED) {
    ndx_error_t* e = ndx_future_error(f);
    CHECK(e == NULL, "DEFERRED work ran at invoke: %s", NDX_TEST_S(ndx_error_message(e)));
    ndx_error_free(e);
  }
}

/* After `w` came from ndx_future_wait(f): the future stays FAILED, ndx_future_error gives
 * an equal copy, and reading its output's data fails with the same error. */
static void check_failed_future(const ndx_future_t* f, const ndx_error_t* w) {
  CHECK(ndx_future_poll(f) == NDX_FUTURE_FAILED, "poll after a failed wait");
  ndx_error_t* c = ndx_future_error(f);
  if (CHECK(c != NULL, "ndx_future_error of a failed future")) {
    CHECK(ndx_error_kind(c) == ndx_error_kind(w), "same kind");
    CHECK_STR_EQ(ndx_error_message(c), ndx_error_message(w));
    CHECK(ndx_test_str_eq(ndx_error_op(c), ndx_error_op(w)) || (!ndx_error_op(c) && !ndx_error_op(w)),
          "same op");
    CHECK(ndx_error_sequence(c) == ndx_error_sequence(w), "same sequence");
    CHECK(ndx_test_chain_length(c) == ndx_test_chain_length(w), "same chain");
    CHECK(ndx_error_frame_count(c) == ndx_error_frame_count(w), "same frames");
  }
  ndx_error_free(c);
  ndx_tensor_t* t = ndx_test_output(f, 0);
  if (t) {
    int64_t buf[16];
    ndx_error_t* e = ndx_tensor_copy_to(t, buf, sizeof buf);
    if (CHECK(e != NULL, "reading a failed output's data fails")) {
      CHECK(ndx_error_kind(e) == ndx_error_kind(w), "with the same kind");
      CHECK_STR_EQ(ndx_error_message(e), ndx_error_message(w));
    }
    ndx_error_free(e);
  }
  ndx_tensor_release(t);
}

/* Every failure was observed: ndx_context_evaluate has nothing to report. */
static void check_evaluate_clean(const ndx_context_t* ctx) {
  ndx_error_t* e = ndx_context_evaluate(ctx);
  if (!CHECK(e == NULL, "ndx_context_evaluate reports %zu failures already observed: %s",
             ndx_error_related_count(e), NDX_TEST_S(ndx_error_message(e)))) {
    ndx_test_print_error(e);
  }
  ndx_error_free(e);
}

static NDX_TEST_NOINLINE void case_kernel_error(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBZero);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t* f = NULL;
  int line = 0;
  ndx_error_t* e = INVOKE(line, r->here, ctx, "div", in, 2, NULL, &f);
  if (CHECK_OK(e) && CHECK(f != NULL, "a future")) {
    check_after_invoke(r, f, NDX_FUTURE_FAILED);
    ndx_error_t* w = ndx_future_wait(f, -1);
    CHECK_LINK(w, NDX_ERROR_VALUE, "integer division by zero (output element 1)", "div", 1);
    CHECK_STR_EQ(ndx_error_message(w), "integer division by zero (output element 1)");
    CHECK(ndx_test_chain_length(w) == 1, "one link: %zu", ndx_test_chain_length(w));
    check_site(w, r, line, "case_kernel_error");
    check_failed_future(f, w);
    ndx_error_free(w);
  }
  check_evaluate_clean(ctx);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

static NDX_TEST_NOINLINE void case_injected_runtime(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, "inject_runtime_error:div");
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBOk);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t* f = NULL;
  int line = 0;
  ndx_error_t* e = INVOKE(line, r->here, ctx, "div", in, 2, NULL, &f);
  if (CHECK_OK(e) && CHECK(f != NULL, "a future")) {
    check_after_invoke(r, f, NDX_FUTURE_FAILED);
    ndx_error_t* w = ndx_future_wait(f, -1);
    CHECK_LINK(w, NDX_ERROR_RUNTIME, "injected runtime error in operator 'div'", "div", 1);
    CHECK(ndx_test_chain_length(w) == 1, "one link: %zu", ndx_test_chain_length(w));
    check_site(w, r, line, "case_injected_runtime");
    check_failed_future(f, w);
    ndx_error_free(w);
  }
  /* Only 'div' is targeted. */
  ndx_future_t* g = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "mul", in, 2, NULL, NULL, &g))) {
    CHECK_OK(ndx_future_wait(g, -1));
  }
  check_evaluate_clean(ctx);
  ndx_future_release(f);
  ndx_future_release(g);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

static NDX_TEST_NOINLINE void case_injected_compile(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, "inject_compile_error:div");
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBOk);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  int line = 0;
  ndx_error_t* e = INVOKE(line, r->here, ctx, "div", in, 2, NULL, &f);
  if (CHECK(e != NULL, "%s: an injected compile error fails ndx_invoke", r->label)) {
    /* The invocation of 'div' failed (op); it never got a sequence number. */
    CHECK_LINK(e, NDX_ERROR_BACKEND, "injected compile error in operator 'div'", "div", 0);
    CHECK(ndx_test_chain_length(e) == 1, "one link: %zu", ndx_test_chain_length(e));
    check_site(e, r, line, "case_injected_compile");
  }
  CHECK(f == NULL, "the out-param is NULL on error");
  ndx_error_free(e);
  /* Only 'div' is targeted. */
  ndx_future_t* g = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &g))) {
    CHECK_OK(ndx_future_wait(g, -1));
  }
  check_evaluate_clean(ctx);
  ndx_future_release(g);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

static NDX_TEST_NOINLINE void case_dependency(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBZero);
  ndx_tensor_t* c = t_i32(kBOk);
  ndx_args_t* args = NULL;
  const int64_t axes[1] = {1};
  CHECK_OK(ndx_args_new(&args));
  CHECK_OK(ndx_args_set_int_array(args, "axes", axes, 1));
  ndx_future_t *f1 = NULL, *f2 = NULL, *f3 = NULL;
  ndx_tensor_t *t1 = NULL, *t2 = NULL, *t3 = NULL;
  int l1 = 0, l2 = 0, l3 = 0;

  ndx_input_t in1[2] = {ndx_test_in(a), ndx_test_in(b)};
  if (!CHECK_OK(INVOKE(l1, r->here, ctx, "div", in1, 2, NULL, &f1))) goto done;
  check_after_invoke(r, f1, NDX_FUTURE_FAILED);
  t1 = ndx_test_output(f1, 0);
  ndx_input_t in2[2] = {ndx_test_in(t1), ndx_test_in(c)};
  if (!CHECK_OK(INVOKE(l2, r->here, ctx, "add", in2, 2, NULL, &f2))) goto done;
  check_after_invoke(r, f2, NDX_FUTURE_FAILED);
  t2 = ndx_test_output(f2, 0);
  ndx_input_t in3[1] = {ndx_test_in(t2)};
  if (!CHECK_OK(INVOKE(l3, r->here, ctx, "sum", in3, 1, args, &f3))) goto done;
  check_after_invoke(r, f3, NDX_FUTURE_FAILED);
  t3 = ndx_test_output(f3, 0);
  {
    const int64_t s2[1] = {2};
    check_meta(t3, NDX_DTYPE_INT64, 1, s2); /* inferred at enqueue, failure or not */
  }
  if (r->mode == NDX_EVAL_DEFERRED) {
    /* Nothing ran: none of the three has an error yet. */
    ndx_error_t* e1 = ndx_future_error(f1);
    CHECK(e1 == NULL, "DEFERRED div ran before anything needed it");
    ndx_error_free(e1);
  }

  ndx_error_t* w = ndx_future_wait(f3, -1);
  if (CHECK(ndx_test_chain_length(w) == 3, "%s: sum -> add -> div: %zu links", r->label,
            ndx_test_chain_length(w))) {
    const ndx_error_t* add_link = ndx_test_chain_link(w, 1);
    const ndx_error_t* div_link = ndx_test_chain_link(w, 2);
    CHECK_LINK(w, NDX_ERROR_VALUE,
               "input 0 of 'sum' (#3) failed: it is the output of 'add' (#2), which failed",
               "sum", 3);
    check_site(w, r, l3, "case_dependency");
    CHECK_LINK(add_link, NDX_ERROR_VALUE,
               "input 0 of 'add' (#2) failed: it is the output of 'div' (#1), which failed",
               "add", 2);
    check_site(add_link, r, l2, "case_dependency");
    CHECK_LINK(div_link, NDX_ERROR_VALUE, "integer division by zero (output element 1)", "div", 1);
    CHECK_STR_EQ(ndx_error_message(div_link), "integer division by zero (output element 1)");
    check_site(div_link, r, l1, "case_dependency");
    CHECK(l1 != l2 && l2 != l3, "three distinct lines");
  }
  check_failed_future(f3, w);
  ndx_error_free(w);
  /* The upstream futures failed with their own errors. */
  ndx_error_t* w2 = ndx_future_wait(f2, -1);
  CHECK_LINK(w2, NDX_ERROR_VALUE, "input 0 of 'add' (#2) failed", "add", 2);
  CHECK(ndx_test_chain_length(w2) == 2, "add -> div");
  ndx_error_free(w2);
  ndx_error_t* w1 = ndx_future_wait(f1, -1);
  CHECK_LINK(w1, NDX_ERROR_VALUE, "integer division by zero", "div", 1);
  CHECK(ndx_test_chain_length(w1) == 1, "div alone");
  ndx_error_free(w1);
done:
  check_evaluate_clean(ctx);
  ndx_tensor_release(t1);
  ndx_tensor_release(t2);
  ndx_tensor_release(t3);
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_future_release(f3);
  ndx_args_free(args);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_tensor_release(c);
  ndx_context_release(ctx);
}

static NDX_TEST_NOINLINE void case_host_error(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "host_fail", host_fail_kernel, &s);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  int line = 0;
  ndx_error_t* e = INVOKE(line, r->here, ctx, "host_fail", in, 1, NULL, &f);
  if (CHECK_OK(e) && CHECK(f != NULL, "a future")) {
    check_after_invoke(r, f, NDX_FUTURE_FAILED);
    if (r->mode == NDX_EVAL_DEFERRED) CHECK(load_int(&s.calls) == 0, "DEFERRED: not run yet");
    ndx_error_t* w = ndx_future_wait(f, -1);
    /* The host's error itself, enriched; its own cause follows with its own site. */
    CHECK_LINK(w, NDX_ERROR_RUNTIME, "host failed", "host_fail", 1);
    CHECK_STR_EQ(ndx_error_message(w), "host failed");
    check_site(w, r, line, "case_host_error");
    if (CHECK(ndx_test_chain_length(w) == 2, "host error -> its cause: %zu",
              ndx_test_chain_length(w))) {
      const ndx_error_t* cause = ndx_error_cause(w);
      CHECK_LINK(cause, NDX_ERROR_INDEX, "root cause", NULL, 0);
      CHECK_STR_EQ(ndx_error_message(cause), "root cause");
      CHECK_FRAME(cause, 0, THIS_FILE, host_fail_line, "host_fail_kernel", NDX_FRAME_NATIVE);
    }
    check_failed_future(f, w);
    ndx_error_free(w);
    CHECK(load_int(&s.calls) == 1, "the kernel ran once: %d", load_int(&s.calls));
    if (is_sync(r->mode)) {
      CHECK(pthread_equal(s.thread, main_thread), "SYNC: ran on the calling thread");
    } else if (r->mode == NDX_EVAL_EAGER) {
      CHECK(!pthread_equal(s.thread, main_thread), "EAGER: ran on a worker");
    }
  }
  check_evaluate_clean(ctx);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

static NDX_TEST_NOINLINE void case_timeout(const run_t* r) {
  ndx_context_t* ctx = make_ctx(r->mode, r->policy, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  s.sleep_ms = 200;
  register_op(ctx, "sleepy", k_copy, &s);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  int line = 0;
  double t0 = now_ms();
  ndx_error_t* e = INVOKE(line, r->here, ctx, "sleepy", in, 1, NULL, &f);
  double invoke_ms = now_ms() - t0;
  (void)line;
  if (!CHECK_OK(e) || !CHECK(f != NULL, "a future")) goto done;
  if (is_sync(r->mode)) {
    /* The work ran inside ndx_invoke: nothing is left to time out. */
    CHECK(invoke_ms >= 150.0, "SYNC invoke took %.1f ms, the kernel sleeps 200", invoke_ms);
    CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "READY on return");
    CHECK_OK(ndx_future_wait(f, 1 * MS));
  } else {
    int wline = __LINE__; ndx_error_t* w = ndx_future_wait(f, 1 * MS);
    CHECK_LINK(w, NDX_ERROR_TIMEOUT, "did not complete within", NULL, 0);
    CHECK_CONTAINS(ndx_error_message(w), "'sleepy'");
    CHECK_CONTAINS(ndx_error_message(w), "#1");
    CHECK(ndx_test_chain_length(w) == 1, "one link");
    /* A failed call of ndx_future_wait: its site is the line that waited. */
    CHECK_FRAME(w, 0, THIS_FILE, wline, "case_timeout", NDX_FRAME_NATIVE);
    ndx_error_free(w);
    CHECK(ndx_future_poll(f) == NDX_FUTURE_PENDING, "the future stays valid and pending");
    ndx_error_t* fe = ndx_future_error(f);
    CHECK(fe == NULL, "a timeout is not the future's error");
    ndx_error_free(fe);
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "READY after waiting");
  }
  CHECK(load_int(&s.calls) == 1, "ran once");
  ndx_tensor_t* t = ndx_test_output(f, 0);
  if (t) check_i32(t, kA, 6);
  ndx_tensor_release(t);
done:
  check_evaluate_clean(ctx);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

typedef void (*case_fn)(const run_t*);
static int cases_run;

/* Calls one case; not inlined and not a tail call, so it is frame 1 of deep captures. */
static NDX_TEST_NOINLINE void run_case(case_fn fn, const run_t* r) {
  fn(r);
  cases_run++;
}

static NDX_TEST_NOINLINE void test_error_matrix(void) {
  static const struct {
    case_fn fn;
    const char* name;
  } cases[6] = {
      {case_kernel_error, "kernel error"},       {case_injected_runtime, "injected runtime error"},
      {case_injected_compile, "injected compile error"}, {case_dependency, "dependency failure"},
      {case_host_error, "host operator error"},  {case_timeout, "timeout"},
  };
  static const struct {
    int32_t policy;
    int here;
    const char* name;
  } sites[4] = {
      {NDX_CAPTURE_OFF, 0, "capture OFF"},
      {NDX_CAPTURE_NATIVE, 0, "capture NATIVE"},
      {NDX_CAPTURE_OFF, 1, "capture OFF + NDX_HERE"},
      {NDX_CAPTURE_NATIVE, 1, "capture NATIVE + NDX_HERE"},
  };
  for (int m = 0; m < 4; m++) {
    for (int c = 0; c < 6; c++) {
      for (int s = 0; s < 4; s++) {
        run_t r;
        r.mode = kModes[m];
        r.policy = sites[s].policy;
        r.here = sites[s].here;
        snprintf(r.label, sizeof r.label, "%s, %s, %s", mode_name(r.mode), cases[c].name,
                 sites[s].name);
        NDX_TEST_CONTEXT(r.label);
        ndx_test_watchdog_phase(r.label);
        run_case(cases[c].fn, &r);
      }
    }
  }
  NDX_TEST_CONTEXT(NULL);
  CHECK(cases_run == 96, "96 runs: %d", cases_run);
}

/* ---- success values ------------------------------------------------------------------------ */

static NDX_TEST_NOINLINE void test_success_values(int32_t mode) {
  ndx_context_t* ctx = make_ctx(mode, NDX_CAPTURE_NATIVE, NULL);
  const int32_t va[6] = {1, 2, 3, 4, 5, 6};
  const int32_t vb[6] = {10, 20, 30, 40, 50, 60};
  const int32_t vsum[6] = {11, 22, 33, 44, 55, 66};
  ndx_tensor_t* a = t_i32(va);
  ndx_tensor_t* b = t_i32(vb);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t *fadd = NULL, *fs1 = NULL, *fs2 = NULL, *fs3 = NULL, *fcast = NULL, *fdiv = NULL,
               *fmul = NULL;
  ndx_tensor_t *tadd = NULL, *ts1 = NULL, *ts2 = NULL, *ts3 = NULL, *tcast = NULL, *tdiv = NULL,
               *tmul = NULL;
  ndx_args_t *axes1 = NULL, *axes_keep = NULL, *to_f32 = NULL;
  CHECK_OK(ndx_args_new(&axes1));
  CHECK_OK(ndx_args_new(&axes_keep));
  CHECK_OK(ndx_args_new(&to_f32));
  const int64_t ax1[1] = {1}, axm1[1] = {-1};
  CHECK_OK(ndx_args_set_int_array(axes1, "axes", ax1, 1));
  CHECK_OK(ndx_args_set_int_array(axes_keep, "axes", axm1, 1));
  CHECK_OK(ndx_args_set_bool(axes_keep, "keepdims", true));
  CHECK_OK(ndx_args_set_dtype(to_f32, "dtype", NDX_DTYPE_FLOAT32));

  if (!CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &fadd))) goto done;
  if (is_sync(mode)) CHECK(ndx_future_poll(fadd) == NDX_FUTURE_READY, "READY on return");
  tadd = ndx_test_output(fadd, 0);
  check_meta(tadd, NDX_DTYPE_INT32, 2, kShape23);
  ndx_input_t ia[1] = {ndx_test_in(tadd)};
  CHECK_OK(ndx_invoke(ctx, "sum", ia, 1, axes1, NULL, &fs1));
  CHECK_OK(ndx_invoke(ctx, "sum", ia, 1, axes_keep, NULL, &fs2));
  CHECK_OK(ndx_invoke(ctx, "sum", ia, 1, NULL, NULL, &fs3));
  CHECK_OK(ndx_invoke(ctx, "cast", ia, 1, to_f32, NULL, &fcast));
  if (!fs1 || !fs2 || !fs3 || !fcast) goto done;
  ts1 = ndx_test_output(fs1, 0);
  ts2 = ndx_test_output(fs2, 0);
  ts3 = ndx_test_output(fs3, 0);
  tcast = ndx_test_output(fcast, 0);
  {
    const int64_t s2[1] = {2}, s21[2] = {2, 1};
    check_meta(ts1, NDX_DTYPE_INT64, 1, s2);
    check_meta(ts2, NDX_DTYPE_INT64, 2, s21);
    check_meta(ts3, NDX_DTYPE_INT64, 0, NULL);
    check_meta(tcast, NDX_DTYPE_FLOAT32, 2, kShape23);
    const int64_t e1[2] = {66, 165}, e3[1] = {231};
    check_i64(ts1, e1, 2);
    check_i64(ts2, e1, 2);
    check_i64(ts3, e3, 1);
    const float ef[6] = {11.f, 22.f, 33.f, 44.f, 55.f, 66.f};
    check_f32(tcast, ef, 6);
    check_i32(tadd, vsum, 6);
  }
  {
    /* Integer division floors; mul broadcasts. */
    const int64_t s4[1] = {4}, s3[1] = {3};
    const int32_t n[4] = {-7, 7, 7, -8}, d[4] = {2, 2, -2, 2}, q[4] = {-4, 3, -4, -4};
    const int32_t row[3] = {1, 0, -1}, prod[6] = {1, 0, -3, 4, 0, -6};
    ndx_tensor_t* tn = ndx_test_tensor(n, NDX_DTYPE_INT32, 1, s4);
    ndx_tensor_t* td = ndx_test_tensor(d, NDX_DTYPE_INT32, 1, s4);
    ndx_tensor_t* trow = ndx_test_tensor(row, NDX_DTYPE_INT32, 1, s3);
    ndx_input_t idv[2] = {ndx_test_in(tn), ndx_test_in(td)};
    ndx_input_t imul[2] = {ndx_test_in(a), ndx_test_in(trow)};
    if (CHECK_OK(ndx_invoke(ctx, "div", idv, 2, NULL, NULL, &fdiv))) {
      tdiv = ndx_test_output(fdiv, 0);
      check_i32(tdiv, q, 4);
    }
    if (CHECK_OK(ndx_invoke(ctx, "mul", imul, 2, NULL, NULL, &fmul))) {
      tmul = ndx_test_output(fmul, 0);
      check_meta(tmul, NDX_DTYPE_INT32, 2, kShape23);
      check_i32(tmul, prod, 6);
    }
    ndx_tensor_release(tn);
    ndx_tensor_release(td);
    ndx_tensor_release(trow);
  }
  {
    ndx_future_t* all[7] = {fadd, fs1, fs2, fs3, fcast, fdiv, fmul};
    for (int i = 0; i < 7; i++) {
      if (!all[i]) continue;
      CHECK_OK(ndx_future_wait(all[i], -1));
      CHECK(ndx_future_poll(all[i]) == NDX_FUTURE_READY, "future %d READY", i);
      ndx_error_t* fe = ndx_future_error(all[i]);
      CHECK(fe == NULL, "no error on a READY future");
      ndx_error_free(fe);
    }
  }
done:
  check_evaluate_clean(ctx);
  ndx_tensor_release(tadd);
  ndx_tensor_release(ts1);
  ndx_tensor_release(ts2);
  ndx_tensor_release(ts3);
  ndx_tensor_release(tcast);
  ndx_tensor_release(tdiv);
  ndx_tensor_release(tmul);
  ndx_future_release(fadd);
  ndx_future_release(fs1);
  ndx_future_release(fs2);
  ndx_future_release(fs3);
  ndx_future_release(fcast);
  ndx_future_release(fdiv);
  ndx_future_release(fmul);
  ndx_args_free(axes1);
  ndx_args_free(axes_keep);
  ndx_args_free(to_f32);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
}

/* ---- DEFERRED: metadata without running; the first poll submits ------------------------ */

static NDX_TEST_NOINLINE void test_deferred_metadata(void) {
  NDX_TEST_CONTEXT("deferred metadata");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "count_copy", k_copy, &s);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* bz = t_i32(kBZero);
  ndx_args_t* axes0 = NULL;
  const int64_t ax0[1] = {0};
  CHECK_OK(ndx_args_new(&axes0));
  CHECK_OK(ndx_args_set_int_array(axes0, "axes", ax0, 1));
  ndx_future_t *fh = NULL, *fd = NULL, *fs = NULL;
  ndx_tensor_t *th = NULL, *td = NULL, *ts = NULL;
  ndx_input_t ih[1] = {ndx_test_in(a)};
  ndx_input_t idv[2] = {ndx_test_in(a), ndx_test_in(bz)};
  if (!CHECK_OK(ndx_invoke(ctx, "count_copy", ih, 1, NULL, NULL, &fh))) goto done;
  if (!CHECK_OK(ndx_invoke(ctx, "div", idv, 2, NULL, NULL, &fd))) goto done;
  td = ndx_test_output(fd, 0);
  ndx_input_t is[1] = {ndx_test_in(td)};
  if (!CHECK_OK(ndx_invoke(ctx, "sum", is, 1, axes0, NULL, &fs))) goto done;
  th = ndx_test_output(fh, 0);
  ts = ndx_test_output(fs, 0);
  size_t count = 0;
  CHECK_OK(ndx_future_output_count(fh, &count));
  CHECK(count == 1, "one output");

  /* Built-in operators infer metadata at enqueue: answered without running. */
  const int64_t s3[1] = {3};
  check_meta(td, NDX_DTYPE_INT32, 2, kShape23);
  check_meta(ts, NDX_DTYPE_INT64, 1, s3);
  size_t numel = 0, nbytes = 0;
  const int64_t* strides = NULL;
  DLDevice dev;
  CHECK_OK(ndx_tensor_numel(ts, &numel));
  CHECK_OK(ndx_tensor_nbytes(ts, &nbytes));
  CHECK_OK(ndx_tensor_strides(td, &strides));
  CHECK_OK(ndx_tensor_device(ts, &dev));
  CHECK(numel == 3 && nbytes == 24, "numel %zu nbytes %zu", numel, nbytes);
  if (strides) {
    const int64_t st[2] = {3, 1};
    CHECK_I64_ARRAY(strides, st, 2);
  }
  CHECK(dev.device_type == kDLCPU, "host memory");
  sleep_ms(20);
  ndx_error_t* e1 = ndx_future_error(fd);
  ndx_error_t* e2 = ndx_future_error(fs);
  CHECK(e1 == NULL && e2 == NULL, "nothing ran: the div has not failed yet");
  ndx_error_free(e1);
  ndx_error_free(e2);
  CHECK(load_int(&s.started) == 0, "the host operator has not run");

  /* A host operator cannot infer: asking its output's shape forces it (and only it). */
  const int64_t* shape = NULL;
  CHECK_OK(ndx_tensor_shape(th, &shape));
  if (shape) CHECK_I64_ARRAY(shape, kShape23, 2);
  CHECK(load_int(&s.calls) == 1, "forced once: %d", load_int(&s.calls));
  CHECK(ndx_future_poll(fh) == NDX_FUTURE_READY, "the host operator is READY");
  e1 = ndx_future_error(fd);
  CHECK(e1 == NULL, "forcing the host operator did not run the unrelated div");
  ndx_error_free(e1);
  ndx_error_t* w = ndx_future_wait(fs, -1);
  CHECK_LINK(w, NDX_ERROR_VALUE, "input 0 of 'sum' (#3) failed: it is the output of 'div' (#2)",
             "sum", 3);
  ndx_error_free(w);
done:
  check_evaluate_clean(ctx);
  ndx_tensor_release(th);
  ndx_tensor_release(td);
  ndx_tensor_release(ts);
  ndx_future_release(fh);
  ndx_future_release(fd);
  ndx_future_release(fs);
  ndx_args_free(axes0);
  ndx_tensor_release(a);
  ndx_tensor_release(bz);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

static NDX_TEST_NOINLINE void test_first_poll_submits(void) {
  NDX_TEST_CONTEXT("first poll submits");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "count_copy", k_copy, &s);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "count_copy", in, 1, NULL, NULL, &f))) {
    sleep_ms(20);
    CHECK(load_int(&s.started) == 0, "recorded, not run");
    CHECK(ndx_future_poll(f) == NDX_FUTURE_PENDING, "the first poll answers PENDING");
    /* ... and hands the work to the workers: it completes without a wait. */
    double end = now_ms() + 5000;
    int st = NDX_FUTURE_PENDING;
    while ((st = ndx_future_poll(f)) == NDX_FUTURE_PENDING && now_ms() < end) sleep_ms(1);
    CHECK(st == NDX_FUTURE_READY, "completed after polling alone: %d", st);
    CHECK(load_int(&s.calls) == 1, "ran once");
    CHECK(!pthread_equal(s.thread, main_thread), "on a worker");
  }
  check_evaluate_clean(ctx);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* on_ready on a DEFERRED future hands its graph to the workers (DESIGN, Decisions): the
 * callback fires with no poll, wait or evaluate. It used to wait for one forever. */
static NDX_TEST_NOINLINE void test_on_ready_submits_deferred(void) {
  NDX_TEST_CONTEXT("on_ready submits DEFERRED work");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "count_copy", k_copy, &s);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  ndx_tensor_t* t1 = NULL;
  cb_state c;
  memset(&c, 0, sizeof c);
  CHECK_OK(ndx_invoke(ctx, "count_copy", in, 1, NULL, NULL, &f1));
  if (!f1) goto done;
  t1 = ndx_test_output(f1, 0);
  ndx_input_t in2[1] = {ndx_test_in(t1)};
  CHECK_OK(ndx_invoke(ctx, "count_copy", in2, 1, NULL, NULL, &f2));
  if (!f2) goto done;
  sleep_ms(20);
  CHECK(load_int(&s.started) == 0, "recorded, not run");
  CHECK_OK(ndx_future_on_ready(f2, cb_record, &c, cb_free));
  CHECK(spin_until(&c.fired, 1, 5000), "the callback fired without a poll, wait or evaluate");
  CHECK(c.status == NDX_FUTURE_READY, "READY in the callback: %d", c.status);
  CHECK(!c.on_main, "on a worker");
  CHECK(load_int(&s.calls) == 2, "the graph ran, both invocations: %d", load_int(&s.calls));
  if (t1) check_i32(t1, kA, 6);
done:
  check_evaluate_clean(ctx);
  ndx_tensor_release(t1);
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- ndx_context_evaluate ------------------------------------------------------------------ */

static NDX_TEST_NOINLINE void test_evaluate_reports_once(void) {
  NDX_TEST_CONTEXT("evaluate");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* bz = t_i32(kBZero);
  ndx_tensor_t* bo = t_i32(kBOk);
  ndx_input_t bad[2] = {ndx_test_in(a), ndx_test_in(bz)};
  ndx_input_t good[2] = {ndx_test_in(a), ndx_test_in(bo)};
  ndx_invoke_options_t sync = mode_opts(NDX_EVAL_SYNC_CPU);
  ndx_invoke_options_t eager = mode_opts(NDX_EVAL_EAGER);
  ndx_future_t* f[8] = {NULL};
  int line[8] = {0};
  /* #1, #2: DEFERRED failures nobody looks at (released unobserved). */
  line[1] = __LINE__; CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &f[1]));
  line[2] = __LINE__; CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &f[2]));
  /* #3: succeeds. */
  CHECK_OK(ndx_invoke(ctx, "div", good, 2, NULL, NULL, &f[3]));
  /* #4: observed through a wait. */
  CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &f[4]));
  expect_error(ndx_future_wait(f[4], -1), NDX_ERROR_VALUE, "integer division by zero");
  /* #5: observed through poll answering FAILED. */
  CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &f[5]));
  {
    double end = now_ms() + 5000;
    int st;
    while ((st = ndx_future_poll(f[5])) == NDX_FUTURE_PENDING && now_ms() < end) sleep_ms(1);
    CHECK(st == NDX_FUTURE_FAILED, "#5 failed: %d", st);
  }
  /* #6: SYNC, observed through ndx_future_error. */
  CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, &sync, &f[6]));
  expect_error(ndx_future_error(f[6]), NDX_ERROR_VALUE, "integer division by zero");
  /* #7: EAGER, released before anyone looked. */
  line[7] = __LINE__; CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, &eager, &f[7]));
  for (int i = 1; i <= 7; i++) {
    if (i == 3 || i == 4) continue; /* kept: released after evaluate */
    ndx_future_release(f[i]);
    f[i] = NULL;
  }

  ndx_error_t* e = ndx_context_evaluate(ctx);
  if (CHECK(e != NULL, "evaluate reports the unobserved failures")) {
    CHECK(ndx_error_kind(e) == NDX_ERROR_RUNTIME, "kind %d", (int)ndx_error_kind(e));
    CHECK_CONTAINS(ndx_error_message(e), "3 invocations failed without being observed");
    size_t n = ndx_error_related_count(e);
    CHECK(n == 3, "#1, #2 and #7: %zu related", n);
    int seen[8] = {0};
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
      const ndx_error_t* r = ndx_error_related(e, i);
      uint64_t seq = ndx_error_sequence(r);
      CHECK(seq > prev, "in enqueue order: #%llu after #%llu", (unsigned long long)seq,
            (unsigned long long)prev);
      prev = seq;
      CHECK_LINK(r, NDX_ERROR_VALUE, "integer division by zero", "div", seq);
      if (CHECK(seq == 1 || seq == 2 || seq == 7, "unexpected related #%llu",
                (unsigned long long)seq)) {
        seen[seq]++;
        CHECK_FRAME(r, 0, THIS_FILE, line[seq], "test_evaluate_reports_once", NDX_FRAME_NATIVE);
      }
    }
    CHECK(seen[1] == 1 && seen[2] == 1 && seen[7] == 1, "each reported once");
  }
  ndx_error_free(e);
  /* Reported once: the second call has nothing left. */
  e = ndx_context_evaluate(ctx);
  CHECK(e == NULL, "second evaluate: %s", NDX_TEST_S(ndx_error_message(e)));
  ndx_error_free(e);
  CHECK(ndx_future_poll(f[3]) == NDX_FUTURE_READY, "#3 ran during evaluate");

  /* A new unobserved failure after that is reported alone. */
  ndx_future_t* g = NULL;
  CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &g));
  ndx_future_release(g);
  e = ndx_context_evaluate(ctx);
  if (CHECK(e != NULL, "the new failure")) {
    CHECK(ndx_error_related_count(e) == 1, "only the new one: %zu", ndx_error_related_count(e));
    CHECK_LINK(ndx_error_related(e, 0), NDX_ERROR_VALUE, "integer division by zero", "div", 8);
    CHECK_CONTAINS(ndx_error_message(e), "1 invocation failed without being observed");
  }
  ndx_error_free(e);
  check_evaluate_clean(ctx);
  ndx_future_release(f[3]);
  ndx_future_release(f[4]);
  ndx_tensor_release(a);
  ndx_tensor_release(bz);
  ndx_tensor_release(bo);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- graphs spanning contexts ------------------------------------------------------------ */

/* Graph record 0 of `ctx`'s explain report: its op count and whether it completed. */
static void check_graph0(const ndx_context_t* ctx, size_t graphs, uint64_t ops, const char* who) {
  ndx_explain_t* x = NULL;
  if (!CHECK_OK(ndx_context_explain(ctx, &x))) return;
  CHECK(ndx_explain_graph_count(x) == graphs, "%s: %zu graphs", who, ndx_explain_graph_count(x));
  if (graphs > 0) {
    ndx_explain_graph_t g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    if (CHECK_OK(ndx_explain_graph(x, 0, &g))) {
      CHECK(g.ops == ops, "%s: graph 0 ran %llu ops", who, (unsigned long long)g.ops);
      CHECK(g.time_ns >= 0, "%s: graph 0 completed", who);
    }
  }
  ndx_explain_free(x);
}

/* A DEFERRED invocation of context B feeds an invocation of context A: waiting and
 * evaluating in A run it, each context tracks (and counts in its explain report) its own
 * invocations, and both evaluates return. Used to abort the process (a worker panicked
 * on B's explain records) or hang ndx_context_evaluate(A). */
static NDX_TEST_NOINLINE void test_cross_context_graph(void) {
  static const int32_t kSum3[6] = {18, 21, -21, 24, 27, 30}; /* (a + a) + a */
  for (int v = 0; v < 4; v++) {
    int32_t consumer = (v & 1) ? NDX_EVAL_EAGER : NDX_EVAL_DEFERRED;
    int wait_first = (v & 2) != 0;
    NDX_TEST_CONTEXT(consumer == NDX_EVAL_EAGER ? "cross-context graph, EAGER consumer"
                                                : "cross-context graph, DEFERRED consumer");
    ndx_context_t* ca = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
    ndx_context_t* cb = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
    ndx_tensor_t* a = t_i32(kA);
    ndx_input_t in_b[2] = {ndx_test_in(a), ndx_test_in(a)};
    ndx_future_t *fb = NULL, *fa = NULL;
    CHECK_OK(ndx_invoke(cb, "add", in_b, 2, NULL, NULL, &fb));
    ndx_tensor_t* tb = ndx_test_output(fb, 0);
    ndx_input_t in_a[2] = {ndx_test_in(tb), ndx_test_in(a)};
    ndx_invoke_options_t o = mode_opts(consumer);
    CHECK_OK(ndx_invoke(ca, "add", in_a, 2, NULL, &o, &fa));
    if (wait_first) CHECK_OK(ndx_future_wait(fa, 10000 * MS));
    check_evaluate_clean(ca);
    CHECK(ndx_future_poll(fa) == NDX_FUTURE_READY, "A's invocation ran");
    CHECK(ndx_future_poll(fb) == NDX_FUTURE_READY, "B's invocation ran");
    ndx_tensor_t* ta = ndx_test_output(fa, 0);
    check_i32(ta, kSum3, 6);
    check_graph0(cb, 1, 1, "B");
    check_graph0(ca, consumer == NDX_EVAL_DEFERRED ? 1 : 0, 1, "A");
    check_evaluate_clean(cb);
    ndx_tensor_release(ta);
    ndx_tensor_release(tb);
    ndx_future_release(fa);
    ndx_future_release(fb);
    ndx_tensor_release(a);
    ndx_context_release(ca);
    ndx_context_release(cb);
  }
  NDX_TEST_CONTEXT(NULL);
}

/* An EAGER failure completes unobserved; its output then goes into an ndx_invoke that
 * fails at call time, or into a DEFERRED invocation that is cancelled. ndx_invoke's own
 * look at the failed input (its device, its data) is no observation: evaluate still
 * reports the failure, once. It used to be lost. */
static NDX_TEST_NOINLINE void test_internal_lookup_is_no_observation(void) {
  static const int64_t kShape2[1] = {2}; /* does not broadcast with [2, 3] */
  for (int variant = 0; variant < 2; variant++) {
    NDX_TEST_CONTEXT(variant == 0 ? "failure fed to an invoke refused at call time"
                                  : "failure fed to a cancelled invocation");
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
    ndx_tensor_t* a = t_i32(kA);
    ndx_tensor_t* bz = t_i32(kBZero);
    ndx_tensor_t* t2 = ndx_test_tensor(kA, NDX_DTYPE_INT32, 1, kShape2);
    ndx_input_t bad[2] = {ndx_test_in(a), ndx_test_in(bz)};
    ndx_future_t *fa = NULL, *fc = NULL;
    cb_state cs;
    memset(&cs, 0, sizeof cs);
    CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &fa));
    if (!fa) goto done;
    /* A callback tells when it completed, without observing it. */
    CHECK_OK(ndx_future_on_ready(fa, cb_count_only, &cs, NULL));
    CHECK(spin_until(&cs.fired, 1, 5000), "the division completed");
    ndx_tensor_t* ta = ndx_test_output(fa, 0);
    if (variant == 0) {
      ndx_input_t in[2] = {ndx_test_in(ta), ndx_test_in(t2)};
      expect_error(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &fc), NDX_ERROR_VALUE,
                   "cannot be broadcast");
      CHECK(fc == NULL, "no future for a refused invocation");
    } else {
      ndx_input_t in[1] = {ndx_test_in(ta)};
      ndx_invoke_options_t deferred = mode_opts(NDX_EVAL_DEFERRED);
      CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, &deferred, &fc));
      bool cancelled = false;
      CHECK_OK(ndx_future_cancel(fc, &cancelled));
      CHECK(cancelled, "cancelled before it ran");
      expect_error(ndx_future_wait(fc, -1), NDX_ERROR_CANCELLED, "was cancelled");
    }
    ndx_tensor_release(ta);
    ndx_error_t* e = ndx_context_evaluate(ctx);
    if (CHECK(e != NULL, "evaluate reports the division")) {
      CHECK(ndx_error_related_count(e) == 1, "the division alone: %zu related",
            ndx_error_related_count(e));
      CHECK_LINK(ndx_error_related(e, 0), NDX_ERROR_VALUE, "integer division by zero", "div", 1);
    }
    ndx_error_free(e);
    check_evaluate_clean(ctx); /* once */
  done:
    ndx_future_release(fa);
    ndx_future_release(fc);
    ndx_tensor_release(a);
    ndx_tensor_release(bz);
    ndx_tensor_release(t2);
    ndx_context_release(ctx);
  }
  NDX_TEST_CONTEXT(NULL);
}

/* ---- cancellation ----------------------------------------------------------------------------- */

static NDX_TEST_NOINLINE void test_cancel_deferred(void) {
  NDX_TEST_CONTEXT("cancel");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBOk);
  ndx_input_t in1[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  ndx_tensor_t* t1 = NULL;
  bool cancelled = false;
  int l1 = __LINE__; CHECK_OK(ndx_invoke(ctx, "div", in1, 2, NULL, NULL, &f1));
  if (!f1) goto done;
  t1 = ndx_test_output(f1, 0);
  ndx_input_t in2[2] = {ndx_test_in(t1), ndx_test_in(b)};
  int l2 = __LINE__; CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &f2));
  if (!f2) goto done;

  CHECK_OK(ndx_future_cancel(f1, &cancelled));
  CHECK(cancelled, "a DEFERRED invocation that has not started is cancelled");
  CHECK(ndx_future_poll(f1) == NDX_FUTURE_FAILED, "cancelled: FAILED");
  ndx_error_t* e1 = ndx_future_error(f1);
  CHECK_LINK(e1, NDX_ERROR_CANCELLED, "cancelled before it ran", "div", 1);
  CHECK_FRAME(e1, 0, THIS_FILE, l1, "test_cancel_deferred", NDX_FRAME_NATIVE);
  ndx_error_free(e1);

  ndx_error_t* e2 = ndx_future_wait(f2, 5000 * MS);
  CHECK_LINK(e2, NDX_ERROR_CANCELLED,
             "input 0 of 'add' (#2) failed: it is the output of 'div' (#1), which failed", "add", 2);
  CHECK_FRAME(e2, 0, THIS_FILE, l2, "test_cancel_deferred", NDX_FRAME_NATIVE);
  if (CHECK(ndx_test_chain_length(e2) == 2, "add -> cancelled div")) {
    CHECK_LINK(ndx_error_cause(e2), NDX_ERROR_CANCELLED, "cancelled before it ran", "div", 1);
    CHECK_FRAME(ndx_error_cause(e2), 0, THIS_FILE, l1, "test_cancel_deferred", NDX_FRAME_NATIVE);
  }
  ndx_error_free(e2);

  cancelled = true;
  CHECK_OK(ndx_future_cancel(f1, &cancelled));
  CHECK(!cancelled, "cancelling twice: false");
  cancelled = true;
  CHECK_OK(ndx_future_cancel(f2, &cancelled));
  CHECK(!cancelled, "a completed invocation is not cancelled");
  expect_error(ndx_future_cancel(NULL, &cancelled), NDX_ERROR_VALUE, "future");
  /* The out-param's error names it (it said 'out'). */
  expect_error(ndx_future_cancel(f2, NULL), NDX_ERROR_VALUE, "argument 'cancelled' is NULL");
  /* An optional out-param is cleared when the call fails (it kept the caller's value). */
  size_t n_run = 99;
  expect_error(ndx_context_process_events(NULL, &n_run), NDX_ERROR_VALUE, "ctx");
  CHECK(n_run == 0, "n_run cleared on error: %zu", n_run);
done:
  check_evaluate_clean(ctx);
  ndx_tensor_release(t1);
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* Whoever cancels an invocation knows its outcome: ndx_context_evaluate reported it as an
 * unobserved failure. What failed because of it is still reported, with it as cause. */
static NDX_TEST_NOINLINE void test_cancel_is_observed(void) {
  NDX_TEST_CONTEXT("cancel observed");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* b = t_i32(kBOk);
  ndx_input_t in1[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  bool cancelled = false;
  if (CHECK_OK(ndx_invoke(ctx, "add", in1, 2, NULL, NULL, &f1))) {
    CHECK_OK(ndx_future_cancel(f1, &cancelled));
    CHECK(cancelled, "cancelled");
    ndx_future_release(f1);
  }
  check_evaluate_clean(ctx);

  f1 = NULL;
  ndx_tensor_t* t1 = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "add", in1, 2, NULL, NULL, &f1))) {
    t1 = ndx_test_output(f1, 0);
    ndx_input_t in2[2] = {ndx_test_in(t1), ndx_test_in(b)};
    CHECK_OK(ndx_invoke(ctx, "mul", in2, 2, NULL, NULL, &f2));
    CHECK_OK(ndx_future_cancel(f1, &cancelled));
    ndx_future_release(f1);
    ndx_future_release(f2);
    ndx_tensor_release(t1);
    ndx_error_t* e = ndx_context_evaluate(ctx);
    CHECK(e && ndx_error_kind(e) == NDX_ERROR_RUNTIME, "evaluate reports the dependent");
    CHECK_CONTAINS(ndx_error_message(e), "1 invocation failed without being observed");
    if (CHECK(ndx_error_related_count(e) == 1, "only the dependent: %zu",
              ndx_error_related_count(e))) {
      const ndx_error_t* dep = ndx_error_related(e, 0);
      CHECK_LINK(dep, NDX_ERROR_CANCELLED, "input 0 of 'mul' (#3) failed", "mul", 3);
      CHECK_LINK(ndx_error_cause(dep), NDX_ERROR_CANCELLED, "cancelled before it ran", "add", 2);
    }
    ndx_error_free(e);
  }
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* Opens a gate from another thread after a delay. */
typedef struct {
  gate_t* gate;
  int delay_ms;
} opener_t;

static void* opener_main(void* p) {
  opener_t* o = (opener_t*)p;
  sleep_ms(o->delay_ms);
  gate_open(o->gate);
  return NULL;
}

/* Releasing a context cancels what has not started; callbacks still fire exactly once.
 * The DEFERRED work waits for an EAGER operator held by a gate (on_ready hands it to the
 * workers; host operators need no metadata of their inputs, so nothing waits here). */
static NDX_TEST_NOINLINE void test_release_cancels_deferred(void) {
  NDX_TEST_CONTEXT("release context with DEFERRED work");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "count_copy", k_copy, &s);
  gate_t gate;
  gate_init(&gate);
  register_op(ctx, "gate", k_gate, &gate);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_invoke_options_t eager = mode_opts(NDX_EVAL_EAGER);
  ndx_future_t *fg = NULL, *fh = NULL, *fa = NULL, *fd = NULL;
  ndx_tensor_t *tg = NULL, *th = NULL, *ta = NULL;
  cb_state ch, ca, cd, late;
  memset(&ch, 0, sizeof ch);
  memset(&ca, 0, sizeof ca);
  memset(&cd, 0, sizeof cd);
  memset(&late, 0, sizeof late);
  opener_t op = {&gate, 100};
  pthread_t opener;
  int started = 0;
  CHECK_OK(ndx_invoke(ctx, "gate", in, 1, NULL, &eager, &fg)); /* #1, held */
  if (!fg) goto fail;
  tg = ndx_test_output(fg, 0);
  ndx_input_t ih[1] = {ndx_test_in(tg)};
  CHECK_OK(ndx_invoke(ctx, "count_copy", ih, 1, NULL, NULL, &fh)); /* #2 */
  if (!fh) goto fail;
  th = ndx_test_output(fh, 0);
  ndx_input_t ia[1] = {ndx_test_in(th)};
  CHECK_OK(ndx_invoke(ctx, "count_copy", ia, 1, NULL, NULL, &fa)); /* #3 */
  if (!fa) goto fail;
  ta = ndx_test_output(fa, 0);
  ndx_input_t id[1] = {ndx_test_in(ta)};
  CHECK_OK(ndx_invoke(ctx, "count_copy", id, 1, NULL, NULL, &fd)); /* #4 */
  if (!fd) goto fail;
  CHECK_OK(ndx_future_on_ready(fh, cb_record, &ch, cb_free));
  CHECK_OK(ndx_future_on_ready(fa, cb_record, &ca, cb_free));
  CHECK_OK(ndx_future_on_ready(fd, cb_record, &cd, cb_free));
  CHECK(load_int(&ch.fired) == 0 && load_int(&ca.fired) == 0, "nothing complete yet");
  if (!CHECK(spin_until(&gate.entered, 1, 5000), "the gate operator is running")) goto fail;
  started = pthread_create(&opener, NULL, opener_main, &op) == 0;
  CHECK(started, "opener thread");

  ndx_context_release(ctx);
  ctx = NULL;
  /* Cancelled by the release: complete (FAILED, CANCELLED) and notified once, at once. */
  CHECK(load_int(&ch.fired) == 1, "host op callback fired %d times on release", load_int(&ch.fired));
  CHECK(load_int(&ca.fired) == 1, "second callback fired %d times on release", load_int(&ca.fired));
  CHECK(load_int(&cd.fired) == 1, "third callback fired %d times on release", load_int(&cd.fired));
  CHECK(load_int(&ch.freed) == 1 && load_int(&ca.freed) == 1 && load_int(&cd.freed) == 1,
        "user_free ran once each: %d %d %d", load_int(&ch.freed), load_int(&ca.freed),
        load_int(&cd.freed));
  CHECK(ndx_future_poll(fg) == NDX_FUTURE_READY, "the running gate finished");
  {
    ndx_error_t* eh = ndx_future_error(fh);
    CHECK_LINK(eh, NDX_ERROR_CANCELLED, "its context was released", "count_copy", 2);
    ndx_error_free(eh);
    /* Cancelled, or failed with the cancellation before it as its cause. */
    ndx_error_t* ea = ndx_future_error(fa);
    CHECK_LINK(ea, NDX_ERROR_CANCELLED, NULL, "count_copy", 3);
    ndx_error_free(ea);
    ndx_error_t* ed = ndx_future_error(fd);
    CHECK(ndx_error_kind(ed) == NDX_ERROR_CANCELLED, "the dependent is cancelled too");
    ndx_error_free(ed);
  }
  CHECK(ndx_future_poll(fh) == NDX_FUTURE_FAILED, "FAILED (cancelled), and poll runs nothing");
  /* The futures stay usable; waiting must neither hang nor run the cancelled work. */
  ndx_error_t* w = ndx_future_wait(fh, 5000 * MS);
  CHECK(ndx_error_kind(w) == NDX_ERROR_CANCELLED, "wait after release: %s: %s",
        NDX_TEST_S(ndx_error_kind_name(ndx_error_kind(w))), NDX_TEST_S(ndx_error_message(w)));
  ndx_error_free(w);
  w = ndx_future_wait(fd, 5000 * MS);
  CHECK(ndx_error_kind(w) == NDX_ERROR_CANCELLED, "wait on the dependent: %s",
        NDX_TEST_S(ndx_error_message(w)));
  ndx_error_free(w);
  sleep_ms(20);
  CHECK(load_int(&s.started) == 0, "the cancelled host operator never ran: %d",
        load_int(&s.started));
  CHECK(load_int(&ch.fired) == 1 && load_int(&ca.fired) == 1 && load_int(&cd.fired) == 1,
        "still once each: %d %d %d", load_int(&ch.fired), load_int(&ca.fired),
        load_int(&cd.fired));
  /* on_ready after completion, context gone: at once, on this thread. */
  CHECK_OK(ndx_future_on_ready(fa, cb_record, &late, cb_free));
  CHECK(load_int(&late.fired) == 1 && late.on_main && late.status == NDX_FUTURE_FAILED,
        "late callback: fired %d on_main %d status %d", load_int(&late.fired), late.on_main,
        late.status);
  CHECK(load_int(&late.freed) == 1, "late user_free");
fail:
  gate_open(&gate);
  if (started) pthread_join(opener, NULL);
  ndx_context_release(ctx);
  ndx_tensor_release(tg);
  ndx_tensor_release(th);
  ndx_tensor_release(ta);
  ndx_future_release(fg);
  ndx_future_release(fh);
  ndx_future_release(fa);
  ndx_future_release(fd);
  ndx_tensor_release(a);
  gate_destroy(&gate);
  NDX_TEST_CONTEXT(NULL);
}

/* An on_ready callback that takes a while. */
static int slow_cb_done;
static void cb_slow(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  sleep_ms(100);
  inc_int(&slow_cb_done);
}

/* Releasing a context waits for running work, its callbacks included (and cancels what
 * has not started). */
static NDX_TEST_NOINLINE void test_release_waits_running(void) {
  NDX_TEST_CONTEXT("release context with running EAGER work");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
  gate_t gate;
  gate_init(&gate);
  register_op(ctx, "gate", k_gate, &gate);
  host_state hs;
  memset(&hs, 0, sizeof hs);
  register_op(ctx, "copy", k_copy, &hs);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_invoke_options_t deferred = mode_opts(NDX_EVAL_DEFERRED);
  ndx_future_t *fg = NULL, *fd = NULL;
  ndx_tensor_t* tg = NULL;
  cb_state cg, cd;
  memset(&cg, 0, sizeof cg);
  memset(&cd, 0, sizeof cd);
  opener_t op = {&gate, 100};
  pthread_t opener;
  int started = 0;
  CHECK_OK(ndx_invoke(ctx, "gate", in, 1, NULL, NULL, &fg));
  if (!fg) goto fail;
  tg = ndx_test_output(fg, 0);
  /* DEFERRED, on the gate's output (a host operator needs no metadata of it): on_ready
   * hands it to the workers, where it waits for the gate. */
  ndx_input_t ing[1] = {ndx_test_in(tg)};
  CHECK_OK(ndx_invoke(ctx, "copy", ing, 1, NULL, &deferred, &fd));
  if (!fd) goto fail;
  slow_cb_done = 0;
  CHECK_OK(ndx_future_on_ready(fg, cb_slow, NULL, NULL)); /* runs first, for 100 ms */
  CHECK_OK(ndx_future_on_ready(fg, cb_record, &cg, cb_free));
  CHECK_OK(ndx_future_on_ready(fd, cb_record, &cd, cb_free));
  if (!CHECK(spin_until(&gate.entered, 1, 5000), "the gate operator is running")) goto fail;
  started = pthread_create(&opener, NULL, opener_main, &op) == 0;
  CHECK(started, "opener thread");
  double t0 = now_ms();
  ndx_context_release(ctx);
  double dt = now_ms() - t0;
  ctx = NULL;
  /* The running one finished before the release returned; the DEFERRED one waiting for it was cancelled. */
  CHECK(dt >= 50.0, "the release waited for the running operator (%.1f ms)", dt);
  CHECK(ndx_future_poll(fg) == NDX_FUTURE_READY, "running work finished: %d",
        ndx_future_poll(fg));
  CHECK(load_int(&slow_cb_done) == 1,
        "the running work's callbacks finished before ndx_context_release returned");
  CHECK(load_int(&cg.fired) == 1, "its callback fired once: %d", load_int(&cg.fired));
  CHECK(gate.timed_out == 0, "opened by the opener thread");
  CHECK(ndx_future_poll(fd) == NDX_FUTURE_FAILED, "waiting work cancelled");
  ndx_error_t* e = ndx_future_error(fd);
  CHECK_LINK(e, NDX_ERROR_CANCELLED, "its context was released", "copy", 2);
  ndx_error_free(e);
  CHECK(load_int(&cd.fired) == 1, "the cancelled one's callback fired once: %d",
        load_int(&cd.fired));
  CHECK(load_int(&hs.started) == 0, "the cancelled one never ran: %d", load_int(&hs.started));
  spin_until(&cg.fired, 1, 2000);
  sleep_ms(20);
  CHECK(load_int(&cg.fired) == 1 && load_int(&cd.fired) == 1, "once each in the end");
  CHECK(load_int(&cg.freed) == 1 && load_int(&cd.freed) == 1, "user_free once each");
  if (tg) check_i32(tg, kA, 6);
fail:
  if (started) pthread_join(opener, NULL);
  ndx_context_release(ctx);
  ndx_tensor_release(tg);
  ndx_future_release(fg);
  ndx_future_release(fd);
  ndx_tensor_release(a);
  gate_destroy(&gate);
  NDX_TEST_CONTEXT(NULL);
}

/* A callback that signals it started, then holds its worker until its gate opens. */
static gate_t* held_cb_gate;
static int held_cb_started, held_cb_done;
static void cb_held(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  inc_int(&held_cb_started);
  pthread_mutex_lock(&held_cb_gate->mu);
  while (!held_cb_gate->open) pthread_cond_wait(&held_cb_gate->cv, &held_cb_gate->mu);
  pthread_mutex_unlock(&held_cb_gate->mu);
  inc_int(&held_cb_done);
}

static int gate_user_freed;
static void count_gate_free(void* user) {
  (void)user;
  inc_int(&gate_user_freed);
}

/* The main thread releases its only reference while a host operator runs on one worker
 * and an on_ready callback of another future runs on another (completing that future
 * holds the context meanwhile): the release still finishes the running work and
 * releases the host operator's user data before it returns. It used to return at once
 * and leave both to the worker that let go of the context last. */
static NDX_TEST_NOINLINE void test_release_joins_while_a_worker_holds_the_context(void) {
  NDX_TEST_CONTEXT("release while a callback holds the context");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
  gate_t gate, cb_gate;
  gate_init(&gate);
  gate_init(&cb_gate);
  held_cb_gate = &cb_gate;
  held_cb_started = held_cb_done = gate_user_freed = 0;
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  CHECK_OK(ndx_register_op(ctx, "gate", &s, k_gate, &gate, count_gate_free));
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_invoke_options_t deferred = mode_opts(NDX_EVAL_DEFERRED);
  ndx_future_t *fx = NULL, *fg = NULL;
  opener_t op = {&gate, 150};
  pthread_t opener;
  int started = 0;
  CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, &deferred, &fx));
  CHECK_OK(ndx_invoke(ctx, "gate", in, 1, NULL, NULL, &fg));
  if (!fx || !fg) goto fail;
  CHECK_OK(ndx_future_on_ready(fx, cb_held, NULL, NULL));
  if (!CHECK(spin_until(&gate.entered, 1, 5000), "the gate operator is running")) goto fail;
  (void)ndx_future_poll(fx); /* runs neg; its callback then holds a worker */
  if (!CHECK(spin_until(&held_cb_started, 1, 5000), "the callback is running")) goto fail;
  started = pthread_create(&opener, NULL, opener_main, &op) == 0;
  CHECK(started, "opener thread");
  /* The callback is let go 300 ms from now, after the operator (150 ms): the release
   * waits for both. */
  opener_t cb_op = {&cb_gate, 300};
  pthread_t cb_opener;
  int cb_started = pthread_create(&cb_opener, NULL, opener_main, &cb_op) == 0;
  CHECK(cb_started, "callback opener thread");
  double t0 = now_ms();
  ndx_context_release(ctx);
  double dt = now_ms() - t0;
  ctx = NULL;
  CHECK(load_int(&gate.calls) == 1,
        "the running host operator finished before the release returned (%.1f ms)", dt);
  CHECK(load_int(&gate_user_freed) == 1, "its user_free ran before the release returned: %d",
        load_int(&gate_user_freed));
  CHECK(load_int(&held_cb_done) == 1,
        "the running callback finished before the release returned");
  CHECK(!pthread_equal(gate.thread, main_thread), "the operator ran on a worker");
  CHECK_OK(ndx_future_wait(fg, 5000 * MS));
  if (cb_started) pthread_join(cb_opener, NULL);
  sleep_ms(20);
  CHECK(load_int(&gate_user_freed) == 1, "user_free once: %d", load_int(&gate_user_freed));
fail:
  if (started) pthread_join(opener, NULL);
  gate_open(&gate);
  gate_open(&cb_gate);
  ndx_context_release(ctx);
  ndx_future_release(fx);
  ndx_future_release(fg);
  ndx_tensor_release(a);
  gate_destroy(&gate);
  gate_destroy(&cb_gate);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- process-events mode ------------------------------------------------------------------ */

/* An EAGER context whose callbacks and host operators run only in process-events. */
static ndx_context_t* make_events_ctx(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_EAGER;
  o.capture_policy = NDX_CAPTURE_OFF;
  o.num_threads = 4;
  o.process_events_callbacks = true;
  return ndx_test_new_context(&o);
}

static ndx_context_t* releasing_ctx; /* released by the first callback that runs */
static int releasing_fired, releasing_on_main, events_user_freed;
static void cb_release_ctx(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  inc_int(&releasing_fired);
  if (pthread_equal(pthread_self(), main_thread)) inc_int(&releasing_on_main);
  ndx_context_t* c = releasing_ctx;
  releasing_ctx = NULL;
  ndx_context_release(c); /* NULL after the first: a no-op */
}
static void count_events_free(void* user) {
  (void)user;
  inc_int(&events_user_freed);
}

/* A callback run inside ndx_context_process_events (or ndx_context_evaluate) releases
 * the last reference to the context while more callbacks are queued behind it: the call
 * runs them all, on this thread, and the context is released when it returns (the host
 * operator's user_free has run). It used to go on reading the freed context (valgrind:
 * invalid reads), with the rest of the queue run inside the release. */
static NDX_TEST_NOINLINE void test_release_inside_process_events(void) {
  for (int via_evaluate = 0; via_evaluate < 2; via_evaluate++) {
    NDX_TEST_CONTEXT(via_evaluate ? "callback releases the context inside evaluate"
                                  : "callback releases the context inside process_events");
    ndx_context_t* ctx = make_events_ctx();
    ndx_op_schema_t s = ndx_test_schema(1, 1);
    events_user_freed = releasing_fired = releasing_on_main = 0;
    host_state hs; /* never invoked: its user_free tells when the context went */
    memset(&hs, 0, sizeof hs);
    CHECK_OK(ndx_register_op(ctx, "copy", &s, k_copy, &hs, count_events_free));
    ndx_tensor_t* a = t_i32(kA);
    ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
    ndx_future_t* f[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f[k]));
    for (int k = 0; k < 4; k++) {
      double end = now_ms() + 5000;
      while (f[k] && ndx_future_poll(f[k]) == NDX_FUTURE_PENDING && now_ms() < end) sleep_ms(1);
    }
    releasing_ctx = ctx;
    /* Complete already: each callback is queued for process-events, the releasing one first. */
    for (int k = 0; k < 4; k++) CHECK_OK(ndx_future_on_ready(f[k], cb_release_ctx, NULL, NULL));
    for (int k = 0; k < 4; k++) ndx_future_release(f[k]);
    size_t n = 0;
    if (via_evaluate) {
      check_evaluate_clean(ctx);
    } else {
      CHECK_OK(ndx_context_process_events(ctx, &n));
      CHECK(n == 4, "process_events ran the 4 queued callbacks itself: %zu", n);
    }
    CHECK(releasing_ctx == NULL, "the first callback released the context");
    CHECK(load_int(&releasing_fired) == 4, "every callback fired: %d", load_int(&releasing_fired));
    CHECK(load_int(&releasing_on_main) == 4, "on this thread: %d", load_int(&releasing_on_main));
    CHECK(load_int(&events_user_freed) == 1,
          "the context was released when the call returned (host user_free ran): %d",
          load_int(&events_user_freed));
    ndx_tensor_release(a);
  }
  NDX_TEST_CONTEXT(NULL);
}

typedef struct {
  int fired;   /* atomic */
  int on_main; /* atomic */
  int freed;   /* atomic */
} where_state;

static void cb_where(void* user, const ndx_future_t* f) {
  where_state* w = (where_state*)user;
  (void)f;
  if (pthread_equal(pthread_self(), main_thread)) inc_int(&w->on_main);
  inc_int(&w->fired);
}
static void cb_where_free(void* user) { inc_int(&((where_state*)user)->freed); }

static ndx_context_t* worker_released_ctx;
static int worker_released; /* atomic: set once released, 2 when on the main thread */
static void cb_release_on_worker(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  ndx_context_release(worker_released_ctx);
  inc_int(&worker_released);
  if (pthread_equal(pthread_self(), main_thread)) inc_int(&worker_released);
}

/* Process-events callbacks never run on an ndx worker, whoever releases the context:
 * released by this thread while its work runs on a worker, the callback runs here
 * during the release (it used to run on the worker completing the work); released on a
 * worker (a callback of another context), the queued callback is dropped uncalled and
 * its user_free runs (it used to run there). */
static NDX_TEST_NOINLINE void test_events_callbacks_never_on_a_worker(void) {
  NDX_TEST_CONTEXT("process-events context released with work running");
  enum { N = 1 << 20, ITERS = 3 };
  int32_t* big = (int32_t*)calloc(N, sizeof(int32_t));
  int64_t shape[1] = {N};
  ndx_tensor_t* tb = ndx_test_tensor(big, NDX_DTYPE_INT32, 1, shape);
  ndx_input_t in2[2] = {ndx_test_in(tb), ndx_test_in(tb)};
  where_state w;
  memset(&w, 0, sizeof w);
  for (int i = 0; i < ITERS; i++) {
    ndx_context_t* ctx = make_events_ctx();
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &f));
    CHECK_OK(ndx_future_on_ready(f, cb_where, &w, cb_where_free));
    ndx_future_release(f);
    sleep_ms(2); /* let a worker start it */
    ndx_context_release(ctx);
  }
  CHECK(load_int(&w.fired) == ITERS, "each callback ran during its release: %d", load_int(&w.fired));
  CHECK(load_int(&w.on_main) == ITERS, "on the releasing thread: %d", load_int(&w.on_main));
  CHECK(load_int(&w.freed) == ITERS, "user_free once each: %d", load_int(&w.freed));
  ndx_tensor_release(tb);
  free(big);

  NDX_TEST_CONTEXT("process-events context released on a worker");
  memset(&w, 0, sizeof w);
  worker_released = 0;
  ndx_context_t* ctx = make_events_ctx();
  ndx_context_t* other = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t *f = NULL, *g = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, NULL, &f));
  CHECK_OK(ndx_future_wait(f, 5000 * MS)); /* complete; nothing queued yet */
  CHECK_OK(ndx_future_on_ready(f, cb_where, &w, cb_where_free)); /* queued */
  worker_released_ctx = ctx;
  ndx_invoke_options_t deferred = mode_opts(NDX_EVAL_DEFERRED);
  CHECK_OK(ndx_invoke(other, "neg", in, 1, NULL, &deferred, &g));
  CHECK_OK(ndx_future_on_ready(g, cb_release_on_worker, NULL, NULL));
  (void)ndx_future_poll(g); /* runs it, and its callback, on a worker */
  CHECK(spin_until(&worker_released, 1, 5000), "the other context's callback released it");
  CHECK(spin_until(&w.freed, 1, 5000), "the queued callback's user_free ran");
  sleep_ms(20);
  CHECK(load_int(&worker_released) == 1, "released on a worker: %d", load_int(&worker_released));
  CHECK(load_int(&w.fired) == 0, "the queued callback was dropped uncalled: %d",
        load_int(&w.fired));
  CHECK(load_int(&w.freed) == 1, "its user_free ran once: %d", load_int(&w.freed));
  ndx_future_release(f);
  ndx_future_release(g);
  ndx_tensor_release(a);
  ndx_context_release(other);
  NDX_TEST_CONTEXT(NULL);
}

/* In the process-events mode a wait runs queued host operators itself, but keeps its
 * timeout: a wait of 0 on a queued 300 ms operator times out at once without starting
 * it (it used to run it and return after 300 ms). */
static NDX_TEST_NOINLINE void test_events_wait_timeout(void) {
  NDX_TEST_CONTEXT("process-events wait with a timeout");
  ndx_context_t* ctx = make_events_ctx();
  host_state hs;
  memset(&hs, 0, sizeof hs);
  hs.sleep_ms = 300;
  register_op(ctx, "slow_copy", k_copy, &hs);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "slow_copy", in, 1, NULL, NULL, &f));
  double t0 = now_ms();
  expect_error(ndx_future_wait(f, 0), NDX_ERROR_TIMEOUT, "did not complete within");
  double dt = now_ms() - t0;
  CHECK(dt < 150.0, "wait(0) returned at once: %.1f ms", dt);
  CHECK(load_int(&hs.started) == 0, "and started nothing: %d", load_int(&hs.started));
  CHECK_OK(ndx_future_wait(f, -1));
  CHECK(load_int(&hs.calls) == 1, "ran once in the last wait: %d", load_int(&hs.calls));
  CHECK(pthread_equal(hs.thread, main_thread), "on the waiting thread");
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* A host operator needs no metadata of its inputs: invoking one on the pending output of
 * another must not run (DEFERRED) or wait for (EAGER) the upstream one, and the
 * upstream's failure travels in the downstream future, not out of ndx_invoke. */
static NDX_TEST_NOINLINE void test_host_op_chains(void) {
  NDX_TEST_CONTEXT("host operator on a pending host operator output");
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
    host_state s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    register_op(ctx, "first", k_copy, &s1);
    register_op(ctx, "second", k_copy, &s2);
    ndx_future_t *f1 = NULL, *f2 = NULL;
    ndx_tensor_t *t1 = NULL, *t2 = NULL;
    if (CHECK_OK(ndx_invoke(ctx, "first", in, 1, NULL, NULL, &f1))) {
      t1 = ndx_test_output(f1, 0);
      ndx_input_t in2[1] = {ndx_test_in(t1)};
      if (CHECK_OK(ndx_invoke(ctx, "second", in2, 1, NULL, NULL, &f2))) {
        CHECK(load_int(&s1.started) == 0,
              "DEFERRED: ndx_invoke of 'second' ran the upstream 'first' (%d runs)",
              load_int(&s1.started));
        t2 = ndx_test_output(f2, 0);
        check_i32(t2, kA, 6);
        CHECK(load_int(&s1.calls) == 1 && load_int(&s2.calls) == 1, "each ran once");
      }
    }
    check_evaluate_clean(ctx);
    ndx_tensor_release(t1);
    ndx_tensor_release(t2);
    ndx_future_release(f1);
    ndx_future_release(f2);
    ndx_context_release(ctx);
  }
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
    gate_t gate;
    gate_init(&gate);
    host_state s2;
    memset(&s2, 0, sizeof s2);
    register_op(ctx, "gate", k_gate, &gate);
    register_op(ctx, "second", k_copy, &s2);
    ndx_future_t *f1 = NULL, *f2 = NULL;
    ndx_tensor_t *t1 = NULL, *t2 = NULL;
    opener_t op = {&gate, 300};
    pthread_t opener;
    int started = 0;
    if (CHECK_OK(ndx_invoke(ctx, "gate", in, 1, NULL, NULL, &f1))) {
      t1 = ndx_test_output(f1, 0);
      started = pthread_create(&opener, NULL, opener_main, &op) == 0;
      ndx_input_t in2[1] = {ndx_test_in(t1)};
      double t0 = now_ms();
      if (CHECK_OK(ndx_invoke(ctx, "second", in2, 1, NULL, NULL, &f2))) {
        double dt = now_ms() - t0;
        CHECK(dt < 250.0, "EAGER: ndx_invoke of 'second' waited %.1f ms for the upstream", dt);
        CHECK_OK(ndx_future_wait(f2, 5000 * MS));
        t2 = ndx_test_output(f2, 0);
        check_i32(t2, kA, 6);
      }
      if (started) pthread_join(opener, NULL);
    }
    check_evaluate_clean(ctx);
    ndx_tensor_release(t1);
    ndx_tensor_release(t2);
    ndx_future_release(f1);
    ndx_future_release(f2);
    ndx_context_release(ctx);
    gate_destroy(&gate);
  }
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
    host_state s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    register_op(ctx, "host_fail", host_fail_kernel, &s1);
    register_op(ctx, "second", k_copy, &s2);
    ndx_future_t *f1 = NULL, *f2 = NULL;
    ndx_tensor_t* t1 = NULL;
    int l1 = __LINE__; CHECK_OK(ndx_invoke(ctx, "host_fail", in, 1, NULL, NULL, &f1));
    if (f1) {
      t1 = ndx_test_output(f1, 0);
      ndx_input_t in2[1] = {ndx_test_in(t1)};
      int l2 = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "second", in2, 1, NULL, NULL, &f2);
      if (CHECK(e == NULL, "the upstream's failure came out of ndx_invoke: %s: %s",
                NDX_TEST_S(ndx_error_kind_name(ndx_error_kind(e))),
                NDX_TEST_S(ndx_error_message(e)))) {
        ndx_error_t* w = ndx_future_wait(f2, 5000 * MS);
        CHECK_LINK(w, NDX_ERROR_RUNTIME,
                   "input 0 of 'second' (#2) failed: it is the output of 'host_fail' (#1), which failed",
                   "second", 2);
        CHECK_FRAME(w, 0, THIS_FILE, l2, "test_host_op_chains", NDX_FRAME_NATIVE);
        CHECK(ndx_test_chain_length(w) == 3, "second -> host failed -> root cause: %zu",
              ndx_test_chain_length(w));
        const ndx_error_t* c = ndx_error_cause(w);
        CHECK_LINK(c, NDX_ERROR_RUNTIME, "host failed", "host_fail", 1);
        CHECK_FRAME(c, 0, THIS_FILE, l1, "test_host_op_chains", NDX_FRAME_NATIVE);
        ndx_error_free(w);
      } else {
        ndx_error_free(e);
      }
      CHECK(load_int(&s2.started) == 0, "the downstream kernel never ran");
    }
    ndx_error_free(ndx_context_evaluate(ctx));
    ndx_tensor_release(t1);
    ndx_future_release(f1);
    ndx_future_release(f2);
    ndx_context_release(ctx);
  }
  ndx_tensor_release(a);
  NDX_TEST_CONTEXT(NULL);
}

/* ndx_register_op: "user_free(user) runs when the context is freed" - once, even while
 * futures of the operator's invocations are still alive (no kernel can run after the
 * release: what had not started was cancelled, what ran has finished). */
static int user_freed;
static void count_user_free(void* user) {
  (void)user;
  inc_int(&user_freed);
}

static NDX_TEST_NOINLINE void test_host_user_free(void) {
  NDX_TEST_CONTEXT("host operator user_free");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  ndx_op_schema_t schema = ndx_test_schema(1, 1);
  user_freed = 0;
  CHECK_OK(ndx_register_op(ctx, "freeable", &schema, k_copy, &s, count_user_free));
  /* A failed registration frees nothing it was not given... */
  expect_error(ndx_register_op(ctx, "freeable", &schema, k_copy, &s, NULL), NDX_ERROR_VALUE,
               "already registered");
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "freeable", in, 1, NULL, NULL, &f)); /* SYNC: done on return */
  CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "ran");
  CHECK(load_int(&user_freed) == 0, "not while the context lives");
  ndx_context_release(ctx);
  CHECK(load_int(&user_freed) == 1, "user_free ran %d times when the context was freed "
        "(a future of the operator is still alive)", load_int(&user_freed));
  ndx_tensor_t* t = ndx_test_output(f, 0);
  if (t) check_i32(t, kA, 6); /* the future outlives its context */
  ndx_tensor_release(t);
  ndx_future_release(f);
  CHECK(load_int(&user_freed) == 1, "exactly once: %d", load_int(&user_freed));
  ndx_tensor_release(a);
  NDX_TEST_CONTEXT(NULL);
}

/* Every function taking user/user_free owns `user` in every case: user_free runs exactly
 * once, also when the call fails (before it returns). */
static size_t no_frames(void* user, ndx_host_frame_t* frames, size_t capacity) {
  (void)user;
  (void)frames;
  (void)capacity;
  return 0;
}
static void cb_nothing(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
}

static NDX_TEST_NOINLINE void test_user_free_on_failure(void) {
  NDX_TEST_CONTEXT("user_free when the call fails");
  int token = 0;
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL);
  ndx_op_schema_t schema = ndx_test_schema(1, 1);

  user_freed = 0;
  expect_error(ndx_future_on_ready(NULL, cb_nothing, &token, count_user_free), NDX_ERROR_VALUE,
               "argument 'future' is NULL");
  CHECK(load_int(&user_freed) == 1, "on_ready(NULL future): user_free ran %d times",
        load_int(&user_freed));

  user_freed = 0;
  expect_error(ndx_context_set_frame_provider(NULL, no_frames, &token, count_user_free),
               NDX_ERROR_VALUE, "argument 'ctx' is NULL");
  CHECK(load_int(&user_freed) == 1, "set_frame_provider(NULL ctx): user_free ran %d times",
        load_int(&user_freed));

  user_freed = 0;
  expect_error(ndx_register_op(ctx, "add", &schema, k_copy, &token, count_user_free),
               NDX_ERROR_VALUE, "is a built-in");
  CHECK(load_int(&user_freed) == 1, "register_op(built-in name): user_free ran %d times",
        load_int(&user_freed));

  user_freed = 0;
  expect_error(ndx_register_op(ctx, "mine", NULL, k_copy, &token, count_user_free),
               NDX_ERROR_VALUE, "argument 'schema' is NULL");
  CHECK(load_int(&user_freed) == 1, "register_op(NULL schema): user_free ran %d times",
        load_int(&user_freed));

  /* Removing the provider (NULL) frees its user at once: nothing will call it. */
  user_freed = 0;
  CHECK_OK(ndx_context_set_frame_provider(ctx, NULL, &token, count_user_free));
  CHECK(load_int(&user_freed) == 1, "set_frame_provider(NULL provider): user_free ran %d times",
        load_int(&user_freed));
  ndx_context_release(ctx);
  CHECK(load_int(&user_freed) == 1, "exactly once: %d", load_int(&user_freed));
  NDX_TEST_CONTEXT(NULL);
}

/* A user_free may call ndx on the context it was registered on: replacing the provider
 * runs the old one's user_free after the context's settings are unlocked (it deadlocked
 * on them). */
static int reentered;
static void user_free_reenters(void* user) {
  ndx_error_t* e = ndx_context_set_capture_policy((const ndx_context_t*)user, NDX_CAPTURE_ALL, 0);
  if (e == NULL) inc_int(&reentered);
  ndx_error_free(e);
}

static NDX_TEST_NOINLINE void test_user_free_reenters_its_context(void) {
  NDX_TEST_CONTEXT("a provider's user_free calls into its context");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_HOST, NULL);
  reentered = 0;
  CHECK_OK(ndx_context_set_frame_provider(ctx, no_frames, ctx, user_free_reenters));
  /* Replaces it: a hang here is the deadlock (the watchdog reports it). */
  CHECK_OK(ndx_context_set_frame_provider(ctx, no_frames, NULL, NULL));
  CHECK(load_int(&reentered) == 1, "user_free's call succeeded %d times", load_int(&reentered));
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* A too-small struct_size says what to set (sizeof, this header's) and the least accepted;
 * schema array errors name the schema's fields. */
static NDX_TEST_NOINLINE void test_struct_size_messages(void) {
  NDX_TEST_CONTEXT("struct_size messages");
  char want[256];
  ndx_import_options_t io;
  memset(&io, 0, sizeof io);
  const float v = 1.0f;
  ndx_tensor_t* t = NULL;
  snprintf(want, sizeof want,
           "opts->struct_size is 0: set it to sizeof(ndx_import_options_t), which is %zu (at "
           "least %zu, the fields of the oldest layout",
           sizeof(ndx_import_options_t), offsetof(ndx_import_options_t, stream));
  expect_error(ndx_tensor_from_host(&v, NDX_DTYPE_FLOAT32, 0, NULL, NULL, &io, &t),
               NDX_ERROR_VALUE, want);

  ndx_context_options_t co;
  memset(&co, 0, sizeof co);
  ndx_context_t* ctx = NULL;
  snprintf(want, sizeof want,
           "opts->struct_size is 0: set it to sizeof(ndx_context_options_t), which is %zu",
           sizeof(ndx_context_options_t));
  expect_error(ndx_context_new(&co, &ctx), NDX_ERROR_VALUE, want);

  ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  ndx_future_t* f = NULL;
  snprintf(want, sizeof want,
           "opts->struct_size is 0: set it to sizeof(ndx_invoke_options_t), which is %zu",
           sizeof(ndx_invoke_options_t));
  expect_error(ndx_invoke(ctx, "neg", in, 1, NULL, &o, &f), NDX_ERROR_VALUE, want);

  ndx_op_schema_t schema;
  memset(&schema, 0, sizeof schema);
  schema.n_inputs = 1;
  schema.n_outputs = 1;
  schema.n_args = 2;
  snprintf(want, sizeof want,
           "schema->struct_size is 0: set it to sizeof(ndx_op_schema_t), which is %zu",
           sizeof(ndx_op_schema_t));
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE, want);
  schema.struct_size = sizeof schema;
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
               "schema->arg_names is NULL but schema->n_args is 2");
  /* Repeated argument names make an invalid schema: both indices are named. */
  const char* names[3] = {"a", "b", "a"};
  const int32_t types[3] = {NDX_ARG_INT, NDX_ARG_INT, NDX_ARG_INT};
  schema.n_args = 3;
  schema.arg_names = names;
  schema.arg_types = types;
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
               "schema->arg_names[0] and schema->arg_names[2] are both \"a\"");
  schema.n_args = 2;
  /* n_inputs is an exact count: the two values ndx reserves for its variadic and
   * whole-batch operators are refused (SIZE_MAX - 1 registered one taking any number). */
  schema.n_inputs = SIZE_MAX;
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
               "schema->n_inputs is SIZE_MAX: give the exact number of inputs");
  schema.n_inputs = SIZE_MAX - 1;
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
               "schema->n_inputs is SIZE_MAX - 1: give the exact number of inputs");
  schema.n_inputs = 1;
  /* No outputs, and argument types outside ndx_arg_type_t (validated, never trusted). */
  schema.n_outputs = 0;
  expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
               "schema->n_outputs is 0: an operator needs at least one output");
  schema.n_outputs = 1;
  const int32_t bad_types[2][2] = {{NDX_ARG_INT, 0}, {NDX_ARG_INT, NDX_ARG_DTYPE + 1}};
  const char* const says[2] = {"schema->arg_types[1] is 0, not an ndx_arg_type_t value",
                               "schema->arg_types[1] is 8, not an ndx_arg_type_t value"};
  for (int k = 0; k < 2; k++) {
    schema.arg_types = bad_types[k];
    expect_error(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL), NDX_ERROR_VALUE,
                 says[k]);
  }
  schema.arg_types = types;
  /* An input entry holds exactly one of a tensor and a batch. */
  ndx_input_t two[2] = {ndx_test_in(a), {NULL, NULL}};
  f = (ndx_future_t*)&f;
  expect_error(ndx_invoke(ctx, "add", two, 2, NULL, NULL, &f), NDX_ERROR_VALUE,
               "inputs[1] has neither a tensor nor a batch");
  CHECK(f == NULL, "no future for an empty input entry");
  const int64_t n1 = 1;
  const int32_t one = 1;
  DLManagedTensorVersioned* m =
      ndx_test_versioned(NULL, NDX_TEST_DL_I32, 1, &n1, NULL, &one, sizeof one);
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(&m, 1, NULL, &b));
  two[1].tensor = a;
  two[1].batch = b;
  expect_error(ndx_invoke(ctx, "add", two, 2, NULL, NULL, &f), NDX_ERROR_VALUE,
               "inputs[1] has both a tensor and a batch; set exactly one");
  CHECK(f == NULL, "no future for an input entry with both");
  ndx_batch_release(b);
  CHECK_OK(ndx_register_op(ctx, "mine", &schema, k_copy, NULL, NULL));
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- on_ready ------------------------------------------------------------------------------------ */

static ndx_future_t* g_block_on; /* a pending future a callback must not wait on */
static const ndx_context_t* g_eval_ctx;
static int g_wait_kind, g_eval_kind, g_wait_fired;

static void cb_try_to_block(void* user, const ndx_future_t* f) {
  (void)user;
  (void)f;
  ndx_error_t* e = ndx_future_wait(g_block_on, -1);
  g_wait_kind = ndx_error_kind(e);
  ndx_error_free(e);
  e = ndx_context_evaluate(g_eval_ctx);
  g_eval_kind = ndx_error_kind(e);
  ndx_error_free(e);
  inc_int(&g_wait_fired);
}

static NDX_TEST_NOINLINE void test_on_ready(void) {
  NDX_TEST_CONTEXT("on_ready");
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* bz = t_i32(kBZero);
  ndx_input_t in1[1] = {ndx_test_in(a)};
  ndx_input_t in2[2] = {ndx_test_in(a), ndx_test_in(a)};
  ndx_input_t bad[2] = {ndx_test_in(a), ndx_test_in(bz)};

  /* SYNC: complete on return, so the callback runs at once, on this thread. */
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL);
    ndx_future_t *ok = NULL, *ko = NULL;
    cb_state c1, c2;
    memset(&c1, 0, sizeof c1);
    memset(&c2, 0, sizeof c2);
    CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &ok));
    CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &ko));
    CHECK_OK(ndx_future_on_ready(ok, cb_record, &c1, cb_free));
    CHECK_OK(ndx_future_on_ready(ko, cb_record, &c2, cb_free));
    CHECK(load_int(&c1.fired) == 1 && c1.on_main && c1.status == NDX_FUTURE_READY,
          "READY: fired %d on_main %d status %d", load_int(&c1.fired), c1.on_main, c1.status);
    CHECK(load_int(&c2.fired) == 1 && c2.on_main && c2.status == NDX_FUTURE_FAILED,
          "FAILED: fired %d on_main %d status %d", load_int(&c2.fired), c2.on_main, c2.status);
    CHECK(load_int(&c1.freed) == 1 && load_int(&c2.freed) == 1, "user_free once each");
    expect_error(ndx_future_on_ready(ok, NULL, NULL, NULL), NDX_ERROR_VALUE, "callback");
    expect_error(ndx_future_on_ready(NULL, cb_record, &c1, NULL), NDX_ERROR_VALUE, "future");
    CHECK(load_int(&c1.fired) == 1, "failed registrations call nothing");
    ndx_future_release(ok);
    ndx_future_release(ko);
    check_evaluate_clean(ctx);
    ndx_context_release(ctx);
  }

  /* EAGER behind a gate: registered before completion (one future released before it
   * completes), after completion; each fires exactly once, on a worker or at once. */
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
    gate_t gate;
    gate_init(&gate);
    register_op(ctx, "gate", k_gate, &gate);
    ndx_future_t *f = NULL, *g = NULL;
    cb_state before, released, after;
    memset(&before, 0, sizeof before);
    memset(&released, 0, sizeof released);
    memset(&after, 0, sizeof after);
    CHECK_OK(ndx_invoke(ctx, "gate", in1, 1, NULL, NULL, &f));
    CHECK_OK(ndx_invoke(ctx, "gate", in1, 1, NULL, NULL, &g));
    if (f && g) {
      CHECK_OK(ndx_future_on_ready(f, cb_record, &before, cb_free));
      CHECK_OK(ndx_future_on_ready(g, cb_record, &released, cb_free));
      ndx_future_release(g); /* before completion: the work and the callback go on */
      g = NULL;
      CHECK(ndx_future_poll(f) == NDX_FUTURE_PENDING, "the gate holds it");
      CHECK(load_int(&before.fired) == 0 && load_int(&released.fired) == 0, "not yet");
      gate_open(&gate);
      CHECK_OK(ndx_future_wait(f, 5000 * MS));
      CHECK(spin_until(&before.fired, 1, 5000), "before: fired");
      CHECK(spin_until(&released.fired, 1, 5000), "released: fired");
      CHECK(spin_until(&released.freed, 1, 5000), "released: user_free");
      sleep_ms(20);
      CHECK(load_int(&before.fired) == 1 && load_int(&released.fired) == 1,
            "exactly once: %d %d", load_int(&before.fired), load_int(&released.fired));
      CHECK(load_int(&before.freed) == 1 && load_int(&released.freed) == 1,
            "user_free once: %d %d", load_int(&before.freed), load_int(&released.freed));
      CHECK(!before.on_main && !released.on_main, "on a worker thread");
      CHECK(before.status == NDX_FUTURE_READY && released.status == NDX_FUTURE_READY,
            "the callback sees READY");
      CHECK_OK(ndx_future_on_ready(f, cb_record, &after, cb_free));
      CHECK(load_int(&after.fired) == 1 && after.on_main, "after completion: at once, here");
      CHECK(load_int(&after.freed) == 1, "after: user_free");
      CHECK(gate.timed_out == 0, "the gate opened in time");
    }
    ndx_future_release(f);
    ndx_future_release(g);
    check_evaluate_clean(ctx);
    ndx_context_release(ctx);
    gate_destroy(&gate);
  }

  /* DEFERRED: the callback fires once the work runs (here: forced by a wait). */
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
    ndx_future_t* f = NULL;
    cb_state c;
    memset(&c, 0, sizeof c);
    CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &f));
    if (f) {
      CHECK_OK(ndx_future_on_ready(f, cb_record, &c, cb_free));
      CHECK_OK(ndx_future_wait(f, 5000 * MS));
      CHECK(spin_until(&c.fired, 1, 5000), "fired");
      sleep_ms(10);
      CHECK(load_int(&c.fired) == 1 && load_int(&c.freed) == 1, "once: %d", load_int(&c.fired));
    }
    ndx_future_release(f);
    check_evaluate_clean(ctx);
    ndx_context_release(ctx);
  }

  /* A callback that waits (or evaluates) gets NDX_ERROR_RUNTIME instead of a deadlock. */
  {
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
    gate_t gate;
    gate_init(&gate);
    register_op(ctx, "gate", k_gate, &gate);
    ndx_future_t *blocked = NULL, *f = NULL;
    CHECK_OK(ndx_invoke(ctx, "gate", in1, 1, NULL, NULL, &blocked));
    g_block_on = blocked;
    g_eval_ctx = ctx;
    g_wait_kind = g_eval_kind = 0;
    g_wait_fired = 0;
    CHECK_OK(ndx_invoke(ctx, "add", in2, 2, NULL, NULL, &f));
    if (f && blocked) {
      CHECK_OK(ndx_future_on_ready(f, cb_try_to_block, NULL, NULL));
      CHECK(spin_until(&g_wait_fired, 1, 4000), "the blocking callback returned");
      CHECK(g_wait_kind == NDX_ERROR_RUNTIME, "wait in a callback: kind %d", g_wait_kind);
      CHECK(g_eval_kind == NDX_ERROR_RUNTIME, "evaluate in a callback: kind %d", g_eval_kind);
      CHECK(ndx_future_poll(blocked) == NDX_FUTURE_PENDING, "the gate still holds");
    }
    gate_open(&gate);
    CHECK_OK(ndx_future_wait(blocked, 5000 * MS));
    CHECK(gate.timed_out == 0, "no gate timeout");
    ndx_future_release(f);
    ndx_future_release(blocked);
    g_block_on = NULL;
    check_evaluate_clean(ctx);
    ndx_context_release(ctx);
    gate_destroy(&gate);
  }
  ndx_tensor_release(a);
  ndx_tensor_release(bz);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- backends --------------------------------------------------------------------------------- */

static NDX_TEST_NOINLINE void test_noexcept(int32_t mode) {
  char label[64];
  snprintf(label, sizeof label, "noexcept, %s", mode_name(mode));
  NDX_TEST_CONTEXT(label);
  ndx_context_t* ctx = make_ctx(mode, NDX_CAPTURE_OFF, "noexcept");
  host_state hs;
  memset(&hs, 0, sizeof hs);
  register_op(ctx, "host_fail", host_fail_kernel, &hs);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* bz = t_i32(kBZero);
  ndx_tensor_t* bo = t_i32(kBOk);
  ndx_input_t bad[2] = {ndx_test_in(a), ndx_test_in(bz)};
  ndx_input_t good[2] = {ndx_test_in(a), ndx_test_in(bo)};
  ndx_input_t one[1] = {ndx_test_in(a)};
  ndx_future_t *fd = NULL, *fs = NULL, *fh = NULL, *fok = NULL;
  ndx_tensor_t *td = NULL, *tok = NULL;

  int ld = __LINE__; CHECK_OK(ndx_invoke(ctx, "div", bad, 2, NULL, NULL, &fd));
  if (fd) {
    ndx_error_t* w = ndx_future_wait(fd, -1);
    CHECK_LINK(w, NDX_ERROR_BACKEND, "unexpected error when running div", "div", 1);
    CHECK_STR_EQ(ndx_error_message(w), "unexpected error when running div");
    CHECK_FRAME(w, 0, THIS_FILE, ld, "test_noexcept", NDX_FRAME_NATIVE);
    if (CHECK(ndx_test_chain_length(w) == 2, "backend error -> original: %zu",
              ndx_test_chain_length(w))) {
      const ndx_error_t* c = ndx_error_cause(w);
      CHECK_LINK(c, NDX_ERROR_VALUE, "integer division by zero (output element 1)", "div", 1);
      CHECK_FRAME(c, 0, THIS_FILE, ld, "test_noexcept", NDX_FRAME_NATIVE);
    }
    ndx_error_free(w);
    /* A dependent fails with the wrapped error as its cause. */
    td = ndx_test_output(fd, 0);
    ndx_input_t is[1] = {ndx_test_in(td)};
    if (CHECK_OK(ndx_invoke(ctx, "sum", is, 1, NULL, NULL, &fs))) {
      w = ndx_future_wait(fs, -1);
      CHECK(ndx_error_kind(w) == NDX_ERROR_BACKEND, "dependent: kind %d", ndx_error_kind(w));
      CHECK(ndx_test_str_eq(ndx_error_op(w), "sum"), "dependent op");
      int saw_wrapper = 0;
      for (const ndx_error_t* l = w; l; l = ndx_error_cause(l)) {
        saw_wrapper |= ndx_test_str_eq(ndx_error_message(l), "unexpected error when running div");
      }
      CHECK(saw_wrapper, "the chain holds div's backend error");
      const ndx_error_t* root = ndx_test_chain_link(w, ndx_test_chain_length(w) - 1);
      CHECK_LINK(root, NDX_ERROR_VALUE, "integer division by zero", "div", 1);
      ndx_error_free(w);
    }
  }
  /* A host operator's error and its own cause, both kept under the backend error. */
  int lh = __LINE__; CHECK_OK(ndx_invoke(ctx, "host_fail", one, 1, NULL, NULL, &fh));
  if (fh) {
    ndx_error_t* w = ndx_future_wait(fh, -1);
    CHECK_LINK(w, NDX_ERROR_BACKEND, "unexpected error when running host_fail", "host_fail", 3);
    CHECK_FRAME(w, 0, THIS_FILE, lh, "test_noexcept", NDX_FRAME_NATIVE);
    if (CHECK(ndx_test_chain_length(w) == 3, "backend -> host failed -> root cause: %zu",
              ndx_test_chain_length(w))) {
      CHECK_LINK(ndx_test_chain_link(w, 1), NDX_ERROR_RUNTIME, "host failed", "host_fail", 3);
      CHECK_LINK(ndx_test_chain_link(w, 2), NDX_ERROR_INDEX, "root cause", NULL, 0);
    }
    ndx_error_free(w);
  }
  /* Call-time errors are not execution failures: not wrapped. */
  {
    ndx_tensor_t* f32 = ndx_test_tensor((const int32_t[4]){1, 2, 3, 4}, NDX_DTYPE_INT32, 1,
                                        (const int64_t[1]){4});
    ndx_input_t mixed[2] = {ndx_test_in(a), ndx_test_in(f32)};
    ndx_future_t* fx = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_invoke(ctx, "add", mixed, 2, NULL, NULL, &fx), NDX_ERROR_VALUE,
                 "cannot be broadcast");
    CHECK(fx == NULL, "out-param cleared");
    ndx_tensor_release(f32);
  }
  /* A per-sample invocation (a batch input) fails like any other: wrapped. */
  {
    int deleted[2] = {0, 0};
    const int64_t n1 = 1;
    const int32_t one = 1, zero = 0;
    DLManagedTensorVersioned* v[2] = {
        ndx_test_versioned(&deleted[0], NDX_TEST_DL_I32, 1, &n1, NULL, &one, sizeof one),
        ndx_test_versioned(&deleted[1], NDX_TEST_DL_I32, 1, &n1, NULL, &one, sizeof one)};
    ndx_batch_t* b = NULL;
    if (CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, NULL, &b))) {
      ndx_tensor_t* z = ndx_test_tensor(&zero, NDX_DTYPE_INT32, 1, &n1);
      ndx_input_t per_sample[2] = {{NULL, b}, ndx_test_in(z)};
      ndx_future_t* fb = NULL;
      if (CHECK_OK(ndx_invoke(ctx, "div", per_sample, 2, NULL, NULL, &fb))) {
        ndx_error_t* w = ndx_future_wait(fb, -1);
        CHECK(ndx_error_kind(w) == NDX_ERROR_BACKEND, "per sample: kind %d", ndx_error_kind(w));
        CHECK_STR_EQ(ndx_error_message(w), "unexpected error when running div");
        const ndx_error_t* c = ndx_error_cause(w);
        CHECK(c && ndx_error_kind(c) == NDX_ERROR_VALUE, "per sample: the original is the cause");
        ndx_error_free(w);
      }
      ndx_future_release(fb);
      ndx_tensor_release(z);
      ndx_batch_release(b);
    } else {
      ndx_test_drop_versioned(v[0]);
      ndx_test_drop_versioned(v[1]);
    }
  }
  /* Success is unaffected. */
  if (CHECK_OK(ndx_invoke(ctx, "div", good, 2, NULL, NULL, &fok))) {
    tok = ndx_test_output(fok, 0);
    check_i32(tok, kAdivBOk, 6);
  }
  check_evaluate_clean(ctx);
  ndx_tensor_release(td);
  ndx_tensor_release(tok);
  ndx_future_release(fd);
  ndx_future_release(fs);
  ndx_future_release(fh);
  ndx_future_release(fok);
  ndx_tensor_release(a);
  ndx_tensor_release(bz);
  ndx_tensor_release(bo);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

static NDX_TEST_NOINLINE void test_accuracy(int32_t mode) {
  char label[64];
  snprintf(label, sizeof label, "inject_accuracy_error, %s", mode_name(mode));
  NDX_TEST_CONTEXT(label);
  ndx_context_t* ctx = make_ctx(mode, NDX_CAPTURE_OFF, "inject_accuracy_error:add");
  const int32_t va[6] = {1, 2, 3, 4, 5, 6};
  const int32_t plus1[6] = {3, 5, 7, 9, 11, 13};  /* a + a + 1 */
  const int32_t square[6] = {1, 4, 9, 16, 25, 36}; /* a * a, untouched */
  const float fa[6] = {0.5f, 1.5f, -2.f, 4.f, 8.f, 16.f};
  const float fplus1[6] = {2.f, 4.f, -3.f, 9.f, 17.f, 33.f};
  ndx_tensor_t* a = t_i32(va);
  ndx_tensor_t* f = ndx_test_tensor(fa, NDX_DTYPE_FLOAT32, 2, kShape23);
  ndx_input_t ii[2] = {ndx_test_in(a), ndx_test_in(a)};
  ndx_input_t ff[2] = {ndx_test_in(f), ndx_test_in(f)};
  ndx_future_t *f1 = NULL, *f2 = NULL, *f3 = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "add", ii, 2, NULL, NULL, &f1))) {
    ndx_tensor_t* t = ndx_test_output(f1, 0);
    check_meta(t, NDX_DTYPE_INT32, 2, kShape23);
    check_i32(t, plus1, 6);
    ndx_tensor_release(t);
    CHECK(ndx_future_poll(f1) == NDX_FUTURE_READY, "silently: READY");
  }
  if (CHECK_OK(ndx_invoke(ctx, "mul", ii, 2, NULL, NULL, &f2))) {
    ndx_tensor_t* t = ndx_test_output(f2, 0);
    check_i32(t, square, 6);
    ndx_tensor_release(t);
  }
  if (CHECK_OK(ndx_invoke(ctx, "add", ff, 2, NULL, NULL, &f3))) {
    ndx_tensor_t* t = ndx_test_output(f3, 0);
    check_f32(t, fplus1, 6);
    ndx_tensor_release(t);
  }
  check_evaluate_clean(ctx);
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_future_release(f3);
  ndx_tensor_release(a);
  ndx_tensor_release(f);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

/* ---- EAGER runs on workers, never inline -------------------------------------------------- */

/* ---- the capture depth is bounded ---------------------------------------------------------- */

static size_t depth_probe_capacity;
static size_t depth_probe(void* user, ndx_host_frame_t* frames, size_t capacity) {
  (void)user;
  depth_probe_capacity = capacity;
  if (capacity == 0) return 0;
  frames[0].function = "py_fn";
  frames[0].file = "x.py";
  frames[0].line = 3;
  return 1;
}

/* Enums from C are validated, never trusted: an eval mode or a capture policy outside its
 * enum is NDX_ERROR_VALUE naming the argument, the value and the range, in the setters
 * (which change nothing) and in the context options (no context is made). A NULL future
 * polls FAILED and its error names it; a NULL string value is refused. */
static void test_unknown_modes_and_policies(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_NATIVE, NULL);
  const int32_t bad[3] = {0, 5, -1};
  char want[160];
  for (int k = 0; k < 3; k++) {
    snprintf(want, sizeof want,
             "argument 'mode' is %d, not an ndx_eval_mode_t value (expected 1 to 4)",
             (int)bad[k]);
    expect_error(ndx_context_set_eval_mode(ctx, bad[k]), NDX_ERROR_VALUE, want);
    snprintf(want, sizeof want,
             "argument 'policy' is %d, not an ndx_capture_policy_t value (expected 1 to 4)",
             (int)bad[k]);
    expect_error(ndx_context_set_capture_policy(ctx, bad[k], 0), NDX_ERROR_VALUE, want);
  }
  /* Still SYNC_CPU: the invocation has completed when ndx_invoke returns. */
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", in, 1, NULL, NULL, &f));
  CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "the refused setters left SYNC_CPU");
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);

  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = 9;
  ndx_context_t* made = (ndx_context_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_context_new(&o, &made), NDX_ERROR_VALUE,
               "opts->eval_mode is 9, not an ndx_eval_mode_t value (expected 1 to 4)");
  CHECK(made == NULL, "no context for an unknown eval mode");
  o.eval_mode = 0;
  o.capture_policy = -2;
  made = (ndx_context_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_context_new(&o, &made), NDX_ERROR_VALUE,
               "opts->capture_policy is -2, not an ndx_capture_policy_t value (expected 1 to 4)");
  CHECK(made == NULL, "no context for an unknown capture policy");

  CHECK(ndx_future_poll(NULL) == NDX_FUTURE_FAILED, "a NULL future polls FAILED");
  expect_error(ndx_future_error(NULL), NDX_ERROR_VALUE, "argument 'future' is NULL");
  ndx_args_t* args = NULL;
  CHECK_OK(ndx_args_new(&args));
  expect_error(ndx_args_set_string(args, "s", NULL), NDX_ERROR_VALUE,
               "argument 'value' is NULL");
  ndx_args_free(args);
}

/* A depth above NDX_MAX_CAPTURE_DEPTH is refused (it once made ndx allocate the depth up
 * front and abort the process); the maximum works in every policy. */
static NDX_TEST_NOINLINE void test_capture_depth_limit(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_HOST, NULL);
  CHECK_OK(ndx_context_set_frame_provider(ctx, depth_probe, NULL, NULL));
  expect_error(ndx_context_set_capture_policy(ctx, NDX_CAPTURE_HOST, 0xffffffffu), NDX_ERROR_VALUE,
               "argument 'depth' is 4294967295, expected at most 1024 (NDX_MAX_CAPTURE_DEPTH)");
  expect_error(ndx_context_set_capture_policy(ctx, NDX_CAPTURE_NATIVE, NDX_MAX_CAPTURE_DEPTH + 1),
               NDX_ERROR_VALUE, "argument 'depth' is 1025, expected at most 1024");
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
  const int32_t policies[3] = {NDX_CAPTURE_HOST, NDX_CAPTURE_NATIVE, NDX_CAPTURE_ALL};
  for (int p = 0; p < 3; p++) {
    /* The refused calls changed nothing: the default depth first, then the maximum. */
    if (p > 0) CHECK_OK(ndx_context_set_capture_policy(ctx, policies[p], NDX_MAX_CAPTURE_DEPTH));
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f));
    CHECK_OK(ndx_future_wait(f, -1));
    ndx_future_release(f);
    if (p == 0) {
      CHECK(depth_probe_capacity == 16, "default depth: capacity %zu", depth_probe_capacity);
    }
  }
  CHECK(depth_probe_capacity == NDX_MAX_CAPTURE_DEPTH, "capacity %zu", depth_probe_capacity);
  ndx_tensor_release(a);
  ndx_context_release(ctx);

  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.capture_depth = 0xffffffffu;
  ndx_context_t* bad = (ndx_context_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_context_new(&o, &bad), NDX_ERROR_VALUE,
               "opts->capture_depth is 4294967295, expected at most 1024 (NDX_MAX_CAPTURE_DEPTH)");
  CHECK(bad == NULL, "the context out-param is NULL after an error");
}

/* A provider that returns more frames than it had room for (an error code, say) gives
 * the invocation no host frames rather than `capacity` blank ones. */
static size_t overcounting(void* user, ndx_host_frame_t* frames, size_t capacity) {
  (void)user;
  if (capacity > 0) {
    frames[0].function = "py_fn";
    frames[0].file = "x.py";
    frames[0].line = 3;
  }
  return (size_t)-1;
}

static NDX_TEST_NOINLINE void test_provider_overcount(void) {
  NDX_TEST_CONTEXT("a provider returning more than its capacity");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_ALL, "inject_runtime_error:add");
  CHECK_OK(ndx_context_set_frame_provider(ctx, overcounting, NULL, NULL));
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
  ndx_future_t* f = NULL;
  int line = __LINE__ + 1;
  CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  CHECK(e != NULL, "the injected failure");
  if (e != NULL) {
    CHECK_FRAME(e, 0, THIS_FILE, line, "test_provider_overcount", NDX_FRAME_NATIVE);
    for (size_t i = 0; i < ndx_error_frame_count(e); i++) {
      ndx_frame_t fr;
      memset(&fr, 0, sizeof fr);
      fr.struct_size = sizeof fr;
      CHECK_OK(ndx_error_frame(e, i, &fr));
      CHECK(fr.origin != NDX_FRAME_HOST, "frame %zu is a host frame (%s)", i,
            NDX_TEST_S(fr.function));
    }
  }
  ndx_error_free(e);
  ndx_future_release(f);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

static NDX_TEST_NOINLINE void test_eager_on_worker(void) {
  NDX_TEST_CONTEXT("EAGER on workers");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, NULL);
  host_state s;
  memset(&s, 0, sizeof s);
  register_op(ctx, "whereami", k_copy, &s);
  gate_t gate;
  gate_init(&gate);
  register_op(ctx, "gate", k_gate, &gate);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[1] = {ndx_test_in(a)};

  int inline_runs = 0;
  for (int i = 0; i < 8; i++) {
    ndx_future_t* f = NULL;
    if (!CHECK_OK(ndx_invoke(ctx, "whereami", in, 1, NULL, NULL, &f))) break;
    CHECK_OK(ndx_future_wait(f, 5000 * MS));
    if (pthread_equal(s.thread, main_thread)) inline_runs++;
    ndx_future_release(f);
  }
  CHECK(inline_runs == 0, "EAGER work ran on the calling thread %d times of 8", inline_runs);
  CHECK(load_int(&s.calls) == 8, "8 runs: %d", load_int(&s.calls));

  /* ndx_invoke returns while the work is blocked on a gate only this thread opens: had it
   * run inline, it would have waited for the gate's 5 s timeout. */
  ndx_future_t* g = NULL;
  double t0 = now_ms();
  if (CHECK_OK(ndx_invoke(ctx, "gate", in, 1, NULL, NULL, &g))) {
    double dt = now_ms() - t0;
    CHECK(gate.timed_out == 0 && dt < 4000.0, "ndx_invoke returned at once (%.1f ms)", dt);
    CHECK(ndx_future_poll(g) == NDX_FUTURE_PENDING, "pending behind the gate");
    gate_open(&gate);
    CHECK_OK(ndx_future_wait(g, 5000 * MS));
    CHECK(!pthread_equal(gate.thread, main_thread), "the gate ran on a worker");
    CHECK(gate.timed_out == 0, "opened by this thread, after ndx_invoke returned");
  }
  ndx_future_release(g);

  /* SYNC work, by contrast, runs on the calling thread. */
  ndx_invoke_options_t sync = mode_opts(NDX_EVAL_SYNC_CPU);
  ndx_future_t* f = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "whereami", in, 1, NULL, &sync, &f))) {
    CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "SYNC: READY on return");
    CHECK(pthread_equal(s.thread, main_thread), "SYNC: on the calling thread");
  }
  ndx_future_release(f);
  check_evaluate_clean(ctx);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
  gate_destroy(&gate);
  NDX_TEST_CONTEXT(NULL);
}

/* Runs one test with its name as the watchdog's phase. */
/* A failure passed down a DEFERRED chain of 5000 invocations, each holding the one
 * whose failure failed it, released on a thread with a 256 KiB stack: letting go of the
 * chain used to recurse once per link and overflow the stack (a crash). The error read
 * at the end has the whole chain; its traceback prints both ends only. */
typedef struct {
  int chain_ok, text_ok;
} chain_result_t;

static void* failed_chain_main(void* arg) {
  chain_result_t* r = (chain_result_t*)arg;
  enum { LINKS = 5000 };
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, "inject_runtime_error:sub");
  static const int32_t v[6] = {1, 2, 3, 4, 5, 6};
  ndx_tensor_t* x = t_i32(v);
  ndx_input_t in[2] = {ndx_test_in(x), ndx_test_in(x)};
  ndx_future_t* f = NULL;
  if (ndx_invoke(ctx, "sub", in, 2, NULL, NULL, &f) != NULL) return NULL;
  for (int i = 0; i < LINKS; i++) {
    ndx_tensor_t* prev = ndx_test_output(f, 0);
    ndx_future_release(f);
    f = NULL;
    ndx_input_t chain[2] = {ndx_test_in(prev), ndx_test_in(x)};
    ndx_error_t* e = ndx_invoke(ctx, "add", chain, 2, NULL, NULL, &f);
    ndx_tensor_release(prev);
    if (e != NULL) {
      ndx_error_free(e);
      ndx_context_release(ctx);
      ndx_tensor_release(x);
      return NULL;
    }
  }
  ndx_error_t* e = ndx_future_wait(f, -1);
  r->chain_ok = e && ndx_test_chain_length(e) == LINKS + 1 &&
                ndx_error_kind(e) == NDX_ERROR_RUNTIME;
  size_t n = ndx_error_format(e, NULL, 0);
  r->text_ok = n < 64 * 1024;
  ndx_error_free(e);
  ndx_future_release(f);
  ndx_context_release(ctx);
  ndx_tensor_release(x);
  return NULL;
}

static NDX_TEST_NOINLINE void test_failed_chain_release(void) {
  chain_result_t r = {0, 0};
  if (!ndx_test_run_on_small_stack(failed_chain_main, &r, 256 * 1024)) return;
  CHECK(r.chain_ok, "the error waited on has the whole chain");
  CHECK(r.text_ok, "its traceback is short");
}

/* ndx_context_evaluate after 20 unobserved failures: one error with 20 related errors,
 * whose traceback prints the first 15 and counts the other 5, as Python prints a wide
 * exception group. */
static NDX_TEST_NOINLINE void test_wide_group_format(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, NDX_CAPTURE_OFF, "inject_runtime_error:add");
  static const int32_t v[6] = {1, 2, 3, 4, 5, 6};
  ndx_tensor_t* x = t_i32(v);
  ndx_input_t in[2] = {ndx_test_in(x), ndx_test_in(x)};
  for (int i = 0; i < 20; i++) {
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f));
    ndx_future_release(f);
  }
  ndx_error_t* e = ndx_context_evaluate(ctx);
  if (CHECK(e != NULL, "evaluate reports the failures")) {
    CHECK(ndx_error_related_count(e) == 20, "%zu related", ndx_error_related_count(e));
    size_t n = ndx_error_format(e, NULL, 0);
    char* text = (char*)malloc(n + 1);
    if (text) {
      ndx_error_format(e, text, n + 1);
      CHECK_CONTAINS(text, "+---------------- 15 of 20 ----------------");
      CHECK(!ndx_test_contains(text, "16 of 20"), "the 16th is not printed");
      CHECK_CONTAINS(text, "| and 5 more exceptions (ndx_error_related reads them all)");
      free(text);
    }
  }
  ndx_error_free(e);
  ndx_context_release(ctx);
  ndx_tensor_release(x);
}

/* A loop driven by callbacks in SYNC_CPU: each step's callback invokes the next step and
 * registers itself on it. The next step is complete before its callback is registered, so
 * that callback runs on this thread once the running one returns, never inside it: 20,000
 * steps on a 256 KiB thread stay one callback deep (nested, they overflowed the stack). */
typedef struct {
  ndx_context_t* ctx;
  ndx_tensor_t* x;
  int left, ran, depth, deepest, failed_calls;
} loop_state_t;

static void loop_step(loop_state_t* s);

static void loop_cb(void* user, const ndx_future_t* f) {
  loop_state_t* s = (loop_state_t*)user;
  (void)f;
  s->depth++;
  if (s->depth > s->deepest) s->deepest = s->depth;
  s->ran++;
  if (--s->left > 0) loop_step(s);
  s->depth--;
}

static void loop_step(loop_state_t* s) {
  ndx_input_t in[2] = {ndx_test_in(s->x), ndx_test_in(s->x)};
  ndx_future_t* f = NULL;
  ndx_error_t* e = ndx_invoke(s->ctx, "add", in, 2, NULL, NULL, &f);
  if (e == NULL) e = ndx_future_on_ready(f, loop_cb, s, NULL);
  if (e != NULL) {
    s->failed_calls++;
    ndx_error_free(e);
  }
  ndx_future_release(f);
}

static void* callback_loop_main(void* arg) {
  loop_step((loop_state_t*)arg);
  return NULL;
}

static NDX_TEST_NOINLINE void test_callback_loop_runs_flat(void) {
  static const int32_t v[6] = {1, 2, 3, 4, 5, 6};
  loop_state_t s = {make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL), t_i32(v), 20000, 0, 0, 0, 0};
  if (ndx_test_run_on_small_stack(callback_loop_main, &s, 256 * 1024)) {
    CHECK(s.ran == 20000, "%d steps ran", s.ran);
    CHECK(s.deepest == 1, "callbacks nested %d deep", s.deepest);
    CHECK(s.failed_calls == 0, "%d calls failed", s.failed_calls);
  }
  ndx_context_release(s.ctx);
  ndx_tensor_release(s.x);
}

/* ---- host kernels whose outputs break the contract ------------------------------------ */

/* Returns its input as output 0 without ndx_tensor_retain. */
static ndx_error_t* k_unretained(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                 const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)n_inputs; (void)args; (void)n_outputs;
  outputs[0] = (ndx_tensor_t*)inputs[0];
  return NULL;
}

/* Puts one new tensor (one reference) in both output slots. */
static ndx_error_t* k_two_slots(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)n_inputs; (void)args; (void)n_outputs;
  ndx_tensor_t* t = NULL;
  ndx_error_t* e = copy_tensor(inputs[0], &t);
  outputs[0] = t;
  outputs[1] = t;
  return e;
}

/* Returns the pending output of a DEFERRED 'neg' it invokes on its context (`user`). */
static ndx_error_t* k_pending_out(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                  const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)n_inputs; (void)args; (void)n_outputs;
  ndx_input_t in = ndx_test_in(inputs[0]);
  ndx_invoke_options_t o = mode_opts(NDX_EVAL_DEFERRED);
  ndx_future_t* f = NULL;
  ndx_error_t* e = ndx_invoke((ndx_context_t*)user, "neg", &in, 1, NULL, &o, &f);
  if (e) return e;
  e = ndx_future_tensor(f, 0, &outputs[0]);
  ndx_future_release(f);
  return e;
}

/* Outputs short of references (an input returned unretained was freed under its output:
 * a use after free; one tensor in two slots with one reference was freed twice) and a
 * pending output (which read as a refused wait) fail the invocation with an error saying
 * so, in every mode; the caller's input is intact. */
static NDX_TEST_NOINLINE void test_host_outputs_break_the_contract(void) {
  for (int m = 0; m < 4; m++) {
    NDX_TEST_CONTEXT(mode_name(kModes[m]));
    ndx_context_t* ctx = make_ctx(kModes[m], NDX_CAPTURE_OFF, NULL);
    ndx_op_schema_t s = ndx_test_schema(1, 1);
    CHECK_OK(ndx_register_op(ctx, "unretained", &s, k_unretained, NULL, NULL));
    CHECK_OK(ndx_register_op(ctx, "pending", &s, k_pending_out, ctx, NULL));
    s.n_outputs = 2;
    CHECK_OK(ndx_register_op(ctx, "two_slots", &s, k_two_slots, NULL, NULL));
    static const char* const ops[3] = {"unretained", "two_slots", "pending"};
    static const char* const expected[3] = {
        "host operator 'unretained' returned inputs[0] as outputs[0] without a reference of its "
        "own (call ndx_tensor_retain on an input it returns)",
        "host operator 'two_slots' put one tensor in outputs[0], outputs[1] with 1 reference for "
        "them",
        "host operator 'pending' returned as outputs[0] the output of 'neg' (#"};
    ndx_tensor_t* a = t_i32(kA);
    ndx_input_t in = ndx_test_in(a);
    for (int k = 0; k < 3; k++) {
      ndx_future_t* f = NULL;
      if (!CHECK_OK(ndx_invoke(ctx, ops[k], &in, 1, NULL, NULL, &f))) continue;
      expect_error(ndx_future_wait(f, -1), NDX_ERROR_BACKEND, expected[k]);
      ndx_future_release(f);
    }
    check_i32(a, kA, 6);
    ndx_tensor_release(a);
    CHECK_OK(ndx_context_evaluate(ctx)); /* the DEFERRED 'neg's, never asked for */
    ndx_context_release(ctx);
    NDX_TEST_CONTEXT(NULL);
  }
}

/* A host kernel returning a float32 [1] on its first call and an int32 [1] after. */
static ndx_error_t* k_float_then_int(void* user, const ndx_tensor_t* const* inputs,
                                     size_t n_inputs, const ndx_args_t* args,
                                     ndx_tensor_t** outputs, size_t n_outputs) {
  (void)inputs; (void)n_inputs; (void)args; (void)n_outputs;
  const int64_t one = 1;
  if (__atomic_fetch_add((int*)user, 1, __ATOMIC_SEQ_CST) == 0) {
    const float f = 1;
    return ndx_tensor_from_host(&f, NDX_DTYPE_FLOAT32, 1, &one, NULL, NULL, &outputs[0]);
  }
  const int32_t k = 7;
  return ndx_tensor_from_host(&k, NDX_DTYPE_INT32, 1, &one, NULL, NULL, &outputs[0]);
}

/* A batch of `n` (at most 8) one-element float32 samples imported through DLPack, each
 * lent from values[k] and counting its deleter's calls in counters[k]. */
static ndx_batch_t* f32_scalar_batch(const float* values, int* counters, int n) {
  const int64_t one = 1;
  DLManagedTensorVersioned* samples[8];
  for (int k = 0; k < n && k < 8; k++) {
    samples[k] = ndx_test_versioned(&counters[k], ndx_test_dl_dtype(kDLFloat, 32, 1), 1, &one,
                                    NULL, &values[k], sizeof values[k]);
  }
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(samples, (size_t)(n < 8 ? n : 8), NULL, &b));
  return b;
}

/* Per-sample runs of a host operator whose outputs differ in dtype fail with an error
 * naming the runs' output (it read like a complaint about the input batch). */
static NDX_TEST_NOINLINE void test_per_sample_outputs_make_no_batch(void) {
  for (int m = 0; m < 4; m++) {
    NDX_TEST_CONTEXT(mode_name(kModes[m]));
    ndx_context_t* ctx = make_ctx(kModes[m], NDX_CAPTURE_OFF, NULL);
    int calls = 0;
    ndx_op_schema_t s = ndx_test_schema(1, 1);
    CHECK_OK(ndx_register_op(ctx, "mixed", &s, k_float_then_int, &calls, NULL));
    int counters[2] = {0, 0};
    const float values[2] = {1, 2};
    ndx_batch_t* b = f32_scalar_batch(values, counters, 2);
    ndx_input_t in = {NULL, b};
    ndx_future_t* f = NULL;
    if (CHECK_OK(ndx_invoke(ctx, "mixed", &in, 1, NULL, NULL, &f))) {
      expect_error(ndx_future_wait(f, -1), NDX_ERROR_VALUE,
                   "output 0 of the per-sample runs makes no batch: samples[1]: dtype is int32, "
                   "expected float32 like samples[0]");
    }
    ndx_future_release(f);
    ndx_batch_release(b);
    ndx_context_release(ctx);
    NDX_TEST_CONTEXT(NULL);
  }
}

/* A host kernel failing with "negative input" on a negative float32 [1], else copying it. */
static ndx_error_t* k_fail_on_negative(void* user, const ndx_tensor_t* const* inputs,
                                       size_t n_inputs, const ndx_args_t* args,
                                       ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)n_inputs; (void)args; (void)n_outputs;
  float v = 0;
  ndx_error_t* e = ndx_tensor_copy_to(inputs[0], &v, sizeof v);
  if (e) return e;
  if (v < 0) return ndx_error_new(NDX_ERROR_VALUE, "negative input", NULL);
  return copy_tensor(inputs[0], &outputs[0]);
}

/* The failure of one run of a per-sample invocation names its sample (ndx_error_sample,
 * the traceback), in every mode and under noexcept; the message stays the kernel's.
 * Before, nothing said which of the batch's samples had failed. */
static NDX_TEST_NOINLINE void test_per_sample_failure_names_its_sample(void) {
  for (int noexcept_backend = 0; noexcept_backend < 2; noexcept_backend++) {
    for (int m = 0; m < 4; m++) {
      NDX_TEST_CONTEXT(mode_name(kModes[m]));
      ndx_context_t* ctx = make_ctx(kModes[m], NDX_CAPTURE_OFF, NULL);
      if (noexcept_backend) CHECK_OK(ndx_context_set_backend(ctx, "noexcept"));
      register_op(ctx, "nonneg", k_fail_on_negative, NULL);
      int counters[5] = {0};
      const float values[5] = {1, 2, 3, -4, -5};
      ndx_batch_t* b = f32_scalar_batch(values, counters, 5);
      const int64_t one = 1;
      ndx_input_t in = {NULL, b};
      ndx_future_t* f = NULL;
      if (CHECK_OK(ndx_invoke(ctx, "nonneg", &in, 1, NULL, NULL, &f))) {
        ndx_error_t* e = ndx_future_wait(f, -1);
        if (CHECK(e != NULL, "the invocation failed")) {
          const ndx_error_t* kernel_error = e;
          if (noexcept_backend) {
            CHECK(ndx_error_kind(e) == NDX_ERROR_BACKEND, "a BACKEND error");
            CHECK(ndx_error_sample(e) == 3, "the BACKEND error names sample 3, got %lld",
                  (long long)ndx_error_sample(e));
            kernel_error = ndx_error_cause(e);
          }
          CHECK_STR_EQ(ndx_error_message(kernel_error), "negative input");
          CHECK(ndx_error_sample(kernel_error) == 3, "sample 3, got %lld",
                (long long)ndx_error_sample(kernel_error));
          char text[4096];
          ndx_error_format(e, text, sizeof text);
          CHECK_CONTAINS(text, "of operator 'nonneg', batch sample 3\n");
          ndx_error_free(e);
        }
      }
      ndx_future_release(f);
      /* A tensor invocation's failure has no sample. */
      const float neg = -1;
      ndx_tensor_t* t = ndx_test_tensor(&neg, NDX_DTYPE_FLOAT32, 1, &one);
      in = ndx_test_in(t);
      if (CHECK_OK(ndx_invoke(ctx, "nonneg", &in, 1, NULL, NULL, &f))) {
        ndx_error_t* e = ndx_future_wait(f, -1);
        CHECK(e != NULL && ndx_error_sample(e) == -1, "no sample for a tensor invocation");
        ndx_error_free(e);
      }
      ndx_future_release(f);
      ndx_tensor_release(t);
      ndx_batch_release(b);
      ndx_context_release(ctx);
      for (int k = 0; k < 5; k++) CHECK(counters[k] == 1, "sample %d deleted once", k);
      NDX_TEST_CONTEXT(NULL);
    }
  }
  CHECK(ndx_error_sample(NULL) == -1, "NULL has no sample");
}

/* A built-in operator on the output of a host operator that failed: inferring the
 * built-in's outputs runs the host operator (it infers none), and its failure fails the
 * built-in in its future with the host operator's error as cause, in every mode, for a
 * tensor and a batch alike. It came out of ndx_invoke as a call-time error of the
 * built-in ("operator 'neg': negative input", no cause). */
static NDX_TEST_NOINLINE void test_failed_host_output_fails_a_builtin_in_its_future(void) {
  for (int batch = 0; batch < 2; batch++) {
    for (int m = 0; m < 4; m++) {
      NDX_TEST_CONTEXT(mode_name(kModes[m]));
      ndx_context_t* ctx = make_ctx(kModes[m], NDX_CAPTURE_OFF, NULL);
      register_op(ctx, "nonneg", k_fail_on_negative, NULL);
      int counters[2] = {0};
      const float values[2] = {1, -2};
      ndx_batch_t* b = f32_scalar_batch(values, counters, 2);
      const int64_t one = 1;
      ndx_tensor_t* t = ndx_test_tensor(&values[1], NDX_DTYPE_FLOAT32, 1, &one);
      ndx_input_t in = batch ? (ndx_input_t){NULL, b} : ndx_test_in(t);
      ndx_future_t *f = NULL, *g = NULL;
      ndx_tensor_t* out_t = NULL;
      ndx_batch_t* out_b = NULL;
      if (CHECK_OK(ndx_invoke(ctx, "nonneg", &in, 1, NULL, NULL, &f))) {
        if (batch) {
          CHECK_OK(ndx_future_batch(f, 0, &out_b));
          in = (ndx_input_t){NULL, out_b};
        } else {
          CHECK_OK(ndx_future_tensor(f, 0, &out_t));
          in = ndx_test_in(out_t);
        }
        ndx_error_t* e = ndx_invoke(ctx, "neg", &in, 1, NULL, NULL, &g);
        if (CHECK(e == NULL, "the upstream's failure came out of ndx_invoke: %s",
                  NDX_TEST_S(ndx_error_message(e)))) {
          ndx_error_t* w = ndx_future_wait(g, -1);
          CHECK_LINK(w, NDX_ERROR_VALUE,
                     "input 0 of 'neg' (#2) failed: it is the output of 'nonneg' (#1), which failed",
                     "neg", 2);
          const ndx_error_t* c = ndx_error_cause(w);
          CHECK_LINK(c, NDX_ERROR_VALUE, "negative input", "nonneg", 1);
          CHECK(ndx_error_sample(c) == (batch ? 1 : -1), "the cause's sample: %lld",
                (long long)ndx_error_sample(c));
          ndx_error_free(w);
        } else {
          ndx_error_free(e);
        }
        /* Past the last output: counted in good English (it said "has 1 outputs"). */
        ndx_batch_t* none = (ndx_batch_t*)&in;
        ndx_tensor_t* none_t = (ndx_tensor_t*)&in;
        const char* want = "output index 1 is out of range: 'nonneg' has 1 output";
        ndx_error_t* oob = batch ? ndx_future_batch(f, 1, &none) : ndx_future_tensor(f, 1, &none_t);
        CHECK(oob && ndx_error_kind(oob) == NDX_ERROR_INDEX &&
                  ndx_test_str_eq(ndx_error_message(oob), want),
              "got %s", NDX_TEST_S(ndx_error_message(oob)));
        CHECK(batch ? none == NULL : none_t == NULL, "out reset");
        ndx_error_free(oob);
      }
      ndx_future_release(g);
      ndx_future_release(f);
      ndx_tensor_release(out_t);
      ndx_batch_release(out_b);
      ndx_tensor_release(t);
      ndx_batch_release(b);
      ndx_context_release(ctx);
      CHECK(counters[0] == 1 && counters[1] == 1, "samples deleted once");
      NDX_TEST_CONTEXT(NULL);
    }
  }
}

/* A per-sample host operator's pending batch output knows its size without running
 * (as many samples as its input batch), and a host operator chained on it does not run
 * it at ndx_invoke (DEFERRED), as for tensors. Both ran the upstream host operator:
 * ndx_batch_size asked its data for the count. */
static NDX_TEST_NOINLINE void test_host_batch_output_size_needs_no_run(void) {
  NDX_TEST_CONTEXT("host operator batch output, DEFERRED");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  host_state s1, s2;
  memset(&s1, 0, sizeof s1);
  memset(&s2, 0, sizeof s2);
  register_op(ctx, "first", k_copy, &s1);
  register_op(ctx, "second", k_copy, &s2);
  int counters[3] = {0, 0, 0};
  const float values[3] = {1, 2, 3};
  ndx_batch_t* b = f32_scalar_batch(values, counters, 3);
  ndx_input_t in = {NULL, b};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  ndx_batch_t *b1 = NULL, *b2 = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "first", &in, 1, NULL, NULL, &f1)) &&
      CHECK_OK(ndx_future_batch(f1, 0, &b1))) {
    size_t n = 0;
    CHECK_OK(ndx_batch_size(b1, &n));
    CHECK(n == 3, "3 samples, got %zu", n);
    CHECK(load_int(&s1.started) == 0, "ndx_batch_size ran 'first' (%d runs)",
          load_int(&s1.started));
    ndx_input_t in2 = {NULL, b1};
    if (CHECK_OK(ndx_invoke(ctx, "second", &in2, 1, NULL, NULL, &f2))) {
      CHECK(load_int(&s1.started) == 0, "ndx_invoke of 'second' ran 'first' (%d runs)",
            load_int(&s1.started));
      CHECK_OK(ndx_future_wait(f2, -1));
      CHECK_OK(ndx_future_batch(f2, 0, &b2));
      size_t n2 = 0;
      CHECK_OK(ndx_batch_size(b2, &n2));
      CHECK(n2 == 3 && load_int(&s1.calls) == 3 && load_int(&s2.calls) == 3,
            "3 samples each: %zu, %d, %d", n2, load_int(&s1.calls), load_int(&s2.calls));
    }
  }
  check_evaluate_clean(ctx);
  ndx_batch_release(b2);
  ndx_batch_release(b1);
  ndx_future_release(f2);
  ndx_future_release(f1);
  ndx_batch_release(b);
  ndx_context_release(ctx);
  for (int k = 0; k < 3; k++) CHECK(counters[k] == 1, "sample %d deleted once", k);
  NDX_TEST_CONTEXT(NULL);
}

/* What a callback found reading a pending output: a data read's and a dtype query's errors. */
typedef struct {
  const ndx_tensor_t* output;
  char copy_msg[512];
  int copy_kind;
  char dtype_msg[512];
  int dtype_kind;
} pending_read_t;

static void cb_read_pending(void* user, const ndx_future_t* f) {
  pending_read_t* p = (pending_read_t*)user;
  (void)f;
  int32_t buf[6];
  int32_t dtype = 0;
  ndx_error_t* e = ndx_tensor_copy_to(p->output, buf, sizeof buf);
  p->copy_kind = e ? ndx_error_kind(e) : 0;
  snprintf(p->copy_msg, sizeof p->copy_msg, "%s", e ? ndx_error_message(e) : "");
  ndx_error_free(e);
  e = ndx_tensor_dtype(p->output, &dtype);
  p->dtype_kind = e ? ndx_error_kind(e) : 0;
  snprintf(p->dtype_msg, sizeof p->dtype_msg, "%s", e ? ndx_error_message(e) : "");
  ndx_error_free(e);
}

/* What a callback got invoking SYNC_CPU 'abs' on a pending output: the error's kind and
 * message, and whether a future came back. */
typedef struct {
  const ndx_context_t* ctx;
  const ndx_tensor_t* pending;
  int kind, got_future;
  char msg[512];
} sync_in_callback_t;

static void cb_sync_on_pending(void* user, const ndx_future_t* f) {
  sync_in_callback_t* s = (sync_in_callback_t*)user;
  (void)f;
  ndx_input_t in = ndx_test_in(s->pending);
  ndx_invoke_options_t sync = mode_opts(NDX_EVAL_SYNC_CPU);
  ndx_future_t* out = NULL;
  ndx_error_t* e = ndx_invoke(s->ctx, "abs", &in, 1, NULL, &sync, &out);
  s->kind = e ? ndx_error_kind(e) : 0;
  snprintf(s->msg, sizeof s->msg, "%s", e ? ndx_error_message(e) : "");
  s->got_future = out != NULL;
  ndx_error_free(e);
  ndx_future_release(out);
}

/* A read refused inside a callback says what it was (reading data, or metadata only
 * running a host operator tells), not "waiting on invocation", which it never called. A
 * SYNC invocation made there on a still-pending input would wait for it on an ndx
 * worker: ndx_invoke refuses it (RUNTIME, naming both invocations) instead of blocking,
 * and the input still runs when evaluated. */
static NDX_TEST_NOINLINE void test_refused_reads_in_a_callback(void) {
  host_state hs;
  memset(&hs, 0, sizeof hs);
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  register_op(ctx, "host_copy", k_copy, &hs);
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in = ndx_test_in(a);
  ndx_future_t *neg = NULL, *host = NULL, *done = NULL;
  CHECK_OK(ndx_invoke(ctx, "neg", &in, 1, NULL, NULL, &neg));        /* #1, recorded */
  CHECK_OK(ndx_invoke(ctx, "host_copy", &in, 1, NULL, NULL, &host)); /* #2, recorded */
  ndx_invoke_options_t sync = mode_opts(NDX_EVAL_SYNC_CPU);
  CHECK_OK(ndx_invoke(ctx, "neg", &in, 1, NULL, &sync, &done));
  if (neg && host && done) {
    pending_read_t r;
    memset(&r, 0, sizeof r);
    r.output = ndx_test_output(neg, 0);
    CHECK_OK(ndx_future_on_ready(done, cb_read_pending, &r, NULL)); /* runs here and now */
    CHECK(r.copy_kind == NDX_ERROR_RUNTIME &&
              ndx_test_contains(r.copy_msg,
                                "reading the data of an output of invocation #1 ('neg'), which "
                                "has not completed, waits for it; waiting from inside an ndx "
                                "callback"),
          "data read: kind %d: %s", r.copy_kind, r.copy_msg);
    CHECK(r.dtype_kind == 0, "an inferred dtype is answered: %s", r.dtype_msg);
    ndx_tensor_release(r.output);
    memset(&r, 0, sizeof r);
    r.output = ndx_test_output(host, 0);
    CHECK_OK(ndx_future_on_ready(done, cb_read_pending, &r, NULL));
    CHECK(r.dtype_kind == NDX_ERROR_RUNTIME &&
              ndx_test_contains(r.dtype_msg,
                                "the dtype and shape of an output of invocation #2 ('host_copy'), "
                                "a host operator that infers none, are known once it has run; "
                                "waiting for it from inside an ndx callback"),
          "dtype query: kind %d: %s", r.dtype_kind, r.dtype_msg);
    ndx_tensor_release(r.output);
    sync_in_callback_t sy;
    memset(&sy, 0, sizeof sy);
    sy.ctx = ctx;
    sy.pending = ndx_test_output(neg, 0);
    CHECK_OK(ndx_future_on_ready(done, cb_sync_on_pending, &sy, NULL));
    CHECK(sy.kind == NDX_ERROR_RUNTIME &&
              ndx_test_contains(sy.msg,
                                "a SYNC invocation of 'abs' waiting for its input from "
                                "invocation #1 from inside an ndx callback or host operator "
                                "would block an ndx worker"),
          "SYNC invocation: kind %d: %s", sy.kind, sy.msg);
    CHECK(!sy.got_future, "no future for a refused invocation");
    ndx_tensor_release((ndx_tensor_t*)sy.pending);
  }
  CHECK_OK(ndx_context_evaluate(ctx));
  CHECK(ndx_future_poll(neg) == NDX_FUTURE_READY, "the pending input still ran");
  ndx_future_release(neg);
  ndx_future_release(host);
  ndx_future_release(done);
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

/* A host kernel of no inputs: fails unless `inputs` is NULL, else makes an int32 [1]. */
static ndx_error_t* k_no_inputs(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user; (void)args; (void)n_outputs;
  if (n_inputs != 0 || inputs != NULL) {
    return ndx_error_new(NDX_ERROR_VALUE, "inputs is not NULL for no inputs", NULL);
  }
  const int32_t v = 5;
  const int64_t one = 1;
  return ndx_tensor_from_host(&v, NDX_DTYPE_INT32, 1, &one, NULL, NULL, &outputs[0]);
}

/* A host operator of no inputs gets `inputs` NULL (it got a dangling non-NULL pointer). */
static NDX_TEST_NOINLINE void test_host_op_of_no_inputs(void) {
  for (int m = 0; m < 4; m++) {
    NDX_TEST_CONTEXT(mode_name(kModes[m]));
    ndx_context_t* ctx = make_ctx(kModes[m], NDX_CAPTURE_OFF, NULL);
    ndx_op_schema_t s = ndx_test_schema(0, 1);
    CHECK_OK(ndx_register_op(ctx, "source", &s, k_no_inputs, NULL, NULL));
    ndx_future_t* f = NULL;
    if (CHECK_OK(ndx_invoke(ctx, "source", NULL, 0, NULL, NULL, &f))) {
      CHECK_OK(ndx_future_wait(f, -1));
      ndx_tensor_t* t = ndx_test_output(f, 0);
      int32_t v = 0;
      CHECK_OK(ndx_tensor_copy_to(t, &v, sizeof v));
      CHECK(v == 5, "the output: %d", (int)v);
      ndx_tensor_release(t);
    }
    ndx_future_release(f);
    ndx_context_release(ctx);
    NDX_TEST_CONTEXT(NULL);
  }
}

/* What a callback's waits returned: on its own (complete) future, and on a pending one. */
typedef struct {
  const ndx_future_t* pending;
  int own_kind; /* 0: NULL */
  char own_msg[256];
  int pending_kind;
} waits_t;

static void cb_waits(void* user, const ndx_future_t* f) {
  waits_t* w = (waits_t*)user;
  ndx_error_t* e = ndx_future_wait(f, -1);
  w->own_kind = e ? ndx_error_kind(e) : 0;
  snprintf(w->own_msg, sizeof w->own_msg, "%s", e ? ndx_error_message(e) : "");
  ndx_error_free(e);
  e = ndx_future_wait(w->pending, -1);
  w->pending_kind = e ? ndx_error_kind(e) : 0;
  ndx_error_free(e);
}

/* As the header says: inside a callback a wait on a complete future (its own) returns its
 * outcome, and a wait on one not complete returns NDX_ERROR_RUNTIME. */
static NDX_TEST_NOINLINE void test_callback_waits_on_complete_futures(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_DEFERRED, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* a = t_i32(kA);
  ndx_tensor_t* zero = t_i32(kBZero);
  ndx_input_t add_in[2] = {ndx_test_in(a), ndx_test_in(a)};
  ndx_input_t div_in[2] = {ndx_test_in(a), ndx_test_in(zero)};
  ndx_invoke_options_t sync = mode_opts(NDX_EVAL_SYNC_CPU);
  ndx_future_t *pending = NULL, *ready = NULL, *failed = NULL;
  CHECK_OK(ndx_invoke(ctx, "add", add_in, 2, NULL, NULL, &pending));
  CHECK_OK(ndx_invoke(ctx, "add", add_in, 2, NULL, &sync, &ready));
  CHECK_OK(ndx_invoke(ctx, "div", div_in, 2, NULL, &sync, &failed));
  if (pending && ready && failed) {
    waits_t w;
    memset(&w, 0, sizeof w);
    w.pending = pending;
    CHECK_OK(ndx_future_on_ready(ready, cb_waits, &w, NULL)); /* runs here and now */
    CHECK(w.own_kind == 0, "own READY future: %s", w.own_msg);
    CHECK(w.pending_kind == NDX_ERROR_RUNTIME, "pending future: kind %d", w.pending_kind);
    memset(&w, 0, sizeof w);
    w.pending = pending;
    CHECK_OK(ndx_future_on_ready(failed, cb_waits, &w, NULL));
    CHECK(w.own_kind == NDX_ERROR_VALUE && ndx_test_contains(w.own_msg, "division by zero"),
          "own FAILED future: kind %d: %s", w.own_kind, w.own_msg);
    CHECK(w.pending_kind == NDX_ERROR_RUNTIME, "pending future: kind %d", w.pending_kind);
  }
  CHECK_OK(ndx_context_evaluate(ctx));
  ndx_future_release(pending);
  ndx_future_release(ready);
  ndx_future_release(failed);
  ndx_tensor_release(a);
  ndx_tensor_release(zero);
  ndx_context_release(ctx);
}

#define RUN(call)                       \
  do {                                  \
    ndx_test_watchdog_phase(#call);     \
    call;                               \
  } while (0)

/* A provider that invokes on its own context (as host code it calls might), at most 8
 * deep so that the test ends without the fix too. */
typedef struct {
  ndx_context_t* ctx;
  int calls;
  size_t nested_frames, nested_host;
  int nested_seen;
} reentry_t;

static NDX_TEST_NOINLINE size_t reentrant_provider(void* user, ndx_host_frame_t* frames,
                                                   size_t capacity) {
  reentry_t* r = (reentry_t*)user;
  r->calls++;
  if (r->calls < 8) {
    ndx_tensor_t* a = t_i32(kA);
    ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
    ndx_future_t* f = NULL;
    int line = __LINE__ + 1;
    if (CHECK_OK(ndx_invoke(r->ctx, "add", in, 2, NULL, NULL, &f))) {
      ndx_error_t* e = ndx_future_wait(f, -1);
      if (!r->nested_seen && CHECK(e != NULL, "the nested invocation fails as injected")) {
        r->nested_seen = 1;
        r->nested_frames = ndx_error_frame_count(e);
        for (size_t i = 0; i < r->nested_frames; i++) {
          ndx_frame_t fr;
          if (ndx_test_get_frame(e, i, &fr) && fr.origin == NDX_FRAME_HOST) r->nested_host++;
        }
        CHECK_FRAME(e, 0, THIS_FILE, line, "reentrant_provider", NDX_FRAME_NATIVE);
      }
      ndx_error_free(e);
      ndx_future_release(f);
    }
    ndx_tensor_release(a);
  }
  if (capacity > 0) {
    frames[0].function = "py_fn";
    frames[0].file = "x.py";
    frames[0].line = 3;
  }
  return capacity > 0 ? 1 : 0;
}

/* A frame provider that invoked on its context was called again by that invocation,
 * and again by the next, until the stack overflowed and the process died. An
 * invocation made inside a provider records no host frames: the provider runs once. */
static NDX_TEST_NOINLINE void test_provider_reentry(void) {
  const int32_t policies[2] = {NDX_CAPTURE_HOST, NDX_CAPTURE_ALL};
  for (int p = 0; p < 2; p++) {
    NDX_TEST_CONTEXT(p == 0 ? "provider re-entry, HOST" : "provider re-entry, ALL");
    ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER, policies[p], "inject_runtime_error:add");
    reentry_t r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    CHECK_OK(ndx_context_set_frame_provider(ctx, reentrant_provider, &r, NULL));
    ndx_tensor_t* a = t_i32(kA);
    ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, NULL, &f));
    CHECK(r.calls == 1, "the provider ran %d times", r.calls);
    CHECK(r.nested_seen && r.nested_host == 0, "the nested invocation has %zu host frames",
          r.nested_host);
    ndx_error_t* e = ndx_future_wait(f, -1);
    if (CHECK(e != NULL, "the injected failure")) {
      CHECK_FRAME(e, 0, "x.py", 3, "py_fn", NDX_FRAME_HOST);
    }
    ndx_error_free(e);
    ndx_future_release(f);
    ndx_tensor_release(a);
    ndx_context_release(ctx);
  }
  NDX_TEST_CONTEXT(NULL);
}

/* A provider whose host marks an unknown line with -1. */
static size_t minus_one_line(void* user, ndx_host_frame_t* frames, size_t capacity) {
  (void)user;
  if (capacity == 0) return 0;
  frames[0].function = "py_fn";
  frames[0].file = "x.py";
  frames[0].line = (uint32_t)-1;
  return 1;
}

/* A host's "unknown" line -1, converted to uint32_t, read as line 4294967295 of the
 * file; from a provider or an explicit location, a line above INT32_MAX is 0 now. */
static NDX_TEST_NOINLINE void test_negative_host_line(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_HOST, "inject_runtime_error:add");
  CHECK_OK(ndx_context_set_frame_provider(ctx, minus_one_line, NULL, NULL));
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
  for (int k = 0; k < 2; k++) {
    ndx_invoke_options_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    if (k == 1) {
      CHECK_OK(ndx_context_set_frame_provider(ctx, NULL, NULL, NULL));
      o.location.file = "app.lua";
      o.location.function = "main";
      o.location.line = (uint32_t)-1;
    }
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "add", in, 2, NULL, &o, &f));
    ndx_error_t* e = ndx_future_wait(f, -1);
    ndx_frame_t fr;
    if (CHECK(e != NULL, "the injected failure") && CHECK(ndx_test_get_frame(e, 0, &fr), "frame 0")) {
      CHECK(fr.line == 0, "%s: line %u", k ? "location" : "provider", (unsigned)fr.line);
      CHECK_STR_EQ(fr.file, k ? "app.lua" : "x.py");
    }
    ndx_error_free(e);
    ndx_future_release(f);
  }
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

/* An invocation refused while ndx_invoke reads its inputs or options (a NULL tensor,
 * an unknown mode) names the host caller under HOST capture, as every call-time error
 * does; it carried ndx's native frames only. */
static NDX_TEST_NOINLINE void test_refused_invocation_names_host_caller(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_HOST, NULL);
  CHECK_OK(ndx_context_set_frame_provider(ctx, depth_probe, NULL, NULL)); /* x.py:3 */
  ndx_tensor_t* a = t_i32(kA);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(NULL)};
  for (int k = 0; k < 2; k++) {
    ndx_invoke_options_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    if (k == 1) o.mode = 99;
    ndx_future_t* f = NULL;
    ndx_error_t* e = ndx_invoke(ctx, "add", in, k == 0 ? 2 : 1, NULL, &o, &f);
    ndx_frame_t fr;
    CHECK(ndx_error_frame_count(e) == 1, "%zu frames", ndx_error_frame_count(e));
    if (CHECK(ndx_test_get_frame(e, 0, &fr), "frame 0")) {
      CHECK_STR_EQ(fr.file, "x.py");
      CHECK(fr.line == 3, "line %u", (unsigned)fr.line);
      CHECK(fr.origin == NDX_FRAME_HOST, "origin %d", (int)fr.origin);
    }
    expect_error(e, NDX_ERROR_VALUE, k == 0 ? "inputs[1]" : "opts->mode");
    CHECK(f == NULL, "no future");
  }
  ndx_tensor_release(a);
  ndx_context_release(ctx);
}

/* clamp of int64 {-5, -1, 0, 1, 5, 100} with float bounds `lo` and `hi` (given when
 * `has_lo`/`has_hi`): expects the call-time error `fragment`, or (NULL) the values
 * `want`. */
static void check_clamp(int has_lo, double lo, int has_hi, double hi, const char* fragment,
                        const int64_t* want) {
  static const int64_t v[6] = {-5, -1, 0, 1, 5, 100};
  static const int64_t shape[1] = {6};
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU, NDX_CAPTURE_OFF, NULL);
  ndx_tensor_t* t = ndx_test_tensor(v, NDX_DTYPE_INT64, 1, shape);
  ndx_args_t* args = NULL;
  CHECK_OK(ndx_args_new(&args));
  if (has_lo) CHECK_OK(ndx_args_set_float(args, "lo", lo));
  if (has_hi) CHECK_OK(ndx_args_set_float(args, "hi", hi));
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  ndx_error_t* e = ndx_invoke(ctx, "clamp", &in, 1, args, NULL, &f);
  if (fragment != NULL) {
    expect_error(e, NDX_ERROR_VALUE, fragment);
    CHECK(f == NULL, "no future after a refused invocation");
  } else if (CHECK_OK(e)) {
    CHECK_OK(ndx_future_wait(f, -1));
    ndx_tensor_t* out = ndx_test_output(f, 0);
    if (out != NULL) check_i64(out, want, 6);
    ndx_tensor_release(out);
    ndx_future_release(f);
  }
  ndx_args_free(args);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* A NaN clamp bound compares false with everything: for integers it became 0 (the cast
 * of NaN), so lo = NaN raised every negative value to 0 and hi = NaN lowered every
 * positive one to 0. Integer bounds with no integer between them (0.5 and 0.7: lo rounds
 * up to 1, hi down to 0) clamped everything to 0. Both are NDX_ERROR_VALUE at invoke. */
static NDX_TEST_NOINLINE void test_clamp_bounds(void) {
  check_clamp(1, NAN, 0, 0, "operator 'clamp': argument 'lo' is NaN, not a bound", NULL);
  check_clamp(0, 0, 1, NAN, "operator 'clamp': argument 'hi' is NaN, not a bound", NULL);
  check_clamp(1, 0.5, 1, 0.7,
              "operator 'clamp': clamp bounds lo = 0.5 and hi = 0.7 hold no integer: for int64 "
              "inputs lo rounds up to 1 and hi down to 0",
              NULL);
  static const int64_t all[6] = {-5, -1, 0, 1, 5, 100};
  static const int64_t inner[6] = {-1, -1, 0, 1, 4, 4};
  static const int64_t ones[6] = {1, 1, 1, 1, 1, 1};
  check_clamp(1, -INFINITY, 1, INFINITY, NULL, all);
  check_clamp(1, -1.5, 1, 4.5, NULL, inner);
  check_clamp(1, 0.5, 1, 1.7, NULL, ones);
}

int main(void) {
  main_thread = pthread_self();
  ndx_test_watchdog_start(120, "test_engine");
  RUN(test_error_matrix());
  for (int m = 0; m < 4; m++) {
    char label[64];
    snprintf(label, sizeof label, "success values, %s", mode_name(kModes[m]));
    NDX_TEST_CONTEXT(label);
    RUN(test_success_values(kModes[m]));
    NDX_TEST_CONTEXT(NULL);
  }
  RUN(test_deferred_metadata());
  RUN(test_first_poll_submits());
  RUN(test_on_ready_submits_deferred());
  RUN(test_evaluate_reports_once());
  RUN(test_cross_context_graph());
  RUN(test_internal_lookup_is_no_observation());
  RUN(test_cancel_deferred());
  RUN(test_cancel_is_observed());
  RUN(test_release_cancels_deferred());
  RUN(test_release_waits_running());
  RUN(test_release_joins_while_a_worker_holds_the_context());
  RUN(test_release_inside_process_events());
  RUN(test_events_callbacks_never_on_a_worker());
  RUN(test_events_wait_timeout());
  RUN(test_host_op_chains());
  RUN(test_host_user_free());
  RUN(test_user_free_on_failure());
  RUN(test_user_free_reenters_its_context());
  RUN(test_struct_size_messages());
  RUN(test_on_ready());
  for (int m = 0; m < 4; m++) {
    RUN(test_noexcept(kModes[m]));
    RUN(test_accuracy(kModes[m]));
  }
  RUN(test_eager_on_worker());
  RUN(test_capture_depth_limit());
  RUN(test_unknown_modes_and_policies());
  RUN(test_provider_overcount());
  RUN(test_failed_chain_release());
  RUN(test_wide_group_format());
  RUN(test_callback_loop_runs_flat());
  RUN(test_host_outputs_break_the_contract());
  RUN(test_per_sample_outputs_make_no_batch());
  RUN(test_per_sample_failure_names_its_sample());
  RUN(test_failed_host_output_fails_a_builtin_in_its_future());
  RUN(test_host_batch_output_size_needs_no_run());
  RUN(test_refused_reads_in_a_callback());
  RUN(test_host_op_of_no_inputs());
  RUN(test_callback_waits_on_complete_futures());
  RUN(test_clamp_bounds());
  RUN(test_provider_reentry());
  RUN(test_negative_host_line());
  RUN(test_refused_invocation_names_host_caller());
  ndx_test_watchdog_stop();
  return NDX_TEST_SUMMARY("test_engine");
}
