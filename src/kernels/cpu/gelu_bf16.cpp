// GeLU over bf16-stored inputs (the Decoder's bf16 storage of fc), fused with the conversions
// around it: one parallel region over blocks of 16K elements, each thread widening, applying
// and narrowing (or rounding) its blocks in its own cache. Unfused, each 64K-float row block of
// the Decoder was three short parallel regions (widen, GeLU, narrow), whose fork/join and
// end-of-region waits cost more than the arithmetic. Each element goes through the very
// functions of the unfused passes (gelu_forward, gelu_backward, the bf16 conversions, all
// elementwise), so the bits are the same.
#include <algorithm>
#include <vector>

#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {
namespace {

constexpr int64_t kBlock = int64_t{1} << 14;  // 64 KiB of fp32: stays in L1/L2 between steps

// A block-sized fp32 scratch of the calling thread.
float* thread_block() {
  thread_local std::vector<float> buf(static_cast<size_t>(kBlock));
  return buf.data();
}

}  // namespace

void gelu_forward_bf16(uint16_t* out, const float* in32, const uint16_t* in16, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (worth_parallel(n))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t b0 = b * kBlock, len = std::min(kBlock, n - b0);
    float* blk = thread_block();
    const float* x = in32 ? in32 + b0 : blk;
    if (!in32) bf16_to_f32_array(in16 + b0, blk, size_t(len));
    gelu_forward(blk, x, len);  // in place when widened: elementwise
    f32_to_bf16_array(blk, out + b0, size_t(len));
  }
}

void gelu_backward_bf16(float* dinp, uint16_t* dinp_bits, const uint16_t* in16, float* dout,
                        bool round_dout, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (worth_parallel(n))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t b0 = b * kBlock, len = std::min(kBlock, n - b0);
    float* blk = thread_block();
    bf16_to_f32_array(in16 + b0, blk, size_t(len));
    if (round_dout) round_bf16_array(dout + b0, nullptr, size_t(len));
    gelu_backward(dinp + b0, blk, dout + b0, len);
    round_bf16_array(dinp + b0, dinp_bits ? dinp_bits + b0 : nullptr, size_t(len));
  }
}

}  // namespace loom::cpu
