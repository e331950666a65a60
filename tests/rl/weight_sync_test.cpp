// Weight sync (rl/weight_sync.h) stages the parameters through the host in chunks
// (ParamSet::read_values / write_values), so it runs on a backend whose memory the host cannot
// touch (the guarded test backend faults on any host access) and sends the same bytes there as
// on the CPU backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/guarded_backend.h"
#include "rl/weight_sync.h"

using namespace loom;
using namespace loom::rl;

namespace {

// Sizes that cut the 4096-element chunks anywhere, padding between parameters included.
ParamSet make(Backend& be) {
  ParamSet P;
  P.add("a", {3, 1500}, true, ParamInit::Normal, 0.5f);
  P.add("b", {7}, false, ParamInit::Ones);
  P.add("c", {5000}, true, ParamInit::Uniform, 0.25f);
  P.allocate(be);
  P.init(3);
  return P;
}

}  // namespace

TEST(WeightSync, StagesParametersThroughTheHostOnAnyBackend) {
  test::GuardedBackend g;
  ParamSet cpu = make(cpu_backend()), dev = make(g);
  const int64_t n = cpu.total();
  ASSERT_GT(n, 2 * 4096);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const WeightMessage want = pack_weights(cpu, dt, 7), got = pack_weights(dev, dt, 7);
    ASSERT_EQ(got.payload.size(), size_t(weight_payload_bytes(n, dt)));
    EXPECT_EQ(got.version, 7);
    EXPECT_EQ(got.payload, want.payload);
    // The payload is the parameters themselves, element by element.
    for (int64_t i = 0; i < n; ++i) {
      if (dt == DType::F32) {
        float v;
        std::memcpy(&v, got.payload.data() + 4 * i, 4);
        ASSERT_EQ(std::memcmp(&v, cpu.data() + i, 4), 0) << i;
      } else {
        uint16_t h;
        std::memcpy(&h, got.payload.data() + 2 * i, 2);
        ASSERT_EQ(h, f32_to_bf16(cpu.data()[i])) << i;
      }
    }
    EXPECT_EQ(weights_hash(dev, dt), weights_hash(cpu, dt));
    // Received into guarded memory: what the CPU set receives, widened from the message.
    ParamSet into_cpu = make(cpu_backend()), into_dev = make(g);
    WeightMessage msg = want;
    EXPECT_EQ(unpack_weights(msg, dt, into_dev), 7);
    EXPECT_EQ(unpack_weights(msg, dt, into_cpu), 7);
    std::vector<float> back(static_cast<size_t>(n));
    into_dev.read_values(0, n, back.data());
    EXPECT_EQ(std::memcmp(back.data(), into_cpu.data(), size_t(n) * 4), 0);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(back[i], dt == DType::F32 ? cpu.data()[i] : bf16_to_f32(f32_to_bf16(cpu.data()[i])))
          << i;
    EXPECT_EQ(weights_hash(into_dev, dt), weights_hash(cpu, dt));
  }
  WeightMessage short_msg;
  short_msg.payload.resize(16);
  EXPECT_THROW(unpack_weights(short_msg, DType::F32, dev), Error);
  WeightMessage negative = pack_weights(cpu, DType::F32, 7);
  negative.version = -1;
  EXPECT_THROW(unpack_weights(negative, DType::F32, dev), Error);
}
