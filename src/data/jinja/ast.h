// The parsed form of a Jinja template: expressions and statements, each with its source line
// for errors raised while rendering.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja/value.h"

namespace loom::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using KwArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum Kind {
    Literal,  // value
    Name,     // name
    Attr,     // a.name
    Item,     // a[b]
    Slice,    // a[args[0]:args[1]:args[2]], each may be null
    Call,     // a(args, kwargs)
    Filter,   // a | name(args, kwargs)
    Test,     // a is [not] name(args)
    Unary,    // name ("-", "+", "not") applied to a
    Binary,   // a name b, for + - * / // % ** ~
    And,      // a and b
    Or,       // a or b
    Compare,  // args[0] ops[0] args[1] ops[1] ... (a chain, as Python's)
    Cond,     // a if b else c (c null: undefined)
    ListLit,  // [args...], or (args...) when tuple
    DictLit,  // {args[0]: args[1], ...}
  };
  Kind kind = {};
  int line = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  KwArgs kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  bool tuple = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches (else: a null condition)
    For,       // for targets in expr [if filter] body [else else_body]
    Set,       // set targets = expr, or set targets[0].attr = expr
    SetBlock,  // set targets[0] %} body {% endset
    Macro,     // macro name(params) body
    Break,
    Continue,
    Generation,  // Hugging Face's {% generation %} body {% endgeneration %}: marks trained text
  };
  Kind kind = {};
  int line = 0;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default null when none
};

}  // namespace loom::data::jinja
