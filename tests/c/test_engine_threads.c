/* Concurrency of the engine: 4 threads share ONE context and each runs 200 iterations of
 * invoke (a random eval mode per invocation, a fifth of them failing in one of several
 * ways), then observe (wait, poll until complete) or release without observing, with
 * on_ready callbacks registered before completion, after completion and on futures
 * released before completion. At the end:
 *  - every callback fired exactly once and its user_free ran exactly once;
 *  - no failure was lost or reported twice: the final ndx_context_evaluate reports exactly
 *    the failures no thread observed, each once, and a second evaluate reports nothing;
 *  - the host operators' user_free ran once the context and every future were released.
 * Then a stress phase: 4 threads x 2000 EAGER "add -> add of its output" chains on a
 * second context, and one ndx_context_evaluate that must return.
 * Then, in process-events mode, a callback registered on another thread while the release
 * runs the queued callbacks must still run once.
 * A watchdog turns a hang into a failure naming the phase (30 s).
 * CMake runs the -O0 build under valgrind too (it must stay well under 20 s there).
 *
 * Worker threads do not use CHECK (the harness counters are not atomic): each counts its
 * own passes and failures, which main adds up after joining them. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "ndx_test.h"

#define N_THREADS 4
#define N_ITERS 200
#define N_SLOTS 3 /* callback registrations per iteration, at most */
#define WAIT_NS (10000LL * 1000000LL)

/* ---- shared state --------------------------------------------------------------------- */

typedef struct {
  int fired; /* atomic */
  int freed; /* atomic */
} slot_t;

static slot_t slots[N_THREADS][N_ITERS][N_SLOTS];
static int registered[N_THREADS][N_ITERS][N_SLOTS]; /* written by the owning thread */

static ndx_context_t* ctx;
static ndx_tensor_t *ta, *tb_ok, *tb_zero;
static const int64_t kShape[1] = {4};
static const int32_t kA[4] = {7, -7, 9, 10};
static const int32_t kBOk[4] = {2, 2, 3, 5};
static const int32_t kBZero[4] = {2, 0, 3, 5};
static const int32_t kSum[4] = {9, -5, 12, 15};

static const int32_t kModes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                  NDX_EVAL_EAGER};

static int host_calls;       /* atomic */
static int host_user_freed;  /* atomic */

static void inc_int(int* p) { __atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST); }
static int load_int(const int* p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

static void sleep_us(long us) {
  struct timespec ts;
  ts.tv_sec = us / 1000000L;
  ts.tv_nsec = (us % 1000000L) * 1000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void cb_fired(void* user, const ndx_future_t* f) {
  (void)f; /* no status query here: a poll would observe failures */
  inc_int(&((slot_t*)user)->fired);
}

static void cb_freed(void* user) { inc_int(&((slot_t*)user)->freed); }

static void host_user_free(void* user) {
  (void)user;
  inc_int(&host_user_freed);
}

static ndx_error_t* k_copy(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                           const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user;
  (void)n_inputs;
  (void)args;
  (void)n_outputs;
  int32_t v[4];
  ndx_error_t* e = ndx_tensor_copy_to(inputs[0], v, sizeof v);
  if (e == NULL) e = ndx_tensor_from_host(v, NDX_DTYPE_INT32, 1, kShape, NULL, NULL, &outputs[0]);
  inc_int(&host_calls);
  return e;
}

static ndx_error_t* k_fail(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                           const ndx_args_t* args, ndx_tensor_t** outputs, size_t n_outputs) {
  (void)user;
  (void)inputs;
  (void)n_inputs;
  (void)args;
  (void)outputs;
  (void)n_outputs;
  inc_int(&host_calls);
  return ndx_error_new(NDX_ERROR_RUNTIME, "host failed",
                       ndx_error_new(NDX_ERROR_INDEX, "root cause", NULL));
}

/* ---- per-thread checks -------------------------------------------------------------------- */

typedef struct {
  int index;
  uint32_t rng;
  int passed;
  int failed;
  int unobserved; /* failing invocations released without being observed */
  int failures;   /* failing invocations in all */
  int kinds[6];
} worker_t;

static int tcheck_(worker_t* w, int ok, int line, const char* cond, const char* fmt, ...)
    NDX_TEST_PRINTF(5, 6);

static int tcheck_(worker_t* w, int ok, int line, const char* cond, const char* fmt, ...) {
  if (ok) {
    w->passed++;
    return 1;
  }
  w->failed++;
  flockfile(stderr);
  fprintf(stderr, "%s:%d: thread %d: CHECK failed: %s: ", __FILE__, line, w->index, cond);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  funlockfile(stderr);
  return 0;
}
#define TCHECK(w, cond, ...) tcheck_((w), (cond) ? 1 : 0, __LINE__, #cond, __VA_ARGS__)

/* An ndx call that must succeed. */
static int tok_(worker_t* w, ndx_error_t* e, int line, const char* expr) {
  int ok = tcheck_(w, e == NULL, line, expr, "%s: %s",
                   NDX_TEST_S(ndx_error_kind_name(ndx_error_kind(e))),
                   NDX_TEST_S(ndx_error_message(e)));
  ndx_error_free(e);
  return ok;
}
#define TOK(w, expr) tok_((w), (expr), __LINE__, #expr)

static uint32_t next_rand(worker_t* w) {
  uint32_t x = w->rng;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  w->rng = x;
  return x;
}

static void on_ready(worker_t* w, const ndx_future_t* f, int iter, int k) {
  if (TOK(w, ndx_future_on_ready(f, cb_fired, &slots[w->index][iter][k], cb_freed))) {
    registered[w->index][iter][k] = 1;
  }
}

static ndx_invoke_options_t mode_opts(int32_t mode) {
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = mode;
  return o;
}

/* Checks a completed future: `e` is its observed error (NULL on success), taken over. */
static void check_outcome(worker_t* w, int kind, const ndx_future_t* f, ndx_error_t* e) {
  switch (kind) {
    case 0: /* add */
    case 3: /* host copy */
    {
      if (!TCHECK(w, e == NULL, "kind %d failed: %s", kind, NDX_TEST_S(ndx_error_message(e))))
        break;
      ndx_tensor_t* t = NULL;
      int32_t v[4] = {0, 0, 0, 0};
      if (TOK(w, ndx_future_tensor(f, 0, &t)) && TOK(w, ndx_tensor_copy_to(t, v, sizeof v))) {
        const int32_t* want = kind == 0 ? kSum : kA;
        TCHECK(w, memcmp(v, want, sizeof v) == 0, "kind %d: wrong values %d %d %d %d", kind,
               v[0], v[1], v[2], v[3]);
      }
      ndx_tensor_release(t);
      break;
    }
    case 1:
      TCHECK(w, ndx_error_kind(e) == NDX_ERROR_VALUE &&
                    ndx_test_contains(ndx_error_message(e), "integer division by zero") &&
                    ndx_test_str_eq(ndx_error_op(e), "div") && ndx_error_sequence(e) > 0,
             "div: %s", NDX_TEST_S(ndx_error_message(e)));
      break;
    case 2:
      TCHECK(w, ndx_error_kind(e) == NDX_ERROR_VALUE &&
                    ndx_test_contains(ndx_error_message(e), "input 0 of 'sum'") &&
                    ndx_test_str_eq(ndx_error_op(e), "sum") && ndx_test_chain_length(e) == 2 &&
                    ndx_test_str_eq(ndx_error_op(ndx_error_cause(e)), "div"),
             "sum of div: %s", NDX_TEST_S(ndx_error_message(e)));
      break;
    case 4:
      TCHECK(w, ndx_error_kind(e) == NDX_ERROR_RUNTIME &&
                    ndx_test_str_eq(ndx_error_message(e), "host failed") &&
                    ndx_test_str_eq(ndx_error_op(e), "host_fail") && ndx_test_chain_length(e) == 2,
             "host_fail: %s", NDX_TEST_S(ndx_error_message(e)));
      break;
    default:
      break;
  }
  ndx_error_free(e);
}

static void iteration(worker_t* w, int iter) {
  uint32_t r = next_rand(w);
  int kind = (int)(r % 6);
  int obs = (int)((r / 6) % 3); /* 0: wait, 1: poll until complete, 2: release unobserved */
  ndx_invoke_options_t o1 = mode_opts(kModes[(r / 18) % 4]);
  ndx_invoke_options_t o2 = mode_opts(kModes[(r / 72) % 4]);
  ndx_invoke_options_t deferred = mode_opts(NDX_EVAL_DEFERRED);
  ndx_input_t ok2[2] = {ndx_test_in(ta), ndx_test_in(tb_ok)};
  ndx_input_t bad2[2] = {ndx_test_in(ta), ndx_test_in(tb_zero)};
  ndx_input_t one[1] = {ndx_test_in(ta)};
  ndx_future_t *f = NULL, *up = NULL;
  ndx_tensor_t* tup = NULL;
  int fails = kind == 1 || kind == 2 || kind == 4;
  w->kinds[kind]++;
  if (kind == 5) obs = 0;

  switch (kind) {
    case 0: TOK(w, ndx_invoke(ctx, "add", ok2, 2, NULL, &o1, &f)); break;
    case 1: TOK(w, ndx_invoke(ctx, "div", bad2, 2, NULL, &o1, &f)); break;
    case 2:
      if (TOK(w, ndx_invoke(ctx, "div", bad2, 2, NULL, &o1, &up)) &&
          TOK(w, ndx_future_tensor(up, 0, &tup))) {
        ndx_input_t in[1] = {ndx_test_in(tup)};
        on_ready(w, up, iter, 2);
        TOK(w, ndx_invoke(ctx, "sum", in, 1, NULL, &o2, &f));
        /* The caller's handles on the upstream go at once; the graph keeps it alive. */
        ndx_tensor_release(tup);
        tup = NULL;
        ndx_future_release(up);
        up = NULL;
      }
      break;
    case 3: TOK(w, ndx_invoke(ctx, "copy", one, 1, NULL, &o1, &f)); break;
    case 4: TOK(w, ndx_invoke(ctx, "host_fail", one, 1, NULL, &o1, &f)); break;
    case 5: TOK(w, ndx_invoke(ctx, "add", ok2, 2, NULL, &deferred, &f)); break;
    default: break;
  }
  if (!TCHECK(w, f != NULL, "kind %d: no future", kind)) return;
  if (fails) w->failures++;
  /* Before completion (except SYNC). A recorded DEFERRED one is cancelled first: on_ready
   * would hand it to the workers. */
  if (kind != 5) on_ready(w, f, iter, 0);

  if (kind == 5) {
    bool cancelled = false;
    TOK(w, ndx_future_cancel(f, &cancelled));
    TCHECK(w, cancelled, "a recorded DEFERRED invocation is cancelled");
    ndx_error_t* e = ndx_future_error(f);
    TCHECK(w, ndx_error_kind(e) == NDX_ERROR_CANCELLED, "cancelled: %s",
           NDX_TEST_S(ndx_error_message(e)));
    ndx_error_free(e);
    on_ready(w, f, iter, 0);
    TCHECK(w, load_int(&slots[w->index][iter][0].fired) == 1,
           "on_ready on a cancelled future fires before it returns");
  } else if (obs == 2) {
    /* Released before completion (for EAGER and DEFERRED); a failure stays unobserved. */
    ndx_future_release(f);
    if (fails) w->unobserved++;
    return;
  } else if (obs == 0) {
    ndx_error_t* e = ndx_future_wait(f, WAIT_NS);
    TCHECK(w, ndx_error_kind(e) != NDX_ERROR_TIMEOUT, "wait timed out");
    check_outcome(w, kind, f, e);
  } else {
    double end = now_ms() + 10000.0;
    int st;
    while ((st = ndx_future_poll(f)) == NDX_FUTURE_PENDING && now_ms() < end) sleep_us(100);
    TCHECK(w, st == (fails ? NDX_FUTURE_FAILED : NDX_FUTURE_READY), "kind %d: status %d", kind,
           st);
    check_outcome(w, kind, f, ndx_future_error(f));
  }
  /* After completion: at once, on this thread. */
  on_ready(w, f, iter, 1);
  TCHECK(w, load_int(&slots[w->index][iter][1].fired) == 1,
         "on_ready after completion fires before it returns");
  ndx_future_release(f);
}

static void* worker_main(void* p) {
  worker_t* w = (worker_t*)p;
  for (int i = 0; i < N_ITERS; i++) iteration(w, i);
  return NULL;
}

/* ---- stress: EAGER chains, then ndx_context_evaluate ----------------------------------
 *
 * Each thread enqueues N_CHAINS pairs "add -> add of its output" in EAGER mode and
 * releases them at once; then one ndx_context_evaluate must see all of them complete.
 * The child is often submitted while its parent completes on a worker: the bookkeeping
 * of that moment must not lose the child (or keep it "pending" forever). */
#define N_CHAINS 2000

static ndx_context_t* stress_ctx;

static void* chains_main(void* p) {
  worker_t* w = (worker_t*)p;
  ndx_input_t in[2] = {ndx_test_in(ta), ndx_test_in(tb_ok)};
  for (int i = 0; i < N_CHAINS; i++) {
    ndx_future_t *parent = NULL, *child = NULL;
    ndx_tensor_t* t = NULL;
    if (TOK(w, ndx_invoke(stress_ctx, "add", in, 2, NULL, NULL, &parent)) &&
        TOK(w, ndx_future_tensor(parent, 0, &t))) {
      ndx_input_t in2[2] = {ndx_test_in(t), ndx_test_in(tb_ok)};
      TOK(w, ndx_invoke(stress_ctx, "add", in2, 2, NULL, NULL, &child));
    }
    ndx_tensor_release(t);
    ndx_future_release(parent);
    ndx_future_release(child);
  }
  return NULL;
}

static void stress_chains(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_EAGER;
  o.capture_policy = NDX_CAPTURE_OFF;
  if (!CHECK_OK(ndx_context_new(&o, &stress_ctx))) return;
  ndx_test_watchdog_phase("the chain stress");
  worker_t workers[N_THREADS];
  pthread_t threads[N_THREADS];
  int started[N_THREADS];
  memset(workers, 0, sizeof workers);
  for (int i = 0; i < N_THREADS; i++) {
    workers[i].index = i;
    started[i] = pthread_create(&threads[i], NULL, chains_main, &workers[i]) == 0;
    CHECK(started[i], "stress thread %d started", i);
  }
  int failed = 0;
  for (int i = 0; i < N_THREADS; i++) {
    if (started[i]) pthread_join(threads[i], NULL);
    failed += workers[i].failed;
  }
  CHECK(failed == 0, "%d calls of the chain stress failed", failed);
  ndx_test_watchdog_phase(
      "ndx_context_evaluate after the chain stress (an EAGER invocation submitted while its "
      "input completed stays 'pending' forever)");
  ndx_error_t* e = ndx_context_evaluate(stress_ctx);
  CHECK(e == NULL, "the chains all succeed: %s", NDX_TEST_S(ndx_error_message(e)));
  ndx_error_free(e);
  ndx_test_watchdog_phase("ndx_context_release after the chain stress");
  ndx_context_release(stress_ctx);
  stress_ctx = NULL;
}

/* ---- a callback registered while the release runs the queued ones ---------------------
 *
 * Process-events mode: ndx_context_release runs the callbacks still queued on the
 * releasing thread. While one of them runs, another thread registers a callback on a
 * complete future of that context: it must still run, once (it used to be queued behind
 * the drained queue and dropped uncalled with it, only its user_free running). */

typedef struct {
  int running;    /* atomic: the queued callback runs (inside the release) */
  int registered; /* atomic: the other thread registered its callback */
  int late_fired; /* atomic */
  int late_freed; /* atomic */
  ndx_future_t* complete;
} late_t;

static void wait_flag(const int* flag) {
  for (int i = 0; i < 10000 && !load_int(flag); i++) sleep_us(1000);
}

static void late_fired(void* user, const ndx_future_t* f) {
  (void)f;
  inc_int(&((late_t*)user)->late_fired);
}

static void late_freed(void* user) { inc_int(&((late_t*)user)->late_freed); }

static void queued_waits_for_registration(void* user, const ndx_future_t* f) {
  (void)f;
  late_t* l = (late_t*)user;
  inc_int(&l->running);
  wait_flag(&l->registered);
}

static void* late_register_main(void* p) {
  late_t* l = (late_t*)p;
  wait_flag(&l->running);
  ndx_error_t* e = ndx_future_on_ready(l->complete, late_fired, l, late_freed);
  if (e != NULL) inc_int(&l->late_freed); /* counted as a failure below */
  ndx_error_free(e);
  inc_int(&l->registered);
  return NULL;
}

static void test_callback_registered_during_release(void) {
  ndx_test_watchdog_phase("a callback registered while the release runs the queued ones");
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  o.process_events_callbacks = true;
  ndx_context_t* c = NULL;
  if (!CHECK_OK(ndx_context_new(&o, &c))) return;
  ndx_tensor_t* a = ndx_test_tensor(kA, NDX_DTYPE_INT32, 1, kShape);
  ndx_input_t in[2] = {ndx_test_in(a), ndx_test_in(a)};
  ndx_future_t *f1 = NULL, *f2 = NULL;
  late_t l;
  memset(&l, 0, sizeof l);
  CHECK_OK(ndx_invoke(c, "add", in, 2, NULL, NULL, &f1));
  CHECK_OK(ndx_invoke(c, "add", in, 2, NULL, NULL, &f2));
  l.complete = f2;
  /* Complete already: queued for process-events, so the release runs it. */
  CHECK_OK(ndx_future_on_ready(f1, queued_waits_for_registration, &l, NULL));
  pthread_t t;
  int started = pthread_create(&t, NULL, late_register_main, &l) == 0;
  CHECK(started, "registering thread started");
  ndx_context_release(c);
  if (started) pthread_join(t, NULL);
  CHECK(load_int(&l.running) == 1, "the queued callback ran in the release");
  CHECK(load_int(&l.late_fired) == 1, "the late callback fired %d times", load_int(&l.late_fired));
  CHECK(load_int(&l.late_freed) == 1, "the late callback's user_free: %d",
        load_int(&l.late_freed));
  ndx_future_release(f1);
  ndx_future_release(f2);
  ndx_tensor_release(a);
}

int main(void) {
  double t0 = now_ms();
  ndx_test_watchdog_start(30, "test_engine_threads");
  ndx_test_watchdog_phase("the worker threads");
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_EAGER;
  o.capture_policy = NDX_CAPTURE_NATIVE;
  o.num_threads = 4;
  if (!CHECK_OK(ndx_context_new(&o, &ctx))) return NDX_TEST_SUMMARY("test_engine_threads");
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  CHECK_OK(ndx_register_op(ctx, "copy", &s, k_copy, NULL, host_user_free));
  CHECK_OK(ndx_register_op(ctx, "host_fail", &s, k_fail, NULL, host_user_free));
  ta = ndx_test_tensor(kA, NDX_DTYPE_INT32, 1, kShape);
  tb_ok = ndx_test_tensor(kBOk, NDX_DTYPE_INT32, 1, kShape);
  tb_zero = ndx_test_tensor(kBZero, NDX_DTYPE_INT32, 1, kShape);

  worker_t workers[N_THREADS];
  pthread_t threads[N_THREADS];
  int started[N_THREADS];
  memset(workers, 0, sizeof workers);
  for (int i = 0; i < N_THREADS; i++) {
    workers[i].index = i;
    workers[i].rng = 0x9e3779b9u * (uint32_t)(i + 1);
    started[i] = pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0;
    CHECK(started[i], "thread %d started", i);
  }
  int unobserved = 0, failures = 0, kinds[6] = {0};
  for (int i = 0; i < N_THREADS; i++) {
    if (started[i]) pthread_join(threads[i], NULL);
    ndx_test_passed_ += workers[i].passed;
    ndx_test_failed_ += workers[i].failed;
    unobserved += workers[i].unobserved;
    failures += workers[i].failures;
    for (int k = 0; k < 6; k++) kinds[k] += workers[i].kinds[k];
  }
  for (int k = 0; k < 6; k++) CHECK(kinds[k] > 0, "kind %d was exercised", k);
  CHECK(unobserved > 0 && unobserved < failures, "%d of %d failures left unobserved", unobserved,
        failures);

  /* Every failure nobody observed, once; runs the DEFERRED work left behind first. */
  ndx_test_watchdog_phase("the final ndx_context_evaluate");
  ndx_error_t* e = ndx_context_evaluate(ctx);
  size_t n = ndx_error_related_count(e);
  CHECK(n == (size_t)unobserved, "evaluate reports %zu failures, %d were left unobserved", n,
        unobserved);
  if (e) {
    CHECK(ndx_error_kind(e) == NDX_ERROR_RUNTIME, "a RuntimeError group");
    CHECK_CONTAINS(ndx_error_message(e), "failed without being observed");
    uint64_t* seqs = (uint64_t*)calloc(n ? n : 1, sizeof(uint64_t));
    int bad = 0, dup = 0;
    for (size_t i = 0; i < n; i++) {
      const ndx_error_t* r = ndx_error_related(e, i);
      const char* op = ndx_error_op(r);
      if (!(ndx_test_str_eq(op, "div") || ndx_test_str_eq(op, "sum") ||
            ndx_test_str_eq(op, "host_fail")) ||
          ndx_error_sequence(r) == 0) {
        bad++;
      }
      seqs[i] = ndx_error_sequence(r);
      for (size_t j = 0; j < i; j++) dup += seqs[j] == seqs[i];
    }
    CHECK(bad == 0, "%d reported errors are not failing invocations", bad);
    CHECK(dup == 0, "%d invocations reported twice", dup);
    free(seqs);
  }
  ndx_error_free(e);
  e = ndx_context_evaluate(ctx);
  CHECK(e == NULL, "a second evaluate has nothing left: %zu", ndx_error_related_count(e));
  ndx_error_free(e);

  ndx_test_watchdog_phase("ndx_context_release");
  ndx_context_release(ctx);
  stress_chains();
  test_callback_registered_during_release();
  ndx_tensor_release(ta);
  ndx_tensor_release(tb_ok);
  ndx_tensor_release(tb_zero);

  /* Every callback fired exactly once, and its user_free ran exactly once. */
  int n_registered = 0, never = 0, twice = 0, not_freed = 0;
  for (int t = 0; t < N_THREADS; t++) {
    for (int i = 0; i < N_ITERS; i++) {
      for (int k = 0; k < N_SLOTS; k++) {
        if (!registered[t][i][k]) continue;
        n_registered++;
        int fired = load_int(&slots[t][i][k].fired);
        never += fired == 0;
        twice += fired > 1;
        not_freed += load_int(&slots[t][i][k].freed) != 1;
      }
    }
  }
  CHECK(n_registered > N_THREADS * N_ITERS, "%d callbacks registered", n_registered);
  CHECK(never == 0, "%d callbacks never fired", never);
  CHECK(twice == 0, "%d callbacks fired more than once", twice);
  CHECK(not_freed == 0, "%d user_free calls missing or repeated", not_freed);
  /* The host operators' user pointers are freed once each, nothing leaks. (When exactly:
   * test_engine's test_host_user_free; a worker may drop the last reference to a
   * completed invocation a moment after the context is gone, hence the grace period.) */
  for (int i = 0; i < 1000 && load_int(&host_user_freed) < 2; i++) sleep_us(1000);
  CHECK(load_int(&host_user_freed) == 2, "host operators' user_free: %d",
        load_int(&host_user_freed));
  CHECK(load_int(&host_calls) > 0, "host operators ran");
  printf("test_engine_threads: %d threads x %d iterations, %d failures (%d unobserved), "
         "%d callbacks, %.0f ms\n",
         N_THREADS, N_ITERS, failures, unobserved, n_registered, now_ms() - t0);
  ndx_test_watchdog_stop();
  return NDX_TEST_SUMMARY("test_engine_threads");
}
