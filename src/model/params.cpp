#include "model/params.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace loom {

uint64_t ParamSet::next_layout_version() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

void ParamSet::add(const std::string& name, const Shape& shape, bool decay, ParamInit init,
                   float std) {
  LOOM_CHECK(!be_, "ParamSet::add after allocate (", name, ")");
  LOOM_CHECK(!index_.count(name), "duplicate parameter name ", name);
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = numel_of(shape);
  // Keep every parameter 16-float aligned (64 bytes) so SIMD loads never straddle two.
  p.offset = (total_ + 15) / 16 * 16;
  p.decay = decay;
  p.init = init;
  p.std = std;
  total_ = p.offset + p.numel;
  index_[name] = infos_.size();
  infos_.push_back(p);
  layout_changed();
}

void ParamSet::allocate(Backend& be) {
  LOOM_CHECK(!be_, "ParamSet::allocate called twice");
  const size_t bytes = static_cast<size_t>(total_) * sizeof(float);
  values_ = BackendBuffer::zeroed(be, bytes, "parameters");
  grads_ = BackendBuffer::zeroed(be, bytes, "gradients");
  be_ = &be;
  layout_changed();
}

void ParamSet::allocate_bf16_copy() {
  LOOM_CHECK(be_, "ParamSet::allocate_bf16_copy: the parameters are not allocated");
  if (!values_bf16_.empty()) return;
  values_bf16_ =
      BackendBuffer::zeroed(*be_, sizeof(uint16_t) * size_t(total_), "parameters (bf16)");
  bf16_written_.clear();  // nothing in it yet
}

void ParamSet::note_bf16_written(int64_t begin, int64_t end) {
  if (values_bf16_.empty() || begin >= end) return;
  ++bf16_write_count_;
  // Overlapping or adjacent ranges merge with the last, so a step's per-parameter calls (and
  // steps repeated before anyone takes the list) leave one range.
  if (!bf16_written_.empty() && begin <= bf16_written_.back().second &&
      end >= bf16_written_.back().first) {
    Range& last = bf16_written_.back();
    last = {std::min(last.first, begin), std::max(last.second, end)};
    return;
  }
  // A bound for a list nobody takes: forgetting a range only costs its conversion on next use.
  constexpr size_t kMaxRanges = 1024;
  if (bf16_written_.size() >= kMaxRanges) bf16_written_.erase(bf16_written_.begin());
  bf16_written_.push_back({begin, end});
}

std::vector<ParamSet::Range> ParamSet::take_bf16_written() {
  return std::exchange(bf16_written_, {});
}

void ParamSet::check_host(const char* op) const {
  LOOM_CHECK(be_, op ? op : "host access to the parameters", ": the parameters are not allocated");
  LOOM_CHECK(be_->host_accessible(), op ? op : "host access to the parameters",
             ": the parameters live in ", be_->name(),
             " backend memory, which the host cannot read or write in place (not supported on this "
             "backend yet)");
}

void ParamSet::refuse_dropped(const char* op) const {
  for (const ParamInfo& p : infos_)
    if (p.fp32_dropped) kept_info(p.name, op);  // throws, naming the first
  fail("ParamSet: ", dropped_, " parameters counted as dropped, none marked");
}

const ParamInfo& ParamSet::kept_info(const std::string& name, const char* op) const {
  const ParamInfo& p = info(name);
  LOOM_CHECK(!p.fp32_dropped, op ? op : "host access to the parameters", ": parameter '", name, "'",
             dropped_ > 1 ? cat(" (and ", dropped_ - 1, " more)") : std::string(),
             " keeps no fp32 values (the bf16 policy's 2-byte weights, ParamSet::drop_fp32): its "
             "elements in the fp32 buffer are zeros. Read it widened from the bf16 copy "
             "(read_values, host_values, copy_values_to), or take fp32_storage() where the "
             "dropped parameters are handled");
  return p;
}

const ParamInfo& ParamSet::info(const std::string& name) const {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  return infos_[it->second];
}

void ParamSet::set_shard(const std::string& name, const Shape& global_shape, int dim,
                         std::vector<int64_t> global_index) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  ParamInfo& p = infos_[it->second];
  LOOM_CHECK(dim == 0 || dim == 1, name, ": shard dimension must be 0 or 1");
  LOOM_CHECK(global_shape.size() == p.shape.size(), name, ": shard of another rank");
  LOOM_CHECK(dim == 1 || static_cast<int64_t>(global_index.size()) == p.shape[0], name,
             ": one global row per local row");
  p.global_shape = global_shape;
  p.shard_dim = dim;
  p.global_index = std::move(global_index);
  layout_changed();
}

void ParamSet::set_inner_shard(const std::string& name, int dim, std::vector<int64_t> inner_index) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  ParamInfo& p = infos_[it->second];
  LOOM_CHECK(p.shard_dim == 0 && p.shape.size() == 3, name,
             ": an inner shard needs a 3-D parameter sharded along dimension 0");
  LOOM_CHECK(dim == 1 || dim == 2, name, ": inner shard dimension must be 1 or 2");
  LOOM_CHECK(dim == 2 || static_cast<int64_t>(inner_index.size()) == p.shape[1], name,
             ": one global row per local row");
  p.inner_dim = dim;
  p.inner_index = std::move(inner_index);
  layout_changed();
}

void ParamSet::mark_expert(const std::string& name) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  infos_[it->second].expert = true;
  layout_changed();
}

void ParamSet::set_trainable(const std::string& name, bool trainable) {
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter named '", name, "'");
  infos_[it->second].trainable = trainable;
  layout_changed();
}

bool ParamSet::any_frozen() const {
  for (const ParamInfo& p : infos_)
    if (!p.trainable) return true;
  return false;
}

int64_t local_row_length(const ParamInfo& p) {
  if (!p.sharded()) return p.numel;
  if (p.inner_dim > 0) return p.shape[2];
  return p.numel / p.shape[0];
}

int64_t global_row_first(const ParamInfo& p, int64_t row) {
  if (!p.sharded()) return 0;
  if (p.inner_dim > 0) {  // expert [E_local, A, B] split inside each expert too
    const int64_t A = p.shape[1], gA = p.global_shape[1], gB = p.global_shape[2];
    const int64_t e = row / A, a = row % A;
    const int64_t base = p.global_index[e] * gA * gB;
    return p.inner_dim == 1 ? base + p.inner_index[a] * gB : base + a * gB + p.inner_index[0];
  }
  const int64_t cols = p.numel / p.shape[0];
  const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
  return p.shard_dim == 0 ? p.global_index[row] * cols : row * gcols + p.global_index[0];
}

void ParamSet::draw(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  LOOM_CHECK(0 <= begin && begin <= end && end <= total_, "ParamSet::draw: range [", begin, ", ",
             end, ") outside the buffer of ", total_);
  for (const ParamInfo& p : infos_) {
    // The parameter's local elements [i0, i1) that fall in [begin, end).
    const int64_t i0 = std::max(begin, p.offset) - p.offset;
    const int64_t i1 = std::min(end, p.offset + p.numel) - p.offset;
    if (i0 >= i1) continue;
    float* dst = out + (p.offset + i0 - begin);
    switch (p.init) {
      case ParamInit::Zeros:
        std::fill(dst, dst + (i1 - i0), 0.f);
        break;
      case ParamInit::Ones:
        std::fill(dst, dst + (i1 - i0), 1.f);
        break;
      case ParamInit::Normal:
      case ParamInit::Uniform: {
        // Each local element drawn at its global index: the same values as one process, and
        // the same values whichever part of the parameter is drawn.
        const uint64_t key = name_key(p.name);
        const int64_t len = local_row_length(p);
        for (int64_t r = i0 / len; r * len < i1; ++r) {
          const int64_t a = std::max(i0, r * len), b = std::min(i1, (r + 1) * len);
          const int64_t first = global_row_first(p, r) + (a - r * len);
          if (p.init == ParamInit::Normal) {
            fill_normal(dst + (a - i0), b - a, seed, key, first, 0.f, p.std);
          } else {
            for (int64_t k = 0; k < b - a; ++k)
              dst[a - i0 + k] =
                  p.std * (2.f * uniform_at(seed, key, static_cast<uint64_t>(first + k)) - 1.f);
          }
        }
        break;
      }
    }
  }
}

void ParamSet::init(uint64_t seed) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  init_ranges(seed, {{0, total_}});
}

// Elements per host staging chunk (4 MiB) when the backend's memory is not host memory.
static constexpr int64_t kStageChunk = int64_t(1) << 20;

void ParamSet::init_ranges(uint64_t seed, const std::vector<Range>& ranges) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  LOOM_CHECK(be_, "ParamSet::init: the parameters are not allocated");
  if (be_->host_accessible()) {
    for (auto [begin, end] : ranges) {
      draw(seed, begin, end, fp32_storage() + begin);
      settle_dropped(begin, end);
    }
    return;
  }
  // Drawn in host memory chunk by chunk and copied over. The chunk starts zeroed so that the
  // padding between parameters, which draw leaves alone, stays the zeros it was allocated as.
  std::vector<float> host;
  for (auto [begin, end] : ranges)
    for (int64_t a = begin; a < end; a += kStageChunk) {
      const int64_t b = std::min(end, a + kStageChunk);
      host.assign(size_t(b - a), 0.f);
      draw(seed, a, b, host.data());
      write_values(a, b, host.data());
    }
}

void ParamSet::draw_to_backend(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  Backend& be = backend();
  if (be.host_accessible()) return draw(seed, begin, end, out);
  std::vector<float> host;
  for (int64_t a = begin; a < end; a += kStageChunk) {
    const int64_t b = std::min(end, a + kStageChunk);
    host.assign(size_t(b - a), 0.f);
    draw(seed, a, b, host.data());
    be.copy_h2d(out + (a - begin), host.data(), sizeof(float) * size_t(b - a));
  }
}

void ParamSet::zero_grad() {
  LOOM_CHECK(be_, "ParamSet::zero_grad: the parameters are not allocated");
  float* g = grad();
  lazy_.zero(total_, [&](int64_t lo, int64_t hi) {
    be_->fill_bytes(g + lo, 0, sizeof(float) * size_t(hi - lo));
  });
  ++grad_zero_count_;
}

void ParamSet::settle_grads(int64_t lo, int64_t hi) {
  if (!be_) return;
  float* g = grad();
  lazy_.settle(lo, hi, [&](int64_t a, int64_t b) {
    be_->fill_bytes(g + a, 0, sizeof(float) * size_t(b - a));
  });
}

static void check_range(const char* op, int64_t begin, int64_t end, int64_t total, bool allocated) {
  LOOM_CHECK(allocated, "ParamSet::", op, ": the parameters are not allocated");
  LOOM_CHECK(0 <= begin && begin <= end && end <= total, "ParamSet::", op, ": range [", begin, ", ",
             end, ") outside the buffer of ", total);
}

void ParamSet::read_values(int64_t begin, int64_t end, float* out) const {
  check_range("read_values", begin, end, total_, be_);
  if (dropped_ > 0) return copy_values_to(out, begin, end);  // host memory is the backend's
  be_->copy_d2h(out, fp32_storage() + begin, sizeof(float) * size_t(end - begin));
}

void ParamSet::write_values(int64_t begin, int64_t end, const float* in) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  check_range("write_values", begin, end, total_, be_);
  be_->copy_h2d(fp32_storage() + begin, in, sizeof(float) * size_t(end - begin));
  settle_dropped(begin, end);
}

void ParamSet::read_grads(int64_t begin, int64_t end, float* out) const {
  check_range("read_grads", begin, end, total_, be_);
  // Lazily zeroed ranges still pending are zeros to every reader (filling them changes no
  // value a reader can see, hence const).
  const_cast<ParamSet*>(this)->settle_grads(begin, end);
  be_->copy_d2h(out, grad() + begin, sizeof(float) * size_t(end - begin));
}

void ParamSet::write_values_on_backend(const float* src) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  LOOM_CHECK(be_, "ParamSet::write_values_on_backend: the parameters are not allocated");
  be_->copy_d2d(fp32_storage(), src, sizeof(float) * size_t(total_));
  settle_dropped(0, total_);
}

void ParamSet::copy_values_from(const ParamSet& src) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  LOOM_CHECK(be_ && src.be_, "ParamSet::copy_values_from: the parameters are not allocated");
  LOOM_CHECK(src.total_ == total_ && src.infos_.size() == infos_.size(),
             "ParamSet::copy_values_from: a set of ", src.total_, " elements in ",
             src.infos_.size(), " parameters into one of ", total_, " in ", infos_.size());
  if (src.be_ == be_) {
    src.copy_values_to(fp32_storage(), 0, total_);
    settle_dropped(0, total_);
    return;
  }
  std::vector<float> host;
  for (int64_t a = 0; a < total_; a += kStageChunk) {
    const int64_t b = std::min(total_, a + kStageChunk);
    host.resize(size_t(b - a));
    src.read_values(a, b, host.data());
    write_values(a, b, host.data());
  }
}

std::map<std::string, Tensor> ParamSet::host_values() const {
  LOOM_CHECK(be_, "ParamSet::host_values: the parameters are not allocated");
  std::map<std::string, Tensor> m;
  for (const ParamInfo& p : infos_) {
    if (p.fp32_dropped) {  // no fp32 values to view: widened from the bf16 copy
      Tensor t = Tensor::zeros(p.shape, DType::F32);
      copy_values_to(t.data<float>(), p.offset, p.offset + p.numel);
      m[p.name] = t;
    } else if (be_->host_accessible()) {
      m[p.name] =
          Tensor::view_of(const_cast<float*>(fp32_storage()) + p.offset, p.shape, DType::F32);
    } else {
      Tensor t = Tensor::zeros(p.shape, DType::F32);
      read_values(p.offset, p.offset + p.numel, t.data<float>());
      m[p.name] = t;
    }
  }
  return m;
}

void ParamSet::store_values(const std::map<std::string, Tensor>& staged) {
  bf16_written_.clear();  // fp32 values written without their bf16 copy
  LOOM_CHECK(be_, "ParamSet::store_values: the parameters are not allocated");
  for (const auto& [name, t] : staged) {
    const ParamInfo& p = info(name);
    // host_values handed out views (written in place), except for dropped parameters.
    if (be_->host_accessible() && !p.fp32_dropped) continue;
    LOOM_CHECK(t.dtype() == DType::F32 && t.numel() == p.numel && t.is_contiguous(),
               "ParamSet::store_values: ", name, " is not a contiguous fp32 tensor of ", p.numel,
               " elements");
    write_values(p.offset, p.offset + p.numel, t.data<float>());
  }
}

std::map<std::string, Tensor> ParamSet::tensors(const char* op) {
  if (!op) op = "ParamSet::tensors (host views of the parameters)";
  float* base = host_data(op);  // (refuses dropped parameters: use host_values)
  std::map<std::string, Tensor> m;
  for (auto& p : infos_) m[p.name] = Tensor::view_of(base + p.offset, p.shape, DType::F32);
  return m;
}

std::map<std::string, Tensor> ParamSet::grad_tensors(const char* op) {
  float* base = host_grad(op ? op : "ParamSet::grad_tensors (host views of the gradients)");
  settle_grads();
  std::map<std::string, Tensor> m;
  for (auto& p : infos_) m[p.name] = Tensor::view_of(base + p.offset, p.shape, DType::F32);
  return m;
}

// ---- 2-byte weights

// Zeroes [p, p+n) and returns its whole pages to the kernel: private anonymous memory reads back
// as zeros after MADV_DONTNEED (parallel/page_memory.h does the same for ZeRO's buffers; the
// model library does not link it).
static void release_pages(float* p, int64_t n) {
  if (n <= 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(n) * 4;
  const uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
  if (a >= b) {
    std::memset(p, 0, size_t(n) * 4);
    return;
  }
  std::memset(p, 0, a - begin);
  std::memset(reinterpret_cast<void*>(b), 0, end - b);
  if (madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0)
    std::memset(reinterpret_cast<void*>(a), 0, b - a);
}

const ParamInfo* ParamSet::info_at(int64_t at) const {
  // Offsets increase with the order of add().
  auto it = std::upper_bound(infos_.begin(), infos_.end(), at,
                             [](int64_t x, const ParamInfo& p) { return x < p.offset; });
  if (it == infos_.begin()) return nullptr;
  --it;
  return at < it->offset + it->numel ? &*it : nullptr;
}

bool ParamSet::fp32_dropped_at(int64_t at) const {
  if (dropped_ == 0) return false;
  const ParamInfo* p = info_at(at);
  return p && p->fp32_dropped;
}

void ParamSet::for_runs(int64_t a, int64_t b,
                        const std::function<void(int64_t, int64_t, bool)>& fn) const {
  if (a >= b) return;
  if (dropped_ == 0) return fn(a, b, false);
  int64_t run_lo = a, at = a;
  bool kind = false;
  auto push = [&](int64_t hi, bool dropped) {  // [at, hi) of one kind
    if (hi <= at) return;
    if (dropped != kind && at > run_lo) {
      fn(run_lo, at, kind);
      run_lo = at;
    }
    kind = dropped;
    at = hi;
  };
  for (const ParamInfo& p : infos_) {
    if (!p.fp32_dropped) continue;
    const int64_t lo = std::max(a, p.offset), hi = std::min(b, p.offset + p.numel);
    if (lo >= hi) continue;
    push(lo, false);
    push(hi, true);
  }
  push(b, false);
  if (at > run_lo) fn(run_lo, at, kind);
}

void ParamSet::settle_dropped(int64_t a, int64_t b) {
  if (dropped_ == 0) return;
  for_runs(a, b, [&](int64_t lo, int64_t hi, bool dropped) {
    if (!dropped) return;
    be_->convert(values_bf16_.as<uint16_t>() + lo, DType::BF16, fp32_storage() + lo, DType::F32,
                 hi - lo);
    note_bf16_written(lo, hi);
    release_pages(fp32_storage() + lo, hi - lo);
  });
}

void ParamSet::copy_values_to(float* dst, int64_t a, int64_t b) const {
  check_range("copy_values_to", a, b, total_, be_);
  for_runs(a, b, [&](int64_t lo, int64_t hi, bool dropped) {
    if (dropped)
      be_->convert(dst + (lo - a), DType::F32, values_bf16_.as<uint16_t>() + lo, DType::BF16,
                   hi - lo);
    else
      be_->copy_d2d(dst + (lo - a), fp32_storage() + lo, sizeof(float) * size_t(hi - lo));
  });
}

void ParamSet::drop_fp32(const std::vector<std::string>& names) {
  LOOM_CHECK(be_ && be_->host_accessible(),
             "ParamSet::drop_fp32: only host memory returns its pages (the bf16 GEMMs' CPU path)");
  LOOM_CHECK(!values_bf16_.empty(), "ParamSet::drop_fp32: no bf16 copy (allocate_bf16_copy)");
  for (const std::string& name : names) {
    ParamInfo& p = infos_[index_.at(info(name).name)];
    if (p.fp32_dropped) continue;
    p.fp32_dropped = true;
    ++dropped_;
    settle_dropped(p.offset, p.offset + p.numel);
    layout_changed();  // ptr() refuses it from now on
  }
}

void ParamSet::widen_rows(const std::string& name, const int32_t* ids, int64_t n) {
  const ParamInfo& p = info(name);
  if (!p.fp32_dropped || p.numel == 0) return;
  const int64_t rows = p.shape[0], len = p.numel / rows;
  // Global id -> local row: a row shard's contiguous global rows by subtraction, any other
  // row shard through a map; unsharded and column shards hold every row.
  int64_t first = 0;
  bool contiguous = true;
  std::unordered_map<int64_t, int64_t> local;
  if (p.shard_dim == 0) {
    first = p.global_index[0];
    for (int64_t i = 0; i < rows && contiguous; ++i) contiguous = p.global_index[i] == first + i;
    if (!contiguous)
      for (int64_t i = 0; i < rows; ++i) local[p.global_index[i]] = i;
  }
  const uint16_t* src = values_bf16_.as<uint16_t>() + p.offset;
  float* dst = fp32_storage() + p.offset;
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = int64_t(ids[i]) - first;
    if (!contiguous) {
      auto it = local.find(ids[i]);
      r = it == local.end() ? -1 : it->second;
    }
    if (r < 0 || r >= rows) continue;
    be_->convert(dst + r * len, DType::F32, src + r * len, DType::BF16, len);
  }
}

void ParamSet::release_fp32(const std::string& name) {
  const ParamInfo& p = info(name);
  if (p.fp32_dropped) release_pages(fp32_storage() + p.offset, p.numel);
}

}  // namespace loom
