// All parameters of a model in ONE allocation (and all gradients in a second one), each
// parameter a named view at a fixed offset (llm.c style). One buffer makes the optimizer a
// few long loops, gradient buckets contiguous ranges, and checkpoints a list of views. Both
// buffers live on a Backend (host memory on the CPU backend, device memory on CUDA): ops take
// data() / grad(); host code goes through host_data() (which refuses a backend the host cannot
// touch, naming the operation) or the staging copies read_values / write_values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/buffer.h"
#include "model/grad_zeroing.h"

namespace loom {

// Normal: N(0, std^2); Uniform: U(-std, std) (std is then the bound); Zeros; Ones.
enum class ParamInit { Normal, Uniform, Zeros, Ones };

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in elements, into the flat buffers
  int64_t numel = 0;
  bool decay = true;  // weight decay applies (matrices); not to norms, biases, embeddings
  ParamInit init = ParamInit::Normal;
  float std = 0.02f;
  // Tensor parallelism (model/tensor_parallel.h): a sharded parameter is a slice of a global
  // tensor of shape global_shape, along dimension shard_dim: for rows (0), global_index[i] is
  // the global row of local row i; for columns (1), global_index[0] is the first global column.
  // Unsharded parameters (shard_dim -1) are replicated across the tensor-parallel group.
  Shape global_shape;
  int shard_dim = -1;
  std::vector<int64_t> global_index;
  bool sharded() const { return shard_dim >= 0; }
  // Expert tensor parallelism: an expert weight [E_local, A, B] (shard_dim 0 over experts) may
  // also be split inside each expert, along inner_dim 1 (inner_index[i] = global A-row of local
  // row i) or 2 (inner_index[0] = first global B-column).
  int inner_dim = -1;
  std::vector<int64_t> inner_index;
  // An expert's weights (mixture of experts): under expert parallelism each rank holds other
  // experts, so these are reduced over the expert-data-parallel group, not the data-parallel one.
  bool expert = false;
  // A frozen parameter (trainable = false: LoRA's base, a reference model) gets no gradient:
  // the model never writes its gradient buffer and skips the GEMMs that would compute it.
  bool trainable = true;
  // The bf16 policy's 2-byte weights (ParamSet::drop_fp32): the values live in the set's bf16
  // copy only; the fp32 buffer's elements of this parameter hold nothing (pages released).
  bool fp32_dropped = false;
};

// Where a parameter's local elements sit in its global tensor (the one-process parameter):
// the local elements are rows of local_row_length(p) elements, and local row `row` holds the
// consecutive global (flattened) elements from global_row_first(p, row). An unsharded parameter
// is one row at 0; a tensor-parallel row shard one row per local row; a column shard one row per
// row; an expert shard split inside the experts one row per (expert, row). Initialisation draws
// (ParamSet::draw) and checkpoint consolidation (ckpt/consolidate.h) both place by it.
int64_t local_row_length(const ParamInfo& p);
int64_t global_row_first(const ParamInfo& p, int64_t row);
// The element count of the global tensor.
inline int64_t global_numel(const ParamInfo& p) {
  return p.sharded() ? numel_of(p.global_shape) : p.numel;
}

class ParamSet {
 public:
  void add(const std::string& name, const Shape& shape, bool decay, ParamInit init,
           float std = 0.f);
  // Marks `name` as a tensor-parallel shard (see ParamInfo); before init().
  void set_shard(const std::string& name, const Shape& global_shape, int dim,
                 std::vector<int64_t> global_index);
  void mark_expert(const std::string& name);
  // Freezes (or unfreezes) a parameter; any time, since it only steers backward.
  void set_trainable(const std::string& name, bool trainable);
  bool any_frozen() const;
  // Changes whenever what ptr(), grad_ptr(), trainable_grad_ptr() or has() answer may change
  // (add, allocate, set_trainable, the shard and expert marks, drop_fp32): a reader
  // that caches those pointers (Decoder's per-layer parameters) rebuilds them when it differs.
  // Drawn from one process-wide counter, so two sets (or a set and its copy made before a change)
  // never share a value by accident.
  uint64_t layout_version() const { return layout_version_; }
  // Marks a 3-D expert shard (set_shard along dim 0 first) as split inside each expert too.
  void set_inner_shard(const std::string& name, int dim, std::vector<int64_t> inner_index);
  // After every add(): zero-filled values and grads allocated on `be` (Backend::alloc_zeroed:
  // on the CPU backend fresh pages that take no memory until written, since a ZeRO-3 rank
  // initialises and uses only part of the buffer). `be` must outlive the set.
  void allocate(Backend& be = cpu_backend());
  // The backend allocate() used (the CPU backend before it).
  Backend& backend() const { return be_ ? *be_ : cpu_backend(); }
  // Whether host code may read and write values and gradients in place (the CPU backend).
  bool host_accessible() const { return backend().host_accessible(); }

  // Draws every parameter from the counter-based RNG keyed by (seed, name, element index), so
  // any sharded layout that knows a slice's global offset draws the same values. On a backend
  // the host cannot touch, the values are drawn in host memory and copied over (copy_h2d).
  void init(uint64_t seed);
  // init() restricted to the flat ranges [begin, end): exactly init()'s values there, and no
  // other element (or page) of the buffer is touched.
  using Range = std::pair<int64_t, int64_t>;
  void init_ranges(uint64_t seed, const std::vector<Range>& ranges);
  // Writes init()'s values of the flat elements [begin, end) to out[0, end - begin) (host
  // memory), e.g. into a shard kept elsewhere; the padding between parameters is left as it is.
  void draw(uint64_t seed, int64_t begin, int64_t end, float* out) const;
  // draw() into `out` in memory of this set's backend (a ZeRO-3 master shard): drawn in place
  // on a host-accessible backend, elsewhere in host chunks copied over, their padding zeros.
  void draw_to_backend(uint64_t seed, int64_t begin, int64_t end, float* out) const;
  void zero_grad();
  // Counts zero_grad() calls: a gradient writer that remembers the count at its last write
  // knows, when it differs, that its gradient holds zeros and can overwrite instead of
  // accumulate (the bf16 weight-gradient GEMMs skip reading dW: beta = 0). Only zero_grad()
  // advances it, so any other way of clearing gradients just keeps writers accumulating.
  uint64_t grad_zero_count() const { return grad_zero_count_; }
  // Lazy zeroing (model/grad_zeroing.h): the gradient elements [lo, hi) are overwritten whole
  // by their first write after each zero_grad() (the bf16 weight-gradient GEMMs), so
  // zero_grad() skips them; their writer calls grad_overwritten before it writes, and every
  // reader of gradients settles first (settle_grads: what is still pending becomes zeros).
  // The set's own readers (read_grads, grad_tensors) settle themselves; the Decoder settles at
  // the end of its backward, the data-parallel reducer per bucket, the optimizer step
  // everything.
  void allow_lazy_zero(int64_t lo, int64_t hi) { lazy_.allow(lo, hi); }
  void grad_overwritten(int64_t lo, int64_t hi) { lazy_.overwritten(lo, hi); }
  void settle_grads(int64_t lo, int64_t hi);
  void settle_grads() { settle_grads(0, total_); }
  bool grads_pending(int64_t lo, int64_t hi) const { return lazy_.pending(lo, hi); }

  // Host staging, whatever the device: the flat elements [begin, end) of the values (or the
  // gradients) copied to or from host memory through the backend (copy_d2h / copy_h2d).
  void read_values(int64_t begin, int64_t end, float* out) const;
  void write_values(int64_t begin, int64_t end, const float* in);
  void read_grads(int64_t begin, int64_t end, float* out) const;
  // The values of `src` (a set of the same layout: a snapshot, a reference model) copied in:
  // on the device when both live on one backend, else staged through the host.
  void copy_values_from(const ParamSet& src);
  // Every fp32 value from `src`, total() floats in the memory of the set's backend (a buffer
  // filled by copy_values_to of a set of the same layout): a copy on the device.
  void write_values_on_backend(const float* src);

  int64_t total() const { return total_; }
  // The buffers on the backend's device: what ops take. Host code never dereferences these;
  // it uses host_data / host_grad / host_ptr, or the staging copies above. The value accessors
  // (data, host_data, ptr, host_ptr) refuse, naming the parameter, once a parameter's fp32
  // values are dropped (drop_fp32): its elements there read as zeros, never as its values.
  float* data() { return check_kept("ParamSet::data()"), values_.as<float>(); }
  float* grad() { return grads_.as<float>(); }
  const float* data() const { return check_kept("ParamSet::data()"), values_.as<float>(); }
  const float* grad() const { return grads_.as<float>(); }
  // The same pointers for host code that reads or writes them in place: throws loom::Error
  // naming `op` and the backend when the host cannot touch the backend's memory.
  float* host_data(const char* op) { return check_host(op), check_kept(op), values_.as<float>(); }
  float* host_grad(const char* op) { return check_host(op), grad(); }
  const float* host_data(const char* op) const {
    return check_host(op), check_kept(op), values_.as<float>();
  }
  const float* host_grad(const char* op) const { return check_host(op), grad(); }
  float* host_ptr(const std::string& name, const char* op) {
    check_host(op);
    return values_.as<float>() + kept_info(name, op).offset;
  }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  float* ptr(const std::string& name) {
    return values_.as<float>() + kept_info(name, "ParamSet::ptr").offset;
  }
  const float* ptr(const std::string& name) const {
    return values_.as<float>() + kept_info(name, "ParamSet::ptr").offset;
  }
  // The fp32 buffer as it is, dropped parameters included (their elements hold zeros, their
  // pages released): for code that handles the dropped parameters itself (for_runs,
  // fp32_dropped: the optimizer, the gathers, widen_rows' lookups) or only needs addresses (a
  // weight's pointer as a key). Anything else takes data() / ptr(), which refuse.
  float* fp32_storage() { return values_.as<float>(); }
  const float* fp32_storage() const { return values_.as<float>(); }
  float* fp32_storage_ptr(const std::string& name) {
    return values_.as<float>() + info(name).offset;
  }
  const float* fp32_storage_ptr(const std::string& name) const {
    return values_.as<float>() + info(name).offset;
  }
  float* grad_ptr(const std::string& name) { return grad() + info(name).offset; }
  // The gradient a backward pass accumulates into: nullptr for a frozen parameter.
  float* trainable_grad_ptr(const std::string& name) {
    const ParamInfo& p = info(name);
    return p.trainable ? grad() + p.offset : nullptr;
  }

  // ---- The bf16 policy's working copy of the weights: every value again in bf16 (2 bytes),
  // what the bf16 GEMMs read (precision/bf16_gemms.h). Allocated on demand; the optimizer
  // writes it in the same pass as the fp32 values (AdamW::update, write_model) and records the
  // ranges it wrote, which the GEMMs' owner takes (take_bf16_written) to know which weights need
  // no conversion. Writers of the fp32 values that do not write it leave those ranges to be
  // converted again on next use.
  void allocate_bf16_copy();
  uint16_t* bf16_data() { return values_bf16_.empty() ? nullptr : values_bf16_.as<uint16_t>(); }
  const uint16_t* bf16_data() const {
    return values_bf16_.empty() ? nullptr : values_bf16_.as<uint16_t>();
  }
  // [begin, end) of bf16_data() now holds the bf16 bits of the (rounded) fp32 values.
  void note_bf16_written(int64_t begin, int64_t end);
  // The ranges noted since the last call (the list is emptied).
  std::vector<Range> take_bf16_written();
  // How many times note_bf16_written wrote into the copy: a reader that caches something derived
  // from the bf16 values (a packed GEMM operand) knows they may have changed when it differs.
  uint64_t bf16_write_count() const { return bf16_write_count_; }

  // ---- 2-byte weights: under the bf16 policy with the bf16 GEMMs, the parameters those GEMMs
  // read (every linear weight, the tied embedding/head) keep no fp32 values in the model: the
  // bf16 copy is their only model copy (the optimizer's fp32 master is the other). drop_fp32
  // rounds the named parameters' fp32 values into the bf16 copy (allocated before) and returns
  // their fp32 pages to the kernel (host memory only). Writers of the fp32 values through
  // ParamSet (write_values, store_values, copy_values_from, init) round what they write into
  // the copy instead; readers (read_values, host_values, copy_values_to) widen it; code that
  // reads data() in place reads it widened on demand (widen_rows) or through the copy.
  void drop_fp32(const std::vector<std::string>& names);
  bool any_fp32_dropped() const { return dropped_ > 0; }
  // The elements of the set's layout in [a, b) in maximal runs of one kind: fn(lo, hi,
  // dropped), dropped when [lo, hi) lies in parameters whose fp32 values are dropped (padding
  // between parameters counts as kept: it holds zeros in the fp32 buffer).
  void for_runs(int64_t a, int64_t b, const std::function<void(int64_t, int64_t, bool)>& fn) const;
  // Whether the parameter holding flat element `at` (padding: none) has its fp32 values
  // dropped.
  bool fp32_dropped_at(int64_t at) const;
  // The flat elements [a, b) as fp32 into dst (memory of the set's backend): copied, or
  // widened from the bf16 copy where dropped.
  void copy_values_to(float* dst, int64_t a, int64_t b) const;
  // A dropped parameter's rows that `ids` (n token ids, host memory) select, widened from the
  // bf16 copy into its fp32 buffer (an embedding lookup reads them there); release_fp32 returns
  // the pages after the lookup. Rows are global ids: a row shard (tensor parallelism) maps
  // them through global_index, ids it does not hold skipped. Nothing for a kept parameter.
  void widen_rows(const std::string& name, const int32_t* ids, int64_t n);
  void release_fp32(const std::string& name);

  // Host tensors of the values, by name, for host code that reads them or fills them
  // (checkpoint save and load): views on a host-accessible backend (no copy), otherwise host
  // copies staged through copy_d2h. After filling them, store_values copies staged tensors back
  // to the backend (nothing to do for views).
  std::map<std::string, Tensor> host_values() const;
  void store_values(const std::map<std::string, Tensor>& staged);
  // Host views of each parameter (or gradient), by name, for host code that reads or writes
  // them in place (exports, consolidation): host_data's check, naming `op`.
  std::map<std::string, Tensor> tensors(const char* op = nullptr);
  std::map<std::string, Tensor> grad_tensors(const char* op = nullptr);

 private:
  void check_host(const char* op) const;
  // Throws naming `op` and a dropped parameter when any (check_kept) or `name` (kept_info) has
  // its fp32 values dropped.
  void check_kept(const char* op) const {
    if (dropped_ > 0) refuse_dropped(op);
  }
  [[noreturn]] void refuse_dropped(const char* op) const;
  const ParamInfo& kept_info(const std::string& name, const char* op) const;
  // fp32 values of [a, b) (backend memory) into the set: the fp32 buffer where kept, rounded
  // into the bf16 copy where dropped (the writers above).
  void settle_dropped(int64_t a, int64_t b);
  const ParamInfo* info_at(int64_t at) const;

  std::vector<ParamInfo> infos_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0;
  Backend* be_ = nullptr;
  BackendBuffer values_, grads_;  // "parameters" and "gradients" in the memory report
  BackendBuffer values_bf16_;     // "parameters (bf16)": empty unless allocate_bf16_copy()
  std::vector<Range> bf16_written_;
  uint64_t grad_zero_count_ = 0;
  GradZeroing lazy_;
  uint64_t bf16_write_count_ = 0;
  int dropped_ = 0;  // parameters with fp32_dropped
  uint64_t layout_version_ = next_layout_version();
  static uint64_t next_layout_version();
  void layout_changed() { layout_version_ = next_layout_version(); }
};

}  // namespace loom
