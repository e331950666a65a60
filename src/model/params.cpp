#include "model/params.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace loom {

void ParamSet::add(const std::string& name, const Shape& shape, bool decay, ParamInit init,
                   float std) {
  LOOM_CHECK(!values_.defined(), "ParamSet::add after allocate (", name, ")");
  LOOM_CHECK(!index_.count(name), "duplicate parameter name ", name);
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = numel_of(shape);
  // Keep every parameter 16-float aligned (64 bytes) so SIMD loads never straddle two.
  p.offset = (total_ + 15) / 16 * 16;
  p.decay = decay;
  p.init = init;
  p.std = std;
  total_ = p.offset + p.numel;
  index_[name] = infos_.size();
  infos_.push_back(p);
}

void ParamSet::allocate() {
  values_ = Tensor::zeros({total_});
  grads_ = Tensor::zeros({total_});
}

const ParamInfo& ParamSet::info(const std::string& name) const {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  return infos_[it->second];
}

void ParamSet::set_shard(const std::string& name, const Shape& global_shape, int dim,
                         std::vector<int64_t> global_index) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  ParamInfo& p = infos_[it->second];
  LOOM_CHECK(dim == 0 || dim == 1, name, ": shard dimension must be 0 or 1");
  LOOM_CHECK(global_shape.size() == p.shape.size(), name, ": shard of another rank");
  LOOM_CHECK(dim == 1 || static_cast<int64_t>(global_index.size()) == p.shape[0], name,
             ": one global row per local row");
  p.global_shape = global_shape;
  p.shard_dim = dim;
  p.global_index = std::move(global_index);
}

void ParamSet::set_inner_shard(const std::string& name, int dim, std::vector<int64_t> inner_index) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  ParamInfo& p = infos_[it->second];
  LOOM_CHECK(p.shard_dim == 0 && p.shape.size() == 3, name,
             ": an inner shard needs a 3-D parameter sharded along dimension 0");
  LOOM_CHECK(dim == 1 || dim == 2, name, ": inner shard dimension must be 1 or 2");
  LOOM_CHECK(dim == 2 || static_cast<int64_t>(inner_index.size()) == p.shape[1], name,
             ": one global row per local row");
  p.inner_dim = dim;
  p.inner_index = std::move(inner_index);
}

void ParamSet::mark_expert(const std::string& name) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  infos_[it->second].expert = true;
}

void ParamSet::init(uint64_t seed) {
  for (auto& p : infos_) {
    float* dst = data() + p.offset;
    switch (p.init) {
      case ParamInit::Zeros:
        std::fill(dst, dst + p.numel, 0.f);
        break;
      case ParamInit::Ones:
        std::fill(dst, dst + p.numel, 1.f);
        break;
      case ParamInit::Normal: {
        const uint64_t key = name_key(p.name);
        if (!p.sharded()) {
          fill_normal(dst, p.numel, seed, key, 0, 0.f, p.std);
          break;
        }
        if (p.inner_dim > 0) {  // expert [E_local, A, B] split inside each expert too
          const int64_t A = p.shape[1], B = p.shape[2];
          const int64_t gA = p.global_shape[1], gB = p.global_shape[2];
          for (int64_t e = 0; e < p.shape[0]; ++e)
            for (int64_t a = 0; a < A; ++a) {
              const int64_t base = p.global_index[e] * gA * gB;
              const int64_t first = p.inner_dim == 1 ? base + p.inner_index[a] * gB
                                                     : base + a * gB + p.inner_index[0];
              fill_normal(dst + (e * A + a) * B, B, seed, key, first, 0.f, p.std);
            }
          break;
        }
        // Draw each local element at its global index: the same values as one process.
        const int64_t rows = p.shape[0], cols = p.numel / rows;
        const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
        for (int64_t i = 0; i < rows; ++i) {
          uint64_t first =
              p.shard_dim == 0 ? p.global_index[i] * cols : i * gcols + p.global_index[0];
          fill_normal(dst + i * cols, cols, seed, key, first, 0.f, p.std);
        }
        break;
      }
    }
  }
}

void ParamSet::zero_grad() {
  std::memset(grad(), 0, sizeof(float) * total_);
}

std::map<std::string, Tensor> ParamSet::tensors() {
  std::map<std::string, Tensor> m;
  for (auto& p : infos_) m[p.name] = Tensor::view_of(data() + p.offset, p.shape, DType::F32);
  return m;
}

std::map<std::string, Tensor> ParamSet::grad_tensors() {
  std::map<std::string, Tensor> m;
  for (auto& p : infos_) m[p.name] = Tensor::view_of(grad() + p.offset, p.shape, DType::F32);
  return m;
}

}  // namespace loom
