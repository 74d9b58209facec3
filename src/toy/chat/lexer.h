// Template text -> tokens, with jinja2's whitespace rules as Hugging Face configures them:
// trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs from the start of a line up to a block or comment tag are dropped), `-` on
// either side of a tag strips all whitespace on that side and `+` turns lstrip/trim off. Line
// endings become "\n" and one trailing newline of the template is dropped, as jinja2 does.
// Comments vanish here; {% raw %} bodies come out as text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace toy::jinja {

struct Token {
  enum class Type : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Type type;
  std::string text;  // Text: the data; Name/Op: the spelling; String: the unescaped value
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

std::vector<Token> tokenize(std::string_view source);

// "[template] line N: " — the prefix of every error the engine raises.
std::string where(int line);

}  // namespace toy::jinja
