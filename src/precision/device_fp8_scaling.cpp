#include "precision/device_fp8_scaling.h"

#include <algorithm>

#include "comm/communicator.h"
#include "core/error.h"
#include "kernels/backend.h"

namespace loom {
namespace {
constexpr size_t kPending = 0, kReduced = 1, kScale = 2, kHistories = 3;
}  // namespace

DeviceFp8Scaling::DeviceFp8Scaling(Backend& be, const Fp8Options& o, std::vector<std::string> names)
    : be_(be), opt_(o), names_(std::move(names)) {
  LOOM_CHECK(o.kind == Fp8RecipeKind::TensorwiseDelayed, "fp8 scaling state: recipe ",
             fp8_recipe_name(o.kind), " keeps no amax history");
  LOOM_CHECK(o.amax_history >= 1 && o.amax_history <= (1 << 20), "fp8 scaling state: amax ",
             "history ", o.amax_history, " outside [1, 2^20]");
  // No layer is a state too: a pipeline stage whose blocks all stay bf16 (fp8_keep_first /
  // fp8_keep_last) holds none, checkpoints an empty layer map and reduces nothing.
  if (names_.empty()) return;
  const size_t n = names_.size() * 3, floats = n * (kHistories + size_t(o.amax_history));
  mem_ = BackendBuffer(be, floats * sizeof(float), "fp8 scaling");
  ring_ = BackendBuffer::zeroed(be, n * 2 * sizeof(int32_t), "fp8 scaling");
  amax_ = BackendBuffer(be, sizeof(float), "fp8 scaling");
  std::vector<float> init(floats, 0.f);                             // histories 0
  std::fill(init.begin(), init.begin() + std::ptrdiff_t(n), -1.f);  // nothing pending
  std::fill(init.begin() + std::ptrdiff_t(kScale * n), init.begin() + std::ptrdiff_t(3 * n), 1.f);
  be.copy_h2d(mem_.data(), init.data(), floats * sizeof(float));
}

size_t DeviceFp8Scaling::slot(size_t i, int t) const {
  LOOM_CHECK(i < names_.size() && t >= 0 && t < 3, "fp8 scaling state: no tensor ", t, " of layer ",
             i, " (", names_.size(), " layers)");
  return i * 3 + size_t(t);
}

float* DeviceFp8Scaling::at(size_t part, size_t i, int t) const {
  return mem_.as<float>() + part * names_.size() * 3 + slot(i, t);
}

float* DeviceFp8Scaling::history_at(size_t i, int t) const {
  return mem_.as<float>() + names_.size() * 3 * kHistories + slot(i, t) * size_t(opt_.amax_history);
}

const float* DeviceFp8Scaling::scales(size_t i) const {
  return at(kScale, i, 0);
}

void DeviceFp8Scaling::record_amax(size_t i, int t, const float* amax) {
  if (recording_) be_.fp8_record_amax(at(kPending, i, t), amax);
}

void DeviceFp8Scaling::record(size_t i, int t, const float* v, int64_t n) {
  if (!recording_) return;
  be_.fp8_amax(v, n, amax_.as<float>());
  record_amax(i, t, amax_.as<float>());
}

void DeviceFp8Scaling::begin_step(comm::Communicator* group) {
  // (A stage without fp8 layers: so are the other ranks of its group, which share its layers.)
  if (names_.empty()) return;
  const size_t n = names_.size() * 3;
  // Every layer's three amaxes in one all-reduce (as Fp8Recipes::begin_step), into a copy: a
  // tensor this rank did not record (-1) takes no part in the max and does not roll here.
  const size_t from = group != nullptr && group->size() > 1 ? kReduced : kPending;
  if (from == kReduced) {
    be_.copy_d2d(at(kReduced, 0, 0), at(kPending, 0, 0), n * sizeof(float));
    group->all_reduce(at(kReduced, 0, 0), int64_t(n), DType::F32, comm::ReduceOp::Max);
  }
  for (size_t i = 0; i < names_.size(); ++i)
    for (int t = 0; t < 3; ++t)
      be_.fp8_roll_history(history_at(i, t), opt_.amax_history,
                           ring_.as<int32_t>() + 2 * slot(i, t), at(kPending, i, t), at(from, i, t),
                           at(kScale, i, t), t == Fp8Linear::DY && opt_.hybrid, opt_.margin,
                           opt_.most_recent);
}

std::vector<float> DeviceFp8Scaling::download() const {
  std::vector<float> h(mem_.bytes() / sizeof(float));
  be_.copy_d2h(h.data(), mem_.data(), mem_.bytes());
  return h;
}

std::vector<int32_t> DeviceFp8Scaling::download_rings() const {
  std::vector<int32_t> h(ring_.bytes() / sizeof(int32_t));
  be_.copy_d2h(h.data(), ring_.data(), ring_.bytes());
  return h;
}

std::vector<float> DeviceFp8Scaling::ordered(const float* ring, const int32_t* pos_count) const {
  const size_t len = size_t(opt_.amax_history), pos = size_t(pos_count[0]);
  const size_t count = size_t(pos_count[1]);
  LOOM_CHECK(pos < len && count <= len, "fp8 scaling state: ring position ", pos, " / fill ", count,
             " outside a history of ", len);
  std::vector<float> h;
  for (size_t j = 0; j < count; ++j) h.push_back(ring[(pos + len - count + j) % len]);
  return h;
}

float DeviceFp8Scaling::scale(size_t i, int t) const {
  float s = 0.f;
  be_.copy_d2h(&s, at(kScale, i, t), sizeof s);
  return s;
}

std::vector<float> DeviceFp8Scaling::history(size_t i, int t) const {
  const size_t len = size_t(opt_.amax_history);
  std::vector<float> ring(len);
  int32_t pc[2];
  be_.copy_d2h(ring.data(), history_at(i, t), len * sizeof(float));
  be_.copy_d2h(pc, ring_.as<int32_t>() + 2 * slot(i, t), sizeof pc);
  return ordered(ring.data(), pc);
}

Json DeviceFp8Scaling::state() const {
  if (names_.empty()) return fp8_recipes_state(opt_.amax_history, names_, {});
  const std::vector<float> all = download();
  const std::vector<int32_t> rings = download_rings();
  const size_t n = names_.size() * 3, len = size_t(opt_.amax_history);
  std::vector<Json> layers;
  for (size_t i = 0; i < names_.size(); ++i) {
    Json tensors = Json::array();
    for (int t = 0; t < 3; ++t) {
      const size_t k = slot(i, t);
      const float* pending = all[kPending * n + k] >= 0.f ? &all[kPending * n + k] : nullptr;
      tensors.push_back(Fp8Linear::tensor_state(
          all[kScale * n + k], ordered(all.data() + kHistories * n + k * len, &rings[2 * k]),
          pending));
    }
    layers.push_back(tensors);
  }
  return fp8_recipes_state(opt_.amax_history, names_, layers);
}

void DeviceFp8Scaling::restore(const Json* j, const std::string& where) {
  const Json::Object* layers = fp8_state_layers(j, names_, opt_.amax_history, where);
  if (layers == nullptr || names_.empty()) return;
  // Every layer parsed and checked before anything changes (no half-restored state).
  const size_t n = names_.size() * 3, len = size_t(opt_.amax_history);
  std::vector<float> all(n * (kHistories + len), 0.f);
  std::vector<int32_t> rings(2 * n);
  for (size_t i = 0; i < names_.size(); ++i) {
    // One parser for both recipes: the CPU layer's (its checks and messages).
    Fp8Linear l(opt_, nullptr);
    l.restore(layers->at(names_[i]), cat(where, ": fp8 state of ", names_[i]));
    for (int t = 0; t < 3; ++t) {
      const size_t k = slot(i, t);
      const auto tensor = Fp8Linear::Tensor(t);
      const std::vector<float> h = l.history(tensor);
      std::copy(h.begin(), h.end(), all.begin() + std::ptrdiff_t(kHistories * n + k * len));
      rings[2 * k] = int32_t(h.size() % len);  // as Fp8Linear::restore lays the ring out
      rings[2 * k + 1] = int32_t(h.size());
      all[kScale * n + k] = l.scale(tensor);
      all[kPending * n + k] = l.recorded(tensor) ? l.pending_amax(tensor) : -1.f;
    }
  }
  be_.copy_h2d(mem_.data(), all.data(), all.size() * sizeof(float));
  be_.copy_h2d(ring_.data(), rings.data(), rings.size() * sizeof(int32_t));
}

}  // namespace loom
