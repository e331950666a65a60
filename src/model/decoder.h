// The decoder: embedding -> n_layer x [norm, attention, residual, norm, MLP, residual] ->
// final norm -> output head fused with softmax cross-entropy. Every layer has an explicit
// forward and backward over plain buffers; nothing here knows about data parallelism, precision
// policies beyond "round activations to this dtype", or the optimizer. Tensor and sequence
// parallelism are a layout handed in from outside (TensorParallel): the same code runs with
// local head counts and widths, and the communication lives behind model/parallel_ops.h (the
// edges of each Linear, the vocabulary, the attention core), implemented in parallel/; with
// the default layout (one rank) it is the single-process model, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/recompute.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/context_parallel.h"
#include "model/hooks.h"
#include "model/linear.h"
#include "model/model_config.h"
#include "model/moe_layer.h"
#include "model/parallel_ops.h"
#include "model/params.h"

namespace loom {

// One micro-batch of N tokens made of nseq sequences (rows of a batch, or packed documents).
struct ModelInput {
  const int32_t* tokens = nullptr;      // [N]
  const int32_t* targets = nullptr;     // [N], -1 = no loss at this position
  const int32_t* positions = nullptr;   // [N], position of each token within its sequence
  const int32_t* cu_seqlens = nullptr;  // [nseq + 1]
  int N = 0;
  int nseq = 0;
  // Context parallelism: the tokens above are this rank's share (CpBatch::shards[cp rank]:
  // gathered rows, their positions, local_cu_seqlens) and `cp` holds every rank's shard.
  const CpBatch* cp = nullptr;
  // [N] per-token loss weights (nullptr = 1 everywhere): token i's loss enters the returned
  // sum as w[i] * loss[i] and its gradient is scaled by w[i]. 0 masks a token exactly as a
  // target of -1 does (SFT prompt masking); negative weights are allowed (DPO, GRPO).
  const float* loss_weights = nullptr;
  // The MoE auxiliary loss's gradient weight per token of this pass, in dloss's units
  // (negative: dloss itself, the trainer's case, where dloss = 1 / the step's tokens). A pass
  // whose dloss is not a per-token mean (DPO and GRPO pass 1 and carry their normalisation in
  // loss_weights) sets it to 1 / the step's tokens, so the auxiliary loss is averaged as the
  // trainer averages it instead of weighted by the pass's token count.
  float aux_weight = -1.f;
  // The head's logits are multiplied by this before the softmax (1 / the sampling temperature:
  // GRPO's learner takes log-probabilities of the distribution its rollouts sampled from, as
  // TRL and verl do); the loss, the gradients, StepOutputs and forward_logits all see the scaled
  // logits. Must be finite and > 0.
  float logit_scale = 1.f;
  // A value head (ModelConfig::value_head, reward models): sequence j's score is
  // score.weight . h, h the final norm's output at row value_rows[j] (its last token). With
  // value_rows set the head computes these n_values scores instead of the language-model loss
  // (StepOutputs::values; the loss returned is sum_j value_grads[j] * score_j, 0 without them),
  // and a backward takes value_grads[j] = dL/dscore_j. Not under tensor, pipeline or context
  // parallelism.
  const int32_t* value_rows = nullptr;
  const float* value_grads = nullptr;
  int n_values = 0;
};

// What a forward reports besides the loss sum, for post-training (DPO, GRPO) and evaluation.
struct StepOutputs {
  // Per sequence of the micro-batch (cu_seqlens): the sum over its tokens with a target
  // (target >= 0) of log p(target), unweighted, summed in fp64 in token order.
  std::vector<double> seq_logprobs;
  // Per token, filled when want_token_logprobs: log p(target), 0 where target < 0.
  bool want_token_logprobs = false;
  std::vector<float> token_logprobs;
  // ModelInput::value_rows set: each sequence's score (fp32 values, widened).
  std::vector<double> values;
};

// A layer's attention core in a forward-only pass when its keys and values are not just the
// micro-batch's own (the serving engine's paged KV cache): applied from outside the model.
class ForwardAttention {
 public:
  virtual ~ForwardAttention() = default;
  // qkv: [N, ld] rows of layer `layer` (Hq query heads, then Hkv key and Hkv value heads of D
  // dims, RoPE applied); writes out[N, Hq * D].
  // window > 0: the query sees its last `window` positions only; softcap > 0: scores capped
  // to softcap * tanh(score / softcap) (Gemma's layers; 0 and 0 otherwise).
  virtual void forward(int layer, const float* qkv, int ld, int Hq, int Hkv, int D, float scale,
                       int window, float softcap, float* out) = 0;
};

// Megatron-style tensor parallelism over `size` ranks (docs/parallel.md): attention split by
// heads (query and KV heads), the MLP column- then row-parallel, vocabulary-parallel embedding
// and output head with a cross-entropy that never gathers logits. With sequence_parallel, the
// residual stream, norms and their inputs are split along tokens too, and all-gather /
// reduce-scatter replace the all-reduces.
struct TensorParallel {
  int size = 1, rank = 0;
  bool sequence_parallel = false;
  comm::Communicator* comm = nullptr;  // the tensor-parallel group (size > 1)
  // The layout's communication, made for each Decoder: parallel::tensor_parallel_layout (or
  // with_tensor_parallel_ops) fills these in. With size > 1 and none, the Decoder holds its
  // shard's parameters (checkpoint consolidation) but refuses to run a step.
  std::unique_ptr<TensorParallelOps> (*make_ops)(const TensorParallel&, Backend&) = nullptr;
  std::unique_ptr<VocabOps> (*make_vocab)(const TensorParallel&, TensorParallelOps&, int vocab,
                                          Backend&) = nullptr;
  // Throws naming the field when the model does not split over `size` ranks.
  void validate(const ModelConfig& cfg) const;
};

// Pipeline parallelism: the layer ranges (model chunks, in chunk order) this rank holds, and
// whether it holds the first stage (embedding; its first chunk starts at layer 0) and the last
// (final norm, output head and loss; its last chunk ends at n_layer). Empty chunks: the whole
// model (one stage). A tied embedding lives on both the first and the last stage.
struct PipelineStage {
  std::vector<std::pair<int, int>> chunks;  // [begin, end) per chunk
  bool first = true, last = true;
  bool whole() const { return chunks.empty(); }
};

class Decoder {
 public:
  Decoder(const ModelConfig& cfg, Backend& backend, Recompute recompute = Recompute::None,
          DType act_dtype = DType::F32, const TensorParallel& tp = {},
          const ExpertParallel& ep = {}, const PipelineStage& pp = {});
  ~Decoder();
  // b_ points into the object itself.
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  const TensorParallel& tensor_parallel() const { return tp_; }
  // Context parallelism (the attention core cp.make_attention makes: ring attention over
  // cp.comm, parallel::context_parallel_layout); inputs then carry ModelInput::cp.
  void set_context_parallel(const ContextParallel& cp);
  const ContextParallel& context_parallel() const { return cp_; }
  const ExpertParallel& expert_parallel() const { return ep_; }

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() const { return be_; }  // where its buffers live and its ops run
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  DType act_dtype() const { return act_dtype_; }
  // Under the bf16 policy activations are stored in bf16 (2 bytes each). This keeps them in
  // fp32 containers holding the same rounded values instead (what fp16 does): the reference
  // the typed storage is tested against, bit for bit. Before the first forward only.
  void store_activations_as_fp32();

  // Forward and backward in one call (the head is fused with the loss). Each token's loss
  // gradient is `dloss` (e.g. 1 / tokens in the global batch, times a loss scale) times its
  // loss weight; parameter gradients ACCUMULATE into params().grad(), except frozen
  // parameters' (ParamInfo::trainable), which are never written and whose weight-gradient GEMMs
  // are skipped. Returns the sum of the (weighted) per-token losses; `out` (nullable) receives
  // the sequences' log-probabilities (whole model only: a pipeline's last stage gets them from
  // parallel::StageRunner::forward_loss; under context parallelism summed over the CP group, so
  // every CP rank gets whole sequences' values). A MoE model adds each MoE layer's auxiliary
  // load-balancing loss weighted by the micro-batch's token count N (a per-token term, averaged
  // like the language-model loss; its gradient weight is dloss * N), included in the returned sum
  // (and in last_aux_loss()).
  double forward_backward(const ModelInput& in, float dloss, StepOutputs* out = nullptr);
  // Forward only, keeping one layer's activations at a time (evaluation, reference models);
  // returns the sum of the (weighted) per-token losses, as forward_backward would.
  double forward_loss(const ModelInput& in, StepOutputs* out = nullptr);
  // Forward only, one layer's activations at a time: logits [rows.size(), vocab] of the given
  // token rows. `attention` (nullable) replaces every layer's attention core (the serving
  // engine's KV cache); without it, packed causal attention over in.cu_seqlens. Under tensor
  // parallelism every rank of the group calls it with the same input and rows and gets the full
  // rows (the vocabulary slices all-gathered); under sequence parallelism too (in.N must then
  // split over the group, as for a step: the final norm's rows are gathered before the head).
  void forward_logits(const ModelInput& in, const std::vector<int>& rows, float* logits,
                      ForwardAttention* attention = nullptr);
  // Forward only, as forward_logits: the final norm's output (the head's input) of the given
  // token rows, [rows.size(), d_model] fp32 on the host (embeddings, infer/embeddings.h).
  void forward_hidden(const ModelInput& in, const std::vector<int>& rows, float* hidden);

  // Called after backward has finished the gradients of block `layer` (last to first), then
  // with -1 for the embedding: the hook for overlapping gradient communication.
  // Each hook takes several subscribers (model/hooks.h: subscribe / unsubscribe), called in
  // the order they subscribed; assigning a function replaces them all (nullptr clears).
  Hook<int> on_grads_ready;
  // Called just before block `layer` runs (forward, or backward including its recomputation)
  // and just after: the hooks for parameters that live elsewhere between uses (ZeRO-3 gathers
  // a block's parameters in before_block and frees them in after_block).
  Hook<int, bool> before_block, after_block;

  // The layers this rank holds under pipeline parallelism (build_params holds only those).
  const PipelineStage& pipeline_stage() const { return pp_; }
  bool holds_layer(int l) const;

  // The model in pieces, for what runs a range of its layers at a time: a pipeline stage's
  // chunks (parallel/pipeline_stage.h, driven by the schedule executor of parallel/pipeline.h).
  // forward_backward is the same pieces over every layer. A pass over micro-batch `in` starts
  // with begin_pass (input checks, buffers sized, inputs uploaded, the MoE aux sum reset; dloss
  // is each token's loss-gradient weight, as forward_backward's), then: embed, or the input
  // activation written to layer_input(first layer); forward_layer per layer (with the block
  // hooks called by the caller); on the last stage head_loss; or the output gradient written to
  // residual_grad(); backward_layer per layer, last to first; embed_backward on the first stage.
  // Activations and their gradients are this rank's rows: [activation_elems(N)] floats,
  // buffers of backend().
  int64_t activation_elems(int N) const { return int64_t(local_rows(N)) * cfg_.d_model; }
  void begin_pass(const ModelInput& in, float dloss);
  void embed(const ModelInput& in);
  float* layer_input(int l) { return b_->layers[l].x_in; }
  float* final_hidden() { return b_->x_final; }  // the last layer's output: the head's input
  float* residual_grad() { return b_->dres; }
  // Layer l forward into x_out (the next layer's input, final_hidden(), or the caller's buffer).
  void forward_layer(int l, const ModelInput& in, float* x_out);
  // The final norm, head and loss on final_hidden() (with grads, residual_grad() then holds the
  // gradient of the last layer's output); returns the (weighted) loss sum.
  double head_loss(const ModelInput& in, bool grads);
  // Layer l's backward from residual_grad() (recomputing what the recompute mode did not keep;
  // under Recompute::Full after forward_layer of the same pass) into residual_grad().
  void backward_layer(int l, const ModelInput& in);
  void embed_backward(const ModelInput& in);
  // The sequences' log-probabilities of the last head_loss into `out`.
  void collect_outputs(const ModelInput& in, StepOutputs* out) const;

  // Linear layers by name ("blocks.<l>.attn.qkv", "blocks.<l>.attn.proj", "blocks.<l>.mlp.fc",
  // "blocks.<l>.mlp.proj", "head"; those this rank holds), with their local shapes [in, out]:
  // what adapters and recipes attach to. The model does not own what is attached.
  struct LinearInfo {
    std::string name;
    int in = 0, out = 0;
  };
  std::vector<LinearInfo> linears() const;
  void attach_adapter(const std::string& linear, LinearAdapter* adapter);  // nullptr detaches
  void attach_recipe(const std::string& linear, GemmRecipe* recipe);

  // The N-weighted auxiliary loss summed over MoE layers in the last forward (0 when dense).
  double last_aux_loss() const { return aux_sum_; }
  // Layer l's MoE layer (routing statistics), or nullptr for a dense layer.
  const MoeLayer* moe_layer(int l) const { return moe_.empty() ? nullptr : moe_[l].get(); }

  // Rows of logits materialised at once (more rows per chunk make the head's weight-gradient
  // GEMM less memory-bound), at least 16: on the CPU's kernels as many as fit in ~64 MB, at most
  // 256; on a GPU (whose head GEMMs want thousands of rows) as many as fit in ~1 GiB, at most
  // 4096. The arena holds no more rows than the largest batch.
  int head_chunk() const;
  // Overrides that rule (0: back to it); before the first forward.
  void set_head_rows(int rows);
  // Bytes held in the training activation buffers for the largest batch so far.
  size_t activation_bytes() const { return train_buf_.mem.bytes(); }
  // Bytes held in the forward-only buffers (forward_loss, forward_logits).
  size_t forward_only_bytes() const { return infer_buf_.mem.bytes(); }

 private:
  struct Norm {
    const float *w = nullptr, *b = nullptr;
    float *dw = nullptr, *db = nullptr;  // nullptr when frozen
  };
  struct LayerParams {
    Norm ln1, ln2;
    Norm q_norm, k_norm;       // model.qk_norm only
    Norm post_attn, post_mlp;  // model.sandwich_norm only
    Linear qkv, proj, fc, mp;  // fc and mp (the MLP) unbound in a MoE layer
  };
  // Under the bf16 policy the GEMM inputs and what attention and the MLP read back in backward
  // (ln1, qkv, att, ln2, fc) are kept in bf16, and the MLP activation is not kept at all: it is
  // recomputed from fc in backward (one elementwise pass) into a buffer all layers share.
  struct LayerActs {
    float* x_in = nullptr;
    ActBuf ln1;
    float *ln1_mean = nullptr, *ln1_rstd = nullptr;
    ActBuf qkv, att;
    // model.qk_norm: the query heads [N * Hq, D], then the key heads [N * Hkv, D], before their
    // norm, and the norm's rstd of each head row.
    float *qk_raw = nullptr, *qk_rstd = nullptr;
    float* lse = nullptr;
    float* x_mid = nullptr;
    ActBuf ln2;
    float *ln2_mean = nullptr, *ln2_rstd = nullptr;
    ActBuf fc, act;
    // model.sandwich_norm: the attention and MLP outputs before their RMSNorm (fp32), and its
    // rstd per row.
    float *post_attn_in = nullptr, *post_attn_rstd = nullptr;
    float *post_mlp_in = nullptr, *post_mlp_rstd = nullptr;
  };

  void build_params();
  // Layer l's parameters: built once and kept (per token a decode step would otherwise build
  // ~12 names and make ~24 string-keyed look-ups per layer), rebuilt when anything they are
  // made from may have changed (layer_params_key()).
  LayerParams layer_params(int l);
  LayerParams build_layer_params(int l);
  Norm norm_params(const std::string& prefix);
  // With what is attached to it, and its split over the tensor-parallel group.
  Linear linear(const std::string& prefix, int in, int out, Linear::Split split);
  Linear head_linear();
  void scale_head_input(int N, float s);
  double value_head(const ModelInput& in, bool grads);
  float* grad_of(const std::string& name);  // nullptr when absent or frozen
  // Sizes the active buffers (train_buf_, or infer_buf_ in a forward-only pass) for N tokens.
  void ensure_buffers(int N);
  // The micro-batch's token ids, targets, positions and loss weights copied into the active
  // buffers (b_->tokens ...): what the ops read. The host arrays of ModelInput stay what the
  // input checks and the host-side bookkeeping (sequence sums) read.
  void upload_input(const ModelInput& in);
  // Backend scratch of at least n floats in `buf` (grown, never shrunk; contents undefined).
  float* scratch(BackendBuffer& buf, int64_t n);
  void use_forward_only_buffers(bool on) { b_ = on ? &infer_buf_ : &train_buf_; }
  struct ForwardOnlyScope;
  // The forward-only pass up to the final norm; leaves the chosen rows side by side in
  // b_->tmp (fp32).
  void forward_final_rows(const ModelInput& in, const std::vector<int>& rows,
                          ForwardAttention* attention);
  void forward_blocks(const ModelInput& in);  // every block, with the before/after hooks
  void block_forward(int l, const ModelInput& in, const LayerActs& a, float* x_out);
  // model.qk_norm: the per-head RMSNorm of qkv's query and key heads (fp32 [N, qkv_] rows, in
  // place, before RoPE), and its backward on dqkv (after RoPE's).
  void qk_norm_forward(const LayerParams& p, const LayerActs& a, float* qkv, int N);
  void qk_norm_backward(const LayerParams& p, const LayerActs& a, float* dqkv, int N);
  // Layer l's attention over qkv's fp32 values into a.att (and a.lse).
  void attention_core(int l, const ModelInput& in, const LayerActs& a, const float* qkv);
  // model.sandwich_norm: o (this rank's Nl rows of a branch output) normalised in place, its
  // input kept in `saved` and rstd in `rstd`; the backward from d into dout (b_->dpost).
  void post_norm_forward(const Norm& p, float* o, float* saved, float* rstd, int Nl);
  const float* post_norm_backward(const Norm& p, const float* d, const float* saved,
                                  const float* rstd, int Nl);
  void block_backward(int l, const ModelInput& in, const LayerActs& a, float* dres);
  void recompute_and_backward(int l, const ModelInput& in);
  // Normalises N rows of inp into out's rows from `offset` on (typed: bf16 storage rounds).
  void norm_forward(const ActBuf& out, int64_t offset, float* mean, float* rstd, const float* inp,
                    const float* w, const float* b, int N);
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, const float* mean, const float* rstd, int N);
  // Norm backward over this rank's rows; the norm's parameter gradients summed over the group
  // where the rows are split (SP).
  void norm_backward(float* dinp, const Norm& p, const float* dout, const float* inp,
                     const float* mean, const float* rstd, int N);
  // Final norm + head over chunks of rows; with grads, fills dres (d of the last residual).
  double head(const ModelInput& in, float dloss, bool grads);
  void final_norm(int N);
  const float* head_weight();
  float* head_grad();
  void round_act(float* x, int64_t n) const;
  // round_act of the output gradient dy (n elements) that lin's backward reads next; a bf16
  // recipe gets dy's bf16 bits stored in the same pass (GemmRecipe::dy_bits).
  void round_grad(const Linear& lin, float* dy, int64_t n) const;
  // Typed storage (bf16 policy). Where an fp32 producer of `buf` writes: buf itself, or the
  // fp32 scratch whose values are then stored (keep: rounded as the policy says, and written
  // to bf16 storage; the scratch keeps the rounded values for fp32 readers that follow).
  static float* fp32_out(const ActBuf& buf, float* scratch) { return buf.f32 ? buf.f32 : scratch; }
  void keep(const ActBuf& buf, float* x, int64_t n);
  // buf's fp32 values: itself, or widened into scratch.
  const float* fp32_in(const ActBuf& buf, int64_t n, float* scratch) const;
  // The MLP's activation act = gelu(fc) / swiglu(fc) of N rows into a.act (rounded), from fc's
  // fp32 values (fc32) or, when null, from a.fc's bf16 storage, in cache-sized row blocks.
  void mlp_act_forward(const LayerActs& a, const float* fc32, int N);
  // dfc = the activation's backward from dact (rounded here to the activation type first),
  // reading fc as stored; dfc rounded as fc's backward reads it (round_grad).
  void mlp_act_backward(const LayerActs& a, float* dfc, float* dact, int N, const Linear& fc);
  // Rows per block of a [N, width] pass that widens bf16 rows into cache-sized scratch (on a
  // GPU all N rows at once).
  int block_rows(int width, int N) const;
  double run(const ModelInput& in, float dloss, bool grads);

  // Where parallelism lives (model/parallel_ops.h): the tensor-parallel edges and token split,
  // the vocabulary, the attention core. One-process implementations unless a layout brings its
  // own; null tpo_ / vocab_ops_ when a size > 1 layout brought none (no step runs).
  void shard_params();
  // Throws when a size > 1 layout brought no communication (TensorParallel::make_ops); checks
  // that the micro-batch's tokens split over the group under SP.
  void check_layout(const ModelInput& in) const;
  bool sp_on() const { return tp_.size > 1 && tp_.sequence_parallel; }
  int local_rows(int N) const { return tpo_->local_rows(N); }
  int row0(int N) const { return tpo_->row0(N); }
  std::unique_ptr<TensorParallelOps> tpo_;
  std::unique_ptr<VocabOps> vocab_ops_;
  std::unique_ptr<AttentionCore> packed_attention_;
  AttentionCore* attention_ = nullptr;  // packed_attention_, or cp_attention_ under CP

  MoeWeights moe_weights(int l, bool grads);

  ModelConfig cfg_;
  TensorParallel tp_;
  ExpertParallel ep_;
  PipelineStage pp_;
  ContextParallel cp_;
  std::unique_ptr<AttentionCore> cp_attention_;  // under CP: the layout's (ring) attention
  std::vector<std::unique_ptr<MoeLayer>> moe_;   // per layer (null for dense layers)
  double aux_sum_ = 0;
  int head_rows_ = 0;  // set_head_rows (0: head_chunk's rule)
  float dloss_ = 0;
  float aux_dloss_ = 0;  // ModelInput::aux_weight, or dloss_
  // Local sizes on this tensor-parallel rank.
  int hq_ = 0, hkv_ = 0, qkv_ = 0, att_ = 0, ff_ = 0, fc_ = 0, vocab_ = 0, v0_ = 0;
  Backend& be_;
  Recompute recompute_;
  DType act_dtype_;
  bool store_bf16_;  // the bf16 policy: activations stored in bf16 (ActBuf)
  ParamSet params_;
  // Cache-sized fp32 scratch for row-blocked passes over bf16 storage, and MoE's widened input.
  BackendBuffer blk_a_, blk_b_, moe_in_;
  BackendBuffer value_buf_,
      value_dx_;  // the value head's scores and gradients, its input's gradient
  std::vector<float> values_host_;
  // Linear's widened input on the fp32 GEMM paths over bf16 storage (Linear::widen): a buffer of
  // this backend, so that the CUDA backend's GEMMs never receive host memory.
  BackendBuffer widen_;

  // Activation buffers: one arena (a Backend buffer: device memory on a GPU), and views into it.
  // Training keeps what the recompute mode says; a forward-only pass keeps one layer (every layer
  // shares one set of views, and the residual stream alternates between two buffers). Two
  // instances, so that evaluation or generation between training steps never reallocates the
  // training arena.
  struct Buffers {
    bool forward_only = false;
    int N = 0;  // tokens the buffers are sized for
    BackendBuffer mem;
    std::vector<LayerActs> layers;  // per layer (views into mem; shared under recompute)
    float* x_final = nullptr;
    ActBuf lnf;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr;
    // bf16 storage only: fp32 working copies of one layer's qkv, attention output and fc.
    float *q32 = nullptr, *att32 = nullptr, *fc32 = nullptr;
    float* logits = nullptr;  // [chunk, vocab]
    float* losses = nullptr;  // [N]
    float* tmp = nullptr;     // [N, C] row-parallel output
    // backward scratch (training only)
    float *dres = nullptr, *dln = nullptr, *dtmp = nullptr, *datt = nullptr, *dqkv = nullptr,
          *dfc = nullptr, *dact = nullptr;
    float* dpost = nullptr;   // model.sandwich_norm: a branch output's gradient [N, C]
    float* capped = nullptr;  // model.final_softcap: a logits chunk after the cap
    // The micro-batch's inputs on the device (upload_input); targets and weights null when the
    // input has none.
    BackendBuffer io;
    int32_t *tokens = nullptr, *targets = nullptr, *positions = nullptr;
    float* weights = nullptr;
    // forward_logits on a backend whose memory the host cannot read: the logits computed here,
    // then copied to the caller's array.
    BackendBuffer logits_out;
  };
  Buffers train_buf_, infer_buf_ = forward_only_buffers();
  static Buffers forward_only_buffers() {
    Buffers b;
    b.forward_only = true;
    return b;
  }
  Buffers* b_ = &train_buf_;
  ForwardAttention* attention_override_ = nullptr;  // during forward_logits only
  std::map<std::string, LinearAdapter*> adapters_;
  std::map<std::string, GemmRecipe*> recipes_;
  // layer_params' cache and what it was built from: the parameter set's layout version (names,
  // buffers, trainable flags), its buffers, the tensor-parallel ops, and attach_generation_
  // (advanced by every attach_adapter / attach_recipe).
  struct LayerParamsKey {
    uint64_t layout = 0, attach = 0;
    const float *data = nullptr, *grad = nullptr;
    const void* tpo = nullptr;
    bool operator==(const LayerParamsKey&) const = default;
  };
  LayerParamsKey layer_params_key();
  uint64_t attach_generation_ = 0;
  LayerParamsKey layer_params_built_;
  std::vector<LayerParams> layer_params_cache_;
  std::vector<char> layer_params_valid_;
};

}  // namespace loom
