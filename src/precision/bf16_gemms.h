// The bf16 policy's GEMMs at bf16 speed on CPUs with AVX512-BF16 (oneDNN, kernels/cpu/
// gemm_bf16.h), attached to every Linear of a Decoder from outside as its GEMM recipe.
//
// Why this is exact: under the bf16 policy every GEMM input is already a bf16 value (weights
// are rounded from the fp32 master after each step, activations and their gradients where a GPU
// stores bf16), so converting them to bf16 storage loses nothing, and the products summed in
// fp32 are those of the fp32 GEMM on the same values up to summation order.
//
// Weights are read from the parameter set's bf16 copy (ParamSet::allocate_bf16_copy, made by
// attach_bf16_gemms), which the optimizer writes in its own pass (AdamW::update): no
// conversion at all for what it wrote. new_weights() (the trainer calls it after every step
// and load) takes the ranges the optimizer wrote since; any other weight is converted into the
// copy once, on its next use (weights written by a load, gathered from other ranks, or by
// hand). The one thing it cannot see: fp32 weights changed in place after an optimizer step
// and before the next new_weights() (the step's ranges are still trusted), so such a writer
// calls new_weights() twice or goes through ParamSet's writers (write_values, store_values,
// init, copy_values_from), which drop the noted ranges. Gradients are converted per call;
// activations are read as stored (bf16 under the bf16 policy) or converted per call.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "model/decoder.h"
#include "model/linear.h"
#include "model/params.h"

namespace loom {

class Bf16Gemms : public GemmRecipe {
 public:
  // params (nullable): the set whose weights the layers use; its bf16 copy is allocated here.
  // Without it (or for a weight outside it) the recipe keeps converted copies of its own.
  explicit Bf16Gemms(ParamSet* params = nullptr);
  ~Bf16Gemms() override;
  Bf16Gemms(const Bf16Gemms&) = delete;
  Bf16Gemms& operator=(const Bf16Gemms&) = delete;
  void forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N, int in,
               int out) override;
  void backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                const float* w, int N, int in, int out) override;
  uint16_t* dy_bits(const float* dy, int64_t n) override;
  // The head's logits written as bf16 by the GEMM itself and their gradient read as bits.
  bool bf16_outputs() const override { return true; }
  void forward_bf16(Backend& be, uint16_t* y, ActIn x, const float* w, int N, int in,
                    int out) override;
  void backward_bf16(Backend& be, float* dx, float* dw, const uint16_t* dy, ActIn x, const float* w,
                     int N, int in, int out) override;
  // The weights changed (optimizer step, checkpoint load): those the optimizer wrote into the
  // bf16 copy since the last call are current, the others are converted again on next use.
  void new_weights();
  // Weights converted from fp32 so far (each conversion of one weight matrix counts one).
  int64_t weight_conversions() const { return conversions_; }

 private:
  const uint16_t* weight(const float* w, int64_t n);
  const uint16_t* input(ActIn x, int64_t n);
  // 0 when dw (n elements) is known to hold zeros (in the set's gradient, which zero_grad()
  // cleared since this recipe last wrote it), else 1; notes the write that follows.
  float dw_beta(const float* dw, int64_t n);
  // backward()'s GEMMs with dy's bf16 bits at dyb.
  void backward_gemms(float* dx, float* dw, const uint16_t* dyb, ActIn x, const float* w, int N,
                      int in, int out);
  ParamSet* params_ = nullptr;
  std::unordered_map<const float*, std::vector<uint16_t>> weights_;  // outside params_
  std::unordered_map<const float*, bool> fresh_;
  std::unordered_map<const float*, int64_t> sizes_;  // elements of each weight seen
  // Per weight gradient: ParamSet::grad_zero_count() at this recipe's last write into it.
  std::unordered_map<const float*, uint64_t> dw_written_;
  std::vector<uint16_t> a_, b_;  // converted activations / gradients
  // The dy whose bf16 bits the caller left in b_ (dy_bits), consumed by the next backward().
  const float* dy_noted_ = nullptr;
  int64_t dy_noted_n_ = 0;
  int64_t conversions_ = 0;
  // Large weights' input-gradient GEMMs keep the weight packed between calls
  // (cpu::gemm_bf16_reused_b, keyed by this recipe's sizes_ entry for the weight): version_
  // changes whenever any weight's bf16 values may have (new_weights, a conversion, the
  // optimizer's writes into the set's copy).
  uint64_t weights_version();
  uint64_t version_ = 1, seen_bf16_writes_ = 0;
  std::vector<const void*> reused_;  // keys handed to gemm_bf16_reused_b
};

// Attaches one Bf16Gemms to every linear layer of `model` when the CPU runs bf16 GEMMs natively
// (AVX512-BF16 and oneDNN); otherwise logs why the fp32 GEMMs stay (never silently) and returns
// nullptr. The caller owns the result and keeps it alive as long as the model runs.
std::unique_ptr<Bf16Gemms> attach_bf16_gemms(Decoder& model, bool quiet = false);

// The 2-byte weights: after attach_bf16_gemms, the parameters the linear layers read as weights
// (the tied embedding, which is the head's weight, among them) and the token embedding (whose
// lookup reads the batch's rows widened, ParamSet::widen_rows) keep no fp32 values in the model
// (ParamSet::drop_fp32): the bf16 copy the GEMMs read is their only model copy, the optimizer's
// fp32 master the other. Norms, biases and a position table keep theirs (small, read as fp32).
void drop_fp32_weights(Decoder& model);

}  // namespace loom
