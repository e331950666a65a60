// Where a decode token's time goes (`loom bench serve --decode` prints it): wall-clock time and
// bytes per part of an engine step, summed while a profile is installed. Off (the default), a
// scope costs one relaxed atomic load and reads no clock. The engine thread is the only one
// that records (the kernels' OpenMP regions lie inside the scopes), so no locking.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace loom::infer {

struct DecodeProfile {
  enum Part {
    kStep,       // LoomEngine::step, whole
    kForward,    // the runner's forward (the parts below that it contains included)
    kGemv,       // every linear layer (weights read once per step)
    kAttention,  // writing new keys and values, and attention over the paged cache
    kSample,     // sampling and log-probabilities, every sequence of the step
    kParts
  };
  double seconds[kParts] = {};
  int64_t calls[kParts] = {};
  double bytes[kParts] = {};  // bytes the part reads from memory (weights; keys and values)
};

// The installed profile, or nullptr (not recording).
DecodeProfile* decode_profile();
void set_decode_profile(DecodeProfile* p);

// Adds the time from construction to destruction (and `bytes`) to `part` of the installed
// profile, if any.
class ProfileScope {
 public:
  explicit ProfileScope(DecodeProfile::Part part, double bytes = 0)
      : p_(decode_profile()), part_(part), bytes_(bytes) {
    if (p_) t0_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (!p_) return;
    p_->seconds[part_] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    p_->calls[part_] += 1;
    p_->bytes[part_] += bytes_;
  }
  // Records nothing after all (an engine step that found nothing to run).
  void discard() { p_ = nullptr; }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  DecodeProfile* p_;
  DecodeProfile::Part part_;
  double bytes_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace loom::infer
