#include "data/hf_chat_template.h"

#include <filesystem>

#include "core/error.h"
#include "core/fs.h"

namespace loom::data {
namespace {

// A special token in tokenizer_config.json: a string or an AddedToken object.
std::string token_text(const Json& cfg, const std::string& key, const std::string& where) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return "";
  const Json& t = cfg.at(key);
  if (t.is_string()) return t.as_string();
  LOOM_CHECK(t.is_object() && t.contains("content") && t.at("content").is_string(), where, ": '",
             key, "' must be a string or an object with a string 'content'");
  return t.at("content").as_string();
}

}  // namespace

HfChatTemplate::HfChatTemplate(const std::string& path) {
  std::string config_path, jinja_path;
  if (std::filesystem::is_directory(path)) {
    config_path = path + "/tokenizer_config.json";
    if (file_exists(path + "/chat_template.jinja")) jinja_path = path + "/chat_template.jinja";
    if (!file_exists(config_path)) config_path.clear();
    LOOM_CHECK(!jinja_path.empty() || !config_path.empty(), path,
               ": neither chat_template.jinja nor tokenizer_config.json is there");
  } else if (std::filesystem::path(path).extension() == ".jinja") {
    jinja_path = path;
  } else {
    config_path = path;
  }
  Json cfg = Json::object();
  if (!config_path.empty()) {
    cfg = Json::parse(read_file(config_path), config_path);
    LOOM_CHECK(cfg.is_object(), config_path, ": expected a JSON object");
    bos_ = token_text(cfg, "bos_token", config_path);
    eos_ = token_text(cfg, "eos_token", config_path);
    unk_ = token_text(cfg, "unk_token", config_path);
    pad_ = token_text(cfg, "pad_token", config_path);
  }
  auto add = [&](const std::string& name, const std::string& src, const std::string& where) {
    templates_[name] = {src, std::make_shared<jinja::Template>(src, where)};
  };
  if (!jinja_path.empty()) {
    add("default", read_file(jinja_path), jinja_path);
    return;
  }
  const std::string where = config_path + " chat_template";
  LOOM_CHECK(cfg.contains("chat_template") && !cfg.at("chat_template").is_null(), config_path,
             ": no 'chat_template'");
  const Json& ct = cfg.at("chat_template");
  if (ct.is_string()) {
    add("default", ct.as_string(), where);
    return;
  }
  LOOM_CHECK(ct.is_array(), where, ": must be a string or a list of {name, template}");
  for (size_t i = 0; i < ct.size(); ++i) {
    const Json& e = ct.as_array()[i];
    const std::string at = cat(where, "[", i, "]");
    LOOM_CHECK(e.is_object() && e.contains("name") && e.at("name").is_string() &&
                   e.contains("template") && e.at("template").is_string(),
               at, ": expected an object with string 'name' and 'template'");
    add(e.at("name").as_string(), e.at("template").as_string(),
        cat(at, " (", e.at("name").as_string(), ")"));
  }
  LOOM_CHECK(templates_.count("default"), where, ": no template named 'default'");
}

const std::string& HfChatTemplate::source(const std::string& name) const {
  auto it = templates_.find(name);
  LOOM_CHECK(it != templates_.end(), "chat template: no template named '", name, "'");
  return it->second.source;
}

bool HfChatTemplate::has_generation_blocks() const {
  return templates_.at("default").tpl->has_generation_blocks();
}

jinja::Rendered HfChatTemplate::render(const Json& messages, const Json& tools,
                                       bool add_generation_prompt, const Json& extra) const {
  using jinja::Value;
  LOOM_CHECK(messages.is_array(), "chat template: 'messages' must be an array");
  LOOM_CHECK(tools.is_null() || tools.is_array(), "chat template: 'tools' must be an array");
  const bool with_tools = tools.is_array() && tools.size() > 0;
  const Named& t =
      templates_.at(with_tools && templates_.count("tool_use") ? "tool_use" : "default");
  jinja::Dict g;
  g.set("messages", Value::from_json(messages));
  g.set("tools", Value::from_json(tools));
  g.set("documents", Value::none());
  g.set("add_generation_prompt", Value(add_generation_prompt));
  for (const auto& [k, v] : {std::pair<const char*, const std::string*>{"bos_token", &bos_},
                             {"eos_token", &eos_},
                             {"unk_token", &unk_},
                             {"pad_token", &pad_}})
    if (!v->empty()) g.set(k, Value(*v));
  g.set("raise_exception", Value::function("raise_exception", [](jinja::Args& a) -> Value {
          fail("raise_exception: ", a.pos.empty() ? std::string() : a.pos[0].str());
        }));
  const std::time_t now = now_ ? now_ : std::time(nullptr);
  g.set("strftime_now", Value::function("strftime_now", [now](jinja::Args& a) {
          LOOM_CHECK(a.pos.size() == 1 && a.pos[0].is_string() && a.kw.empty(),
                     "strftime_now expects one format string");
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[512];
          const size_t n = std::strftime(buf, sizeof buf, a.pos[0].as_string().c_str(), &tm);
          LOOM_CHECK(n > 0 || a.pos[0].as_string().empty(),
                     "strftime_now: format too long or empty result");
          return Value(std::string(buf, n));
        }));
  LOOM_CHECK(extra.is_object(), "chat template: extra variables must be an object");
  for (const auto& [k, v] : extra.as_object()) g.set(k, Value::from_json(v));
  return t.tpl->render(g);
}

}  // namespace loom::data
