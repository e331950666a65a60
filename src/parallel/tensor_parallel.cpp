#include "parallel/tensor_parallel.h"

#include "core/error.h"

namespace loom::parallel {

TensorParallel tensor_parallel_layout(comm::ProcessGroups& groups, bool sequence_parallel) {
  TensorParallel tp;
  tp.size = groups.tp().size();
  tp.rank = groups.tp().rank();
  tp.sequence_parallel = sequence_parallel && tp.size > 1;
  tp.comm = &groups.tp();
  return tp;
}

ExpertParallel expert_parallel_layout(comm::ProcessGroups& groups, int etp) {
  ExpertParallel ep;
  ep.size = groups.ep().size();
  ep.rank = groups.ep().rank();
  ep.comm = &groups.ep();
  comm::Communicator& tp = groups.tp();
  LOOM_CHECK(etp >= 1 && tp.size() % etp == 0, "parallel.etp (", etp, ") must divide parallel.tp (",
             tp.size(), "): use etp = 1 (experts replicated over ",
             "the TP group) or a divisor of tp");
  ep.tp_size = etp;
  ep.tp_rank = tp.rank() % etp;
  if (etp == tp.size()) {
    ep.tp_comm = &tp;
  } else if (etp > 1) {
    ep.tp_owner = tp.split(tp.rank() / etp, ep.tp_rank, "etp");
    ep.tp_comm = ep.tp_owner.get();
  }
  return ep;
}

std::vector<double> grad_norm_weights(const ParamSet& params, int tp_rank, int etp) {
  std::vector<double> w;
  for (const ParamInfo& p : params.infos()) {
    const bool counts = p.expert ? tp_rank < etp : p.sharded() || tp_rank == 0;
    w.push_back(counts ? 1.0 : 0.0);
  }
  return w;
}

}  // namespace loom::parallel
