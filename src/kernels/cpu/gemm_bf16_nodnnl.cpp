// A build without oneDNN: every bf16 GEMM takes the fp32 fallback.
#include "kernels/cpu/gemm_bf16_dnnl.h"

namespace loom::cpu::detail {

bool dnnl_built() {
  return false;
}
bool dnnl_isa_has_bf16() {
  return false;
}
bool dnnl_gemm_bf16(bool, bool, int, int, int, float, const uint16_t*, int, int64_t,
                    const uint16_t*, int, int64_t, float, void*, bool, int, int64_t, int) {
  return false;
}
bool dnnl_gemm_bf16_reused_b(int, int, int, const uint16_t*, int, const uint16_t*, int, float*, int,
                             const void*, uint64_t) {
  return false;
}
void dnnl_release_reused_b(const void*) {}
bool dnnl_gemm_bf16_bias(int, int, int, const uint16_t*, int, const uint16_t*, int, const float*,
                         float*, int) {
  return false;
}

bool dnnl_gemm_bf16_varying_alpha(bool, bool, int, int, int, float, const uint16_t*, int,
                                  const uint16_t*, int, float, float*, int, const float*) {
  return false;
}
uint64_t dnnl_primitives_created() {
  return 0;
}

}  // namespace loom::cpu::detail
