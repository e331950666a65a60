// Weight-only low precision for serving: single-stream decode reads every weight once per
// token, so it runs at the speed the weights stream from memory. Each linear layer's weight
// (the output head included) is stored once more as bf16 (2 bytes), or int8 or fp8 E4M3 (1 byte)
// with one fp32 scale per output channel (fp8: 448 / the row's largest magnitude, as
// kernels/cpu/gemm_lowp.h's quantize_fp8_rows), and attached to the model as a GemmRecipe that
// reads only that copy; activations and accumulation stay fp32. Forward only: the recipe refuses
// backward. F32 keeps the model's weights and only routes decode batches (M <= 16 rows) to the same
// streaming GEMV kernel, which reads them at close to the memory bandwidth where a BLAS GEMM with M
// = 1 does not.
// Under tensor parallelism each rank quantises its own shard; a row-parallel shard's per-channel
// scales come from the whole row (the maximum over the ranks), so the ranks' partial products
// sum to the one-process model's result.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_lowp_pages.h"
#include "model/decoder.h"

namespace loom::infer {

enum class WeightType { F32, BF16, INT8, FP8 };
WeightType weight_type_from_name(const std::string& name);  // fp32 | bf16 | int8 | fp8
const char* weight_type_name(WeightType t);

class QuantizedWeights {
 public:
  // Quantises the model's current weights and attaches the recipes (F32: no copy).
  // The model must outlive this object; call again after the weights change. A tensor-parallel
  // model's ranks construct it together (int8 and fp8 all-reduce over the TP group), and a
  // NaN or infinite weight (int8, fp8) is refused on every rank, naming the layer.
  QuantizedWeights(Decoder& model, WeightType type);
  ~QuantizedWeights();  // detaches the recipes
  QuantizedWeights(const QuantizedWeights&) = delete;
  QuantizedWeights& operator=(const QuantizedWeights&) = delete;
  WeightType type() const { return type_; }
  // Bytes read per decoded token besides the KV cache (infer::decode_weight_bytes).
  double bytes_per_token() const;
  // Bytes of the low-precision copies (weights and scales).
  int64_t stored_bytes() const;

  class Layer;

 private:
  Decoder& model_;
  WeightType type_;
  cpu::HugeBuffer store_;  // every layer's copy (not F32)
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace loom::infer
