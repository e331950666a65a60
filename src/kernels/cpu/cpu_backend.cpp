#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"

#include <omp.h>

namespace loom {
namespace {

// Delegates every op to loom::cpu; the class exists so callers can hold a Backend&.
class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
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
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    cpu::swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    cpu::swiglu_backward(dinp, inp, dout, N, F);
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
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
  bool all_finite(const float* x, int64_t n) override { return cpu::all_finite(x, n); }
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
