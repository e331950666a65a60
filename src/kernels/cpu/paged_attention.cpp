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

  // Work items: (chunk, kv head, tile of up to kQueryTile queries): the query heads of one kv
  // head share each block of keys/values loaded, and one long prefill still spreads over threads.
  struct Item {
    int chunk, kv_head, q0, q1;
    int64_t row0;
  };
  std::vector<Item> items;
  int64_t row = 0;
  for (int s = 0; s < nchunks; ++s) {
    for (int t = 0; t < chunks[s].n; t += kQueryTile)
      for (int h = 0; h < Hkv; ++h)
        items.push_back({s, h, t, std::min(chunks[s].n, t + kQueryTile), row});
    row += chunks[s].n;
  }

#pragma omp parallel
  {
    const size_t rows = size_t(kQueryTile) * group;  // (query, head of the group) pairs
    std::vector<float> kbuf(size_t(bs) * D), vbuf(size_t(bs) * D), acc(rows * D);
    std::vector<const float*> krow(static_cast<size_t>(bs)), vrow(static_cast<size_t>(bs));
    std::vector<float> scores(bs), m(rows), l(rows);
#pragma omp for schedule(dynamic)
    for (size_t w = 0; w < items.size(); ++w) {
      const Item& it = items[w];
      const PagedChunk& ch = chunks[it.chunk];
      const int kvh = it.kv_head;
      const int nq = it.q1 - it.q0;
      std::fill(acc.begin(), acc.begin() + size_t(nq) * group * D, 0.0f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
      const int last_pos = ch.start_pos + it.q1 - 1;  // the tile's last query sees [0, last_pos]
      for (int p0 = 0; p0 <= last_pos; p0 += bs) {
        // One block of keys/values, shared by the tile's queries and heads: fp32 rows read in
        // place (a copy first cost more than the attention itself at decode, where every
        // position is read once), bf16 rows converted once.
        const int nk = std::min(bs, last_pos + 1 - p0);
        for (int j = 0; j < nk; ++j) {
          const int64_t off = slot_offset(c, ch.block_table, p0 + j, kvh);
          if (c.dtype == DType::F32) {
            krow[size_t(j)] = static_cast<const float*>(c.k) + off;
            vrow[size_t(j)] = static_cast<const float*>(c.v) + off;
          } else {
            load_row(kbuf.data() + size_t(j) * D, c.k, c.dtype, off, D);
            load_row(vbuf.data() + size_t(j) * D, c.v, c.dtype, off, D);
            krow[size_t(j)] = kbuf.data() + size_t(j) * D;
            vrow[size_t(j)] = vbuf.data() + size_t(j) * D;
          }
        }
        // The next block's rows of this head are scattered (a slot holds every head): fetched
        // while this block is summed.
        const int64_t row_bytes = int64_t(D) * (c.dtype == DType::F32 ? 4 : 2);
        for (int j = 0; p0 + bs + j <= last_pos && j < bs; ++j) {
          const int64_t off = slot_offset(c, ch.block_table, p0 + bs + j, kvh) * (row_bytes / D);
          for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch(static_cast<const char*>(c.k) + off + b);
            __builtin_prefetch(static_cast<const char*>(c.v) + off + b);
          }
        }
        for (int i = 0; i < nq; ++i) {
          const int qpos = ch.start_pos + it.q0 + i;
          const int visible = std::min(nk, qpos - p0 + 1);  // causal
          if (visible <= 0) continue;
          for (int g = 0; g < group; ++g) {
            const int head = kvh * group + g;
            const size_t r = size_t(i) * group + g;
            const float* qr = q + (it.row0 + it.q0 + i) * ldq + size_t(head) * D;
            float bmax = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < visible; ++j) {
              const float* kr = krow[size_t(j)];
              float dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
              scores[j] = dot * scale;
              bmax = std::max(bmax, scores[j]);
            }
            const float new_m = std::max(m[r], bmax);
            const float correction = std::exp(m[r] - new_m);  // 0 on the first block
            float* a = acc.data() + r * D;
            l[r] *= correction;
            for (int d = 0; d < D; ++d) a[d] *= correction;
            for (int j = 0; j < visible; ++j) {
              const float pj = std::exp(scores[j] - new_m);
              l[r] += pj;
              const float* vr = vrow[size_t(j)];
              for (int d = 0; d < D; ++d) a[d] += pj * vr[d];
            }
            m[r] = new_m;
          }
        }
      }
      for (int i = 0; i < nq; ++i) {
        for (int g = 0; g < group; ++g) {
          const size_t r = size_t(i) * group + g;
          float* o = out + (it.row0 + it.q0 + i) * int64_t(Hq) * D + size_t(kvh * group + g) * D;
          const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
          for (int d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv;
        }
      }
    }
  }
}

}  // namespace loom::cpu
