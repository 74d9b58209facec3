// JSON Schema -> GBNF (grammar.h), for structured output: a grammar whose sentences are the
// JSON texts the schema accepts. Supported: type (one or a list) object / array / string /
// number / integer / boolean / null; properties (written in the schema's order), required,
// additionalProperties (false, true or absent); items, minItems, maxItems; minLength,
// maxLength; enum, const; anyOf / oneOf; $ref to #/$defs/... or #/definitions/... (recursion
// allowed); integer minimum / maximum / exclusiveMinimum / exclusiveMaximum. Annotations
// (title, description, default, examples, $schema, $id, $comment, and format, which JSON Schema
// 2020-12 makes an annotation unless asserted) are ignored. Anything else
// is a toy::Error naming the keyword and where it is ("[json-schema] ... at /properties/x").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace toy {

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// How values are written: JSON, or Gemma 4's call arguments ({key:<|"|>text<|"|>,n:3}: keys
// bare and in sorted order, as its template writes them; strings between quote marks, unescaped).
struct JsonSpelling {
  bool gemma = false;
  std::string quote;       // gemma: the quote mark's text
  std::string quote_gbnf;  // gemma: how the grammar asks for it (its token <[id]>, or the text)
  // Texts no string may contain (a tool-call format's markers: its parser looks for the next one).
  std::vector<std::string> forbidden;
};

// Several schemas in one grammar (a tool call's grammar holds every tool's arguments).
class JsonSchemaRules {
 public:
  explicit JsonSchemaRules(JsonSpelling spelling = {});
  ~JsonSchemaRules();
  // The rule whose sentences are the values `schema` accepts (its rules named from `hint`);
  // throws toy::Error as json_schema_to_gbnf does.
  std::string add(const nlohmann::ordered_json& schema, const std::string& hint);
  // The rules added so far and the primitives they use (no `root`: the caller writes it; the
  // names it writes should have a '_', which these never do).
  std::string text() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};
// Any JSON object ({"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace toy
