#include "kernels/cpu/paged_attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cpu/paged_decode.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {

namespace {

void check(const PagedKvLayer& c, const PagedChunk* chunks, int nchunks) {
  LOOM_CHECK(c.dtype == DType::F32 || c.dtype == DType::BF16 || c.dtype == DType::F8E4M3,
             "paged attention: cache storage must be fp32, bf16 or fp8 (e4m3), not ",
             dtype_name(c.dtype));
  LOOM_CHECK(c.dtype != DType::F8E4M3 || (c.k_scale && c.v_scale),
             "paged attention: an fp8 cache without its row scales");
  LOOM_CHECK(c.block_size > 0 && c.n_kv_head > 0 && c.head_dim > 0 && c.num_blocks > 0,
             "paged attention: bad cache shape");
  for (int s = 0; s < nchunks; ++s) {
    const PagedChunk& ch = chunks[s];
    LOOM_CHECK(ch.n >= 0 && ch.start_pos >= 0, "paged attention: chunk ", s, " has n ", ch.n,
               ", start_pos ", ch.start_pos);
    const int64_t need = (int64_t(ch.start_pos) + ch.n + c.block_size - 1) / c.block_size;
    LOOM_CHECK(ch.num_blocks >= need, "paged attention: chunk ", s, " covers ", ch.num_blocks,
               " blocks, needs ", need);
    for (int64_t b = 0; b < need; ++b)
      LOOM_CHECK(ch.block_table[b] >= 0 && ch.block_table[b] < c.num_blocks,
                 "paged attention: chunk ", s, " names block ", ch.block_table[b], " of ",
                 c.num_blocks);
  }
}

// Element offset of (position p, kv head h, dim 0) in the pool.
inline int64_t slot_offset(const PagedKvLayer& c, const int32_t* table, int p, int h) {
  const int64_t slot = int64_t(table[p / c.block_size]) * c.block_size + p % c.block_size;
  return (slot * c.n_kv_head + h) * c.head_dim;
}

// Loads the rows of kv heads [h0, h0 + nh) of slot `slot` (nh * D elements) as fp32.
inline void load_rows(float* dst, const void* base, const uint8_t* scales, const PagedKvLayer& c,
                      int64_t slot, int h0, int nh) {
  const int D = c.head_dim;
  const int64_t off = (slot * c.n_kv_head + h0) * D;
  if (c.dtype == DType::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + off;
    for (int d = 0; d < nh * D; ++d) dst[d] = bf16_to_f32(src[d]);
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(base) + off;
    for (int h = 0; h < nh; ++h)
      kv_fp8_decode_row(src + h * D, scales[slot * c.n_kv_head + h0 + h], D, dst + h * D);
  }
}

// Loads kv head h's row at position p (D elements) as fp32, whatever the pool stores.
inline void load_head_row(float* dst, const void* base, const uint8_t* scales,
                          const PagedKvLayer& c, const int32_t* table, int p, int h) {
  if (c.dtype == DType::F32) {
    const float* src = static_cast<const float*>(base) + slot_offset(c, table, p, h);
    std::copy(src, src + c.head_dim, dst);
    return;
  }
  const int64_t slot = int64_t(table[p / c.block_size]) * c.block_size + p % c.block_size;
  load_rows(dst, base, scales, c, slot, h, 1);
}

constexpr int kQueryTile = 16;

// sum_d a[d] b[d] in a fixed order. The compiler's own reduction of a vectorised loop adds the
// 16 lanes one after another (16 dependent scalar adds per dot, more than its FMAs): a head
// dimension of whole vectors is summed in two vector chains and a tree of lanes instead.
inline float dot(const float* a, const float* b, int D) {
#ifdef __AVX512F__
  if (D % 16 == 0) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int d = 0;
    for (; d + 32 <= D; d += 32) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), _mm512_loadu_ps(b + d + 16), s1);
    }
    if (d < D) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), s0);
    // Zero-masked shuffles: GCC 12 warns that the plain ones read an undefined register.
    const __mmask16 all = 0xFFFF;
    const __m512 v = _mm512_add_ps(s0, s1);
    const __m512 x = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(all, v, v, 0xEE));
    const __m512 y = _mm512_add_ps(x, _mm512_maskz_shuffle_f32x4(all, x, x, 0x55));
    const __m512 z = _mm512_add_ps(y, _mm512_maskz_permute_ps(all, y, 0x4E));
    return _mm512_cvtss_f32(_mm512_add_ps(z, _mm512_maskz_permute_ps(all, z, 0xB1)));
  }
#endif
  float s = 0;
  for (int d = 0; d < D; ++d) s = std::fma(a[d], b[d], s);
  return s;
}

}  // namespace

void paged_kv_write(const PagedKvLayer& c, const float* k_new, const float* v_new, int ld,
                    const PagedChunk* chunks, int nchunks) {
  check(c, chunks, nchunks);
  const int HD = c.n_kv_head * c.head_dim;
  LOOM_CHECK(ld >= HD, "paged_kv_write: row stride ", ld, " below n_kv_head * head_dim ", HD);
  // Grow-only (called once per layer and step); a local reference, so that the parallel loop's
  // threads read the caller's copy.
  thread_local std::vector<int64_t> first_row_buf;
  std::vector<int64_t>& first_row = first_row_buf;
  first_row.assign(nchunks + 1, 0);
  for (int s = 0; s < nchunks; ++s) first_row[s + 1] = first_row[s] + chunks[s].n;
    // A decode step's few rows are copied by one thread: a parallel region (once per layer and
    // token) costs more than the copy.
#pragma omp parallel for schedule(static) if (first_row[nchunks] * HD >= (int64_t(1) << 16))
  for (int64_t r = 0; r < first_row[nchunks]; ++r) {
    const int s =
        int(std::upper_bound(first_row.begin(), first_row.end(), r) - first_row.begin()) - 1;
    const PagedChunk& ch = chunks[s];
    const int p = ch.start_pos + int(r - first_row[s]);
    const int64_t off = slot_offset(c, ch.block_table, p, 0);  // heads are contiguous in a slot
    const float* kr = k_new + r * ld;
    const float* vr = v_new + r * ld;
    if (c.dtype == DType::F32) {
      std::copy(kr, kr + HD, static_cast<float*>(c.k) + off);
      std::copy(vr, vr + HD, static_cast<float*>(c.v) + off);
    } else if (c.dtype == DType::F8E4M3) {
      const int D = c.head_dim;
      const int64_t srow = off / D;  // (slot, head 0)'s scale
      uint8_t* kd = static_cast<uint8_t*>(c.k) + off;
      uint8_t* vd = static_cast<uint8_t*>(c.v) + off;
      for (int h = 0; h < c.n_kv_head; ++h) {
        c.k_scale[srow + h] = kv_fp8_encode_row(kr + h * D, D, kd + h * D);
        c.v_scale[srow + h] = kv_fp8_encode_row(vr + h * D, D, vd + h * D);
      }
    } else {
      uint16_t* kd = static_cast<uint16_t*>(c.k) + off;
      uint16_t* vd = static_cast<uint16_t*>(c.v) + off;
      for (int i = 0; i < HD; ++i) {
        kd[i] = f32_to_bf16(kr[i]);
        vd[i] = f32_to_bf16(vr[i]);
      }
    }
  }
}

void paged_attention(float* out, const float* q, int ldq, const PagedKvLayer& c,
                     const PagedChunk* chunks, int nchunks, int Hq, float scale) {
  check(c, chunks, nchunks);
  const int Hkv = c.n_kv_head, D = c.head_dim, bs = c.block_size;
  LOOM_CHECK(Hq > 0 && Hq % Hkv == 0, "paged attention: ", Hq, " query heads over ", Hkv,
             " kv heads");
  LOOM_CHECK(ldq >= Hq * D, "paged attention: q row stride ", ldq, " below Hq * D ", Hq * D);
  const int group = Hq / Hkv;

  // Work items: (chunk, range of kv heads, tile of up to kQueryTile queries). A slot holds every
  // head's row side by side, so an item reads its heads' rows of a block in memory order (all
  // heads, as one thread runs a decode, is one contiguous sweep of the block): one head at a
  // time read 256-byte pieces 3 KB apart (gpt2), at a third of the read bandwidth. A decode is
  // also split into position segments (paged_decode.h; as many tiles), merged afterwards. The
  // heads are split into as many ranges as keep every thread busy (a single decode over 2
  // threads: its 2 segments, every head; over 4: 2 ranges of each). The query heads of one kv
  // head share each block of keys/values loaded, and one long prefill still spreads over
  // threads.
  struct Item {
    int chunk, h0, h1, q0, q1;
    int64_t row0;
    int seg, nseg;  // a decode's position segment (nseg 1: the whole context, no merge)
    int64_t dec;    // a segmented decode's index among them (its partials)
  };
  const bool dec_ok = paged_decode_supported(D);
  const auto segments = [&](const PagedChunk& ch) {
    return ch.n == 1 && dec_ok ? paged_decode_segments(ch.start_pos + 1, bs) : 0;
  };
  int tiles = 0;
  for (int s = 0; s < nchunks; ++s) {
    const int segs = segments(chunks[s]);
    tiles += segs > 0 ? segs : (chunks[s].n + kQueryTile - 1) / kQueryTile;
  }
  const int threads = omp_get_max_threads();
  const int ranges = std::min(Hkv, std::max(1, (threads + tiles - 1) / std::max(tiles, 1)));
  thread_local std::vector<Item> items_buf;  // grow-only, as paged_kv_write's rows
  std::vector<Item>& items = items_buf;
  items.clear();
  thread_local std::vector<std::pair<int, int64_t>> merged_buf;  // (chunk, row) of each
  std::vector<std::pair<int, int64_t>>& merged = merged_buf;     // segmented decode
  merged.clear();
  int64_t row = 0;
  for (int s = 0; s < nchunks; ++s) {
    const int segs = segments(chunks[s]);
    if (segs > 0) {
      if (segs > 1) merged.emplace_back(s, row);
      for (int g = 0; g < segs; ++g)
        for (int r = 0; r < ranges; ++r)
          items.push_back({s, Hkv * r / ranges, Hkv * (r + 1) / ranges, 0, 1, row, g, segs,
                           segs > 1 ? int64_t(merged.size()) - 1 : -1});
    } else {
      for (int t = 0; t < chunks[s].n; t += kQueryTile)
        for (int r = 0; r < ranges; ++r)
          items.push_back({s, Hkv * r / ranges, Hkv * (r + 1) / ranges, t,
                           std::min(chunks[s].n, t + kQueryTile), row, 0, 1, -1});
    }
    row += chunks[s].n;
  }
  // Segment partials: [segmented decode][segment][query head][m, l, D sums].
  const int64_t part_stride = D + 2;
  thread_local std::vector<float> partial_buf;
  std::vector<float>& partial = partial_buf;
  const size_t part_size = merged.size() * size_t(kDecodeSegments) * Hq * part_stride;
  if (partial.size() < part_size) partial.resize(part_size);
  const int max_heads = (Hkv + ranges - 1) / ranges;

#pragma omp parallel
  {
    // Per (query, kv head of the range, query head of its group): the online softmax's running
    // maximum m, sum l and output acc; one block's scores (then weights) of one row.
    // Grow-only per thread (OpenMP keeps its threads): a decode-only step uses none of them, and
    // allocating them for every layer's call cost more than its small ranges compute.
    const size_t rows = size_t(kQueryTile) * max_heads * group;
    const bool f32 = c.dtype == DType::F32;
    thread_local std::vector<float> kbuf, vbuf, acc, m, l, s;
    const bool decode_only = dec_ok && std::all_of(chunks, chunks + nchunks,
                                                   [](const PagedChunk& x) { return x.n == 1; });
    if (!decode_only) {
      for (auto* v : {&kbuf, &vbuf})
        if (v->size() < size_t(bs) * max_heads * D) v->resize(size_t(bs) * max_heads * D);
      if (acc.size() < rows * D) acc.resize(rows * D);
      for (auto* v : {&m, &l})
        if (v->size() < rows) v->resize(rows);
      if (s.size() < size_t(bs)) s.resize(size_t(bs));
    }
#pragma omp for schedule(dynamic)
    for (size_t w = 0; w < items.size(); ++w) {
      const Item& it = items[w];
      const PagedChunk& ch = chunks[it.chunk];
      const int nq = it.q1 - it.q0, nh = it.h1 - it.h0;
      if (ch.n == 1 && dec_ok) {
        float* part = it.dec < 0
                          ? nullptr
                          : partial.data() + (it.dec * kDecodeSegments + it.seg) * Hq * part_stride;
        paged_decode_heads(out + it.row0 * int64_t(Hq) * D, part, q + it.row0 * ldq, c, ch, it.h0,
                           it.h1, group, scale, it.seg, it.nseg);
        continue;
      }
      // Row index of (query i, kv head h of the range, group member g).
      const auto rix = [&](int i, int h, int g) { return (size_t(i) * nh + h) * group + g; };
      std::fill(acc.begin(), acc.begin() + size_t(nq) * nh * group * D, 0.0f);
      std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      const int last_pos = ch.start_pos + it.q1 - 1;  // the tile's last query sees [0, last_pos]
      // Row (position j of the block, head h of the range) is at kb + j * lds + h * D: in place
      // for fp32 (a slot holds every head), in kbuf/vbuf for bf16 and fp8 (the range's heads,
      // widened: decoded and scaled, for fp8).
      const int64_t lds = f32 ? int64_t(Hkv) * D : int64_t(nh) * D;
      for (int p0 = 0; p0 <= last_pos; p0 += bs) {
        const int nk = std::min(bs, last_pos + 1 - p0);
        // One block's slots are consecutive: one table look-up per block, not per row (the
        // division by a run-time block size per row and head cost more than the row's dot).
        const int64_t slot0 = int64_t(ch.block_table[p0 / bs]) * bs;
        const int64_t off0 = (slot0 * Hkv + it.h0) * D;
        const float *kb, *vb;
        if (f32) {
          kb = static_cast<const float*>(c.k) + off0;
          vb = static_cast<const float*>(c.v) + off0;
        } else {
          for (int j = 0; j < nk; ++j) {
            load_rows(kbuf.data() + j * lds, c.k, c.k_scale, c, slot0 + j, it.h0, nh);
            load_rows(vbuf.data() + j * lds, c.v, c.v_scale, c, slot0 + j, it.h0, nh);
          }
          kb = kbuf.data();
          vb = vbuf.data();
        }
        // The next block's rows of head h are fetched while head h of this one is summed (a
        // head's rows are Hkv * D apart, which the hardware prefetcher follows late; all of the
        // next block's rows at once overfill the line-fill buffers).
        const int next_nk = std::min(bs, last_pos + 1 - p0 - bs);
        const size_t esz = dtype_size(c.dtype), stride = size_t(Hkv) * D * esz;
        const char *nkb = nullptr, *nvb = nullptr;
        if (next_nk > 0) {
          const int64_t next = (int64_t(ch.block_table[p0 / bs + 1]) * bs * Hkv + it.h0) * D;
          nkb = static_cast<const char*>(c.k) + next * esz;
          nvb = static_cast<const char*>(c.v) + next * esz;
        }
        for (int h = 0; h < nh; ++h) {
          if (next_nk > 0)
            for (int j = 0; j < next_nk; ++j)
              for (size_t o = 0; o < D * esz; o += 64) {
                __builtin_prefetch(nkb + j * stride + h * D * esz + o);
                __builtin_prefetch(nvb + j * stride + h * D * esz + o);
              }
          for (int i = 0; i < nq; ++i) {
            const int qpos = ch.start_pos + it.q0 + i;
            const int visible = std::min(nk, qpos - p0 + 1);  // causal
            if (visible <= 0) continue;
            const float* qi = q + (it.row0 + it.q0 + i) * ldq;
            for (int g = 0; g < group; ++g) {
              const size_t r = rix(i, h, g);
              const float* qr = qi + size_t((it.h0 + h) * group + g) * D;
              // The block's scores, then the online softmax's rescale, then the weighted
              // values: every row sums its positions in order (the bits do not depend on the
              // threads or the tiling).
              float bmax = -std::numeric_limits<float>::infinity();
              for (int j = 0; j < visible; ++j) {
                const float* kr = kb + j * lds + int64_t(h) * D;
                s[j] = dot(qr, kr, D) * scale;
                bmax = std::max(bmax, s[j]);
              }
              const float new_m = std::max(m[r], bmax);
              const float correction = fast_exp(m[r] - new_m);  // 0 on the first block
              m[r] = new_m;
              float sum = 0;
#pragma omp simd reduction(+ : sum)
              for (int j = 0; j < visible; ++j) {
                s[j] = fast_exp(s[j] - new_m);
                sum += s[j];
              }
              l[r] = l[r] * correction + sum;
              float* a = acc.data() + r * D;
              const float* vh = vb + int64_t(h) * D;
              // Positions in pairs: half the passes over the accumulator (its loads and stores).
              int j = 0;
              if (visible >= 2) {
                const float* v0 = vh;
                const float* v1 = vh + lds;
#pragma omp simd
                for (int d = 0; d < D; ++d)
                  a[d] = (a[d] * correction + s[0] * v0[d]) + s[1] * v1[d];
                j = 2;
              } else {
#pragma omp simd
                for (int d = 0; d < D; ++d) a[d] *= correction;
              }
              for (; j + 2 <= visible; j += 2) {
                const float* v0 = vh + j * lds;
                const float* v1 = v0 + lds;
                const float p0w = s[j], p1w = s[j + 1];
#pragma omp simd
                for (int d = 0; d < D; ++d) a[d] = (a[d] + p0w * v0[d]) + p1w * v1[d];
              }
              if (j < visible) {
                const float* v0 = vh + j * lds;
                const float pw = s[j];
#pragma omp simd
                for (int d = 0; d < D; ++d) a[d] += pw * v0[d];
              }
            }
          }
        }
      }
      for (int i = 0; i < nq; ++i)
        for (int h = 0; h < nh; ++h)
          for (int g = 0; g < group; ++g) {
            const size_t r = rix(i, h, g);
            float* o =
                out + (it.row0 + it.q0 + i) * int64_t(Hq) * D + size_t((it.h0 + h) * group + g) * D;
            const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
            for (int d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
          }
    }
    // Segmented decodes: each query head's segments merged in segment order (the loop above
    // ends in a barrier, so every partial is written).
#pragma omp for schedule(static)
    for (int64_t w = 0; w < int64_t(merged.size()) * Hq; ++w) {
      const int64_t i = w / Hq;
      const int hq = int(w % Hq);
      const PagedChunk& ch = chunks[merged[size_t(i)].first];
      const int segs = paged_decode_segments(ch.start_pos + 1, bs);
      const auto seg = [&](int g) {
        return partial.data() + ((i * kDecodeSegments + g) * Hq + hq) * part_stride;
      };
      float mx = -std::numeric_limits<float>::infinity();
      for (int g = 0; g < segs; ++g) mx = std::max(mx, seg(g)[0]);
      float* o = out + merged[size_t(i)].second * int64_t(Hq) * D + int64_t(hq) * D;
      float lsum = 0;
      for (int g = 0; g < segs; ++g) {
        const float* p = seg(g);
        const float f = fast_exp(p[0] - mx);
        lsum += p[1] * f;
        if (g == 0)
          for (int d = 0; d < D; ++d) o[d] = p[2 + d] * f;
        else
          for (int d = 0; d < D; ++d) o[d] += p[2 + d] * f;
      }
      const float inv = 1.0f / lsum;
      for (int d = 0; d < D; ++d) o[d] *= inv;
    }
  }
}

}  // namespace loom::cpu

namespace loom::cpu {

void paged_attention_variant(float* out, const float* q, int ldq, const PagedKvLayer& c,
                             const PagedChunk* chunks, int nchunks, int Hq, float scale, int window,
                             float softcap) {
  check(c, chunks, nchunks);
  const int Hkv = c.n_kv_head, D = c.head_dim;
  LOOM_CHECK(Hq > 0 && Hq % Hkv == 0, "paged attention: ", Hq, " query heads over ", Hkv,
             " kv heads");
  LOOM_CHECK(ldq >= Hq * D, "paged attention: q row stride ", ldq, " below Hq * D ", Hq * D);
  LOOM_CHECK(window >= 0 && softcap >= 0, "paged attention: window ", window, " and softcap ",
             softcap, " must be >= 0");
  const int group = Hq / Hkv;
  std::vector<int64_t> first_row(size_t(nchunks) + 1, 0);
  for (int s = 0; s < nchunks; ++s) first_row[size_t(s) + 1] = first_row[size_t(s)] + chunks[s].n;
  const int64_t items = first_row.back() * Hq;
#pragma omp parallel
  {
    const size_t Dn = static_cast<size_t>(D);
    std::vector<float> kr(Dn), vr(Dn), acc(Dn), z;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t r = it / Hq;
      const int h = int(it % Hq), hk = h / group;
      const int s =
          int(std::upper_bound(first_row.begin(), first_row.end(), r) - first_row.begin()) - 1;
      const PagedChunk& ch = chunks[s];
      const int pos = ch.start_pos + int(r - first_row[size_t(s)]);
      const int p0 = window > 0 ? std::max(0, pos - window + 1) : 0;
      const float* qi = q + r * ldq + int64_t(h) * D;
      z.resize(size_t(pos - p0 + 1));
      float m = -INFINITY;
      for (int p = p0; p <= pos; ++p) {
        load_head_row(kr.data(), c.k, c.k_scale, c, ch.block_table, p, hk);
        float sc = 0;
        for (int d = 0; d < D; ++d) sc = std::fma(qi[d], kr[size_t(d)], sc);
        sc *= scale;
        if (softcap > 0) sc = softcap * std::tanh(sc / softcap);
        z[size_t(p - p0)] = sc;
        m = std::max(m, sc);
      }
      float l = 0;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int p = p0; p <= pos; ++p) {
        const float e = std::exp(z[size_t(p - p0)] - m);
        l += e;
        load_head_row(vr.data(), c.v, c.v_scale, c, ch.block_table, p, hk);
        for (int d = 0; d < D; ++d) acc[size_t(d)] = std::fma(e, vr[size_t(d)], acc[size_t(d)]);
      }
      float* o = out + r * Hq * D + int64_t(h) * D;
      for (int d = 0; d < D; ++d) o[d] = acc[size_t(d)] / l;
    }
  }
}

}  // namespace loom::cpu
