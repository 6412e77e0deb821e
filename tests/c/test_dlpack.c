/* Tests of DLPack import and export: versioned and legacy single imports (ownership,
 * every invalid field), bulk batch imports (validation before anything is taken, the
 * major-version rule), strided views, READ_ONLY and IS_COPIED, export -> re-import
 * round trips and the exported deleter, CUDA tensors as metadata, and batches
 * (ndx_batch_to_tensor, ndx_batch_sample, accessors).
 *
 * Every producer tensor comes from ndx_test_versioned()/ndx_test_legacy() (ndx_test.h):
 * its deleter frees everything and counts its calls, so each case asserts exactly how
 * often ndx called it (0 while the caller owns it, 1 after the last release). */
#include "ndx_test.h"

static const float k12[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

/* A 2x3 float32 CPU tensor holding 0..5 (compact, no strides). */
static DLManagedTensorVersioned* v_2x3(int* counter) {
  const int64_t shape[2] = {2, 3};
  return ndx_test_versioned(counter, NDX_TEST_DL_F32, 2, shape, NULL, k12, 6 * sizeof(float));
}
static DLManagedTensor* l_2x3(int* counter) {
  const int64_t shape[2] = {2, 3};
  return ndx_test_legacy(counter, NDX_TEST_DL_F32, 2, shape, NULL, k12, 6 * sizeof(float));
}

/* Copies a float32 tensor out and compares it with `expected` (n values). */
static int check_f32_values(const ndx_tensor_t* t, const float* expected, size_t n, int line) {
  float got[64];
  size_t nbytes = 0;
  memset(got, 0, sizeof got);
  if (!CHECK_OK(ndx_tensor_nbytes(t, &nbytes))) return 0;
  if (!CHECK(nbytes == n * sizeof(float), "line %d: nbytes %zu, expected %zu", line, nbytes,
             n * sizeof(float)))
    return 0;
  if (!CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got))) return 0;
  int ok = 1;
  for (size_t i = 0; i < n; i++) {
    if (got[i] != expected[i]) ok = 0;
  }
  if (!ok) {
    fprintf(stderr, "  line %d: got", line);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %g", (double)got[i]);
    fprintf(stderr, "\n  expected");
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %g", (double)expected[i]);
    fprintf(stderr, "\n");
  }
  return CHECK(ok, "values of the tensor (line %d)", line);
}
#define CHECK_F32(t, expected, n) check_f32_values((t), (expected), (n), __LINE__)

static void check_shape(const ndx_tensor_t* t, int32_t ndim, const int64_t* shape,
                        const int64_t* strides) {
  int32_t nd = -1;
  const int64_t* s = NULL;
  const int64_t* st = NULL;
  CHECK_OK(ndx_tensor_ndim(t, &nd));
  CHECK(nd == ndim, "ndim %d, expected %d", (int)nd, (int)ndim);
  if (nd != ndim) return;
  CHECK_OK(ndx_tensor_shape(t, &s));
  CHECK_I64_ARRAY(s, shape, ndim);
  if (strides) {
    CHECK_OK(ndx_tensor_strides(t, &st));
    CHECK_I64_ARRAY(st, strides, ndim);
  }
}

/* ---- single imports ------------------------------------------------------------------ */

static void test_versioned_import_success(void) {
  int deleted = 0;
  DLManagedTensorVersioned* m = v_2x3(&deleted);
  void* producer_data = m->dl_tensor.data;
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  if (!CHECK(t != NULL && t != NDX_TEST_BOGUS_PTR, "a tensor")) return;
  CHECK(deleted == 0, "owned by ndx, not yet deleted");

  int32_t dtype = 0;
  size_t numel = 0, nbytes = 0;
  DLDevice dev = {kDLCUDA, 9};
  const char* layout = NULL;
  bool ro = true;
  CHECK_OK(ndx_tensor_dtype(t, &dtype));
  CHECK(dtype == NDX_DTYPE_FLOAT32, "dtype %d", (int)dtype);
  const int64_t shape[2] = {2, 3}, compact[2] = {3, 1};
  check_shape(t, 2, shape, compact);
  CHECK_OK(ndx_tensor_numel(t, &numel));
  CHECK(numel == 6, "numel %zu", numel);
  CHECK_OK(ndx_tensor_nbytes(t, &nbytes));
  CHECK(nbytes == 24, "nbytes %zu", nbytes);
  CHECK_OK(ndx_tensor_device(t, &dev));
  CHECK(dev.device_type == kDLCPU && dev.device_id == 0, "device %d:%d", (int)dev.device_type,
        (int)dev.device_id);
  CHECK_OK(ndx_tensor_layout(t, &layout));
  CHECK_STR_EQ(layout, "");
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(!ro, "not read-only");
  CHECK_F32(t, k12, 6);

  /* Zero-copy: an export points at the producer's memory. */
  DLManagedTensorVersioned* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (CHECK(ex != NULL, "exported")) {
    CHECK((char*)ex->dl_tensor.data + ex->dl_tensor.byte_offset == (char*)producer_data,
          "the export aliases the producer's data");
    ex->deleter(ex);
  }

  /* Retain/release: the deleter runs once, at the last release. */
  CHECK_OK(ndx_tensor_retain(t));
  CHECK_OK(ndx_tensor_retain(t));
  ndx_tensor_release(t);
  ndx_tensor_release(t);
  CHECK(deleted == 0, "two retains, two releases: still alive (%d)", deleted);
  CHECK_F32(t, k12, 6);
  ndx_tensor_release(t);
  CHECK(deleted == 1, "last release calls the deleter once (%d)", deleted);
}

static void test_legacy_import_success(void) {
  int deleted = 0;
  DLManagedTensor* m = l_2x3(&deleted);
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack(m, NULL, &t));
  if (!CHECK(t != NULL, "a tensor")) return;
  CHECK(deleted == 0, "owned by ndx");
  const int64_t shape[2] = {2, 3}, compact[2] = {3, 1};
  check_shape(t, 2, shape, compact);
  CHECK_F32(t, k12, 6);
  bool ro = true;
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(!ro, "legacy imports are writable");
  CHECK_OK(ndx_tensor_retain(t));
  ndx_tensor_release(t);
  CHECK(deleted == 0, "still referenced");
  ndx_tensor_release(t);
  CHECK(deleted == 1, "deleted once (%d)", deleted);
}

static void test_scalar_and_empty(void) {
  /* ndim 0: a scalar, shape may be NULL. */
  int deleted = 0;
  const float v = 42.0f;
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 0, NULL, NULL, &v, sizeof v);
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  size_t numel = 0;
  CHECK_OK(ndx_tensor_numel(t, &numel));
  CHECK(numel == 1, "a scalar has one element (%zu)", numel);
  int32_t nd = -1;
  CHECK_OK(ndx_tensor_ndim(t, &nd));
  CHECK(nd == 0, "ndim 0");
  CHECK_F32(t, &v, 1);
  ndx_tensor_release(t);
  CHECK(deleted == 1, "deleted once");

  /* No elements: data may be NULL. */
  deleted = 0;
  const int64_t shape[2] = {0, 3};
  m = ndx_test_versioned(&deleted, NDX_TEST_DL_F32, 2, shape, NULL, NULL, 0);
  CHECK(m->dl_tensor.data == NULL, "no data");
  t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  CHECK_OK(ndx_tensor_numel(t, &numel));
  CHECK(numel == 0, "numel 0");
  CHECK_OK(ndx_tensor_copy_to(t, NULL, 0));
  ndx_tensor_release(t);
  CHECK(deleted == 1, "deleted once");
}

/* One invalid field per case, applied to a fresh valid 2x3 float32 tensor. */
enum mutation {
  M_NDIM_NEG,
  M_NDIM_HUGE,
  M_SHAPE_NULL,
  M_NEG_DIM,
  M_COMPLEX64,
  M_LANES4,
  M_OPENCL,
  M_DEVICE_ID_NEG,
  M_DATA_NULL,
  M_STRIDES_OVERFLOW,
  M_BROADCAST_OVERFLOW,
  M_LAYOUT_LENGTH,
  M_LAYOUT_TWICE,
  M_LAYOUT_NOT_LETTERS,
  M_OPTS_SIZE,
  M_SHAPE_MISALIGNED,
  M_OUT_NULL,
  M_COUNT
};

static const struct {
  int kind;
  const char* fragment;
  const char* name;
} k_mutations[M_COUNT] = {
    {NDX_ERROR_VALUE, "ndim is -1, expected 0 to 64", "ndim -1"},
    {NDX_ERROR_VALUE, "ndim is 1000, expected 0 to 64", "ndim 1000"},
    {NDX_ERROR_VALUE, "shape is NULL but ndim is 2", "shape NULL"},
    {NDX_ERROR_VALUE, "shape[1] is -3", "negative dim"},
    {NDX_ERROR_TYPE, "dtype code 5 (complex), bits 64, lanes 1 is not supported", "complex64"},
    {NDX_ERROR_TYPE, "dtype code 2 (float), bits 32, lanes 4 is not supported", "lanes 4"},
    {NDX_ERROR_VALUE, "device type 4 (kDLOpenCL) is not supported", "kDLOpenCL"},
    {NDX_ERROR_VALUE, "device id is -1", "device id -1"},
    {NDX_ERROR_VALUE, "data is NULL but the tensor has 6 elements", "data NULL"},
    {NDX_ERROR_VALUE, "overflows the address space", "strides overflow"},
    /* A zero-stride view spans a few bytes, but its elements do not fit compacted. */
    {NDX_ERROR_VALUE,
     "shape [2305843009213693952, 3] of itemsize 4 is too large to address: its compact size "
     "(6917529027641081856 elements x 4 bytes) overflows",
     "broadcast size overflow"},
    {NDX_ERROR_VALUE, "layout \"HWC\" has 3 letters but the tensor has ndim 2", "layout HWC"},
    {NDX_ERROR_VALUE, "names dimension 'H' twice", "layout HH"},
    {NDX_ERROR_VALUE, "must consist of ASCII letters", "layout H1"},
    {NDX_ERROR_VALUE, "opts->struct_size is 8", "opts struct_size"},
    /* A broken producer's shape array at an odd address: refused, never read. */
    {NDX_ERROR_VALUE, "is not aligned to 8 bytes", "shape misaligned"},
    {NDX_ERROR_VALUE, "argument 'out' is NULL", "out NULL"},
};

/* Applies mutation `m` to `dl` and `opts`; returns whether `out` should be NULL. */
static int mutate(enum mutation m, DLTensor* dl, ndx_import_options_t* opts) {
  static int64_t neg_shape[2] = {2, -3};
  static int64_t huge_strides[2] = {INT64_MAX / 2, 1};
  static int64_t broadcast_shape[2] = {INT64_C(1) << 61, 3};
  static int64_t broadcast_strides[2] = {0, 1};
  switch (m) {
    case M_NDIM_NEG: dl->ndim = -1; break;
    case M_NDIM_HUGE: dl->ndim = 1000; break;
    case M_SHAPE_NULL: dl->shape = NULL; break;
    case M_NEG_DIM: dl->shape = neg_shape; break;
    case M_COMPLEX64: dl->dtype = ndx_test_dl_dtype(kDLComplex, 64, 1); break;
    case M_LANES4: dl->dtype = ndx_test_dl_dtype(kDLFloat, 32, 4); break;
    case M_OPENCL: dl->device.device_type = kDLOpenCL; break;
    case M_DEVICE_ID_NEG: dl->device.device_id = -1; break;
    case M_DATA_NULL: dl->data = NULL; break;
    case M_STRIDES_OVERFLOW: dl->strides = huge_strides; break;
    case M_BROADCAST_OVERFLOW:
      dl->shape = broadcast_shape;
      dl->strides = broadcast_strides;
      break;
    case M_LAYOUT_LENGTH: opts->layout = "HWC"; break;
    case M_LAYOUT_TWICE: opts->layout = "HH"; break;
    case M_LAYOUT_NOT_LETTERS: opts->layout = "H1"; break;
    case M_OPTS_SIZE: opts->struct_size = 8; break;
    case M_SHAPE_MISALIGNED: {
      /* {2, 3} one byte into an 8-aligned buffer. */
      static int64_t words[3];
      const int64_t dims[2] = {2, 3};
      memcpy((char*)words + 1, dims, sizeof dims);
      dl->shape = (int64_t*)(void*)((char*)words + 1);
      break;
    }
    case M_OUT_NULL: return 1;
    case M_COUNT: break;
  }
  return 0;
}

/* Each DLPack device type and type code ndx does not take is named in the refusal by its
 * kDL* name or kind (an unassigned one as "unknown"), and the caller keeps the tensor. */
static void test_unsupported_devices_and_codes_named(void) {
  static const struct {
    int32_t type;
    const char* name;
  } devices[] = {{4, "kDLOpenCL"},   {5, "unknown"},    {7, "kDLVulkan"},  {8, "kDLMetal"},
                 {9, "kDLVPI"},      {10, "kDLROCM"},   {11, "kDLROCMHost"}, {12, "kDLExtDev"},
                 {14, "kDLOneAPI"},  {15, "kDLWebGPU"}, {16, "kDLHexagon"}, {17, "kDLMAIA"},
                 {18, "kDLTrn"},     {99, "unknown"}};
  static const struct {
    uint8_t code;
    const char* name;
  } codes[] = {{3, "opaque handle"}, {7, "float8"}, {14, "float8"}, {15, "float6"},
               {16, "float6"},       {17, "float4"}, {200, "unknown"}};
  const size_t n_devices = sizeof devices / sizeof devices[0];
  const size_t n_codes = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n_devices + n_codes; i++) {
    int deleted = 0;
    DLManagedTensorVersioned* v = v_2x3(&deleted);
    char want[128];
    int kind;
    if (i < n_devices) {
      v->dl_tensor.device.device_type = (DLDeviceType)devices[i].type;
      snprintf(want, sizeof want, "device type %d (%s) is not supported", (int)devices[i].type,
               devices[i].name);
      kind = NDX_ERROR_VALUE;
    } else {
      const size_t c = i - n_devices;
      v->dl_tensor.dtype = ndx_test_dl_dtype(codes[c].code, 8, 1);
      snprintf(want, sizeof want, "dtype code %d (%s), bits 8, lanes 1 is not supported",
               (int)codes[c].code, codes[c].name);
      kind = NDX_ERROR_TYPE;
    }
    ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_tensor_from_dlpack_versioned(v, NULL, &t), kind, want);
    CHECK(t == NULL, "%s: out reset to NULL", want);
    CHECK(deleted == 0, "%s: the caller still owns the tensor", want);
    ndx_test_drop_versioned(v);
    CHECK(deleted == 1, "freed by the test");
  }
}

static void test_invalid_fields(void) {
  /* NULL tensor. */
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_dlpack_versioned(NULL, NULL, &t), NDX_ERROR_VALUE,
               "argument 'tensor' is NULL");
  CHECK(t == NULL, "out reset to NULL");
  t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_dlpack(NULL, NULL, &t), NDX_ERROR_VALUE,
               "argument 'tensor' is NULL");
  CHECK(t == NULL, "out reset to NULL");

  for (int legacy = 0; legacy <= 1; legacy++) {
    for (int i = 0; i < M_COUNT; i++) {
      int deleted = 0;
      ndx_import_options_t opts = ndx_test_options(NULL, false);
      DLManagedTensorVersioned* v = legacy ? NULL : v_2x3(&deleted);
      DLManagedTensor* l = legacy ? l_2x3(&deleted) : NULL;
      DLTensor* dl = legacy ? &l->dl_tensor : &v->dl_tensor;
      int null_out = mutate((enum mutation)i, dl, &opts);
      t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
      ndx_tensor_t** out = null_out ? NULL : &t;
      ndx_error_t* e = legacy ? ndx_tensor_from_dlpack(l, &opts, out)
                              : ndx_tensor_from_dlpack_versioned(v, &opts, out);
      if (!expect_error(e, k_mutations[i].kind, k_mutations[i].fragment)) {
        fprintf(stderr, "  (case: %s, %s)\n", k_mutations[i].name,
                legacy ? "legacy" : "versioned");
      }
      if (e == NULL && !null_out && t != NULL && t != NDX_TEST_BOGUS_PTR) {
        ndx_tensor_release(t); /* imported by mistake: ndx owns it now */
        continue;
      }
      CHECK(null_out || t == NULL, "%s: out reset to NULL", k_mutations[i].name);
      CHECK(deleted == 0, "%s (%s): the caller still owns the tensor, deleter calls %d",
            k_mutations[i].name, legacy ? "legacy" : "versioned", deleted);
      if (legacy) {
        ndx_test_drop_legacy(l);
      } else {
        ndx_test_drop_versioned(v);
      }
      CHECK(deleted == 1, "freed by the test");
    }
  }
}

static void test_unknown_major_version(void) {
  int deleted = 0;
  DLManagedTensorVersioned* m = v_2x3(&deleted);
  m->version.major = 2;
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_from_dlpack_versioned(m, NULL, &t), NDX_ERROR_VALUE,
               "deleter has been called");
  CHECK(t == NULL, "no tensor");
  CHECK(deleted == 1, "ndx called the deleter exactly once (%d)", deleted);

  /* The message names the version. */
  deleted = 0;
  m = v_2x3(&deleted);
  m->version.major = 2;
  expect_error(ndx_tensor_from_dlpack_versioned(m, NULL, &t), NDX_ERROR_VALUE,
               "DLPack major version 2 is not supported");
  CHECK(deleted == 1, "deleted once");

  /* Only version and deleter may be read: even a garbage body is fine. */
  deleted = 0;
  m = v_2x3(&deleted);
  m->version.major = 0;
  m->dl_tensor.ndim = -12345;
  m->dl_tensor.shape = NULL;
  expect_error(ndx_tensor_from_dlpack_versioned(m, NULL, &t), NDX_ERROR_VALUE,
               "major version 0 is not supported");
  CHECK(deleted == 1, "major 0 is unknown too: deleted once");

  /* A newer minor version is accepted. */
  deleted = 0;
  m = v_2x3(&deleted);
  m->version.minor = 99;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  ndx_tensor_release(t);
  CHECK(deleted == 1, "minor 99 imported and deleted once");

  /* The header's rule is unconditional: "On failure the caller still owns `tensor` -
   * except when its major version is not 1: then ... ndx calls its deleter". A caller
   * cannot look at the tensor after such a failure (it may be freed), so whatever else
   * is wrong with the call, an unknown major version must always end with the deleter
   * called exactly once - otherwise a caller that follows the header leaks it. Checked
   * here with two argument errors that ndx detects before it looks at the tensor. */
  deleted = 0;
  m = v_2x3(&deleted);
  m->version.major = 2;
  ndx_import_options_t bad_opts = ndx_test_options(NULL, false);
  bad_opts.struct_size = 0;
  ndx_error_t* err = ndx_tensor_from_dlpack_versioned(m, &bad_opts, &t);
  CHECK(err != NULL, "fails");
  ndx_error_free(err);
  CHECK(deleted == 1,
        "major 2 with bad options: the deleter must be called once, as the header says "
        "for every failure with an unknown major version (calls: %d)",
        deleted);
  if (deleted == 0) ndx_test_drop_versioned(m); /* not taken: free it here, no leak */

  deleted = 0;
  m = v_2x3(&deleted);
  m->version.major = 2;
  err = ndx_tensor_from_dlpack_versioned(m, NULL, NULL);
  CHECK(err != NULL, "fails");
  ndx_error_free(err);
  CHECK(deleted == 1,
        "major 2 with a NULL out: the deleter must be called once, as the header says for "
        "every failure with an unknown major version (calls: %d)",
        deleted);
  if (deleted == 0) ndx_test_drop_versioned(m);

  /* An unknown major version with no deleter: an error, no crash. */
  deleted = 0;
  m = v_2x3(&deleted);
  m->version.major = 2;
  void (*saved)(DLManagedTensorVersioned*) = m->deleter;
  m->deleter = NULL;
  expect_error(ndx_tensor_from_dlpack_versioned(m, NULL, &t), NDX_ERROR_VALUE,
               "major version 2");
  CHECK(deleted == 0, "nothing to call");
  saved(m);
  CHECK(deleted == 1, "freed by the test");
}

/* ---- bulk imports -------------------------------------------------------------------- */

#define NB 5

/* n float32 samples of shape {rows[i], 3} on `device`, holding 100*i + k. */
static void make_samples(int n, DLManagedTensorVersioned** v, DLManagedTensor** l,
                         int* counters, const int64_t* rows) {
  for (int i = 0; i < n; i++) {
    float vals[30];
    for (int k = 0; k < 30; k++) vals[k] = (float)(100 * i + k);
    int64_t shape[2] = {rows[i], 3};
    size_t bytes = (size_t)(rows[i] * 3) * sizeof(float);
    counters[i] = 0;
    if (v) v[i] = ndx_test_versioned(&counters[i], NDX_TEST_DL_F32, 2, shape, NULL, vals, bytes);
    if (l) l[i] = ndx_test_legacy(&counters[i], NDX_TEST_DL_F32, 2, shape, NULL, vals, bytes);
  }
}

static void drop_samples(int n, DLManagedTensorVersioned** v, DLManagedTensor** l,
                         const int* counters) {
  for (int i = 0; i < n; i++) {
    if (counters[i] != 0) continue; /* already deleted by ndx */
    if (v && v[i]) ndx_test_drop_versioned(v[i]);
    if (l && l[i]) ndx_test_drop_legacy(l[i]);
  }
}

static int all_zero(const int* counters, int n) {
  for (int i = 0; i < n; i++) {
    if (counters[i] != 0) return 0;
  }
  return 1;
}

static void check_ragged_batch(ndx_batch_t* b, const int64_t* rows) {
  size_t size = 0;
  bool uniform = true;
  int32_t dtype = 0, ndim = 0;
  DLDevice dev = {kDLCUDA, 5};
  const char* layout = NULL;
  CHECK_OK(ndx_batch_size(b, &size));
  CHECK(size == 3, "3 samples (%zu)", size);
  CHECK_OK(ndx_batch_is_uniform(b, &uniform));
  CHECK(!uniform, "ragged");
  CHECK_OK(ndx_batch_dtype(b, &dtype));
  CHECK(dtype == NDX_DTYPE_FLOAT32, "dtype");
  CHECK_OK(ndx_batch_ndim(b, &ndim));
  CHECK(ndim == 2, "ndim");
  CHECK_OK(ndx_batch_device(b, &dev));
  CHECK(dev.device_type == kDLCPU && dev.device_id == 0, "device");
  CHECK_OK(ndx_batch_layout(b, &layout));
  CHECK_STR_EQ(layout, "HW");
  for (size_t i = 0; i < 3; i++) {
    ndx_tensor_t* s = NULL;
    CHECK_OK(ndx_batch_sample(b, i, &s));
    if (!s) continue;
    const int64_t shape[2] = {rows[i], 3};
    check_shape(s, 2, shape, NULL);
    float expect[30];
    for (int k = 0; k < 30; k++) expect[k] = (float)(100 * (int)i + k);
    CHECK_F32(s, expect, (size_t)(rows[i] * 3));
    const char* sl = NULL;
    CHECK_OK(ndx_tensor_layout(s, &sl));
    CHECK_STR_EQ(sl, "HW");
    ndx_tensor_release(s);
  }
}

static void test_bulk_success(void) {
  const int64_t rows[3] = {2, 4, 1};
  ndx_import_options_t opts = ndx_test_options("HW", false);
  for (int legacy = 0; legacy <= 1; legacy++) {
    DLManagedTensorVersioned* v[3] = {NULL, NULL, NULL};
    DLManagedTensor* l[3] = {NULL, NULL, NULL};
    int c[3];
    make_samples(3, legacy ? NULL : v, legacy ? l : NULL, c, rows);
    ndx_batch_t* b = NULL;
    if (legacy) {
      CHECK_OK(ndx_batch_from_dlpack(l, 3, &opts, &b));
    } else {
      CHECK_OK(ndx_batch_from_dlpack_versioned(v, 3, &opts, &b));
    }
    if (!CHECK(b != NULL, "a batch")) continue;
    CHECK(all_zero(c, 3), "owned by ndx, none deleted");
    check_ragged_batch(b, rows);
    CHECK(all_zero(c, 3), "samples taken and released: none deleted");

    /* Keep sample 1; releasing the batch deletes the others once. */
    ndx_tensor_t* keep = NULL;
    CHECK_OK(ndx_batch_sample(b, 1, &keep));
    CHECK_OK(ndx_batch_retain(b));
    ndx_batch_release(b);
    CHECK(all_zero(c, 3), "retained batch still alive");
    ndx_batch_release(b);
    CHECK(c[0] == 1 && c[1] == 0 && c[2] == 1, "%s: deleters %d %d %d, expected 1 0 1",
          legacy ? "legacy" : "versioned", c[0], c[1], c[2]);
    float expect[12];
    for (int k = 0; k < 12; k++) expect[k] = (float)(100 + k);
    CHECK_F32(keep, expect, 12);
    ndx_tensor_release(keep);
    CHECK(c[0] == 1 && c[1] == 1 && c[2] == 1, "all deleted once: %d %d %d", c[0], c[1], c[2]);
  }
}

/* Which sample to spoil and how, for the bulk failure cases. */
enum bulk_case {
  B_NULL_AT_2,
  B_DTYPE_AT_2,
  B_DEVICE_TYPE_AT_1,
  B_DEVICE_ID_AT_2,
  B_NDIM_AT_1,
  B_NEG_DIM_AT_1,
  B_COMPLEX_AT_2,
  B_LAYOUT,
  B_COUNT
};

static const struct {
  int kind;
  const char* fragments[3];
  const char* name;
} k_bulk[B_COUNT] = {
    {NDX_ERROR_VALUE, {"tensors[2] is NULL", "(n = 3)", "still belongs to the caller"}, "NULL"},
    {NDX_ERROR_VALUE,
     {"tensors[2]: dtype is int32, expected float32", "like tensors[0]", "still belong"},
     "dtype"},
    {NDX_ERROR_VALUE, {"tensors[1]: device type is kDLCUDA, expected kDLCPU", "tensors[0]", NULL},
     "device type"},
    {NDX_ERROR_VALUE, {"tensors[2]: device id is 1, expected 0", "tensors[0]", NULL},
     "device id"},
    {NDX_ERROR_VALUE, {"tensors[1]: ndim is 3, expected 2", "tensors[0]", NULL}, "ndim"},
    {NDX_ERROR_VALUE, {"tensors[1]: shape[0] is -1", "still belong", NULL}, "negative dim"},
    {NDX_ERROR_TYPE, {"tensors[2]: dtype code 5 (complex)", "still belong", NULL}, "complex"},
    {NDX_ERROR_VALUE, {"tensors[0]: layout \"HWC\" has 3 letters", NULL, NULL}, "layout"},
};

static void spoil(enum bulk_case bc, DLTensor** dl, DLManagedTensorVersioned** v,
                  DLManagedTensor** l, ndx_import_options_t* opts) {
  static int64_t neg[2] = {-1, 3};
  static int64_t shape3[3] = {2, 3, 1};
  (void)l;
  switch (bc) {
    case B_NULL_AT_2:
      if (v) v[2] = NULL;
      if (l) l[2] = NULL;
      break;
    case B_DTYPE_AT_2: dl[2]->dtype = NDX_TEST_DL_I32; break;
    case B_DEVICE_TYPE_AT_1:
      dl[1]->device.device_type = kDLCUDA;
      dl[1]->data = (void*)(uintptr_t)0x1000;
      break;
    case B_DEVICE_ID_AT_2:
      for (int i = 0; i < 3; i++) {
        dl[i]->device.device_type = kDLCUDA;
        dl[i]->data = (void*)(uintptr_t)0x1000;
      }
      dl[2]->device.device_id = 1;
      break;
    case B_NDIM_AT_1:
      dl[1]->ndim = 3;
      dl[1]->shape = shape3;
      break;
    case B_NEG_DIM_AT_1: dl[1]->shape = neg; break;
    case B_COMPLEX_AT_2: dl[2]->dtype = ndx_test_dl_dtype(kDLComplex, 64, 1); break;
    case B_LAYOUT: opts->layout = "HWC"; break;
    case B_COUNT: break;
  }
}

static void test_bulk_failures(void) {
  const int64_t rows[3] = {2, 2, 2};
  ndx_batch_t* b = (ndx_batch_t*)NDX_TEST_BOGUS_PTR;

  /* n = 0 and a NULL array. */
  DLManagedTensorVersioned* none_v[1] = {NULL};
  DLManagedTensor* none_l[1] = {NULL};
  expect_error(ndx_batch_from_dlpack_versioned(none_v, 0, NULL, &b), NDX_ERROR_VALUE,
               "argument 'n' is 0");
  CHECK(b == NULL, "out reset");
  expect_error(ndx_batch_from_dlpack(none_l, 0, NULL, &b), NDX_ERROR_VALUE, "argument 'n' is 0");
  expect_error(ndx_batch_from_dlpack_versioned(NULL, 3, NULL, &b), NDX_ERROR_VALUE,
               "argument 'tensors' is NULL");
  expect_error(ndx_batch_from_dlpack(NULL, 3, NULL, &b), NDX_ERROR_VALUE,
               "argument 'tensors' is NULL");

  for (int legacy = 0; legacy <= 1; legacy++) {
    for (int bc = 0; bc < B_COUNT; bc++) {
      DLManagedTensorVersioned* v[3] = {NULL, NULL, NULL};
      DLManagedTensor* l[3] = {NULL, NULL, NULL};
      DLManagedTensorVersioned* v_keep[3];
      DLManagedTensor* l_keep[3];
      int c[3];
      make_samples(3, legacy ? NULL : v, legacy ? l : NULL, c, rows);
      DLTensor* dl[3];
      for (int i = 0; i < 3; i++) {
        v_keep[i] = v[i];
        l_keep[i] = l[i];
        dl[i] = legacy ? &l[i]->dl_tensor : &v[i]->dl_tensor;
      }
      ndx_import_options_t opts = ndx_test_options(NULL, false);
      spoil((enum bulk_case)bc, dl, legacy ? NULL : v, legacy ? l : NULL, &opts);
      b = (ndx_batch_t*)NDX_TEST_BOGUS_PTR;
      ndx_error_t* e = legacy ? ndx_batch_from_dlpack(l, 3, &opts, &b)
                              : ndx_batch_from_dlpack_versioned(v, 3, &opts, &b);
      const char* what = legacy ? "legacy" : "versioned";
      if (!CHECK(e != NULL, "%s %s: the import must fail", what, k_bulk[bc].name)) {
        ndx_batch_release(b); /* ndx owns the samples now */
        continue;
      }
      CHECK(ndx_error_kind(e) == k_bulk[bc].kind, "%s %s: kind %d", what, k_bulk[bc].name,
            (int)ndx_error_kind(e));
      for (int f = 0; f < 3; f++) {
        if (k_bulk[bc].fragments[f] == NULL) continue;
        CHECK(ndx_test_contains(ndx_error_message(e), k_bulk[bc].fragments[f]),
              "%s %s: message \"%s\" lacks \"%s\"", what, k_bulk[bc].name,
              NDX_TEST_S(ndx_error_message(e)), k_bulk[bc].fragments[f]);
      }
      ndx_error_free(e);
      CHECK(b == NULL, "out reset");
      CHECK(all_zero(c, 3), "%s %s: every tensor still belongs to the caller: %d %d %d", what,
            k_bulk[bc].name, c[0], c[1], c[2]);
      drop_samples(3, legacy ? NULL : v_keep, legacy ? l_keep : NULL, c);
    }
  }
}

static void test_bulk_unknown_major(void) {
  const int64_t rows[NB] = {1, 2, 3, 4, 5};
  DLManagedTensorVersioned* v[NB];
  int c[NB];
  make_samples(NB, v, NULL, c, rows);
  v[1]->version.major = 2;
  v[3]->version.major = 2;
  /* Another problem elsewhere does not stop the version rule (versions come first). */
  v[4]->dl_tensor.dtype = NDX_TEST_DL_I32;
  ndx_batch_t* b = (ndx_batch_t*)NDX_TEST_BOGUS_PTR;
  ndx_error_t* e = ndx_batch_from_dlpack_versioned(v, NB, NULL, &b);
  CHECK(ndx_error_kind(e) == NDX_ERROR_VALUE, "kind %d", (int)ndx_error_kind(e));
  CHECK_CONTAINS(ndx_error_message(e), "tensors[1]");
  CHECK_CONTAINS(ndx_error_message(e), "tensors[3]");
  CHECK_CONTAINS(ndx_error_message(e), "major 2");
  CHECK_CONTAINS(ndx_error_message(e), "deleters have been called");
  CHECK(!ndx_test_contains(ndx_error_message(e), "tensors[0]") &&
            !ndx_test_contains(ndx_error_message(e), "tensors[2]") &&
            !ndx_test_contains(ndx_error_message(e), "tensors[4]"),
        "only the unknown versions are named: %s", NDX_TEST_S(ndx_error_message(e)));
  ndx_error_free(e);
  CHECK(b == NULL, "no batch");
  CHECK(c[0] == 0 && c[1] == 1 && c[2] == 0 && c[3] == 1 && c[4] == 0,
        "deleters %d %d %d %d %d, expected 0 1 0 1 0", c[0], c[1], c[2], c[3], c[4]);
  drop_samples(NB, v, NULL, c);
  CHECK(c[0] == 1 && c[2] == 1 && c[4] == 1, "the rest freed by the test");

  /* "versions are checked for every sample first": an argument error detected before
   * that (bad options, NULL out) must not leave the unknown-version samples in limbo -
   * the header says their deleters are called on failure. */
  for (int variant = 0; variant < 2; variant++) {
    const int64_t rows3[3] = {1, 1, 1};
    DLManagedTensorVersioned* w[3];
    int d[3];
    make_samples(3, w, NULL, d, rows3);
    w[1]->version.major = 2;
    ndx_import_options_t bad = ndx_test_options(NULL, false);
    bad.struct_size = 1;
    ndx_batch_t* bb = NULL;
    ndx_error_t* err = variant == 0 ? ndx_batch_from_dlpack_versioned(w, 3, &bad, &bb)
                                    : ndx_batch_from_dlpack_versioned(w, 3, NULL, NULL);
    CHECK(err != NULL, "fails");
    ndx_error_free(err);
    CHECK(d[0] == 0 && d[1] == 1 && d[2] == 0,
          "%s: deleters %d %d %d, expected 0 1 0 (tensors[1] has major version 2)",
          variant == 0 ? "bad options" : "NULL out", d[0], d[1], d[2]);
    drop_samples(3, w, NULL, d); /* frees whatever ndx did not */
  }
}

/* The same tensor listed twice would get its deleter called twice: refused before any
 * deleter runs, naming both indices, on the success path and the unknown-version path. */
static void test_bulk_duplicates(void) {
  const int64_t rows[3] = {1, 2, 1};
  for (int variant = 0; variant < 3; variant++) {
    int legacy = variant == 2, unknown_major = variant == 1;
    DLManagedTensorVersioned* v[3] = {NULL, NULL, NULL};
    DLManagedTensor* l[3] = {NULL, NULL, NULL};
    int c[3];
    make_samples(3, legacy ? NULL : v, legacy ? l : NULL, c, rows);
    if (unknown_major) v[0]->version.major = 2;
    DLManagedTensorVersioned* vd[4] = {v[0], v[1], v[2], v[0]};
    DLManagedTensor* ld[4] = {l[0], l[1], l[2], l[0]};
    ndx_batch_t* b = (ndx_batch_t*)NDX_TEST_BOGUS_PTR;
    ndx_error_t* e = legacy ? ndx_batch_from_dlpack(ld, 4, NULL, &b)
                            : ndx_batch_from_dlpack_versioned(vd, 4, NULL, &b);
    const char* what = legacy ? "legacy" : unknown_major ? "versioned, major 2" : "versioned";
    if (!CHECK(e != NULL, "%s: the import must fail", what)) {
      ndx_batch_release(b);
      continue;
    }
    expect_error(e, NDX_ERROR_VALUE, "tensors[0] and tensors[3] are the same tensor");
    CHECK(b == NULL, "%s: out reset", what);
    CHECK(all_zero(c, 3), "%s: no deleter ran: %d %d %d", what, c[0], c[1], c[2]);
    drop_samples(3, legacy ? NULL : v, legacy ? l : NULL, c);
    CHECK(c[0] == 1 && c[1] == 1 && c[2] == 1, "%s: each freed once by the test: %d %d %d", what,
          c[0], c[1], c[2]);
  }
}

/* ---- strided views ------------------------------------------------------------------- */

/* A view of the 3x4 float32 matrix 0..11 (row-major) with the given geometry. */
static ndx_tensor_t* view_3x4(int* counter, int legacy, int32_t ndim, const int64_t* shape,
                              const int64_t* strides, uint64_t byte_offset) {
  ndx_tensor_t* t = NULL;
  if (legacy) {
    DLManagedTensor* m =
        ndx_test_legacy(counter, NDX_TEST_DL_F32, ndim, shape, strides, k12, sizeof k12);
    m->dl_tensor.byte_offset = byte_offset;
    ndx_error_t* e = ndx_tensor_from_dlpack(m, NULL, &t);
    if (!CHECK_OK(e)) ndx_test_drop_legacy(m);
  } else {
    DLManagedTensorVersioned* m =
        ndx_test_versioned(counter, NDX_TEST_DL_F32, ndim, shape, strides, k12, sizeof k12);
    m->dl_tensor.byte_offset = byte_offset;
    ndx_error_t* e = ndx_tensor_from_dlpack_versioned(m, NULL, &t);
    if (!CHECK_OK(e)) ndx_test_drop_versioned(m);
  }
  return t;
}

static void test_strided_views(void) {
  for (int legacy = 0; legacy <= 1; legacy++) {
    int c = 0;
    /* Transposed: shape {4,3}, strides {1,4}. */
    const int64_t tshape[2] = {4, 3}, tstrides[2] = {1, 4};
    ndx_tensor_t* t = view_3x4(&c, legacy, 2, tshape, tstrides, 0);
    if (t) {
      const float expect[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
      check_shape(t, 2, tshape, tstrides);
      CHECK_F32(t, expect, 12);

      /* Too small a buffer: VALUE, buffer untouched. */
      float small[12];
      for (int i = 0; i < 12; i++) small[i] = -1.0f;
      expect_error(ndx_tensor_copy_to(t, small, sizeof small - 1), NDX_ERROR_VALUE,
                   "buffer too small");
      CHECK(small[0] == -1.0f && small[10] == -1.0f, "nothing written");
      expect_error(ndx_tensor_copy_to(t, NULL, 48), NDX_ERROR_VALUE, "argument 'buf' is NULL");
      expect_error(ndx_tensor_copy_to(NULL, small, sizeof small), NDX_ERROR_VALUE,
                   "argument 'tensor' is NULL");
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Transposed with a byte_offset: starts at element [0][1]; shape {3,2}. */
    c = 0;
    const int64_t oshape[2] = {3, 2}, ostrides[2] = {1, 4};
    t = view_3x4(&c, legacy, 2, oshape, ostrides, 1 * sizeof(float));
    if (t) {
      const float expect[6] = {1, 5, 2, 6, 3, 7};
      CHECK_F32(t, expect, 6);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Rows 1..2 via byte_offset, compact strides. */
    c = 0;
    const int64_t rshape[2] = {2, 4};
    t = view_3x4(&c, legacy, 2, rshape, NULL, 4 * sizeof(float));
    if (t) {
      CHECK_F32(t, k12 + 4, 8);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Column 0 as {3,1}: an extent of 1 takes any stride, even one that overflows
       scaled to bytes (it is never stepped). */
    c = 0;
    const int64_t eshape[2] = {3, 1}, estrides[2] = {4, INT64_MIN};
    t = view_3x4(&c, legacy, 2, eshape, estrides, 0);
    if (t) {
      const float expect[3] = {0, 4, 8};
      check_shape(t, 2, eshape, estrides);
      CHECK_F32(t, expect, 3);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Rows flipped: strides {-4,1}, element 0 is [2][0]. */
    c = 0;
    const int64_t fshape[2] = {3, 4}, fstrides[2] = {-4, 1};
    t = view_3x4(&c, legacy, 2, fshape, fstrides, 8 * sizeof(float));
    if (t) {
      const float expect[12] = {8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3};
      check_shape(t, 2, fshape, fstrides);
      CHECK_F32(t, expect, 12);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Both flipped: strides {-4,-1}, element 0 is [2][3]. */
    c = 0;
    const int64_t bstrides[2] = {-4, -1};
    t = view_3x4(&c, legacy, 2, fshape, bstrides, 11 * sizeof(float));
    if (t) {
      const float expect[12] = {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
      CHECK_F32(t, expect, 12);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* Broadcast row: strides {0,1}. */
    c = 0;
    const int64_t zstrides[2] = {0, 1};
    t = view_3x4(&c, legacy, 2, fshape, zstrides, 0);
    if (t) {
      const float expect[12] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
      CHECK_F32(t, expect, 12);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");

    /* A 1-D column with stride 4 (non-compact, ndim 1). */
    c = 0;
    const int64_t cshape[1] = {3}, cstrides[1] = {4};
    t = view_3x4(&c, legacy, 1, cshape, cstrides, 2 * sizeof(float));
    if (t) {
      const float expect[3] = {2, 6, 10};
      CHECK_F32(t, expect, 3);
      ndx_tensor_release(t);
    }
    CHECK(c == 1, "deleted once");
  }

  /* A negative stride that would reach below address 0: refused, caller keeps it. */
  int c = 0;
  const int64_t shape[1] = {4}, strides[1] = {INT64_MIN / 8};
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&c, NDX_TEST_DL_F32, 1, shape, strides, k12, sizeof k12);
  ndx_tensor_t* t = NULL;
  expect_error(ndx_tensor_from_dlpack_versioned(m, NULL, &t), NDX_ERROR_VALUE, "overflows");
  CHECK(c == 0, "caller still owns it");
  ndx_test_drop_versioned(m);
}

/* ---- flags --------------------------------------------------------------------------- */

static void test_read_only_and_is_copied(void) {
  /* READ_ONLY from the producer. */
  int c = 0;
  DLManagedTensorVersioned* m = v_2x3(&c);
  m->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  bool ro = false;
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(ro, "READ_ONLY honoured");
  DLManagedTensorVersioned* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (CHECK(ex != NULL, "exported")) {
    CHECK((ex->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, "export carries READ_ONLY");
    CHECK((ex->flags & DLPACK_FLAG_BITMASK_IS_COPIED) == 0, "not IS_COPIED");
    ex->deleter(ex);
  }
  DLManagedTensor* lex = (DLManagedTensor*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_tensor_to_dlpack(t, &lex), NDX_ERROR_VALUE, "read-only");
  CHECK(lex == NULL, "out reset");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  /* opts.read_only forces it, on versioned and legacy imports. */
  ndx_import_options_t opts = ndx_test_options(NULL, true);
  c = 0;
  m = v_2x3(&c);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &opts, &t));
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(ro, "opts.read_only");
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK((ex->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, "export carries READ_ONLY");
    ex->deleter(ex);
  }
  expect_error(ndx_tensor_to_dlpack(t, &lex), NDX_ERROR_VALUE, "ndx_tensor_to_dlpack_versioned");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  c = 0;
  DLManagedTensor* lm = l_2x3(&c);
  CHECK_OK(ndx_tensor_from_dlpack(lm, &opts, &t));
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(ro, "opts.read_only on a legacy import");
  expect_error(ndx_tensor_to_dlpack(t, &lex), NDX_ERROR_VALUE, "read-only");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  /* Neither: writable, legacy export allowed, no flags. */
  c = 0;
  m = v_2x3(&c);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  CHECK_OK(ndx_tensor_is_read_only(t, &ro));
  CHECK(!ro, "writable");
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK(ex->flags == 0, "no flags: %llu", (unsigned long long)ex->flags);
    ex->deleter(ex);
  }
  lex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack(t, &lex));
  if (lex) lex->deleter(lex);
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  /* IS_COPIED is kept through export (and READ_ONLY with it). */
  c = 0;
  m = v_2x3(&c);
  m->flags = DLPACK_FLAG_BITMASK_IS_COPIED;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK((ex->flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0, "IS_COPIED kept");
    CHECK((ex->flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0, "not READ_ONLY");
    ex->deleter(ex);
  }
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  c = 0;
  m = v_2x3(&c);
  m->flags = DLPACK_FLAG_BITMASK_IS_COPIED | DLPACK_FLAG_BITMASK_READ_ONLY;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    CHECK(ex->flags == (DLPACK_FLAG_BITMASK_IS_COPIED | DLPACK_FLAG_BITMASK_READ_ONLY),
          "both kept: %llu", (unsigned long long)ex->flags);
    ex->deleter(ex);
  }
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");
}

/* ---- export and round trips ---------------------------------------------------------- */

static void check_exported_dl(const DLTensor* dl, const void* data, uint64_t byte_offset,
                              int32_t ndim, const int64_t* shape, const int64_t* strides) {
  CHECK(dl->data == data, "data pointer is the producer's");
  CHECK(dl->byte_offset == byte_offset, "byte_offset %llu, expected %llu",
        (unsigned long long)dl->byte_offset, (unsigned long long)byte_offset);
  CHECK(dl->device.device_type == kDLCPU && dl->device.device_id == 0, "CPU");
  CHECK(dl->dtype.code == kDLFloat && dl->dtype.bits == 32 && dl->dtype.lanes == 1, "float32");
  CHECK(dl->ndim == ndim, "ndim %d", (int)dl->ndim);
  if (dl->ndim == ndim) {
    CHECK_I64_ARRAY(dl->shape, shape, ndim);
    CHECK(dl->strides != NULL, "strides are always given");
    if (dl->strides) CHECK_I64_ARRAY(dl->strides, strides, ndim);
  }
}

static void test_round_trip_versioned(void) {
  /* HWC 2x2x3, values 0..11, layout "HWC". */
  const int64_t shape[3] = {2, 2, 3}, compact[3] = {6, 3, 1};
  ndx_import_options_t hwc = ndx_test_options("HWC", false);
  int c = 0;
  DLManagedTensorVersioned* m =
      ndx_test_versioned(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12, sizeof k12);
  void* data = m->dl_tensor.data;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &hwc, &t));
  const char* layout = NULL;
  CHECK_OK(ndx_tensor_layout(t, &layout));
  CHECK_STR_EQ(layout, "HWC");

  DLManagedTensorVersioned* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (!CHECK(ex != NULL, "exported")) {
    ndx_tensor_release(t);
    return;
  }
  CHECK(ex->version.major == 1, "major 1");
  CHECK(ex->deleter != NULL, "a deleter");
  check_exported_dl(&ex->dl_tensor, data, 0, 3, shape, compact);

  /* Re-import the export (ndx consuming its own export), with the layout again. */
  ndx_tensor_t* t2 = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(ex, &hwc, &t2));
  if (t2) {
    int32_t dtype = 0;
    CHECK_OK(ndx_tensor_dtype(t2, &dtype));
    CHECK(dtype == NDX_DTYPE_FLOAT32, "dtype kept");
    check_shape(t2, 3, shape, compact);
    CHECK_F32(t2, k12, 12);
    CHECK_OK(ndx_tensor_layout(t2, &layout));
    CHECK_STR_EQ(layout, "HWC");
  }
  /* Order: original handle first, then the re-import (which owns the export). */
  ndx_tensor_release(t);
  CHECK(c == 0, "the export keeps the producer's memory alive");
  if (t2) CHECK_F32(t2, k12, 12);
  ndx_tensor_release(t2);
  CHECK(c == 1, "producer deleted once, after both are gone (%d)", c);

  /* Order: export deleted first, then the handle. */
  c = 0;
  m = ndx_test_versioned(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12, sizeof k12);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) ex->deleter(ex);
  CHECK(c == 0, "the handle still holds it");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  /* Order: handle released first, then the export. */
  c = 0;
  m = ndx_test_versioned(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12, sizeof k12);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  ndx_tensor_release(t);
  CHECK(c == 0, "the export still holds it");
  if (ex) {
    /* The export is still readable after the handle is gone. */
    CHECK(((const float*)ex->dl_tensor.data)[11] == 11.0f, "data alive");
    ex->deleter(ex);
  }
  CHECK(c == 1, "deleted once");

  /* Two exports of one tensor are independent. */
  c = 0;
  m = ndx_test_versioned(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12, sizeof k12);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  DLManagedTensorVersioned* e1 = NULL;
  DLManagedTensorVersioned* e2 = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &e1));
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &e2));
  CHECK(e1 != e2 && e1 && e2 && e1->dl_tensor.shape != e2->dl_tensor.shape,
        "separate exports with their own shape arrays");
  ndx_tensor_release(t);
  if (e1) e1->deleter(e1);
  CHECK(c == 0, "one export left");
  if (e2) e2->deleter(e2);
  CHECK(c == 1, "deleted once");

  /* A strided view keeps its strides and byte_offset through export and re-import. */
  c = 0;
  const int64_t oshape[2] = {3, 2}, ostrides[2] = {1, 4};
  m = ndx_test_versioned(&c, NDX_TEST_DL_F32, 2, oshape, ostrides, k12, sizeof k12);
  m->dl_tensor.byte_offset = sizeof(float);
  data = m->dl_tensor.data;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
  if (ex) {
    check_exported_dl(&ex->dl_tensor, data, sizeof(float), 2, oshape, ostrides);
    t2 = NULL;
    CHECK_OK(ndx_tensor_from_dlpack_versioned(ex, NULL, &t2));
    const float expect[6] = {1, 5, 2, 6, 3, 7};
    if (t2) {
      check_shape(t2, 2, oshape, ostrides);
      CHECK_F32(t2, expect, 6);
    }
    ndx_tensor_release(t2);
  }
  CHECK(c == 0, "the original handle still holds it");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");
}

static void test_round_trip_legacy(void) {
  const int64_t shape[3] = {2, 2, 3}, compact[3] = {6, 3, 1};
  ndx_import_options_t hwc = ndx_test_options("HWC", false);
  int c = 0;
  DLManagedTensor* m = ndx_test_legacy(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12, sizeof k12);
  void* data = m->dl_tensor.data;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack(m, &hwc, &t));
  DLManagedTensor* ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack(t, &ex));
  if (!CHECK(ex != NULL, "exported")) {
    ndx_tensor_release(t);
    return;
  }
  check_exported_dl(&ex->dl_tensor, data, 0, 3, shape, compact);
  ndx_tensor_t* t2 = NULL;
  CHECK_OK(ndx_tensor_from_dlpack(ex, &hwc, &t2));
  if (t2) {
    check_shape(t2, 3, shape, compact);
    CHECK_F32(t2, k12, 12);
    const char* layout = NULL;
    CHECK_OK(ndx_tensor_layout(t2, &layout));
    CHECK_STR_EQ(layout, "HWC");
  }
  ndx_tensor_release(t2);
  CHECK(c == 0, "the original handle still holds it");
  ndx_tensor_release(t);
  CHECK(c == 1, "deleted once");

  /* Export deleted after the handle; and a versioned import exported as legacy. */
  c = 0;
  DLManagedTensorVersioned* vm = ndx_test_versioned(&c, NDX_TEST_DL_F32, 3, shape, NULL, k12,
                                                    sizeof k12);
  CHECK_OK(ndx_tensor_from_dlpack_versioned(vm, NULL, &t));
  ex = NULL;
  CHECK_OK(ndx_tensor_to_dlpack(t, &ex));
  ndx_tensor_release(t);
  CHECK(c == 0, "the legacy export holds it");
  if (ex) {
    CHECK(((const float*)ex->dl_tensor.data)[5] == 5.0f, "data alive");
    ex->deleter(ex);
  }
  CHECK(c == 1, "deleted once");
}

/* ---- CUDA tensors as metadata -------------------------------------------------------- */

static void test_cuda_metadata(void) {
  const int64_t shape[2] = {2, 3};
  /* Device 1 may not exist where a driver is present: no stream ordering is asked
   * for, so the import takes the metadata alone on every machine. */
  ndx_import_options_t no_sync = ndx_test_options(NULL, false);
  no_sync.stream = NDX_STREAM_NO_SYNC;
  for (int legacy = 0; legacy <= 1; legacy++) {
    int c = 0;
    DLManagedTensorVersioned* vm = NULL;
    DLManagedTensor* lm = NULL;
    DLTensor* dl;
    if (legacy) {
      lm = ndx_test_legacy(&c, NDX_TEST_DL_F32, 2, shape, NULL, NULL, 0);
      dl = &lm->dl_tensor;
    } else {
      vm = ndx_test_versioned(&c, NDX_TEST_DL_F32, 2, shape, NULL, NULL, 0);
      dl = &vm->dl_tensor;
    }
    dl->device.device_type = kDLCUDA;
    dl->device.device_id = 1;
    dl->data = (void*)(uintptr_t)0x1000; /* never dereferenced */
    ndx_tensor_t* t = NULL;
    ndx_error_t* e = legacy ? ndx_tensor_from_dlpack(lm, &no_sync, &t)
                            : ndx_tensor_from_dlpack_versioned(vm, &no_sync, &t);
    if (!CHECK_OK(e)) {
      if (legacy) ndx_test_drop_legacy(lm);
      else ndx_test_drop_versioned(vm);
      continue;
    }
    DLDevice dev = {kDLCPU, 0};
    CHECK_OK(ndx_tensor_device(t, &dev));
    CHECK(dev.device_type == kDLCUDA && dev.device_id == 1, "device %d:%d",
          (int)dev.device_type, (int)dev.device_id);
    size_t numel = 0;
    CHECK_OK(ndx_tensor_numel(t, &numel));
    CHECK(numel == 6, "numel");
    float buf[6];
    expect_error(ndx_tensor_copy_to(t, buf, sizeof buf), NDX_ERROR_VALUE, "device memory");

    DLManagedTensorVersioned* ex = NULL;
    CHECK_OK(ndx_tensor_to_dlpack_versioned(t, &ex));
    if (ex) {
      CHECK(ex->dl_tensor.device.device_type == kDLCUDA && ex->dl_tensor.device.device_id == 1,
            "export keeps the device");
      CHECK(ex->dl_tensor.data == (void*)(uintptr_t)0x1000, "and the pointer");
      ex->deleter(ex);
    }
    ndx_tensor_release(t);
    CHECK(c == 1, "%s CUDA tensor: deleter called once (%d)", legacy ? "legacy" : "versioned",
          c);
  }

  /* A batch in device memory does not stack into host memory: said naming the sample and
   * its device (it said "ndx_tensor_copy_to reads host-accessible memory only"). */
  {
    const int64_t shape[1] = {2};
    int deleted[2] = {0, 0};
    DLManagedTensorVersioned* v[2];
    for (int i = 0; i < 2; i++) {
      v[i] = ndx_test_versioned(&deleted[i], NDX_TEST_DL_F32, 1, shape, NULL, NULL, 0);
      v[i]->dl_tensor.device.device_type = kDLCUDA;
      v[i]->dl_tensor.device.device_id = 1;
      v[i]->dl_tensor.data = (void*)(uintptr_t)0x1000; /* never dereferenced */
    }
    ndx_batch_t* b = NULL;
    if (CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, &no_sync, &b))) {
      ndx_tensor_t* stacked = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
      ndx_error_t* e = ndx_batch_to_tensor(b, &stacked);
      if (e) CHECK(!ndx_test_contains(ndx_error_message(e), "ndx_tensor_copy_to"), "%s",
                   ndx_error_message(e));
      expect_error(e, NDX_ERROR_VALUE,
                   "cannot stack sample 0: it lives in kDLCUDA:1 device memory");
      CHECK(stacked == NULL, "no tensor on error");
      ndx_batch_release(b);
    } else {
      for (int i = 0; i < 2; i++) ndx_test_drop_versioned(v[i]);
    }
    CHECK(deleted[0] == 1 && deleted[1] == 1, "deleted once each (%d, %d)", deleted[0],
          deleted[1]);
  }

  /* Pinned (CUDA-host) memory is host-accessible: copy_to works. */
  int c = 0;
  DLManagedTensorVersioned* m = v_2x3(&c);
  m->dl_tensor.device.device_type = kDLCUDAHost;
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  if (t) {
    DLDevice dev = {kDLCPU, 0};
    CHECK_OK(ndx_tensor_device(t, &dev));
    CHECK(dev.device_type == kDLCUDAHost, "kDLCUDAHost");
    CHECK_F32(t, k12, 6);
    ndx_tensor_release(t);
  }
  CHECK(c == 1, "deleted once");

  /* Managed memory too. */
  c = 0;
  m = v_2x3(&c);
  m->dl_tensor.device.device_type = kDLCUDAManaged;
  t = NULL;
  CHECK_OK(ndx_tensor_from_dlpack_versioned(m, NULL, &t));
  if (t) {
    CHECK_F32(t, k12, 6);
    ndx_tensor_release(t);
  }
  CHECK(c == 1, "deleted once");

  /* A batch of CUDA samples on device 1: metadata only. */
  DLManagedTensorVersioned* v[2];
  int cs[2];
  const int64_t rows[2] = {2, 2};
  make_samples(2, v, NULL, cs, rows);
  for (int i = 0; i < 2; i++) {
    v[i]->dl_tensor.device.device_type = kDLCUDA;
    v[i]->dl_tensor.device.device_id = 1;
    v[i]->dl_tensor.data = (void*)(uintptr_t)0x2000;
  }
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, &no_sync, &b));
  if (b) {
    DLDevice dev = {kDLCPU, 0};
    CHECK_OK(ndx_batch_device(b, &dev));
    CHECK(dev.device_type == kDLCUDA && dev.device_id == 1, "batch device");
    ndx_tensor_t* stacked = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_batch_to_tensor(b, &stacked), NDX_ERROR_VALUE, "device memory");
    CHECK(stacked == NULL, "out reset");
    ndx_batch_release(b);
  } else {
    drop_samples(2, v, NULL, cs);
  }
  CHECK(cs[0] == 1 && cs[1] == 1, "deleted once each");
}

/* ---- batches ------------------------------------------------------------------------- */

static void test_batch_to_tensor(void) {
  const int64_t shape[2] = {2, 2};
  const int32_t a[4] = {1, 2, 3, 4}, bvals[4] = {5, 6, 7, 8};
  int c[2] = {0, 0};
  DLManagedTensorVersioned* v[2];
  v[0] = ndx_test_versioned(&c[0], NDX_TEST_DL_I32, 2, shape, NULL, a, sizeof a);
  v[1] = ndx_test_versioned(&c[1], NDX_TEST_DL_I32, 2, shape, NULL, bvals, sizeof bvals);
  ndx_import_options_t hw = ndx_test_options("HW", false);
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(v, 2, &hw, &b));
  if (!b) {
    ndx_test_drop_versioned(v[0]);
    ndx_test_drop_versioned(v[1]);
    return;
  }
  bool uniform = false;
  CHECK_OK(ndx_batch_is_uniform(b, &uniform));
  CHECK(uniform, "uniform");
  ndx_tensor_t* t = NULL;
  CHECK_OK(ndx_batch_to_tensor(b, &t));
  if (t) {
    const int64_t s3[3] = {2, 2, 2}, st3[3] = {4, 2, 1};
    check_shape(t, 3, s3, st3);
    int32_t dtype = 0;
    CHECK_OK(ndx_tensor_dtype(t, &dtype));
    CHECK(dtype == NDX_DTYPE_INT32, "int32");
    int32_t got[8] = {0};
    CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got));
    int ok = 1;
    for (int i = 0; i < 8; i++) {
      if (got[i] != i + 1) ok = 0;
    }
    CHECK(ok, "stacked values 1..8: %d %d %d %d %d %d %d %d", got[0], got[1], got[2], got[3],
          got[4], got[5], got[6], got[7]);
    const char* layout = NULL;
    CHECK_OK(ndx_tensor_layout(t, &layout));
    CHECK_STR_EQ(layout, "NHW");
    bool ro = true;
    CHECK_OK(ndx_tensor_is_read_only(t, &ro));
    CHECK(!ro, "a new writable tensor");
  }
  /* The stacked tensor is a copy: the samples go with the batch. */
  ndx_batch_release(b);
  CHECK(c[0] == 1 && c[1] == 1, "samples deleted with the batch");
  if (t) {
    int32_t got[8] = {0};
    CHECK_OK(ndx_tensor_copy_to(t, got, sizeof got));
    CHECK(got[0] == 1 && got[7] == 8, "the copy outlives the samples");
    ndx_tensor_release(t);
  }

  /* Ragged: 2x2 then 3x2. */
  const int64_t shape3[2] = {3, 2};
  const int32_t six[6] = {1, 2, 3, 4, 5, 6};
  c[0] = c[1] = 0;
  DLManagedTensor* l[2];
  l[0] = ndx_test_legacy(&c[0], NDX_TEST_DL_I32, 2, shape, NULL, a, sizeof a);
  l[1] = ndx_test_legacy(&c[1], NDX_TEST_DL_I32, 2, shape3, NULL, six, sizeof six);
  b = NULL;
  CHECK_OK(ndx_batch_from_dlpack(l, 2, NULL, &b));
  if (b) {
    CHECK_OK(ndx_batch_is_uniform(b, &uniform));
    CHECK(!uniform, "ragged");
    t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
    ndx_error_t* e = ndx_batch_to_tensor(b, &t);
    CHECK(ndx_error_kind(e) == NDX_ERROR_VALUE, "VALUE");
    CHECK_CONTAINS(ndx_error_message(e), "sample 1");
    CHECK_CONTAINS(ndx_error_message(e), "[3, 2]");
    CHECK_CONTAINS(ndx_error_message(e), "[2, 2]");
    ndx_error_free(e);
    CHECK(t == NULL, "out reset");

    /* Sample index out of range. */
    ndx_tensor_t* s = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
    expect_error(ndx_batch_sample(b, 2, &s), NDX_ERROR_INDEX, "sample index 2 is out of range");
    CHECK(s == NULL, "out reset");
    expect_error(ndx_batch_sample(b, (size_t)-1, &s), NDX_ERROR_INDEX, "out of range");
    expect_error(ndx_batch_sample(b, 0, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    const char* layout = NULL;
    CHECK_OK(ndx_batch_layout(b, &layout));
    CHECK_STR_EQ(layout, "");
    ndx_batch_release(b);
  } else {
    ndx_test_drop_legacy(l[0]);
    ndx_test_drop_legacy(l[1]);
  }
  CHECK(c[0] == 1 && c[1] == 1, "deleted once each");

  /* A single-sample batch of strided (transposed) samples stacks compactly. */
  int cc = 0;
  const int64_t tshape[2] = {4, 3}, tstrides[2] = {1, 4};
  DLManagedTensorVersioned* one =
      ndx_test_versioned(&cc, NDX_TEST_DL_F32, 2, tshape, tstrides, k12, sizeof k12);
  b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(&one, 1, NULL, &b));
  if (b) {
    t = NULL;
    CHECK_OK(ndx_batch_to_tensor(b, &t));
    if (t) {
      const int64_t s3[3] = {1, 4, 3};
      check_shape(t, 3, s3, NULL);
      const float expect[12] = {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11};
      CHECK_F32(t, expect, 12);
      const char* layout = NULL;
      CHECK_OK(ndx_tensor_layout(t, &layout));
      CHECK_STR_EQ(layout, "");
      ndx_tensor_release(t);
    }
    ndx_batch_release(b);
  } else {
    ndx_test_drop_versioned(one);
  }
  CHECK(cc == 1, "deleted once");

  /* Broadcast samples (stride 0: one byte standing for 2^62 elements) whose stack would
   * pass the address space: named as the stack (it said "output: shape [...] of
   * itemsize 1 is too large to address"). */
  int bc[2] = {0, 0};
  const int64_t huge[1] = {(int64_t)1 << 62}, zero[1] = {0};
  const uint8_t byte = 7;
  DLManagedTensorVersioned* bv[2];
  for (int i = 0; i < 2; i++) {
    bv[i] = ndx_test_versioned(&bc[i], ndx_test_dl_dtype(kDLUInt, 8, 1), 1, huge, zero, &byte, 1);
  }
  b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(bv, 2, NULL, &b));
  if (b) {
    t = (ndx_tensor_t*)&cc;
    expect_error(ndx_batch_to_tensor(b, &t), NDX_ERROR_VALUE,
                 "cannot stack 2 samples of shape [4611686018427387904] (uint8): the stacked "
                 "tensor of shape [2, 4611686018427387904] is too large to address");
    CHECK(t == NULL, "out reset");
    ndx_batch_release(b);
  } else {
    ndx_test_drop_versioned(bv[0]);
    ndx_test_drop_versioned(bv[1]);
  }
  CHECK(bc[0] == 1 && bc[1] == 1, "deleted once each");
}

static void test_batch_null_handles(void) {
  size_t n = 9;
  bool u = true;
  int32_t i = 9;
  DLDevice d = {kDLCUDA, 9};
  const char* s = "x";
  ndx_tensor_t* t = (ndx_tensor_t*)NDX_TEST_BOGUS_PTR;
  expect_error(ndx_batch_size(NULL, &n), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(n == 0, "size reset");
  expect_error(ndx_batch_is_uniform(NULL, &u), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(!u, "is_uniform reset");
  expect_error(ndx_batch_dtype(NULL, &i), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(i == 0, "dtype reset");
  i = 9;
  expect_error(ndx_batch_ndim(NULL, &i), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(i == 0, "ndim reset");
  expect_error(ndx_batch_device(NULL, &d), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(d.device_type == kDLCPU && d.device_id == 0, "device reset to kDLCPU:0");
  expect_error(ndx_batch_layout(NULL, &s), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(s == NULL, "layout reset");
  expect_error(ndx_batch_sample(NULL, 0, &t), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  CHECK(t == NULL, "sample reset");
  expect_error(ndx_batch_to_tensor(NULL, &t), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  expect_error(ndx_batch_retain(NULL), NDX_ERROR_VALUE, "argument 'batch' is NULL");
  ndx_batch_release(NULL);
  CHECK(1, "ndx_batch_release(NULL) returned");

  /* NULL out-params with a real batch. */
  int c = 0;
  DLManagedTensorVersioned* m = v_2x3(&c);
  ndx_batch_t* b = NULL;
  CHECK_OK(ndx_batch_from_dlpack_versioned(&m, 1, NULL, &b));
  if (b) {
    expect_error(ndx_batch_size(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_is_uniform(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_dtype(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_ndim(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_device(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_layout(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    expect_error(ndx_batch_to_tensor(b, NULL), NDX_ERROR_VALUE, "argument 'out' is NULL");
    CHECK_OK(ndx_batch_size(b, &n));
    CHECK(n == 1, "one sample");
    ndx_batch_release(b);
  } else {
    ndx_test_drop_versioned(m);
  }
  CHECK(c == 1, "deleted once");

  /* A NULL out for a bulk import: nothing taken. */
  int cs[2];
  DLManagedTensorVersioned* v[2];
  const int64_t rows[2] = {1, 1};
  make_samples(2, v, NULL, cs, rows);
  expect_error(ndx_batch_from_dlpack_versioned(v, 2, NULL, NULL), NDX_ERROR_VALUE,
               "argument 'out' is NULL");
  CHECK(all_zero(cs, 2), "nothing taken");
  drop_samples(2, v, NULL, cs);
}

/* ---- empty tensors with extreme strides through operators ---------------------------- */

/* Runs `op` on `t` (SYNC_CPU): its output's shape must be `expect` (ndim 2 or 3, given by
 * `ndim`) and its layout `layout`. */
static void check_op_on_empty(const ndx_context_t* ctx, const ndx_tensor_t* t, const char* op,
                              const ndx_args_t* args, int32_t ndim, const int64_t* expect,
                              const char* layout) {
  ndx_input_t in = {t, NULL};
  ndx_future_t* f = NULL;
  if (!CHECK_OK(ndx_invoke(ctx, op, &in, 1, args, NULL, &f))) return;
  if (CHECK_OK(ndx_future_wait(f, -1))) {
    ndx_tensor_t* out = NULL;
    CHECK_OK(ndx_future_tensor(f, 0, &out));
    check_shape(out, ndim, expect, NULL);
    const char* l = NULL;
    CHECK_OK(ndx_tensor_layout(out, &l));
    CHECK_STR_EQ(l, layout);
    ndx_tensor_release(out);
  }
  ndx_future_release(f);
}

/* An empty tensor reads no element, so DLPack lets its strides be anything and the import
 * keeps them; flips, slices, crops and reductions scaled or negated them (a panic,
 * NDX_ERROR_INTERNAL "attempt to multiply with overflow", in builds with overflow checks). */
static void test_empty_extreme_strides_through_ops(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  o.num_threads = 2;
  ndx_context_t* ctx = ndx_test_new_context(&o);
  ndx_args_t* none = NULL;
  ndx_args_t* axis1 = NULL;
  ndx_args_t* slice = NULL;
  ndx_args_t* crop = NULL;
  CHECK_OK(ndx_args_new(&none));
  CHECK_OK(ndx_args_new(&axis1));
  CHECK_OK(ndx_args_new(&slice));
  CHECK_OK(ndx_args_new(&crop));
  const int64_t one[1] = {1};
  const int64_t start[1] = {4}, end[1] = {0}, step[1] = {-2};
  CHECK_OK(ndx_args_set_int_array(axis1, "axes", one, 1));
  CHECK_OK(ndx_args_set_int_array(slice, "start", start, 1));
  CHECK_OK(ndx_args_set_int_array(slice, "end", end, 1));
  CHECK_OK(ndx_args_set_int_array(slice, "step", step, 1));
  CHECK_OK(ndx_args_set_int_array(slice, "axes", one, 1));
  CHECK_OK(ndx_args_set_int(crop, "x", 1));
  CHECK_OK(ndx_args_set_int(crop, "y", 1));
  CHECK_OK(ndx_args_set_int(crop, "w", 2));
  CHECK_OK(ndx_args_set_int(crop, "h", 3));
  const int64_t huge[3] = {INT64_MIN, INT64_MAX, INT64_MAX / 3};
  const int64_t e053[3] = {0, 5, 3}, e503[3] = {5, 0, 3}, e550[3] = {5, 5, 0};
  const int64_t e023[3] = {0, 2, 3}, e320[3] = {3, 2, 0}, e03[2] = {0, 3};
  const ndx_import_options_t hwc = ndx_test_options("HWC", false);
  for (int k = 0; k < 3; k++) {
    const int64_t strides[3] = {huge[k], huge[k], huge[k]};
    const int64_t* shapes[3] = {e053, e503, e550};
    ndx_tensor_t* t[3] = {NULL, NULL, NULL};
    int deleted[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
      DLManagedTensorVersioned* m =
          ndx_test_versioned(&deleted[i], NDX_TEST_DL_F32, 3, shapes[i], strides, NULL, 0);
      CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &hwc, &t[i]));
      check_shape(t[i], 3, shapes[i], strides); /* the producer's strides are kept */
    }
    check_op_on_empty(ctx, t[0], "flip", axis1, 3, e053, "");
    check_op_on_empty(ctx, t[1], "flip", none, 3, e503, "");
    check_op_on_empty(ctx, t[0], "slice", slice, 3, e023, "");
    check_op_on_empty(ctx, t[0], "flip_horizontal", none, 3, e053, "HWC");
    check_op_on_empty(ctx, t[1], "flip_vertical", none, 3, e503, "HWC");
    check_op_on_empty(ctx, t[2], "crop", crop, 3, e320, "HWC");
    check_op_on_empty(ctx, t[0], "max", axis1, 2, e03, "");
    for (int i = 0; i < 3; i++) {
      ndx_tensor_release(t[i]);
      CHECK(deleted[i] == 1, "deleted once (%d)", deleted[i]);
    }
  }
  ndx_args_free(none);
  ndx_args_free(axis1);
  ndx_args_free(slice);
  ndx_args_free(crop);
  ndx_context_release(ctx);
}

/* ---- the most dimensions a tensor may have ------------------------------------------ */

/* expand_dims and reshape made tensors of more than NDX_MAX_NDIM dimensions, which ndx
 * exported but could not import again; such an output is now refused at ndx_invoke. */
static void test_max_ndim_round_trip(void) {
  ndx_context_options_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  o.eval_mode = NDX_EVAL_SYNC_CPU;
  o.num_threads = 2;
  ndx_context_t* ctx = ndx_test_new_context(&o);
  const float value = 2.5f;
  ndx_tensor_t* x = NULL;
  CHECK_OK(ndx_tensor_from_host(&value, NDX_DTYPE_FLOAT32, 0, NULL, NULL, NULL, &x));
  int64_t ones[NDX_MAX_NDIM + 1];
  for (int i = 0; i <= NDX_MAX_NDIM; i++) ones[i] = 1;
  ndx_args_t* most = NULL;
  ndx_args_t* over = NULL;
  ndx_args_t* axis0 = NULL;
  CHECK_OK(ndx_args_new(&most));
  CHECK_OK(ndx_args_new(&over));
  CHECK_OK(ndx_args_new(&axis0));
  CHECK_OK(ndx_args_set_int_array(most, "shape", ones, NDX_MAX_NDIM));
  CHECK_OK(ndx_args_set_int_array(over, "shape", ones, NDX_MAX_NDIM + 1));
  CHECK_OK(ndx_args_set_int(axis0, "axis", 0));

  ndx_input_t in = {x, NULL};
  ndx_future_t* f = NULL;
  ndx_tensor_t* wide = NULL;
  if (CHECK_OK(ndx_invoke(ctx, "reshape", &in, 1, most, NULL, &f))) {
    CHECK_OK(ndx_future_tensor(f, 0, &wide));
    ndx_future_release(f);
  }
  if (wide) {
    check_shape(wide, NDX_MAX_NDIM, ones, NULL);
    DLManagedTensorVersioned* exported = NULL;
    ndx_tensor_t* back = NULL;
    CHECK_OK(ndx_tensor_to_dlpack_versioned(wide, &exported));
    if (exported && CHECK_OK(ndx_tensor_from_dlpack_versioned(exported, NULL, &back))) {
      check_shape(back, NDX_MAX_NDIM, ones, NULL);
      check_f32_values(back, &value, 1, __LINE__);
      ndx_tensor_release(back);
    }
    f = (ndx_future_t*)NDX_TEST_BOGUS_PTR;
    ndx_input_t w = {wide, NULL};
    expect_error(ndx_invoke(ctx, "expand_dims", &w, 1, axis0, NULL, &f),
                          NDX_ERROR_VALUE,
                          "output 0 would have 65 dimensions; a tensor has at most 64");
    CHECK(f == NULL, "no future on error");
    ndx_tensor_release(wide);
  }
  expect_error(ndx_invoke(ctx, "reshape", &in, 1, over, NULL, &f), NDX_ERROR_VALUE,
                        "output 0 would have 65 dimensions");
  ndx_args_free(most);
  ndx_args_free(over);
  ndx_args_free(axis0);
  ndx_tensor_release(x);
  ndx_context_release(ctx);
}

int main(void) {
  test_versioned_import_success();
  test_legacy_import_success();
  test_scalar_and_empty();
  test_invalid_fields();
  test_unsupported_devices_and_codes_named();
  test_unknown_major_version();
  test_bulk_success();
  test_bulk_failures();
  test_bulk_unknown_major();
  test_bulk_duplicates();
  test_strided_views();
  test_read_only_and_is_copied();
  test_round_trip_versioned();
  test_round_trip_legacy();
  test_cuda_metadata();
  test_batch_to_tensor();
  test_batch_null_handles();
  test_empty_extreme_strides_through_ops();
  test_max_ndim_round_trip();
  return NDX_TEST_SUMMARY("test_dlpack");
}
