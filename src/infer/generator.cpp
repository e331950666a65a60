#include "infer/generator.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

void generate(Decoder& model, std::vector<int32_t>& tokens, int n, const SamplingOptions& o,
              const std::function<void(int32_t)>& on_token) {
  validate(o);
  LOOM_CHECK(!tokens.empty(), "generation needs a non-empty prompt");
  const ModelConfig& cfg = model.config();
  std::vector<float> logits(cfg.vocab);
  std::vector<int32_t> positions, cu(2);
  for (int i = 0; i < n; ++i) {
    int ctx = std::min<int>(static_cast<int>(tokens.size()), cfg.max_seq);
    const int32_t* window = tokens.data() + tokens.size() - ctx;
    positions.resize(ctx);
    for (int t = 0; t < ctx; ++t) positions[t] = t;
    cu = {0, ctx};
    ModelInput in;
    in.tokens = window;
    in.positions = positions.data();
    in.cu_seqlens = cu.data();
    in.N = ctx;
    in.nseq = 1;
    model.forward_logits(in, {ctx - 1}, logits.data());
    int32_t next = sample_token(logits.data(), cfg.vocab, o, tokens.size());
    tokens.push_back(next);
    if (on_token) on_token(next);
  }
}

}  // namespace loom
