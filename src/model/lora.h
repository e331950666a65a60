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

#include "kernels/buffer.h"
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
  // PEFT's lora_dropout: the probability of zeroing an element of the adapter's input while
  // training (the base layer sees x whole). In [0, 1).
  double dropout = 0;
  double scale() const;
  std::string describe() const;
};
// [lora] rank, alpha, rslora, targets (comma-separated), dropout, seed.
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

  // LoRA dropout (config().dropout > 0) acts only between set_dropout_batch and clear_dropout:
  // the trainer brackets each training micro-batch with them, so evaluation, forward-only use,
  // generation and serving never drop anything. The mask of element (token row n, input
  // feature c) of an adapter is drawn from the counter-based RNG by (lora seed, adapter name,
  // `micro`, n, c), c counted over the layer's whole (tensor-parallel global) input: it depends
  // on nothing else, so forward, recomputation and backward agree, a resumed run draws what the
  // straight one drew, and data/tensor-parallel ranks draw what one process draws for the same
  // micro-batch. `micro` is the micro-batch's index in the one-process run's sequence of
  // micro-batches (step * micro-batches per step + index; see Trainer). `rows` (nullable, kept
  // by the caller until clear_dropout): the micro-batch row of each row the model runs, when it
  // runs a share of the micro-batch's rows (context parallelism: CpShard::global_rows).
  void set_dropout_batch(uint64_t micro, const int32_t* rows = nullptr);
  void clear_dropout();
  bool dropout_active() const { return drop_.active; }
  uint64_t dropout_micro() const { return drop_.micro; }

 private:
  struct Adapter;
  // What every adapter's dropout reads (shared, owned here).
  struct DropoutState {
    double p = 0;
    uint32_t p16 = 0;        // p in units of 2^-16: draws below it drop
    float keep_scale = 1.f;  // 1 / (1 - p16 / 2^16)
    uint64_t seed = 0;
    bool active = false;
    uint64_t micro = 0;
    const int32_t* rows = nullptr;
    uint64_t epoch = 1;  // counts set_dropout_batch calls: an adapter's kept mask is this one's
  };
  DropoutState drop_;
  // The dropped input and input gradient of the adapter running now (one at a time).
  // Memory of the backend the adapters run on.
  struct DropoutScratch {
    BackendBuffer x, dx;
  };
  DropoutScratch scratch_;
  Decoder& model_;
  LoraConfig cfg_;
  ParamSet params_;
  std::vector<std::unique_ptr<Adapter>> adapters_;
  std::vector<bool> was_trainable_;  // the base's flags before LoRA froze it
};

}  // namespace loom
