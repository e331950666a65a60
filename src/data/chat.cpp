#include "data/chat.h"

#include "core/error.h"
#include "core/fs.h"
#include "core/jsonl.h"
#include "data/hf_chat_template.h"
#include "data/unicode.h"

namespace loom::data {

std::vector<std::string> ChatTemplate::special_tokens(const std::string& name) {
  if (is_jinja_name(name)) {
    const HfChatTemplate hf(name.substr(3));
    if (hf.bos_token().empty()) return {hf.eos_token()};
    return {hf.bos_token(), hf.eos_token()};
  }
  if (name == "chatml") return {"<|im_start|>", "<|im_end|>"};
  if (name == "llama3")
    return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  fail("unknown chat template '", name, "' (chatml, llama3 or hf:PATH)");
}

std::string ChatTemplate::end_of_turn_token(const std::string& name) {
  if (is_jinja_name(name)) return special_tokens(name).back();
  special_tokens(name);  // refuses unknown names
  return name == "chatml" ? "<|im_end|>" : "<|eot_id|>";
}

std::string ChatTemplate::begin_of_text_token(const std::string& name) {
  if (is_jinja_name(name)) return HfChatTemplate(name.substr(3)).bos_token();
  special_tokens(name);
  return name == "chatml" ? "" : "<|begin_of_text|>";
}

// Kept beside message() and prompt_ids(): the three must produce the same text.
std::string ChatTemplate::jinja(const std::string& name) {
  if (is_jinja_name(name)) return HfChatTemplate(name.substr(3)).source();
  if (name == "chatml")
    return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
           "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt "
           "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  if (name == "llama3")
    return "{{ '<|begin_of_text|>' }}{% for message in messages %}{{ '<|start_header_id|>' + "
           "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
           "{% endfor %}{% if add_generation_prompt %}{{ "
           "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  special_tokens(name);  // throws naming the unknown template
  return "";
}

ChatTemplate::ChatTemplate(const std::string& name, const BpeTokenizer& tok)
    : name_(name), tok_(tok) {
  if (is_jinja_name(name)) {
    init_jinja();
    return;
  }
  for (const std::string& s : special_tokens(name))
    LOOM_CHECK(tok.special_id(s) >= 0, "chat template ", name, " needs the special token ", s,
               ", which the tokenizer does not have (add it as a special token)");
  end_of_turn_ = tok.special_id(name == "chatml" ? "<|im_end|>" : "<|eot_id|>");
}

// Appends text: a marker is one special id; other text is encoded as ordinary text, so a user
// who writes "<|im_end|>" in a message cannot end the turn.
void ChatTemplate::append(ChatExample& ex, const std::string& text, bool trained,
                          bool special) const {
  const size_t before = ex.ids.size();
  if (special)
    ex.ids.push_back(tok_.special_id(text));
  else
    tok_.encode(text, ex.ids, /*allow_special=*/false);
  ex.mask.resize(ex.ids.size(), 0);
  for (size_t i = before; i < ex.ids.size(); ++i) ex.mask[i] = trained ? 1 : 0;
}

void ChatTemplate::message(ChatExample& ex, const ChatMessage& m) const {
  const bool trained = m.role == "assistant";
  if (name_ == "chatml") {
    append(ex, "<|im_start|>", false, true);
    append(ex, m.role + "\n", false, false);
    append(ex, m.content, trained, false);
    append(ex, "<|im_end|>", trained, true);
    append(ex, "\n", false, false);
  } else {
    append(ex, "<|start_header_id|>", false, true);
    append(ex, m.role, false, false);
    append(ex, "<|end_header_id|>", false, true);
    append(ex, "\n\n", false, false);
    append(ex, m.content, trained, false);
    append(ex, "<|eot_id|>", trained, true);
  }
}

ChatExample ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  if (hf_) return render_json(chat_messages_json(messages), Json(), name_);
  ChatExample ex;
  if (name_ == "llama3") append(ex, "<|begin_of_text|>", false, true);
  for (const ChatMessage& m : messages) message(ex, m);
  return ex;
}

ChatExample ChatTemplate::render_completion(const std::string& prompt,
                                            const std::string& completion) const {
  return render({{"user", prompt}, {"assistant", completion}});
}

std::vector<int32_t> ChatTemplate::prompt_ids(const std::vector<ChatMessage>& messages) const {
  if (hf_) return tok_.encode(render_text(chat_messages_json(messages), Json(), true));
  ChatExample ex = render(messages);
  if (name_ == "chatml") {
    append(ex, "<|im_start|>", false, true);
    append(ex, "assistant\n", false, false);
  } else {
    append(ex, "<|start_header_id|>", false, true);
    append(ex, "assistant", false, false);
    append(ex, "<|end_header_id|>", false, true);
    append(ex, "\n\n", false, false);
  }
  return ex.ids;
}

namespace {

// Text the template renders must be UTF-8, as plain tokenization requires (tokenize_job.cpp).
void check_utf8(const std::string& text, const std::string& where, const char* field) {
  size_t bad = 0;
  LOOM_CHECK(utf8_valid(text, &bad), where, ": '", field, "' is not valid UTF-8 (byte ", bad,
             " of the text)");
}

}  // namespace

void check_chat_message(const std::string& role, const std::string& content,
                        const std::string& where) {
  LOOM_CHECK(role == "system" || role == "user" || role == "assistant", where, ": role '", role,
             "' is not system, user or assistant");
  check_utf8(content, where, "content");
}

std::vector<ChatMessage> chat_messages_of(const Json& v, const std::string& role,
                                          const std::string& where, const std::string& field) {
  if (v.is_string()) {
    check_chat_message(role, v.as_string(), cat(where, ": '", field, "'"));
    return {{role, v.as_string()}};
  }
  LOOM_CHECK(v.is_array() && v.size() > 0, where, ": '", field,
             "' must be a string or a non-empty list of messages");
  std::vector<ChatMessage> out;
  for (const Json& m : v.as_array()) {
    LOOM_CHECK(m.is_object() && m.contains("role") && m.contains("content") &&
                   m.at("role").is_string() && m.at("content").is_string(),
               where, ": '", field, "' messages need string 'role' and 'content'");
    const std::string at = cat(where, ": '", field, "'[", out.size(), "]");
    check_chat_message(m.at("role").as_string(), m.at("content").as_string(), at);
    out.push_back({m.at("role").as_string(), m.at("content").as_string()});
  }
  return out;
}

ChatExample parse_chat_example(const Json& j, const ChatTemplate& t, const std::string& where) {
  LOOM_CHECK(j.is_object(), where, ": expected a JSON object");
  if (t.is_jinja()) return parse_jinja_example(j, t, where);
  if (j.contains("messages")) {
    const Json& ms = j.at("messages");
    LOOM_CHECK(ms.is_array() && ms.size() > 0, where, ": 'messages' must be a non-empty array");
    std::vector<ChatMessage> messages;
    bool any_assistant = false;
    for (size_t i = 0; i < ms.size(); ++i) {
      const Json& m = ms.as_array()[i];
      const std::string at = cat(where, ": messages[", i, "]");
      LOOM_CHECK(m.is_object() && m.contains("role") && m.contains("content"), at,
                 " must be an object with 'role' and 'content'");
      LOOM_CHECK(m.at("role").is_string() && m.at("content").is_string(), at,
                 ": 'role' and 'content' must be strings");
      const std::string& role = m.at("role").as_string();
      check_chat_message(role, m.at("content").as_string(), at);
      any_assistant |= role == "assistant";
      messages.push_back({role, m.at("content").as_string()});
    }
    LOOM_CHECK(any_assistant, where, ": no assistant message, so nothing to learn");
    return t.render(messages);
  }
  LOOM_CHECK(j.contains("prompt") && j.contains("completion"), where,
             ": expected 'messages', or 'prompt' and 'completion'");
  LOOM_CHECK(j.at("prompt").is_string() && j.at("completion").is_string(), where,
             ": 'prompt' and 'completion' must be strings");
  check_utf8(j.at("prompt").as_string(), where, "prompt");
  check_utf8(j.at("completion").as_string(), where, "completion");
  return t.render_completion(j.at("prompt").as_string(), j.at("completion").as_string());
}

std::vector<ChatExample> load_chat_jsonl(const std::string& path, const ChatTemplate& t) {
  std::vector<ChatExample> out;
  for_each_jsonl(path, [&](const Json& j, const std::string& where) {
    out.push_back(parse_chat_example(j, t, where));
  });
  LOOM_CHECK(!out.empty(), path, ": no examples");
  return out;
}

}  // namespace loom::data
