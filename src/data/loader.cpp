#include "data/loader.h"

#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "data/blended_dataset.h"
#include "data/packed_dataset.h"

namespace loom::data {

namespace {

std::shared_ptr<const SampleSource> make_one(const LoaderConfig& c, const std::string& prefix,
                                             int64_t num_samples, double* efficiency) {
  auto data = std::make_shared<const IndexedDataset>(prefix);
  if (c.packed) {
    PackedDatasetConfig pc;
    pc.prefix = prefix;
    pc.seq_len = c.seq_len;
    pc.seed = c.seed;
    pc.num_samples = num_samples;
    pc.split = c.split;
    pc.which = c.which;
    pc.open_rows = c.packing_open_rows;
    pc.log = c.log && c.rank == 0;
    auto p = std::make_shared<const PackedDataset>(pc, data);
    *efficiency = p->efficiency();
    return p;
  }
  GptDatasetConfig gc;
  gc.prefix = prefix;
  gc.seq_len = c.seq_len;
  gc.seed = c.seed;
  gc.num_samples = num_samples;
  gc.split = c.split;
  gc.which = c.which;
  gc.cache_dir = c.cache_dir;
  gc.log = c.log && c.rank == 0;
  return std::make_shared<const GptDataset>(gc, data);
}

std::shared_ptr<const SampleSource> make_source(const LoaderConfig& c, double* efficiency) {
  LOOM_CHECK(!c.prefixes.empty(), "data loader: no token files given");
  if (c.prefixes.size() == 1) return make_one(c, c.prefixes[0], c.num_samples, efficiency);
  std::vector<double> w = c.weights;
  if (w.empty()) w.assign(c.prefixes.size(), 1.0);
  LOOM_CHECK(w.size() == c.prefixes.size(), "data loader: ", c.prefixes.size(), " token files but ",
             w.size(), " weights");
  double sum = 0;
  for (double x : w) sum += x;
  LOOM_CHECK(sum > 0, "data loader: blend weights sum to zero");
  std::vector<std::shared_ptr<const SampleSource>> parts;
  int64_t size = c.num_samples;
  double eff_sum = 0;
  int64_t limit = INT64_MAX;
  for (size_t k = 0; k < c.prefixes.size(); ++k) {
    // Megatron's margin: each part gets 0.5% more than its share.
    int64_t n = size > 0 ? int64_t(std::ceil(w[k] / sum * double(size) * 1.005)) : 0;
    double eff = 1;
    parts.push_back(make_one(c, c.prefixes[k], n, &eff));
    eff_sum += eff * w[k] / sum;
    if (w[k] > 0)
      limit = std::min(limit, int64_t(double(parts.back()->size()) / (w[k] / sum * 1.005)));
  }
  *efficiency = eff_sum;
  if (size <= 0) size = limit;  // one pass over the scarcest part
  return std::make_shared<const BlendedDataset>(parts, w, size);
}

}  // namespace

Loader::Loader(const LoaderConfig& cfg)
    : B_(cfg.micro_batch),
      rank_(cfg.rank),
      world_(cfg.world),
      prefetch_(cfg.prefetch),
      seed_(cfg.seed) {
  LOOM_CHECK(B_ > 0 && world_ > 0 && rank_ >= 0 && rank_ < world_, "data loader: bad micro_batch ",
             B_, " / rank ", rank_, " / world ", world_);
  source_ = make_source(cfg, &packing_efficiency_);
  start();
}

Loader::Loader(std::shared_ptr<const SampleSource> source, int micro_batch, int rank, int world,
               int prefetch, uint64_t seed)
    : source_(std::move(source)),
      B_(micro_batch),
      rank_(rank),
      world_(world),
      prefetch_(prefetch),
      seed_(seed) {
  LOOM_CHECK(B_ > 0 && world_ > 0 && rank_ >= 0 && rank_ < world_, "data loader: bad micro_batch ",
             B_, " / rank ", rank_, " / world ", world_);
  LOOM_CHECK(source_ && source_->size() > 0, "data loader: empty dataset");
  start();
}

Loader::~Loader() {
  stop();
}

void Loader::make_batch(int64_t first, Batch& b) const {
  const int T = source_->seq_len();
  const int64_t n = source_->size();
  b.B = B_;
  b.T = T;
  b.first_sample = first;
  b.tokens.resize(size_t(B_) * T);
  b.targets.resize(size_t(B_) * T);
  b.positions.resize(size_t(B_) * T);
  b.cu_seqlens.assign(1, 0);
  std::vector<int32_t> segs;
  for (int r = 0; r < B_; ++r) {
    segs.clear();
    size_t o = size_t(r) * T;
    source_->fill_row((first + r) % n, b.tokens.data() + o, b.targets.data() + o,
                      b.positions.data() + o, segs);
    int32_t sum = 0;
    for (int32_t s : segs) {
      sum += s;
      b.cu_seqlens.push_back(int32_t(o) + sum);
    }
    LOOM_CHECK(sum == T, "internal: row segments sum to ", sum, ", not ", T);
  }
}

void Loader::produce() {
  while (true) {
    int64_t at;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || int(queue_.size()) < prefetch_; });
      if (stopping_) return;
      at = produce_at_;
      produce_at_ += int64_t(B_) * world_;
    }
    Batch b;
    try {
      make_batch(at + int64_t(rank_) * B_, b);
    } catch (...) {
      std::lock_guard lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lk(mu_);
      queue_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
}

void Loader::start() {
  queue_.clear();
  error_ = nullptr;
  stopping_ = false;
  produce_at_ = consumed_;
  if (prefetch_ > 0) thread_ = std::thread([this] { produce(); });
}

void Loader::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Loader::next(Batch& out) {
  if (prefetch_ <= 0) {
    make_batch(consumed_ + int64_t(rank_) * B_, out);
    consumed_ += int64_t(B_) * world_;
    return;
  }
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty() || error_; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  out = std::move(queue_.front());
  queue_.pop_front();
  consumed_ += int64_t(B_) * world_;
  lk.unlock();
  cv_.notify_all();
}

Json Loader::state() const {
  Json s = Json::object();
  s["samples_consumed"] = consumed_;
  s["seed"] = uint64_t(seed_);
  s["dataset_size"] = source_->size();
  return s;
}

void Loader::restore(const Json& s) {
  int64_t at = s.at("samples_consumed").as_int();
  LOOM_CHECK(at >= 0, "data loader state: samples_consumed must be non-negative");
  if (s.contains("seed"))
    LOOM_CHECK(uint64_t(s.at("seed").as_int()) == seed_, "data loader state was saved with seed ",
               s.at("seed").as_int(), " but this run uses seed ", seed_);
  if (s.contains("dataset_size") && s.at("dataset_size").as_int() != source_->size())
    log_warn("data loader state was saved over ", s.at("dataset_size").as_int(),
             " samples; the dataset now has ", source_->size(), " (order may differ)");
  stop();
  consumed_ = at;
  start();
}

}  // namespace loom::data
