#include "model/linear.h"

namespace loom {

const float* ActIn::widened(Backend& be, int64_t n, std::vector<float>& scratch) const {
  if (f32) return f32;
  scratch.resize(static_cast<size_t>(n));
  be.convert(scratch.data(), DType::F32, bf16, DType::BF16, n);
  return scratch.data();
}

namespace {
// The widened input of the layer being run (fp32 paths on bf16 storage); one per thread.
std::vector<float>& widen_scratch() {
  thread_local std::vector<float> s;
  return s;
}
}  // namespace

void Linear::forward(Backend& be, float* y, ActIn x, int N) const {
  const float* x32 = nullptr;
  if (recipe) {
    recipe->forward(be, y, x, w, b, N, in, out);
  } else {
    x32 = x.widened(be, int64_t(N) * in, widen_scratch());
    be.matmul_forward(y, x32, w, b, N, in, out);
  }
  if (adapter) {
    if (!x32) x32 = x.widened(be, int64_t(N) * in, widen_scratch());
    adapter->forward(be, y, x32, N, first_row);
  }
}

void Linear::backward(Backend& be, float* dx, const float* dy, ActIn x, int N) const {
  const float* x32 = nullptr;
  if (recipe) {
    recipe->backward(be, dx, dw, db, dy, x, w, N, in, out);
  } else {
    x32 = x.widened(be, int64_t(N) * in, widen_scratch());
    be.matmul_backward(dx, dw, db, dy, x32, w, N, in, out);
  }
  if (adapter) {
    if (!x32) x32 = x.widened(be, int64_t(N) * in, widen_scratch());
    adapter->backward(be, dx, dy, x32, N, first_row);
  }
}

}  // namespace loom
