#include "data/jinja/parser.h"

#include "core/error.h"

namespace loom::data::jinja {
namespace {

// Deep nesting is refused rather than overflowing the stack on hostile input.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  Parser(const std::vector<Token>& t, const std::string& where) : t_(t), where_(where) {}

  Body parse_all() {
    std::string end;
    return body({}, &end);
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(const char* op) const { return cur().kind == Token::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Token::Name && cur().text == n; }
  [[noreturn]] void error(const std::string& what) const {
    fail(where_, ":", cur().line, ": ", what);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Token::End:
        return "end of template";
      case Token::BlockEnd:
        return "end of tag";
      case Token::VarEnd:
        return "'}}'";
      case Token::String:
        return "a string";
      case Token::Int:
      case Token::Float:
        return "a number";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cat("expected '", op, "', found ", describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().kind != Token::Name) error(cat("expected a name, found ", describe(cur())));
    return next().text;
  }
  void expect_block_end() {
    if (cur().kind != Token::BlockEnd) error(cat("expected end of tag, found ", describe(cur())));
    next();
  }
  struct Depth {
    Depth(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.error("template nests too deeply");
    }
    ~Depth() { --p.depth_; }
    Parser& p;
  };

  // Statements until one of `ends` opens a block tag; *end receives which (empty at the end of
  // the template, allowed only when `ends` is empty).
  Body body(const std::vector<std::string>& ends, std::string* end) {
    Depth d(*this);
    Body out;
    while (true) {
      const Token& tk = cur();
      if (tk.kind == Token::End) {
        if (!ends.empty()) error(cat("missing '{% ", ends.back(), " %}'"));
        end->clear();
        return out;
      }
      if (tk.kind == Token::Text) {
        auto s = stmt(Stmt::Text, tk.line);
        s->text = tk.text;
        out.push_back(std::move(s));
        next();
      } else if (tk.kind == Token::VarBegin) {
        auto s = stmt(Stmt::Output, tk.line);
        next();
        s->expr = expression();
        if (cur().kind != Token::VarEnd) error(cat("expected '}}', found ", describe(cur())));
        next();
        out.push_back(std::move(s));
      } else if (tk.kind == Token::BlockBegin) {
        next();
        if (cur().kind != Token::Name) error("expected a tag name after '{%'");
        const std::string kw = cur().text;
        for (const std::string& e : ends)
          if (kw == e) {
            *end = kw;
            next();
            return out;
          }
        out.push_back(statement());
      } else {
        error(cat("unexpected ", describe(tk)));
      }
    }
  }

  std::unique_ptr<Stmt> statement() {
    const int line = cur().line;
    const std::string kw = next().text;
    auto s = stmt(Stmt::Text, line);
    std::string end;
    if (kw == "if") {
      s->kind = Stmt::If;
      ExprPtr cond = expression();
      expect_block_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "endif") break;
        if (end == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, body({"endif"}, &end));
          break;
        }
        cond = expression();
        expect_block_end();
      }
    } else if (kw == "for") {
      s->kind = Stmt::For;
      s->targets = target_names();
      ++loop_depth_;
      if (!is_name("in")) error(cat("expected 'in' in the for tag, found ", describe(cur())));
      next();
      s->expr = or_expr();
      if (is_name("if")) {
        next();
        s->filter = or_expr();
      }
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      s->body = body({"else", "endfor"}, &end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        s->else_body = body({"endfor"}, &end);
      }
    } else if (kw == "set") {
      s->targets = target_names();
      if (s->targets.size() == 1 && is_op(".")) {
        next();
        s->attr = expect_name();
      }
      if (is_op("=")) {
        s->kind = Stmt::Set;
        next();
        s->expr = tuple_or_expression();
      } else {
        if (s->targets.size() != 1 || !s->attr.empty()) error("a set block assigns one name");
        if (is_op("|")) error("filters on a set block are not supported");
        s->kind = Stmt::SetBlock;
        expect_block_end();
        s->body = body({"endset"}, &end);
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          next();
          def = expression();
        }
        s->params.emplace_back(std::move(p), std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      const int outer_loops = loop_depth_;  // a loop around the macro is not the macro's
      loop_depth_ = 0;
      s->body = body({"endmacro"}, &end);
      loop_depth_ = outer_loops;
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Break : Stmt::Continue;
      if (loop_depth_ == 0) error(cat("'", kw, "' outside a for loop"));
    } else if (kw == "generation") {
      s->kind = Stmt::Generation;
      expect_block_end();
      s->body = body({"endgeneration"}, &end);
    } else {
      error(cat("the '", kw, "' tag is not supported"));
    }
    expect_block_end();
    return s;
  }

  // for/set targets: a name or names separated by commas, optionally in parentheses.
  std::vector<std::string> target_names() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name());
    while (is_op(",")) {
      next();
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  static std::unique_ptr<Stmt> stmt(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `set a = 1, 2` assigns a tuple.
  ExprPtr tuple_or_expression() {
    const int line = cur().line;
    ExprPtr e = expression();
    if (!is_op(",")) return e;
    ExprPtr l = make(Expr::ListLit, line);
    l->tuple = true;
    l->args.push_back(std::move(e));
    while (is_op(",")) {
      next();
      if (cur().kind == Token::BlockEnd) break;
      l->args.push_back(expression());
    }
    return l;
  }

  ExprPtr expression() {
    Depth d(*this);
    ExprPtr e = or_expr();
    if (is_name("if")) {
      const int line = next().line;
      ExprPtr c = make(Expr::Cond, line);
      c->a = std::move(e);
      c->b = or_expr();
      if (is_name("else")) {
        next();
        c->c = expression();
      }
      return c;
    }
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr l = and_expr();
    while (is_name("or")) {
      ExprPtr e = make(Expr::Or, next().line);
      e->a = std::move(l);
      e->b = and_expr();
      l = std::move(e);
    }
    return l;
  }

  ExprPtr and_expr() {
    ExprPtr l = not_expr();
    while (is_name("and")) {
      ExprPtr e = make(Expr::And, next().line);
      e->a = std::move(l);
      e->b = not_expr();
      l = std::move(e);
    }
    return l;
  }

  ExprPtr not_expr() {
    if (is_name("not")) {
      Depth d(*this);
      ExprPtr e = make(Expr::Unary, next().line);
      e->name = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
  }

  ExprPtr compare() {
    const int line = cur().line;
    ExprPtr first = math1();
    ExprPtr c;
    while (true) {
      std::string op;
      if (cur().kind == Token::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && t_[p_ + 1].kind == Token::Name && t_[p_ + 1].text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::Compare, line);
        c->args.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->args.push_back(math1());
    }
    return c ? std::move(c) : std::move(first);
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    ExprPtr e = make(Expr::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr math1() {
    ExprPtr l = concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      l = binary(t.text, std::move(l), concat(), t.line);
    }
    return l;
  }

  ExprPtr concat() {
    ExprPtr l = math2();
    while (is_op("~")) {
      const Token& t = next();
      l = binary("~", std::move(l), math2(), t.line);
    }
    return l;
  }

  ExprPtr math2() {
    ExprPtr l = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      l = binary(t.text, std::move(l), pow(), t.line);
    }
    return l;
  }

  ExprPtr pow() {
    ExprPtr l = unary(true);
    while (is_op("**")) {
      const Token& t = next();
      l = binary("**", std::move(l), unary(true), t.line);
    }
    return l;
  }

  ExprPtr unary(bool with_filter) {
    Depth d(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(Expr::Unary, t.line);
      e->name = t.text;
      e->a = unary(false);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Token& t = cur();
    if (t.kind == Token::Name) {
      next();
      if (t.text == "true" || t.text == "True") return literal(Value(true), t.line);
      if (t.text == "false" || t.text == "False") return literal(Value(false), t.line);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
      ExprPtr e = make(Expr::Name, t.line);
      e->name = t.text;
      return e;
    }
    if (t.kind == Token::String) {
      std::string s;
      while (cur().kind == Token::String) s += next().text;
      return literal(Value(s), t.line);
    }
    if (t.kind == Token::Int) return literal(Value(next().i), t.line);
    if (t.kind == Token::Float) return literal(Value(next().d), t.line);
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        ExprPtr empty = make(Expr::ListLit, t.line);
        empty->tuple = true;
        return empty;
      }
      ExprPtr e = expression();
      if (is_op(",")) {
        ExprPtr l = make(Expr::ListLit, t.line);
        l->tuple = true;
        l->args.push_back(std::move(e));
        while (is_op(",")) {
          next();
          if (is_op(")")) break;
          l->args.push_back(expression());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      ExprPtr l = make(Expr::ListLit, t.line);
      while (!is_op("]")) {
        l->args.push_back(expression());
        if (!is_op("]")) expect_op(",");
      }
      next();
      return l;
    }
    if (is_op("{")) {
      next();
      ExprPtr d = make(Expr::DictLit, t.line);
      while (!is_op("}")) {
        d->args.push_back(expression());
        expect_op(":");
        d->args.push_back(expression());
        if (!is_op("}")) expect_op(",");
      }
      next();
      return d;
    }
    error(cat("unexpected ", describe(t), " in an expression"));
  }

  ExprPtr literal(Value v, int line) {
    ExprPtr e = make(Expr::Literal, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        ExprPtr a = make(Expr::Attr, line);
        if (cur().kind == Token::Int) {  // foo.0 is foo[0]
          a->kind = Expr::Item;
          a->b = literal(Value(next().i), line);
        } else {
          a->name = expect_name();
        }
        a->a = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        const int line = next().line;
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++n > 2) error("a slice has at most three parts");
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) error(cat("expected ':' or ']', found ", describe(cur())));
      parts[n] = expression();
    }
    next();
    ExprPtr e = make(slice ? Expr::Slice : Expr::Item, line);
    e->a = std::move(obj);
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      if (!parts[0]) error("empty subscript '[]'");
      e->b = std::move(parts[0]);
    }
    return e;
  }

  void call_args(std::vector<ExprPtr>& args, KwArgs& kwargs) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().kind == Token::Name && t_[p_ + 1].kind == Token::Op && t_[p_ + 1].text == "=") {
        std::string k = next().text;
        next();
        kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!kwargs.empty()) error("a positional argument follows a keyword argument");
        args.push_back(expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr call(ExprPtr callee) {
    ExprPtr e = make(Expr::Call, cur().line);
    e->a = std::move(callee);
    call_args(e->args, e->kwargs);
    return e;
  }

  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        ExprPtr f = make(Expr::Filter, line);
        f->name = expect_name();
        while (is_op(".")) {
          next();
          f->name += '.';
          f->name += expect_name();
        }
        if (is_op("(")) call_args(f->args, f->kwargs);
        f->a = std::move(e);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        ExprPtr t = make(Expr::Test, line);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect_name();
        if (is_op("(")) {
          call_args(t->args, t->kwargs);
        } else if ((cur().kind == Token::Name && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if") && !is_name("in") && !is_name("not") &&
                    !is_name("is")) ||
                   cur().kind == Token::String || cur().kind == Token::Int ||
                   cur().kind == Token::Float || is_op("[") || is_op("{")) {
          t->args.push_back(postfix(primary()));
        }
        t->a = std::move(e);
        e = std::move(t);
      } else if (is_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& where_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& where) {
  return Parser(tokens, where).parse_all();
}

}  // namespace loom::data::jinja
