// Data parallelism's parameter gathering: the model's weights brought back from the owners'
// fp32 master shards after a step. ZeRO-1/2 all-gather the whole dense buffer; ZeRO-3 keeps
// only the parameters outside the blocks gathered (embeddings, final norm, head) and gathers
// each block's parameters just before use (the next block's gather prefetched), releasing them
// after: under pipeline parallelism block by block within a chunk, with nothing kept between a
// chunk's uses. Expert-parallel experts are gathered over their own group (edp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/flat_shards.h"

namespace loom::parallel {

class ParamGatherer {
 public:
  // `dense`: the owners of [0, dense.n) over `dp`, whose masters `dense_adam` holds for this
  // rank; under ZeRO-3 with `experts` (expert_adam non-null) the experts' shards over `edp`.
  // `blocks` (ZeRO-3): gather block by block, hooking before_block / after_block.
  ParamGatherer(Decoder& model, ParamSet& P, comm::Communicator& dp, const FlatShards& dense,
                AdamW& dense_adam, bool blocks, comm::Communicator* edp = nullptr,
                const FlatShards* experts = nullptr, AdamW* expert_adam = nullptr);
  // (Under the bf16 policy's 2-byte weights, ParamSet::drop_fp32, which ZeRO-3 never has,
  // ZeRO-1/2 gather the bf16 copy: bf16 on the wire.)
  ~ParamGatherer();  // waits for what is in flight and unhooks
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // The ranges that stay gathered between steps: the whole dense buffer, or under ZeRO-3 what
  // lies outside the blocks.
  const std::vector<std::pair<int64_t, int64_t>>& resident_ranges() const { return resident_; }
  // ZeRO-3: returns every block's pages (a model initialised outside held them all).
  void release_blocks();
  // Every rank's weights into place from the masters: the resident ranges gathered, ZeRO-3's
  // blocks released (gathered again on use).
  void gather_resident();
  // ZeRO-3 hooks (the Decoder calls them around each block).
  void before(int layer, bool backward);
  void after(int layer, bool backward);
  int max_gathered_units() const { return max_gathered_; }
  // Bytes of parameters this rank has put on the wire in its all-gathers since construction,
  // counted as DataParallel::grad_wire_bytes counts them (a gather of n elements sends the
  // n - own elements of the other ranks' blocks) at the payload's element size: 2 for the
  // 2-byte weights' bf16 gather, 4 for fp32.
  int64_t wire_bytes() const { return wire_bytes_; }
  void reset_max_gathered_units() { max_gathered_ = gathered_; }

 private:
  // A contiguous run of one block's parameters, gathered over the data-parallel group or, for
  // expert-parallel experts, over the expert-data-parallel group.
  struct Piece {
    int64_t lo = 0, hi = 0;
    bool experts = false;
    std::vector<int64_t> counts;
    comm::Work work;
  };
  // One block's parameters. A MoE block's experts lie after every other parameter, so its unit
  // has two pieces: the dense part and the experts.
  struct Unit {
    std::vector<Piece> pieces;
    enum State { Released, InFlight, Resident } state = Released;
  };

  void build_units();
  void gather_range_async(int64_t lo, int64_t hi, comm::Work* work, std::vector<int64_t>* counts);
  void gather_piece_async(Piece& p);
  void count_wire(const std::vector<int64_t>& counts, int rank, int64_t elem_bytes);
  // After a bf16 gather of [lo, hi): the parameters that keep fp32 values widened into them.
  void widen_kept(int64_t lo, int64_t hi);
  bool pipelined() const { return !model_.pipeline_stage().whole(); }
  std::pair<int, int> chunk_of(int layer) const;
  void ensure_gathered(int layer);
  void release_unit(int layer);

  Decoder& model_;
  int64_t before_id_ = -1, after_id_ = -1;  // our subscriptions to the model's block hooks
  ParamSet& P_;
  comm::Communicator& dp_;
  FlatShards dense_;
  AdamW& dense_adam_;
  bool blocks_;
  comm::Communicator* edp_;
  FlatShards experts_;
  AdamW* expert_adam_;
  int n_layer_;
  std::vector<Unit> units_;
  std::vector<std::pair<int64_t, int64_t>> resident_;
  int gathered_ = 0, max_gathered_ = 0;  // units not Released now, and the peak
  int64_t wire_bytes_ = 0;
};

}  // namespace loom::parallel
