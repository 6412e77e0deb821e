/* Tests of host-memory tensors and the tensor accessors: ndx_tensor_from_host (copies),
 * ndx_tensor_wrap_host (borrows, with a user deleter), ndx_dtype_name, the NULL-handle
 * and NULL-out contracts of every accessor (out-params are reset on error),
 * retain/release of NULL, and the import options' struct_size check. */
#include <time.h>

#include "ndx_test.h"

static const int64_t k_itemsize[14] = {0, 1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};
static const char* const k_dtype_names[14] = {
    NULL,     "bool",   "int8",   "int16",   "int32",    "int64",   "uint8",
    "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
};
/* The DLPack encoding of each ndx dtype: code, bits. */
static const uint8_t k_dl_code[14] = {0,       kDLBool, kDLInt,   kDLInt,   kDLInt,
                                      kDLInt,  kDLUInt, kDLUInt,  kDLUInt,  kDLUInt,
                                      kDLFloat, kDLBfloat, kDLFloat, kDLFloat};

static int i32_equal(const int32_t* a, const int32_t* b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (a[i] != b[i]) return 0;
  }
  return 1;
}

/* Copies an int32 tensor out and compares it with `expected`. */
static int check_i32(const ndx_tensor_t* t, const int32_t* expected, size_t n, int line) {
  int32_t got[64];
  memset(got, 0, sizeof got);
  size_t nbytes = 0;
  if (!CHECK_OK(ndx_tensor_nbytes(t, &nbytes))) return 0;
  if (!CHECK(nbytes == n * sizeof(int32_t), "line %d: nbytes %zu", line, nbytes)) return 0;
  if (!CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got))) return 0;
  int ok = i32_equal(got, expected, n);
  if (!ok) {
    fprintf(stderr, "  line %d: got", line);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", (int)got[i]);
    fprintf(stderr, "\n");
  }
  return CHECK(ok, "values (line %d)", line);
}
#define CHECK_I32(t, e, n) check_i32((t), (e), (n), __LINE__)

static void test_dtype_names(void) {
  for (int32_t d = 1; d <= 13; d++) {
    CHECK_STR_EQ(ndx_dtype_name(d), k_dtype_names[d]);
  }
  CHECK(ndx_dtype_name(0) == NULL, "0 is not a dtype");
  CHECK(ndx_dtype_name(14) == NULL, "14 is not a dtype");
  CHECK(ndx_dtype_name(-1) == NULL, "-1 is not a dtype");
  CHECK(ndx_dtype_name(99) == NULL, "99 is not a dtype");
}

static void test_from_host_copies(void) {
  const int64_t shape[2] = {2, 3};
  int32_t* src = (int32_t*)malloc(6 * sizeof(int32_t));
  if (!CHECK(src != NULL, "malloc")) return;
  for (int i = 0; i < 6; i++) src[i] = 10 + i;
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  CHECK_OK(ndx_tensor_from_host(src, NDX_DTYPE_INT32, 2, shape, NULL, NULL, &t));
  /* The caller may free (or change) its buffer right away: ndx has a copy. Valgrind
   * would flag any later read of `src`. */
  free(src);
  if (!CHECK(t != NULL && t != NDX_TEST_BOGUS_PTR, "a tensor")) return;
  const int32_t expect[6] = {10, 11, 12, 13, 14, 15};
  CHECK_I32(t, expect, 6);

  int32_t dtype = 0, ndim = 0;
  const int64_t* s = NULL;
  const int64_t* st = NULL;
  size_t numel = 0;
  DLDevice dev = {kDLCUDA, 3};
  const char* layout = NULL;
  bool ro = true;
  CHECK_OK(ndx_tensor_dtype(t, &dtype));
  CHECK(dtype == NDX_DTYPE_INT32, "dtype");
  CHECK_OK(ndx_tensor_ndim(t, &ndim));
  CHECK(ndim == 2, "ndim");
  CHECK_OK(ndx_tensor_shape(t, &s));
  CHECK_I64_ARRAY(s, shape, 2);
  const int64_t compact[2] = {3, 1};
  CHECK_OK(ndx_tensor_strides(t, &st));
  CHECK_I64_ARRAY(st, compact, 2);
  CHECK_OK(ndx_tensor_numel(t, &numel));
  CHECK(numel == 6, "numel");
  CHECK_OK(ndx_tensor_device(t, &dev));
  CHECK(dev.device_type == kDLCPU && dev.device_id == 0, "host memory");
  CHECK_OK(ndx_tensor_layout(t, &layout));
  CHECK_STR_EQ(layout, "");
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(!ro, "writable");

  /* The copy is ndx's own memory; exports of it work both ways. */
  DLManagedTensorVersioned* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK(ex->dl_tensor.data != NULL, "ndx-owned data");
    CHECK(ex->dl_tensor.dtype.code == kDLInt && ex->dl_tensor.dtype.bits == 32 &&
              ex->dl_tensor.dtype.lanes == 1,
          "int32 in DLPack");
    CHECK(((const int32_t*)ex->dl_tensor.data)[5] == 15, "values");
    CHECK(ex->flags == 0, "neither READ_ONLY nor IS_COPIED");
    ex->deleter(ex);
  }
  DLManagedTensor* lex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack(t, &lex));
  if (lex) lex->deleter(lex);
  ndx_tensor_release(t);
}

static void test_from_host_strided(void) {
  /* Source: 3x4 int32 0..11, row-major. */
  int32_t src[12];
  for (int i = 0; i < 12; i++) src[i] = i;

  /* Transposed. */
  const int64_t tshape[2] = {4, 3}, tstrides[2] = {1, 4};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(src, NDX_DTYPE_INT32, 2, tshape, tstrides, NULL, &t));
  if (t) {
    const int32_t expect[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
    CHECK_I32(t, expect, 12);
    const int64_t* st = NULL;
    const int64_t compact[2] = {3, 1};
    CHECK_OK(ndx_tensor_strides(t, &st));
    CHECK_I64_ARRAY(st, compact, 2); /* the copy is compact */
    ndx_tensor_release(t);
  }

  /* Rows flipped: data points at element 0 = [2][0]. */
  const int64_t fshape[2] = {3, 4}, fstrides[2] = {-4, 1};
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(src + 8, NDX_DTYPE_INT32, 2, fshape, fstrides, NULL, &t));
  if (t) {
    const int32_t expect[12] = {8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3};
    CHECK_I32(t, expect, 12);
    ndx_tensor_release(t);
  }

  /* Broadcast (zero stride). */
  const int64_t zstrides[2] = {0, 1};
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(src + 4, NDX_DTYPE_INT32, 2, fshape, zstrides, NULL, &t));
  if (t) {
    const int32_t expect[12] = {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7};
    CHECK_I32(t, expect, 12);
    ndx_tensor_release(t);
  }

  /* A column (ndim 1, stride 4). */
  const int64_t cshape[1] = {3}, cstrides[1] = {4};
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(src + 1, NDX_DTYPE_INT32, 1, cshape, cstrides, NULL, &t));
  if (t) {
    const int32_t expect[3] = {1, 5, 9};
    CHECK_I32(t, expect, 3);
    ndx_tensor_release(t);
  }
}

static void test_from_host_edge_cases(void) {
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  const int64_t empty[2] = {0, 3};
  /* No elements: data may be NULL. */
  CHECK_OK(ndx_tensor_from_host(NULL, NDX_DTYPE_FLOAT32, 2, empty, NULL, NULL, &t));
  if (t && t != NDX_TEST_BOGUS_PTR) {
    size_t numel = 9, nbytes = 9;
    CHECK_OK(ndx_tensor_numel(t, &numel));
    CHECK_OK(ndx_tensor_nbytes(t, &nbytes));
    CHECK(numel == 0 && nbytes == 0, "empty: %zu, %zu", numel, nbytes);
    CHECK_OK(ndx_tensor_copy_to(t, NULL, 0));
    DLManagedTensorVersioned* ex = NULL;
    CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
    if (ex) {
      CHECK(ex->dl_tensor.ndim == 2 && ex->dl_tensor.shape[0] == 0, "empty export");
      ex->deleter(ex);
    }
    ndx_tensor_release(t);
  }

  /* A scalar (ndim 0, shape NULL). */
  const double pi = 3.25;
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(&pi, NDX_DTYPE_FLOAT64, 0, NULL, NULL, NULL, &t));
  if (t) {
    double got = 0;
    CHECK_OK(ndx_tensor_copy_to(t, &got, sizeof got));
    CHECK(got == 3.25, "scalar value %g", got);
    ndx_tensor_release(t);
  }

  /* NDX_MAX_NDIM (64) dimensions of size 1 is the maximum. */
  int64_t ones[NDX_MAX_NDIM + 1];
  for (int i = 0; i <= NDX_MAX_NDIM; i++) ones[i] = 1;
  const uint8_t byte = 7;
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(&byte, NDX_DTYPE_UINT8, NDX_MAX_NDIM, ones, NULL, NULL, &t));
  if (t) {
    int32_t nd = 0;
    CHECK_OK(ndx_tensor_ndim(t, &nd));
    CHECK(nd == 64, "ndim %d", (int)nd);
    ndx_tensor_release(t);
  }

  /* Errors: nothing is made, out is reset. */
  const int64_t shape[2] = {2, 3};
  const float data[6] = {0};
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_host(NULL, NDX_DTYPE_FLOAT32, 2, shape, NULL, NULL, &t),
               NDX_ERROR_VALUE, "data is NULL but the tensor has 6 elements");
  CHECK(t == NULL, "out reset");
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_host(NULL, NDX_DTYPE_FLOAT32, 0, NULL, NULL, NULL, &t),
               NDX_ERROR_VALUE, "data is NULL but the tensor has 1 element");
  CHECK(t == NULL, "out reset");
  expect_error(ndx_tensor_from_host(data, 99, 2, shape, NULL, NULL, &t), NDX_ERROR_VALUE,
               "argument 'dtype' is 99");
  expect_error(ndx_tensor_from_host(data, 0, 2, shape, NULL, NULL, &t), NDX_ERROR_VALUE,
               "'dtype'");
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 65, ones, NULL, NULL, &t),
               NDX_ERROR_VALUE, "argument 'ndim' is 65, expected 0 to 64");
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, -1, shape, NULL, NULL, &t),
               NDX_ERROR_VALUE, "argument 'ndim' is -1");
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, NULL, NULL, NULL, &t),
               NDX_ERROR_VALUE, "argument 'shape' is NULL but ndim is 2");
  const int64_t neg[2] = {2, -3};
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, neg, NULL, NULL, &t),
               NDX_ERROR_VALUE, "shape[1] is -3");
  const int64_t huge[2] = {INT64_MAX / 2, 1};
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, huge, NULL, &t),
               NDX_ERROR_VALUE, "overflows the address space");
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, NULL, NULL),
               NDX_ERROR_VALUE, "argument 'out' is NULL");
  CHECK(t == NULL, "still NULL");
  /* One float viewed as 2^44 (strides 0): a valid view whose 64 TiB copy no system
   * grants, refused with NDX_ERROR_MEMORY (never an abort). */
  const int64_t vast[1] = {INT64_C(1) << 44}, zero_stride[1] = {0};
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 1, vast, zero_stride, NULL, &t),
               NDX_ERROR_MEMORY,
               "the copy of shape [17592186044416] (float32): cannot allocate 64.00 TiB "
               "(70368744177664 bytes) of host memory: ");
  CHECK(t == NULL, "out reset after a memory error");
}

static void test_from_host_every_dtype(void) {
  uint64_t buf[4] = {0x0102030405060708ull, 0x1112131415161718ull, 0x2122232425262728ull,
                     0x3132333435363738ull};
  const int64_t shape[1] = {3};
  for (int32_t d = 1; d <= 13; d++) {
    ndx_tensor_t* t = NULL;
    if (!CHECK_OK(ndx_tensor_from_host(buf, d, 1, shape, NULL, NULL, &t))) continue;
    size_t nbytes = 0;
    int32_t dtype = 0;
    CHECK_OK(ndx_tensor_nbytes(t, &nbytes));
    CHECK(nbytes == (size_t)(3 * k_itemsize[d]), "%s: nbytes %zu", k_dtype_names[d], nbytes);
    CHECK_OK(ndx_tensor_dtype(t, &dtype));
    CHECK(dtype == d, "%s: dtype %d", k_dtype_names[d], (int)dtype);
    unsigned char out[32];
    memset(out, 0xEE, sizeof out);
    CHECK_OK(ndx_tensor_copy_to(t, out, sizeof out));
    CHECK(memcmp(out, buf, nbytes) == 0, "%s: bytes copied exactly", k_dtype_names[d]);
    CHECK(out[nbytes] == 0xEE, "%s: nothing written past nbytes", k_dtype_names[d]);
    DLManagedTensorVersioned* ex = NULL;
    CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
    if (ex) {
      CHECK(ex->dl_tensor.dtype.code == k_dl_code[d] &&
                ex->dl_tensor.dtype.bits == 8 * k_itemsize[d] && ex->dl_tensor.dtype.lanes == 1,
            "%s: DLPack code %d bits %d lanes %d", k_dtype_names[d], ex->dl_tensor.dtype.code,
            ex->dl_tensor.dtype.bits, ex->dl_tensor.dtype.lanes);
      ex->deleter(ex);
    }
    ndx_tensor_release(t);
  }
}

static void test_from_host_options(void) {
  const int64_t shape[2] = {2, 3};
  const float data[6] = {1, 2, 3, 4, 5, 6};
  ndx_tensor_t* t = NULL;
  ndx_import_options_t o = ndx_test_options("HW", true);
  CHECK_OK(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t));
  if (t) {
    const char* layout = NULL;
    bool ro = false;
    CHECK_OK(ndx_tensor_layout(t, &layout));
    CHECK_STR_EQ(layout, "HW");
    CHECK_OK(ndx_tensor_is_read_only(t, &ro));
    CHECK(ro, "opts.read_only");
    DLManagedTensor* lex = (DLManagedTensor*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_tensor_to_dlpack(t, &lex), NDX_ERROR_VALUE, "read-only");
    CHECK(lex == NULL, "out reset");
    ndx_tensor_release(t);
  }

  /* The layout string is copied. */
  char layout_buf[4] = "HW";
  o = ndx_test_options(layout_buf, false);
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t));
  layout_buf[0] = 'X';
  if (t) {
    const char* layout = NULL;
    CHECK_OK(ndx_tensor_layout(t, &layout));
    CHECK_STR_EQ(layout, "HW");
    ndx_tensor_release(t);
  }

  /* struct_size too small (an older or broken caller): VALUE. */
  o = ndx_test_options("HW", false);
  o.struct_size = offsetof(ndx_import_options_t, stream) - 1;
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t),
               NDX_ERROR_VALUE, "opts->struct_size is");
  CHECK(t == NULL, "out reset");
  o.struct_size = 0;
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t),
               NDX_ERROR_VALUE, "sizeof(ndx_import_options_t)");
  expect_error(ndx_tensor_wrap_host((void*)data, NDX_DTYPE_FLOAT32, 2, shape, NULL, NULL, NULL,
                                    &o, &t),
               NDX_ERROR_VALUE, "opts->struct_size is 0");

  /* A larger struct (a caller built against a later ndx) is accepted. */
  struct {
    ndx_import_options_t o;
    char more[32];
  } big;
  memset(&big, 0, sizeof big);
  big.o.struct_size = sizeof big;
  big.o.layout = "HW";
  t = NULL;
  CHECK_OK(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &big.o, &t));
  ndx_tensor_release(t);

  /* Bad layouts. */
  o = ndx_test_options("HWC", false);
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t),
               NDX_ERROR_VALUE, "has 3 letters but the tensor has ndim 2");
  o = ndx_test_options("H-", false);
  expect_error(ndx_tensor_from_host(data, NDX_DTYPE_FLOAT32, 2, shape, NULL, &o, &t),
               NDX_ERROR_VALUE, "ASCII letters");
}

/* ---- wrap_host ----------------------------------------------------------------------- */

typedef struct {
  int calls;
  void* data;
  void* user;
} wrap_log;

static void wrap_deleter(void* data, void* user) {
  wrap_log* log = (wrap_log*)user;
  log->calls++;
  log->data = data;
  log->user = user;
  free(data);
}

static void test_wrap_host(void) {
  const int64_t shape[2] = {2, 3};
  int32_t* data = (int32_t*)malloc(6 * sizeof(int32_t));
  if (!CHECK(data != NULL, "malloc")) return;
  for (int i = 0; i < 6; i++) data[i] = i * i;
  wrap_log log = {0, NULL, NULL};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_wrap_host(data, NDX_DTYPE_INT32, 2, shape, NULL, wrap_deleter, &log, NULL,
                                &t));
  if (!t) {
    free(data);
    return;
  }
  CHECK(log.calls == 0, "borrowed, not deleted");
  const int32_t expect[6] = {0, 1, 4, 9, 16, 25};
  CHECK_I32(t, expect, 6);

  /* No copy: an export points into the caller's buffer. */
  DLManagedTensorVersioned* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK((char*)ex->dl_tensor.data + ex->dl_tensor.byte_offset == (char*)data,
          "the export aliases the wrapped memory");
  }
  bool ro = true;
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(!ro, "not read-only without the option");

  CHECK_OK(ndx_tensor_retain(t));
  ndx_tensor_release(t);
  ndx_tensor_release(t);
  CHECK(log.calls == 0, "the export still holds the memory");
  if (ex) ex->deleter(ex);
  CHECK(log.calls == 1, "deleter called exactly once (%d)", log.calls);
  CHECK(log.data == data && log.user == &log, "with (data, user)");

  /* Strided wrap: no copy, values through the view. */
  int32_t* m = (int32_t*)malloc(12 * sizeof(int32_t));
  if (!CHECK(m != NULL, "malloc")) return;
  for (int i = 0; i < 12; i++) m[i] = i;
  const int64_t tshape[2] = {4, 3}, tstrides[2] = {1, 4};
  wrap_log log2 = {0, NULL, NULL};
  ndx_import_options_t ro_opts = ndx_test_options(NULL, true);
  t = NULL;
  CHECK_OK(ndx_tensor_wrap_host(m, NDX_DTYPE_INT32, 2, tshape, tstrides, wrap_deleter, &log2,
                                &ro_opts, &t));
  if (t) {
    const int32_t texpect[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
    CHECK_I32(t, texpect, 12);
    const int64_t* st = NULL;
    CHECK_OK(ndx_tensor_strides(t, &st));
    CHECK_I64_ARRAY(st, tstrides, 2);
    CHECK_OK(ndx_tensor_is_read_only(t, &ro));
    CHECK(ro, "opts.read_only");
    ndx_tensor_release(t);
    CHECK(log2.calls == 1 && log2.data == m && log2.user == &log2, "deleted once");
  } else {
    free(m);
  }

  /* Failure: the deleter is not called and the caller keeps the memory. */
  int32_t* keep = (int32_t*)malloc(6 * sizeof(int32_t));
  if (!CHECK(keep != NULL, "malloc")) return;
  wrap_log log3 = {0, NULL, NULL};
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_wrap_host(keep, 99, 2, shape, NULL, wrap_deleter, &log3, NULL, &t),
               NDX_ERROR_VALUE, "'dtype'");
  CHECK(t == NULL, "out reset");
  const int64_t neg[2] = {-1, 3};
  expect_error(ndx_tensor_wrap_host(keep, NDX_DTYPE_INT32, 2, neg, NULL, wrap_deleter, &log3,
                                    NULL, &t),
               NDX_ERROR_VALUE, "shape[0] is -1");
  ndx_import_options_t bad = ndx_test_options("ABC", false);
  expect_error(ndx_tensor_wrap_host(keep, NDX_DTYPE_INT32, 2, shape, NULL, wrap_deleter, &log3,
                                    &bad, &t),
               NDX_ERROR_VALUE, "layout");
  expect_error(ndx_tensor_wrap_host(keep, NDX_DTYPE_INT32, 2, shape, NULL, wrap_deleter, &log3,
                                    NULL, NULL),
               NDX_ERROR_VALUE, "argument 'out' is NULL");
  expect_error(ndx_tensor_wrap_host(NULL, NDX_DTYPE_INT32, 2, shape, NULL, wrap_deleter, &log3,
                                    NULL, &t),
               NDX_ERROR_VALUE, "data is NULL");
  /* A zero-stride (broadcast) view whose elements x itemsize overflow: refused at import,
   * not a panic in nbytes or copy_to later. */
  const int64_t bshape[1] = {INT64_C(1) << 61}, bstrides[1] = {0};
  expect_error(ndx_tensor_wrap_host(keep, NDX_DTYPE_FLOAT64, 1, bshape, bstrides, wrap_deleter,
                                    &log3, NULL, &t),
               NDX_ERROR_VALUE,
               "shape [2305843009213693952] of itemsize 8 is too large to address");
  CHECK(t == NULL, "out reset");
  const int64_t bshape2[2] = {INT64_C(1) << 62, 3}, bstrides2[2] = {0, 0};
  expect_error(ndx_tensor_wrap_host(keep, NDX_DTYPE_INT8, 2, bshape2, bstrides2, wrap_deleter,
                                    &log3, NULL, &t),
               NDX_ERROR_VALUE, "shape [4611686018427387904, 3] of itemsize 1 is too large");
  CHECK(log3.calls == 0, "never called on failure (%d)", log3.calls);
  keep[0] = 1; /* still ours: valgrind would flag a use after free */
  free(keep);

  /* No deleter: nothing is called; the caller frees after the last release. */
  int32_t local[6] = {6, 5, 4, 3, 2, 1};
  t = NULL;
  CHECK_OK(ndx_tensor_wrap_host(local, NDX_DTYPE_INT32, 2, shape, NULL, NULL, NULL, NULL, &t));
  if (t) {
    CHECK_I32(t, local, 6);
    ndx_tensor_release(t);
  }

  /* Empty wrap with NULL data: the deleter still runs once, with NULL. */
  const int64_t empty[1] = {0};
  wrap_log log4 = {0, NDX_TEST_BOGUS_PTR, NULL};
  t = NULL;
  CHECK_OK(ndx_tensor_wrap_host(NULL, NDX_DTYPE_INT32, 1, empty, NULL, wrap_deleter, &log4, NULL,
                                &t));
  ndx_tensor_release(t);
  CHECK(log4.calls == 1 && log4.data == NULL, "empty wrap: deleter once with NULL data");
}

/* ---- accessor contracts -------------------------------------------------------------- */

static void test_accessors_null_handle(void) {
  int32_t i32 = 7;
  const int64_t* p64 = (const int64_t*)NDX_TEST_BOGUS_PTR;
  size_t sz = 7;
  DLDevice dev = {kDLCUDA, 7};
  const char* str = (const char*)NDX_TEST_BOGUS_PTR;
  bool b = true;
  const char* frag = "argument 'tensor' is NULL";

  expect_error(ndx_tensor_dtype(NULL, &i32), NDX_ERROR_VALUE, frag);
  CHECK(i32 == 0, "dtype out reset to 0");
  i32 = 7;
  expect_error(ndx_tensor_ndim(NULL, &i32), NDX_ERROR_VALUE, frag);
  CHECK(i32 == 0, "ndim out reset to 0");
  expect_error(ndx_tensor_shape(NULL, &p64), NDX_ERROR_VALUE, frag);
  CHECK(p64 == NULL, "shape out reset to NULL");
  p64 = (const int64_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_strides(NULL, &p64), NDX_ERROR_VALUE, frag);
  CHECK(p64 == NULL, "strides out reset to NULL");
  expect_error(ndx_tensor_numel(NULL, &sz), NDX_ERROR_VALUE, frag);
  CHECK(sz == 0, "numel out reset to 0");
  sz = 7;
  expect_error(ndx_tensor_nbytes(NULL, &sz), NDX_ERROR_VALUE, frag);
  CHECK(sz == 0, "nbytes out reset to 0");
  expect_error(ndx_tensor_device(NULL, &dev), NDX_ERROR_VALUE, frag);
  CHECK(dev.device_type == kDLCPU && dev.device_id == 0, "device out reset to kDLCPU:0");
  expect_error(ndx_tensor_layout(NULL, &str), NDX_ERROR_VALUE, frag);
  CHECK(str == NULL, "layout out reset to NULL");
  expect_error(ndx_tensor_is_read_only(NULL, &b), NDX_ERROR_VALUE, frag);
  CHECK(!b, "is_read_only out reset to false");

  DLManagedTensorVersioned* ev = (DLManagedTensorVersioned*)NDX_TEST_BOGUS_PTR;
  DLManagedTensor* el = (DLManagedTensor*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_to_dlpack_versioned(NULL, &ev), NDX_ERROR_VALUE, frag);
  CHECK(ev == NULL, "export out reset");
  expect_error(ndx_tensor_to_dlpack(NULL, &el), NDX_ERROR_VALUE, frag);
  CHECK(el == NULL, "export out reset");
  float f;
  expect_error(ndx_tensor_copy_to(NULL, &f, sizeof f), NDX_ERROR_VALUE, frag);

  expect_error(ndx_tensor_retain(NULL), NDX_ERROR_VALUE, frag);
  ndx_tensor_release(NULL);
  CHECK(1, "ndx_tensor_release(NULL) returned");
}

static void test_accessors_null_out(void) {
  const int64_t shape[1] = {2};
  const int16_t data[2] = {1, 2};
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(data, NDX_DTYPE_INT16, 1, shape, NULL, NULL, &t));
  if (!t) return;
  const char* frag = "argument 'out' is NULL";
  expect_error(ndx_tensor_dtype(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_ndim(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_shape(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_strides(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_numel(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_nbytes(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_device(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_layout(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_is_read_only(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_to_dlpack_versioned(t, NULL), NDX_ERROR_VALUE, frag);
  expect_error(ndx_tensor_to_dlpack(t, NULL), NDX_ERROR_VALUE, frag);

  /* Both NULL: a VALUE error either way. */
  expect_error(ndx_tensor_ndim(NULL, NULL), NDX_ERROR_VALUE, "is NULL");

  /* A failed export took no reference: one release frees the tensor (valgrind). */
  ndx_tensor_release(t);
}

/* The array getters of ndx_args_t: a non-NULL out-param is reset even when the other one
 * is NULL (out-params "are set to NULL/0/false first"). */
static void test_args_array_out_params(void) {
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  const int64_t iv[2] = {3, -1};
  const double fv[2] = {0.5, 1.5};
  CHECK_OK(ndx_args_set_int_array(a, "ia0", iv, 2));
  CHECK_OK(ndx_args_set_float_array(a, "fa0", fv, 2));

  const int64_t* ivals = (const int64_t*)NDX_TEST_BOGUS_PTR;
  size_t n = 99;
  expect_error(ndx_args_get_int_array(a, "ia0", &ivals, NULL), NDX_ERROR_VALUE,
               "argument 'n' is NULL");
  CHECK(ivals == NULL, "int array: values reset when n is NULL");
  expect_error(ndx_args_get_int_array(a, "ia0", NULL, &n), NDX_ERROR_VALUE,
               "argument 'values' is NULL");
  CHECK(n == 0, "int array: n reset when values is NULL (%zu)", n);

  const double* fvals = (const double*)NDX_TEST_BOGUS_PTR;
  n = 99;
  expect_error(ndx_args_get_float_array(a, "fa0", &fvals, NULL), NDX_ERROR_VALUE,
               "argument 'n' is NULL");
  CHECK(fvals == NULL, "float array: values reset when n is NULL");
  expect_error(ndx_args_get_float_array(a, "fa0", NULL, &n), NDX_ERROR_VALUE,
               "argument 'values' is NULL");
  CHECK(n == 0, "float array: n reset when values is NULL (%zu)", n);

  /* And still read correctly. */
  CHECK_OK(ndx_args_get_int_array(a, "ia0", &ivals, &n));
  CHECK(n == 2 && ivals != NULL && ivals[0] == 3 && ivals[1] == -1, "int array values");
  ndx_args_free(a);
}

/* A host kernel that is never run (the operators below are only registered). */
static ndx_error_t* unused_kernel(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                  const ndx_args_t* args, ndx_tensor_t** outputs,
                                  size_t n_outputs) {
  (void)user; (void)inputs; (void)n_inputs; (void)args; (void)outputs; (void)n_outputs;
  return ndx_error_new(NDX_ERROR_RUNTIME, "unused_kernel ran", NULL);
}

static ndx_op_schema_t one_in_one_out(size_t n_args, const char* const* names,
                                      const int32_t* types) {
  ndx_op_schema_t s = ndx_test_schema(1, 1);
  s.n_args = n_args;
  s.arg_names = names;
  s.arg_types = types;
  return s;
}

/* Names are keys: replacing their invalid UTF-8 made distinct names equal. Arguments
 * "\xff" and "\xfe" were one argument (setting one replaced the other, reading "\xfd"
 * returned it), two such schema names were "both U+FFFD", and ndx_invoke of operator
 * "op\xfe" ran the one registered as "op\xff". Such names are NDX_ERROR_VALUE now. */
static void test_names_must_be_utf8(void) {
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  expect_error(ndx_args_set_int(a, "\xff", 1), NDX_ERROR_VALUE,
               "argument 'name' (\"\\xff\") is not valid UTF-8: byte 0xff at offset 0; names "
               "must be UTF-8");
  expect_error(ndx_args_set_string(a, "a\xfe", "v"), NDX_ERROR_VALUE,
               "argument 'name' (\"a\\xfe\") is not valid UTF-8: byte 0xfe at offset 1");
  CHECK_OK(ndx_args_set_int(a, "\xef\xbf\xbd", 7)); /* U+FFFD itself is a valid name */
  int64_t v = -1;
  expect_error(ndx_args_get_int(a, "\xfd", &v), NDX_ERROR_VALUE, "is not valid UTF-8");
  CHECK(v == 0, "the out-param is cleared (%lld)", (long long)v);
  CHECK_OK(ndx_args_get_int(a, "\xef\xbf\xbd", &v));
  CHECK(v == 7, "U+FFFD reads its own value (%lld)", (long long)v);
  ndx_args_free(a);

  ndx_context_t* ctx = ndx_test_new_context(NULL);
  const char* const names[2] = {"\xff", "\xfe"};
  const int32_t types[2] = {NDX_ARG_INT, NDX_ARG_INT};
  ndx_op_schema_t two = one_in_one_out(2, names, types);
  expect_error(ndx_register_op(ctx, "op", &two, unused_kernel, NULL, NULL), NDX_ERROR_VALUE,
               "argument 'schema->arg_names[0]' (\"\\xff\") is not valid UTF-8");
  ndx_op_schema_t none = one_in_one_out(0, NULL, NULL);
  expect_error(ndx_register_op(ctx, "op\xff", &none, unused_kernel, NULL, NULL),
               NDX_ERROR_VALUE, "argument 'name' (\"op\\xff\") is not valid UTF-8");
  CHECK_OK(ndx_register_op(ctx, "op\xef\xbf\xbd", &none, unused_kernel, NULL, NULL));
  const int64_t shape[1] = {2};
  const int32_t data[2] = {1, 2};
  ndx_tensor_t* t = ndx_test_tensor(data, NDX_DTYPE_INT32, 1, shape);
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_invoke(ctx, "op\xfe", &in, 1, NULL, NULL, &f), NDX_ERROR_VALUE,
               "argument 'op' (\"op\\xfe\") is not valid UTF-8");
  CHECK(f == NULL, "no future after a refused invocation");
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* ndx_invoke copies the arguments: changing or freeing them while a DEFERRED (or
 * EAGER) invocation is pending changes nothing about it. */
static void test_args_copied_at_invoke(void) {
  const int32_t modes[2] = {NDX_EVAL_DEFERRED, NDX_EVAL_EAGER};
  for (int m = 0; m < 2; m++) {
    ndx_context_options_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.eval_mode = modes[m];
    ndx_context_t* ctx = ndx_test_new_context(&o);
    const int64_t shape[2] = {2, 3};
    const int32_t data[6] = {1, 2, 3, 10, 20, 30};
    ndx_tensor_t* t = ndx_test_tensor(data, NDX_DTYPE_INT32, 2, shape);
    ndx_args_t* a = NULL;
    CHECK_OK(ndx_args_new(&a));
    const int64_t axis0[1] = {0}, axis1[1] = {1};
    CHECK_OK(ndx_args_set_int_array(a, "axes", axis0, 1));
    ndx_input_t in = ndx_test_in(t);
    ndx_future_t* f = NULL;
    CHECK_OK(ndx_invoke(ctx, "sum", &in, 1, a, NULL, &f));
    CHECK_OK(ndx_args_set_int_array(a, "axes", axis1, 1));
    CHECK_OK(ndx_args_set_string(a, "keepdims", "changed"));
    ndx_args_free(a);
    if (f != NULL && CHECK_OK(ndx_future_wait(f, -1))) {
      ndx_tensor_t* out = NULL;
      CHECK_OK(ndx_future_tensor(f, 0, &out));
      int64_t sums[3] = {0, 0, 0};
      size_t nbytes = 0;
      if (out && CHECK_OK(ndx_tensor_nbytes(out, &nbytes)) &&
          CHECK(nbytes == sizeof sums, "sum over axis 0: 3 int64 values (%zu bytes)", nbytes)) {
        CHECK_OK(ndx_tensor_copy_to(out, sums, sizeof sums));
        CHECK(sums[0] == 11 && sums[1] == 22 && sums[2] == 33, "sums %lld %lld %lld",
              (long long)sums[0], (long long)sums[1], (long long)sums[2]);
      }
      ndx_tensor_release(out);
    }
    ndx_future_release(f);
    ndx_tensor_release(t);
    ndx_context_release(ctx);
  }
}

/* A new context whose invocations run SYNC_CPU. */
static ndx_context_t* sync_cpu_context(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  return ndx_test_new_context(&o);
}

/* Returns a kernel's input 0 as its output 0 (retained). */
static ndx_error_t* pass_input(const ndx_tensor_t* const* inputs, ndx_tensor_t** outputs) {
  ndx_error_t* e = ndx_tensor_retain(inputs[0]);
  if (e == NULL) outputs[0] = (ndx_tensor_t*)inputs[0];
  return e;
}

/* What typed_reader read, each argument with the getter of its declared type. */
typedef struct {
  int ia_ok, fa_ok, f_ok;
  size_t ia_n, fa_n;
  int64_t ia0;
  double fa0, f;
} typed_read_t;

static ndx_error_t* typed_reader(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                 const ndx_args_t* args, ndx_tensor_t** outputs,
                                 size_t n_outputs) {
  (void)n_inputs; (void)n_outputs;
  typed_read_t* r = (typed_read_t*)user;
  const int64_t* iv = NULL;
  const double* fv = NULL;
  ndx_error_t* e = ndx_args_get_int_array(args, "ia", &iv, &r->ia_n);
  r->ia_ok = e == NULL;
  if (e == NULL && r->ia_n > 0) r->ia0 = iv[0];
  ndx_error_free(e);
  e = ndx_args_get_float_array(args, "fa", &fv, &r->fa_n);
  r->fa_ok = e == NULL;
  if (e == NULL && r->fa_n > 0) r->fa0 = fv[0];
  ndx_error_free(e);
  e = ndx_args_get_float(args, "f", &r->f);
  r->f_ok = e == NULL;
  ndx_error_free(e);
  return pass_input(inputs, outputs);
}

/* A schema's NDX_ARG_INT_ARRAY accepts a single int and NDX_ARG_FLOAT_ARRAY a single
 * float or int, but the kernel got them as given: its ndx_args_get_int_array failed
 * ("argument 'ia' is an int, not an int array"), so an invocation ndx_invoke accepted
 * failed in the kernel. The kernel's copy now holds the declared types. */
static void test_host_kernel_reads_declared_types(void) {
  ndx_context_t* ctx = sync_cpu_context();
  const char* const names[3] = {"ia", "fa", "f"};
  const int32_t types[3] = {NDX_ARG_INT_ARRAY, NDX_ARG_FLOAT_ARRAY, NDX_ARG_FLOAT};
  ndx_op_schema_t s = one_in_one_out(3, names, types);
  s.flags = NDX_OP_OUTPUTS_MAY_ALIAS;
  typed_read_t r;
  memset(&r, 0, sizeof r);
  CHECK_OK(ndx_register_op(ctx, "typed", &s, typed_reader, &r, NULL));
  const float v = 1;
  ndx_tensor_t* t = ndx_test_tensor(&v, NDX_DTYPE_FLOAT32, 0, NULL);
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_int(a, "ia", 3));
  CHECK_OK(ndx_args_set_int(a, "fa", -2));
  CHECK_OK(ndx_args_set_int(a, "f", 5));
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "typed", &in, 1, a, NULL, &f))) {
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(r.ia_ok && r.ia_n == 1 && r.ia0 == 3, "ia: ok %d, n %zu, [0] %lld", r.ia_ok, r.ia_n,
          (long long)r.ia0);
    CHECK(r.fa_ok && r.fa_n == 1 && r.fa0 == -2.0, "fa: ok %d, n %zu, [0] %g", r.fa_ok, r.fa_n,
          r.fa0);
    CHECK(r.f_ok && r.f == 5.0, "f: ok %d, %g", r.f_ok, r.f);
  }
  ndx_future_release(f);
  f = NULL;
  memset(&r, 0, sizeof r);
  CHECK_OK(ndx_args_set_float(a, "fa", 0.25));
  if (CHECK_OK(ndx_invoke(ctx, "typed", &in, 1, a, NULL, &f))) {
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(r.fa_ok && r.fa_n == 1 && r.fa0 == 0.25, "fa from a float: ok %d, n %zu, [0] %g",
          r.fa_ok, r.fa_n, r.fa0);
  }
  ndx_future_release(f);
  ndx_args_free(a);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* What bool_dtype_reader read: "flag" (bool) and "dt" (dtype), and the kind of error
 * and message of reading "dt" as a bool. */
typedef struct {
  int flag_ok, dt_ok, wrong_kind;
  bool flag;
  int32_t dt;
  char wrong_message[160];
} bool_dtype_read_t;

static ndx_error_t* bool_dtype_reader(void* user, const ndx_tensor_t* const* inputs,
                                      size_t n_inputs, const ndx_args_t* args,
                                      ndx_tensor_t** outputs, size_t n_outputs) {
  (void)n_inputs; (void)n_outputs;
  bool_dtype_read_t* r = (bool_dtype_read_t*)user;
  ndx_error_t* e = ndx_args_get_bool(args, "flag", &r->flag);
  r->flag_ok = e == NULL;
  ndx_error_free(e);
  e = ndx_args_get_dtype(args, "dt", &r->dt);
  r->dt_ok = e == NULL;
  ndx_error_free(e);
  bool b = true;
  e = ndx_args_get_bool(args, "dt", &b);
  r->wrong_kind = e == NULL ? -1 : ndx_error_kind(e);
  if (e != NULL) snprintf(r->wrong_message, sizeof r->wrong_message, "%s", ndx_error_message(e));
  if (b) r->wrong_kind = -2; /* the out-param must be cleared */
  ndx_error_free(e);
  return pass_input(inputs, outputs);
}

/* ndx_args_get_bool and ndx_args_get_dtype: on a builder, and in a host kernel whose
 * schema declares a BOOL and a DTYPE argument; an argument of another type is
 * NDX_ERROR_TYPE naming it and both types, with the out-param cleared. */
static void test_args_bool_and_dtype(void) {
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_bool(a, "flag", true));
  CHECK_OK(ndx_args_set_dtype(a, "dt", NDX_DTYPE_FLOAT16));
  CHECK_OK(ndx_args_set_int(a, "n", 2));
  bool b = false;
  int32_t d = 0;
  CHECK_OK(ndx_args_get_bool(a, "flag", &b));
  CHECK(b, "flag read back true");
  CHECK_OK(ndx_args_get_dtype(a, "dt", &d));
  CHECK(d == NDX_DTYPE_FLOAT16, "dt read back %d", (int)d);
  d = 9;
  expect_error(ndx_args_get_dtype(a, "n", &d), NDX_ERROR_TYPE,
               "argument 'n' is an int, not a dtype");
  CHECK(d == 0, "dtype cleared on error (%d)", (int)d);
  b = true;
  expect_error(ndx_args_get_bool(a, "missing", &b), NDX_ERROR_VALUE,
               "no argument 'missing' was given");
  CHECK(!b, "bool cleared on error");

  ndx_context_t* ctx = sync_cpu_context();
  const char* const names[2] = {"flag", "dt"};
  const int32_t types[2] = {NDX_ARG_BOOL, NDX_ARG_DTYPE};
  ndx_op_schema_t s = one_in_one_out(2, names, types);
  s.flags = NDX_OP_OUTPUTS_MAY_ALIAS;
  bool_dtype_read_t r;
  memset(&r, 0, sizeof r);
  CHECK_OK(ndx_register_op(ctx, "bool_dtype", &s, bool_dtype_reader, &r, NULL));
  const float v = 1;
  ndx_tensor_t* t = ndx_test_tensor(&v, NDX_DTYPE_FLOAT32, 0, NULL);
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = NULL;
  ndx_args_free(a);
  a = NULL;
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_bool(a, "flag", true));
  CHECK_OK(ndx_args_set_dtype(a, "dt", NDX_DTYPE_BFLOAT16));
  if (CHECK_OK(ndx_invoke(ctx, "bool_dtype", &in, 1, a, NULL, &f))) {
    CHECK_OK(ndx_future_wait(f, -1));
    CHECK(r.flag_ok && r.flag, "kernel read flag: ok %d, %d", r.flag_ok, (int)r.flag);
    CHECK(r.dt_ok && r.dt == NDX_DTYPE_BFLOAT16, "kernel read dt: ok %d, %d", r.dt_ok,
          (int)r.dt);
    CHECK(r.wrong_kind == NDX_ERROR_TYPE &&
              strstr(r.wrong_message, "argument 'dt' is a dtype, not a bool") != NULL,
          "kernel read dt as a bool: kind %d, message \"%s\"", r.wrong_kind, r.wrong_message);
  }
  ndx_future_release(f);
  ndx_args_free(a);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* A kernel that invokes an EAGER neg on its context (user), polls it until it completed
 * (for at most about 10 s of CPU time) and returns its output. */
static ndx_error_t* eager_inside(void* user, const ndx_tensor_t* const* inputs, size_t n_inputs,
                                 const ndx_args_t* args, ndx_tensor_t** outputs,
                                 size_t n_outputs) {
  (void)n_inputs; (void)args; (void)n_outputs;
  ndx_invoke_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.mode = NDX_EVAL_EAGER;
  ndx_input_t in = ndx_test_in(inputs[0]);
  ndx_future_t* f = NULL;
  ndx_error_t* e = ndx_invoke((const ndx_context_t*)user, "neg", &in, 1, NULL, &opts, &f);
  if (e != NULL) return e;
  clock_t start = clock();
  while (ndx_future_poll(f) == NDX_FUTURE_PENDING &&
         clock() - start < 10 * (clock_t)CLOCKS_PER_SEC) {
  }
  e = ndx_future_tensor(f, 0, &outputs[0]);
  ndx_future_release(f);
  return e;
}

/* A kernel that returned the output of an EAGER invocation it made passed when that
 * invocation had completed by the time it returned, and failed when not (as it always
 * did with a DEFERRED one): timing decided. It fails alike now, in every mode of the
 * host operator's invocation. */
static void test_kernel_output_of_its_own_eager_invocation(void) {
  for (int32_t mode = NDX_EVAL_SYNC_CPU; mode <= NDX_EVAL_EAGER; mode++) {
    ndx_context_options_t o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.eval_mode = mode;
    ndx_context_t* ctx = ndx_test_new_context(&o);
    ndx_op_schema_t s = one_in_one_out(0, NULL, NULL);
    CHECK_OK(ndx_register_op(ctx, "eager_inside", &s, eager_inside, ctx, NULL));
    const float v = 1;
    ndx_tensor_t* t = ndx_test_tensor(&v, NDX_DTYPE_FLOAT32, 0, NULL);
    ndx_input_t in = ndx_test_in(t);
    ndx_future_t* f = NULL;
    if (CHECK_OK(ndx_invoke(ctx, "eager_inside", &in, 1, NULL, NULL, &f))) {
      expect_error(ndx_future_wait(f, -1), NDX_ERROR_BACKEND,
                   "host operator 'eager_inside' returned as outputs[0] the output of 'neg' "
                   "(#2), which it invoked in NDX_EVAL_EAGER (complete or not when it "
                   "returned)");
    }
    ndx_future_release(f);
    CHECK_OK(ndx_context_evaluate(ctx));
    ndx_tensor_release(t);
    ndx_context_release(ctx);
  }
}

/* slice with start, end, step and axes of different lengths said "got 2, 1, 2 and 2":
 * counts for a step and axes never given. Only the given ones are counted, by name. */
static void test_slice_length_mismatch_message(void) {
  ndx_context_t* ctx = ndx_test_new_context(NULL);
  const int64_t shape[2] = {2, 2};
  const int32_t data[4] = {1, 2, 3, 4};
  ndx_tensor_t* t = ndx_test_tensor(data, NDX_DTYPE_INT32, 2, shape);
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  const int64_t two[2] = {0, 0}, one[1] = {1}, three[3] = {1, 1, 1};
  CHECK_OK(ndx_args_set_int_array(a, "start", two, 2));
  CHECK_OK(ndx_args_set_int_array(a, "end", one, 1));
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = NULL;
  expect_error(ndx_invoke(ctx, "slice", &in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "must have one entry per sliced axis; got 2 in start, 1 in end");
  CHECK_OK(ndx_args_set_int_array(a, "step", three, 3));
  expect_error(ndx_invoke(ctx, "slice", &in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "must have one entry per sliced axis; got 2 in start, 1 in end, 3 in step");
  ndx_args_free(a);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* A negative size in reshape's shape and a negative pad width said "dimension -2 is
 * negative in shape [2, -2]" and "pad: width -1 is negative": they name the argument,
 * the index (for pad, which side of which axis), the value and the range allowed. */
static void test_negative_shape_and_pad_entries_message(void) {
  ndx_context_t* ctx = ndx_test_new_context(NULL);
  const int64_t shape[2] = {2, 2};
  const int32_t data[4] = {1, 2, 3, 4};
  ndx_tensor_t* t = ndx_test_tensor(data, NDX_DTYPE_INT32, 2, shape);
  ndx_input_t in = ndx_test_in(t);
  ndx_future_t* f = NULL;
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  const int64_t target[2] = {2, -2}, widths[4] = {0, 1, 2, -1};
  CHECK_OK(ndx_args_set_int_array(a, "shape", target, 2));
  expect_error(ndx_invoke(ctx, "reshape", &in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "operator 'reshape': argument 'shape' [2, -2] has -2 at index 1; expected a "
               "size >= 0, or -1 for the one size to infer");
  ndx_args_free(a);
  /* A wrong type names every form accepted (it said "expected a float"). */
  CHECK_OK(ndx_args_new(&a));
  const int64_t zeros[4] = {0, 0, 0, 0};
  CHECK_OK(ndx_args_set_int_array(a, "widths", zeros, 4));
  CHECK_OK(ndx_args_set_string(a, "value", "1"));
  expect_error(ndx_invoke(ctx, "pad", &in, 1, a, NULL, &f), NDX_ERROR_TYPE,
               "operator 'pad': argument 'value' is a string, expected a float or an int");
  ndx_args_free(a);
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_int_array(a, "widths", widths, 4));
  expect_error(ndx_invoke(ctx, "pad", &in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "operator 'pad': argument 'widths' [0, 1, 2, -1] has -1 at index 3 (the width "
               "after axis 1); expected a width >= 0");
  ndx_args_free(a);
  /* slice's step 0 said "slice: step for axis 0 is 0". */
  CHECK_OK(ndx_args_new(&a));
  const int64_t zero[1] = {0}, one[1] = {1};
  CHECK_OK(ndx_args_set_int_array(a, "start", zero, 1));
  CHECK_OK(ndx_args_set_int_array(a, "end", one, 1));
  CHECK_OK(ndx_args_set_int_array(a, "step", zero, 1));
  expect_error(ndx_invoke(ctx, "slice", &in, 1, a, NULL, &f), NDX_ERROR_VALUE,
               "operator 'slice': argument 'step' [0] has 0 at index 0 (the step along axis 0); "
               "expected a non-zero step");
  ndx_args_free(a);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* max / argmax over no element said only "zero-size reduction: operator 'max' has no
 * identity for an empty set of elements"; the error names the axes and the shape. */
static void test_empty_reduction_message(void) {
  ndx_context_t* ctx = ndx_test_new_context(NULL);
  const int64_t shape[2] = {2, 0};
  const float none[1] = {0};
  ndx_tensor_t* t = ndx_test_tensor(none, NDX_DTYPE_FLOAT32, 2, shape);
  ndx_input_t in = ndx_test_in(t);
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  const int64_t axes[1] = {1};
  CHECK_OK(ndx_args_set_int_array(a, "axes", axes, 1));
  ndx_future_t* f = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "max", &in, 1, a, NULL, &f))) {
    expect_error(ndx_future_wait(f, -1), NDX_ERROR_VALUE,
                 "operator 'max' has no identity for an empty set of elements (it reduces "
                 "axes [1] of shape [2, 0]: 0 elements, expected at least 1)");
  }
  ndx_future_release(f);
  ndx_args_free(a);
  CHECK_OK(ndx_args_new(&a));
  CHECK_OK(ndx_args_set_int(a, "axis", 1));
  f = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "argmax", &in, 1, a, NULL, &f))) {
    expect_error(ndx_future_wait(f, -1), NDX_ERROR_VALUE,
                 "(it reduces axis 1 of shape [2, 0]: 0 elements, expected at least 1)");
  }
  ndx_future_release(f);
  ndx_args_free(a);
  ndx_tensor_release(t);
  ndx_context_release(ctx);
}

/* Array lengths no array can have (their byte size passes PTRDIFF_MAX) are refused
 * with NDX_ERROR_VALUE naming the length, and a copy_to capacity of SIZE_MAX copies
 * the tensor; they once aborted the process (Rust's slice::from_raw_parts
 * precondition). */
static void test_array_lengths_beyond_the_address_space(void) {
  ndx_args_t* a = NULL;
  CHECK_OK(ndx_args_new(&a));
  const int64_t iv[2] = {3, -1};
  const double fv[2] = {0.5, 1.5};
  expect_error(ndx_args_set_int_array(a, "axes", iv, SIZE_MAX), NDX_ERROR_VALUE,
               "argument 'values': n is 18446744073709551615, and");
  expect_error(ndx_args_set_float_array(a, "mean", fv, SIZE_MAX / 4), NDX_ERROR_VALUE,
               "exceed the address space");
  CHECK_OK(ndx_args_set_int_array(a, "axes", iv, 2)); /* the builder is still usable */

  ndx_context_t* ctx = NULL;
  CHECK_OK(ndx_context_new(NULL, &ctx));
  ndx_input_t in[1] = {{NULL, NULL}};
  ndx_future_t* f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_invoke(ctx, "sum", in, SIZE_MAX, a, NULL, &f), NDX_ERROR_VALUE,
               "argument 'inputs': n_inputs is 18446744073709551615, and");
  CHECK(f == NULL, "the future out-param is NULL after the error");
  ndx_context_release(ctx);
  ndx_args_free(a);

  /* A batch of SIZE_MAX samples; a copy whose capacity says "enough". */
  DLManagedTensorVersioned* none[2] = {NULL, NULL};
  ndx_batch_t* b = NULL;
  expect_error(ndx_batch_from_dlpack_versioned(none, SIZE_MAX, NULL, &b), NDX_ERROR_VALUE,
               "pointers exceed the address space");
  const float one = 1.0f;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_host(&one, NDX_DTYPE_FLOAT32, 0, NULL, NULL, NULL, &t));
  float got[2] = {0.0f, 0.0f};
  CHECK_OK(ndx_tensor_copy_to(t, got, SIZE_MAX));
  CHECK(got[0] == 1.0f && got[1] == 0.0f, "copy_to with cap SIZE_MAX: %g %g", got[0], got[1]);
  ndx_tensor_release(t);
}

/* ndx_tensor_copy_to into memory the tensor reads is refused naming 'buf' (it read bytes
 * it had just overwritten: a transposed view copied onto its own buffer came out
 * scrambled); buffers next to that memory are fine. */
static void test_copy_to_overlapping_buffer(void) {
  float buf[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int64_t shape[2] = {3, 2};
  const int64_t strides[2] = {1, 3};
  ndx_tensor_t* t = NULL;
  /* The transpose of the 2x3 matrix in buf[1..7]. */
  CHECK_OK(ndx_tensor_wrap_host(buf + 1, NDX_DTYPE_FLOAT32, 2, shape, strides, NULL, NULL, NULL,
                                &t));
  float apart[6] = {0};
  const float transposed[6] = {1, 4, 2, 5, 3, 6};
  CHECK_OK(ndx_tensor_copy_to(t, apart, sizeof apart));
  CHECK(memcmp(apart, transposed, sizeof apart) == 0, "the transpose copied apart");
  const size_t at[4] = {1, 6, 0, 0};
  const size_t cap[4] = {24, 24, 8, SIZE_MAX};
  for (int i = 0; i < 4; i++) {
    ndx_error_t* e = ndx_tensor_copy_to(t, buf + at[i], cap[i]);
    if (CHECK(e != NULL, "a copy onto buf[%zu..] was accepted", at[i])) {
      CHECK_CONTAINS(ndx_error_message(e), "argument 'buf'");
    }
    expect_error(e, NDX_ERROR_VALUE, "overlaps the tensor's memory");
  }
  for (int i = 0; i < 8; i++) CHECK(buf[i] == (float)i, "buf[%d] untouched: %g", i, (double)buf[i]);
  /* buf[1] alone, copied next to itself on either side. */
  const int64_t one[1] = {1};
  ndx_tensor_t* t1 = NULL;
  CHECK_OK(ndx_tensor_wrap_host(buf + 1, NDX_DTYPE_FLOAT32, 1, one, NULL, NULL, NULL, NULL, &t1));
  CHECK_OK(ndx_tensor_copy_to(t1, buf + 2, sizeof(float)));
  CHECK_OK(ndx_tensor_copy_to(t1, buf, sizeof(float)));
  CHECK(buf[0] == 1 && buf[1] == 1 && buf[2] == 1, "copied next to itself");
  ndx_tensor_release(t1);
  ndx_tensor_release(t);
}

/* A 0-d tensor's shape and strides are non-NULL pointers (never to be read), so a
 * caller that treats NULL as failure does not misread a scalar; alike for a DLPack
 * import whose shape and strides are NULL. */
static void test_zero_d_shape_pointer(void) {
  float x = 3;
  ndx_tensor_t* t = NULL;
  const int64_t *sp = NULL, *st = NULL;
  CHECK_OK(ndx_tensor_from_host(&x, NDX_DTYPE_FLOAT32, 0, NULL, NULL, NULL, &t));
  CHECK_OK(ndx_tensor_shape(t, &sp));
  CHECK_OK(ndx_tensor_strides(t, &st));
  CHECK(sp != NULL && st != NULL, "0-d from_host: shape %p strides %p", (const void*)sp,
        (const void*)st);
  ndx_tensor_release(t);
  int deleted = 0;
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&deleted, ndx_test_dl_dtype(kDLFloat, 32, 1), 0, NULL, NULL, &x, 4);
  m->dl_tensor.shape = NULL;
  m->dl_tensor.strides = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  sp = NULL;
  st = NULL;
  CHECK_OK(ndx_tensor_shape(t, &sp));
  CHECK_OK(ndx_tensor_strides(t, &st));
  CHECK(sp != NULL && st != NULL, "0-d DLPack: shape %p strides %p", (const void*)sp,
        (const void*)st);
  ndx_tensor_release(t);
  CHECK(deleted == 1, "deleter ran once: %d", deleted);
}

int main(void) {
  test_dtype_names();
  test_from_host_copies();
  test_from_host_strided();
  test_from_host_edge_cases();
  test_from_host_every_dtype();
  test_from_host_options();
  test_wrap_host();
  test_zero_d_shape_pointer();
  test_accessors_null_handle();
  test_accessors_null_out();
  test_args_array_out_params();
  test_array_lengths_beyond_the_address_space();
  test_copy_to_overlapping_buffer();
  test_names_must_be_utf8();
  test_args_copied_at_invoke();
  test_host_kernel_reads_declared_types();
  test_args_bool_and_dtype();
  test_kernel_output_of_its_own_eager_invocation();
  test_slice_length_mismatch_message();
  test_negative_shape_and_pad_entries_message();
  test_empty_reduction_message();
  return NDX_TEST_SUMMARY("test_host");
}
