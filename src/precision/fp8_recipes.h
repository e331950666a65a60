// FP8 and MXFP8 training recipes, as GemmRecipes attached per Linear by name: the
// GEMM inputs x, W (forward) and dy (backward) are quantised to fp8 the way Transformer Engine's
// recipes do, then multiplied.
//   fp8_tensorwise_current: one scale per tensor from its amax now: fmt_max / amax / 2^margin.
//   fp8_tensorwise_delayed: one scale per tensor from an amax history (TE's DelayedScaling):
//       the step uses the scale computed from the history of earlier steps; this step's amaxes
//       (the max over its calls) join the history at the next begin_step().
//   mxfp8: OCP MX v1.0, 1x32 blocks along the GEMM's reduction dimension, one E8M0 scale each
//       (kernels/cpu/fp8.h); a short last block is the spec's zero padding.
// precision.fp8_format = e4m3 (everything E4M3) or hybrid (E5M2 for dy).
//
// Why the CPU emulation is cheap and exact: fp8 values (and fp8 values times a power of two, for
// MX) are exact in bf16, so the GEMM runs as the bf16 GEMM (gemm_bf16.h, fp32 accumulation) of
// the fp8 values, times scale_inv_a * scale_inv_b afterwards for the per-tensor recipes: the same
// arithmetic as cuBLASLt's FP8 GEMM with scale pointers, up to summation order. The bias and its
// gradient stay fp32, as in TE.
//
// Under tensor parallelism every per-tensor amax is max-reduced over the TP group (TE's amax
// reduction), so a split tensor gets the scale one process would give it; MX needs none (its
// blocks match one process's when the local shards are multiples of 32). Delayed scaling also
// max-reduces its step amaxes over the data-parallel ranks (TE's amax reduction group spans
// TP x DP), so every DP rank keeps the history one process with all their micro-batches would.
// Current scaling and MX need no DP reduction: a DP rank's micro-batch is one process's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "kernels/cpu/fp8.h"
#include "model/decoder.h"
#include "model/linear.h"

namespace loom {

class Config;
namespace comm {
class Communicator;
}

enum class Fp8RecipeKind { TensorwiseCurrent, TensorwiseDelayed, Mxfp8 };
const char* fp8_recipe_name(Fp8RecipeKind k);

struct Fp8Options {
  Fp8RecipeKind kind = Fp8RecipeKind::TensorwiseCurrent;
  bool hybrid = false;       // E5M2 for gradients
  int margin = 0;            // scale = fmt_max / amax / 2^margin (per-tensor recipes)
  int amax_history = 1024;   // delayed: history length (TE's default)
  bool most_recent = false;  // delayed: amax = the latest entry instead of the history's max
  int keep_first = 0, keep_last = 0;  // blocks whose linears stay bf16 (the head always does)

  // The [precision] keys: fp8_recipe (none | fp8_tensorwise_current | fp8_tensorwise_delayed |
  // mxfp8), fp8_format, fp8_margin, fp8_amax_history, fp8_amax_compute (max | most_recent),
  // fp8_keep_first, fp8_keep_last. Returns false when no recipe is asked for; throws naming the
  // key on a bad value (and on fp8 keys without a recipe, or keep counts past n_layer).
  static bool from(const Config& cfg, int n_layer, Fp8Options* out);
  std::string describe() const;
};

// The recipe of one linear layer (it keeps that layer's scales and fp8 weight copies).
class Fp8Linear : public GemmRecipe {
 public:
  enum Tensor { X = 0, W = 1, DY = 2 };
  // params (nullable): the set holding the layer's weight and gradient. Where its fp32 values
  // are dropped (drop_fp32_weights: the bf16 copy is the weight) W is quantised from that copy,
  // half the bytes of fp32 (the same values); a gradient it knows to be zeroed is written
  // rather than accumulated (no pass adding the GEMM's result onto zeros).
  Fp8Linear(const Fp8Options& o, comm::Communicator* tp, ParamSet* params = nullptr);

  void forward(Backend& be, float* y, ActIn x, const float* w, const float* b, int N, int in,
               int out) override;
  void backward(Backend& be, float* dx, float* dw, float* db, const float* dy, ActIn x,
                const float* w, int N, int in, int out) override;

  // Under bf16 activations the caller rounds dy in place and leaves its bf16 bits here in the
  // same pass (GemmRecipe::dy_bits): backward() then quantises dy from half the bytes (the
  // same values). The note lasts until this layer's next forward() or backward().
  uint16_t* dy_bits(const float* dy, int64_t n) override;

  // Scratch of the GEMM inputs (quantised x and dy, dy's bf16 bits), used within one call
  // only: the layers of one model share one (Fp8Recipes), as the bf16 recipe's layers do.
  struct Scratch {
    std::vector<uint16_t> a, b, dy;
  };
  void share_scratch(Scratch* s) { s_ = s; }

  void new_weights() { fresh_ = false; }
  // Delayed scaling: the amaxes seen since the last call (max over calls) as the history's
  // newest entry, then new scales. `amax` overrides them (the holder's TP-reduced values).
  float pending_amax(Tensor t) const { return state_[t].seen ? state_[t].pending : 0.f; }
  void roll_history(const float* amax = nullptr);
  // Evaluation passes (forward only, other data) quantise with the current scales but record
  // no amaxes: the history holds training steps only.
  void set_recording(bool on) { record_ = on; }
  // Delayed scaling's state (scales, histories, this step's pending amaxes) as fp32 bit patterns,
  // exact; restore() throws naming `where` on a malformed or mismatched value.
  Json state() const;
  void restore(const Json& j, const std::string& where);
  // One tensor's entry of state(): its scale, history (oldest first) and, when an amax was
  // recorded since the last roll, the pending one (the GPU recipe writes the same entries).
  static Json tensor_state(float scale, const std::vector<float>& history, const float* pending);

  // Inspection (tests): the scale the next GEMM uses for t (delayed), the history (newest last),
  // whether an amax of t was recorded since the last roll.
  float scale(Tensor t) const { return state_[t].scale; }
  bool recorded(Tensor t) const { return state_[t].seen; }
  std::vector<float> history(Tensor t) const;
  cpu::Fp8Format format(Tensor t) const { return t == DY ? bwd_ : fwd_; }

 private:
  struct State {
    float scale = 1.f;  // delayed: from the history; current: the last one computed
    std::vector<float> hist;
    size_t pos = 0, count = 0;
    float pending = 0.f;
    bool seen = false;
  };
  float tp_max(float amax) const;
  // Per-tensor: t's values v (fp32, or bf16 bits) quantised into out, returning the scale used:
  // current scaling from their amax now (TP-reduced; a first pass), delayed scaling with the
  // step's scale, recording their amax in the same pass. `again`: the tensor quantised a second
  // time in the step (x for wgrad): no amax recorded, no state changed.
  template <typename In>
  float quantise_tensor(Tensor t, const In* v, int64_t n, uint16_t* out, bool again = false);
  // x as the recipe reads it: the stored bf16 bits, or fp32 values.
  template <typename Fn>
  void with_input(ActIn x, Fn&& fn) const;
  void quantise_weight(const float* w, int in, int out);
  // W's bf16 copy in the parameter set where its fp32 values are dropped, else null.
  const uint16_t* weight_bf16(const float* w, int64_t n) const;
  // 0 when dw (n elements) is known to hold zeros (params_' gradient, zeroed since this layer
  // last wrote it), else 1; notes the write that follows (Bf16Gemms::dw_beta's rule, lazy
  // zeroing included).
  float dw_beta(const float* dw, int64_t n);

  Fp8Options opt_;
  cpu::Fp8Format fwd_, bwd_;
  comm::Communicator* tp_;
  ParamSet* params_;
  uint64_t dw_written_ = 0;         // params_->grad_zero_count() at this layer's last dW write
  bool lazy_zero_allowed_ = false;  // dW's range given to params_' lazy zeroing
  State state_[3];
  bool fresh_ = false;
  bool record_ = true;
  const float* wptr_ = nullptr;
  std::vector<uint16_t> wq_, wq_t_;  // W's fp8 values in bf16 (MX: blocks along in / along out)
  // Per-tensor recipes: x quantised by the last training forward, with its scale, for that
  // forward's wgrad (Transformer Engine keeps it too): no second amax and cast of x in backward.
  // kept_x_ names the input it came from (null: none kept); backward uses it once.
  std::vector<uint16_t> xq_;
  const void* kept_x_ = nullptr;
  int64_t kept_n_ = 0;
  float kept_scale_ = 1.f;
  Scratch own_;
  Scratch* s_ = &own_;               // (grown, kept between calls: no allocation per step)
  const float* dy_noted_ = nullptr;  // the dy whose bits s_->dy holds (dy_bits)
  int64_t dy_noted_n_ = 0;
};

// Delayed scaling's checkpoint state as Fp8Recipes::state() writes it: the recipe, the history
// length and one Fp8Linear::state() per layer name (the GPU recipe writes the same, so a
// checkpoint moves between CPU and GPU runs).
Json fp8_recipes_state(int amax_history, const std::vector<std::string>& names,
                       const std::vector<Json>& layers);
// The per-layer states of such a checkpoint state `j` after checking it against a run with the
// fp8 layers `names` and histories of `amax_history` (refused naming `where`); nullptr, with a
// warning that the run is not bit-identical, when the checkpoint holds none (j null).
const Json::Object* fp8_state_layers(const Json* j, const std::vector<std::string>& names,
                                     int amax_history, const std::string& where);

// The linears a recipe takes, in the model's order: every block linear but the first keep_first
// and last keep_last blocks' (never the head). The CPU and GPU recipes select alike.
std::vector<std::string> fp8_layer_names(const Decoder& model, const Fp8Options& o);

// One Fp8Linear per selected linear of a model (all block linears but the first keep_first and
// last keep_last blocks'; never the head), attached to it; the model must outlive this.
class Fp8Recipes {
 public:
  Fp8Recipes(Decoder& model, const Fp8Options& o);
  const Fp8Options& options() const { return opt_; }
  // The weights changed (optimizer step, checkpoint load): quantise them again on next use.
  void new_weights();
  // A new training step: new_weights(), and for delayed scaling the step's amaxes (max-reduced
  // over the TP group in one all-reduce) join the histories and give the scales of this step.
  void begin_step();
  // Delayed scaling: the group its step amaxes are max-reduced over (TP x DP of the run; the
  // TP group by default). Every rank of it must hold the same linear layers.
  void set_amax_group(comm::Communicator* g) { amax_group_ = g; }
  // Evaluation passes between steps: true while they run (no amaxes recorded).
  void set_evaluating(bool on);
  // Delayed scaling's per-layer state for checkpoints (a null Json for the other recipes,
  // which keep none), and its restore: a resumed run continues bit-identically. restore(nullptr)
  // (a checkpoint without fp8 state) keeps fresh histories, with a warning; a state for other
  // layers or another history length is refused naming `where`.
  Json state() const;
  void restore(const Json* j, const std::string& where);
  const std::vector<std::string>& names() const { return names_; }
  Fp8Linear* get(const std::string& name);

 private:
  Fp8Options opt_;
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* amax_group_ = nullptr;  // delayed: the step's amax reduction (TP x DP)
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Fp8Linear>> linears_;
  Fp8Linear::Scratch scratch_;  // shared by linears_
};

// Fp8Recipes::set_evaluating(true) for a scope (null: nothing to do).
class Fp8Evaluating {
 public:
  explicit Fp8Evaluating(Fp8Recipes* r) : r_(r) {
    if (r_) r_->set_evaluating(true);
  }
  ~Fp8Evaluating() {
    if (r_) r_->set_evaluating(false);
  }
  Fp8Evaluating(const Fp8Evaluating&) = delete;
  Fp8Evaluating& operator=(const Fp8Evaluating&) = delete;

 private:
  Fp8Recipes* r_;
};

// Reads the [precision] fp8 keys; when a recipe is asked for, attaches it to `model` (replacing
// any bf16 recipe on those linears) and logs what it did. nullptr when none is asked for.
std::unique_ptr<Fp8Recipes> attach_fp8_recipes(const Config& cfg, Decoder& model, bool quiet);
// The same with options already read (Fp8Options::from).
std::unique_ptr<Fp8Recipes> attach_fp8_recipes(const Fp8Options& o, Decoder& model, bool quiet);

}  // namespace loom
