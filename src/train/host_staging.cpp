#include "train/host_staging.h"

namespace loom {

ckpt::TensorList HostStaging::stage(ckpt::TensorList views) {
  if (be_.host_accessible()) return views;
  for (auto& t : views) {
    Tensor host = Tensor::zeros(t.tensor.shape());
    be_.copy_d2h(host.data<float>(), t.tensor.data<float>(), size_t(t.tensor.nbytes()));
    staged_.push_back({t.tensor.data<float>(), host});
    t.tensor = host;
  }
  return views;
}

void HostStaging::upload() {
  for (auto& [dev, host] : staged_) be_.copy_h2d(dev, host.data<float>(), size_t(host.nbytes()));
  staged_.clear();
}

ckpt::TensorList whole_views(ParamSet& P, int replica) {
  ckpt::TensorList out;
  for (const ParamInfo& p : P.infos()) {
    ckpt::ShardInfo info;
    info.replica_id = replica;
    out.push_back({p.name, Tensor::view_of(P.data() + p.offset, p.shape, DType::F32), info});
  }
  return out;
}

bool in_block(const std::string& name) {
  return name.rfind("blocks.", 0) == 0;
}

}  // namespace loom
