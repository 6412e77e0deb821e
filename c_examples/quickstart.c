/*
 * quickstart.c - the ndx C API in one page.
 *
 * A "producer" (here: this file, standing in for any library that speaks DLPack) owns
 * some images and hands them to ndx as DLManagedTensorVersioned. ndx imports them as
 * one batch without copying, reads them, exports one back, and - when given bad
 * input - returns an error that names the problem and points at the line that asked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ndx.h"

/* ---- a minimal DLPack producer ----------------------------------------------------- */

typedef struct {
  DLManagedTensorVersioned managed; /* first, so the deleter can free the whole block */
  int64_t shape[3];
  int64_t strides[3];
  int* deleted; /* counts deleter calls, to show ownership at work */
  float data[];
} produced_t;

static void producer_deleter(DLManagedTensorVersioned* self) {
  produced_t* p = (produced_t*)self->manager_ctx;
  ++*p->deleted;
  free(p);
}

/* An h x w x 3 float32 image filled with `value`, owned by the producer until handed over. */
static DLManagedTensorVersioned* produce_image(int64_t h, int64_t w, float value, int* deleted) {
  size_t n = (size_t)(h * w * 3);
  produced_t* p = malloc(sizeof(produced_t) + n * sizeof(float));
  if (!p) return NULL;
  for (size_t i = 0; i < n; ++i) p->data[i] = value + (float)i;
  p->shape[0] = h;
  p->shape[1] = w;
  p->shape[2] = 3;
  p->strides[0] = w * 3;
  p->strides[1] = 3;
  p->strides[2] = 1;
  p->deleted = deleted;
  p->managed.version.major = DLPACK_MAJOR_VERSION;
  p->managed.version.minor = DLPACK_MINOR_VERSION;
  p->managed.manager_ctx = p;
  p->managed.deleter = producer_deleter;
  p->managed.flags = 0;
  p->managed.dl_tensor.data = p->data;
  p->managed.dl_tensor.device.device_type = kDLCPU;
  p->managed.dl_tensor.device.device_id = 0;
  p->managed.dl_tensor.ndim = 3;
  p->managed.dl_tensor.dtype.code = kDLFloat;
  p->managed.dl_tensor.dtype.bits = 32;
  p->managed.dl_tensor.dtype.lanes = 1;
  p->managed.dl_tensor.shape = p->shape;
  p->managed.dl_tensor.strides = p->strides;
  p->managed.dl_tensor.byte_offset = 0;
  return &p->managed;
}

/* Prints an error as a Python-style traceback and frees it. */
static void print_and_free(ndx_error_t* err) {
  size_t need = ndx_error_format(err, NULL, 0);
  char* text = malloc(need + 1);
  if (text) {
    ndx_error_format(err, text, need + 1);
    printf("%s", text);
    free(text);
  }
  ndx_error_free(err);
}

#define TRY(call)                                              \
  do {                                                         \
    ndx_error_t* err_ = (call);                                \
    if (err_) {                                                \
      fprintf(stderr, "unexpected failure: %s\n", #call);      \
      print_and_free(err_);                                    \
      return 1;                                                \
    }                                                          \
  } while (0)

int main(void) {
  printf("ndx %s (header %s)\n\n", ndx_version_string(), NDX_VERSION_STRING);

  /* 1. Three images of different sizes, produced elsewhere. */
  int deleted[3] = {0, 0, 0};
  DLManagedTensorVersioned* images[3] = {
      produce_image(4, 6, 0.0f, &deleted[0]),
      produce_image(2, 2, 100.0f, &deleted[1]),
      produce_image(3, 5, 200.0f, &deleted[2]),
  };
  if (!images[0] || !images[1] || !images[2]) return 1;

  /* 2. Import them as one batch: zero-copy; ndx owns them only if this succeeds. */
  ndx_import_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts;
  opts.layout = "HWC";
  ndx_batch_t* batch = NULL;
  TRY(ndx_batch_from_dlpack_versioned(images, 3, &opts, &batch));
  size_t n = 0;
  bool uniform = true;
  TRY(ndx_batch_size(batch, &n));
  TRY(ndx_batch_is_uniform(batch, &uniform));
  printf("imported a batch of %zu HWC float32 images (uniform: %s)\n", n, uniform ? "yes" : "no");

  /* 3. Look at one sample and copy its first pixel out. */
  ndx_tensor_t* second = NULL;
  TRY(ndx_batch_sample(batch, 1, &second));
  const int64_t* shape = NULL;
  TRY(ndx_tensor_shape(second, &shape));
  float pixels[2 * 2 * 3];
  TRY(ndx_tensor_copy_to(second, pixels, sizeof pixels));
  printf("sample 1: shape [%lld, %lld, %lld], first pixel (%.0f, %.0f, %.0f)\n",
         (long long)shape[0], (long long)shape[1], (long long)shape[2], pixels[0], pixels[1],
         pixels[2]);

  /* 4. Export it back through DLPack (zero-copy); the consumer calls the deleter. */
  DLManagedTensorVersioned* exported = NULL;
  TRY(ndx_tensor_to_dlpack_versioned(second, &exported));
  printf("exported sample 1 as DLPack %u.%u, data shared with the producer: %s\n",
         exported->version.major, exported->version.minor,
         exported->dl_tensor.data == images[1]->dl_tensor.data ? "yes" : "no");
  ndx_tensor_release(second);
  ndx_batch_release(batch);
  printf("after releasing the batch, producer deleters called: %d %d %d "
         "(sample 1 is still exported)\n", deleted[0], deleted[1], deleted[2]);
  exported->deleter(exported);
  printf("after the consumer deletes the export:               %d %d %d\n\n", deleted[0],
         deleted[1], deleted[2]);

  /* 5. A deliberate mistake: a batch whose samples disagree on dtype. The import fails,
   *    says which sample and why, points at this line, and leaves ownership with us. */
  int bad_deleted[2] = {0, 0};
  DLManagedTensorVersioned* mixed[2] = {
      produce_image(2, 2, 0.0f, &bad_deleted[0]),
      produce_image(2, 2, 0.0f, &bad_deleted[1]),
  };
  if (!mixed[0] || !mixed[1]) return 1;
  mixed[1]->dl_tensor.dtype.bits = 64; /* says float64, is float32 */
  ndx_batch_t* never = NULL;
  ndx_error_t* err = ndx_batch_from_dlpack_versioned(mixed, 2, NULL, &never);
  if (!err) {
    fprintf(stderr, "expected the mixed batch to fail\n");
    return 1;
  }
  printf("a mixed batch fails with %s (kind %d):\n", ndx_error_kind_name(ndx_error_kind(err)),
         (int)ndx_error_kind(err));
  print_and_free(err);
  printf("\nthe caller still owns both tensors (deleters called: %d %d); releasing them.\n",
         bad_deleted[0], bad_deleted[1]);
  mixed[0]->deleter(mixed[0]);
  mixed[1]->deleter(mixed[1]);
  return (deleted[0] == 1 && deleted[1] == 1 && deleted[2] == 1 && bad_deleted[0] == 1 &&
          bad_deleted[1] == 1)
             ? 0
             : 1;
}
