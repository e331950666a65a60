// The Jinja subset (data/jinja/): lexing with Hugging Face's whitespace settings, expressions,
// tests, filters, Python methods and statements, each checked against the text jinja2 renders
// for the same source (the refusals: test_jinja_bad.cpp).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/json.h"
#include "data/jinja/template.h"
#include "data/jinja/value.h"

namespace loom::data::jinja {
namespace {

struct Case {
  const char* source;
  const char* vars;  // JSON object of the template's variables
  const char* expected;
};

std::string render(const std::string& source, const std::string& vars = "{}") {
  Template t(source, "t.jinja");
  Dict g;
  const Json j = Json::parse(vars);
  for (const auto& [k, v] : j.as_object()) g.set(k, Value::from_json(v));
  return t.render(g).text;
}

void check_all(const Case* cases, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(cases[i].source);
    EXPECT_EQ(render(cases[i].source, cases[i].vars), cases[i].expected);
  }
}

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kWhitespace[] = {
    {"a\n  {% if true %}\n  x\n  {% endif %}\nb", "{}", "a\n  x\nb"},
    {"a  {%- if true -%}  x  {%- endif -%}  b", "{}", "axb"},
    {"{% for i in [1,2] %}\n    {{ i }}\n{% endfor %}", "{}", "    1\n    2\n"},
    {"  {%+ if true %}x{% endif %}", "{}", "  x"},
    {"{% if true +%}\nx{% endif %}", "{}", "\nx"},
    {"a {# c #}\nb\n  {# d #}\nc", "{}", "a b\nc"},
    {"{{ 'x' }}\n{{- 'y' }}  {{ 'z' -}}  \n w", "{}", "xy  zw"},
    {"{% raw %}{{ not parsed }}{% endraw %}", "{}", "{{ not parsed }}"},
    {"line\n", "{}", "line"},
    {"line\n\n", "{}", "line\n"},
    {"a\r\nb", "{}", "a\nb"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kLiterals[] = {
    {"{{ [1, 'a', none, true, 1.5, {'k': [2]}] }}", "{}", "[1, 'a', None, True, 1.5, {'k': [2]}]"},
    {"{{ 1.0 }} {{ 1e-5 }} {{ 1e16 }} {{ 123456789.125 }} {{ 0.1 + 0.2 }} {{ 3 / 2 }} {{ 4 / 2 }}",
     "{}", "1.0 1e-05 1e+16 123456789.125 0.30000000000000004 1.5 2.0"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % "
     "2 }}",
     "{}", "3 -4 2 1024 0.5 3.0 0.5"},
    {"{{ 'a' ~ 1 ~ none ~ x }}|{{ 'ab' * 3 }}|{{ [1] + [2] }}", "{}", "a1None|ababab|[1, 2]"},
    {"{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }} {{ 'tab\\tnl\\n\\u00e9\\x41' }}", "{}",
     "it's [\"it's\", 'q\"'] tab\tnl\néA"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kTestsAndOperators[] = {
    {"{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ true is "
     "number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }}",
     "{}", "False True True True True True False True"},
    {"{{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 3 is "
     "odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1.0 }}",
     "{}", "True True True True True True True True"},
    {"{{ false is false }} {{ 0 is false }} {{ true is true }} {{ true is boolean }} {{ 'a' is not "
     "string }} {{ x is not defined }}",
     "{}", "True False True True False True"},
    {"{{ not x is defined }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'b' in 'abc' }} {{ 2 not in [1, 3] "
     "}} {{ 'k' in {'k': 1} }}",
     "{}", "True True False True True True"},
    {"{{ 1 == 1.0 }} {{ true == 1 }} {{ [1, 2] == [1, 2] }} {{ 'a' < 'b' }} {{ x == none }} {{ "
     "none == none }}",
     "{}", "True True True True False True"},
    {"{{ 0 or 'y' }} {{ 'x' and 0 }} {{ [] or none }} {{ 'a' if 1 else 'b' }} {{ 'a' if 0 }}|",
     "{}", "y 0 None a |"},
    {"{{ -3 | abs }} {{ - 2 ** 2 }} {{ (1, 2) }} {{ 1 + 2 * 3 - 4 }} {{ 'a' + 'b' ~ 'c' }}", "{}",
     "3 4 (1, 2) 3 abc"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kAccessAndSlices[] = {
    {"{{ d.a }} {{ d['b'][1] }} {{ d.c }}|{{ d.items() | list }} {{ d.get('a') }} {{ d.get('z', "
     "'def') }} {{ d.get('z') }} {{ d.keys() | list }}",
     "{\"d\": {\"a\": 1, \"b\": [5, 6]}}", "1 6 |[('a', 1), ('b', [5, 6])] 1 def None ['a', 'b']"},
    {"{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ l[5] }}|{{ l[1:2] }} {{ "
     "'hello'[1:3] }} {{ 'héllo'[::-1] }} {{ l.0 }}",
     "{\"l\": [1, 2, 3]}", "1 3 [2, 3] [3, 2, 1] [1, 2] |[2] el olléh 1"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kStringMethods[] = {
    {"{{ s.startswith('ab') }} {{ s.endswith(('x', 'yz')) }} {{ s.split(',') }} {{ s.split(',', 1) "
     "}} {{ '  a  b '.split() }} {{ ' a b '.split(None, 1) }}",
     "{\"s\": \"ab,cd,xyz\"}",
     "True True ['ab', 'cd', 'xyz'] ['ab', 'cd,xyz'] ['a', 'b'] ['a', 'b ']"},
    {"[{{ '\\n x \\n'.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '\\na'.lstrip('\\n') }}] [{{ 'a  "
     "'.rstrip() }}] {{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'hello world-wide'.title() }} {{ "
     "'hELLO'.capitalize() }}",
     "{}", "[x] [a] [a] [a] ABC abc Hello World-Wide Hello"},
    {"{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'ab'.replace('', '.') "
     "}} {{ ', '.join(['a', 'b']) }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }}",
     "{}", "a+b+c ab-c .a.b. a, b 1 2"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kFilters[] = {
    {"[{{ '  x \\n' | trim }}] {{ 'abc' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} "
     "{{ 'é日' | length }} {{ x | length }}",
     "{}", "[x] 3 2 1 2 0"},
    {"{{ {'b': [1, 2.5, none, true], 'a': 'é\"\\n'} | tojson }} {{ [1, {'x': []}] | "
     "tojson(indent=2) }} {{ {'a': {}} | tojson(indent=2) }}",
     "{}",
     "{\"b\": [1, 2.5, null, true], \"a\": \"é\\\"\\n\"} [\n  1,\n  {\n    \"x\": []\n  }\n] {\n  "
     "\"a\": {}\n}"},
    {"{{ 'é' | tojson(ensure_ascii=true) }} {{ '🎉' | tojson(true) }} {{ {'b': 1, 'a': 2} | "
     "tojson(sort_keys=true) }} {{ [1, 2] | tojson(separators=(',', ':')) }}",
     "{}", "\"\\u00e9\" \"\\ud83c\\udf89\" {\"a\": 2, \"b\": 1} [1,2]"},
    {"{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | "
     "d('n', boolean=true) }} {{ [1, 2, 3] | join('-') }} {{ l | join(', ', attribute='n') }}",
     "{\"l\": [{\"n\": \"a\"}, {\"n\": \"b\"}]}", "d  d n 1-2-3 a, b"},
    {"{{ 'ab' | list }} {{ {'a': 1, 'b': 2} | items | list }} {{ [3, 1, 2] | first }} {{ [3, 1, 2] "
     "| last }} {{ 'hello' | upper }} {{ 'HeLLo' | lower }} {{ 'hello world' | title }} {{ 'hi "
     "there' | capitalize }}",
     "{}", "['a', 'b'] [('a', 1), ('b', 2)] 3 2 HELLO hello Hello World Hi there"},
    {"{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ ms | "
     "rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('extra') | list }} {{ "
     "ms | map(attribute='missing', default='-') | join }}",
     "{\"ms\": [{\"content\": \"u1\", \"role\": \"user\"}, {\"content\": \"a1\", \"extra\": 1, "
     "\"role\": \"assistant\"}, {\"content\": \"u2\", \"role\": \"user\"}]}",
     "['u1', 'u2'] 1 [{'content': 'a1', 'extra': 1, 'role': 'assistant'}] ---"},
    {"{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('even') | list }} {{ ['a', "
     "'B'] | map('upper') | list }} {{ ['1', '2'] | map('int') | sum if false else 'x' }}",
     "{}", "[1, 3] [1, 3] ['A', 'B'] x"},
    {"{{ 'a-b' | replace('-', '+') }} {{ 12 | string ~ 'x' }} {{ '42' | int + 1 }} {{ '4.7' | int "
     "}} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 'x' | float }} "
     "{{ '<b>' | safe }}",
     "{}", "a+b 12x 43 4 0 7 3 2.5 0.0 <b>"},
    {"{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ "
     "[1, 2, 1] | unique | list }} {{ [1, 5, 3] | min }} {{ [1, 5, 3] | max }} {{ [1, 2] | reverse "
     "| list }} {{ 'abc' | reverse }} {{ {'b': 1, 'a': 2} | dictsort }}",
     "{}", "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] [1, 2] 1 5 [2, 1] cba [('a', 2), ('b', 1)]"},
    {"{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, "
     "blank=true) }}|{{ 'x' | indent('>> ', first=true) }}",
     "{}", "a\n    b\n\n    c|  a\n  b|a\n  \n  b|>> x"},
};

// Expected texts: jinja2 3.1 rendering the same source (trim_blocks, lstrip_blocks).
const Case kStatements[] = {
    {"{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ "
     "loop.length }}{{ loop.revindex }}{% if loop.previtem is defined %}p{{ loop.previtem }}{% "
     "endif %}{% if loop.nextitem is defined %}n{{ loop.nextitem }}{% endif %};{% endfor %}",
     "{}", "10TrueFalse33n2;21FalseFalse32p1n3;32FalseTrue31p2;"},
    {"{% for x in [] %}a{% else %}empty{% endfor %} {% for x in [1, 2, 3, 4] if x is even %}{{ x "
     "}}{{ loop.length }}{% endfor %} {% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% "
     "endfor %}",
     "{}", "empty 2242 a=1 b=2 "},
    {"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% "
     "endif %}{{ x }}{% endfor %} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %} {{ "
     "range(2, 8, 3) | list }} {% for c in 'hé' %}[{{ c }}]{% endfor %} {% for k in {'x': 1, 'y': "
     "2} %}{{ k }}{% endfor %}",
     "{}", "0134 37 [2, 5] [h][é] xy"},
    {"{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }} {% set ns "
     "= namespace(t=0) %}{% for i in [1, 2, 3] %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }} "
     "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "{}", "231 6 5"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set blk %}in {{ 'block' }}{% endset %}[{{ blk }}] {% "
     "set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}{{ ns.c }}",
     "{}", "12 [in block] 1x"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ "
     "greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet('D') | upper }}",
     "{}", "Hi A! Hi B? Hi C. HI D!"},
    {"{% macro outer(x) %}<{{ inner(x) }}>{% endmacro %}{% macro inner(y) %}{{ y * 2 }}{% endmacro "
     "%}{{ outer(3) }} {% set g = 'glob' %}{% macro sees() %}{{ g }}{% endmacro %}{{ sees() }}",
     "{}", "<6> glob"},
    {"{% for i in [1] %}{% set loopvar = 'in' %}{% endfor %}[{{ loopvar }}] {% for m in ms %}{{ "
     "loop.cycle('odd', 'even') }} {% endfor %}",
     "{\"ms\": [1, 2, 3]}", "[] odd even odd "},
    {"{{ messages[0]['content'] | trim + '|' }} {{ (messages | length) - 1 }} {{ messages[1:] | "
     "length }} {{ messages[0].content.split()[0] }}",
     "{\"messages\": [{\"content\": \" sys prompt \", \"role\": \"system\"}, {\"content\": \"hi\", "
     "\"role\": \"user\"}]}",
     "sys prompt| 1 1 sys"},
    {"{% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a and not b %}N{% endif %}",
     "{\"b\": 1}", "B"},
    {"{{ none.x }}|{{ x if x is defined else 'no' }}|{{ (none) is none }}|{{ [] | first }}|{{ "
     "{'a': 1}['b'] }}|{{ [1][3] }}|",
     "{}", "|no|True||||"},
    {"{% generation %}gen{% endgeneration %} {{ 'x' }}", "{}", "gen x"},
    {"{% set s = 'a' %}{% set t %}{{ s }}b{% endset %}{{ t ~ t }} {{ dict(a=1, b=2) | tojson }} {{ "
     "namespace(a=1).a }}",
     "{}", "abab {\"a\": 1, \"b\": 2} 1"},
};

#define CHECK_ALL(cases) check_all(cases, sizeof(cases) / sizeof(cases[0]))

TEST(Jinja, Whitespace) {
  CHECK_ALL(kWhitespace);
}
TEST(Jinja, Literals) {
  CHECK_ALL(kLiterals);
}
TEST(Jinja, TestsAndOperators) {
  CHECK_ALL(kTestsAndOperators);
}
TEST(Jinja, AccessAndSlices) {
  CHECK_ALL(kAccessAndSlices);
}
TEST(Jinja, StringMethods) {
  CHECK_ALL(kStringMethods);
}
TEST(Jinja, Filters) {
  CHECK_ALL(kFilters);
}
TEST(Jinja, Statements) {
  CHECK_ALL(kStatements);
}

TEST(Jinja, GenerationBlocksMarkTheirText) {
  Template t(
      "a{% generation %}bc{% endgeneration %}d{% for x in [1, 2] %}{% generation %}"
      "{{ x }}{% endgeneration %}{% endfor %}",
      "t");
  EXPECT_TRUE(t.has_generation_blocks());
  const Rendered r = t.render({});
  EXPECT_EQ(r.text, "abcd12");
  ASSERT_EQ(r.generation.size(), 3u);
  EXPECT_EQ(r.generation[0], (std::pair<size_t, size_t>(1, 3)));
  EXPECT_EQ(r.generation[2], (std::pair<size_t, size_t>(5, 6)));
}

TEST(Jinja, FloatReprIsPythons) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(-2.5e-300), "-2.5e-300");
}

}  // namespace
}  // namespace loom::data::jinja
