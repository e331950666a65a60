// Tensor: a typed, shaped, strided view into storage that it either owns (shared) or borrows.
// Kernels take raw pointers (llm.c style); Tensor is how higher layers own and pass buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom {

enum class Device : uint8_t { CPU, CUDA };

using Shape = std::vector<int64_t>;
int64_t numel_of(const Shape& s);
std::string shape_str(const Shape& s);

// A block of bytes on a device. Borrowed storage wraps memory someone else keeps alive
// (an mmap'd file, a slice of the model's single parameter allocation).
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes, Device dev = Device::CPU);
  static std::shared_ptr<Storage> borrow(void* ptr, size_t bytes, Device dev = Device::CPU);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return dev_; }

 private:
  Storage(void* p, size_t b, Device d, bool owned) : ptr_(p), bytes_(b), dev_(d), owned_(owned) {}
  void* ptr_;
  size_t bytes_;
  Device dev_;
  bool owned_;
};

class Tensor {
 public:
  Tensor() = default;
  // New zero-filled contiguous tensor.
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device dev = Device::CPU);
  // Contiguous view over memory that outlives the tensor.
  static Tensor view_of(void* ptr, const Shape& shape, DType dtype, Device dev = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_of(shape_); }
  size_t nbytes() const { return numel() * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Views share storage.
  Tensor reshape(const Shape& shape) const;        // contiguous only
  Tensor slice(int64_t begin, int64_t end) const;  // along dim 0
  Tensor transpose(int a, int b) const;            // swaps strides; result is not contiguous

  Tensor clone() const;               // deep, contiguous copy
  Tensor to(DType dtype) const;       // converted contiguous copy (rounding to nearest even)
  void copy_from(const Tensor& src);  // same shape; converts dtype
  void fill(float value);

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
};

}  // namespace loom
