// A Decoder from a checkpoint, in one place: what a checkpoint says about its model (the run's
// config, the model it defines, the precision it trained in), what cannot be read as a model's
// weights (a rank's part of a distributed run, LoRA adapters without their base), and the
// Decoder itself with its weights. Generation, serving, tensor-parallel serving, RL, the
// trainer's train.pretrained / train.init_from and consolidation read checkpoints through it.
#pragma once

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "model/decoder.h"
#include "precision/policy.h"

namespace loom::ckpt {

struct SavedModel {
  Config config;              // the run's config (state.json's config_text)
  ModelConfig model;          // its [model] section
  PrecisionPolicy precision;  // its precision.policy
};
SavedModel saved_model_of(const Checkpoint& c);

// Refuses a rank's part of a distributed run (consolidate it first).
void require_one_process(const Checkpoint& c);
// ... and a LoRA checkpoint, which holds adapters only (merge it first).
void require_full_model(const Checkpoint& c);
// Refuses host tensors (weights as read from `where`) holding a NaN or an inf, naming the first.
void require_finite(const TensorList& host, const std::string& where);

}  // namespace loom::ckpt

namespace loom {

// Builds the model a one-process checkpoint was trained with, in its precision, on `be` (the
// CPU, or a device the serving engine runs on; it must outlive the model), and loads its weights.
// Over `tp` (size > 1) each rank holds its shard of every parameter, read from the whole tensors;
// a LoRA checkpoint (one rank only) gets its base from train.pretrained with the adapters merged.
std::unique_ptr<Decoder> load_model_from_checkpoint(const std::string& path,
                                                    Backend& be = cpu_backend(),
                                                    const TensorParallel& tp = {});

}  // namespace loom
