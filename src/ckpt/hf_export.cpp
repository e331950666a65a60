#include "ckpt/hf_export.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/fs.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kGenerationFile = "generation_config.json";

// One exported tensor: rows [row_begin, row_end) of a Loom parameter, transposed or not.
struct Piece {
  std::string hf, loom;
  int64_t row_begin = 0, row_end = 0;  // row_end 0: all rows
  bool transpose = false;
  int64_t expert = -1;  // >= 0: that expert's matrix of a [E, rows, cols] parameter
  float offset = 0.f;   // HF's value = Loom's - offset (Gemma's RMSNorm weights: 1)
};

std::vector<Piece> pieces(const HfModelShape& s) {
  std::vector<Piece> out;
  auto add = [&](std::string hf, std::string loom, bool transpose = false, int64_t r0 = 0,
                 int64_t r1 = 0, int64_t expert = -1) {
    out.push_back({std::move(hf), std::move(loom), r0, r1, transpose, expert});
  };
  const int64_t q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_kv_head} * s.head_dim;
  if (s.family == "gpt2") {
    add("transformer.wte.weight", "embed.wte");
    add("transformer.wpe.weight", "embed.wpe");
    for (int i = 0; i < s.n_layer; ++i) {
      const std::string h = cat("transformer.h.", i, "."), b = cat("blocks.", i, ".");
      add(h + "ln_1.weight", b + "norm1.weight");
      add(h + "ln_1.bias", b + "norm1.bias");
      add(h + "attn.c_attn.weight", b + "attn.qkv.weight", true);
      add(h + "attn.c_attn.bias", b + "attn.qkv.bias");
      add(h + "attn.c_proj.weight", b + "attn.proj.weight", true);
      add(h + "attn.c_proj.bias", b + "attn.proj.bias");
      add(h + "ln_2.weight", b + "norm2.weight");
      add(h + "ln_2.bias", b + "norm2.bias");
      add(h + "mlp.c_fc.weight", b + "mlp.fc.weight", true);
      add(h + "mlp.c_fc.bias", b + "mlp.fc.bias");
      add(h + "mlp.c_proj.weight", b + "mlp.proj.weight", true);
      add(h + "mlp.c_proj.bias", b + "mlp.proj.bias");
    }
    add("transformer.ln_f.weight", "final_norm.weight");
    add("transformer.ln_f.bias", "final_norm.bias");
  } else if (s.gemma()) {
    // Gemma's RMSNorm multiplies by (1 + weight): Loom's norm weight is HF's + 1.
    auto norm = [&](std::string hf, std::string loom) {
      add(std::move(hf), std::move(loom));
      out.back().offset = 1.f;
    };
    add("model.embed_tokens.weight", "embed.wte");
    for (int i = 0; i < s.n_layer; ++i) {
      const std::string h = cat("model.layers.", i, "."), b = cat("blocks.", i, ".");
      norm(h + "input_layernorm.weight", b + "norm1.weight");
      add(h + "self_attn.q_proj.weight", b + "attn.qkv.weight", false, 0, q);
      add(h + "self_attn.k_proj.weight", b + "attn.qkv.weight", false, q, q + kv);
      add(h + "self_attn.v_proj.weight", b + "attn.qkv.weight", false, q + kv, q + 2 * kv);
      if (s.qk_norm()) {
        norm(h + "self_attn.q_norm.weight", b + "attn.q_norm.weight");
        norm(h + "self_attn.k_norm.weight", b + "attn.k_norm.weight");
      }
      add(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
      if (s.sandwich_norm()) {  // post_attention_layernorm is the attention output's norm
        norm(h + "post_attention_layernorm.weight", b + "attn.post_norm.weight");
        norm(h + "pre_feedforward_layernorm.weight", b + "norm2.weight");
        norm(h + "post_feedforward_layernorm.weight", b + "mlp.post_norm.weight");
      } else {
        norm(h + "post_attention_layernorm.weight", b + "norm2.weight");
      }
      add(h + "mlp.gate_proj.weight", b + "mlp.fc.weight", false, 0, s.d_ff);
      add(h + "mlp.up_proj.weight", b + "mlp.fc.weight", false, s.d_ff, 2 * int64_t{s.d_ff});
      add(h + "mlp.down_proj.weight", b + "mlp.proj.weight");
    }
    norm("model.norm.weight", "final_norm.weight");
  } else {
    add("model.embed_tokens.weight", "embed.wte");
    for (int i = 0; i < s.n_layer; ++i) {
      const std::string h = cat("model.layers.", i, "."), b = cat("blocks.", i, ".");
      add(h + "input_layernorm.weight", b + "norm1.weight");
      if (s.fused()) {  // Phi-3: Loom's fused layout exactly (q, k, v rows; gate, up rows)
        add(h + "self_attn.qkv_proj.weight", b + "attn.qkv.weight");
        add(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
        add(h + "post_attention_layernorm.weight", b + "norm2.weight");
        add(h + "mlp.gate_up_proj.weight", b + "mlp.fc.weight");
        add(h + "mlp.down_proj.weight", b + "mlp.proj.weight");
        continue;
      }
      add(h + "self_attn.q_proj.weight", b + "attn.qkv.weight", false, 0, q);
      add(h + "self_attn.k_proj.weight", b + "attn.qkv.weight", false, q, q + kv);
      add(h + "self_attn.v_proj.weight", b + "attn.qkv.weight", false, q + kv, q + 2 * kv);
      if (s.qkv_bias()) {
        add(h + "self_attn.q_proj.bias", b + "attn.qkv.bias", false, 0, q);
        add(h + "self_attn.k_proj.bias", b + "attn.qkv.bias", false, q, q + kv);
        add(h + "self_attn.v_proj.bias", b + "attn.qkv.bias", false, q + kv, q + 2 * kv);
      }
      if (s.qk_norm()) {
        add(h + "self_attn.q_norm.weight", b + "attn.q_norm.weight");
        add(h + "self_attn.k_norm.weight", b + "attn.k_norm.weight");
      }
      add(h + "self_attn.o_proj.weight", b + "attn.proj.weight");
      add(h + "post_attention_layernorm.weight", b + "norm2.weight");
      if (!s.is_moe()) {
        add(h + "mlp.gate_proj.weight", b + "mlp.fc.weight", false, 0, s.d_ff);
        add(h + "mlp.up_proj.weight", b + "mlp.fc.weight", false, s.d_ff, 2 * int64_t{s.d_ff});
        add(h + "mlp.down_proj.weight", b + "mlp.proj.weight");
        continue;
      }
      // Mixtral names an expert's gate, down and up w1, w2 and w3; Qwen3-MoE as its MLP.
      const bool mixtral = s.family == "mixtral";
      const std::string m = h + (mixtral ? "block_sparse_moe." : "mlp."), r = b + "moe.";
      add(m + "gate.weight", r + "router.weight");
      for (int e = 0; e < s.n_experts; ++e) {
        const std::string x = cat(m, "experts.", e, ".");
        add(x + (mixtral ? "w1" : "gate_proj") + ".weight", r + "experts.w1", false, 0, s.d_ff, e);
        add(x + (mixtral ? "w3" : "up_proj") + ".weight", r + "experts.w1", false, s.d_ff,
            2 * int64_t{s.d_ff}, e);
        add(x + (mixtral ? "w2" : "down_proj") + ".weight", r + "experts.w2", false, 0, 0, e);
      }
    }
    add("model.norm.weight", "final_norm.weight");
  }
  if (!s.tied) add("lm_head.weight", "head.weight");
  return out;
}

Shape hf_shape_of(const Piece& p, const Shape& loom) {
  Shape s = loom;
  if (p.expert >= 0) s.erase(s.begin());
  if (p.row_end > 0) s[0] = p.row_end - p.row_begin;
  if (p.transpose) std::swap(s[0], s[1]);
  return s;
}

// Expert e's matrix of a contiguous [E, rows, cols] tensor (a view).
Tensor expert_matrix(const Tensor& t, int64_t e) {
  return t.slice(e, e + 1).reshape(Shape(t.shape().begin() + 1, t.shape().end()));
}

// Exact element-wise transpose of a contiguous 2-D tensor (any dtype: bytes are moved).
template <typename T>
void transpose_block(const T* src, T* dst, int64_t rows, int64_t cols) {
  constexpr int64_t B = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += B)
    for (int64_t j0 = 0; j0 < cols; j0 += B)
      for (int64_t i = i0; i < std::min(i0 + B, rows); ++i)
        for (int64_t j = j0; j < std::min(j0 + B, cols); ++j) dst[j * rows + i] = src[i * cols + j];
}

Tensor transposed(const Tensor& src) {
  Tensor c = src.is_contiguous() ? src : src.clone();
  const int64_t r = c.dim(0), k = c.dim(1);
  Tensor out = Tensor::zeros({k, r}, c.dtype());
  switch (dtype_size(c.dtype())) {
    case 1:
      transpose_block(c.data<uint8_t>(), out.data<uint8_t>(), r, k);
      break;
    case 2:
      transpose_block(c.data<uint16_t>(), out.data<uint16_t>(), r, k);
      break;
    case 4:
      transpose_block(c.data<uint32_t>(), out.data<uint32_t>(), r, k);
      break;
    case 8:
      transpose_block(c.data<uint64_t>(), out.data<uint64_t>(), r, k);
      break;
    default:
      fail("transpose: unsupported element size");
  }
  return out;
}

// `t` in `dtype`, contiguous: the tensor itself (a view) when it already is. The common
// float conversions run as flat loops (Tensor::to handles any strides, element by element).
Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t.is_contiguous() ? t : t.clone();
  if (!t.is_contiguous()) return t.to(dtype);
  const int64_t n = t.numel();
  Tensor out = Tensor::zeros(t.shape(), dtype);
  const DType from = t.dtype();
  if (from == DType::F32 && dtype == DType::BF16) {
    const float* a = t.data<float>();
    uint16_t* b = out.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) b[i] = f32_to_bf16(a[i]);
  } else if (from == DType::BF16 && dtype == DType::F32) {
    const uint16_t* a = t.data<uint16_t>();
    float* b = out.data<float>();
    for (int64_t i = 0; i < n; ++i) b[i] = bf16_to_f32(a[i]);
  } else if (from == DType::F32 && dtype == DType::F16) {
    const float* a = t.data<float>();
    uint16_t* b = out.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) b[i] = f32_to_f16(a[i]);
  } else if (from == DType::F16 && dtype == DType::F32) {
    const uint16_t* a = t.data<uint16_t>();
    float* b = out.data<float>();
    for (int64_t i = 0; i < n; ++i) b[i] = f16_to_f32(a[i]);
  } else {
    out.copy_from(t);
  }
  return out;
}

// `t` plus `delta` element by element, in `dtype` (computed in fp32; Gemma's norm offsets).
Tensor offset_by(const Tensor& t, float delta, DType dtype) {
  Tensor f = t.dtype() == DType::F32 ? t.clone() : converted(t, DType::F32);
  float* x = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) x[i] += delta;
  return converted(f, dtype);
}

// Checks `have` holds exactly the names and shapes in `want`; `what` names the side.
void check_exact(const TensorMap& have, const std::map<std::string, Shape>& want,
                 const std::string& where, const std::string& family) {
  for (const auto& [name, shape] : want) {
    auto it = have.find(name);
    LOOM_CHECK(it != have.end(), where, ": tensor '", name, "' ", shape_str(shape), " is missing (",
               family, " model)");
    LOOM_CHECK(it->second.defined() && it->second.shape() == shape, where, ": tensor '", name,
               "' has shape ", shape_str(it->second.defined() ? it->second.shape() : Shape{}),
               ", expected ", shape_str(shape));
  }
  for (const auto& [name, t] : have)
    LOOM_CHECK(want.count(name), where, ": unexpected tensor '", name, "' ", shape_str(t.shape()),
               " for a ", family, " model");
}

// Non-parameter buffers some HF checkpoints carry, and the tied head's duplicate.
bool ignorable_hf_name(const HfModelShape& s, const std::string& n) {
  auto ends_with = [&](const char* suf) {
    size_t k = std::strlen(suf);
    return n.size() >= k && n.compare(n.size() - k, k, suf) == 0;
  };
  if (s.tied && n == "lm_head.weight") return true;
  if (s.family == "gpt2") return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  return ends_with(".rotary_emb.inv_freq");
}

// GPT-2 files saved from GPT2Model (the Hub's own gpt2) lack the "transformer." prefix.
std::string canonical_hf_name(const HfModelShape& s, const std::string& n) {
  if (s.family == "gpt2" && n.rfind("transformer.", 0) != 0 && n.rfind("lm_head.", 0) != 0)
    return "transformer." + n;
  return n;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      fail("Hugging Face export supports F32, BF16 and F16, not ", dtype_name(t));
  }
}

// The shortest decimal that reads back as `f`, so config.json says 1e-05 rather than
// 9.99999975e-06.
Json float_json(float f) {
  char buf[40];
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return Json(std::strtod(buf, nullptr));
}

// Typed config.json field access with errors naming the field.
struct ConfigReader {
  const Json& j;
  const std::string& where;
  bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  const Json& get(const char* k) const {
    LOOM_CHECK(has(k), where, ": missing field '", k, "'");
    return j.at(k);
  }
  int64_t integer(const char* k) const {
    try {
      return get(k).as_int();
    } catch (const Error& e) {
      fail(where, ": field '", k, "': ", e.what());
    }
  }
  int positive(const char* k) const {
    int64_t v = integer(k);
    LOOM_CHECK(v > 0 && v < (int64_t{1} << 31), where, ": field '", k,
               "' must be a positive integer, got ", v);
    return static_cast<int>(v);
  }
  float number(const char* k, float dflt) const {
    if (!has(k)) return dflt;
    try {
      return static_cast<float>(get(k).as_double());
    } catch (const Error& e) {
      fail(where, ": field '", k, "': ", e.what());
    }
  }
  bool boolean(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    try {
      return get(k).as_bool();
    } catch (const Error& e) {
      fail(where, ": field '", k, "': ", e.what());
    }
  }
  std::string string(const char* k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    try {
      return get(k).as_string();
    } catch (const Error& e) {
      fail(where, ": field '", k, "': ", e.what());
    }
  }
  int token_id(const char* k) const {  // Llama 3 lists several eos ids: keep the first
    if (!has(k)) return -1;
    const Json& v = get(k);
    if (v.is_array()) {
      if (v.size() == 0) return -1;
      return static_cast<int>(v.as_array()[0].as_int());
    }
    return static_cast<int>(integer(k));
  }
};

// transformers' class for a family's causal language model.
const char* causal_lm_class(const std::string& family) {
  if (family == "gpt2") return "GPT2LMHeadModel";
  if (family == "qwen2") return "Qwen2ForCausalLM";
  if (family == "qwen3") return "Qwen3ForCausalLM";
  if (family == "mistral") return "MistralForCausalLM";
  if (family == "mixtral") return "MixtralForCausalLM";
  if (family == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (family == "phi3") return "Phi3ForCausalLM";
  if (family == "gemma") return "GemmaForCausalLM";
  if (family == "gemma2") return "Gemma2ForCausalLM";
  if (family == "gemma3_text") return "Gemma3ForCausalLM";
  return "LlamaForCausalLM";
}

// "architectures" (optional) names the class the weights were saved from: the family's causal
// LM or its base model (no head: a tied embedding serves); a head of another kind is refused.
void check_architectures(const ConfigReader& r, const std::string& family,
                         const std::string& where) {
  if (!r.has("architectures")) return;
  const Json& a = r.get("architectures");
  LOOM_CHECK(a.is_array(), where, ": field 'architectures' must be a list");
  const std::string lm = causal_lm_class(family);
  const std::string base = family == "gpt2"          ? "GPT2Model"
                           : family == "gemma3_text" ? "Gemma3TextModel"
                                                     : lm.substr(0, lm.find("For")) + "Model";
  for (size_t i = 0; i < a.size(); ++i) {
    const Json& e = a.as_array()[i];
    const std::string name = e.is_string() ? e.as_string() : e.dump();
    LOOM_CHECK(name == lm || name == base, where, ": architectures[", i, "] '", name,
               "' is not supported (Loom reads ", lm, " for model_type ", family, ")");
  }
}

// The experts of a Mixtral or Qwen3-MoE config: every layer sparse, softmax routing with the
// top k renormalised (what Loom's MoE layers compute).
void read_moe(const ConfigReader& r, HfModelShape& s, const std::string& where) {
  const bool mixtral = s.family == "mixtral";
  s.n_experts = r.positive(mixtral ? "num_local_experts" : "num_experts");
  s.top_k = r.positive("num_experts_per_tok");
  LOOM_CHECK(s.top_k >= 2 && s.top_k <= s.n_experts, where, ": num_experts_per_tok = ", s.top_k,
             " is not supported (Loom's MoE layers take 2 to ", s.n_experts, " experts a token)");
  if (mixtral) {
    LOOM_CHECK(r.number("router_jitter_noise", 0.f) == 0.f, where,
               ": router_jitter_noise other than 0 is not supported");
    return;
  }
  s.d_ff = r.positive("moe_intermediate_size");
  LOOM_CHECK(r.boolean("norm_topk_prob", false), where,
             ": norm_topk_prob false is not supported (Loom renormalises the top-k weights)");
  LOOM_CHECK(!r.has("decoder_sparse_step") || r.integer("decoder_sparse_step") == 1, where,
             ": decoder_sparse_step other than 1 is not supported (every layer is sparse)");
  LOOM_CHECK(!r.has("mlp_only_layers") || r.get("mlp_only_layers").size() == 0, where,
             ": mlp_only_layers is not supported (every layer is sparse)");
}

// rope_scaling: {"rope_type" (or the older "type"): "llama3", factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings}; "default" means none.
RopeScaling rope_scaling_from(const Json& j, const std::string& where) {
  LOOM_CHECK(j.is_object(), where, ": rope_scaling must be an object or null");
  const std::string w = where + ": rope_scaling";
  ConfigReader r{j, w};
  const std::string type = r.has("rope_type") ? r.string("rope_type", "") : r.string("type", "");
  RopeScaling s;
  if (type == "default") return s;
  LOOM_CHECK(type == "llama3", where, ": rope_scaling type '", type,
             "' is not supported (Loom implements llama3)");
  s.factor = r.number("factor", 0.f);
  s.low_freq_factor = r.number("low_freq_factor", 0.f);
  s.high_freq_factor = r.number("high_freq_factor", 0.f);
  s.original_max_seq = r.positive("original_max_position_embeddings");
  LOOM_CHECK(std::isfinite(s.factor) && s.factor >= 1.f, w, ": factor must be >= 1, got ",
             s.factor);
  LOOM_CHECK(std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0.f &&
                 s.high_freq_factor > s.low_freq_factor,
             w, ": need 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
             s.high_freq_factor);
  return s;
}

// Gemma 1, 2 and 3 (text): what their configs say, and refusals naming what Loom does not
// compute.
void read_gemma(const ConfigReader& r, HfModelShape& s, const std::string& type,
                const std::string& where) {
  s.family = type;
  const bool g1 = type == "gemma", g3 = type == "gemma3_text";
  s.d_model = r.positive("hidden_size");
  s.d_ff = r.positive("intermediate_size");
  s.n_layer = r.positive("num_hidden_layers");
  s.n_head = r.positive("num_attention_heads");
  s.n_kv_head = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : s.n_head;
  s.head_dim = r.has("head_dim") ? r.positive("head_dim") : 256;  // transformers' default
  s.vocab = r.positive("vocab_size");
  s.max_seq = r.positive("max_position_embeddings");
  s.norm_eps = r.number("rms_norm_eps", 1e-6f);
  s.rope_theta = r.number("rope_theta", g3 ? 1e6f : 10000.f);
  s.tied = r.boolean("tie_word_embeddings", true);
  // Gemma 1 reads hidden_act (hidden_activation first where set); Gemma 2 and 3
  // hidden_activation.
  // Gemma 1's published configs say hidden_act "gelu" with hidden_activation null: the tanh
  // GELU its checkpoints were trained with (transformers 4.38-4.4x read it so).
  const char* act_field = r.has("hidden_activation") || !g1 ? "hidden_activation" : "hidden_act";
  const std::string act = r.string(act_field, "gelu_pytorch_tanh");
  const bool g1_gelu = g1 && act == "gelu" && !r.has("hidden_activation");
  LOOM_CHECK(act == "gelu_pytorch_tanh" || act == "gelu_new" || g1_gelu, where, ": ", act_field,
             " '", act, "' is not supported (Loom's GeGLU uses the tanh GELU, gelu_pytorch_tanh)");
  LOOM_CHECK(!r.boolean("attention_bias", false), where, ": attention_bias true is not supported");
  LOOM_CHECK(!r.has("rope_scaling") || !rope_scaling_from(r.get("rope_scaling"), where).enabled(),
             where, ": rope_scaling is not supported for ", type);
  LOOM_CHECK(!r.has("rope_parameters"), where, ": rope_parameters is not supported for ", type,
             " (write rope_theta", g3 ? " and rope_local_base_freq" : "", ")");
  if (g1) return;
  s.attn_scalar = r.number("query_pre_attn_scalar", 256.f);
  LOOM_CHECK(std::isfinite(s.attn_scalar) && s.attn_scalar > 0, where,
             ": query_pre_attn_scalar must be positive, got ", s.attn_scalar);
  s.attn_softcap = r.number("attn_logit_softcapping", g3 ? 0.f : 50.f);
  s.final_softcap = r.number("final_logit_softcapping", g3 ? 0.f : 30.f);
  if (r.has("attn_logit_softcapping") || !g3)
    LOOM_CHECK(std::isfinite(s.attn_softcap) && s.attn_softcap > 0, where,
               ": attn_logit_softcapping must be positive or null, got ", s.attn_softcap);
  if (r.has("final_logit_softcapping") || !g3)
    LOOM_CHECK(std::isfinite(s.final_softcap) && s.final_softcap > 0, where,
               ": final_logit_softcapping must be positive or null, got ", s.final_softcap);
  if (g3) {
    s.rope_local_theta = r.number("rope_local_base_freq", 10000.f);
    LOOM_CHECK(!r.boolean("use_bidirectional_attention", false), where,
               ": use_bidirectional_attention true is not supported (Loom's attention is causal)");
  }
  // The layers' kinds: layer_types where written, else every 2nd (Gemma 2) or every
  // sliding_window_pattern-th (Gemma 3) layer global.
  int pattern = g3 ? 6 : 2;
  if (g3 && r.has("sliding_window_pattern")) pattern = r.positive("sliding_window_pattern");
  if (g3 && !r.has("sliding_window_pattern") && r.has("_sliding_window_pattern"))
    pattern = r.positive("_sliding_window_pattern");
  if (r.has("layer_types")) {
    const Json& t = r.get("layer_types");
    LOOM_CHECK(t.is_array() && t.size() == size_t(s.n_layer), where, ": layer_types must list ",
               s.n_layer, " layers");
    int first_full = -1;
    for (size_t l = 0; l < t.size(); ++l) {
      const Json& e = t.as_array()[l];
      const std::string k = e.is_string() ? e.as_string() : e.dump();
      LOOM_CHECK(k == "sliding_attention" || k == "full_attention", where, ": layer_types[", l,
                 "] '", k, "' is not supported");
      if (k == "full_attention" && first_full < 0) first_full = int(l);
    }
    pattern = first_full < 0 ? s.n_layer + 1 : first_full + 1;
    for (size_t l = 0; l < t.size(); ++l)
      LOOM_CHECK(t.as_array()[l].as_string() ==
                     ((int(l) + 1) % pattern != 0 ? "sliding_attention" : "full_attention"),
                 where, ": layer_types is not supported: Loom's windowed layers repeat with one ",
                 "global layer every k (layer ", l, " breaks the pattern of ", pattern, ")");
  }
  s.sliding_window = r.has("sliding_window") ? r.positive("sliding_window") : 4096;
  s.window_pattern = pattern;
  // A window as long as the context never binds: no window.
  if (s.sliding_window >= s.max_seq || pattern == 1) {
    s.sliding_window = 0;
    s.window_pattern = 0;
  }
  if (type == "gemma2" && s.window_pattern != 0 && s.window_pattern != 2)
    fail(where, ": layer_types other than alternating windowed and global layers is not ",
         "supported for gemma2");
}

// The layers the weights hold against config.json's count, before anything is sized by the
// config: a config claiming 10^9 layers is an error naming both, not a 10^9-entry shape table.
void check_layer_count(const HfModelShape& s, const TensorMap& hf, const std::string& config_path,
                       const std::string& where) {
  std::set<long> layers;
  for (const auto& [name, t] : hf) {
    std::string n = canonical_hf_name(s, name);
    const std::string prefix = s.family == "gpt2" ? "transformer.h." : "model.layers.";
    if (n.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long i = std::strtol(n.c_str() + prefix.size(), &end, 10);
    if (end && *end == '.' && i >= 0) layers.insert(i);
  }
  const long found = layers.empty() ? 0 : *layers.rbegin() + 1;
  LOOM_CHECK(found == s.n_layer && long(layers.size()) == found, config_path, ": ",
             s.family == "gpt2" ? "n_layer" : "num_hidden_layers", " = ", s.n_layer, " but ", where,
             " holds weights of ", layers.size(), " layers",
             layers.empty() ? std::string() : cat(" (numbered up to ", *layers.rbegin(), ")"));
}

std::string join(const std::string& a, const std::string& b) {
  return (fs::path(a) / b).string();
}

std::string shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

bool is_shard_file_name(const std::string& n) {
  unsigned a, b;
  char tail[32];
  return n.size() == shard_file_name(1, 1).size() &&
         std::sscanf(n.c_str(), "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 &&
         std::string(tail) == "safetensors";
}

}  // namespace

void HfModelShape::validate() const {
  LOOM_CHECK(family == "gpt2" || family == "llama" || family == "qwen2" || family == "qwen3" ||
                 family == "mistral" || family == "mixtral" || family == "qwen3_moe" ||
                 family == "phi3" || gemma(),
             "model family '", family,
             "' has no Hugging Face mapping (supported: gpt2, llama, qwen2, qwen3, mistral, ",
             "mixtral, qwen3_moe, phi3, gemma, gemma2, gemma3_text)");
  LOOM_CHECK(sliding_window == 0 || family == "mistral" || family == "mixtral" ||
                 family == "phi3" || sandwich_norm(),
             "model shape: a sliding window (", sliding_window,
             ") maps only to the mistral, mixtral, phi3, gemma2 and gemma3_text families, not ",
             family);
  LOOM_CHECK(sandwich_norm() || (window_pattern == 0 && attn_softcap == 0 && final_softcap == 0 &&
                                 attn_scalar == 0 && rope_local_theta == 0),
             "model shape: window_pattern, soft-capping, query_pre_attn_scalar and ",
             "rope_local_base_freq map only to gemma2 and gemma3_text, not ", family);
  LOOM_CHECK(!sandwich_norm() || (sliding_window > 0) == (window_pattern > 0),
             "model shape: ", family, " needs a window pattern with its sliding window (",
             sliding_window, ", pattern ", window_pattern, ")");
  LOOM_CHECK(family != "gemma2" || window_pattern == 0 || window_pattern == 2,
             "model shape: gemma2 alternates windowed and global layers (pattern 2, not ",
             window_pattern, ")");
  LOOM_CHECK(family == "gemma3_text" || rope_local_theta == 0, "model shape: ", family,
             " has one RoPE base (rope_local_base_freq is gemma3_text's)");
  LOOM_CHECK(!gemma() || !rope_scaling.enabled(), "model shape: ", family,
             " with RoPE scaling is not supported");
  const bool moe_family = family == "mixtral" || family == "qwen3_moe";
  LOOM_CHECK(moe_family == (n_experts > 0), "model shape: the ", family, " family ",
             moe_family ? "needs experts" : "has no experts", " (n_experts ", n_experts, ")");
  LOOM_CHECK(!moe_family || (top_k >= 2 && top_k <= n_experts), "model shape: top_k (", top_k,
             ") must lie in [2, n_experts = ", n_experts, "]");
  LOOM_CHECK(sliding_window >= 0, "model shape: sliding_window must be >= 0, got ", sliding_window);
  auto pos = [](int v, const char* name) {
    LOOM_CHECK(v > 0, "model shape: ", name, " must be positive, got ", v);
  };
  pos(n_layer, "n_layer");
  pos(d_model, "d_model");
  pos(n_head, "n_head");
  pos(n_kv_head, "n_kv_head");
  pos(head_dim, "head_dim");
  pos(d_ff, "d_ff");
  pos(vocab, "vocab");
  pos(max_seq, "max_seq");
  LOOM_CHECK(n_head % n_kv_head == 0, "model shape: n_head (", n_head,
             ") must be a multiple of n_kv_head (", n_kv_head, ")");
  if (family == "gpt2") {
    LOOM_CHECK(n_kv_head == n_head, "model shape: GPT-2 has no grouped-query attention (n_head ",
               n_head, ", n_kv_head ", n_kv_head, ")");
    LOOM_CHECK(int64_t{n_head} * head_dim == d_model, "model shape: GPT-2 needs n_head * head_dim",
               " == d_model (", n_head, " * ", head_dim, " != ", d_model, ")");
  }
}

std::map<std::string, Shape> loom_param_shapes(const HfModelShape& s) {
  s.validate();
  const int64_t C = s.d_model, V = s.vocab, F = s.d_ff;
  const int64_t q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_kv_head} * s.head_dim;
  const bool gpt2 = s.family == "gpt2";
  std::map<std::string, Shape> m;
  m["embed.wte"] = {V, C};
  if (gpt2) m["embed.wpe"] = {s.max_seq, C};
  for (int i = 0; i < s.n_layer; ++i) {
    const std::string b = cat("blocks.", i, ".");
    m[b + "norm1.weight"] = {C};
    m[b + "attn.qkv.weight"] = {q + 2 * kv, C};
    if (s.qkv_bias()) m[b + "attn.qkv.bias"] = {q + 2 * kv};
    if (s.qk_norm()) {
      m[b + "attn.q_norm.weight"] = {s.head_dim};
      m[b + "attn.k_norm.weight"] = {s.head_dim};
    }
    m[b + "attn.proj.weight"] = {C, q};
    m[b + "norm2.weight"] = {C};
    if (s.sandwich_norm()) {
      m[b + "attn.post_norm.weight"] = {C};
      m[b + "mlp.post_norm.weight"] = {C};
    }
    if (s.is_moe()) {
      const int64_t E = s.n_experts;
      m[b + "moe.router.weight"] = {E, C};
      m[b + "moe.experts.w1"] = {E, 2 * F, C};
      m[b + "moe.experts.w2"] = {E, C, F};
    } else {
      m[b + "mlp.fc.weight"] = {gpt2 ? F : 2 * F, C};
      m[b + "mlp.proj.weight"] = {C, F};
    }
    if (gpt2) {
      m[b + "norm1.bias"] = {C};
      m[b + "attn.qkv.bias"] = {q + 2 * kv};
      m[b + "attn.proj.bias"] = {C};
      m[b + "norm2.bias"] = {C};
      m[b + "mlp.fc.bias"] = {F};
      m[b + "mlp.proj.bias"] = {C};
    }
  }
  m["final_norm.weight"] = {C};
  if (gpt2) m["final_norm.bias"] = {C};
  if (!s.tied) m["head.weight"] = {V, C};
  return m;
}

std::map<std::string, Shape> hf_param_shapes(const HfModelShape& s) {
  const auto loom = loom_param_shapes(s);
  std::map<std::string, Shape> m;
  for (const Piece& p : pieces(s)) m[p.hf] = hf_shape_of(p, loom.at(p.loom));
  return m;
}

// The config.json keys every Llama-style family (Llama, Qwen, Mistral, Phi-3, Gemma) writes alike.
static void llama_like_keys(Json& j, const HfModelShape& s, const char* act) {
  j["architectures"] = Json(Json::Array{Json(causal_lm_class(s.family))});
  j["model_type"] = Json(s.family);
  j["hidden_act"] = Json(act);
  j["hidden_size"] = Json(s.d_model);
  j["intermediate_size"] = Json(s.d_ff);
  j["num_hidden_layers"] = Json(s.n_layer);
  j["num_attention_heads"] = Json(s.n_head);
  j["num_key_value_heads"] = Json(s.n_kv_head);
  j["head_dim"] = Json(s.head_dim);
  j["max_position_embeddings"] = Json(s.max_seq);
  j["rms_norm_eps"] = float_json(s.norm_eps);
  j["rope_theta"] = float_json(s.rope_theta);
}

Json hf_config_json(const HfModelShape& s, DType dtype) {
  s.validate();
  Json j = Json::object();
  j["torch_dtype"] = Json(torch_dtype_name(dtype));
  j["vocab_size"] = Json(s.vocab);
  j["tie_word_embeddings"] = Json(s.tied);
  j["initializer_range"] = Json(0.02);
  j["use_cache"] = Json(true);
  if (s.bos_token_id >= 0) j["bos_token_id"] = Json(s.bos_token_id);
  if (s.eos_token_id >= 0) j["eos_token_id"] = Json(s.eos_token_id);
  if (s.family == "gpt2") {
    j["architectures"] = Json(Json::Array{Json("GPT2LMHeadModel")});
    j["model_type"] = Json("gpt2");
    j["activation_function"] = Json("gelu_new");
    j["n_embd"] = Json(s.d_model);
    j["n_layer"] = Json(s.n_layer);
    j["n_head"] = Json(s.n_head);
    j["n_positions"] = Json(s.max_seq);
    j["n_ctx"] = Json(s.max_seq);
    j["n_inner"] = s.d_ff == 4 * s.d_model ? Json() : Json(s.d_ff);
    j["layer_norm_epsilon"] = float_json(s.norm_eps);
    j["attn_pdrop"] = Json(0.0);
    j["embd_pdrop"] = Json(0.0);
    j["resid_pdrop"] = Json(0.0);
    j["scale_attn_weights"] = Json(true);
    j["scale_attn_by_inverse_layer_idx"] = Json(false);
    j["reorder_and_upcast_attn"] = Json(false);
  } else if (s.gemma()) {
    llama_like_keys(j, s, "gelu_pytorch_tanh");
    j["hidden_activation"] = Json("gelu_pytorch_tanh");
    j["rope_scaling"] = Json();
    j["attention_bias"] = Json(false);
    j["attention_dropout"] = Json(0.0);
    if (s.sandwich_norm()) {
      j["query_pre_attn_scalar"] =
          float_json(s.attn_scalar > 0 ? s.attn_scalar : static_cast<float>(s.head_dim));
      j["attn_logit_softcapping"] = s.attn_softcap > 0 ? float_json(s.attn_softcap) : Json();
      j["final_logit_softcapping"] = s.final_softcap > 0 ? float_json(s.final_softcap) : Json();
      // No window: one as long as the context, which never binds.
      const int pattern = s.window_pattern > 0 ? s.window_pattern : (s.family == "gemma2" ? 2 : 6);
      j["sliding_window"] = Json(s.sliding_window > 0 ? s.sliding_window : s.max_seq);
      Json types = Json::array();
      for (int l = 0; l < s.n_layer; ++l)
        types.push_back(Json((l + 1) % pattern != 0 ? "sliding_attention" : "full_attention"));
      j["layer_types"] = std::move(types);
      j["cache_implementation"] = Json("hybrid");
      if (s.family == "gemma3_text") {
        j["sliding_window_pattern"] = Json(pattern);
        j["rope_local_base_freq"] =
            float_json(s.rope_local_theta > 0 ? s.rope_local_theta : s.rope_theta);
        j["use_bidirectional_attention"] = Json(false);
      }
    }
  } else {
    llama_like_keys(j, s, "silu");
    if (s.rope_scaling.enabled()) {
      Json r = Json::object();
      r["rope_type"] = Json("llama3");
      r["factor"] = float_json(s.rope_scaling.factor);
      r["low_freq_factor"] = float_json(s.rope_scaling.low_freq_factor);
      r["high_freq_factor"] = float_json(s.rope_scaling.high_freq_factor);
      r["original_max_position_embeddings"] = Json(s.rope_scaling.original_max_seq);
      j["rope_scaling"] = std::move(r);
    } else {
      j["rope_scaling"] = Json();
    }
    j["attention_dropout"] = Json(0.0);
    if (s.family == "llama") {
      j["attention_bias"] = Json(false);
      j["mlp_bias"] = Json(false);
      j["pretraining_tp"] = Json(1);
    } else if (s.family == "mistral" || s.family == "mixtral") {
      j["sliding_window"] = s.sliding_window > 0 ? Json(s.sliding_window) : Json();
    } else if (s.family == "phi3") {
      j["sliding_window"] = s.sliding_window > 0 ? Json(s.sliding_window) : Json();
      j["original_max_position_embeddings"] = Json(s.max_seq);
      j["partial_rotary_factor"] = Json(1.0);
      j["resid_pdrop"] = Json(0.0);
      j["embd_pdrop"] = Json(0.0);
      j["attention_dropout"] = Json(0.0);
    } else {  // qwen2, qwen3, qwen3_moe: the window stays off (use_sliding_window)
      j["use_sliding_window"] = Json(false);
      j["sliding_window"] = Json();
      j["max_window_layers"] = Json(s.n_layer);
      if (s.family != "qwen2") j["attention_bias"] = Json(false);
    }
    if (s.family == "mixtral") {
      j["num_local_experts"] = Json(s.n_experts);
      j["num_experts_per_tok"] = Json(s.top_k);
      j["router_jitter_noise"] = Json(0.0);
    } else if (s.family == "qwen3_moe") {
      j["num_experts"] = Json(s.n_experts);
      j["num_experts_per_tok"] = Json(s.top_k);
      j["moe_intermediate_size"] = Json(s.d_ff);
      j["norm_topk_prob"] = Json(true);
      j["decoder_sparse_step"] = Json(1);
      j["mlp_only_layers"] = Json::array();
    }
    if (s.is_moe()) {
      // Loom's auxiliary loss is its own training option (model.aux_loss_coeff).
      j["output_router_logits"] = Json(false);
      j["router_aux_loss_coef"] = Json(0.001);
    }
  }
  return j;
}

Json hf_generation_config_json(const HfModelShape& s, const std::vector<int32_t>& eos_ids) {
  Json j = Json::object();
  if (s.bos_token_id >= 0) j["bos_token_id"] = Json(s.bos_token_id);
  if (eos_ids.size() > 1) {
    Json list = Json::array();
    for (int32_t id : eos_ids) list.push_back(Json(id));
    j["eos_token_id"] = std::move(list);
  } else if (!eos_ids.empty() || s.eos_token_id >= 0) {
    j["eos_token_id"] = Json(eos_ids.empty() ? s.eos_token_id : eos_ids[0]);
  }
  j["_from_model_config"] = Json(false);
  return j;
}

HfModelShape hf_shape_from_config(const Json& config, const std::string& where) {
  LOOM_CHECK(config.is_object(), where, ": expected a JSON object");
  ConfigReader r{config, where};
  HfModelShape s;
  const std::string type = r.string("model_type", "");
  LOOM_CHECK(!type.empty(), where, ": missing field 'model_type'");
  if (type == "gpt2") {
    s.family = "gpt2";
    s.d_model = r.positive("n_embd");
    s.n_layer = r.positive("n_layer");
    s.n_head = r.positive("n_head");
    s.n_kv_head = s.n_head;
    LOOM_CHECK(s.d_model % s.n_head == 0, where, ": n_embd (", s.d_model,
               ") is not a multiple of n_head (", s.n_head, ")");
    s.head_dim = s.d_model / s.n_head;
    s.d_ff = r.has("n_inner") ? r.positive("n_inner") : 4 * s.d_model;
    s.vocab = r.positive("vocab_size");
    s.max_seq = r.has("n_positions") ? r.positive("n_positions") : r.positive("n_ctx");
    s.norm_eps = r.number("layer_norm_epsilon", 1e-5f);
    s.tied = r.boolean("tie_word_embeddings", true);
    const std::string act = r.string("activation_function", "gelu_new");
    LOOM_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", where, ": activation_function '",
               act, "' is not supported (Loom's GPT-2 uses the tanh ", "GELU: gelu_new)");
    LOOM_CHECK(r.boolean("scale_attn_weights", true), where,
               ": scale_attn_weights false is not supported");
    LOOM_CHECK(!r.boolean("scale_attn_by_inverse_layer_idx", false), where,
               ": scale_attn_by_inverse_layer_idx is not supported");
  } else if (type == "gemma" || type == "gemma2" || type == "gemma3_text") {
    read_gemma(r, s, type, where);
  } else if (type == "gemma3") {
    fail(where, ": model_type 'gemma3' (Gemma3ForConditionalGeneration, text and vision) is not ",
         "supported: Loom imports the text model, model_type gemma3_text");
  } else if (type == "qwen2_moe") {
    fail(where, ": model_type 'qwen2_moe' is not supported: its shared expert and that expert's ",
         "sigmoid gate have no equivalent in Loom's MoE layers (Loom imports mixtral and ",
         "qwen3_moe)");
  } else if (type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral" ||
             type == "mixtral" || type == "qwen3_moe" || type == "phi3") {
    s.family = type;
    s.d_model = r.positive("hidden_size");
    s.d_ff = r.positive("intermediate_size");
    s.n_layer = r.positive("num_hidden_layers");
    s.n_head = r.positive("num_attention_heads");
    s.n_kv_head = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : s.n_head;
    if (r.has("head_dim")) {
      s.head_dim = r.positive("head_dim");
    } else {
      LOOM_CHECK(s.d_model % s.n_head == 0, where, ": hidden_size (", s.d_model,
                 ") is not a multiple of num_attention_heads (", s.n_head, ") and no head_dim");
      s.head_dim = s.d_model / s.n_head;
    }
    s.vocab = r.positive("vocab_size");
    s.max_seq = r.positive("max_position_embeddings");
    s.norm_eps = r.number("rms_norm_eps", 1e-6f);
    s.rope_theta = r.number("rope_theta", 10000.f);
    s.tied = r.boolean("tie_word_embeddings", false);
    const std::string act = r.string("hidden_act", "silu");
    LOOM_CHECK(act == "silu", where, ": hidden_act '", act, "' is not supported (", type,
               " uses silu)");
    if (r.has("rope_scaling")) s.rope_scaling = rope_scaling_from(r.get("rope_scaling"), where);
    // transformers 5 writes both as one object, rope_parameters.
    if (r.has("rope_parameters")) {
      const Json& p = r.get("rope_parameters");
      s.rope_scaling = rope_scaling_from(p, where);
      s.rope_theta =
          ConfigReader{p, where + ": rope_parameters"}.number("rope_theta", s.rope_theta);
    }
    // Qwen2 always has q/k/v biases (and no others); Qwen3's attention_bias would put one on
    // o_proj as well, which no Loom option matches.
    LOOM_CHECK(!r.boolean("attention_bias", false), where,
               ": attention_bias true is not supported");
    LOOM_CHECK(!r.boolean("mlp_bias", false), where, ": mlp_bias true is not supported");
    if (type == "qwen2" || type == "qwen3" || type == "qwen3_moe")
      LOOM_CHECK(!r.boolean("use_sliding_window", false), where,
                 ": use_sliding_window true is not supported (Loom's attention has no sliding ",
                 "window)");
    if (type == "mixtral" || type == "qwen3_moe") read_moe(r, s, where);
    if (type == "phi3")
      LOOM_CHECK(r.number("partial_rotary_factor", 1.f) == 1.f, where,
                 ": partial_rotary_factor other than 1 is not supported (Loom rotates every ",
                 "dimension of a head)");
    if ((type == "mistral" || type == "mixtral" || type == "phi3") && r.has("sliding_window")) {
      s.sliding_window = r.positive("sliding_window");
      // A window as long as the context never binds: the same model as none.
      if (s.sliding_window >= s.max_seq) s.sliding_window = 0;
    }
  } else {
    fail(where, ": model_type '", type,
         "' is not supported (Loom imports gpt2, llama, qwen2, qwen3, mistral, mixtral, ",
         "qwen3_moe, phi3, gemma, gemma2 and gemma3_text)");
  }
  check_architectures(r, s.family, where);
  s.bos_token_id = r.token_id("bos_token_id");
  s.eos_token_id = r.token_id("eos_token_id");
  try {
    s.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return s;
}

TensorMap loom_to_hf(const HfModelShape& s, const TensorMap& loom, DType dtype) {
  torch_dtype_name(dtype);  // rejects dtypes transformers cannot load
  check_exact(loom, loom_param_shapes(s), "export_hf: Loom parameters", s.family);
  for (const auto& [name, t] : loom)
    LOOM_CHECK(t.device() == Device::CPU, "export_hf: parameter '", name,
               "' is not on the CPU (copy it to the host first)");
  TensorMap out;
  for (const Piece& p : pieces(s)) {
    Tensor src = loom.at(p.loom);
    if (p.expert >= 0) src = expert_matrix(src, p.expert);
    if (p.row_end > 0) src = src.slice(p.row_begin, p.row_end);
    Tensor t = p.offset != 0 ? offset_by(src, -p.offset, dtype) : converted(src, dtype);
    out[p.hf] = p.transpose ? transposed(t) : t;
  }
  return out;
}

// The parameters of `hf_in` under their canonical names, checked against the family's.
static TensorMap canonical_names(const HfModelShape& s, const TensorMap& hf_in,
                                 const std::string& where) {
  TensorMap hf;
  for (const auto& [name, t] : hf_in) {
    if (ignorable_hf_name(s, name)) continue;
    std::string n = canonical_hf_name(s, name);
    LOOM_CHECK(!hf.count(n), where, ": tensor '", name, "' appears twice (with and without ",
               "the 'transformer.' prefix)");
    hf[n] = t;
  }
  check_exact(hf, hf_param_shapes(s), where, s.family);
  return hf;
}

// The canonical, checked HF tensors into the Loom parameters `out`, converted to their dtypes;
// `done(hf_name)` (when given) after each tensor is copied.
static void hf_to_loom_into(const HfModelShape& s, const TensorMap& hf, const TensorMap& out,
                            const std::function<void(const std::string&)>& done = {}) {
  check_exact(out, loom_param_shapes(s), "import destination", s.family);
  for (const Piece& p : pieces(s)) {
    Tensor dst = out.at(p.loom);
    LOOM_CHECK(dst.is_contiguous(), "import destination: tensor '", p.loom, "' is not contiguous");
    // The common case straight into the destination (no temporary of the tensor): its rows
    // copied, or widened from bf16 as they are copied.
    if (!p.transpose && p.offset == 0 && p.expert < 0 && hf.at(p.hf).is_contiguous()) {
      Tensor d = p.row_end > 0 ? dst.slice(p.row_begin, p.row_end) : dst;
      const Tensor& src = hf.at(p.hf);
      if (d.is_contiguous() && d.shape() == src.shape() &&
          (src.dtype() == d.dtype() || (src.dtype() == DType::BF16 && d.dtype() == DType::F32))) {
        if (src.dtype() == d.dtype()) {
          std::memcpy(d.raw(), src.raw(), src.nbytes());
        } else {
          const uint16_t* a = src.data<uint16_t>();
          float* b = d.data<float>();
          for (int64_t i = 0; i < src.numel(); ++i) b[i] = bf16_to_f32(a[i]);
        }
        if (done) done(p.hf);
        continue;
      }
    }
    Tensor src = p.offset != 0 ? offset_by(hf.at(p.hf), p.offset, dst.dtype())
                               : converted(hf.at(p.hf), dst.dtype());
    if (p.expert >= 0) dst = expert_matrix(dst, p.expert);
    if (p.row_end > 0) dst = dst.slice(p.row_begin, p.row_end);
    dst.copy_from(p.transpose ? transposed(src) : src);  // same dtype, contiguous: a memcpy
    if (done) done(p.hf);
  }
}

TensorMap hf_to_loom(const HfModelShape& s, const TensorMap& hf_in, DType dtype,
                     const std::string& where) {
  const TensorMap hf = canonical_names(s, hf_in, where);
  TensorMap out;
  for (const auto& [name, shape] : loom_param_shapes(s)) out[name] = Tensor::zeros(shape, dtype);
  hf_to_loom_into(s, hf, out);
  return out;
}

void export_hf(const std::string& dir, const HfModelShape& shape, const TensorMap& loom_params,
               DType out_dtype, uint64_t max_shard_bytes, const std::vector<int32_t>& eos_ids) {
  const Json config = hf_config_json(shape, out_dtype);
  const TensorMap hf = loom_to_hf(shape, loom_params, out_dtype);
  make_dirs(dir);
  const Metadata meta = {{"format", "pt"}};

  // Group tensors into shards in name order (transformers' own order is by name as well).
  std::vector<std::vector<std::string>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : hf) {
    const uint64_t n = t.nbytes();
    if (max_shard_bytes > 0 && in_shard > 0 && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(name);
    in_shard += n;
    total += n;
  }

  std::set<std::string> written;
  if (max_shard_bytes == 0 || shards.size() == 1) {
    write_safetensors(join(dir, kSingleFile), hf, meta);
    written.insert(kSingleFile);
  } else {
    Json weight_map = Json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shard_file_name(i + 1, shards.size());
      TensorMap part;
      for (const std::string& name : shards[i]) {
        part[name] = hf.at(name);
        weight_map[name] = Json(file);
      }
      write_safetensors(join(dir, file), part, meta);
      written.insert(file);
    }
    Json index = Json::object();
    index["metadata"]["total_size"] = Json(total);
    index["weight_map"] = std::move(weight_map);
    write_file_atomic(join(dir, kIndexFile), index.dump(2) + "\n");
    written.insert(kIndexFile);
  }
  // Weights of an earlier export in the other layout would confuse loaders: remove them.
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string n = de.path().filename().string();
    if ((n == kSingleFile || n == kIndexFile || is_shard_file_name(n)) && !written.count(n))
      remove_all(de.path().string());
  }
  if (shape.bos_token_id >= 0 || shape.eos_token_id >= 0 || !eos_ids.empty())
    write_file_atomic(join(dir, kGenerationFile),
                      hf_generation_config_json(shape, eos_ids).dump(2) + "\n");
  else if (file_exists(join(dir, kGenerationFile)))
    remove_all(join(dir, kGenerationFile));  // an earlier export's ids would not be this model's
  write_file_atomic(join(dir, kConfigFile), config.dump(2) + "\n");
}

HfModelShape read_hf_shape(const std::string& dir) {
  const std::string config_path = join(dir, kConfigFile);
  return hf_shape_from_config(Json::parse(read_file(config_path), config_path), config_path);
}

// Maps the directory's safetensors, checks them against `shape` (names, shapes, the layer
// count), and only then asks `destination` for the parameters to convert them into (null: check
// only), so a config.json the weights do not hold is refused before anything is allocated.
static void import_hf_checked(const std::string& dir, const HfModelShape& shape,
                              const std::function<const TensorMap*()>& destination) {
  const std::string config_path = join(dir, kConfigFile);

  std::vector<std::unique_ptr<SafetensorsReader>> files;
  TensorMap hf;
  std::string where;
  // Each canonical name's file and name there: its pages are dropped once it is copied, so the
  // import holds the model once plus one tensor of the files, not the files too.
  std::map<std::string, std::pair<const SafetensorsReader*, std::string>> origin;
  // Buffers of dtypes Loom has no type for are read past, but only those a loader skips anyway.
  auto check_skipped = [&](const SafetensorsReader& f) {
    for (const auto& s : f.skipped())
      LOOM_CHECK(ignorable_hf_name(shape, s.name), f.path(), ": tensor '", s.name, "' has dtype ",
                 s.dtype, ", which Loom cannot load (only buffers such as GPT-2's attn.bias mask ",
                 "are skipped)");
  };
  const std::string single = join(dir, kSingleFile), index_path = join(dir, kIndexFile);
  if (file_exists(single)) {
    files.push_back(std::make_unique<SafetensorsReader>(single, /*skip_foreign=*/true));
    check_skipped(*files.back());
    for (const std::string& n : files.back()->names()) {
      hf[n] = files.back()->view(n);
      origin[canonical_hf_name(shape, n)] = {files.back().get(), n};
    }
    where = single;
  } else {
    LOOM_CHECK(file_exists(index_path), dir, ": neither ", kSingleFile, " nor ", kIndexFile);
    const Json index = Json::parse(read_file(index_path), index_path);
    LOOM_CHECK(
        index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
        index_path, ": missing object 'weight_map'");
    std::map<std::string, SafetensorsReader*> by_file;
    for (const auto& [name, file_json] : index.at("weight_map").as_object()) {
      LOOM_CHECK(file_json.is_string(), index_path, ": weight_map '", name, "' is not a string");
      const std::string& file = file_json.as_string();
      LOOM_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(), index_path,
                 ": weight_map '", name, "' names '", file, "', not a file in ", dir);
      auto it = by_file.find(file);
      if (it == by_file.end()) {
        files.push_back(std::make_unique<SafetensorsReader>(join(dir, file), true));
        check_skipped(*files.back());
        it = by_file.emplace(file, files.back().get()).first;
      }
      if (ignorable_hf_name(shape, name) && !it->second->contains(name)) continue;  // skipped
      LOOM_CHECK(it->second->contains(name), index_path, ": weight_map puts '", name, "' in ",
                 it->second->path(), ", which does not contain it");
      hf[name] = it->second->view(name);
      origin[canonical_hf_name(shape, name)] = {it->second, name};
    }
    where = index_path;
  }
  check_layer_count(shape, hf, config_path, where);
  const TensorMap canonical = canonical_names(shape, hf, where);
  if (const TensorMap* dst = destination())
    hf_to_loom_into(shape, canonical, *dst, [&](const std::string& n) {
      if (auto it = origin.find(n); it != origin.end())
        it->second.first->release(it->second.second);
    });
}

void check_hf_import(const std::string& dir, const HfModelShape& shape) {
  import_hf_checked(dir, shape, [] { return nullptr; });
}

void import_hf_into(const std::string& dir, const HfModelShape& shape, const TensorMap& dst) {
  import_hf_checked(dir, shape, [&] { return &dst; });
}

HfModel import_hf(const std::string& dir, DType dtype) {
  HfModel m;
  m.shape = read_hf_shape(dir);
  import_hf_checked(dir, m.shape, [&] {
    for (const auto& [name, shape] : loom_param_shapes(m.shape))
      m.params[name] = Tensor::zeros(shape, dtype);
    return &m.params;
  });
  return m;
}

}  // namespace loom::ckpt
