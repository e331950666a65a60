#include "model/decoder.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

void TensorParallel::validate(const ModelConfig& c) const {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor-parallel rank ", rank,
             " outside a group of ", size);
  if (size == 1) return;
  LOOM_CHECK(comm && comm->size() == size, "tensor parallelism needs its group's communicator");
  LOOM_CHECK(c.n_head % size == 0, "model.n_head (", c.n_head, ") must be divisible by ",
             "parallel.tp (", size, ")");
  LOOM_CHECK(c.n_kv_head % size == 0, "model.n_kv_head (", c.n_kv_head,
             ") must be divisible by parallel.tp (", size, "): KV heads are split, not replicated");
  LOOM_CHECK(c.d_ff % size == 0, "model.d_ff (", c.d_ff, ") must be divisible by parallel.tp (",
             size, ")");
  // The ranks hold different heads, so the q/k norms' weight gradients would need a sum over
  // the group that the layout does not make.
  LOOM_CHECK(!c.qk_norm,
             "model.qk_norm is not supported under tensor parallelism (parallel.tp = ", size, ")");
  LOOM_CHECK(!c.uses_gemma_ops() && !c.embed_scale,
             "Gemma's options (model.window_pattern, geglu, sandwich_norm, embed_scale, ",
             "attn_softcap, final_softcap) are not supported under tensor parallelism ",
             "(parallel.tp = ", size, ")");
  LOOM_CHECK(c.vocab % size == 0, "model.vocab (", c.vocab, ") must be divisible by parallel.tp (",
             size, "): pad the vocabulary to a multiple of ", size,
             " (e.g. model.vocab = ", (c.vocab + size - 1) / size * size, ")");
}

Decoder::Decoder(const ModelConfig& cfg, Backend& backend, Recompute recompute, DType act_dtype,
                 const TensorParallel& tp, const ExpertParallel& ep, const PipelineStage& pp)
    : cfg_(cfg),
      tp_(tp),
      ep_(ep),
      pp_(pp),
      be_(backend),
      recompute_(recompute),
      act_dtype_(act_dtype),
      store_bf16_(act_dtype == DType::BF16) {
  for (size_t c = 0; c < pp_.chunks.size(); ++c) {
    auto [b, e] = pp_.chunks[c];
    LOOM_CHECK(0 <= b && b < e && e <= cfg.n_layer, "pipeline chunk ", c, " holds layers [", b,
               ", ", e, ") of ", cfg.n_layer);
  }
  LOOM_CHECK(pp_.whole() || !pp_.first || pp_.chunks.front().first == 0,
             "the first pipeline stage must start at layer 0");
  LOOM_CHECK(pp_.whole() || !pp_.last || pp_.chunks.back().second == cfg.n_layer,
             "the last pipeline stage must end at the last layer");
  cfg_.validate();
  tp_.validate(cfg_);
  LOOM_CHECK(!cfg_.uses_gemma_ops() || be_.has_gemma_ops(), "the ", be_.name(),
             " backend does not implement Gemma's ops (GeGLU, windowed and soft-capped ",
             "attention, logit soft-capping; model.window_pattern, geglu, attn_softcap, ",
             "final_softcap, sandwich_norm): run this model on the CPU backend");
  ep_.validate(cfg_);
  // The expert-tensor-parallel group is a slice of the tensor-parallel one (tokens and routing
  // are replicated over TP; each ETP group splits the experts' width).
  LOOM_CHECK(tp_.size % ep_.tp_size == 0, "parallel.etp (", ep_.tp_size,
             ") must divide parallel.tp (", tp_.size, "): use etp = 1 (experts replicated over ",
             "the TP group) or a divisor of tp");
  LOOM_CHECK(act_dtype == DType::F32 || act_dtype == DType::BF16 || act_dtype == DType::F16,
             "activation dtype must be fp32, bf16 or fp16, got ", dtype_name(act_dtype));
  const int T = tp_.size;
  hq_ = cfg_.n_head / T;
  hkv_ = cfg_.n_kv_head / T;
  qkv_ = (hq_ + 2 * hkv_) * cfg_.head_dim;
  att_ = hq_ * cfg_.head_dim;
  ff_ = cfg_.d_ff / T;
  fc_ = cfg_.fc_dim() / T;
  vocab_ = cfg_.vocab / T;
  v0_ = tp_.rank * vocab_;
  // The layout's communication (parallel/), or the one-process ops: also for a one-rank group
  // that brought its own, so that one rank computes exactly what one process does (the whole
  // vocabulary's fused cross-entropy, not the sliced one).
  if (T == 1) {
    tpo_ = single_rank_ops();
    vocab_ops_ = whole_vocab_ops(be_, cfg_.vocab);
  } else if (tp_.make_ops && tp_.make_vocab) {
    tpo_ = tp_.make_ops(tp_, be_);
    vocab_ops_ = tp_.make_vocab(tp_, *tpo_, cfg_.vocab, be_);
  }
  packed_attention_ = packed_attention(be_);
  attention_ = packed_attention_.get();
  build_params();
  if (cfg_.is_moe()) {
    moe_.resize(cfg_.n_layer);
    for (int l = 0; l < cfg_.n_layer; ++l)
      if (cfg_.is_moe_layer(l) && holds_layer(l))
        moe_[l] = std::make_unique<MoeLayer>(cfg_, ep_, be_);
  }
}

Decoder::~Decoder() = default;

void Decoder::build_params() {
  const int64_t C = cfg_.d_model, V = cfg_.vocab;
  const float std = cfg_.init_std;
  // Output projections of residual branches are scaled by 1/sqrt(2 * layers) (GPT-2) so the
  // residual stream's variance does not grow with depth.
  const float proj_std = std / std::sqrt(2.f * cfg_.n_layer);
  const bool b = cfg_.bias;
  auto norm = [&](const std::string& n) {
    params_.add(n + ".weight", {C}, false, ParamInit::Ones);
    if (b) params_.add(n + ".bias", {C}, false, ParamInit::Zeros);
  };
  auto linear = [&](const std::string& n, int64_t out, int64_t in, float s, bool with_bias) {
    params_.add(n + ".weight", {out, in}, true, ParamInit::Normal, s);
    if (with_bias) params_.add(n + ".bias", {out}, false, ParamInit::Zeros);
  };
  const int64_t Vl = vocab_;
  // Under pipeline parallelism each rank builds only what its stages hold (same names, so the
  // same initial values); a tied embedding is on the first and the last stage.
  if (pp_.first || (pp_.last && cfg_.tied))
    params_.add("embed.wte", {Vl, C}, false, ParamInit::Normal, std);
  if (pp_.first && cfg_.uses_positions_table())
    params_.add("embed.wpe", {cfg_.max_seq, C}, false, ParamInit::Normal, std);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!holds_layer(l)) continue;
    std::string p = "blocks." + std::to_string(l);
    norm(p + ".norm1");
    linear(p + ".attn.qkv", qkv_, C, std, cfg_.has_qkv_bias());
    linear(p + ".attn.proj", C, att_, proj_std, b);
    if (cfg_.qk_norm) {
      params_.add(p + ".attn.q_norm.weight", {cfg_.head_dim}, false, ParamInit::Ones);
      params_.add(p + ".attn.k_norm.weight", {cfg_.head_dim}, false, ParamInit::Ones);
    }
    norm(p + ".norm2");
    if (cfg_.sandwich_norm) {
      norm(p + ".attn.post_norm");
      norm(p + ".mlp.post_norm");
    }
    if (cfg_.is_moe_layer(l)) {
      params_.add(p + ".moe.router.weight", {int64_t(cfg_.n_experts), C}, true, ParamInit::Normal,
                  std);
      continue;
    }
    linear(p + ".mlp.fc", fc_, C, std, b);
    linear(p + ".mlp.proj", C, ff_, proj_std, b);
  }
  if (pp_.last) {
    norm("final_norm");
    if (!cfg_.tied) params_.add("head.weight", {Vl, C}, true, ParamInit::Normal, std);
    if (cfg_.value_head) params_.add("score.weight", {1, C}, true, ParamInit::Normal, std);
  }
  (void)V;
  // Expert weights sit after every other parameter, so that under expert parallelism (where
  // each rank holds other experts) the data-parallel engine treats one contiguous tail apart.
  // This rank's experts [e0, e0 + El) draw the values of those experts in one process.
  const int64_t El = cfg_.n_experts / ep_.size, e0 = int64_t(ep_.rank) * El;
  const int64_t H = cfg_.fc_dim(), F = cfg_.d_ff;
  std::vector<int64_t> experts;
  for (int64_t e = 0; e < El; ++e) experts.push_back(e0 + e);
  // Expert tensor parallelism: this rank's rows of w1 (GeLU input, or SwiGLU gate and up) and
  // first column of w2.
  const int T = ep_.tp_size;
  const int64_t Fl = F / T, Hl = H / T, f0 = ep_.tp_rank * Fl;
  std::vector<int64_t> w1_rows;
  for (int64_t i = 0; i < Fl; ++i) w1_rows.push_back(f0 + i);
  if (cfg_.family == Family::Llama)
    for (int64_t i = 0; i < Fl; ++i) w1_rows.push_back(F + f0 + i);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!cfg_.is_moe_layer(l) || !holds_layer(l)) continue;
    std::string p = "blocks." + std::to_string(l) + ".moe.experts.";
    params_.add(p + "w1", {El, Hl, C}, true, ParamInit::Normal, std);
    params_.add(p + "w2", {El, C, Fl}, true, ParamInit::Normal, proj_std);
    for (const char* n : {"w1", "w2"}) {
      params_.mark_expert(p + n);
      if (ep_.size > 1 || T > 1) {
        const bool w1 = n[1] == '1';
        Shape global = w1 ? Shape{cfg_.n_experts, H, C} : Shape{cfg_.n_experts, C, F};
        params_.set_shard(p + n, global, 0, experts);
        if (T > 1) params_.set_inner_shard(p + n, w1 ? 1 : 2, w1 ? w1_rows : std::vector{f0});
      }
    }
  }
  if (tp_.size > 1) shard_params();
  params_.allocate(be_);
}

// Where each local shard sits in its global tensor, so that initialisation draws the global
// elements and checkpoints can place them.
void Decoder::shard_params() {
  const int64_t C = cfg_.d_model, D = cfg_.head_dim, r = tp_.rank;
  auto rows = [](int64_t first, int64_t n, std::vector<int64_t>& out) {
    for (int64_t i = 0; i < n; ++i) out.push_back(first + i);
  };
  auto row_shard = [&](const std::string& name, int64_t global_rows,
                       const std::vector<int64_t>& idx) {
    params_.set_shard(name + ".weight", {global_rows, C}, 0, idx);
    if (params_.has(name + ".bias")) params_.set_shard(name + ".bias", {global_rows}, 0, idx);
  };
  std::vector<int64_t> vocab_rows;
  rows(v0_, vocab_, vocab_rows);
  if (params_.has("embed.wte")) params_.set_shard("embed.wte", {cfg_.vocab, C}, 0, vocab_rows);
  if (params_.has("head.weight")) params_.set_shard("head.weight", {cfg_.vocab, C}, 0, vocab_rows);
  const int64_t Hq = cfg_.n_head, Hkv = cfg_.n_kv_head;
  std::vector<int64_t> qkv_rows, fc_rows;
  rows(r * hq_ * D, hq_ * D, qkv_rows);                     // this rank's query heads
  rows(Hq * D + r * hkv_ * D, hkv_ * D, qkv_rows);          // its key heads
  rows((Hq + Hkv) * D + r * hkv_ * D, hkv_ * D, qkv_rows);  // its value heads
  rows(r * ff_, ff_, fc_rows);                              // GeLU input, or SwiGLU gate
  if (cfg_.family == Family::Llama) rows(cfg_.d_ff + r * ff_, ff_, fc_rows);  // SwiGLU up
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!holds_layer(l)) continue;
    std::string p = "blocks." + std::to_string(l);
    row_shard(p + ".attn.qkv", cfg_.qkv_dim(), qkv_rows);
    params_.set_shard(p + ".attn.proj.weight", {C, Hq * D}, 1, {r * att_});
    if (cfg_.is_moe_layer(l)) continue;  // router replicated; experts sharded by ETP only
    row_shard(p + ".mlp.fc", cfg_.fc_dim(), fc_rows);
    params_.set_shard(p + ".mlp.proj.weight", {C, int64_t(cfg_.d_ff)}, 1, {r * ff_});
  }
}

MoeWeights Decoder::moe_weights(int l, bool grads) {
  std::string p = "blocks." + std::to_string(l) + ".moe.";
  auto get = [&](const std::string& n) { return grads ? grad_of(p + n) : params_.ptr(p + n); };
  return {get("router.weight"), get("experts.w1"), get("experts.w2")};
}

Decoder::Norm Decoder::norm_params(const std::string& prefix) {
  const std::string w = prefix + ".weight", b = prefix + ".bias";
  const bool has_b = params_.has(b);
  return {params_.ptr(w), has_b ? params_.ptr(b) : nullptr, grad_of(w),
          has_b ? grad_of(b) : nullptr};
}

// A linear's weight. Under the 2-byte weights (ParamSet::drop_fp32) a weight the GEMM recipe
// reads keeps only its place in the fp32 buffer: the recipe takes the address as a key into the
// bf16 copy. Without a recipe ptr() refuses a dropped weight (the GEMM would read zeros).
static const float* linear_weight(ParamSet& P, const std::string& name, bool recipe) {
  return recipe ? P.fp32_storage_ptr(name) : P.ptr(name);
}

Linear Decoder::linear(const std::string& prefix, int in, int out, Linear::Split split) {
  const std::string w = prefix + ".weight", b = prefix + ".bias";
  const bool has_b = params_.has(b);
  Linear lin;
  lin.w = linear_weight(params_, w, recipes_.count(prefix) > 0);
  lin.b = has_b ? params_.ptr(b) : nullptr;
  lin.dw = grad_of(w);
  lin.db = has_b ? grad_of(b) : nullptr;
  lin.in = in;
  lin.out = out;
  lin.split = split;
  lin.tp = tpo_.get();
  lin.widen = &widen_;
  if (auto it = adapters_.find(prefix); it != adapters_.end()) lin.adapter = it->second;
  if (auto it = recipes_.find(prefix); it != recipes_.end()) lin.recipe = it->second;
  return lin;
}

Decoder::LayerParamsKey Decoder::layer_params_key() {
  return {params_.layout_version(), attach_generation_, params_.fp32_storage(), params_.grad(),
          tpo_.get()};
}

Decoder::LayerParams Decoder::layer_params(int l) {
  const LayerParamsKey key = layer_params_key();
  if (!(key == layer_params_built_) || layer_params_cache_.size() != size_t(cfg_.n_layer)) {
    layer_params_cache_.assign(size_t(cfg_.n_layer), LayerParams{});
    layer_params_valid_.assign(size_t(cfg_.n_layer), 0);
    layer_params_built_ = key;
  }
  if (!layer_params_valid_[size_t(l)]) {
    layer_params_cache_[size_t(l)] = build_layer_params(l);
    layer_params_valid_[size_t(l)] = 1;
  }
  return layer_params_cache_[size_t(l)];
}

Decoder::LayerParams Decoder::build_layer_params(int l) {
  const std::string p = "blocks." + std::to_string(l) + ".";
  const int C = cfg_.d_model;
  LayerParams lp;
  lp.ln1 = norm_params(p + "norm1");
  lp.ln2 = norm_params(p + "norm2");
  if (cfg_.qk_norm) {
    lp.q_norm = norm_params(p + "attn.q_norm");
    lp.k_norm = norm_params(p + "attn.k_norm");
  }
  if (cfg_.sandwich_norm) {
    lp.post_attn = norm_params(p + "attn.post_norm");
    lp.post_mlp = norm_params(p + "mlp.post_norm");
  }
  using S = Linear::Split;
  lp.qkv = linear(p + "attn.qkv", C, qkv_, S::Column);
  lp.proj = linear(p + "attn.proj", att_, C, S::Row);
  if (!cfg_.is_moe_layer(l)) {
    lp.fc = linear(p + "mlp.fc", C, fc_, S::Column);
    lp.mp = linear(p + "mlp.proj", ff_, C, S::Row);
  }
  return lp;
}

std::vector<Decoder::LinearInfo> Decoder::linears() const {
  std::vector<LinearInfo> out;
  const int C = cfg_.d_model;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!holds_layer(l)) continue;
    const std::string p = "blocks." + std::to_string(l) + ".";
    out.push_back({p + "attn.qkv", C, qkv_});
    out.push_back({p + "attn.proj", att_, C});
    if (cfg_.is_moe_layer(l)) continue;
    out.push_back({p + "mlp.fc", C, fc_});
    out.push_back({p + "mlp.proj", ff_, C});
  }
  if (pp_.last) out.push_back({"head", C, vocab_});
  return out;
}

static void check_linear_name(const std::vector<Decoder::LinearInfo>& all,
                              const std::string& name) {
  for (const auto& l : all)
    if (l.name == name) return;
  fail("no linear layer named '", name, "' in this model (e.g. blocks.0.attn.qkv, ",
       "blocks.0.mlp.fc, head)");
}

void Decoder::attach_adapter(const std::string& name, LinearAdapter* adapter) {
  check_linear_name(linears(), name);
  ++attach_generation_;  // layer_params' cache holds the old attachment
  if (adapter)
    adapters_[name] = adapter;
  else
    adapters_.erase(name);
}

void Decoder::attach_recipe(const std::string& name, GemmRecipe* recipe) {
  check_linear_name(linears(), name);
  ++attach_generation_;
  if (recipe)
    recipes_[name] = recipe;
  else
    recipes_.erase(name);
}

float* Decoder::grad_of(const std::string& name) {
  return params_.has(name) ? params_.trainable_grad_ptr(name) : nullptr;
}

void Decoder::ensure_buffers(int N) {
  if (N <= b_->N) return;
  const bool fwd = b_->forward_only;
  const int64_t C = cfg_.d_model, Q = qkv_, A = att_, H = hq_, F = ff_, FC = fc_, L = cfg_.n_layer;
  // Two passes: the first measures, the second assigns pointers into one arena.
  int64_t total = 0;
  float* base = nullptr;
  // Floats of a buffer of per_token values per token, padded to 64 bytes.
  auto span = [&](int64_t per_token) { return (per_token * N + 15) / 16 * 16; };
  auto take_floats = [&](int64_t n) -> float* {
    float* p = base ? base + total : nullptr;
    total += n;
    return p;
  };
  auto take = [&](int64_t per_token) -> float* { return take_floats(span(per_token)); };
  // A buffer in the policy's storage type: bf16 takes half the floats.
  auto take_act = [&](int64_t per_token) -> ActBuf {
    ActBuf a;
    if (!store_bf16_) {
      a.f32 = take(per_token);
      return a;
    }
    int64_t n = (per_token * N + 31) / 32 * 16;
    a.bf16 = base ? reinterpret_cast<uint16_t*>(base + total) : nullptr;
    total += n;
    return a;
  };
  for (int pass = 0; pass < 2; ++pass) {
    total = 0;
    b_->layers.assign(L, LayerActs{});
    LayerActs shared{};
    shared.ln1 = take_act(C);
    shared.ln1_mean = take(1);
    shared.ln1_rstd = take(1);
    shared.qkv = take_act(Q);
    if (cfg_.qk_norm) {
      shared.qk_raw = take((H + hkv_) * cfg_.head_dim);
      shared.qk_rstd = take(H + hkv_);
    }
    shared.att = take_act(A);
    shared.lse = take(H);
    shared.x_mid = take(C);
    shared.ln2 = take_act(C);
    shared.ln2_mean = take(1);
    shared.ln2_rstd = take(1);
    shared.fc = take_act(FC);
    shared.act = take_act(F);  // bf16: the one buffer every layer's recomputed act uses
    const bool sw = cfg_.sandwich_norm;
    if (sw) {
      shared.post_attn_in = take(C);
      shared.post_attn_rstd = take(1);
      shared.post_mlp_in = take(C);
      shared.post_mlp_rstd = take(1);
    }
    // A pipeline stage allocates only the layers it holds (the first of them keeps the shared
    // set); with the whole model that is every layer, and layer 0 keeps the shared set.
    int first_held = -1;
    // Forward only: the residual stream alternates between two buffers, layer by layer.
    float* x_pair[2] = {nullptr, nullptr};
    if (fwd) {
      x_pair[0] = take(C);
      x_pair[1] = take(C);
    }
    for (int l = 0; l < L; ++l) {
      LayerActs& a = b_->layers[l];
      if (!holds_layer(l)) continue;
      if (first_held < 0) first_held = l;
      a = shared;
      if (fwd) {
        a.x_in = x_pair[l % 2];
        continue;
      }
      a.x_in = take(C);
      if (recompute_ == Recompute::Full) continue;  // everything else is recomputed
      if (l == first_held) continue;
      a.ln1 = take_act(C);
      a.ln1_mean = take(1);
      a.ln1_rstd = take(1);
      a.qkv = take_act(Q);
      if (cfg_.qk_norm) {
        a.qk_raw = take((H + hkv_) * cfg_.head_dim);
        a.qk_rstd = take(H + hkv_);
      }
      if (recompute_ != Recompute::Selective) {  // selective: attention core recomputed, shared
        a.att = take_act(A);
        a.lse = take(H);
      }
      a.x_mid = take(C);
      a.ln2 = take_act(C);
      a.ln2_mean = take(1);
      a.ln2_rstd = take(1);
      a.fc = take_act(FC);
      if (!store_bf16_) a.act = take_act(F);
      if (sw) {
        a.post_attn_in = take(C);
        a.post_attn_rstd = take(1);
        a.post_mlp_in = take(C);
        a.post_mlp_rstd = take(1);
      }
    }
    b_->x_final = take(C);
    b_->lnf = take_act(C);
    b_->lnf_mean = take(1);
    b_->lnf_rstd = take(1);
    b_->losses = take(1);
    b_->tmp = take(C);
    if (!fwd) {
      b_->dres = take(C);
      b_->dln = take(C);
      if (sw) b_->dpost = take(C);
    }
    if (!fwd && store_bf16_) {
      // bf16 storage, training: the fp32 working buffers share two regions, as their lifetimes
      // within a block's backward allow (block_backward's order: MLP, ln2, attention, ln1):
      //   region 1: q32 | att32 (forward, recomputation, attention backward's widened inputs),
      //             dact (MLP backward), dtmp (the norms' backward, before q32 is widened and
      //             after attention backward);
      //   region 2: fc32 (forward, recomputation) = dfc (MLP backward), dqkv | datt (attention
      //             backward, after fc's backward consumed dfc).
      // 6K floats per token less for GPT-2 124M: what keeps bf16 under 60% of fp32's activation
      // memory at 256 tokens, where the fixed fp32 logits chunk weighs most.
      const int64_t q = span(Q), a = span(A);
      float* r1 = take_floats(std::max({q + a, span(F), span(C)}));
      float* r2 = take_floats(std::max(span(FC), q + a));
      b_->q32 = r1;
      b_->att32 = r1 ? r1 + q : nullptr;
      b_->dact = r1;
      b_->dtmp = r1;
      b_->dfc = r2;
      b_->fc32 = r2;
      b_->dqkv = r2;
      b_->datt = r2 ? r2 + q : nullptr;
    } else if (!fwd) {
      b_->dtmp = take(C);
      b_->datt = take(A);
      b_->dqkv = take(Q);
      b_->dfc = take(FC);
      b_->dact = take(F);
    } else if (store_bf16_) {
      b_->q32 = take(Q);
      b_->att32 = take(A);
      b_->fc32 = take(FC);
    }
    // Logits exist only where the head runs (the whole model, or the last pipeline stage).
    // (No more rows than the batch has: a device's chunk can exceed a small batch.)
    const int64_t head_rows = std::min<int64_t>(head_chunk(), N);
    int64_t logits = pp_.last ? (head_rows * vocab_ + 15) / 16 * 16 : 0;
    b_->logits = base ? base + total : nullptr;
    total += logits;
    if (cfg_.final_softcap > 0 && !fwd) b_->capped = take_floats(logits);
    if (pass == 0) {
      // Zeroed, as a fresh arena always was (the padding between views stays zero).
      const size_t bytes = static_cast<size_t>(total) * sizeof(float);
      b_->mem.reset();  // the old arena goes before the new one comes: no two at once
      b_->mem = BackendBuffer(be_, bytes, fwd ? "forward-only" : "activations");
      be_.fill_bytes(b_->mem.data(), 0, bytes);
      base = b_->mem.as<float>();
    }
  }
  b_->N = N;
  // Inputs: tokens, targets, positions (int32) and loss weights (fp32), each part aligned.
  const size_t part = (size_t(N) * 4 + Backend::kAlign - 1) / Backend::kAlign * Backend::kAlign;
  b_->io = BackendBuffer(be_, 4 * part, "inputs");
}

void Decoder::upload_input(const ModelInput& in) {
  char* io = b_->io.as<char>();
  const size_t part = b_->io.bytes() / 4, bytes = size_t(in.N) * 4;
  auto put = [&](int slot, const void* src) -> void* {
    if (!src) return nullptr;
    be_.copy_h2d(io + slot * part, src, bytes);
    return io + slot * part;
  };
  b_->tokens = static_cast<int32_t*>(put(0, in.tokens));
  b_->targets = static_cast<int32_t*>(put(1, in.targets));
  b_->positions = static_cast<int32_t*>(put(2, in.positions));
  b_->weights = static_cast<float*>(put(3, in.loss_weights));
}

float* Decoder::scratch(BackendBuffer& buf, int64_t n) {
  return buf.ensure_n<float>(be_, size_t(n), "scratch");
}

void Decoder::set_head_rows(int rows) {
  LOOM_CHECK(rows >= 0, "head rows per chunk must be >= 0, got ", rows);
  LOOM_CHECK(train_buf_.N == 0 && infer_buf_.N == 0,
             "set_head_rows must be called before the first forward (the arena is sized by it)");
  head_rows_ = rows;
}

int Decoder::head_chunk() const {
  if (head_rows_ > 0) return head_rows_;
  // The CPU's kernels (the CPU backend, and the guarded backend that runs them on device-like
  // memory) want the logits cache-near: 64 MB, at most 256 rows; their results are pinned to
  // that chunking, since the head's weight gradient sums chunk by chunk. A GPU's head GEMMs
  // want thousands of rows: at 256 each chunk re-reads the whole head weight twice and rewrites
  // its fp32 gradient, 64 times per 16K tokens for GPT-2; up to 1 GiB of logits (4096 rows of
  // GPT-2's vocabulary, as bench_cuda runs) is cheap there. (As block_rows decides.)
  if (be_.device() == Device::CPU) {
    constexpr int64_t kLogitFloats = int64_t(16) << 20;
    return static_cast<int>(std::clamp<int64_t>(kLogitFloats / vocab_, 16, 256));
  }
  constexpr int64_t kDeviceLogitFloats = int64_t(256) << 20;
  return static_cast<int>(std::clamp<int64_t>(kDeviceLogitFloats / vocab_, 16, 4096));
}

void Decoder::round_act(float* x, int64_t n) const {
  if (act_dtype_ != DType::F32) be_.round_to(act_dtype_, x, n, nullptr);
}

void Decoder::round_grad(const Linear& lin, float* dy, int64_t n) const {
  if (act_dtype_ == DType::BF16 && lin.recipe)
    if (uint16_t* bits = lin.recipe->dy_bits(dy, n)) return be_.round_to(DType::BF16, dy, n, bits);
  round_act(dy, n);
}

void Decoder::store_activations_as_fp32() {
  LOOM_CHECK(train_buf_.N == 0 && infer_buf_.N == 0,
             "store_activations_as_fp32 must be called before the first forward");
  store_bf16_ = false;
}

void Decoder::keep(const ActBuf& buf, float* x, int64_t n) {
  if (buf.bf16)
    be_.round_to(DType::BF16, x, n, buf.bf16);
  else
    round_act(x, n);
}

const float* Decoder::fp32_in(const ActBuf& buf, int64_t n, float* scratch) const {
  if (buf.f32) return buf.f32;
  be_.convert(scratch, DType::F32, buf.bf16, DType::BF16, n);
  return scratch;
}

int Decoder::block_rows(int width, int N) const {
  // On a GPU one block of every row: each block is two kernel launches, and cache-sized blocks
  // would make the bf16 passes launch-bound (hundreds of launches per norm at 16K tokens).
  if (be_.device() != Device::CPU) return std::max(1, N);
  constexpr int kBlockFloats = 1 << 16;  // 256 KiB: stays in L2 between the two passes
  return std::max(1, kBlockFloats / std::max(1, width));
}

void Decoder::norm_forward(const ActBuf& out, int64_t offset, float* mean, float* rstd,
                           const float* inp, const float* w, const float* b, int N) {
  const int C = cfg_.d_model;
  auto norm = [&](float* o, float* m, float* r, const float* x, int n) {
    if (cfg_.family == Family::GPT2)
      be_.layernorm_forward(o, m, r, x, w, b, n, C, cfg_.norm_eps);
    else
      be_.rmsnorm_forward(o, r, x, w, n, C, cfg_.norm_eps);
  };
  if (out.f32) {
    norm(out.f32 + offset, mean, rstd, inp, N);
    round_act(out.f32 + offset, int64_t(N) * C);
    return;
  }
  // bf16 storage: row blocks normalised into cache-resident scratch, then stored (rounded).
  const int rows = block_rows(C, N);
  float* blk = scratch(blk_a_, int64_t(rows) * C);
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    norm(blk, mean ? mean + r0 : nullptr, rstd + r0, inp + int64_t(r0) * C, n);
    be_.convert(out.bf16 + offset + int64_t(r0) * C, DType::BF16, blk, DType::F32, int64_t(n) * C);
  }
}

void Decoder::mlp_act_forward(const LayerActs& a, const float* fc32, int N) {
  const int F = ff_, FC = fc_;
  auto act = [&](float* o, const float* x, int n) {
    if (cfg_.family == Family::GPT2)
      be_.gelu_forward(o, x, int64_t(n) * F);
    else if (cfg_.geglu)
      be_.geglu_forward(o, x, n, F);
    else
      be_.swiglu_forward(o, x, n, F);
  };
  if (a.act.f32) {
    act(a.act.f32, fc32, N);
    round_act(a.act.f32, int64_t(N) * F);
    return;
  }
  // One fused pass where the backend has it (the CPU: widen, GeLU and narrow per cached block).
  if (cfg_.family == Family::GPT2 &&
      be_.gelu_forward_bf16(a.act.bf16, fc32, fc32 ? nullptr : a.fc.bf16, int64_t(N) * F))
    return;
  const int rows = block_rows(FC, N);
  float* blk_a = scratch(blk_a_, int64_t(rows) * FC);
  float* blk_b = scratch(blk_b_, int64_t(rows) * F);
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    const float* x = fc32
                         ? fc32 + int64_t(r0) * FC
                         : fp32_in({nullptr, a.fc.bf16 + int64_t(r0) * FC}, int64_t(n) * FC, blk_a);
    act(blk_b, x, n);
    be_.convert(a.act.bf16 + int64_t(r0) * F, DType::BF16, blk_b, DType::F32, int64_t(n) * F);
  }
}

void Decoder::mlp_act_backward(const LayerActs& a, float* dfc, float* dact, int N,
                               const Linear& fc) {
  const int F = ff_, FC = fc_;
  // bf16 storage: one fused pass where the backend has it (dact rounded, widened fc, GeLU's
  // gradient, dfc rounded with the bits fc's bf16 GEMMs read), else the separate passes below.
  if (!a.fc.f32 && cfg_.family == Family::GPT2) {
    uint16_t* bits = fc.recipe ? fc.recipe->dy_bits(dfc, int64_t(N) * FC) : nullptr;
    if (be_.gelu_backward_bf16(dfc, bits, a.fc.bf16, dact, act_dtype_ != DType::F32,
                               int64_t(N) * F))
      return;
  }
  round_act(dact, int64_t(N) * F);
  auto back = [&](float* d, const float* x, const float* dout, int n) {
    if (cfg_.family == Family::GPT2)
      be_.gelu_backward(d, x, dout, int64_t(n) * F);
    else if (cfg_.geglu)
      be_.geglu_backward(d, x, dout, n, F);
    else
      be_.swiglu_backward(d, x, dout, n, F);
  };
  if (a.fc.f32) {
    back(dfc, a.fc.f32, dact, N);
  } else {
    const int rows = block_rows(FC, N);
    float* blk = scratch(blk_a_, int64_t(rows) * FC);
    for (int r0 = 0; r0 < N; r0 += rows) {
      const int n = std::min(rows, N - r0);
      be_.convert(blk, DType::F32, a.fc.bf16 + int64_t(r0) * FC, DType::BF16, int64_t(n) * FC);
      back(dfc + int64_t(r0) * FC, blk, dact + int64_t(r0) * F, n);
    }
  }
  round_grad(fc, dfc, int64_t(N) * FC);
}

void Decoder::norm_backward(float* dinp, const Norm& p, const float* dout, const float* inp,
                            const float* mean, const float* rstd, int N) {
  const int C = cfg_.d_model;
  tpo_->replicated_grads(p.dw, p.db, C, [&](float* dw, float* db) {
    if (cfg_.family == Family::GPT2)
      be_.layernorm_backward(dinp, dw, db, dout, inp, p.w, mean, rstd, N, C);
    else
      be_.rmsnorm_backward(dinp, dw, dout, inp, p.w, rstd, N, C);
  });
  round_act(dinp, int64_t(N) * C);
}

void Decoder::embed(const ModelInput& in) {
  LOOM_CHECK(pp_.first, "the token embedding lives on the first pipeline stage");
  const int C = cfg_.d_model, N = in.N, Nl = local_rows(N);
  float* x = b_->layers[0].x_in;
  // 2-byte weights (ParamSet::drop_fp32): the batch's rows widened from the bf16 copy for the
  // lookup, their pages returned after it.
  params_.widen_rows("embed.wte", b_->tokens, N);
  vocab_ops_->embed(x, b_->tokens, params_.fp32_storage_ptr("embed.wte"), N, C);
  params_.release_fp32("embed.wte");
  if (cfg_.uses_positions_table())
    be_.embedding_forward(x, b_->positions + row0(N), params_.ptr("embed.wpe"), Nl, C, true);
  if (cfg_.embed_scale) be_.scale_inplace(x, std::sqrt(static_cast<float>(C)), int64_t(Nl) * C);
  round_act(x, int64_t(Nl) * C);
}

void Decoder::embed_backward(const ModelInput& in) {
  const int C = cfg_.d_model;
  float* gwte = grad_of("embed.wte");
  float* gwpe = cfg_.uses_positions_table() ? grad_of("embed.wpe") : nullptr;
  // The end of the backward: gradients left to a writer that did not come (lazy zeroing: a
  // linear without rows) become zeros now, before the lookup's gradient accumulates onto the
  // table (which a tied head may not have overwritten) and before anyone reads them.
  params_.settle_grads();
  // Frozen tables: nothing to accumulate (the same on every tensor-parallel rank, so the
  // gather below is skipped by all of them).
  if (!gwte && !gwpe) return;
  // Every token's gradient (gathered along the sequence under SP); positions are replicated:
  // every rank adds the full gradient, identically.
  // model.embed_scale: the lookup's output was scaled by sqrt(C), its gradient is too (dres is
  // not read after this).
  if (cfg_.embed_scale)
    be_.scale_inplace(b_->dres, std::sqrt(static_cast<float>(C)), int64_t(local_rows(in.N)) * C);
  const float* d = tpo_->full_rows(b_->dres, in.N, C);
  if (gwte) vocab_ops_->embed_backward(gwte, d, b_->tokens, in.N, C);
  if (gwpe) be_.embedding_backward(gwpe, d, b_->positions, in.N, C);
}

void Decoder::set_context_parallel(const ContextParallel& cp) {
  LOOM_CHECK(cp.size >= 1 && cp.rank >= 0 && cp.rank < cp.size, "context-parallel rank ", cp.rank,
             " of ", cp.size);
  LOOM_CHECK(cp.size == 1 || cp.comm, "context parallelism needs its communicator");
  // MoE under CP: routing and experts are per token (local rows); the auxiliary loss's
  // statistics are summed over the CP group. A capacity keeps each expert's first assignments
  // in the micro-batch's token order, which no rank sees: refused.
  LOOM_CHECK(cp.size == 1 || !cfg_.is_moe() || cfg_.capacity_factor <= 0,
             "context parallelism with a MoE capacity is not supported (parallel.cp = ", cp.size,
             " with model.capacity_factor = ", cfg_.capacity_factor,
             "); use dropless routing (capacity_factor = 0)");
  LOOM_CHECK(cp.size == 1 || (cfg_.window_pattern == 0 && cfg_.attn_softcap == 0),
             "context parallelism with windowed or soft-capped attention is not supported ",
             "(parallel.cp = ", cp.size, " with model.window_pattern = ", cfg_.window_pattern,
             ", model.attn_softcap = ", cfg_.attn_softcap, "): ring attention has neither");
  cp_ = cp;
  for (auto& m : moe_)
    if (m) m->set_token_group(cp.size > 1 ? cp.comm : nullptr);
  LOOM_CHECK(cp.size == 1 || cp.make_attention,
             "a context-parallel layout without its attention core runs no step: make it with "
             "parallel::context_parallel_layout");
  cp_attention_ = cp.size > 1 ? cp.make_attention(cp, be_) : nullptr;
  attention_ = cp_attention_ ? cp_attention_.get() : packed_attention_.get();
}

// The query heads (then the key heads) of every row gathered into [N * heads, D] rows, one
// RMSNorm over each, written back into the rows.
void Decoder::qk_norm_forward(const LayerParams& p, const LayerActs& a, float* qkv, int N) {
  const int D = cfg_.head_dim;
  const size_t pitch = size_t(qkv_) * sizeof(float);
  float* out = scratch(blk_a_, int64_t(N) * hq_ * D);
  const int heads[2] = {hq_, hkv_};
  const float* w[2] = {p.q_norm.w, p.k_norm.w};
  for (int part = 0; part < 2; ++part) {
    const int64_t col = part == 0 ? 0 : att_;
    float* raw = a.qk_raw + int64_t(N) * col;
    float* rstd = a.qk_rstd + int64_t(N) * (part == 0 ? 0 : hq_);
    const size_t row = size_t(heads[part]) * D * sizeof(float);
    be_.copy_2d(raw, row, qkv + col, pitch, row, size_t(N));
    be_.rmsnorm_forward(out, rstd, raw, w[part], N * heads[part], D, cfg_.norm_eps);
    be_.copy_2d(qkv + col, pitch, out, row, row, size_t(N));
  }
}

void Decoder::qk_norm_backward(const LayerParams& p, const LayerActs& a, float* dqkv, int N) {
  const int D = cfg_.head_dim;
  const size_t pitch = size_t(qkv_) * sizeof(float);
  float* d = scratch(blk_a_, int64_t(N) * hq_ * D);
  float* dx = scratch(blk_b_, int64_t(N) * hq_ * D);
  const int heads[2] = {hq_, hkv_};
  const Norm* norm[2] = {&p.q_norm, &p.k_norm};
  for (int part = 0; part < 2; ++part) {
    const int64_t col = part == 0 ? 0 : att_;
    const float* raw = a.qk_raw + int64_t(N) * col;
    const float* rstd = a.qk_rstd + int64_t(N) * (part == 0 ? 0 : hq_);
    const size_t row = size_t(heads[part]) * D * sizeof(float);
    be_.copy_2d(d, row, dqkv + col, pitch, row, size_t(N));
    be_.rmsnorm_backward(dx, norm[part]->dw, d, raw, norm[part]->w, rstd, N * heads[part], D);
    be_.copy_2d(dqkv + col, pitch, dx, row, row, size_t(N));
  }
}

void Decoder::attention_core(int l, const ModelInput& in, const LayerActs& a, const float* qkv) {
  const int Hq = hq_, Hkv = hkv_, D = cfg_.head_dim, Q = qkv_;
  const float scale = cfg_.attn_scale();
  const int window = cfg_.layer_window(l);
  float* att = fp32_out(a.att, b_->att32);
  if (attention_override_)  // the serving engine's KV cache
    attention_override_->forward(l, qkv, Q, Hq, Hkv, D, scale, window, cfg_.attn_softcap, att);
  else if (cfg_.layer_attention_variant(l))  // one process (CP refuses these layers)
    be_.attention_variant_forward(att, a.lse, qkv, qkv + Hq * D, qkv + (Hq + Hkv) * D, Q,
                                  in.cu_seqlens, in.nseq, Hq, Hkv, D, scale, window,
                                  cfg_.attn_softcap);
  else
    attention_->forward(att, a.lse, qkv, Q, Hq, Hkv, D, scale, in);
  keep(a.att, att, int64_t(in.N) * Hq * D);
}

void Decoder::post_norm_forward(const Norm& p, float* o, float* saved, float* rstd, int Nl) {
  const int C = cfg_.d_model;
  be_.copy_d2d(saved, o, size_t(Nl) * C * sizeof(float));
  be_.rmsnorm_forward(o, rstd, saved, p.w, Nl, C, cfg_.norm_eps);
  round_act(o, int64_t(Nl) * C);
}

const float* Decoder::post_norm_backward(const Norm& p, const float* d, const float* saved,
                                         const float* rstd, int Nl) {
  const int C = cfg_.d_model;
  tpo_->replicated_grads(p.dw, nullptr, C, [&](float* dw, float*) {
    be_.rmsnorm_backward(b_->dpost, dw, d, saved, p.w, rstd, Nl, C);
  });
  round_act(b_->dpost, int64_t(Nl) * C);
  return b_->dpost;
}

// The block reads as one process's: the Linears carry the tensor-parallel edges (gathers before
// column-parallel layers, reductions after row-parallel ones), norms and residuals run over this
// rank's rows (all of them without SP), the attention core is the layout's.
void Decoder::block_forward(int l, const ModelInput& in, const LayerActs& a, float* x_out) {
  const int N = in.N, Nl = local_rows(N), C = cfg_.d_model, Q = qkv_, Hq = hq_, Hkv = hkv_,
            D = cfg_.head_dim, A = att_, FC = fc_;
  const int64_t mine = int64_t(row0(N)) * C;  // this rank's rows of a full [N, C] buffer
  const LayerParams p = layer_params(l);
  norm_forward(a.ln1, mine, a.ln1_mean, a.ln1_rstd, a.x_in, p.ln1.w, p.ln1.b, Nl);
  float* qkv = fp32_out(a.qkv, b_->q32);
  p.qkv.forward(be_, qkv, a.ln1, N);
  if (cfg_.qk_norm) qk_norm_forward(p, a, qkv, N);
  if (cfg_.uses_rope()) {
    const float theta = cfg_.layer_rope_theta(l);
    be_.rope_forward_scaled(qkv, b_->positions, N, Hq, D, Q, theta, cfg_.rope_scaling);
    be_.rope_forward_scaled(qkv + A, b_->positions, N, Hkv, D, Q, theta, cfg_.rope_scaling);
  }
  keep(a.qkv, qkv, int64_t(N) * Q);
  attention_core(l, in, a, qkv);
  float* o = p.proj.forward(be_, b_->tmp, a.att, N);
  round_act(o, int64_t(Nl) * C);
  if (cfg_.sandwich_norm) post_norm_forward(p.post_attn, o, a.post_attn_in, a.post_attn_rstd, Nl);
  be_.add(a.x_mid, a.x_in, o, int64_t(Nl) * C);
  round_act(a.x_mid, int64_t(Nl) * C);
  norm_forward(a.ln2, mine, a.ln2_mean, a.ln2_rstd, a.x_mid, p.ln2.w, p.ln2.b, Nl);
  if (moe_.size() && moe_[l]) {
    // Every tensor-parallel rank routes all N tokens (ln2 gathered along the sequence under SP,
    // also for backward after a recomputation) and gets the whole output; it keeps its rows.
    tpo_->gather_rows(a.ln2, N, C);
    // The MoE layer keeps its own state for backward, so recomputation stops before it.
    if (!x_out) return;
    const float* x = fp32_in(a.ln2, int64_t(N) * C, scratch(moe_in_, int64_t(N) * C));
    aux_sum_ += double(N) * moe_[l]->forward(b_->tmp, x, N, moe_weights(l, false));
    round_act(b_->tmp, int64_t(N) * C);
    be_.add(x_out, a.x_mid, b_->tmp + mine, int64_t(Nl) * C);
    round_act(x_out, int64_t(Nl) * C);
    return;
  }
  float* fc = fp32_out(a.fc, b_->fc32);
  p.fc.forward(be_, fc, a.ln2, N);
  keep(a.fc, fc, int64_t(N) * FC);
  mlp_act_forward(a, fc, N);
  // Recomputation needs the layer's internals, not its output (with sandwich norms, the MLP
  // output's norm input is one of them).
  if (!x_out && !cfg_.sandwich_norm) return;
  o = p.mp.forward(be_, b_->tmp, a.act, N);
  round_act(o, int64_t(Nl) * C);
  if (cfg_.sandwich_norm) post_norm_forward(p.post_mlp, o, a.post_mlp_in, a.post_mlp_rstd, Nl);
  if (!x_out) return;
  be_.add(x_out, a.x_mid, o, int64_t(Nl) * C);
  round_act(x_out, int64_t(Nl) * C);
}

void Decoder::block_backward(int l, const ModelInput& in, const LayerActs& a, float* dres) {
  const int N = in.N, Nl = local_rows(N), C = cfg_.d_model, Q = qkv_, Hq = hq_, Hkv = hkv_,
            D = cfg_.head_dim, A = att_;
  const LayerParams p = layer_params(l);
  float* dl = nullptr;
  if (moe_.size() && moe_[l]) {  // x_out = x_mid + moe(ln2)
    // Every TP rank runs the whole layer on all tokens: the input gradient it gets is already
    // complete (not a partial sum), and its weight gradients are whole (router, replicated
    // experts) or its expert-tensor-parallel slice's.
    const float* x = fp32_in(a.ln2, int64_t(N) * C, scratch(moe_in_, int64_t(N) * C));
    moe_[l]->backward(b_->dln, tpo_->full_rows(dres, N, C), x, N, moe_weights(l, false),
                      moe_weights(l, true), aux_dloss_ * static_cast<float>(N));
    dl = b_->dln + int64_t(row0(N)) * C;
  } else {
    // MLP branch: x_out = x_mid + act * mp_w^T + mp_b. Under bf16 storage act was not kept:
    // recomputed from fc (the same values forward had).
    if (a.act.bf16) mlp_act_forward(a, nullptr, N);
    const float* dmp = cfg_.sandwich_norm ? post_norm_backward(p.post_mlp, dres, a.post_mlp_in,
                                                               a.post_mlp_rstd, Nl)
                                          : dres;
    p.mp.backward(be_, b_->dact, dmp, a.act.in(), N);
    mlp_act_backward(a, b_->dfc, b_->dact, N, p.fc);
    dl = p.fc.backward(be_, b_->dln, b_->dfc, a.ln2.in(), N);
  }
  round_act(dl, int64_t(Nl) * C);
  norm_backward(b_->dtmp, p.ln2, dl, a.x_mid, a.ln2_mean, a.ln2_rstd, Nl);
  be_.add_inplace(dres, b_->dtmp, int64_t(Nl) * C);
  round_grad(p.proj, dres, int64_t(Nl) * C);
  // Attention branch: x_mid = x_in + att * proj_w^T + proj_b.
  const float* dproj = cfg_.sandwich_norm ? post_norm_backward(p.post_attn, dres, a.post_attn_in,
                                                               a.post_attn_rstd, Nl)
                                          : dres;
  p.proj.backward(be_, b_->datt, dproj, a.att.in(), N);
  round_act(b_->datt, int64_t(N) * A);
  const float* q = fp32_in(a.qkv, int64_t(N) * Q, b_->q32);
  const float* att = fp32_in(a.att, int64_t(N) * A, b_->att32);
  const float scale = cfg_.attn_scale();
  if (cfg_.layer_attention_variant(l))
    be_.attention_variant_backward(b_->dqkv, b_->dqkv + A, b_->dqkv + A + Hkv * D, b_->datt, q,
                                   q + A, q + A + Hkv * D, att, a.lse, Q, in.cu_seqlens, in.nseq,
                                   Hq, Hkv, D, scale, cfg_.layer_window(l), cfg_.attn_softcap);
  else
    attention_->backward(b_->dqkv, b_->datt, q, att, a.lse, Q, Hq, Hkv, D, scale, in);
  if (cfg_.uses_rope()) {
    const float theta = cfg_.layer_rope_theta(l);
    be_.rope_backward_scaled(b_->dqkv, b_->positions, N, Hq, D, Q, theta, cfg_.rope_scaling);
    be_.rope_backward_scaled(b_->dqkv + A, b_->positions, N, Hkv, D, Q, theta, cfg_.rope_scaling);
  }
  if (cfg_.qk_norm) qk_norm_backward(p, a, b_->dqkv, N);
  round_grad(p.qkv, b_->dqkv, int64_t(N) * Q);
  dl = p.qkv.backward(be_, b_->dln, b_->dqkv, a.ln1.in(), N);
  round_act(dl, int64_t(Nl) * C);
  norm_backward(b_->dtmp, p.ln1, dl, a.x_in, a.ln1_mean, a.ln1_rstd, Nl);
  be_.add_inplace(dres, b_->dtmp, int64_t(Nl) * C);
  round_act(dres, int64_t(Nl) * C);
}

const float* Decoder::head_weight() {
  return linear_weight(params_, cfg_.tied ? "embed.wte" : "head.weight", recipes_.count("head"));
}
float* Decoder::head_grad() {
  return grad_of(cfg_.tied ? "embed.wte" : "head.weight");
}

Linear Decoder::head_linear() {
  Linear lin;
  lin.w = head_weight();
  lin.dw = head_grad();
  lin.in = cfg_.d_model;
  lin.out = vocab_;
  lin.split = Linear::Split::Column;
  lin.tp = tpo_.get();
  lin.widen = &widen_;
  if (auto it = adapters_.find("head"); it != adapters_.end()) lin.adapter = it->second;
  if (auto it = recipes_.find("head"); it != recipes_.end()) lin.recipe = it->second;
  return lin;
}

// The final norm of this rank's rows into lnf (gathered to all N rows under SP).
void Decoder::final_norm(int N) {
  const int64_t mine = int64_t(row0(N)) * cfg_.d_model;
  const float* lnf_b = cfg_.bias ? params_.ptr("final_norm.bias") : nullptr;
  norm_forward(b_->lnf, mine, b_->lnf_mean, b_->lnf_rstd, b_->x_final,
               params_.ptr("final_norm.weight"), lnf_b, local_rows(N));
  head_linear().gather_input(b_->lnf, N);
}

// The head's input times s (ModelInput::logit_scale): the head has no bias, so its logits are
// the unscaled ones times s. bf16 storage goes through fp32 (b_->tmp holds N rows).
void Decoder::scale_head_input(int N, float s) {
  const int64_t n = int64_t(N) * cfg_.d_model;
  const ActBuf& x = b_->lnf;
  if (x.f32) {
    be_.scale_inplace(x.f32, s, n);
    return;
  }
  be_.convert(b_->tmp, DType::F32, x.bf16, DType::BF16, n);
  be_.scale_inplace(b_->tmp, s, n);
  be_.convert(x.bf16, DType::BF16, b_->tmp, DType::F32, n);
}

// The value head at the chosen rows: scores = x W^T (W = score.weight [1, C], x the rows of the
// final norm's output side by side in b_->tmp); the backward's input gradient goes to those
// rows of dln (zero elsewhere), W's gradient accumulates.
double Decoder::value_head(const ModelInput& in, bool grads) {
  LOOM_CHECK(params_.has("score.weight"), "value rows need a model with a value head ",
             "(model.value_head = true)");
  LOOM_CHECK(tp_.size == 1 && cp_.size == 1 && pp_.whole(), "the value head runs in one ",
             "process or under data parallelism only (no tensor, pipeline or context parallelism)");
  const int n = in.n_values, N = in.N, C = cfg_.d_model;
  LOOM_CHECK(n > 0 && n <= N, "value rows: ", n, " for a micro-batch of ", N, " tokens");
  for (int j = 0; j < n; ++j)
    LOOM_CHECK(in.value_rows[j] >= 0 && in.value_rows[j] < N, "value row ", in.value_rows[j],
               " outside the micro-batch of ", N);
  const ActBuf& lnf = b_->lnf;
  for (int j = 0; j < n; ++j) {
    float* row = b_->tmp + int64_t(j) * C;
    if (lnf.f32)
      be_.copy_d2d(row, lnf.f32 + int64_t(in.value_rows[j]) * C, size_t(C) * sizeof(float));
    else
      be_.convert(row, DType::F32, lnf.bf16 + int64_t(in.value_rows[j]) * C, DType::BF16, C);
  }
  float* v = scratch(value_buf_, 2 * int64_t(n));  // scores, then their gradients
  const float* w = params_.ptr("score.weight");
  be_.matmul_forward(v, b_->tmp, w, nullptr, n, C, 1);
  values_host_.resize(size_t(n));
  be_.copy_d2h(values_host_.data(), v, size_t(n) * sizeof(float));
  double sum = 0;
  if (in.value_grads)
    for (int j = 0; j < n; ++j) sum += double(in.value_grads[j]) * values_host_[size_t(j)];
  if (grads) {
    LOOM_CHECK(in.value_grads, "a backward through the value head needs value_grads");
    be_.copy_h2d(v + n, in.value_grads, size_t(n) * sizeof(float));
    float* dx = scratch(value_dx_, int64_t(n) * C);
    float* dw = grad_of("score.weight");
    be_.matmul_backward(dx, dw, nullptr, v + n, b_->tmp, w, n, C, 1);
    be_.fill_bytes(b_->dln, 0, size_t(N) * C * sizeof(float));
    // Distinct sequences have distinct last rows; a repeated row adds its gradients.
    std::vector<int> seen(size_t(N), -1);
    for (int j = 0; j < n; ++j) {
      const int r = in.value_rows[j];
      LOOM_CHECK(seen[size_t(r)] < 0, "value row ", r, " given twice");
      seen[size_t(r)] = j;
      be_.copy_d2d(b_->dln + int64_t(r) * C, dx + int64_t(j) * C, size_t(C) * sizeof(float));
    }
  }
  return sum;
}

double Decoder::head(const ModelInput& in, float dloss, bool grads) {
  const int N = in.N, Nl = local_rows(N), C = cfg_.d_model, V = vocab_;
  final_norm(N);
  if (in.value_rows) {
    const double sum = value_head(in, grads);
    if (grads) {
      round_act(b_->dln, int64_t(N) * C);
      const Norm lnf = norm_params("final_norm");
      norm_backward(b_->dres, lnf, b_->dln, b_->x_final, b_->lnf_mean, b_->lnf_rstd, Nl);
    }
    return sum;
  }
  const float scale = in.logit_scale;
  if (scale != 1.f) scale_head_input(N, scale);
  Linear H = head_linear();
  // Logits exist for head_chunk() rows at a time: computed, turned into loss and gradient in
  // place, and consumed by the head's backward before the next chunk overwrites them. Under
  // tensor parallelism each rank holds its vocabulary slice of every row's logits.
  const int chunk = head_chunk();
  // bf16 with a recipe that writes bf16 outputs: the logits chunk is the GEMM's bf16 output (2
  // bytes a logit, so a 256-row chunk of GPT-2's vocabulary stays in the L3), the loss reads
  // it and the gradient's bits replace it in place, and the backward GEMMs read those bits: no
  // fp32 logits and no rounding pass. Chosen by the policy and the recipe alone, never by the
  // storage, so fp32 containers holding the rounded values (store_activations_as_fp32) run the
  // same GEMM and stay bit-identical.
  const float cap = cfg_.final_softcap;
  const bool bf16_logits =
      cap == 0 && act_dtype_ == DType::BF16 && H.bf16_outputs() &&
      vocab_ops_->cross_entropy_from_bf16(nullptr, nullptr, nullptr, 0, dloss, nullptr, grads);
  for (int r0 = 0; r0 < N; r0 += chunk) {
    int n = std::min(chunk, N - r0);
    // An adapter on the head sees rows r0.. of the micro-batch, not rows 0.. (LoRA dropout
    // keys its mask by the token's row).
    H.first_row = r0;
    const float* w = b_->weights ? b_->weights + r0 : nullptr;
    const ActIn x = b_->lnf.in(int64_t(r0) * C);
    if (bf16_logits) {
      auto* bits = reinterpret_cast<uint16_t*>(b_->logits);  // within the fp32 chunk's space
      H.local_forward_bf16(be_, bits, x, n);
      vocab_ops_->cross_entropy_from_bf16(b_->losses + r0, bits, b_->targets + r0, n, dloss, w,
                                          grads);
      if (grads) H.local_backward_bf16(be_, b_->dln + int64_t(r0) * C, bits, x, n);
      continue;
    }
    H.local_forward(be_, b_->logits, x, n);
    if (cap > 0) {  // model.final_softcap: the loss reads the capped logits
      be_.softcap_forward(b_->logits, int64_t(n) * V, cap);
      if (grads) be_.copy_d2d(b_->capped, b_->logits, size_t(n) * V * sizeof(float));
    }
    // bf16: the logits' rounding, the loss and the gradient's rounding (with the bits the
    // head's bf16 GEMMs read) in one pass over each row where the backend fuses them.
    uint16_t* bits = grads && act_dtype_ == DType::BF16 && H.recipe
                         ? H.recipe->dy_bits(b_->logits, int64_t(n) * V)
                         : nullptr;
    const bool fused = cap == 0 && act_dtype_ == DType::BF16 &&
                       vocab_ops_->cross_entropy_bf16(b_->losses + r0, b_->logits, bits,
                                                      b_->targets + r0, n, dloss, w, grads);
    if (!fused) {
      round_act(b_->logits, int64_t(n) * V);
      vocab_ops_->cross_entropy(b_->losses + r0, b_->logits, b_->targets + r0, n, dloss, w, grads);
    }
    if (grads) {
      if (cap > 0) be_.softcap_backward(b_->logits, b_->capped, int64_t(n) * V, cap);
      if (!fused) round_grad(H, b_->logits, int64_t(n) * V);
      H.local_backward(be_, b_->dln + int64_t(r0) * C, b_->logits, x, n);
    }
  }
  // One reduction on the device, one double back (fixed order: bit-reproducible).
  const double sum = be_.weighted_sum(b_->losses, b_->weights, N);
  if (grads) {
    if (scale != 1.f) be_.scale_inplace(b_->dln, scale, int64_t(N) * C);  // d(s x) / dx
    round_act(b_->dln, int64_t(N) * C);
    float* dl = H.reduce_input_grad(b_->dln, N);
    const Norm lnf = norm_params("final_norm");
    norm_backward(b_->dres, lnf, dl, b_->x_final, b_->lnf_mean, b_->lnf_rstd, Nl);
  }
  return sum;
}

void Decoder::check_layout(const ModelInput& in) const {
  LOOM_CHECK(tpo_, "a tensor-parallel layout of ", tp_.size, " ranks built without its ",
             "communication runs no step: make it with parallel::tensor_parallel_layout");
  LOOM_CHECK(!sp_on() || in.N % tp_.size == 0, "sequence parallelism splits the ", in.N,
             " tokens of a micro-batch over parallel.tp = ", tp_.size,
             " ranks: make micro_batch * seq_len divisible by it");
}

static void check_input(const ModelInput& in, const ModelConfig& cfg) {
  LOOM_CHECK(in.N > 0 && in.nseq > 0, "empty micro-batch");
  LOOM_CHECK(std::isfinite(in.logit_scale) && in.logit_scale > 0,
             "logit_scale must be finite and > 0, got ", in.logit_scale);
  // The scale is applied to the head's input, which equals scaling the logits only while the
  // head is linear: a soft-capped head would need it after the cap.
  LOOM_CHECK(in.logit_scale == 1.f || cfg.final_softcap == 0,
             "a sampling temperature other than 1 (logit scale ", in.logit_scale,
             ") with model.final_softcap ", cfg.final_softcap, " is not supported");
  LOOM_CHECK(in.cu_seqlens[0] == 0 && in.cu_seqlens[in.nseq] == in.N,
             "cu_seqlens must start at 0 and end at N=", in.N);
  for (int s = 0; s < in.nseq; ++s)
    LOOM_CHECK(in.cu_seqlens[s + 1] >= in.cu_seqlens[s], "cu_seqlens must be non-decreasing");
  for (int i = 0; i < in.N; ++i) {
    LOOM_CHECK(in.tokens[i] >= 0 && in.tokens[i] < cfg.vocab, "token id ", in.tokens[i],
               " at position ", i, " is outside the vocabulary [0, ", cfg.vocab, ")");
    LOOM_CHECK(in.positions[i] >= 0 && in.positions[i] < cfg.max_seq, "position ", in.positions[i],
               " exceeds model.max_seq ", cfg.max_seq);
    // Below the window every earlier position is in it: full causal attention is exact.
    LOOM_CHECK(
        cfg.sliding_window == 0 || cfg.window_pattern > 0 || in.positions[i] < cfg.sliding_window,
        "position ", in.positions[i], " reaches past model.sliding_window = ", cfg.sliding_window,
        ": sliding-window attention is not implemented (training's packed and ring ",
        "attention and the serving engine's paged attention attend to every earlier ",
        "position); keep sequences within ", cfg.sliding_window, " tokens");
    if (in.targets)
      LOOM_CHECK(in.targets[i] >= -1 && in.targets[i] < cfg.vocab, "target id ", in.targets[i],
                 " at position ", i, " is outside the vocabulary");
  }
}

void Decoder::forward_blocks(const ModelInput& in) {
  const int L = cfg_.n_layer;
  for (int l = 0; l < L; ++l) {
    if (before_block) before_block(l, false);
    block_forward(l, in, b_->layers[l], l + 1 < L ? b_->layers[l + 1].x_in : b_->x_final);
    if (after_block) after_block(l, false);
  }
}

bool Decoder::holds_layer(int l) const {
  if (pp_.whole()) return true;
  for (auto [b, e] : pp_.chunks)
    if (l >= b && l < e) return true;
  return false;
}

// Block l's backward into b_->dres, after recomputing what the recompute mode did not keep.
void Decoder::recompute_and_backward(int l, const ModelInput& in) {
  const LayerActs& a = b_->layers[l];
  if (recompute_ == Recompute::Full)
    block_forward(l, in, a, nullptr);
  else if (recompute_ == Recompute::Selective)
    attention_core(l, in, a, fp32_in(a.qkv, int64_t(in.N) * qkv_, b_->q32));
  block_backward(l, in, a, b_->dres);
}

void Decoder::begin_pass(const ModelInput& in, float dloss) {
  check_input(in, cfg_);
  check_layout(in);
  ensure_buffers(in.N);
  upload_input(in);
  aux_sum_ = 0;
  dloss_ = dloss;
  aux_dloss_ = in.aux_weight >= 0 ? in.aux_weight : dloss;
}

void Decoder::forward_layer(int l, const ModelInput& in, float* x_out) {
  LOOM_CHECK(holds_layer(l) && x_out, "forward_layer(", l, "): a layer this stage holds, and ",
             "where its output goes");
  block_forward(l, in, b_->layers[l], x_out);
}

void Decoder::backward_layer(int l, const ModelInput& in) {
  LOOM_CHECK(holds_layer(l), "layer ", l, " is not held by this pipeline stage");
  recompute_and_backward(l, in);
}

double Decoder::head_loss(const ModelInput& in, bool grads) {
  LOOM_CHECK(pp_.last, "the head lives on the last pipeline stage");
  LOOM_CHECK(!grads || in.targets, "a backward from the loss needs targets");
  return head(in, dloss_, grads);
}

double Decoder::run(const ModelInput& in, float dloss, bool grads) {
  LOOM_CHECK(pp_.whole() || (pp_.first && pp_.last && pp_.chunks.size() == 1 &&
                             pp_.chunks[0] == std::make_pair(0, cfg_.n_layer)),
             "a pipeline stage runs through parallel::StageRunner (parallel/pipeline_stage.h)");
  begin_pass(in, dloss);
  const int L = cfg_.n_layer;
  embed(in);
  forward_blocks(in);
  double loss = head(in, dloss, grads) + aux_sum_;
  if (!grads) return loss;
  for (int l = L - 1; l >= 0; --l) {
    if (before_block) before_block(l, true);
    recompute_and_backward(l, in);
    if (after_block) after_block(l, true);
    if (on_grads_ready) on_grads_ready(l);
  }
  embed_backward(in);
  if (on_grads_ready) on_grads_ready(-1);
  return loss;
}

// Sequence sums of log p(target) = -loss over the rows with a target, in token order.
void Decoder::collect_outputs(const ModelInput& in, StepOutputs* out) const {
  if (in.value_rows) {  // scores only: the language-model head did not run
    out->values.assign(values_host_.begin(), values_host_.end());
    out->seq_logprobs.assign(in.nseq, 0.0);
    return;
  }
  // The per-token losses come to the host once; the sums follow the host's cu_seqlens.
  std::vector<float> losses(size_t(in.N));
  be_.copy_d2h(losses.data(), b_->losses, losses.size() * sizeof(float));
  out->seq_logprobs.assign(in.nseq, 0.0);
  for (int s = 0; s < in.nseq; ++s)
    for (int i = in.cu_seqlens[s]; i < in.cu_seqlens[s + 1]; ++i)
      if (in.targets[i] >= 0) out->seq_logprobs[s] -= losses[i];
  // Under context parallelism this rank's rows are its chunks of every sequence (cu_seqlens is
  // the local one, sequence by sequence): the attention core's group makes the sums whole.
  // (Per-token values stay this rank's.)
  attention_->sum_sequence_parts(out->seq_logprobs.data(), in.nseq);
  if (!out->want_token_logprobs) return;
  out->token_logprobs.assign(in.N, 0.f);
  for (int i = 0; i < in.N; ++i)
    if (in.targets[i] >= 0) out->token_logprobs[i] = -losses[i];
}

double Decoder::forward_backward(const ModelInput& in, float dloss, StepOutputs* out) {
  LOOM_CHECK(in.targets, "forward_backward needs targets");
  double loss = run(in, dloss, true);
  if (out) collect_outputs(in, out);
  return loss;
}

// For the length of a forward-only pass: the forward-only buffers and an attention override;
// back to the training buffers and the model's own attention on exit, errors included.
struct Decoder::ForwardOnlyScope {
  Decoder& d;
  ForwardOnlyScope(Decoder& dec, ForwardAttention* attention) : d(dec) {
    d.use_forward_only_buffers(true);
    d.attention_override_ = attention;
  }
  ~ForwardOnlyScope() {
    d.attention_override_ = nullptr;
    d.use_forward_only_buffers(false);
  }
};

double Decoder::forward_loss(const ModelInput& in, StepOutputs* out) {
  LOOM_CHECK(in.targets, "forward_loss needs targets");
  ForwardOnlyScope scope(*this, nullptr);
  double loss = run(in, 0.f, false);
  if (out) collect_outputs(in, out);
  return loss;
}

void Decoder::forward_final_rows(const ModelInput& in, const std::vector<int>& rows,
                                 ForwardAttention* attention) {
  LOOM_CHECK(pp_.whole(), "a forward-only pass runs the whole model, not a pipeline stage");
  LOOM_CHECK(!attention || cp_.size == 1, "an attention override excludes context parallelism");
  ModelInput fwd = in;
  fwd.targets = nullptr;
  check_input(fwd, cfg_);
  check_layout(fwd);
  LOOM_CHECK(rows.size() <= size_t(in.N), "forward_logits: ", rows.size(),
             " logit rows for a micro-batch of ", in.N, " tokens");
  for (int r : rows)
    LOOM_CHECK(r >= 0 && r < in.N, "logit row ", r, " outside the micro-batch of ", in.N);
  ensure_buffers(in.N);
  upload_input(fwd);
  const int C = cfg_.d_model, n = static_cast<int>(rows.size());
  embed(fwd);
  forward_blocks(fwd);
  // Under SP each rank normalises its rows and final_norm gathers all N (the head's column-
  // parallel input edge), so any row can be chosen on every rank.
  final_norm(in.N);
  // The chosen rows side by side, then one GEMM (a batch of decodes is one GEMM, not n GEMVs).
  for (int i = 0; i < n; ++i) {
    float* row = b_->tmp + int64_t(i) * C;
    const ActBuf& lnf = b_->lnf;
    if (lnf.f32)
      be_.copy_d2d(row, lnf.f32 + int64_t(rows[i]) * C, size_t(C) * sizeof(float));
    else
      be_.convert(row, DType::F32, lnf.bf16 + int64_t(rows[i]) * C, DType::BF16, C);
  }
}

void Decoder::forward_logits(const ModelInput& in, const std::vector<int>& rows, float* logits,
                             ForwardAttention* attention) {
  ForwardOnlyScope scope(*this, attention);
  forward_final_rows(in, rows, attention);
  const int V = cfg_.vocab, C = cfg_.d_model, n = static_cast<int>(rows.size());
  // The sampling temperature's 1/T (ModelInput::logit_scale) on the head's input rows: the
  // head is linear, so the logits come out scaled.
  if (in.logit_scale != 1.f) be_.scale_inplace(b_->tmp, in.logit_scale, int64_t(n) * C);
  // Straight into the caller's array where the host can address the backend's memory;
  // otherwise into a device buffer, then one copy to the host. Under tensor parallelism each
  // rank's head gives its vocabulary slice of every row, gathered into whole rows.
  const bool direct = be_.host_accessible();
  float* out = direct ? logits : scratch(b_->logits_out, int64_t(n) * V);
  float* mine = vocab_ops_->logits_slot(out, n);
  head_linear().local_forward(be_, mine, b_->tmp, n);
  if (cfg_.final_softcap > 0) be_.softcap_forward(mine, int64_t(n) * vocab_, cfg_.final_softcap);
  round_act(mine, int64_t(n) * vocab_);
  vocab_ops_->gather_logits(out, n);
  if (!direct) be_.copy_d2h(logits, out, size_t(n) * V * sizeof(float));
}

void Decoder::forward_hidden(const ModelInput& in, const std::vector<int>& rows, float* hidden) {
  ForwardOnlyScope scope(*this, nullptr);
  forward_final_rows(in, rows, nullptr);
  be_.copy_d2h(hidden, b_->tmp, rows.size() * size_t(cfg_.d_model) * sizeof(float));
}

}  // namespace loom
