// ChatTemplate's hf:PATH form: a model's own Jinja chat template (hf_chat_template.h) rendered
// to text, then encoded with the loss mask over what the assistant writes.
#include <algorithm>

#include "core/error.h"
#include "data/chat.h"
#include "data/hf_chat_template.h"

namespace loom::data {

void ChatTemplate::init_jinja() {
  auto hf = std::make_shared<HfChatTemplate>(name_.substr(3));
  LOOM_CHECK(!hf->eos_token().empty(), "chat template ", name_,
             ": no eos_token in tokenizer_config.json, so the end of an assistant turn is unknown");
  for (const std::string& s : {hf->bos_token(), hf->eos_token()})
    LOOM_CHECK(s.empty() || tok_.special_id(s) >= 0, "chat template ", name_,
               " needs the special token ", s,
               ", which the tokenizer does not have (add it as a special token)");
  end_of_turn_ = tok_.special_id(hf->eos_token());
  hf_ = std::move(hf);
}

std::string ChatTemplate::render_text(const Json& messages, const Json& tools,
                                      bool add_generation_prompt) const {
  LOOM_CHECK(hf_, "chat template ", name_, " is a built-in, not a Jinja template");
  return hf_->render(messages, tools, add_generation_prompt).text;
}

// Encodes text with the template's markers as special tokens, as Hugging Face tokenizes the
// rendered string (so a marker written inside a message is a marker too).
void ChatTemplate::append_text(ChatExample& ex, const std::string& text, bool trained) const {
  tok_.encode(text, ex.ids, /*allow_special=*/true);
  ex.mask.resize(ex.ids.size(), trained ? 1 : 0);
}

ChatExample ChatTemplate::render_json(const Json& messages, const Json& tools,
                                      const std::string& where) const {
  LOOM_CHECK(hf_, "chat template ", name_, " is a built-in, not a Jinja template");
  const jinja::Rendered full = hf_->render(messages, tools, false);
  std::vector<std::pair<size_t, size_t>> spans = full.generation;
  if (!hf_->has_generation_blocks()) {
    // The assistant's text is what message k adds after the generation prompt that precedes
    // it: render(messages[:k], prompt) .. render(messages[:k+1]), both prefixes of the whole.
    const Json::Array& ms = messages.as_array();
    for (size_t k = 0; k < ms.size(); ++k) {
      if (!(ms[k].is_object() && ms[k].contains("role") && ms[k].at("role").is_string() &&
            ms[k].at("role").as_string() == "assistant"))
        continue;
      const Json before(Json::Array(ms.begin(), ms.begin() + long(k)));
      const Json upto(Json::Array(ms.begin(), ms.begin() + long(k) + 1));
      const std::string p = hf_->render(before, tools, true).text;
      const std::string f = hf_->render(upto, tools, false).text;
      LOOM_CHECK(full.text.compare(0, p.size(), p) == 0 && full.text.compare(0, f.size(), f) == 0 &&
                     f.size() >= p.size() && f.compare(0, p.size(), p) == 0,
                 where, ": messages[", k, "]: chat template ", name_,
                 " renders the conversation up to this assistant message differently from the "
                 "start of the whole conversation, so its trained tokens cannot be located (mark "
                 "them in the template with {% generation %} ... {% endgeneration %})");
      spans.emplace_back(p.size(), f.size());
    }
  }
  ChatExample ex;
  // The ids of the whole text (what the model sees when served), each trained when it starts
  // inside a span; the start is the byte offset its decoded bytes give, so this needs decoding
  // to be the exact inverse of encoding (byte-level vocabularies).
  ex.ids = tok_.encode(full.text);
  std::vector<size_t> start(ex.ids.size());
  std::string decoded;
  for (size_t i = 0; i < ex.ids.size(); ++i) {
    start[i] = decoded.size();
    tok_.decode_append(ex.ids[i], decoded);
  }
  if (decoded == full.text) {
    ex.mask.assign(ex.ids.size(), 0);
    for (const auto& [b, e] : spans)
      for (size_t i = 0; i < ex.ids.size(); ++i) ex.mask[i] |= start[i] >= b && start[i] < e;
    return ex;
  }
  // Otherwise (a SentencePiece decoder's space handling) each span is encoded on its own.
  ex = ChatExample();
  size_t pos = 0;
  for (const auto& [b, e] : spans) {
    if (b < pos || e <= b) continue;  // empty, or inside a span already taken
    append_text(ex, full.text.substr(pos, b - pos), false);
    append_text(ex, full.text.substr(b, e - b), true);
    pos = e;
  }
  append_text(ex, full.text.substr(pos), false);
  return ex;
}

Json chat_messages_json(const std::vector<ChatMessage>& messages) {
  Json out = Json::array();
  for (const ChatMessage& m : messages) {
    Json o = Json::object();
    o["role"] = m.role;
    o["content"] = m.content;
    out.push_back(std::move(o));
  }
  return out;
}

ChatExample parse_jinja_example(const Json& j, const ChatTemplate& t, const std::string& where) {
  if (!j.contains("messages")) {
    LOOM_CHECK(j.contains("prompt") && j.contains("completion"), where,
               ": expected 'messages', or 'prompt' and 'completion'");
    LOOM_CHECK(j.at("prompt").is_string() && j.at("completion").is_string(), where,
               ": 'prompt' and 'completion' must be strings");
    return t.render_completion(j.at("prompt").as_string(), j.at("completion").as_string());
  }
  for (const auto& [k, v] : j.as_object())
    LOOM_CHECK(k == "messages" || k == "tools", where, ": field '", k,
               "' is not read (a chat line has 'messages' and optionally 'tools')");
  const Json& ms = j.at("messages");
  LOOM_CHECK(ms.is_array() && ms.size() > 0, where, ": 'messages' must be a non-empty array");
  bool any_assistant = false;
  for (size_t i = 0; i < ms.size(); ++i) {
    const Json& m = ms.as_array()[i];
    LOOM_CHECK(m.is_object() && m.contains("role") && m.at("role").is_string(), where,
               ": messages[", i, "] must be an object with a string 'role'");
    any_assistant |= m.at("role").as_string() == "assistant";
  }
  LOOM_CHECK(any_assistant, where, ": no assistant message, so nothing to learn");
  const Json tools = j.contains("tools") ? j.at("tools") : Json();
  LOOM_CHECK(tools.is_null() || tools.is_array(), where, ": 'tools' must be an array");
  try {
    return t.render_json(ms, tools, where);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind(where, 0) == 0) throw;
    fail(where, ": ", what);
  }
}

}  // namespace loom::data
