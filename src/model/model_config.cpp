#include "model/model_config.h"

#include <cmath>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"

namespace loom {

const char* family_name(Family f) {
  return f == Family::GPT2 ? "gpt2" : "llama";
}

static ModelConfig gpt2(const char* name, int layers, int d, int heads, int vocab, int seq) {
  ModelConfig c;
  c.name = name;
  c.family = Family::GPT2;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = c.n_kv_head = heads;
  c.head_dim = d / heads;
  c.d_ff = 4 * d;
  c.vocab = vocab;
  c.max_seq = seq;
  c.tied = true;
  c.bias = true;
  return c;
}

static ModelConfig llama(const char* name, int layers, int d, int heads, int kv, int ff, int vocab,
                         int seq, float theta, bool tied) {
  ModelConfig c;
  c.name = name;
  c.family = Family::Llama;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.n_kv_head = kv;
  c.head_dim = d / heads;
  c.d_ff = ff;
  c.vocab = vocab;
  c.max_seq = seq;
  c.norm_eps = 1e-5f;
  c.rope_theta = theta;
  c.tied = tied;
  c.bias = false;
  return c;
}

std::vector<std::string> model_preset_names() {
  return {"tiny",     "tiny-llama", "gpt2-124m",      "gpt2-350m",   "llama-1b",
          "llama-8b", "tiny-moe",   "tiny-llama-moe", "mixtral-8x7b"};
}

ModelConfig model_preset(const std::string& name) {
  // tiny: trains in minutes on 2 cores (byte-level vocabulary by default).
  if (name == "tiny") return gpt2("tiny", 4, 128, 4, 256, 128);
  if (name == "tiny-llama") return llama("tiny-llama", 4, 128, 4, 2, 352, 256, 128, 10000.f, false);
  // GPT-2 small with the vocabulary padded to a multiple of 128 (50257 -> 50304), as llm.c and
  // Megatron do for GEMM efficiency.
  if (name == "gpt2-124m") return gpt2("gpt2-124m", 12, 768, 12, 50304, 1024);
  if (name == "gpt2-350m") return gpt2("gpt2-350m", 24, 1024, 16, 50304, 1024);
  // Llama 3.2 1B shapes (tied embeddings, as that model ships) and Llama 3 8B shapes.
  if (name == "llama-1b")
    return llama("llama-1b", 16, 2048, 32, 8, 8192, 128256, 8192, 500000.f, true);
  if (name == "llama-8b")
    return llama("llama-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.f, false);
  // Mixture of experts: 8 experts, top-2, every layer (Mixtral's shape) in both families.
  auto moe = [](ModelConfig c) {
    c.n_experts = 8;
    c.top_k = 2;
    return c;
  };
  if (name == "tiny-moe") return moe(gpt2("tiny-moe", 4, 128, 4, 256, 128));
  if (name == "tiny-llama-moe")
    return moe(llama("tiny-llama-moe", 4, 128, 4, 2, 352, 256, 128, 10000.f, false));
  // Mixtral 8x7B: Mistral 7B's attention (GQA 32/8), 8 SwiGLU experts of width 14336, top-2.
  if (name == "mixtral-8x7b")
    return moe(llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 1e6f, false));
  std::string all;
  for (auto& n : model_preset_names()) all += (all.empty() ? "" : ", ") + n;
  fail("unknown model preset '", name, "' (known: ", all, ")");
}

void ModelConfig::validate() const {
  LOOM_CHECK(n_layer > 0, "model.n_layer must be positive, got ", n_layer);
  LOOM_CHECK(d_model > 0, "model.d_model must be positive, got ", d_model);
  LOOM_CHECK(n_head > 0, "model.n_head must be positive, got ", n_head);
  LOOM_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model.n_kv_head (", n_kv_head,
             ") must divide model.n_head (", n_head, ")");
  LOOM_CHECK(head_dim > 0, "model.head_dim must be positive, got ", head_dim);
  LOOM_CHECK(d_model % n_head == 0, "model.n_head (", n_head, ") must divide model.d_model (",
             d_model, ")");
  LOOM_CHECK(family == Family::Llama || head_dim * n_head == d_model, "model.head_dim (", head_dim,
             ") must equal d_model / n_head for the gpt2 family");
  LOOM_CHECK(!uses_rope() || head_dim % 2 == 0, "model.head_dim must be even for RoPE, got ",
             head_dim);
  if (rope_scaling.enabled()) {
    LOOM_CHECK(uses_rope(), "model.rope_scaling needs RoPE (the llama family)");
    LOOM_CHECK(rope_scaling.factor >= 1.f, "model.rope_factor must be >= 1, got ",
               rope_scaling.factor);
    LOOM_CHECK(rope_scaling.low_freq_factor > 0.f &&
                   rope_scaling.high_freq_factor > rope_scaling.low_freq_factor,
               "model.rope_high_freq_factor (", rope_scaling.high_freq_factor,
               ") must exceed model.rope_low_freq_factor (", rope_scaling.low_freq_factor,
               "), which must be positive");
    LOOM_CHECK(rope_scaling.original_max_seq > 0,
               "model.rope_original_max_seq must be positive, got ", rope_scaling.original_max_seq);
  }
  LOOM_CHECK(d_ff > 0, "model.d_ff must be positive, got ", d_ff);
  LOOM_CHECK(vocab > 0, "model.vocab must be positive, got ", vocab);
  LOOM_CHECK(max_seq > 0, "model.max_seq must be positive, got ", max_seq);
  LOOM_CHECK(norm_eps > 0, "model.norm_eps must be positive");
  LOOM_CHECK(init_std > 0, "model.init_std must be positive");
  LOOM_CHECK(sliding_window >= 0, "model.sliding_window must be >= 0 (0: none), got ",
             sliding_window);
  LOOM_CHECK(window_pattern >= 0, "model.window_pattern must be >= 0, got ", window_pattern);
  LOOM_CHECK(window_pattern == 0 || sliding_window > 0,
             "model.window_pattern needs model.sliding_window > 0");
  LOOM_CHECK(rope_local_theta >= 0, "model.rope_local_theta must be >= 0, got ", rope_local_theta);
  LOOM_CHECK(attn_softcap >= 0 && final_softcap >= 0 && attn_scalar >= 0,
             "model.attn_softcap, model.final_softcap and model.attn_scalar must be >= 0");
  LOOM_CHECK(!(geglu || sandwich_norm || embed_scale || window_pattern > 0 || attn_softcap > 0 ||
               rope_local_theta > 0) ||
                 family == Family::Llama,
             "model.geglu, model.sandwich_norm, model.embed_scale, model.window_pattern, ",
             "model.rope_local_theta and model.attn_softcap need the llama family");
  LOOM_CHECK(!(uses_gemma_ops() && n_experts > 0),
             "Gemma's options (model.geglu, sandwich_norm, window_pattern, attn/final_softcap) ",
             "are not supported with a mixture of experts (model.n_experts = ", n_experts, ")");
  LOOM_CHECK(n_experts >= 0, "model.n_experts must be >= 0 (0: dense), got ", n_experts);
  if (n_experts == 0) return;
  LOOM_CHECK(top_k >= 1 && top_k <= n_experts, "model.top_k (", top_k,
             ") must be between 1 and model.n_experts (", n_experts, ")");
  LOOM_CHECK(moe_router == "softmax" || moe_router == "sigmoid",
             "model.moe_router must be softmax or sigmoid, got '", moe_router, "'");
  LOOM_CHECK(capacity_factor >= 0, "model.capacity_factor must be >= 0 (0: dropless), got ",
             capacity_factor);
  LOOM_CHECK(aux_loss_coeff >= 0, "model.aux_loss_coeff must be >= 0, got ", aux_loss_coeff);
  LOOM_CHECK(moe_layer_freq >= 1, "model.moe_layer_freq must be >= 1, got ", moe_layer_freq);
}

float ModelConfig::attn_scale() const {
  return 1.f / std::sqrt(attn_scalar > 0 ? attn_scalar : static_cast<float>(head_dim));
}

int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int64_t ModelConfig::num_params() const {
  int64_t C = d_model, b = bias ? 1 : 0;
  int64_t norm = C * (1 + b);
  int64_t attn = static_cast<int64_t>(qkv_dim()) * C + (has_qkv_bias() ? qkv_dim() : 0) +
                 C * static_cast<int64_t>(n_head) * head_dim + b * C + (qk_norm ? 2 * head_dim : 0);
  int64_t mlp = static_cast<int64_t>(fc_dim()) * C + b * fc_dim() + C * d_ff + b * C;
  int64_t per_layer = (sandwich_norm ? 4 : 2) * norm + attn + mlp;
  int64_t embed = static_cast<int64_t>(vocab) * C +
                  (uses_positions_table() ? static_cast<int64_t>(max_seq) * C : 0);
  int64_t head = tied ? 0 : static_cast<int64_t>(vocab) * C;
  // A MoE layer: router [E, C] and E experts (w1 [fc_dim, C], w2 [C, d_ff]) instead of the MLP.
  const int64_t moe_mlp =
      n_experts * C + static_cast<int64_t>(n_experts) * (int64_t(fc_dim()) * C + C * d_ff);
  const int64_t moe = num_moe_layers();
  return embed + n_layer * per_layer + moe * (moe_mlp - mlp) + norm + head;
}

double ModelConfig::train_flops_per_token(int seq) const {
  // Every parameter used in a matmul costs 6 FLOPs per token (2 forward, 4 backward); the
  // output head counts even when tied. Embedding lookups, norms and biases are not matmuls.
  double C = d_model;
  // A MoE layer's token uses the router and top_k experts (the active parameters).
  const double mlp = static_cast<double>(fc_dim()) * C + C * d_ff;
  const int moe = num_moe_layers();
  double matmul = n_layer * (static_cast<double>(qkv_dim()) * C + C * n_head * head_dim) +
                  (n_layer - moe) * mlp + moe * (n_experts * C + top_k * mlp) +
                  static_cast<double>(vocab) * C;
  double attn = 6.0 * n_layer * seq * static_cast<double>(n_head) * head_dim;  // causal: half of 12
  return 6.0 * matmul + attn;
}

std::string ModelConfig::fingerprint() const {
  return cat(family_name(family), " layers=", n_layer, " d=", d_model, " heads=", n_head, "/",
             n_kv_head, " head_dim=", head_dim, " ff=", d_ff, " vocab=", vocab,
             " max_seq=", max_seq, " tied=", tied, " bias=", bias,
             // Dense models keep their fingerprint (checkpoints stay compatible).
             n_experts == 0 ? std::string()
                            : cat(" experts=", n_experts, " top_k=", top_k, " router=", moe_router,
                                  " moe_freq=", moe_layer_freq),
             // Unscaled RoPE keeps the fingerprint as it was.
             !rope_scaling.enabled()
                 ? std::string()
                 : cat(" rope=llama3/", rope_scaling.factor, "/", rope_scaling.low_freq_factor, "/",
                       rope_scaling.high_freq_factor, "/", rope_scaling.original_max_seq),
             // The families' parameters appear only when present (older checkpoints stay
             // compatible).
             qkv_bias && !bias ? " qkv_bias=1" : "", qk_norm ? " qk_norm=1" : "",
             value_head ? " value_head=1" : "", sandwich_norm ? " sandwich_norm=1" : "");
}

ModelConfig model_config_from(const Config& cfg) {
  return model_config_from(cfg, model_preset(cfg.get_string("model.preset", "tiny")));
}

ModelConfig model_config_from(const Config& cfg, ModelConfig c) {
  std::string fam = cfg.get_string("model.family", family_name(c.family));
  LOOM_CHECK(fam == "gpt2" || fam == "llama", "model.family must be gpt2 or llama, got '", fam,
             "'");
  Family f = fam == "gpt2" ? Family::GPT2 : Family::Llama;
  if (f != c.family) {  // switching family switches its defining choices
    c.family = f;
    c.tied = f == Family::GPT2;
    c.bias = f == Family::GPT2;
  }
  c.n_layer = get_int32(cfg, "model.n_layer", c.n_layer);
  int old_d = c.d_model, old_h = c.n_head;
  c.d_model = get_int32(cfg, "model.d_model", c.d_model);
  c.n_head = get_int32(cfg, "model.n_head", c.n_head);
  c.n_kv_head = get_int32(cfg, "model.n_kv_head", c.n_kv_head == old_h ? c.n_head : c.n_kv_head);
  bool width_changed = c.d_model != old_d || c.n_head != old_h;
  LOOM_CHECK(c.n_head > 0, "model.n_head must be positive, got ", c.n_head);
  c.head_dim = get_int32(cfg, "model.head_dim", width_changed ? c.d_model / c.n_head : c.head_dim);
  c.d_ff = get_int32(cfg, "model.d_ff",
                     c.d_model != old_d && f == Family::GPT2 ? 4 * c.d_model : c.d_ff);
  c.vocab = get_int32(cfg, "model.vocab", c.vocab);
  c.max_seq = get_int32(cfg, "model.max_seq", c.max_seq);
  c.norm_eps = static_cast<float>(cfg.get_double("model.norm_eps", c.norm_eps));
  c.rope_theta = static_cast<float>(cfg.get_double("model.rope_theta", c.rope_theta));
  const std::string scaling = cfg.get_string("model.rope_scaling", "none");
  LOOM_CHECK(scaling == "none" || scaling == "llama3",
             "model.rope_scaling must be none or llama3, ", "got '", scaling, "'");
  if (scaling == "llama3") {
    RopeScaling& r = c.rope_scaling;
    r.factor = static_cast<float>(cfg.get_double("model.rope_factor", 8.0));
    r.low_freq_factor = static_cast<float>(cfg.get_double("model.rope_low_freq_factor", 1.0));
    r.high_freq_factor = static_cast<float>(cfg.get_double("model.rope_high_freq_factor", 4.0));
    r.original_max_seq = get_int32(cfg, "model.rope_original_max_seq", 8192);
    LOOM_CHECK(r.factor > 0, "model.rope_factor must be positive, got ", r.factor);
  }
  c.init_std = static_cast<float>(cfg.get_double("model.init_std", c.init_std));
  c.tied = cfg.get_bool("model.tied", c.tied);
  c.bias = cfg.get_bool("model.bias", c.bias);
  c.qkv_bias = cfg.get_bool("model.qkv_bias", c.qkv_bias);
  c.qk_norm = cfg.get_bool("model.qk_norm", c.qk_norm);
  c.sliding_window = get_int32(cfg, "model.sliding_window", c.sliding_window);
  c.window_pattern = get_int32(cfg, "model.window_pattern", c.window_pattern);
  c.rope_local_theta =
      static_cast<float>(cfg.get_double("model.rope_local_theta", c.rope_local_theta));
  c.embed_scale = cfg.get_bool("model.embed_scale", c.embed_scale);
  c.geglu = cfg.get_bool("model.geglu", c.geglu);
  c.sandwich_norm = cfg.get_bool("model.sandwich_norm", c.sandwich_norm);
  c.attn_softcap = static_cast<float>(cfg.get_double("model.attn_softcap", c.attn_softcap));
  c.final_softcap = static_cast<float>(cfg.get_double("model.final_softcap", c.final_softcap));
  c.attn_scalar = static_cast<float>(cfg.get_double("model.attn_scalar", c.attn_scalar));
  c.hf_family = cfg.get_string("model.hf_family", c.hf_family);
  LOOM_CHECK(c.hf_family.empty() || c.hf_family == "phi3",
             "model.hf_family must be empty or phi3, got '", c.hf_family, "'");
  c.n_experts = get_int32(cfg, "model.n_experts", c.n_experts);
  c.top_k = get_int32(cfg, "model.top_k", c.top_k);
  c.moe_router = cfg.get_string("model.moe_router", c.moe_router);
  c.capacity_factor = cfg.get_double("model.capacity_factor", c.capacity_factor);
  c.aux_loss_coeff = cfg.get_double("model.aux_loss_coeff", c.aux_loss_coeff);
  c.moe_layer_freq = get_int32(cfg, "model.moe_layer_freq", c.moe_layer_freq);
  c.value_head = cfg.get_bool("model.value_head",
                              cfg.get_string("train.mode", "") == "reward" || c.value_head);
  c.validate();
  return c;
}

}  // namespace loom
