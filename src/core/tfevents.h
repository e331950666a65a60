// TensorBoard event files (events.out.tfevents.*), so that `tensorboard --logdir <out_dir>`
// plots a run's scalars as it does Megatron's and NeMo's. The format: TFRecord framing (length,
// masked CRC-32C of the length, payload, masked CRC-32C of the payload) around serialized
// tensorflow.Event protocol buffers, written by hand here since only scalars are needed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// CRC-32C (Castagnoli), as TFRecord checksums use it.
uint32_t crc32c(std::string_view data);
// TFRecord's masking of a stored CRC (a CRC of data that holds CRCs would be weak otherwise).
uint32_t masked_crc32c(std::string_view data);

class TfEventsWriter {
 public:
  // Starts a new event file in `dir` (created if needed) that begins with the file-version
  // event; TensorBoard reads every events file in a directory, so a resumed run adds one.
  explicit TfEventsWriter(const std::string& dir);
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  // One event holding a scalar summary per (tag, value), flushed so a crashed run's file is
  // complete up to its last record.
  void scalars(int64_t step, double wall_time,
               const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace loom
