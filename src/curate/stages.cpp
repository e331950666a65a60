#include "curate/stages.h"

#include <atomic>
#include <map>

#include "core/error.h"
#include "core/json.h"

namespace loom::curate {

static std::atomic<bool> g_reference_paths{false};
void set_reference_paths(bool on) {
  g_reference_paths.store(on, std::memory_order_relaxed);
}
bool reference_paths() {
  return g_reference_paths.load(std::memory_order_relaxed);
}

using Factory = std::unique_ptr<Stage> (*)(const StageParams&);

static const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> r = {
      {"clean", make_clean_stage},
      {"html_extract", make_html_extract_stage},
      {"langid", make_langid_stage},
      {"gopher_quality", make_gopher_quality_stage},
      {"gopher_repetition", make_gopher_repetition_stage},
      {"c4", make_c4_stage},
      {"fineweb", make_fineweb_stage},
      {"pii", make_pii_stage},
      {"exact_dedup", make_exact_dedup_stage},
      {"fuzzy_dedup", make_fuzzy_dedup_stage},
      {"quality_classifier", make_quality_classifier_stage},
      {"length", make_length_stage},
  };
  return r;
}

std::vector<std::string> stage_types() {
  std::vector<std::string> t;
  for (auto& [k, f] : registry()) t.push_back(k);
  return t;
}

std::unique_ptr<Stage> make_stage(const std::string& type, const StageParams& params) {
  auto it = registry().find(type);
  if (it == registry().end()) {
    std::string valid;
    for (auto& t : stage_types()) valid += (valid.empty() ? "" : ", ") + t;
    fail(params.key("type"), ": unknown stage type '", type, "' (valid: ", valid, ")");
  }
  return it->second(params);
}

std::vector<std::string> parse_string_list(const std::string& text, const std::string& where) {
  std::vector<std::string> out;
  Json j;
  try {
    j = Json::parse(text, where);
  } catch (const Error&) {
    // A single bare string is a list of one.
    if (!text.empty() && text.front() != '[') return {text};
    throw;
  }
  if (j.is_string()) return {j.as_string()};
  LOOM_CHECK(j.is_array(), where, ": expected a list of strings like [\"a\", \"b\"]");
  for (auto& v : j.as_array()) {
    LOOM_CHECK(v.is_string(), where, ": expected a list of strings like [\"a\", \"b\"]");
    out.push_back(v.as_string());
  }
  return out;
}

std::vector<std::string> StageParams::get_list(const std::string& k,
                                               const std::vector<std::string>& def) const {
  if (!cfg_.has(key(k))) return def;
  return parse_string_list(cfg_.get_string(key(k), ""), key(k));
}

}  // namespace loom::curate
