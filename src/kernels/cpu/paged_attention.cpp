#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace loom::cpu {
namespace {

inline int64_t slot_offset(const PagedKv& c, const int32_t* table, int pos) {
  const int64_t block = table[pos / c.block_size];
  return ((block * c.block_size + pos % c.block_size) * c.Hkv) * c.D;
}

// One head's D values of position `pos` as floats.
inline void load_row(const PagedKv& c, const void* pool, int64_t off, float* dst) {
  if (c.dtype == DType::F32) {
    const float* s = static_cast<const float*>(pool) + off;
    std::copy(s, s + c.D, dst);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(pool) + off;
    for (int d = 0; d < c.D; ++d) dst[d] = bf16_to_f32(s[d]);
  }
}

}  // namespace

void paged_kv_write(const PagedKv& c, const int32_t* table, int start, int n, const float* k,
                    const float* v, int ld) {
  LOOM_CHECK(c.dtype == DType::F32 || c.dtype == DType::BF16, "paged KV cache dtype must be ",
             "fp32 or bf16, got ", dtype_name(c.dtype));
  const int W = c.Hkv * c.D;
  for (int i = 0; i < n; ++i) {
    const int64_t off = slot_offset(c, table, start + i);
    const float* ks = k + int64_t(i) * ld;
    const float* vs = v + int64_t(i) * ld;
    if (c.dtype == DType::F32) {
      std::copy(ks, ks + W, static_cast<float*>(c.k) + off);
      std::copy(vs, vs + W, static_cast<float*>(c.v) + off);
    } else {
      uint16_t* kd = static_cast<uint16_t*>(c.k) + off;
      uint16_t* vd = static_cast<uint16_t*>(c.v) + off;
      for (int j = 0; j < W; ++j) {
        kd[j] = f32_to_bf16(ks[j]);
        vd[j] = f32_to_bf16(vs[j]);
      }
    }
  }
}

void paged_attention_forward(float* out, const float* q, int ldq, int n, int start, int Hq,
                             float scale, const PagedKv& c, const int32_t* table) {
  LOOM_CHECK(c.Hkv > 0 && Hq % c.Hkv == 0, "paged attention: ", Hq, " query heads over ", c.Hkv,
             " KV heads");
  const int D = c.D, group = Hq / c.Hkv;
  const int items = n * Hq;
#pragma omp parallel
  {
    std::vector<float> kbuf(static_cast<size_t>(D)), vbuf(static_cast<size_t>(D)),
        acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 4)
    for (int it = 0; it < items; ++it) {
      const int i = it / Hq, h = it % Hq, kv = h / group;
      const float* qi = q + int64_t(i) * ldq + int64_t(h) * D;
      const int last = start + i;  // causal: positions 0 .. last
      float m = -std::numeric_limits<float>::infinity();
      double l = 0;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int p = 0; p <= last; ++p) {
        const int64_t off = slot_offset(c, table, p) + int64_t(kv) * D;
        load_row(c, c.k, off, kbuf.data());
        float s = 0;
        for (int d = 0; d < D; ++d) s += qi[d] * kbuf[d];
        s *= scale;
        // Online softmax: rescale what was accumulated when the running max grows.
        if (s > m) {
          const float r = std::exp(m - s);
          l *= r;
          for (int d = 0; d < D; ++d) acc[size_t(d)] *= r;
          m = s;
        }
        const float w = std::exp(s - m);
        l += w;
        load_row(c, c.v, off, vbuf.data());
        for (int d = 0; d < D; ++d) acc[size_t(d)] += w * vbuf[size_t(d)];
      }
      float* o = out + int64_t(i) * Hq * D + int64_t(h) * D;
      const float inv = static_cast<float>(1.0 / l);
      for (int d = 0; d < D; ++d) o[d] = acc[size_t(d)] * inv;
    }
  }
}

}  // namespace loom::cpu
