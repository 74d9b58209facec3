// Byte-level BPE as in GPT-2: the text is pre-split with GPT-2's regex, each piece starts as
// its bytes (every byte has a token, so any input, invalid UTF-8 included, encodes and
// decodes back exactly), and merges are applied inside a piece, lowest rank first (leftmost
// first among equal ranks) — the same procedure as llama.cpp's and Hugging Face's.
//
// Training ("bpe:N") learns N merges: count the corpus's distinct pieces, then repeatedly
// merge the most frequent adjacent pair (ties: smallest (left id, right id)), updating the
// pair counts from the words the merge touches only. Ids: 0..255 the bytes, 256.. the merges
// in rank order, then <|endoftext|> (eos). Training stops early when no pair is left (every
// piece already one token), so a small corpus can give fewer than N merges.
//
// Loading reads any GPT-2-style vocabulary (tokenizer.ggml.model "gpt2", pre "gpt-2"): ids,
// token text and merges as stored. Normal tokens (type 1) hold bytes_to_unicode text; other
// types (control, user-defined) hold their text as is; a normal token whose text is not
// byte-level text, or a merge whose parts or result are not tokens, makes the file malformed.
// Special tokens are never produced by encode (text is encoded as plain text, as llama.cpp
// does with parse_special = false).
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include <fmt/core.h>

#include "toy/tokenizer/internal.h"
#include "toy/tokenizer/pretokenizer.h"

namespace toy::tokenizer_detail {

void gpt2_split(std::string_view text, const std::function<void(std::string_view)>& piece) {
  PreTokenizer::get("gpt-2").split(text, piece);
}

// ---- the tokenizer ---------------------------------------------------------------------------

namespace {

inline uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

struct Merge {
  int32_t left, right, result;
};

// For unordered_map<std::string, ...> lookups by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class BpeTokenizer final : public PieceTokenizer {
 public:
  // pieces: id -> bytes; types: id -> token type; merges in rank order.
  BpeTokenizer(std::vector<std::string> pieces, std::vector<int32_t> types, std::vector<Merge> merges, int32_t bos,
               int32_t eos, const PreTokenizer& pre, bool add_bos)
      : types_(std::move(types)), merges_(std::move(merges)), bos_(bos), eos_(eos), pre_(&pre), add_bos_(add_bos) {
    pieces_ = std::move(pieces);
    // Whole pieces that are tokens, for pre-tokenizers that take them as they are.
    if (pre_->ignore_merges())
      for (size_t id = 0; id < pieces_.size(); ++id)
        if (types_[id] == kTokenNormal) whole_.emplace(pieces_[id], int32_t(id));
    byte_id_.fill(-1);
    // A byte's token is the normal token of that one byte (the first, if a vocabulary
    // repeats one). Missing bytes are reported when a text needs them.
    for (size_t id = pieces_.size(); id-- > 0;)
      if (types_[id] == kTokenNormal && pieces_[id].size() == 1) byte_id_[uint8_t(pieces_[id][0])] = int32_t(id);
    rank_.reserve(merges_.size());
    for (size_t r = 0; r < merges_.size(); ++r) rank_.emplace(pair_key(merges_[r].left, merges_[r].right), int32_t(r));
  }

  std::string kind() const override { return "bpe"; }
  int32_t eos_id() const override { return eos_; }
  int32_t bos_id() const override { return bos_; }
  bool adds_bos() const override { return add_bos_ && bos_ >= 0; }
  std::vector<int32_t> special_ids() const override {
    std::vector<int32_t> ids;
    for (size_t id = 0; id < types_.size(); ++id)
      if (types_[id] == kTokenControl || types_[id] == kTokenUserDefined) ids.push_back(int32_t(id));
    return ids;
  }
  std::vector<int32_t> control_ids() const override {
    std::vector<int32_t> ids;
    for (size_t id = 0; id < types_.size(); ++id)
      if (types_[id] == kTokenControl) ids.push_back(int32_t(id));
    return ids;
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 1);
    size_t offset = 0;
    pre_->split(text, [&](std::string_view piece) {
      encode_piece(piece, offset, ids);
      offset += piece.size();
    });
    return ids;
  }

  void save(gguf::Writer& w) const override {
    std::vector<std::string> tokens(pieces_.size());
    for (size_t id = 0; id < pieces_.size(); ++id) tokens[id] = text_of(int32_t(id));
    std::vector<std::string> merges;
    merges.reserve(merges_.size());
    for (const Merge& m : merges_) merges.push_back(text_of(m.left) + " " + text_of(m.right));
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::Value::str(pre_->name()));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(std::move(tokens)));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types_));
    w.set("tokenizer.ggml.merges", gguf::Value::str_array(std::move(merges)));
    if (bos_ >= 0) w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(uint32_t(bos_)));
    if (eos_ >= 0) w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(uint32_t(eos_)));
    // Always written: readers' defaults differ (llama.cpp's for a pre-tokenizer need not be
    // toy's), so a file that leaves it out can get a BOS in one and not the other.
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos_));
    w.set("toy.tokenizer.kind", gguf::Value::str("bpe"));
  }

 private:
  // GGUF text of a token: byte-level text for normal tokens, the text itself otherwise.
  std::string text_of(int32_t id) const {
    return types_[size_t(id)] == kTokenNormal ? gpt2_bytes_to_text(pieces_[size_t(id)]) : pieces_[size_t(id)];
  }

  // Appends the ids of one pre-split piece; `offset` (its byte position) is for errors.
  void encode_piece(std::string_view piece, size_t offset, std::vector<int32_t>& out) const {
    if (!whole_.empty()) {
      if (auto it = whole_.find(piece); it != whole_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    // Pieces repeat a lot in natural text ("the", " and"), so their ids are cached. Long
    // pieces (runs of spaces or symbols) are rare and would only bloat the cache.
    constexpr size_t kMaxCachedPiece = 64;
    const bool cacheable = piece.size() <= kMaxCachedPiece;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (auto it = cache_.find(piece); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge_piece(piece, offset, out);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      // A crude bound on memory: start over rather than track recency.
      if (cache_.size() >= (size_t(1) << 18)) cache_.clear();
      cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
    }
  }

  // Bytes -> ids, then merges by rank. Symbols form a linked list over the byte positions;
  // a min-heap holds candidate pairs by (rank, left position), and an entry whose symbols
  // have changed since it was pushed is skipped when popped. O(n log n) even for long
  // pieces, where rescanning for the best pair after every merge would be quadratic.
  void merge_piece(std::string_view piece, size_t offset, std::vector<int32_t>& out) const {
    const size_t n = piece.size();
    struct Sym {
      int32_t id, prev, next;
    };
    std::vector<Sym> sym(n);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t b = uint8_t(piece[i]);
      TOY_CHECK(byte_id_[b] >= 0, "[tokenizer:bpe] encode: byte {:#04x} at byte {} has no token in this vocabulary", b,
                offset + i);
      sym[i] = {byte_id_[b], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1};
    }
    struct Cand {
      int32_t rank, left;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::vector<Cand> heap;
    auto consider = [&](int32_t left) {
      const int32_t right = sym[size_t(left)].next;
      if (right < 0) return;
      if (auto it = rank_.find(pair_key(sym[size_t(left)].id, sym[size_t(right)].id)); it != rank_.end()) {
        heap.push_back({it->second, left});
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(int32_t(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Cand c = heap.back();
      heap.pop_back();
      Sym& l = sym[size_t(c.left)];
      const Merge& m = merges_[size_t(c.rank)];
      if (l.id != m.left || l.next < 0 || sym[size_t(l.next)].id != m.right) continue;  // stale
      Sym& r = sym[size_t(l.next)];
      l.id = m.result;
      l.next = r.next;
      if (r.next >= 0) sym[size_t(r.next)].prev = c.left;
      r.id = -1;  // dead: no merge has a left id of -1, so its stale entries fail the check
      if (l.prev >= 0) consider(l.prev);
      consider(c.left);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
  }

  std::vector<int32_t> types_;
  std::vector<Merge> merges_;
  std::unordered_map<uint64_t, int32_t> rank_;  // (left, right) -> rank
  std::array<int32_t, 256> byte_id_;
  int32_t bos_, eos_;
  const PreTokenizer* pre_;
  bool add_bos_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> whole_;  // ignore_merges

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

// ---- training --------------------------------------------------------------------------------

struct Word {
  std::vector<int32_t> sym;
  int64_t count;
};

// Most frequent pair first; among equal counts the smallest (left, right), which is the
// smallest key. Entries go stale when a count changes (a fresh one is pushed then) and are
// dropped when popped.
struct HeapEntry {
  int64_t count;
  uint64_t key;
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

class Trainer {
 public:
  Trainer(std::string_view corpus, const PreTokenizer& pre) {
    // Distinct pieces and their counts; the views point into the corpus, which outlives us.
    std::unordered_map<std::string_view, int64_t> counts;
    pre.split(corpus, [&](std::string_view piece) { ++counts[piece]; });
    // Sorted, so word indices (and everything after) do not depend on hash order.
    std::vector<std::pair<std::string_view, int64_t>> sorted(counts.begin(), counts.end());
    std::sort(sorted.begin(), sorted.end());
    words_.reserve(sorted.size());
    for (const auto& [piece, count] : sorted) {
      Word w{{}, count};
      w.sym.reserve(piece.size());
      for (char c : piece) w.sym.push_back(uint8_t(c));
      words_.push_back(std::move(w));
    }
    for (uint32_t wi = 0; wi < words_.size(); ++wi) {
      const Word& w = words_[wi];
      for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
        const uint64_t key = pair_key(w.sym[i], w.sym[i + 1]);
        pair_count_[key] += w.count;
        note_word(key, wi);
      }
    }
    for (const auto& [key, count] : pair_count_) heap_.push({count, key});
  }

  // The next merge (the new symbol gets id `result`); false when no pair is left.
  bool step(int32_t result, Merge* merge) {
    uint64_t key;
    for (;;) {
      if (heap_.empty()) return false;
      const HeapEntry top = heap_.top();
      heap_.pop();
      auto it = pair_count_.find(top.key);
      if (it != pair_count_.end() && it->second == top.count) {
        key = top.key;
        break;
      }
    }
    *merge = {int32_t(key >> 32), int32_t(key & 0xFFFFFFFFu), result};
    // The pair never occurs again once merged (new pairs involve the new id), so its word
    // list is consumed here. It may name words that lost the pair since; those find nothing.
    const std::vector<uint32_t> where = std::move(where_[key]);
    where_.erase(key);
    for (uint32_t wi : where) apply(wi, *merge);
    return true;
  }

 private:
  void note_word(uint64_t key, uint32_t wi) {
    std::vector<uint32_t>& list = where_[key];
    if (list.empty() || list.back() != wi) list.push_back(wi);
  }

  // Merges every (left, right) in word wi, leftmost first, and moves the counts of the pairs
  // that changed: the word's old pairs minus its new pairs, times the word's count.
  void apply(uint32_t wi, const Merge& m) {
    Word& w = words_[wi];
    std::vector<int32_t>& s = w.sym;
    size_t i = 0;
    while (i + 1 < s.size() && !(s[i] == m.left && s[i + 1] == m.right)) ++i;
    if (i + 1 >= s.size()) return;

    old_pairs_.clear();
    new_pairs_.clear();
    for (size_t k = 0; k + 1 < s.size(); ++k) old_pairs_.push_back(pair_key(s[k], s[k + 1]));
    size_t out = i;
    for (; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == m.left && s[i + 1] == m.right) {
        s[out++] = m.result;
        ++i;
      } else {
        s[out++] = s[i];
      }
    }
    s.resize(out);
    for (size_t k = 0; k + 1 < s.size(); ++k) new_pairs_.push_back(pair_key(s[k], s[k + 1]));

    // Sorted multiset difference: only pairs whose count in this word changed are touched.
    std::sort(old_pairs_.begin(), old_pairs_.end());
    std::sort(new_pairs_.begin(), new_pairs_.end());
    size_t a = 0, b = 0;
    while (a < old_pairs_.size() || b < new_pairs_.size()) {
      uint64_t key;
      int64_t delta = 0;
      if (b == new_pairs_.size() || (a < old_pairs_.size() && old_pairs_[a] < new_pairs_[b])) {
        key = old_pairs_[a];
      } else {
        key = new_pairs_[b];
      }
      for (; a < old_pairs_.size() && old_pairs_[a] == key; ++a) --delta;
      for (; b < new_pairs_.size() && new_pairs_[b] == key; ++b) ++delta;
      if (delta == 0) continue;
      int64_t& count = pair_count_[key];
      count += delta * w.count;
      if (delta > 0) note_word(key, wi);
      if (count > 0) {
        heap_.push({count, key});
      } else {
        pair_count_.erase(key);
      }
    }
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_count_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;  // pair -> words that had it
  std::priority_queue<HeapEntry> heap_;
  std::vector<uint64_t> old_pairs_, new_pairs_;  // scratch for apply()
};

// The 256 byte tokens, then up to n_merges merges learned from corpus (fewer when no pair
// repeats), each adding the token it makes.
struct LearnedVocab {
  std::vector<std::string> pieces;
  std::vector<int32_t> types;
  std::vector<Merge> merges;
};
LearnedVocab learn_merges(std::string_view corpus, const PreTokenizer& pre, int64_t n_merges) {
  LearnedVocab v;
  for (int b = 0; b < 256; ++b) {
    v.pieces.emplace_back(1, char(b));
    v.types.push_back(kTokenNormal);
  }
  Trainer trainer(corpus, pre);
  Merge m;
  while (int64_t(v.merges.size()) < n_merges && trainer.step(int32_t(v.pieces.size()), &m)) {
    v.merges.push_back(m);
    v.pieces.push_back(v.pieces[size_t(m.left)] + v.pieces[size_t(m.right)]);
    v.types.push_back(kTokenNormal);
  }
  return v;
}

}  // namespace

std::unique_ptr<Tokenizer> train_bpe_tokenizer(int64_t n_merges, std::string_view corpus, const std::string& pre_name) {
  const PreTokenizer& pre = PreTokenizer::get(pre_name);
  auto [pieces, types, merges] = learn_merges(corpus, pre, n_merges);
  const int32_t eos = int32_t(pieces.size());
  pieces.emplace_back(kEndOfText);
  types.push_back(kTokenControl);
  // A Llama-3-style vocabulary starts sequences with a BOS: <|endoftext|> serves as both.
  return std::make_unique<BpeTokenizer>(std::move(pieces), std::move(types), std::move(merges), eos, eos, pre,
                                        pre.adds_bos());
}

std::unique_ptr<Tokenizer> train_fixed_size_bpe(std::string_view corpus, const std::string& pre_name,
                                                int64_t vocab_size, const std::vector<std::string>& controls) {
  static constexpr std::string_view kChatTokens[] = {kEndOfText, "<|im_start|>", "<|im_end|>"};
  const int64_t n_chat = int64_t(std::size(kChatTokens)) + int64_t(controls.size());
  TOY_CHECK(vocab_size >= 256 + n_chat && vocab_size <= INT32_MAX,
            "[tokenizer:bpe] a vocabulary of {} tokens cannot hold the 256 bytes and {} chat tokens", vocab_size, n_chat);
  const PreTokenizer& pre = PreTokenizer::get(pre_name);
  auto [pieces, types, merges] = learn_merges(corpus, pre, vocab_size - n_chat - 256);
  const int32_t first_chat = int32_t(pieces.size());
  for (std::string_view t : kChatTokens) {
    pieces.emplace_back(t);
    types.push_back(kTokenControl);
  }
  for (const std::string& t : controls) {
    pieces.push_back(t);
    types.push_back(kTokenControl);
  }
  for (int64_t i = 0; int64_t(pieces.size()) < vocab_size; ++i) {
    pieces.push_back(fmt::format("<|ctrl_{}|>", i));
    types.push_back(kTokenControl);
  }
  // BOS <|endoftext|>, EOS <|im_end|> (a chat turn ends the reply), as Qwen's files have them.
  return std::make_unique<BpeTokenizer>(std::move(pieces), std::move(types), std::move(merges), first_chat,
                                        first_chat + 2, pre, pre.adds_bos());
}

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const gguf::Reader& r) {
  // No pre-tokenizer named: llama.cpp's "default" (it warns that quality suffers).
  const std::string pre_name = r.has("tokenizer.ggml.pre") ? meta_str(r, "tokenizer.ggml.pre") : "default";
  const PreTokenizer* pre = nullptr;
  try {
    pre = &PreTokenizer::get(pre_name);
  } catch (const Error& e) {
    fail("[tokenizer:bpe] '{}': {}", printable(r.path()), e.what());
  }
  const std::vector<std::string>& tokens = meta_str_array(r, "tokenizer.ggml.tokens");
  TOY_CHECK(!tokens.empty() && tokens.size() <= size_t(INT32_MAX), "[tokenizer:bpe] '{}': {} tokens", printable(r.path()),
            tokens.size());
  std::vector<int32_t> types = meta_token_types(r, tokens.size());

  std::vector<std::string> pieces(tokens.size());
  std::unordered_map<std::string_view, int32_t> id_of;  // token text -> first id with it
  id_of.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kTokenNormal) {
      std::optional<std::string> bytes = gpt2_text_to_bytes(tokens[id]);
      TOY_CHECK(bytes, "[tokenizer:bpe] '{}': normal token {} ('{}') is not byte-level (bytes_to_unicode) text",
                printable(r.path()), id, printable(tokens[id]));
      pieces[id] = std::move(*bytes);
    } else {
      pieces[id] = tokens[id];
    }
    id_of.emplace(tokens[id], int32_t(id));
  }

  const std::vector<std::string>& merge_text = meta_str_array(r, "tokenizer.ggml.merges");
  std::vector<Merge> merges;
  merges.reserve(merge_text.size());
  auto lookup = [&](std::string_view text, size_t rank, std::string_view what) {
    auto it = id_of.find(text);
    TOY_CHECK(it != id_of.end(), "[tokenizer:bpe] '{}': merge {} ('{}'): {} '{}' is not a token", printable(r.path()), rank,
              printable(merge_text[rank]), what, printable(text));
    return it->second;
  };
  for (size_t rank = 0; rank < merge_text.size(); ++rank) {
    const std::string& t = merge_text[rank];
    // Split at the first space after position 0, as llama.cpp does.
    const size_t sp = t.find(' ', 1);
    TOY_CHECK(sp != std::string::npos, "[tokenizer:bpe] '{}': merge {} ('{}') is not 'left right'", printable(r.path()), rank, printable(t));
    const std::string_view left(t.data(), sp), right(t.data() + sp + 1, t.size() - sp - 1);
    merges.push_back({lookup(left, rank, "left"), lookup(right, rank, "right"),
                      lookup(std::string(left) + std::string(right), rank, "the merged text")});
  }
  const int32_t bos = meta_token_id(r, "tokenizer.ggml.bos_token_id", tokens.size());
  const int32_t eos = meta_token_id(r, "tokenizer.ggml.eos_token_id", tokens.size());
  bool add_bos = pre->adds_bos();
  if (const gguf::Value* v = r.find("tokenizer.ggml.add_bos_token")) {
    TOY_CHECK(v->type == gguf::Type::BOOL, "[tokenizer:bpe] '{}': key 'tokenizer.ggml.add_bos_token' is {}, expected bool",
              printable(r.path()), gguf::type_name(v->type));
    add_bos = v->u != 0;
  }
  return std::make_unique<BpeTokenizer>(std::move(pieces), std::move(types), std::move(merges), bos, eos, *pre,
                                        add_bos);
}

}  // namespace toy::tokenizer_detail
