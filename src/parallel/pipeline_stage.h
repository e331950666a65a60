// A pipeline rank's model chunks, run one at a time by the schedule executor (pipeline.h): the
// Decoder holds the layers of its stage (PipelineStage) and offers its pieces (embed,
// forward_layer, head_loss, backward_layer, embed_backward); this class puts them together into
// a chunk's forward, its backward (recomputing the chunk from its kept input) and an evaluation
// forward, with the block hooks where forward_backward calls them. The Decoder itself holds no
// pipeline logic: with the whole model it is the single-process code.
#pragma once

#include <utility>

#include "kernels/buffer.h"
#include "model/decoder.h"

namespace loom::parallel {

class StageRunner {
 public:
  explicit StageRunner(Decoder& model);

  int num_chunks() const { return n_chunks_; }
  // Whether chunk `chunk` embeds the tokens (the first stage's first chunk) or ends in the
  // head and the loss (the last stage's last chunk).
  bool is_first_stage(int chunk) const;
  bool is_last_stage(int chunk) const;
  // Floats of one stage activation (or its gradient): this rank's rows of [N, d_model].
  int64_t act_elems(int N) const { return model_.activation_elems(N); }

  // Chunk `chunk` on x_in (ignored on the first stage, which embeds the tokens), its output to
  // x_out (ignored on the last stage). Buffers of the model's backend.
  void forward(int chunk, const ModelInput& in, const float* x_in, float* x_out);
  // Recomputes the chunk from its input (so only chunk inputs are kept between forward and
  // backward, whatever the number of micro-batches in flight), then runs backward from dx_out
  // (or from the loss on the last stage) and writes the chunk's input gradient to dx_in
  // (embedding gradients on the first stage). Gradients accumulate, each token's loss gradient
  // weighted by dloss. Both call before_block / after_block around each block as
  // forward_backward does (the recomputation's blocks as forward's, except the last, whose hooks
  // span its recomputation and its backward: the block is not released and gathered again
  // between the two). Returns this chunk's part of the loss sum (head loss on the last stage,
  // MoE aux losses).
  double backward(int chunk, const ModelInput& in, const float* x_in, const float* dx_out,
                  float* dx_in, float dloss);
  // Forward only (evaluation): forward, then this chunk's part of the loss sum as backward
  // would return it; no backward, no gradient touched. On the last stage `out` (nullable)
  // receives the sequences' log-probabilities as forward_loss gives them (DPO under PP).
  double forward_loss(int chunk, const ModelInput& in, const float* x_in, float* x_out,
                      StepOutputs* out = nullptr);

 private:
  std::pair<int, int> range(int chunk) const;  // [first layer, end)
  // forward's body; for_backward: backward's recomputation (see there for the hooks).
  void run_forward(int chunk, const ModelInput& in, const float* x_in, float* x_out, float dloss,
                   bool for_backward);

  Decoder& model_;
  int n_chunks_ = 1;
  BackendBuffer recomputed_out_;  // the output of a chunk recomputed for its backward
};

}  // namespace loom::parallel
