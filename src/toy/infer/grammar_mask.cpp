#include "toy/infer/grammar_mask.h"

#include <algorithm>

#include "toy/tokenizer/tokenizer.h"

namespace toy {

GrammarVocab grammar_vocab(const Tokenizer& tok) {
  GrammarVocab v;
  v.size = tok.vocab_size();
  v.identity = &tok;
  v.id_of = [&tok](std::string_view text) -> int32_t {
    for (int32_t id : tok.special_ids())
      if (tok.token_bytes(id) == text) return id;
    const std::vector<int32_t> ids = tok.encode(text);
    return ids.size() == 1 ? ids[0] : -1;
  };
  return v;
}

TokenMasker::TokenMasker(const Tokenizer& tok) : vocab_(size_t(tok.vocab_size())) {
  std::vector<int32_t> specials = tok.special_ids();
  std::sort(specials.begin(), specials.end());
  nodes_.emplace_back();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (std::binary_search(specials.begin(), specials.end(), id)) continue;
    const std::string& bytes = tok.token_bytes(id);
    if (bytes.empty()) continue;
    int32_t at = 0;
    for (char c : bytes) {
      auto& kids = nodes_[size_t(at)].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == uint8_t(c); });
      if (it != kids.end()) {
        at = it->second;
      } else {
        const int32_t fresh = int32_t(nodes_.size());
        nodes_[size_t(at)].kids.emplace_back(uint8_t(c), fresh);
        nodes_.emplace_back();
        at = fresh;
      }
    }
    nodes_[size_t(at)].ends.push_back(id);
    horizon_ = std::max(horizon_, uint32_t(bytes.size()));
  }
}

int32_t TokenMasker::intern(States& st, GrammarMatcher m) const {
  // (states with equal keys accept the same next `horizon_` code points: more than a token has)
  auto [it, fresh] = st.ids.emplace(m.key(horizon_), int32_t(st.matcher.size()));
  if (fresh) {
    st.matcher.push_back(std::move(m));
    st.next.emplace_back();
    st.next.back().fill(-2);
  }
  return it->second;
}

int32_t TokenMasker::step(States& st, int32_t from, uint8_t byte) const {
  if (const int32_t known = st.next[size_t(from)][byte]; known != -2) return known;
  int32_t found = -1;
  if (st.matcher[size_t(from)].may_accept_byte(byte)) {  // most bytes die here, without a copy
    GrammarMatcher next = st.matcher[size_t(from)];
    if (next.accept_byte(byte)) found = intern(st, std::move(next));
  }
  st.next[size_t(from)][byte] = found;  // (intern may have grown st.next: no reference kept)
  return found;
}

void TokenMasker::walk(int32_t node, States& st, int32_t state, std::vector<uint8_t>& out) const {
  for (int32_t id : nodes_[size_t(node)].ends) out[size_t(id)] = 1;
  for (const auto& [byte, kid] : nodes_[size_t(node)].kids) {
    const int32_t next = step(st, state, byte);
    if (next >= 0) walk(kid, st, next, out);
  }
}

const std::vector<uint8_t>& TokenMasker::allowed(const GrammarMatcher& m, const std::shared_ptr<const Grammar>& g) {
  // Bounded memory: at most kMaxMasks masks (a byte per token each) over all grammars.
  if (masks_ >= kMaxMasks || (caches_.size() >= 16 && !caches_.count(g.get()))) caches_.clear(), masks_ = 0;
  Cache& c = caches_[g.get()];
  c.grammar = g;
  const std::string key = m.key(horizon_);
  auto it = c.masks.find(key);
  if (it != c.masks.end()) return it->second;
  std::vector<uint8_t> mask(vocab_, 0);
  if (c.states.matcher.size() > kMaxStates) c.states = States();
  walk(0, c.states, intern(c.states, m), mask);
  for (const Grammar::Elem* e : m.token_elements()) {
    if (!e->negated) {
      if (size_t(e->token) < vocab_) mask[size_t(e->token)] = 1;
      continue;
    }
    for (size_t id = 0; id < vocab_; ++id)
      if (int32_t(id) != e->token) mask[id] = 1;
  }
  ++masks_;
  return c.masks.emplace(key, std::move(mask)).first->second;
}

size_t TokenMasker::cached_states() const {
  size_t n = 0;
  for (const auto& [g, c] : caches_) n += c.masks.size();
  return n;
}

}  // namespace toy
