#include "data/jinja/template.h"

#include <climits>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja/builtins.h"
#include "data/jinja/parser.h"
#include "data/unicode.h"

namespace loom::data::jinja {
namespace {

// Bounds that no chat format comes near, so a hostile template fails fast instead of running
// or growing without end.
constexpr int64_t kMaxSteps = 1'000'000;  // loop iterations and macro calls
constexpr size_t kMaxOutput = size_t(64) << 20;
constexpr int kMaxCallDepth = 64;

// An error that already names the template and line.
struct Located : Error {
  using Error::Error;
};

bool int_like(const Value& v) {
  return v.is_int() || v.is_bool();
}

// Python's ints are unbounded; here they are int64 and overflow is an error.
Value checked_int(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == "+"   ? __builtin_add_overflow(a, b, &r)
                        : op == "-" ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) fail("integer overflow in '", op, "'");
  return Value(r);
}

[[noreturn]] void bad_operands(const std::string& op, const Value& x, const Value& y) {
  fail("unsupported operand types for ", op, ": '", x.type_name(), "' and '", y.type_name(), "'");
}

Value repeat(const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value("") : Value(List{});
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
  if (unit != 0 && size_t(n) > kMaxOutput / unit) fail("'*' result too large");
  if (seq.is_string()) {
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += seq.as_string();
    return Value(s);
  }
  List l;
  for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
  return Value(std::move(l));
}

Value arith(const std::string& op, const Value& x, const Value& y) {
  if (op == "~") {
    std::string s = x.str() + y.str();
    if (s.size() > kMaxOutput) fail("'~' result too large");
    return Value(std::move(s));
  }
  need_defined(x);
  need_defined(y);
  if (op == "+") {
    if (x.is_string() && y.is_string()) {
      if (x.as_string().size() + y.as_string().size() > kMaxOutput) fail("'+' result too large");
      return Value(x.as_string() + y.as_string());
    }
    if (x.is_list() && y.is_list()) {
      List l = x.as_list();
      l.insert(l.end(), y.as_list().begin(), y.as_list().end());
      return Value(std::move(l));
    }
  }
  if (op == "*") {
    if ((x.is_string() || x.is_list()) && int_like(y)) return repeat(x, y.as_int());
    if (int_like(x) && (y.is_string() || y.is_list())) return repeat(y, x.as_int());
  }
  if (op == "%" && x.is_string()) fail("string formatting with '%' is not supported");
  if (!x.is_number() || !y.is_number()) bad_operands(op, x, y);
  if (int_like(x) && int_like(y) && op != "/") {
    const int64_t a = x.as_int(), b = y.as_int();
    if (op == "+" || op == "-" || op == "*") return checked_int(op, a, b);
    if (op == "//" || op == "%") {
      if (b == 0) fail("integer division or modulo by zero");
      if (a == INT64_MIN && b == -1) fail("integer overflow");
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
        --q;
        m += b;
      }
      return Value(op == "//" ? q : m);
    }
    if (op == "**") {
      if (b < 0) return Value(std::pow(double(a), double(b)));
      if (a == 0 || a == 1) return Value(b == 0 ? int64_t(1) : a);
      if (a == -1) return Value(b % 2 ? int64_t(-1) : int64_t(1));
      Value p(int64_t(1));
      for (int64_t i = 0; i < b; ++i) p = checked_int("*", p.as_int(), a);  // |a| >= 2: < 64 steps
      return p;
    }
  }
  const double a = x.as_double(), b = y.as_double();
  if (op == "+") return Value(a + b);
  if (op == "-") return Value(a - b);
  if (op == "*") return Value(a * b);
  if (op == "/") {
    if (b == 0) fail("division by zero");
    return Value(a / b);
  }
  if (op == "//" || op == "%") {
    if (b == 0) fail("float division or modulo by zero");
    const double m = std::fmod(a, b);
    const double mm = m != 0 && ((m < 0) != (b < 0)) ? m + b : m;
    return Value(op == "//" ? std::floor(a / b) : mm);
  }
  return Value(std::pow(a, b));
}

int order(const Value& x, const Value& y, const std::string& op) {
  if (x.is_number() && y.is_number()) {
    const double a = x.as_double(), b = y.as_double();
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (x.is_string() && y.is_string()) return x.as_string().compare(y.as_string());
  fail("'", op, "' is not supported between '", x.type_name(), "' and '", y.type_name(), "'");
}

bool contains(const Value& seq, const Value& item) {
  if (seq.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires a string, not '", item.type_name(), "'");
    return seq.as_string().find(item.as_string()) != std::string::npos;
  }
  if (seq.is_mapping()) return item.is_string() && seq.as_dict().find(item.as_string());
  for (const Value& x : iterate(seq))
    if (equal(x, item)) return true;
  return false;
}

class Evaluator {
 public:
  Evaluator(const std::string& where, const Dict& globals, Rendered& out)
      : where_(where), out_(out) {
    frames_.push_back({});
    for (const auto& [k, v] : globals.items) frames_[0].vars[k] = v;
  }

  void run(const Body& body) { exec(body, out_.text); }

 private:
  enum class Flow { Normal, Break, Continue };
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    bool barrier = false;  // a macro's frame: names beyond it resolve in the globals
  };

  Value lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > 0;) {
      auto it = frames_[i].vars.find(name);
      if (it != frames_[i].vars.end()) return it->second;
      if (frames_[i].barrier) {
        auto g = frames_[0].vars.find(name);
        if (g != frames_[0].vars.end()) return g->second;
        break;
      }
    }
    Value g = global_function(name);
    return g.is_undefined() ? Value::undefined(name) : g;
  }

  void step() {
    if (++steps_ > kMaxSteps)
      fail("the template runs too long (over ", kMaxSteps, " loop iterations)");
  }

  void bind(const std::vector<std::string>& names, const Value& v) {
    Frame& f = frames_.back();
    if (names.size() == 1) {
      f.vars[names[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != names.size())
      fail("cannot unpack ", items.size(), " values into ", names.size(), " names");
    for (size_t i = 0; i < names.size(); ++i) f.vars[names[i]] = items[i];
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& s : body) {
      Flow f;
      try {
        f = exec_one(*s, out);
      } catch (const Located&) {
        throw;
      } catch (const Error& e) {
        throw Located(cat(where_, ":", s->line, ": ", e.what()));
      }
      if (out.size() > kMaxOutput) throw Located(cat(where_, ":", s->line, ": output too large"));
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_one(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Output:
        out += eval(*s.expr).str();
        return Flow::Normal;
      case Stmt::If:
        for (const auto& [cond, body] : s.branches)
          if (!cond || eval(*cond).truthy()) return exec(body, out);
        return Flow::Normal;
      case Stmt::For:
        return exec_for(s, out);
      case Stmt::Set: {
        const Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value ns = lookup(s.targets[0]);
          if (!ns.is_namespace())
            fail("cannot set attribute '", s.attr, "' of '", s.targets[0],
                 "', which is not a namespace()");
          ns.as_dict().set(s.attr, v);
        } else {
          bind(s.targets, v);
        }
        return Flow::Normal;
      }
      case Stmt::SetBlock: {
        std::string text;
        exec(s.body, text);
        frames_.back().vars[s.targets[0]] = Value(text);
        return Flow::Normal;
      }
      case Stmt::Macro:
        frames_.back().vars[s.text] =
            Value::function(s.text, [this, &s](Args& a) { return call_macro(s, a); });
        return Flow::Normal;
      case Stmt::Break:
        return Flow::Break;
      case Stmt::Continue:
        return Flow::Continue;
      case Stmt::Generation: {
        const size_t start = out.size();
        const Flow f = exec(s.body, out);
        if (&out == &out_.text) out_.generation.emplace_back(start, out.size());
        return f;
      }
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    List items = iterate(eval(*s.expr));
    if (s.filter) {
      List kept;
      for (const Value& item : items) {
        step();
        frames_.push_back({});
        bind(s.targets, item);
        const bool keep = eval(*s.filter).truthy();
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = int64_t(items.size());
    auto index = std::make_shared<int64_t>(0);  // one loop.cycle for all iterations
    const Value cycle = Value::function("loop.cycle", [index](Args& a) {
      if (a.pos.empty()) fail("loop.cycle needs at least one value");
      return a.pos[size_t(*index) % a.pos.size()];
    });
    if (n == 0) {
      frames_.push_back({});
      const Flow f = exec(s.else_body, out);
      frames_.pop_back();
      return f == Flow::Normal ? f : Flow::Normal;
    }
    for (int64_t i = 0; i < n; ++i) {
      step();
      frames_.push_back({});
      bind(s.targets, items[size_t(i)]);
      Dict loop;
      loop.items = {{"index0", Value(i)},       {"index", Value(i + 1)},
                    {"revindex", Value(n - i)}, {"revindex0", Value(n - i - 1)},
                    {"first", Value(i == 0)},   {"last", Value(i == n - 1)},
                    {"length", Value(n)},       {"depth", Value(1)},
                    {"depth0", Value(0)}};
      if (i > 0) loop.items.emplace_back("previtem", items[size_t(i - 1)]);
      if (i + 1 < n) loop.items.emplace_back("nextitem", items[size_t(i + 1)]);
      *index = i;
      loop.items.emplace_back("cycle", cycle);
      frames_.back().vars["loop"] = Value(std::move(loop));
      const Flow f = exec(s.body, out);
      frames_.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value call_macro(const Stmt& m, Args& a) {
    step();
    if (call_depth_ >= kMaxCallDepth) fail("macro '", m.text, "' recurses too deeply");
    if (a.pos.size() > m.params.size())
      fail("macro '", m.text, "' takes ", m.params.size(), " arguments, got ", a.pos.size());
    Frame f;
    f.barrier = true;
    for (size_t i = 0; i < a.pos.size(); ++i) f.vars[m.params[i].first] = a.pos[i];
    for (auto& [k, v] : a.kw) {
      bool known = false;
      for (const auto& p : m.params) known |= p.first == k;
      if (!known) fail("macro '", m.text, "' has no parameter '", k, "'");
      f.vars[k] = v;
    }
    frames_.push_back(std::move(f));
    for (const auto& [name, def] : m.params)
      if (!frames_.back().vars.count(name))
        frames_.back().vars[name] = def ? eval(*def) : Value::undefined(name);
    ++call_depth_;
    std::string text;
    exec(m.body, text);
    --call_depth_;
    frames_.pop_back();
    return Value(text);
  }

  Args eval_args(const Expr& e) {
    Args a;
    for (const auto& x : e.args) a.pos.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Literal:
        return e.value;
      case Expr::Name:
        return lookup(e.name);
      case Expr::Attr:
        return get_attr(eval(*e.a), e.name);
      case Expr::Item:
        return get_item(eval(*e.a), eval(*e.b));
      case Expr::Slice: {
        Value parts[3];
        for (size_t i = 0; i < 3; ++i)
          if (e.args[i]) parts[i] = eval(*e.args[i]);
        return get_slice(eval(*e.a), parts[0], parts[1], parts[2]);
      }
      case Expr::Call: {
        const Value f = eval(*e.a);
        need_defined(f);
        if (!f.is_callable()) fail("'", f.type_name(), "' object is not callable");
        Args a = eval_args(e);
        return f.call(a);
      }
      case Expr::Filter: {
        const Value v = eval(*e.a);
        Args a = eval_args(e);
        return apply_filter(e.name, v, a);
      }
      case Expr::Test: {
        const Value v = eval(*e.a);
        Args a = eval_args(e);
        return Value(apply_test(e.name, v, a) != e.negated);
      }
      case Expr::Unary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value(!v.truthy());
        need_defined(v);
        if (!v.is_number()) fail("bad operand type for unary ", e.name, ": '", v.type_name(), "'");
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        if (v.is_float()) return Value(-v.as_double());
        if (v.as_int() == INT64_MIN) fail("integer overflow");
        return Value(-v.as_int());
      }
      case Expr::Binary:
        return arith(e.name, eval(*e.a), eval(*e.b));
      case Expr::And: {
        Value l = eval(*e.a);
        return l.truthy() ? eval(*e.b) : l;
      }
      case Expr::Or: {
        Value l = eval(*e.a);
        return l.truthy() ? l : eval(*e.b);
      }
      case Expr::Compare: {
        Value l = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.args[i + 1]);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = equal(l, r);
          else if (op == "!=")
            ok = !equal(l, r);
          else if (op == "in")
            ok = contains(r, l);
          else if (op == "not in")
            ok = !contains(r, l);
          else {
            const int c = order(l, r, op);
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("");
      case Expr::ListLit: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x));
        return e.tuple ? Value::tuple(std::move(l)) : Value(std::move(l));
      }
      case Expr::DictLit: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string()) fail("dict keys must be strings here, got ", k.type_name());
          d.set(k.as_string(), eval(*e.args[i + 1]));
        }
        return Value(std::move(d));
      }
    }
    return Value();
  }

  const std::string& where_;
  Rendered& out_;
  std::vector<Frame> frames_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

// Refuses, at load time, filters and tests the subset does not have.
void check_names(const Expr* e, const std::string& where) {
  if (!e) return;
  if (e->kind == Expr::Filter && !has_filter(e->name))
    fail(where, ":", e->line, ": the filter '", e->name, "' is not supported");
  if (e->kind == Expr::Test && !has_test(e->name))
    fail(where, ":", e->line, ": the test '", e->name, "' is not supported");
  check_names(e->a.get(), where);
  check_names(e->b.get(), where);
  check_names(e->c.get(), where);
  for (const auto& x : e->args) check_names(x.get(), where);
  for (const auto& [k, x] : e->kwargs) check_names(x.get(), where);
}

void check_names(const Body& body, const std::string& where, bool* generation) {
  for (const auto& s : body) {
    check_names(s->expr.get(), where);
    check_names(s->filter.get(), where);
    for (const auto& [cond, b] : s->branches) {
      check_names(cond.get(), where);
      check_names(b, where, generation);
    }
    for (const auto& [name, def] : s->params) check_names(def.get(), where);
    check_names(s->body, where, generation);
    check_names(s->else_body, where, generation);
    *generation |= s->kind == Stmt::Generation;
  }
}

}  // namespace

Template::Template(const std::string& source, const std::string& where, const LexOptions& opt)
    : where_(where) {
  size_t bad = 0;
  LOOM_CHECK(utf8_valid(source, &bad), where, ": not valid UTF-8 (byte ", bad, ")");
  body_ = parse(lex(source, opt, where), where);
  check_names(body_, where, &has_generation_);
}

Rendered Template::render(const Dict& globals) const {
  Rendered out;
  Evaluator(where_, globals, out).run(body_);
  return out;
}

}  // namespace loom::data::jinja
