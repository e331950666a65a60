// The GPU recipe's delayed-scaling bookkeeping (precision/device_fp8_scaling.h) against the CPU
// recipe's (Fp8Linear) on the same tensors: each layer of the reference really quantises them
// in a forward and backward (recording its amaxes as the trainer's steps do), the device state
// records the same tensors' amaxes through Backend ops on its own buffers; both then start a
// step (the reference max-reduces its pending amaxes over the group on the host, as
// Fp8Recipes::begin_step; the device state all-reduces device memory) and must agree bit for
// bit: scales, histories and the checkpoint state. Used over the guarded CPU backend
// (device_fp8_scaling_test.cpp) and over MPI ranks (tests/parallel/fp8_device_amax_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "precision/device_fp8_scaling.h"
#include "precision/fp8_recipes.h"

namespace loom::test {

constexpr int kFp8N = 16, kFp8In = 32, kFp8Out = 48;

// Deterministic values in [-mag, mag] from `key` (splitmix64), so every rank and both sides
// can make any step's tensors.
inline std::vector<float> fp8_values(uint64_t key, size_t n, float mag) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = key * 0x9E3779B97F4A7C15ull + i + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v[i] = mag * (float(z >> 40) / float(1 << 23) - 1.f);
  }
  return v;
}

struct Fp8StepTensors {
  std::vector<float> x, w, dy;
};

// Layer `layer`'s tensors at `step` on `rank`: magnitudes that rise and fall over the steps
// (so the history's max leaves a short window) and differ between layers, tensors and ranks.
inline Fp8StepTensors fp8_step_tensors(int step, int layer, int rank) {
  const uint64_t key = uint64_t(step) * 1000 + uint64_t(layer) * 10 + uint64_t(rank) * 100000;
  auto mag = [&](int t) {
    return std::ldexp(1.f + 0.37f * float(t + layer), (step * 3 + t + rank) % 7 - 3);
  };
  return {fp8_values(key + 1, size_t(kFp8N) * kFp8In, mag(0)),
          fp8_values(key + 2, size_t(kFp8Out) * kFp8In, 0.1f * mag(1)),
          fp8_values(key + 3, size_t(kFp8N) * kFp8Out, 1e-3f * mag(2))};
}

class Fp8ScalingPair {
 public:
  Fp8ScalingPair(Backend& be, const Fp8Options& o, int layers) : be_(be), opt_(o) {
    for (int i = 0; i < layers; ++i) {
      names_.push_back("blocks." + std::to_string(i) + ".mlp.fc");
      ref_.push_back(std::make_unique<Fp8Linear>(o, nullptr));
    }
    dev_ = std::make_unique<DeviceFp8Scaling>(be, o, names_);
    x_ = BackendBuffer(be, size_t(kFp8N) * kFp8In * sizeof(float), "test");
    w_ = BackendBuffer(be, size_t(kFp8Out) * kFp8In * sizeof(float), "test");
    dy_ = BackendBuffer(be, size_t(kFp8N) * kFp8Out * sizeof(float), "test");
  }

  DeviceFp8Scaling& device() { return *dev_; }
  Fp8Linear& reference(size_t i) { return *ref_[i]; }
  const std::vector<std::string>& names() const { return names_; }

  // Layer i quantises `d` in a forward and, when `backward`, a backward.
  void feed(size_t i, const Fp8StepTensors& d, bool backward) {
    Backend& cpu = cpu_backend();
    std::vector<float> y(size_t(kFp8N) * kFp8Out), dx(d.x.size()), dw(d.w.size(), 0.f);
    ref_[i]->forward(cpu, y.data(), d.x.data(), d.w.data(), nullptr, kFp8N, kFp8In, kFp8Out);
    if (backward)
      ref_[i]->backward(cpu, dx.data(), dw.data(), nullptr, d.dy.data(), d.x.data(), d.w.data(),
                        kFp8N, kFp8In, kFp8Out);
    upload(x_, d.x);
    upload(w_, d.w);
    dev_->record(i, Fp8Linear::X, x_.as<float>(), int64_t(d.x.size()));
    dev_->record(i, Fp8Linear::W, w_.as<float>(), int64_t(d.w.size()));
    if (backward) {
      upload(dy_, d.dy);
      dev_->record(i, Fp8Linear::DY, dy_.as<float>(), int64_t(d.dy.size()));
    }
  }

  void set_recording(bool on) {
    for (auto& l : ref_) l->set_recording(on);
    dev_->set_recording(on);
  }

  // A new step on both. `host_group`: the ranks the reference's amaxes are reduced over (host
  // memory); `device_group`: the same ranks for the device state's buffer.
  void begin_step(comm::Communicator* host_group, comm::Communicator* device_group) {
    std::vector<float> amax;
    for (auto& l : ref_)
      for (int t = 0; t < 3; ++t) amax.push_back(l->pending_amax(Fp8Linear::Tensor(t)));
    if (host_group != nullptr && host_group->size() > 1)
      host_group->all_reduce(amax.data(), int64_t(amax.size()), DType::F32, comm::ReduceOp::Max);
    for (size_t i = 0; i < ref_.size(); ++i) {
      ref_[i]->roll_history(&amax[i * 3]);
      ref_[i]->new_weights();
    }
    dev_->begin_step(device_group);
  }

  // The reference's checkpoint state in Fp8Recipes::state()'s format.
  Json reference_state() const {
    std::vector<Json> layers;
    for (const auto& l : ref_) layers.push_back(l->state());
    return fp8_recipes_state(opt_.amax_history, names_, layers);
  }

  // Empty when both sides agree bit for bit; else what differs (`when` prefixes it).
  std::string compare(const std::string& when) const {
    std::string bad;
    for (size_t i = 0; i < ref_.size(); ++i)
      for (int t = 0; t < 3; ++t) {
        const auto k = Fp8Linear::Tensor(t);
        const float a = ref_[i]->scale(k), b = dev_->scale(i, t);
        if (std::memcmp(&a, &b, sizeof a) != 0)
          bad +=
              cat(when, ": layer ", i, " tensor ", t, " scale ", b, ", the CPU recipe's ", a, "\n");
        if (dev_->history(i, t) != ref_[i]->history(k))
          bad += cat(when, ": layer ", i, " tensor ", t, " history differs\n");
      }
    const std::string want = reference_state().dump(), got = dev_->state().dump();
    if (want != got) bad += cat(when, ": state ", got, "\n  the CPU recipe's ", want, "\n");
    return bad;
  }

  // Every tensor's scale moved away from 1 (the step's roll really ran), on the reference.
  bool scales_moved() const {
    for (const auto& l : ref_)
      for (int t = 0; t < 3; ++t)
        if (l->scale(Fp8Linear::Tensor(t)) == 1.f) return false;
    return true;
  }

 private:
  void upload(BackendBuffer& b, const std::vector<float>& v) {
    be_.copy_h2d(b.data(), v.data(), v.size() * sizeof(float));
  }

  Backend& be_;
  Fp8Options opt_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Fp8Linear>> ref_;
  std::unique_ptr<DeviceFp8Scaling> dev_;
  BackendBuffer x_, w_, dy_;
};

}  // namespace loom::test
