// cuBLASLt's fp8 GEMM rules (kernels/cuda/fp8_gemm_rules.h), checked on the host: a GEMM as
// CudaFp8Linear poses it passes; each broken rule is refused naming it. No GPU needed (the
// pointers are host addresses with the alignments under test; nothing is launched).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kernels/cuda/fp8_gemm_rules.h"

using namespace loom;

namespace {

alignas(256) unsigned char mem[4096];

// The forward GEMM of an fp8 linear layer: y[N, out] = x[N, in] W[out, in]^T, 64 tokens, 128 in,
// 96 out, fp32 output, scales on their own 16-byte slots.
GemmEx forward_gemm() {
  GemmEx g;
  g.trans_b = true;
  g.M = 64;
  g.N = 96;
  g.K = 128;
  g.a_type = DType::F8E4M3;
  g.b_type = DType::F8E4M3;
  g.c_type = DType::F32;
  g.A = mem;
  g.lda = 128;
  g.B = mem + 1024;
  g.ldb = 128;
  g.C = mem + 2048;
  g.ldc = 96;
  g.a_scale = reinterpret_cast<const float*>(mem + 3072);
  g.b_scale = reinterpret_cast<const float*>(mem + 3088);
  return g;
}

std::string refusal(const GemmEx& g, int sm = 90) {
  try {
    cuda::check_fp8_gemm(g, sm);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Fp8GemmRules, TheLinearLayersGemmsPass) {
  EXPECT_EQ(refusal(forward_gemm()), "");
  // Hybrid gradients: e5m2 meets e4m3 on either side.
  GemmEx g = forward_gemm();
  g.a_type = DType::F8E5M2;
  EXPECT_EQ(refusal(g), "");
  g.a_type = DType::F8E4M3;
  g.b_type = DType::F8E5M2;
  EXPECT_EQ(refusal(g), "");
  // bf16 output, accumulation into C.
  g.c_type = DType::BF16;
  g.beta = 1.f;
  EXPECT_EQ(refusal(g), "");
}

TEST(Fp8GemmRules, EachBrokenRuleIsNamed) {
  struct Case {
    const char* what;
    void (*breaks)(GemmEx&);
    const char* message;
    int sm = 90;
  };
  const Case cases[] = {
      {"ampere", [](GemmEx&) {}, "sm_89 or newer (this device is sm_80)", 80},
      {"e5m2 x e5m2", [](GemmEx& g) { g.a_type = g.b_type = DType::F8E5M2; },
       "e5m2 x e5m2 is not a cuBLASLt fp8 combination"},
      {"fp8 x bf16", [](GemmEx& g) { g.b_type = DType::BF16; }, "both operands fp8"},
      {"NN layout", [](GemmEx& g) { g.trans_b = false; },
       "the TN layout cuBLASLt's fp8 kernels require"},
      {"TT layout", [](GemmEx& g) { g.trans_a = true; },
       "the TN layout cuBLASLt's fp8 kernels require"},
      {"no scale", [](GemmEx& g) { g.b_scale = nullptr; }, "per-tensor scales"},
      {"scale 4 bytes on", [](GemmEx& g) { g.b_scale = g.a_scale + 1; },
       "scale pointers must be 16-byte aligned"},
      {"bias", [](GemmEx& g) { g.bias = reinterpret_cast<const float*>(mem); },
       "bias is not supported"},
      {"fp8 output", [](GemmEx& g) { g.c_type = DType::F8E4M3; }, "output must be fp32"},
      {"A 8 bytes on", [](GemmEx& g) { g.A = mem + 8; }, "16-byte aligned (cuBLASLt's Tensor"},
      {"C 4 bytes on", [](GemmEx& g) { g.C = mem + 2052; }, "16-byte aligned (cuBLASLt's Tensor"},
      {"K 120", [](GemmEx& g) { g.K = g.lda = g.ldb = 120; }, "K, lda and ldb multiples of 16"},
      {"lda 136", [](GemmEx& g) { g.lda = 136; }, "K, lda and ldb multiples of 16"},
      {"N 94", [](GemmEx& g) { g.N = g.ldc = 94; }, "the output's rows (N=94"},
      {"bf16 ldc 100",
       [](GemmEx& g) {
         g.c_type = DType::BF16;
         g.ldc = 100;
       },
       "a multiple of 16 bytes of bf16"},
      {"batch stride",
       [](GemmEx& g) {
         g.batch = 2;
         g.stride_a = 64 * 128 + 8;
         g.stride_b = 96 * 128;
         g.stride_c = 64 * 96;
       },
       "batch strides"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    GemmEx g = forward_gemm();
    c.breaks(g);
    const std::string e = refusal(g, c.sm);
    EXPECT_NE(e.find(c.message), std::string::npos) << "got: '" << e << "'";
  }
}

}  // namespace
