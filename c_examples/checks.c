/*
 * checks.c - checks that do not interrupt the computation, reported with their sites.
 *
 * A preprocessing pipeline normalises a batch of sensor readings and checks them on
 * the way: the readings must be finite, and the normalised values must lie in [-3, 3].
 * With the COLLECT policy a failing check raises a flag and the work goes on; at the
 * end ndx_context_evaluate reports every raised flag in the order the checks were
 * enqueued, each with the line that enqueued it, how many elements failed and the
 * first failing index. The range check's flag is marked as a consequence of the
 * finiteness flag, because it ran on data derived from the flagged readings.
 *
 * Exits 0 when all of that is so, 1 otherwise.
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

/* The line of a flag's innermost frame (0 when it has none). */
static unsigned line_of(const ndx_error_t* e) {
  ndx_frame_t f;
  memset(&f, 0, sizeof f);
  f.struct_size = sizeof f;
  ndx_error_t* err = ndx_error_frame(e, 0, &f);
  if (err) {
    ndx_error_free(err);
    return 0;
  }
  return f.line;
}

int main(void) {
  int good = 0;
  ndx_context_t* ctx = NULL;
  ndx_tensor_t *readings = NULL, *finite = NULL, *centred = NULL, *scaled = NULL;
  ndx_tensor_t *mean = NULL, *checked = NULL;
  ndx_future_t *f_finite = NULL, *f_mean = NULL, *f_centred = NULL, *f_scaled = NULL;
  ndx_future_t* f_range = NULL;
  ndx_args_t* range = NULL;
  ndx_error_t* report = NULL;

  ndx_context_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.eval_mode = NDX_EVAL_DEFERRED;
  opts.check_policy = NDX_CHECKS_COLLECT;
  opts.check_categories = NDX_CHECK_USER;
  if (!ok(ndx_context_new(&opts, &ctx), "ndx_context_new")) goto done;

  /* Reading 5 is a sensor glitch (infinite). */
  const float values[8] = {0.5f, 1.0f, 0.75f, 1.25f, 0.5f, 1.0f / 0.0f, 1.0f, 0.75f};
  const int64_t shape[1] = {8};
  if (!ok(ndx_tensor_from_host(values, NDX_DTYPE_FLOAT32, 1, shape, NULL, NULL, &readings),
          "readings")) {
    goto done;
  }

  ndx_input_t in_readings[1] = {{readings, NULL}};
  int finite_line = __LINE__; ndx_error_t* e = ndx_invoke(ctx, "check_finite", in_readings, 1, NULL, NULL, &f_finite);
  if (!ok(e, "check_finite") || !ok(ndx_future_tensor(f_finite, 0, &finite), "output")) goto done;

  ndx_input_t in_finite[1] = {{finite, NULL}};
  if (!ok(ndx_invoke(ctx, "mean", in_finite, 1, NULL, NULL, &f_mean), "mean") ||
      !ok(ndx_future_tensor(f_mean, 0, &mean), "output")) {
    goto done;
  }
  ndx_input_t in_sub[2] = {{finite, NULL}, {mean, NULL}};
  if (!ok(ndx_invoke(ctx, "sub", in_sub, 2, NULL, NULL, &f_centred), "sub") ||
      !ok(ndx_future_tensor(f_centred, 0, &centred), "output")) {
    goto done;
  }
  ndx_input_t in_scale[2] = {{centred, NULL}, {centred, NULL}};
  if (!ok(ndx_invoke(ctx, "add", in_scale, 2, NULL, NULL, &f_scaled), "add") ||
      !ok(ndx_future_tensor(f_scaled, 0, &scaled), "output")) {
    goto done;
  }

  if (!ok(ndx_args_new(&range), "args") || !ok(ndx_args_set_float(range, "lo", -3.0), "lo") ||
      !ok(ndx_args_set_float(range, "hi", 3.0), "hi")) {
    goto done;
  }
  ndx_input_t in_scaled[1] = {{scaled, NULL}};
  int range_line = __LINE__; e = ndx_invoke(ctx, "check_range", in_scaled, 1, range, NULL, &f_range);
  if (!ok(e, "check_range") || !ok(ndx_future_tensor(f_range, 0, &checked), "output")) goto done;

  /* Nothing has run yet (DEFERRED); evaluate runs the graph and reports the flags. */
  report = ndx_context_evaluate(ctx);
  if (report == NULL || ndx_error_kind(report) != NDX_ERROR_CHECK) {
    fprintf(stderr, "expected a CheckError group\n");
    goto done;
  }
  char text[8192];
  ndx_error_format(report, text, sizeof text);
  printf("%s\n", text);

  size_t n = ndx_error_related_count(report);
  printf("%zu flags, in enqueue order:\n", n);
  for (size_t i = 0; i < n; i++) {
    const ndx_error_t* flag = ndx_error_related(report, i);
    ndx_check_info_t info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ndx_error_check_info(flag, &info);
    printf("  #%llu %s at line %u: %llu failing, first at index %llu%s\n",
           (unsigned long long)ndx_error_sequence(flag), ndx_error_op(flag), line_of(flag),
           (unsigned long long)info.count, (unsigned long long)info.first_index,
           info.consequence_of ? " (a consequence of an earlier flag)" : "");
  }
  const ndx_error_t* first = n == 2 ? ndx_error_related(report, 0) : NULL;
  const ndx_error_t* second = n == 2 ? ndx_error_related(report, 1) : NULL;
  ndx_check_info_t i1, i2;
  memset(&i1, 0, sizeof i1);
  memset(&i2, 0, sizeof i2);
  i1.struct_size = i2.struct_size = sizeof i1;
  good = first && second && ndx_error_check_info(first, &i1) &&
         ndx_error_check_info(second, &i2) && strcmp(ndx_error_op(first), "check_finite") == 0 &&
         line_of(first) == (unsigned)finite_line && i1.first_index == 5 && i1.count == 1 &&
         strcmp(ndx_error_op(second), "check_range") == 0 &&
         line_of(second) == (unsigned)range_line && i2.consequence_of == ndx_error_sequence(first);
  if (!good) fprintf(stderr, "the flags are not what this example expects\n");

done:
  ndx_error_free(report);
  ndx_args_free(range);
  ndx_tensor_release(checked);
  ndx_tensor_release(scaled);
  ndx_tensor_release(centred);
  ndx_tensor_release(mean);
  ndx_tensor_release(finite);
  ndx_tensor_release(readings);
  ndx_future_release(f_range);
  ndx_future_release(f_scaled);
  ndx_future_release(f_centred);
  ndx_future_release(f_mean);
  ndx_future_release(f_finite);
  ndx_context_release(ctx);
  return good ? 0 : 1;
}
