// JSON Schema -> GBNF (grammar.h), for structured output: a grammar whose sentences are the
// JSON texts the schema accepts. Supported: type (one or a list) object / array / string /
// number / integer / boolean / null; properties (written in the schema's order), required,
// additionalProperties (false, true or absent); items, minItems, maxItems; minLength,
// maxLength; enum, const; anyOf / oneOf; $ref to #/$defs/... or #/definitions/... (recursion
// allowed); integer minimum / maximum / exclusiveMinimum / exclusiveMaximum. Annotations
// (title, description, default, examples, $schema, $id, $comment) are ignored. Anything else
// is a toy::Error naming the keyword and where it is ("[json-schema] ... at /properties/x").
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace toy {

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// Any JSON object ({"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace toy
