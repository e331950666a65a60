#include "comm/staged_communicator.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"

namespace loom::comm {
namespace {

using Bytes = std::vector<char>;

// The host operation, the host buffers it reads and writes (kept alive until it is done), and
// the upload of its result into device memory.
struct StagedWork : Work::Impl {
  Work inner;
  std::vector<std::shared_ptr<Bytes>> keep;
  std::function<void()> on_done;
  bool done = false;

  void finish() {
    done = true;
    if (on_done) on_done();
    on_done = nullptr;
    keep.clear();
  }
  bool test() override {
    if (done) return true;
    if (!inner.test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (done) return;
    inner.wait();
    finish();
  }
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> owned, Communicator& host, Backend& be)
      : owned_(std::move(owned)), host_(host), be_(be) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int world_rank_of(int r) const override { return host_.world_rank_of(r); }
  std::string name() const override { return host_.name() + "-staged"; }

  Work all_reduce_async(void* buf, int64_t n, DType t, ReduceOp op) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    auto w = std::make_shared<StagedWork>();
    char* h = stage(*w, bytes);
    down(h, buf, bytes);
    w->inner = host_.all_reduce_async(h, n, t, op);
    w->on_done = [this, buf, h, bytes] { up(buf, h, bytes); };
    return Work(w);
  }

  Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                            DType t, ReduceOp op) override {
    check_counts(counts, "reduce_scatter");
    const size_t es = dtype_size(t), total = size_t(sum(counts)) * es;
    const size_t mine = size_t(counts[size_t(rank())]) * es;
    auto w = std::make_shared<StagedWork>();
    char* hs = stage(*w, total);
    char* hr = stage(*w, mine);
    down(hs, send, total);
    w->inner = host_.reduce_scatter_async(hs, hr, counts, t, op);
    w->on_done = [this, recv, hr, mine] { up(recv, hr, mine); };
    return Work(w);
  }

  Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                 const std::vector<int64_t>& counts) override {
    check_counts(counts, "reduce_scatter_bf16");
    const size_t total = size_t(sum(counts)) * sizeof(uint16_t);
    const size_t mine = size_t(counts[size_t(rank())]) * sizeof(float);
    auto w = std::make_shared<StagedWork>();
    char* hs = stage(*w, total);
    char* hr = stage(*w, mine);
    down(hs, send, total);
    w->inner = host_.reduce_scatter_bf16_async(reinterpret_cast<const uint16_t*>(hs),
                                               reinterpret_cast<float*>(hr), counts);
    w->on_done = [this, recv, hr, mine] { up(recv, hr, mine); };
    return Work(w);
  }

  // In place: only this rank's block goes down (the others' bytes are received).
  Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) override {
    check_counts(counts, "all_gather");
    const size_t es = dtype_size(t), total = size_t(sum(counts)) * es;
    const size_t off =
        size_t(std::accumulate(counts.begin(), counts.begin() + rank(), int64_t(0))) * es;
    const size_t mine = size_t(counts[size_t(rank())]) * es;
    auto w = std::make_shared<StagedWork>();
    char* h = stage(*w, total);
    down(h + off, static_cast<const char*>(buf) + off, mine);
    w->inner = host_.all_gather_async(h, counts, t);
    w->on_done = [this, buf, h, total] { up(buf, h, total); };
    return Work(w);
  }

  Work broadcast_async(void* buf, int64_t n, DType t, int root) override {
    LOOM_CHECK(root >= 0 && root < size(), name(), ": broadcast root ", root, " out of range");
    const size_t bytes = size_t(n) * dtype_size(t);
    auto w = std::make_shared<StagedWork>();
    char* h = stage(*w, bytes);
    const bool from_here = rank() == root;
    if (from_here) down(h, buf, bytes);
    w->inner = host_.broadcast_async(h, n, t, root);
    if (!from_here) w->on_done = [this, buf, h, bytes] { up(buf, h, bytes); };
    return Work(w);
  }

  Work send_async(const void* buf, int64_t n, DType t, int peer, int tag) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    auto w = std::make_shared<StagedWork>();
    char* h = stage(*w, bytes);
    down(h, buf, bytes);
    w->inner = host_.send_async(h, n, t, peer, tag);
    return Work(w);
  }

  Work recv_async(void* buf, int64_t n, DType t, int peer, int tag) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    auto w = std::make_shared<StagedWork>();
    char* h = stage(*w, bytes);
    w->inner = host_.recv_async(h, n, t, peer, tag);
    w->on_done = [this, buf, h, bytes] { up(buf, h, bytes); };
    return Work(w);
  }

  Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    const size_t bytes = size_t(n) * dtype_size(t) * size_t(size());
    auto w = std::make_shared<StagedWork>();
    char* hs = stage(*w, bytes);
    char* hr = stage(*w, bytes);
    down(hs, send, bytes);
    w->inner = host_.all_to_all_async(hs, hr, n, t);
    w->on_done = [this, recv, hr, bytes] { up(recv, hr, bytes); };
    return Work(w);
  }

  void barrier() override { host_.barrier(); }
  void all_reduce_f64(double* buf, int64_t n, ReduceOp op) override {
    host_.all_reduce_f64(buf, n, op);  // host doubles (norms, loss sums) by the interface
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    auto sub = host_.split(color, key, name);
    if (!sub) return nullptr;
    Communicator& ref = *sub;
    return std::make_unique<StagedCommunicator>(std::move(sub), ref, be_);
  }

 private:
  static int64_t sum(const std::vector<int64_t>& c) {
    return std::accumulate(c.begin(), c.end(), int64_t(0));
  }
  void check_counts(const std::vector<int64_t>& c, const char* op) const {
    LOOM_CHECK(c.size() == size_t(size()), name(), ": ", op, " needs one count per rank (", size(),
               "), got ", c.size());
  }
  // A host buffer of `bytes` that lives as long as the operation.
  static char* stage(StagedWork& w, size_t bytes) {
    w.keep.push_back(std::make_shared<Bytes>(std::max<size_t>(bytes, 1)));
    return w.keep.back()->data();
  }
  void down(void* host, const void* dev, size_t bytes) {
    if (bytes) be_.copy_d2h(host, dev, bytes);
  }
  void up(void* dev, const void* host, size_t bytes) {
    if (bytes) be_.copy_h2d(dev, host, bytes);
  }

  std::unique_ptr<Communicator> owned_;
  Communicator& host_;
  Backend& be_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host,
                                                       Backend& be) {
  LOOM_CHECK(host, "a staged communicator needs a host communicator");
  Communicator& ref = *host;
  return std::make_unique<StagedCommunicator>(std::move(host), ref, be);
}

std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, Backend& be) {
  return std::make_unique<StagedCommunicator>(nullptr, host, be);
}

}  // namespace loom::comm
