#include "parallel/tensor_parallel.h"

namespace loom::parallel {

TensorParallel tensor_parallel_layout(comm::ProcessGroups& groups, bool sequence_parallel) {
  TensorParallel tp;
  tp.size = groups.tp().size();
  tp.rank = groups.tp().rank();
  tp.sequence_parallel = sequence_parallel && tp.size > 1;
  tp.comm = &groups.tp();
  return tp;
}

ExpertParallel expert_parallel_layout(comm::ProcessGroups& groups) {
  ExpertParallel ep;
  ep.size = groups.ep().size();
  ep.rank = groups.ep().rank();
  ep.comm = &groups.ep();
  return ep;
}

std::vector<double> grad_norm_weights(const ParamSet& params, int tp_rank) {
  std::vector<double> w;
  for (const ParamInfo& p : params.infos()) w.push_back(p.sharded() || tp_rank == 0 ? 1.0 : 0.0);
  return w;
}

}  // namespace loom::parallel
