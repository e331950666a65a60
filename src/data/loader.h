// The trainer's view of token data: batches of B rows x T tokens for one data-parallel rank.
//
// Global order: sample s of the dataset (GPT samples, packed rows, or a blend) is used at
// global position s (wrapping around at the end). Each call to next() consumes B x world
// samples: rank r gets positions [c + r*B, c + (r+1)*B) where c counts samples consumed so
// far, so the ranks of one step read disjoint rows whose union is that step's global batch.
// The token files are memory-mapped (ranks on one host share the page cache), the order is
// fixed by the seed, a background thread prepares the next batches, and state()/restore()
// let a checkpoint resume at exactly the next batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/json.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"

namespace loom::data {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> tokens;     // B*T, row-major
  std::vector<int32_t> targets;    // B*T; -1 where no loss
  std::vector<int32_t> positions;  // B*T; 0.. in every row (unpacked) or document (packed)
  // Segment boundaries over the flattened B*T tokens: {0, T, 2T, ..., B*T} unpacked; with
  // packing one entry per document end (and row end), attention stays inside a segment.
  std::vector<int32_t> cu_seqlens;
  int64_t first_sample = 0;  // global position of this rank's first row
};

struct LoaderConfig {
  std::vector<std::string> prefixes;  // token files (PREFIX.bin/.idx), one or more
  std::vector<double> weights;        // blend weights, one per prefix (empty: equal)
  int seq_len = 1024;                 // T
  int micro_batch = 1;                // B: rows per rank per next()
  int rank = 0, world = 1;            // data-parallel rank / size
  uint64_t seed = 1234;
  std::string split = "969,30,1";
  Split which = Split::Train;
  int64_t num_samples = 0;  // global samples the run will draw; 0: one epoch of the data
  bool packed = false;      // whole documents packed into rows (cu_seqlens per document)
  int packing_open_rows = 64;
  int prefetch = 2;  // batches prepared ahead by a background thread (0: none)
  std::string cache_dir;
  bool log = true;
};

class Loader {
 public:
  explicit Loader(const LoaderConfig& cfg);
  // Over any source (tests, custom datasets).
  Loader(std::shared_ptr<const SampleSource> source, int micro_batch, int rank, int world,
         int prefetch = 2, uint64_t seed = 0);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  void next(Batch& out);
  // {"samples_consumed": N, "seed": S, "dataset_size": M}: global samples consumed so far.
  Json state() const;
  void restore(const Json& state);

  int64_t samples_consumed() const { return consumed_; }
  int64_t dataset_size() const { return source_->size(); }
  const SampleSource& source() const { return *source_; }
  double packing_efficiency() const { return packing_efficiency_; }  // 1 when unpacked

  // Fills `out` with the rows of global positions [first, first + B) (no state change).
  void make_batch(int64_t first, Batch& out) const;

 private:
  void start();
  void stop();
  void produce();

  std::shared_ptr<const SampleSource> source_;
  int B_, rank_, world_, prefetch_;
  uint64_t seed_;
  double packing_efficiency_ = 1.0;
  int64_t consumed_ = 0;  // global samples handed out by next()

  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  int64_t produce_at_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace loom::data
