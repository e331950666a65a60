#include "ckpt/global_commit.h"

#include <algorithm>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "loom.checkpoint.global_commit";
constexpr const char* kSuffix = ".json";

std::string record_path(const std::string& checkpoints_dir, int64_t step) {
  return global_commit_dir(checkpoints_dir) + "/" + step_dir_name(step) + kSuffix;
}

}  // namespace

std::string global_commit_dir(const std::string& checkpoints_dir) {
  return checkpoints_dir + "/committed";
}

std::string write_global_commit(const std::string& checkpoints_dir, const GlobalCommit& commit) {
  Json j = Json::object();
  j["format"] = Json(kFormat);
  j["version"] = Json(1);
  j["step"] = Json(commit.step);
  j["world_size"] = Json(static_cast<int64_t>(commit.parts.size()));
  j["layout"] = Json(commit.layout);
  Json parts = Json::array();
  for (uint64_t d : commit.parts) parts.push_back(Json(hex64(d)));
  j["parts"] = std::move(parts);
  make_dirs(global_commit_dir(checkpoints_dir));
  const std::string path = record_path(checkpoints_dir, commit.step);
  write_file_atomic(path, j.dump(2) + "\n");
  return path;
}

std::optional<GlobalCommit> read_global_commit(const std::string& checkpoints_dir, int64_t step) {
  const std::string path = record_path(checkpoints_dir, step);
  if (!file_exists(path)) return std::nullopt;
  GlobalCommit c;
  try {
    const Json j = Json::parse(read_file(path), path);
    LOOM_CHECK(j.is_object() && j.at("format").as_string() == kFormat,
               "not a global commit record");
    c.step = j.at("step").as_int();
    LOOM_CHECK(c.step == step, "records step ", c.step, ", but its name says ", step);
    c.layout = j.at("layout").as_string();
    const Json& parts = j.at("parts");
    LOOM_CHECK(
        parts.is_array() && static_cast<int64_t>(parts.size()) == j.at("world_size").as_int(),
        "'parts' must list one digest per rank (world_size)");
    for (const Json& p : parts.as_array()) {
      uint64_t d = 0;
      LOOM_CHECK(p.is_string() && parse_hex64(p.as_string(), &d), "parts[", c.parts.size(),
                 "] is not 16 hex digits");
      c.parts.push_back(d);
    }
  } catch (const Error& e) {
    throw CheckpointCorrupt(cat(path, ": ", e.what()));
  }
  return c;
}

std::vector<int64_t> list_global_commits(const std::string& checkpoints_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(global_commit_dir(checkpoints_dir), ec)) {
    const fs::path p = de.path();
    int64_t s;
    if (de.is_regular_file() && p.extension() == kSuffix &&
        parse_step_dir_name(p.stem().string(), &s))
      steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void prune_global_commits(const std::string& checkpoints_dir, const std::string& rank0_root,
                          int64_t newest) {
  const std::vector<int64_t> kept = list_checkpoint_steps(rank0_root);
  bool removed = false;
  for (int64_t s : list_global_commits(checkpoints_dir)) {
    if (s >= newest || std::binary_search(kept.begin(), kept.end(), s)) continue;
    remove_all(record_path(checkpoints_dir, s));
    removed = true;
  }
  if (removed) fsync_dir(global_commit_dir(checkpoints_dir));
}

}  // namespace loom::ckpt
