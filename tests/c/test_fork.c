/* fork() after ndx ran: the child has none of the parent's worker threads.
 *  - new contexts work in the child in every eval mode, with kernels large enough to be
 *    split across the pool (ndx makes the child a pool of its own);
 *  - a context made before the fork refuses every call there: NDX_ERROR_VALUE naming
 *    the argument, never a hang; releasing it waits for nothing;
 *  - a DEFERRED future that had not run reads as failed there (poll FAILED, wait
 *    NDX_ERROR_RUNTIME saying why), and its pending output is refused as an input;
 *  - the parent goes on: the same deferred work runs there as if nothing happened.
 * The child sends its failure count through a pipe and then kills itself with SIGKILL,
 * so that no exit-time leak check runs there: it would list what the parent's worker
 * threads held, lost with the threads the child does not have (CMake's valgrind run of
 * this test adds --child-silent-after-fork=yes for the same reason; the parent is
 * checked in full). alarm() turns a hang in the child into a failure. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ndx_test.h"

#define N (1 << 20) /* large enough to be split across the pool */

static float a[N];
static float got[N];
static const int64_t shape[1] = {N};

static ndx_context_t* make_ctx(int32_t mode) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = mode;
  o.num_threads = 2;
  return ndx_test_new_context(&o);
}

static ndx_error_t* invoke(const ndx_context_t* ctx, const char* op, const ndx_tensor_t* x,
                           const ndx_tensor_t* y, ndx_future_t** out) {
  ndx_input_t in[2] = {ndx_test_in(x), ndx_test_in(y)};
  return ndx_invoke(ctx, op, in, 2, NULL, NULL, out);
}

/* Waits for `f` and checks out[i] == op(a[i], a[i]) at a few places. Releases f. */
static void check_result(ndx_future_t* f, int mul, const char* what) {
  NDX_TEST_CONTEXT(what);
  if (CHECK_OK(ndx_future_wait(f, -1))) {
    ndx_tensor_t* t = ndx_test_output(f, 0);
    const float* p = got;
    if (t && CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got))) {
      const size_t at[4] = {0, 1, N / 2 + 3, N - 1};
      for (int k = 0; k < 4; k++) {
        float want = mul ? a[at[k]] * a[at[k]] : a[at[k]] + a[at[k]];
        CHECK(p[at[k]] == want, "element %zu: %g, expected %g", at[k], p[at[k]], want);
      }
    }
    ndx_tensor_release(t);
  }
  ndx_future_release(f);
  NDX_TEST_CONTEXT(NULL);
}

static int child(ndx_context_t* parent_ctx, ndx_future_t* pending, ndx_tensor_t* x) {
  alarm(120);
  static const int32_t modes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                   NDX_EVAL_EAGER};
  static const char* const names[4] = {"child SYNC_CPU", "child SYNC_FULL", "child DEFERRED",
                                       "child EAGER"};
  for (int m = 0; m < 4; m++) {
    ndx_context_t* ctx = make_ctx(modes[m]);
    ndx_future_t* f = NULL;
    if (CHECK_OK(invoke(ctx, "add", x, x, &f))) check_result(f, 0, names[m]);
    ndx_context_release(ctx);
  }

  /* The parent's context: refused, naming the argument. */
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  expect_error(invoke(parent_ctx, "add", x, x, &f), NDX_ERROR_VALUE,
               "argument 'ctx': the context was created before this process forked");
  CHECK(f == NULL, "no future");
  expect_error(ndx_context_evaluate(parent_ctx), NDX_ERROR_VALUE,
               "a forked child cannot use it");

  /* Its DEFERRED work never runs here. */
  const char* lost = "('mul') had not completed when the process forked; it never completes";
  CHECK(ndx_future_poll(pending) == NDX_FUTURE_FAILED, "poll: FAILED");
  expect_error(ndx_future_wait(pending, -1), NDX_ERROR_RUNTIME, lost);
  ndx_tensor_t* out = NULL;
  expect_error(ndx_future_tensor(pending, 0, &out), NDX_ERROR_RUNTIME, lost);
  ndx_tensor_release(out);

  ndx_context_release(parent_ctx);
  ndx_future_release(pending);
  return ndx_test_failed_;
}

/* ---- forks while other threads use a complete invocation -------------------------------
 * Parent threads keep invoking SYNC_CPU consumers of a complete future's output,
 * exporting it through DLPack and registering callbacks on it while the main thread
 * forks: each child uses that output and future (invoke SYNC_CPU and EAGER, export,
 * on_ready, cancel) without hanging on a lock a parent thread held at the fork. A child
 * that hangs is ended by alarm().
 * Under valgrind (CMake's valgrind run sets NDX_TEST_UNDER_VALGRIND=1, and runs it with
 * --fair-sched=yes, without which the spinning users starved the forking thread for
 * minutes per fork) a fork still costs far more, so the run forks fewer times and gives
 * each child longer before alarm() ends it. */
#define N_FORKS 150
#define N_FORKS_VALGRIND 30
#define N_USERS 2

static int under_valgrind(void) {
  const char* v = getenv("NDX_TEST_UNDER_VALGRIND");
  return v != NULL && strcmp(v, "1") == 0;
}

static ndx_future_t* done_f;
static ndx_tensor_t* done_t;
static volatile int stop_users;

static void count_cb(void* user, const ndx_future_t* f) {
  (void)f;
  __atomic_fetch_add((int*)user, 1, __ATOMIC_SEQ_CST);
}

/* Exports `t` through DLPack and reads its first float into *first; 0 on success. */
static int export_first(const ndx_tensor_t* t, float* first) {
  DLManagedTensorVersioned* m = NULL;
  ndx_error_t* e = ndx_tensor_to_dlpack_versioned(t, &m);
  if (e != NULL || m == NULL) {
    ndx_error_free(e);
    return 1;
  }
  *first = *(const float*)m->dl_tensor.data;
  m->deleter(m);
  return 0;
}

static void* user_main(void* p) {
  ndx_context_t* ctx = (ndx_context_t*)p;
  int fired = 0;
  while (!__atomic_load_n(&stop_users, __ATOMIC_SEQ_CST)) {
    ndx_future_t* g = NULL;
    if (invoke(ctx, "add", done_t, done_t, &g) == NULL) ndx_future_release(g);
    ndx_error_free(ndx_future_on_ready(done_f, count_cb, &fired, NULL));
    float first = 0;
    (void)export_first(done_t, &first);
  }
  return NULL;
}

static int fork_child_uses_done(void) {
  alarm(under_valgrind() ? 120 : 10);
  int bad = 0;
  static const int32_t modes[2] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_EAGER};
  for (int m = 0; m < 2; m++) {
    ndx_context_t* ctx = make_ctx(modes[m]);
    ndx_future_t* g = NULL;
    ndx_error_t* e = invoke(ctx, "add", done_t, done_t, &g);
    if (e != NULL || (e = ndx_future_wait(g, -1)) != NULL) bad = 1;
    ndx_error_free(e);
    ndx_future_release(g);
    ndx_context_release(ctx);
  }
  int fired = 0;
  ndx_error_t* e = ndx_future_on_ready(done_f, count_cb, &fired, NULL);
  if (e != NULL || fired != 1) bad = 1;
  ndx_error_free(e);
  float first = 0;
  if (export_first(done_t, &first) != 0 || first != 2.0f) bad = 1;
  bool cancelled = true;
  e = ndx_future_cancel(done_f, &cancelled);
  if (e != NULL || cancelled) bad = 1;
  ndx_error_free(e);
  return bad;
}

static void forks_while_threads_use_a_complete_invocation(void) {
  NDX_TEST_CONTEXT("forks while threads use a complete invocation");
  ndx_context_t* ctx = make_ctx(NDX_EVAL_SYNC_CPU);
  static const float small[4] = {1, 2, 3, 4};
  static const int64_t small_shape[1] = {4};
  ndx_tensor_t* s = ndx_test_tensor(small, NDX_DTYPE_FLOAT32, 1, small_shape);
  if (!CHECK_OK(invoke(ctx, "add", s, s, &done_f))) return;
  done_t = ndx_test_output(done_f, 0);
  pthread_t users[N_USERS];
  for (int i = 0; i < N_USERS; i++) pthread_create(&users[i], NULL, user_main, ctx);
  int hung = 0, failed = 0;
  const int n_forks = under_valgrind() ? N_FORKS_VALGRIND : N_FORKS;
  for (int k = 0; k < n_forks; k++) {
    int fds[2];
    if (!CHECK(pipe(fds) == 0, "pipe")) break;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      /* Reports through the pipe, then SIGKILL: no exit-time leak check (see above). */
      close(fds[0]);
      char bad = (char)fork_child_uses_done();
      if (write(fds[1], &bad, 1) != 1) _exit(3);
      kill(getpid(), SIGKILL);
      _exit(4);
    }
    close(fds[1]);
    char bad = 0;
    ssize_t got = pid > 0 ? read(fds[0], &bad, 1) : -1;
    close(fds[0]);
    int status = 0;
    if (!CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork and waitpid")) break;
    if (got != 1) hung++; /* ended by alarm() before reporting */
    else if (bad != 0) failed++;
  }
  __atomic_store_n(&stop_users, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < N_USERS; i++) pthread_join(users[i], NULL);
  CHECK(hung == 0, "%d of %d children hung (ended by alarm)", hung, n_forks);
  CHECK(failed == 0, "%d of %d children failed", failed, n_forks);
  ndx_tensor_release(done_t);
  ndx_future_release(done_f);
  ndx_tensor_release(s);
  ndx_context_release(ctx);
  NDX_TEST_CONTEXT(NULL);
}

int main(void) {
  for (int i = 0; i < N; i++) a[i] = (float)(i % 1000) * 0.5f;
  ndx_tensor_t* x = ndx_test_tensor(a, NDX_DTYPE_FLOAT32, 1, shape);
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);

  /* The pool has run work before the fork. */
  ndx_future_t* f = NULL;
  if (CHECK_OK(invoke(ctx, "add", x, x, &f))) check_result(f, 0, "parent before the fork");
  ndx_future_t* pending = NULL;
  ndx_input_t in[2] = {ndx_test_in(x), ndx_test_in(x)};
  ndx_invoke_options_t deferred;
  memset(&deferred, 0, sizeof deferred);
  deferred.struct_size = sizeof deferred;
  deferred.mode = NDX_EVAL_DEFERRED;
  CHECK_OK(ndx_invoke(ctx, "mul", in, 2, NULL, &deferred, &pending));

  int fds[2];
  if (!CHECK(pipe(fds) == 0, "pipe")) return NDX_TEST_SUMMARY("test_fork");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int before = ndx_test_failed_;
    int failed = child(ctx, pending, x) - before;
    ndx_tensor_release(x);
    fflush(stdout);
    fflush(stderr);
    if (write(fds[1], &failed, sizeof failed) != (ssize_t)sizeof failed) _exit(3);
    kill(getpid(), SIGKILL);
    _exit(4);
  }
  close(fds[1]);
  if (CHECK(pid > 0, "fork")) {
    int failed = -1;
    ssize_t got = read(fds[0], &failed, sizeof failed);
    CHECK(got == (ssize_t)sizeof failed, "the child hung or died before reporting (read %zd)",
          got);
    CHECK(failed == 0, "%d checks failed in the child (printed above)", failed);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
          "the child ended by SIGKILL after reporting (exited %d with %d, signal %d)",
          WIFEXITED(status), WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  close(fds[0]);

  /* The parent goes on. */
  if (pending) check_result(pending, 1, "parent after the fork");
  ndx_context_release(ctx);
  ndx_tensor_release(x);
  forks_while_threads_use_a_complete_invocation();
  return NDX_TEST_SUMMARY("test_fork");
}
