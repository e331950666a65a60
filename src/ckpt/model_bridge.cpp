#include "ckpt/model_bridge.h"

#include "core/error.h"

namespace loom::ckpt {

HfModelShape hf_shape_of(const ModelConfig& c) {
  // Mixtral and Qwen3-MoE: every layer sparse, dropless softmax routing over 2+ experts a
  // token, the top k renormalised.
  if (c.is_moe())
    LOOM_CHECK(c.family == Family::Llama && c.moe_router == "softmax" && c.moe_layer_freq == 1 &&
                   c.capacity_factor == 0 && c.top_k >= 2 && !c.qkv_bias,
               "model '", c.name, "': a mixture of experts maps to Hugging Face's Mixtral or ",
               "Qwen3-MoE only with the llama family, model.moe_router = softmax, ",
               "model.moe_layer_freq = 1, model.capacity_factor = 0, model.top_k >= 2 and no ",
               "model.qkv_bias (got ", family_name(c.family), ", ", c.moe_router, ", ",
               c.moe_layer_freq, ", ", c.capacity_factor, ", ", c.top_k, ", ", c.qkv_bias, ")");
  HfModelShape s;
  s.family = family_name(c.family);
  // The Llama-layout families differ from Llama in one option each; Loom's configs may not
  // combine them.
  const bool gemma = c.geglu || c.embed_scale || c.sandwich_norm || c.window_pattern > 0 ||
                     c.attn_softcap > 0 || c.final_softcap > 0 || c.attn_scalar > 0 ||
                     c.rope_local_theta > 0;
  if (gemma) {
    // Gemma: GeGLU and the scaled embedding always; Gemma 2 and 3 add the sandwich norms, Gemma
    // 3 the q/k norms.
    LOOM_CHECK(c.family == Family::Llama && c.geglu && c.embed_scale && !c.qkv_bias &&
                   !c.is_moe() && (c.sandwich_norm || !c.qk_norm),
               "model '", c.name, "': Gemma's options map to Hugging Face's gemma families only ",
               "with model.geglu and model.embed_scale, without model.qkv_bias or experts, and ",
               "model.qk_norm only with model.sandwich_norm (Gemma 3)");
    LOOM_CHECK(c.sliding_window == 0 || c.window_pattern > 0, "model '", c.name,
               "': a Gemma model's window needs model.window_pattern (2: Gemma 2, 6: Gemma 3)");
    s.family = !c.sandwich_norm ? "gemma" : c.qk_norm ? "gemma3_text" : "gemma2";
  } else if (c.hf_family == "phi3") {
    // Phi-3: Llama's model (a window as Mistral's) with q/k/v and gate/up fused in its files.
    LOOM_CHECK(c.family == Family::Llama && !c.qkv_bias && !c.qk_norm && !c.is_moe(), "model '",
               c.name, "': model.hf_family = phi3 needs the llama family without ",
               "model.qkv_bias, model.qk_norm or experts");
    s.family = "phi3";
  } else if (c.family == Family::Llama) {
    LOOM_CHECK(int(c.qkv_bias) + int(c.qk_norm) + int(c.sliding_window > 0) <= 1, "model '", c.name,
               "' combines model.qkv_bias (", c.qkv_bias, "), model.qk_norm (", c.qk_norm,
               ") and model.sliding_window (", c.sliding_window,
               "): no Hugging Face family has more than one of them");
    if (c.qkv_bias) s.family = "qwen2";
    if (c.qk_norm) s.family = "qwen3";
    if (c.sliding_window > 0) s.family = "mistral";
    if (c.is_moe()) s.family = c.qk_norm ? "qwen3_moe" : "mixtral";
  } else {
    LOOM_CHECK(!c.qkv_bias && !c.qk_norm && c.sliding_window == 0, "model '", c.name,
               "': GPT-2 on Hugging Face has no q/k norm, separate q/k/v biases or sliding window");
  }
  s.sliding_window = c.sliding_window;
  s.window_pattern = c.window_pattern;
  s.attn_scalar = c.attn_scalar;
  s.attn_softcap = c.attn_softcap;
  s.final_softcap = c.final_softcap;
  s.rope_local_theta = c.rope_local_theta;
  s.n_experts = c.n_experts;
  s.top_k = c.is_moe() ? c.top_k : 0;
  s.n_layer = c.n_layer;
  s.d_model = c.d_model;
  s.n_head = c.n_head;
  s.n_kv_head = c.n_kv_head;
  s.head_dim = c.head_dim;
  s.d_ff = c.d_ff;
  s.vocab = c.vocab;
  s.max_seq = c.max_seq;
  s.norm_eps = c.norm_eps;
  s.rope_theta = c.rope_theta;
  s.rope_scaling = c.rope_scaling;
  s.tied = c.tied;
  // Hugging Face's two families fix these choices; Loom's configs may not mix them.
  LOOM_CHECK(c.bias == (c.family == Family::GPT2), "a ", s.family, " model with bias=", c.bias,
             " has no Hugging Face equivalent");
  return s;
}

ModelConfig model_config_of(const HfModelShape& s) {
  ModelConfig c;
  c.name = "hf-" + s.family;
  s.validate();
  c.family = s.family == "gpt2" ? Family::GPT2 : Family::Llama;
  c.qkv_bias = s.qkv_bias();
  c.qk_norm = s.qk_norm();
  c.sliding_window = s.sliding_window;
  if (s.family == "phi3") c.hf_family = "phi3";
  if (s.gemma()) {
    c.geglu = true;
    c.embed_scale = true;
    c.sandwich_norm = s.sandwich_norm();
    c.window_pattern = s.window_pattern;
    c.attn_scalar = s.attn_scalar;
    c.attn_softcap = s.attn_softcap;
    c.final_softcap = s.final_softcap;
    c.rope_local_theta = s.rope_local_theta;
  }
  c.n_experts = s.n_experts;
  if (s.is_moe()) {
    c.top_k = s.top_k;
    c.moe_router = "softmax";
    c.moe_layer_freq = 1;
    c.capacity_factor = 0;
  }
  c.n_layer = s.n_layer;
  c.d_model = s.d_model;
  c.n_head = s.n_head;
  c.n_kv_head = s.n_kv_head;
  c.head_dim = s.head_dim;
  c.d_ff = s.d_ff;
  c.vocab = s.vocab;
  c.max_seq = s.max_seq;
  c.norm_eps = s.norm_eps;
  c.rope_theta = s.rope_theta;
  c.rope_scaling = s.rope_scaling;
  c.tied = s.tied;
  c.bias = c.family == Family::GPT2;
  c.validate();
  return c;
}

}  // namespace loom::ckpt
