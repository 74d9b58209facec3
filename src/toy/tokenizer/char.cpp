// The char tokenizer: one id per distinct symbol of the training corpus, for character-level
// LMs (tinyshakespeare gives 65). No eos.
//
// Symbols are Unicode code points, read as UTF-8. A byte that does not start a well-formed
// UTF-8 sequence (stray continuation byte, overlong, surrogate, truncated sequence, ...) is
// a symbol of its own standing for that raw byte, so no corpus is rejected and decode gives
// back exactly the bytes that were encoded; replacing such bytes with U+FFFD would lose them.
// Ids follow the symbols' order: code points ascending, then raw bytes ascending.
// Encoding a symbol the corpus did not have throws, naming it and its byte position.
//
// GGUF: tokenizer.ggml.model = "toy-char" (llama.cpp refuses it, as it should: it has no
// such tokenizer), tokens = each character as UTF-8, or "<0xNN>" with token type 6 (byte)
// for a raw byte, the way SentencePiece vocabularies write byte tokens.
#include <algorithm>
#include <array>
#include <cstdio>
#include <unordered_map>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/internal.h"

namespace toy::tokenizer_detail {
namespace {

// Symbol keys: a code point, or kRawByte + b for the raw byte b (sorts after every cp).
constexpr uint32_t kRawByte = 0x110000;

uint32_t symbol_at(std::string_view s, size_t i, uint32_t* len) {
  const Utf8Step st = utf8_step(s, i);
  *len = st.len;
  return st.status == Utf8Status::ok ? st.cp : kRawByte + uint8_t(s[i]);
}

std::string symbol_bytes(uint32_t key) {
  if (key >= kRawByte) return std::string(1, char(key - kRawByte));
  std::string out;
  utf8_append(out, key);
  return out;
}

class CharTokenizer final : public PieceTokenizer {
 public:
  // `keys` sorted or not: ids are given in this order.
  explicit CharTokenizer(const std::vector<uint32_t>& keys) : keys_(keys) {
    ascii_.fill(-1);
    for (size_t id = 0; id < keys.size(); ++id) {
      pieces_.push_back(symbol_bytes(keys[id]));
      if (keys[id] < 128) ascii_[keys[id]] = int32_t(id);
      else id_of_.emplace(keys[id], int32_t(id));
    }
  }

  std::string kind() const override { return "char"; }
  int32_t eos_id() const override { return -1; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      uint32_t len;
      const uint32_t key = symbol_at(text, i, &len);
      int32_t id = -1;
      if (key < 128) {
        id = ascii_[key];
      } else if (auto it = id_of_.find(key); it != id_of_.end()) {
        id = it->second;
      }
      if (id < 0) unknown(key, i);
      ids.push_back(id);
      i += len;
    }
    return ids;
  }

  void save(gguf::Writer& w) const override {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (size_t id = 0; id < keys_.size(); ++id) {
      if (keys_[id] >= kRawByte) {
        tokens.push_back(fmt::format("<0x{:02X}>", keys_[id] - kRawByte));
        types.push_back(kTokenByte);
      } else {
        tokens.push_back(pieces_[id]);
        types.push_back(kTokenNormal);
      }
    }
    w.set("tokenizer.ggml.model", gguf::Value::str("toy-char"));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(std::move(tokens)));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(std::move(types)));
    w.set("toy.tokenizer.kind", gguf::Value::str("char"));
  }

 private:
  [[noreturn]] static void unknown(uint32_t key, size_t pos) {
    if (key >= kRawByte)
      fail("[tokenizer:char] encode: invalid UTF-8 byte {:#04x} at byte {} is not in the vocabulary", key - kRawByte,
           pos);
    // Control characters would garble the message; name them by code point only.
    const std::string shown = key < 0x20 || key == 0x7F ? std::string() : " '" + symbol_bytes(key) + "'";
    fail("[tokenizer:char] encode: character{} (U+{:04X}) at byte {} is not in the vocabulary", shown, key, pos);
  }

  std::vector<uint32_t> keys_;
  std::array<int32_t, 128> ascii_;  // the common case without hashing
  std::unordered_map<uint32_t, int32_t> id_of_;
};

}  // namespace

std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus) {
  TOY_CHECK(!corpus.empty(), "[tokenizer:char] cannot train on an empty corpus");
  // Each symbol is listed when first seen (no scan of all 1.1M code points afterwards).
  std::vector<bool> seen(kRawByte + 256, false);
  std::vector<uint32_t> keys;
  for (size_t i = 0; i < corpus.size();) {
    uint32_t len;
    const uint32_t k = symbol_at(corpus, i, &len);
    if (!seen[k]) {
      seen[k] = true;
      keys.push_back(k);
    }
    i += len;
  }
  std::sort(keys.begin(), keys.end());
  return std::make_unique<CharTokenizer>(keys);
}

std::unique_ptr<Tokenizer> load_char_tokenizer(const gguf::Reader& r) {
  const std::vector<std::string>& tokens = meta_str_array(r, "tokenizer.ggml.tokens");
  const std::vector<int32_t> types = meta_token_types(r, tokens.size());
  TOY_CHECK(!tokens.empty(), "[tokenizer:char] '{}': the vocabulary is empty", printable(r.path()));
  std::vector<uint32_t> keys;
  std::unordered_map<uint32_t, size_t> first;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    uint32_t key;
    if (types[id] == kTokenByte) {
      unsigned b = 0;
      TOY_CHECK(t.size() == 6 && t.starts_with("<0x") && t.ends_with(">") && std::sscanf(t.c_str(), "<0x%2X>", &b) == 1,
                "[tokenizer:char] '{}': byte token {} is '{}', expected '<0xNN>'", printable(r.path()), id, printable(t));
      key = kRawByte + b;
    } else {
      uint32_t len = 0;
      const bool one_char = !t.empty() && utf8_step(t, 0).status == Utf8Status::ok && utf8_step(t, 0).len == t.size();
      TOY_CHECK(one_char, "[tokenizer:char] '{}': token {} is not a single UTF-8 character", printable(r.path()), id);
      key = symbol_at(t, 0, &len);
    }
    const auto [it, fresh] = first.emplace(key, id);
    TOY_CHECK(fresh, "[tokenizer:char] '{}': tokens {} and {} are the same symbol", printable(r.path()), it->second, id);
    keys.push_back(key);
  }
  return std::make_unique<CharTokenizer>(keys);
}

}  // namespace toy::tokenizer_detail
