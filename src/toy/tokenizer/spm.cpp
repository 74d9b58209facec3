// SentencePiece-style vocabularies as llama.cpp reads them (tokenizer.ggml.model "llama":
// Llama 2, TinyLlama, Mistral ...): each token has a score; a text is prefixed with a space
// (add_space_prefix), its spaces become U+2581 "▁", it starts as one symbol per UTF-8
// character, and the adjacent pair whose joined text is a token with the highest score
// (leftmost among equals) merges, until none is left. A symbol that is not a token is
// re-split along the merges that built it, down to characters, and a character with no token
// falls back to its bytes' tokens "<0xNN>".
#include <algorithm>
#include <array>
#include <cstdio>
#include <queue>
#include <unordered_map>

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/internal.h"

namespace toy::tokenizer_detail {

namespace {

constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's visible space

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    out.append(s.substr(pos, hit == std::string_view::npos ? std::string_view::npos : hit - pos));
    if (hit == std::string_view::npos) return out;
    out.append(to);
    pos = hit + from.size();
  }
}

class SpmTokenizer final : public PieceTokenizer {
 public:
  SpmTokenizer(std::vector<std::string> texts, std::vector<float> scores, std::vector<int32_t> types, int32_t bos,
               int32_t eos, int32_t unk, bool add_bos, bool add_space_prefix)
      : texts_(std::move(texts)), scores_(std::move(scores)), types_(std::move(types)), bos_(bos), eos_(eos),
        unk_(unk), add_bos_(add_bos), add_space_prefix_(add_space_prefix) {
    pieces_.resize(texts_.size());
    for (size_t id = 0; id < texts_.size(); ++id) {
      const std::string& t = texts_[id];
      unsigned b = 0;
      if (types_[id] == kTokenByte && t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>", &b) == 1)
        pieces_[id] = std::string(1, char(b));
      else
        pieces_[id] = replace_all(t, kSpace, " ");
      // The first id of each text (llama.cpp's text_to_token keeps the first as well).
      id_of_.emplace(t, int32_t(id));
    }
    // Byte fallback by text, "<0x0A>", as llama.cpp looks it up.
    byte_id_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (auto it = id_of_.find(fmt::format("<0x{:02X}>", b)); it != id_of_.end()) byte_id_[size_t(b)] = it->second;
  }

  std::string kind() const override { return "spm"; }
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

  std::vector<int32_t> encode(std::string_view raw) const override {
    std::vector<int32_t> out;
    if (raw.empty()) return out;
    const std::string text = replace_all((add_space_prefix_ ? " " : "") + std::string(raw), " ", kSpace);
    // Symbols: one per UTF-8 character (an invalid byte is a symbol of its own), linked.
    struct Symbol {
      int32_t prev, next;
      size_t start, len;
    };
    std::vector<Symbol> sym;
    for (size_t i = 0; i < text.size();) {
      const Utf8Step st = utf8_step(text, i);
      const size_t len = st.status == Utf8Status::ok ? st.len : 1;
      sym.push_back({int32_t(sym.size()) - 1, int32_t(sym.size()) + 1, i, len});
      i += len;
    }
    sym.back().next = -1;
    struct Bigram {
      int32_t left, right;
      float score;
      size_t len;
    };
    auto worse = [](const Bigram& a, const Bigram& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
    auto try_pair = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0) return;
      auto it = id_of_.find(text.substr(sym[size_t(l)].start, sym[size_t(l)].len + sym[size_t(r)].len));
      if (it != id_of_.end()) queue.push({l, r, scores_[size_t(it->second)], sym[size_t(l)].len + sym[size_t(r)].len});
    };
    for (size_t i = 1; i < sym.size(); ++i) try_pair(int32_t(i - 1), int32_t(i));
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[size_t(b.left)];
      Symbol& r = sym[size_t(b.right)];
      // Stale: one side was merged away since the pair was queued.
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[size_t(r.next)].prev = b.left;
      try_pair(l.prev, b.left);
      try_pair(b.left, l.next);
    }
    // Each final symbol is a token (only pairs that are tokens merge), or a single character
    // the vocabulary lacks: its bytes' tokens then.
    auto emit = [&](size_t start, size_t len) {
      const std::string s = text.substr(start, len);
      if (auto it = id_of_.find(s); it != id_of_.end()) {
        out.push_back(it->second);
        return;
      }
      for (unsigned char c : s) {
        TOY_CHECK(byte_id_[c] >= 0 || unk_ >= 0, "[tokenizer:spm] encode: byte {:#04x} has no token", c);
        out.push_back(byte_id_[c] >= 0 ? byte_id_[c] : unk_);
      }
    };
    for (int32_t i = 0; i >= 0 && size_t(i) < sym.size(); i = sym[size_t(i)].next)
      if (sym[size_t(i)].len) emit(sym[size_t(i)].start, sym[size_t(i)].len);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string s = PieceTokenizer::decode(ids);
    // The space encode put in front of the text is not part of it.
    if (add_space_prefix_ && !ids.empty() && !s.empty() && s[0] == ' ' && types_[size_t(ids[0])] == kTokenNormal)
      s.erase(0, 1);
    return s;
  }

  void save(gguf::Writer& w) const override {
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(texts_));
    w.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores_));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types_));
    if (bos_ >= 0) w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(uint32_t(bos_)));
    if (eos_ >= 0) w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(uint32_t(eos_)));
    if (unk_ >= 0) w.set("tokenizer.ggml.unknown_token_id", gguf::Value::u32(uint32_t(unk_)));
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos_));
    w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(add_space_prefix_));
  }

 private:
  std::vector<std::string> texts_;  // as stored (with ▁)
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> id_of_;
  std::array<int32_t, 256> byte_id_;
  int32_t bos_, eos_, unk_;
  bool add_bos_, add_space_prefix_;
};

bool meta_bool(const gguf::Reader& r, const std::string& key, bool fallback) {
  const gguf::Value* v = r.find(key);
  if (!v) return fallback;
  TOY_CHECK(v->type == gguf::Type::BOOL, "[tokenizer:spm] '{}': key '{}' is {}, expected bool", printable(r.path()),
            key, gguf::type_name(v->type));
  return v->u != 0;
}

}  // namespace

std::unique_ptr<Tokenizer> load_spm_tokenizer(const gguf::Reader& r) {
  const std::string shown = printable(r.path());
  const std::vector<std::string>& tokens = meta_str_array(r, "tokenizer.ggml.tokens");
  TOY_CHECK(!tokens.empty() && tokens.size() <= size_t(INT32_MAX), "[tokenizer:spm] '{}': {} tokens", shown,
            tokens.size());
  std::vector<int32_t> types = meta_token_types(r, tokens.size());
  std::vector<float> scores(tokens.size(), 0.0f);
  if (const gguf::Value* v = r.find("tokenizer.ggml.scores")) {
    TOY_CHECK(v->type == gguf::Type::ARRAY && v->elem == gguf::Type::F32 && v->af.size() == tokens.size(),
              "[tokenizer:spm] '{}': key 'tokenizer.ggml.scores' must be {} f32 values", shown, tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) scores[i] = float(v->af[i]);
  }
  const int32_t bos = meta_token_id(r, "tokenizer.ggml.bos_token_id", tokens.size());
  const int32_t eos = meta_token_id(r, "tokenizer.ggml.eos_token_id", tokens.size());
  const int32_t unk = meta_token_id(r, "tokenizer.ggml.unknown_token_id", tokens.size());
  return std::make_unique<SpmTokenizer>(tokens, std::move(scores), std::move(types), bos, eos, unk,
                                        meta_bool(r, "tokenizer.ggml.add_bos_token", true),
                                        meta_bool(r, "tokenizer.ggml.add_space_prefix", true));
}

}  // namespace toy::tokenizer_detail
