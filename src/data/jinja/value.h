// The values a Jinja template computes with, following Python's semantics as Jinja (and so
// Hugging Face's chat templates) sees them: undefined, None, bool, int, float, str, list, dict
// (insertion-ordered, string keys), namespace() objects and callables. Lists, dicts and
// namespaces are shared by reference, as Python objects are, so `ns.x = ...` inside a loop is
// seen outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace loom::data::jinja {

class Value;
using List = std::vector<Value>;

// Keys in insertion order (Python's dict); lookups are linear, which suits the few keys a
// message or a tool schema holds.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

  Value() = default;  // undefined
  static Value undefined(std::string name) {
    Value v;
    v.s_ = std::move(name);
    return v;
  }
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool), i_(b) {}
  Value(int64_t i) : kind_(Kind::Int), i_(i) {}
  Value(int i) : kind_(Kind::Int), i_(i) {}
  Value(double d) : kind_(Kind::Float), d_(d) {}
  Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
  Value(const char* s) : kind_(Kind::String), s_(s) {}
  Value(List l) : kind_(Kind::List), list_(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : kind_(Kind::Dict), dict_(std::make_shared<Dict>(std::move(d))) {}
  // A Python tuple: a list that prints as (a, b) (tuple literals, dict items).
  static Value tuple(List l) {
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
  }
  static Value make_namespace(Dict d);
  static Value function(std::string name, Function f);
  // JSON null becomes None; objects keep the order Json holds them in (sorted keys).
  static Value from_json(const Json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || is_bool(); }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }
  // Dicts and namespaces: attribute and item lookup by string key.
  bool is_mapping() const { return is_dict() || is_namespace(); }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // Int and Bool
  double as_double() const { return kind_ == Kind::Float ? d_ : double(i_); }
  const std::string& as_string() const { return s_; }
  // The name an undefined value was looked up under (for errors).
  const std::string& undefined_name() const { return s_; }
  const List& as_list() const { return *list_; }
  List& as_list() { return *list_; }
  const Dict& as_dict() const { return *dict_; }  // dict or namespace
  Dict& as_dict() { return *dict_; }
  const std::string& callable_name() const { return s_; }
  Value call(Args& args) const { return (*fn_)(args); }

  bool truthy() const;
  // Python's str(): what {{ value }} prints (undefined prints nothing).
  std::string str() const;
  // Python's repr(): strings quoted, as inside a printed list.
  std::string repr() const;
  // Python's type name, for errors.
  std::string type_name() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python's ==, with 1 == 1.0 == True; undefined equals only undefined.
bool equal(const Value& a, const Value& b);
// Python's repr() of a float ("1.0", "0.1", "1e-05", "inf").
std::string python_float_repr(double d);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Hugging Face's tojson filter
// calls it; indent < 0 means none. Undefined and callables are errors.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonStyle& style);

// Code points of valid UTF-8 (template text and JSON strings are validated before they get
// here) and back.
std::vector<uint32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
bool python_isspace(uint32_t cp);

}  // namespace loom::data::jinja
