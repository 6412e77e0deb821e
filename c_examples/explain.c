/*
 * explain.c - what did my deferred pipeline actually run?
 *
 * A DEFERRED context records a small preprocessing pipeline and should run it as one
 * graph at ndx_context_evaluate. But in the middle the program peeks at an
 * intermediate value (ndx_tensor_copy_to), which forces the recorded work to run
 * early: a graph break. ndx_context_explain shows two graphs instead of one, and the
 * break names its reason and the line that forced it - the place to fix.
 *
 * Exits 0 when the report shows that, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndx.h"

static int ok(ndx_error_t* e, const char* what) {
  if (e == NULL) return 1;
  fprintf(stderr, "%s failed: %s: %s\n", what, ndx_error_kind_name(ndx_error_kind(e)),
          ndx_error_message(e));
  ndx_error_free(e);
  return 0;
}

/* Enqueues a one-input operator and returns its (pending) output, or NULL. */
static ndx_tensor_t* step(ndx_context_t* ctx, const char* op, const ndx_tensor_t* x) {
  ndx_input_t in[1] = {{x, NULL}};
  ndx_future_t* f = NULL;
  ndx_tensor_t* out = NULL;
  if (ok(ndx_invoke(ctx, op, in, 1, NULL, NULL, &f), op)) ok(ndx_future_tensor(f, 0, &out), op);
  ndx_future_release(f); /* the output keeps the work alive */
  return out;
}

int main(void) {
  int good = 0;
  ndx_context_t* ctx = NULL;
  ndx_tensor_t *x = NULL, *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  ndx_explain_t* ex = NULL;
  char* json = NULL;

  ndx_context_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.eval_mode = NDX_EVAL_DEFERRED;
  if (!ok(ndx_context_new(&opts, &ctx), "ndx_context_new")) goto done;

  const float values[4] = {1.0f, 4.0f, 9.0f, 16.0f};
  const int64_t shape[1] = {4};
  if (!ok(ndx_tensor_from_host(values, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &x), "x")) {
    goto done;
  }
  a = step(ctx, "sqrt", x);
  b = step(ctx, "neg", a);
  if (!a || !b) goto done;
  float peek[4];
  int peek_line = __LINE__; ndx_error_t* e = ndx_tensor_copy_to(b, peek, sizeof peek); /* the break */
  if (!ok(e, "ndx_tensor_copy_to")) goto done;
  c = step(ctx, "abs", b);
  d = step(ctx, "sigmoid", c);
  if (!c || !d || !ok(ndx_context_evaluate(ctx), "ndx_context_evaluate")) goto done;

  if (!ok(ndx_context_explain(ctx, &ex), "ndx_context_explain")) goto done;
  ndx_explain_summary_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (!ok(ndx_explain_summary(ex, &s), "ndx_explain_summary")) goto done;
  printf("%llu invocations ran in %llu graphs; %llu graph break(s)\n",
         (unsigned long long)s.ops, (unsigned long long)s.graphs, (unsigned long long)s.breaks);
  for (size_t i = 0; i < ndx_explain_graph_count(ex); i++) {
    ndx_explain_graph_t g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    if (!ok(ndx_explain_graph(ex, i, &g), "ndx_explain_graph")) goto done;
    printf("  graph %zu: %llu ops, %lld ns\n", i, (unsigned long long)g.ops, (long long)g.time_ns);
  }
  ndx_graph_break_t br;
  memset(&br, 0, sizeof br);
  br.struct_size = sizeof br;
  if (!ok(ndx_explain_break(ex, 0, &br), "ndx_explain_break")) goto done;
  printf("  break before graph %zu: reading data of invocation #%llu at %s:%u\n", br.graph,
         (unsigned long long)br.seq, br.file ? br.file : "?", br.line);

  size_t n = ndx_explain_json(ex, NULL, 0);
  json = (char*)malloc(n + 1);
  if (json && ndx_explain_json(ex, json, n + 1) == n) printf("%s\n", json);

  good = s.graphs == 2 && s.breaks == 1 && br.reason == NDX_FLUSH_DATA_READ && br.seq == 2 &&
         br.line == (unsigned)peek_line;
  if (!good) fprintf(stderr, "the report is not what this example expects\n");

done:
  free(json);
  ndx_explain_free(ex);
  ndx_tensor_release(d);
  ndx_tensor_release(c);
  ndx_tensor_release(b);
  ndx_tensor_release(a);
  ndx_tensor_release(x);
  ndx_context_release(ctx);
  return good ? 0 : 1;
}
