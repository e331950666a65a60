// What the model knows of context parallelism: the group, its micro-batch layout (every
// rank's shard of every document, CpBatch), and the factory of the attention core that runs
// over the group. The ring attention itself lives in parallel/ring_attention.h and is handed
// in through the factory (parallel::context_parallel_layout), as TensorParallel's ops are.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_merge.h"
#include "model/parallel_ops.h"

namespace loom {

struct ContextParallel {
  int size = 1, rank = 0;
  comm::Communicator* comm = nullptr;  // the context-parallel group (size > 1)
  // The attention core over the group (parallel::context_parallel_layout fills it in). A
  // layout of more than one rank without it refuses to run, naming that function.
  std::unique_ptr<AttentionCore> (*make_attention)(const ContextParallel&, Backend&) = nullptr;
};

// All ranks' shards of one micro-batch (shards[r] = cp_shard(..., r)), computed from the global
// cu_seqlens; every rank of the CP group needs them all (it computes against every rank's keys).
struct CpBatch {
  std::vector<cpu::CpShard> shards;
  static CpBatch make(const int32_t* cu_seqlens, int nseq, int cp);
};

}  // namespace loom
