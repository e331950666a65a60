// GRPO over MPI ranks (issue 15): `loom launch -n N -- rl ... --rollout-ranks K`. World rank 0
// is the learner; ranks 1..K are rollout ranks, each running the serving engine over its own
// copy of the weights and generating its share of every step's prompts (prompt i goes to rollout
// rank 1 + i % K). Data parallelism over several learner ranks is not supported yet: N must be
// K + 1.
//
// Protocol, all of it bounded by learner_timeout (nothing waits forever):
// - Weights: the learner broadcasts one flat buffer (weight_sync.h: the version, then the
//   parameters in fp32 or bf16) at the start (version = the first step, so no rollout starts
//   before the learner's weights arrive) and after every step but the last. The broadcast is
//   non-blocking on the learner; a rollout rank keeps one receive posted and takes new weights
//   between generation batches (rollouts in flight finish on the weights they started with and
//   are tagged so: no partial rollouts).
// - Staleness: a rollout rank generates target step s only from version >= s - max_staleness,
//   waiting for newer weights otherwise; the learner checks the bound again (replay buffer).
// - Trajectories: for each target step, each rollout rank sends one message (trajectory_wire.h)
//   to the learner: a header (step, bytes) then the bytes, by tag. The learner at step s waits
//   for every rollout rank's message of step s; after learner_timeout it stops with an error
//   naming the ranks it did not hear from (a stalled or dead rollout rank never hangs it).
// With max_staleness = 0, fp32 weight sync and one rollout rank, the run is the synchronous
// algorithm (GrpoTrainer) bit for bit: the same engine samples the same requests from the same
// weights, and the learner sees the groups in the same order.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "rl/grpo_trainer.h"
#include "rl/replay_buffer.h"
#include "rl/rollout.h"

namespace loom::rl {

struct MpiRlOptions {
  int rollout_ranks = 1;             // --rollout-ranks K, in [1, N - 1]
  DType weight_dtype = DType::BF16;  // --weight-sync: what the broadcast carries
  int64_t max_staleness = 1;         // --max-staleness
  double learner_timeout = 600;      // seconds any rank waits for another before failing
  int64_t steps = 0;                 // target steps [first, steps) are generated and learnt
  // Instrumentation for tests: on a rollout rank before each batch, on the learner before each
  // step (after its data arrived).
  std::function<void(int64_t)> before_rollout, before_learn;
};

// Checks a layout of `world_size` ranks with `rollout_ranks` rollout ranks; throws naming both.
void check_rl_layout(int world_size, int rollout_ranks);

class MpiGrpo {
 public:
  // Collective over `world`: every rank constructs it with the same options. The learner
  // restores (restore) and broadcasts its weights; the rollout ranks receive them.
  MpiGrpo(comm::Communicator& world, Decoder& policy, const data::BpeTokenizer& tok,
          const data::ChatTemplate& chat, const Environment& env, const RlOptions& opt,
          const MpiRlOptions& mo, const RlRestore& restore = {});
  ~MpiGrpo();
  bool is_learner() const { return rank_ == 0; }
  int64_t first_step() const { return first_; }
  int64_t steps_taken() const { return step_; }

  // Learner: one step (waits for every rollout rank's groups of this step, learns, broadcasts).
  RlStepStats step();
  // Learner: after the last step, waits until every broadcast was taken (bounded).
  void finish();
  GrpoLearner& learner() { return *learner_; }
  ReplayStats buffer_stats() const { return buffer_.stats(); }

  // Rollout rank: generates its share of every target step in [first, steps), sends it, takes
  // every remaining broadcast, then returns.
  void run_rollout();

  // (version, weights_hash) of every version this rank sent (learner) or took (rollout rank).
  const std::vector<std::pair<int64_t, uint64_t>>& weight_hashes() const { return hashes_; }
  // Rollout rank: target step - weight version of each batch it generated.
  const std::vector<int64_t>& generated_ages() const { return ages_; }

 private:
  struct Inflight {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> header;
    comm::Work header_work, work;
  };
  void broadcast_weights();               // learner
  void progress_broadcasts(size_t keep);  // learner: completes those done; waits while > keep
  void apply_weights();                   // rollout: the posted receive completed
  void post_weight_recv();                // rollout: the next version's receive, if one will come
  void wait_work(comm::Work& w, const std::string& what);
  std::string rollout_name(int world_rank) const;

  comm::Communicator& world_;
  Decoder& policy_;
  RlOptions opt_;
  MpiRlOptions mo_;
  int rank_ = 0;
  int64_t first_ = 0, step_ = 0;
  int64_t have_ = 0;  // rollout: the version held
  std::unique_ptr<GrpoLearner> learner_;
  ReplayBuffer buffer_;
  std::unique_ptr<RolloutWorker> rollout_;
  std::deque<Inflight> sends_;  // learner: broadcasts; rollout: trajectory messages
  // Rollout: the posted weight receive.
  std::vector<uint8_t> wbuf_;
  comm::Work wwork_;
  bool wpending_ = false;
  // Learner: each rollout rank's posted header receive (step, bytes).
  std::vector<std::vector<int64_t>> headers_;
  std::vector<comm::Work> hwork_;
  std::vector<std::pair<int64_t, uint64_t>> hashes_;
  std::vector<int64_t> ages_;
  double last_step_end_ = 0;
};

}  // namespace loom::rl
