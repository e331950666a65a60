// A model's own chat template, as Hugging Face's tokenizer.apply_chat_template renders it: the
// Jinja `chat_template` of tokenizer_config.json (a string, or the list of named templates, of
// which "tool_use" is taken when tools are given and "default" otherwise) or the
// chat_template.jinja file beside it, rendered with trim_blocks and lstrip_blocks and the
// variables Hugging Face passes: messages, tools (None when absent), documents (None),
// add_generation_prompt, the tokenizer's bos/eos/unk/pad tokens, raise_exception,
// strftime_now, and any extra keyword (enable_thinking, ...).
#pragma once

#include <ctime>
#include <map>
#include <memory>
#include <string>

#include "core/json.h"
#include "data/jinja/template.h"

namespace loom::data {

class HfChatTemplate {
 public:
  // `path`: a model directory (its chat_template.jinja, else its tokenizer_config.json), a
  // tokenizer_config.json, or a .jinja file. Errors name the file and, for template syntax or
  // an unsupported construct, the line.
  explicit HfChatTemplate(const std::string& path);

  // Renders `messages` (a JSON array of message objects, passed as they are); `tools` is a JSON
  // array or null; `extra` an object of further variables. Errors (raise_exception included)
  // name the template and line.
  jinja::Rendered render(const Json& messages, const Json& tools, bool add_generation_prompt,
                         const Json& extra = Json::object()) const;

  const std::string& source(const std::string& name = "default") const;
  const std::string& bos_token() const { return bos_; }  // "" when the config has none
  const std::string& eos_token() const { return eos_; }
  bool has_generation_blocks() const;
  // strftime_now's clock (default: the current local time); tests fix it.
  void set_now(std::time_t t) { now_ = t; }

 private:
  struct Named {
    std::string source;
    std::shared_ptr<jinja::Template> tpl;
  };
  std::map<std::string, Named> templates_;
  std::string bos_, eos_, unk_, pad_;
  std::time_t now_ = 0;
};

}  // namespace loom::data
