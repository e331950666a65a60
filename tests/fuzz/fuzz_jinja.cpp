// data/jinja: a chat template (input: its source) parsed and, when it parses, rendered with a
// small conversation, tools and the Hugging Face globals (raise_exception included), as
// loom's hf:PATH chat templates are.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::data::jinja::Value;
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    loom::data::jinja::Template t(source, "fuzz");
    loom::data::jinja::Dict g;
    g.set("messages",
          Value::from_json(loom::Json::parse(
              R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi é"},
                              {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
                               "function": {"name": "f", "arguments": {"a": [1, 2.5, true]}}}]},
                              {"role": "tool", "content": "{\"r\": 1}"}])")));
    g.set("tools", Value::from_json(loom::Json::parse(
                       R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])")));
    g.set("add_generation_prompt", Value(true));
    g.set("bos_token", Value("<s>"));
    g.set("raise_exception",
          Value::function("raise_exception",
                          [](loom::data::jinja::Args&) -> Value { loom::fail("raised"); }));
    (void)t.render(g);
  } catch (const loom::Error&) {
  }
  return 0;
}
