#include "infer/generator.h"

#include <algorithm>

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "model/lora.h"
#include "precision/policy.h"

namespace loom {

std::unique_ptr<Decoder> load_model_from_checkpoint(const std::string& path, Backend& be) {
  ckpt::Checkpoint c(path);
  Config cfg = Config::parse(c.state().config_text, c.dir() + "/state.json:config_text");
  ModelConfig mc = model_config_from(cfg);
  PrecisionPolicy policy = precision_from_name(cfg.get_string("precision.policy", "fp32"));
  auto model = std::make_unique<Decoder>(mc, be, Recompute::None, policy.compute);
  if (!c.state().extra.contains("lora")) {
    auto staged = model->params().host_values();  // host staging of the weights
    c.restore_model(staged);
    model->params().store_values(staged);
    return model;
  }
  // A LoRA checkpoint holds adapters only: the base comes from the run's train.pretrained, and
  // the adapters are merged into it.
  const std::string base = cfg.get_string("train.pretrained", "");
  LOOM_CHECK(!base.empty(), c.dir(), ": a LoRA checkpoint whose config names no train.pretrained");
  auto base_values = model->params().host_values();
  ckpt::Checkpoint(base).restore_model(base_values);
  model->params().store_values(base_values);
  {
    Lora lora(*model, lora_config_from(cfg, 0));
    auto adapters = lora.params().host_values();
    c.restore_model(adapters);
    lora.params().store_values(adapters);
    lora.merge_into_base();
  }
  if (policy.compute != DType::F32)
    model->params().backend().round_to(policy.compute, model->params().data(),
                                       model->params().total(), nullptr);
  return model;
}

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
