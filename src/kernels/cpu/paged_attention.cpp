#include "kernels/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace loom::cpu {

namespace {

void check(const PagedKvLayer& c, const PagedChunk* chunks, int nchunks) {
  LOOM_CHECK(c.dtype == DType::F32 || c.dtype == DType::BF16,
             "paged attention: cache storage must be fp32 or bf16");
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

// Loads D elements of the pool as fp32.
inline void load_row(float* dst, const void* base, DType dt, int64_t off, int D) {
  if (dt == DType::F32) {
    const float* src = static_cast<const float*>(base) + off;
    std::copy(src, src + D, dst);
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(base) + off;
    for (int d = 0; d < D; ++d) dst[d] = bf16_to_f32(src[d]);
  }
}

constexpr int kQueryTile = 16;

}  // namespace

void paged_kv_write(const PagedKvLayer& c, const float* k_new, const float* v_new, int ld,
                    const PagedChunk* chunks, int nchunks) {
  check(c, chunks, nchunks);
  const int HD = c.n_kv_head * c.head_dim;
  LOOM_CHECK(ld >= HD, "paged_kv_write: row stride ", ld, " below n_kv_head * head_dim ", HD);
  std::vector<int64_t> first_row(nchunks + 1, 0);
  for (int s = 0; s < nchunks; ++s) first_row[s + 1] = first_row[s] + chunks[s].n;
#pragma omp parallel for schedule(static)
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
  // time read 256-byte pieces 3 KB apart (gpt2), at a third of the read bandwidth. The heads
  // are split into as many ranges as keep every thread busy (a single decode over 2 threads: 2
  // ranges). The query heads of one kv head share each block of keys/values loaded, and one
  // long prefill still spreads over threads.
  struct Item {
    int chunk, h0, h1, q0, q1;
    int64_t row0;
  };
  int tiles = 0;
  for (int s = 0; s < nchunks; ++s) tiles += (chunks[s].n + kQueryTile - 1) / kQueryTile;
  const int threads = omp_get_max_threads();
  const int ranges = std::min(Hkv, std::max(1, (threads + tiles - 1) / std::max(tiles, 1)));
  std::vector<Item> items;
  int64_t row = 0;
  for (int s = 0; s < nchunks; ++s) {
    for (int t = 0; t < chunks[s].n; t += kQueryTile)
      for (int r = 0; r < ranges; ++r)
        items.push_back({s, Hkv * r / ranges, Hkv * (r + 1) / ranges, t,
                         std::min(chunks[s].n, t + kQueryTile), row});
    row += chunks[s].n;
  }
  const int max_heads = (Hkv + ranges - 1) / ranges;

#pragma omp parallel
  {
    // Per (query, kv head of the range, query head of its group): the online softmax's running
    // maximum m, sum l and output acc, and one block's scores.
    const size_t rows = size_t(kQueryTile) * max_heads * group;
    std::vector<float> kbuf(size_t(bs) * max_heads * D), vbuf(kbuf.size()), acc(rows * D);
    std::vector<const float*> krow(size_t(bs) * max_heads), vrow(krow.size());
    std::vector<float> scores(rows * bs), m(rows), l(rows);
#pragma omp for schedule(dynamic)
    for (size_t w = 0; w < items.size(); ++w) {
      const Item& it = items[w];
      const PagedChunk& ch = chunks[it.chunk];
      const int nq = it.q1 - it.q0, nh = it.h1 - it.h0;
      // Row index of (query i, kv head h of the range, group member g).
      const auto rix = [&](int i, int h, int g) { return (size_t(i) * nh + h) * group + g; };
      std::fill(acc.begin(), acc.begin() + size_t(nq) * nh * group * D, 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      const int last_pos = ch.start_pos + it.q1 - 1;  // the tile's last query sees [0, last_pos]
      for (int p0 = 0; p0 <= last_pos; p0 += bs) {
        // One block of keys/values, shared by the tile's queries and heads: fp32 rows read in
        // place, bf16 rows converted once.
        const int nk = std::min(bs, last_pos + 1 - p0);
        for (int j = 0; j < nk; ++j)
          for (int h = 0; h < nh; ++h) {
            const int64_t off = slot_offset(c, ch.block_table, p0 + j, it.h0 + h);
            const size_t e = size_t(j) * nh + h;
            if (c.dtype == DType::F32) {
              krow[e] = static_cast<const float*>(c.k) + off;
              vrow[e] = static_cast<const float*>(c.v) + off;
            } else {
              load_row(kbuf.data() + e * D, c.k, c.dtype, off, D);
              load_row(vbuf.data() + e * D, c.v, c.dtype, off, D);
              krow[e] = kbuf.data() + e * D;
              vrow[e] = vbuf.data() + e * D;
            }
          }
        for (int i = 0; i < nq; ++i) {
          const int qpos = ch.start_pos + it.q0 + i;
          const int visible = std::min(nk, qpos - p0 + 1);  // causal
          if (visible <= 0) continue;
          const float* qi = q + (it.row0 + it.q0 + i) * ldq;
          // Scores position by position, heads inside (memory order); each row's terms are
          // summed in the same order as one head at a time would.
          for (int j = 0; j < visible; ++j)
            for (int h = 0; h < nh; ++h) {
              const float* kr = krow[size_t(j) * nh + h];
              for (int g = 0; g < group; ++g) {
                const float* qr = qi + size_t((it.h0 + h) * group + g) * D;
                float dot = 0;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
                scores[rix(i, h, g) * bs + j] = dot * scale;
              }
            }
          for (int h = 0; h < nh; ++h)
            for (int g = 0; g < group; ++g) {
              const size_t r = rix(i, h, g);
              const float* sc = scores.data() + r * bs;
              float bmax = -std::numeric_limits<float>::infinity();
              for (int j = 0; j < visible; ++j) bmax = std::max(bmax, sc[j]);
              const float new_m = std::max(m[r], bmax);
              const float correction = std::exp(m[r] - new_m);  // 0 on the first block
              float* a = acc.data() + r * D;
              l[r] *= correction;
              for (int d = 0; d < D; ++d) a[d] *= correction;
              m[r] = new_m;
            }
          for (int j = 0; j < visible; ++j)
            for (int h = 0; h < nh; ++h) {
              const float* vr = vrow[size_t(j) * nh + h];
              for (int g = 0; g < group; ++g) {
                const size_t r = rix(i, h, g);
                const float pj = std::exp(scores[r * bs + j] - m[r]);
                l[r] += pj;
                float* a = acc.data() + r * D;
                for (int d = 0; d < D; ++d) a[d] += pj * vr[d];
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
  }
}

}  // namespace loom::cpu
