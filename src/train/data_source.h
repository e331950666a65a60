// Builds the trainer's batch source from the [data] section of a config:
//   source = "text"    byte-level fallback over plain-text files (data.paths)
//   source = "tokens"  Megatron .bin/.idx token files (data.prefixes, data.weights, data.split,
//                      data.packed, data.cache_dir, data.tokenizer)
//   source = "chat"    supervised fine-tuning on chat JSONL (data.path, data.tokenizer,
//                      data.chat_template, data.packed, data.valid_fraction): train/chat_source.h
//   source = "preference"  DPO pairs (data.path, data.tokenizer, data.chat_template,
//                      data.valid_fraction): train.micro_batch pairs per micro-batch
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "model/model_config.h"
#include "train/batch.h"

namespace loom {

struct TrainOptions;

// `split` is "train" or "valid". Data-parallel rank `dp_rank` of `dp_size` reads only its own
// rows: its micro-batch j is the one-process run's micro-batch j * dp_size + dp_rank, so a DP run
// sees the data of the one-process run with dp_size times the gradient accumulation.
std::unique_ptr<BatchSource> make_batch_source(const Config& cfg, const TrainOptions& opt,
                                               const ModelConfig& model, const std::string& split,
                                               int dp_rank = 0, int dp_size = 1);

}  // namespace loom
