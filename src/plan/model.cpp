#include "plan/model.h"

#include <map>

#include "core/error.h"

namespace loom::plan {

double ParamCounts::total(const ModelSpec& m) const {
  return m.layers * (per_layer_dense() + per_layer_experts(m)) + embedding + output;
}

double ParamCounts::active(const ModelSpec& m) const {
  double mlp_active = m.moe() ? mlp * m.top_k : mlp;
  return m.layers * (per_layer_dense() + mlp_active) + embedding + output;
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts p;
  const double h = m.hidden, q = double(m.heads) * m.hd(), kv = double(m.kv()) * m.hd();
  const double b = m.bias ? 1 : 0;
  p.attn = h * (q + 2 * kv) + b * (q + 2 * kv) + q * h + b * h;
  const double up = m.gated_mlp ? 2.0 * m.ffn : double(m.ffn);
  p.mlp = h * up + b * up + double(m.ffn) * h + b * h;
  p.router = m.moe() ? h * m.experts : 0;
  p.norms = 2 * h * (m.bias ? 2 : 1);  // LayerNorm has a bias, RMSNorm does not
  p.embedding = double(m.vocab) * h +
                (m.learned_positions ? double(m.positions > 0 ? m.positions : m.seq) * h : 0);
  p.output = (m.tied_embeddings ? 0 : double(m.vocab) * h) + h * (m.bias ? 2 : 1);
  return p;
}

double layer_gemm_flops_per_token(const ModelSpec& m) {
  ParamCounts p = count_params(m);
  double mlp = m.moe() ? p.mlp * m.top_k + p.router : p.mlp;
  return 2 * (p.attn + mlp);
}

double attention_flops_per_token(const ModelSpec& m, double kv_len) {
  return 4.0 * kv_len * double(m.heads) * m.hd();
}

double logits_flops_per_token(const ModelSpec& m) {
  return 2.0 * m.hidden * double(m.vocab);
}

void validate(const ModelSpec& m) {
  auto need = [&](int64_t v, const char* field) {
    LOOM_CHECK(v > 0, "model '", m.name, "': field '", field, "' must be a positive integer, got ",
               v);
  };
  need(m.layers, "layers");
  need(m.hidden, "hidden");
  need(m.heads, "heads");
  need(m.ffn, "ffn");
  need(m.vocab, "vocab");
  need(m.seq, "seq");
  LOOM_CHECK(m.head_dim > 0 || m.hidden % m.heads == 0, "model '", m.name, "': hidden ", m.hidden,
             " is not divisible by heads ", m.heads, " (set head_dim explicitly)");
  LOOM_CHECK(m.kv_heads >= 0 && m.heads % m.kv() == 0, "model '", m.name, "': kv_heads ",
             m.kv_heads, " must divide heads ", m.heads);
  LOOM_CHECK(m.experts >= 0, "model '", m.name, "': experts must be >= 0");
  LOOM_CHECK(!m.moe() || (m.top_k >= 1 && m.top_k <= m.experts), "model '", m.name, "': top_k ",
             m.top_k, " must be between 1 and experts (", m.experts, ")");
}

namespace {

ModelSpec llama(const char* name, int64_t L, int64_t h, int64_t a, int64_t kv, int64_t f, int64_t V,
                int64_t s, bool tied) {
  ModelSpec m;
  m.name = name;
  m.layers = L;
  m.hidden = h;
  m.heads = a;
  m.kv_heads = kv;
  m.ffn = f;
  m.vocab = V;
  m.seq = s;
  m.gated_mlp = true;
  m.tied_embeddings = tied;
  return m;
}

// GPT models of the Megatron-LM scaling study (Narayanan et al. 2021, Table 1): vocabulary
// 51,200, sequence 2,048, FFN 4h, GeLU, biases, learned positions, tied embeddings, dropout.
ModelSpec megatron(const char* name, int64_t L, int64_t h, int64_t a) {
  ModelSpec m;
  m.name = name;
  m.layers = L;
  m.hidden = h;
  m.heads = a;
  m.ffn = 4 * h;
  m.vocab = 51200;
  m.seq = 2048;
  m.gated_mlp = false;
  m.tied_embeddings = true;
  m.bias = true;
  m.learned_positions = true;
  m.dropout = true;
  return m;
}

const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> all = [] {
    std::map<std::string, ModelSpec> p;
    ModelSpec gpt2 = megatron("gpt2-124m", 12, 768, 12);
    gpt2.vocab = 50257;
    gpt2.seq = 1024;
    gpt2.dropout = false;
    p[gpt2.name] = gpt2;
    p["llama3-1b"] = llama("llama3-1b", 16, 2048, 32, 8, 8192, 128256, 8192, true);
    p["llama3-8b"] = llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, false);
    p["llama3-70b"] = llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, false);
    p["llama3-405b"] = llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, false);
    ModelSpec gpt3 = megatron("gpt3-175b", 96, 12288, 96);
    p[gpt3.name] = gpt3;
    // Nemotron-4 340B: GQA, squared-ReLU MLP (two matrices), no biases, untied, RoPE.
    ModelSpec nem = llama("nemotron4-340b", 96, 18432, 96, 8, 73728, 256000, 4096, false);
    nem.gated_mlp = false;
    p[nem.name] = nem;
    ModelSpec mix = llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, false);
    mix.experts = 8;
    mix.top_k = 2;
    p[mix.name] = mix;
    ModelSpec mix22 = llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 4096, false);
    mix22.experts = 8;
    mix22.top_k = 2;
    p[mix22.name] = mix22;
    for (ModelSpec m :
         {megatron("megatron-1.7b", 24, 2304, 24), megatron("megatron-3.6b", 30, 3072, 32),
          megatron("megatron-7.5b", 36, 4096, 32), megatron("megatron-18b", 40, 6144, 48),
          megatron("megatron-39b", 48, 8192, 64), megatron("megatron-76b", 60, 10240, 80),
          megatron("megatron-145b", 80, 12288, 96), megatron("megatron-310b", 96, 16384, 128),
          megatron("megatron-530b", 105, 20480, 128), megatron("megatron-1t", 128, 25600, 160)})
      p[m.name] = m;
    return p;
  }();
  return all;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (auto& [k, v] : presets()) names.push_back(k);
  return names;
}

ModelSpec model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
    fail("unknown model preset '", name, "' (known: ", known, ")");
  }
  return it->second;
}

}  // namespace loom::plan
