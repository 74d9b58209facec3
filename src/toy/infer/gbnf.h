// Pieces for writing GBNF text (grammar.h) from code: literals, and text in which no marker
// occurs (a reasoning block up to its closing tag; a tool call's strings, which must not end
// the call early when its parser looks for the next marker).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace toy {

// A GBNF string literal of `text` ("" for an empty text).
std::string gbnf_literal(std::string_view text);

// What a text is made of: single code points (those `allows` accepts; `excluded` is the same set
// as the inside of a GBNF negated class, e.g. "\"\\\\\\x00-\\x1F") and, when `escape` is not empty,
// that GBNF expression (an escape sequence, which no marker's text is part of).
struct GbnfTextAlphabet {
  std::string excluded;
  std::function<bool(uint32_t)> allows = [](uint32_t) { return true; };
  std::string escape;
};

// Rules `name ::= ...` whose sentences are the texts of `alphabet` (any length, empty included)
// with none of `markers` anywhere in them: one rule per state of the markers' matching automaton
// (Aho-Corasick), named name-0, name-1, ...
std::string gbnf_text_without(const std::string& name, const std::vector<std::string>& markers,
                              const GbnfTextAlphabet& alphabet = {});
inline std::string gbnf_text_without(const std::string& name, std::string_view marker) {
  return gbnf_text_without(name, std::vector<std::string>{std::string(marker)});
}

// A GBNF class of one code point that begins none of `markers` and is in `alphabet` (for texts of
// bounded length, where the automaton cannot count: no marker can begin in them).
std::string gbnf_char_starting_no(const std::vector<std::string>& markers, const GbnfTextAlphabet& alphabet);

}  // namespace toy
