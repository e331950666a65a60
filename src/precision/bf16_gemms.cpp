#include "precision/bf16_gemms.h"

#include <algorithm>

#include "core/log.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"

namespace loom {

Bf16Gemms::Bf16Gemms(ParamSet* params) : params_(params) {
  if (params_) params_->allocate_bf16_copy();
}

Bf16Gemms::~Bf16Gemms() {
  for (const void* key : reused_) cpu::gemm_bf16_release(key);
}

uint64_t Bf16Gemms::weights_version() {
  const uint64_t writes = params_ ? params_->bf16_write_count() : 0;
  if (writes != seen_bf16_writes_) {
    seen_bf16_writes_ = writes;
    ++version_;
  }
  return version_;
}

void Bf16Gemms::new_weights() {
  ++version_;
  const std::vector<ParamSet::Range> written =
      params_ ? params_->take_bf16_written() : std::vector<ParamSet::Range>{};
  const float* base = params_ ? params_->fp32_storage() : nullptr;  // (addresses: keys)
  for (auto& [w, fresh] : fresh_) {
    fresh = false;
    if (!base || w < base || w >= base + params_->total()) continue;
    const int64_t a = w - base, b = a + sizes_[w];
    for (const auto& [lo, hi] : written) fresh = fresh || (lo <= a && b <= hi);
  }
}

const uint16_t* Bf16Gemms::weight(const float* w, int64_t n) {
  bool& fresh = fresh_[w];
  int64_t& size = sizes_[w];
  if (size != n) fresh = false;
  size = n;
  const float* base = params_ ? params_->fp32_storage() : nullptr;  // (addresses: keys)
  if (base && w >= base && w + n <= base + params_->total()) {      // in the set's bf16 copy
    uint16_t* c = params_->bf16_data() + (w - base);
    // A weight without fp32 values (ParamSet::drop_fp32): the copy is the weight itself.
    if (!fresh && params_->fp32_dropped_at(w - base)) fresh = true;
    if (!fresh) {
      cpu::f32_to_bf16_array(w, c, size_t(n));
      fresh = true;
      ++conversions_;
      ++version_;
    }
    return c;
  }
  std::vector<uint16_t>& c = weights_[w];
  if (!fresh || c.size() != size_t(n)) {
    c.resize(size_t(n));
    cpu::f32_to_bf16_array(w, c.data(), size_t(n));
    fresh = true;
    ++conversions_;
    ++version_;
  }
  return c.data();
}

// x as bf16: the stored activation itself (bf16 policy), or converted into a_ (exact: its values
// are bf16 values already).
const uint16_t* Bf16Gemms::input(ActIn x, int64_t n) {
  if (x.bf16) return x.bf16;
  a_.resize(size_t(n));
  cpu::f32_to_bf16_array(x.f32, a_.data(), a_.size());
  return a_.data();
}

float Bf16Gemms::dw_beta(const float* dw, int64_t n) {
  if (!params_) return 1.f;
  const float* g = params_->grad();
  if (!g || dw < g || dw + n > g + params_->total()) return 1.f;
  const uint64_t zeroed = params_->grad_zero_count();
  auto [it, first_use] = dw_written_.try_emplace(dw, 0);
  uint64_t& written = it->second;  // 0 when never written: zero_grad() counts from 1
  const bool zero = zeroed > 0 && written != zeroed;
  written = zeroed;
  // This GEMM is dW's first writer after every zero_grad() and writes it whole: zero_grad()
  // may leave it to this write (lazy zeroing, ParamSet::allow_lazy_zero).
  const int64_t at = dw - g;
  if (first_use) params_->allow_lazy_zero(at, at + n);
  if (zero) params_->grad_overwritten(at, at + n);
  return zero ? 0.f : 1.f;
}

uint16_t* Bf16Gemms::dy_bits(const float* dy, int64_t n) {
  b_.resize(size_t(n));
  dy_noted_ = dy;
  dy_noted_n_ = n;
  return b_.data();
}

void Bf16Gemms::forward(Backend&, float* y, ActIn x, const float* w, const float* b, int N, int in,
                        int out) {
  dy_noted_ = nullptr;
  if (N == 0 || out == 0) return;
  const uint16_t* wb = weight(w, int64_t(out) * in);
  const uint16_t* xb = input(x, int64_t(N) * in);
  if (b != nullptr)  // the bias added in the GEMM's kernel: no seeding pass, no reading y
    return cpu::gemm_bf16_bias(N, out, in, xb, in, wb, in, b, y, out);
  cpu::gemm_bf16(false, true, N, out, in, 1.f, xb, in, wb, in, 0.f, y, out);
}

void Bf16Gemms::backward(Backend&, float* dx, float* dw, float* db, const float* dy, ActIn x,
                         const float* w, int N, int in, int out) {
  // dy's bits are in b_ already when the caller stored them while rounding dy (dy_bits), else
  // converted here (exact either way: dy holds bf16 values).
  const bool noted = dy == dy_noted_ && int64_t(N) * out == dy_noted_n_;
  dy_noted_ = nullptr;
  if (N == 0) return;
  if (!noted) {
    b_.resize(size_t(N) * out);
    cpu::f32_to_bf16_array(dy, b_.data(), b_.size());
  }
  backward_gemms(dx, dw, b_.data(), x, w, N, in, out);
  if (db != nullptr)  // column sums of dy, as the fp32 path computes them (x unused there)
    cpu::matmul_backward(nullptr, nullptr, db, dy, nullptr, w, N, in, out);
}

void Bf16Gemms::backward_gemms(float* dx, float* dw, const uint16_t* dyb, ActIn x, const float* w,
                               int N, int in, int out) {
  // A weight this large is the output head's (or a vocabulary slice of it), whose input
  // gradient runs once per chunk of rows: packed once per version, not once per chunk.
  constexpr int64_t kReusedWeight = int64_t(16) << 20;
  if (dx != nullptr && int64_t(out) * in >= kReusedWeight) {
    const uint16_t* wb = weight(w, int64_t(out) * in);
    // Keyed by this recipe's entry for the weight (stable while the recipe lives): another
    // recipe's versions count apart.
    const void* key = &sizes_.at(w);
    if (std::find(reused_.begin(), reused_.end(), key) == reused_.end()) reused_.push_back(key);
    cpu::gemm_bf16_reused_b(N, in, out, dyb, out, wb, in, dx, in, key, weights_version());
  } else if (dx != nullptr) {  // dx[N, in] = dy W
    cpu::gemm_bf16(false, false, N, in, out, 1.f, dyb, out, weight(w, int64_t(out) * in), in, 0.f,
                   dx, in);
  }
  if (dw != nullptr)  // dW[out, in] += dy^T x
    cpu::gemm_bf16(true, false, out, in, N, 1.f, dyb, out, input(x, int64_t(N) * in), in,
                   dw_beta(dw, int64_t(out) * in), dw, in);
}

void Bf16Gemms::forward_bf16(Backend&, uint16_t* y, ActIn x, const float* w, int N, int in,
                             int out) {
  dy_noted_ = nullptr;
  if (N == 0 || out == 0) return;
  const uint16_t* wb = weight(w, int64_t(out) * in);
  cpu::gemm_bf16(false, true, N, out, in, 1.f, input(x, int64_t(N) * in), in, wb, in, 0.f, y, out);
}

void Bf16Gemms::backward_bf16(Backend&, float* dx, float* dw, const uint16_t* dy, ActIn x,
                              const float* w, int N, int in, int out) {
  dy_noted_ = nullptr;
  if (N == 0) return;
  backward_gemms(dx, dw, dy, x, w, N, in, out);
}

void drop_fp32_weights(Decoder& model) {
  ParamSet& P = model.params();
  LOOM_CHECK(P.bf16_data(), "drop_fp32_weights: no bf16 copy (attach_bf16_gemms first)");
  std::vector<std::string> names;
  for (const auto& l : model.linears())  // "<prefix>" reads "<prefix>.weight"; the head its own
    names.push_back(l.name != "head"      ? l.name + ".weight"
                    : model.config().tied ? "embed.wte"
                                          : "head.weight");
  // The token embedding too when untied (Llama): only the lookup reads it, from widened rows.
  if (P.has("embed.wte") && std::find(names.begin(), names.end(), "embed.wte") == names.end())
    names.push_back("embed.wte");
  P.drop_fp32(names);
}

std::unique_ptr<Bf16Gemms> attach_bf16_gemms(Decoder& model, bool quiet) {
  if (cpu::bf16_gemm_path() != cpu::Bf16GemmPath::OneDnn) {
    if (!quiet)
      log_info("bf16 policy: GEMMs stay fp32 sgemm on bf16 values (bf16 GEMM path: ",
               cpu::bf16_gemm_path_name(), ")");
    return nullptr;
  }
  auto r = std::make_unique<Bf16Gemms>(&model.params());
  for (const auto& l : model.linears()) model.attach_recipe(l.name, r.get());
  if (!quiet) log_info("bf16 policy: linear layers' GEMMs in bf16 (oneDNN, AVX512-BF16)");
  return r;
}

}  // namespace loom
