#include "rl/tp_gather.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt/reshard.h"
#include "core/error.h"
#include "model/decoder.h"
#include "rl/rl_checkpoint.h"

namespace loom::rl {

void check_learner_grid(int learners, int tp, const ModelConfig& cfg, bool sp, int ep, int etp) {
  LOOM_CHECK(tp >= 1, "--learner-tp must be at least 1 (got ", tp, ")");
  LOOM_CHECK(!sp || tp > 1, "--learner-sp needs --learner-tp > 1 (got ", tp, ")");
  LOOM_CHECK(ep >= 1 && etp >= 1, "--learner-ep and --learner-etp must be at least 1 (got ", ep,
             " and ", etp, ")");
  LOOM_CHECK((ep == 1 && etp == 1) || cfg.is_moe(), "--learner-ep ", ep, " / --learner-etp ", etp,
             " split the experts of a mixture-of-experts policy; this one has none ",
             "(model.n_experts = ", cfg.n_experts, ")");
  // The trainer's layout: EP splits the data-parallel groups, ETP the TP group.
  LOOM_CHECK(tp % etp == 0, "--learner-etp ", etp, " must divide --learner-tp ", tp,
             ": each expert's width is split over that many of a TP group's ranks");
  LOOM_CHECK(cfg.n_experts % ep == 0, "--learner-ep ", ep, ": model.n_experts (", cfg.n_experts,
             ") must be divisible by it");
  LOOM_CHECK(cfg.d_ff % etp == 0, "--learner-etp ", etp, ": model.d_ff (", cfg.d_ff,
             ") must be divisible by it");
  if (tp == 1 && ep == 1) return;
  LOOM_CHECK(learners % tp == 0, "--learner-tp ", tp, " must divide the ", learners,
             " learner rank(s) (ranks minus --rollout-ranks): the learners form data-parallel ",
             "groups of ", tp, " tensor-parallel ranks");
  LOOM_CHECK((learners / tp) % ep == 0, "--learner-ep ", ep, " must divide the ", learners / tp,
             " data-parallel learner group(s) (", learners, " learner rank(s) / --learner-tp ", tp,
             "): the experts are split over data-parallel groups, as the trainer's parallel.ep");
  if (tp == 1) return;
  // The decoder's own check, without a communicator (none exists yet on any rank).
  LOOM_CHECK(cfg.n_head % tp == 0, "--learner-tp ", tp, ": model.n_head (", cfg.n_head,
             ") must be divisible by it");
  LOOM_CHECK(cfg.n_kv_head % tp == 0, "--learner-tp ", tp, ": model.n_kv_head (", cfg.n_kv_head,
             ") must be divisible by it (KV heads are split, not replicated)");
  LOOM_CHECK(cfg.d_ff % tp == 0, "--learner-tp ", tp, ": model.d_ff (", cfg.d_ff,
             ") must be divisible by it");
  LOOM_CHECK(cfg.vocab % tp == 0, "--learner-tp ", tp, ": model.vocab (", cfg.vocab,
             ") must be divisible by it");
  // A MoE policy trains under TP as the trainer runs it (every TP rank routes all tokens; the
  // experts replicated over the group). Under SP a learner pads a pass whose tokens do not split
  // over the group with a sequence that carries no loss (grpo_trainer.cpp): exact for a dense
  // model, but padding tokens would enter the routing statistics (the auxiliary loss) and the
  // experts' capacity.
  LOOM_CHECK(!sp || !cfg.is_moe() || (cfg.aux_loss_coeff == 0 && cfg.capacity_factor <= 0),
             "--learner-sp with a mixture-of-experts policy needs model.aux_loss_coeff = 0 and ",
             "dropless routing (model.capacity_factor = 0), got ", cfg.aux_loss_coeff, " and ",
             cfg.capacity_factor, ": the padding that splits a pass's tokens over the TP group ",
             "would enter the routing statistics; run without --learner-sp");
}

void extract_shard(ParamSet& whole, ParamSet& shard) {
  for (const ParamInfo& p : shard.infos()) {
    const ParamInfo& w = whole.info(p.name);
    LOOM_CHECK(w.numel == global_numel(p), "parameter ", p.name, ": the whole model holds ",
               w.numel, " elements, the shard's whole tensor ", global_numel(p));
    ckpt::extract_local(p, whole.ptr(p.name), 0, p.numel, shard.ptr(p.name));
  }
}

// The state kinds both hold: the moments, and the fp32 master of a bf16 / fp16 policy.
static std::vector<std::string> shared_kinds(const std::map<std::string, Tensor>& whole,
                                             const std::map<std::string, Tensor>& shard,
                                             const ParamSet& shard_params) {
  std::vector<std::string> kinds = {"exp_avg.", "exp_avg_sq."};
  const std::string first = "master." + shard_params.infos().front().name;
  LOOM_CHECK(whole.count(first) == shard.count(first), "learner gather: the ",
             whole.count(first) ? "whole model's" : "shard's",
             " optimizer keeps an fp32 master and the other does not");
  if (whole.count(first)) kinds.push_back("master.");
  return kinds;
}

void extract_shard_state(AdamW& whole, Optimizer& shard, const ParamSet& shard_params) {
  auto w = whole.state_tensors(), s = whole_state_tensors(shard, shard_params);
  for (const std::string& m : shared_kinds(w, s, shard_params))
    for (const ParamInfo& p : shard_params.infos())
      ckpt::extract_local(p, w.at(m + p.name).data<float>(), 0, p.numel,
                          s.at(m + p.name).data<float>());
  shard.set_steps_taken(whole.steps_taken());
}

std::vector<char> owned_params(const ParamSet& shard, int tp_rank, int etp, int ep_rank) {
  std::vector<char> owned;
  for (const ParamInfo& p : shard.infos())
    owned.push_back(p.expert ? tp_rank < etp : (p.sharded() || tp_rank == 0) && ep_rank == 0);
  return owned;
}

TpGather::TpGather(const ParamSet& shard, comm::Communicator& tp, const std::vector<char>& owned)
    : shard_(shard), tp_(tp) {
  const int n = tp.size(), me = tp.rank();
  std::vector<int64_t> mine;  // 4 numbers a run
  int64_t values = 0;
  const auto& infos = shard.infos();
  LOOM_CHECK(owned.size() == infos.size(), "learner gather: ", owned.size(),
             " ownership flags for ", infos.size(), " parameters");
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    if (!owned[i]) continue;  // another learner of the group holds the same values
    ckpt::for_each_global_run(p, 0, p.numel, [&](int64_t local, int64_t global, int64_t len) {
      mine.insert(mine.end(), {int64_t(i), local, global, len});
      values += len;
    });
  }
  std::vector<int64_t> sizes(size_t(n), 0);
  sizes[size_t(me)] = int64_t(mine.size());
  tp.all_gather(sizes.data(), std::vector<int64_t>(size_t(n), 1), DType::I64);
  std::vector<int64_t> all;
  int64_t at = 0;
  for (int r = 0; r < n; ++r) at += r < me ? sizes[size_t(r)] : 0;
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  all.assign(size_t(total), 0);
  std::copy(mine.begin(), mine.end(), all.begin() + at);
  tp.all_gather(all.data(), sizes, DType::I64);
  runs_.resize(size_t(n));
  counts_.assign(size_t(n), 0);
  at = 0;
  for (int r = 0; r < n; ++r) {
    for (int64_t k = at; k < at + sizes[size_t(r)]; k += 4) {
      const Run run{all[size_t(k)], all[size_t(k + 1)], all[size_t(k + 2)], all[size_t(k + 3)]};
      LOOM_CHECK(run.param >= 0 && run.param < int64_t(infos.size()), "learner gather: rank ", r,
                 " holds another model");
      runs_[size_t(r)].push_back(run);
      counts_[size_t(r)] += run.length;
    }
    at += sizes[size_t(r)];
  }
  // Every element of every whole tensor exactly once (a layout whose ownership leaves a hole
  // or a duplicate would otherwise send stale or doubled bytes silently).
  std::vector<int64_t> covered(infos.size(), 0);
  for (const auto& runs : runs_)
    for (const Run& run : runs) covered[size_t(run.param)] += run.length;
  for (size_t i = 0; i < infos.size(); ++i)
    LOOM_CHECK(covered[i] == global_numel(infos[i]), "learner gather: the group holds ", covered[i],
               " of the ", global_numel(infos[i]), " elements of ", infos[i].name);
  int64_t sum = 0;
  for (int64_t c : counts_) sum += c;
  buf_.resize(size_t(sum));
}

void TpGather::gather(const Local& local, const Whole& whole) {
  const auto& infos = shard_.infos();
  int64_t at = 0;
  for (int r = 0; r < tp_.rank(); ++r) at += counts_[size_t(r)];
  for (const Run& run : runs_[size_t(tp_.rank())]) {
    std::memcpy(buf_.data() + at, local(infos[size_t(run.param)]) + run.local,
                sizeof(float) * size_t(run.length));
    at += run.length;
  }
  tp_.all_gather(buf_.data(), counts_, DType::F32);
  at = 0;
  for (const auto& runs : runs_)
    for (const Run& run : runs) {
      std::memcpy(whole(infos[size_t(run.param)]) + run.global, buf_.data() + at,
                  sizeof(float) * size_t(run.length));
      at += run.length;
    }
}

void TpGather::gather_state(Optimizer& shard, AdamW& whole) {
  auto s = whole_state_tensors(shard, shard_), w = whole.state_tensors();
  for (const std::string& m : shared_kinds(w, s, shard_))
    gather([&](const ParamInfo& p) { return s.at(m + p.name).data<float>(); },
           [&](const ParamInfo& p) { return w.at(m + p.name).data<float>(); });
  whole.set_steps_taken(shard.steps_taken());
}

}  // namespace loom::rl
