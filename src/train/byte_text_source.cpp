#include "train/byte_text_source.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"

namespace loom {

static void collect(const std::string& path, std::vector<std::string>& out) {
  namespace fs = std::filesystem;
  LOOM_CHECK(fs::exists(path), "data path '", path, "' does not exist");
  if (fs::is_directory(path)) {
    std::vector<std::string> files;
    for (auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  } else {
    out.push_back(path);
  }
}

ByteTextSource::ByteTextSource(const std::vector<std::string>& paths, int micro_batch, int seq_len,
                               uint64_t seed, double valid_fraction, const std::string& split,
                               int rank, int world)
    : B_(micro_batch), T_(seq_len), seed_(seed), rank_(rank), world_(world), split_(split) {
  LOOM_CHECK(world >= 1 && rank >= 0 && rank < world, "data-parallel rank ", rank, " of ", world);
  LOOM_CHECK(split == "train" || split == "valid", "unknown split '", split, "'");
  LOOM_CHECK(valid_fraction >= 0 && valid_fraction < 1, "data.valid_fraction must lie in [0, 1)");
  std::vector<std::string> files;
  for (auto& p : paths) collect(p, files);
  LOOM_CHECK(!files.empty(), "no data files found");
  for (auto& f : files) {
    text_ += read_file(f);
    text_ += '\n';
  }
  files_ = files.size();
  size_t cut = text_.size() - static_cast<size_t>(valid_fraction * text_.size());
  begin_ = split == "train" ? 0 : cut;
  end_ = split == "train" ? cut : text_.size();
  LOOM_CHECK(end_ - begin_ > static_cast<size_t>(T_) + 1, "the ", split, " split has ",
             end_ - begin_, " bytes: fewer than one sample of seq_len+1 = ", T_ + 1);
}

void ByteTextSource::next(Batch& b) {
  b.set_rows(B_, T_);
  const uint64_t key = name_key("data.byte_text." + split_);
  const size_t span = end_ - begin_ - T_ - 1;
  const int64_t first = sample_ + static_cast<int64_t>(rank_) * B_;
  for (int r = 0; r < B_; ++r) {
    size_t start = begin_ + static_cast<size_t>(uniform_at(seed_, key, first + r) * span);
    for (int t = 0; t < T_; ++t) {
      size_t i = static_cast<size_t>(r) * T_ + t;
      b.tokens[i] = static_cast<unsigned char>(text_[start + t]);
      b.targets[i] = static_cast<unsigned char>(text_[start + t + 1]);
    }
  }
  sample_ += static_cast<int64_t>(world_) * B_;
}

Json ByteTextSource::state() const {
  Json j = Json::object();
  j["kind"] = "byte_text";
  j["sample"] = sample_;
  return j;
}

void ByteTextSource::restore(const Json& state) {
  LOOM_CHECK(state.at("kind").as_string() == "byte_text",
             "checkpoint's data state is for another data source");
  sample_ = state.at("sample").as_int();
}

std::string ByteTextSource::describe() const {
  return cat("byte-level text: ", files_, " files, ", end_ - begin_, " bytes in the ", split_,
             " split");
}

}  // namespace loom
