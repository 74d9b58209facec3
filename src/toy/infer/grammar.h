// Constrained generation: a context-free grammar in llama.cpp's GBNF, and where a text stands
// in it. A GBNF text is rules `name ::= alternatives` with string literals "...", character
// classes [a-z0-9_] / [^"\\], `.`, rule references, groups ( ), repetition * + ? {m} {m,}
// {m,n}, `|`, comments from `#`; the rule `root` is the whole text. Parsing expands groups and
// repetitions into rules of their own, as llama.cpp does; left recursion is refused.
//
// GrammarMatcher follows a text byte by byte (UTF-8, a code point at a time; an unfinished
// code point is kept and checked for whether any completion could match) as the set of
// llama.cpp's stacks: each stack the elements still to match, innermost last.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace toy {

class Grammar {
 public:
  struct Elem {
    enum Kind : uint8_t { End, Rule, Chars } kind = End;
    bool negated = false;                           // Chars: any code point outside the ranges
    uint32_t rule = 0;                              // Rule
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // Chars: inclusive code point ranges
    bool matches(uint32_t cp) const;
    bool matches_any(uint32_t lo, uint32_t hi) const;  // some code point in [lo, hi]
  };
  using Alternative = std::vector<Elem>;  // ends with an End element

  // Throws toy::Error naming the line and column of a syntax error, an undefined rule, a rule
  // without `root`, or left recursion.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf);

  const std::vector<std::vector<Alternative>>& rules() const { return rules_; }
  uint32_t root() const { return root_; }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }

 private:
  std::vector<std::vector<Alternative>> rules_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
  friend class GrammarParser;
};

class GrammarMatcher {
 public:
  using Stack = std::vector<const Grammar::Elem*>;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);

  // Follows `bytes`; false (the matcher unchanged) when the grammar cannot continue so.
  bool accept(std::string_view bytes);
  // One byte at a time, for the token mask's walk of the vocabulary (true: still alive).
  bool accept_byte(uint8_t b);
  // A quick necessary check for accept_byte (no copy, no allocation): false means it would fail.
  bool may_accept_byte(uint8_t b) const;
  // The text so far is a whole sentence of the grammar (an end of text may come now).
  bool complete() const;
  // Nothing can follow (complete, and no stack with more to match).
  bool finished() const;
  // A key of the state (stacks and unfinished bytes): equal keys accept the same futures.
  std::string key() const;

 private:
  void expand(Stack& s, std::vector<Stack>& out, int depth) const;
  bool advance(uint32_t cp, std::vector<Stack>& next) const;
  bool partial_viable() const { return viable(pending_); }
  bool viable(std::string_view partial) const;  // an unfinished code point some stack could take

  std::shared_ptr<const Grammar> g_;
  std::vector<Stack> stacks_;
  std::string pending_;  // the bytes of an unfinished code point
};

}  // namespace toy
