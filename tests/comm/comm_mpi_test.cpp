// Every communicator operation on real MPI ranks (run with mpirun -n 2 and -n 4), uneven and
// empty counts included, plus process groups built from the rank generator.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "mpi_main.h"

using namespace loom;
using namespace loom::comm;

namespace {
Communicator& W() {
  return world();
}
}  // namespace

TEST(CommMpi, WorldIsDistributed) {
  EXPECT_GT(W().size(), 1);
  EXPECT_TRUE(launched_distributed());
}

TEST(CommMpi, AllReduceSumAvgMax) {
  const int r = W().rank(), n = W().size();
  std::vector<float> x = {float(r), float(2 * r + 1), -float(r)};
  W().all_reduce(x.data(), 3, DType::F32, ReduceOp::Sum);
  float s = n * (n - 1) / 2.f;
  EXPECT_EQ(x[0], s);
  EXPECT_EQ(x[1], 2 * s + n);
  std::vector<float> a = {float(r)};
  W().all_reduce(a.data(), 1, DType::F32, ReduceOp::Avg);
  EXPECT_FLOAT_EQ(a[0], s / n);
  std::vector<int64_t> m = {r, -r};
  W().all_reduce(m.data(), 2, DType::I64, ReduceOp::Max);
  EXPECT_EQ(m[0], n - 1);
  EXPECT_EQ(m[1], 0);
  EXPECT_DOUBLE_EQ(W().all_reduce_scalar(0.5 * r, ReduceOp::Sum), 0.5 * s);
}

TEST(CommMpi, AsyncOperationsOverlapAndComplete) {
  const int r = W().rank(), n = W().size();
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1000, float(r + 1)));
  std::vector<Work> works;
  for (auto& b : bufs)
    works.push_back(W().all_reduce_async(b.data(), 1000, DType::F32, ReduceOp::Sum));
  while (!works[0].test()) {
  }
  for (auto& w : works) w.wait();
  for (auto& b : bufs) EXPECT_EQ(b[999], n * (n + 1) / 2.f);
}

TEST(CommMpi, ReduceScatterWithUnevenAndEmptyCounts) {
  const int r = W().rank(), n = W().size();
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = i == 1 ? 0 : i + 2;  // rank 1 receives nothing
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<float> send(total);
  for (int64_t i = 0; i < total; ++i) send[i] = float(i * (r + 1));
  std::vector<float> recv(std::max<int64_t>(1, counts[r]), -1.f);
  W().reduce_scatter(send.data(), recv.data(), counts, DType::F32, ReduceOp::Sum);
  int64_t off = 0;
  for (int i = 0; i < r; ++i) off += counts[i];
  float ranks = n * (n + 1) / 2.f;
  for (int64_t i = 0; i < counts[r]; ++i) EXPECT_EQ(recv[i], float(off + i) * ranks);
}

TEST(CommMpi, AllGatherInPlaceUneven) {
  const int r = W().rank(), n = W().size();
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = 3 - (i % 3);
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0)), off = 0;
  for (int i = 0; i < r; ++i) off += counts[i];
  std::vector<float> buf(total, -1.f);
  for (int64_t i = 0; i < counts[r]; ++i) buf[off + i] = float(100 * r + i);
  W().all_gather(buf.data(), counts, DType::F32);
  int64_t p = 0;
  for (int i = 0; i < n; ++i)
    for (int64_t j = 0; j < counts[i]; ++j) EXPECT_EQ(buf[p++], float(100 * i + j));
}

TEST(CommMpi, BroadcastSendRecvAllToAll) {
  const int r = W().rank(), n = W().size();
  std::vector<int32_t> b(5, r == n - 1 ? 7 : 0);
  W().broadcast(b.data(), 5, DType::I32, n - 1);
  EXPECT_EQ(b[4], 7);
  // Ring: send to the right, receive from the left.
  float out = float(r), in = -1;
  Work s = W().send_async(&out, 1, DType::F32, (r + 1) % n);
  W().recv(&in, 1, DType::F32, (r + n - 1) % n);
  s.wait();
  EXPECT_EQ(in, float((r + n - 1) % n));
  std::vector<int32_t> send(2 * n), recv(2 * n);
  for (int i = 0; i < n; ++i) send[2 * i] = send[2 * i + 1] = 10 * r + i;
  W().all_to_all(send.data(), recv.data(), 2, DType::I32);
  for (int i = 0; i < n; ++i) EXPECT_EQ(recv[2 * i + 1], 10 * i + r);
  W().barrier();
}

TEST(CommMpi, ProcessGroupsMatchTheGenerator) {
  const int n = W().size();
  ParallelDims d;
  d.tp = n >= 4 ? 2 : 1;
  ProcessGroups pg(W(), d);
  EXPECT_EQ(pg.tp().size() * pg.dp().size(), n);
  EXPECT_EQ(pg.tp().rank(), pg.coords().tp);
  EXPECT_EQ(pg.dp().rank(), pg.coords().dp);
  // Summing world ranks over the tp group gives the generator's members' sum.
  int64_t sum = pg.tp().all_reduce_scalar(static_cast<int64_t>(W().rank()), ReduceOp::Sum);
  auto members = pg.generator().group_of("tp", W().rank());
  EXPECT_EQ(sum, std::accumulate(members.begin(), members.end(), int64_t(0)));
  for (int i = 0; i < pg.dp().size(); ++i)
    EXPECT_EQ(pg.dp().world_rank_of(i), pg.generator().group_of("dp", W().rank())[i]);
  EXPECT_EQ(pg.tp_dp().size(), n);
}

// bf16 payloads summed in fp32: the sum is exactly the rank-order fp32 sum of every rank's bf16
// values (computed here from the values each rank sends), not rounded back to bf16. Values with
// 3 significant bf16 digits and wide exponents make an fp32 sum differ from a bf16 one.
float bf16_value(int rank, int64_t i) {
  return round_bf16(
      std::ldexp(1.f + 0.37f * float((i * 7 + rank * 13) % 11), int((i + 3 * rank) % 9) - 4) *
      (rank % 2 ? -1.f : 1.f) / 3.f);
}

TEST(CommMpi, ReduceScatterBf16SumsInFp32UnevenAndEmpty) {
  const int r = W().rank(), n = W().size();
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = i == 1 ? 0 : 3 * i + 5;  // rank 1 receives nothing
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  std::vector<uint16_t> send(total);
  for (int64_t i = 0; i < total; ++i) send[i] = f32_to_bf16(bf16_value(r, i));
  std::vector<float> recv(std::max<int64_t>(1, counts[r]), -1.f);
  Work w = W().reduce_scatter_bf16_async(send.data(), recv.data(), counts);
  w.wait();
  int64_t off = 0;
  for (int i = 0; i < r; ++i) off += counts[i];
  int rounded_differs = 0;
  for (int64_t i = 0; i < counts[r]; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += bf16_value(q, off + i);
    EXPECT_EQ(recv[i], want) << "element " << i;
    rounded_differs += round_bf16(want) != want;
  }
  if (counts[r] > 0) {
    EXPECT_GT(rounded_differs, 0) << "the values should tell an fp32 sum from a bf16 one";
  }
}

TEST(CommMpi, ReductionsOverBf16AreRejected) {
  uint16_t x = 0;
  EXPECT_THROW(W().all_reduce(&x, 1, DType::BF16, ReduceOp::Sum), Error);
}

LOOM_MPI_TEST_MAIN()
