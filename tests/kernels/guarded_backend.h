// A CPU backend for tests whose buffers the host cannot touch: every buffer it allocates is
// its own mapping, kept PROT_NONE except while one of its ops runs. Any host code that reads or
// writes a backend buffer outside an op (a loop over activations, a std::copy into the arena)
// faults, exactly where a GPU's device memory would be read as garbage or crash. Run what uses
// it in a child process (a death test), so a fault fails one test instead of the suite.
//
// The ops themselves are the CPU backend's (bit for bit), so results can be compared with a
// run on cpu_backend(). Host memory passed to an op (the attention cu_seqlens, or scratch that
// strict mode flags) stays accessible: the guard only catches host access to its buffers.
// alloc_zeroed is the Backend's default (alloc, then fill_bytes), as on CUDA.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/memory_ledger.h"

namespace loom::test {

class GuardedBackend final : public Backend {
 public:
  explicit GuardedBackend(Backend& inner = cpu_backend()) : in_(inner) {}
  ~GuardedBackend() override {
    for (auto& [p, n] : regions_) munmap(p, n);
  }
  GuardedBackend(const GuardedBackend&) = delete;
  GuardedBackend& operator=(const GuardedBackend&) = delete;

  const char* name() const override { return "guarded-cpu"; }
  Device device() const override { return in_.device(); }
  bool host_accessible() const override { return false; }
  std::string memory_report() const override { return ledger_.report("guarded-cpu"); }
  // Ops (memory operations included) run so far: evidence that a test went through here.
  int64_t ops() const { return ops_; }
  size_t live_buffers() const { return regions_.size(); }
  // Strict mode (off by default): every pointer an op receives (except the attention ops'
  // cu_seqlens, a host array by the Backend's convention) must be one of this backend's
  // buffers or inside a range given to allow_host.
  // Ops that receive other host memory are recorded in host_pointer_ops().
  void set_strict(bool on) { strict_ = on; }
  void allow_host(const void* p, size_t bytes) { allowed_[p] = bytes; }
  const std::vector<std::string>& host_pointer_ops() const { return host_ptrs_; }

  // Host code standing in for a device kernel the backend lacks (a test's stand-in for a
  // GPU-only op, e.g. tests/precision/guarded_fp8_recipes.h): `f` runs with the buffers open,
  // counted and checked as the op `name` on `device_ptrs`.
  template <typename F>
  void host_op(const char* name, std::initializer_list<const void*> device_ptrs, F&& f) {
    Op op(*this, name, device_ptrs);
    f();
  }

  // ---- memory
  void* alloc(size_t bytes, const char* cls) override {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t n = std::max<size_t>(1, (bytes + page - 1) / page) * page;
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LOOM_CHECK(p != MAP_FAILED, "guarded backend: mmap of ", n, " bytes for ", cls, " failed");
    regions_[p] = n;
    ledger_.add(p, n, cls);
    // A buffer allocated while an op runs (none today) is opened like the others.
    if (depth_ > 0) mprotect(p, n, PROT_READ | PROT_WRITE);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    ledger_.remove(p, name());
    auto it = regions_.find(p);
    munmap(it->first, it->second);
    regions_.erase(it);
  }
  void copy_h2d(void* dst, const void* src, size_t bytes) override {
    Op op(*this, "copy_h2d", {dst});
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_d2h(void* dst, const void* src, size_t bytes) override {
    Op op(*this, "copy_d2h", {src});
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_d2d(void* dst, const void* src, size_t bytes) override {
    Op op(*this, "copy_d2d", {dst, src});
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void fill_bytes(void* dst, int byte, size_t bytes) override {
    Op op(*this, "fill_bytes", {dst});
    if (bytes) std::memset(dst, byte, bytes);
  }
  void sync() override {}

  // ---- ops: the inner backend's, with the buffers opened around each call
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    Op op(*this, "gemm", {A, B, C});
    in_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_batched(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                    int64_t sa, const float* B, int ldb, int64_t sb, float beta, float* C, int ldc,
                    int64_t sc, int batch) override {
    Op op(*this, "gemm_batched", {A, B, C});
    in_.gemm_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* b, int N, int IC,
                      int OC) override {
    Op op(*this, "matmul_forward", {out, inp, w, b});
    in_.matmul_forward(out, inp, w, b, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int N, int IC, int OC) override {
    Op op(*this, "matmul_backward", {dinp, dw, db, dout, inp, w});
    in_.matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                         bool acc) override {
    Op op(*this, "embedding_forward", {out, ids, table});
    in_.embedding_forward(out, ids, table, N, C, acc);
  }
  void embedding_backward(float* dt, const float* dout, const int32_t* ids, int N, int C) override {
    Op op(*this, "embedding_backward", {dt, dout, ids});
    in_.embedding_backward(dt, dout, ids, N, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C, float eps) override {
    Op op(*this, "layernorm_forward", {out, mean, rstd, inp, w, b});
    in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    Op op(*this, "layernorm_backward", {dinp, dw, db, dout, inp, w, mean, rstd});
    in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override {
    Op op(*this, "rmsnorm_forward", {out, rstd, inp, w});
    in_.rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    Op op(*this, "rmsnorm_backward", {dinp, dw, dout, inp, w, rstd});
    in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    Op op(*this, "gelu_forward", {out, inp});
    in_.gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    Op op(*this, "gelu_backward", {dinp, inp, dout});
    in_.gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    Op op(*this, "swiglu_forward", {out, inp});
    in_.swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    Op op(*this, "swiglu_backward", {dinp, inp, dout});
    in_.swiglu_backward(dinp, inp, dout, N, F);
  }
  void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld,
                    float theta) override {
    Op op(*this, "rope_forward", {x, pos});
    in_.rope_forward(x, pos, N, H, D, ld, theta);
  }
  void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld,
                     float theta) override {
    Op op(*this, "rope_backward", {dx, pos});
    in_.rope_backward(dx, pos, N, H, D, ld, theta);
  }
  void rope_forward_scaled(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                           const RopeScaling& s) override {
    Op op(*this, "rope_forward_scaled", {x, pos});
    in_.rope_forward_scaled(x, pos, N, H, D, ld, theta, s);
  }
  void rope_backward_scaled(float* dx, const int32_t* pos, int N, int H, int D, int ld, float theta,
                            const RopeScaling& s) override {
    Op op(*this, "rope_backward_scaled", {dx, pos});
    in_.rope_backward_scaled(dx, pos, N, H, D, ld, theta, s);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    Op op(*this, "add", {out, a, b});
    in_.add(out, a, b, n);
  }
  void add_inplace(float* acc, const float* x, int64_t n) override {
    Op op(*this, "add_inplace", {acc, x});
    in_.add_inplace(acc, x, n);
  }
  void scale_inplace(float* x, float s, int64_t n) override {
    Op op(*this, "scale_inplace", {x});
    in_.scale_inplace(x, s, n);
  }
  void apply_bit_mask(float* out, const float* x, const uint64_t* bits, int N, int C,
                      float scale) override {
    Op op(*this, "apply_bit_mask", {out, x, bits});
    in_.apply_bit_mask(out, x, bits, N, C, scale);
  }
  void softmax_forward(float* out, const float* inp, int rows, int cols) override {
    Op op(*this, "softmax_forward", {out, inp});
    in_.softmax_forward(out, inp, rows, cols);
  }
  void softmax_backward(float* dinp, const float* out, const float* dout, int rows,
                        int cols) override {
    Op op(*this, "softmax_backward", {dinp, out, dout});
    in_.softmax_backward(dinp, out, dout, rows, cols);
  }
  void embedding_forward_slice(float* out, const int32_t* ids, const float* t, int N, int C, int v0,
                               int V) override {
    Op op(*this, "embedding_forward_slice", {out, ids, t});
    in_.embedding_forward_slice(out, ids, t, N, C, v0, V);
  }
  void embedding_backward_slice(float* dt, const float* dout, const int32_t* ids, int N, int C,
                                int v0, int V) override {
    Op op(*this, "embedding_backward_slice", {dt, dout, ids});
    in_.embedding_backward_slice(dt, dout, ids, N, C, v0, V);
  }
  void cross_entropy_slice_max(float* mx, const float* logits, int N, int V) override {
    Op op(*this, "cross_entropy_slice_max", {mx, logits});
    in_.cross_entropy_slice_max(mx, logits, N, V);
  }
  void cross_entropy_slice_sums(float* se, float* tl, const float* logits, const float* mx,
                                const int32_t* targets, int N, int V, int v0) override {
    Op op(*this, "cross_entropy_slice_sums", {se, tl, logits, mx, targets});
    in_.cross_entropy_slice_sums(se, tl, logits, mx, targets, N, V, v0);
  }
  void cross_entropy_slice_finish(float* losses, float* dlogits, const float* logits,
                                  const float* mx, const float* se, const float* tl,
                                  const int32_t* targets, int N, int V, int v0, float dloss,
                                  const float* weights) override {
    Op op(*this, "cross_entropy_slice_finish",
          {losses, dlogits, logits, mx, se, tl, targets, weights});
    in_.cross_entropy_slice_finish(losses, dlogits, logits, mx, se, tl, targets, N, V, v0, dloss,
                                   weights);
  }
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t row_bytes,
               size_t rows) override {
    Op op(*this, "copy_2d", {dst, src});
    in_.copy_2d(dst, dpitch, src, spitch, row_bytes, rows);
  }
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int N, int V, float dloss, const float* weights) override {
    Op op(*this, "cross_entropy", {losses, dlogits, logits, targets, weights});
    in_.cross_entropy(losses, dlogits, logits, targets, N, V, dloss, weights);
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                         float scale) override {
    Op op(*this, "attention_forward", {out, lse, q, k, v});
    in_.attention_forward(out, lse, q, k, v, ld, cu, nseq, Hq, Hkv, D, scale);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int ld, const int32_t* cu, int nseq, int Hq, int Hkv, int D,
                          float scale) override {
    Op op(*this, "attention_backward", {dq, dk, dv, dout, q, k, v, out, lse});
    in_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, ld, cu, nseq, Hq, Hkv, D, scale);
  }
  void adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
             float eps, float wd, float gs, int64_t step) override {
    Op op(*this, "adamw", {p, g, m, v});
    in_.adamw(p, g, m, v, n, lr, b1, b2, eps, wd, gs, step);
  }
  double sum_squares(const float* x, int64_t n) override {
    Op op(*this, "sum_squares", {x});
    return in_.sum_squares(x, n);
  }
  bool all_finite(const float* x, int64_t n) override {
    Op op(*this, "all_finite", {x});
    return in_.all_finite(x, n);
  }
  double weighted_sum(const float* x, const float* w, int64_t n) override {
    Op op(*this, "weighted_sum", {x, w});
    return in_.weighted_sum(x, w, n);
  }
  // ---- MoE and ring attention
  void moe_router_forward(float* scores, int32_t* idx, float* w, const float* logits, int N, int E,
                          int k, bool sig, bool renorm) override {
    Op op(*this, "moe_router_forward", {scores, idx, w, logits});
    in_.moe_router_forward(scores, idx, w, logits, N, E, k, sig, renorm);
  }
  void moe_router_backward(float* dlogits, const float* dw, const float* ds, const float* scores,
                           const int32_t* idx, int N, int E, int k, bool sig,
                           bool renorm) override {
    Op op(*this, "moe_router_backward", {dlogits, dw, ds, scores, idx});
    in_.moe_router_backward(dlogits, dw, ds, scores, idx, N, E, k, sig, renorm);
  }
  double moe_aux_loss(float* ds, const float* scores, const int32_t* idx, int N, int E, int k,
                      float coeff, float dloss) override {
    Op op(*this, "moe_aux_loss", {ds, scores, idx});
    return in_.moe_aux_loss(ds, scores, idx, N, E, k, coeff, dloss);
  }
  void moe_expert_stats(float* stats, const float* scores, const int32_t* idx, int N, int E,
                        int k) override {
    Op op(*this, "moe_expert_stats", {stats, scores, idx});
    in_.moe_expert_stats(stats, scores, idx, N, E, k);
  }
  void add_row_broadcast(float* x, const float* row, int N, int C) override {
    Op op(*this, "add_row_broadcast", {x, row});
    in_.add_row_broadcast(x, row, N, C);
  }
  void moe_plan_routing(int32_t* plan, const int32_t* idx, int N, int E, int k, int cap) override {
    Op op(*this, "moe_plan_routing", {plan, idx});
    in_.moe_plan_routing(plan, idx, N, E, k, cap);
  }
  void moe_permute(float* out, const float* x, const int32_t* token_of, int rows, int C) override {
    Op op(*this, "moe_permute", {out, x, token_of});
    in_.moe_permute(out, x, token_of, rows, C);
  }
  void moe_permute_backward(float* dx, const float* dout, const int32_t* row_of, int N, int k,
                            int C) override {
    Op op(*this, "moe_permute_backward", {dx, dout, row_of});
    in_.moe_permute_backward(dx, dout, row_of, N, k, C);
  }
  void moe_unpermute(float* y, const float* eo, const float* w, const int32_t* row_of, int N, int k,
                     int C) override {
    Op op(*this, "moe_unpermute", {y, eo, w, row_of});
    in_.moe_unpermute(y, eo, w, row_of, N, k, C);
  }
  void moe_unpermute_backward(float* deo, float* dw, const float* dy, const float* eo,
                              const float* w, const int32_t* row_of, int N, int k, int C) override {
    Op op(*this, "moe_unpermute_backward", {deo, dw, dy, eo, w, row_of});
    in_.moe_unpermute_backward(deo, dw, dy, eo, w, row_of, N, k, C);
  }
  void attention_block_forward(float* out, float* lse, const float* q, int ldq, const float* k,
                               const float* v, int ldk, int nq, int nk, int Hq, int Hkv, int D,
                               float scale) override {
    Op op(*this, "attention_block_forward", {out, lse, q, k, v});
    in_.attention_block_forward(out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D, scale);
  }
  void attention_block_backward(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* lse, const float* q, int ldq,
                                const float* k, const float* v, int ldk, int nq, int nk, int Hq,
                                int Hkv, int D, float scale) override {
    Op op(*this, "attention_block_backward", {dq, dk, dv, dout, out, lse, q, k, v});
    in_.attention_block_backward(dq, dk, dv, dout, out, lse, q, ldq, k, v, ldk, nq, nk, Hq, Hkv, D,
                                 scale);
  }
  void attention_merge(float* out, float* lse, const float* oa, const float* la, const float* ob,
                       const float* lb, int N, int H, int D) override {
    Op op(*this, "attention_merge", {out, lse, oa, la, ob, lb});
    in_.attention_merge(out, lse, oa, la, ob, lb, N, H, D);
  }
  void add_2d(float* dst, int ldd, const float* src, int lds, int rows, int cols) override {
    Op op(*this, "add_2d", {dst, src});
    in_.add_2d(dst, ldd, src, lds, rows, cols);
  }
  void fp8_amax(const float* x, int64_t n, float* amax) override {
    Op op(*this, "fp8_amax", {x, amax});
    in_.fp8_amax(x, n, amax);
  }
  void fp8_record_amax(float* pending, const float* amax) override {
    Op op(*this, "fp8_record_amax", {pending, amax});
    in_.fp8_record_amax(pending, amax);
  }
  void fp8_roll_history(float* history, int len, int32_t* pos_count, float* pending,
                        const float* amax, float* scale, bool e5m2, int margin,
                        bool most_recent) override {
    Op op(*this, "fp8_roll_history", {history, pos_count, pending, amax, scale});
    in_.fp8_roll_history(history, len, pos_count, pending, amax, scale, e5m2, margin, most_recent);
  }
  void paged_kv_write(const PagedKvBuffers& c, const float* k_new, const float* v_new, int ld,
                      const int32_t* chunks, int nchunks, int rows) override {
    Op op(*this, "paged_kv_write", {c.k, c.v, k_new, v_new, chunks});
    in_.paged_kv_write(c, k_new, v_new, ld, chunks, nchunks, rows);
  }
  void paged_attention(float* out, const float* q, int ldq, const PagedKvBuffers& c,
                       const int32_t* chunks, int nchunks, int rows, int Hq, float scale) override {
    Op op(*this, "paged_attention", {out, q, c.k, c.v, chunks});
    in_.paged_attention(out, q, ldq, c, chunks, nchunks, rows, Hq, scale);
  }
  void round_to(DType t, float* x, int64_t n, void* store) override {
    Op op(*this, "round_to", {x, store});
    in_.round_to(t, x, n, store);
  }
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override {
    Op op(*this, "convert", {dst, src});
    in_.convert(dst, dt, src, st, n);
  }

 private:
  // Opens every buffer for the length of one op (the outermost, if ops nest).
  struct Op {
    GuardedBackend& g;
    Op(GuardedBackend& b, const char* op, std::initializer_list<const void*> device_ptrs) : g(b) {
      for (const void* p : device_ptrs) g.check_device(p, op);
      ++g.ops_;
      if (g.depth_++ == 0) g.protect(PROT_READ | PROT_WRITE);
    }
    ~Op() {
      if (--g.depth_ == 0) g.protect(PROT_NONE);
    }
  };
  // Runs in destructors: a failure cannot throw, and a guard that no longer guards must not
  // let a test pass.
  void protect(int prot) {
    for (auto& [p, n] : regions_)
      if (mprotect(p, n, prot) != 0) {
        std::perror("guarded backend: mprotect");
        std::abort();
      }
  }

  // Strict mode: a pointer an op receives must lie in one of this backend's buffers or in a
  // range declared host-allowed; anything else is host memory a GPU could not read.
  void check_device(const void* p, const char* op) {
    if (!strict_ || !p) return;
    auto inside = [p](const auto& m) {
      auto it = m.upper_bound(const_cast<void*>(p));
      if (it == m.begin()) return false;
      --it;
      return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
    };
    if (!inside(regions_) && !inside(allowed_)) host_ptrs_.push_back(op);
  }

  Backend& in_;
  std::map<void*, size_t> regions_;
  std::map<const void*, size_t> allowed_;
  bool strict_ = false;
  std::vector<std::string> host_ptrs_;
  MemoryLedger ledger_;
  int depth_ = 0;
  int64_t ops_ = 0;
};

}  // namespace loom::test
