#include "ckpt/verify.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "ckpt/checkpoint.h"
#include "ckpt/global_commit.h"
#include "core/error.h"
#include "core/fs.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

VerifyEntry check_one(const std::string& dir, int64_t step) {
  VerifyEntry e{dir, step, "", ""};
  try {
    verify_checkpoint(dir);
  } catch (const Error& err) {
    e.error = err.what();
  }
  return e;
}

// rank_00003 -> 3; -1 for other names.
int rank_of(const std::string& name) {
  if (name.size() != 10 || name.rfind("rank_", 0) != 0) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  const int r = std::stoi(name.substr(5));
  return rank_dir_name(r) == name ? r : -1;
}

}  // namespace

std::vector<VerifyEntry> verify_checkpoints(const std::string& path) {
  int64_t step;
  const std::string name = fs::path(path).filename().string();
  if (file_exists(path + "/state.json") || parse_step_dir_name(name, &step)) {
    VerifyEntry e = check_one(path, -1);
    try {
      e.step = Checkpoint(path).state().step;
    } catch (const Error&) {
    }
    return {e};
  }
  const std::string base = fs::is_directory(path + "/checkpoints") ? path + "/checkpoints" : path;
  std::vector<VerifyEntry> out;
  for (int64_t s : list_checkpoint_steps(base))
    out.push_back(check_one(base + "/" + step_dir_name(s), s));

  // A distributed run: per-rank roots and rank 0's global commit records.
  std::map<int, std::string> ranks;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(base, ec))
    if (de.is_directory() && rank_of(de.path().filename().string()) >= 0)
      ranks[rank_of(de.path().filename().string())] = de.path().string();
  const std::vector<int64_t> committed = list_global_commits(base);
  for (const auto& [rank, root] : ranks) {
    for (int64_t s : list_checkpoint_steps(root)) {
      VerifyEntry e = check_one(root + "/" + step_dir_name(s), s);
      if (e.error.empty()) {
        if (!std::binary_search(committed.begin(), committed.end(), s)) {
          e.note = "not committed by every rank (no global commit record): resume ignores it";
        } else {
          try {
            const GlobalCommit gc = *read_global_commit(base, s);
            if (size_t(rank) >= gc.parts.size())
              e.error = cat(e.dir, ": rank ", rank, " is not in the global commit record of step ",
                            s, " (", gc.parts.size(), " ranks)");
            else if (commit_digest(e.dir) != gc.parts[size_t(rank)])
              e.error = cat(e.dir, ": differs from the part the global commit record of step ", s,
                            " lists (replaced after the commit)");
          } catch (const Error& err) {
            e.error = err.what();
          }
        }
      }
      out.push_back(e);
    }
  }
  // A committed step must have every rank's part (a part deleted since would go unnoticed above).
  for (int64_t s : committed) {
    try {
      const GlobalCommit gc = *read_global_commit(base, s);
      for (size_t r = 0; r < gc.parts.size(); ++r) {
        const std::string dir = base + "/" + rank_dir_name(int(r)) + "/" + step_dir_name(s);
        if (!fs::is_directory(dir))
          out.push_back({dir, s,
                         cat(dir, ": missing, but the global commit record of step ", s,
                             " lists rank ", r, "'s part"),
                         ""});
      }
    } catch (const Error& err) {
      out.push_back({global_commit_dir(base), s, err.what(), ""});
    }
  }
  LOOM_CHECK(!out.empty(), path, ": no checkpoints here (no step directories under ", base,
             " or its rank_* directories)");
  return out;
}

}  // namespace loom::ckpt
