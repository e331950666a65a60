#include "parallel/data_parallel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "core/log.h"

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

static int64_t page_size() {
  static const int64_t p = sysconf(_SC_PAGESIZE);
  return p;
}

void release_memory(float* p, int64_t n) {
  if (n <= 0) return;
  const uintptr_t page = page_size();
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(n) * sizeof(float);
  uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
  if (a >= b) {
    std::memset(p, 0, n * sizeof(float));
    return;
  }
  std::memset(p, 0, a - begin);
  std::memset(reinterpret_cast<void*>(b), 0, end - b);
  // Private anonymous memory reads back as zeros after MADV_DONTNEED: freed and zeroed at once.
  if (madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(a), 0, b - a);
}

int64_t resident_bytes(const void* p, int64_t bytes) {
  if (!p || bytes <= 0) return 0;
  const uintptr_t page = page_size();
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  uintptr_t a = begin / page * page, b = (end + page - 1) / page * page;
  std::vector<unsigned char> vec((b - a) / page);
  if (mincore(reinterpret_cast<void*>(a), b - a, vec.data()) != 0) return bytes;
  int64_t total = 0;
  for (size_t i = 0; i < vec.size(); ++i) {
    if (!(vec[i] & 1)) continue;
    uintptr_t lo = std::max(begin, a + i * page), hi = std::min(end, a + (i + 1) * page);
    total += static_cast<int64_t>(hi - lo);
  }
  return total;
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
    const int64_t n = expert_hi_ - expert_lo_;
    eshard_ = opt_.zero == 3 ? (n + edp_->size() - 1) / edp_->size() : n;
    const int er = opt_.zero == 3 ? edp_->rank() : 0;
    elo_ = expert_lo_ + std::min(int64_t(er) * eshard_, n);
    ehi_ = expert_lo_ + std::min(int64_t(er) * eshard_ + eshard_, n);
    expert_adam_ = std::make_unique<AdamW>(P_, adam, param_dtype_, be_, elo_, ehi_, opt_.zero == 3);
    if (opt_.zero == 3) egshard_ = Tensor::zeros({ehi_ - elo_});
  }
  const int D = dp_.size();
  shard_ = (total_ + D - 1) / D;
  lo_ = std::min(int64_t(dp_.rank()) * shard_, total_);
  hi_ = std::min(lo_ + shard_, total_);
  // ZeRO-0 steps every dense parameter on every rank, ZeRO >= 1 this rank's shard.
  adam_ = opt_.zero == 0
              ? std::make_unique<AdamW>(P_, adam, param_dtype_, be_, 0, total_, false)
              : std::make_unique<AdamW>(P_, adam, param_dtype_, be_, lo_, hi_, opt_.zero == 3);
  if (opt_.zero == 3) build_units();
  if (opt_.init_seed) draw_initial_weights(*opt_.init_seed);
  // The master copies start from the model's weights, except a ZeRO-3 shard drawn in place.
  if (!(opt_.zero == 3 && opt_.init_seed)) {
    adam_->sync_master_from_model();
    if (expert_adam_) expert_adam_->sync_master_from_model();
  }
  if (opt_.zero >= 1) gshard_ = Tensor::zeros({hi_ - lo_});

  for (const ParamInfo& p : P_.infos()) {
    int b = block_of(p.name);
    stage_of_param_.push_back(b >= 0                           ? n_layer_ - 1 - b
                              : p.name.rfind("embed.", 0) == 0 ? n_layer_
                                                               : 0);
  }
  build_buckets();

  model_.on_grads_ready = [this](int layer) { on_ready(layer); };
  if (opt_.zero >= 2) release_memory(P_.grad(), total_);
  if (experts_sharded()) release_memory(P_.grad() + expert_lo_, expert_hi_ - expert_lo_);
  if (opt_.zero == 3) {
    // A model initialised outside holds every block: keep only the gathered parameters. (Drawn
    // here, the blocks' pages were never written.)
    if (!opt_.init_seed)
      for (auto& u : units_)
        for (auto& p : u.pieces) release_memory(P_.data() + p.lo, p.hi - p.lo);
    model_.before_block = [this](int l, bool bwd) { unit_before(l, bwd); };
    model_.after_block = [this](int l, bool bwd) { unit_after(l, bwd); };
  }
}

void DataParallel::build_units() {
  // A pipeline stage holds only its layers: the other units stay empty and never gathered.
  // A block's parameters are one run of the flat buffer, except its MoE experts, which follow
  // every other parameter: consecutive parameters of one block (and one group) share a piece.
  units_.resize(n_layer_);
  int prev_block = -1;
  for (const ParamInfo& p : P_.infos()) {
    const int b = block_of(p.name);
    const bool experts = experts_apart() && p.expert;
    if (b >= 0) {
      auto& pieces = units_[b].pieces;
      if (b != prev_block || pieces.empty() || pieces.back().experts != experts) {
        Piece piece;
        piece.lo = piece.hi = p.offset;
        piece.experts = experts;
        pieces.push_back(std::move(piece));
      }
      pieces.back().hi = p.offset + p.numel;
    }
    prev_block = b;
  }
  for (auto& u : units_)
    for (auto& p : u.pieces)
      p.counts = p.experts ? expert_counts_of(p.lo, p.hi) : counts_of(p.lo, p.hi);
  // Everything outside the blocks stays gathered: embeddings, final norm, head (of the first
  // and last pipeline stage; none on a middle stage).
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (const Unit& u : units_)
    for (const Piece& p : u.pieces)
      if (!p.experts) blocks.push_back({p.lo, p.hi});
  std::sort(blocks.begin(), blocks.end());
  int64_t at = 0;
  for (auto [lo, hi] : blocks) {
    if (lo > at) resident_ranges_.push_back({at, lo});
    at = std::max(at, hi);
  }
  if (at < total_) resident_ranges_.push_back({at, total_});
}

void DataParallel::draw_initial_weights(uint64_t seed) {
  auto round = [&](float* p, int64_t n) {
    if (param_dtype_ != DType::F32) round_to(param_dtype_, p, static_cast<size_t>(n));
  };
  if (opt_.zero < 3) {
    P_.init(seed);
    round(P_.data(), P_.total());
    return;
  }
  // Blocks are gathered from the owners' master shards on use: draw the shard straight into the
  // master, and into the model only the parameters that stay gathered.
  P_.init_ranges(seed, resident_ranges_);
  for (auto [lo, hi] : resident_ranges_) round(P_.data() + lo, hi - lo);
  P_.draw(seed, lo_, hi_, adam_->master());
  round(adam_->master(), hi_ - lo_);
  if (experts_sharded()) {
    P_.draw(seed, elo_, ehi_, expert_adam_->master());
    round(expert_adam_->master(), ehi_ - elo_);
  }
}

DataParallel::~DataParallel() {
  for (auto& b : buckets_) b.work.wait();
  for (auto& u : units_)
    for (auto& p : u.pieces) p.work.wait();
  model_.on_grads_ready = nullptr;
  model_.before_block = nullptr;
  model_.after_block = nullptr;
}

std::vector<int64_t> DataParallel::counts_of(int64_t lo, int64_t hi) const {
  std::vector<int64_t> c(dp_.size());
  for (int r = 0; r < dp_.size(); ++r) {
    int64_t a = std::max(lo, std::min(int64_t(r) * shard_, total_));
    int64_t b = std::min(hi, std::min(int64_t(r + 1) * shard_, total_));
    c[r] = std::max<int64_t>(0, b - a);
  }
  return c;
}

std::vector<int64_t> DataParallel::expert_counts_of(int64_t lo, int64_t hi) const {
  std::vector<int64_t> c(edp_->size());
  for (int r = 0; r < edp_->size(); ++r) {
    int64_t a = std::max(lo, std::min(expert_lo_ + int64_t(r) * eshard_, expert_hi_));
    int64_t b = std::min(hi, std::min(expert_lo_ + int64_t(r + 1) * eshard_, expert_hi_));
    c[r] = std::max<int64_t>(0, b - a);
  }
  return c;
}

void DataParallel::build_buckets() {
  // Walk parameters from the end of the flat buffer (the order backward finishes them), closing
  // a bucket once it holds bucket_elems elements. Each bucket is one contiguous range.
  const auto& infos = P_.infos();
  Bucket cur;
  bool open = false;
  int n = static_cast<int>(infos.size());
  while (n > 0 && infos[n - 1].offset >= total_) --n;  // expert weights reduce apart
  for (int i = n - 1; i >= 0; --i) {
    const ParamInfo& p = infos[i];
    if (!open) {
      cur = Bucket{};
      cur.hi = i + 1 < n ? infos[i + 1].offset : total_;
      open = true;
    }
    cur.lo = p.offset;
    cur.stage = std::max(cur.stage, stage_of_param_[i]);
    if (cur.hi - cur.lo >= opt_.bucket_elems || i == 0) {
      if (i == 0) cur.lo = 0;
      buckets_.push_back(cur);
      open = false;
    }
  }
  for (auto& b : buckets_) {
    b.counts = counts_of(b.lo, b.hi);
    b.own_lo = std::max(b.lo, lo_);
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
    std::fill(P_.grad() + expert_lo_, P_.grad() + expert_hi_, 0.f);
  if (egshard_.defined() && egshard_.numel() > 0) egshard_.fill(0.f);
  if (gshard_.defined() && gshard_.numel() > 0) gshard_.fill(0.f);
}

void DataParallel::start_micro(int m) {
  micro_ = m;
  for (auto& b : buckets_) b.launched = false;
}

// Where a bucket's reduce-scatter leaves this rank's sums: straight in the gradient shard under
// ZeRO-1, in scratch under ZeRO-2/3 (added to the shard when complete) and under bf16 ZeRO-0
// (gathered back to every rank).
float* DataParallel::reduce_target(Bucket& b) {
  const int64_t mine = b.counts[dp_.rank()];
  static float nothing;  // a valid address for a rank that receives no elements
  if (opt_.zero == 1) return mine > 0 ? gshard_.data<float>() + (b.own_lo - lo_) : &nothing;
  b.scratch.resize(std::max<int64_t>(1, mine));
  return b.scratch.data();
}

void DataParallel::launch(Bucket& b) {
  b.launched = true;
  ++started_;
  if (bf16_reduce()) {
    launch_bf16(b);
    return;
  }
  float* send = P_.grad() + b.lo;
  int64_t mine = b.counts[dp_.rank()];
  if (opt_.zero == 0) {
    b.work = dp_.all_reduce_async(send, b.hi - b.lo, DType::F32, comm::ReduceOp::Sum);
    wire_bytes_ += 2 * 4 * (b.hi - b.lo - mine);
    return;
  }
  b.work =
      dp_.reduce_scatter_async(send, reduce_target(b), b.counts, DType::F32, comm::ReduceOp::Sum);
  wire_bytes_ += 4 * (b.hi - b.lo - mine);
}

// bf16: a reduce-scatter of the rounded gradients, summed in fp32, for every ZeRO level (ZeRO-0
// into scratch, then gather_bf16_sums).
void DataParallel::launch_bf16(Bucket& b) {
  const int64_t n = b.hi - b.lo, mine = b.counts[dp_.rank()];
  const float* g = P_.grad() + b.lo;
  b.wire.resize(n);
  for (int64_t i = 0; i < n; ++i) b.wire[i] = f32_to_bf16(g[i]);
  b.work = dp_.reduce_scatter_bf16_async(b.wire.data(), reduce_target(b), b.counts);
  wire_bytes_ += 2 * (n - mine);
}

// bf16 ZeRO-0, second half of the all-reduce: this rank's sums, rounded to bf16 (so that every
// rank ends with the same gradients), all-gathered into the bucket's bf16 buffer. Started in
// bucket order after backward: collectives must start in the same order on every rank, and the
// moment a reduce-scatter is seen complete during backward differs between ranks.
void DataParallel::gather_bf16_sums(Bucket& b) {
  b.work.wait();
  const int64_t n = b.hi - b.lo, mine = b.counts[dp_.rank()], at = b.own_lo - b.lo;
  for (int64_t i = 0; i < mine; ++i) b.wire[at + i] = f32_to_bf16(b.scratch[i]);
  b.work = dp_.all_gather_async(b.wire.data(), b.counts, DType::BF16);
  wire_bytes_ += 2 * (n - mine);
}

void DataParallel::on_ready(int layer) {
  if (!reduces_now() || !opt_.overlap) return;
  const int stage = layer >= 0 ? n_layer_ - 1 - layer : n_layer_;
  for (auto& b : buckets_)
    if (!b.launched && b.stage <= stage) {
      launch(b);
      ++started_in_backward_;
    }
  // Drive MPI's progress engine for what is in flight while backward continues.
  for (auto& b : buckets_)
    if (b.launched) b.work.test();
}

void DataParallel::complete(Bucket& b) {
  if (bf16_reduce() && opt_.zero == 0) {
    float* g = P_.grad() + b.lo;
    for (int64_t i = 0; i < b.hi - b.lo; ++i) g[i] = bf16_to_f32(b.wire[i]);
    std::vector<float>().swap(b.scratch);
  }
  std::vector<uint16_t>().swap(b.wire);
  if (opt_.zero < 2) return;
  int64_t mine = b.counts[dp_.rank()];
  if (mine > 0) be_.add_inplace(gshard_.data<float>() + (b.own_lo - lo_), b.scratch.data(), mine);
  std::vector<float>().swap(b.scratch);  // transient: only while the reduction is in flight
  release_memory(P_.grad() + b.lo, b.hi - b.lo);
}

void DataParallel::finish_micro() {
  // Expert gradients: summed over the ranks that hold the same experts, once per step (ZeRO-3:
  // into this rank's shard, and the full-size pages released).
  if (experts_sharded() && micro_ == micros_ - 1) {
    static float dummy;
    edp_->reduce_scatter(P_.grad() + expert_lo_, ehi_ > elo_ ? egshard_.data<float>() : &dummy,
                         expert_counts_of(expert_lo_, expert_hi_), DType::F32, comm::ReduceOp::Sum);
    release_memory(P_.grad() + expert_lo_, expert_hi_ - expert_lo_);
  } else if (experts_apart() && micro_ == micros_ - 1 && edp_->size() > 1) {
    edp_->all_reduce(P_.grad() + expert_lo_, expert_hi_ - expert_lo_, DType::F32,
                     comm::ReduceOp::Sum);
  }
  if (!reduces_now()) return;
  for (auto& b : buckets_)
    if (!b.launched) launch(b);
  double t0 = now_seconds();
  if (bf16_reduce() && opt_.zero == 0)
    for (auto& b : buckets_) gather_bf16_sums(b);
  for (auto& b : buckets_) b.work.wait();
  exposed_seconds_ += now_seconds() - t0;
  for (auto& b : buckets_) complete(b);
}

double DataParallel::grad_sq_local(const std::vector<double>& weights) const {
  const float* g = opt_.zero == 0 ? P_.grad() : gshard_.data<float>() - lo_;
  double sum = 0;
  const auto& infos = P_.infos();
  for (size_t i = 0; i < infos.size(); ++i) {
    double w = weights.empty() ? 1.0 : weights[i];
    if (w == 0) continue;
    int64_t a = std::max(infos[i].offset, lo_), b = std::min(infos[i].offset + infos[i].numel, hi_);
    if (a < b) sum += w * be_.sum_squares(g + a, b - a);
  }
  // ZeRO-3 expert weights: each element on one rank of the expert-data-parallel group.
  if (experts_sharded())
    for (size_t i = 0; i < infos.size(); ++i) {
      const double w = weights.empty() ? 1.0 : weights[i];
      int64_t a = std::max(infos[i].offset, elo_);
      int64_t b = std::min(infos[i].offset + infos[i].numel, ehi_);
      if (infos[i].expert && w != 0 && a < b)
        sum += w * be_.sum_squares(egshard_.data<float>() + (a - elo_), b - a);
    }
  // Otherwise: replicated over the expert-data-parallel group, counted on its rank 0.
  if (experts_apart() && !experts_sharded() && edp_->rank() == 0)
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].expert && (weights.empty() || weights[i] != 0))
        sum += (weights.empty() ? 1.0 : weights[i]) *
               be_.sum_squares(P_.grad() + infos[i].offset, infos[i].numel);
  return sum;
}

void DataParallel::write_own_params(int64_t lo, int64_t hi) {
  adam_->write_model(lo, hi);  // (ZeRO-0: its range is every dense parameter)
}

void DataParallel::gather_range_async(int64_t lo, int64_t hi, comm::Work* work,
                                      std::vector<int64_t>* counts) {
  *counts = counts_of(lo, hi);
  write_own_params(lo, hi);
  *work = dp_.all_gather_async(P_.data() + lo, *counts, DType::F32);
}

void DataParallel::expert_adam(double lr, float gs) {
  if (!experts_apart()) return;
  // [elo_, ehi_): every expert weight here (ZeRO 0-2), or this rank's shard of them (ZeRO-3,
  // whose ranks gather them on use).
  expert_adam_->update(lr, gs, experts_sharded() ? egshard_.data<float>() : P_.grad() + elo_);
  if (!experts_sharded()) expert_adam_->sync_model_from_master();
}

void DataParallel::set_steps_taken(int64_t t) {
  adam_->set_steps_taken(t);
  if (expert_adam_) expert_adam_->set_steps_taken(t);
}

void DataParallel::step(double lr, float grad_scale) {
  expert_adam(lr, grad_scale);
  if (opt_.zero == 0) {
    adam_->update(lr, grad_scale, P_.grad());
    write_own_params(0, total_);
    return;
  }
  adam_->update(lr, grad_scale, gshard_.data<float>());
  sync_model_from_master();
}

void DataParallel::sync_model_from_master() {
  if (experts_apart() && !experts_sharded()) expert_adam_->sync_model_from_master();
  if (opt_.zero == 0) {
    write_own_params(0, total_);
    return;
  }
  if (opt_.zero <= 2) {
    comm::Work w;
    std::vector<int64_t> counts;
    gather_range_async(0, total_, &w, &counts);
    w.wait();
    return;
  }
  for (int l = 0; l < n_layer_; ++l) release_unit(l);
  for (auto [lo, hi] : resident_ranges_) {  // the same ranges on every rank of the group
    comm::Work w;
    std::vector<int64_t> counts;
    gather_range_async(lo, hi, &w, &counts);
    w.wait();
  }
}

void DataParallel::sync_master_from_model() {
  if (opt_.zero == 0) adam_->sync_master_from_model();
}

// A dense piece from the owners' master shards over dp_; an expert piece from the owners'
// expert master shards over edp_.
void DataParallel::gather_piece_async(Piece& p) {
  if (!p.experts) {
    gather_range_async(p.lo, p.hi, &p.work, &p.counts);
    return;
  }
  expert_adam_->write_model(p.lo, p.hi);
  p.work = edp_->all_gather_async(P_.data() + p.lo, p.counts, DType::F32);
}

void DataParallel::ensure_gathered(int l) {
  Unit& u = units_[l];
  if (u.state != Unit::Released) return;
  for (auto& p : u.pieces) gather_piece_async(p);
  u.state = Unit::InFlight;
  max_gathered_ = std::max(max_gathered_, ++gathered_);
}

void DataParallel::release_unit(int l) {
  Unit& u = units_[l];
  if (u.state == Unit::Released) return;
  for (auto& p : u.pieces) {
    p.work.wait();
    release_memory(P_.data() + p.lo, p.hi - p.lo);
  }
  u.state = Unit::Released;
  --gathered_;
}

// The chunk [begin, end) of this pipeline stage that holds layer l.
std::pair<int, int> DataParallel::chunk_of(int l) const {
  for (auto [b, e] : model_.pipeline_stage().chunks)
    if (l >= b && l < e) return {b, e};
  fail("layer ", l, " is not on this pipeline stage");
}

// Gathers block l (waits for it), then prefetches the block that runs next: l+1 forward, l-1
// backward; under a pipeline only within l's chunk (the next action's chunk is unknown here).
// The hooks come in the same order on every DP rank (the same model code, and under a pipeline
// the same action list), so the gathers start in the same order on all of them.
void DataParallel::unit_before(int l, bool backward) {
  LOOM_CHECK(!units_[l].pieces.empty(), "layer ", l, " is not on this pipeline stage");
  ensure_gathered(l);
  for (auto& p : units_[l].pieces) p.work.wait();
  units_[l].state = Unit::Resident;
  const auto [b, e] = pipelined() ? chunk_of(l) : std::make_pair(0, n_layer_);
  const int next = backward ? l - 1 : l + 1;
  if (next >= b && next < e) ensure_gathered(next);
}

void DataParallel::unit_after(int l, bool backward) {
  // One process: backward starts with the last block. Under a pipeline, another micro-batch's
  // forward or backward may come first: release every block after each use (the Decoder keeps
  // a chunk's last block inside the backward's hooks from its recomputation on).
  if (!pipelined() && !backward && l == n_layer_ - 1) return;
  release_unit(l);
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
  const float* g = gshard_.data<float>();
  return std::vector<float>(g, g + (hi_ - lo_));
}

std::vector<StateSlice> DataParallel::param_slices() {
  std::vector<StateSlice> out;
  if (opt_.zero == 0) {
    for (const ParamInfo& p : P_.infos())
      out.push_back(
          {p.name, Tensor::view_of(P_.data() + p.offset, p.shape, DType::F32), p.numel, 0});
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
  u.params = resident_bytes(P_.data(), P_.total() * 4);
  u.grads = resident_bytes(P_.grad(), P_.total() * 4);
  for (const Tensor* t : {&gshard_, &egshard_})
    if (t->defined()) u.grads += resident_bytes(t->data<float>(), t->nbytes());
  for (auto& b : buckets_) {
    u.grads += resident_bytes(b.scratch.data(), int64_t(b.scratch.capacity()) * 4);
    u.grads += resident_bytes(b.wire.data(), int64_t(b.wire.capacity()) * 2);
  }
  for (const AdamW* o : {adam_.get(), expert_adam_.get()})
    if (o)
      for (const Tensor* t : o->buffers()) u.optim += resident_bytes(t->data<float>(), t->nbytes());
  return u;
}

}  // namespace loom::parallel
