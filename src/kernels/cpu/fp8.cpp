// FP8 / E8M0 conversions. Rounding works on the fp32 bit pattern of |v|:
//   - normal range: add half an fp8 ulp minus one plus the lowest kept bit, clear the dropped
//     bits (round to nearest even in integer arithmetic, as f32_to_bf16 does);
//   - subnormal range: |v| + 2^(q+23) - 2^(q+23), where 2^q is the fp8 subnormal quantum: the
//     fp32 addition rounds |v| to a multiple of 2^q, to nearest even;
//   - at or above the max normal (inf included): the max normal.
// The AVX512 loops do exactly these operations on 16 lanes, so both paths give the same bits.

#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if !defined(__clang__)  // (clang has no such warning and rejects the name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX512 intrinsics
#endif

namespace loom::cpu {
namespace {

struct Fmt {
  int shift;              // fp32 mantissa bits dropped: 23 - mantissa bits
  uint32_t max_bits;      // |max normal| as fp32 bits
  uint32_t minnorm_bits;  // smallest normal as fp32 bits
  uint32_t magic_bits;    // 2^(subnormal quantum exponent + 23)
  uint32_t rebias;        // (127 - bias) << mantissa bits: fp32 exponent field -> fp8's
  uint8_t max_code, nan_code;
};

constexpr Fmt kE4M3{20, 0x43E00000u, 0x3C800000u, 0x46800000u, 120u << 3, 0x7E, 0x7F};
constexpr Fmt kE5M2{21, 0x47600000u, 0x38800000u, 0x43000000u, 112u << 2, 0x7B, 0x7E};

const Fmt& fmt(Fp8Format f) {
  return f == Fp8Format::E4M3 ? kE4M3 : kE5M2;
}

constexpr uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u;
constexpr uint16_t kBf16Nan = 0x7fc0;

// |v|'s bits (not NaN) -> the bits of the fp8 value it rounds to.
inline uint32_t round_abs(const Fmt& F, uint32_t a) {
  if (a >= F.max_bits) return F.max_bits;
  if (a < F.minnorm_bits) {
    const float m = bits_f32(F.magic_bits);
    return f32_bits((bits_f32(a) + m) - m);  // IEEE order kept: no -ffast-math in Loom
  }
  const uint32_t half = (1u << (F.shift - 1)) - 1u;
  return (a + half + ((a >> F.shift) & 1u)) & ~((1u << F.shift) - 1u);
}

// Bits of a rounded fp8 value (abs) -> its code without the sign.
inline uint32_t code_of(const Fmt& F, uint32_t r) {
  if (r < F.minnorm_bits) return f32_bits(bits_f32(r) + bits_f32(F.magic_bits)) - F.magic_bits;
  return (r >> F.shift) - F.rebias;
}

struct Tables {
  float value[2][256];
  Tables() {
    for (int f = 0; f < 2; ++f) {
      const int mbits = f == 0 ? 3 : 2, bias = f == 0 ? 7 : 15;
      for (int c = 0; c < 256; ++c) {
        const int e = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1);
        float v = e == 0 ? std::ldexp(float(m), 1 - bias - mbits)
                         : std::ldexp(1.f + float(m) / float(1 << mbits), e - bias);
        if (f == 0 && (c & 0x7f) == 0x7f) v = NAN;
        if (f == 1 && e == 31) v = m ? NAN : INFINITY;
        value[f][c] = (c & 0x80) ? -v : v;
      }
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

std::atomic<bool> g_force_portable{false};

// Input elements as fp32: fp32 itself, or bf16 bits (exactly their widened value).
inline float in_f32(float v) {
  return v;
}
inline float in_f32(uint16_t v) {
  return bits_f32(uint32_t(v) << 16);
}

// The element loop shared by every quantiser: v = x[i] * m (m broadcast, or per element),
// r = fp8 round of v; codes[i] = r's code; deq[i] = bf16 bits of r * X[i] (or of r when X is
// null), with results below 2^-126 flushed to signed zero. amax (nullable): max'ed with the
// largest |x[i]| as fp32 bits (NaN's bits exceed inf's), in the same pass.
template <typename In>
void elems_portable(const Fmt& F, const In* x, int64_t n, const float* m, bool m_bcast,
                    const float* X, uint8_t* codes, uint16_t* deq, uint32_t* amax = nullptr) {
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float xi = in_f32(x[i]);
    mx = std::max(mx, f32_bits(xi) & kAbs);
    const float v = xi * m[m_bcast ? 0 : i];
    const uint32_t u = f32_bits(v), a = u & kAbs, sign = u & ~kAbs;
    if (a > kInf) {
      if (codes) codes[i] = uint8_t(F.nan_code | (sign >> 24));
      if (deq) deq[i] = kBf16Nan;
      continue;
    }
    const uint32_t r = round_abs(F, a);
    if (codes) codes[i] = uint8_t(code_of(F, r) | (sign >> 24));
    if (deq) {
      uint32_t d = X ? f32_bits(bits_f32(r) * X[i]) : r;
      if ((d & kAbs) < 0x00800000u) d = 0;  // below bf16's normal range: flushed (see fp8.h)
      if ((d & kAbs) > kInf) {
        deq[i] = kBf16Nan;
        continue;
      }
      deq[i] = uint16_t((d | sign) >> 16);
    }
  }
  if (amax) *amax = std::max(*amax, mx);
}

#if defined(__x86_64__)
#define LOOM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

LOOM_AVX512 inline void elems16(const Fmt& F, __m512 x, __m512 m, __m512 X, bool use_X,
                                __mmask16 lanes, uint8_t* codes, uint16_t* deq) {
  const __m512i abs = _mm512_set1_epi32(int(kAbs)), one = _mm512_set1_epi32(1);
  const __m512i u = _mm512_castps_si512(_mm512_mul_ps(x, m));
  const __m512i a = _mm512_and_si512(u, abs), sign = _mm512_andnot_si512(abs, u);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(int(kInf)));
  const __mmask16 big = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(int(F.max_bits)));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(int(F.minnorm_bits)));
  const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(int(F.magic_bits)));
  const __m512i half = _mm512_set1_epi32(int((1u << (F.shift - 1)) - 1u));
  const __m512i keep = _mm512_set1_epi32(int(~((1u << F.shift) - 1u)));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, unsigned(F.shift)), one);
  __m512i r = _mm512_and_si512(_mm512_add_epi32(a, _mm512_add_epi32(half, lsb)), keep);
  const __m512 s = _mm512_add_ps(_mm512_castsi512_ps(a), magic);
  r = _mm512_mask_mov_epi32(r, sub, _mm512_castps_si512(_mm512_sub_ps(s, magic)));
  r = _mm512_mask_mov_epi32(r, big, _mm512_set1_epi32(int(F.max_bits)));
  if (codes) {
    const __m512i rs = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(r), magic));
    __m512i c =
        _mm512_sub_epi32(_mm512_srli_epi32(r, unsigned(F.shift)), _mm512_set1_epi32(int(F.rebias)));
    c = _mm512_mask_mov_epi32(c, sub, _mm512_sub_epi32(rs, _mm512_set1_epi32(int(F.magic_bits))));
    c = _mm512_mask_mov_epi32(c, nan, _mm512_set1_epi32(F.nan_code));
    c = _mm512_or_si512(c, _mm512_srli_epi32(sign, 24));
    _mm_mask_storeu_epi8(codes, lanes, _mm512_cvtepi32_epi8(c));
  }
  if (deq) {
    __m512i d = use_X ? _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(r), X)) : r;
    const __mmask16 tiny =
        _mm512_cmplt_epu32_mask(_mm512_and_si512(d, abs), _mm512_set1_epi32(0x00800000));
    d = _mm512_mask_mov_epi32(d, tiny, _mm512_setzero_si512());
    const __mmask16 dnan =
        nan | _mm512_cmpgt_epu32_mask(_mm512_and_si512(d, abs), _mm512_set1_epi32(int(kInf)));
    d = _mm512_srli_epi32(_mm512_or_si512(d, sign), 16);
    d = _mm512_mask_mov_epi32(d, dnan, _mm512_set1_epi32(kBf16Nan));
    _mm256_mask_storeu_epi16(deq, lanes, _mm512_cvtepi32_epi16(d));
  }
}

// 16 inputs (the lanes' ones; the others zero) as fp32.
LOOM_AVX512 inline __m512 load16(const float* p, __mmask16 lanes) {
  return _mm512_maskz_loadu_ps(lanes, p);
}
LOOM_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 lanes) {
  const __m256i h = _mm256_maskz_loadu_epi16(lanes, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <typename In>
LOOM_AVX512 void elems_avx512(const Fmt& F, const In* x, int64_t n, const float* m, bool m_bcast,
                              const float* X, uint8_t* codes, uint16_t* deq,
                              uint32_t* amax = nullptr) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512i abs = _mm512_set1_epi32(int(kAbs));
  __m512i mx = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t k = std::min<int64_t>(16, n - i);
    const __mmask16 lanes = static_cast<__mmask16>((1u << k) - 1u);
    const __m512 xv = load16(x + i, lanes);
    if (amax) mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(xv), abs));
    const __m512 mv = m_bcast ? _mm512_set1_ps(m[0]) : _mm512_maskz_loadu_ps(lanes, m + i);
    const __m512 Xv = X ? _mm512_mask_loadu_ps(one, lanes, X + i) : one;
    elems16(F, xv, mv, Xv, X != nullptr, lanes, codes ? codes + i : nullptr,
            deq ? deq + i : nullptr);
  }
  if (amax) {
    alignas(64) uint32_t l[16];  // (see amax_bits_avx512 on _mm512_reduce_max_epu32)
    _mm512_store_si512(l, mx);
    for (uint32_t v : l) *amax = std::max(*amax, v);
  }
}

LOOM_AVX512 uint32_t amax_bits_avx512(const float* x, int64_t n) {
  const __m512i abs = _mm512_set1_epi32(int(kAbs));
  __m512i mx = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
  if (i < n) {
    const __mmask16 lanes = static_cast<__mmask16>((1u << (n - i)) - 1u);
    mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_maskz_loadu_epi32(lanes, x + i), abs));
  }
  // Not _mm512_reduce_max_epu32: GCC 12 warns inside it (-Wuninitialized) when the function
  // gets AVX-512 from a target attribute rather than -march.
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, mx);
  uint32_t r = 0;
  for (uint32_t v : lanes) r = std::max(r, v);
  return r;
}

// bf16 bits: the largest |bits| of 32 lanes at a time, as the fp32 bits of the widened value.
LOOM_AVX512 uint32_t amax_bits_avx512(const uint16_t* x, int64_t n) {
  const __m512i abs = _mm512_set1_epi16(0x7fff);
  __m512i mx = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_loadu_si512(x + i), abs));
  if (i < n) {
    const __mmask32 lanes = static_cast<__mmask32>((uint64_t{1} << (n - i)) - 1u);
    mx = _mm512_max_epu16(mx, _mm512_and_si512(_mm512_maskz_loadu_epi16(lanes, x + i), abs));
  }
  alignas(64) uint16_t lanes[32];
  _mm512_store_si512(lanes, mx);
  uint32_t r = 0;
  for (uint16_t v : lanes) r = std::max<uint32_t>(r, v);
  return r << 16;
}
#endif

bool avx512() {
#if defined(__x86_64__)
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && !g_force_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

template <typename In>
void elems(const Fmt& F, const In* x, int64_t n, const float* m, bool m_bcast, const float* X,
           uint8_t* codes, uint16_t* deq, uint32_t* amax = nullptr) {
#if defined(__x86_64__)
  if (avx512()) return elems_avx512(F, x, n, m, m_bcast, X, codes, deq, amax);
#endif
  elems_portable(F, x, n, m, m_bcast, X, codes, deq, amax);
}

// The largest |x| as fp32 bits: for non-negative floats the integer order is the float order,
// and NaN's bits exceed inf's, so a NaN anywhere wins (bf16 bits alike).
template <typename In>
uint32_t amax_bits(const In* x, int64_t n) {
#if defined(__x86_64__)
  if (avx512()) return amax_bits_avx512(x, n);
#endif
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, f32_bits(in_f32(x[i])) & kAbs);
  return mx;
}

// Elements per OpenMP chunk of the flat loops (memory bound: only large arrays are split).
constexpr int64_t kChunk = int64_t{1} << 14;

template <typename Fn>
void chunked(int64_t n, Fn&& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1 && worth_parallel(n))
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunk, std::min(kChunk, n - c * kChunk));
}

// chunked() where fn returns a max (fp32 bits) over its chunk: the max over all of them (in
// any order: max is exact).
template <typename Fn>
uint32_t chunked_max(int64_t n, Fn&& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  uint32_t mx = 0;
#pragma omp parallel for schedule(static) reduction(max : mx) if (chunks > 1 && worth_parallel(n))
  for (int64_t c = 0; c < chunks; ++c)
    mx = std::max(mx, fn(c * kChunk, std::min(kChunk, n - c * kChunk)));
  return mx;
}

// The block scale's multiplier 2^-shared (into the fp8 range) and X = 2^shared, from the code.
void block_factors(uint8_t scale, float* mult, float* X) {
  if (scale == 0xFF) {
    *mult = *X = NAN;
    return;
  }
  *X = e8m0_to_f32(scale);
  *mult = bits_f32(uint32_t(254 - scale) << 23);  // 2^(127 - scale); scale <= 246 for finite amax
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::E4M3 ? "e4m3" : "e5m2";
}

uint8_t fp8_encode(Fp8Format f, float x) {
  uint8_t c;
  const float one = 1.f;
  elems_portable(fmt(f), &x, 1, &one, true, nullptr, &c, nullptr);
  return c;
}

float fp8_decode(Fp8Format f, uint8_t code) {
  return tables().value[f == Fp8Format::E4M3 ? 0 : 1][code];
}

float fp8_round(Fp8Format f, float x) {
  return fp8_decode(f, fp8_encode(f, x));
}

uint8_t e8m0_block_scale(float amax, Fp8Format elem) {
  const uint32_t a = f32_bits(amax) & kAbs;
  if (a >= kInf) return 0xFF;
  // floor(log2(amax)) is the exponent field minus 127 for a normal amax; a denormal or zero
  // amax lies below 2^-126, so its shared exponent clamps to -127 either way.
  const int e = a < 0x00800000u ? -127 : int(a >> 23) - 127;
  const int shared = std::clamp(e - fp8_emax(elem), -127, 127);
  return uint8_t(shared + 127);
}

float e8m0_to_f32(uint8_t code) {
  if (code == 0xFF) return NAN;
  if (code == 0) return bits_f32(0x00400000u);  // 2^-127: an fp32 denormal
  return bits_f32(uint32_t(code) << 23);
}

float fp8_amax(const float* x, int64_t n) {
  return bits_f32(chunked_max(n, [&](int64_t b, int64_t k) { return amax_bits(x + b, k); }));
}

float fp8_amax(const uint16_t* x, int64_t n) {
  return bits_f32(chunked_max(n, [&](int64_t b, int64_t k) { return amax_bits(x + b, k); }));
}

void fp8_roll_history(Fp8Format f, float* history, int len, int32_t* pos_count, float* pending,
                      const float* amax, float* scale, int margin, bool most_recent) {
  if (!(*pending >= 0.f)) return;  // nothing recorded since the last step
  const float a = *amax;
  history[pos_count[0]] = a;
  pos_count[0] = (pos_count[0] + 1) % len;
  pos_count[1] = std::min(pos_count[1] + 1, len);
  float use = a;
  if (!most_recent)
    for (int i = 0; i < len; ++i) use = std::max(use, history[i]);
  if (use > 0.f && std::isfinite(use)) {
    const float s = std::ldexp(fp8_max(f) / use, -margin);
    *scale = std::isfinite(s) ? s : FLT_MAX;
  }
  *pending = -1.f;
}

void fp8_quantize(Fp8Format f, const float* x, float scale, uint8_t* q, int64_t n) {
  chunked(n, [&](int64_t b, int64_t k) {
    elems(fmt(f), x + b, k, &scale, true, nullptr, q + b, nullptr);
  });
}

void fp8_dequantize(Fp8Format f, const uint8_t* q, float scale_inv, float* y, int64_t n) {
  const float* t = tables().value[f == Fp8Format::E4M3 ? 0 : 1];
  for (int64_t i = 0; i < n; ++i) y[i] = t[q[i]] * scale_inv;
}

void fp8_scaled_to_bf16(Fp8Format f, const float* x, float scale, uint16_t* out, int64_t n) {
  chunked(n, [&](int64_t b, int64_t k) {
    elems(fmt(f), x + b, k, &scale, true, nullptr, nullptr, out + b);
  });
}

void fp8_scaled_to_bf16(Fp8Format f, const uint16_t* x, float scale, uint16_t* out, int64_t n) {
  chunked(n, [&](int64_t b, int64_t k) {
    elems(fmt(f), x + b, k, &scale, true, nullptr, nullptr, out + b);
  });
}

namespace {
template <typename In>
float scaled_to_bf16_amax(Fp8Format f, const In* x, float scale, uint16_t* out, int64_t n) {
  return bits_f32(chunked_max(n, [&](int64_t b, int64_t k) {
    uint32_t mx = 0;
    elems(fmt(f), x + b, k, &scale, true, nullptr, nullptr, out + b, &mx);
    return mx;
  }));
}
}  // namespace

float fp8_scaled_to_bf16_amax(Fp8Format f, const float* x, float scale, uint16_t* out, int64_t n) {
  return scaled_to_bf16_amax(f, x, scale, out, n);
}

float fp8_scaled_to_bf16_amax(Fp8Format f, const uint16_t* x, float scale, uint16_t* out,
                              int64_t n) {
  return scaled_to_bf16_amax(f, x, scale, out, n);
}

namespace {

// Per-thread scratch of the along-rows blocking (grown, never freed: no allocation per call).
struct ColScratch {
  std::vector<uint32_t> mx;
  std::vector<float> mult, X;
};
ColScratch& col_scratch(int64_t C) {
  thread_local ColScratch s;
  if (s.mx.size() < size_t(C)) {
    s.mx.resize(size_t(C));
    s.mult.resize(size_t(C));
    s.X.resize(size_t(C));
  }
  return s;
}

#if defined(__x86_64__)
// The MX fast path. For a block of shared exponent k (X = 2^k) the reference computes
// v = x * 2^-k, rounds v to fp8 (integer RNE in the normal range, the magic-number addition in
// the subnormal range, saturation at the max normal) and returns r * 2^k. Where |k| <= 100,
// every non-zero result is at least the subnormal quantum times 2^k >= 2^-116 and the magic
// number times 2^k at most 2^114 (normal fp32s), so each of those steps commutes with the exact
// scaling by 2^k: rounding x itself against the thresholds and the magic number times 2^k (k
// added to their exponent fields) gives the same bits. An input or product below fp32's normal
// range (or flushed by DAZ/FTZ) rounds to a signed zero either way: it lies far below half a
// quantum. Two multiplies, the flush of tiny results and the NaN lanes (a non-finite block has
// the NaN scale, not an ordinary one) go.
constexpr int kMxFastMaxK = 100;

// The fast path's per-lane constants from the lanes' block amaxes (fp32 bits).
struct MxScaled {
  __m512i max_bits, minnorm_bits;
  __m512 magic;
};

LOOM_AVX512 inline MxScaled mx_scaled(const Fmt& F, Fp8Format f, __m512i amax) {
  const __m512i k = _mm512_slli_epi32(
      _mm512_sub_epi32(_mm512_srli_epi32(amax, 23), _mm512_set1_epi32(127 + fp8_emax(f))), 23);
  return {_mm512_add_epi32(k, _mm512_set1_epi32(int(F.max_bits))),
          _mm512_add_epi32(k, _mm512_set1_epi32(int(F.minnorm_bits))),
          _mm512_castsi512_ps(_mm512_add_epi32(k, _mm512_set1_epi32(int(F.magic_bits))))};
}

// The lanes whose block amax gives |k| <= kMxFastMaxK (a non-finite amax does not).
LOOM_AVX512 inline __mmask16 mx_ordinary(Fp8Format f, __m512i amax) {
  const int k0 = 127 + fp8_emax(f);  // the exponent field of an amax giving k = 0
  const uint32_t lowest = uint32_t(k0 - kMxFastMaxK) << 23, past = uint32_t(k0 + kMxFastMaxK + 1)
                                                                   << 23;
  return _mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(int(lowest))) &
         _mm512_cmplt_epu32_mask(amax, _mm512_set1_epi32(int(past)));
}

// elems16's deq for blocks of ordinary scales (see kMxFastMaxK).
LOOM_AVX512 inline void mx_elems16_ordinary(const Fmt& F, __m512 x, const MxScaled& S,
                                            __mmask16 lanes, uint16_t* deq) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(int(kAbs)));
  const __m512i sign = _mm512_xor_si512(u, a);
  const __mmask16 big = _mm512_cmpge_epu32_mask(a, S.max_bits);
  const __mmask16 sub = _mm512_cmplt_epu32_mask(a, S.minnorm_bits);
  const __m512i half = _mm512_set1_epi32(int((1u << (F.shift - 1)) - 1u));
  const __m512i keep = _mm512_set1_epi32(int(~((1u << F.shift) - 1u)));
  const __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(a, unsigned(F.shift)), _mm512_set1_epi32(1));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(a, _mm512_add_epi32(half, lsb)), keep);
  const __m512 s = _mm512_add_ps(_mm512_castsi512_ps(a), S.magic);
  r = _mm512_mask_mov_epi32(r, sub, _mm512_castps_si512(_mm512_sub_ps(s, S.magic)));
  r = _mm512_mask_mov_epi32(r, big, S.max_bits);
  const __m512i d = _mm512_srli_epi32(_mm512_or_si512(r, sign), 16);
  _mm256_mask_storeu_epi16(deq, lanes, _mm512_cvtepi32_epi16(d));
}

// The max of v's lanes in every lane.
LOOM_AVX512 inline __m512i all_lanes_max_epu32(__m512i v) {
  v = _mm512_max_epu32(v, _mm512_shuffle_i32x4(v, v, 0x4E));
  v = _mm512_max_epu32(v, _mm512_shuffle_i32x4(v, v, 0xB1));
  v = _mm512_max_epu32(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  return _mm512_max_epu32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
}

// bf16 inputs on the fast path, 32 lanes of 16 bits: a bf16 is the top half of an fp32 whose
// low half is zero, so mx_elems16_ordinary's integer rounding, thresholds and saturation apply
// to the halves unchanged (half an ulp minus one, the kept bits and k shifted down by 16). Its
// magic-number addition (non-zero lanes in fp8's subnormal range) does not: where a row of 32
// has such a lane the caller runs them through mx_elems16_ordinary instead (false returned).
// Zeros round to zero on the integer path too.
struct MxScaledBf16 {
  __m512i max_bits, minnorm_bits;  // 16-bit lanes
};

LOOM_AVX512 inline MxScaledBf16 mx_scaled_bf16(const Fmt& F, Fp8Format f, __m512i amax) {
  const __m512i k = _mm512_slli_epi16(
      _mm512_sub_epi16(_mm512_srli_epi16(amax, 7), _mm512_set1_epi16(short(127 + fp8_emax(f)))), 7);
  return {_mm512_add_epi16(k, _mm512_set1_epi16(short(F.max_bits >> 16))),
          _mm512_add_epi16(k, _mm512_set1_epi16(short(F.minnorm_bits >> 16)))};
}

LOOM_AVX512 inline __mmask32 mx_ordinary_bf16(Fp8Format f, __m512i amax) {
  const int k0 = 127 + fp8_emax(f);
  return _mm512_cmpge_epu16_mask(amax, _mm512_set1_epi16(short((k0 - kMxFastMaxK) << 7))) &
         _mm512_cmplt_epu16_mask(amax, _mm512_set1_epi16(short((k0 + kMxFastMaxK + 1) << 7)));
}

LOOM_AVX512 inline bool mx_elems32_bf16_ordinary(const Fmt& F, __m512i u, const MxScaledBf16& S,
                                                 __mmask32 lanes, uint16_t* deq) {
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi16(0x7fff));
  // non-zero and below the normal range: a - 1 < minnorm - 1 (zero wraps past it)
  if (_mm512_mask_cmplt_epu16_mask(lanes, _mm512_sub_epi16(a, one),
                                   _mm512_sub_epi16(S.minnorm_bits, one)))
    return false;
  const unsigned shift = unsigned(F.shift - 16);
  const __m512i half = _mm512_set1_epi16(short((1u << (shift - 1)) - 1u));
  const __m512i keep = _mm512_set1_epi16(short(~((1u << shift) - 1u)));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, shift), one);
  __m512i r = _mm512_and_si512(_mm512_add_epi16(a, _mm512_add_epi16(half, lsb)), keep);
  r = _mm512_mask_mov_epi16(r, _mm512_cmpge_epu16_mask(a, S.max_bits), S.max_bits);
  _mm512_mask_storeu_epi16(deq, lanes, _mm512_or_si512(r, _mm512_xor_si512(u, a)));
  return true;
}

// 32 bf16 lanes through mx_elems16_ordinary, with their blocks' amaxes (16-bit lanes).
LOOM_AVX512 inline void mx_elems32_bf16_widened(const Fmt& F, Fp8Format f, __m512i u, __m512i amax,
                                                __mmask32 lanes, uint16_t* deq) {
  for (int h = 0; h < 2; ++h) {
    const __mmask16 l = static_cast<__mmask16>(lanes >> (16 * h));
    if (!l) continue;
    const __m256i uh = h ? _mm512_extracti64x4_epi64(u, 1) : _mm512_castsi512_si256(u);
    const __m256i ah = h ? _mm512_extracti64x4_epi64(amax, 1) : _mm512_castsi512_si256(amax);
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(uh), 16));
    const __m512i a32 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(ah), 16);
    mx_elems16_ordinary(F, x, mx_scaled(F, f, a32), l, deq + 16 * h);
  }
}

// The max of v's 16-bit lanes in every lane.
LOOM_AVX512 inline __m512i all_lanes_max_epu16(__m512i v) {
  v = _mm512_max_epu16(v, _mm512_shuffle_i32x4(v, v, 0x4E));
  v = _mm512_max_epu16(v, _mm512_shuffle_i32x4(v, v, 0xB1));
  v = _mm512_max_epu16(v, _mm512_shuffle_epi32(v, _MM_PERM_BADC));
  v = _mm512_max_epu16(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB));
  return _mm512_max_epu16(v, _mm512_rol_epi32(v, 16));
}

// A block of k <= 32 bf16 values along a row on the fast path; false (nothing written) where
// its scale is not ordinary.
LOOM_AVX512 inline bool mx_row_block_bf16(const Fmt& F, Fp8Format f, const uint16_t* x, int k,
                                          uint16_t* deq) {
  const __mmask32 lanes = k >= 32 ? ~__mmask32{0} : (__mmask32{1} << k) - 1u;
  const __m512i u = _mm512_maskz_loadu_epi16(lanes, x);
  const __m512i amax = all_lanes_max_epu16(_mm512_and_si512(u, _mm512_set1_epi16(0x7fff)));
  if (!(mx_ordinary_bf16(f, amax) & 1u)) return false;
  if (!mx_elems32_bf16_ordinary(F, u, mx_scaled_bf16(F, f, amax), lanes, deq))
    mx_elems32_bf16_widened(F, f, u, amax, lanes, deq);
  return true;
}

// 32 columns c0.. of an along-rows block of bf16 values (rows r0..r1, their amaxes `amax`) on
// the fast path; false (nothing written) where a column's scale is not ordinary.
LOOM_AVX512 inline bool mx_col_block_bf16(const Fmt& F, Fp8Format f, const uint16_t* x, int64_t r0,
                                          int64_t r1, int64_t c0, int64_t C, int ld, __m512i amax,
                                          uint16_t* deq) {
  const int64_t k = std::min<int64_t>(32, C - c0);
  const __mmask32 lanes = k >= 32 ? ~__mmask32{0} : (__mmask32{1} << k) - 1u;
  if ((mx_ordinary_bf16(f, amax) & lanes) != lanes) return false;
  const MxScaledBf16 S = mx_scaled_bf16(F, f, amax);
  for (int64_t r = r0; r < r1; ++r) {
    const __m512i u = _mm512_maskz_loadu_epi16(lanes, x + r * ld + c0);
    if (!mx_elems32_bf16_ordinary(F, u, S, lanes, deq + r * C + c0))
      mx_elems32_bf16_widened(F, f, u, amax, lanes, deq + r * C + c0);
  }
  return true;
}

// The largest |x| of each column over rows [r0, r1) (as x's bits), read row by row: the
// block's rows stream from memory once, and its second pass, down 32 rows at a time, finds
// them in cache (reading down the rows first stalled on 32 streams at once).
template <typename In>
LOOM_AVX512 void col_amax_avx512(const In* x, int64_t r0, int64_t r1, int64_t C, int ld, In* amax) {
  constexpr int64_t kLanes = 64 / sizeof(In);
  std::fill(amax, amax + C, In(0));
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
      const int64_t k = std::min(kLanes, C - c0);
      if constexpr (std::is_same_v<In, uint16_t>) {
        const __mmask32 lanes = k >= 32 ? ~__mmask32{0} : (__mmask32{1} << k) - 1u;
        const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(lanes, x + r * ld + c0),
                                           _mm512_set1_epi16(0x7fff));
        _mm512_mask_storeu_epi16(amax + c0, lanes,
                                 _mm512_max_epu16(v, _mm512_maskz_loadu_epi16(lanes, amax + c0)));
      } else {
        const __mmask16 lanes = static_cast<__mmask16>((1u << k) - 1u);
        const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(lanes, x + r * ld + c0),
                                           _mm512_set1_epi32(int(kAbs)));
        _mm512_mask_storeu_epi32(amax + c0, lanes,
                                 _mm512_max_epu32(v, _mm512_maskz_loadu_epi32(lanes, amax + c0)));
      }
    }
}

// Room for C column amaxes and a whole register past the last 32-column chunk start.
template <typename In>
In* col_amax_scratch(int64_t C) {
  thread_local std::vector<In> v;  // (grown, never freed: no allocation per call)
  const size_t n = size_t((C + 31) / 32 * 32);
  if (v.size() < n) v.resize(n);
  return v.data();
}

// mx_row_blocks with each block of 32 held in two registers: its amax, scale and elements
// without a round trip through memory (ordinary blocks on the fast path, the others with the
// reference's operations: the same bits as the portable loop either way).
template <typename In>
LOOM_AVX512 void mx_row_blocks_avx512(const Fmt& F, Fp8Format f, const In* x, int64_t r0,
                                      int64_t r1, int cols, int ld, uint8_t* scales, uint8_t* codes,
                                      uint16_t* deq) {
  const __m512i abs = _mm512_set1_epi32(int(kAbs));
  const int64_t C = cols;
  const int nb = (cols + 31) / 32;
  const bool fast = deq != nullptr && codes == nullptr;
  for (int64_t r = r0; r < r1; ++r)
    for (int b = 0; b < nb; ++b) {
      const int c0 = b * 32, k = std::min(32, cols - c0);
      const __mmask16 l0 = static_cast<__mmask16>(k >= 16 ? 0xFFFFu : (1u << k) - 1u);
      const __mmask16 l1 = static_cast<__mmask16>(k >= 32  ? 0xFFFFu
                                                  : k > 16 ? (1u << (k - 16)) - 1u
                                                           : 0u);
      const In* xr = x + r * ld + c0;
      const int64_t o = r * C + c0;
      if constexpr (std::is_same_v<In, uint16_t>)
        if (fast && scales == nullptr && mx_row_block_bf16(F, f, xr, k, deq + o)) continue;
      const __m512 v0 = load16(xr, l0), v1 = load16(xr + 16, l1);
      const __m512i amax =
          all_lanes_max_epu32(_mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(v0), abs),
                                               _mm512_and_si512(_mm512_castps_si512(v1), abs)));
      const uint32_t a = uint32_t(_mm_cvtsi128_si32(_mm512_castsi512_si128(amax)));
      if (scales) scales[r * nb + b] = e8m0_block_scale(bits_f32(a), f);
      if (fast && (mx_ordinary(f, amax) & 1u)) {
        const MxScaled S = mx_scaled(F, f, amax);
        mx_elems16_ordinary(F, v0, S, l0, deq + o);
        if (l1) mx_elems16_ordinary(F, v1, S, l1, deq + o + 16);
        continue;
      }
      float mult, X;
      block_factors(e8m0_block_scale(bits_f32(a), f), &mult, &X);
      const __m512 mv = _mm512_set1_ps(mult), Xv = _mm512_set1_ps(X);
      elems16(F, v0, mv, Xv, true, l0, codes ? codes + o : nullptr, deq ? deq + o : nullptr);
      if (l1)
        elems16(F, v1, mv, Xv, true, l1, codes ? codes + o + 16 : nullptr,
                deq ? deq + o + 16 : nullptr);
    }
}

// mx_col_blocks with the column amaxes first (col_amax_avx512), then 16 columns at a time (32
// bf16 columns on their fast path), each row of them from cache with per-lane constants.
template <typename In>
LOOM_AVX512 void mx_col_blocks_avx512(const Fmt& F, Fp8Format f, const In* x, int64_t b, int64_t R,
                                      int cols, int ld, uint8_t* scales, uint8_t* codes,
                                      uint16_t* deq) {
  const int64_t C = cols, r0 = b * 32, r1 = std::min(R, r0 + 32);
  const bool fast = deq != nullptr && codes == nullptr;
  In* col_amax = col_amax_scratch<In>(C);
  col_amax_avx512(x, r0, r1, C, ld, col_amax);
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    if constexpr (std::is_same_v<In, uint16_t>)
      if (fast && scales == nullptr && c0 % 32 == 0 &&
          mx_col_block_bf16(F, f, x, r0, r1, c0, C, ld, _mm512_loadu_si512(col_amax + c0), deq)) {
        c0 += 16;  // 32 columns done
        continue;
      }
    const int64_t k = std::min<int64_t>(16, C - c0);
    const __mmask16 lanes = static_cast<__mmask16>((1u << k) - 1u);
    const __m512i amax = _mm512_castps_si512(load16(col_amax + c0, lanes));
    alignas(64) uint32_t a[16];
    _mm512_store_si512(a, amax);
    if (scales)
      for (int64_t j = 0; j < k; ++j) scales[b * C + c0 + j] = e8m0_block_scale(bits_f32(a[j]), f);
    if (fast && (mx_ordinary(f, amax) & lanes) == lanes) {
      const MxScaled S = mx_scaled(F, f, amax);
      for (int64_t r = r0; r < r1; ++r)
        mx_elems16_ordinary(F, load16(x + r * ld + c0, lanes), S, lanes, deq + r * C + c0);
      continue;
    }
    alignas(64) float mult[16], X[16];
    for (int j = 0; j < 16; ++j)
      block_factors(e8m0_block_scale(bits_f32(a[j]), f), &mult[j], &X[j]);
    const __m512 mv = _mm512_load_ps(mult), Xv = _mm512_load_ps(X);
    for (int64_t r = r0; r < r1; ++r)
      elems16(F, load16(x + r * ld + c0, lanes), mv, Xv, true, lanes,
              codes ? codes + r * C + c0 : nullptr, deq ? deq + r * C + c0 : nullptr);
  }
}
#endif

// Rows [r0, r1) of x with blocks of 32 along the columns (mx_quantize, along_rows = false).
template <typename In>
void mx_row_blocks(Fp8Format f, const In* x, int64_t r0, int64_t r1, int cols, int ld,
                   uint8_t* scales, uint8_t* codes, uint16_t* deq) {
  const Fmt& F = fmt(f);
#if defined(__x86_64__)
  if (avx512()) return mx_row_blocks_avx512(F, f, x, r0, r1, cols, ld, scales, codes, deq);
#endif
  const int64_t C = cols;
  const int nb = (cols + 31) / 32;
  float mult[32], X[32];
  for (int64_t r = r0; r < r1; ++r)
    for (int b = 0; b < nb; ++b) {
      const int c0 = b * 32, k = std::min(32, cols - c0);
      const In* xr = x + r * ld + c0;
      const uint8_t s = e8m0_block_scale(bits_f32(amax_bits(xr, k)), f);
      if (scales) scales[r * nb + b] = s;
      block_factors(s, &mult[0], &X[0]);
      std::fill(X + 1, X + k, X[0]);
      elems(F, xr, k, mult, true, X, codes ? codes + r * C + c0 : nullptr,
            deq ? deq + r * C + c0 : nullptr);
    }
}

// Block b of 32 rows with blocks along the rows (mx_quantize, along_rows = true): per column
// amaxes over the block's rows, then each row of the block with per-column factors (vector
// loops run along the contiguous columns).
template <typename In>
void mx_col_blocks(Fp8Format f, const In* x, int64_t b, int64_t R, int cols, int ld,
                   uint8_t* scales, uint8_t* codes, uint16_t* deq) {
  const Fmt& F = fmt(f);
#if defined(__x86_64__)
  if (avx512()) return mx_col_blocks_avx512(F, f, x, b, R, cols, ld, scales, codes, deq);
#endif
  const int64_t C = cols;
  ColScratch& cs = col_scratch(C);
  uint32_t* mx = cs.mx.data();
  std::fill(mx, mx + C, 0u);
  const int64_t r0 = b * 32, r1 = std::min(R, r0 + 32);
  for (int64_t r = r0; r < r1; ++r) {
    const In* xr = x + r * ld;
    for (int64_t c = 0; c < C; ++c) mx[c] = std::max(mx[c], f32_bits(in_f32(xr[c])) & kAbs);
  }
  for (int64_t c = 0; c < C; ++c) {
    const uint8_t s = e8m0_block_scale(bits_f32(mx[c]), f);
    if (scales) scales[b * C + c] = s;
    block_factors(s, &cs.mult[size_t(c)], &cs.X[size_t(c)]);
  }
  for (int64_t r = r0; r < r1; ++r)
    elems(F, x + r * ld, C, cs.mult.data(), false, cs.X.data(), codes ? codes + r * C : nullptr,
          deq ? deq + r * C : nullptr);
}

template <typename In>
void mx_quantize_impl(Fp8Format f, const In* x, int rows, int cols, int ld, bool along_rows,
                      uint8_t* scales, uint8_t* codes, uint16_t* deq) {
  const int64_t R = rows, C = cols;
  if (!along_rows) {
#pragma omp parallel for schedule(static) if (worth_parallel(R, C))
    for (int64_t r = 0; r < R; ++r) mx_row_blocks(f, x, r, r + 1, cols, ld, scales, codes, deq);
    return;
  }
  const int64_t nb = (R + 31) / 32;
#pragma omp parallel for schedule(static) if (worth_parallel(R, C))
  for (int64_t b = 0; b < nb; ++b) mx_col_blocks(f, x, b, R, cols, ld, scales, codes, deq);
}

// Both blockings of x, stripe by stripe of 32 rows: the stripe is read from memory once and
// from cache for the second blocking.
template <typename In>
void mx_both_impl(Fp8Format f, const In* x, int rows, int cols, uint16_t* deq_cols,
                  uint16_t* deq_rows) {
  const int64_t R = rows, C = cols, nb = (R + 31) / 32;
#pragma omp parallel for schedule(static) if (worth_parallel(R, C))
  for (int64_t b = 0; b < nb; ++b) {
    mx_col_blocks(f, x, b, R, cols, cols, nullptr, nullptr, deq_rows);
    mx_row_blocks(f, x, b * 32, std::min(R, b * 32 + 32), cols, cols, nullptr, nullptr, deq_cols);
  }
}

}  // namespace

void mx_quantize(Fp8Format f, const float* x, int rows, int cols, int ld, bool along_rows,
                 uint8_t* scales, uint8_t* codes, uint16_t* deq) {
  mx_quantize_impl(f, x, rows, cols, ld, along_rows, scales, codes, deq);
}

void mx_quantize(Fp8Format f, const uint16_t* x, int rows, int cols, int ld, bool along_rows,
                 uint8_t* scales, uint8_t* codes, uint16_t* deq) {
  mx_quantize_impl(f, x, rows, cols, ld, along_rows, scales, codes, deq);
}

void mx_quantize_both(Fp8Format f, const float* x, int rows, int cols, uint16_t* deq_cols,
                      uint16_t* deq_rows) {
  mx_both_impl(f, x, rows, cols, deq_cols, deq_rows);
}

void mx_quantize_both(Fp8Format f, const uint16_t* x, int rows, int cols, uint16_t* deq_cols,
                      uint16_t* deq_rows) {
  mx_both_impl(f, x, rows, cols, deq_cols, deq_rows);
}

void force_fp8_portable(bool force) {
  g_force_portable.store(force, std::memory_order_relaxed);
}

bool fp8_uses_avx512() {
  return avx512();
}

}  // namespace loom::cpu
