// The FP8 recipes (precision/fp8_recipes.h) on a GPU: the same [precision] keys select them, and
// the Trainer (train.device = "cuda") and `loom bench train --device cuda` attach them through
// this header, which needs no CUDA headers (the recipe itself: precision/cuda_fp8_recipes.h,
// built with the CUDA backend). What runs there:
//   fp8_tensorwise_current, fp8_tensorwise_delayed: cuBLASLt fp8 GEMMs (kernels/cuda/fp8_linear.h),
//       on GPUs with fp8 tensor cores (sm_89 or newer); elsewhere refused, naming the GPU (no
//       silent fallback: a run asked for fp8 must not quietly train in another precision).
//   mxfp8: 1x32 blocks dequantised to bf16 for bf16 GEMMs (no GPU before Blackwell multiplies
//       MX blocks), on any GPU the CUDA backend runs on.
// Refused by name as well: a micro-batch (under context parallelism: a rank's share of it) or
// layer width that is not a multiple of 16 (cuBLASLt's fp8 alignment).
// Across ranks, as the CPU recipe: delayed scaling max-reduces each step's amaxes over its amax
// group (the trainer's TP x DP (x CP) ranks of the pipeline stage, through a communicator of
// device memory; a stage's recipe holds its own blocks' layers, possibly none; expert MLPs take
// no recipe, on the CPU either), and current scaling max-reduces every amax over the TP group
// where one is set; delayed scaling's state
// (scales, histories, pending amaxes; precision/device_fp8_scaling.h) is checkpointed in the
// CPU recipe's format.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/json.h"
#include "model/decoder.h"
#include "precision/fp8_recipes.h"

namespace loom {

struct Backend;
namespace comm {
class Communicator;
}

// The GPU recipe as the Trainer drives it: one fp8 layer per selected linear (fp8_layer_names),
// attached to the model.
class DeviceFp8Recipes {
 public:
  virtual ~DeviceFp8Recipes() = default;
  // Before each training step: delayed scaling's amaxes recorded since the last call join the
  // histories and give this step's scales (nothing for the other recipes).
  virtual void begin_step() = 0;
  // False while evaluation passes run: they quantise with the current scales but record no
  // amaxes (the histories hold training steps only).
  virtual void set_recording(bool on) = 0;
  virtual size_t size() const = 0;
  // Delayed scaling (amax histories, kept across steps and checkpoints).
  virtual bool delayed() const = 0;
  virtual const std::string& name(size_t i) const = 0;
  // Delayed scaling: the group (a communicator of the device's memory, e.g. make_device_
  // communicator over the TP x DP ranks) its step amaxes are max-reduced over; null: none.
  virtual void set_amax_group(comm::Communicator* g) = 0;
  // Current scaling: the TP group (device memory) every amax is max-reduced over; null: none.
  virtual void set_tp_group(comm::Communicator* g) = 0;
  // Delayed scaling's state for checkpoints, Fp8Recipes::state()'s format (a null Json for the
  // other recipes), and its restore (Fp8Recipes::restore's semantics and checks).
  virtual Json state() const = 0;
  virtual void restore(const Json* j, const std::string& where) = 0;
};

// What the device offers the recipe, known before the model is allocated.
struct DeviceFp8Target {
  bool cuda = false;      // the backend is the CUDA one (the only device with fp8 recipes)
  bool stand_in = false;  // a test's stand-in recipe is registered for it (set_device_fp8_stand_in)
  int sm_version = 0;     // its compute capability, 10 * major + minor
  int dp_ranks = 1;       // data-parallel ranks of the run (every recipe runs on any number)
  int tokens = 0;         // tokens of the largest forward (train.micro_batch x train.seq_len;
                          // DPO: twice that, its chosen and rejected rows)
  int cp = 1;             // context-parallel ranks: each multiplies its share, tokens / cp
};

// Throws an error naming precision.fp8_recipe (and the value at fault) when recipe `o` cannot
// run on `t`; `where` prefixes it ("train.device = \"cuda\" (the cuda backend): ").
void check_device_fp8(const Fp8Options& o, const DeviceFp8Target& t, const std::string& where);

// The target of a backend: its kind and SM version (a non-CUDA backend: cuda = false).
DeviceFp8Target device_fp8_target(Backend& be, int dp_ranks, int tokens, int cp = 1);

// Tests: a recipe standing in for the GPU one on a device backend that is not CUDA (the guarded
// CPU backend, which runs the trainer's device paths without a GPU), made by `make` for the
// backend `be` while registered (a null `make` unregisters). check_device_fp8 takes such a
// backend as it takes an sm_90 GPU (the same alignment rules), and attach_device_fp8_recipes
// calls `make` where it would build the CUDA recipe, with the same largest micro-batch (tokens):
// so a test runs the trainer's fp8 wiring (layers per pipeline stage, amax groups, begin_step,
// evaluation, checkpoints, the scratch's size) on the device.
using DeviceFp8StandIn = std::function<std::unique_ptr<DeviceFp8Recipes>(
    const Fp8Options&, Decoder&, Backend&, int max_tokens)>;
void set_device_fp8_stand_in(const Backend* be, DeviceFp8StandIn make);

// Checks as check_device_fp8 does, then attaches the GPU recipe to `model` (on `be`, the CUDA
// backend) for forwards of up to `tokens` tokens (its scratch's size: the caller passes the
// largest it will run, e.g. DPO's chosen + rejected rows), replacing any recipe on those linears;
// also refuses a selected layer whose width is not a multiple of 16. Logs what it did unless
// quiet. Throws in a build without the CUDA backend.
std::unique_ptr<DeviceFp8Recipes> attach_device_fp8_recipes(const Fp8Options& o, Decoder& model,
                                                            Backend& be, int dp_ranks, int tokens,
                                                            const std::string& where, bool quiet);

}  // namespace loom
