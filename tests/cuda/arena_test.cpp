// DeviceArena / BumpRegion bookkeeping with a host allocator standing in for cudaMalloc.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "kernels/cuda/arena.h"

namespace loom {
namespace {

struct CountingAlloc {
  int allocs = 0, frees = 0;
  std::set<void*> live;
  DeviceArena make() {
    return DeviceArena(
        [this](size_t n) {
          ++allocs;
          void* p = std::aligned_alloc(256, align_up(n, 256));
          live.insert(p);
          return p;
        },
        [this](void* p) {
          ++frees;
          live.erase(p);
          std::free(p);
        });
  }
};

TEST(Arena, OneAllocationPerClassAndAlignedBuffers) {
  CountingAlloc ca;
  {
    DeviceArena a = ca.make();
    a.reserve("params", 1000);
    a.reserve("params", 24);  // rounded to 256 each
    a.reserve("grads", 4096);
    EXPECT_EQ(a.planned("params"), 1024u + 256u);
    BumpRegion& p = a.commit("params");
    BumpRegion& g = a.commit("grads");
    EXPECT_EQ(ca.allocs, 2);
    EXPECT_EQ(a.allocations(), 2u);
    void* x = p.take(1000);
    void* y = p.take(24);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x) % 256, 0u);
    EXPECT_EQ(static_cast<char*>(y) - static_cast<char*>(x), 1024);
    EXPECT_EQ(p.used(), p.capacity());
    g.take(4096);
    EXPECT_EQ(a.total_capacity(), 1280u + 4096u);
    EXPECT_EQ(a.total_peak(), 1280u + 4096u);
    // Adding a class later does not move the regions already handed out.
    BumpRegion& w = a.create("workspace", 512);
    EXPECT_EQ(&a.region("params"), &p);
    EXPECT_EQ(w.capacity(), 512u);
    EXPECT_EQ(ca.allocs, 3);
    EXPECT_NE(a.report().find("params"), std::string::npos);
  }
  EXPECT_EQ(ca.frees, 3);
  EXPECT_TRUE(ca.live.empty());
}

TEST(Arena, OverflowNamesTheClassAndTheRequest) {
  CountingAlloc ca;
  DeviceArena a = ca.make();
  BumpRegion& r = a.create("activations", 1024);
  r.take(512, "ln1");
  try {
    r.take(1024, "qkv");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qkv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1024"), std::string::npos) << msg;
  }
  EXPECT_EQ(r.used(), 512u);  // a failed take changes nothing
}

TEST(Arena, ScratchIsStackLikeAndPeakIsKept) {
  CountingAlloc ca;
  DeviceArena a = ca.make();
  BumpRegion& ws = a.create("workspace", 8192);
  ws.take(256);
  {
    ScratchScope s(ws);
    ws.take(4096);
    EXPECT_EQ(ws.used(), 256u + 4096u);
  }
  EXPECT_EQ(ws.used(), 256u);
  EXPECT_EQ(ws.peak(), 256u + 4096u);
  {
    ScratchScope s(ws);
    ws.take(1024);
  }
  EXPECT_EQ(ws.peak(), 256u + 4096u);
  EXPECT_THROW(ws.release(999999), Error);
}

TEST(Arena, MisuseIsAnError) {
  CountingAlloc ca;
  DeviceArena a = ca.make();
  EXPECT_THROW(a.commit("nothing"), Error);
  a.create("x", 10);
  EXPECT_THROW(a.commit("x"), Error);
  EXPECT_THROW(a.reserve("x", 10), Error);
  EXPECT_THROW(a.region("y"), Error);
  DeviceArena failing([](size_t) -> void* { return nullptr; }, [](void*) {});
  failing.reserve("big", 1 << 20);
  EXPECT_THROW(failing.commit("big"), Error);
}

}  // namespace
}  // namespace loom
