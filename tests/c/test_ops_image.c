/* Tests of the joining and image operators through the C API: concat (values, promotion
 * of int8 + uint8 + float16 to float16, a shape mismatch refused at ndx_invoke), stack,
 * crop, resize (OpenCV's linear rule for uint8, bad sizes, an unknown interp, bool),
 * rgb_to_gray, normalize, a ragged batch of HWC images imported with a layout and resized
 * per sample, the same resize in DEFERRED and EAGER modes, batch_to_tensor refusing
 * samples whose layouts differ at ndx_invoke and stacking samples from pageable, pinned
 * and managed host memory.
 *
 * Every expected value is computed by hand (the resize and gray values agree with
 * cv2.resize(INTER_LINEAR) and cv2.cvtColor(COLOR_RGB2GRAY)), never by ndx itself.
 * Every invocation passes NDX_HERE; call-time errors are checked to come from ndx_invoke
 * itself (the out-param stays NULL) with their kind and a message fragment.
 *
 * CMake compiles this at -O0 and -O2 and runs the -O0 build under valgrind: every
 * handle is released and every error freed. */
#include "ndx_test.h"

#define THIS_FILE "test_ops_image.c"

/* ---- helpers ------------------------------------------------------------------------- */

static ndx_context_t* make_ctx(int32_t mode) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = mode;
  o.num_threads = 2;
  return ndx_test_new_context(&o);
}

/* A new host tensor copied from `data`, with `layout` (NULL: none). Aborts on failure. */
static ndx_tensor_t* mk(const void* data, int32_t dtype, int32_t ndim, const int64_t* shape,
                        const char* layout) {
  ndx_import_options_t o = ndx_test_options(layout, false);
  ndx_tensor_t* t = NULL;
  ndx_error_t* e = ndx_tensor_from_host(data, dtype, ndim, shape, NULL, layout ? &o : NULL, &t);
  if (e != NULL || t == NULL) {
    fprintf(stderr, "ndx_tensor_from_host failed: %s\n", NDX_TEST_S(ndx_error_message(e)));
    abort();
  }
  return t;
}

static ndx_args_t* new_args(void) {
  ndx_args_t* a = NULL;
  ndx_error_t* e = ndx_args_new(&a);
  if (e != NULL || a == NULL) {
    fprintf(stderr, "ndx_args_new failed: %s\n", NDX_TEST_S(ndx_error_message(e)));
    abort();
  }
  return a;
}

static ndx_args_t* crop_args(int64_t x, int64_t y, int64_t w, int64_t h) {
  ndx_args_t* a = new_args();
  CHECK_OK(ndx_args_set_int(a, "x", x));
  CHECK_OK(ndx_args_set_int(a, "y", y));
  CHECK_OK(ndx_args_set_int(a, "w", w));
  CHECK_OK(ndx_args_set_int(a, "h", h));
  return a;
}

/* resize args; interp NULL: not given. */
static ndx_args_t* resize_args(int64_t h, int64_t w, const char* interp) {
  ndx_args_t* a = new_args();
  CHECK_OK(ndx_args_set_int(a, "h", h));
  CHECK_OK(ndx_args_set_int(a, "w", w));
  if (interp) CHECK_OK(ndx_args_set_string(a, "interp", interp));
  return a;
}

/* ndx_invoke with NDX_HERE and an eval mode (0: the context's). */
#define INVOKE(ctx, op, in, n, args, eval_mode, out)                                              \
  ndx_invoke((ctx), (op), (in), (n), (args),                                                \
             &(ndx_invoke_options_t){.struct_size = sizeof(ndx_invoke_options_t),  \
                                     .location = NDX_HERE, .mode = (eval_mode)}, (out))

/* Waits for f (which must succeed) and returns its output 0, or NULL (reported). Releases
 * the future. */
static ndx_tensor_t* finish(ndx_future_t* f) {
  if (!CHECK(f != NULL, "a future")) return NULL;
  ndx_tensor_t* t = NULL;
  if (CHECK_OK(ndx_future_wait(f, -1))) {
    CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "READY after a successful wait");
    t = ndx_test_output(f, 0);
  }
  ndx_future_release(f);
  return t;
}

/* Invokes `op` (which must be accepted and succeed) and returns its output 0, or NULL. */
static ndx_tensor_t* run_op(const ndx_context_t* ctx, const char* op, const ndx_input_t* in,
                            size_t n, const ndx_args_t* args) {
  ndx_future_t* f = NULL;
  if (!CHECK_OK(INVOKE(ctx, op, in, n, args, 0, &f))) {
    ndx_future_release(f);
    return NULL;
  }
  return finish(f);
}

/* Invokes `op`, which must fail AT ndx_invoke with `kind` and a message containing `frag`
 * (and leave the future NULL). The error's site is the NDX_HERE location of the call. */
static void expect_invoke_error(const ndx_context_t* ctx, const char* op, const ndx_input_t* in,
                                size_t n, const ndx_args_t* args, int32_t mode, int kind,
                                const char* frag) {
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  int line = __LINE__ + 1;
  ndx_error_t* e = INVOKE(ctx, op, in, n, args, mode, &f);
  if (CHECK(e != NULL, "'%s' was accepted by ndx_invoke; expected an error containing \"%s\"",
            op, frag)) {
    CHECK_FRAME(e, 0, THIS_FILE, line, "expect_invoke_error", NDX_FRAME_HOST);
    CHECK_STR_EQ(ndx_error_op(e), op);
  }
  expect_error(e, kind, frag);
  CHECK(f == NULL, "'%s': the future out-param is NULL after a call-time error", op);
  if (f != NULL && f != NDX_TEST_BOGUS_PTR) {
    ndx_error_free(ndx_future_wait(f, -1));
    ndx_future_release(f);
  }
}

static void check_meta(const ndx_tensor_t* t, int32_t dtype, int32_t ndim, const int64_t* shape,
                       const char* layout) {
  int32_t d = 0, nd = -1;
  const int64_t* s = NULL;
  const char* l = NULL;
  CHECK_OK(ndx_tensor_dtype(t, &d));
  CHECK(d == dtype, "dtype %d (%s), expected %d (%s)", (int)d, NDX_TEST_S(ndx_dtype_name(d)),
        (int)dtype, NDX_TEST_S(ndx_dtype_name(dtype)));
  CHECK_OK(ndx_tensor_ndim(t, &nd));
  if (CHECK(nd == ndim, "ndim %d, expected %d", (int)nd, (int)ndim)) {
    CHECK_OK(ndx_tensor_shape(t, &s));
    if (ndim > 0) CHECK_I64_ARRAY(s, shape, ndim);
  }
  CHECK_OK(ndx_tensor_layout(t, &l));
  CHECK_STR_EQ(l, layout);
}

/* Compares the tensor's compact bytes with `expected` (n bytes), printing both. */
static int check_bytes_(const ndx_tensor_t* t, const void* expected, size_t n, int line) {
  unsigned char got[256];
  size_t nbytes = 0;
  if (!CHECK_OK(ndx_tensor_nbytes(t, &nbytes))) return 0;
  if (!CHECK(nbytes == n && n <= sizeof got, "line %d: nbytes %zu, expected %zu", line, nbytes,
             n)) {
    return 0;
  }
  if (!CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got))) return 0;
  int ok = memcmp(got, expected, n) == 0;
  if (!ok) {
    const unsigned char* x = (const unsigned char*)expected;
    fprintf(stderr, "  line %d: got bytes     ", line);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %u", got[i]);
    fprintf(stderr, "\n  line %d: expected bytes", line);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %u", x[i]);
    fprintf(stderr, "\n");
  }
  return CHECK(ok, "values (line %d)", line);
}
#define CHECK_BYTES(t, expected, n) check_bytes_((t), (expected), (n), __LINE__)

/* ---- concat and stack ------------------------------------------------------------------ */

static NDX_TEST_NOINLINE void test_concat(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  const int64_t s22[2] = {2, 2}, s12[2] = {1, 2}, s21[2] = {2, 1}, s13[2] = {1, 3};
  const int32_t va[4] = {1, 2, 3, 4}, vb[2] = {5, 6}, vc[2] = {7, 8}, vd[3] = {9, 9, 9};
  ndx_tensor_t* a = mk(va, NDX_DTYPE_INT32, 2, s22, NULL);
  ndx_tensor_t* b = mk(vb, NDX_DTYPE_INT32, 2, s12, NULL);
  ndx_tensor_t* c = mk(vc, NDX_DTYPE_INT32, 2, s21, NULL);
  ndx_tensor_t* d = mk(vd, NDX_DTYPE_INT32, 2, s13, NULL);

  /* (2,2) + (1,2) along axis 0 -> (3,2). */
  ndx_args_t* axis0 = new_args();
  CHECK_OK(ndx_args_set_int(axis0, "axis", 0));
  ndx_input_t ab[2] = {ndx_test_in(a), ndx_test_in(b)};
  ndx_tensor_t* r = run_op(ctx, "concat", ab, 2, axis0);
  if (r) {
    const int64_t s32[2] = {3, 2};
    const int32_t expect[6] = {1, 2, 3, 4, 5, 6};
    check_meta(r, NDX_DTYPE_INT32, 2, s32, "");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* The default axis is 0 too. */
  r = run_op(ctx, "concat", ab, 2, NULL);
  if (r) {
    const int32_t expect[6] = {1, 2, 3, 4, 5, 6};
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* (2,2) + (2,1) along axis -1 -> (2,3): rows interleave. */
  ndx_args_t* axis_last = new_args();
  CHECK_OK(ndx_args_set_int(axis_last, "axis", -1));
  ndx_input_t ac[2] = {ndx_test_in(a), ndx_test_in(c)};
  r = run_op(ctx, "concat", ac, 2, axis_last);
  if (r) {
    const int64_t s23[2] = {2, 3};
    const int32_t expect[6] = {1, 2, 7, 3, 4, 8};
    check_meta(r, NDX_DTYPE_INT32, 2, s23, "");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* (2,2) + (1,3) along axis 0: refused at ndx_invoke, naming input 1 and both shapes. */
  ndx_input_t ad[2] = {ndx_test_in(a), ndx_test_in(d)};
  expect_invoke_error(ctx, "concat", ad, 2, axis0, 0, NDX_ERROR_VALUE, "input 1 has shape");
  expect_invoke_error(ctx, "concat", ad, 2, axis0, 0, NDX_ERROR_VALUE,
                      "input 1 has shape [1, 3], which does not match input 0's [2, 2]");
  /* Also in DEFERRED mode: metadata is inferred at invoke whatever the mode. */
  expect_invoke_error(ctx, "concat", ad, 2, axis0, NDX_EVAL_DEFERRED, NDX_ERROR_VALUE,
                      "input 1 has shape");

  /* Broadcast views of 2^62 elements: their extents along axis 0 add up past int64,
   * refused at ndx_invoke (the sum once overflowed: a panic, NDX_ERROR_INTERNAL). */
  uint8_t one = 7;
  const int64_t huge_shape[2] = {INT64_C(1) << 62, 1}, zero_strides[2] = {0, 0};
  ndx_tensor_t* huge = NULL;
  CHECK_OK(ndx_tensor_wrap_host(&one, NDX_DTYPE_UINT8, 2, huge_shape, zero_strides, NULL, NULL,
                                NULL, &huge));
  ndx_input_t hh[2] = {ndx_test_in(huge), ndx_test_in(huge)};
  expect_invoke_error(ctx, "concat", hh, 2, NULL, 0, NDX_ERROR_VALUE,
                      "operator 'concat': the extents along axis 0 add up past int64 at input 1");
  ndx_tensor_release(huge);

  /* An empty broadcast view of [0, 2^62] and a [0, 1] tensor along the last axis: an empty
   * [0, 2^62 + 1]. The first input's block along the axis (2^62 float32) once overflowed when
   * counted in bytes while running (a panic, NDX_ERROR_INTERNAL in debug builds). */
  float fone = 0.0f;
  const int64_t empty_huge[2] = {0, INT64_C(1) << 62}, empty_one[2] = {0, 1};
  ndx_tensor_t* eh = NULL;
  CHECK_OK(ndx_tensor_wrap_host(&fone, NDX_DTYPE_FLOAT32, 2, empty_huge, zero_strides, NULL, NULL,
                                NULL, &eh));
  ndx_tensor_t* e1 = mk(&fone, NDX_DTYPE_FLOAT32, 2, empty_one, NULL);
  ndx_args_t* minus1 = new_args();
  CHECK_OK(ndx_args_set_int(minus1, "axis", -1));
  ndx_input_t ee[2] = {ndx_test_in(eh), ndx_test_in(e1)};
  r = run_op(ctx, "concat", ee, 2, minus1);
  if (r) {
    const int64_t joined[2] = {0, (INT64_C(1) << 62) + 1};
    check_meta(r, NDX_DTYPE_FLOAT32, 2, joined, "");
    size_t nbytes = 1;
    CHECK_OK(ndx_tensor_nbytes(r, &nbytes));
    CHECK(nbytes == 0, "an empty output of %zu bytes", nbytes);
    ndx_tensor_release(r);
  }
  ndx_args_free(minus1);
  ndx_tensor_release(e1);
  ndx_tensor_release(eh);

  /* int8 + uint8 + float16 -> float16 (np.result_type, not a left fold to float32). */
  const int64_t s2[1] = {2};
  const int8_t v8[2] = {-1, 2};
  const uint8_t vu8[2] = {200, 3};
  const uint16_t vh[2] = {0x3800 /* 0.5 */, 0x3E00 /* 1.5 */};
  ndx_tensor_t* t8 = mk(v8, NDX_DTYPE_INT8, 1, s2, NULL);
  ndx_tensor_t* tu8 = mk(vu8, NDX_DTYPE_UINT8, 1, s2, NULL);
  ndx_tensor_t* th = mk(vh, NDX_DTYPE_FLOAT16, 1, s2, NULL);
  ndx_input_t mixed[3] = {ndx_test_in(t8), ndx_test_in(tu8), ndx_test_in(th)};
  r = run_op(ctx, "concat", mixed, 3, NULL);
  if (r) {
    const int64_t s6[1] = {6};
    /* -1, 2, 200, 3, 0.5, 1.5 as IEEE half bit patterns. */
    const uint16_t expect[6] = {0xBC00, 0x4000, 0x5A40, 0x4200, 0x3800, 0x3E00};
    check_meta(r, NDX_DTYPE_FLOAT16, 1, s6, "");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* stack of two (2,) -> (2,2). */
  const int32_t v12[2] = {1, 2}, v34[2] = {3, 4};
  ndx_tensor_t* p = mk(v12, NDX_DTYPE_INT32, 1, s2, NULL);
  ndx_tensor_t* q = mk(v34, NDX_DTYPE_INT32, 1, s2, NULL);
  ndx_input_t pq[2] = {ndx_test_in(p), ndx_test_in(q)};
  r = run_op(ctx, "stack", pq, 2, NULL);
  if (r) {
    const int32_t expect[4] = {1, 2, 3, 4};
    check_meta(r, NDX_DTYPE_INT32, 2, s22, "");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);
  /* ... and along axis 1: columns. */
  ndx_args_t* axis1 = new_args();
  CHECK_OK(ndx_args_set_int(axis1, "axis", 1));
  r = run_op(ctx, "stack", pq, 2, axis1);
  if (r) {
    const int32_t expect[4] = {1, 3, 2, 4};
    check_meta(r, NDX_DTYPE_INT32, 2, s22, "");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  ndx_args_free(axis0);
  ndx_args_free(axis_last);
  ndx_args_free(axis1);
  ndx_tensor_release(a);
  ndx_tensor_release(b);
  ndx_tensor_release(c);
  ndx_tensor_release(d);
  ndx_tensor_release(t8);
  ndx_tensor_release(tu8);
  ndx_tensor_release(th);
  ndx_tensor_release(p);
  ndx_tensor_release(q);
  ndx_context_release(ctx);
}

/* ---- crop ---------------------------------------------------------------------------------- */

static NDX_TEST_NOINLINE void test_crop(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  const int64_t s342[3] = {3, 4, 2};
  uint8_t v[24];
  for (int i = 0; i < 24; i++) v[i] = (uint8_t)i;
  ndx_tensor_t* img = mk(v, NDX_DTYPE_UINT8, 3, s342, "HWC");
  ndx_tensor_t* plain = mk(v, NDX_DTYPE_UINT8, 3, s342, NULL);
  ndx_input_t in[1] = {ndx_test_in(img)};
  ndx_input_t in_plain[1] = {ndx_test_in(plain)};

  ndx_args_t* ok = crop_args(1, 1, 2, 2);
  ndx_tensor_t* r = run_op(ctx, "crop", in, 1, ok);
  if (r) {
    /* Rows 1-2, columns 1-2, both channels: pixel (y, x) starts at byte 8y + 2x. */
    const int64_t s222[3] = {2, 2, 2};
    const uint8_t expect[8] = {10, 11, 12, 13, 18, 19, 20, 21};
    check_meta(r, NDX_DTYPE_UINT8, 3, s222, "HWC");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* x + w = 5 > 4: outside the 4x3 (w x h) image. */
  ndx_args_t* outside = crop_args(3, 1, 2, 2);
  expect_invoke_error(ctx, "crop", in, 1, outside, 0, NDX_ERROR_VALUE,
                      "not inside the 4x3 image");
  expect_invoke_error(ctx, "crop", in, 1, outside, 0, NDX_ERROR_VALUE,
                      "crop window x=3 y=1 w=2 h=2");
  /* y + h = 4 > 3. */
  ndx_args_t* too_low = crop_args(0, 2, 1, 2);
  expect_invoke_error(ctx, "crop", in, 1, too_low, 0, NDX_ERROR_VALUE,
                      "not inside the 4x3 image");
  /* The message says which rule the window breaks (it named only the window). */
  expect_invoke_error(ctx, "crop", in, 1, outside, 0, NDX_ERROR_VALUE,
                      "is not inside the 4x3 image: x + w = 5 is past the width 4");
  expect_invoke_error(ctx, "crop", in, 1, too_low, 0, NDX_ERROR_VALUE,
                      "is not inside the 4x3 image: y + h = 4 is past the height 3");
  ndx_args_t* empty = crop_args(0, 0, 2, 0);
  expect_invoke_error(ctx, "crop", in, 1, empty, 0, NDX_ERROR_VALUE,
                      "crop window x=0 y=0 w=2 h=0 is not inside the 4x3 image: h = 0; "
                      "expected a size >= 1");
  ndx_args_free(empty);
  /* An image without a layout. */
  expect_invoke_error(ctx, "crop", in_plain, 1, ok, 0, NDX_ERROR_VALUE,
                      "layout \"HWC\" or \"CHW\"");

  ndx_args_free(ok);
  ndx_args_free(outside);
  ndx_args_free(too_low);
  ndx_tensor_release(img);
  ndx_tensor_release(plain);
  ndx_context_release(ctx);
}

/* ---- resize --------------------------------------------------------------------------------- */

/* [[0, 100], [200, 255]] as a 2x2x1 HWC image, and its 4x4 linear resize. By hand
 * (docs/operators.md): source coordinate (d + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25.
 * Columns: the clamped ones (d = 0, 3) take weight 0, so rows become [0, 25, 75, 100] and
 * [200, 213.75, 241.25, 255]. Rows: d = 0 blends row 0 with itself, d = 1 is 0.75 row 0 +
 * 0.25 row 1, d = 2 the reverse, d = 3 is row 1: [50, 72.19, 116.56, 138.75] and
 * [150, 166.56, 199.69, 216.25], rounded. Equal to cv2.resize(INTER_LINEAR). */
static const uint8_t kSmall[4] = {0, 100, 200, 255};
static const int64_t kShape221[3] = {2, 2, 1};
static const int64_t kShape441[3] = {4, 4, 1};
static const uint8_t kResized4x4[16] = {0,   25,  75,  100, 50,  72,  117, 139,
                                        150, 167, 200, 216, 200, 214, 241, 255};

static NDX_TEST_NOINLINE void test_resize(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  ndx_tensor_t* img = mk(kSmall, NDX_DTYPE_UINT8, 3, kShape221, "HWC");
  ndx_input_t in[1] = {ndx_test_in(img)};

  ndx_args_t* linear = resize_args(4, 4, "linear");
  ndx_tensor_t* r = run_op(ctx, "resize", in, 1, linear);
  if (r) {
    check_meta(r, NDX_DTYPE_UINT8, 3, kShape441, "HWC");
    CHECK_BYTES(r, kResized4x4, sizeof kResized4x4);
  }
  ndx_tensor_release(r);

  /* interp defaults to linear. */
  ndx_args_t* dflt = resize_args(4, 4, NULL);
  r = run_op(ctx, "resize", in, 1, dflt);
  if (r) CHECK_BYTES(r, kResized4x4, sizeof kResized4x4);
  ndx_tensor_release(r);

  /* nearest: source pixel min(floor((d + 0.5) * 2 / 4), 1) = 0, 0, 1, 1. */
  ndx_args_t* nearest = resize_args(4, 4, "nearest");
  r = run_op(ctx, "resize", in, 1, nearest);
  if (r) {
    const uint8_t expect[16] = {0,   0,   100, 100, 0,   0,   100, 100,
                                200, 200, 255, 255, 200, 200, 255, 255};
    check_meta(r, NDX_DTYPE_UINT8, 3, kShape441, "HWC");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* Bad requests, all refused at ndx_invoke. */
  ndx_args_t* zero_h = resize_args(0, 4, NULL);
  expect_invoke_error(ctx, "resize", in, 1, zero_h, 0, NDX_ERROR_VALUE, "resize to");
  expect_invoke_error(ctx, "resize", in, 1, zero_h, 0, NDX_ERROR_VALUE,
                      "resize to h = 0, w = 4: argument 'h' is 0; expected a size >= 1");
  ndx_args_t* cubic = resize_args(4, 4, "cubic");
  expect_invoke_error(ctx, "resize", in, 1, cubic, 0, NDX_ERROR_VALUE, "interp");
  expect_invoke_error(ctx, "resize", in, 1, cubic, 0, NDX_ERROR_VALUE, "\"cubic\"");

  const uint8_t bools[4] = {0, 1, 1, 0};
  ndx_tensor_t* bimg = mk(bools, NDX_DTYPE_BOOL, 3, kShape221, "HWC");
  ndx_input_t bin[1] = {ndx_test_in(bimg)};
  expect_invoke_error(ctx, "resize", bin, 1, linear, 0, NDX_ERROR_TYPE, "bool");

  /* An output too large to address is refused at ndx_invoke, in DEFERRED mode too (whose
   * pending output would otherwise lend metadata it cannot represent), naming h; any
   * other operator's such output by the generic check (a broadcast of zero-stride views). */
  ndx_args_t* huge = resize_args(INT64_C(1) << 62, 4, NULL);
  const int8_t one = 1;
  const int64_t col_shape[2] = {INT64_C(1) << 32, 1}, row_shape[2] = {1, INT64_C(1) << 32};
  const int64_t zero_strides[2] = {0, 0};
  ndx_tensor_t *col = NULL, *row = NULL;
  CHECK_OK(ndx_tensor_wrap_host((void*)&one, NDX_DTYPE_INT8, 2, col_shape, zero_strides, NULL,
                                NULL, NULL, &col));
  CHECK_OK(ndx_tensor_wrap_host((void*)&one, NDX_DTYPE_INT8, 2, row_shape, zero_strides, NULL,
                                NULL, NULL, &row));
  ndx_input_t col_row[2] = {ndx_test_in(col), ndx_test_in(row)};
  const int32_t modes[2] = {NDX_EVAL_DEFERRED, NDX_EVAL_EAGER};
  for (int m = 0; m < 2; m++) {
    expect_invoke_error(ctx, "resize", in, 1, huge, modes[m], NDX_ERROR_VALUE,
                        "resize to h = 4611686018427387904, w = 4: the output of shape "
                        "[4611686018427387904, 4, 1] (uint8) is too large to address");
    expect_invoke_error(ctx, "add", col_row, 2, NULL, modes[m], NDX_ERROR_VALUE,
                        "operator 'add': output 0: shape [4294967296, 4294967296] of int8 "
                        "(itemsize 1) is too large to address");
  }

  /* An output that fits the address space but not the machine (256 TiB) fails when its
   * work runs, with NDX_ERROR_MEMORY naming the output, the size asked for and what the
   * system had available, at the invocation's line. */
  ndx_args_t* vast = resize_args(INT64_C(1) << 24, INT64_C(1) << 24, NULL);
  ndx_future_t* vf = NULL;
  const int vast_line = __LINE__ + 1;
  CHECK_OK(INVOKE(ctx, "resize", in, 1, vast, NDX_EVAL_EAGER, &vf));
  ndx_error_t* ve = ndx_future_wait(vf, -1);
  if (CHECK(ve != NULL, "the 256 TiB resize failed")) {
    CHECK_FRAME(ve, 0, THIS_FILE, vast_line, "test_resize", NDX_FRAME_HOST);
    CHECK_CONTAINS(ndx_error_message(ve), " available; ndx released ");
  }
  expect_error(ve, NDX_ERROR_MEMORY,
               "the output of shape [16777216, 16777216, 1] (uint8): cannot allocate "
               "256.00 TiB (281474976710656 bytes) of host memory: ");
  ndx_future_release(vf);

  ndx_args_free(linear);
  ndx_args_free(dflt);
  ndx_args_free(nearest);
  ndx_args_free(zero_h);
  ndx_args_free(cubic);
  ndx_args_free(huge);
  ndx_args_free(vast);
  ndx_tensor_release(img);
  ndx_tensor_release(bimg);
  ndx_tensor_release(col);
  ndx_tensor_release(row);
  ndx_context_release(ctx);
}

/* ---- rgb_to_gray and normalize ----------------------------------------------------------- */

static NDX_TEST_NOINLINE void test_gray_and_normalize(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);

  /* OpenCV's 15-bit fixed point: (255 * 9798 + 2^14) >> 15 = 76 and
   * (255 * 19235 + 2^14) >> 15 = 150 (cv2.cvtColor(COLOR_RGB2GRAY) agrees). */
  const int64_t s123[3] = {1, 2, 3};
  const uint8_t rgb[6] = {255, 0, 0, 0, 255, 0};
  ndx_tensor_t* img = mk(rgb, NDX_DTYPE_UINT8, 3, s123, "HWC");
  ndx_input_t in[1] = {ndx_test_in(img)};
  ndx_tensor_t* r = run_op(ctx, "rgb_to_gray", in, 1, NULL);
  if (r) {
    const int64_t s121[3] = {1, 2, 1};
    const uint8_t expect[2] = {76, 150};
    check_meta(r, NDX_DTYPE_UINT8, 3, s121, "HWC");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  const int64_t s122[3] = {1, 2, 2};
  const uint8_t two[4] = {1, 2, 3, 4};
  ndx_tensor_t* img2 = mk(two, NDX_DTYPE_UINT8, 3, s122, "HWC");
  ndx_input_t in2[1] = {ndx_test_in(img2)};
  expect_invoke_error(ctx, "rgb_to_gray", in2, 1, NULL, 0, NDX_ERROR_VALUE, "3 or 4 channels");

  /* CHW 2x1x2: channel 0 = [4, 0], channel 1 = [7, 2]; mean [1, 2], std [2, 4]:
   * (4-1)/2, (0-1)/2, (7-2)/4, (2-2)/4 = 1.5, -0.5, 1.25, 0 (exact in float32). */
  const int64_t s212[3] = {2, 1, 2};
  const uint8_t chw[4] = {4, 0, 7, 2};
  ndx_tensor_t* cimg = mk(chw, NDX_DTYPE_UINT8, 3, s212, "CHW");
  ndx_input_t cin[1] = {ndx_test_in(cimg)};
  ndx_args_t* ms = new_args();
  const double mean[2] = {1.0, 2.0}, stdv[2] = {2.0, 4.0};
  CHECK_OK(ndx_args_set_float_array(ms, "mean", mean, 2));
  CHECK_OK(ndx_args_set_float_array(ms, "std", stdv, 2));
  r = run_op(ctx, "normalize", cin, 1, ms);
  if (r) {
    const float expect[4] = {1.5f, -0.5f, 1.25f, 0.0f};
    check_meta(r, NDX_DTYPE_FLOAT32, 3, s212, "CHW");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);

  /* The same with int arrays for mean and std (a float-array argument converts them, as
   * it does a single int; they were refused: "is an int array, expected a float array"). */
  ndx_args_t* mi = new_args();
  const int64_t imean[2] = {1, 2}, istd[2] = {2, 4};
  CHECK_OK(ndx_args_set_int_array(mi, "mean", imean, 2));
  CHECK_OK(ndx_args_set_int_array(mi, "std", istd, 2));
  r = run_op(ctx, "normalize", cin, 1, mi);
  if (r) {
    const float expect[4] = {1.5f, -0.5f, 1.25f, 0.0f};
    check_meta(r, NDX_DTYPE_FLOAT32, 3, s212, "CHW");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);
  ndx_args_free(mi);

  /* A zero in std: the message names the argument, the index and value of the zero
   * (it said only "'std' contains 0"). */
  ndx_args_t* mz = new_args();
  const double zstd[2] = {2.0, 0.0};
  CHECK_OK(ndx_args_set_float_array(mz, "mean", mean, 2));
  CHECK_OK(ndx_args_set_float_array(mz, "std", zstd, 2));
  expect_invoke_error(ctx, "normalize", cin, 1, mz, 0, NDX_ERROR_VALUE,
                      "operator 'normalize': argument 'std' [2.0, 0.0] has 0.0 at index 1; expected a "
                      "non-zero value");
  ndx_args_free(mz);

  /* A mean of the wrong length says what is accepted: one value, or one per channel. */
  ndx_args_t* mc = new_args();
  const double one[1] = {1.0}, three[3] = {1.0, 2.0, 3.0};
  CHECK_OK(ndx_args_set_float_array(mc, "mean", three, 3));
  CHECK_OK(ndx_args_set_float_array(mc, "std", one, 1));
  expect_invoke_error(ctx, "normalize", cin, 1, mc, 0, NDX_ERROR_VALUE,
                      "argument 'mean' has 3 values, the image has 2 channels; expected 1 (for "
                      "every channel) or 2");
  ndx_args_free(mc);

  ndx_args_free(ms);
  ndx_tensor_release(img);
  ndx_tensor_release(img2);
  ndx_tensor_release(cimg);
  ndx_context_release(ctx);
}

/* ---- a ragged batch ------------------------------------------------------------------------ */

/* Two HWC uint8 images imported as one batch with layout "HWC" (DLPack is the only way the
 * C API builds a batch): 2x2x1 [0, 100, 200, 255] and 3x5x1 with pixel (y, x) = 50y + 10x.
 * Resized to 2x2: the first keeps its pixels (same size); for the second the source
 * coordinates are x = 0.75, 3.25 and y = 0.25, 1.75, and a linear blend of a linear image
 * is exact: 50y + 10x = 20, 45, 95, 120 (cv2.resize agrees). */
static NDX_TEST_NOINLINE void test_batch(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  const int64_t s351[3] = {3, 5, 1};
  uint8_t big[15];
  for (int y = 0; y < 3; y++) {
    for (int x = 0; x < 5; x++) big[y * 5 + x] = (uint8_t)(50 * y + 10 * x);
  }
  int deleted[2] = {0, 0};
  DLManagedTensorVersioned* v[2];
  v[0] = ndx_test_versioned(&deleted[0], ndx_test_dl_dtype(kDLUInt, 8, 1), 3, kShape221, NULL,
                            kSmall, sizeof kSmall);
  v[1] = ndx_test_versioned(&deleted[1], ndx_test_dl_dtype(kDLUInt, 8, 1), 3, s351, NULL, big,
                            sizeof big);
  ndx_import_options_t opts = ndx_test_options("HWC", false);
  ndx_batch_t* batch = NULL;
  if (!CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, &opts, &batch))) {
    ndx_test_drop_versioned(v[0]);
    ndx_test_drop_versioned(v[1]);
    ndx_context_release(ctx);
    return;
  }
  bool uniform = true;
  CHECK_OK(ndx_batch_is_uniform(batch, &uniform));
  CHECK(!uniform, "the input batch is ragged");

  ndx_args_t* to2x2 = resize_args(2, 2, NULL);
  ndx_input_t in[1];
  in[0].tensor = NULL;
  in[0].batch = batch;
  ndx_future_t* f = NULL;
  ndx_batch_t* out = NULL;
  if (CHECK_OK(INVOKE(ctx, "resize", in, 1, to2x2, 0, &f))) {
    CHECK_OK(ndx_future_wait(f, -1));
    /* The output is a batch, not a tensor. */
    ndx_tensor_t* not_tensor = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_future_tensor(f, 0, &not_tensor), NDX_ERROR_TYPE, NULL);
    CHECK(not_tensor == NULL, "out-param reset");
    CHECK_OK(ndx_future_batch(f, 0, &out));
  }
  ndx_future_release(f);
  if (CHECK(out != NULL, "an output batch")) {
    size_t n = 0;
    int32_t dtype = 0, ndim = 0;
    const char* layout = NULL;
    CHECK_OK(ndx_batch_size(out, &n));
    CHECK(n == 2, "2 samples, got %zu", n);
    CHECK_OK(ndx_batch_dtype(out, &dtype));
    CHECK(dtype == NDX_DTYPE_UINT8, "uint8 samples, got %d", (int)dtype);
    CHECK_OK(ndx_batch_ndim(out, &ndim));
    CHECK(ndim == 3, "3-d samples, got %d", (int)ndim);
    CHECK_OK(ndx_batch_layout(out, &layout));
    CHECK_STR_EQ(layout, "HWC");
    uniform = false;
    CHECK_OK(ndx_batch_is_uniform(out, &uniform));
    CHECK(uniform, "every sample is 2x2x1 now");
    const int64_t s2[3] = {2, 2, 1};
    const uint8_t expect0[4] = {0, 100, 200, 255};
    const uint8_t expect1[4] = {20, 45, 95, 120};
    const uint8_t* expect[2] = {expect0, expect1};
    for (size_t i = 0; i < 2 && i < n; i++) {
      ndx_tensor_t* s = NULL;
      if (!CHECK_OK(ndx_batch_sample(out, i, &s))) continue;
      check_meta(s, NDX_DTYPE_UINT8, 3, s2, "HWC");
      CHECK_BYTES(s, expect[i], 4);
      ndx_tensor_release(s);
    }
    /* Uniform now: it stacks into one (2, 2, 2, 1) tensor with layout "NHWC". */
    ndx_tensor_t* stacked = NULL;
    if (CHECK_OK(ndx_batch_to_tensor(out, &stacked))) {
      const int64_t s4[4] = {2, 2, 2, 1};
      const uint8_t all[8] = {0, 100, 200, 255, 20, 45, 95, 120};
      check_meta(stacked, NDX_DTYPE_UINT8, 4, s4, "NHWC");
      CHECK_BYTES(stacked, all, sizeof all);
    }
    ndx_tensor_release(stacked);
  }
  ndx_batch_release(out);
  ndx_args_free(to2x2);
  ndx_batch_release(batch);
  ndx_context_release(ctx);
  CHECK(deleted[0] == 1 && deleted[1] == 1, "each producer deleter ran once: %d %d", deleted[0],
        deleted[1]);
}

/* ---- reductions of images -------------------------------------------------------------------- */

/* A reduction that keeps the rank keeps the layout: argmax with keepdims gave no layout
 * (max with keepdims gave "HWC"), and sum over no axis dropped it without keepdims.
 * (And the layouts of elementwise results, below.) */
static NDX_TEST_NOINLINE void test_reduction_layouts(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  const int64_t s223[3] = {2, 2, 3}, s221[3] = {2, 2, 1};
  const uint8_t px[12] = {1, 9, 3, 7, 2, 7, 0, 0, 5, 4, 4, 4};
  ndx_tensor_t* img = mk(px, NDX_DTYPE_UINT8, 3, s223, "HWC");
  ndx_input_t in[1] = {ndx_test_in(img)};

  ndx_args_t* a = new_args();
  CHECK_OK(ndx_args_set_int(a, "axis", 2));
  CHECK_OK(ndx_args_set_bool(a, "keepdims", true));
  ndx_tensor_t* r = run_op(ctx, "argmax", in, 1, a);
  if (r) {
    const int64_t expect[4] = {1, 0, 2, 0};
    check_meta(r, NDX_DTYPE_INT64, 3, s221, "HWC");
    CHECK_BYTES(r, expect, sizeof expect);
  }
  ndx_tensor_release(r);
  ndx_args_free(a);

  ndx_args_t* none = new_args();
  CHECK_OK(ndx_args_set_int_array(none, "axes", NULL, 0));
  r = run_op(ctx, "sum", in, 1, none);
  if (r) check_meta(r, NDX_DTYPE_UINT64, 3, s223, "HWC");
  ndx_tensor_release(r);
  ndx_args_free(none);

  /* Elementwise: an "HWC" image plus a "CHW" tensor of its shape claimed "HWC" (the
   * first input's layout); layouts that disagree now give none. */
  ndx_tensor_t* chw = mk(px, NDX_DTYPE_UINT8, 3, s223, "CHW");
  ndx_input_t both[2] = {ndx_test_in(img), ndx_test_in(chw)};
  r = run_op(ctx, "add", both, 2, NULL);
  if (r) check_meta(r, NDX_DTYPE_UINT8, 3, s223, "");
  ndx_tensor_release(r);
  ndx_input_t same[2] = {ndx_test_in(img), ndx_test_in(img)};
  r = run_op(ctx, "add", same, 2, NULL);
  if (r) check_meta(r, NDX_DTYPE_UINT8, 3, s223, "HWC");
  ndx_tensor_release(r);
  ndx_tensor_release(chw);

  ndx_tensor_release(img);
  ndx_context_release(ctx);
}

/* ---- eval modes ---------------------------------------------------------------------------- */

static NDX_TEST_NOINLINE void test_modes(void) {
  static const int32_t modes[2] = {NDX_EVAL_DEFERRED, NDX_EVAL_EAGER};
  static const char* const names[2] = {"DEFERRED", "EAGER"};
  ndx_tensor_t* img = mk(kSmall, NDX_DTYPE_UINT8, 3, kShape221, "HWC");
  ndx_input_t in[1] = {ndx_test_in(img)};
  ndx_args_t* a = resize_args(4, 4, "linear");
  for (int m = 0; m < 2; m++) {
    NDX_TEST_CONTEXT(names[m]);
    /* The context's own mode, and the same mode given per invocation to a context whose
     * default is the other one. */
    for (int per_call = 0; per_call <= 1; per_call++) {
      ndx_context_t* ctx = make_ctx(per_call ? modes[1 - m] : modes[m]);
      ndx_future_t* f = NULL;
      if (CHECK_OK(INVOKE(ctx, "resize", in, 1, a, per_call ? modes[m] : 0, &f))) {
        /* Metadata is known before the work ran. */
        ndx_tensor_t* pending = ndx_test_output(f, 0);
        if (pending) check_meta(pending, NDX_DTYPE_UINT8, 3, kShape441, "HWC");
        if (modes[m] == NDX_EVAL_DEFERRED) {
          ndx_error_t* e = ndx_future_error(f); /* neither submits nor blocks */
          CHECK(e == NULL, "no error before the DEFERRED work ran");
          ndx_error_free(e);
        }
        CHECK_OK(ndx_future_wait(f, -1));
        CHECK(ndx_future_poll(f) == NDX_FUTURE_READY, "READY after the wait");
        if (pending) CHECK_BYTES(pending, kResized4x4, sizeof kResized4x4);
        ndx_tensor_release(pending);
      }
      ndx_future_release(f);
      /* A bad size is refused at ndx_invoke in this mode too. */
      ndx_args_t* bad = resize_args(4, 0, NULL);
      expect_invoke_error(ctx, "resize", in, 1, bad, per_call ? modes[m] : 0, NDX_ERROR_VALUE,
                          "resize to h = 4, w = 0: argument 'w' is 0; expected a size >= 1");
      ndx_args_free(bad);
      ndx_error_t* ev = ndx_context_evaluate(ctx);
      CHECK(ev == NULL, "nothing unobserved: %s", NDX_TEST_S(ndx_error_message(ev)));
      ndx_error_free(ev);
      ndx_context_release(ctx);
    }
  }
  NDX_TEST_CONTEXT(NULL);
  ndx_args_free(a);
  ndx_tensor_release(img);
}

/* ---- memory ----------------------------------------------------------------------------- */

/* Sizes that follow the data never abort the process. A float repeated over 2^44
 * elements (strides 0) is summed, which compacts it first: the 64 TiB copy is refused
 * with NDX_ERROR_MEMORY naming the tensor, at the invocation's line; the context then
 * goes on. An image with no pixels and 2^44 channels normalises (one mean and std for
 * all channels are not repeated per channel) to an empty image. */
static NDX_TEST_NOINLINE void test_memory(void) {
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  const float one = 1.5f;
  const int64_t big_shape[1] = {INT64_C(1) << 44}, zero_stride[1] = {0};
  ndx_tensor_t* big = NULL;
  CHECK_OK(ndx_tensor_wrap_host((void*)&one, NDX_DTYPE_FLOAT32, 1, big_shape, zero_stride, NULL,
                                NULL, NULL, &big));
  ndx_input_t in[1] = {ndx_test_in(big)};
  ndx_future_t* f = NULL;
  const int line = __LINE__ + 1;
  CHECK_OK(INVOKE(ctx, "sum", in, 1, NULL, 0, &f));
  ndx_error_t* e = ndx_future_wait(f, -1);
  if (CHECK(e != NULL, "the sum of a 64 TiB view failed")) {
    CHECK_FRAME(e, 0, THIS_FILE, line, "test_memory", NDX_FRAME_HOST);
  }
  expect_error(e, NDX_ERROR_MEMORY,
               "a compact copy of the float32 tensor of shape [17592186044416]: cannot allocate "
               "64.00 TiB (70368744177664 bytes) of host memory: ");
  ndx_future_release(f);

  const uint8_t pixel = 0;
  const int64_t empty_shape[3] = {0, 0, INT64_C(1) << 44}, zero_strides[3] = {0, 0, 0};
  ndx_import_options_t hwc = ndx_test_options("HWC", true);
  ndx_tensor_t* empty = NULL;
  CHECK_OK(ndx_tensor_wrap_host((void*)&pixel, NDX_DTYPE_UINT8, 3, empty_shape, zero_strides,
                                NULL, NULL, &hwc, &empty));
  ndx_args_t* a = new_args();
  const double mean = 0.5, std = 2.0;
  CHECK_OK(ndx_args_set_float_array(a, "mean", &mean, 1));
  CHECK_OK(ndx_args_set_float_array(a, "std", &std, 1));
  ndx_input_t ein[1] = {ndx_test_in(empty)};
  ndx_tensor_t* r = run_op(ctx, "normalize", ein, 1, a);
  if (r) {
    check_meta(r, NDX_DTYPE_FLOAT32, 3, empty_shape, "HWC");
    ndx_tensor_release(r);
  }

  ndx_args_free(a);
  ndx_tensor_release(empty);
  ndx_tensor_release(big);
  ndx_context_release(ctx);
}

/* batch_to_tensor on tensors standing for the samples: those whose layouts differ are
 * refused at ndx_invoke in every mode, as a ragged set is (they used to be accepted, with
 * an inferred layout, and fail only when the kernel ran); equal layouts stack with "N"
 * prefixed. */
static void test_batch_to_tensor_layouts(void) {
  static const float v[2] = {7.f, 8.f};
  static const int64_t shape[1] = {2};
  static const int64_t stacked_shape[2] = {2, 2};
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  ndx_tensor_t* w = mk(v, NDX_DTYPE_FLOAT32, 1, shape, "W");
  ndx_tensor_t* none = mk(v, NDX_DTYPE_FLOAT32, 1, shape, NULL);
  ndx_tensor_t* h = mk(v, NDX_DTYPE_FLOAT32, 1, shape, "H");
  ndx_input_t w_none[2] = {ndx_test_in(w), ndx_test_in(none)};
  ndx_input_t none_w[2] = {ndx_test_in(none), ndx_test_in(w)};
  ndx_input_t w_h[2] = {ndx_test_in(w), ndx_test_in(h)};
  ndx_input_t w_w[2] = {ndx_test_in(w), ndx_test_in(w)};
  static const int32_t modes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                   NDX_EVAL_EAGER};
  for (int m = 0; m < 4; m++) {
    expect_invoke_error(ctx, "batch_to_tensor", w_none, 2, NULL, modes[m], NDX_ERROR_VALUE,
                        "sample 1 has layout \"\", sample 0 has layout \"W\"");
    expect_invoke_error(ctx, "batch_to_tensor", none_w, 2, NULL, modes[m], NDX_ERROR_VALUE,
                        "sample 1 has layout \"W\"");
    expect_invoke_error(ctx, "batch_to_tensor", w_h, 2, NULL, modes[m], NDX_ERROR_VALUE,
                        "stacked samples share a layout");
  }
  ndx_tensor_t* t = run_op(ctx, "batch_to_tensor", w_w, 2, NULL);
  if (t) {
    check_meta(t, NDX_DTYPE_FLOAT32, 2, stacked_shape, "NW");
    float out[4] = {0};
    if (CHECK_OK(ndx_tensor_copy_to(t, out, sizeof out))) {
      CHECK(out[0] == 7.f && out[1] == 8.f && out[2] == 7.f && out[3] == 8.f, "stacked values");
    }
  }
  ndx_tensor_release(t);
  ndx_tensor_release(w);
  ndx_tensor_release(none);
  ndx_tensor_release(h);
  ndx_context_release(ctx);
}

/* batch_to_tensor stacks into new host memory, so tensors standing for the samples may
 * live in different host-readable memories (pageable, pinned, managed), in every mode;
 * they used to be refused only when the kernel ran ("device type is kDLCUDAHost"). */
static void test_batch_to_tensor_memories(void) {
  static const float v[3][2] = {{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}};
  static const int64_t shape[1] = {2};
  static const int64_t stacked_shape[2] = {3, 2};
  int deleted[2] = {0, 0};
  ndx_tensor_t* s[3] = {mk(v[0], NDX_DTYPE_FLOAT32, 1, shape, NULL), NULL, NULL};
  const DLDeviceType kinds[2] = {kDLCUDAHost, kDLCUDAManaged};
  for (int i = 0; i < 2; i++) {
    DLManagedTensorVersioned* m =
        ndx_test_versioned(&deleted[i], NDX_TEST_DL_F32, 1, shape, NULL, v[i + 1], sizeof v[0]);
    m->dl_tensor.device.device_type = kinds[i];
    if (!CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &s[i + 1]))) {
      ndx_test_drop_versioned(m);
    }
  }
  static const int32_t modes[4] = {NDX_EVAL_SYNC_CPU, NDX_EVAL_SYNC_FULL, NDX_EVAL_DEFERRED,
                                   NDX_EVAL_EAGER};
  static const char* const names[4] = {"SYNC_CPU", "SYNC_FULL", "DEFERRED", "EAGER"};
  ndx_context_t* ctx = make_ctx(NDX_EVAL_EAGER);
  for (int m = 0; s[1] && s[2] && m < 4; m++) {
    NDX_TEST_CONTEXT(names[m]);
    for (int first = 0; first < 3; first++) {
      ndx_input_t in[3];
      for (int i = 0; i < 3; i++) in[i] = ndx_test_in(s[(first + i) % 3]);
      ndx_future_t* f = NULL;
      if (!CHECK_OK(INVOKE(ctx, "batch_to_tensor", in, 3, NULL, modes[m], &f))) {
        ndx_future_release(f);
        continue;
      }
      ndx_tensor_t* t = finish(f);
      if (t) {
        check_meta(t, NDX_DTYPE_FLOAT32, 2, stacked_shape, "");
        float out[6] = {0};
        if (CHECK_OK(ndx_tensor_copy_to(t, out, sizeof out))) {
          for (int i = 0; i < 3; i++) {
            const float* want = v[(first + i) % 3];
            CHECK(out[2 * i] == want[0] && out[2 * i + 1] == want[1], "row %d: %g %g", i,
                  out[2 * i], out[2 * i + 1]);
          }
        }
      }
      ndx_tensor_release(t);
    }
  }
  NDX_TEST_CONTEXT(NULL);
  ndx_context_release(ctx);
  for (int i = 0; i < 3; i++) ndx_tensor_release(s[i]);
  CHECK(deleted[0] == 1 && deleted[1] == 1, "each producer deleter ran once: %d %d", deleted[0],
        deleted[1]);
}

int main(void) {
  test_concat();
  test_crop();
  test_resize();
  test_gray_and_normalize();
  test_batch();
  test_batch_to_tensor_layouts();
  test_batch_to_tensor_memories();
  test_reduction_layouts();
  test_modes();
  test_memory();
  return NDX_TEST_SUMMARY("test_ops_image");
}
