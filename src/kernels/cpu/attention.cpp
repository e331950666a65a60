// Causal self-attention on the CPU, FlashAttention-2 style: tile by tile with an online softmax,
// so memory stays linear in sequence length (no N x N score matrix, only per-thread tiles).
//
// Layout: a tile is kB = 64 query rows x 64 key columns. Each tile product runs through one of
// three register-blocked micro-kernels written with GCC vector extensions (zmm on AVX-512, ymm
// on AVX2), over packed, aligned copies of the tile operands:
//   mm_abt: C[r][0:64]  = sum_d A[r][d] * Bt[d][0:64]   (S = Q K^T, dP = dO V^T)
//   mm_ab:  C[r][0:Dp] += sum_k A[r][k] * B[k][0:Dp]    (O += P V, dQ += dS K)
//   mm_atb: C[r][0:Dp] += sum_k A[k][r] * B[k][0:Dp]    (dV += P^T dO, dK += dS^T Q)
// Dp is D rounded up to the vector width. Exponentials use a vectorised exp2 (scores are
// multiplied by scale * log2(e)). Tiles start at each sequence's first token, and key tiles
// right of the diagonal are skipped (fully masked).
//
// Determinism: every output element is produced by exactly one work item, which sums its terms
// in a fixed order, so results are bit-identical run to run and for any thread count. The
// backward (FlashAttention-2: P recomputed from q, k and the saved log-sum-exp) has two
// schedules that give the same bits; see "Backward" below.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace loom::cpu {
namespace {

// Floats per vector register, and rows per micro-tile (kMR x kB/VW accumulators stay in the 16
// or 32 vector registers). Without AVX the code still works, on 4-wide SSE vectors.
#if defined(__AVX512F__)
#define LOOM_ATTN_VW 16
constexpr int kMR = 4;
#elif defined(__AVX__)
#define LOOM_ATTN_VW 8
constexpr int kMR = 2;
#else
#define LOOM_ATTN_VW 4
constexpr int kMR = 1;
#endif
constexpr int VW = LOOM_ATTN_VW;
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(VW * sizeof(uint32_t))));

constexpr int kB = 64;        // query rows per tile = key columns per tile
constexpr int kNV = kB / VW;  // vectors per tile row
constexpr int kChunk = 4;     // vectors per column chunk in mm_ab
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kRescaleLog2 = 8.0f;  // forward: rescale O only when the max grows by > 2^8

inline vf load(const float* p) {
  return *reinterpret_cast<const vf*>(p);
}
inline void store(float* p, vf x) {
  *reinterpret_cast<vf*>(p) = x;
}
inline vf splat(float x) {
  return vf{} + x;
}
inline vf vmax(vf a, vf b) {
  return a > b ? a : b;
}
inline int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

// Horizontal max / sum of one vector in log2(VW) shuffle steps (a fixed order: deterministic).
inline vf swap_lanes(vf x, int step) {
#if LOOM_ATTN_VW == 16
  switch (step) {
    case 8:
      return __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4:
      return __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2:
      return __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default:
      return __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
#elif LOOM_ATTN_VW == 8
  switch (step) {
    case 4:
      return __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
    case 2:
      return __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
    default:
      return __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
  }
#else
  return step == 2 ? __builtin_shufflevector(x, x, 2, 3, 0, 1)
                   : __builtin_shufflevector(x, x, 1, 0, 3, 2);
#endif
}
inline float hmax(vf x) {
  for (int step = VW / 2; step >= 1; step /= 2) x = vmax(x, swap_lanes(x, step));
  return x[0];
}
inline float hsum(vf x) {
  for (int step = VW / 2; step >= 1; step /= 2) x += swap_lanes(x, step);
  return x[0];
}

// 2^x for x <= 127 (callers pass x <= ~8), relative error ~2e-7; exactly 0 for x < -125,
// including -inf (masked scores); NaN for NaN. No input clamp: for x < -125 the bits computed
// below are garbage, and the final select replaces them.
inline vf exp2v(vf x) {
  const vf lo = splat(-125.0f);
  const vf shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf t = x + shifter;
  const vf n = t - shifter;
  const vf r = x - n;  // in [-0.5, 0.5]
  // Taylor series of 2^r = e^(r ln2), degree 6 (truncation error < 1.2e-7 on [-0.5, 0.5]).
  vf p = splat(1.5403530393381606e-4f);
  p = p * r + splat(1.3333558146428441e-3f);
  p = p * r + splat(9.6181291076284772e-3f);
  p = p * r + splat(5.5504108664821580e-2f);
  p = p * r + splat(2.4022650695910071e-1f);
  p = p * r + splat(6.9314718055994531e-1f);
  p = p * r + splat(1.0f);
  // Unsigned lanes: the integer arithmetic wraps (well defined) on the garbage lanes.
  const vu e = ((vu)t - (vu)shifter) << 23;
  const vf y = (vf)((vu)p + e);
  return x < lo ? vf{} : (x == x ? y : x);  // NaN stays NaN
}

// The micro-kernels. Rows go kMR at a time; `causal` marks a diagonal tile (query i, key j with
// i, j counted from the tile start), where only j <= i matters: the kernels then skip the
// column vectors / reduction terms that the mask zeroes anyway, halving the diagonal's cost.

// C[r][0:kB] = sum_{d<K} A[r*lda + d] * Bt[d*kB + 0:kB] for r < rows. Causal: for each row
// group only the column vectors that hold some j <= r (the rest of C is left unwritten).
template <int NC>
void abt_rows(float* C, const float* A, int lda, const float* Bt, int K, int r0) {
  vf acc[kMR][NC] = {};
  const float* a = A + (size_t)r0 * lda;
  for (int d = 0; d < K; ++d) {
    vf b[NC];
    for (int c = 0; c < NC; ++c) b[c] = load(Bt + (size_t)d * kB + c * VW);
    for (int r = 0; r < kMR; ++r) {
      const vf av = splat(a[(size_t)r * lda + d]);
      for (int c = 0; c < NC; ++c) acc[r][c] += av * b[c];
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int c = 0; c < NC; ++c) store(C + (size_t)(r0 + r) * kB + c * VW, acc[r][c]);
}

using AbtRows = void (*)(float*, const float*, int, const float*, int, int);
template <int... I>
constexpr std::array<AbtRows, sizeof...(I)> abt_table(std::integer_sequence<int, I...>) {
  return {&abt_rows<I + 1>...};
}
constexpr auto kAbtRows = abt_table(std::make_integer_sequence<int, kNV>{});

// Columns that causal mm_abt computes for row r: whole vectors covering j <= r's row group.
inline int causal_cols(int r) {
  return std::min(kB, (r / kMR * kMR + kMR - 1) / VW * VW + VW);
}

void mm_abt(float* C, const float* A, int lda, const float* Bt, int K, int rows, bool causal) {
  for (int r0 = 0; r0 < rows; r0 += kMR)
    kAbtRows[(causal ? causal_cols(r0) : kB) / VW - 1](C, A, lda, Bt, K, r0);
}

// C[r][c0 : c0 + NV*VW] += sum_{k in [k0(r0), k1(r0))} A(r, k) * B[k*Dp + c0 ...], where A(r, k)
// is A[r*kB + k] (mm_ab) or A[k*kB + r] (mm_atb, A read transposed).
template <int NV, bool kTransA>
void ab_cols(float* C, const float* A, const float* B, int Dp, int K, int rows, int c0,
             bool causal) {
  for (int r0 = 0; r0 < rows; r0 += kMR) {
    // Causal: mm_ab (A = P or dS, [query][key]) needs keys k <= r; mm_atb (rows are keys, k
    // runs over queries) needs queries k >= r.
    const int k0 = causal && kTransA ? r0 : 0;
    const int k1 = causal && !kTransA ? std::min(K, r0 + kMR) : K;
    vf acc[kMR][NV];
    for (int r = 0; r < kMR; ++r)
      for (int c = 0; c < NV; ++c) acc[r][c] = load(C + (size_t)(r0 + r) * Dp + c0 + c * VW);
    for (int k = k0; k < k1; ++k) {
      vf b[NV];
      for (int c = 0; c < NV; ++c) b[c] = load(B + (size_t)k * Dp + c0 + c * VW);
      for (int r = 0; r < kMR; ++r) {
        const vf av = splat(kTransA ? A[(size_t)k * kB + r0 + r] : A[(size_t)(r0 + r) * kB + k]);
        for (int c = 0; c < NV; ++c) acc[r][c] += av * b[c];
      }
    }
    for (int r = 0; r < kMR; ++r)
      for (int c = 0; c < NV; ++c) store(C + (size_t)(r0 + r) * Dp + c0 + c * VW, acc[r][c]);
  }
}

template <bool kTransA>
void ab_any(float* C, const float* A, const float* B, int Dp, int K, int rows, bool causal) {
  const int nv = Dp / VW;
  int v = 0;
  for (; v + kChunk <= nv; v += kChunk)
    ab_cols<kChunk, kTransA>(C, A, B, Dp, K, rows, v * VW, causal);
  switch (nv - v) {
    case 1:
      ab_cols<1, kTransA>(C, A, B, Dp, K, rows, v * VW, causal);
      break;
    case 2:
      ab_cols<2, kTransA>(C, A, B, Dp, K, rows, v * VW, causal);
      break;
    case 3:
      ab_cols<3, kTransA>(C, A, B, Dp, K, rows, v * VW, causal);
      break;
    default:
      break;
  }
}

// C[r][0:Dp] += sum_{k<K} A[r*kB + k] * B[k*Dp + 0:Dp] for r < rows (A is a kB-wide tile).
void mm_ab(float* C, const float* A, const float* B, int Dp, int K, int rows, bool causal) {
  ab_any<false>(C, A, B, Dp, K, rows, causal);
}

// C[r][0:Dp] += sum_{k<K} A[k*kB + r] * B[k*Dp + 0:Dp] for r < rows.
void mm_atb(float* C, const float* A, const float* B, int Dp, int K, int rows, bool causal) {
  ab_any<true>(C, A, B, Dp, K, rows, causal);
}

// 64-byte aligned, zero-initialised float scratch, carved into tiles; one per thread per call.
class Scratch {
 public:
  explicit Scratch(size_t floats) : size_(floats) {
    data_ = static_cast<float*>(::operator new(floats * sizeof(float), std::align_val_t(64)));
    std::memset(data_, 0, floats * sizeof(float));
  }
  ~Scratch() { ::operator delete(data_, std::align_val_t(64)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // Next tile of n floats (n is rounded up to keep every tile 64-byte aligned).
  float* take(size_t n) {
    float* p = data_ + used_;
    used_ += (n + 15) / 16 * 16;
    if (used_ > size_) std::abort();  // a sizing bug in this file, never an input error
    return p;
  }

 private:
  float* data_;
  size_t size_, used_ = 0;
};

struct Shape {
  int ld, Hq, Hkv, D, Dp, group;
  float scale, c;  // c = scale * log2(e): scores in the exp2 domain
};

Shape check_shape(int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D, float scale,
                  const char* op) {
  LOOM_CHECK(Hq > 0 && Hkv > 0 && D > 0, op, ": bad head counts/dim Hq=", Hq, " Hkv=", Hkv,
             " D=", D);
  LOOM_CHECK(Hq % Hkv == 0, op, ": Hq=", Hq, " is not a multiple of Hkv=", Hkv);
  LOOM_CHECK(scale > 0.0f && std::isfinite(scale), op, ": scale=", scale,
             " must be positive and finite");
  LOOM_CHECK((int64_t)ld >= (int64_t)std::max(Hq, Hkv) * D, op, ": row stride ld=", ld,
             " is smaller than a head block of ", std::max(Hq, Hkv), "x", D);
  LOOM_CHECK(nseq >= 0, op, ": nseq=", nseq, " is negative");
  LOOM_CHECK(nseq == 0 || cu_seqlens != nullptr, op, ": cu_seqlens is null");
  if (nseq > 0) {
    LOOM_CHECK(cu_seqlens[0] >= 0, op, ": cu_seqlens[0]=", cu_seqlens[0], " is negative");
    for (int s = 0; s < nseq; ++s)
      LOOM_CHECK(cu_seqlens[s + 1] >= cu_seqlens[s], op, ": cu_seqlens decreases at index ", s + 1,
                 " (", cu_seqlens[s], " -> ", cu_seqlens[s + 1], ")");
  }
  return Shape{ld, Hq, Hkv, D, round_up(D, VW), Hq / Hkv, scale, scale * kLog2e};
}

// One unit of parallel work: tile `blk` of sequence `seq` for head `h` (a query head, or a kv
// head for dK/dV items).
struct Item {
  int seq, h, blk;
};

// Sequences with tokens, longest first (so the dynamic schedule ends balanced).
std::vector<int> longest_first(const int32_t* cu, int nseq) {
  std::vector<int> order;
  for (int s = 0; s < nseq; ++s)
    if (cu[s + 1] > cu[s]) order.push_back(s);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return cu[x + 1] - cu[x] > cu[y + 1] - cu[y]; });
  return order;
}

// Items ordered so a thread's consecutive items share a (sequence, kv head), reusing its
// KvPanel; tiles run from the most expensive down (`cost_grows_with_blk`: causal query tiles
// cost more further right, dK/dV key tiles less).
std::vector<Item> make_items(const int32_t* cu, int nseq, int heads, bool cost_grows_with_blk) {
  std::vector<Item> items;
  for (int s : longest_first(cu, nseq)) {
    const int nb = (cu[s + 1] - cu[s] + kB - 1) / kB;
    for (int h = 0; h < heads; ++h)
      for (int b = 0; b < nb; ++b) items.push_back({s, h, cost_grows_with_blk ? nb - 1 - b : b});
  }
  return items;
}

int max_len(const int32_t* cu, int nseq) {
  int m = 0;
  for (int s = 0; s < nseq; ++s) m = std::max(m, cu[s + 1] - cu[s]);
  return m;
}

// 64-byte aligned float storage for a tile of n floats, rounded so the next tile stays aligned.
inline size_t tile_floats(size_t n) {
  return (n + 15) / 16 * 16;
}

// Row-major copy of `n` rows of D floats (source rows `ld` apart) into a tile with row stride Dp;
// rows n..rows-1 are zeroed, so padded rows stay finite.
void pack_rows(float* dst, int Dp, const float* src, int64_t ld, int n, int rows, int D) {
  for (int r = 0; r < n; ++r) std::memcpy(dst + (size_t)r * Dp, src + r * ld, D * sizeof(float));
  for (int r = n; r < rows; ++r) std::memset(dst + (size_t)r * Dp, 0, Dp * sizeof(float));
}

typedef float v8 __attribute__((vector_size(8 * sizeof(float))));

// Transposes an 8x8 block held as 8 row vectors into 8 column vectors (3 shuffle stages).
inline void transpose8(v8 r[8]) {
  v8 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    for (int k = 0; k < 2; ++k) {
      u[i + 2 * k] = __builtin_shufflevector(t[i + k], t[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 * k + 1] =
          __builtin_shufflevector(t[i + k], t[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[c + 4] = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// Transposed copy: dst[d*kB + j] = src[j*ld + d] for j < n, zero for n <= j < kB. Works in 8x8
// blocks so eight source rows (usually far apart in a fused QKV activation) load at once.
void pack_cols(float* dst, const float* src, int64_t ld, int n, int D) {
  const int n8 = n / 8 * 8, D8 = D / 8 * 8;
  for (int j0 = 0; j0 < n8; j0 += 8) {
    for (int d0 = 0; d0 < D8; d0 += 8) {
      v8 r[8];
      for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src + (j0 + i) * ld + d0, sizeof(v8));
      transpose8(r);
      for (int c = 0; c < 8; ++c) std::memcpy(dst + (size_t)(d0 + c) * kB + j0, &r[c], sizeof(v8));
    }
    for (int j = j0; j < j0 + 8; ++j)
      for (int d = D8; d < D; ++d) dst[(size_t)d * kB + j] = src[j * ld + d];
  }
  for (int j = n8; j < n; ++j)
    for (int d = 0; d < D; ++d) dst[(size_t)d * kB + j] = src[j * ld + d];
  if (n < kB)
    for (int d = 0; d < D; ++d) std::memset(dst + (size_t)d * kB + n, 0, (kB - n) * sizeof(float));
}

// The keys and values of one (sequence, kv head), in the layouts the micro-kernels read:
// K^T and V^T tiles (D x kB each; tile kb at kb * D * kB) and K, V rows (stride Dp). Tiles are
// packed on first use and kept while a thread's consecutive items share the sequence and head,
// so packing costs O(len * D) per item instead of O(len^2 * D / kB). Null arrays are skipped.
struct KvPanel {
  float *kt = nullptr, *vt = nullptr, *k = nullptr, *v = nullptr;
  int seq = -1, hk = -1, ready = 0;

  KvPanel(Scratch& sc, int len_pad, int D, int Dp, bool want_kt, bool want_vt, bool want_k,
          bool want_v) {
    const size_t n_t = (size_t)len_pad * D, n_r = (size_t)len_pad * Dp;
    if (want_kt) kt = sc.take(n_t);
    if (want_vt) vt = sc.take(n_t);
    if (want_k) k = sc.take(n_r);
    if (want_v) v = sc.take(n_r);
  }
  static size_t floats(int len_pad, int D, int Dp, int transposed, int rowmajor) {
    return transposed * tile_floats((size_t)len_pad * D) +
           rowmajor * tile_floats((size_t)len_pad * Dp);
  }
  // Makes key tiles 0..kb of sequence `s` (rows start.., `len` tokens), kv head hk, available.
  void need(const Shape& sh, const float* kp, const float* vp, int s, int start, int len, int h,
            int kb) {
    if (s != seq || h != hk) {
      seq = s;
      hk = h;
      ready = 0;
    }
    for (; ready <= kb; ++ready) {
      const int j0 = ready * kB, nk = std::min(kB, len - j0);
      const int64_t off = (int64_t)(start + j0) * sh.ld + (int64_t)hk * sh.D;
      const size_t t_off = (size_t)ready * sh.D * kB, r_off = (size_t)j0 * sh.Dp;
      if (kt) pack_cols(kt + t_off, kp + off, sh.ld, nk, sh.D);
      if (vt) pack_cols(vt + t_off, vp + off, sh.ld, nk, sh.D);
      for (int j = 0; j < nk; ++j) {
        const int64_t src = off + j * (int64_t)sh.ld;
        if (k) std::memcpy(k + r_off + (size_t)j * sh.Dp, kp + src, sh.D * sizeof(float));
        if (v) std::memcpy(v + r_off + (size_t)j * sh.Dp, vp + src, sh.D * sizeof(float));
      }
    }
  }
  const float* kt_tile(const Shape& sh, int kb) const { return kt + (size_t)kb * sh.D * kB; }
  const float* vt_tile(const Shape& sh, int kb) const { return vt + (size_t)kb * sh.D * kB; }
  const float* k_tile(const Shape& sh, int kb) const { return k + (size_t)kb * kB * sh.Dp; }
  const float* v_tile(const Shape& sh, int kb) const { return v + (size_t)kb * kB * sh.Dp; }
};

// ---------------------------------------------------------------------------------------------
// Forward: per (sequence, query head, query tile), an online softmax over key tiles 0..qb.

struct FwdTiles {
  float *q, *s, *o, *m, *l;
  explicit FwdTiles(Scratch& sc, int Dp)
      : q(sc.take(kB * Dp)),
        s(sc.take(kB * kB)),
        o(sc.take(kB * Dp)),
        m(sc.take(kB)),
        l(sc.take(kB)) {}
  static size_t floats(int Dp) { return 2 * tile_floats((size_t)kB * Dp) + kB * kB + 2 * kB; }
};

void forward_tile(const Shape& sh, FwdTiles& t, const KvPanel& kv, float* out, float* lse,
                  const float* q, int start, int len, int qb, int h) {
  const int D = sh.D, Dp = sh.Dp;
  const int i0 = qb * kB, nq = std::min(kB, len - i0), rows = round_up(nq, kMR);
  pack_rows(t.q, Dp, q + (int64_t)(start + i0) * sh.ld + (int64_t)h * D, sh.ld, nq, rows, D);
  std::fill(t.m, t.m + rows, kNegInf);
  std::fill(t.l, t.l + rows, 0.0f);
  std::memset(t.o, 0, (size_t)rows * Dp * sizeof(float));
  const vf c = splat(sh.c);
  for (int kb = 0; kb <= qb; ++kb) {
    // Only the diagonal tile has masked keys (later positions, or padding past the sequence
    // end); tiles left of it are full and wholly visible.
    const bool diag = kb == qb;
    mm_abt(t.s, t.q, Dp, kv.kt_tile(sh, kb), D, rows, diag);
    for (int r = 0; r < rows; ++r) {
      float* srow = t.s + (size_t)r * kB;
      if (diag) std::fill(srow + std::min(r + 1, kB), srow + kB, kNegInf);
      vf mx = splat(kNegInf);
      for (int cv = 0; cv < kNV; ++cv) mx = vmax(mx, load(srow + cv * VW));
      const float tile_max = hmax(mx) * sh.c;  // c > 0: the max of the scaled scores
      // Lazy rescaling: keep the running max until a tile's exceeds it by more than
      // kRescaleLog2 (P then stays below 2^kRescaleLog2, harmless in float), so most tiles
      // skip rescaling O and l. The first tile always sets it (m starts at -inf).
      if (!(tile_max <= t.m[r] + kRescaleLog2)) {  // (a NaN max also lands here, spreading)
        const float alpha = std::exp2(t.m[r] - tile_max);
        t.m[r] = tile_max;
        t.l[r] *= alpha;
        const vf av = splat(alpha);
        float* orow = t.o + (size_t)r * Dp;
        for (int d = 0; d < Dp; d += VW) store(orow + d, load(orow + d) * av);
      }
      const vf mv = splat(t.m[r]);
      vf sum = {};
      for (int cv = 0; cv < kNV; ++cv) {
        const vf p = exp2v(load(srow + cv * VW) * c - mv);
        store(srow + cv * VW, p);
        sum += p;
      }
      t.l[r] += hsum(sum);
    }
    mm_ab(t.o, t.s, kv.v_tile(sh, kb), Dp, std::min(kB, len - kb * kB), rows, diag);
  }
  for (int r = 0; r < nq; ++r) {
    const int64_t row = start + i0 + r;
    const float inv = 1.0f / t.l[r];
    float* dst = out + row * (int64_t)sh.Hq * D + (int64_t)h * D;
    const float* orow = t.o + (size_t)r * Dp;
    for (int d = 0; d < D; ++d) dst[d] = orow[d] * inv;
    lse[row * sh.Hq + h] = t.m[r] * kLn2 + std::log(t.l[r]);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.
//
// Every (query tile, key tile) pair goes through bwd_tile, which recomputes P = exp(S - lse) and
// dS = P * (dP - delta) with S and dP laid out [query][key]. Then
//   dV[j] += sum_i P[i][j] dO[i],  dK[j] += sum_i dS[i][j] Q[i]   (mm_atb, over the query tile)
//   dQ[i] += sum_j dS[i][j] K[j]                                   (mm_ab, over the key tile)
// Only K and V need transposed copies (for S = Q K^T and dP = dO V^T); they come from a KvPanel.
//
// Two schedules produce the same bits (each output element sums the same terms, in the same
// order, through the same kernels):
//   fused: one item per (sequence, kv head): for each query head of the group and query tile,
//          for key tiles 0..qb, accumulate dK/dV (into per-sequence accumulators) and dQ (5 tile
//          GEMMs per pair);
//   split: dK/dV items per (sequence, kv head, key tile), then dQ items per (sequence, query
//          head, query tile) that recompute P and dS (7 tile GEMMs per pair, but many more,
//          smaller items), for when there are too few (sequence, kv head) pairs to keep every
//          thread busy.

struct BwdArgs {
  const float *dout, *q, *k, *v, *lse, *delta;  // delta[row*Hq + h] = rowsum(dO * O)
};

struct BwdTiles {
  float *q, *dout;      // one query tile (kB x Dp), padded rows zero
  float *lse2, *delta;  // per query row; padded rows: +inf (so P = 0) and 0
  float *p, *ds;        // kB x kB
  float *dk, *dv, *dq;  // accumulators (kB x Dp)
  BwdTiles(Scratch& sc, int Dp)
      : q(sc.take(kB * Dp)),
        dout(sc.take(kB * Dp)),
        lse2(sc.take(kB)),
        delta(sc.take(kB)),
        p(sc.take(kB * kB)),
        ds(sc.take(kB * kB)),
        dk(sc.take(kB * Dp)),
        dv(sc.take(kB * Dp)),
        dq(sc.take(kB * Dp)) {}
  static size_t floats(int Dp) { return 5 * tile_floats((size_t)kB * Dp) + 2 * kB * kB + 2 * kB; }
};

// Packs query tile qb of a sequence (query head h): Q, dO rows, lse (in the exp2 domain), delta.
void pack_query_tile(const Shape& sh, BwdTiles& t, const BwdArgs& a, int start, int len, int qb,
                     int h) {
  const int i0 = qb * kB, nq = std::min(kB, len - i0), rows = round_up(nq, kMR);
  const int64_t ldo = (int64_t)sh.Hq * sh.D;
  pack_rows(t.q, sh.Dp, a.q + (int64_t)(start + i0) * sh.ld + (int64_t)h * sh.D, sh.ld, nq, rows,
            sh.D);
  pack_rows(t.dout, sh.Dp, a.dout + (start + i0) * ldo + (int64_t)h * sh.D, ldo, nq, rows, sh.D);
  for (int r = 0; r < rows; ++r) {
    const int64_t idx = (int64_t)(start + i0 + r) * sh.Hq + h;
    t.lse2[r] = r < nq ? a.lse[idx] * kLog2e : std::numeric_limits<float>::infinity();
    t.delta[r] = r < nq ? a.delta[idx] : 0.0f;
  }
}

// P and dS of the packed query tile (`rows` rows) against key tile kb; `diag` masks keys after
// each query.
void bwd_tile(const Shape& sh, BwdTiles& t, const KvPanel& kv, int kb, int rows, bool diag) {
  mm_abt(t.p, t.q, sh.Dp, kv.kt_tile(sh, kb), sh.D, rows, diag);
  mm_abt(t.ds, t.dout, sh.Dp, kv.vt_tile(sh, kb), sh.D, rows, diag);
  const vf c = splat(sh.c);
  for (int r = 0; r < rows; ++r) {
    float* p = t.p + (size_t)r * kB;
    float* ds = t.ds + (size_t)r * kB;
    const vf l = splat(t.lse2[r]), dl = splat(t.delta[r]);
    const int ncols = diag ? causal_cols(r) : kB;  // columns mm_abt computed
    for (int j = 0; j < ncols; j += VW) store(p + j, exp2v(load(p + j) * c - l));
    if (diag) std::fill(p + r + 1, p + kB, 0.0f);  // keys after the query
    for (int j = 0; j < ncols; j += VW) store(ds + j, load(p + j) * (load(ds + j) - dl));
    if (diag) std::fill(ds + ncols, ds + kB, 0.0f);
  }
}

// Writes `n` rows of dK/dV accumulators (row stride Dp) starting at key row `row0`, kv head hk.
void store_dkv(const Shape& sh, const float* acc_k, const float* acc_v, float* dk, float* dv,
               int64_t row0, int n, int hk) {
  for (int j = 0; j < n; ++j) {
    const int64_t off = (row0 + j) * sh.ld + (int64_t)hk * sh.D;
    const float* sk = acc_k + (size_t)j * sh.Dp;
    const float* sv = acc_v + (size_t)j * sh.Dp;
    for (int d = 0; d < sh.D; ++d) {
      dk[off + d] = sk[d] * sh.scale;
      dv[off + d] = sv[d];
    }
  }
}

// Writes `n` rows of a dQ accumulator (row stride Dp) starting at query row `row0`, head h.
void store_dq(const Shape& sh, const float* acc, float* dq, int64_t row0, int n, int h) {
  for (int r = 0; r < n; ++r) {
    float* dst = dq + (row0 + r) * sh.ld + (int64_t)h * sh.D;
    const float* src = acc + (size_t)r * sh.Dp;
    for (int d = 0; d < sh.D; ++d) dst[d] = src[d] * sh.scale;
  }
}

// Fused schedule: the whole backward of sequence s for kv head hk. dk_acc, dv_acc hold
// len rounded up to kB rows x Dp.
void bwd_fused(const Shape& sh, BwdTiles& t, KvPanel& kv, const BwdArgs& a, float* dq, float* dk,
               float* dv, int s, int start, int len, int hk, float* dk_acc, float* dv_acc) {
  const int nb = (len + kB - 1) / kB;
  kv.need(sh, a.k, a.v, s, start, len, hk, nb - 1);
  std::memset(dk_acc, 0, (size_t)nb * kB * sh.Dp * sizeof(float));
  std::memset(dv_acc, 0, (size_t)nb * kB * sh.Dp * sizeof(float));
  for (int h = hk * sh.group; h < (hk + 1) * sh.group; ++h) {
    for (int qb = 0; qb < nb; ++qb) {
      const int nq = std::min(kB, len - qb * kB), rows_q = round_up(nq, kMR);
      pack_query_tile(sh, t, a, start, len, qb, h);
      std::memset(t.dq, 0, (size_t)rows_q * sh.Dp * sizeof(float));
      for (int kb = 0; kb <= qb; ++kb) {
        const int nk = std::min(kB, len - kb * kB), rows_k = round_up(nk, kMR);
        const size_t acc = (size_t)kb * kB * sh.Dp;
        bwd_tile(sh, t, kv, kb, rows_q, kb == qb);
        mm_atb(dv_acc + acc, t.p, t.dout, sh.Dp, nq, rows_k, kb == qb);
        mm_atb(dk_acc + acc, t.ds, t.q, sh.Dp, nq, rows_k, kb == qb);
        mm_ab(t.dq, t.ds, kv.k_tile(sh, kb), sh.Dp, nk, rows_q, kb == qb);
      }
      store_dq(sh, t.dq, dq, start + qb * kB, nq, h);
    }
  }
  store_dkv(sh, dk_acc, dv_acc, dk, dv, start, len, hk);
}

// Split schedule, dK/dV item: key tile kb of kv head hk against the group's query tiles qb >= kb.
void dkv_split(const Shape& sh, BwdTiles& t, KvPanel& kv, const BwdArgs& a, float* dk, float* dv,
               int s, int start, int len, int kb, int hk) {
  const int nb = (len + kB - 1) / kB;
  const int nk = std::min(kB, len - kb * kB), rows_k = round_up(nk, kMR);
  kv.need(sh, a.k, a.v, s, start, len, hk, kb);
  std::memset(t.dk, 0, (size_t)rows_k * sh.Dp * sizeof(float));
  std::memset(t.dv, 0, (size_t)rows_k * sh.Dp * sizeof(float));
  for (int h = hk * sh.group; h < (hk + 1) * sh.group; ++h) {
    for (int qb = kb; qb < nb; ++qb) {
      const int nq = std::min(kB, len - qb * kB), rows_q = round_up(nq, kMR);
      pack_query_tile(sh, t, a, start, len, qb, h);
      bwd_tile(sh, t, kv, kb, rows_q, qb == kb);
      mm_atb(t.dv, t.p, t.dout, sh.Dp, nq, rows_k, kb == qb);
      mm_atb(t.dk, t.ds, t.q, sh.Dp, nq, rows_k, kb == qb);
    }
  }
  store_dkv(sh, t.dk, t.dv, dk, dv, start + kb * kB, nk, hk);
}

// Split schedule, dQ item: query tile qb of head h against key tiles 0..qb, in order.
void dq_split(const Shape& sh, BwdTiles& t, KvPanel& kv, const BwdArgs& a, float* dq, int s,
              int start, int len, int qb, int h) {
  const int nq = std::min(kB, len - qb * kB), rows_q = round_up(nq, kMR);
  kv.need(sh, a.k, a.v, s, start, len, h / sh.group, qb);
  pack_query_tile(sh, t, a, start, len, qb, h);
  std::memset(t.dq, 0, (size_t)rows_q * sh.Dp * sizeof(float));
  for (int kb = 0; kb <= qb; ++kb) {
    bwd_tile(sh, t, kv, kb, rows_q, kb == qb);
    mm_ab(t.dq, t.ds, kv.k_tile(sh, kb), sh.Dp, std::min(kB, len - kb * kB), rows_q, kb == qb);
  }
  store_dq(sh, t.dq, dq, start + qb * kB, nq, h);
}

}  // namespace

// Rows outside [cu_seqlens[0], cu_seqlens[nseq]) are neither read nor written; every row inside
// is written (out, lse; dq, dk, dv heads), so outputs need no zeroing by the caller.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int ld, const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D,
                       float scale) {
  const Shape sh = check_shape(ld, cu_seqlens, nseq, Hq, Hkv, D, scale, "attention_forward");
  const std::vector<Item> items = make_items(cu_seqlens, nseq, Hq, /*cost_grows_with_blk=*/true);
  const int64_t n_work = (int64_t)items.size();
  if (n_work == 0) return;
  const int len_pad = round_up(max_len(cu_seqlens, nseq), kB);
#pragma omp parallel if (n_work > 1)
  {
    Scratch scratch(FwdTiles::floats(sh.Dp) + KvPanel::floats(len_pad, D, sh.Dp, 1, 1));
    FwdTiles tiles(scratch, sh.Dp);
    KvPanel kv(scratch, len_pad, D, sh.Dp, /*kt=*/true, /*vt=*/false, /*k=*/false, /*v=*/true);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_work; ++w) {
      const Item& it = items[w];
      const int start = cu_seqlens[it.seq], len = cu_seqlens[it.seq + 1] - start;
      kv.need(sh, k, v, it.seq, start, len, it.h / sh.group, it.blk);
      forward_tile(sh, tiles, kv, out, lse, q, start, len, it.blk, it.h);
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, int ld,
                        const int32_t* cu_seqlens, int nseq, int Hq, int Hkv, int D, float scale) {
  const Shape sh = check_shape(ld, cu_seqlens, nseq, Hq, Hkv, D, scale, "attention_backward");
  if (nseq == 0 || cu_seqlens[nseq] == cu_seqlens[0]) return;
  LOOM_CHECK(dq != q && dk != k && dv != v,
             "attention_backward: dq/dk/dv must not alias q/k/v (they are read while written)");
  const int row0 = cu_seqlens[0], row1 = cu_seqlens[nseq];

  // delta[row, h] = sum_d dO * O, the softmax-backward row term (linear memory: N x Hq).
  std::vector<float> delta((size_t)row1 * Hq);
  const int64_t ldo = (int64_t)Hq * D;
#pragma omp parallel for schedule(static)
  for (int64_t row = row0; row < row1; ++row) {
    for (int h = 0; h < Hq; ++h) {
      const float* o = out + row * ldo + (int64_t)h * D;
      const float* g = dout + row * ldo + (int64_t)h * D;
      float s = 0.0f;
      for (int d = 0; d < D; ++d) s += o[d] * g[d];
      delta[row * Hq + h] = s;
    }
  }
  const BwdArgs args{dout, q, k, v, lse, delta.data()};
  const int len_pad = round_up(max_len(cu_seqlens, nseq), kB);
  const size_t panel_floats = KvPanel::floats(len_pad, D, sh.Dp, 2, 1);

  // The fused schedule does the least work but has only nseq x Hkv items: use it when even the
  // largest item is at most half of one thread's fair share of the total (tile pairs).
  int64_t total = 0, largest = 0;
  for (int s = 0; s < nseq; ++s) {
    const int64_t nb = (cu_seqlens[s + 1] - cu_seqlens[s] + kB - 1) / kB;
    total += nb * (nb + 1) / 2 * Hkv;
    largest = std::max(largest, nb * (nb + 1) / 2);
  }
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const bool fused = largest * 2 * threads <= total;

  if (fused) {
    const std::vector<int> order = longest_first(cu_seqlens, nseq);
    const int64_t n_work = (int64_t)order.size() * Hkv;
    const size_t acc_floats = tile_floats((size_t)len_pad * sh.Dp);
#pragma omp parallel if (n_work > 1)
    {
      Scratch scratch(BwdTiles::floats(sh.Dp) + panel_floats + 2 * acc_floats);
      BwdTiles tiles(scratch, sh.Dp);
      KvPanel kv(scratch, len_pad, D, sh.Dp, /*kt=*/true, /*vt=*/true, /*k=*/true, /*v=*/false);
      float* dk_acc = scratch.take(acc_floats);
      float* dv_acc = scratch.take(acc_floats);
#pragma omp for schedule(dynamic, 1)
      for (int64_t w = 0; w < n_work; ++w) {
        const int s = order[w / Hkv];
        const int start = cu_seqlens[s], len = cu_seqlens[s + 1] - start;
        bwd_fused(sh, tiles, kv, args, dq, dk, dv, s, start, len, (int)(w % Hkv), dk_acc, dv_acc);
      }
    }
    return;
  }

  const std::vector<Item> kv_items = make_items(cu_seqlens, nseq, Hkv, false);
  const std::vector<Item> q_items = make_items(cu_seqlens, nseq, Hq, true);
  const int64_t n_kv = (int64_t)kv_items.size(), n_q = (int64_t)q_items.size();
#pragma omp parallel
  {
    Scratch scratch(BwdTiles::floats(sh.Dp) + panel_floats);
    BwdTiles tiles(scratch, sh.Dp);
    KvPanel kv(scratch, len_pad, D, sh.Dp, /*kt=*/true, /*vt=*/true, /*k=*/true, /*v=*/false);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t w = 0; w < n_kv; ++w) {
      const Item& it = kv_items[w];
      const int start = cu_seqlens[it.seq], len = cu_seqlens[it.seq + 1] - start;
      dkv_split(sh, tiles, kv, args, dk, dv, it.seq, start, len, it.blk, it.h);
    }
    // The dQ items read only inputs and write only dq, so threads move on to them without
    // waiting for the dK/dV items to finish (nowait above).
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < n_q; ++w) {
      const Item& it = q_items[w];
      const int start = cu_seqlens[it.seq], len = cu_seqlens[it.seq + 1] - start;
      dq_split(sh, tiles, kv, args, dq, it.seq, start, len, it.blk, it.h);
    }
  }
}

}  // namespace loom::cpu
