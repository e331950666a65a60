#include "train/gemm_recipes.h"

namespace loom {

void GemmRecipes::begin_step() {
  if (bf16) bf16->new_weights();
  if (fp8) fp8->begin_step();
  if (device_fp8) device_fp8->begin_step();
}

void GemmRecipes::new_weights() {
  if (bf16) bf16->new_weights();
  if (fp8) fp8->new_weights();
}

Json GemmRecipes::state() const {
  return fp8 ? fp8->state() : device_fp8 ? device_fp8->state() : Json();
}

void GemmRecipes::restore(const Json* state, const std::string& where) {
  if (fp8) fp8->restore(state, where);
  if (device_fp8) device_fp8->restore(state, where);
}

GemmRecipes::Evaluating::Evaluating(GemmRecipes& r) : r_(r) {
  if (r_.fp8) r_.fp8->set_evaluating(true);
  if (r_.device_fp8) r_.device_fp8->set_recording(false);
}

GemmRecipes::Evaluating::~Evaluating() {
  if (r_.fp8) r_.fp8->set_evaluating(false);
  if (r_.device_fp8) r_.device_fp8->set_recording(true);
}

}  // namespace loom
