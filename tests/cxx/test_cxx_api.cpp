// The C API used from C++17: RAII owners (std::unique_ptr with ndx_error_free and
// ndx_tensor_release as deleters), a C++ DLPack producer whose deleter is a captureless
// lambda, one import -> export -> re-import round trip, and error formatting into a
// std::string. Proves that ndx.h and ndx_dlpack.h work from C++ (enums with a fixed
// underlying type, extern "C" linkage).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ndx.h"

namespace {

int g_passed = 0;
int g_failed = 0;

bool check(bool ok, const char* what, int line) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, line, what);
  }
  return ok;
}
#define CHECK(cond) check((cond), #cond, __LINE__)

struct ErrorFree {
  void operator()(ndx_error_t* e) const noexcept { ndx_error_free(e); }
};
using Error = std::unique_ptr<ndx_error_t, ErrorFree>;
// The plain function-pointer form works too.
using ErrorFn = std::unique_ptr<ndx_error_t, decltype(&ndx_error_free)>;

struct TensorRelease {
  void operator()(ndx_tensor_t* t) const noexcept { ndx_tensor_release(t); }
};
using Tensor = std::unique_ptr<ndx_tensor_t, TensorRelease>;

std::string format(const ndx_error_t* e) {
  std::string text(ndx_error_format(e, nullptr, 0), '\0');
  // C++17: std::string::data() is writable; the extra byte holds the NUL.
  text.resize(text.size() + 1);
  std::size_t n = ndx_error_format(e, text.data(), text.size());
  text.resize(n);
  return text;
}

bool ok(Error e, int line) {
  if (!e) return check(true, "ok", line);
  std::fprintf(stderr, "unexpected error:\n%s", format(e.get()).c_str());
  return check(false, "call succeeded", line);
}
#define CHECK_OK(expr) ok(Error(expr), __LINE__)

// A C++ producer: the managed tensor owns its shape and data through a struct
// allocated with new; the deleter (a captureless lambda) deletes it and counts.
struct Producer {
  DLManagedTensorVersioned managed{};
  std::vector<int64_t> shape;
  std::vector<float> data;
  int* deleted = nullptr;
};

DLManagedTensorVersioned* make_producer(std::vector<int64_t> shape, std::vector<float> data,
                                        int* deleted) {
  auto* p = new Producer;
  p->shape = std::move(shape);
  p->data = std::move(data);
  p->deleted = deleted;
  p->managed.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  p->managed.manager_ctx = p;
  p->managed.deleter = [](DLManagedTensorVersioned* self) {
    auto* owner = static_cast<Producer*>(self->manager_ctx);
    ++*owner->deleted;
    delete owner;
  };
  p->managed.flags = 0;
  DLTensor& dl = p->managed.dl_tensor;
  dl.data = p->data.data();
  dl.device = DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(p->shape.size());
  dl.dtype = DLDataType{kDLFloat, 32, 1};
  dl.shape = p->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  return &p->managed;
}

void test_types() {
  static_assert(std::is_same_v<std::underlying_type_t<ndx_error_kind_t>, int32_t>);
  static_assert(std::is_same_v<std::underlying_type_t<ndx_dtype_t>, int32_t>);
  static_assert(sizeof(DLManagedTensorVersioned) == 80);
  static_assert(sizeof(DLDeviceType) == 4);
  CHECK(ndx_version() == NDX_VERSION_MAJOR * 10000u + NDX_VERSION_MINOR * 100u +
                             NDX_VERSION_PATCH);
  CHECK(std::string(ndx_version_string()) == NDX_VERSION_STRING);
  CHECK(std::string(ndx_error_kind_name(NDX_ERROR_NOT_IMPLEMENTED)) == "NotImplementedError");
  CHECK(std::string(ndx_dtype_name(NDX_DTYPE_BFLOAT16)) == "bfloat16");
}

void test_round_trip() {
  int deleted = 0;
  DLManagedTensorVersioned* m =
      make_producer({2, 3}, {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}, &deleted);
  ndx_import_options_t opts{};
  opts.struct_size = sizeof opts;
  opts.layout = "HW";
  opts.read_only = false;

  Tensor t;
  {
    ndx_tensor_t* raw = nullptr;
    if (!CHECK_OK(ndx_tensor_from_dlpack_versioned(m, &opts, &raw))) {
      m->deleter(m);
      return;
    }
    t.reset(raw);
  }
  CHECK(deleted == 0);

  DLManagedTensorVersioned* exported = nullptr;
  CHECK_OK(ndx_tensor_to_dlpack_versioned(t.get(), &exported));
  if (!CHECK(exported != nullptr)) return;
  CHECK(exported->version.major == 1);
  CHECK(exported->dl_tensor.ndim == 2);
  CHECK(exported->dl_tensor.shape[0] == 2 && exported->dl_tensor.shape[1] == 3);
  CHECK(exported->dl_tensor.strides != nullptr && exported->dl_tensor.strides[0] == 3 &&
        exported->dl_tensor.strides[1] == 1);
  CHECK(exported->dl_tensor.dtype.code == kDLFloat && exported->dl_tensor.dtype.bits == 32);

  Tensor again;
  {
    ndx_tensor_t* raw = nullptr;
    if (CHECK_OK(ndx_tensor_from_dlpack_versioned(exported, &opts, &raw))) {
      again.reset(raw);
    } else {
      exported->deleter(exported);
    }
  }
  if (again) {
    std::vector<float> values(6, 0.0f);
    CHECK_OK(ndx_tensor_copy_to(again.get(), values.data(), values.size() * sizeof(float)));
    CHECK((values == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f}));
    const char* layout = nullptr;
    CHECK_OK(ndx_tensor_layout(again.get(), &layout));
    CHECK(layout != nullptr && std::string(layout) == "HW");
  }
  t.reset();
  CHECK(deleted == 0);  // the re-import holds the export, which holds the original
  again.reset();
  CHECK(deleted == 1);
}

void test_errors() {
  // A failing call, owned by a unique_ptr.
  const int64_t shape[2] = {2, 2};
  const float data[4] = {1, 2, 3, 4};
  ndx_tensor_t* raw = reinterpret_cast<ndx_tensor_t*>(0x1);
  Error e(ndx_tensor_from_host(data, 99, 2, shape, nullptr, nullptr, &raw));
  CHECK(e != nullptr);
  CHECK(raw == nullptr);
  CHECK(ndx_error_kind(e.get()) == NDX_ERROR_VALUE);
  CHECK(std::string(ndx_error_kind_name(ndx_error_kind(e.get()))) == "ValueError");
  const std::string text = format(e.get());
  CHECK(text.size() == ndx_error_format(e.get(), nullptr, 0));
  CHECK(text.find("Traceback (most recent call last):") != std::string::npos);
  CHECK(text.find("ValueError: argument 'dtype' is 99") != std::string::npos);
  CHECK(text.find("test_cxx_api.cpp") != std::string::npos);

  // A chain built from C++: root cause first in the text.
  ErrorFn root(ndx_error_new(NDX_ERROR_TYPE, "inner problem", nullptr), &ndx_error_free);
  Error outer(ndx_error_new(NDX_ERROR_RUNTIME, "outer problem", root.release()));
  CHECK(ndx_error_cause(outer.get()) != nullptr);
  const std::string chain = format(outer.get());
  const auto a = chain.find("TypeError: inner problem");
  const auto b = chain.find("The above exception was the direct cause of the following exception:");
  const auto c = chain.find("RuntimeError: outer problem");
  CHECK(a != std::string::npos && b != std::string::npos && c != std::string::npos && a < b &&
        b < c);

  // A clone outlives its original.
  Error copy(ndx_error_clone(outer.get()));
  outer.reset();
  CHECK(copy && std::string(ndx_error_message(copy.get())) == "outer problem");
  CHECK(std::string(ndx_error_message(ndx_error_cause(copy.get()))) == "inner problem");

  // Frame access through the versioned struct.
  ndx_frame_t frame{};
  frame.struct_size = sizeof frame;
  CHECK(ndx_error_frame_count(copy.get()) > 0);
  CHECK_OK(ndx_error_frame(copy.get(), 0, &frame));
  CHECK(frame.origin == NDX_FRAME_NATIVE && frame.ip != 0);
  Error bad(ndx_error_frame(copy.get(), ndx_error_frame_count(copy.get()), &frame));
  CHECK(ndx_error_kind(bad.get()) == NDX_ERROR_INDEX);
}

}  // namespace

int main() {
  test_types();
  test_round_trip();
  test_errors();
  std::printf("test_cxx_api: %d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
