// bf16 GEMMs on oneDNN's matmul primitive. Creating a primitive costs far more than running a
// small GEMM, so primitives are cached per shape, layout, scaling and thread count (oneDNN
// fixes its work split for the OpenMP thread count in force when the primitive is created).
// Each call brings its own scratchpad, so calls from several threads never share one.

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/gemm_bf16_dnnl.h"
#include "kernels/cpu/gemm_scale_pass.h"

namespace loom::cpu::detail {
namespace {

using dnnl::memory;
using Dims = memory::dims;

struct Key {
  bool trans_a = false, trans_b = false, c_bf16 = false;
  bool packed_b = false;  // B in the layout the primitive chooses (format any), packed by us
  bool bias = false;      // an fp32 bias row [N] added to every row of C in the kernel
  int M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0, batch = 0, threads = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  uint32_t alpha_bits = 0, beta_bits = 0;  // compared as bits, so equal keys hash equally
  auto fields() const {
    return std::tie(trans_a, trans_b, c_bf16, packed_b, bias, M, N, K, lda, ldb, ldc, batch,
                    threads, stride_a, stride_b, stride_c, alpha_bits, beta_bits);
  }
  bool operator==(const Key& o) const { return fields() == o.fields(); }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    std::apply([&](const auto&... f) { (mix(static_cast<uint64_t>(f)), ...); }, k.fields());
    return static_cast<size_t>(h);
  }
};

struct Entry {
  bool usable = false;  // false: oneDNN offered only a reference kernel or refused the layout
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, bias_md, scratch_md;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Row-major (optionally transposed-in-storage) matrix of `rows` x `cols` logical elements,
// with a leading batch dimension when batch > 1 (size 1, i.e. broadcast, for stride 0).
memory::desc matrix_md(memory::data_type type, int batch, int64_t stride, int rows, int cols,
                       bool transposed, int ld) {
  const Dims inner_strides = transposed ? Dims{1, ld} : Dims{ld, 1};
  if (batch == 1) return memory::desc(Dims{rows, cols}, type, inner_strides);
  const int64_t b = stride == 0 ? 1 : batch;
  return memory::desc(Dims{b, rows, cols}, type,
                      Dims{stride == 0 ? int64_t{1} : stride, inner_strides[0], inner_strides[1]});
}

std::atomic<uint64_t> g_created{0};  // primitives created (dnnl_primitives_created)

std::shared_ptr<Entry> make_entry(const Key& k) {
  g_created.fetch_add(1, std::memory_order_relaxed);
  auto e = std::make_shared<Entry>();
  using dt = memory::data_type;
  e->a_md = matrix_md(dt::bf16, k.batch, k.stride_a, k.M, k.K, k.trans_a, k.lda);
  e->b_md = k.packed_b ? memory::desc(Dims{k.K, k.N}, dt::bf16, memory::format_tag::any)
                       : matrix_md(dt::bf16, k.batch, k.stride_b, k.K, k.N, k.trans_b, k.ldb);
  e->c_md = matrix_md(k.c_bf16 ? dt::bf16 : dt::f32, k.batch, k.stride_c, k.M, k.N, false, k.ldc);
  if (k.bias) e->bias_md = memory::desc(Dims{1, k.N}, dt::f32, Dims{k.N, 1});
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (bits_f32(k.alpha_bits) != 1.0f) attr.set_output_scales(0, {bits_f32(k.alpha_bits)});
    if (bits_f32(k.beta_bits) != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(bits_f32(k.beta_bits));
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc desc = k.bias
                                        ? dnnl::matmul::desc(e->a_md, e->b_md, e->bias_md, e->c_md)
                                        : dnnl::matmul::desc(e->a_md, e->b_md, e->c_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) {
      log_warn("bf16 GEMM: oneDNN has only its reference kernel (", impl, ") for M=", k.M,
               " N=", k.N, " K=", k.K, " trans_a=", k.trans_a, " trans_b=", k.trans_b,
               "; this shape converts to fp32 instead");
      return e;
    }
    e->scratch_md = pd.scratchpad_desc();
    if (k.packed_b) e->b_md = pd.weights_desc();
    e->prim = dnnl::matmul(pd);
    e->usable = true;
  } catch (const dnnl::error& err) {
    log_warn("bf16 GEMM: oneDNN refused M=", k.M, " N=", k.N, " K=", k.K, " (", err.what(),
             "); this shape converts to fp32 instead");
  }
  return e;
}

std::shared_ptr<Entry> lookup(const Key& key) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> cache;
  // A bound on the cache's size, so a caller cycling through endless shapes cannot grow it
  // without limit; training and serving use a few dozen shapes.
  constexpr size_t kMaxEntries = 4096;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto entry = make_entry(key);  // outside the lock: creation takes milliseconds
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxEntries) cache.clear();
  return cache.emplace(key, std::move(entry)).first->second;
}

// A fork/join of the OpenMP team costs microseconds on an idle machine and a scheduler time
// slice (milliseconds) when the other core is busy; below this many multiply-adds (~8 us on
// one core at 250 GFLOP/s) a GEMM runs on the calling thread. OpenBLAS does the same below
// 65536 * 4 for fp32 (gemm.cpp); bf16 is about 4x faster per core, hence 4x the work.
constexpr double kSingleThreadedWork = 65536.0 * 16.0;

// Sets the calling thread's OpenMP thread count for a scope (n = 0: leaves it alone).
class OmpThreadsOverride {
 public:
  explicit OmpThreadsOverride(int n) : saved_(n > 0 ? omp_get_max_threads() : 0) {
    if (n > 0) omp_set_num_threads(n);
  }
  ~OmpThreadsOverride() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  OmpThreadsOverride(const OmpThreadsOverride&) = delete;
  OmpThreadsOverride& operator=(const OmpThreadsOverride&) = delete;

 private:
  int saved_;
};

// 64-byte aligned per-thread scratchpad.
void* scratchpad(size_t bytes) {
  thread_local std::vector<unsigned char> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  auto p = reinterpret_cast<uintptr_t>(buffer.data());
  return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
}

}  // namespace

bool dnnl_built() {
  return true;
}

bool dnnl_isa_has_bf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & need) == need;
}

namespace {

// A reused B operand's copy in the layout a primitive reads (gemm_bf16_reused_b): packed from
// src once per version and kept until the version or the shape changes.
struct PackedB {
  const uint16_t* src = nullptr;
  uint64_t version = 0;
  int K = 0, N = 0, ldb = 0;
  int uses = 0;     // calls with this (src, version, shape)
  memory::desc md;  // the layout `mem` holds (empty: nothing packed yet)
  memory mem;       // owns its buffer
};

// One oneDNN matmul; one_thread forces the single-threaded primitive (the caller splits the
// work itself). check_only: look the primitive up (creating it) without running it. packed
// (non-transposed, unbatched B only): B is read from packed->mem, packed from B first when it
// holds another layout or nothing (also under check_only, so that calls from several threads
// then only read it).
bool run_one(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
             int lda, int64_t stride_a, const uint16_t* B, int ldb, int64_t stride_b, float beta,
             void* C, bool c_bf16, int ldc, int64_t stride_c, int batch, bool one_thread_forced,
             bool check_only = false, PackedB* packed = nullptr, const float* bias = nullptr) {
  Key key;
  key.trans_a = trans_a;
  key.trans_b = trans_b;
  key.c_bf16 = c_bf16;
  key.M = M;
  key.N = N;
  key.K = K;
  key.lda = lda;
  key.ldb = ldb;
  key.ldc = ldc;
  key.batch = batch;
  key.packed_b = packed != nullptr;
  key.bias = bias != nullptr;
  // Inside a parallel region oneDNN runs on the calling thread alone; small GEMMs are run
  // there too (see kSingleThreadedWork), by lowering the OpenMP thread count while the
  // primitive is created and run.
  const double work = static_cast<double>(M) * N * K * batch;
  const bool one_thread = one_thread_forced || omp_in_parallel() || work <= kSingleThreadedWork;
  key.threads = one_thread ? 1 : omp_get_max_threads();
  const OmpThreadsOverride override_threads(one_thread ? 1 : 0);
  if (batch > 1) {
    key.stride_a = stride_a;
    key.stride_b = stride_b;
    key.stride_c = stride_c;
  }
  key.alpha_bits = f32_bits(alpha);
  key.beta_bits = f32_bits(beta);
  const std::shared_ptr<Entry> e = lookup(key);
  if (!e->usable) return false;
  if (check_only && !packed) return true;
  dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  try {
    if (packed && (!packed->mem || packed->md != e->b_md)) {
      const memory::desc plain = matrix_md(memory::data_type::bf16, 1, 0, K, N, false, ldb);
      memory src(plain, engine, const_cast<uint16_t*>(B));
      packed->mem = memory(e->b_md, engine);
      dnnl::reorder(src, packed->mem).execute(stream, src, packed->mem);
      packed->md = e->b_md;
    }
    if (check_only) return true;  // (with packed: B is packed now)
    memory a(e->a_md, engine, const_cast<uint16_t*>(A));
    memory b;
    if (packed) {
      b = packed->mem;
    } else {
      b = memory(e->b_md, engine, const_cast<uint16_t*>(B));
    }
    memory c(e->c_md, engine, C);
    memory s(e->scratch_md, engine, scratchpad(e->scratch_md.get_size()));
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, s}};
    if (bias) args.emplace(DNNL_ARG_BIAS, memory(e->bias_md, engine, const_cast<float*>(bias)));
    e->prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& err) {
    throw Error(cat("bf16 GEMM: oneDNN matmul M=", M, " N=", N, " K=", K, " failed: ", err.what()));
  }
  return true;
}

// Whether oneDNN may use AMX (honours ONEDNN_MAX_CPU_ISA). Its AMX matmul (brgemm) takes A
// only untransposed: a transposed A (the weight-gradient layout) falls back to its AVX512-BF16
// gemm kernel, at about a quarter of the AMX speed.
bool dnnl_isa_has_amx() {
  static const bool amx = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
    return (isa & need) == need;
  }();
  return amx;
}

// The AMX route of the weight-gradient layout (below) where A^T has at most this many elements
// (2 MiB of bf16, within L2). Measured on two threads (a 2-thread micro-benchmark, load 5): the
// block layers' dW at K = 256 (M <= 3072) went from 700-950 to 850-1150 GFLOP/s; the head's
// chunks (M = 50304, K = 256) and K = 2048 (B8 x T256's block layers) fell to 290-390 from
// 490-900, so they keep the AVX512-BF16 kernel on A transposed in place.
constexpr int64_t kAmxTransposedMaxElems = int64_t(1) << 20;

// dst [rows, K] (row-major) = the transpose of src [K, rows] (row stride lds), by a oneDNN
// reorder (its JIT'd transposition; the team splits it when called outside a parallel region).
void transpose_bf16(uint16_t* dst, const uint16_t* src, int rows, int K, int lds) {
  using dt = memory::data_type;
  dnnl::engine& engine = cpu_engine();
  memory from(matrix_md(dt::bf16, 1, 0, rows, K, true, lds), engine, const_cast<uint16_t*>(src));
  memory to(matrix_md(dt::bf16, 1, 0, rows, K, false, K), engine, dst);
  thread_local dnnl::stream stream(engine);
  try {
    dnnl::reorder(from, to).execute(stream, from, to);
    stream.wait();
  } catch (const dnnl::error& err) {
    throw Error(
        cat("bf16 GEMM: oneDNN transposition of ", K, " x ", rows, " failed: ", err.what()));
  }
}

// Rows of C per block of the weight-gradient layout (below): fixed by M alone, never by the
// thread count, so every element of C comes from the same single-threaded primitive whatever
// the thread count (bit-identical results). 128 rows keep 2 threads busy on the 768- and
// 2304-row weights (6 and 18 blocks); 256 rows where there are a dozen blocks or more.
int dw_block_rows(int M) {
  return M / 256 >= 12 ? 256 : 128;
}

// The weight-gradient layout, C[M,N] = alpha A^T B + beta C with A [K,M] and B [K,N] stored
// row-major (dW = dY^T X: M output features, N input features, K tokens), fp32 C. oneDNN runs
// it well below its forward speed: its sum post-op (beta != 0) reads C in a separate slow pass
// (280 GFLOP/s against 420-460 without, one core, K = 256), and its own blocking of the long-K
// case (K = 2048) reaches ~360. Split into blocks of rows of C, each one single-threaded
// matmul with beta = 0 and the blocks spread over the OpenMP threads, it reaches ~420 without
// accumulation and ~380-400 with it: a block is written into per-thread scratch that stays in
// cache, then added to C (C = beta C + block) in one pass. Returns false, without touching C,
// when oneDNN has no optimised kernel for a block's shape. With AMX (and A^T within
// kAmxTransposedMaxElems), A is first transposed into scratch (M x K bf16, one reorder over the
// team), so that the blocks run on the AMX kernel, and B is packed once into that kernel's
// layout for all the full blocks (packed per block, it cost as much as AMX saved); otherwise
// the blocks read A transposed in place, as before.
// alpha_after: each block runs with alpha 1 and alpha is applied in the pass that writes or adds
// it (gemm_scale_pass, while the block is in cache), so that one primitive serves every alpha.
bool blocked_weight_gradient(int M, int N, int K, float alpha, const uint16_t* A, int lda,
                             const uint16_t* B, int ldb, float beta, float* C, int ldc,
                             bool alpha_after = false) {
  const int rows = dw_block_rows(M), blocks = (M + rows - 1) / rows, last = M - (blocks - 1) * rows;
  const float kernel_alpha = alpha_after ? 1.f : alpha;
  const int ld = beta == 0.f ? ldc : N;  // into C directly, or into the scratch block
  const bool transpose = dnnl_isa_has_amx() && int64_t(M) * K <= kAmxTransposedMaxElems;
  PackedB packed_b;  // (AMX) B for the blocks of `rows` rows; a shorter last block reads B plain
  // (AMX) A transposed, [M, K]: the calling thread's scratch, read by the whole team (a
  // thread_local named inside the loop would be each thread's own).
  thread_local std::vector<uint16_t> a_t_scratch;
  const uint16_t* a_t = nullptr;
  if (transpose) {
    a_t_scratch.resize(size_t(M) * K);
    transpose_bf16(a_t_scratch.data(), A, M, K, lda);
    a_t = a_t_scratch.data();
  }
  // One block's product into c (row stride ldc_block), reading A's block as the kernel wants it.
  auto block_gemm = [&](int m0, int r, float* c, int ldc_block, bool check_only) {
    if (!transpose)
      return run_one(true, false, r, N, K, kernel_alpha, A + m0, lda, 0, B, ldb, 0, 0.f, c, false,
                     ldc_block, 0, 1, true, check_only);
    return run_one(false, false, r, N, K, kernel_alpha, a_t + int64_t(m0) * K, K, 0, B, ldb, 0, 0.f,
                   c, false, ldc_block, 0, 1, true, check_only, r == rows ? &packed_b : nullptr);
  };
  for (int r : {rows, last})  // both shapes usable before any block writes
    if (!block_gemm(0, r, nullptr, ld, true)) return false;
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (int blk = 0; blk < blocks; ++blk) {
    const int m0 = blk * rows, r = std::min(rows, M - m0);
    float* c = C + int64_t(m0) * ldc;
    if (beta == 0.f) {
      ok = block_gemm(m0, r, c, ldc, false) && ok;
      if (alpha_after) gemm_scale_pass(r, N, alpha, c, ldc, nullptr, false, c, ldc);
      continue;
    }
    thread_local std::vector<float> block;
    block.resize(size_t(rows) * N);
    ok = block_gemm(m0, r, block.data(), N, false) && ok;
    if (alpha_after) {  // (beta 1)
      gemm_scale_pass(r, N, alpha, block.data(), N, nullptr, true, c, ldc);
      continue;
    }
    for (int i = 0; i < r; ++i) {
      float* __restrict ci = c + int64_t(i) * ldc;
      const float* __restrict bi = block.data() + size_t(i) * N;
      if (beta == 1.f) {
        for (int j = 0; j < N; ++j) ci[j] += bi[j];
      } else {
        for (int j = 0; j < N; ++j) ci[j] = beta * ci[j] + bi[j];
      }
    }
  }
  LOOM_CHECK(ok, "bf16 GEMM: a weight-gradient block's oneDNN kernel vanished (M=", M, " N=", N,
             " K=", K, ")");
  return true;
}

}  // namespace

namespace {

// The packed copies of reused B operands, one per caller's key.
struct PackedCache {
  std::mutex mu;  // (calls come from one thread in practice; the copies are shared state)
  std::unordered_map<const void*, PackedB> map;
};
PackedCache& packed_cache() {
  static PackedCache c;
  return c;
}

}  // namespace

bool dnnl_gemm_bf16_reused_b(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                             int ldb, float* C, int ldc, const void* key, uint64_t version) {
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  // A bound, as for the primitives: a caller cycling through endless keys cannot grow it.
  constexpr size_t kMaxPacked = 64;
  if (c.map.size() >= kMaxPacked && !c.map.count(key)) c.map.clear();
  PackedB& p = c.map[key];
  if (p.src != B || p.version != version || p.K != K || p.N != N || p.ldb != ldb) {
    p = PackedB{};
    p.src = B, p.version = version, p.K = K, p.N = N, p.ldb = ldb;
  }
  // The first call of a version runs on the plain B (oneDNN packs its blocks on the fly, about
  // as costly as one packing of the whole): a weight used once per version never pays twice.
  const bool pack = ++p.uses >= 2;
  return run_one(false, false, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, C, false, ldc, 0, 1, false,
                 false, pack ? &p : nullptr);
}

void dnnl_release_reused_b(const void* key) {
  PackedCache& c = packed_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.erase(key);
}

namespace {
// Whether a GEMM takes blocked_weight_gradient.
bool weight_gradient_blocks(bool trans_a, bool trans_b, bool c_bf16, int batch, int M, int N,
                            int K) {
  return trans_a && !trans_b && !c_bf16 && batch == 1 && !omp_in_parallel() &&
         M >= 2 * dw_block_rows(M) && static_cast<double>(M) * N * K > kSingleThreadedWork;
}
}  // namespace

bool dnnl_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
                    int lda, int64_t stride_a, const uint16_t* B, int ldb, int64_t stride_b,
                    float beta, void* C, bool c_bf16, int ldc, int64_t stride_c, int batch) {
  if (weight_gradient_blocks(trans_a, trans_b, c_bf16, batch, M, N, K))
    return blocked_weight_gradient(M, N, K, alpha, A, lda, B, ldb, beta, static_cast<float*>(C),
                                   ldc);
  return run_one(trans_a, trans_b, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C,
                 c_bf16, ldc, stride_c, batch, false);
}

bool dnnl_gemm_bf16_bias(int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
                         int ldb, const float* bias, float* C, int ldc) {
  return run_one(false, true, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, C, false, ldc, 0, 1, false,
                 false, nullptr, bias);
}

bool dnnl_gemm_bf16_varying_alpha(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                  const uint16_t* A, int lda, const uint16_t* B, int ldb,
                                  float beta, float* C, int ldc, const float* bias) {
  if (bias == nullptr && weight_gradient_blocks(trans_a, trans_b, false, 1, M, N, K))
    return blocked_weight_gradient(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, alpha != 1.f);
  if (beta == 0.f) {
    if (!run_one(trans_a, trans_b, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, C, false, ldc, 0, 1,
                 false))
      return false;
    if (alpha != 1.f || bias != nullptr)  // (no pass multiplying by 1)
      gemm_scale_pass(M, N, alpha, C, ldc, bias, false, C, ldc);
    return true;
  }
  thread_local std::vector<float> product;  // (beta 1) alpha op(A) op(B) before it joins C
  product.resize(size_t(M) * N);
  if (!run_one(trans_a, trans_b, M, N, K, 1.f, A, lda, 0, B, ldb, 0, 0.f, product.data(), false, N,
               0, 1, false))
    return false;
  gemm_scale_pass(M, N, alpha, product.data(), N, nullptr, true, C, ldc);
  return true;
}

uint64_t dnnl_primitives_created() {
  return g_created.load(std::memory_order_relaxed);
}

}  // namespace loom::cpu::detail
