/*
 * async_errors.c - an asynchronous failure still points at the line that asked for it.
 *
 * A context in EAGER mode runs every invocation on worker threads: ndx_invoke returns at
 * once. Here `div` divides two int32 tensors, one divisor is 0, and `sum` adds up the
 * quotients. Neither call fails - the work has not even run yet. The failure surfaces
 * much later, at ndx_future_wait on the sum: a chain of two errors, the sum's ("its
 * input failed") caused by the div's ("integer division by zero"), each carrying the
 * operator, its sequence number and the line of the ndx_invoke call that enqueued it.
 *
 * Exits 0 when all of that is so, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndx.h"

/* Prints an error returned by a call that should have succeeded, frees it, and fails. */
static int ok(ndx_error_t* e, const char* what) {
  if (e == NULL) return 1;
  fprintf(stderr, "%s failed: %s: %s\n", what, ndx_error_kind_name(ndx_error_kind(e)),
          ndx_error_message(e));
  ndx_error_free(e);
  return 0;
}

/* Some other work the program does meanwhile. */
static long busy_work(void) {
  long acc = 0;
  for (long i = 0; i < 1000000; i++) acc += i % 7;
  return acc;
}

int main(void) {
  int good = 0;
  ndx_context_t* ctx = NULL;
  ndx_tensor_t *a = NULL, *b = NULL, *quotients = NULL;
  ndx_future_t *div = NULL, *sum = NULL;
  ndx_error_t* error = NULL;
  char* text = NULL;

  ndx_context_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.eval_mode = NDX_EVAL_EAGER;
  if (!ok(ndx_context_new(&opts, &ctx), "ndx_context_new")) goto done;

  const int32_t numerators[4] = {10, 20, 30, 40};
  const int32_t divisors[4] = {2, 5, 0, 8}; /* element 2 divides by zero */
  const int64_t shape[1] = {4};
  if (!ok(ndx_tensor_from_host(numerators, NDX_DTYPE_INT32, 1, shape, NULL, NULL, &a), "a") ||
      !ok(ndx_tensor_from_host(divisors, NDX_DTYPE_INT32, 1, shape, NULL, NULL, &b), "b")) {
    goto done;
  }

  /* Enqueue the work. Both calls succeed: the division has not happened yet. */
  ndx_input_t div_in[2] = {{a, NULL}, {b, NULL}};
  int div_line = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "div", div_in, 2, NULL, NULL, &div);
  if (!ok(e, "ndx_invoke(div)") || !ok(ndx_future_tensor(div, 0, &quotients), "outputs")) goto done;
  ndx_input_t sum_in[1] = {{quotients, NULL}};
  int sum_line = __LINE__; e = ndx_invoke(ctx, "sum", sum_in, 1, NULL, NULL, &sum);
  if (!ok(e, "ndx_invoke(sum)")) goto done;
  printf("enqueued div (line %d) and sum (line %d); both calls returned no error\n", div_line,
         sum_line);

  printf("doing other work meanwhile (%ld)\n", busy_work());

  /* Much later: the result is needed. */
  error = ndx_future_wait(sum, -1);
  if (error == NULL) {
    fprintf(stderr, "expected the sum to fail\n");
    goto done;
  }
  size_t n = ndx_error_format(error, NULL, 0);
  text = malloc(n + 1);
  if (!text) goto done;
  ndx_error_format(error, text, n + 1);
  printf("\nndx_future_wait(sum) failed:\n\n%s\n", text);

  /* Walk the chain to the div's link: its frame 0 is the line that enqueued it. */
  int links = 0, div_ok = 0, sum_ok = 0;
  for (const ndx_error_t* link = error; link != NULL; link = ndx_error_cause(link)) {
    links++;
    const char* op = ndx_error_op(link);
    ndx_frame_t frame;
    memset(&frame, 0, sizeof frame);
    frame.struct_size = sizeof frame;
    ndx_error_t* fe = ndx_error_frame(link, 0, &frame);
    if (fe) {
      ndx_error_free(fe);
      continue;
    }
    if (op && strcmp(op, "div") == 0) {
      printf("div was enqueued at %s:%u (in %s)\n", frame.file ? frame.file : "?",
             (unsigned)frame.line, frame.function ? frame.function : "?");
      div_ok = ndx_error_kind(link) == NDX_ERROR_VALUE &&
               strstr(ndx_error_message(link), "integer division by zero") != NULL &&
               frame.line == (uint32_t)div_line;
    } else if (op && strcmp(op, "sum") == 0) {
      printf("sum was enqueued at %s:%u\n", frame.file ? frame.file : "?", (unsigned)frame.line);
      sum_ok = ndx_error_kind(link) == NDX_ERROR_VALUE && frame.line == (uint32_t)sum_line;
    }
  }
  good = links == 2 && div_ok && sum_ok && strstr(text, "integer division by zero") != NULL &&
         strstr(text, "The above exception was the direct cause of the following exception:");
  /* The failure was observed by the wait: nothing is left for ndx_context_evaluate. */
  ndx_error_t* rest = ndx_context_evaluate(ctx);
  good = good && rest == NULL;
  ndx_error_free(rest);
  printf("%s\n", good ? "as expected" : "NOT as expected");

done:
  free(text);
  ndx_error_free(error);
  ndx_future_release(sum);
  ndx_future_release(div);
  ndx_tensor_release(quotients);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_context_release(ctx);
  return good ? 0 : 1;
}
