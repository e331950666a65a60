#include "parallel/frozen_shards.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/data_parallel.h"

namespace loom::parallel {

namespace {
int block_of(const std::string& name) {  // "blocks.<l>.…" -> l, else -1
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}
}  // namespace

FrozenShards::FrozenShards(Decoder& model, comm::Communicator& dp, bool take_values)
    : model_(model), P_(model.params()), dp_(dp), n_layer_(model.config().n_layer) {
  LOOM_CHECK(!model.before_block && !model.after_block,
             "the model's block hooks are taken (a ZeRO-3 engine over the same model?)");
  total_ = P_.total();
  const int D = dp_.size();
  shard_ = (total_ + D - 1) / D;
  lo_ = std::min(int64_t(dp_.rank()) * shard_, total_);
  hi_ = std::min(lo_ + shard_, total_);
  // On the model's backend (device memory on a GPU: the gathers copy from it there).
  Backend& be = P_.backend();
  own_ = BackendBuffer::zeroed(be, sizeof(float) * size_t(std::max<int64_t>(1, hi_ - lo_)),
                               "parameters");
  if (take_values && hi_ > lo_)
    be.copy_d2d(own_.data(), P_.data() + lo_, sizeof(float) * size_t(hi_ - lo_));

  // A block's parameters: runs of consecutive parameters of the flat buffer (one, unless MoE
  // experts lie at the end of the buffer), the alignment padding between them included (zeros
  // on every rank); everything else stays gathered.
  units_.resize(size_t(n_layer_));
  int prev = -1;
  for (const ParamInfo& p : P_.infos()) {
    const int b = block_of(p.name);
    if (b >= 0) {
      auto& ranges = units_[size_t(b)].ranges;
      if (b != prev || ranges.empty()) {
        Range r;
        r.lo = r.hi = p.offset;
        ranges.push_back(std::move(r));
      }
      ranges.back().hi = p.offset + p.numel;
    }
    prev = b;
  }
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (auto& u : units_)
    for (auto& r : u.ranges) {
      r.counts = counts_of(r.lo, r.hi);
      blocks.push_back({r.lo, r.hi});
    }
  std::sort(blocks.begin(), blocks.end());
  int64_t at = 0;
  for (auto [lo, hi] : blocks) {
    if (lo > at) resident_.push_back({at, lo});
    at = std::max(at, hi);
  }
  if (at < total_) resident_.push_back({at, total_});
  if (take_values)
    for (auto& u : units_)
      for (auto& r : u.ranges) release_memory(be, P_.data() + r.lo, r.hi - r.lo);
  // Subscribers beside others (a profiler, say): removed by id, nobody else's hook touched.
  before_id_ = model_.before_block.subscribe([this](int l, bool bwd) { before(l, bwd); });
  after_id_ = model_.after_block.subscribe([this](int l, bool bwd) { after(l, bwd); });
}

FrozenShards::~FrozenShards() {
  for (auto& u : units_)
    for (auto& r : u.ranges) r.work.wait();
  model_.before_block.unsubscribe(before_id_);
  model_.after_block.unsubscribe(after_id_);
}

std::vector<int64_t> FrozenShards::counts_of(int64_t lo, int64_t hi) const {
  std::vector<int64_t> c(size_t(dp_.size()));
  for (int r = 0; r < dp_.size(); ++r) {
    const int64_t a = std::max(lo, std::min(int64_t(r) * shard_, total_));
    const int64_t b = std::min(hi, std::min(int64_t(r + 1) * shard_, total_));
    c[size_t(r)] = std::max<int64_t>(0, b - a);
  }
  return c;
}

void FrozenShards::gather(int l) {
  Unit& u = units_[size_t(l)];
  if (u.state != Unit::Released) return;
  for (auto& r : u.ranges) {
    // This rank's part in place, then every rank's part from its owner (in-place all-gather:
    // rank k's elements sit where its shard intersects the range).
    const int64_t a = std::max(r.lo, lo_), b = std::min(r.hi, hi_);
    if (a < b)
      P_.backend().copy_d2d(P_.data() + a, own_.as<float>() + (a - lo_),
                            sizeof(float) * size_t(b - a));
    r.work = dp_.all_gather_async(P_.data() + r.lo, r.counts, DType::F32);
  }
  u.state = Unit::InFlight;
  max_gathered_ = std::max(max_gathered_, ++gathered_);
}

void FrozenShards::release(int l) {
  Unit& u = units_[size_t(l)];
  if (u.state == Unit::Released) return;
  for (auto& r : u.ranges) {
    r.work.wait();
    release_memory(P_.backend(), P_.data() + r.lo, r.hi - r.lo);
  }
  u.state = Unit::Released;
  --gathered_;
}

// The layers [begin, end) of the chunk holding layer l: the whole model, or under a pipeline
// the stage's chunk (the next action's chunk is unknown here).
std::pair<int, int> FrozenShards::chunk_of(int l) const {
  if (model_.pipeline_stage().whole()) return {0, n_layer_};
  for (auto [b, e] : model_.pipeline_stage().chunks)
    if (l >= b && l < e) return {b, e};
  fail("layer ", l, " is not on this pipeline stage");
}

// The hooks come in the same order on every DP rank (the same model code on micro-batches of
// the same shape, and under a pipeline the same action list), so the collective gathers start
// in the same order on all of them.
void FrozenShards::before(int l, bool backward) {
  LOOM_CHECK(!units_[size_t(l)].ranges.empty(), "layer ", l, " is not on this pipeline stage");
  gather(l);
  for (auto& r : units_[size_t(l)].ranges) r.work.wait();
  units_[size_t(l)].state = Unit::Resident;
  const auto [b, e] = chunk_of(l);
  const int next = backward ? l - 1 : l + 1;
  if (next >= b && next < e) gather(next);
}

void FrozenShards::after(int l, bool backward) {
  // One process: backward starts with the last block, so keep it from its forward on. (A
  // forward-only pass leaves it gathered until the next backward passes it: one block, and
  // frozen values, so never stale.) Under a pipeline another micro-batch's forward or backward
  // may come next: release every block after each use (the Decoder keeps a chunk's last block
  // inside the backward's hooks from its recomputation on), as DataParallel's ZeRO-3 does.
  if (model_.pipeline_stage().whole() && !backward && l == n_layer_ - 1) return;
  release(l);
}

}  // namespace loom::parallel
