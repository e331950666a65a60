// What `loom generate`, `loom serve` and `loom bench serve` share to put a model behind the
// engine: the engine's options, the run's tokenizer, and the engine's end-of-text ids and
// detokeniser for it.
#pragma once

#include <memory>
#include <string>

#include "cli/options.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "infer/weight_quant.h"
#include "model/decoder.h"
#include "train/device.h"

namespace loom::cli {

// The engine's options, declared once so the three commands take the same names, defaults and
// help: --max-num-seqs (64), --max-batched-tokens (512), --kv-cache-mb (512), --kv-cache-dtype
// (auto: the model's compute type) and --weights (fp32). 512 MB of KV cache holds 113 tokens for
// each of the 64 sequences of gpt2-124m in fp32 (73.7 KB per token): a full batch of short requests
// stays resident. Speculative decoding: --speculative (none | ngram | draft), --speculative-model
// (draft's checkpoint), --num-speculative-tokens (4), --ngram-prompt-lookup-max (4) and
// --ngram-prompt-lookup-min (1).
void declare_engine_options(Options& o);
// The scheduler and cache of an engine from those options (range errors name the option).
infer::EngineConfig engine_config_from(const Options& o);
// --speculative draft's model (--speculative-model), loaded onto `backend` with the target's
// weight type (on the CPU), behind its own runner; null without --speculative-model. Refuses,
// naming the path, a draft whose vocabulary differs from the target's.
struct DraftSetup {
  std::unique_ptr<Decoder> model;
  std::unique_ptr<infer::QuantizedWeights> quant;
  std::unique_ptr<infer::DecoderRunner> runner;
};
std::unique_ptr<DraftSetup> load_draft_model(const Options& o, const Decoder& target,
                                             Backend& backend, infer::WeightType weights);
// --weights as a type (an error naming the option lists the valid ones).
infer::WeightType engine_weights_from(const Options& o);

// The tokenizer named by `spec`, else the checkpoint's own (ckpt::checkpoint_tokenizer_spec: its
// copy, else the run's data.tokenizer resolved); null for a byte-level model. Throws when the
// model is neither.
std::unique_ptr<data::BpeTokenizer> checkpoint_tokenizer(const std::string& ckpt,
                                                         const std::string& spec,
                                                         const Decoder& model);

// End-of-text (and the template's end-of-turn) as stop ids; text from ids, where ids the
// tokenizer does not have (a model vocabulary padded past it) decode to nothing.
void set_text_codec(infer::EngineConfig& cfg, const data::BpeTokenizer* tok,
                    const data::ChatTemplate* chat);

// The device `loom generate` / `loom serve` run the engine on (option `key`, e.g. --device):
// cpu, cuda (an error naming the key without a CUDA build or a visible GPU) or auto (the GPU
// when there is one, else the CPU with a logged notice saying what `doing` runs on). On CUDA,
// the first visible GPU.
DeviceChoice select_serving_device(const std::string& device, const std::string& key,
                                   const std::string& doing);

// --kv-cache-dtype fp8 on a GPU: an error naming the option (its kernels are CPU ones).
void check_serving_kv_cache(const infer::EngineConfig& ec, const DeviceChoice& dev);
// Refuses, naming `key`, a weight type the device cannot decode with: the weight-only copies
// (bf16, int8, fp8) are CPU kernels over host memory; on a GPU the model decodes with the
// weights it holds (fp32, or bf16 values under a bf16 checkpoint's precision policy).
void check_serving_weights(const std::string& weights, const std::string& key,
                           const DeviceChoice& dev);

}  // namespace loom::cli
