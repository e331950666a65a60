// Delayed fp8 scaling's state for the GPU recipe (precision/cuda_fp8_recipes.h), kept in one
// buffer of a Backend and driven through Backend ops only (fp8_amax, fp8_record_amax,
// fp8_roll_history, copies), so that the same code runs on the CPU backend and on the guarded
// one in tests, where it must equal the CPU recipe (Fp8Linear) bit for bit.
//
// Per fp8 layer and tensor (x, W, dy): a scale, the amax pending since the last step (-1 while
// nothing was recorded: a non-finite amax is not, and only the device knows which were), a ring
// of amax_history amaxes and its position and fill. Pending amaxes lie side by side ([layers x
// 3]), so that a step's amax reduction over the ranks (Transformer Engine's amax reduction
// group: the TP and DP ranks of a pipeline stage, as Fp8Recipes::begin_step) is one max
// all-reduce of device memory through a device communicator (into a copy: whether a tensor
// rolls depends on this rank's own record, as on the CPU). Nothing is read back per step.
//
// state() / restore() write and read the checkpoint entry Fp8Recipes does (fp8_recipes_state):
// the same names, bit patterns and validation, so a checkpoint moves between CPU and GPU runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "kernels/buffer.h"
#include "precision/fp8_recipes.h"

namespace loom {

struct Backend;
namespace comm {
class Communicator;
}

class DeviceFp8Scaling {
 public:
  // For the fp8 layers `names` (delayed scaling: o.kind must be fp8_tensorwise_delayed): scales
  // 1, empty histories, nothing pending. `names` may be empty (a pipeline stage whose blocks
  // all stay bf16): nothing to roll or reduce, and state() is the CPU recipe's empty one.
  DeviceFp8Scaling(Backend& be, const Fp8Options& o, std::vector<std::string> names);
  DeviceFp8Scaling(const DeviceFp8Scaling&) = delete;
  DeviceFp8Scaling& operator=(const DeviceFp8Scaling&) = delete;

  size_t size() const { return names_.size(); }
  const std::vector<std::string>& names() const { return names_; }
  // Layer i's scales (x, W, dy: three consecutive floats of the backend), what its quantisation
  // multiplies by during a step.
  const float* scales(size_t i) const;
  // Tensor t (Fp8Linear::Tensor) of layer i was quantised and its amax is at `amax` (a float of
  // the backend): it joins this step's pending amax (max over the step's calls; a non-finite
  // one is dropped). Nothing while not recording.
  void record_amax(size_t i, int t, const float* amax);
  // The same from the values: amax = max |v[0..n)| first (Backend::fp8_amax).
  void record(size_t i, int t, const float* v, int64_t n);
  // False while evaluation passes run (the histories hold training steps only).
  void set_recording(bool on) { recording_ = on; }
  // A new training step: the pending amaxes, max-reduced over `group` (a communicator of this
  // backend's memory; null or one rank: none), join the histories of the tensors this rank
  // recorded a finite amax of and give their scales; the others stay as they were (as
  // Fp8Linear::roll_history).
  void begin_step(comm::Communicator* group);

  Json state() const;
  // restore(nullptr): fresh histories, with a warning; a mismatched state is refused naming
  // `where` (fp8_state_layers, Fp8Linear::restore).
  void restore(const Json* j, const std::string& where);

  // Inspection (tests; downloads): tensor t of layer i's scale and history (oldest first).
  float scale(size_t i, int t) const;
  std::vector<float> history(size_t i, int t) const;

 private:
  // Floats of mem_: pending [L*3], reduced [L*3] (the all-reduce's copy), scale [L*3],
  // histories [L*3][len]; ints of ring_: {pos, count} per tensor.
  size_t slot(size_t i, int t) const;
  float* at(size_t part, size_t i, int t) const;
  float* history_at(size_t i, int t) const;
  std::vector<float> download() const;
  std::vector<int32_t> download_rings() const;
  // Tensor k's history, oldest first, from a download of its ring.
  std::vector<float> ordered(const float* ring, const int32_t* pos_count) const;

  Backend& be_;
  Fp8Options opt_;
  std::vector<std::string> names_;
  BackendBuffer mem_, ring_;
  BackendBuffer amax_;  // record()'s amax of the values
  bool recording_ = true;
};

}  // namespace loom
