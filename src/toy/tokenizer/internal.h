// Private to src/toy/tokenizer/: the pieces the three tokenizers share.
//   - UTF-8 stepping that tells a well-formed character, an invalid byte and a sequence cut
//     short by the end of the text apart (char vocabularies, the stream decoder);
//   - GPT-2's bytes_to_unicode mapping between token bytes and GGUF token text;
//   - GPT-2's pre-split regex (PCRE2), which never drops a byte;
//   - checked access to the tokenizer.ggml.* keys (errors name the file and the key);
//   - PieceTokenizer, the common base: every token stands for a fixed byte string.
// Tests may include this header; nothing outside the tokenizer directory should.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "toy/tokenizer/tokenizer.h"

namespace toy::tokenizer_detail {

// ---- UTF-8 ---------------------------------------------------------------------------------

enum class Utf8Status { ok, invalid, incomplete };
struct Utf8Step {
  Utf8Status status;
  uint32_t len;  // bytes of the character when ok; 1 otherwise
  uint32_t cp;   // the code point when ok
};
// Examines the sequence starting at s[i] (i < s.size()) by the Unicode well-formedness table
// (no overlongs, no surrogates, nothing above U+10FFFF). `invalid`: s[i] cannot start a
// well-formed sequence here; `incomplete`: the bytes up to the end of s are a valid prefix.
Utf8Step utf8_step(std::string_view s, size_t i);
void utf8_append(std::string& out, uint32_t cp);

// ---- GPT-2 byte-level token text -------------------------------------------------------------

// GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the other 68 bytes map, in byte order, to U+0100, U+0101, ... (a space is 'Ġ').
// Token bytes -> the text GGUF stores for a byte-level BPE token.
std::string gpt2_bytes_to_text(std::string_view bytes);
// The inverse; nullopt when `text` has a character outside the 256 of the mapping.
std::optional<std::string> gpt2_text_to_bytes(std::string_view text);

// Splits `text` with GPT-2's pre-tokenizer regex and calls `piece` for each piece in order.
// The pieces concatenate to `text` exactly: bytes no alternative can match (only invalid
// UTF-8 can be such) become pieces of their own.
void gpt2_split(std::string_view text, const std::function<void(std::string_view)>& piece);

// ---- GGUF metadata -------------------------------------------------------------------------

constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenByte = 6;
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

const std::string& meta_str(const gguf::Reader& r, const std::string& key);  // throws if absent
const std::vector<std::string>& meta_str_array(const gguf::Reader& r, const std::string& key);
// tokenizer.ggml.token_type, or all-normal when absent (as llama.cpp assumes).
std::vector<int32_t> meta_token_types(const gguf::Reader& r, size_t n_tokens);
// A special token id (u32); -1 when absent. Throws when present but out of range.
int32_t meta_token_id(const gguf::Reader& r, const std::string& key, size_t n_tokens);

// ---- the common base -------------------------------------------------------------------------

// A tokenizer whose token i always decodes to pieces_[i]; kind() tags its error messages.
class PieceTokenizer : public Tokenizer {
 public:
  int32_t vocab_size() const override { return int32_t(pieces_.size()); }
  std::string decode(std::span<const int32_t> ids) const override;
  const std::string& token_bytes(int32_t id) const override;

 protected:
  std::vector<std::string> pieces_;
};

// ---- factories (one per file) ----------------------------------------------------------------

std::unique_ptr<Tokenizer> make_byte_tokenizer();
std::unique_ptr<Tokenizer> load_byte_tokenizer(const gguf::Reader& r);
std::unique_ptr<Tokenizer> train_char_tokenizer(std::string_view corpus);
std::unique_ptr<Tokenizer> load_char_tokenizer(const gguf::Reader& r);
std::unique_ptr<Tokenizer> train_fixed_size_bpe(std::string_view corpus, const std::string& pre_name,
                                                int64_t vocab_size, const std::vector<std::string>& controls);
std::unique_ptr<Tokenizer> train_bpe_tokenizer(int64_t n_merges, std::string_view corpus,
                                               const std::string& pre_name = "gpt-2");
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const gguf::Reader& r);
std::unique_ptr<Tokenizer> load_spm_tokenizer(const gguf::Reader& r);

}  // namespace toy::tokenizer_detail
