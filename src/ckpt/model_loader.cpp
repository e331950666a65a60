#include "ckpt/model_loader.h"

#include "ckpt/reshard.h"
#include "core/error.h"
#include "model/lora.h"

namespace loom::ckpt {

SavedModel saved_model_of(const Checkpoint& c) {
  SavedModel s;
  s.config = Config::parse(c.state().config_text, c.dir() + "/state.json:config_text");
  s.model = model_config_from(s.config);
  s.precision = precision_from_name(s.config.get_string("precision.policy", "fp32"));
  return s;
}

void require_one_process(const Checkpoint& c) {
  LOOM_CHECK(!c.state().extra.contains("layout"), c.dir(),
             ": a rank's checkpoint of a distributed run; consolidate the run's checkpoints first "
             "(loom ckpt consolidate)");
}

void require_full_model(const Checkpoint& c) {
  require_one_process(c);
  LOOM_CHECK(!c.state().extra.contains("lora"), c.dir(),
             ": a LoRA checkpoint holds adapters only; merge it first (loom ckpt merge)");
}

void require_finite(const TensorList& host, const std::string& where) {
  for (const auto& t : host)
    LOOM_CHECK(cpu_backend().all_finite(t.tensor.data<float>(), t.tensor.numel()), where,
               ": parameter '", t.name, "' holds non-finite values (NaN or inf)");
}

}  // namespace loom::ckpt

namespace loom {
namespace {

// The shard of every parameter a tensor-parallel rank holds, cut from the whole tensors.
std::unique_ptr<Decoder> load_shard(const ckpt::Checkpoint& c, const ckpt::SavedModel& s,
                                    Backend& be, const TensorParallel& tp) {
  ckpt::require_full_model(c);
  try {
    tp.validate(s.model);
  } catch (const Error& e) {
    throw Error(cat(c.dir(), ": cannot serve this model over ", tp.size,
                    " tensor-parallel ranks: ", e.what()));
  }
  auto model = std::make_unique<Decoder>(s.model, be, Recompute::None, s.precision.compute, tp);
  // Every local parameter whole (no data-parallel slicing): its piece of the whole tensor.
  ckpt::TensorList local;
  for (auto& [name, t] : model->params().tensors("loading tensor-parallel serving weights"))
    local.push_back({name, t});
  ckpt::fill_from_whole(c, model->params(), local, {});
  return model;
}

}  // namespace

std::unique_ptr<Decoder> load_model_from_checkpoint(const std::string& path, Backend& be,
                                                    const TensorParallel& tp) {
  ckpt::Checkpoint c(path);
  const ckpt::SavedModel s = ckpt::saved_model_of(c);
  if (tp.size > 1) return load_shard(c, s, be, tp);
  auto model = std::make_unique<Decoder>(s.model, be, Recompute::None, s.precision.compute);
  if (!c.state().extra.contains("lora")) {
    auto staged = model->params().host_values();  // host staging of the weights
    c.restore_model(staged);
    model->params().store_values(staged);
    return model;
  }
  // A LoRA checkpoint holds adapters only: the base comes from the run's train.pretrained, and
  // the adapters are merged into it.
  const std::string base = s.config.get_string("train.pretrained", "");
  LOOM_CHECK(!base.empty(), c.dir(), ": a LoRA checkpoint whose config names no train.pretrained");
  auto base_values = model->params().host_values();
  ckpt::Checkpoint(base).restore_model(base_values);
  model->params().store_values(base_values);
  {
    Lora lora(*model, lora_config_from(s.config, 0));
    auto adapters = lora.params().host_values();
    c.restore_model(adapters);
    lora.params().store_values(adapters);
    lora.merge_into_base();
  }
  if (s.precision.compute != DType::F32)
    model->params().backend().round_to(s.precision.compute, model->params().data(),
                                       model->params().total(), nullptr);
  return model;
}

}  // namespace loom
