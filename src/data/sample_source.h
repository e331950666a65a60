// A source of training rows: GPT samples, packed sequences, or a blend of sources.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;  // number of rows available
  virtual int seq_len() const = 0;   // T: positions per row
  // Fills row i (0 <= i < size()): T tokens, T targets (-1: no loss), T positions, and
  // appends the lengths of the row's attention segments (summing to T) to seg_lens.
  virtual void fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                        std::vector<int32_t>& seg_lens) const = 0;
};

// Uniform integer in [0, n) from a counter-based stream (seed, key, counter).
uint64_t random_below(uint64_t seed, uint64_t key, uint64_t counter, uint64_t n);

// Fisher-Yates shuffle driven by (seed, key): the same permutation on every rank and run.
template <typename T>
void shuffle_in_place(std::vector<T>& v, size_t begin, size_t end, uint64_t seed, uint64_t key) {
  for (size_t i = end - begin; i > 1; --i) {
    size_t j = size_t(random_below(seed, key, i, i));
    std::swap(v[begin + i - 1], v[begin + j]);
  }
}

}  // namespace loom::data
