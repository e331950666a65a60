#include "infer/weight_quant.h"

#include "core/error.h"
#include "infer/decode_bench.h"

namespace loom::infer {

class QuantizedWeights::Layer {};

WeightType weight_type_from_name(const std::string& name) {
  if (name == "fp32") return WeightType::F32;
  if (name == "bf16") return WeightType::BF16;
  if (name == "int8") return WeightType::INT8;
  fail("unknown weight type '", name, "' (known: fp32, bf16, int8)");
}

const char* weight_type_name(WeightType t) {
  return t == WeightType::F32 ? "fp32" : t == WeightType::BF16 ? "bf16" : "int8";
}

QuantizedWeights::QuantizedWeights(Decoder& model, WeightType type) : model_(model), type_(type) {
  LOOM_CHECK(type == WeightType::F32, "weights ", weight_type_name(type), " are not built yet");
}

QuantizedWeights::~QuantizedWeights() = default;

double QuantizedWeights::bytes_per_token() const {
  return decode_weight_bytes(model_, 4);
}

int64_t QuantizedWeights::stored_bytes() const {
  return 0;
}

}  // namespace loom::infer
