#include "train/cp_inputs.h"

namespace loom {

ModelInput CpInputs::of(const Batch& b) {
  if (size_ == 1) return b.input();
  Local& l = local_[&b];
  l.batch = CpBatch::make(b.cu_seqlens.data(), static_cast<int>(b.cu_seqlens.size()) - 1, size_);
  const cpu::CpShard& s = l.batch.shards[size_t(rank_)];
  l.tokens.resize(size_t(s.rows()));
  l.targets.resize(size_t(s.rows()));
  for (int i = 0; i < s.rows(); ++i) {
    l.tokens[size_t(i)] = b.tokens[size_t(s.global_rows[size_t(i)])];
    l.targets[size_t(i)] = b.targets[size_t(s.global_rows[size_t(i)])];
  }
  ModelInput in{l.tokens.data(),    l.targets.data(),
                s.positions.data(), s.local_cu_seqlens.data(),
                s.rows(),           static_cast<int>(s.local_cu_seqlens.size()) - 1};
  in.cp = &l.batch;
  return in;
}

}  // namespace loom
