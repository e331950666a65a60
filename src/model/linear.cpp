#include "model/linear.h"

#include "model/parallel_ops.h"

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

const float* Linear::fp32_input(Backend& be, ActIn x, int N) const {
  const int64_t n = int64_t(N) * in;
  if (x.f32 || !widen) return x.widened(be, n, widen_scratch());
  float* s = widen->ensure_n<float>(be, size_t(n), "scratch");
  be.convert(s, DType::F32, x.bf16, DType::BF16, n);
  return s;
}

void Linear::local_forward(Backend& be, float* y, ActIn x, int N) const {
  const float* x32 = nullptr;
  if (recipe) {
    recipe->forward(be, y, x, w, b, N, in, out);
  } else {
    x32 = fp32_input(be, x, N);
    be.matmul_forward(y, x32, w, b, N, in, out);
  }
  if (adapter) {
    if (!x32) x32 = fp32_input(be, x, N);
    adapter->forward(be, y, x32, N, first_row);
  }
}

void Linear::local_backward(Backend& be, float* dx, const float* dy, ActIn x, int N) const {
  const float* x32 = nullptr;
  if (recipe) {
    recipe->backward(be, dx, dw, db, dy, x, w, N, in, out);
  } else {
    x32 = fp32_input(be, x, N);
    be.matmul_backward(dx, dw, db, dy, x32, w, N, in, out);
  }
  if (adapter) {
    if (!x32) x32 = fp32_input(be, x, N);
    adapter->backward(be, dx, dy, x32, N, first_row);
  }
}

void Linear::local_forward_bf16(Backend& be, uint16_t* y, ActIn x, int N) const {
  LOOM_CHECK(bf16_outputs(), "local_forward_bf16: the layer has no bf16-output recipe");
  recipe->forward_bf16(be, y, x, w, N, in, out);
}

void Linear::local_backward_bf16(Backend& be, float* dx, const uint16_t* dy, ActIn x, int N) const {
  LOOM_CHECK(bf16_outputs(), "local_backward_bf16: the layer has no bf16-output recipe");
  recipe->backward_bf16(be, dx, dw, dy, x, w, N, in, out);
}

void Linear::gather_input(const ActBuf& x, int N) const {
  if (split == Split::Column && tp) tp->gather_rows(x, N, in);
}

float* Linear::reduce_input_grad(float* dx, int N) const {
  return split == Split::Column && tp ? tp->reduce_rows(dx, N, in) : dx;
}

float* Linear::forward(Backend& be, float* y, const ActBuf& x, int N) const {
  if (split != Split::Row || !tp) {
    gather_input(x, N);
    local_forward(be, y, x.in(), N);
    return y;
  }
  // The partial products of the ranks sum to the layer's output: the bias goes in once.
  Linear shard = *this;
  if (!tp->holds_bias()) shard.b = nullptr;
  shard.local_forward(be, y, x.in(), N);
  return tp->reduce_rows(y, N, out);
}

float* Linear::backward(Backend& be, float* dx, const float* dy, ActIn x, int N) const {
  if (split == Split::Row && tp) dy = tp->full_rows(dy, N, out);
  local_backward(be, dx, dy, x, N);
  return dx ? reduce_input_grad(dx, N) : nullptr;
}

}  // namespace loom
