// Two ranks without MPI (tests/comm/pair_communicator.h: the binary forks, a socket pair joins
// the processes), and the staged device communicator over them (comm/staged_communicator.h):
// every operation the model and trainer use gives the expected values, on host memory and on
// the guarded CPU backend's buffers (host access outside its ops faults, as device memory
// would), and receives match their sends by tag when posted in another order.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/staged_communicator.h"
#include "kernels/guarded_backend.h"
#include "pair_communicator.h"

using namespace loom;

namespace {

comm::Communicator* g_world = nullptr;

// Buffers on `be` (host memory on the CPU backend), filled from and read back into vectors.
template <typename T>
struct Buf {
  Buf(Backend& be, const std::vector<T>& v) : be(be), p(be.alloc(v.size() * sizeof(T), "test")) {
    be.copy_h2d(p, v.data(), v.size() * sizeof(T));
    n = v.size();
  }
  ~Buf() { be.free(p); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    be.copy_d2h(v.data(), p, n * sizeof(T));
    return v;
  }
  T* ptr() const { return static_cast<T*>(p); }
  Backend& be;
  void* p;
  size_t n;
};

void exercise(comm::Communicator& c, Backend& be) {
  const int r = c.rank();
  ASSERT_EQ(c.size(), 2);
  // all_reduce: sum, max, average (fp32), sum (int64)
  {
    Buf<float> s(be, {1.f + r, 10.f * (r + 1), -3.f});
    c.all_reduce(s.ptr(), 3, DType::F32, comm::ReduceOp::Sum);
    EXPECT_EQ(s.get(), (std::vector<float>{3.f, 30.f, -6.f}));
    Buf<float> m(be, {float(r), float(-r)});
    c.all_reduce(m.ptr(), 2, DType::F32, comm::ReduceOp::Max);
    EXPECT_EQ(m.get(), (std::vector<float>{1.f, 0.f}));
    Buf<float> a(be, {2.f * r, 4.f});
    c.all_reduce(a.ptr(), 2, DType::F32, comm::ReduceOp::Avg);
    EXPECT_EQ(a.get(), (std::vector<float>{1.f, 4.f}));
    Buf<int64_t> i(be, {int64_t(r) << 40, 7});
    c.all_reduce(i.ptr(), 2, DType::I64, comm::ReduceOp::Sum);
    EXPECT_EQ(i.get(), (std::vector<int64_t>{int64_t(1) << 40, 14}));
  }
  // reduce_scatter with uneven blocks (3 for rank 0, 1 for rank 1)
  {
    Buf<float> send(be, {1.f + r, 2.f + r, 3.f + r, 100.f * (r + 1)});
    Buf<float> recv(be, std::vector<float>(r == 0 ? 3 : 1, -1.f));
    c.reduce_scatter(send.ptr(), recv.ptr(), {3, 1}, DType::F32, comm::ReduceOp::Sum);
    const std::vector<float> want =
        r == 0 ? std::vector<float>{3.f, 5.f, 7.f} : std::vector<float>{300.f};
    EXPECT_EQ(recv.get(), want);
  }
  // the bf16 reduce-scatter: fp32 sums of bf16 blocks
  {
    const uint16_t one = f32_to_bf16(1.f), half = f32_to_bf16(0.5f);
    Buf<uint16_t> send(be, {r == 0 ? one : half, one, half});
    Buf<float> recv(be, std::vector<float>(r == 0 ? 1 : 2, -1.f));
    c.reduce_scatter_bf16(send.ptr(), recv.ptr(), {1, 2});
    const std::vector<float> want =
        r == 0 ? std::vector<float>{1.5f} : std::vector<float>{2.f, 1.f};
    EXPECT_EQ(recv.get(), want);
  }
  // all_gather in place, uneven (rank 0 one element, rank 1 two)
  {
    std::vector<float> v(3, -1.f);
    if (r == 0) v[0] = 5.f;
    if (r == 1) v[1] = 6.f, v[2] = 7.f;
    Buf<float> b(be, v);
    c.all_gather(b.ptr(), {1, 2}, DType::F32);
    EXPECT_EQ(b.get(), (std::vector<float>{5.f, 6.f, 7.f}));
  }
  // broadcast from rank 1 (int32)
  {
    Buf<int32_t> b(be, {r == 1 ? 42 : 0, r == 1 ? -9 : 0});
    c.broadcast(b.ptr(), 2, DType::I32, 1);
    EXPECT_EQ(b.get(), (std::vector<int32_t>{42, -9}));
  }
  // point to point, tags posted in another order than sent: each receive gets its tag's message
  {
    const int peer = 1 - r;
    Buf<float> a(be, {10.f * r + 1, 10.f * r + 2}), b(be, {10.f * r + 3});
    Buf<float> ra(be, {0.f, 0.f}), rb(be, {0.f});
    comm::Work wb = c.recv_async(rb.ptr(), 1, DType::F32, peer, 8);  // tag 8 first
    comm::Work wa = c.recv_async(ra.ptr(), 2, DType::F32, peer, 7);
    comm::Work sa = c.send_async(a.ptr(), 2, DType::F32, peer, 7);  // tag 7 sent first
    comm::Work sb = c.send_async(b.ptr(), 1, DType::F32, peer, 8);
    wb.wait();
    wa.wait();
    sa.wait();
    sb.wait();
    EXPECT_EQ(ra.get(), (std::vector<float>{10.f * peer + 1, 10.f * peer + 2}));
    EXPECT_EQ(rb.get(), (std::vector<float>{10.f * peer + 3}));
  }
  // all_to_all: block j of rank i's send lands in block i of rank j's receive
  {
    Buf<float> send(be, {10.f * r, 10.f * r + 1, 10.f * r + 2, 10.f * r + 3});
    Buf<float> recv(be, std::vector<float>(4, -1.f));
    c.all_to_all(send.ptr(), recv.ptr(), 2, DType::F32);
    EXPECT_EQ(recv.get(),
              (std::vector<float>{0.f + 2 * r, 1.f + 2 * r, 10.f + 2 * r, 11.f + 2 * r}));
  }
  // host doubles, a barrier, and splits: one color keeps both ranks (keys reversing them),
  // two colors give groups of one
  {
    double d[2] = {0.25 * (r + 1), double(r)};
    c.all_reduce_f64(d, 2, comm::ReduceOp::Sum);
    EXPECT_EQ(d[0], 0.75);
    EXPECT_EQ(d[1], 1.0);
    c.barrier();
    auto both = c.split(0, 1 - r, "both");
    ASSERT_EQ(both->size(), 2);
    EXPECT_EQ(both->rank(), 1 - r);
    Buf<float> s(be, {float(r + 1)});
    both->all_reduce(s.ptr(), 1, DType::F32, comm::ReduceOp::Sum);
    EXPECT_EQ(s.get(), (std::vector<float>{3.f}));
    auto alone = c.split(r, 0, "alone");
    EXPECT_EQ(alone->size(), 1);
  }
}

}  // namespace

TEST(PairComm, EveryOperationOnHostMemory) {
  exercise(*g_world, cpu_backend());
}

// The staged communicator over the guarded backend: every operation reads and writes the
// buffers only through Backend copies (a host touch would fault), with the same results.
TEST(PairComm, StagedCommunicatorMovesGuardedBuffers) {
  test::GuardedBackend g;
  auto staged = comm::make_staged_communicator(*g_world, g);
  EXPECT_EQ(staged->rank(), g_world->rank());
  const int64_t before = g.ops();
  exercise(*staged, g);
  // (The buffers really are the guarded backend's: their fills, reads and the staging copies
  // all count as its operations.)
  EXPECT_GT(g.ops() - before, 40);
}

// A message whose size differs from the receive's is an error naming both, not a silent
// truncation.
TEST(PairComm, SizeMismatchIsAnError) {
  comm::Communicator& c = *g_world;
  const int peer = 1 - c.rank();
  float x[3] = {1, 2, 3};
  if (c.rank() == 0) {
    c.send(x, 3, DType::F32, peer, 5);
  } else {
    try {
      c.recv(x, 2, DType::F32, peer, 5);
      ADD_FAILURE() << "a 3-element message was received into 2 elements";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds 12 bytes, the receiver expected 8"),
                std::string::npos)
          << e.what();
    }
  }
  c.barrier();
}

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return test::run_all_tests_as_pair(&g_world, 120);
}
