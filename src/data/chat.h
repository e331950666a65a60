// Chat data for supervised fine-tuning: conversations ({"messages": [{"role", "content"}]}) or
// prompt/completion pairs, rendered by a chat template into token ids with a loss mask that
// covers only what the model must learn to write (assistant turns with their end-of-turn
// token, or the completion), as TRL's assistant-only / completion-only loss does.
//
// Templates (the text Hugging Face's own templates produce):
//   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... ; generation prompt
//            "<|im_start|>assistant\n"
//   llama3   <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n{content}
//            <|eot_id|> per message; generation prompt the assistant header
//   hf:PATH  a model's own Jinja chat template (data/hf_chat_template.h): PATH is a model
//            directory, its tokenizer_config.json, or a .jinja file
// The template's markers must be special tokens of the tokenizer (one id each); a tokenizer
// without them is refused with the missing token named. For hf:PATH these are the config's
// bos_token and eos_token (the end of turn); the rendered text is encoded with special tokens
// recognised, as Hugging Face's apply_chat_template does, and the trained spans are the
// template's {% generation %} blocks or, without them, each assistant message's text as
// rendering the conversation up to it shows (chat_jinja.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json.h"
#include "data/bpe.h"

namespace loom::data {

class HfChatTemplate;

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// One training example: ids and, per id, whether its prediction is trained (the loss mask of
// the token itself: position i's target is ids[i + 1], trained when mask[i + 1]).
struct ChatExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};

class ChatTemplate {
 public:
  // "chatml", "llama3" or "hf:PATH"; throws on another name, on a template that does not
  // parse, or when `tok` lacks a marker token.
  ChatTemplate(const std::string& name, const BpeTokenizer& tok);
  static bool is_jinja_name(const std::string& name) { return name.rfind("hf:", 0) == 0; }
  bool is_jinja() const { return hf_ != nullptr; }
  const std::string& name() const { return name_; }
  // The marker tokens this template needs (for adding them to a tokenizer).
  static std::vector<std::string> special_tokens(const std::string& name);
  // The template's end-of-turn marker (<|im_end|>, <|eot_id|>) and its begin-of-text marker
  // ("" for chatml, which has none).
  static std::string end_of_turn_token(const std::string& name);
  static std::string begin_of_text_token(const std::string& name);
  // The template as Hugging Face Jinja (tokenizer_config.json's chat_template): it renders the
  // exact text that render() and, with add_generation_prompt, prompt_ids() encode.
  static std::string jinja(const std::string& name);

  // A conversation, assistant turns trained (content and end-of-turn token).
  ChatExample render(const std::vector<ChatMessage>& messages) const;
  // Prompt as a user turn, completion as the assistant's reply (only the reply trained).
  ChatExample render_completion(const std::string& prompt, const std::string& completion) const;
  // Ids of a conversation followed by the assistant's generation prompt (for serving).
  std::vector<int32_t> prompt_ids(const std::vector<ChatMessage>& messages) const;
  int32_t end_of_turn() const { return end_of_turn_; }

  // hf:PATH only. A chat JSONL line's messages (objects passed to the template as they are:
  // tool calls, tool messages, null content) with the line's optional "tools"; `where` names
  // the line in errors.
  ChatExample render_json(const Json& messages, const Json& tools, const std::string& where) const;
  // hf:PATH only: the template's text for messages and tools (null or an array).
  std::string render_text(const Json& messages, const Json& tools,
                          bool add_generation_prompt) const;

 private:
  void append(ChatExample& ex, const std::string& text, bool trained, bool special) const;
  void message(ChatExample& ex, const ChatMessage& m) const;
  void init_jinja();
  void append_text(ChatExample& ex, const std::string& text, bool trained) const;
  std::string name_;
  const BpeTokenizer& tok_;
  int32_t end_of_turn_ = -1;
  std::shared_ptr<const HfChatTemplate> hf_;
};

// Throws naming `where` unless `role` is system, user or assistant and `content` is UTF-8: what
// every chat reader (chat data, preference pairs, `loom tokenize --chat`) requires of a message.
void check_chat_message(const std::string& role, const std::string& content,
                        const std::string& where);
// A JSONL line's field `field` as messages: a string is one message of `role`, otherwise a
// non-empty list of {"role", "content"} objects, each checked by check_chat_message.
std::vector<ChatMessage> chat_messages_of(const Json& v, const std::string& role,
                                          const std::string& where, const std::string& field);

// One JSONL line: {"messages": [...]} or {"prompt": "...", "completion": "..."}; `where`
// names the file and line in errors.
ChatExample parse_chat_example(const Json& j, const ChatTemplate& t, const std::string& where);

// parse_chat_example for an hf:PATH template: "messages" (any roles and fields the template
// reads) with optional "tools", or "prompt"/"completion".
ChatExample parse_jinja_example(const Json& j, const ChatTemplate& t, const std::string& where);

// Messages as the JSON objects a Jinja template reads: [{"role", "content"}, ...].
Json chat_messages_json(const std::vector<ChatMessage>& messages);

// Every example of a chat JSONL file; malformed lines are errors naming file and line.
std::vector<ChatExample> load_chat_jsonl(const std::string& path, const ChatTemplate& t);

}  // namespace loom::data
