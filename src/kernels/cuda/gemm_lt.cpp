#include "kernels/cuda/gemm_lt.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>

#include "core/error.h"
#include "kernels/cuda/fp8_gemm_rules.h"

namespace loom::cuda {
namespace {

#define LOOM_LT_CHECK(call)                                                    \
  do {                                                                         \
    const cublasStatus_t loom_st_ = (call);                                    \
    if (loom_st_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::loom::fail("cuBLASLt error in ", #call, " (", __FILE__, ":", __LINE__, \
                   "): ", cublasLtGetStatusString(loom_st_));                  \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    case DType::F8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::F8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      fail("gemm (cuda): unsupported operand type ", dtype_name(t));
  }
}

using Key = std::array<int64_t, 22>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cublasLtMatrixLayout_t layout(DType t, int rows, int cols, int ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  LOOM_LT_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), rows, cols, ld));
  if (batch > 1) {
    LOOM_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                   sizeof batch));
    LOOM_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof stride));
  }
  return l;
}

}  // namespace

int compute_type_of(GemmMath m) {
  switch (m) {
    case GemmMath::FP32:
      return CUBLAS_COMPUTE_32F;
    case GemmMath::TF32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmMath::BF16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmMath::FP16:
      return CUBLAS_COMPUTE_32F_FAST_16F;
  }
  return CUBLAS_COMPUTE_32F;
}

struct LtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  int sm = 0;
  std::map<Key, Plan> plans;

  ~Impl() {
    for (auto& [k, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.la);
      cublasLtMatrixLayoutDestroy(p.lb);
      cublasLtMatrixLayoutDestroy(p.lc);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (handle) cublasLtDestroy(handle);
  }

  Plan& plan(const GemmEx& g, int compute) {
    const int al_a = pointer_alignment(g.A), al_b = pointer_alignment(g.B),
              al_c = pointer_alignment(g.C);
    const Key key{g.trans_a,
                  g.trans_b,
                  g.M,
                  g.N,
                  g.K,
                  g.lda,
                  g.ldb,
                  g.ldc,
                  int64_t(g.a_type),
                  int64_t(g.b_type),
                  int64_t(g.c_type),
                  compute,
                  g.batch,
                  g.stride_a,
                  g.stride_b,
                  g.stride_c,
                  g.bias != nullptr,
                  g.a_scale != nullptr,
                  al_a,
                  al_b,
                  al_c,
                  0};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;

    // Column-major view: m = N, n = M, k = K; first operand B (trans_b), second A (trans_a).
    const int m = g.N, n = g.M, k = g.K;
    Plan p;
    LOOM_LT_CHECK(
        cublasLtMatmulDescCreate(&p.op, static_cast<cublasComputeType_t>(compute), CUDA_R_32F));
    const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LOOM_LT_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LOOM_LT_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      LOOM_LT_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      const cudaDataType_t bt = CUDA_R_32F;
      LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                   sizeof bt));
    }
    if (is_fp8(g.a_type) || is_fp8(g.b_type)) {
      // Scale pointers are part of the problem the heuristic plans for; run() sets them again
      // (a plan is shared by calls with other scale buffers). cuBLASLt's A is our B.
      LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                   &g.b_scale, sizeof g.b_scale));
      LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                   &g.a_scale, sizeof g.a_scale));
    }
    p.la = g.trans_b ? layout(g.b_type, k, m, g.ldb, g.batch, g.stride_b)
                     : layout(g.b_type, m, k, g.ldb, g.batch, g.stride_b);
    p.lb = g.trans_a ? layout(g.a_type, n, k, g.lda, g.batch, g.stride_a)
                     : layout(g.a_type, k, n, g.lda, g.batch, g.stride_a);
    p.lc = layout(g.c_type, m, n, g.ldc, g.batch, g.stride_c);

    cublasLtMatmulPreference_t pref = nullptr;
    LOOM_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    LOOM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    const uint32_t aa = al_b, ab = al_a, ac = al_c;  // cuBLASLt's A is our B
    LOOM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    LOOM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    LOOM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    LOOM_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.la);
      cublasLtMatrixLayoutDestroy(p.lb);
      cublasLtMatrixLayoutDestroy(p.lc);
      cublasLtMatmulDescDestroy(p.op);
      fail("gemm (cuda): cuBLASLt has no algorithm for M=", g.M, " N=", g.N, " K=", g.K,
           " trans_a=", g.trans_a, " trans_b=", g.trans_b, " lda=", g.lda, " ldb=", g.ldb,
           " ldc=", g.ldc, " types ", dtype_name(g.a_type), "/", dtype_name(g.b_type), "->",
           dtype_name(g.c_type), " compute ", compute, " alignment ", al_a, "/", al_b, "/", al_c,
           " (", cublasLtGetStatusString(hs), ")");
    }
    p.algo = res.algo;
    return plans.emplace(key, p).first->second;
  }
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes, int sm) : impl_(new Impl) {
  LOOM_LT_CHECK(cublasLtCreate(&impl_->handle));
  impl_->ws = workspace;
  impl_->ws_bytes = workspace_bytes;
  impl_->sm = sm;
}

LtGemm::~LtGemm() = default;

size_t LtGemm::cached_plans() const {
  return impl_->plans.size();
}

void LtGemm::run(cudaStream_t st, const GemmEx& g, int compute) {
  LOOM_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "gemm (cuda): negative size M=", g.M, " N=", g.N,
             " K=", g.K);
  const int a_cols = g.trans_a ? g.M : g.K, b_cols = g.trans_b ? g.K : g.N;
  LOOM_CHECK(g.lda >= std::max(1, a_cols), "gemm (cuda): lda=", g.lda, " < ", a_cols);
  LOOM_CHECK(g.ldb >= std::max(1, b_cols), "gemm (cuda): ldb=", g.ldb, " < ", b_cols);
  LOOM_CHECK(g.ldc >= std::max(1, g.N), "gemm (cuda): ldc=", g.ldc, " < ", g.N);
  LOOM_CHECK(g.batch >= 1, "gemm (cuda): batch=", g.batch);
  LOOM_CHECK(g.c_type == DType::F32 || g.c_type == DType::BF16 || g.c_type == DType::F16,
             "gemm (cuda): output type must be fp32, bf16 or fp16, got ", dtype_name(g.c_type));
  const bool fp8 = is_fp8(g.a_type) || is_fp8(g.b_type);
  if (fp8) {
    check_fp8_gemm(g, impl_->sm);  // cuBLASLt's fp8 rules (fp8_gemm_rules.h)
  } else {
    LOOM_CHECK(g.a_type == g.b_type, "gemm (cuda): A and B types differ (", dtype_name(g.a_type),
               ", ", dtype_name(g.b_type), ")");
  }
  Plan& p = impl_->plan(g, compute);
  if (g.bias)
    LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                 sizeof g.bias));
  if (fp8) {
    // cuBLASLt's A is our B and vice versa.
    LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                 &g.b_scale, sizeof g.b_scale));
    LOOM_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &g.a_scale, sizeof g.a_scale));
  }
  const cublasStatus_t rs =
      cublasLtMatmul(impl_->handle, p.op, &g.alpha, g.B, p.la, g.A, p.lb, &g.beta, g.C, p.lc, g.C,
                     p.lc, &p.algo, impl_->ws, impl_->ws_bytes, st);
  if (rs != CUBLAS_STATUS_SUCCESS)
    fail("gemm (cuda): cublasLtMatmul failed for M=", g.M, " N=", g.N, " K=", g.K, " types ",
         dtype_name(g.a_type), "/", dtype_name(g.b_type), "->", dtype_name(g.c_type), ": ",
         cublasLtGetStatusString(rs));
}

}  // namespace loom::cuda
