// Two ranks without MPI, for tests on machines that have no Open MPI (the GPU machine has only the
// CUDA toolkit): run_pair() forks the test binary into two processes joined by a Unix socket pair,
// and each gets a host Communicator of two ranks over it (PairCommunicator). Messages carry their
// tag, so a receive matches its send by tag as under MPI; collectives run eagerly (blocking) in
// call order, each with its own internal tag; sums combine rank 0's value with rank 1's, as MPI
// does for two ranks. A reader thread per process drains the socket into a mailbox, so a send
// never waits for the peer to receive (no deadlock when both ranks send first). Every wait has
// a timeout, and a peer that dies closes the socket: the other rank fails instead of hanging.
//
// Fork before anything starts threads or touches a GPU (the first thing main() does).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace loom::test {

// One socket, its reader thread and the mailbox of received messages, keyed by (channel, tag);
// shared by a PairCommunicator and its splits (each split its own channel).
class PairLink {
 public:
  explicit PairLink(int fd, double timeout_s) : fd_(fd), timeout_s_(timeout_s) {
    reader_ = std::thread([this] { read_loop(); });
  }
  ~PairLink() {
    ::shutdown(fd_, SHUT_RDWR);  // ends the reader's read
    reader_.join();
    ::close(fd_);
  }
  PairLink(const PairLink&) = delete;
  PairLink& operator=(const PairLink&) = delete;

  void send(int64_t channel, int64_t tag, const void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(write_mu_);
    const int64_t hdr[3] = {channel, tag, int64_t(bytes)};
    write_all(hdr, sizeof hdr);
    write_all(p, bytes);
  }

  // The oldest message on (channel, tag) into `out`: waits up to the timeout when `block`,
  // else returns false when none has arrived. Throws when the peer is gone or time is up.
  bool take(int64_t channel, int64_t tag, std::vector<char>& out, bool block) {
    std::unique_lock<std::mutex> lk(mu_);
    const auto key = std::make_pair(channel, tag);
    auto ready = [&] {
      auto it = box_.find(key);
      return (it != box_.end() && !it->second.empty()) || closed_;
    };
    if (!block && !ready()) return false;
    LOOM_CHECK(cv_.wait_for(lk, std::chrono::duration<double>(timeout_s_), ready),
               "pair communicator: no message (channel ", channel, ", tag ", tag, ") within ",
               timeout_s_, " s");
    auto it = box_.find(key);
    LOOM_CHECK(it != box_.end() && !it->second.empty(),
               "pair communicator: the peer closed the connection (it failed or exited) while ",
               "this rank waited for tag ", tag);
    out = std::move(it->second.front());
    it->second.pop_front();
    return true;
  }

 private:
  void write_all(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::send(fd_, c, n, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      LOOM_CHECK(w > 0, "pair communicator: send failed: ", std::strerror(errno));
      c += w;
      n -= size_t(w);
    }
  }
  bool read_all(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = ::read(fd_, c, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r;
      n -= size_t(r);
    }
    return true;
  }
  void read_loop() {
    for (;;) {
      int64_t hdr[3];
      if (!read_all(hdr, sizeof hdr)) break;
      std::vector<char> v(static_cast<size_t>(hdr[2]));
      if (!read_all(v.data(), v.size())) break;
      {
        std::lock_guard<std::mutex> g(mu_);
        box_[{hdr[0], hdr[1]}].push_back(std::move(v));
      }
      cv_.notify_all();
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  int fd_;
  double timeout_s_;
  std::thread reader_;
  std::mutex mu_, write_mu_;
  std::condition_variable cv_;
  std::map<std::pair<int64_t, int64_t>, std::deque<std::vector<char>>> box_;
  bool closed_ = false;
};

class PairCommunicator final : public comm::Communicator {
 public:
  PairCommunicator(std::shared_ptr<PairLink> link, int rank, int64_t channel, std::string name,
                   std::vector<int> world_ranks = {0, 1})
      : link_(std::move(link)),
        rank_(rank),
        channel_(channel),
        name_(std::move(name)),
        world_(std::move(world_ranks)) {}

  int rank() const override { return rank_; }
  int size() const override { return 2; }
  int world_rank_of(int r) const override { return world_.at(size_t(r)); }
  std::string name() const override { return name_; }

  comm::Work all_reduce_async(void* buf, int64_t n, DType t, comm::ReduceOp op) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    const std::vector<char> theirs = exchange(buf, bytes);
    combine(buf, theirs.data(), n, t, op);
    return {};
  }
  void all_reduce_f64(double* buf, int64_t n, comm::ReduceOp op) override {
    const std::vector<char> theirs = exchange(buf, size_t(n) * sizeof(double));
    const double* o = reinterpret_cast<const double*>(theirs.data());
    for (int64_t i = 0; i < n; ++i) {
      const double a = rank_ == 0 ? buf[i] : o[i], b = rank_ == 0 ? o[i] : buf[i];
      buf[i] = op == comm::ReduceOp::Max   ? std::max(a, b)
               : op == comm::ReduceOp::Avg ? (a + b) / 2
                                           : a + b;
    }
  }
  comm::Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DType t, comm::ReduceOp op) override {
    check_counts(counts);
    const size_t es = dtype_size(t);
    const char* s = static_cast<const char*>(send);
    const size_t mine_off = rank_ == 0 ? 0 : size_t(counts[0]) * es;
    const size_t their_off = rank_ == 0 ? size_t(counts[0]) * es : 0;
    const int64_t mine = counts[size_t(rank_)];
    const std::vector<char> theirs =
        exchange(s + their_off, size_t(counts[size_t(1 - rank_)]) * es, size_t(mine) * es);
    std::memcpy(recv, s + mine_off, size_t(mine) * es);
    combine(recv, theirs.data(), mine, t, op);
    return {};
  }
  comm::Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                       const std::vector<int64_t>& counts) override {
    check_counts(counts);
    const int64_t mine = counts[size_t(rank_)];
    const uint16_t* own = send + (rank_ == 0 ? 0 : counts[0]);
    const uint16_t* out = send + (rank_ == 0 ? counts[0] : 0);
    const std::vector<char> theirs =
        exchange(out, size_t(counts[size_t(1 - rank_)]) * 2, size_t(mine) * 2);
    const uint16_t* o = reinterpret_cast<const uint16_t*>(theirs.data());
    for (int64_t i = 0; i < mine; ++i) {  // fp32 sums in rank order 0, 1
      const uint16_t a = rank_ == 0 ? own[i] : o[i], b = rank_ == 0 ? o[i] : own[i];
      recv[i] = bf16_to_f32(a);
      recv[i] += bf16_to_f32(b);
    }
    return {};
  }
  comm::Work all_gather_async(void* buf, const std::vector<int64_t>& counts, DType t) override {
    check_counts(counts);
    const size_t es = dtype_size(t);
    char* b = static_cast<char*>(buf);
    const size_t mine_off = rank_ == 0 ? 0 : size_t(counts[0]) * es;
    const size_t their_off = rank_ == 0 ? size_t(counts[0]) * es : 0;
    const size_t their_bytes = size_t(counts[size_t(1 - rank_)]) * es;
    const std::vector<char> theirs =
        exchange(b + mine_off, size_t(counts[size_t(rank_)]) * es, their_bytes);
    if (their_bytes) std::memcpy(b + their_off, theirs.data(), their_bytes);
    return {};
  }
  comm::Work broadcast_async(void* buf, int64_t n, DType t, int root) override {
    LOOM_CHECK(root == 0 || root == 1, name_, ": broadcast root ", root, " out of range");
    const size_t bytes = size_t(n) * dtype_size(t);
    const int64_t tag = next_tag();
    if (rank_ == root) {
      link_->send(channel_, tag, buf, bytes);
    } else {
      std::vector<char> v;
      link_->take(channel_, tag, v, true);
      expect_bytes(v, bytes, tag);
      if (bytes) std::memcpy(buf, v.data(), bytes);
    }
    return {};
  }
  comm::Work send_async(const void* buf, int64_t n, DType t, int peer, int tag) override {
    check_peer(peer, tag);
    link_->send(channel_, tag, buf, size_t(n) * dtype_size(t));
    return {};  // the bytes are in the socket or the peer's mailbox
  }
  comm::Work recv_async(void* buf, int64_t n, DType t, int peer, int tag) override {
    check_peer(peer, tag);
    return comm::Work(std::make_shared<Recv>(*this, buf, size_t(n) * dtype_size(t), tag));
  }
  comm::Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    const size_t bytes = size_t(n) * dtype_size(t);
    const char* s = static_cast<const char*>(send);
    char* r = static_cast<char*>(recv);
    const std::vector<char> theirs = exchange(s + size_t(1 - rank_) * bytes, bytes);
    if (bytes) {
      std::memcpy(r + size_t(rank_) * bytes, s + size_t(rank_) * bytes, bytes);
      std::memcpy(r + size_t(1 - rank_) * bytes, theirs.data(), bytes);
    }
    return {};
  }
  void barrier() override { exchange(nullptr, 0); }

  // Collective: the ranks exchange (color, key); the same color gives a pair on a channel of its
  // own (numbered by call order, the same on both ranks), another color a group of one.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    const int64_t mine[2] = {color, key};
    const std::vector<char> v = exchange(mine, sizeof mine);
    const int64_t* theirs = reinterpret_cast<const int64_t*>(v.data());
    const int64_t channel = channel_ * 64 + (++children_);
    if (theirs[0] != color) return comm::make_self_communicator(name);
    // Ranks by (key, old rank).
    const bool first = std::make_pair(int64_t(key), rank_) < std::make_pair(theirs[1], 1 - rank_);
    const int r = first ? 0 : 1;
    std::vector<int> world(2);
    world[size_t(r)] = world_rank_of(rank_);
    world[size_t(1 - r)] = world_rank_of(1 - rank_);
    return std::make_unique<PairCommunicator>(link_, r, channel, name, world);
  }

 private:
  struct Recv : comm::Work::Impl {
    Recv(PairCommunicator& c, void* b, size_t n, int t) : comm(c), buf(b), bytes(n), tag(t) {}
    bool test() override { return done || finish(false); }
    void wait() override {
      if (!done) finish(true);
    }
    bool finish(bool block) {
      std::vector<char> v;
      if (!comm.link_->take(comm.channel_, tag, v, block)) return false;
      comm.expect_bytes(v, bytes, tag);
      if (bytes) std::memcpy(buf, v.data(), bytes);
      done = true;
      return true;
    }
    PairCommunicator& comm;
    void* buf;
    size_t bytes;
    int tag;
    bool done = false;
  };

  // Collectives use negative tags (user messages are >= 0), one per call in call order.
  int64_t next_tag() { return -(++collectives_); }
  // Sends `bytes` from p, returns the peer's message of the same collective (`expect` bytes).
  std::vector<char> exchange(const void* p, size_t bytes, size_t expect = size_t(-1)) {
    const int64_t tag = next_tag();
    link_->send(channel_, tag, p, bytes);
    std::vector<char> v;
    link_->take(channel_, tag, v, true);
    expect_bytes(v, expect == size_t(-1) ? bytes : expect, tag);
    return v;
  }
  void expect_bytes(const std::vector<char>& v, size_t bytes, int64_t tag) const {
    LOOM_CHECK(v.size() == bytes, name_, ": message with tag ", tag, " holds ", v.size(),
               " bytes, the receiver expected ", bytes);
  }
  // buf <- rank 0's value op rank 1's value (this rank's is in buf, the peer's in o).
  void combine(void* buf, const void* o, int64_t n, DType t, comm::ReduceOp op) const {
    auto apply = [&](auto* mine, const auto* theirs) {
      for (int64_t i = 0; i < n; ++i) {
        const auto a = rank_ == 0 ? mine[i] : theirs[i], b = rank_ == 0 ? theirs[i] : mine[i];
        mine[i] = op == comm::ReduceOp::Max ? std::max(a, b) : a + b;
      }
    };
    switch (t) {
      case DType::F32:
        apply(static_cast<float*>(buf), static_cast<const float*>(o));
        if (op == comm::ReduceOp::Avg)  // as the MPI communicator: the sum times 1/size
          for (int64_t i = 0; i < n; ++i)
            static_cast<float*>(buf)[i] = static_cast<float>(static_cast<float*>(buf)[i] * 0.5);
        return;
      case DType::I32:
        LOOM_CHECK(op != comm::ReduceOp::Avg, name_, ": average of integers");
        return apply(static_cast<int32_t*>(buf), static_cast<const int32_t*>(o));
      case DType::I64:
        LOOM_CHECK(op != comm::ReduceOp::Avg, name_, ": average of integers");
        return apply(static_cast<int64_t*>(buf), static_cast<const int64_t*>(o));
      default:
        fail(name_, ": reductions over ", dtype_name(t), " are not supported");
    }
  }
  void check_counts(const std::vector<int64_t>& c) const {
    LOOM_CHECK(c.size() == 2, name_, ": needs one count per rank (2), got ", c.size());
  }
  void check_peer(int peer, int tag) const {
    LOOM_CHECK(peer == 1 - rank_, name_, ": bad peer ", peer, " for rank ", rank_);
    LOOM_CHECK(tag >= 0, name_, ": negative tag ", tag);
  }

  std::shared_ptr<PairLink> link_;
  int rank_;
  int64_t channel_;
  std::string name_;
  std::vector<int> world_;
  int64_t collectives_ = 0, children_ = 0;
};

// Forks into rank 0 (this process) and rank 1 (the child), runs body(world) in both, and returns
// the worse of the two results (the child's exit status; a child that does not end within
// `timeout_s` after rank 0 finished is killed and counts as a failure).
inline int run_pair(const std::function<int(comm::Communicator&)>& body, double timeout_s = 300) {
  int sv[2];
  LOOM_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0,
             "socketpair failed: ", std::strerror(errno));
  const pid_t child = ::fork();
  LOOM_CHECK(child >= 0, "fork failed: ", std::strerror(errno));
  const int rank = child == 0 ? 1 : 0;
  ::close(sv[child == 0 ? 0 : 1]);
  int rc = 1;
  {
    auto link = std::make_shared<PairLink>(sv[rank], timeout_s);
    PairCommunicator world(link, rank, 1, "pair-world");
    try {
      rc = body(world);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      rc = 1;
    }
  }
  if (rank == 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(rc);  // no parent's atexit handlers or gtest teardown in the child
  }
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(timeout_s)) {
      std::fprintf(stderr, "rank 1 did not finish within %.0f s: killed\n", timeout_s);
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok) std::fprintf(stderr, "rank 1 failed (status %d)\n", status);
  return rc != 0 || !child_ok ? 1 : 0;
}

// A gtest binary's main over two forked ranks: *world is set to each rank's communicator, rank 1
// prints nothing of its own, and the exit status is the worse of the two ranks' RUN_ALL_TESTS.
inline int run_all_tests_as_pair(comm::Communicator** world, double timeout_s) {
  return run_pair(
      [world](comm::Communicator& w) {
        *world = &w;
        if (w.rank() != 0) {
          auto& listeners = testing::UnitTest::GetInstance()->listeners();
          delete listeners.Release(listeners.default_result_printer());
        }
        const int rc = RUN_ALL_TESTS();
        return int(w.all_reduce_scalar(int64_t(rc), comm::ReduceOp::Max));
      },
      timeout_s);
}

}  // namespace loom::test
