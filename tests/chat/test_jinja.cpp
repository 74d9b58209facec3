// toy's Jinja2 engine (src/toy/chat/), one feature at a time. Every expected string below was
// produced by Python's jinja2 3.1 (Debian python3-jinja2) set up as Hugging Face's
// apply_chat_template sets it up (tools/chat/render_reference.py's make_env: the immutable
// sandbox, trim_blocks, lstrip_blocks, loopcontrols, {% generation %}, HF's tojson,
// raise_exception, strftime_now fixed at 2026-03-14 09:26:53), rendering with the variables
// in kVars. Error messages are toy's own (each names the template line); the runtime errors
// are ones Python raises too, the syntax errors include a feature toy refuses (include) where
// Python would go on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "proc.h"
#include "toy/chat/builtins.h"
#include "toy/chat/chat_render.h"
#include "toy/chat/render.h"
#include "toy/core/error.h"

namespace {

using nlohmann::json;
namespace jinja = toy::jinja;
using toy::test::error_of;

const json kVars = json::parse(R"({
  "d": {"a": 1, "b": [1, 2, 3]}, "l": [3, 1, 2], "s": "Hello World", "n": null,
  "words": ["b", "A", "a", "C"],
  "msgs": [{"content": "hi", "role": "user"}, {"content": "yo", "role": "assistant"},
           {"content": "bye", "role": "user"}]})");

std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 9;
  tm.tm_min = 26;
  tm.tm_sec = 53;
  tm.tm_wday = 6;  // a Saturday
  tm.tm_yday = 72;
  return tm;
}

std::string render(std::string_view tmpl) {
  jinja::Dict vars;
  jinja::add_globals(vars, fixed_now());
  for (const auto& [k, v] : kVars.items()) vars.set(jinja::Value(k), jinja::from_json(v));
  return jinja::Template(tmpl).render(vars);
}

void expect_error(std::string_view tmpl, std::string_view needle) {
  const std::string msg = error_of([&] { render(tmpl); });
  EXPECT_NE(msg.find(needle), std::string::npos) << "template: " << tmpl << "\nerror: " << msg;
  EXPECT_EQ(msg.rfind("[template] ", 0), 0u) << msg;
}

}  // namespace

TEST(Jinja, Whitespace) {
  EXPECT_EQ(render(R"J(a {{ 1 }} b)J"),
            R"J(a 1 b)J");
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\nend"),
            "  x\nend");
  EXPECT_EQ(render(R"J(a  {%- if true -%}  b  {%- endif -%}  c)J"),
            R"J(abc)J");
  EXPECT_EQ(render("a\n  {{- 'b' -}}  \nc"),
            R"J(abc)J");
  EXPECT_EQ(render(R"J(  {%+ if true %}x{% endif %})J"),
            R"J(  x)J");
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"),
            "\nx");
  EXPECT_EQ(render("a {# note #}\nb\n  {# own line #}\nc"),
            "a b\nc");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n"),
            "a\nb");
  EXPECT_EQ(render("x {% if true %}y{% endif %}\n"),
            R"J(x y)J");
  EXPECT_EQ(render("one\r\ntwo\rthree\n\n"),
            "one\ntwo\nthree\n");
  EXPECT_EQ(render("  {% raw %}{{ x }} {% if %}{% endraw %}\nz"),
            R"J({{ x }} {% if %}z)J");
  EXPECT_EQ(render(R"J({%- raw -%}  a  {%- endraw -%}  b)J"),
            R"J(ab)J");
  EXPECT_EQ(render("{% for i in [1, 2] %}\n  - {{ i }}\n{% endfor %}\ndone"),
            "  - 1\n  - 2\ndone");
}

TEST(Jinja, Literals) {
  EXPECT_EQ(render(R"J({{ "tab\there" }}|{{ 'it\'s' }}|{{ "\u00e9\x41\\" }}|{{ "a" 'b' "c" }}|{{ "\q" }})J"),
            "tab\there|it's|éA\\|abc|\\q");
  EXPECT_EQ(render(R"J({{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 1.5e3 }} {{ 2.0 }} {{ 1e20 }})J"),
            R"J(1000 31 5 1500.0 2.0 1e+20)J");
  EXPECT_EQ(render(R"J({{ true }} {{ True }} {{ false }} {{ none }} {{ None }} [{{ undefined_name }}])J"),
            R"J(True True False None None [])J");
  EXPECT_EQ(render(R"J({{ [1, 'a', none, true, 1.0, {'k': [1]}] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ 1, 2 }})J"),
            R"J([1, 'a', None, True, 1.0, {'k': [1]}] (1,) (1, 2) () (1, 2))J");
  EXPECT_EQ(render(R"J({{ {'a': 1, 'b': 'x', 'a': 2} }} {{ ["it's", 'say "hi"', 'both \' "', 'nl\n'] }})J"),
            R"J({'a': 2, 'b': 'x'} ["it's", 'say "hi"', 'both \' "', 'nl\n'])J");
  EXPECT_EQ(render(R"J({{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 10 / 2 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1e16 }} {{ 1e15 }} {{ -0.0 }} {{ 2.5e-10 }})J"),
            R"J(0.30000000000000004 0.3333333333333333 5.0 1e-05 0.0001 1e+16 1000000000000000.0 -0.0 2.5e-10)J");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(render(R"J({{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }})J"),
            R"J(3 -4 -2 2 1024 0.5 64)J");
  EXPECT_EQ(render(R"J({{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 7 / 2 }} {{ 1 + 2.0 }} {{ true + 1 }} {{ -(3) }} {{ +3 }})J"),
            R"J(3.0 0.5 3.5 3.0 2 -3 3)J");
  EXPECT_EQ(render(R"J({{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'a' + 'b' }} {{ 1 ~ 2 ~ none ~ u }})J"),
            R"J(ababab xx [1, 1] [1, 2] (1, 2) ab 12None)J");
  EXPECT_EQ(render(R"J({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ~ 4 }} {{ -2 ** 2 }} {{ -3|abs }} {{ 10 - 2 - 3 }})J"),
            R"J(7 9 64 4 3 5)J");
  EXPECT_EQ(render(R"J({{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ none == none }} {{ u == u }} {{ 1 != '1' }})J"),
            R"J(True True True True True False True True True)J");
  EXPECT_EQ(render(R"J({{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ not 1 in [1] }} {{ 'x' in u }})J"),
            R"J(True True True True False False)J");
  EXPECT_EQ(render(R"J({{ 0 or 'x' }} {{ 1 and 'y' }} {{ none or [] }} [{{ '' and 1 }}] {{ not '' }} {{ not [0] }})J"),
            R"J(x y [] [] True False)J");
  EXPECT_EQ(render(R"J({{ 'a' if true else 'b' }} [{{ 'a' if false }}] {{ 'x' if 0 else 'y' if 1 else 'z' }})J"),
            R"J(a [] y)J");
  EXPECT_EQ(render(R"J({{ '%s and %d' % ('a', 3) }} {{ '%05.2f|%-4s|%+d|%x|%r' % (3.14159, 'ab', 3, 255, 'q') }} {{ '%s' % [1] }} {{ '%(k)s!' % {'k': 'v'} }})J"),
            R"J(a and 3 03.14|ab  |+3|ff|'q' [1] v!)J");
}

TEST(Jinja, Access) {
  EXPECT_EQ(render(R"J({{ d.a }} {{ d['b'][1] }} {{ d.b[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ l[5:] }} {{ d.b.0 }})J"),
            R"J(1 2 3 [1, 2] [2, 1, 3] [3, 1] [] 1)J");
  EXPECT_EQ(render(R"J({{ 'hello'[1:4] }} {{ 'héllo'[1] }} {{ 'abc'[::-1] }} {{ 'héllo'[-3:] }} {{ 'abcdef'[::2] }} {{ s[0] }})J"),
            R"J(ell é cba llo ace H)J");
  EXPECT_EQ(render(R"J([{{ d.missing }}] [{{ l[10] }}] [{{ n.x }}] [{{ s.nope }}] {{ d.missing is defined }} {{ d.a is defined }})J"),
            R"J([] [] [] [] False True)J");
  EXPECT_EQ(render(R"J({{ d.get('a') }} {{ d.get('zz', 5) }} {{ d.get('zz') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.items() }})J"),
            R"J(1 5 None ['a', 'b'] [1, [1, 2, 3]] [('a', 1), ('b', [1, 2, 3])] dict_items([('a', 1), ('b', [1, 2, 3])]))J");
  EXPECT_EQ(render(R"J({{ {'items': 1}['items'] }} {{ {'x': {'y': 'z'}}.x.y }} {{ {1: 'one'}[1] }} {{ (5, 6)[1] }} {{ range(3) }} {{ range(1, 10, 3)[1] }})J"),
            R"J(1 z one 6 range(0, 3) 4)J");
}

TEST(Jinja, If) {
  EXPECT_EQ(render(R"J({% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}{% if none %}x{% else %}y{% endif %})J"),
            R"J(cy)J");
  EXPECT_EQ(render(R"J({% if u %}1{% endif %}{% if u is defined %}2{% endif %}{% if not u %}3{% endif %}{% if d.missing %}4{% endif %})J"),
            R"J(3)J");
}

TEST(Jinja, For) {
  EXPECT_EQ(render(R"J({% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})J"),
            R"J(1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;)J");
  EXPECT_EQ(render(R"J({% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }}|{{ loop.depth }}]{% endfor %})J"),
            R"J([|2|a|1][1|3|b|1][2||a|1])J");
  EXPECT_EQ(render(R"J({% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %})J"),
            R"J(2/2 4/2 |empty)J");
  EXPECT_EQ(render(R"J({% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }},{% endfor %} {% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %} {% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}{% endfor %})J"),
            R"J(b=1,a=2, ba 123)J");
  EXPECT_EQ(render(R"J({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %})J"),
            R"J(0134)J");
  EXPECT_EQ(render(R"J({% for x in [1, 1, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %} {% for x in u %}never{% endfor %}{% for c in 'hé' %}<{{ c }}>{% endfor %})J"),
            R"J(121 <h><é>)J");
  EXPECT_EQ(render(R"J({% for o in [1, 2] %}{% for i in 'ab' %}{{ o }}{{ i }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %})J"),
            R"J(1a1 1b2 1|2a1 2b2 2|)J");
}

TEST(Jinja, Set) {
  EXPECT_EQ(render(R"J({% set a = 1 %}{% set b, c = 2, 3 %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }})J"),
            R"J(123(4, 5))J");
  EXPECT_EQ(render(R"J({% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i + 10 %}{{ x }}|{% endfor %}{{ x }})J"),
            R"J(010|011|012|0)J");
  EXPECT_EQ(render(R"J({% set ns = namespace(n=0, items=[]) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.n }} {{ ns.items }} {{ ns }})J"),
            R"J(6 [1, 2, 3] <Namespace {'n': 6, 'items': [1, 2, 3]}>)J");
  EXPECT_EQ(render(R"J({% set x %}a{{ 1 }}b{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}{% if true %}{% set z = 'if-leaks' %}{% endif %}{{ z }})J"),
            R"J([a1b]ABCif-leaks)J");
}

TEST(Jinja, Macro) {
  EXPECT_EQ(render(R"J({% macro m(a, b=a + 1, c='c') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 5) }} {{ m(1, c='z') }} {{ m(b=2, a=0) }} {{ m }})J"),
            R"J(1-2-c 1-5-c 1-2-z 0-2-c <Macro 'm'>)J");
  EXPECT_EQ(render(R"J({% macro v(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, 3, k=4) }} {{ v() }})J"),
            R"J(1(2, 3){'k': 4} (){})J");
  EXPECT_EQ(render(R"J({% macro f(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }})J"),
            R"J(4*3*2*1)J");
  EXPECT_EQ(render(R"J({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %} {% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}{% call(x, i) each('ab') %}{{ i }}{{ x }};{% endcall %})J"),
            R"J(<b>bold</b> 1a;2b;)J");
  EXPECT_EQ(render(R"J({% set g = 'global' %}{% macro m() %}{{ g }}{{ late }}{% endmacro %}{% set late = '+late' %}{{ m() }})J"),
            R"J(global+late)J");
}

TEST(Jinja, Blocks) {
  EXPECT_EQ(render(R"J({% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter trim|replace('x', 'y') %}  axa  {% endfilter %}|{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])J"),
            R"J(ABC D|aya|3[])J");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render(R"J({{ 1 is odd }} {{ 2 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ u is defined }} {{ u is undefined }} {{ n is none }} {{ 'a' is string }})J"),
            R"J(True True True False False True True True)J");
  EXPECT_EQ(render(R"J({{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 1 is boolean }} {{ {} is mapping }} {{ [] is mapping }})J"),
            R"J(True True True False True True False True False)J");
  EXPECT_EQ(render(R"J({{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ range is callable }} {{ 'x' is callable }})J"),
            R"J(True True False True True False True False)J");
  EXPECT_EQ(render(R"J({{ 'ab' is lower }} {{ 'AB' is upper }} {{ 'Ab' is lower }} {{ 1 is in [1, 2] }} {{ n is sameas none }} {{ true is true }} {{ 0 is false }} {{ false is false }})J"),
            R"J(True True False True True True False True)J");
  EXPECT_EQ(render(R"J({{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is not ne 1 }} {{ 2 is gt 1 }} {{ 2 is ge 3 }} {{ 1 is lt 2 }} {{ 'x' is not none }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }})J"),
            R"J(True False True True False True True True True False)J");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render(R"J({{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'abc'|length }}|{{ [1, 2]|count }}|{{ {'a': 1}|length }}|{{ u|length }}|{{ 'héllo'|length }})J"),
            R"J(x|a|3|2|1|0|5)J");
  EXPECT_EQ(render(R"J({{ [1, 2, 3]|join(', ') }}|{{ msgs|join('/', attribute='role') }}|{{ [1, none, 'a']|join }}|{{ 'abc'|join('-') }})J"),
            R"J(1, 2, 3|user/assistant/user|1Nonea|a-b-c)J");
  EXPECT_EQ(render(R"J({{ msgs|map(attribute='content')|list }} {{ ['a', 'b']|map('upper')|list }} {{ [1, 2]|map('string')|join }} {{ msgs|map(attribute='x', default='?')|list }})J"),
            R"J(['hi', 'yo', 'bye'] ['A', 'B'] 12 ['?', '?', '?'])J");
  EXPECT_EQ(render(R"J({{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 5, 9]|select('gt', 4)|list }})J"),
            R"J([1, 3] [2, 4] [1, 'a'] [5, 9])J");
  EXPECT_EQ(render(R"J({{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ msgs|selectattr('content')|list|length }})J"),
            R"J(hi,bye 1 3)J");
  EXPECT_EQ(render(R"J({{ d|items|list }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'a': 3}|dictsort(by='value', reverse=true) }} {% for k, v in d|items %}{{ k }}{% endfor %})J"),
            R"J([('a', 1), ('b', [1, 2, 3])] [('A', 2), ('a', 3), ('b', 1)] [('a', 3), ('b', 1)] ab)J");
  EXPECT_EQ(render(R"J({{ u|default('dflt') }} {{ ''|default('x') }} {{ ''|default('x', true) }} {{ none|d('y') }} {{ 0|default(5, boolean=true) }} {{ d.zz|default(d.a) }})J"),
            R"J(dflt  x None 5 1)J");
  EXPECT_EQ(render(R"J({{ 5|string ~ 'x' }} {{ [1]|string }} {{ '42'|int + 1 }} {{ '3.9'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '1e3'|int }} {{ '0x1f'|int(base=16) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ 3|float }})J"),
            R"J(5x [1] 43 3 0 7 1000 31 3 2.5 0.0 3.0)J");
  EXPECT_EQ(render(R"J({{ 'hello world'|upper }} {{ 'HeLLo'|lower }} {{ 'hello WORLD'|capitalize }} {{ 'hello-world foo(bar)'|title }} {{ 'aaa'|replace('a', 'b', 2) }})J"),
            R"J(HELLO WORLD hello Hello world Hello-World Foo(Bar) bba)J");
  EXPECT_EQ(render(R"J({{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ []|first is defined }} {{ 'abc'|list }} {{ [3, 1, 2]|unique|list }} {{ words|unique|list }})J"),
            R"J(1 3 a False ['a', 'b', 'c'] [3, 1, 2] ['b', 'A', 'C'])J");
  EXPECT_EQ(render(R"J({{ '<a href="x">&</a>'|e }} {{ '<b>'|escape|escape }} {{ '<b>'|safe }} {{ '<i>'|safe + '<u>' }} {{ ('<b>'|safe) is escaped }} {{ '<p>a &amp; <!-- c --> b</p>'|striptags }})J"),
            R"J(&lt;a href=&#34;x&#34;&gt;&amp;&lt;/a&gt; &lt;b&gt; <b> <i>&lt;u&gt; True a & b)J");
  EXPECT_EQ(render("[{{ 'a\nb\n\nc'|indent }}] [{{ 'a\nb'|indent(2, true) }}] [{{ 'a\n\nb'|indent('>', blank=true) }}] [{{ 'x\n'|indent }}]"),
            "[a\n    b\n\n    c] [  a\n  b] [a\n>\n>b] [x\n]");
  EXPECT_EQ(render(R"J({{ 'one two  three'|wordcount }} {{ -5|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 3|round }})J"),
            R"J(3 5 2.5 2.0 4.0 2.67 3.0 2.0 3)J");
  EXPECT_EQ(render(R"J({{ [1, 2, 3]|sum }} {{ msgs|length }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ [1.5]|sum(start=1) }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ words|min }} {{ words|max }} {{ []|max is defined }})J"),
            R"J(6 3 3 2.5 1 3 A C False)J");
  EXPECT_EQ(render(R"J({{ l|sort }} {{ l|sort(reverse=true) }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ msgs|sort(attribute='content')|map(attribute='content')|join }} {{ l|reverse|list }} {{ 'abc'|reverse }})J"),
            R"J([1, 2, 3] [3, 2, 1] ['A', 'a', 'b', 'C'] ['A', 'C', 'a', 'b'] byehiyo [2, 1, 3] cba)J");
  EXPECT_EQ(render(R"J({{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} {{ [1, 2, 3, 4, 5]|slice(2)|list }} {{ 'abc'|center(9) }}| {{ 'ab'|center(7) }}|)J"),
            R"J([[1, 2], [3, 4], [5]] [[1, 2], [3, 'x']] [[1, 2, 3], [4, 5]]    abc   |    ab  |)J");
  EXPECT_EQ(render(R"J({% for g in msgs|groupby('role') %}{{ g.grouper }}:{{ g.list|map(attribute='content')|join(',') }};{% endfor %} {% for role, items in msgs|groupby('role') %}{{ role }}{{ items|length }}{% endfor %})J"),
            R"J(assistant:yo;user:hi,bye; assistant1user2)J");
  EXPECT_EQ(render(R"J({{ 'foo bar baz qux'|truncate(9) }} {{ 'foo bar baz qux'|truncate(9, true) }} {{ 'foo bar baz qux'|truncate(11) }} {{ 'foo bar baz qux'|truncate(11, false, '...', 0) }})J"),
            R"J(foo... foo ba... foo bar baz qux foo bar...)J");
  EXPECT_EQ(render(R"J({{ '%s-%s'|format('a', 1) }} {{ '%(x)s'|format(x='kw') }} {{ d|attr('a') }} {{ d|attr('items') is defined }} {{ [1, 2]|list|length }} {{ msgs|map(attribute='role')|unique|list }})J"),
            R"J(a-1 kw  True 2 ['user', 'assistant'])J");
  EXPECT_EQ(render(R"J({% if msgs|selectattr('role', 'equalto', 'nobody') %}generator-truthy{% endif %} {% set it = [1, 2, 3]|select %}{{ it|list }}{{ it|list }} {{ u|list }} {{ u|string }}|{{ u|join }}|{{ u|first is defined }})J"),
            R"J(generator-truthy [1, 2, 3][] [] ||False)J");
}

TEST(Jinja, ToJson) {
  EXPECT_EQ(render("{{ {'b': [1, 2.5, none, true], 'a': 'é\"\\n\t'}|tojson }}"),
            R"J({"b": [1, 2.5, null, true], "a": "é\"\n\t"})J");
  EXPECT_EQ(render(R"J({{ {'a': [1, {'b': []}], 'c': {}}|tojson(indent=2) }}|{{ []|tojson(indent=2) }}|{{ [1]|tojson(indent=0) }})J"),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ],\n  \"c\": {}\n}|[]|[\n1\n]");
  EXPECT_EQ(render(R"J({{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ [1, 2]|tojson(separators=(',', ':')) }} {{ 'é'|tojson(ensure_ascii=true) }} {{ '😀'|tojson(ensure_ascii=true) }} {{ 1e100|tojson }} {{ (1, 'x')|tojson }} {{ {1: 2, none: 3, true: 4}|tojson }})J"),
            R"J({"a": 2, "b": 1} [1,2] "\u00e9" "\ud83d\ude00" 1e+100 [1, "x"] {"1": 4, "null": 3})J");
  EXPECT_EQ(render(R"J({{ msgs[0]|tojson }} {{ d|tojson(indent=4) }} {{ '<>&\''|tojson }} {{ '\u001f\u007f'|tojson }})J"),
            "{\"content\": \"hi\", \"role\": \"user\"} {\n    \"a\": 1,\n    \"b\": [\n        1,\n        2,\n        3\n    ]\n} \"<>&'\" \"\\u001f\x7f""\"");
}

TEST(Jinja, Methods) {
  EXPECT_EQ(render("[{{ '  a b  '.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '  a'.lstrip() }}] [{{ 'a\n\n'.rstrip() }}] [{{ 'abcba'.lstrip('ab') }}] [{{ 'abc'.rstrip('c') }}] [{{ '\xc2\xa0""x\xe3\x80\x80""'.strip() }}]"),
            R"J([a b] [a] [a] [a] [cba] [ab] [x])J");
  EXPECT_EQ(render(R"J({{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c  '.split(none, 1) }} {{ '  a b  c  '.rsplit(none, 1) }} {{ ''.split(',') }} {{ ''.split() }})J"),
            R"J(['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b  c  '] ['  a b', 'c'] [''] [])J");
  EXPECT_EQ(render(R"J({{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('lo') }} {{ 'hello'.endswith('l', 0, 3) }} {{ 'a.b'.upper() }} {{ 'A.B'.lower() }} {{ 'hello world'.title() }} {{ "they're".title() }} {{ 'hELLO'.capitalize() }} {{ 'aBc'.swapcase() }})J"),
            R"J(True True True True A.B a.b Hello World They'Re Hello AbC)J");
  EXPECT_EQ(render(R"J({{ 'banana'.replace('a', 'o') }} {{ 'banana'.replace('a', 'o', 1) }} {{ 'banana'.find('an') }} {{ 'banana'.rfind('an') }} {{ 'banana'.find('x') }} {{ 'banana'.index('n') }} {{ 'banana'.count('a') }} {{ 'héllo'.find('l') }})J"),
            R"J(bonono bonana 1 3 -1 2 3 2)J");
  EXPECT_EQ(render(R"J({{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='n') }} {{ '{:>5}|{:<4}|{:^6}|{:05.1f}|{:,}|{!r}'.format('ab', 'c', 'mid', 3.14159, 1234567, 'q') }} {{ '{:x} {:08.3f} {:+d} {:.2%}'.format(255, 2.5, 4, 0.125) }})J"),
            R"J(a, b 1 and x aba n!    ab|c   | mid  |003.1|1,234,567|'q' ff 0002.500 +4 12.50%)J");
  EXPECT_EQ(render("{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' \t'.isspace() }} {{ ''.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'a1'.isalnum() }} {{ 'a\nb\r\nc'.splitlines() }} {{ 'a\nb'.splitlines(true) }}"),
            R"J(True False True True False True True True ['a', 'b', 'c'] ['a\n', 'b'])J");
  EXPECT_EQ(render(R"J({{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ '-42'.zfill(6) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ [1, 2, 1].count(1) }} {{ [1, 2, 3].index(2) }} {{ (1, 2).index(2) }})J"),
            R"J(**ab** ab..   ab -00042 ('a', '=', 'b=c') ('a=b', '=', 'c') x 2 1 1)J");
}

TEST(Jinja, Globals) {
  EXPECT_EQ(render(R"J({{ range(3)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3)|length }} {{ dict(a=1, b='x') }} {{ dict({'z': 0}, y=1) }})J"),
            R"J([0, 1, 2] [2, 3, 4] [10, 7, 4, 1] [] 3 {'a': 1, 'b': 'x'} {'z': 0, 'y': 1})J");
  EXPECT_EQ(render(R"J({% set c = cycler('odd', 'even') %}{{ c.next() }} {{ c.next() }} {{ c.current }} {{ c.next() }}{% set j = joiner('|') %} {% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %})J"),
            R"J(odd even odd odd a|b|c)J");
  EXPECT_EQ(render(R"J({{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %B %Y, %A (%j) %b %a %I%p') }} [{{ strftime_now('%z%Z') }}])J"),
            R"J(2026-03-14 09:26:53 14 March 2026, Saturday (073) Mar Sat 09AM [])J");
}

TEST(Jinja, Generation) {
  EXPECT_EQ(render(R"J({% generation %}{% set x = 1 %}body{{ x }}{% endgeneration %}[{{ x }}])J"),
            R"J(body1[])J");
}

TEST(Jinja, UnknownNamesInsideIf) {
  EXPECT_EQ(render(R"J({% if false %}{{ x|nosuch }}{% elif false %}{{ 1 is nosuch }}{% endif %}{{ 1 if true else x|nosuch }}ok)J"),
            R"J(1ok)J");
}

TEST(Jinja, RuntimeErrors) {
  expect_error(R"J({{ u.x }})J", R"J('u' is undefined)J");
  expect_error(R"J({{ d.missing.x }})J", R"J('dict object' has no attribute 'missing')J");
  expect_error(R"J({{ 1 + 'a' }})J", R"J(unsupported operand type(s) for +: 'int' and 'str')J");
  expect_error(R"J({{ 'a' + 1 }})J", R"J(can only concatenate str (not "int") to str)J");
  expect_error(R"J({{ u + 1 }})J", R"J('u' is undefined)J");
  expect_error(R"J({{ 1 < 'a' }})J", R"J('<' not supported between instances of 'int' and 'str')J");
  expect_error(R"J({{ l.append(4) }})J", R"J(access to attribute 'append' of 'list' object is unsafe.)J");
  expect_error(R"J({{ d.update({}) }})J", R"J(access to attribute 'update' of 'dict' object is unsafe.)J");
  expect_error(R"J({{ 1 / 0 }})J", R"J(division by zero)J");
  expect_error(R"J({% for a, b in [1] %}{% endfor %})J", R"J(cannot unpack non-iterable int object)J");
  expect_error(R"J({% for a, b in ['abc'] %}{% endfor %})J", R"J(too many values to unpack (expected 2))J");
  expect_error(R"J({{ raise_exception('Only user and assistant roles are supported!') }})J", R"J(Only user and assistant roles are supported!)J");
  expect_error(R"J({% macro m(a) %}{% endmacro %}{{ m(1, 2) }})J", R"J(macro 'm' takes not more than 1 argument(s))J");
  expect_error(R"J({{ none|length }})J", R"J(object of type 'NoneType' has no len())J");
  expect_error(R"J({{ [1, 2]|select('odd')|length }})J", R"J(object of type 'generator' has no len())J");
  expect_error(R"J({{ u|tojson }})J", R"J(Object of type Undefined is not JSON serializable)J");
  expect_error(R"J({{ range(200000)|length }})J", R"J(Range too big)J");
  expect_error(R"J({% set x = 1 %}{% set x.y = 2 %})J", R"J(cannot assign attribute on non-namespace object)J");
  expect_error(R"J({{ 'abc'.index('z') }})J", R"J(substring not found)J");
  expect_error(R"J({{ 5() }})J", R"J('int' object is not callable)J");
  expect_error(R"J({% if true %}{{ x|nosuch }}{% endif %})J", R"J(line 1: unknown filter 'nosuch')J");
  expect_error(R"J({{ dict(u) }})J", R"J('u' is undefined)J");
}

TEST(Jinja, SyntaxErrors) {
  expect_error(R"J({{ x|nosuch }})J", R"J(line 1: unknown filter 'nosuch')J");
  expect_error("a\n\n{{ x is nosuch }}", R"J(line 3: unknown test 'nosuch')J");
  expect_error(R"J({% nosuch %})J", R"J(unknown tag 'nosuch')J");
  expect_error(R"J({% if false %}{% for i in [1] %}{{ x|nosuch }}{% endfor %}{% endif %})J", R"J(unknown filter 'nosuch')J");
  expect_error("{% if x %}\nopen", R"J(unexpected end of template)J");
  expect_error(R"J({{ 1 + }})J", R"J(line 1:)J");
  expect_error(R"J({% break %})J", R"J('break' outside of a loop)J");
  expect_error(R"J({{ 'unterminated }})J", R"J(string literal)J");
  expect_error(R"J({# never closed)J", R"J(Missing end of comment tag)J");
  expect_error(R"J({{ x ! y }})J", R"J(unexpected char '!')J");
  expect_error(R"J({% include 'x.jinja' %})J", R"J(unknown tag 'include')J");
}

TEST(Jinja, RecursiveLoops) {
  EXPECT_EQ(render("{% for m in [{'n': 1, 'kids': [{'n': 2, 'kids': [{'n': 3, 'kids': []}]}, {'n': 4, 'kids': []}]}] recursive %}"
                   "{{ loop.depth0 }}:{{ m.n }}{% if m.kids %}({{ loop(m.kids) }}){% endif %}{{ loop.index }}/{{ loop.length }} "
                   "{% endfor %}"),
            "0:1(1:2(2:31/1 )1/2 1:42/2 )1/1 ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 recursive %}{{ x }}@{{ loop.depth }}{% else %}none{% endfor %}|"
                   "{% for x in [[]] recursive %}[{{ loop(x) }}]{% else %}E{% endfor %}"),
            "2@13@1|[E]");
  expect_error("{% for x in [1] %}{{ loop([2]) }}{% endfor %}", "not callable");
  expect_error("{% for x in [[1]] recursive %}{{ loop(x) }}{{ loop(loop) }}{% endfor %}", "line 1");
}

TEST(Jinja, UrlXmlAndSizeFilters) {
  EXPECT_EQ(render("{{ 1 | filesizeformat }}|{{ 999 | filesizeformat }}|{{ 1000 | filesizeformat }}|"
                   "{{ 1048576 | filesizeformat(true) }}|{{ '2500000' | filesizeformat }}|{{ 1e30 | filesizeformat }}"),
            "1 Byte|999 Bytes|1.0 kB|1.0 MiB|2.5 MB|1000000.0 YB");
  EXPECT_EQ(render("{{ {'a b': 'c/d', 'x': 3} | urlencode }}|{{ [('k', 'v w')] | urlencode }}|{{ 'é/ ~&' | urlencode }}"),
            "a+b=c%2Fd&x=3|k=v+w|%C3%A9/%20~%26");
  EXPECT_EQ(render("<a{{ {'class': 'x<y', 'n': none, 'k': 3} | xmlattr }}>|{{ {'a': 1} | xmlattr(false) }}|[{{ {} | xmlattr }}]"),
            "<a class=\"x&lt;y\" k=\"3\">|a=\"1\"|[]");
  expect_error("{{ {'a b': 1} | xmlattr }}", "Invalid character in attribute name");
}

TEST(Jinja, ErrorsNameTheLine) {
  EXPECT_EQ(error_of([] { render("line 1\n{% if true %}\n  {{ 1 + none }}\n{% endif %}"); }),
            "[template] line 3: unsupported operand type(s) for +: 'int' and 'NoneType'");
  EXPECT_EQ(error_of([] { render("{% macro m() %}\n{{ raise_exception('inner') }}\n{% endmacro %}\n{{ m() }}"); }),
            "[template] line 2: inner");
}

TEST(Jinja, ValuesFromJson) {
  // Conversation JSON keeps its types: ints stay ints, floats print as Python floats.
  const json j = json::parse(R"({"i": 3, "f": 2.0, "big": 1e100, "s": "é", "t": true, "z": null, "a": [1, "x"]})");
  const jinja::Value v = jinja::from_json(j);
  EXPECT_EQ(jinja::repr(v), R"({'a': [1, 'x'], 'big': 1e+100, 'f': 2.0, 'i': 3, 's': 'é', 't': True, 'z': None})");
  EXPECT_EQ(jinja::dump_json(v, {}), R"({"a": [1, "x"], "big": 1e+100, "f": 2.0, "i": 3, "s": "é", "t": true, "z": null})");
}

// ---- render_chat_template: HF's variables and defaults ----

constexpr const char* kChatML =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(ChatTemplate, RendersMessagesWithHfDefaults) {
  const json conv = json::parse(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  EXPECT_EQ(toy::render_chat_template(kChatML, conv), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  json no_prompt = conv;
  no_prompt["add_generation_prompt"] = false;
  EXPECT_EQ(toy::render_chat_template(kChatML, no_prompt), "<|im_start|>user\nHi<|im_end|>\n");
  // bos_token / eos_token default to "", tools are absent unless given (and non-empty).
  EXPECT_EQ(toy::render_chat_template("[{{ bos_token }}|{{ eos_token }}|{{ tools is defined }}]", conv), "[||False]");
  json with = conv;
  with["bos_token"] = "<s>";
  with["eos_token"] = "</s>";
  with["tools"] = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(toy::render_chat_template("{{ bos_token }}{{ tools|tojson }}{{ eos_token }}", with),
            R"(<s>[{"function": {"name": "f"}, "type": "function"}]</s>)");
  // A request's own key order is kept (as HF keeps Python's dict order): ordered_json.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(
      R"({"messages": [], "tools": [{"type": "function", "function": {"name": "f", "description": "d"}}]})");
  EXPECT_EQ(toy::render_chat_template("{{ tools|tojson }}", ordered),
            R"([{"type": "function", "function": {"name": "f", "description": "d"}}])");
  with["tools"] = json::array();
  EXPECT_EQ(toy::render_chat_template("{{ tools is defined }}", with), "False");
}

TEST(ChatTemplate, StrftimeNowUsesTheConversationsClock) {
  json conv = json::parse(R"({"messages": [], "now": "2024-02-29T23:05:09"})");
  EXPECT_EQ(toy::render_chat_template("{{ strftime_now('%d %b %Y %H:%M:%S %A') }}", conv), "29 Feb 2024 23:05:09 Thursday");
  conv["now"] = "2024-02-30T00:00:00";
  EXPECT_NE(error_of([&] { toy::render_chat_template("x", conv); }).find("not a valid time"), std::string::npos);
  // Without "now", the local clock: at least the year's shape.
  EXPECT_EQ(toy::render_chat_template("{{ strftime_now('%Y')|length }}", json::parse(R"({"messages": []})")), "4");
}

TEST(ChatTemplate, GenerationBlocksRenderTheirBody) {
  const json conv = json::parse(R"({"messages": [{"role": "assistant", "content": "ok"}]})");
  EXPECT_EQ(toy::render_chat_template(
                "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}", conv),
            "ok");
}

TEST(ChatTemplate, RaiseExceptionCarriesTheTemplatesMessage) {
  const json conv = json::parse(R"({"messages": [{"role": "system", "content": "x"}]})");
  const std::string msg = error_of([&] {
    toy::render_chat_template("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}",
                              conv);
  });
  EXPECT_EQ(msg, "[template] line 1: System role not supported");
}

TEST(ChatTemplate, RefusesMalformedConversations) {
  EXPECT_NE(error_of([] { toy::render_chat_template("x", json::parse("[]")); }).find("JSON object"), std::string::npos);
  EXPECT_NE(error_of([] { toy::render_chat_template("x", json::parse("{}")); }).find("\"messages\""), std::string::npos);
  EXPECT_NE(error_of([] { toy::render_chat_template("x", json::parse(R"({"messages": [], "bos_token": 1})")); })
                .find("bos_token"),
            std::string::npos);
}

// ---- the `toy template` command ----

class TemplateCli : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const auto path = std::filesystem::path(::testing::TempDir()) / ("toy_template_" + std::to_string(getpid()) + name);
    std::ofstream(path, std::ios::binary) << text;
    files_.push_back(path);
    return path.string();
  }
  void TearDown() override {
    for (const auto& f : files_) std::filesystem::remove(f);
  }
  std::vector<std::filesystem::path> files_;
};

TEST_F(TemplateCli, PrintsTheRenderingExactly) {
  const std::string tmpl = write("a.jinja", std::string(kChatML) + "\n");
  const std::string conv = write("a.json", R"({"messages": [{"role": "user", "content": "héllo"}], "add_generation_prompt": false})");
  const auto r = toy::test::run_toy({"template", tmpl, conv});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nhéllo<|im_end|>\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(TemplateCli, ExitsOneWithTheTemplatesError) {
  const std::string tmpl = write("b.jinja", "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
  const std::string conv = write("b.json", R"({"messages": []})");
  const auto r = toy::test::run_toy({"template", tmpl, conv});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "toy: [template] line 1: Conversation roles must alternate user/assistant/user/assistant/...\n");
  const std::string bad_json = write("c.json", "{not json");
  const auto r2 = toy::test::run_toy({"template", tmpl, bad_json});
  EXPECT_EQ(r2.status, 1);
  EXPECT_NE(r2.err.find("not valid JSON"), std::string::npos) << r2.err;
}

// A render is bounded: a template that loops without end in practice, or builds an enormous
// string, stops with an error naming the line instead of hanging a server.
TEST(Jinja, RendersAreBounded) {
  expect_error("\n{% for i in range(2000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
               "line 2: the template runs more than 1000000 loop steps");
  expect_error("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               "longer than 64 MiB");
  expect_error("{{ 'x' * 100000000 }}", "repeated string too long");
}
