// A transformer described by its shape alone (no weights): what the planner needs to count
// parameters, FLOPs and activation bytes. Dense GPT-2/Llama-style models and top-k MoE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::plan {

struct ModelSpec {
  std::string name = "custom";
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: same as heads (multi-head attention)
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 0;       // MLP inner size (per expert for MoE)
  int64_t vocab = 0;
  int64_t seq = 0;        // training sequence length
  int64_t positions = 0;  // rows of the learned position table (0: seq)
  int64_t experts = 0;    // 0 or 1: dense MLP
  int64_t top_k = 1;      // experts each token is routed to
  bool gated_mlp = true;  // SwiGLU (3 matrices) vs GeLU/ReLU^2 (2 matrices)
  bool tied_embeddings = false;
  bool bias = false;               // linear and norm biases (GPT-2, Megatron GPT)
  bool learned_positions = false;  // absolute position table of `seq` rows
  bool dropout = false;            // dropout masks are kept for backward

  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t hd() const { return head_dim > 0 ? head_dim : hidden / heads; }
  bool moe() const { return experts > 1; }
};

// Parameter counts, split the way parallelism shards them.
struct ParamCounts {
  double attn = 0;       // per layer: QKV + output projection (+ biases)
  double mlp = 0;        // per layer: dense MLP, or one expert for MoE
  double router = 0;     // per layer (MoE only)
  double norms = 0;      // per layer
  double embedding = 0;  // token (+ position) table
  double output = 0;     // LM head (0 when tied) + final norm
  double per_layer_dense() const { return attn + norms + router; }
  double per_layer_experts(const ModelSpec& m) const { return m.moe() ? mlp * m.experts : mlp; }
  double total(const ModelSpec& m) const;
  double active(const ModelSpec& m) const;  // parameters one token touches
};

ParamCounts count_params(const ModelSpec& m);

// Forward FLOPs per token. GEMMs are 2 FLOPs per multiply-add; attention counts QK^T and AV
// over `kv_len` keys (the caller decides whether causal masking halves it).
double layer_gemm_flops_per_token(const ModelSpec& m);
double attention_flops_per_token(const ModelSpec& m, double kv_len);
double logits_flops_per_token(const ModelSpec& m);

// Checks that the shape is complete and consistent; throws naming the field.
void validate(const ModelSpec& m);

// Presets: gpt2-124m, llama3-1b/8b/70b/405b, gpt3-175b, nemotron4-340b, mixtral-8x7b,
// mixtral-8x22b and the Megatron-LM scaling-table models megatron-1.7b ... megatron-1t.
ModelSpec model_preset(const std::string& name);  // throws listing the known names
std::vector<std::string> model_preset_names();

}  // namespace loom::plan
