// The step replay (step_replay.h) makes exactly the Decoder's backend calls: on the CPU
// backend both give bit-identical losses and gradients. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "cuda/step_fixture.h"
#include "cuda/step_replay.h"
#include "model/decoder.h"

namespace loom {
namespace {

void check_replay(const std::string& preset) {
  const ModelConfig cfg = model_preset(preset);
  const test::StepBatch b = test::make_batch(cfg, {0, 64, 100, 128}, 17);
  Decoder m(cfg, cpu_backend());
  m.params().init(3);
  m.params().zero_grad();
  const ModelInput in{b.tokens.data(), b.targets.data(), b.positions.data(), b.cu.data(), b.N,
                      b.nseq};
  const float dloss = 1.f / b.N;
  const double want = m.forward_backward(in, dloss);

  std::vector<std::unique_ptr<float[]>> bufs;
  auto alloc = [&](size_t n) {
    bufs.emplace_back(new float[n]());
    return bufs.back().get();
  };
  std::vector<float> params(m.params().data(), m.params().data() + m.params().total());
  std::vector<float> grads(m.params().total(), 0.f);
  test::StepReplay r(cpu_backend(), cfg, m.params(), params.data(), grads.data(), b.N,
                     m.head_chunk(), alloc,
                     [](float* d, const float* s, size_t n) { std::memcpy(d, s, n * 4); });
  const double got = r.forward_backward(b.tokens.data(), b.targets.data(), b.positions.data(),
                                        b.cu.data(), b.nseq, dloss);
  EXPECT_EQ(got, want) << preset;
  EXPECT_EQ(std::memcmp(grads.data(), m.params().grad(), grads.size() * 4), 0)
      << preset << ": gradients differ from the Decoder's";
  EXPECT_GT(want, 0.0);
}

TEST(StepReplay, MatchesDecoderGpt2) {
  check_replay("tiny");
}

TEST(StepReplay, MatchesDecoderLlama) {
  check_replay("tiny-llama");
}

}  // namespace
}  // namespace loom
