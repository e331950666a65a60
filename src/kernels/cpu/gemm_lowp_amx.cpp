#include "kernels/cpu/gemm_lowp_amx.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm_lowp.h"

namespace loom::cpu {
namespace {

#define LOOM_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,amx-tile,amx-bf16")))

bool cpu_has_amx() {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx512f && f.avx512bw && f.avx512vbmi && f.avx512bf16 && f.amx_tile && f.amx_bf16))
    return false;
  // Linux hands a process the tile state (8 KB per thread) only when asked; it refuses where the
  // kernel or the hypervisor does not support it.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}
// LOOM_LOWP_AMX=0 in the environment keeps the tile path off (A/B runs of one binary).
bool amx_available() {
  static const bool available = [] {
    const char* env = std::getenv("LOOM_LOWP_AMX");
    return !(env && std::string_view(env) == "0") && cpu_has_amx();
  }();
  return available;
}
std::atomic<bool> g_amx_off{false};

// The zero-masked forms of some intrinsics: GCC 12 warns that the plain ones read an undefined
// register.
constexpr __mmask16 kAll = 0xFFFF;

// Tiles: 0, 1 the sums of two blocks of 16 weight rows (rows x Mb fp32: y transposed); 2, 3 those
// blocks' weights (rows x 32 bf16); 4, 5, 6 the three parts of the inputs for 32 k (16 pairs of
// k x Mb inputs, each pair one 32-bit element, as the tile unit pairs them).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

LOOM_AMX_TARGET void configure_tiles(int rows, int Mb) {
  TileConfig cfg;
  for (int t : {0, 1}) cfg.rows[t] = uint8_t(rows), cfg.colsb[t] = uint16_t(Mb * 4);
  for (int t : {2, 3}) cfg.rows[t] = uint8_t(rows), cfg.colsb[t] = 64;
  for (int t : {4, 5, 6}) cfg.rows[t] = 16, cfg.colsb[t] = uint16_t(Mb * 4);
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes: make every store happen.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// x rows [0, Mb) (each K floats) as three bf16 parts in the tile unit's pair layout: part p,
// pair r (k = 2r, 2r + 1), input m is the 32-bit word at xv[p * K / 2 * Mb + r * Mb + m], low half
// k = 2r. Each part is the truncation to bf16 of what the earlier parts left, so x = x1 + x2 + x3
// exactly (the differences are exact: a truncation has the value's sign and exponent). Pairs
// [r0, r1) only (the threads split them).
LOOM_AMX_TARGET void split_inputs(uint32_t* xv, const float* x, int Mb, int K, int r0, int r1) {
  const int64_t part = int64_t(K / 2) * Mb;
  const __mmask16 in = __mmask16((1u << Mb) - 1);
  const __m512i at =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(K));
  const __m512i top = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  for (int r = r0; r < r1; ++r) {
    __m512 lo = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, at, x + 2 * r, 4);
    __m512 hi = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, at, x + 2 * r + 1, 4);
    for (int p = 0; p < 3; ++p) {
      const __m512i tlo = _mm512_and_si512(_mm512_castps_si512(lo), top);
      const __m512i thi = _mm512_and_si512(_mm512_castps_si512(hi), top);
      _mm512_mask_storeu_epi32(xv + p * part + int64_t(r) * Mb, in,
                               _mm512_or_si512(thi, _mm512_maskz_srli_epi32(kAll, tlo, 16)));
      lo = _mm512_sub_ps(lo, _mm512_castsi512_ps(tlo));
      hi = _mm512_sub_ps(hi, _mm512_castsi512_ps(thi));
    }
  }
}

// int8 rows as bf16 (every value in [-128, 127] is exact).
LOOM_AMX_TARGET void to_bf16(uint16_t* dst, const int8_t* src, int64_t n) {
  for (int64_t k = 0; k < n; k += 32) {
    const __m512 f0 = _mm512_maskz_cvtepi32_ps(
        kAll, _mm512_maskz_cvtepi8_epi32(
                  kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
    const __m512 f1 = _mm512_maskz_cvtepi32_ps(
        kAll, _mm512_maskz_cvtepi8_epi32(
                  kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k + 16))));
    _mm512_storeu_si512(dst + k, (__m512i)_mm512_cvtne2ps_pbh(f1, f0));
  }
}

// E4M3 codes as bf16 (every E4M3 value is exact): a code's magnitude looks up the low and high
// byte of its bf16 bits (vpermi2b reads 7 index bits), the sign is OR-ed in, and two byte
// permutes interleave them into words in the codes' order.
struct Fp8Bf16Tables {
  alignas(64) uint8_t lo[128], hi[128];
  alignas(64) uint8_t interleave[2][64];  // words (lo, hi) of codes [0, 32), then [32, 64)
  Fp8Bf16Tables() {
    for (int c = 0; c < 128; ++c) {
      // 0x7F (NaN, never written by quantize_fp8_rows) reads as 480, as the GEMV reads it.
      const float v = c == 0x7F ? 480.f : fp8_decode(Fp8Format::E4M3, uint8_t(c));
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      lo[c] = uint8_t(bits >> 16);
      hi[c] = uint8_t(bits >> 24);
    }
    for (int half = 0; half < 2; ++half)
      for (int q = 0; q < 64; ++q) interleave[half][q] = uint8_t(32 * half + q / 2 + 64 * (q % 2));
  }
};

LOOM_AMX_TARGET void to_bf16(uint16_t* dst, const uint8_t* src, int64_t n) {
  static const Fp8Bf16Tables t;
  const __m512i lo0 = _mm512_load_si512(t.lo), lo1 = _mm512_load_si512(t.lo + 64);
  const __m512i hi0 = _mm512_load_si512(t.hi), hi1 = _mm512_load_si512(t.hi + 64);
  const __m512i mix0 = _mm512_load_si512(t.interleave[0]);
  const __m512i mix1 = _mm512_load_si512(t.interleave[1]);
  const __m512i sign = _mm512_set1_epi8(int8_t(0x80));
  int64_t k = 0;
  for (; k + 64 <= n; k += 64) {
    const __m512i c = _mm512_loadu_si512(src + k);
    const __m512i l = _mm512_permutex2var_epi8(lo0, c, lo1);
    const __m512i h =
        _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, c, hi1), c, sign, 0xF8);
    _mm512_storeu_si512(dst + k, _mm512_permutex2var_epi8(l, mix0, h));
    _mm512_storeu_si512(dst + k + 32, _mm512_permutex2var_epi8(l, mix1, h));
  }
  for (; k < n; ++k) {  // (K is a multiple of 32, not always of 64)
    const uint8_t c = src[k];
    dst[k] = uint16_t((t.hi[c & 0x7F] | (c & 0x80)) << 8 | t.lo[c & 0x7F]);
  }
}

// Weight rows [n0, n1) of y for inputs [m0, m0 + Mb): blocks of 32 rows (two sum tiles sharing
// each input tile), then one of 16, then the last rows. Per element the tile unit adds the
// products k = 0, 1, 2, ... of part 1, then part 2, then part 3 for each 32 k in turn: a fixed
// order whatever Mb, the rows' block or the thread.
template <typename W>
LOOM_AMX_TARGET void tile_rows(float* y, const uint32_t* xv, int Mb, int m0, const W* w,
                               const float* scale, const float* b, int K, int N, int n0, int n1) {
  const int64_t part = int64_t(K / 2) * Mb;
  const long xstride = long(Mb) * 4, wstride = long(K) * 2;
  static thread_local std::vector<uint16_t> widened;  // int8 and fp8 rows as bf16
  if constexpr (!std::is_same_v<W, uint16_t>) widened.resize(size_t(32) * K);
  alignas(64) float sums[16][16];
  const auto finish = [&](int n, int rows) {
    for (int i = 0; i < rows; ++i)
      for (int m = 0; m < Mb; ++m) {
        float v = sums[i][m];
        if (scale) v *= scale[n + i];
        y[int64_t(m0 + m) * N + n + i] = v + (b ? b[n + i] : 0.f);
      }
  };
  int configured = 0;
  for (int n = n0; n < n1;) {
    const int rows = std::min(16, n1 - n);
    const bool two = n1 - n >= 32;
    if (rows != configured) configure_tiles(rows, Mb), configured = rows;
    const uint16_t* a;
    if constexpr (std::is_same_v<W, uint16_t>) {
      a = w + int64_t(n) * K;
    } else {
      to_bf16(widened.data(), w + int64_t(n) * K, int64_t(two ? 32 : rows) * K);
      a = widened.data();
    }
    _tile_zero(0);
    _tile_zero(1);
    // The next 32 rows (contiguous after these) are fetched into L2 while these are multiplied,
    // spread over the steps: without it every block's first loads (the tile loads of bf16
    // weights, the widening loads of int8 and fp8) wait for memory with nothing else in flight.
    // (As an integer: past the matrix's last rows the address is only a hint, never a pointer.)
    const uintptr_t next = reinterpret_cast<uintptr_t>(w + int64_t(n) * K) +
                           uintptr_t(two ? 32 : rows) * uintptr_t(K) * sizeof(W);
    constexpr int kStepLines = 16 * int(sizeof(W));  // 32 rows x 32 weights per step
    for (int k = 0; k < K; k += 32) {
      for (int j = 0; j < kStepLines; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(next + uintptr_t(k) * 32 * sizeof(W) + 64 * j),
                     _MM_HINT_T1);
      const uint32_t* xk = xv + int64_t(k / 2) * Mb;
      _tile_loadd(4, xk, xstride);
      _tile_loadd(5, xk + part, xstride);
      _tile_loadd(6, xk + 2 * part, xstride);
      _tile_loadd(2, a + k, wstride);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(0, 2, 5);
      _tile_dpbf16ps(0, 2, 6);
      if (two) {
        _tile_loadd(3, a + int64_t(16) * K + k, wstride);
        _tile_dpbf16ps(1, 3, 4);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(1, 3, 6);
      }
    }
    _tile_stored(0, sums, 64);
    finish(n, rows);
    if (two) {
      _tile_stored(1, sums, 64);
      finish(n + 16, 16);
    }
    n += two ? 32 : rows;
  }
  _tile_release();
}

template <typename W>
bool amx_linear(float* y, const float* x, const W* w, const float* scale, const float* b, int M,
                int K, int N) {
  if (M < kAmxMinRows || K % 32 != 0 || !lowp_uses_amx()) return false;
  static thread_local std::vector<uint32_t> xv_store;
  xv_store.resize(size_t(3) * size_t(K / 2) * 16);
  uint32_t* xv = xv_store.data();
  const bool par = int64_t(N) * K >= (int64_t(1) << 16);
  for (int m0 = 0; m0 < M; m0 += 16) {
    const int Mb = std::min(16, M - m0);
#pragma omp parallel if (par)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int pairs = K / 2;
      split_inputs(xv, x + int64_t(m0) * K, Mb, K, int(int64_t(pairs) * t / nt),
                   int(int64_t(pairs) * (t + 1) / nt));
#pragma omp barrier
      // Whole blocks of 16 rows per thread (only the last block may be short).
      const int blocks = (N + 15) / 16;
      const int n0 = 16 * int(int64_t(blocks) * t / nt);
      const int n1 = std::min(N, 16 * int(int64_t(blocks) * (t + 1) / nt));
      if (n0 < n1) tile_rows(y, xv, Mb, m0, w, scale, b, K, N, n0, n1);
    }
  }
  return true;
}

}  // namespace

bool lowp_uses_amx() {
  return !g_amx_off.load(std::memory_order_relaxed) && lowp_uses_avx512() && amx_available();
}

void set_lowp_amx(bool on) {
  g_amx_off = !on;
}

bool amx_linear_bf16w(float* y, const float* x, const uint16_t* w, const float* b, int M, int K,
                      int N) {
  return amx_linear(y, x, w, nullptr, b, M, K, N);
}

bool amx_linear_int8w(float* y, const float* x, const int8_t* w, const float* scale, const float* b,
                      int M, int K, int N) {
  return amx_linear(y, x, w, scale, b, M, K, N);
}

bool amx_linear_fp8w(float* y, const float* x, const uint8_t* w, const float* scale, const float* b,
                     int M, int K, int N) {
  return amx_linear(y, x, w, scale, b, M, K, N);
}

}  // namespace loom::cpu
