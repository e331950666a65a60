// LoRA (Hu et al. 2021; PEFT's conventions): low-rank adapters on chosen linear layers of a
// Decoder, y = W x + b + scale * B (A x), with A [r, in] and B [out, r], B initialised to zero
// (so a fresh adapter leaves the model unchanged), A uniform in +-1/sqrt(in) (PEFT's Kaiming
// uniform with a = sqrt(5)), scale = alpha / r, or alpha / sqrt(r) with rsLoRA.
//
// The adapters' parameters live in their own ParamSet (named "<linear>.lora_A" / "lora_B"), so
// an optimizer, a checkpoint or a gradient reduction over adapters only is one over that set;
// the base model's parameters are frozen (ParamInfo::trainable = false: no gradients, no
// weight-gradient GEMMs) while the adapters are attached. Applied from outside the model through
// Decoder::attach_adapter; the model code does not know LoRA exists.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace loom {

class Config;

struct LoraConfig {
  int rank = 8;
  double alpha = 8;
  bool rslora = false;
  // Which linear layers: "all-linear" (every linear layer of the blocks, not the output head,
  // as PEFT's all-linear), or names / name suffixes of Decoder::linears() ("attn.qkv",
  // "mlp.fc", "blocks.3.attn.proj", "head").
  std::vector<std::string> targets = {"all-linear"};
  uint64_t seed = 0;
  double scale() const;
  std::string describe() const;
};
// [lora] rank, alpha, rslora, targets (comma-separated), dropout (only 0 is supported yet).
// Returns nullopt-like rank 0 when the section sets nothing.
LoraConfig lora_config_from(const Config& cfg, uint64_t seed);
bool lora_enabled(const Config& cfg);

class Lora {
 public:
  // Builds an adapter for every targeted linear layer, draws A, zeroes B, freezes the base and
  // attaches the adapters. Throws when a target matches no linear layer.
  Lora(Decoder& model, const LoraConfig& cfg);
  ~Lora();  // detaches the adapters and restores the base's trainable flags
  Lora(const Lora&) = delete;
  Lora& operator=(const Lora&) = delete;

  ParamSet& params() { return params_; }
  const LoraConfig& config() const { return cfg_; }
  std::vector<std::string> target_names() const;
  // W += scale * B A for every adapter (then detach to get the merged model).
  void merge_into_base();
  // Detached, the model is its base again (DPO's reference model without a second copy).
  void set_attached(bool attached);

 private:
  struct Adapter;
  Decoder& model_;
  LoraConfig cfg_;
  ParamSet params_;
  std::vector<std::unique_ptr<Adapter>> adapters_;
  std::vector<bool> was_trainable_;  // the base's flags before LoRA froze it
};

}  // namespace loom
