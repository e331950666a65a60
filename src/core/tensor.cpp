#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace loom {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device dev) {
  LOOM_CHECK(dev == Device::CPU, "Storage::allocate: only CPU storage is built into core");
  // 64-byte alignment for AVX-512 loads; aligned_alloc needs a multiple of the alignment.
  size_t padded = (bytes + 63) / 64 * 64;
  void* p = padded ? std::aligned_alloc(64, padded) : nullptr;
  LOOM_CHECK(p || !padded, "out of memory allocating ", bytes, " bytes");
  if (p) std::memset(p, 0, padded);
  return std::shared_ptr<Storage>(new Storage(p, bytes, dev, true));
}

std::shared_ptr<Storage> Storage::borrow(void* ptr, size_t bytes, Device dev) {
  return std::shared_ptr<Storage>(new Storage(ptr, bytes, dev, false));
}

Storage::~Storage() {
  if (owned_) std::free(ptr_);
}

static Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev) {
  for (int64_t d : shape) LOOM_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.storage_ = Storage::allocate(numel_of(shape) * dtype_size(dtype), dev);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::view_of(void* ptr, const Shape& shape, DType dtype, Device dev) {
  Tensor t;
  t.storage_ = Storage::borrow(ptr, numel_of(shape) * dtype_size(dtype), dev);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  LOOM_CHECK(is_contiguous(), "reshape of a non-contiguous tensor");
  LOOM_CHECK(numel_of(shape) == numel(), "reshape ", shape_str(shape_), " -> ", shape_str(shape),
             ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  LOOM_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ",
             end, ") out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += begin * strides_[0];
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  Tensor t = *this;
  std::swap(t.shape_.at(a), t.shape_.at(b));
  std::swap(t.strides_.at(a), t.strides_.at(b));
  return t;
}

namespace {
float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F8E4M3:
      return e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::F8E5M2:
      return e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::I32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::I64:
      return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DType::U8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::U16:
      return static_cast<const uint16_t*>(p)[i];
  }
  return 0;
}
void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    case DType::F8E4M3:
      static_cast<uint8_t*>(p)[i] = f32_to_e4m3(v);
      break;
    case DType::F8E5M2:
      static_cast<uint8_t*>(p)[i] = f32_to_e5m2(v);
      break;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::I64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::U8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DType::U16:
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v);
      break;
  }
}
// Element offset of the i-th element in row-major logical order.
int64_t strided_offset(const Shape& shape, const Shape& strides, int64_t i) {
  int64_t off = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  LOOM_CHECK(src.shape_ == shape_, "copy_from: shape ", shape_str(src.shape_), " into ",
             shape_str(shape_));
  const int64_t n = numel();
  if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memcpy(raw(), src.raw(), nbytes());
    return;
  }
  // Integer types are copied exactly, not through float.
  if (src.dtype_ == dtype_ && (dtype_ == DType::I64 || dtype_ == DType::I32)) {
    size_t es = dtype_size(dtype_);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(
          static_cast<char*>(raw()) + strided_offset(shape_, strides_, i) * es,
          static_cast<const char*>(src.raw()) + strided_offset(src.shape_, src.strides_, i) * es,
          es);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    store_f32(raw(), dtype_, strided_offset(shape_, strides_, i),
              load_as_f32(src.raw(), src.dtype_, strided_offset(src.shape_, src.strides_, i)));
}

Tensor Tensor::clone() const {
  Tensor t = zeros(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = zeros(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float value) {
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i)
    store_f32(raw(), dtype_, strided_offset(shape_, strides_, i), value);
}

}  // namespace loom
