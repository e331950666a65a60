#include "rl/mpi_grpo.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"
#include "precision/bf16_gemms.h"
#include "rl/rl_checkpoint.h"
#include "rl/trajectory_wire.h"
#include "rl/weight_sync.h"

namespace loom::rl {

namespace {

constexpr int kTagHeader = 7101, kTagPayload = 7102;

// Polling interval of the bounded waits: short against a generation batch, long enough that a
// waiting rank leaves the (shared) core to the one it waits for.
void nap() {
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// LOOM_FAULT_INJECT=<rank>:<step>[:error|:stall], as the trainer reads it: that rollout rank is
// killed (SIGKILL), throws, or stops answering (sleeps for an hour) when it starts generating
// that target step. The fault tests check that the learner then ends with a message naming the
// rank within --learner-timeout instead of hanging.
void maybe_inject_fault(int rank, int64_t step) {
  const char* f = std::getenv("LOOM_FAULT_INJECT");
  if (!f) return;
  int r = -1;
  long long s = -1;
  char mode[16] = "";
  const int n = std::sscanf(f, "%d:%lld:%15s", &r, &s, mode);
  if (n < 2 || r != rank || s != step) return;
  if (std::string(mode) == "error") fail("injected fault at step ", step);
  if (std::string(mode) == "stall") {
    log_warn("rollout rank ", rank, ": injected stall at step ", step);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  std::raise(SIGKILL);
}

}  // namespace

void check_rl_layout(int world_size, int rollout_ranks) {
  LOOM_CHECK(world_size >= 2, "--rollout-ranks needs at least 2 ranks (loom launch -n N with ",
             "N >= 2); this job has ", world_size);
  LOOM_CHECK(rollout_ranks >= 1 && rollout_ranks <= world_size - 1, "--rollout-ranks ",
             rollout_ranks, " must lie in [1, ", world_size - 1, "] for ", world_size,
             " ranks (at least one learner rank and one rollout rank)");
}

MpiGrpo::MpiGrpo(comm::Communicator& world, Decoder& policy, const data::BpeTokenizer& tok,
                 const data::ChatTemplate& chat, const Environment& env, const RlOptions& opt,
                 const MpiRlOptions& mo, const RlRestore& restore)
    : world_(world),
      policy_(policy),
      opt_(opt),
      mo_(mo),
      rank_(world.rank()),
      buffer_(mo.max_staleness) {
  check_rl_layout(world.size(), mo.rollout_ranks);
  // On every rank before any collective: a bad grid ends them all with the same error.
  check_learner_grid(world.size() - mo.rollout_ranks, mo.learner_tp, policy.config(), mo.learner_sp,
                     mo.learner_ep, mo.learner_etp);
  LOOM_CHECK(mo.learner_timeout > 0, "rl.learner_timeout must be positive");
  const bool model_parallel = mo.learner_tp > 1 || mo.learner_ep > 1 || mo.learner_etp > 1;
  LOOM_CHECK(opt.zero >= 0 && opt.zero <= 3, "parallel.zero must be 0, 1, 2 or 3, not ", opt.zero);
  // The TP / EP learners' data-parallel groups step their shards whole (ZeRO over them would
  // shard a shard; the gathers for the weight sync and the checkpoints read whole shards).
  LOOM_CHECK(!model_parallel || opt.zero == 0,
             "tensor- or expert-parallel GRPO learners (--learner-tp / --learner-ep / "
             "--learner-etp) run at parallel.zero = 0, not ",
             opt.zero);
  K_ = mo.rollout_ranks;
  L_ = world.size() - K_;
  lead_ = rollout_lead(opt, mo.max_staleness);
  // Two sub-communicators (collective over the world, in this order on every rank): the learner
  // ranks (gradients, each step's groups), and learner 0 with the rollout ranks (weights).
  learners_ = world.split(is_learner() ? 0 : 1, rank_, "rl-learners");
  sync_ = world.split(rank_ <= K_ ? 0 : 1, rank_, "rl-weights");
  const int64_t bytes = weight_payload_bytes(policy.params().total(), mo.weight_dtype);
  if (is_learner()) {
    li_ = learners_->rank();
    T_ = mo.learner_tp;
    D_ = L_ / T_;
    E_ = mo.learner_ep;
    if (model_parallel) {
      setup_model_parallel();
    } else if (opt_.zero == 3) {
      // The learners train a copy whose blocks live sharded over them; the policy keeps the
      // whole weights, gathered after every step, for the weight sync, evaluation and saves.
      shard_ = std::make_unique<Decoder>(policy.config(), cpu_backend(), Recompute::None,
                                         opt_.precision.compute);
      shard_->params().copy_values_from(policy.params());
    }
    // The whole model's optimizer state for learner 0's checkpoints (and every learner's
    // restore): fp32 moments, and the master under bf16 / fp16.
    if (opt_.zero >= 1)
      whole_optim_ = std::make_unique<AdamW>(policy.params(), opt_.adam, opt_.precision.compute,
                                             cpu_backend());
    learner_ = std::make_unique<GrpoLearner>(shard_ ? *shard_ : policy, opt_,
                                             dp_ ? dp_.get() : learners_.get(), edp_.get(),
                                             learners_.get());
    if (opt_.zero >= 1) {
      // Each learner's share of the flat buffer, in rank order from element 0.
      parallel::DataParallel& dpo = learner_->optimizer();
      zero_counts_.assign(size_t(L_), 0);
      zero_counts_[size_t(li_)] = dpo.shard_end() - dpo.shard_begin();
      learners_->all_gather(zero_counts_.data(), std::vector<int64_t>(size_t(L_), 1), DType::I64);
      int64_t at = 0;
      for (int r = 0; r < L_; ++r) at += r < li_ ? zero_counts_[size_t(r)] : 0;
      int64_t sum = 0;
      for (int64_t c : zero_counts_) sum += c;
      LOOM_CHECK(at == dpo.shard_begin() && sum == trained_model().params().total(),
                 "ZeRO learners: the shards do not tile the ", trained_model().params().total(),
                 " parameters in rank order");
    }
    // A restore writes the whole model (and, with a shard or under ZeRO, the whole optimizer
    // state, cut below).
    StepEngine& engine = learner_->engine().engine();
    LossScaler* scaler = engine.loss_scaling() ? &engine.scaler() : nullptr;
    step_ = first_ = !restore       ? 0
                     : whole_optim_ ? restore(policy, *whole_optim_, scaler)
                                    : restore_learner(restore, policy, *learner_);
    LOOM_CHECK(mo.steps >= first_, "the run starts at step ", first_, ", past its ", mo.steps,
               " steps");
    if (L_ > 1) {
      // Data parallelism needs every learner at the same step with the same weights.
      const int64_t hi = learners_->all_reduce_scalar(first_, comm::ReduceOp::Max),
                    lo = -learners_->all_reduce_scalar(-first_, comm::ReduceOp::Max);
      LOOM_CHECK(lo == hi, "learner ranks restored different steps (", lo, " to ", hi, ")");
      learners_->broadcast(policy.params().host_data("broadcasting the weights to the learners"),
                           policy.params().total(), DType::F32, 0);
    }
    if (model_parallel) {
      extract_shard(policy.params(), shard_->params());
      if (restore) extract_shard_state(*whole_optim_, learner_->optimizer(), shard_->params());
      // The shard's copy again from its master (rounded to the compute type), its GEMMs' too.
      learner_->engine().weights_restored();
      if (!gather_) whole_optim_.reset();  // only learner 0's gathering group assembles it
    } else if (opt_.zero >= 1) {
      if (restore) {
        cut_zero_state();
        learner_->engine().weights_restored();
      }
      if (rank_ != 0) whole_optim_.reset();  // learner 0 alone saves
    }
    // The whole policy (rounded to the compute type) before the first weights go out.
    gather_whole(false);
    if (rank_ == 0) {
      // A resume's buffered groups are trained on first; the rollout ranks generate from the
      // step after the last of them, which they learn first (before any weights).
      int64_t gen = check_resume_buffer(mo_.resume_buffer, step_, opt_.prompts_per_step);
      for (BufferedStep& b : mo_.resume_buffer) {
        if (b.target_step >= mo_.steps) continue;  // past a resumed run's (smaller) --steps
        RolloutBatch rb;
        // The buffer keeps one drop count per step; a step a partial-rollout run marked
        // complete holds fewer groups, and the learner must not wait for the rest.
        rb.dropped_timeout =
            opt_.partial_tokens > 0
                ? b.dropped
                : std::max<int64_t>(b.dropped, opt_.prompts_per_step - int64_t(b.groups.size()));
        rb.groups = std::move(b.groups);
        ready_[b.target_step] = {std::move(rb), K_};
      }
      mo_.resume_buffer.clear();
      gen = std::min(gen, mo_.steps);
      comm::Work w = sync_->broadcast_async(&gen, 1, DType::I64, 0);
      wait_work(w, "every rollout rank to take the first step to generate");
      // Partial rollouts: the checkpoint's unfinished groups, which their rollout ranks continue
      // in their first batch (step gen); kept as what the ranks carried after step gen - 1.
      check_resume_carry(mo_.resume_carry, gen, opt_.partial_tokens);
      RolloutBatch carry;
      carry.groups = std::move(mo_.resume_carry);
      mo_.resume_carry.clear();
      std::vector<uint8_t> msg = encode_trajectories(carry, gen);
      int64_t size = int64_t(msg.size());
      w = sync_->broadcast_async(&size, 1, DType::I64, 0);
      wait_work(w, "every rollout rank to take the size of the unfinished groups");
      w = sync_->broadcast_async(msg.data(), size, DType::U8, 0);
      wait_work(w, "every rollout rank to take the unfinished groups");
      auto& kept = carries_[gen - 1];
      kept.resize(size_t(K_ + 1));
      for (PromptGroup& g : carry.groups)
        kept[size_t(1 + int(g.task_index % uint64_t(opt_.prompts_per_step)) % K_)].push_back(
            std::move(g));
      // Every rollout rank sends every step's message to rank 0: one header receive posted per
      // rank, re-posted as each message arrives.
      headers_.assign(size_t(K_ + 1), std::vector<int64_t>(2, 0));
      hwork_.resize(size_t(K_ + 1));
      next_.assign(size_t(K_ + 1), gen);
      if (gen < mo_.steps)
        for (int r = 1; r <= K_; ++r)
          hwork_[size_t(r)] =
              world_.recv_async(headers_[size_t(r)].data(), 2, DType::I64, r, kTagHeader);
      broadcast_weights();
      progress_broadcasts(0);  // the first weights reach every rollout rank before anything else
    }
  } else {
    // The rollout ranks sample from the policy in its compute type, with its GEMMs (a bf16
    // policy: bf16 activations, and the bf16 GEMMs on an AVX512-BF16 CPU), as the one-process
    // rollouts do; the weights they receive are the learner's, rounded to that type.
    LOOM_CHECK(policy.act_dtype() == opt_.precision.compute, rollout_name(rank_),
               ": the policy computes in ", dtype_name(policy.act_dtype()),
               ", but precision.policy = \"", opt_.precision.name, "\" computes in ",
               dtype_name(opt_.precision.compute));
    if (opt_.precision.compute == DType::BF16 && policy.backend().host_accessible())
      rollout_recipes_.bf16 = attach_bf16_gemms(policy, true);
    rollout_ = std::make_unique<RolloutWorker>(policy, tok, chat, env, opt_);
    int64_t gen = 0;
    comm::Work w = sync_->broadcast_async(&gen, 1, DType::I64, 0);
    wait_work(w, "the learner's first step to generate");
    // A resume's unfinished groups (partial rollouts): this rank continues its share.
    int64_t size = 0;
    w = sync_->broadcast_async(&size, 1, DType::I64, 0);
    wait_work(w, "the size of the learner's unfinished groups");
    LOOM_CHECK(size > 0 && size < (int64_t(1) << 40), rollout_name(rank_),
               ": the learner announced unfinished groups of ", size, " bytes");
    std::vector<uint8_t> msg(static_cast<size_t>(size));
    w = sync_->broadcast_async(msg.data(), size, DType::U8, 0);
    wait_work(w, "the learner's unfinished groups");
    int64_t target = -1;
    RolloutBatch carry = decode_trajectories(msg, "learner rank 0", &target);
    LOOM_CHECK(target == gen, rollout_name(rank_), ": unfinished groups of step ", target,
               " for a first step ", gen);
    for (PromptGroup& g : carry.groups)
      if (int(g.task_index % uint64_t(opt_.prompts_per_step)) % K_ == rank_ - 1)
        carry_.push_back(std::move(g));
    wbuf_.payload.resize(size_t(bytes));
    post_weight_broadcasts();
    wait_work(wvwork_, "the learner's first weight version");
    wait_work(wwork_, "the learner's first weights");
    apply_weights();
    step_ = first_ = gen;
  }
  last_step_end_ = now_seconds();
}

MpiGrpo::~MpiGrpo() {
  // The learner's engine holds the shard's hooks and the groups declared after it: it goes first.
  learner_.reset();
  // A rollout rank's bf16 GEMMs leave the policy, which outlives them.
  if (rollout_recipes_.bf16)
    for (const auto& l : policy_.linears()) policy_.attach_recipe(l.name, nullptr);
}

void MpiGrpo::setup_model_parallel() {
  // Learner i is TP rank i % T of data-parallel group d = i / T, and group d is EP rank d % E of
  // expert-data-parallel group d / E (the trainer's order: comm/process_groups.h).
  const int tr = li_ % T_, d = li_ / T_, er = d % E_, ed = d / E_;
  // Collective over the learners, in this order: the TP group (T consecutive learners), the
  // data-parallel group (the same TP rank in every TP group); with EP the EP group (E
  // consecutive data-parallel groups), the expert-data-parallel group (the same EP rank in every
  // EP group), and the first T x E learners, which hold every element between them.
  tp_ = learners_->split(d, tr, "rl-learner-tp");
  dp_ = learners_->split(tr, d, "rl-learner-dp");
  comm::Communicator* gather_group = tp_.get();
  if (E_ > 1) {
    ep_ = learners_->split(tr + T_ * ed, er, "rl-learner-ep");
    edp_ = learners_->split(tr + T_ * er, ed, "rl-learner-edp");
    whole_ = learners_->split(ed == 0 ? 0 : 1, li_, "rl-learner-whole");
    gather_group = whole_.get();
  }
  TensorParallel tp;
  if (T_ > 1) {
    tp.size = T_;
    tp.rank = tr;
    tp.comm = tp_.get();
    tp.sequence_parallel = mo_.learner_sp;
    tp = parallel::with_tensor_parallel_ops(tp);  // the layers' communication over that group
  }
  ExpertParallel ep;
  const int etp = mo_.learner_etp;
  if (E_ > 1) {
    ep.size = E_;
    ep.rank = er;
    ep.comm = ep_.get();
  }
  ep.tp_size = etp;
  ep.tp_rank = tr % etp;
  if (etp == T_ && etp > 1) {
    ep.tp_comm = tp_.get();
  } else if (etp > 1) {
    ep.tp_owner = tp_->split(tr / etp, tr % etp, "rl-learner-etp");
    ep.tp_comm = ep.tp_owner.get();
  }
  ep.make_exchange = &parallel::make_expert_exchange;
  // The shard computes in the policy's type: the engine keeps its fp32 master and rounds the
  // shard's copy from it, as for one learner (and as the trainer's TP / EP layouts).
  shard_ = std::make_unique<Decoder>(policy_.config(), cpu_backend(), Recompute::None,
                                     opt_.precision.compute, tp, ep);
  // The starting weights: the reference model (beta > 0) copies them from the shard.
  extract_shard(policy_.params(), shard_->params());
  whole_optim_ =
      std::make_unique<AdamW>(policy_.params(), opt_.adam, opt_.precision.compute, cpu_backend());
  if (ed == 0)  // with E = 1: learner 0's TP group
    gather_ = std::make_unique<TpGather>(shard_->params(), *gather_group,
                                         owned_params(shard_->params(), tr, etp, er));
}

bool MpiGrpo::checkpoint_step() const {
  return step_ == mo_.steps || (mo_.save_every > 0 && step_ % mo_.save_every == 0);
}

void MpiGrpo::gather_whole(bool state) {
  if (opt_.zero == 3) gather_zero3_weights();
  if (opt_.zero >= 1 && state && checkpoint_step()) gather_zero_state();
  if (!gather_) return;
  ParamSet& sh = shard_->params();
  ParamSet& whole = policy_.params();
  gather_->gather([&](const ParamInfo& p) { return sh.data() + p.offset; },
                  [&](const ParamInfo& p) { return whole.ptr(p.name); });
  if (state && checkpoint_step()) gather_->gather_state(learner_->optimizer(), *whole_optim_);
}

void MpiGrpo::gather_zero3_weights() {
  parallel::DataParallel& dpo = learner_->optimizer();
  const ParamSet& sp = shard_->params();
  float* w = policy_.params().host_data("gathering the ZeRO-3 learners' weights");
  // This learner's master shard (contiguous from shard_begin), rounded as the engine rounds the
  // copy it gathers for the forward, then every learner's.
  for (const StateSlice& s : dpo.param_slices())
    std::memcpy(w + sp.info(s.name).offset + s.offset, s.tensor.data<float>(),
                sizeof(float) * size_t(s.tensor.numel()));
  const int64_t lo = dpo.shard_begin(), hi = dpo.shard_end();
  if (opt_.precision.compute != DType::F32 && hi > lo)
    policy_.backend().round_to(opt_.precision.compute, w + lo, hi - lo, nullptr);
  learners_->all_gather(w, zero_counts_, DType::F32);
}

void MpiGrpo::gather_zero_state() {
  parallel::DataParallel& dpo = learner_->optimizer();
  const ParamSet& sp = trained_model().params();
  std::map<std::string, Tensor> whole;
  if (whole_optim_) whole = whole_optim_->state_tensors();
  std::vector<float> buf(size_t(sp.total()), 0.f);
  const std::vector<StateSlice> slices = dpo.state_slices();
  // Every learner gathers the same buffers: the moments, and the master under bf16 / fp16 (an
  // fp32 ZeRO-3 shard's master is the weights, which the checkpoint holds already).
  std::vector<std::string> kinds = {"exp_avg.", "exp_avg_sq."};
  if (opt_.precision.compute != DType::F32) kinds.push_back("master.");
  for (const std::string& kind : kinds) {
    for (const StateSlice& s : slices)
      if (s.name.rfind(kind, 0) == 0)
        std::memcpy(buf.data() + sp.info(s.name.substr(kind.size())).offset + s.offset,
                    s.tensor.data<float>(), sizeof(float) * size_t(s.tensor.numel()));
    learners_->all_gather(buf.data(), zero_counts_, DType::F32);
    if (whole_optim_)
      for (const ParamInfo& p : sp.infos())
        std::memcpy(whole.at(kind + p.name).data<float>(), buf.data() + p.offset,
                    sizeof(float) * size_t(p.numel));
  }
  if (whole_optim_) whole_optim_->set_steps_taken(dpo.steps_taken());
}

void MpiGrpo::cut_zero_state() {
  parallel::DataParallel& dpo = learner_->optimizer();
  std::map<std::string, Tensor> whole = whole_optim_->state_tensors();
  ParamSet& weights = policy_.params();
  for (const StateSlice& s : dpo.state_slices()) {
    auto it = whole.find(s.name);
    const float* src = nullptr;
    if (it != whole.end()) {
      src = it->second.data<float>();
    } else {
      // An fp32 ZeRO-3 master: the restored weights themselves.
      LOOM_CHECK(s.name.rfind("master.", 0) == 0, "ZeRO learners: the checkpoint has no ", s.name);
      src = weights.ptr(s.name.substr(7));
    }
    std::memcpy(s.tensor.data<float>(), src + s.offset, sizeof(float) * size_t(s.tensor.numel()));
  }
  dpo.set_steps_taken(whole_optim_->steps_taken());
}

std::string MpiGrpo::rollout_name(int r) const {
  return cat("rollout rank ", world_.world_rank_of(r));
}

void MpiGrpo::wait_work(comm::Work& w, const std::string& what, double timeout) {
  if (timeout <= 0) timeout = mo_.learner_timeout;
  const double deadline = now_seconds() + timeout;
  while (!w.test()) {
    LOOM_CHECK(
        now_seconds() < deadline,
        is_learner() ? cat("learner rank ", world_.world_rank_of(rank_)) : rollout_name(rank_),
        ": waited ", timeout, " s (--learner-timeout) for ", what);
    nap();
  }
}

void MpiGrpo::broadcast_weights() {
  Inflight f;
  f.weights = pack_weights(policy_.params(), mo_.weight_dtype, step_);
  // The version from heap memory, which stays put when `f` moves into the queue.
  f.header = {f.weights.version};
  f.header_work = sync_->broadcast_async(f.header.data(), 1, DType::I64, 0);
  f.work = sync_->broadcast_async(f.weights.payload.data(), int64_t(f.weights.payload.size()),
                                  DType::U8, 0);
  hashes_.push_back({step_, weights_hash(policy_.params(), mo_.weight_dtype)});
  sends_.push_back(std::move(f));
}

void MpiGrpo::progress_broadcasts(size_t keep) {
  while (!sends_.empty() && sends_.front().header_work.test() && sends_.front().work.test())
    sends_.pop_front();
  while (sends_.size() > keep) {
    const int64_t v = sends_.front().weights.version;
    wait_work(sends_.front().header_work, cat("every rollout rank to take weight version ", v));
    wait_work(sends_.front().work, cat("every rollout rank to take weight version ", v));
    sends_.pop_front();
  }
}

RlStepStats MpiGrpo::step() {
  LOOM_CHECK(is_learner(), "MpiGrpo::step runs on the learner ranks");
  LOOM_CHECK(step_ < mo_.steps, "learner step ", step_, " is past the run's ", mo_.steps, " steps");
  RlStepStats st;
  st.step = step_;
  const double t0 = now_seconds();
  RolloutBatch all;  // this step's groups, in prompt order, and the counts
  if (rank_ == 0) {
    all = receive_step(&st);
    // A checkpoint keeps the unfinished groups of step_ - 1 at the oldest.
    carries_.erase(carries_.begin(), carries_.lower_bound(step_ - 1));
  } else {
    // Learner 0 sends every learner the step's groups; its own wait for them is bounded by
    // learner_timeout, so twice that here.
    int64_t size = 0;
    comm::Work w = learners_->broadcast_async(&size, 1, DType::I64, 0);
    wait_work(w, cat("learner rank 0's groups of step ", step_), 2 * mo_.learner_timeout);
    std::vector<uint8_t> bytes(size_t(std::max<int64_t>(size, 0)));
    w = learners_->broadcast_async(bytes.data(), size, DType::U8, 0);
    wait_work(w, cat("learner rank 0's groups of step ", step_), 2 * mo_.learner_timeout);
    int64_t target = -1;
    all = decode_trajectories(bytes, "learner rank 0", &target);
    LOOM_CHECK(target == step_, "learner step ", step_, ": learner rank 0 sent the groups of step ",
               target);
  }
  if (rank_ == 0 && L_ > 1) {
    const std::vector<uint8_t> bytes = encode_trajectories(all, step_);
    int64_t size = int64_t(bytes.size());
    learners_->broadcast(&size, 1, DType::I64, 0);
    learners_->broadcast(const_cast<uint8_t*>(bytes.data()), size, DType::U8, 0);
  }
  st.learner_wait_seconds = now_seconds() - t0;
  // Data-parallel group d of D trains on groups d, d + D, d + 2D, ... of the step (all of them
  // with one group); without TP each learner is a group.
  const int me = li_ / T_;
  std::vector<PromptGroup> share;
  for (size_t j = 0; j < all.groups.size(); ++j)
    if (int(j % size_t(D_)) == me) share.push_back(std::move(all.groups[j]));
  if (mo_.before_learn) mo_.before_learn(step_);
  learner_->learn(share, step_, &st);
  ++step_;
  gather_whole(true);  // the whole policy for the weight sync, evaluation and saves
  if (rank_ == 0) {
    // The new weights to the rollout ranks (not after the last step: nobody generates then).
    if (step_ < mo_.steps) broadcast_weights();
    progress_broadcasts(size_t(mo_.max_staleness) + 2);
  }
  const double t1 = now_seconds();
  const double wall = std::max(t1 - last_step_end_, 1e-9);
  st.rollout_seconds = all.seconds;
  st.rollout_utilisation = all.seconds / double(K_) / wall;
  st.generation_tokens_per_s = double(all.generated_tokens) / std::max(all.seconds, 1e-9);
  st.learner_utilisation = (t1 - t0 - st.learner_wait_seconds) / wall;
  st.dropped_timeout = all.dropped_timeout;
  st.dropped_env = all.dropped_env;
  last_step_end_ = t1;
  return st;
}

void MpiGrpo::receive_until(int64_t until) {
  until = std::min(until, mo_.steps);
  const double deadline = now_seconds() + mo_.learner_timeout;
  // Per rollout rank: 0 header pending, 1 payload pending. A payload completes one message and
  // re-posts the header receive of the rank's next one.
  std::vector<int> state(size_t(K_ + 1), 0);
  std::vector<std::vector<uint8_t>> payload(static_cast<size_t>(K_ + 1));
  std::vector<comm::Work> pwork(static_cast<size_t>(K_ + 1));
  auto behind = [&] {
    int n = 0;
    for (int r = 1; r <= K_; ++r) n += next_[size_t(r)] < until;
    return n;
  };
  while (behind() > 0) {
    bool moved = false;
    for (int r = 1; r <= K_; ++r) {
      if (next_[size_t(r)] >= until) continue;
      if (state[size_t(r)] == 0 && hwork_[size_t(r)].test()) {
        const auto& h = headers_[size_t(r)];
        LOOM_CHECK(h[0] == next_[size_t(r)] && h[1] > 0 && h[1] < (int64_t(1) << 31),
                   "learner step ", step_, ": ", rollout_name(r), " announced a message for step ",
                   h[0], " of ", h[1], " bytes (expected step ", next_[size_t(r)], ")");
        payload[size_t(r)].resize(size_t(h[1]));
        pwork[size_t(r)] =
            world_.recv_async(payload[size_t(r)].data(), h[1], DType::U8, r, kTagPayload);
        state[size_t(r)] = 1;
        moved = true;
      }
      if (state[size_t(r)] == 1 && pwork[size_t(r)].test()) {
        const int64_t want = next_[size_t(r)];
        int64_t target = -1;
        RolloutBatch b = decode_trajectories(payload[size_t(r)], rollout_name(r), &target);
        LOOM_CHECK(target == want, "learner step ", step_, ": ", rollout_name(r),
                   " sent the groups of step ", target, " (expected step ", want, ")");
        auto& [all, ranks] = ready_[want];
        for (PromptGroup& g : b.groups) {
          LOOM_CHECK(int(g.task_index % uint64_t(opt_.prompts_per_step)) % K_ == r - 1,
                     "learner step ", step_, ": ", rollout_name(r), " sent task ", g.task_index,
                     ", another rank's share");
          all.groups.push_back(std::move(g));
        }
        if (opt_.partial_tokens > 0) {
          auto& kept = carries_[want];
          kept.resize(size_t(K_ + 1));
          kept[size_t(r)] = std::move(b.carried);
        }
        all.dropped_timeout += b.dropped_timeout;
        all.dropped_env += b.dropped_env;
        all.generated_tokens += b.generated_tokens;
        all.seconds += b.seconds;
        ++ranks;
        state[size_t(r)] = 0;
        moved = true;
        // The next step's header may already be on its way.
        if (++next_[size_t(r)] < mo_.steps)
          hwork_[size_t(r)] =
              world_.recv_async(headers_[size_t(r)].data(), 2, DType::I64, r, kTagHeader);
      }
    }
    progress_broadcasts(sends_.size());  // drives MPI's progress on the weights in flight
    if (!moved && behind() > 0) {
      if (now_seconds() > deadline) {
        std::string silent;
        for (int r = 1; r <= K_; ++r)
          if (next_[size_t(r)] < until)
            silent += cat(silent.empty() ? "" : ", ", world_.world_rank_of(r),
                          state[size_t(r)] == 0 ? " (nothing)" : " (header only)");
        fail("learner step ", step_, ": waited ", mo_.learner_timeout,
             " s (--learner-timeout) for the rollout groups of ",
             until == step_ + 1 ? std::string("this step")
                                : cat("steps up to ", until - 1, " (for a checkpoint)"),
             "; no message from rollout rank(s) ", silent, ": stalled or dead");
      }
      nap();
    }
  }
}

RolloutBatch MpiGrpo::receive_step(RlStepStats* stp) {
  RlStepStats& st = *stp;
  // 1. One message of this step from every rollout rank (possibly received already, for a
  // checkpoint, or restored from one).
  receive_until(step_ + 1);
  auto it = ready_.find(step_);
  LOOM_CHECK(it != ready_.end() && it->second.second == K_, "learner step ", step_,
             ": the groups of this step are missing");
  RolloutBatch all = std::move(it->second.first);
  ready_.erase(it);
  std::vector<PromptGroup>& groups = all.groups;
  // 2. The groups in prompt order (the order of the synchronous run), through the replay buffer
  // so that the staleness bound is checked and the drops are counted as in the other modes.
  std::sort(groups.begin(), groups.end(),
            [](const PromptGroup& a, const PromptGroup& b) { return a.task_index < b.task_index; });
  const ReplayStats before = buffer_.stats();
  if (opt_.partial_tokens > 0) {
    // Partial rollouts: the step holds the groups that finished for it (possibly fewer or more
    // than its prompts); those past the bound are dropped as stale.
    buffer_.push_step(step_, std::move(groups), all.dropped_timeout, all.dropped_env);
  } else {
    for (PromptGroup& g : groups) buffer_.push(std::move(g));
    buffer_.drop(step_, all.dropped_timeout, true);
    buffer_.drop(step_, all.dropped_env, false);
  }
  groups = buffer_.take(step_, opt_.prompts_per_step, 0);
  st.dropped_stale = buffer_.stats().dropped_stale - before.dropped_stale;
  return all;
}

std::vector<BufferedStep> MpiGrpo::buffer_contents(std::vector<PromptGroup>* carried) {
  std::vector<BufferedStep> out;
  if (carried) carried->clear();
  if (rank_ != 0) return out;
  receive_until(step_ + lead_);
  if (carried && opt_.partial_tokens > 0) {
    // Cut by the rollout ranks' batches of the last step kept (or, with none kept, the last
    // trained on): what their next batch (the first a resume generates) continues.
    const int64_t last = std::min(step_ + lead_, mo_.steps) - 1;
    auto it = carries_.find(last);
    LOOM_CHECK(last < first_ || it != carries_.end(), "checkpoint after step ", step_,
               ": the unfinished groups of step ", last, " are missing");
    if (it != carries_.end())
      for (auto& per_rank : it->second)
        carried->insert(carried->end(), per_rank.begin(), per_rank.end());
  }
  for (const auto& [s, entry] : ready_) {
    LOOM_CHECK(s >= step_ && entry.second == K_, "checkpoint after step ", step_,
               ": the groups of step ", s, " are incomplete");
    BufferedStep b;
    b.target_step = s;
    b.groups = entry.first.groups;
    std::sort(b.groups.begin(), b.groups.end(), [](const PromptGroup& x, const PromptGroup& y) {
      return x.task_index < y.task_index;
    });
    b.dropped = entry.first.dropped_timeout + entry.first.dropped_env;
    b.complete = opt_.partial_tokens > 0;  // it may hold fewer groups than the step's prompts
    out.push_back(std::move(b));
  }
  return out;
}

void MpiGrpo::finish() {
  if (rank_ == 0) progress_broadcasts(0);
}

void MpiGrpo::post_weight_recv() {
  // The learner broadcasts versions first_ .. steps - 1.
  if (have_ + 1 >= mo_.steps) return;
  post_weight_broadcasts();
}

void MpiGrpo::post_weight_broadcasts() {
  wvwork_ = sync_->broadcast_async(&wbuf_.version, 1, DType::I64, 0);
  wwork_ =
      sync_->broadcast_async(wbuf_.payload.data(), int64_t(wbuf_.payload.size()), DType::U8, 0);
  wpending_ = true;
}

void MpiGrpo::apply_weights() {
  const int64_t v = unpack_weights(wbuf_, mo_.weight_dtype, policy_.params());
  LOOM_CHECK(hashes_.empty() || v == have_ + 1, rollout_name(rank_), ": received weight version ",
             v, " after version ", have_);
  have_ = v;
  wpending_ = false;
  // The hash of what this rank now holds, recomputed from its model (not from the message).
  hashes_.push_back({v, weights_hash(policy_.params(), mo_.weight_dtype)});
  rollout_recipes_.new_weights();
  rollout_->weights_updated();
  post_weight_recv();
}

void MpiGrpo::run_rollout() {
  LOOM_CHECK(!is_learner(), "MpiGrpo::run_rollout runs on the rollout ranks");
  const int K = K_, part = rank_ - 1;
  for (int64_t s = first_; s < mo_.steps; ++s) {
    // Newer weights between batches, as many as have arrived; then wait (bounded) while the
    // weights held are too old for step s.
    if (!mo_.fixed_lag)
      while (wpending_ && wvwork_.test() && wwork_.test()) apply_weights();
    while (s - have_ > lead_) {
      LOOM_CHECK(wpending_, rollout_name(rank_), ": no weight version ", s - lead_,
                 " will come (the run ends at ", mo_.steps, ")");
      wait_work(wvwork_, cat("weight version ", have_ + 1, " (step ", s, " needs version ",
                             s - lead_, " or newer)"));
      wait_work(wwork_, cat("weight version ", have_ + 1, " (step ", s, " needs version ",
                            s - lead_, " or newer)"));
      apply_weights();
    }
    maybe_inject_fault(world_.world_rank_of(rank_), s);
    if (mo_.before_rollout) mo_.before_rollout(s);
    // Partial rollouts: carried groups already past the bound at step s are not worth
    // continuing; they go with the batch, and the learner drops and counts them as stale.
    std::vector<PromptGroup> too_old, keep;
    for (PromptGroup& g : carry_)
      (s - g.version > mo_.max_staleness ? too_old : keep).push_back(std::move(g));
    carry_.swap(keep);
    RolloutBatch b =
        rollout_->generate(s, have_, part, K, opt_.partial_tokens > 0 ? &carry_ : nullptr);
    for (PromptGroup& g : too_old) {
      g.target_step = s;
      b.groups.push_back(std::move(g));
    }
    if (opt_.partial_tokens > 0) b.carried = carry_;  // for the learner's checkpoints
    ages_.push_back(s - have_);
    Inflight f;
    f.bytes = encode_trajectories(b, s);
    f.header = {s, int64_t(f.bytes.size())};
    f.header_work = world_.send_async(f.header.data(), 2, DType::I64, 0, kTagHeader);
    f.work = world_.send_async(f.bytes.data(), int64_t(f.bytes.size()), DType::U8, 0, kTagPayload);
    sends_.push_back(std::move(f));
    while (!sends_.empty() && sends_.front().header_work.test() && sends_.front().work.test())
      sends_.pop_front();
  }
  // Every broadcast the learner makes must be taken, or it would wait for this rank.
  while (wpending_) {
    wait_work(wvwork_, cat("weight version ", have_ + 1, " (the run's last)"));
    wait_work(wwork_, cat("weight version ", have_ + 1, " (the run's last)"));
    apply_weights();
  }
  while (!sends_.empty()) {
    wait_work(sends_.front().header_work,
              cat("the learner to take the header of step ", sends_.front().header[0]));
    wait_work(sends_.front().work,
              cat("the learner to take the groups of step ", sends_.front().header[0]));
    sends_.pop_front();
  }
}

}  // namespace loom::rl
