#include "parallel/grad_reduce.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "parallel/page_memory.h"

namespace loom::parallel {

GradReducer::GradReducer(ParamSet& P, comm::Communicator& dp, const FlatShards& shards, int zero,
                         int64_t bucket_elems, bool overlap, DType reduce_dtype, Backend& be,
                         float* shard_grads, const std::vector<int>& stages)
    : P_(P),
      dp_(dp),
      shards_(shards),
      zero_(zero),
      overlap_(overlap),
      reduce_dtype_(reduce_dtype),
      be_(be),
      shard_grads_(shard_grads),
      lo_(shards.begin(dp.rank())),
      hi_(shards.end(dp.rank())) {
  LOOM_CHECK(zero == 0 || shard_grads || hi_ == lo_, "ZeRO-", zero,
             " reduces into a gradient shard, and none was given");
  build(bucket_elems, stages);
}

GradReducer::~GradReducer() {
  for (auto& b : buckets_) b.work.wait();
}

void GradReducer::build(int64_t bucket_elems, const std::vector<int>& stages) {
  // Walk parameters from the end of the flat buffer (the order backward finishes them), closing
  // a bucket once it holds bucket_elems elements. Each bucket is one contiguous range.
  const auto& infos = P_.infos();
  const int64_t total = shards_.base + shards_.n;
  Bucket cur;
  bool open = false;
  int n = static_cast<int>(infos.size());
  while (n > 0 && infos[n - 1].offset >= total) --n;  // expert weights reduce apart
  for (int i = n - 1; i >= 0; --i) {
    const ParamInfo& p = infos[i];
    if (!open) {
      cur = Bucket{};
      cur.hi = i + 1 < n ? infos[i + 1].offset : total;
      open = true;
    }
    cur.lo = p.offset;
    cur.stage = std::max(cur.stage, stages[size_t(i)]);
    if (cur.hi - cur.lo >= bucket_elems || i == 0) {
      if (i == 0) cur.lo = 0;
      buckets_.push_back(std::move(cur));
      open = false;
    }
  }
  for (auto& b : buckets_) {
    b.counts = shards_.counts_of(b.lo, b.hi);
    b.own_lo = std::max(b.lo, lo_);
  }
}

void GradReducer::start_micro(bool reduces) {
  reduces_ = reduces;
  for (auto& b : buckets_) b.launched = false;
}

// Where a bucket's reduce-scatter leaves this rank's sums: straight in the gradient shard under
// ZeRO-1, in scratch under ZeRO-2/3 (added to the shard when complete) and under bf16 ZeRO-0
// (gathered back to every rank).
float* GradReducer::reduce_target(Bucket& b) {
  const int64_t mine = b.counts[dp_.rank()];
  static float nothing;  // a valid address for a rank that receives no elements
  if (zero_ == 1) return mine > 0 ? shard_grads_ + (b.own_lo - lo_) : &nothing;
  if (b.scratch.empty())
    b.scratch = BackendBuffer(be_, sizeof(float) * size_t(std::max<int64_t>(1, mine)), "scratch");
  return b.scratch.as<float>();
}

void GradReducer::launch(Bucket& b) {
  b.launched = true;
  // Lazy zeroing: the bucket's gradients that no writer overwrote this step (a linear without
  // rows) read zero, not the previous step's values.
  P_.settle_grads(b.lo, b.hi);
  ++started_;
  if (bf16()) {
    launch_bf16(b);
    return;
  }
  float* send = P_.grad() + b.lo;
  int64_t mine = b.counts[dp_.rank()];
  if (zero_ == 0) {
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
void GradReducer::launch_bf16(Bucket& b) {
  const int64_t n = b.hi - b.lo, mine = b.counts[dp_.rank()];
  // Rounded (nearest even) by a Backend op: on a device the gradients never leave it.
  uint16_t* wire = b.wire.ensure_n<uint16_t>(be_, size_t(n), "scratch");
  be_.convert(wire, DType::BF16, P_.grad() + b.lo, DType::F32, n);
  b.work = dp_.reduce_scatter_bf16_async(wire, reduce_target(b), b.counts);
  wire_bytes_ += 2 * (n - mine);
}

// bf16 ZeRO-0, second half of the all-reduce: this rank's sums, rounded to bf16 (so that every
// rank ends with the same gradients), all-gathered into the bucket's bf16 buffer. Started in
// bucket order after backward: collectives must start in the same order on every rank, and the
// moment a reduce-scatter is seen complete during backward differs between ranks.
void GradReducer::gather_bf16_sums(Bucket& b) {
  b.work.wait();
  const int64_t n = b.hi - b.lo, mine = b.counts[dp_.rank()], at = b.own_lo - b.lo;
  uint16_t* wire = b.wire.as<uint16_t>();
  if (mine > 0) be_.convert(wire + at, DType::BF16, b.scratch.as<float>(), DType::F32, mine);
  b.work = dp_.all_gather_async(wire, b.counts, DType::BF16);
  wire_bytes_ += 2 * (n - mine);
}

void GradReducer::on_ready(int stage) {
  if (!reduces_ || !overlap_) return;
  for (auto& b : buckets_)
    if (!b.launched && b.stage <= stage) {
      launch(b);
      ++started_in_backward_;
    }
  // Drive MPI's progress engine for what is in flight while backward continues.
  for (auto& b : buckets_)
    if (b.launched) b.work.test();
}

void GradReducer::complete(Bucket& b) {
  if (bf16() && zero_ == 0) {
    be_.convert(P_.grad() + b.lo, DType::F32, b.wire.data(), DType::BF16, b.hi - b.lo);
    b.scratch.reset();
  }
  b.wire.reset();  // transient, like scratch
  if (zero_ < 2) return;
  int64_t mine = b.counts[dp_.rank()];
  if (mine > 0) be_.add_inplace(shard_grads_ + (b.own_lo - lo_), b.scratch.as<float>(), mine);
  b.scratch.reset();  // transient: only while the reduction is in flight
  release_memory(be_, P_.grad() + b.lo, b.hi - b.lo);
}

void GradReducer::finish() {
  if (!reduces_) return;
  for (auto& b : buckets_)
    if (!b.launched) launch(b);
  double t0 = now_seconds();
  if (bf16() && zero_ == 0)
    for (auto& b : buckets_) gather_bf16_sums(b);
  for (auto& b : buckets_) b.work.wait();
  exposed_seconds_ += now_seconds() - t0;
  for (auto& b : buckets_) complete(b);
}

int64_t GradReducer::resident_scratch_bytes() const {
  int64_t bytes = 0;
  for (auto& b : buckets_) {
    bytes += resident_bytes(b.scratch.data(), int64_t(b.scratch.bytes()));
    bytes += resident_bytes(b.wire.data(), int64_t(b.wire.bytes()));
  }
  return bytes;
}

}  // namespace loom::parallel
