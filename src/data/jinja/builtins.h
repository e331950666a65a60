// Jinja's filters, tests, global functions and the Python methods chat templates call on
// strings and dicts (str.startswith, dict.items, ...), with the semantics of Jinja 3 and
// CPython. tojson is Hugging Face's: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False). Errors throw loom::Error without a location; the evaluator
// adds the template line.
#pragma once

#include <string>

#include "data/jinja/value.h"

namespace loom::data::jinja {

// Throws "'name' is undefined" for an undefined value (using one beyond printing or testing).
void need_defined(const Value& v);

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& v, Args& args);
bool apply_test(const std::string& name, const Value& v, Args& args);

// obj.name as Jinja resolves it: a method of a str or dict (bound to obj), else the dict key
// or namespace attribute; undefined when absent. Throws when obj itself is undefined.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: dict key, list or str index (negative from the end); undefined when absent.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or str, any part undefined/None meaning omitted.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The items a for loop visits: a list's elements, a dict's keys, a str's characters; an
// undefined value has none. Throws for a value that is not iterable.
List iterate(const Value& v);

// Jinja's globals: range, namespace, dict.
Value global_function(const std::string& name);

// Reads a call's arguments against a signature: at(i, "name") takes position i or keyword
// "name"; done() refuses unused keywords and extra positions, naming `what`.
class ArgReader {
 public:
  ArgReader(Args& a, std::string what) : a_(a), what_(std::move(what)) {}
  Value at(size_t pos, const char* name, Value def = Value());
  void done();

 private:
  Args& a_;
  std::string what_;
  size_t max_pos_ = 0;
  std::vector<std::string> used_;
};

}  // namespace loom::data::jinja
