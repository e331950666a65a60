// POST /v1/embeddings in OpenAI's shape, as plain data: the request parsed and validated (every
// error a 400 naming its field) and the response built, so that unmodified clients (the
// official openai packages, which ask for base64 unless told otherwise) read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "serve/openai_api.h"

namespace loom::serve {

struct EmbeddingsRequest {
  std::string model;
  // `input`: strings (encoded by the server) or token-id lists, never both.
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  bool base64 = false;  // encoding_format "base64": little-endian float32 bytes, base64
  int dimensions = 0;   // 0: not given
};

// Throws ApiError (400) naming the field: a body that is not an object, `input` missing,
// empty, an empty string or token list, of mixed or wrong types, more than 2048 inputs;
// `encoding_format` other than float or base64; `dimensions` not a positive integer; `user`
// not a string; any other field (Loom refuses what it does not honour).
EmbeddingsRequest parse_embeddings_request(const std::string& body);

// The little-endian bytes of v as float32, base64-encoded (OpenAI's encoding_format base64).
std::string float32_base64(const std::vector<float>& v);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
//  "usage": {"prompt_tokens", "total_tokens"}}.
Json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vectors,
                         bool base64, int prompt_tokens);

}  // namespace loom::serve
