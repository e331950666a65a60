// A Backend that forwards every call to an inner backend and first tells a listener which op
// runs ("matmul_forward", "attention_backward", ...): how bench_cuda times the real Decoder's op
// groups (a CUDA event whenever the group changes) without the Decoder knowing. The inner
// backend does all the work, so results are the inner backend's bit for bit (tested over the
// CPU backend in tests/model/backend_step_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "kernels/backend.h"

namespace loom::test {

class TapBackend final : public Backend {
 public:
  using Listener = std::function<void(const char* op)>;
  explicit TapBackend(Backend& inner, Listener listener = nullptr)
      : in_(inner), tap_(std::move(listener)) {}
  // Replaces the listener (nullptr: none; the calls still forward).
  void set_listener(Listener l) { tap_ = std::move(l); }
  Backend& inner() { return in_; }

  // What device() reports (default: the inner backend's). Tests set Device::CUDA to run the
  // Decoder's GPU-only choices (whole-row bf16 passes) over the CPU's ops.
  void report_device(Device d) { dev_ = d; }

  const char* name() const override { return in_.name(); }
  Device device() const override { return dev_ ? *dev_ : in_.device(); }
  bool host_accessible() const override { return in_.host_accessible(); }
  std::string memory_report() const override { return in_.memory_report(); }

  // ---- memory
  void* alloc(size_t bytes, const char* cls) override { return in_.alloc(bytes, cls); }
  void* alloc_zeroed(size_t bytes, const char* cls) override {
    return in_.alloc_zeroed(bytes, cls);
  }
  void free(void* p) override { in_.free(p); }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    on("copy_h2d");
    in_.copy_h2d(dst, src, bytes);
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    on("copy_d2h");
    in_.copy_d2h(dst, src, bytes);
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    on("copy_d2d");
    in_.copy_d2d(dst, src, bytes);
  }
  void fill_bytes(void* dst, int byte, size_t bytes) override {
    on("fill_bytes");
    in_.fill_bytes(dst, byte, bytes);
  }
  void sync() override { in_.sync(); }

  // ---- ops
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    on("gemm");
    in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    int64_t sa, const float* B, int ldb, int64_t sb, float beta, float* C, int ldc,
                    int64_t sc, int batch) override {
    on("gemm_batched");
    in_.gemm_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int IC,
                      int OC) override {
    on("matmul_forward");
    in_.matmul_forward(out, inp, w, b, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) override {
    on("matmul_backward");
    in_.matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         bool acc) override {
    on("embedding_forward");
    in_.embedding_forward(out, ids, table, N, C, acc);
  }
  void embedding_backward(float* dt, const float* dout, const int32_t* ids, int N, int C) override {
    on("embedding_backward");
    in_.embedding_backward(dt, dout, ids, N, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C, float eps) override {
    on("layernorm_forward");
    in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    on("layernorm_backward");
    in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override {
    on("rmsnorm_forward");
    in_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    on("rmsnorm_backward");
    in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    on("gelu_forward");
    in_.gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    on("gelu_backward");
    in_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    on("swiglu_forward");
    in_.swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    on("swiglu_backward");
    in_.swiglu_backward(dinp, inp, dout, N, F);
  }
  void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                    float theta) override {
    on("rope_forward");
    in_.rope_forward(x, pos, N, H, D, ld, theta);
  }
  void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                     float theta) override {
    on("rope_backward");
    in_.rope_backward(dx, pos, N, H, D, ld, theta);
  }
  void rope_forward_scaled(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                           const RopeScaling& s) override {
    on("rope_forward");
    in_.rope_forward_scaled(x, pos, N, H, D, ld, theta, s);
  }
  void rope_backward_scaled(float* dx, const int32_t* pos, int N, int H, int D, int ld, float theta,
                            const RopeScaling& s) override {
    on("rope_backward");
    in_.rope_backward_scaled(dx, pos, N, H, D, ld, theta, s);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    on("add");
    in_.add(out, a, b, n);
  }
  void add_inplace(float* acc, const float* x, int64_t n) override {
    on("add_inplace");
    in_.add_inplace(acc, x, n);
  }
  void scale_inplace(float* x, float s, int64_t n) override {
    on("scale_inplace");
    in_.scale_inplace(x, s, n);
  }
  void apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                      float scale) override {
    on("apply_bit_mask");
    in_.apply_bit_mask(out, x, bits, N, C, scale);
  }
  void softmax_forward(float* out, const float* inp, int rows, int cols) override {
    on("softmax_forward");
    in_.softmax_forward(out, inp, rows, cols);
  }
  void softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                        int cols) override {
    on("softmax_backward");
    in_.softmax_backward(dinp, out, dout, rows, cols);
  }
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, float dloss, const float* weights) override {
    on("cross_entropy");
    in_.cross_entropy(losses, dlogits, logits, targets, N, V, dloss, weights);
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                         float scale) override {
    on("attention_forward");
    in_.attention_forward(out, lse, q, k, v, ld, cu, nseq, Hq, Hkv, D, scale);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                          float scale) override {
    on("attention_backward");
    in_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, ld, cu, nseq, Hq, Hkv, D, scale);
  }
  void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
             float beta2, float eps, float wd, float grad_scale, int64_t step) override {
    on("adamw");
    in_.adamw(param, grad, m, v, n, lr, beta1, beta2, eps, wd, grad_scale, step);
  }
  double sum_squares(const float* x, int64_t n) override {
    on("sum_squares");
    return in_.sum_squares(x, n);
  }
  double weighted_sum(const float* x, const float* w, int64_t n) override {
    on("weighted_sum");
    return in_.weighted_sum(x, w, n);
  }
  bool all_finite(const float* x, int64_t n) override {
    on("all_finite");
    return in_.all_finite(x, n);
  }
  void embedding_forward_slice(float* out, const int32_t* ids, const float* table, int N, int C,
                               int v0, int V) override {
    on("embedding_forward");
    in_.embedding_forward_slice(out, ids, table, N, C, v0, V);
  }
  void embedding_backward_slice(float* dt, const float* dout, const int32_t* ids, int N, int C,
                                int v0, int V) override {
    on("embedding_backward");
    in_.embedding_backward_slice(dt, dout, ids, N, C, v0, V);
  }
  void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) override {
    on("cross_entropy");
    in_.cross_entropy_slice_max(mx, logits, N, V);
  }
  void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                                const int32_t* targets, int N, int V, int v0) override {
    on("cross_entropy");
    in_.cross_entropy_slice_sums(se, tl, logits, mx, targets, N, V, v0);
  }
  void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                  const float* mx, const float* se, const float* tl,
                                  const int32_t* targets, int N, int V, int v0, float dloss,
                                  const float* weights) override {
    on("cross_entropy");
    in_.cross_entropy_slice_finish(losses, dlogits, logits, mx, se, tl, targets, N, V, v0, dloss,
                                   weights);
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t row_bytes,
               size_t rows) override {
    on("copy_2d");
    in_.copy_2d(dst, dpitch, src, spitch, row_bytes, rows);
  }
  // ---- MoE and ring attention (moe_ring ops)
  void moe_router_forward(float* scores, int32_t* idx, float* w, const float* logits, int N, int E,
                          int k, bool sig, bool renorm) override {
    on("moe_router_forward");
    in_.moe_router_forward(scores, idx, w, logits, N, E, k, sig, renorm);
  }
  void moe_router_backward(float* dlogits, const float* dw, const float* ds, const float* scores,
                           const int32_t* idx, int N, int E, int k, bool sig,
                           bool renorm) override {
    on("moe_router_backward");
    in_.moe_router_backward(dlogits, dw, ds, scores, idx, N, E, k, sig, renorm);
  }
  double moe_aux_loss(float* ds, const float* scores, const int32_t* idx, int N, int E, int k,
                      float coeff, float dloss) override {
    on("moe_aux_loss");
    return in_.moe_aux_loss(ds, scores, idx, N, E, k, coeff, dloss);
  }
  void moe_expert_stats(float* stats, const float* scores, const int32_t* idx, int N, int E,
                        int k) override {
    on("moe_expert_stats");
    in_.moe_expert_stats(stats, scores, idx, N, E, k);
  }
  void add_row_broadcast(float* x, const float* row, int N, int C) override {
    on("add_row_broadcast");
    in_.add_row_broadcast(x, row, N, C);
  }
  void moe_plan_routing(int32_t* plan, const int32_t* idx, int N, int E, int k, int cap) override {
    on("moe_plan_routing");
    in_.moe_plan_routing(plan, idx, N, E, k, cap);
  }
  void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) override {
    on("moe_permute");
    in_.moe_permute(out, x, token_of, rows, C);
  }
  void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                            int C) override {
    on("moe_permute_backward");
    in_.moe_permute_backward(dx, dout, row_of, N, k, C);
  }
  void moe_unpermute(float* y, const float* eo, const float* w, const int32_t* row_of, int N, int k,
                     int C) override {
    on("moe_unpermute");
    in_.moe_unpermute(y, eo, w, row_of, N, k, C);
  }
  void moe_unpermute_backward(float* deo, float* dw, const float* dy, const float* eo,
                              const float* w, const int32_t* row_of, int N, int k, int C) override {
    on("moe_unpermute_backward");
    in_.moe_unpermute_backward(deo, dw, dy, eo, w, row_of, N, k, C);
  }
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                               const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                               float scale) override {
    on("attention_block_forward");
    in_.attention_block_forward(out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D, scale);
  }
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, int ldq,
                                const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                                int Hkv, int D, float scale) override {
    on("attention_block_backward");
    in_.attention_block_backward(dq, dk, dv, dout, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D,
                                 scale);
  }
  void attention_merge(float* out, float* lse, const float* oa, const float* la, const float* ob,
                       const float* lb, int N, int H, int D) override {
    on("attention_merge");
    in_.attention_merge(out, lse, oa, la, ob, lb, N, H, D);
  }
  void add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) override {
    on("add_2d");
    in_.add_2d(dst, ldd, src, lds, rows, cols);
  }
  void paged_kv_write(const PagedKvBuffers& c, const float* k_new, const float* v_new, int ld,
                      const int32_t* chunks, int nchunks, int rows) override {
    on("paged_kv_write");
    in_.paged_kv_write(c, k_new, v_new, ld, chunks, nchunks, rows);
  }
  void paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& c,
                       const int32_t* chunks, int nchunks, int rows, int Hq, float scale) override {
    on("paged_attention");
    in_.paged_attention(out, q, ldq, c, chunks, nchunks, rows, Hq, scale);
  }
  void fp8_amax(const float* x, int64_t n, float* amax) override {
    on("fp8_amax");
    in_.fp8_amax(x, n, amax);
  }
  void fp8_record_amax(float* pending, const float* amax) override {
    on("fp8_record_amax");
    in_.fp8_record_amax(pending, amax);
  }
  void fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                        const float* amax, float* scale, bool e5m2, int margin,
                        bool most_recent) override {
    on("fp8_roll_history");
    in_.fp8_roll_history(history, len, pos_count, pending, amax, scale, e5m2, margin, most_recent);
  }
  void round_to(DType t, float* x, int64_t n, void* store) override {
    on("round_to");
    in_.round_to(t, x, n, store);
  }
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override {
    on("convert");
    in_.convert(dst, dt, src, st, n);
  }

 private:
  void on(const char* op) {
    if (tap_) tap_(op);
  }
  Backend& in_;
  Listener tap_;
  std::optional<Device> dev_;
};

}  // namespace loom::test
