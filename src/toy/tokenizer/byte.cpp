// The byte tokenizer: id b (0..255) is the byte b, id 256 is <|endoftext|> (eos). Any byte
// string encodes, and decode gives it back exactly.
//
// GGUF: saved as a GPT-2-style byte-level BPE with zero merges (model "gpt2", pre "gpt-2",
// tokens = bytes_to_unicode text, <|endoftext|> as a control token, bos = eos = 256), so
// llama.cpp loads it and tokenizes exactly as toy does: with no merges every pre-split piece
// falls apart into its bytes. "toy.tokenizer.kind" = "byte" tells toy to rebuild this class.
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/internal.h"

namespace toy::tokenizer_detail {
namespace {

constexpr int32_t kEos = 256;

class ByteTokenizer final : public PieceTokenizer {
 public:
  ByteTokenizer() {
    for (int b = 0; b < 256; ++b) pieces_.emplace_back(1, char(b));
    pieces_.emplace_back(kEndOfText);
  }

  std::string kind() const override { return "byte"; }
  int32_t eos_id() const override { return kEos; }
  std::vector<int32_t> special_ids() const override { return {kEos}; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = uint8_t(text[i]);
    return ids;
  }

  void save(gguf::Writer& w) const override {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(gpt2_bytes_to_text(pieces_[size_t(b)]));
      types.push_back(kTokenNormal);
    }
    tokens.emplace_back(kEndOfText);
    types.push_back(kTokenControl);
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::Value::str("gpt-2"));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(std::move(tokens)));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(std::move(types)));
    w.set("tokenizer.ggml.merges", gguf::Value::str_array({}));
    w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(kEos));
    w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(kEos));
    w.set("toy.tokenizer.kind", gguf::Value::str("byte"));
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

// Nothing is read back but checked: a byte vocabulary is fixed, so any difference means the
// file is not what its kind key says.
std::unique_ptr<Tokenizer> load_byte_tokenizer(const gguf::Reader& r) {
  const std::vector<std::string>& tokens = meta_str_array(r, "tokenizer.ggml.tokens");
  TOY_CHECK(tokens.size() == 257, "[tokenizer:byte] '{}': expected 257 tokens, found {}", printable(r.path()), tokens.size());
  for (int b = 0; b < 256; ++b)
    TOY_CHECK(tokens[size_t(b)] == gpt2_bytes_to_text(std::string(1, char(b))),
              "[tokenizer:byte] '{}': token {} is '{}', expected the byte-level text of byte {:#04x}", printable(r.path()), b,
              printable(tokens[size_t(b)]), b);
  TOY_CHECK(tokens[256] == kEndOfText, "[tokenizer:byte] '{}': token 256 is '{}', expected '{}'", printable(r.path()),
            printable(tokens[256]), kEndOfText);
  if (const gguf::Value* m = r.find("tokenizer.ggml.merges"))
    TOY_CHECK(m->type == gguf::Type::ARRAY && m->as.empty(), "[tokenizer:byte] '{}': a byte vocabulary has no merges",
              printable(r.path()));
  const int32_t eos = meta_token_id(r, "tokenizer.ggml.eos_token_id", tokens.size());
  TOY_CHECK(eos == kEos, "[tokenizer:byte] '{}': eos id is {}, expected {}", printable(r.path()), eos, kEos);
  return make_byte_tokenizer();
}

}  // namespace toy::tokenizer_detail
