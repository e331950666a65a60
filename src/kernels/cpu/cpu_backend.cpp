#include "kernels/backend.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/attention_merge.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/paged_attention.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "kernels/memory_ledger.h"

namespace loom {
namespace {

// memset, with large fills (the gradient buffer's zeroing, 500 MB for GPT-2 124M) split in
// 1 MiB chunks over the OpenMP team: one thread's memset does not reach the memory bandwidth
// that all cores do.
void fill(void* dst, int byte, size_t bytes) {
  constexpr size_t kChunk = size_t(1) << 20;
  if (bytes < 2 * kChunk || omp_in_parallel() || omp_get_max_threads() == 1) {
    if (bytes) std::memset(dst, byte, bytes);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t a = size_t(c) * kChunk;
    std::memset(d + a, byte, std::min(kChunk, bytes - a));
  }
}

// fp32 -> fp16 / fp8 and back, element by element (bf16 has its vectorised loops).
void narrow(void* dst, DType t, const float* x, int64_t n) {
  auto* u8 = static_cast<uint8_t*>(dst);
  auto* u16 = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F16)
      u16[i] = f32_to_f16(x[i]);
    else if (t == DType::F8E4M3)
      u8[i] = f32_to_e4m3(x[i]);
    else if (t == DType::F8E5M2)
      u8[i] = f32_to_e5m2(x[i]);
    else
      fail("cpu backend: cannot convert fp32 to ", dtype_name(t));
  }
}
void widen(float* x, const void* src, DType t, int64_t n) {
  const auto* u8 = static_cast<const uint8_t*>(src);
  const auto* u16 = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F16)
      x[i] = f16_to_f32(u16[i]);
    else if (t == DType::F8E4M3)
      x[i] = e4m3_to_f32(u8[i]);
    else if (t == DType::F8E5M2)
      x[i] = e5m2_to_f32(u8[i]);
    else
      fail("cpu backend: cannot convert ", dtype_name(t), " to fp32");
  }
}

cpu::RouterScore router(bool sigmoid) {
  return sigmoid ? cpu::RouterScore::Sigmoid : cpu::RouterScore::Softmax;
}

// Delegates every op to loom::cpu; the class exists so callers can hold a Backend&.
class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }

  // Host memory: buffers are ordinary aligned heap blocks, copies are memcpy, and every op has
  // finished when it returns (sync has nothing to wait for).
  void* alloc(size_t bytes, const char* cls) override {
    // aligned_alloc wants a multiple of the alignment; at least one block, so that a zero-byte
    // buffer is still a distinct, freeable pointer.
    const size_t n = std::max<size_t>(1, (bytes + kAlign - 1) / kAlign) * kAlign;
    void* p = std::aligned_alloc(kAlign, n);
    LOOM_CHECK(p, "cpu backend: out of memory allocating ", bytes, " bytes of ", cls);
    ledger_.add(p, n, cls);
    return p;
  }
  // Fresh anonymous pages read as zeros and become resident only when written, unlike a
  // zero-filled heap block, which touches every page up front (parameters: a ZeRO-3 rank
  // initialises only its part, and gradients of frozen parameters are never written).
  void* alloc_zeroed(size_t bytes, const char* cls) override {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t n = std::max<size_t>(1, (bytes + page - 1) / page) * page;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LOOM_CHECK(p != MAP_FAILED, "cpu backend: out of memory mapping ", bytes, " bytes of ", cls);
    {
      std::lock_guard<std::mutex> lock(mu_);
      mapped_.insert(p);
    }
    ledger_.add(p, n, cls);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    const size_t n = ledger_.remove(p, "cpu");
    bool mapped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mapped = mapped_.erase(p) > 0;
    }
    if (mapped)
      munmap(p, n);
    else
      std::free(p);
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_d2h(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_d2d(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void fill_bytes(void* dst, int byte, size_t bytes) override { fill(dst, byte, bytes); }
  void sync() override {}
  bool host_accessible() const override { return true; }
  std::string memory_report() const override { return ledger_.report("cpu"); }
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    cpu::gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                    float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    cpu::gemm_batched(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C,
                      ldc, stride_c, batch);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int IC, int OC) override {
    cpu::matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int IC, int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         bool accumulate) override {
    cpu::embedding_forward(out, ids, table, N, C, accumulate);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N,
                          int C) override {
    cpu::embedding_backward(dtable, dout, ids, N, C);
  }
  void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                               int v0, int V) override {
    cpu::embedding_forward_slice(out, ids, table, N, C, v0, V);
  }
  void embedding_backward_slice(float* dtable, const float* dout, const int32_t* ids, int N, int C,
                                int v0, int V) override {
    cpu::embedding_backward_slice(dtable, dout, ids, N, C, v0, V);
  }
  void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) override {
    cpu::cross_entropy_slice_max(mx, logits, N, V);
  }
  void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                                const int32_t* targets, int N, int V, int v0) override {
    cpu::cross_entropy_slice_sums(se, tl, logits, mx, targets, N, V, v0);
  }
  void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                  const float* mx, const float* se, const float* tl,
                                  const int32_t* targets, int N, int V, int v0, float dloss,
                                  const float* weights) override {
    cpu::cross_entropy_slice_finish(losses, dlogits, logits, mx, se, tl, targets, N, V, v0, dloss,
                                    weights);
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t row_bytes,
               size_t rows) override {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                  row_bytes);
  }
  // ---- MoE and ring attention (kernels/cpu/moe.h, attention_block.h, attention_merge.h)
  void moe_router_forward(float* scores, int32_t* topk_idx, float* topk_w, const float* logits,
                          int N, int E, int k, bool sigmoid, bool renormalize) override {
    cpu::moe_router_forward(scores, topk_idx, topk_w, logits, N, E, k, router(sigmoid),
                            renormalize);
  }
  void moe_router_backward(float* dlogits, const float* dtopk_w, const float* dscores,
                           const float* scores, const int32_t* topk_idx, int N, int E, int k,
                           bool sigmoid, bool renormalize) override {
    cpu::moe_router_backward(dlogits, dtopk_w, dscores, scores, topk_idx, N, E, k, router(sigmoid),
                             renormalize);
  }
  double moe_aux_loss(float* dscores, const float* scores, const int32_t* topk_idx, int N, int E,
                      int k, float coeff, float dloss) override {
    return cpu::moe_aux_loss(dscores, scores, topk_idx, N, E, k, coeff, dloss);
  }
  void moe_expert_stats(float* stats, const float* scores, const int32_t* topk_idx, int N, int E,
                        int k) override {
    cpu::moe_expert_stats(stats, scores, topk_idx, N, E, k);
  }
  void add_row_broadcast(float* x, const float* row, int N, int C) override {
    for (int64_t t = 0; t < N; ++t)
      for (int c = 0; c < C; ++c) x[t * C + c] += row[c];
  }
  void moe_plan_routing(int32_t* plan, const int32_t* topk_idx, int N, int E, int k,
                        int capacity) override {
    cpu::moe_plan_routing(plan, topk_idx, N, E, k, capacity);
  }
  void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) override {
    cpu::moe_permute(out, x, token_of, rows, C);
  }
  void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                            int C) override {
    cpu::moe_permute_backward(dx, dout, row_of, N, k, C);
  }
  void moe_unpermute(float* y, const float* expert_out, const float* topk_w, const int32_t* row_of,
                     int N, int k, int C) override {
    cpu::moe_unpermute(y, expert_out, topk_w, row_of, N, k, C);
  }
  void moe_unpermute_backward(float* dexpert_out, float* dtopk_w, const float* dy,
                              const float* expert_out, const float* topk_w, const int32_t* row_of,
                              int N, int k, int C) override {
    cpu::moe_unpermute_backward(dexpert_out, dtopk_w, dy, expert_out, topk_w, row_of, N, k, C);
  }
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                               const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                               float scale) override {
    cpu::attention_block_forward(out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D, scale);
  }
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, int ldq,
                                const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                                int Hkv, int D, float scale) override {
    cpu::attention_block_backward(dq, dk, dv, dout, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D,
                                  scale);
  }
  void attention_merge(float* out, float* lse, const float* out_a, const float* lse_a,
                       const float* out_b, const float* lse_b, int N, int H, int D) override {
    cpu::attention_merge(out, lse, out_a, lse_a, out_b, lse_b, N, H, D);
  }
  void add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) override {
    for (int64_t i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) dst[i * ldd + j] += src[i * lds + j];
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    cpu::rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                        const float* weight, const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  bool gelu_forward_bf16(uint16_t* out, const float* in32, const uint16_t* in16,
                         int64_t n) override {
    cpu::gelu_forward_bf16(out, in32, in16, n);
    return true;
  }
  bool gelu_backward_bf16(float* dinp, uint16_t* dinp_bits, const uint16_t* in16, float* dout,
                          bool round_dout, int64_t n) override {
    cpu::gelu_backward_bf16(dinp, dinp_bits, in16, dout, round_dout, n);
    return true;
  }
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    cpu::swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    cpu::swiglu_backward(dinp, inp, dout, N, F);
  }
  bool has_gemma_ops() const override { return true; }
  void geglu_forward(float* out, const float* inp, int N, int F) override {
    cpu::geglu_forward(out, inp, N, F);
  }
  void geglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    cpu::geglu_backward(dinp, inp, dout, N, F);
  }
  void softcap_forward(float* x, int64_t n, float cap) override { cpu::softcap_forward(x, n, cap); }
  void softcap_backward(float* d, const float* y, int64_t n, float cap) override {
    cpu::softcap_backward(d, y, n, cap);
  }
  void attention_variant_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, int ld, const int32_t* cu_seqlens, int nseq,
                                 int Hq, int Hkv, int D, float scale, int window,
                                 float softcap) override {
    cpu::attention_variant_forward(out, lse, q, k, v, ld, cu_seqlens, nseq, Hq, Hkv, D, scale,
                                   window, softcap);
  }
  void attention_variant_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, int ld, const int32_t* cu_seqlens, int nseq,
                                  int Hq, int Hkv, int D, float scale, int window,
                                  float softcap) override {
    cpu::attention_variant_backward(dq, dk, dv, dout, q, k, v, out, lse, ld, cu_seqlens, nseq, Hq,
                                    Hkv, D, scale, window, softcap);
  }
  void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                    float theta) override {
    cpu::rope_forward(x, pos, N, H, D, ld, theta);
  }
  void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                     float theta) override {
    cpu::rope_backward(dx, pos, N, H, D, ld, theta);
  }
  void rope_forward_scaled(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                           const RopeScaling& s) override {
    cpu::rope_forward(x, pos, N, H, D, ld, theta, s);
  }
  void rope_backward_scaled(float* dx, const int32_t* pos, int N, int H, int D, int ld, float theta,
                            const RopeScaling& s) override {
    cpu::rope_backward(dx, pos, N, H, D, ld, theta, s);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    cpu::add(out, a, b, n);
  }
  void add_inplace(float* acc, const float* x, int64_t n) override { cpu::add_inplace(acc, x, n); }
  void scale_inplace(float* x, float s, int64_t n) override { cpu::scale_inplace(x, s, n); }
  void apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                      float scale) override {
    const int64_t words = (int64_t(C) + 63) / 64;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const uint64_t* w = bits + int64_t(n) * words;
      const float* xr = x + int64_t(n) * C;
      float* o = out + int64_t(n) * C;
      for (int c = 0; c < C; ++c) o[c] = (w[c >> 6] >> (c & 63)) & 1 ? xr[c] * scale : 0.f;
    }
  }
  void softmax_forward(float* out, const float* inp, int rows, int cols) override {
    cpu::softmax_forward(out, inp, rows, cols);
  }
  void softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                        int cols) override {
    cpu::softmax_backward(dinp, out, dout, rows, cols);
  }
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, float dloss, const float* weights) override {
    cpu::cross_entropy(losses, dlogits, logits, targets, N, V, dloss, weights);
  }
  bool cross_entropy_bf16(float* losses, float* logits, uint16_t* dlogit_bits,
                          const int32_t* targets, int N, int V, float dloss, const float* weights,
                          bool grads) override {
    cpu::cross_entropy_bf16(losses, logits, dlogit_bits, targets, N, V, dloss, weights, grads);
    return true;
  }
  bool cross_entropy_from_bf16(float* losses, uint16_t* logits, const int32_t* targets, int N,
                               int V, float dloss, const float* weights, bool grads) override {
    if (N > 0) cpu::cross_entropy_from_bf16(losses, logits, targets, N, V, dloss, weights, grads);
    return true;
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                         float scale) override {
    cpu::attention_forward(out, lse, q, k, v, ld, cu_seqlens, nseq, Hq, Hkv, D, scale);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                          float scale) override {
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, ld, cu_seqlens, nseq, Hq, Hkv, D,
                            scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, float grad_scale, int64_t step) override {
    cpu::adamw(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step);
  }
  double sum_squares(const float* x, int64_t n) override {
    return cpu::sum_squares(x, n);
  }
  bool all_finite(const float* x, int64_t n) override {
    return cpu::all_finite(x, n);
  }
  double weighted_sum(const float* x, const float* w, int64_t n) override {
    double sum = 0;  // index order: bit-reproducible
    for (int64_t i = 0; i < n; ++i) sum += w ? double(w[i]) * x[i] : x[i];
    return sum;
  }

  void fp8_amax(const float* x, int64_t n, float* amax) override {
    *amax = cpu::fp8_amax(x, n);
  }
  void fp8_record_amax(float* pending, const float* amax) override {
    if (std::isfinite(*amax)) *pending = std::max(*pending, *amax);
  }
  void fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                        const float* amax, float* scale, bool e5m2, int margin,
                        bool most_recent) override {
    cpu::fp8_roll_history(e5m2 ? cpu::Fp8Format::E5M2 : cpu::Fp8Format::E4M3, history, len,
                          pos_count, pending, amax, scale, margin, most_recent);
  }

  void round_to(DType t, float* x, int64_t n, void* store) override {
    if (t == DType::BF16) return cpu::round_bf16_array(x, static_cast<uint16_t*>(store), size_t(n));
    loom::round_to(t, x, size_t(n));
    if (store) convert(store, t, x, DType::F32, n);
  }
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override {
    if (dt == st) {
      std::memcpy(dst, src, size_t(n) * dtype_size(dt));
    } else if (st == DType::F32 && dt == DType::BF16) {
      cpu::f32_to_bf16_array(static_cast<const float*>(src), static_cast<uint16_t*>(dst),
                             size_t(n));
    } else if (st == DType::BF16 && dt == DType::F32) {
      cpu::bf16_to_f32_array(static_cast<const uint16_t*>(src), static_cast<float*>(dst),
                             size_t(n));
    } else {
      LOOM_CHECK(st == DType::F32 || dt == DType::F32, "cpu backend: convert ", dtype_name(st),
                 " to ", dtype_name(dt), " goes through fp32");
      if (st == DType::F32)
        narrow(dst, dt, static_cast<const float*>(src), n);
      else
        widen(static_cast<float*>(dst), src, st, n);
    }
  }

  // ---- Serving: the chunk table read in place (host memory), then the cpu:: paged kernels.
  void paged_kv_write(const PagedKvBuffers& c, const float* k_new, const float* v_new, int ld,
                      const int32_t* chunks, int nchunks, int rows) override {
    const cpu::PagedKvLayer kv = paged_layer(c);
    const std::vector<cpu::PagedChunk>& ch = paged_chunks(chunks, nchunks, rows);
    cpu::paged_kv_write(kv, k_new, v_new, ld, ch.data(), nchunks);
  }
  void paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& c,
                       const int32_t* chunks, int nchunks, int rows, int Hq, float scale) override {
    const cpu::PagedKvLayer kv = paged_layer(c);
    const std::vector<cpu::PagedChunk>& ch = paged_chunks(chunks, nchunks, rows);
    cpu::paged_attention(out, q, ldq, kv, ch.data(), nchunks, Hq, scale);
  }
  void paged_attention_variant(float* out, const float* q, int ldq, const PagedKvBuffers& c,
                               const int32_t* chunks, int nchunks, int rows, int Hq, float scale,
                               int window, float softcap) override {
    const cpu::PagedKvLayer kv = paged_layer(c);
    const std::vector<cpu::PagedChunk>& ch = paged_chunks(chunks, nchunks, rows);
    cpu::paged_attention_variant(out, q, ldq, kv, ch.data(), nchunks, Hq, scale, window, softcap);
  }

  // ---- bf16 policy (kernels/cpu/adamw.cpp)
  void adamw_to_bf16(float* master, const float* grad, float* m, float* v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                     int64_t step, float* model, uint16_t* model_bf16) override {
    cpu::adamw_to_bf16(master, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step,
                       model, model_bf16);
  }

 private:
  static cpu::PagedKvLayer paged_layer(const PagedKvBuffers& c) {
    cpu::PagedKvLayer kv;
    kv.k = c.k;
    kv.v = c.v;
    kv.k_scale = c.k_scale;
    kv.v_scale = c.v_scale;
    kv.dtype = c.dtype;
    kv.num_blocks = c.num_blocks;
    kv.block_size = c.block_size;
    kv.n_kv_head = c.n_kv_head;
    kv.head_dim = c.head_dim;
    return kv;
  }
  // The table's chunks as cpu::PagedChunk (block tables pointing into the table), in a
  // grow-only per-thread vector: called twice per layer and step. The cpu:: kernels check the
  // block indices; the rows are checked here.
  static const std::vector<cpu::PagedChunk>& paged_chunks(const int32_t* t, int nchunks, int rows) {
    thread_local std::vector<cpu::PagedChunk> out;
    LOOM_CHECK(nchunks >= 0 && rows >= 0, "paged attention: ", nchunks, " chunks of ", rows,
               " rows");
    out.resize(size_t(nchunks));
    int row = 0;
    for (int s = 0; s < nchunks; ++s) {
      const int32_t* f = t + int64_t(s) * kPagedChunkInts;
      LOOM_CHECK(f[kPagedRow0] == row && f[kPagedN] >= 0 && f[kPagedBlocks] >= 0 &&
                     f[kPagedTable] >= nchunks * kPagedChunkInts,
                 "paged attention: chunk ", s, " of the chunk table is malformed (row ",
                 f[kPagedRow0], ", expected ", row, ")");
      out[size_t(s)] = {f[kPagedN], f[kPagedStart], t + f[kPagedTable], f[kPagedBlocks]};
      row += f[kPagedN];
    }
    LOOM_CHECK(row == rows, "paged attention: the chunk table has ", row, " rows, the op ", rows);
    return out;
  }
  // memmove semantics are not promised by the interface, but a copy onto itself is harmless.
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  MemoryLedger ledger_;
  std::mutex mu_;
  std::unordered_set<void*> mapped_;  // alloc_zeroed's mappings (munmap, not free)
};
}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  cpu::set_blas_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace loom
