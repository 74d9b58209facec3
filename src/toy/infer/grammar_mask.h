// Which tokens a grammar allows next: a walk of the vocabulary's byte trie, each branch
// followed in the grammar until it dies, so a token is checked in full (multi-byte and
// partial UTF-8 included) and tokens sharing a prefix share the work. Masks are cached per
// grammar state: a JSON string's inside, or a number's digits, repeat states again and again.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "toy/infer/grammar.h"

namespace toy {

class Tokenizer;

// A tokenizer as the vocabulary of grammar token references: `<text>` is the special token of
// that text, or else the text when it encodes to exactly one token.
GrammarVocab grammar_vocab(const Tokenizer& tok);

class TokenMasker {
 public:
  explicit TokenMasker(const Tokenizer& tok);
  // allowed[id] = 1 when token `id` continues the matcher's text within grammar `g` (the
  // matcher's): by its bytes, or as a token element the grammar waits on. Special tokens only
  // as token elements; an end-of-generation token may be among them (the caller decides about
  // the end).
  const std::vector<uint8_t>& allowed(const GrammarMatcher& m, const std::shared_ptr<const Grammar>& g);
  size_t cached_states() const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    std::vector<int32_t> ends;  // tokens whose bytes end here
  };
  // Grammar states met in walks, interned by their keys, with their byte transitions (-2 not
  // yet known, -1 refused): the inside of a string is one state whatever its characters, so a
  // walk computes each transition once instead of once per trie branch.
  struct States {
    std::vector<GrammarMatcher> matcher;
    std::vector<std::array<int32_t, 256>> next;
    std::unordered_map<std::string, int32_t> ids;
  };
  int32_t intern(States& st, GrammarMatcher m) const;
  int32_t step(States& st, int32_t from, uint8_t byte) const;
  void walk(int32_t node, States& st, int32_t state, std::vector<uint8_t>& out) const;

  std::vector<Node> nodes_;
  size_t vocab_ = 0;
  uint32_t horizon_ = 0;  // the longest token, in bytes (>= its code points)
  struct Cache {
    std::shared_ptr<const Grammar> grammar;  // kept alive: the keys hold its addresses
    std::unordered_map<std::string, std::vector<uint8_t>> masks;
    States states;
  };
  static constexpr size_t kMaxStates = 20000;  // per grammar (each ~1 KB of transitions)
  std::map<const Grammar*, Cache> caches_;
  static constexpr size_t kMaxMasks = 256;  // ~13 MB for a 50k vocabulary
  size_t masks_ = 0;
};

}  // namespace toy
