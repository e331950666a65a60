// The Jinja subset's refusals: unsupported constructs, syntax errors and runtime errors, each
// naming the template and line; bounds on hostile templates.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/json.h"
#include "data/jinja/template.h"

namespace loom::data::jinja {
namespace {

std::string render(const std::string& source) {
  return Template(source, "t.jinja").render({}).text;
}

// The message of the loom::Error that `f` throws ("" when it does not throw).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaBadInput, UnsupportedConstructsNameTheLine) {
  EXPECT_EQ(error_of([] { render("ok\n{% include 'x.jinja' %}"); }),
            "t.jinja:2: the 'include' tag is not supported");
  EXPECT_EQ(error_of([] { render("{{ x }}\n\n{{ x | wordwrap }}"); }),
            "t.jinja:3: the filter 'wordwrap' is not supported");
  EXPECT_EQ(error_of([] { render("{% if x is prime %}{% endif %}"); }),
            "t.jinja:1: the test 'prime' is not supported");
  EXPECT_EQ(error_of([] { render("{% for x in y recursive %}{% endfor %}"); }),
            "t.jinja:1: recursive for loops are not supported");
  EXPECT_EQ(error_of([] { render("{{ f(*args) }}"); }),
            "t.jinja:1: *args and **kwargs in calls are not supported");
  EXPECT_EQ(error_of([] { render("{{ '%s' % 1 }}"); }),
            "t.jinja:1: string formatting with '%' is not supported");
}

TEST(JinjaBadInput, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(error_of([] { render("a\n{% if x %}b"); }), "t.jinja:2: missing '{% endif %}'");
  EXPECT_EQ(error_of([] { render("{{ x"); }), "t.jinja:1: tag opened here is never closed ('}}')");
  EXPECT_EQ(error_of([] { render("\n{{ 'abc }}"); }), "t.jinja:2: string literal is never closed");
  EXPECT_EQ(error_of([] { render("{# open"); }), "t.jinja:1: comment '{#' is never closed ('#}')");
  EXPECT_EQ(error_of([] { render("{{ (1 }}"); }), "t.jinja:1: unexpected '}'");
  EXPECT_EQ(error_of([] { render("{% break %}"); }), "t.jinja:1: 'break' outside a for loop");
  EXPECT_EQ(error_of([] { render("{% endfor %}"); }),
            "t.jinja:1: the 'endfor' tag is not supported");
  EXPECT_EQ(error_of([] { render("{{ 1 + }}"); }), "t.jinja:1: unexpected '}}' in an expression");
  EXPECT_EQ(error_of([] { Template("\xff", "t.jinja"); }), "t.jinja: not valid UTF-8 (byte 0)");
  const std::string deep = std::string(500, '(') + "1" + std::string(500, ')');
  EXPECT_EQ(error_of([&] { render("{{ " + deep + " }}"); }),
            "t.jinja:1: template nests too deeply");
}

TEST(JinjaBadInput, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(error_of([] { render("\n{{ x.y }}"); }), "t.jinja:2: 'x' is undefined");
  EXPECT_EQ(error_of([] { render("{% set x = {} %}\n{{ x.y.z }}"); }),
            "t.jinja:2: 'y' is undefined");
  EXPECT_EQ(error_of([] { render("{{ 'a' + 1 }}"); }),
            "t.jinja:1: unsupported operand types for +: 'str' and 'int'");
  EXPECT_EQ(error_of([] { render("{{ 1 // 0 }}"); }),
            "t.jinja:1: integer division or modulo by zero");
  EXPECT_EQ(error_of([] { render("{% for x in 5 %}{% endfor %}"); }),
            "t.jinja:1: 'int' object is not iterable");
  EXPECT_EQ(error_of([] { render("{{ 9223372036854775807 + 1 }}"); }),
            "t.jinja:1: integer overflow in '+'");
  EXPECT_EQ(error_of([] { render("{% set x = 1 %}{% set x.a = 2 %}"); }),
            "t.jinja:1: cannot set attribute 'a' of 'x', which is not a namespace()");
  EXPECT_EQ(error_of([] { render("{{ 'a' | trim('a', 'b') }}"); }),
            "t.jinja:1: filter 'trim' takes at most 1 positional argument, got 2");
  EXPECT_EQ(error_of([] { render("{{ x | tojson }}"); }),
            "t.jinja:1: tojson: the value is undefined ('x')");
  EXPECT_EQ(error_of([] { render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"); }),
            "t.jinja:1: macro 'm' recurses too deeply");
  EXPECT_EQ(
      error_of([] {
        render("{% for a in range(2000) %}{% for b in range(2000) %}{% endfor %}{% endfor %}");
      }),
      "t.jinja:1: the template runs too long (over 1000000 loop iterations)");
  EXPECT_EQ(error_of([] { render("{{ 'x' * 100000000 }}"); }), "t.jinja:1: '*' result too large");
}

}  // namespace
}  // namespace loom::data::jinja
