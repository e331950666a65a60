#include "kernels/cpu/kv_fp8.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/fp8.h"

namespace loom::cpu {

uint8_t kv_fp8_scale_code(float amax) {
  if (!std::isfinite(amax)) return kKvFp8NonFinite;
  if (!(amax >= 448.0f * 0x1p-126f)) return 1;
  // amax / 2^e lies in [256, 512) for e = floor(log2(amax)) - 8; one more when above 448 (the
  // division by a power of two is exact, so is the comparison).
  int e = std::ilogb(amax) - 8;
  if (std::ldexp(amax, -e) > 448.0f) ++e;
  e = std::clamp(e, -126, 119);
  return static_cast<uint8_t>(e + 127);
}

uint8_t kv_fp8_encode_row(const float* x, int n, uint8_t* codes) {
  const uint8_t s = kv_fp8_scale_code(fp8_amax(x, n));
  // 1/X = 2^(127 - s) is a normal float for s in [1, 246]; a non-finite row is coded unscaled
  // (NaN stays NaN, infinities saturate) and reads back non-finite through X = inf.
  const float inv = s == kKvFp8NonFinite ? 1.0f : kv_fp8_scale(uint8_t(254 - s));
  fp8_quantize(Fp8Format::E4M3, x, inv, codes, n);
  return s;
}

void kv_fp8_decode_row(const uint8_t* codes, uint8_t s, int n, float* out) {
  fp8_dequantize(Fp8Format::E4M3, codes, kv_fp8_scale(s), out, n);
}

}  // namespace loom::cpu
