#include "train/device_gemms.h"

namespace loom {

const float* DeviceGemms::widened(Backend& be, ActIn x, int64_t n) {
  if (x.f32) return x.f32;
  float* s = scratch_.ensure_n<float>(be, size_t(n), "scratch");
  be.convert(s, DType::F32, x.bf16, DType::BF16, n);
  return s;
}

void DeviceGemms::forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N,
                          int in, int out) {
  be.matmul_forward(y, widened(be, x, int64_t(N) * in), w, b, N, in, out);
}

void DeviceGemms::backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                           const float* w, int N, int in, int out) {
  be.matmul_backward(dx, dw, db, dy, widened(be, x, int64_t(N) * in), w, N, in, out);
}

std::unique_ptr<DeviceGemms> attach_device_gemms(Decoder& model) {
  auto r = std::make_unique<DeviceGemms>();
  for (const auto& l : model.linears()) model.attach_recipe(l.name, r.get());
  return r;
}

}  // namespace loom
