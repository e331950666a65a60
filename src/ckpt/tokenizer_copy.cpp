#include "ckpt/tokenizer_copy.h"

#include <unistd.h>

#include <filesystem>

#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSource = "loom_tokenizer_source.json";

// The files a tokenizer is made of, in any of the formats data::load_tokenizer reads.
constexpr const char* kTokenizerFiles[] = {"encoder.json",
                                           "vocab.bpe",
                                           "tokenizer.tiktoken",
                                           "tokenizer.tiktoken.json",
                                           "tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "tokenizer.model"};

// A spec's kind prefix ("gpt2:", "tiktoken:", "loom:", "hf:", "spm:"; "" for a bare path) and path,
// as data::load_tokenizer splits them.
std::pair<std::string, std::string> split_spec(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon != std::string::npos) {
    const std::string kind = spec.substr(0, colon);
    if (kind == "gpt2" || kind == "tiktoken" || kind == "loom" || kind == "hf" || kind == "spm")
      return {kind + ":", spec.substr(colon + 1)};
  }
  return {"", spec};
}

struct Recorded {
  std::string from, spec, chat;
};

bool read_source(const fs::path& dir, Recorded& r) {
  const fs::path p = dir / kSource;
  if (!file_exists(p.string())) return false;
  const Json j = Json::parse(read_file(p.string()), p.string());
  r.from = j.at("from").as_string();
  r.spec = j.at("spec").as_string();
  r.chat = j.contains("chat_template") ? j.at("chat_template").as_string() : "";
  return true;
}

// The copy's folder for a step directory: <step>/tokenizer, else the checkpoints root's above.
bool find_copy(const std::string& step_dir, fs::path& dir, Recorded& r) {
  const fs::path step = fs::absolute(step_dir);
  for (const fs::path& d : {step / "tokenizer", step.parent_path() / "tokenizer",
                            step.parent_path().parent_path() / "tokenizer"})
    if (read_source(d, r)) {
      dir = d;
      return true;
    }
  return false;
}

}  // namespace

void copy_tokenizer_in(const std::string& out_dir, const std::string& config_text) {
  const Config cfg = Config::parse(config_text, "the run's config");
  const std::string spec = cfg.get_string("data.tokenizer", "");
  if (spec.empty()) return;
  const std::string chat = cfg.get_string("data.chat_template", "");
  const fs::path dest = fs::path(out_dir) / "checkpoints" / "tokenizer";
  Recorded have;
  if (read_source(dest, have) && have.from == spec && have.chat == chat) return;
  const auto [kind, path] = split_spec(spec);
  LOOM_CHECK(fs::exists(path), "data.tokenizer ", spec, ": ", path,
             " not found (copying the tokenizer into the checkpoint)");
  // Written beside the destination, then moved into place: a crash leaves the old copy or none.
  const fs::path tmp = dest.string() + ".tmp." + std::to_string(::getpid());
  remove_all(tmp.string());
  make_dirs(tmp.string());
  std::string copy_spec;
  auto copy = [&](const fs::path& from, const std::string& name) {
    write_file_atomic((tmp / name).string(), read_file(from.string()));
  };
  if (fs::is_directory(path)) {
    int n = 0;
    for (const char* name : kTokenizerFiles)
      if (fs::is_regular_file(fs::path(path) / name)) {
        copy(fs::path(path) / name, name);
        ++n;
      }
    LOOM_CHECK(n > 0, "data.tokenizer ", spec, ": the folder holds no tokenizer file");
    copy_spec = kind + ".";
  } else {
    const std::string name = fs::path(path).filename().string();
    copy(path, name);
    if (fs::is_regular_file(path + ".json")) copy(path + ".json", name + ".json");  // tiktoken's
    copy_spec = kind + name;
  }
  Json src = Json::object();
  src["from"] = spec;
  src["spec"] = copy_spec;
  src["chat_template"] = chat;
  write_file_atomic((tmp / kSource).string(), src.dump(2) + "\n");
  remove_all(dest.string());
  fs::rename(tmp, dest);
  fsync_dir(dest.parent_path().string());
}

std::string checkpoint_tokenizer_spec(const std::string& step_dir, const std::string& config_text) {
  fs::path dir;
  Recorded r;
  if (find_copy(step_dir, dir, r)) {
    const auto [kind, name] = split_spec(r.spec);
    return kind + (dir / name).lexically_normal().string();
  }
  const std::string spec =
      Config::parse(config_text, step_dir + "/state.json").get_string("data.tokenizer", "");
  const auto [kind, path] = split_spec(spec);
  if (spec.empty() || fs::path(path).is_absolute() || fs::exists(path)) return spec;
  // The run directory: the one holding "checkpoints" above the step (a root per rank sits one
  // level deeper).
  fs::path run = fs::absolute(step_dir).lexically_normal();
  while (run.has_parent_path() && run.filename() != "checkpoints" && run != run.root_path())
    run = run.parent_path();
  run = run.filename() == "checkpoints" ? run.parent_path()
                                        : fs::absolute(step_dir).lexically_normal().parent_path();
  for (fs::path a = run;; a = a.parent_path()) {
    if (fs::exists(a / path)) return kind + (a / path).lexically_normal().string();
    if (a == a.root_path() || !a.has_parent_path()) break;
  }
  return spec;
}

std::string checkpoint_chat_template(const std::string& step_dir) {
  fs::path dir;
  Recorded r;
  return find_copy(step_dir, dir, r) ? r.chat : "";
}

}  // namespace loom::ckpt
