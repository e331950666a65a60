// Host tensors for checkpoint I/O on any backend: on a host-accessible backend the views
// themselves; on a device a host copy of each (copy_d2h), remembered so that upload() writes
// them back once they were filled (copy_h2d). Views name backend memory, which the host never
// reads on a device.
#pragma once

#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "kernels/backend.h"
#include "model/params.h"

namespace loom {

class HostStaging {
 public:
  explicit HostStaging(Backend& be) : be_(be) {}
  // Forgets earlier copies (a failed read may have left some behind: they are never uploaded).
  void clear() { staged_.clear(); }
  ckpt::TensorList stage(ckpt::TensorList views);
  void upload();  // every copy made since clear(), back to its device memory; then clear()

 private:
  Backend& be_;
  std::vector<std::pair<float*, Tensor>> staged_;  // device address, host copy
};

// Every parameter of P whole, as views of its buffer (backend memory), each held by replica
// `replica` (a data-parallel rank).
ckpt::TensorList whole_views(ParamSet& P, int replica);
// A parameter of one of the blocks (what ZeRO-3 gathers around use), not the embeddings, final
// norm or head.
bool in_block(const std::string& name);

}  // namespace loom
