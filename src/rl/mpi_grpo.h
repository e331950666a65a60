// GRPO over MPI ranks: `loom launch -n N -- rl ... --rollout-ranks K`. World ranks
// 1..K are rollout ranks, each running the serving engine over its own copy of the weights and
// generating its share of every step's prompts (prompt i goes to rollout rank 1 + i % K). The
// other L = N - K ranks (world rank 0, then K+1..N-1) are learners: with L > 1 they are data-
// parallel (GrpoLearner over their communicator: learner i trains on the step's groups
// i, i + L, ..., the loss normalised over the whole step and the gradients all-reduced, so each
// takes the step one learner would take on all the groups). World rank 0 is learner 0: it alone
// talks to the rollout ranks, forwards each step's groups to the other learners, writes metrics
// and checkpoints.
//
// Protocol, all of it bounded by learner_timeout (nothing waits forever):
// - Weights: the learner broadcasts one flat buffer (weight_sync.h: the version, then the
//   parameters in fp32 or bf16) at the start (version = the first step, so no rollout starts
//   before the learner's weights arrive) and after every step but the last. The broadcast is
//   non-blocking on the learner; a rollout rank keeps one receive posted and takes new weights
//   between generation batches (rollouts in flight finish on the weights they started with and
//   are tagged so). With partial rollouts (RlOptions::partial_tokens) a batch gives each
//   completion at most that many tokens; a rollout rank carries its cut groups to its next batch
//   (the next target step), which continues them on the newest weights it holds, every token
//   tagged with its version (as in the one-process loop; new groups start rollout_lead steps
//   ahead, so every group finishes within the bound).
// - Staleness: a rollout rank generates target step s only from version >= s - max_staleness,
//   waiting for newer weights otherwise; the learner checks the bound again (replay buffer).
// - Trajectories: for each target step, each rollout rank sends one message (trajectory_wire.h)
//   to learner 0: a header (step, bytes) then the bytes, by tag. Learner 0 at step s waits
//   for every rollout rank's message of step s; after learner_timeout it stops with an error
//   naming the ranks it did not hear from (a stalled or dead rollout rank never hangs it). It
//   then broadcasts the step's groups (the same message format) to the other learners, which
//   wait for it at most 2 x learner_timeout. The learners' gradient all-reduce is blocking, as
//   the data-parallel trainer's is (a dead learner ends the job through mpirun).
// - Checkpoints: the groups the rollout ranks generated ahead of the learner (by weights older
//   than the checkpoint's) are saved with it (buffer_contents) and trained on after a resume, as
//   in the one-process asynchronous loop; the rollout ranks then start after the last of them.
// - Tensor parallelism (MpiRlOptions::learner_tp = T > 1): the L learners form L / T data-parallel
//   groups of T consecutive learner ranks (learner i: TP rank i % T, data-parallel group i / T).
//   Each trains a TP shard of the policy (the trainer's layout, cut from the whole starting
//   weights); the groups of a step are shared out over the data-parallel groups, every TP rank
//   of one group taking the same share. After every step the TP group of learner 0 pieces its
//   shards together into the whole policy (tp_gather.h: copies, so the whole tensors hold the
//   shards' bits), which learner 0 broadcasts to the rollout ranks (they run the whole model),
//   evaluates and saves; at the checkpoint steps (save_every, and the last) the optimizer's
//   moments too (checkpoint_optimizer()). Checkpoints are therefore the one-learner layout, and
//   any layout resumes from any other. With learner_sp the TP groups run sequence parallelism
//   too (a pass's tokens padded to split over the group: GrpoLearner); a MoE policy's experts
//   are replicated over the TP group, as the trainer's etp = 1.
// - Expert parallelism (learner_ep = E > 1, a MoE policy): as the trainer's parallel.ep, the
//   experts are split over E consecutive data-parallel groups (group d: EP rank d % E, expert-
//   data-parallel rank d / E), each pass exchanging tokens over the EP group; with learner_etp
//   each expert's width is split over that many ranks of a TP group (parallel.etp). Learner 0's
//   TP groups of the first EP group (the first T x E learners) then hold every element once
//   between them, and gather the whole policy after each step (and the optimizer's moments at
//   the checkpoint steps), as the TP group does without EP.
// - ZeRO (RlOptions::zero, parallel.zero) over the data-parallel learners: the training engine's
//   DataParallel at stage 1-3 (optimizer state, gradients, then parameters sharded as contiguous
//   ranges of the flat buffer). At ZeRO 1-2 the policy holds the whole weights after every step
//   (the engine all-gathers them); at ZeRO-3 the learners train a copy of the policy whose blocks
//   are gathered around each use, and after every step they all-gather the whole weights from
//   every learner's fp32 master shard (rounded to the compute type) into the policy, which the
//   weight sync, the evaluation and the checkpoints read. Every forward of a ZeRO-3 learner
//   gathers over the learners, so they run the same number of passes (GrpoLearner pads). At
//   the checkpoint steps the shards of the optimizer state are all-gathered into a whole-model
//   AdamW (moments, and the master under bf16 / fp16), so a checkpoint is the one-learner
//   layout, and a resume cuts every learner's shard from it.
// - Precision (RlOptions::precision): every rank's policy computes in the policy's type (the
//   rollout ranks with its bf16 GEMMs where the CPU has them, as the one-process rollouts); TP /
//   EP shards keep their fp32 master in the engine, and the whole-model state the learners
//   gather for checkpoints carries it (and fp16's loss scaler restores on every learner).
// With max_staleness = 0, fp32 weight sync and one learner, the run is the synchronous
// algorithm (GrpoTrainer) bit for bit: the same engine samples the same requests from the same
// weights, and the learner sees the groups in the same order. With several learners it is the
// same up to the order of the floating-point sums of the gradient all-reduce.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "rl/grpo_trainer.h"
#include "rl/replay_buffer.h"
#include "rl/rollout.h"
#include "rl/tp_gather.h"
#include "rl/weight_sync.h"
#include "train/gemm_recipes.h"

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
  // Instrumentation for tests: a rollout rank generates step s from exactly version
  // max(s - lead, its first) (lead: max_staleness, less with partial rollouts), never a newer one
  // that has arrived, so that which weights made each step's groups does not depend on timing (a
  // resumed run can then be compared with the uninterrupted one bit for bit at max_staleness > 0).
  bool fixed_lag = false;
  // Tensor-parallel ranks per data-parallel learner group (--learner-tp; divides the learners).
  int learner_tp = 1;
  // With learner_tp > 1: sequence parallelism inside each TP group (--learner-sp; the trainer's
  // parallel.sp): norms and residuals split along the tokens.
  bool learner_sp = false;
  // Data-parallel learner groups the experts of a MoE policy are split over (--learner-ep;
  // divides the groups), and TP ranks each expert's width is split over (--learner-etp; divides
  // learner_tp).
  int learner_ep = 1, learner_etp = 1;
  // With learner_tp, learner_ep or learner_etp > 1, or ZeRO >= 1: after every save_every-th step
  // (0: only the last) the optimizer state is gathered for learner 0's checkpoint
  // (checkpoint_optimizer()).
  int64_t save_every = 0;
  // Learner 0, a resume: the checkpoint's buffered groups (rl_checkpoint.h), trained on first;
  // the rollout ranks start after the last step they cover.
  std::vector<BufferedStep> resume_buffer;
  // Learner 0, a resume with partial rollouts: the checkpoint's unfinished groups; each rollout
  // rank continues its share of them in its first batch.
  std::vector<PromptGroup> resume_carry;
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
  // World rank 0 and ranks K+1..N-1 learn (data-parallel when there are several); ranks 1..K
  // generate.
  bool is_learner() const { return rank_ == 0 || rank_ > K_; }
  int64_t first_step() const { return first_; }
  int64_t steps_taken() const { return step_; }

  // Learner: one step (waits for every rollout rank's groups of this step, learns, broadcasts).
  RlStepStats step();
  // Learner: after the last step, waits until every broadcast was taken (bounded).
  void finish();
  GrpoLearner& learner() { return *learner_; }
  // Learner: the model its optimizer steps (its shard under TP or EP, else the policy).
  Decoder& trained_model() { return shard_ ? *shard_ : policy_; }
  // Learner 0: the optimizer state of the whole model, for a checkpoint after a step that
  // gathers it (every step without TP, EP or ZeRO; with them the save_every-th and the last).
  Optimizer& checkpoint_optimizer() {
    if (whole_optim_) return *whole_optim_;
    return learner_->optimizer();
  }
  ReplayStats buffer_stats() const { return buffer_.stats(); }
  // Learner 0, for a checkpoint between steps: the groups of the next lead steps (max_staleness,
  // less with partial rollouts: those that older weights than the checkpoint's may have
  // generated), received from the rollout ranks now (waiting at most learner_timeout; they need
  // no newer weights) and kept for the steps that train on them. The rollout ranks go on; a resume
  // from them trains on the same groups as the uninterrupted run. Empty on the other ranks and at
  // max_staleness 0. With partial rollouts, *carried (nullable) gets the groups the rollout
  // ranks had cut, unfinished, in their batches of the last of those steps (they target the
  // next): the rollout ranks send them with every batch, and a resume hands them back.
  std::vector<BufferedStep> buffer_contents(std::vector<PromptGroup>* carried = nullptr);

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
    WeightMessage weights;  // learner: a weight broadcast (header: its version, as sent)
  };
  void broadcast_weights();               // learner
  void progress_broadcasts(size_t keep);  // learner: completes those done; waits while > keep
  void apply_weights();                   // rollout: the posted receive completed
  void post_weight_recv();                // rollout: the next version's receive, if one will come
  void post_weight_broadcasts();          // rollout: the receives of one version and its payload
  void wait_work(comm::Work& w, const std::string& what, double timeout = 0);  // 0: learner_timeout
  RolloutBatch receive_step(RlStepStats* st);  // learner 0: every rollout rank's groups of step_
  // Learner 0: receives each rollout rank's messages, in order, until every rank has sent those
  // of the steps before `until` (into ready_); at most learner_timeout, then an error naming the
  // silent ranks.
  void receive_until(int64_t until);
  std::string rollout_name(int world_rank) const;
  void setup_model_parallel();  // learners, TP or EP
  // The learners that hold learner 0's whole model (TP / EP: the gathering group; ZeRO-3: every
  // learner): the whole weights into policy_ after each step; the whole optimizer state at the
  // checkpoint steps.
  void gather_whole(bool state);
  bool checkpoint_step() const;
  // ZeRO >= 1: the whole optimizer state <- every learner's shard (all-gathered over the
  // learners); and a restore's whole state -> this learner's shard.
  void gather_zero_state();
  void cut_zero_state();
  // ZeRO-3: the policy's whole weights <- every learner's master shard, rounded to the compute
  // type (all-gathered over the learners).
  void gather_zero3_weights();

  comm::Communicator& world_;
  Decoder& policy_;
  RlOptions opt_;
  MpiRlOptions mo_;
  int rank_ = 0;
  int K_ = 1, L_ = 1;                                    // rollout ranks, learner ranks
  std::unique_ptr<comm::Communicator> learners_, sync_;  // see the constructor
  int64_t first_ = 0, step_ = 0;
  int64_t have_ = 0;                // rollout: the version held
  int64_t lead_ = 1;                // how far ahead of the learner new groups start (rollout_lead)
  std::vector<PromptGroup> carry_;  // rollout, partial rollouts: groups cut in the last batch
  std::unique_ptr<GrpoLearner> learner_;
  // Tensor and expert parallelism: learner index, TP size, data-parallel groups, EP size; the
  // TP, data-parallel, EP, expert-data-parallel and gathering communicators, this rank's shard of
  // the policy (policy_ stays whole), the whole model's optimizer state (learner 0's checkpoints
  // and restores), the gather (the first T x E learners only).
  int li_ = 0, T_ = 1, D_ = 1, E_ = 1;
  std::unique_ptr<comm::Communicator> tp_, dp_, ep_, edp_, whole_;
  std::unique_ptr<Decoder> shard_;
  std::unique_ptr<AdamW> whole_optim_;
  std::unique_ptr<TpGather> gather_;
  // ZeRO >= 1 over the learners: each learner's count of the flat buffer's shard.
  std::vector<int64_t> zero_counts_;
  ReplayBuffer buffer_;
  std::unique_ptr<RolloutWorker> rollout_;
  GemmRecipes rollout_recipes_;  // rollout rank, bf16 policy: its bf16 GEMMs
  std::deque<Inflight> sends_;   // learner: broadcasts; rollout: trajectory messages
  // Rollout: the posted weight receive.
  // The version arrives as its own int64 broadcast ahead of the payload (wvwork_, then wwork_).
  WeightMessage wbuf_;
  comm::Work wvwork_, wwork_;
  bool wpending_ = false;
  // Learner: each rollout rank's posted header receive (step, bytes).
  std::vector<std::vector<int64_t>> headers_;
  std::vector<comm::Work> hwork_;
  std::vector<int64_t> next_;  // learner 0: the step of each rollout rank's next message
  // Learner 0: the groups of steps received (or restored from a checkpoint) but not yet trained
  // on, merged over the rollout ranks, with the number of ranks whose message is in.
  std::map<int64_t, std::pair<RolloutBatch, int>> ready_;
  // Learner 0, partial rollouts: per step, each rollout rank's unfinished groups after its batch
  // of that step (index: world rank), for checkpoints; the steps before step_ - 1 are let go.
  std::map<int64_t, std::vector<std::vector<PromptGroup>>> carries_;
  std::vector<std::pair<int64_t, uint64_t>> hashes_;
  std::vector<int64_t> ages_;
  double last_step_end_ = 0;
};

}  // namespace loom::rl
