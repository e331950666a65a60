// The model's input for a micro-batch: the batch itself, or under context parallelism this
// rank's share of it (every document cut into 2*cp chunks, chunks r and 2cp-1-r kept, with their
// positions for RoPE). A share stays valid until the next call for the same batch or forget().
#pragma once

#include <map>
#include <vector>

#include "model/context_parallel.h"
#include "model/decoder.h"
#include "train/batch.h"

namespace loom {

class CpInputs {
 public:
  CpInputs(int cp_size, int cp_rank) : size_(cp_size), rank_(cp_rank) {}
  ModelInput of(const Batch& b);
  void forget(const Batch& b) { local_.erase(&b); }
  // The micro-batch row of each of this rank's rows of `in` (LoRA dropout draws a token's mask
  // by its micro-batch row); nullptr without context parallelism.
  const int32_t* rows(const ModelInput& in) const {
    return in.cp ? in.cp->shards[size_t(rank_)].global_rows.data() : nullptr;
  }

 private:
  struct Local {
    CpBatch batch;
    std::vector<int32_t> tokens, targets;
  };
  int size_, rank_;
  std::map<const Batch*, Local> local_;
};

}  // namespace loom
