// bf16 GEMM door: argument checks, the run-time choice between oneDNN and the fp32 fallback,
// and the fallback itself (widen A and B to fp32, run blas.h's GEMM, round C if it is bf16).

#include "kernels/cpu/gemm_bf16.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16_dnnl.h"

namespace loom::cpu {
namespace {

struct Choice {
  Bf16GemmPath path;
  std::string name;
};

// The automatic choice, made once: LOOM_BF16_GEMM, then the build, then the CPU.
const Choice& automatic_choice() {
  static const Choice choice = [] {
    std::string reason;
    const char* env = std::getenv("LOOM_BF16_GEMM");
    const std::string mode = env != nullptr ? env : "";
    LOOM_CHECK(mode.empty() || mode == "auto" || mode == "fallback", "LOOM_BF16_GEMM='", mode,
               "': expected 'auto' or 'fallback'");
    if (mode == "fallback") {
      reason = "LOOM_BF16_GEMM=fallback";
    } else if (!detail::dnnl_built()) {
      reason = "built without oneDNN";
    } else if (!cpu_has_avx512_bf16()) {
      reason = "this CPU lacks AVX512-BF16";
    } else if (!detail::dnnl_isa_has_bf16()) {
      reason = "oneDNN may not use AVX512-BF16 here (DNNL_MAX_CPU_ISA?)";
    }
    if (reason.empty()) return Choice{Bf16GemmPath::OneDnn, "onednn"};
    return Choice{Bf16GemmPath::Fallback, "fallback (" + reason + ")"};
  }();
  return choice;
}

std::atomic<bool> g_forced_fallback{false};
const std::string kForcedName = "fallback (forced)";

// The one notice a fallback run logs, naming why.
void notice_fallback(const std::string& name) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log_warn("bf16 GEMM: ", name, ": converting bf16 operands to fp32 and running the fp32 ",
             "GEMM (", blas_name(), "), slower than a native bf16 GEMM");
  });
}

void check_args(const char* what, bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb,
                int ldc) {
  LOOM_CHECK(M >= 0 && N >= 0 && K >= 0, what, ": negative size M=", M, " N=", N, " K=", K);
  const int a_cols = trans_a ? M : K;
  const int b_cols = trans_b ? K : N;
  LOOM_CHECK(lda >= std::max(1, a_cols), what, ": lda=", lda, " < ", a_cols);
  LOOM_CHECK(ldb >= std::max(1, b_cols), what, ": ldb=", ldb, " < ", b_cols);
  LOOM_CHECK(ldc >= std::max(1, N), what, ": ldc=", ldc, " < ", N);
}

// Copies a rows x cols bf16 matrix with leading dimension ld into a dense fp32 buffer.
void widen(const uint16_t* X, int rows, int cols, int ld, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows) * cols);
  if (ld == cols) return bf16_to_f32_array(X, out.data(), out.size());
  for (int r = 0; r < rows; ++r)
    bf16_to_f32_array(X + static_cast<int64_t>(r) * ld, out.data() + static_cast<size_t>(r) * cols,
                      static_cast<size_t>(cols));
}

void narrow(const std::vector<float>& in, int rows, int cols, uint16_t* X, int ld) {
  for (int r = 0; r < rows; ++r)
    f32_to_bf16_array(in.data() + static_cast<size_t>(r) * cols, X + static_cast<int64_t>(r) * ld,
                      static_cast<size_t>(cols));
}

struct Fp32Scratch {
  std::vector<float> a, b, c;
};
Fp32Scratch& fp32_scratch() {
  thread_local Fp32Scratch s;
  return s;
}

// The fallback for one GEMM; also the K == 0 case on every path.
void fallback_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
                   int lda, const uint16_t* B, int ldb, float beta, void* C, bool c_bf16, int ldc) {
  Fp32Scratch& s = fp32_scratch();
  widen(A, trans_a ? K : M, trans_a ? M : K, lda, s.a);
  widen(B, trans_b ? N : K, trans_b ? K : N, ldb, s.b);
  const int a_ld = std::max(1, trans_a ? M : K), b_ld = std::max(1, trans_b ? K : N);
  if (!c_bf16) {
    gemm(trans_a, trans_b, M, N, K, alpha, s.a.data(), a_ld, s.b.data(), b_ld, beta,
         static_cast<float*>(C), ldc);
    return;
  }
  auto* c16 = static_cast<uint16_t*>(C);
  if (beta != 0.0f) {
    widen(c16, M, N, ldc, s.c);
  } else {
    s.c.resize(static_cast<size_t>(M) * N);  // beta == 0: the GEMM overwrites it
  }
  gemm(trans_a, trans_b, M, N, K, alpha, s.a.data(), a_ld, s.b.data(), b_ld, beta, s.c.data(), N);
  narrow(s.c, M, N, c16, ldc);
}

void run(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A, int lda,
         int64_t stride_a, const uint16_t* B, int ldb, int64_t stride_b, float beta, void* C,
         bool c_bf16, int ldc, int64_t stride_c, int batch) {
  const char* what = batch == 1 ? "gemm_bf16" : "gemm_bf16_batched";
  check_args(what, trans_a, trans_b, M, N, K, lda, ldb, ldc);
  LOOM_CHECK(batch >= 0, what, ": negative batch ", batch);
  LOOM_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, what, ": negative stride");
  LOOM_CHECK(batch <= 1 || stride_c >= static_cast<int64_t>(M) * ldc, what, ": stride_c=", stride_c,
             " < M*ldc=", static_cast<int64_t>(M) * ldc, " (C matrices overlap)");
  if (M == 0 || N == 0 || batch == 0) return;
  if (K > 0 && bf16_gemm_path() == Bf16GemmPath::OneDnn &&
      detail::dnnl_gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b,
                             beta, C, c_bf16, ldc, stride_c, batch))
    return;
  if (K > 0 && bf16_gemm_path() == Bf16GemmPath::Fallback) notice_fallback(bf16_gemm_path_name());
  const size_t c_elem = c_bf16 ? sizeof(uint16_t) : sizeof(float);
  for (int b = 0; b < batch; ++b)
    fallback_gemm(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
                  beta, static_cast<unsigned char*>(C) + b * stride_c * c_elem, c_bf16, ldc);
}

// The fallbacks' bias: every row of C [M, N] (row stride ldc) set to bias [N], for the GEMM to
// accumulate onto.
void seed_with_bias(int M, int N, const float* bias, float* C, int ldc) {
  for (int r = 0; r < M; ++r) std::copy(bias, bias + N, C + int64_t(r) * ldc);
}

}  // namespace

bool cpu_has_avx512_bf16() {
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512bf16;
}

bool bf16_gemm_onednn_built() {
  return detail::dnnl_built();
}

Bf16GemmPath bf16_gemm_path() {
  if (g_forced_fallback.load(std::memory_order_relaxed)) return Bf16GemmPath::Fallback;
  return automatic_choice().path;
}

const char* bf16_gemm_path_name() {
  if (g_forced_fallback.load(std::memory_order_relaxed)) return kForcedName.c_str();
  return automatic_choice().name.c_str();
}

void force_bf16_gemm_fallback(bool force) {
  g_forced_fallback.store(force, std::memory_order_relaxed);
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, false, ldc, 0, 1);
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, true, ldc, 0, 1);
}

void gemm_bf16_bias(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
                    const float* bias, float* C, int ldc) {
  check_args("gemm_bf16_bias", false, true, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K > 0 && bf16_gemm_path() == Bf16GemmPath::OneDnn &&
      detail::dnnl_gemm_bf16_bias(M, N, K, A, lda, B, ldb, bias, C, ldc))
    return;
  seed_with_bias(M, N, bias, C, ldc);  // (as seeded before)
  run(false, true, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 1.f, C, false, ldc, 0, 1);
}

void gemm_bf16_varying_alpha(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                             const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta,
                             float* C, int ldc, const float* bias) {
  check_args("gemm_bf16_varying_alpha", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  LOOM_CHECK(beta == 0.f || beta == 1.f, "gemm_bf16_varying_alpha: beta ", beta,
             " (expected 0 or 1)");
  LOOM_CHECK(bias == nullptr || beta == 0.f, "gemm_bf16_varying_alpha: a bias with beta 1");
  if (M == 0 || N == 0) return;
  if (K > 0 && bf16_gemm_path() == Bf16GemmPath::OneDnn &&
      detail::dnnl_gemm_bf16_varying_alpha(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta,
                                           C, ldc, bias))
    return;
  if (bias != nullptr) {  // seeded, then accumulated onto: gemm_bf16's own arithmetic
    seed_with_bias(M, N, bias, C, ldc);
    beta = 1.f;
  }
  run(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, false, ldc, 0, 1);
}

uint64_t bf16_gemm_primitives_created() {
  return detail::dnnl_primitives_created();
}

void gemm_bf16_reused_b(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B, int ldb,
                        float* C, int ldc, const void* key, uint64_t version) {
  check_args("gemm_bf16_reused_b", false, false, M, N, K, lda, ldb, ldc);
  if (M > 0 && N > 0 && K > 0 && bf16_gemm_path() == Bf16GemmPath::OneDnn &&
      detail::dnnl_gemm_bf16_reused_b(M, N, K, A, lda, B, ldb, C, ldc, key, version))
    return;
  run(false, false, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, C, false, ldc, 0, 1);
}

void gemm_bf16_release(const void* key) {
  detail::dnnl_release_reused_b(key);
}

void gemm_bf16_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const uint16_t* A, int lda, int64_t stride_a, const uint16_t* B, int ldb,
                       int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c,
                       int batch) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, false, ldc,
      stride_c, batch);
}

void gemm_bf16_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                       const uint16_t* A, int lda, int64_t stride_a, const uint16_t* B, int ldb,
                       int64_t stride_b, float beta, uint16_t* C, int ldc, int64_t stride_c,
                       int batch) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, true, ldc,
      stride_c, batch);
}

}  // namespace loom::cpu
