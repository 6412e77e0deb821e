/* The explain report through the C ABI: one graph per deferred flush with its reason,
 * ops and time; graph breaks (a data read, an export, a SYNC consumer) with the line
 * that forced them; per-mode counts; check flags; JSON text; argument errors. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ndx_test.h"

static ndx_context_t* deferred_context(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_DEFERRED;
  o.check_policy = NDX_CHECKS_COLLECT;
  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(&o, &ctx));
  return ctx;
}

static ndx_explain_summary_t summary_of(const ndx_explain_t* ex) {
  ndx_explain_summary_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  CHECK_OK(ndx_explain_summary(ex, &s));
  return s;
}

static ndx_explain_graph_t graph_of(const ndx_explain_t* ex, size_t i) {
  ndx_explain_graph_t g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g;
  CHECK_OK(ndx_explain_graph(ex, i, &g));
  return g;
}

static ndx_graph_break_t break_of(const ndx_explain_t* ex, size_t i) {
  ndx_graph_break_t b;
  memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  CHECK_OK(ndx_explain_break(ex, i, &b));
  return b;
}

/* Enqueues `op` on one input (context mode unless `mode` != 0) and returns its output. */
static ndx_tensor_t* unary(ndx_context_t* ctx, const char* op, const ndx_tensor_t* x,
                           int32_t mode, ndx_future_t** keep) {
  ndx_input_t in[1] = {ndx_test_in(x)};
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = mode;
  ndx_future_t* f = NULL;
  CHECK_OK(ndx_invoke(ctx, op, in, 1, NULL, &o, &f));
  ndx_tensor_t* t = ndx_test_output(f, 0);
  if (keep) *keep = f;
  else ndx_future_release(f);
  return t;
}

static void test_graphs_and_breaks(void) {
  ndx_context_t* ctx = deferred_context();
  const float v[3] = {1, 4, 9};
  const int64_t n = 3;
  ndx_tensor_t* x = ndx_test_tensor(v, NDX_DTYPE_FLOAT32, 1, &n);

  /* Graph 0: an evaluate of three recorded invocations. */
  ndx_tensor_t* a = unary(ctx, "sqrt", x, 0, NULL);
  ndx_tensor_t* b = unary(ctx, "neg", a, 0, NULL);
  ndx_tensor_t* c = unary(ctx, "check_finite", b, 0, NULL);
  CHECK_OK(ndx_context_evaluate(ctx));

  /* Graph 1 (a break): reading the data of a pending output. */
  ndx_tensor_t* d = unary(ctx, "abs", c, 0, NULL);
  ndx_tensor_t* e = unary(ctx, "sqrt", d, 0, NULL);
  float got[3] = {0};
  int read_line = __LINE__; CHECK_OK(ndx_tensor_copy_to(e, got, sizeof got));
  CHECK(got[2] > 1.73f && got[2] < 1.74f, "sqrt(3) = %g", got[2]);

  /* Graph 2 (a break): a SYNC_CPU invocation consuming a deferred value. */
  ndx_tensor_t* f = unary(ctx, "neg", x, 0, NULL);
  ndx_input_t in[1] = {ndx_test_in(f)};
  ndx_invoke_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.mode = NDX_EVAL_SYNC_CPU;
  ndx_future_t* sync = NULL;
  int consumer_line = __LINE__; CHECK_OK(ndx_invoke(ctx, "abs", in, 1, NULL, &o, &sync));

  /* Graph 3 (a break): exporting a pending output. */
  ndx_tensor_t* g = unary(ctx, "neg", x, 0, NULL);
  DLManagedTensorVersioned* dl = NULL;
  int export_line = __LINE__; CHECK_OK(ndx_tensor_to_dlpack_versioned(g, &dl));
  if (dl && dl->deleter) dl->deleter(dl);

  /* Graph 4: a wait, asked for; not a break. */
  ndx_future_t* w = NULL;
  ndx_tensor_t* h = unary(ctx, "abs", x, 0, &w);
  CHECK_OK(ndx_future_wait(w, -1));

  /* A flag, and EAGER work that makes no graph. */
  const float bad[1] = {1.0f / 0.0f};
  const int64_t one = 1;
  ndx_tensor_t* inf = ndx_test_tensor(bad, NDX_DTYPE_FLOAT32, 1, &one);
  ndx_tensor_t* k = unary(ctx, "check_finite", inf, NDX_EVAL_EAGER, NULL);
  ndx_error_t* flags = ndx_context_evaluate(ctx);
  CHECK_LINK(flags, NDX_ERROR_CHECK, "1 check failed", NULL, 0);
  ndx_error_free(flags);

  ndx_explain_t* ex = NULL;
  CHECK_OK(ndx_context_explain(ctx, &ex));
  ndx_explain_summary_t s = summary_of(ex);
  CHECK(s.graphs == 5 && s.breaks == 3, "graphs %llu breaks %llu", (unsigned long long)s.graphs,
        (unsigned long long)s.breaks);
  CHECK(s.ops == 10 && s.deferred == 8 && s.sync_cpu == 1 && s.eager == 1 && s.sync_full == 0,
        "ops %llu: deferred %llu sync_cpu %llu eager %llu", (unsigned long long)s.ops,
        (unsigned long long)s.deferred, (unsigned long long)s.sync_cpu,
        (unsigned long long)s.eager);
  CHECK(s.graph_ops == 8 && s.checks_raised == 1, "graph_ops %llu checks %llu",
        (unsigned long long)s.graph_ops, (unsigned long long)s.checks_raised);
  CHECK(ndx_explain_graph_count(ex) == 5, "graph records: %zu", ndx_explain_graph_count(ex));
  const int32_t reasons[5] = {NDX_FLUSH_EVALUATE, NDX_FLUSH_DATA_READ, NDX_FLUSH_CONSUMER,
                              NDX_FLUSH_EXPORT, NDX_FLUSH_WAIT};
  const uint64_t ops[5] = {3, 2, 1, 1, 1};
  for (size_t i = 0; i < 5; i++) {
    ndx_explain_graph_t gr = graph_of(ex, i);
    CHECK(gr.reason == reasons[i] && gr.ops == ops[i] && gr.time_ns >= 0,
          "graph %zu: reason %d ops %llu time %lld", i, gr.reason, (unsigned long long)gr.ops,
          (long long)gr.time_ns);
  }
  CHECK(ndx_explain_break_count(ex) == 3, "break records: %zu", ndx_explain_break_count(ex));
  const int32_t break_reasons[3] = {NDX_FLUSH_DATA_READ, NDX_FLUSH_CONSUMER, NDX_FLUSH_EXPORT};
  const int lines[3] = {read_line, consumer_line, export_line};
  const uint64_t seqs[3] = {5, 6, 8};
  for (size_t i = 0; i < 3; i++) {
    ndx_graph_break_t br = break_of(ex, i);
    CHECK(br.reason == break_reasons[i] && br.graph == i + 1 && br.seq == seqs[i],
          "break %zu: reason %d graph %zu seq %llu", i, br.reason, br.graph,
          (unsigned long long)br.seq);
    CHECK(ndx_test_ends_with(br.file, "test_explain.c") && br.line == (uint32_t)lines[i],
          "break %zu forced at %s:%u, expected line %d", i, NDX_TEST_S(br.file), br.line,
          lines[i]);
  }
  size_t need = ndx_explain_json(ex, NULL, 0);
  char* json = (char*)malloc(need + 1);
  CHECK(ndx_explain_json(ex, json, need + 1) == need, "json length");
  CHECK_CONTAINS(json, "\"graphs_total\": 5");
  CHECK_CONTAINS(json, "\"breaks_total\": 3");
  CHECK_CONTAINS(json, "\"reason\": \"data_read\"");
  CHECK_CONTAINS(json, "test_explain.c");
  free(json);

  /* Argument errors. */
  ndx_explain_graph_t gr;
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  expect_error(ndx_explain_graph(ex, 5, &gr), NDX_ERROR_INDEX, "graph index 5 is out of range");
  gr.struct_size = 8;
  expect_error(ndx_explain_graph(ex, 0, &gr), NDX_ERROR_VALUE, "out->struct_size is 8");
  expect_error(ndx_explain_summary(NULL, NULL), NDX_ERROR_VALUE, "argument 'explain' is NULL");
  CHECK(ndx_explain_graph_count(NULL) == 0 && ndx_explain_json(NULL, NULL, 0) == 0, "NULL");
  ndx_explain_free(ex);
  ndx_explain_free(NULL);

  ndx_tensor_t* ts[10] = {x, a, b, c, d, e, f, g, h, inf};
  for (int i = 0; i < 10; i++) ndx_tensor_release(ts[i]);
  ndx_tensor_release(k);
  ndx_future_release(sync);
  ndx_future_release(w);
  ndx_context_release(ctx);
}

/* A failed summary, graph or break read never leaves stale values behind: with a
 * usable `out` every field after struct_size reads zero. */
static void test_records_cleared_on_failure(void) {
  ndx_context_t* ctx = deferred_context();
  ndx_explain_t* ex = NULL;
  CHECK_OK(ndx_context_explain(ctx, &ex));

  ndx_explain_summary_t s;
  memset(&s, 0x5a, sizeof s);
  s.struct_size = sizeof s;
  expect_error(ndx_explain_summary(NULL, &s), NDX_ERROR_VALUE, "argument 'explain' is NULL");
  CHECK(s.struct_size == sizeof s && s.graphs == 0 && s.ops == 0 && s.eager == 0 &&
            s.checks_raised == 0,
        "stale summary: graphs %llu", (unsigned long long)s.graphs);

  ndx_explain_graph_t g;
  memset(&g, 0x5a, sizeof g);
  g.struct_size = sizeof g;
  expect_error(ndx_explain_graph(ex, 0, &g), NDX_ERROR_INDEX, "graph index 0 is out of range");
  CHECK(g.reason == 0 && g.ops == 0 && g.time_ns == 0 && g.seq == 0, "stale graph: ops %llu",
        (unsigned long long)g.ops);

  ndx_graph_break_t b;
  memset(&b, 0x5a, sizeof b);
  b.struct_size = sizeof b;
  expect_error(ndx_explain_break(ex, 0, &b), NDX_ERROR_INDEX, "break index 0 is out of range");
  CHECK(b.file == NULL && b.function == NULL && b.line == 0 && b.seq == 0 && b.graph == 0,
        "stale break: line %u", b.line);

  ndx_explain_free(ex);
  ndx_context_release(ctx);
}

int main(void) {
  test_graphs_and_breaks();
  test_records_cleared_on_failure();
  return NDX_TEST_SUMMARY("test_explain");
}
