// Grammars (toy/infer/grammar.h) and JSON Schema compiled to them (json_schema.h): what a
// grammar accepts byte by byte, what it refuses, and that a schema's grammar accepts exactly
// the JSON texts the schema does (checked on hand-written instances both ways).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "toy/core/error.h"
#include "toy/infer/grammar.h"
#include "toy/infer/json_schema.h"

using namespace toy;
using Json = nlohmann::ordered_json;

namespace {

// Whether the grammar accepts exactly `text` (a whole sentence).
bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.complete();
}

bool schema_accepts(const std::string& schema, const std::string& text) {
  return accepts(Grammar::parse(json_schema_to_gbnf(Json::parse(schema))), text);
}

}  // namespace

TEST(Grammar, GbnfLiteralsClassesRepetitionsAndGroups) {
  const auto g = Grammar::parse(R"(
    root ::= greeting (", " name){1,2} "!"?   # a comment
    greeting ::= "hi" | "hello"
    name ::= [A-Z] [a-z]* | "\u00e9t\xE9"
  )");
  EXPECT_TRUE(accepts(g, "hi, Bob"));
  EXPECT_TRUE(accepts(g, "hello, Ann, Zed!"));
  EXPECT_TRUE(accepts(g, "hi, \xc3\xa9t\xc3\xa9"));  // étè as UTF-8
  EXPECT_FALSE(accepts(g, "hi"));
  EXPECT_FALSE(accepts(g, "hi, Ann, Bob, Cy"));
  EXPECT_FALSE(accepts(g, "hi, bob"));
  // Byte by byte: a prefix is alive but not complete; a wrong byte is refused and changes nothing.
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept("hel"));
  EXPECT_FALSE(m.complete());
  EXPECT_FALSE(m.accept("x"));
  EXPECT_TRUE(m.accept("lo, A"));
  EXPECT_TRUE(m.complete());
  // Half a UTF-8 character is alive when some completion matches, refused when none can.
  GrammarMatcher u(Grammar::parse(R"(root ::= [a-z] "\u00e9")"));
  EXPECT_TRUE(u.accept("a\xc3"));
  EXPECT_FALSE(u.complete());
  EXPECT_FALSE(GrammarMatcher(u).accept("\xa8"));  // è, not é
  EXPECT_TRUE(u.accept("\xa9"));
  EXPECT_TRUE(u.complete());
  // Overlong and surrogate forms are not characters: "[" spelt in four bytes is refused.
  GrammarMatcher b(Grammar::parse(R"(root ::= "[")"));
  EXPECT_FALSE(GrammarMatcher(b).accept("\xf0"));
  EXPECT_FALSE(GrammarMatcher(b).accept("\xc1\x9b"));
  EXPECT_FALSE(GrammarMatcher(Grammar::parse("root ::= [^a]")).accept("\xed\xa0\x80"));
  GrammarMatcher n(Grammar::parse(R"(root ::= [^"\\] "x")"));
  EXPECT_FALSE(n.accept("\""));
  EXPECT_TRUE(n.accept("\xe4\xb8\xad" "x"));  // 中 is not excluded
}

TEST(Grammar, BadGrammarsNameTheLine) {
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"root ::= \"a", "unterminated string"},
           {"root ::= [a-", "unterminated character class"},
           {"root ::= x", "'x' is used but not defined"},
           {"start ::= \"a\"", "no rule 'root'"},
           {"root ::= root \"a\" | \"b\"", "left-recursive"},
           {"root ::= \"a\"\nroot ::= \"b\"", "line 2"},
           {"root ::= (\"a\"", "expected ')'"},
           {"root ::= \"a\"{3,1}", "minimum is above"},
           {"root ::= * \"a\"", "repeats nothing"},
           {"root ::= \"abcdefghijklmnopqrstu\"{60000}", "grows past 1000000 elements"}}) {
    const std::string gbnf = text;  // (clang 14 cannot capture a structured binding)
    const std::string e = test::error_of([&] { Grammar::parse(gbnf); });
    EXPECT_NE(e.find(says), std::string::npos) << text << ": " << e;
  }
}

// A repetition of something that can be empty would expand without end: refused up front.
TEST(Grammar, EndlessExpansionIsAnError) {
  const std::string e = test::error_of([] { Grammar::parse("root ::= (\"a\"?)* \"b\""); });
  EXPECT_NE(e.find("left-recursive"), std::string::npos) << e;
  // Groups are rules, so nesting repetitions does not multiply the grammar.
  EXPECT_NO_THROW(Grammar::parse("root ::= (\"a\"{1000}){1000}"));
}

TEST(JsonSchema, GrammarsAcceptWhatTheSchemaAccepts) {
  const std::string person = R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 5},
      "age": {"type": "integer", "minimum": 18, "maximum": 130},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "ok": {"type": "boolean"}},
    "required": ["name", "age"], "additionalProperties": false})";
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 30})"));
  EXPECT_TRUE(schema_accepts(person, R"({"name":"Ann","age":130,"tags":["a","b"],"ok":true})"));
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 18, "ok": false})"));
  EXPECT_FALSE(schema_accepts(person, R"({"age": 30, "name": "Ann"})")) << "properties in the schema's order";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann"})")) << "required";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "", "age": 30})")) << "minLength";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Annabel", "age": 30})")) << "maxLength";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 17})")) << "minimum";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 131})")) << "maximum";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 30, "tags": ["c"]})")) << "enum";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 30, "tags": ["a", "a", "b"]})")) << "maxItems";
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 30, "x": 1})")) << "additionalProperties";
  // Integer ranges across digit counts and signs.
  const std::string range = R"({"type": "integer", "minimum": -12, "maximum": 107})";
  for (int v = -20; v <= 120; ++v)
    EXPECT_EQ(schema_accepts(range, std::to_string(v)), v >= -12 && v <= 107) << v;
  EXPECT_FALSE(schema_accepts(range, "-0"));
  EXPECT_FALSE(schema_accepts(range, "007"));
  const std::string at_least = R"({"type": "integer", "exclusiveMinimum": 99})";
  EXPECT_FALSE(schema_accepts(at_least, "99"));
  EXPECT_TRUE(schema_accepts(at_least, "100"));
  EXPECT_TRUE(schema_accepts(at_least, "123456789"));
  // $ref, recursion, anyOf, const, null; extras allowed when additionalProperties is absent.
  const std::string tree = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"anyOf": [{"type": "integer"}, {"const": "x"}, {"type": "null"}]},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}})";
  EXPECT_TRUE(schema_accepts(tree, R"({"v": 1, "kids": [{"v": "x"}, {"v": null, "kids": []}]})"));
  EXPECT_TRUE(schema_accepts(tree, R"({"v": 1, "extra": {"any": [1, 2.5e3]}})"));
  EXPECT_FALSE(schema_accepts(tree, R"({"v": "y"})"));
  EXPECT_TRUE(accepts(Grammar::parse(json_object_gbnf()), R"({"a": [1, {"b": null}], "c": "\u00e9\n"})"));
  EXPECT_FALSE(accepts(Grammar::parse(json_object_gbnf()), R"([1])"));
}

// Whatever the JSON grammar accepts, a JSON parser reads: no lone surrogate escape, no number
// past a double's range (both found by random walks: a reply that never parsed).
TEST(JsonSchema, EveryTextTheJsonGrammarTakesParses) {
  const auto any = Grammar::parse(json_object_gbnf());
  EXPECT_TRUE(accepts(any, R"({"a": "\ud83d\ude00 \u00e9 \/"})"));
  EXPECT_FALSE(accepts(any, R"({"a": "\udead"})")) << "a lone low surrogate";
  EXPECT_FALSE(accepts(any, R"({"a": "\ud83d"})")) << "a high surrogate without its pair";
  EXPECT_FALSE(accepts(any, R"({"a": "\ud83d\u0041"})"));
  EXPECT_TRUE(accepts(any, R"({"a": 1.5e99})"));
  EXPECT_FALSE(accepts(any, R"({"a": 32e462})")) << "overflows a double";
  // A code point's bytes that can only become a surrogate (ED A0..BF) are refused at once.
  GrammarMatcher m(any);
  ASSERT_TRUE(m.accept("{\"a\": \""));
  EXPECT_TRUE(GrammarMatcher(m).accept("\xED\x9F"));
  EXPECT_FALSE(GrammarMatcher(m).accept("\xED\xA3"));
  EXPECT_FALSE(m.may_accept_byte(0xED) && GrammarMatcher(m).accept_byte(0xED) && [&] {
    GrammarMatcher t(m);
    t.accept_byte(0xED);
    return t.may_accept_byte(0xA3) && t.accept_byte(0xA3);
  }());
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  for (const auto& [schema, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "string", "pattern": "^a"})", "'pattern' is not supported (at /)"},
           {R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}})",
            "'pattern' is not supported (at /properties/a)"},
           {R"({"allOf": [{}]})", "'allOf'"},
           {R"({"type": "number", "minimum": 1})", "only on integers"},
           {R"({"$ref": "#/$defs/missing"})", "does not name a definition"},
           {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer lies between"},
           {R"({"type": "widget"})", "unknown type 'widget'"},
           {R"({"type": "integer", "minimum": 1e300})", "'minimum' must be an integer"},
           {R"({"type": "integer", "exclusiveMaximum": 9223372036854775807})", "beyond 15 digits"},
           {R"({"type": "array", "maxItems": 2.5})", "'maxItems' must be an integer"},
           {R"({"type": "object", "properties": {"a": true}, "required": [1]})", "'required' must list property names"}}) {
    const std::string spec = schema;  // (clang 14 cannot capture a structured binding)
    const std::string e = test::error_of([&] { json_schema_to_gbnf(Json::parse(spec)); });
    EXPECT_NE(e.find(says), std::string::npos) << schema << ": " << e;
  }
  // 'format' is an annotation (JSON Schema 2020-12, unless a format-assertion vocabulary is asked for).
  EXPECT_NO_THROW(json_schema_to_gbnf(Json::parse(R"({"type": "string", "format": "date-time"})")));
}
