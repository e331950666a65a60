#include "model/lora.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/buffer.h"

namespace loom {

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / rank;
}

std::string LoraConfig::describe() const {
  std::string t;
  for (const auto& s : targets) t += (t.empty() ? "" : ",") + s;
  return cat("LoRA r=", rank, " alpha=", alpha, rslora ? " (rsLoRA)" : "", " scale=", scale(),
             dropout > 0 ? cat(" dropout=", dropout) : std::string(), " on ", t);
}

bool lora_enabled(const Config& cfg) {
  return cfg.get_int("lora.rank", 0) > 0;
}

LoraConfig lora_config_from(const Config& cfg, uint64_t seed) {
  LoraConfig c;
  c.rank = get_int32(cfg, "lora.rank", 0);
  c.alpha = cfg.get_double("lora.alpha", c.rank);
  c.rslora = cfg.get_bool("lora.rslora", false);
  c.seed = static_cast<uint64_t>(cfg.get_int("lora.seed", static_cast<int64_t>(seed)));
  c.dropout = cfg.get_double("lora.dropout", 0.0);
  LOOM_CHECK(c.rank > 0 && c.rank <= 4096, "lora.rank must lie in [1, 4096], got ", c.rank);
  LOOM_CHECK(c.alpha > 0, "lora.alpha must be positive, got ", c.alpha);
  // 1 would zero every adapter input (and divide by 0); NaN fails both comparisons.
  LOOM_CHECK(c.dropout >= 0 && c.dropout < 1, "lora.dropout must lie in [0, 1), got ", c.dropout);
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
//
// Under tensor parallelism the adapter is split like its layer (in, out are local sizes):
//   column-parallel (W split by output rows; x whole, y this rank's columns): B split by rows,
//     A replicated. Forward needs nothing more. Backward: dh = s dy B_local is a partial sum
//     over the TP ranks: all-reduced before dA += dh^T x (so every rank holds the whole,
//     identical dA), while dx += dh_partial A stays partial, summed with the layer's own
//     partial dx by the caller's reduction.
//   row-parallel (W split by input columns; x this rank's columns, y a partial sum reduced by
//     the caller): A split by columns, B replicated. Forward: s (x A_local^T) B^T is a partial
//     sum too, reduced with the layer's. Backward: h = x A_local^T is all-reduced before
//     dB += s dy^T h (whole and identical on every rank); dh = s dy B is whole (dy is), so
//     dA_local and dx_local need nothing more.
// One all-reduce of N x r values per adapted layer and backward: small beside the layer's own.
//
// Dropout (PEFT's lora_dropout) sits on the adapter's input only: y = W x + b + s B A drop(x),
// drop(x) = x * m / (1 - p) with m in {0, 1}. The mask is a function of (seed, adapter,
// micro-batch, row, global column) alone, so any pass of the same micro-batch gets the same one;
// each adapter draws it once per micro-batch and keeps it as bits for backward and
// recomputation. In backward, with xd = drop(x): h = xd A^T, dA += dh^T xd and
// dx += drop(dh A) (the mask's Jacobian is the mask itself).
struct Lora::Adapter : LinearAdapter {
  enum class Split { None, Column, Row };
  std::string name;
  int in = 0, out = 0, r = 0;
  float scale = 1.f;
  ParamSet* P = nullptr;
  std::string a_name, b_name;
  Split split = Split::None;
  comm::Communicator* tp = nullptr;
  // h = x A^T and its gradient [N, r]: memory of the backend the GEMMs run on (device memory
  // on a GPU), grown on demand and kept between calls.
  BackendBuffer h, dh;
  // Dropout: the state the trainer sets (shared by every adapter), this adapter's stream, and
  // where its local input columns sit in the layer's whole input (a row-parallel layer's shard
  // starts at col0 of in_global).
  const DropoutState* drop = nullptr;
  DropoutScratch* scratch = nullptr;
  uint64_t drop_key = 0;
  int64_t in_global = 0, col0 = 0;
  // The last mask drawn (bits, row by row) and what it was drawn for; on a backend whose memory
  // the host cannot reach, its copy there (uploaded once per mask drawn: a few bytes per row).
  std::vector<uint64_t> bits;
  BackendBuffer dbits;
  bool dbits_stale = true;
  uint64_t mask_epoch = 0;
  int mask_first_row = -1, mask_rows = -1;

  const float* A() const { return P->data() + P->info(a_name).offset; }
  const float* B() const { return P->data() + P->info(b_name).offset; }
  void all_reduce(float* v, int N) const {
    tp->all_reduce(v, int64_t(N) * r, DType::F32, comm::ReduceOp::Sum);
  }
  bool dropping() const { return drop && drop->active && drop->p > 0; }

  // The mask of rows first_row.. of what the model runs (the micro-batch, or under context
  // parallelism this rank's rows, mapped to the micro-batch's by drop->rows), as bits (bit c of
  // row n's words: keep). Element (n, c) of micro-batch row R is index e = R * in_global +
  // col0 + c of the adapter's stream: Philox block e / 8 gives eight 16-bit draws, and draw
  // e % 8 below p16 drops the element (p rounded to a multiple of 2^-16). Drawn once per
  // training micro-batch and rows: forward keeps the bits, and backward (and recomputation)
  // reuse them, as long as the trainer has not set another micro-batch since (drop->epoch).
  const uint64_t* mask(int N, int first_row) {
    const int64_t words = (in + 63) / 64;
    if (mask_epoch == drop->epoch && mask_first_row == first_row && mask_rows == N)
      return bits.data();
    bits.assign(size_t(N) * size_t(words), 0);
    const uint64_t key = drop_key + drop->micro * 0x9E3779B97F4A7C15ull;
    const uint32_t p16 = drop->p16;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const int row = drop->rows ? drop->rows[first_row + n] : first_row + n;
      const uint64_t base = uint64_t(row) * uint64_t(in_global) + uint64_t(col0);
      uint64_t* w = bits.data() + int64_t(n) * words;
      std::array<uint32_t, 4> draws{};
      uint64_t block = ~0ull;
      for (int c = 0; c < in; ++c) {
        const uint64_t e = base + uint64_t(c);
        if (e >> 3 != block) {
          block = e >> 3;
          draws = philox(drop->seed, key, block);
        }
        const uint32_t draw = (draws[(e >> 1) & 3] >> (16 * (e & 1))) & 0xFFFFu;
        if (draw >= p16) w[c >> 6] |= uint64_t(1) << (c & 63);
      }
    }
    mask_epoch = drop->epoch;
    mask_first_row = first_row;
    mask_rows = N;
    dbits_stale = true;
    return bits.data();
  }
  // out[N, in] = v * m / (1 - p) (in place allowed), a Backend op on the mask's bits (drawn on
  // the host: they depend on the RNG's counters only, never on device data).
  void apply_mask(Backend& be, float* out, const float* v, int N, int first_row) {
    const uint64_t* m = mask(N, first_row);
    if (!be.host_accessible()) {
      const size_t bytes = bits.size() * sizeof(uint64_t);
      void* d = dbits.ensure(be, bytes, "scratch");
      if (dbits_stale && bytes > 0) be.copy_h2d(d, bits.data(), bytes);
      dbits_stale = false;
      m = static_cast<const uint64_t*>(d);
    }
    be.apply_bit_mask(out, v, m, N, in, drop->keep_scale);
  }
  // The adapter's input: x, or drop(x) in the shared scratch while training with dropout (the
  // adapters run one at a time, so one buffer serves them all).
  const float* input(Backend& be, const float* x, int N, int first_row) {
    if (!dropping()) return x;
    float* xd = scratch->x.ensure_n<float>(be, size_t(N) * in, "scratch");
    apply_mask(be, xd, x, N, first_row);
    return xd;
  }

  void forward(Backend& be, float* y, const float* x_in, int N, int first_row) override {
    const float* x = input(be, x_in, N, first_row);
    float* hp = h.ensure_n<float>(be, size_t(N) * r, "scratch");
    be.gemm(false, true, N, r, in, 1.f, x, in, A(), in, 0.f, hp, r);
    be.gemm(false, true, N, out, r, scale, hp, r, B(), r, 1.f, y, out);
  }
  // With h = x A^T and y += s h B^T: dB += s dy^T h, dh = s dy B, dA += dh^T x, dx += dh A
  // (x here the dropped input; dx's share then goes through the same mask).
  void backward(Backend& be, float* dx, const float* dy, const float* x_in, int N,
                int first_row) override {
    const float* x = input(be, x_in, N, first_row);
    float* hp = h.ensure_n<float>(be, size_t(N) * r, "scratch");
    float* dhp = dh.ensure_n<float>(be, size_t(N) * r, "scratch");
    be.gemm(false, true, N, r, in, 1.f, x, in, A(), in, 0.f, hp, r);
    if (split == Split::Row) all_reduce(hp, N);
    float* dA = P->trainable_grad_ptr(a_name);
    float* dB = P->trainable_grad_ptr(b_name);
    if (dB) be.gemm(true, false, out, r, N, scale, dy, out, hp, r, 1.f, dB, r);
    be.gemm(false, false, N, r, out, scale, dy, out, B(), r, 0.f, dhp, r);
    if (dx && !dropping()) {
      be.gemm(false, false, N, in, r, 1.f, dhp, r, A(), in, 1.f, dx, in);
    } else if (dx) {
      // Not scratch->x: that holds x's dropped copy.
      float* t = scratch->dx.ensure_n<float>(be, size_t(N) * in, "scratch");
      be.gemm(false, false, N, in, r, 1.f, dhp, r, A(), in, 0.f, t, in);
      apply_mask(be, t, t, N, first_row);
      be.add_inplace(dx, t, int64_t(N) * in);
    }
    if (split == Split::Column) all_reduce(dhp, N);  // after dx, which keeps the partial sum
    if (dA) be.gemm(true, false, r, in, N, 1.f, dhp, r, x, in, 1.f, dA, in);
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
  LOOM_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "LoRA dropout must lie in [0, 1), got ",
             cfg.dropout);
  drop_.p = cfg.dropout;
  drop_.seed = cfg.seed;
  // The 16-bit draws' threshold: p to the nearest multiple of 2^-16 (at least one step when
  // p > 0), and the scale that keeps E[drop(x)] = x for that rate.
  drop_.p16 =
      cfg.dropout > 0 ? std::max<uint32_t>(1, uint32_t(std::lround(cfg.dropout * 65536))) : 0;
  drop_.p16 = std::min<uint32_t>(drop_.p16, 65535);
  drop_.keep_scale = static_cast<float>(65536.0 / (65536.0 - drop_.p16));
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
    // Split like the layer's weight [out, in]: its ParamInfo says along which dimension, and
    // (counter-based init by global position) the shards draw one process's values.
    const ParamInfo& w = model.params().info(l.name + ".weight");
    const int64_t in_global = w.sharded() ? w.global_shape[1] : l.in;
    a->in_global = in_global;
    a->col0 = w.sharded() && w.shard_dim == 1 ? w.global_index.at(0) : 0;
    a->drop_key = name_key(l.name + ".lora_dropout");
    a->drop = &drop_;
    a->scratch = &scratch_;
    params_.add(a->a_name, {cfg.rank, l.in}, false, ParamInit::Uniform,
                1.f / std::sqrt(static_cast<float>(in_global)));
    params_.add(a->b_name, {l.out, cfg.rank}, false, ParamInit::Zeros);
    if (w.sharded()) {
      a->tp = model.tensor_parallel().comm;
      LOOM_CHECK(a->tp, l.name, ": a tensor-parallel layer without its communicator");
      if (w.shard_dim == 0) {
        a->split = Adapter::Split::Column;
        params_.set_shard(a->b_name, {w.global_shape[0], cfg.rank}, 0, w.global_index);
      } else {
        a->split = Adapter::Split::Row;
        params_.set_shard(a->a_name, {cfg.rank, w.global_shape[1]}, 1, w.global_index);
      }
    }
    adapters_.push_back(std::move(a));
  }
  // On the base model's backend, next to the weights the adapters' GEMMs read with theirs.
  params_.allocate(model.params().backend());
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

void Lora::set_dropout_batch(uint64_t micro, const int32_t* rows) {
  drop_.active = true;
  drop_.micro = micro;
  drop_.rows = rows;
  ++drop_.epoch;  // masks drawn before are not this micro-batch's
}

void Lora::clear_dropout() {
  drop_.active = false;
  drop_.rows = nullptr;
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
    // W[out, in] += scale * B[out, r] A[r, in], on the device both live on.
    P.backend().gemm(false, false, a->out, a->in, a->r, a->scale, a->B(), a->r, a->A(), a->in, 1.f,
                     W, a->in);
  }
}

}  // namespace loom
