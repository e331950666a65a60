#include "train/frozen_reference.h"

#include <algorithm>

#include "ckpt/model_loader.h"
#include "ckpt/reshard.h"
#include "core/error.h"

namespace loom {

namespace {

// The policy's weights now into the reference's parameters R (the same layout): whole, or
// (`sharded`: ZeRO-3, the policy's blocks not resident) the engine's master shard of the blocks,
// rounded to the compute type, and the parameters outside the blocks, which stay gathered.
void copy_policy(ParamSet& R, const Decoder& policy, parallel::DataParallel& dp, DType compute,
                 bool sharded) {
  const ParamSet& P = policy.params();
  Backend& be = policy.backend();
  if (!sharded) {
    P.copy_values_to(R.data(), 0, P.total());
    return;
  }
  const auto copy = [&](float* dst, const float* src, int64_t n) {
    if (n > 0) be.copy_d2d(dst, src, sizeof(float) * size_t(n));
  };
  for (const auto& sl : dp.param_slices()) {
    float* dst = R.data() + R.info(sl.name).offset + sl.offset;
    copy(dst, sl.tensor.data<float>(), sl.tensor.numel());
    if (compute != DType::F32 && sl.tensor.numel() > 0)
      be.round_to(compute, dst, sl.tensor.numel(), nullptr);
  }
  for (const ParamInfo& p : P.infos())
    if (!in_block(p.name)) copy(R.data() + p.offset, P.data() + p.offset, p.numel);
}

}  // namespace

FrozenReference frozen_copy_of(Decoder& policy, parallel::DataParallel& dp,
                               comm::Communicator& dp_comm) {
  const bool sharded = dp.zero() == 3;
  LOOM_CHECK(!sharded || policy.expert_parallel().size == 1,
             "a ZeRO-3 frozen reference under expert parallelism is not supported (its experts ",
             "differ between the data-parallel ranks): use ZeRO 0-2, or no reference (beta 0)");
  FrozenReference ref;
  ref.model = std::make_unique<Decoder>(policy.config(), policy.backend(), Recompute::None,
                                        policy.act_dtype(), policy.tensor_parallel(),
                                        policy.expert_parallel(), policy.pipeline_stage());
  LOOM_CHECK(ref.model->params().total() == policy.params().total(), "reference layout mismatch");
  copy_policy(ref.model->params(), policy, dp, policy.act_dtype(), sharded);
  if (sharded) {
    ref.shards = std::make_unique<parallel::FrozenShards>(*ref.model, dp_comm);
    LOOM_CHECK(
        ref.shards->shard_begin() == dp.shard_begin() && ref.shards->shard_end() == dp.shard_end(),
        "frozen reference: its ZeRO-3 shard differs from the policy's");
  }
  return ref;
}

// DPO's reference is the run's starting weights. train.pretrained's and the seeded draw are in
// the model when the reference copies it (construction); a weights-only train.init_from (e.g.
// `loom ckpt import`) arrives later: its weights are taken here, from the model when the run
// starts from them, or from the checkpoint again when the run resumes its own checkpoint.
void reference_from_init_weights(TrainSetup& s, bool resumed) {
  if (!s.reference.model || !s.opt.pretrained.empty() || s.opt.init_from.empty()) return;
  const ckpt::Checkpoint c(s.opt.init_from);
  if (c.state().extra.contains("optimizer_steps")) return;  // a run's checkpoint: see docs
  make_reference(s, resumed ? &c : nullptr);
}

// The DPO reference: a frozen Decoder in the policy's layout holding the policy's weights now
// (`from` null), or `from`'s weights. Under ZeRO-3 it holds what FrozenShards needs and no
// more (this rank's flat shard of the blocks, the same split as the policy's, and the
// parameters outside the blocks whole), so no rank ever holds the whole reference either.
void make_reference(TrainSetup& s, const ckpt::Checkpoint* from) {
  s.reference.shards.reset();  // it points into the old reference
  s.reference.pipe.reset();
  // On the policy's backend: on a device the reference's forward runs there too, and its
  // weights are copied and rounded by Backend ops (checkpoint reads staged through the host).
  s.reference.model = std::make_unique<Decoder>(s.model_cfg, *s.be, Recompute::None,
                                                s.policy.compute, s.model->tensor_parallel(),
                                                ExpertParallel{}, s.model->pipeline_stage());
  // Under a pipeline the reference runs forward only through its own stages, with the policy's
  // schedule (a collective over the pipeline group: every rank makes it here).
  if (s.pipe)
    s.reference.pipe = std::make_unique<parallel::PipelineRunner>(*s.reference.model, s.pg->pp(),
                                                                  s.pipe->schedule());
  if (s.model->context_parallel().size > 1)
    s.reference.model->set_context_parallel(s.model->context_parallel());
  ParamSet& R = s.reference.model->params();
  const ParamSet& P = s.model->params();
  LOOM_CHECK(R.total() == P.total(), "DPO reference layout mismatch");
  const bool sharded = s.dp->zero() == 3;
  const auto round = [&](float* p, int64_t n) {  // backend memory
    if (s.policy.compute != DType::F32 && n > 0) s.be->round_to(s.policy.compute, p, n, nullptr);
  };
  if (!sharded && !from) {
    copy_policy(R, *s.model, *s.dp, s.policy.compute, false);  // whole (this rank's TP shard)
    return;
  }
  if (!sharded) {
    s.staging->clear();
    const ckpt::TensorList host = s.staging->stage(whole_views(R, s.pg->dp().rank()));
    ckpt::fill_from_whole(*from, R, host, {});
    ckpt::require_finite(host, from->dir());
    s.staging->upload();
    round(R.data(), R.total());
    return;
  }
  const int64_t lo = s.dp->shard_begin(), hi = s.dp->shard_end();
  if (from) {
    // The pieces this rank keeps, read from the checkpoint's whole tensors.
    ckpt::TensorList pieces;
    for (const ParamInfo& p : R.infos()) {
      ckpt::ShardInfo info;
      if (!in_block(p.name)) {
        info.replica_id = s.pg->dp().rank();
        pieces.push_back({p.name, Tensor::view_of(R.data() + p.offset, p.shape, DType::F32), info});
        continue;
      }
      const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      if (a >= b) continue;
      info.global_shape = {p.numel};
      info.global_offset = {a - p.offset};
      pieces.push_back({p.name, Tensor::view_of(R.data() + a, {b - a}, DType::F32), info});
    }
    s.staging->clear();
    const ckpt::TensorList host = s.staging->stage(pieces);
    ckpt::fill_from_whole(*from, R, host, {});
    ckpt::require_finite(host, from->dir());  // the rest of R is zeros
    s.staging->upload();
    for (const auto& piece : pieces) round(piece.tensor.data<float>(), piece.tensor.numel());
  } else {
    copy_policy(R, *s.model, *s.dp, s.policy.compute, true);
  }
  s.reference.shards =
      std::make_unique<parallel::FrozenShards>(*s.reference.model, s.on_device(s.pg->dp()));
  LOOM_CHECK(s.reference.shards->shard_begin() == lo && s.reference.shards->shard_end() == hi,
             "DPO reference: its ZeRO-3 shard differs from the policy's");
}

}  // namespace loom
