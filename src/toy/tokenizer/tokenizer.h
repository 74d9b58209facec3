// Tokenizers: text <-> token ids. Three kinds train from a corpus:
//   byte   — 256 ids, one per byte (plus <|endoftext|>); any input encodes.
//   char   — one id per distinct Unicode code point of the corpus (sorted), for char-level LMs.
//   bpe    — byte-level BPE with a pre-split regex (GPT-2's by default, or Llama 3's, Qwen2's,
//            SmolLM's: "bpe:N:PRE"), N merges learned from the corpus; stored the way
//            llama.cpp reads GPT-2-style vocabularies (tokenizer.ggml.model = "gpt2",
//            tokenizer.ggml.pre, byte-to-unicode token text, merges in rank order), and read
//            back from any such file.
// A tokenizer saves itself into GGUF metadata (tokenizer.ggml.*) and loads back from it, so
// model files carry their tokenizer. Bad input (unknown character for char, out-of-range id
// to decode, malformed metadata) throws toy::Error naming what and where.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace toy::gguf {
class Reader;
class Writer;
}  // namespace toy::gguf

namespace toy {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "byte", "char" or "bpe"
  virtual int32_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Concatenated bytes of the tokens (may end inside a UTF-8 sequence for byte/bpe).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The bytes one token stands for.
  virtual const std::string& token_bytes(int32_t id) const = 0;
  // End-of-text id (-1 if none).
  virtual int32_t eos_id() const = 0;
  // Beginning-of-sequence id (-1 if none), and whether the vocabulary asks for it in front of
  // every text (tokenizer.ggml.add_bos_token, or its pre-tokenizer's default).
  virtual int32_t bos_id() const { return -1; }
  virtual bool adds_bos() const { return false; }
  // Tokens that end a reply: EOS, and the special tokens that end a turn in the chat
  // formats (<|im_end|>, <|eot_id|>, <|endoftext|>, <|end_of_text|>, </s>), as llama.cpp
  // treats them. Computed on each call: ask once per generation.
  std::vector<int32_t> end_of_generation_ids() const;
  // Control and user-defined tokens (e.g. <|im_start|>): never produced by encode(); their
  // text becomes their id only through encode_special().
  virtual std::vector<int32_t> special_ids() const { return {}; }
  // The control tokens among them (token_type 3: <|im_start|>, <|eot_id|>, BOS/EOS...); the
  // rest are user-defined (token_type 4: Qwen3's <think>, Gemma's <start_of_image>...).
  virtual std::vector<int32_t> control_ids() const { return special_ids(); }
  // A byte range [begin, end) of a text.
  struct Span {
    size_t begin = 0, end = 0;
  };
  // encode() with special tokens' text parsed as those tokens (llama.cpp's parse_special),
  // except that a control token's text overlapping one of the `plain` spans (sorted, disjoint)
  // is ordinary text there, as llama.cpp tokenizes a text with parse_special off (user-defined
  // tokens still match). A chat prompt marks the messages' own text plain: a user cannot forge
  // the template's markers.
  std::vector<int32_t> encode_special(std::string_view text, std::span<const Span> plain = {}) const;
  // Writes tokenizer.ggml.* keys (model, pre, tokens, token_type, merges, special ids).
  virtual void save(gguf::Writer& w) const = 0;

  // Trains a tokenizer of the given spec ("byte", "char", "bpe:N") on `corpus`.
  static std::unique_ptr<Tokenizer> train(const std::string& spec, std::string_view corpus);
  // A byte-level BPE vocabulary of exactly vocab_size tokens, for a model of a fixed shape
  // (toy init): merges learned from corpus with pre-tokenizer `pre` (as many as the text
  // yields and fit), then <|endoftext|> (BOS), <|im_start|>, <|im_end|> (EOS) and control
  // tokens (`controls`, then <|ctrl_N|>) up to the size.
  static std::unique_ptr<Tokenizer> train_fixed_size(std::string_view corpus, const std::string& pre,
                                                     int64_t vocab_size, const std::vector<std::string>& controls = {});
  // Reads the tokenizer a model file carries; throws if it has none or it is malformed.
  static std::unique_ptr<Tokenizer> load(const gguf::Reader& r);
};

// Decodes a stream of token ids into complete UTF-8: bytes of a character split across
// tokens are held back until the character is complete (for streaming generation).
class Utf8StreamDecoder {
 public:
  explicit Utf8StreamDecoder(const Tokenizer& t) : tok_(t) {}
  // Text that is complete after appending `id` (possibly empty); valid until the next call
  // (a buffer reused from call to call: no allocation per token once warm).
  const std::string& push(int32_t id);
  // Whatever is left (an incomplete sequence is returned as is).
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_, out_;
};

}  // namespace toy
