#include "model/lora.h"

#include <cmath>

#include "core/config.h"
#include "core/error.h"

namespace loom {

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / rank;
}

std::string LoraConfig::describe() const {
  std::string t;
  for (const auto& s : targets) t += (t.empty() ? "" : ",") + s;
  return cat("LoRA r=", rank, " alpha=", alpha, rslora ? " (rsLoRA)" : "", " scale=", scale(),
             " on ", t);
}

bool lora_enabled(const Config& cfg) {
  return cfg.get_int("lora.rank", 0) > 0;
}

LoraConfig lora_config_from(const Config& cfg, uint64_t seed) {
  LoraConfig c;
  c.rank = static_cast<int>(cfg.get_int("lora.rank", 0));
  c.alpha = cfg.get_double("lora.alpha", c.rank);
  c.rslora = cfg.get_bool("lora.rslora", false);
  c.seed = static_cast<uint64_t>(cfg.get_int("lora.seed", static_cast<int64_t>(seed)));
  const double dropout = cfg.get_double("lora.dropout", 0.0);
  LOOM_CHECK(c.rank > 0 && c.rank <= 4096, "lora.rank must lie in [1, 4096], got ", c.rank);
  LOOM_CHECK(c.alpha > 0, "lora.alpha must be positive, got ", c.alpha);
  LOOM_CHECK(dropout == 0.0, "lora.dropout = ", dropout,
             ": only 0 is supported yet (PEFT's default); remove the key or set it to 0");
  const std::string t = cfg.get_string("lora.targets", "all-linear");
  c.targets.clear();
  size_t pos = 0;
  while (pos <= t.size()) {
    size_t end = t.find(',', pos);
    if (end == std::string::npos) end = t.size();
    std::string item = t.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) c.targets.push_back(item);
    pos = end + 1;
  }
  LOOM_CHECK(!c.targets.empty(), "lora.targets names no linear layer");
  return c;
}

// h = x A^T [N, r] is recomputed in backward (r is small) instead of being kept, so the
// adapter adds no activation memory and every recompute mode stays as it is.
struct Lora::Adapter : LinearAdapter {
  std::string name;
  int in = 0, out = 0, r = 0;
  float scale = 1.f;
  ParamSet* P = nullptr;
  std::string a_name, b_name;
  std::vector<float> h, dh;

  const float* A() const { return P->data() + P->info(a_name).offset; }
  const float* B() const { return P->data() + P->info(b_name).offset; }

  void forward(Backend& be, float* y, const float* x, int N) override {
    h.resize(size_t(N) * r);
    be.gemm(false, true, N, r, in, 1.f, x, in, A(), in, 0.f, h.data(), r);
    be.gemm(false, true, N, out, r, scale, h.data(), r, B(), r, 1.f, y, out);
  }
  // With h = x A^T and y += s h B^T: dB += s dy^T h, dh = s dy B, dA += dh^T x, dx += dh A.
  void backward(Backend& be, float* dx, const float* dy, const float* x, int N) override {
    h.resize(size_t(N) * r);
    dh.resize(size_t(N) * r);
    be.gemm(false, true, N, r, in, 1.f, x, in, A(), in, 0.f, h.data(), r);
    float* dA = P->trainable_grad_ptr(a_name);
    float* dB = P->trainable_grad_ptr(b_name);
    if (dB) be.gemm(true, false, out, r, N, scale, dy, out, h.data(), r, 1.f, dB, r);
    be.gemm(false, false, N, r, out, scale, dy, out, B(), r, 0.f, dh.data(), r);
    if (dA) be.gemm(true, false, r, in, N, 1.f, dh.data(), r, x, in, 1.f, dA, in);
    if (dx) be.gemm(false, false, N, in, r, 1.f, dh.data(), r, A(), in, 1.f, dx, in);
  }
};

static bool matches(const std::string& linear, const std::string& target) {
  if (target == "all-linear") return linear != "head";
  if (linear == target) return true;
  return linear.size() > target.size() &&
         linear.compare(linear.size() - target.size(), target.size(), target) == 0 &&
         linear[linear.size() - target.size() - 1] == '.';
}

Lora::Lora(Decoder& model, const LoraConfig& cfg) : model_(model), cfg_(cfg) {
  LOOM_CHECK(cfg.rank > 0, "LoRA rank must be positive");
  LOOM_CHECK(model.tensor_parallel().size == 1,
             "LoRA under tensor parallelism is not supported yet (parallel.tp = ",
             model.tensor_parallel().size, ")");
  const auto all = model.linears();
  for (const std::string& t : cfg.targets) {
    bool any = false;
    for (const auto& l : all) any |= matches(l.name, t);
    LOOM_CHECK(any, "lora.targets: '", t, "' matches no linear layer of the model (names look ",
               "like blocks.0.attn.qkv, blocks.0.attn.proj, blocks.0.mlp.fc, blocks.0.mlp.proj, ",
               "head; a suffix such as attn.qkv matches every block's)");
  }
  for (const auto& l : all) {
    bool chosen = false;
    for (const std::string& t : cfg.targets) chosen |= matches(l.name, t);
    if (!chosen) continue;
    // A tied head is the token embedding: merging an adapter into it would change the
    // embedding too, so the merged model would not be the adapted one.
    LOOM_CHECK(l.name != "head" || !model.config().tied,
               "lora.targets: the output head is tied to the token embedding in this model; ",
               "LoRA on it cannot be merged (leave 'head' out)");
    auto a = std::make_unique<Adapter>();
    a->name = l.name;
    a->in = l.in;
    a->out = l.out;
    a->r = cfg.rank;
    a->scale = static_cast<float>(cfg.scale());
    a->a_name = l.name + ".lora_A";
    a->b_name = l.name + ".lora_B";
    params_.add(a->a_name, {cfg.rank, l.in}, false, ParamInit::Uniform,
                1.f / std::sqrt(static_cast<float>(l.in)));
    params_.add(a->b_name, {l.out, cfg.rank}, false, ParamInit::Zeros);
    adapters_.push_back(std::move(a));
  }
  params_.allocate();
  params_.init(cfg.seed);
  for (auto& a : adapters_) {
    a->P = &params_;
    model_.attach_adapter(a->name, a.get());
  }
  for (const ParamInfo& p : model_.params().infos()) {
    was_trainable_.push_back(p.trainable);
    model_.params().set_trainable(p.name, false);
  }
}

Lora::~Lora() {
  for (auto& a : adapters_) model_.attach_adapter(a->name, nullptr);
  const auto& infos = model_.params().infos();
  for (size_t i = 0; i < infos.size(); ++i)
    model_.params().set_trainable(infos[i].name, was_trainable_[i]);
}

void Lora::set_attached(bool attached) {
  for (auto& a : adapters_) model_.attach_adapter(a->name, attached ? a.get() : nullptr);
}

std::vector<std::string> Lora::target_names() const {
  std::vector<std::string> out;
  for (const auto& a : adapters_) out.push_back(a->name);
  return out;
}

void Lora::merge_into_base() {
  ParamSet& P = model_.params();
  for (const auto& a : adapters_) {
    float* W = P.ptr(a->name + ".weight");
    // W[out, in] += scale * B[out, r] A[r, in]
    cpu_backend().gemm(false, false, a->out, a->in, a->r, a->scale, a->B(), a->r, a->A(), a->in,
                       1.f, W, a->in);
  }
}

}  // namespace loom
