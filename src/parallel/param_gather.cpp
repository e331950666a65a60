#include "parallel/param_gather.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/page_memory.h"

namespace loom::parallel {

static int block_of(const std::string& name) {  // "blocks.<l>.…" -> l, else -1
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

ParamGatherer::ParamGatherer(Decoder& model, ParamSet& P, comm::Communicator& dp,
                             const FlatShards& dense, AdamW& dense_adam, bool blocks,
                             comm::Communicator* edp, const FlatShards* experts, AdamW* expert_adam)
    : model_(model),
      P_(P),
      dp_(dp),
      dense_(dense),
      dense_adam_(dense_adam),
      blocks_(blocks),
      edp_(edp),
      experts_(experts ? *experts : FlatShards()),
      expert_adam_(expert_adam),
      n_layer_(model.config().n_layer) {
  LOOM_CHECK(!expert_adam_ || (edp_ && experts), "ZeRO-3 experts need their group and shards");
  if (!blocks_) {
    resident_.push_back({0, dense_.n});
    return;
  }
  build_units();
  before_id_ = model_.before_block.subscribe([this](int l, bool bwd) { before(l, bwd); });
  after_id_ = model_.after_block.subscribe([this](int l, bool bwd) { after(l, bwd); });
}

ParamGatherer::~ParamGatherer() {
  for (auto& u : units_)
    for (auto& p : u.pieces) p.work.wait();
  if (blocks_) {
    model_.before_block.unsubscribe(before_id_);
    model_.after_block.unsubscribe(after_id_);
  }
}

void ParamGatherer::build_units() {
  // A pipeline stage holds only its layers: the other units stay empty and never gathered.
  // A block's parameters are one run of the flat buffer, except its MoE experts, which follow
  // every other parameter: consecutive parameters of one block (and one group) share a piece.
  units_.resize(n_layer_);
  int prev_block = -1;
  for (const ParamInfo& p : P_.infos()) {
    const int b = block_of(p.name);
    const bool experts = expert_adam_ && p.expert;
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
      p.counts = p.experts ? experts_.counts_of(p.lo, p.hi) : dense_.counts_of(p.lo, p.hi);
  // Everything outside the blocks stays gathered: embeddings, final norm, head (of the first
  // and last pipeline stage; none on a middle stage).
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (const Unit& u : units_)
    for (const Piece& p : u.pieces)
      if (!p.experts) blocks.push_back({p.lo, p.hi});
  std::sort(blocks.begin(), blocks.end());
  int64_t at = 0;
  for (auto [lo, hi] : blocks) {
    if (lo > at) resident_.push_back({at, lo});
    at = std::max(at, hi);
  }
  if (at < dense_.n) resident_.push_back({at, dense_.n});
}

void ParamGatherer::release_blocks() {
  for (auto& u : units_)
    for (auto& p : u.pieces) release_memory(P_.backend(), P_.data() + p.lo, p.hi - p.lo);
}

// This rank's part of [lo, hi) from its master (rounded to the compute type), then everyone's.
void ParamGatherer::gather_range_async(int64_t lo, int64_t hi, comm::Work* work,
                                       std::vector<int64_t>* counts) {
  *counts = dense_.counts_of(lo, hi);
  dense_adam_.write_model(lo, hi);
  // 2-byte weights (ParamSet::drop_fp32, ZeRO-1/2 only): the owners wrote every value's bf16
  // bits into the set's bf16 copy, and under the bf16 policy every model value is a bf16 value,
  // so the copy goes on the wire (half the bytes); the parameters that keep fp32 values are
  // widened from it once gathered (widen_kept).
  if (P_.any_fp32_dropped()) {
    count_wire(*counts, dp_.rank(), 2);
    *work = dp_.all_gather_async(P_.bf16_data() + lo, *counts, DType::BF16);
    return;
  }
  count_wire(*counts, dp_.rank(), 4);
  *work = dp_.all_gather_async(P_.data() + lo, *counts, DType::F32);
}

void ParamGatherer::count_wire(const std::vector<int64_t>& counts, int rank, int64_t elem_bytes) {
  int64_t others = 0;
  for (size_t r = 0; r < counts.size(); ++r)
    if (int(r) != rank) others += counts[r];
  wire_bytes_ += elem_bytes * others;
}

void ParamGatherer::widen_kept(int64_t lo, int64_t hi) {
  if (!P_.any_fp32_dropped()) return;
  P_.for_runs(lo, hi, [&](int64_t a, int64_t b, bool dropped) {
    if (!dropped)
      P_.backend().convert(P_.fp32_storage() + a, DType::F32, P_.bf16_data() + a, DType::BF16,
                           b - a);
  });
  P_.note_bf16_written(lo, hi);  // every rank's bits, as its optimizer wrote them
}

void ParamGatherer::gather_resident() {
  for (int l = 0; l < int(units_.size()); ++l) release_unit(l);
  for (auto [lo, hi] : resident_) {  // the same ranges on every rank of the group
    comm::Work w;
    std::vector<int64_t> counts;
    gather_range_async(lo, hi, &w, &counts);
    w.wait();
    widen_kept(lo, hi);
  }
}

// A dense piece from the owners' master shards over dp_; an expert piece from the owners'
// expert master shards over edp_.
void ParamGatherer::gather_piece_async(Piece& p) {
  if (!p.experts) {
    gather_range_async(p.lo, p.hi, &p.work, &p.counts);
    return;
  }
  expert_adam_->write_model(p.lo, p.hi);
  count_wire(p.counts, edp_->rank(), 4);
  p.work = edp_->all_gather_async(P_.data() + p.lo, p.counts, DType::F32);
}

void ParamGatherer::ensure_gathered(int l) {
  Unit& u = units_[l];
  if (u.state != Unit::Released) return;
  for (auto& p : u.pieces) gather_piece_async(p);
  u.state = Unit::InFlight;
  max_gathered_ = std::max(max_gathered_, ++gathered_);
}

void ParamGatherer::release_unit(int l) {
  Unit& u = units_[l];
  if (u.state == Unit::Released) return;
  for (auto& p : u.pieces) {
    p.work.wait();
    // (Host pages returned on the CPU; on a device the block is zeroed by a Backend fill, so a
    // released block reads as zeros on both and a step's results do not depend on where.)
    release_memory(P_.backend(), P_.data() + p.lo, p.hi - p.lo);
  }
  u.state = Unit::Released;
  --gathered_;
}

// The chunk [begin, end) of this pipeline stage that holds layer l.
std::pair<int, int> ParamGatherer::chunk_of(int l) const {
  for (auto [b, e] : model_.pipeline_stage().chunks)
    if (l >= b && l < e) return {b, e};
  fail("layer ", l, " is not on this pipeline stage");
}

// Gathers block l (waits for it), then prefetches the block that runs next: l+1 forward, l-1
// backward; under a pipeline only within l's chunk (the next action's chunk is unknown here).
// The hooks come in the same order on every DP rank (the same model code, and under a pipeline
// the same action list), so the gathers start in the same order on all of them.
void ParamGatherer::before(int l, bool backward) {
  LOOM_CHECK(!units_[l].pieces.empty(), "layer ", l, " is not on this pipeline stage");
  ensure_gathered(l);
  for (auto& p : units_[l].pieces) p.work.wait();
  units_[l].state = Unit::Resident;
  const auto [b, e] = pipelined() ? chunk_of(l) : std::make_pair(0, n_layer_);
  const int next = backward ? l - 1 : l + 1;
  if (next >= b && next < e) ensure_gathered(next);
}

void ParamGatherer::after(int l, bool backward) {
  // One process: backward starts with the last block. Under a pipeline, another micro-batch's
  // forward or backward may come first: release every block after each use (the Decoder keeps
  // a chunk's last block inside the backward's hooks from its recomputation on).
  if (!pipelined() && !backward && l == n_layer_ - 1) return;
  release_unit(l);
}

}  // namespace loom::parallel
