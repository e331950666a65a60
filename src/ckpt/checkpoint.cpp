#include "ckpt/checkpoint.h"

#include <fcntl.h>  // AT_FDCWD
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "ckpt/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "loom.checkpoint";
constexpr int kVersion = 2;        // 2: the directory holds a commit record
constexpr int kLegacyVersion = 1;  // written before commit records: loaded unverified
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optim.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kCommitFile = "commit.json";
constexpr const char* kCommitFormat = "loom.checkpoint.commit";
constexpr const char* kLatestFile = "latest";

std::string join(const std::string& a, const std::string& b) {
  return (fs::path(a) / b).string();
}

// Last path component, ignoring trailing slashes.
std::string base_name(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return fs::path(p).filename().string();
}

// "step_*.tmp.<pid>" or "latest.tmp.<pid>" of a process that no longer exists: a crashed
// save's leftovers. Assumes one host writes the root (pids of other hosts are not visible).
bool is_stale_tmp(const std::string& name) {
  size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return false;
  if (name.rfind("step_", 0) != 0 && name.rfind("latest.", 0) != 0) return false;
  std::string pid_text = name.substr(at + 5);
  if (pid_text.empty() || pid_text.size() > 9 ||
      !std::all_of(pid_text.begin(), pid_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  pid_t pid = static_cast<pid_t>(std::stol(pid_text));
  if (pid == ::getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

void remove_stale_tmps(const std::string& root) {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(root, ec)) {
    std::string name = de.path().filename().string();
    if (is_stale_tmp(name)) {
      log_warn("checkpoint: removing ", de.path().string(), " left by a crashed save");
      remove_all(de.path().string());
    }
  }
}

// Moves the finished `tmp` directory to `final_dir`, replacing an existing one atomically.
void commit_dir(const std::string& tmp, const std::string& final_dir) {
  if (::rename(tmp.c_str(), final_dir.c_str()) == 0) return;
  const int err = errno;
  LOOM_CHECK(err == EEXIST || err == ENOTEMPTY, final_dir, ": rename from ", tmp, " failed (",
             std::strerror(err), ")");
  // Re-saving a step: swap the two directories in one step, then delete the old one.
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    remove_all(tmp);
    return;
  }
  // No RENAME_EXCHANGE on this filesystem: move the old one aside first (a short window in
  // which the step directory is missing; `latest` still names it, and loading says so).
  const std::string old = final_dir + ".old." + std::to_string(::getpid());
  LOOM_CHECK(::rename(final_dir.c_str(), old.c_str()) == 0, final_dir, ": cannot move aside (",
             std::strerror(errno), ")");
  LOOM_CHECK(::rename(tmp.c_str(), final_dir.c_str()) == 0, final_dir, ": rename from ", tmp,
             " failed (", std::strerror(errno), ")");
  remove_all(old);
}

// A test hook (LOOM_TEST_CKPT_WRITE_DELAY_S seconds): a slow disk between the two tensor files,
// so that tests can kill a process in the middle of a (background) checkpoint write.
void test_write_delay() {
  const char* env = std::getenv("LOOM_TEST_CKPT_WRITE_DELAY_S");
  if (!env || !*env) return;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  LOOM_CHECK(end && *end == '\0' && s >= 0 && s <= 3600, "LOOM_TEST_CKPT_WRITE_DELAY_S='", env,
             "' is not a number of seconds in [0, 3600]");
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

Json digest_json(const SafetensorsDigest& d) {
  Json j = Json::object();
  j["bytes"] = Json(static_cast<int64_t>(d.bytes));
  j["header"] = Json(hex64(d.header));
  Json t = Json::object();
  for (const auto& [name, sum] : d.tensors) t[name] = Json(hex64(sum));
  j["tensors"] = std::move(t);
  return j;
}

Json commit_record(int64_t step, const SafetensorsDigest& model, const SafetensorsDigest& optim,
                   const std::string& state_text) {
  Json j = Json::object();
  j["format"] = Json(kCommitFormat);
  j["version"] = Json(1);
  j["step"] = Json(step);
  j["checksum"] = Json("xxh64");
  Json files = Json::object();
  files[kModelFile] = digest_json(model);
  files[kOptimFile] = digest_json(optim);
  Json st = Json::object();
  st["bytes"] = Json(static_cast<int64_t>(state_text.size()));
  st["xxh64"] = Json(hex64(xxh64(state_text.data(), state_text.size())));
  files[kStateFile] = std::move(st);
  j["files"] = std::move(files);
  return j;
}

uint64_t recorded_sum(const Json& j, const std::string& key, const std::string& where) {
  uint64_t v = 0;
  LOOM_CHECK(j.contains(key) && j.at(key).is_string() && parse_hex64(j.at(key).as_string(), &v),
             where, ": '", key, "' is missing or not 16 hex digits");
  return v;
}

// Throws naming `file` and what differs from its entry `rec` of the commit record.
void check_file(const SafetensorsReader& file, const Json& rec, const std::string& commit_path) {
  const std::string where = cat(commit_path, ": entry for ", file.path());
  LOOM_CHECK(rec.is_object() && rec.contains("tensors") && rec.at("tensors").is_object(), where,
             " is malformed");
  const SafetensorsDigest d = file.digest();
  const int64_t bytes = rec.at("bytes").as_int();
  LOOM_CHECK(static_cast<int64_t>(d.bytes) == bytes, file.path(), ": ", d.bytes,
             " bytes, but the commit record says ", bytes, " (truncated or replaced)");
  const uint64_t header = recorded_sum(rec, "header", where);
  LOOM_CHECK(d.header == header, file.path(), ": header checksum ", hex64(d.header),
             " differs from the commit record's ", hex64(header), " (corrupt header)");
  const auto& want = rec.at("tensors").as_object();
  LOOM_CHECK(want.size() == d.tensors.size(), file.path(), ": ", d.tensors.size(),
             " tensors, but the commit record lists ", want.size());
  for (const auto& [name, sum] : d.tensors) {
    LOOM_CHECK(rec.at("tensors").contains(name), file.path(), ": tensor '", name,
               "' is not in the commit record");
    const uint64_t w = recorded_sum(rec.at("tensors"), name, where);
    LOOM_CHECK(sum == w, file.path(), ": tensor '", name, "': checksum ", hex64(sum),
               " differs from the commit record's ", hex64(w), " (corrupt data)");
  }
}

uint64_t fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// widen: a model file's bf16/fp16 tensors restore into fp32 ones (exactly; an import kept in
// the files' bf16, `loom ckpt import --dtype bf16`).
void restore(const SafetensorsReader& file, const TensorList& dst, bool widen = false) {
  check_tensors_match(file, dst, /*check_dtype=*/true, widen);
  for (const NamedTensor& nt : dst) {
    Tensor src = file.view(nt.name);
    Tensor out = nt.tensor;  // shares storage: writes land in the caller's buffer
    if (src.dtype() == DType::BF16 && out.dtype() == DType::F32 && src.is_contiguous() &&
        out.is_contiguous()) {
      const uint16_t* a = src.data<uint16_t>();
      float* b = out.data<float>();
      for (int64_t i = 0; i < out.numel(); ++i) b[i] = bf16_to_f32(a[i]);
      continue;
    }
    out.copy_from(src);
  }
}

}  // namespace

Json trainer_state_to_json(const TrainerState& s) {
  Json j = Json::object();
  j["format"] = Json(kFormat);
  j["version"] = Json(kVersion);
  j["step"] = Json(s.step);
  j["seed"] = Json(s.seed);  // stored as its int64 bit pattern; read back exactly
  j["rng"] = s.rng;
  j["data"] = s.data;
  j["config"] = Json(s.config_text);
  j["fingerprint"] = Json(s.fingerprint);
  j["extra"] = s.extra;
  return j;
}

TrainerState trainer_state_from_json(const Json& j, const std::string& where) {
  TrainerState s;
  try {
    LOOM_CHECK(j.is_object(), "expected a JSON object");
    // Each error names its field (the JSON layer's says only what was wrong).
    auto field = [&](const char* k) -> const Json& {
      LOOM_CHECK(j.contains(k), "missing field '", k, "'");
      return j.at(k);
    };
    auto integer = [&](const char* k) -> int64_t {
      try {
        return field(k).as_int();
      } catch (const Error& e) {
        fail("field '", k, "': ", e.what());
      }
    };
    auto text = [&](const char* k) -> std::string {
      try {
        return field(k).as_string();
      } catch (const Error& e) {
        fail("field '", k, "': ", e.what());
      }
    };
    auto object = [&](const char* k) -> const Json& {
      LOOM_CHECK(field(k).is_object(), "field '", k, "': expected an object");
      return field(k);
    };
    LOOM_CHECK(text("format") == kFormat, "format is '", text("format"), "', expected '", kFormat,
               "'");
    int64_t version = integer("version");
    LOOM_CHECK(version == kVersion || version == kLegacyVersion, "version ", version,
               " is not supported (this build reads ", kLegacyVersion, " and ", kVersion, ")");
    s.step = integer("step");
    LOOM_CHECK(s.step >= 0, "negative step ", s.step);
    s.seed = static_cast<uint64_t>(integer("seed"));
    s.rng = field("rng");
    s.data = object("data");
    s.config_text = text("config");
    s.fingerprint = text("fingerprint");
    s.extra = object("extra");
    if (s.extra.contains("optimizer_steps")) {
      try {
        s.extra.at("optimizer_steps").as_int();
      } catch (const Error& e) {
        fail("field 'extra.optimizer_steps': ", e.what());
      }
    }
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return s;
}

std::string shape_fingerprint(const TensorList& tensors) {
  std::vector<std::pair<std::string, Shape>> items;
  for (const NamedTensor& nt : tensors)
    items.emplace_back(nt.name, nt.shard.sharded() ? nt.shard.global_shape : nt.tensor.shape());
  std::sort(items.begin(), items.end());
  uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, shape] : items) {
    h = fnv1a(h, name);
    h = fnv1a(h, shape_str(shape));
    h = fnv1a(h, ";");
  }
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return cat("shapes:", items.size(), ":", buf);
}

std::string shape_fingerprint(const TensorMap& tensors) {
  return shape_fingerprint(to_list(tensors));
}

std::string rank_dir_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d", rank);
  return buf;
}

std::string step_dir_name(int64_t step) {
  LOOM_CHECK(step >= 0, "negative checkpoint step ", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

bool parse_step_dir_name(const std::string& name, int64_t* step) {
  // 8 to 18 digits: the canonical zero padding, and no int64 overflow.
  if (name.size() < 13 || name.size() > 23 || name.rfind("step_", 0) != 0) return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  *step = std::stoll(name.substr(5));
  return step_dir_name(*step) == name;  // canonical spelling only
}

std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorMap& model, const TensorMap& optim, int keep_last) {
  return save_checkpoint(root, state, to_list(model), to_list(optim), keep_last);
}

std::string save_checkpoint(const std::string& root, const TrainerState& state,
                            const TensorList& model, const TensorList& optim, int keep_last) {
  LOOM_CHECK(keep_last >= 0, "checkpoint keep_last must be >= 0, got ", keep_last);
  const std::string name = step_dir_name(state.step);
  make_dirs(root);
  remove_stale_tmps(root);

  const std::string tmp = join(root, name + ".tmp." + std::to_string(::getpid()));
  const std::string final_dir = join(root, name);
  remove_all(tmp);
  make_dirs(tmp);
  try {
    TrainerState st = state;
    if (st.fingerprint.empty()) st.fingerprint = shape_fingerprint(model);
    SafetensorsDigest model_sums, optim_sums;
    write_safetensors(join(tmp, kModelFile), model, {{"format", "pt"}, {"loom.kind", "model"}},
                      &model_sums);
    test_write_delay();
    write_safetensors(join(tmp, kOptimFile), optim, {{"format", "pt"}, {"loom.kind", "optim"}},
                      &optim_sums);
    const std::string state_text = trainer_state_to_json(st).dump(2) + "\n";
    write_file_atomic(join(tmp, kStateFile), state_text);
    // Last, once everything it describes is durable (AtomicFile fsyncs each file).
    write_file_atomic(join(tmp, kCommitFile),
                      commit_record(st.step, model_sums, optim_sums, state_text).dump(2) + "\n");
    commit_dir(tmp, final_dir);
  } catch (...) {
    remove_all(tmp);
    throw;
  }
  fsync_dir(root);
  // Read back what was stored before `latest` names it and rotation deletes anything older.
  Checkpoint stored(final_dir);
  write_file_atomic(join(root, kLatestFile), name + "\n");
  if (keep_last > 0) prune_checkpoints(root, state.step, keep_last);
  return final_dir;
}

void prune_checkpoints(const std::string& root, int64_t newest, int keep_last) {
  LOOM_CHECK(keep_last >= 1, "checkpoint keep_last must be >= 1 to rotate, got ", keep_last);
  std::vector<int64_t> older;
  for (int64_t s : list_checkpoint_steps(root))
    if (s < newest) older.push_back(s);
  const size_t keep_older = static_cast<size_t>(keep_last - 1);
  if (older.size() <= keep_older) return;
  for (size_t i = 0; i + keep_older < older.size(); ++i) {
    const std::string dir = join(root, step_dir_name(older[i]));
    log_info("checkpoint: removing ", dir, " (keep_last=", keep_last, ")");
    remove_all(dir);
  }
  fsync_dir(root);
}

bool has_checkpoints(const std::string& root) {
  return file_exists(join(root, kLatestFile)) || !list_checkpoint_steps(root).empty();
}

void verify_checkpoint(const std::string& step_dir) {
  int64_t step;
  LOOM_CHECK(
      file_exists(join(step_dir, kStateFile)) || parse_step_dir_name(base_name(step_dir), &step),
      step_dir, ": not a checkpoint step directory");
  Checkpoint c(step_dir);
}

uint64_t commit_digest(const std::string& step_dir) {
  const std::string path = join(step_dir, kCommitFile);
  try {
    const std::string text = read_file(path);
    return xxh64(text.data(), text.size());
  } catch (const Error& e) {
    throw CheckpointCorrupt(e.what());
  }
}

std::vector<int64_t> list_checkpoint_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(root, ec)) {
    int64_t s;
    if (de.is_directory() && parse_step_dir_name(de.path().filename().string(), &s))
      steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
  const std::string path = join(root, kLatestFile);
  if (!file_exists(path)) return std::nullopt;
  std::string text = read_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  int64_t step;
  LOOM_CHECK(parse_step_dir_name(text, &step), path, ": expected a step directory name like ",
             step_dir_name(42), ", got '", text.substr(0, 64), "'");
  const std::string dir = join(root, text);
  LOOM_CHECK(fs::is_directory(dir), path, ": names ", dir, ", which does not exist");
  return dir;
}

void check_tensors_match(const SafetensorsReader& file, const TensorList& expected,
                         bool check_dtype, bool widen) {
  std::vector<const NamedTensor*> want;
  for (const NamedTensor& nt : expected) want.push_back(&nt);
  std::sort(want.begin(), want.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });
  const auto& have = file.entries();  // sorted by name
  size_t i = 0, k = 0;
  while (i < have.size() || k < want.size()) {
    if (k == want.size() || (i < have.size() && have[i].name < want[k]->name))
      fail(file.path(), ": tensor '", have[i].name, "' ", shape_str(have[i].shape),
           " is in the checkpoint but not in the model");
    if (i == have.size() || want[k]->name < have[i].name)
      fail(file.path(), ": tensor '", want[k]->name, "' ", shape_str(want[k]->tensor.shape()),
           " is expected but missing from the checkpoint");
    const auto& h = have[i];
    const NamedTensor& w = *want[k];
    LOOM_CHECK(k == 0 || want[k - 1]->name != w.name, "duplicate expected tensor '", w.name, "'");
    LOOM_CHECK(h.shape == w.tensor.shape(), file.path(), ": tensor '", h.name,
               "': checkpoint has shape ", shape_str(h.shape), ", expected ",
               shape_str(w.tensor.shape()));
    const bool widens = widen && w.tensor.dtype() == DType::F32 &&
                        (h.dtype == DType::BF16 || h.dtype == DType::F16);
    LOOM_CHECK(!check_dtype || h.dtype == w.tensor.dtype() || widens, file.path(), ": tensor '",
               h.name, "': checkpoint has dtype ", dtype_name(h.dtype), ", expected ",
               dtype_name(w.tensor.dtype()));
    auto norm = [](const ShardInfo& s, const Shape& local) {
      ShardInfo n = s;
      if (!n.sharded()) n.global_shape = local;
      if (n.global_offset.empty()) n.global_offset = Shape(local.size(), 0);
      return n;
    };
    const ShardInfo hs = norm(h.shard, h.shape), ws = norm(w.shard, w.tensor.shape());
    LOOM_CHECK(hs.global_shape == ws.global_shape && hs.global_offset == ws.global_offset,
               file.path(), ": tensor '", h.name, "': checkpoint holds global shape ",
               shape_str(hs.global_shape), " at offset ", shape_str(hs.global_offset),
               ", expected global shape ", shape_str(ws.global_shape), " at offset ",
               shape_str(ws.global_offset), " (resharding on load is not supported yet)");
    ++i;
    ++k;
  }
}

Checkpoint::Checkpoint(const std::string& path) {
  int64_t named_step;
  if (file_exists(join(path, kStateFile)) || parse_step_dir_name(base_name(path), &named_step)) {
    open(path);
    return;
  }
  // A root: `latest` first, then older steps; later steps are an abandoned future.
  const std::string latest_path = join(path, kLatestFile);
  const std::vector<int64_t> steps = list_checkpoint_steps(path);
  LOOM_CHECK(file_exists(latest_path) || !steps.empty(), path, ": no checkpoint here (neither ",
             kStateFile, " nor ", kLatestFile, ")");
  int64_t bound = INT64_MAX;
  std::string failures;
  if (file_exists(latest_path)) {
    try {
      const std::string latest = *find_latest_checkpoint(path);
      parse_step_dir_name(base_name(latest), &bound);
    } catch (const Error& e) {
      // `latest` is rewritten after the step directory is committed; a damaged one leaves the
      // directories themselves to go by.
      log_warn("checkpoint: ", e.what(), "; looking for the newest step that verifies");
      failures += cat("\n  ", e.what());
    }
  }
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (*it > bound) continue;
    const std::string dir = join(path, step_dir_name(*it));
    try {
      open(dir);
      if (!failures.empty()) log_warn("checkpoint: resuming from step ", *it, " (", dir, ")");
      return;
    } catch (const CheckpointCorrupt& e) {
      log_warn("checkpoint step ", *it, " skipped: ", e.what());
      failures += cat("\n  step ", *it, ": ", e.what());
    }
  }
  throw CheckpointCorrupt(cat(path, ": no checkpoint here verifies:", failures));
}

void Checkpoint::open(const std::string& dir) {
  dir_ = dir;
  model_.reset();
  optim_.reset();
  const std::string state_path = join(dir_, kStateFile);
  const std::string commit_path = join(dir_, kCommitFile);
  try {
    const std::string state_text = read_file(state_path);
    const Json state_json = Json::parse(state_text, state_path);
    state_ = trainer_state_from_json(state_json, state_path);
    model_ = std::make_unique<SafetensorsReader>(join(dir_, kModelFile));
    optim_ = std::make_unique<SafetensorsReader>(join(dir_, kOptimFile));
    int64_t dir_step;
    if (parse_step_dir_name(base_name(dir_), &dir_step))
      LOOM_CHECK(dir_step == state_.step, state_path, ": step ", state_.step,
                 " does not match the directory name");
    if (!file_exists(commit_path)) {
      LOOM_CHECK(state_json.at("version").as_int() == kLegacyVersion, commit_path,
                 ": missing (every checkpoint of state.json version ", kVersion,
                 " has a commit record)");
      log_warn("checkpoint ", dir_, ": written before checksums existed; loaded unverified");
      return;
    }
    const Json commit = Json::parse(read_file(commit_path), commit_path);
    LOOM_CHECK(commit.is_object() && commit.contains("format") && commit.at("format").is_string() &&
                   commit.at("format").as_string() == kCommitFormat,
               commit_path, ": not a Loom commit record");
    LOOM_CHECK(commit.at("step").as_int() == state_.step, commit_path, ": step ",
               commit.at("step").as_int(), " differs from state.json's ", state_.step);
    const Json& files = commit.at("files");
    const Json& st = files.at(kStateFile);
    LOOM_CHECK(
        st.at("bytes").as_int() == static_cast<int64_t>(state_text.size()) &&
            recorded_sum(st, "xxh64", commit_path) == xxh64(state_text.data(), state_text.size()),
        state_path, ": size or checksum differs from the commit record (corrupt file)");
    check_file(*model_, files.at(kModelFile), commit_path);
    check_file(*optim_, files.at(kOptimFile), commit_path);
  } catch (const CheckpointCorrupt&) {
    throw;
  } catch (const Error& e) {
    // Every failure names the checkpoint (JSON lookups alone would not say which file).
    const std::string what = e.what();
    throw CheckpointCorrupt(what.find(dir_) == std::string::npos ? cat(dir_, ": ", what) : what);
  }
}

void Checkpoint::restore_model(const TensorList& dst,
                               const std::string& expected_fingerprint) const {
  check_tensors_match(*model_, dst, /*check_dtype=*/true, /*widen=*/true);
  LOOM_CHECK(expected_fingerprint.empty() || expected_fingerprint == state_.fingerprint,
             join(dir_, kStateFile), ": model fingerprint '", state_.fingerprint,
             "' differs from the model's '", expected_fingerprint, "'");
  restore(*model_, dst, /*widen=*/true);
}

void Checkpoint::restore_model(const TensorMap& dst,
                               const std::string& expected_fingerprint) const {
  restore_model(to_list(dst), expected_fingerprint);
}

void Checkpoint::restore_optim(const TensorList& dst) const {
  restore(*optim_, dst);
}
void Checkpoint::restore_optim(const TensorMap& dst) const {
  restore(*optim_, to_list(dst));
}

}  // namespace loom::ckpt
