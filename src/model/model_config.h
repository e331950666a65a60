// The shape of a decoder: one definition, configured into the GPT-2 family (LayerNorm, GeLU
// MLP, learned positions, tied embeddings, biases) or the Llama family (RMSNorm, SwiGLU, RoPE,
// grouped-query attention, untied, no biases).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rope_scaling.h"

namespace loom {

class Config;

enum class Family { GPT2, Llama };
const char* family_name(Family f);

struct ModelConfig {
  std::string name = "custom";
  Family family = Family::GPT2;
  int n_layer = 0;
  int d_model = 0;
  int n_head = 0;
  int n_kv_head = 0;  // == n_head for multi-head attention
  int head_dim = 0;   // d_model / n_head unless set
  int d_ff = 0;       // MLP hidden width (per branch for SwiGLU)
  int vocab = 0;
  int max_seq = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  // Llama 3.1's RoPE frequency scaling (model.rope_scaling = "llama3" with
  // model.rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_seq).
  RopeScaling rope_scaling;
  float init_std = 0.02f;
  bool tied = true;  // output head shares the token embedding
  bool bias = true;  // linear and norm biases
  // Biases on the q, k and v projections only (Qwen2), with bias = false elsewhere.
  bool qkv_bias = false;
  // RMSNorm of each query and key head over its head_dim, before RoPE (Qwen3): one weight of
  // head_dim per layer for the queries (attn.q_norm) and one for the keys (attn.k_norm).
  bool qk_norm = false;
  // Attention sees the last sliding_window positions only (Mistral); 0: every earlier one.
  // Loom's attention kernels attend to every earlier position, so a run whose positions reach
  // the window is refused (Decoder) rather than computed over the wrong keys.
  int sliding_window = 0;
  // Gemma's options (the llama family; docs/finetuning.md). With window_pattern = k > 0 the
  // window is exact (layer by layer, not refused): layer l attends to its last sliding_window
  // positions unless (l + 1) % k == 0, a global layer (Gemma 2: 2, Gemma 3: 6); windowed layers
  // take RoPE base rope_local_theta (0: rope_theta).
  int window_pattern = 0;
  float rope_local_theta = 0.f;
  bool embed_scale = false;    // the embedding's output times sqrt(d_model)
  bool geglu = false;          // MLP gelu_tanh(gate) * up instead of silu(gate) * up
  bool sandwich_norm = false;  // RMSNorm of the attention and MLP outputs (attn/mlp.post_norm)
  float attn_softcap = 0.f;    // > 0: scores = cap * tanh(scores / cap)
  float final_softcap = 0.f;   // > 0: logits = cap * tanh(logits / cap)
  float attn_scalar = 0.f;     // > 0: scores scaled by attn_scalar^-1/2 instead of head_dim^-1/2
  // The Hugging Face family export writes where the options alone do not decide it ("phi3":
  // Llama's model in Phi-3's fused layout; "": from the options). Not part of the shape.
  std::string hf_family;
  // Mixture of experts (docs/parallel.md): n_experts = 0 is a dense model. A MoE layer replaces
  // the MLP with a router (top_k of n_experts, softmax or sigmoid scores) and n_experts expert
  // MLPs of width d_ff (GeLU for gpt2, SwiGLU for llama; no biases). Layer l is a MoE layer when
  // l % moe_layer_freq == 0 (1: every layer). capacity_factor 0 = dropless routing.
  int n_experts = 0;
  int top_k = 2;
  std::string moe_router = "softmax";  // softmax | sigmoid
  double capacity_factor = 0.0;
  double aux_loss_coeff = 0.01;
  int moe_layer_freq = 1;
  // A scalar value head (reward models): score.weight [1, d_model] on the final norm's output,
  // read at rows ModelInput::value_rows instead of the language-model head. model.value_head,
  // true by default for train.mode = "reward".
  bool value_head = false;

  bool uses_rope() const { return family == Family::Llama; }
  bool uses_positions_table() const { return family == Family::GPT2; }
  int qkv_dim() const { return (n_head + 2 * n_kv_head) * head_dim; }
  bool has_qkv_bias() const { return bias || qkv_bias; }
  int fc_dim() const { return family == Family::Llama ? 2 * d_ff : d_ff; }
  bool is_moe() const { return n_experts > 0; }
  // Layer l's exact window (0: every earlier position; Mistral's refused window is not one).
  int layer_window(int l) const {
    return window_pattern > 0 && sliding_window > 0 && (l + 1) % window_pattern != 0
               ? sliding_window
               : 0;
  }
  float layer_rope_theta(int l) const {
    return layer_window(l) > 0 && rope_local_theta > 0 ? rope_local_theta : rope_theta;
  }
  float attn_scale() const;
  // Whether layer l's attention needs the variant kernel (a window or soft-capped scores).
  bool layer_attention_variant(int l) const { return layer_window(l) > 0 || attn_softcap > 0; }
  // Any Gemma option: what only the CPU backend computes and tensor/context parallelism refuse.
  bool uses_gemma_ops() const {
    return window_pattern > 0 || geglu || sandwich_norm || attn_softcap > 0 || final_softcap > 0;
  }
  bool is_moe_layer(int l) const { return n_experts > 0 && l % moe_layer_freq == 0; }
  int num_moe_layers() const;

  // Throws naming the field for impossible shapes (heads not dividing width, ...).
  void validate() const;
  int64_t num_params() const;
  // Training FLOPs per token for sequence length `seq`: 6 * (non-embedding-lookup params)
  // plus causal attention (6 * n_layer * seq * Hq * head_dim: QK^T and PV, forward and
  // backward, halved for the causal mask).
  double train_flops_per_token(int seq) const;
  // A stable description of every shape-determining field (checkpoint compatibility).
  std::string fingerprint() const;
};

// Named presets: tiny, tiny-llama, gpt2-124m, gpt2-350m, llama-1b, llama-8b tiny-moe,
// tiny-llama-moe, mixtral-8x7b.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// Reads [model] from a config: `preset` then any field overrides (model.n_layer = ...).
ModelConfig model_config_from(const Config& cfg);
// The same over a given starting shape instead of model.preset (which it does not read): the
// planner's published shapes (plan/model.h) take the trainer's keys this way.
ModelConfig model_config_from(const Config& cfg, ModelConfig base);

}  // namespace loom
