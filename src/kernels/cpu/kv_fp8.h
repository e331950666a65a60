// The fp8 KV cache's row encoding (--kv-cache-dtype fp8). A row is the head_dim values of one
// position of one kv head; it is stored as E4M3 codes (kernels/cpu/fp8.h: round to nearest even,
// saturating) of the values times 2^-e, with one scale byte s per row, X = 2^e = 2^(s - 127)
// (E8M0's encoding). e is the smallest exponent that brings the row's largest magnitude to at
// most 448, E4M3's largest value, so no value of the row saturates. A power of two costs no
// precision (E4M3 keeps its 3 mantissa bits at any exponent; only the subnormals, below 2^-6 of
// the row's scale, are coarser) and makes the scaling exact both ways. Each row depends on its
// own values alone: a rewritten slot (speculative rollback, recomputation after preemption)
// stores the same bytes for the same values, whatever else its block holds.
#pragma once

#include <cstdint>
#include <cstring>

namespace loom::cpu {

// s for a row whose largest magnitude is amax: e = ceil(log2(amax / 448)), clamped to
// [-126, 119] (s in [1, 246]: a row of zeros, or one below 448 * 2^-126, takes s = 1; one
// beyond 448 * 2^119 ~ 3e38 saturates). A NaN or infinite amax gives kKvFp8NonFinite, whose X is
// +inf: such a row reads back as non-finite, and attention over it gives NaN as over fp32.
constexpr uint8_t kKvFp8NonFinite = 0xFF;
uint8_t kv_fp8_scale_code(float amax);

// 2^(s - 127 + shift) as a float (s in [1, 246], shift in [0, 8]); +inf for kKvFp8NonFinite.
inline float kv_fp8_scale(uint8_t s, int shift = 0) {
  const uint32_t bits = s == kKvFp8NonFinite ? 0x7F800000u : uint32_t(s + shift) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Encodes the n values of x as n codes; returns the row's scale byte.
uint8_t kv_fp8_encode_row(const float* x, int n, uint8_t* codes);
// out[i] = decode(codes[i]) * X: the values the cache holds.
void kv_fp8_decode_row(const uint8_t* codes, uint8_t s, int n, float* out);

}  // namespace loom::cpu
