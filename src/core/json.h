// A small JSON value with a strict parser (errors name line and column) and a writer.
// Written here so the trainer core builds with a bare toolchain (the GPU machine has no
// Debian packages); used for configs, metrics, safetensors headers and HF config.json.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class Json {
 public:
  enum class Type { Null, Bool, Int, Float, String, Array, Object };
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json>;  // sorted keys: deterministic output

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::Bool), i_(b) {}
  Json(int v) : type_(Type::Int), i_(v) {}
  Json(int64_t v) : type_(Type::Int), i_(v) {}
  Json(uint64_t v) : type_(Type::Int), i_(static_cast<int64_t>(v)) {}
  Json(double v) : type_(Type::Float), d_(v) {}
  Json(float v) : type_(Type::Float), d_(v) {}
  Json(const char* s) : type_(Type::String), s_(s) {}
  Json(std::string s) : type_(Type::String), s_(std::move(s)) {}
  Json(Array a) : type_(Type::Array), a_(std::make_shared<Array>(std::move(a))) {}
  Json(Object o) : type_(Type::Object), o_(std::make_shared<Object>(std::move(o))) {}
  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_number() const { return type_ == Type::Int || type_ == Type::Float; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  // Typed access; throws loom::Error naming the expected type.
  bool as_bool() const;
  // A Float converts only when finite, whole and inside int64 (else an error naming it).
  int64_t as_int() const;
  int64_t as_int(int64_t lo, int64_t hi) const;  // also checks lo <= value <= hi
  int32_t as_int32() const;
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  bool contains(const std::string& key) const;
  const Json& at(const std::string& key) const;  // throws "missing field 'key'"
  Json& operator[](const std::string& key);      // object: inserts
  void push_back(Json v);
  size_t size() const;

  // Compact one-line output (JSONL); indent > 0 pretty-prints.
  std::string dump(int indent = 0) const;

  // Parses a whole document. `where` names the source in error messages.
  static Json parse(std::string_view text, const std::string& where = "json");

 private:
  void dump_to(std::string& out, int indent, int depth) const;
  Type type_ = Type::Null;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
};

// Appends s to out as a quoted JSON string (escaping control characters and quotes); bytes
// that are not well-formed UTF-8 are written as U+FFFD, so the output is always valid UTF-8.
// With `ensure_ascii`, every character outside 0x20-0x7E is a \uXXXX escape (a surrogate pair
// above U+FFFF), as Python's json.dumps(ensure_ascii=True) writes it (Jinja's tojson filter).
void json_escape(std::string& out, std::string_view s, bool ensure_ascii = false);

}  // namespace loom
