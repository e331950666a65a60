// loom serve's request bodies (serve/openai_api.h, serve/embeddings_api.h): any bytes are either
// a request whose every field was validated, or an ApiError with a 4xx status, for completions,
// chat and embeddings alike.
#include <cstdint>
#include <string>

#include "serve/embeddings_api.h"
#include "serve/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {false, true}) {
    try {
      const loom::serve::ApiRequest r = loom::serve::parse_request(body, chat, 256);
      // What the engine will be handed is in range.
      if (r.sampling.n < 1 || r.sampling.n > 16 || r.sampling.max_tokens < 0 ||
          r.sampling.temperature < 0 || r.sampling.temperature > 2 || r.sampling.top_p <= 0 ||
          r.sampling.top_p > 1 || r.sampling.logprobs > 20 || r.sampling.stop.size() > 16)
        __builtin_trap();
      if (chat ? r.messages.empty() : r.prompts.empty() && r.prompt_ids.empty()) __builtin_trap();
    } catch (const loom::serve::ApiError& e) {
      if (e.status < 400 || e.status >= 500 || e.message.empty()) __builtin_trap();
    }
  }
  try {
    const loom::serve::EmbeddingsRequest r = loom::serve::parse_embeddings_request(body);
    const size_t inputs = r.texts.size() + r.ids.size();
    if (inputs == 0 || inputs > 2048 || (!r.texts.empty() && !r.ids.empty()) || r.dimensions < 0)
      __builtin_trap();
    for (const auto& t : r.texts)
      if (t.empty()) __builtin_trap();
    for (const auto& ids : r.ids)
      if (ids.empty()) __builtin_trap();
  } catch (const loom::serve::ApiError& e) {
    if (e.status != 400 || e.message.empty()) __builtin_trap();
  }
  return 0;
}
