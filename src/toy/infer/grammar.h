// Constrained generation: a context-free grammar in llama.cpp's GBNF, and where a text stands
// in it. A GBNF text is rules `name ::= alternatives` with string literals "...", character
// classes [a-z0-9_] / [^"\\], `.`, rule references, groups ( ), repetition * + ? {m} {m,}
// {m,n}, `|`, comments from `#`; the rule `root` is the whole text. Parsing expands groups and
// repetitions into rules of their own, as llama.cpp does; left recursion is refused. Tokens, as
// llama.cpp writes them: `<[123]>` is the token of id 123, `<think>` the one token whose text
// that is, `!<[123]>` / `!<think>` any one token but that one. A token element matches a whole
// token at a token's start (how a chat format's special markers are asked for).
//
// GrammarMatcher follows a text byte by byte (UTF-8, a code point at a time; an unfinished
// code point is kept and checked for whether any completion could match) as the set of
// llama.cpp's stacks: each stack the elements still to match, innermost last.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace toy {

// The vocabulary token references resolve against. Empty (no id_of, size 0): a grammar with a
// token reference is an error.
struct GrammarVocab {
  std::function<int32_t(std::string_view)> id_of;  // the one token whose text is exactly this; -1: none
  int32_t size = 0;                                // ids are below it
  const void* identity = nullptr;                  // parse_cached keeps grammars of vocabularies apart
};

class Grammar {
 public:
  // Which rule, alternative and place an element is (for keys that do not depend on memory).
  struct Place {
    uint32_t rule = 0, alt = 0, index = 0;
  };
  struct Elem {
    enum Kind : uint8_t { End, Rule, Chars, Token } kind = End;
    bool negated = false;                           // Chars: any code point outside the ranges; Token: any other token
    uint32_t rule = 0;                              // Rule
    int32_t token = -1;                             // Token
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // Chars: inclusive code point ranges
    Place place;                                        // where it stands in the grammar
    bool matches(uint32_t cp) const;                   // (a Chars element; false for a Token)
    bool matches_any(uint32_t lo, uint32_t hi) const;  // some code point in [lo, hi]
    bool matches_token(int32_t id) const { return kind == Token && (id == token) != negated; }
  };
  using Alternative = std::vector<Elem>;  // ends with an End element

  // Throws toy::Error naming the line and column of a syntax error, an undefined rule, a rule
  // without `root`, left recursion, or a token reference `vocab` does not resolve.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, const GrammarVocab& vocab = {});
  // parse(), the same object for the same text while a few recent ones are kept (a server's
  // requests with one schema share its grammar, and so the token masks cached for it).
  static std::shared_ptr<const Grammar> parse_cached(std::string_view gbnf, const GrammarVocab& vocab = {});

  const std::vector<std::vector<Alternative>>& rules() const { return rules_; }
  // A bounded repetition x{m,n} becomes a chain of rules, one per repetition still allowed:
  // the chain's id and how many remain (0 for a rule of no chain). Masks use it to see that
  // two places in a long chain accept the same tokens (see GrammarMatcher::key).
  struct Chain {
    uint32_t id = 0;
    uint32_t remaining = 0;
  };
  const std::vector<Chain>& chains() const { return chains_; }
  uint32_t root() const { return root_; }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }

 private:
  std::vector<std::vector<Alternative>> rules_;
  std::vector<std::string> names_;
  std::vector<Chain> chains_;
  uint32_t root_ = 0;
  friend class GrammarParser;
};

class GrammarMatcher {
 public:
  using Stack = std::vector<const Grammar::Elem*>;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);

  // Follows `bytes`; false (the matcher unchanged) when the grammar cannot continue so.
  bool accept(std::string_view bytes);
  // Follows one token: as a token element (`<[id]>`, `!<...>`) at a token's start, or, unless it
  // is `special` (control and user-defined tokens are never text here), as its bytes. False (the
  // matcher unchanged) when neither continues the grammar.
  bool accept_token(int32_t id, std::string_view bytes, bool special);
  // The token elements some stack waits on (at a token's start: nothing half-matched).
  std::vector<const Grammar::Elem*> token_elements() const;
  // One byte at a time, for the token mask's walk of the vocabulary (true: still alive).
  bool accept_byte(uint8_t b);
  // A quick necessary check for accept_byte (no copy, no allocation): false means it would fail.
  bool may_accept_byte(uint8_t b) const;
  // The text so far is a whole sentence of the grammar (an end of text may come now).
  bool complete() const;
  // Nothing can follow (complete, and no stack with more to match).
  bool finished() const;
  // A key of the state (stacks and unfinished bytes): equal keys accept the same next tokens of
  // up to `horizon` code points (places deeper than that in a repetition chain are alike).
  std::string key(uint32_t horizon = UINT32_MAX) const;

 private:
  // The stacks `s` stands for, each with a code point or token element on top (or empty), into
  // `out`; s is left as it came.
  void expand(Stack& s, std::vector<Stack>& out, int depth) const;
  // The element on top of `s` matched: the stack goes on after it (expanded into `out`).
  void step_past_top(const Stack& s, std::vector<Stack>& out) const;
  bool advance(uint32_t cp, std::vector<Stack>& next) const;
  bool partial_viable() const { return viable(pending_); }
  bool viable(std::string_view partial) const;  // an unfinished code point some stack could take

  std::shared_ptr<const Grammar> g_;
  std::vector<Stack> stacks_;
  std::string pending_;  // the bytes of an unfinished code point
};

}  // namespace toy
