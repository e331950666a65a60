#include "kernels/cpu/paged_decode.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kv_fp8.h"
#include "kernels/cpu/lane_sums.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {

#ifdef __AVX512F__

bool paged_decode_supported(int head_dim) {
  return head_dim % 16 == 0 && head_dim >= 16 && head_dim <= 128;
}

namespace {

// Grow-only buffers of the thread that runs a range (OpenMP keeps its threads): a decode runs
// once per layer and token, and allocating them each time cost more than small ranges compute.
struct Scratch {
  std::vector<float> q, scores, acc, sum, part, mx, rs;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
float* grown(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

constexpr __mmask16 kAll = 0xFFFF;

// A row of D = 16 NV stored elements as NV fp32 vectors in the "arranged" order. fp32: as
// stored. bf16: each 64-byte load of 32 elements gives the even ones by a 16-bit shift and the
// odd ones by masking off the low halves (one instruction per 16 elements, where a 16-element
// widening takes two); the query and the value accumulators use the same order (arrange()), so
// dot products and sums are unchanged by it. An odd last 16 are widened in order. fp8 (E4M3
// codes): 2^-8 times each code's value, in order (the row's scale and the 2^8 are applied to its
// finished dot product and its value weight).
template <int NV>
inline void load_row(const float* p, __m512* x) {
  for (int i = 0; i < NV; ++i) x[i] = _mm512_loadu_ps(p + 16 * i);
}
template <int NV>
inline void load_row(const uint16_t* p, __m512* x) {
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  int i = 0;
  for (; i + 2 <= NV; i += 2) {
    const __m512i w = _mm512_loadu_si512(p + 16 * i);
    x[i] = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, w, 16));
    x[i + 1] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
  }
  if (i < NV) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * i));
    x[i] = _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
  }
}

// An E4M3 code is an fp16 number with the top exponent bit zero, the exponent rebiased from 7 to
// 15, so 2^-8 times the code's value (gemm_lowp.cpp's widening): the byte sign-extended and
// shifted left by 7 puts sign, exponent and mantissa in place (the mask clears the sign's copy
// in bit 14); the hardware's fp16 conversion is exact, subnormal codes included.
// 32 codes at a time where AVX512BW has the 512-bit word steps (the three integer steps once for
// both halves: 7 instructions per 32 codes where two 16-code widenings take 10).
template <int NV>
inline void load_row(const uint8_t* p, __m512* x) {
  int i = 0;
#ifdef __AVX512BW__
  const __m512i keep32 = _mm512_set1_epi16(int16_t(0xBFFF));
  for (; i + 2 <= NV; i += 2) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * i));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(q), 7), keep32);
    x[i] = _mm512_maskz_cvtph_ps(kAll, _mm512_maskz_extracti64x4_epi64(__mmask8(0xFF), h, 0));
    x[i + 1] = _mm512_maskz_cvtph_ps(kAll, _mm512_maskz_extracti64x4_epi64(__mmask8(0xFF), h, 1));
  }
#endif
  const __m256i keep = _mm256_set1_epi16(int16_t(0xBFFF));
  for (; i < NV; ++i) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i));
    x[i] = _mm512_maskz_cvtph_ps(
        kAll, _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(q), 7), keep));
  }
}

// Index in the arranged order of element d of a row of D (T = uint16_t: evens then odds in
// each 32; an odd last 16 in order).
template <typename T>
inline int arranged(int d, int D) {
  if constexpr (sizeof(T) != 2) {
    return d;
  } else {
    const int c = d / 32 * 32;
    if (c + 32 > D) return d;
    const int e = d - c;
    return c + (e % 2) * 16 + e / 2;
  }
}

// Prefetches rows [j0, j1) of a block (rows `lds` elements apart, `run` bytes each) a few lines
// per call of step(), spread over the loop that sums the current block: a burst of a whole
// block's worth overfills the queue of outstanding misses and stalls the loads behind it.
template <typename T>
struct Prefetcher {
  const char* row = nullptr;  // row j's first byte
  size_t stride = 0, run = 0, off = 0;
  int j = 0, j1 = 0;
  Prefetcher(const T* block, int64_t lds, size_t run_bytes, int j0, int jend)
      : row(reinterpret_cast<const char*>(block + j0 * lds)),
        stride(size_t(lds) * sizeof(T)),
        run(run_bytes),
        j(j0),
        j1(jend) {}
  void step(int lines) {
    for (int i = 0; i < lines && j < j1; ++i) {
      _mm_prefetch(row + off, _MM_HINT_T0);  // (to L2 only, _MM_HINT_T1, was slower)
      off += 64;
      if (off >= run) {
        off = 0;
        row += stride;
        ++j;
      }
    }
  }
  void finish() { step(1 << 30); }
  // Lines left for rows [j, j1).
  int lines() const { return j >= j1 ? 0 : int((j1 - j) * ((run + 63) / 64) - off / 64); }
};

// Decode reads every cached key and value once and computes little per byte: the pool is read
// a block at a time in memory order (position by position, the range's heads of a position one
// contiguous run: read head by head instead, 16 positions at a time, fp32 keys came from memory
// 10% slower), all scores of the segment first, one softmax per query head over the segment
// (no online rescaling), then the values. Scores: each (position, head) leaves a vector of partial
// products in L1, and every 16 positions of a head are reduced together (sum_lanes16). The next
// block is prefetched a few lines per row and head while this one is summed (a sequence's
// blocks need not be adjacent, and the hardware prefetcher stops at the end of each). fp8: each
// score is multiplied by its row's scale (times 2^8, load_row's factor) once its 16 positions
// are reduced, and each value weight by its row's before the weighted sum.
template <typename T, int NV>
void decode_heads(float* out, float* partial, const float* q, const PagedKvLayer& c,
                  const PagedChunk& ch, int h0, int h1, int group, float scale, int seg, int nseg) {
  constexpr int D = 16 * NV;
  const int Hkv = c.n_kv_head, bs = c.block_size;
  const int L = ch.start_pos + 1;
  // The segment: blocks [b0, b1), positions [P0, P0 + Ls).
  const int all_blocks = (L + bs - 1) / bs;
  const int b0 = all_blocks * seg / nseg, b1 = all_blocks * (seg + 1) / nseg;
  const int P0 = b0 * bs, Ls = std::min(b1 * bs, L) - P0;
  const int nh = h1 - h0, rows = nh * group;  // row r = h * group + g
  const int64_t lds = int64_t(Hkv) * D;       // elements from one position to the next
  const size_t run = size_t(nh) * D * sizeof(T);
  Scratch& s = scratch();
  float* qa = grown(s.q, size_t(rows) * D);
  float* sc = grown(s.scores, size_t(rows) * Ls);
  float* acc = grown(s.acc, size_t(rows) * D);
  float* sums = grown(s.sum, size_t(rows));
  float* part = grown(s.part, size_t(rows) * 16 * 16);  // [row][position of the tile][lane]
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + (int64_t(h0) * group + r) * D;
    for (int d = 0; d < D; ++d) qa[int64_t(r) * D + arranged<T>(d, D)] = qr[d];
  }
  const T* K = static_cast<const T*>(c.k);
  const T* V = static_cast<const T*>(c.v);
  auto block = [&](const T* pool, int b) {
    return pool + (int64_t(ch.block_table[b]) * bs * Hkv + h0) * D;
  };
  const __m512 vscale = _mm512_set1_ps(scale);
  constexpr bool kFp8 = std::is_same_v<T, uint8_t>;
  // fp8: the row scales (times 2^8) of block b's nk positions, head by head: rs[h * bs + j]
  // (16 floats of padding, so that a head's 16 may be loaded whole).
  float* rs = kFp8 ? grown(s.rs, size_t(nh) * bs + 16) : nullptr;
  auto row_scales = [&](const uint8_t* scales, int b, int nk) {
    const uint8_t* sb = scales + int64_t(ch.block_table[b]) * bs * Hkv + h0;
    for (int h = 0; h < nh; ++h)
      for (int j = 0; j < nk; ++j) rs[h * bs + j] = kv_fp8_scale(sb[j * Hkv + h], 8);
  };

  // Scores (sc[r * Ls + p - P0]).
  for (int b = b0; b < b1; ++b) {
    const int p0 = b * bs, nk = std::min(bs, L - p0);
    const T* kb = block(K, b);
    // The next block of keys; after the last, the first block of values.
    const bool last = b + 1 == b1;
    Prefetcher<T> pf(last ? block(V, b0) : block(K, b + 1), lds, run, 0,
                     last ? std::min(bs, L - P0) : std::min(bs, L - p0 - bs));
    const int per_step = (pf.lines() + nk * nh - 1) / (nk * nh);
    if constexpr (kFp8) row_scales(c.k_scale, b, nk);
    for (int t0 = 0; t0 < nk; t0 += 16) {
      const int nt = std::min(16, nk - t0);
      for (int j = 0; j < nt; ++j) {
        const T* kr = kb + (t0 + j) * lds;
        for (int h = 0; h < nh; ++h) {
          pf.step(per_step);
          __m512 x[NV];
          load_row<NV>(kr + int64_t(h) * D, x);
          for (int g = 0; g < group; ++g) {
            const int r = h * group + g;
            const float* qr = qa + int64_t(r) * D;
            __m512 p = _mm512_mul_ps(_mm512_loadu_ps(qr), x[0]);
            for (int i = 1; i < NV; ++i) p = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * i), x[i], p);
            _mm512_storeu_ps(part + (int64_t(r) * 16 + j) * 16, p);
          }
        }
      }
      for (int r = 0; r < rows; ++r) {
        __m512 v[16];
        for (int j = 0; j < 16; ++j)
          v[j] = j < nt ? _mm512_loadu_ps(part + (int64_t(r) * 16 + j) * 16) : _mm512_setzero_ps();
        __m512 scores = _mm512_mul_ps(sum_lanes16(v), vscale);
        if constexpr (kFp8)
          scores = _mm512_mul_ps(scores, _mm512_loadu_ps(rs + (r / group) * bs + t0));
        _mm512_mask_storeu_ps(sc + int64_t(r) * Ls + p0 - P0 + t0, __mmask16((1u << nt) - 1),
                              scores);
      }
    }
    pf.finish();
  }
  // Softmax weights, unnormalised (divided by their sum at the end); a segment's maximum and
  // sum are kept for the merge.
  float* mx = grown(s.mx, size_t(rows));
  for (int r = 0; r < rows; ++r) {
    float* w = sc + int64_t(r) * Ls;
    float m = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < Ls; ++j) m = std::max(m, w[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < Ls; ++j) {
      w[j] = fast_exp(w[j] - m);
      sum += w[j];
    }
    mx[r] = m;
    sums[r] = sum;
  }
  // Values, two positions per pass over a head's accumulators (in L1).
  std::fill(acc, acc + size_t(rows) * D, 0.0f);
  for (int b = b0; b < b1; ++b) {
    const int p0 = b * bs, nk = std::min(bs, L - p0);
    const T* vb = block(V, b);
    const bool last = b + 1 == b1;
    Prefetcher<T> pf(last ? vb : block(V, b + 1), lds, run, 0,
                     last ? 0 : std::min(bs, L - p0 - bs));
    const int steps = (nk + 1) / 2 * nh;
    const int per_step = (pf.lines() + steps - 1) / steps;
    if constexpr (kFp8) row_scales(c.v_scale, b, nk);
    for (int j = 0; j < nk; j += 2) {
      const bool pair = j + 1 < nk;
      const T* vr = vb + j * lds;
      for (int h = 0; h < nh; ++h) {
        pf.step(per_step);
        __m512 x[NV], y[NV];
        load_row<NV>(vr + int64_t(h) * D, x);
        if (pair) load_row<NV>(vr + lds + int64_t(h) * D, y);
        float vs0 = 1, vs1 = 1;  // fp8: the two rows' scales
        if constexpr (kFp8) {
          vs0 = rs[h * bs + j];
          if (pair) vs1 = rs[h * bs + j + 1];
        }
        for (int g = 0; g < group; ++g) {
          const int r = h * group + g;
          const float* w = sc + int64_t(r) * Ls + p0 - P0 + j;
          const __m512 w0 = _mm512_set1_ps(kFp8 ? w[0] * vs0 : w[0]);
          float* a = acc + int64_t(r) * D;
          if (pair) {
            const __m512 w1 = _mm512_set1_ps(kFp8 ? w[1] * vs1 : w[1]);
            for (int i = 0; i < NV; ++i)
              _mm512_storeu_ps(
                  a + 16 * i,
                  _mm512_fmadd_ps(w1, y[i],
                                  _mm512_fmadd_ps(w0, x[i], _mm512_loadu_ps(a + 16 * i))));
          } else {
            for (int i = 0; i < NV; ++i)
              _mm512_storeu_ps(a + 16 * i, _mm512_fmadd_ps(w0, x[i], _mm512_loadu_ps(a + 16 * i)));
          }
        }
      }
    }
    pf.finish();
  }
  for (int r = 0; r < rows; ++r) {
    const float* a = acc + int64_t(r) * D;
    if (partial == nullptr) {
      float* o = out + (int64_t(h0) * group + r) * D;
      const float f = 1.0f / sums[r];
      for (int d = 0; d < D; ++d) o[d] = a[arranged<T>(d, D)] * f;
    } else {
      float* p = partial + (int64_t(h0) * group + r) * (D + 2);
      p[0] = mx[r];
      p[1] = sums[r];
      for (int d = 0; d < D; ++d) p[2 + d] = a[arranged<T>(d, D)];
    }
  }
}

template <typename T>
void dispatch(float* out, float* partial, const float* q, const PagedKvLayer& c,
              const PagedChunk& ch, int h0, int h1, int group, float scale, int seg, int nseg) {
  switch (c.head_dim / 16) {
#define LOOM_DECODE_CASE(NV) \
  case NV:                   \
    return decode_heads<T, NV>(out, partial, q, c, ch, h0, h1, group, scale, seg, nseg);
    LOOM_DECODE_CASE(1)
    LOOM_DECODE_CASE(2)
    LOOM_DECODE_CASE(3)
    LOOM_DECODE_CASE(4)
    LOOM_DECODE_CASE(5)
    LOOM_DECODE_CASE(6)
    LOOM_DECODE_CASE(7)
    LOOM_DECODE_CASE(8)
#undef LOOM_DECODE_CASE
    default:
      break;
  }
}

}  // namespace

void paged_decode_heads(float* out, float* partial, const float* q, const PagedKvLayer& c,
                        const PagedChunk& ch, int h0, int h1, int group, float scale, int seg,
                        int nseg) {
  if (c.dtype == DType::F32)
    dispatch<float>(out, partial, q, c, ch, h0, h1, group, scale, seg, nseg);
  else if (c.dtype == DType::F8E4M3)
    dispatch<uint8_t>(out, partial, q, c, ch, h0, h1, group, scale, seg, nseg);
  else
    dispatch<uint16_t>(out, partial, q, c, ch, h0, h1, group, scale, seg, nseg);
}

#else

bool paged_decode_supported(int) {
  return false;
}
void paged_decode_heads(float*, float*, const float*, const PagedKvLayer&, const PagedChunk&, int,
                        int, int, float, int, int) {}

#endif

}  // namespace loom::cpu
