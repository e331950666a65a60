// Activation recomputation: what a decoder keeps between forward and backward. One enum for the
// model that runs it (model/decoder.h) and the planner that predicts its memory and time
// (plan/), both read from `train.recompute`:
//   None       every layer's activations;
//   Selective  all but the attention core (RoPE'd q/k kept; attention output and LSE
//              recomputed per layer in backward);
//   Full       only each layer's input; the whole layer is recomputed in backward.
#pragma once

#include <string>

namespace loom {

enum class Recompute { None, Selective, Full };

// "none", "selective", "full"; anything else throws listing the valid names.
Recompute recompute_from_name(const std::string& s);
const char* recompute_name(Recompute r);

}  // namespace loom
