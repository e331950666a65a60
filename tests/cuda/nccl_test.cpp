// The NCCL communicator on one GPU (a one-rank group: the GPU machine has one GPU, and NCCL
// refuses two ranks on one device). Checks bootstrap through a file and through a bootstrap
// communicator, every collective's one-rank semantics, overlap plumbing (Work), and split.
// Multi-rank behaviour needs a machine with several GPUs. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "comm/communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "core/error.h"
#include "cuda/cuda_test_util.h"

namespace loom::comm {
namespace {

using test::DevBuf;
using test::gpu;

TEST(Nccl, OneRankCollectives) {
  LOOM_REQUIRE_GPU();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("loom_nccl_id_" + std::to_string(::getpid())))
          .string();
  auto c = make_nccl_communicator_file(path, 0, 1, 0, gpu()->stream(), 10.0, "dp");
  std::filesystem::remove(path);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->world_rank_of(0), 0);
  std::vector<float> x = {1.f, -2.f, 3.5f, 4.f};
  DevBuf b(x);
  Work w = c->all_reduce_async(b.f(), 4, DType::F32, ReduceOp::Avg);
  w.wait();
  EXPECT_TRUE(w.test());
  EXPECT_EQ(b.get(), x);
  DevBuf out(4 * 4);
  out.poison();
  c->reduce_scatter(b.f(), out.f(), {4}, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(out.get(), x);
  c->all_gather(b.f(), {4}, DType::F32);
  c->broadcast(b.f(), 4, DType::F32, 0);
  EXPECT_EQ(b.get(), x);
  double d[2] = {1.5, -3.0};
  c->all_reduce_f64(d, 2, ReduceOp::Max);
  EXPECT_EQ(d[0], 1.5);
  EXPECT_EQ(d[1], -3.0);
  c->barrier();
  auto sub = c->split(0, 0, "sub");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "sub");
  EXPECT_THROW(c->send(b.f(), 4, DType::F32, 1), loom::Error);

  auto self = make_self_communicator();
  auto c2 = make_nccl_communicator(*self, 0, gpu()->stream());
  EXPECT_EQ(c2->size(), 1);
  c2->all_reduce(b.f(), 4, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(b.get(), x);
}

}  // namespace
}  // namespace loom::comm
