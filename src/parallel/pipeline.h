// Pipeline parallelism at run time: a rank walks its action list from a schedule
// (schedule/pipeline_schedule.h: GPipe, 1F1B, interleaved) and runs each action on its Decoder
// stage's chunks (pipeline_stage.h: StageRunner): receives are posted asynchronously and waited
// just before the compute that needs them, sends are asynchronous and waited at the end of the
// step. Between a chunk's forward and its backward only the chunk's input activation is kept (the
// backward recomputes the chunk), so any number of micro-batches in flight costs one [tokens, C]
// buffer each. Those buffers are the model's Backend buffers (device memory on a GPU) and `pp`
// moves them where they are: on a device it must be a device communicator (train/device.h
// make_device_communicator).
//
// Tied embeddings: the first stage (embedding) and the last stage (head) both hold embed.wte;
// after the step's backwards their gradients are summed over the two ranks so the copies stay
// equal after every optimizer step. Under ZeRO-3 the stage's forward and backward gather each
// block just before its use and release it after (the Decoder's block hooks), every DP rank of
// the stage in the same order: they walk the same action list. The loss lives
// on the last stage (plus MoE aux losses on whichever stage holds the layer): run() returns this
// rank's part; sum it over the pipeline.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/buffer.h"
#include "model/decoder.h"
#include "parallel/pipeline_stage.h"
#include "parallel/schedule/pipeline_schedule.h"
#include "parallel/schedule/stage_layers.h"

namespace loom::parallel {

// The Decoder stage of pipeline rank `rank` under `layout` (chunks c = 0..v-1 hold stage
// c*p + rank).
PipelineStage pipeline_stage_of(const pp::StageLayout& layout, int rank);

class PipelineRunner {
 public:
  // Collective over `pp` (builds the first/last-stage group for tied embeddings).
  PipelineRunner(Decoder& model, comm::Communicator& pp, pp::Schedule schedule);

  // One step's forwards and backwards over micro[0..m-1] (every pipeline rank passes the same
  // micro-batches); gradients accumulate with per-token weight dloss. Returns this rank's part
  // of the loss sum. Tied embedding gradients are summed across first and last stage.
  double run(const std::vector<ModelInput>& micro, float dloss);

  // Evaluation: forward passes only, each micro-batch through every stage with activations sent
  // between stages as in run(); no backward, no gradient touched, and last_aux_loss() /
  // last_idle_fraction() keep the last run()'s values. `micro` may hold any number of
  // micro-batches (every pipeline rank passes the same ones); they run in windows of the
  // schedule's m, chunk by chunk. Returns this rank's part of the loss sum (head loss on the
  // last stage, MoE aux losses where their layers are): sum it over the pipeline.
  // `outs` (nullable): on the rank holding the last stage, micro-batch j's sequence
  // log-probabilities in (*outs)[j] (resized to micro.size(); left empty elsewhere).
  // before_micro is called before each micro-batch's forward here too.
  double forward_only(const std::vector<ModelInput>& micro,
                      std::vector<StepOutputs>* outs = nullptr);

  // Called with micro-batch j's index just before each of its forward and backward
  // computations (run() and forward_only()): what depends on which micro-batch runs (LoRA
  // dropout's mask key) follows the schedule's interleaving.
  std::function<void(int microbatch)> before_micro;

  const pp::Schedule& schedule() const { return schedule_; }
  // Of the last run(): the MoE auxiliary losses (N-weighted, already in run()'s return value)
  // of this rank's chunks, and this rank's idle fraction, 1 - (seconds inside forward and
  // backward computations) / (seconds from entering run() until its sends completed): the
  // pipeline bubble plus time spent waiting for neighbours' messages.
  double last_aux_loss() const { return aux_; }
  double last_idle_fraction() const { return idle_; }
  // Per parameter: 1 if this rank counts it in the global gradient norm (a tied embedding
  // counts on the first stage only), else 0. Multiply into other weights.
  std::vector<double> grad_norm_weights() const;

 private:
  int tag(int microbatch, int stage, int kind) const;
  using Buffers = std::map<std::pair<int, int>, BackendBuffer>;
  float* buffer(Buffers& m, int mb, int chunk);
  // Stage s-1 on this rank (p = 1 with v > 1): its output (or input gradient) is copied over.
  void copy_local(Buffers& to, const Buffers& from, int mb, int to_chunk, int from_chunk);
  double forward_window(const ModelInput* micro, int m, int first, std::vector<StepOutputs>* outs);

  Decoder& model_;
  StageRunner stage_;  // this rank's chunks of the model
  comm::Communicator& pp_;
  pp::Schedule schedule_;
  std::unique_ptr<comm::Communicator> tied_;  // first + last stage (p > 1, tied embeddings)
  int64_t n_ = 0;                             // elements of one activation
  double aux_ = 0, idle_ = 0;
  Buffers act_in_, act_out_, grad_in_, grad_out_;
};

}  // namespace loom::parallel
