#include "parallel/data_parallel.h"

#include <algorithm>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"

namespace loom::parallel {

DataParallelOptions DataParallelOptions::from(const Config& cfg) {
  DataParallelOptions o;
  o.zero = get_int32(cfg, "parallel.zero", o.zero);
  double mb = cfg.get_double("parallel.bucket_mb", 4.0);
  o.overlap = cfg.get_bool("parallel.overlap_grad_reduce", o.overlap);
  LOOM_CHECK(o.zero >= 0 && o.zero <= 3, "parallel.zero must be 0, 1, 2 or 3, got ", o.zero);
  LOOM_CHECK(mb > 0, "parallel.bucket_mb must be positive, got ", mb);
  const std::string reduce = cfg.get_string("parallel.grad_reduce_dtype", "fp32");
  LOOM_CHECK(reduce == "fp32" || reduce == "bf16",
             "parallel.grad_reduce_dtype must be \"fp32\" or \"bf16\", got \"", reduce, "\"");
  o.grad_reduce_dtype = reduce == "bf16" ? DType::BF16 : DType::F32;
  o.bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / 4));
  return o;
}

static int block_of(const std::string& name) {  // "blocks.<l>.…" -> l, else -1
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

DataParallel::DataParallel(Decoder& model, comm::Communicator& dp, const DataParallelOptions& opt,
                           const AdamWConfig& adam, DType param_dtype, Backend& backend,
                           comm::Communicator* expert_dp, ParamSet* trained)
    : model_(model),
      P_(trained ? *trained : model.params()),
      dp_(dp),
      opt_(opt),
      param_dtype_(param_dtype),
      be_(backend),
      n_layer_(model.config().n_layer) {
  LOOM_CHECK(opt.zero >= 0 && opt.zero <= 3, "parallel.zero must be 0..3, got ", opt.zero);
  LOOM_CHECK(opt.grad_reduce_dtype == DType::F32 || opt.grad_reduce_dtype == DType::BF16,
             "parallel.grad_reduce_dtype must be fp32 or bf16, got ",
             dtype_name(opt.grad_reduce_dtype));
  // The experts' gradients are all-reduced over their own group, in fp32 only.
  LOOM_CHECK(opt.grad_reduce_dtype == DType::F32 || model.expert_parallel().size <= 1,
             "parallel.grad_reduce_dtype = \"bf16\" with expert parallelism (parallel.ep = ",
             model.expert_parallel().size, ") is not implemented: use \"fp32\"");
  LOOM_CHECK(!trained || opt.zero <= 2, "parallel.zero = ", opt.zero,
             " over a separate trained parameter set (LoRA adapters): use ZeRO 0, 1 or 2");
  LOOM_CHECK(!trained || model.expert_parallel().size <= 1,
             "a separate trained parameter set (LoRA adapters) under expert parallelism");
  LOOM_CHECK(!trained || !opt.init_seed,
             "a separate trained parameter set (LoRA adapters) arrives initialised");
  total_ = P_.total();
  if (model.expert_parallel().size > 1) {
    // The decoder puts every expert weight after the other parameters.
    LOOM_CHECK(expert_dp, "expert parallelism needs the expert-data-parallel group");
    edp_ = expert_dp;
    expert_lo_ = total_;
    for (const ParamInfo& p : P_.infos())
      if (p.expert) expert_lo_ = std::min(expert_lo_, p.offset);
    for (const ParamInfo& p : P_.infos())
      LOOM_CHECK(p.expert == (p.offset >= expert_lo_), p.name,
                 ": expert weights must follow every other parameter");
    expert_hi_ = total_;
    total_ = expert_lo_;
    // ZeRO-3 shards the experts over edp_ like the dense part over dp_; otherwise every rank of
    // edp_ steps them whole.
    eshards_ = FlatShards(expert_lo_, expert_hi_ - expert_lo_, opt_.zero == 3 ? edp_->size() : 1);
    const int er = opt_.zero == 3 ? edp_->rank() : 0;
    elo_ = eshards_.begin(er);
    ehi_ = eshards_.end(er);
    expert_adam_ = std::make_unique<AdamW>(P_, adam, param_dtype_, be_, elo_, ehi_, opt_.zero == 3);
    if (opt_.zero == 3 && ehi_ > elo_)
      egshard_ = BackendBuffer::zeroed(be_, sizeof(float) * size_t(ehi_ - elo_), "gradients");
  }
  shards_ = FlatShards(0, total_, dp_.size());
  lo_ = shards_.begin(dp_.rank());
  hi_ = shards_.end(dp_.rank());
  // ZeRO-0 steps every dense parameter on every rank, ZeRO >= 1 this rank's shard.
  adam_ = opt_.zero == 0
              ? std::make_unique<AdamW>(P_, adam, param_dtype_, be_, 0, total_, false)
              : std::make_unique<AdamW>(P_, adam, param_dtype_, be_, lo_, hi_, opt_.zero == 3);
  if (opt_.zero >= 1)
    gatherer_ = std::make_unique<ParamGatherer>(model_, P_, dp_, shards_, *adam_, opt_.zero == 3,
                                                edp_, experts_sharded() ? &eshards_ : nullptr,
                                                experts_sharded() ? expert_adam_.get() : nullptr);
  if (opt_.init_seed) draw_initial_weights(*opt_.init_seed);
  // The master copies start from the model's weights, except a ZeRO-3 shard drawn in place.
  if (!(opt_.zero == 3 && opt_.init_seed)) {
    adam_->sync_master_from_model();
    if (expert_adam_) expert_adam_->sync_master_from_model();
  }
  if (opt_.zero >= 1 && hi_ > lo_)
    gshard_ = BackendBuffer::zeroed(be_, sizeof(float) * size_t(hi_ - lo_), "gradients");

  // Per parameter, the backward stage after which its gradient is final: blocks last to first,
  // then the embeddings; the head and final norm at stage 0.
  std::vector<int> stages;
  for (const ParamInfo& p : P_.infos()) {
    int b = block_of(p.name);
    stages.push_back(b >= 0 ? n_layer_ - 1 - b : p.name.rfind("embed.", 0) == 0 ? n_layer_ : 0);
  }
  reducer_ = std::make_unique<GradReducer>(P_, dp_, shards_, opt_.zero, opt_.bucket_elems,
                                           opt_.overlap, opt_.grad_reduce_dtype, be_,
                                           opt_.zero >= 1 ? gshard_.as<float>() : nullptr, stages);
  grads_ready_id_ = model_.on_grads_ready.subscribe(
      [this](int layer) { reducer_->on_ready(layer >= 0 ? n_layer_ - 1 - layer : n_layer_); });
  if (opt_.zero >= 2) release_memory(be_, P_.grad(), total_);
  if (experts_sharded()) release_memory(be_, P_.grad() + expert_lo_, expert_hi_ - expert_lo_);
  // ZeRO-3: a model initialised outside holds every block; keep only the gathered parameters.
  // (Drawn here, the blocks' pages were never written.)
  if (opt_.zero == 3 && !opt_.init_seed) gatherer_->release_blocks();
}

DataParallel::~DataParallel() {
  reducer_.reset();   // waits for the reductions in flight
  gatherer_.reset();  // and the gathers; unhooks the blocks
  model_.on_grads_ready.unsubscribe(grads_ready_id_);
}

void DataParallel::draw_initial_weights(uint64_t seed) {
  // (A Backend op: the weights and the master shard are the backend's memory.)
  auto round = [&](float* p, int64_t n) {
    if (param_dtype_ != DType::F32 && n > 0) be_.round_to(param_dtype_, p, n, nullptr);
  };
  if (opt_.zero < 3) {
    P_.init(seed);
    round(P_.data(), P_.total());
    return;
  }
  // Blocks are gathered from the owners' master shards on use: draw the shard straight into the
  // master, and into the model only the parameters that stay gathered.
  P_.init_ranges(seed, gatherer_->resident_ranges());
  for (auto [lo, hi] : gatherer_->resident_ranges()) round(P_.data() + lo, hi - lo);
  P_.draw_to_backend(seed, lo_, hi_, adam_->master());
  round(adam_->master(), hi_ - lo_);
  if (experts_sharded()) {
    P_.draw_to_backend(seed, elo_, ehi_, expert_adam_->master());
    round(expert_adam_->master(), ehi_ - elo_);
  }
}

bool DataParallel::reduces_now() const {
  return opt_.zero >= 2 || micro_ == micros_ - 1;
}

void DataParallel::start_step(int micro_batches) {
  LOOM_CHECK(micro_batches > 0, "a step needs at least one micro-batch");
  micros_ = micro_batches;
  if (opt_.zero <= 1) P_.zero_grad();  // ZeRO-2/3 keep the full buffer zero (released)
  // (ZeRO-3 releases the experts' gradients after reducing them: zero, and no pages touched.)
  if (experts_apart() && !experts_sharded())
    be_.fill_bytes(P_.grad() + expert_lo_, 0, size_t(expert_hi_ - expert_lo_) * sizeof(float));
  for (BackendBuffer* b : {&egshard_, &gshard_})
    if (!b->empty()) be_.fill_bytes(b->data(), 0, b->bytes());
}

void DataParallel::start_micro(int m) {
  micro_ = m;
  reducer_->start_micro(reduces_now());
}

void DataParallel::finish_micro() {
  // Expert gradients: summed over the ranks that hold the same experts, once per step (ZeRO-3:
  // into this rank's shard, and the full-size pages released).
  if (experts_sharded() && micro_ == micros_ - 1) {
    static float dummy;
    edp_->reduce_scatter(P_.grad() + expert_lo_, ehi_ > elo_ ? egshard_.as<float>() : &dummy,
                         eshards_.counts_of(expert_lo_, expert_hi_), DType::F32,
                         comm::ReduceOp::Sum);
    release_memory(be_, P_.grad() + expert_lo_, expert_hi_ - expert_lo_);
  } else if (experts_apart() && micro_ == micros_ - 1 && edp_->size() > 1) {
    edp_->all_reduce(P_.grad() + expert_lo_, expert_hi_ - expert_lo_, DType::F32,
                     comm::ReduceOp::Sum);
  }
  reducer_->finish();  // (nothing unless this micro-batch reduces)
}

double DataParallel::grad_sq_local(const std::vector<double>& weights) const {
  P_.settle_grads();  // (lazy zeroing: what no writer overwrote reads zero; usually nothing)
  const float* g = opt_.zero == 0 ? P_.grad() : gshard_.as<float>() - lo_;
  double sum = 0;
  const auto& infos = P_.infos();
  // Consecutive parameters of one weight are summed as one run of the flat buffer: with every
  // weight 1 (one process, plain DP) that is one sum over the owned range, the same summation
  // as a sum over the whole gradient buffer when one rank owns it all.
  int64_t run_lo = 0, run_hi = 0;
  double run_w = 0;
  auto flush = [&] {
    if (run_lo < run_hi && run_w != 0) sum += run_w * be_.sum_squares(g + run_lo, run_hi - run_lo);
    run_lo = run_hi = 0;
  };
  for (size_t i = 0; i < infos.size(); ++i) {
    const double w = weights.empty() ? 1.0 : weights[i];
    const int64_t a = std::max(infos[i].offset, lo_);
    const int64_t b = std::min(infos[i].offset + infos[i].numel, hi_);
    if (a >= b) continue;
    if (w != run_w || a != run_hi) flush();
    if (run_lo == run_hi) run_lo = a, run_w = w;
    run_hi = b;
  }
  flush();
  // ZeRO-3 expert weights: each element on one rank of the expert-data-parallel group.
  if (experts_sharded())
    for (size_t i = 0; i < infos.size(); ++i) {
      const double w = weights.empty() ? 1.0 : weights[i];
      int64_t a = std::max(infos[i].offset, elo_);
      int64_t b = std::min(infos[i].offset + infos[i].numel, ehi_);
      if (infos[i].expert && w != 0 && a < b)
        sum += w * be_.sum_squares(egshard_.as<float>() + (a - elo_), b - a);
    }
  // Otherwise: replicated over the expert-data-parallel group, counted on its rank 0.
  if (experts_apart() && !experts_sharded() && edp_->rank() == 0)
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].expert && (weights.empty() || weights[i] != 0))
        sum += (weights.empty() ? 1.0 : weights[i]) *
               be_.sum_squares(P_.grad() + infos[i].offset, infos[i].numel);
  return sum;
}

void DataParallel::expert_adam(double lr, float gs) {
  if (!experts_apart()) return;
  // [elo_, ehi_): every expert weight here (ZeRO 0-2), or this rank's shard of them (ZeRO-3,
  // whose ranks gather them on use).
  expert_adam_->update(lr, gs, experts_sharded() ? egshard_.as<float>() : P_.grad() + elo_);
  if (!experts_sharded()) expert_adam_->sync_model_from_master();
}

void DataParallel::set_steps_taken(int64_t t) {
  adam_->set_steps_taken(t);
  if (expert_adam_) expert_adam_->set_steps_taken(t);
}

void DataParallel::step(double lr, float grad_scale) {
  P_.settle_grads();  // (lazy zeroing: what no writer overwrote reads zero; usually nothing)
  expert_adam(lr, grad_scale);
  if (opt_.zero == 0) {
    adam_->update(lr, grad_scale, P_.grad());
    adam_->write_model(0, total_);
    return;
  }
  adam_->update(lr, grad_scale, gshard_.as<float>());
  sync_model_from_master();
}

void DataParallel::sync_model_from_master() {
  if (experts_apart() && !experts_sharded()) expert_adam_->sync_model_from_master();
  if (opt_.zero == 0)
    adam_->write_model(0, total_);  // (its range is every dense parameter)
  else
    gatherer_->gather_resident();
}

void DataParallel::sync_master_from_model() {
  if (opt_.zero != 0) return;
  if (!P_.any_fp32_dropped()) return adam_->sync_master_from_model();
  // (load_slices: the dropped parameters were loaded into the master; the kept ones copied.)
  float* master = adam_->master();
  P_.for_runs(0, total_, [&](int64_t a, int64_t b, bool dropped) {
    if (!dropped) be_.copy_d2d(master + a, P_.fp32_storage() + a, sizeof(float) * size_t(b - a));
  });
}

std::vector<StateSlice> DataParallel::load_slices() {
  if (opt_.zero != 0 || !P_.any_fp32_dropped()) return param_slices();
  // ZeRO-0 steps every dense parameter: its master is indexed like the flat buffer.
  float* master = adam_->master();
  LOOM_CHECK(master, "DataParallel::load_slices: dropped fp32 weights without an fp32 master");
  std::vector<StateSlice> out;
  for (const ParamInfo& p : P_.infos()) {
    LOOM_CHECK(!p.fp32_dropped || p.offset + p.numel <= total_, p.name,
               ": an expert weight without fp32 values");
    float* base = p.fp32_dropped ? master : P_.fp32_storage();
    out.push_back({p.name, Tensor::view_of(base + p.offset, p.shape, DType::F32), p.numel, 0});
  }
  return out;
}

std::vector<StateSlice> DataParallel::state_slices() {
  // The dense part's, then the experts' (whole on every edp rank, or under ZeRO-3 this rank's
  // slice of each).
  std::vector<StateSlice> out = adam_->state_slices();
  if (expert_adam_)
    for (StateSlice& s : expert_adam_->state_slices()) out.push_back(std::move(s));
  return out;
}

std::vector<float> DataParallel::reduced_grad_shard() const {
  LOOM_CHECK(opt_.zero >= 1, "reduced_grad_shard: ZeRO-0 keeps the full gradient in the model");
  std::vector<float> g(size_t(hi_ - lo_));
  if (!g.empty()) be_.copy_d2h(g.data(), gshard_.data(), g.size() * sizeof(float));
  return g;
}

std::vector<StateSlice> DataParallel::whole_slices() {
  // (The 2-byte weights keep no fp32 values: widened from the bf16 copy, which holds the master
  // rounded, as the fp32 model did. Read only: a load takes load_slices.)
  std::vector<StateSlice> out;
  for (const ParamInfo& p : P_.infos()) {
    if (!p.fp32_dropped) {
      out.push_back(
          {p.name, Tensor::view_of(P_.fp32_storage() + p.offset, p.shape, DType::F32), p.numel, 0});
      continue;
    }
    const int64_t lo = p.offset, hi = p.offset + p.numel;
    out.push_back(
        {p.name, Tensor::view_of(nullptr, p.shape, DType::F32), p.numel, 0,
         [this, lo, hi](void* dst) { P_.copy_values_to(static_cast<float*>(dst), lo, hi); }});
  }
  return out;
}

std::vector<StateSlice> DataParallel::save_slices() {
  return opt_.zero == 0 ? whole_slices() : param_slices();
}

std::vector<StateSlice> DataParallel::param_slices() {
  std::vector<StateSlice> out;
  if (opt_.zero == 0) {
    out = whole_slices();
    for (StateSlice& s : out)  // a dropped parameter: a widened copy
      if (s.fill) {
        s.tensor = Tensor::zeros(s.tensor.shape(), DType::F32);
        s.fill(s.tensor.raw());
        s.fill = nullptr;
      }
    return out;
  }
  float* w = adam_->master() ? adam_->master() - lo_ : P_.data();
  for (const ParamInfo& p : P_.infos()) {
    int64_t a = std::max(p.offset, lo_), b = std::min(p.offset + p.numel, hi_);
    if (a >= b) continue;
    out.push_back({p.name, Tensor::view_of(w + a, {b - a}, DType::F32), p.numel, a - p.offset});
  }
  for (const ParamInfo& p : P_.infos()) {
    if (!experts_apart() || !p.expert) continue;
    int64_t a = std::max(p.offset, elo_), b = std::min(p.offset + p.numel, ehi_);
    if (a >= b) continue;
    float* src = expert_adam_->master() ? expert_adam_->master() + (a - elo_) : P_.data() + a;
    out.push_back({p.name, Tensor::view_of(src, {b - a}, DType::F32), p.numel, a - p.offset});
  }
  return out;
}

MemoryUse DataParallel::memory_use() const {
  MemoryUse u;
  // The whole flat buffer, the expert-parallel experts included.
  u.params = resident_bytes(P_.fp32_storage(), P_.total() * 4);
  if (P_.bf16_data()) u.params += resident_bytes(P_.bf16_data(), P_.total() * 2);
  u.grads = resident_bytes(P_.grad(), P_.total() * 4);
  for (const BackendBuffer* b : {&gshard_, &egshard_})
    if (!b->empty()) u.grads += resident_bytes(b->data(), int64_t(b->bytes()));
  u.grads += reducer_->resident_scratch_bytes();
  for (const AdamW* o : {adam_.get(), expert_adam_.get()})
    if (o)
      for (auto [data, bytes] : o->buffers()) u.optim += resident_bytes(data, bytes);
  return u;
}

}  // namespace loom::parallel
