// The GEMM recipes a run's precision attaches to its model, in one slot for the host and the
// device: bf16 GEMMs on an AVX512-BF16 CPU, and precision.fp8_recipe's FP8 / MXFP8 recipe on the
// CPU (Fp8Recipes) or on a GPU (DeviceFp8Recipes). The trainer drives them through this alone;
// a checkpoint records the fp8 state in one format from either recipe, so it moves between CPU
// and GPU runs.
#pragma once

#include <memory>
#include <string>

#include "core/json.h"
#include "precision/bf16_gemms.h"
#include "precision/device_fp8.h"
#include "precision/fp8_recipes.h"

namespace loom {

struct GemmRecipes {
  std::unique_ptr<Bf16Gemms> bf16;               // bf16 policy on an AVX512-BF16 CPU
  std::unique_ptr<Fp8Recipes> fp8;               // precision.fp8_recipe on the host
  std::unique_ptr<DeviceFp8Recipes> device_fp8;  // ... on a GPU

  // Before a training step: the weights moved since the last use; delayed scaling's history
  // moves on.
  void begin_step();
  // The weights were loaded or restored.
  void new_weights();
  Json state() const;  // null without an fp8 recipe
  void restore(const Json* state, const std::string& where);

  // Evaluation for a scope: amaxes stay out of the training history, however the scope ends.
  class Evaluating {
   public:
    explicit Evaluating(GemmRecipes& r);
    ~Evaluating();
    Evaluating(const Evaluating&) = delete;
    Evaluating& operator=(const Evaluating&) = delete;

   private:
    GemmRecipes& r_;
  };
};

}  // namespace loom
