#include "serve/embeddings_api.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom::serve {
namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError{400, message, "invalid_request_error", param};
}

bool is_id_list(const Json& a) {
  if (!a.is_array() || a.size() == 0) return false;
  for (const Json& t : a.as_array())
    if (t.type() != Json::Type::Int) return false;
  return true;
}

std::vector<int32_t> ids_of(const Json& a, size_t index) {
  std::vector<int32_t> ids;
  for (const Json& t : a.as_array()) {
    if (t.as_int() < 0 || t.as_int() > INT32_MAX)
      bad("input",
          cat("'input' ", index, ": token ids must be non-negative integers, got ", t.dump()));
    ids.push_back(static_cast<int32_t>(t.as_int()));
  }
  return ids;
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(const std::string& body) {
  Json j;
  try {
    j = Json::parse(body, "request body");
  } catch (const Error& e) {
    bad("", e.what());
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  EmbeddingsRequest r;
  for (const auto& [k, v] : j.as_object()) {
    if (v.is_null()) continue;
    if (k == "model") {
      if (!v.is_string()) bad("model", "'model' must be a string");
      r.model = v.as_string();
    } else if (k == "encoding_format") {
      if (!v.is_string() || (v.as_string() != "float" && v.as_string() != "base64"))
        bad("encoding_format",
            cat("'encoding_format' must be \"float\" or \"base64\", got ", v.dump()));
      r.base64 = v.as_string() == "base64";
    } else if (k == "dimensions") {
      if (v.type() != Json::Type::Int || v.as_int() < 1 || v.as_int() > (1 << 20))
        bad("dimensions", cat("'dimensions' must be a positive integer, got ", v.dump()));
      r.dimensions = static_cast<int>(v.as_int());
    } else if (k == "user") {
      if (!v.is_string()) bad("user", "'user' must be a string");
    } else if (k != "input") {
      bad(k, cat("'", k, "' is not supported by this server"));
    }
  }
  if (!j.contains("input") || j.at("input").is_null()) bad("input", "'input' is required");
  const Json& in = j.at("input");
  if (in.is_string()) {
    r.texts.push_back(in.as_string());
  } else if (is_id_list(in)) {
    r.ids.push_back(ids_of(in, 0));
  } else if (in.is_array() && in.size() > 0) {
    const Json::Array& a = in.as_array();
    const bool strings = a[0].is_string();
    for (size_t i = 0; i < a.size(); ++i) {
      if (strings && a[i].is_string())
        r.texts.push_back(a[i].as_string());
      else if (!strings && is_id_list(a[i]))
        r.ids.push_back(ids_of(a[i], i));
      else if (a[i].is_array() && a[i].size() == 0)
        bad("input", cat("'input' ", i, " is an empty list of token ids"));
      else
        bad("input",
            "'input' must be a string, an array of strings, an array of token ids or "
            "an array of arrays of token ids (not a mix)");
    }
  } else {
    bad("input", in.is_array() ? "'input' is an empty array"
                               : "'input' must be a string, an array of strings, an array of "
                                 "token ids or an array of arrays of token ids");
  }
  for (size_t i = 0; i < r.texts.size(); ++i)
    if (r.texts[i].empty()) bad("input", cat("'input' ", i, " is an empty string"));
  if (r.texts.size() + r.ids.size() > 2048) bad("input", "at most 2048 inputs per request");
  return r;
}

std::string float32_base64(const std::vector<float>& v) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = static_cast<char>((u >> (8 * b)) & 0xff);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = 0;
    for (size_t k = 0; k < 3; ++k)
      w = (w << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k)
      out.push_back(k <= n ? kAlphabet[(w >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

Json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vectors,
                         bool base64, int prompt_tokens) {
  Json data = Json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    Json e = Json::object();
    e["object"] = "embedding";
    e["index"] = int64_t(i);
    if (base64) {
      e["embedding"] = float32_base64(vectors[i]);
    } else {
      Json v = Json::array();
      for (float x : vectors[i]) v.push_back(Json(x));
      e["embedding"] = v;
    }
    data.push_back(e);
  }
  Json usage = Json::object();
  usage["prompt_tokens"] = int64_t(prompt_tokens);
  usage["total_tokens"] = int64_t(prompt_tokens);
  Json j = Json::object();
  j["object"] = "list";
  j["data"] = data;
  j["model"] = model;
  j["usage"] = usage;
  return j;
}

}  // namespace loom::serve
