// Tokenizer::train / Tokenizer::load (spec parsing and dispatch on the GGUF keys),
// Utf8StreamDecoder, and the helpers internal.h declares for all three tokenizers.
//
// Which class a GGUF file rebuilds: toy writes "toy.tokenizer.kind" ("byte", "char", "bpe");
// files without it (converted by llama.cpp) are chosen by tokenizer.ggml.model: "gpt2" loads
// as bpe, "toy-char" as char, anything else ("llama" = SentencePiece, "bert", ...) is refused
// as not supported yet.
#include <algorithm>
#include <array>
#include <charconv>

#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/internal.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {
namespace tokenizer_detail {

// ---- UTF-8 ---------------------------------------------------------------------------------

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t n = s.size() - i;
  const unsigned c = p[0];
  if (c < 0x80) return {Utf8Status::ok, 1, c};
  // The lead byte fixes the length and the allowed range of the second byte (Unicode
  // Table 3-7); that range is what excludes overlongs, surrogates and > U+10FFFF.
  uint32_t len, cp;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Status::invalid, 1, 0};
  }
  for (uint32_t k = 1; k < len; ++k) {
    if (k >= n) return {Utf8Status::incomplete, 1, 0};
    const unsigned b = p[k];
    if (b < lo || b > hi) return {Utf8Status::invalid, 1, 0};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Status::ok, len, cp};
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// ---- GPT-2 byte-level token text -------------------------------------------------------------

namespace {

struct Gpt2Table {
  std::array<uint32_t, 256> cp{};
  std::array<std::string, 256> text{};  // UTF-8 of cp[b], so encoding a token is a lookup
  std::array<int16_t, 256 + 68> byte{};  // code point -> byte, -1 where unmapped
  Gpt2Table() {
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      cp[b] = printable(b) ? uint32_t(b) : next++;
      utf8_append(text[b], cp[b]);
      byte[cp[b]] = int16_t(b);
    }
  }
};

const Gpt2Table& gpt2_table() {
  static const Gpt2Table t;
  return t;
}

}  // namespace

std::string gpt2_bytes_to_text(std::string_view bytes) {
  const Gpt2Table& t = gpt2_table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.text[uint8_t(c)];
  return out;
}

std::optional<std::string> gpt2_text_to_bytes(std::string_view text) {
  const Gpt2Table& t = gpt2_table();
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const Utf8Step st = utf8_step(text, i);
    if (st.status != Utf8Status::ok || st.cp >= t.byte.size() || t.byte[st.cp] < 0) return std::nullopt;
    out += char(uint8_t(t.byte[st.cp]));
    i += st.len;
  }
  return out;
}

// ---- GGUF metadata -------------------------------------------------------------------------

const std::string& meta_str(const gguf::Reader& r, const std::string& key) {
  const gguf::Value* v = r.find(key);
  TOY_CHECK(v, "[tokenizer] '{}': missing key '{}'", printable(r.path()), key);
  TOY_CHECK(v->type == gguf::Type::STRING, "[tokenizer] '{}': key '{}' is {}, expected string", printable(r.path()), key,
            gguf::type_name(v->type));
  return v->s;
}

const std::vector<std::string>& meta_str_array(const gguf::Reader& r, const std::string& key) {
  const gguf::Value* v = r.find(key);
  TOY_CHECK(v, "[tokenizer] '{}': missing key '{}'", printable(r.path()), key);
  TOY_CHECK(v->type == gguf::Type::ARRAY && v->elem == gguf::Type::STRING,
            "[tokenizer] '{}': key '{}' is {}, expected array of string", printable(r.path()), key,
            v->type == gguf::Type::ARRAY ? std::string("array of ") + gguf::type_name(v->elem)
                                         : std::string(gguf::type_name(v->type)));
  return v->as;
}

std::vector<int32_t> meta_token_types(const gguf::Reader& r, size_t n_tokens) {
  const std::string key = "tokenizer.ggml.token_type";
  const gguf::Value* v = r.find(key);
  if (!v) return std::vector<int32_t>(n_tokens, kTokenNormal);
  TOY_CHECK(v->type == gguf::Type::ARRAY && (v->elem == gguf::Type::I32 || v->elem == gguf::Type::U32),
            "[tokenizer] '{}': key '{}' is not an array of i32", printable(r.path()), key);
  const size_t n = v->elem == gguf::Type::I32 ? v->ai.size() : v->au.size();
  TOY_CHECK(n == n_tokens, "[tokenizer] '{}': key '{}' has {} entries, expected one per token ({})", printable(r.path()), key,
            n, n_tokens);
  std::vector<int32_t> types(n);
  for (size_t i = 0; i < n; ++i) types[i] = int32_t(v->elem == gguf::Type::I32 ? v->ai[i] : int64_t(v->au[i]));
  return types;
}

int32_t meta_token_id(const gguf::Reader& r, const std::string& key, size_t n_tokens) {
  const gguf::Value* v = r.find(key);
  if (!v) return -1;
  TOY_CHECK(v->type == gguf::Type::U32, "[tokenizer] '{}': key '{}' is {}, expected u32", printable(r.path()), key,
            gguf::type_name(v->type));
  TOY_CHECK(v->u < n_tokens, "[tokenizer] '{}': key '{}' = {} is out of range (vocabulary of {})", printable(r.path()), key,
            v->u, n_tokens);
  return int32_t(v->u);
}

// ---- the common base -------------------------------------------------------------------------

std::string PieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TOY_CHECK(id >= 0 && size_t(id) < pieces_.size(),
              "[tokenizer:{}] decode: token id {} at position {} is out of range (vocabulary of {})", kind(), id, i,
              pieces_.size());
    out += pieces_[size_t(id)];
  }
  return out;
}

const std::string& PieceTokenizer::token_bytes(int32_t id) const {
  TOY_CHECK(id >= 0 && size_t(id) < pieces_.size(), "[tokenizer:{}] token id {} is out of range (vocabulary of {})",
            kind(), id, pieces_.size());
  return pieces_[size_t(id)];
}

}  // namespace tokenizer_detail

namespace td = tokenizer_detail;

// ---- special tokens ---------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::end_of_generation_ids() const {
  // The turn ends of the chat formats llama.cpp knows: ChatML, Llama 3, GPT-2 style, Phi
  // (<|end|>), Gemma (<end_of_turn>), DeepSeek, CodeLlama (<EOT>), SmolVLM, gpt-oss (<|return|>,
  // and <|call|> before a tool call).
  static constexpr std::string_view kEnds[] = {
      "<|im_end|>", "<|eot_id|>",          "<|endoftext|>", "<|end_of_text|>",          "</s>",
      "<|eom_id|>", "<|end|>",             "<end_of_turn>", "<｜end▁of▁sentence｜>",
      "<EOT>",      "<end_of_utterance>", "<|return|>",    "<|call|>"};
  std::vector<int32_t> ids;
  if (eos_id() >= 0) ids.push_back(eos_id());
  // gpt-oss ends a message with <|end|> and goes on (<|start|>assistant...): its reply ends at
  // <|return|> or <|call|>, as llama.cpp decides for a vocabulary with both.
  bool harmony = false;
  for (int32_t id : special_ids()) harmony = harmony || token_bytes(id) == "<|return|>";
  for (int32_t id : special_ids()) {
    const std::string t = token_bytes(id);
    if (harmony && t == "<|end|>") continue;
    if (std::find(std::begin(kEnds), std::end(kEnds), t) != std::end(kEnds) &&
        std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(id);
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode_special(std::string_view text, std::span<const Span> plain) const {
  // Special tokens' texts by first byte, longest first (so "<|im_start|>" wins over a shorter
  // prefix): a vocabulary with thousands of them (Gemma's) costs one short list per byte.
  struct Special {
    std::string text;
    int32_t id;
    bool control;
  };
  std::vector<int32_t> controls = control_ids();
  std::sort(controls.begin(), controls.end());
  std::array<std::vector<Special>, 256> by_first;
  for (int32_t id : special_ids()) {
    std::string t = token_bytes(id);
    if (t.empty()) continue;
    const bool control = std::binary_search(controls.begin(), controls.end(), id);
    by_first[uint8_t(t[0])].push_back({std::move(t), id, control});
  }
  for (auto& list : by_first)
    std::stable_sort(list.begin(), list.end(), [](const Special& a, const Special& b) { return a.text.size() > b.text.size(); });
  // Whether [at, at + n) overlaps a plain span; `next` is the first span not wholly before `at`.
  size_t next = 0;
  auto overlaps_plain = [&](size_t at, size_t n) {
    while (next < plain.size() && plain[next].end <= at) ++next;
    return next < plain.size() && plain[next].begin < at + n;
  };
  std::vector<int32_t> ids;
  size_t gap = 0, pos = 0;
  while (pos < text.size()) {
    const Special* hit = nullptr;
    for (const Special& s : by_first[uint8_t(text[pos])])
      if (text.substr(pos, s.text.size()) == s.text && !(s.control && overlaps_plain(pos, s.text.size()))) {
        hit = &s;
        break;
      }
    if (!hit) {
      ++pos;
      continue;
    }
    const std::vector<int32_t> before = encode(text.substr(gap, pos - gap));
    ids.insert(ids.end(), before.begin(), before.end());
    ids.push_back(hit->id);
    pos += hit->text.size();
    gap = pos;
  }
  const std::vector<int32_t> rest = encode(text.substr(gap));
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

// ---- factories -------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> Tokenizer::train_fixed_size(std::string_view corpus, const std::string& pre,
                                                       int64_t vocab_size, const std::vector<std::string>& controls) {
  return td::train_fixed_size_bpe(corpus, pre, vocab_size, controls);
}

std::unique_ptr<Tokenizer> Tokenizer::train(const std::string& spec, std::string_view corpus) {
  if (spec == "byte") return td::make_byte_tokenizer();
  if (spec == "char") return td::train_char_tokenizer(corpus);
  if (spec.starts_with("bpe:")) {
    // bpe:N or bpe:N:PRE (a pre-tokenizer llama.cpp knows; gpt-2 by default).
    std::string_view n_text = std::string_view(spec).substr(4);
    std::string pre = "gpt-2";
    if (const size_t colon = n_text.find(':'); colon != std::string_view::npos) {
      pre = std::string(n_text.substr(colon + 1));
      n_text = n_text.substr(0, colon);
    }
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(n_text.data(), n_text.data() + n_text.size(), n);
    // Token ids are int32: the 256 bytes, the merges and <|endoftext|> must all fit.
    constexpr int64_t kMaxMerges = int64_t(INT32_MAX) - 257;
    TOY_CHECK(ec == std::errc() && end == n_text.data() + n_text.size() && n >= 1 && n <= kMaxMerges,
              "[tokenizer] bad spec '{}': the merge count after 'bpe:' must be an integer in 1..{}", printable(spec),
              kMaxMerges);
    return td::train_bpe_tokenizer(n, corpus, pre);
  }
  fail("[tokenizer] unknown spec '{}': expected 'byte', 'char', 'bpe:N' or 'bpe:N:PRE' (N merges, PRE a pre-tokenizer)",
       printable(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::load(const gguf::Reader& r) {
  TOY_CHECK(r.has("tokenizer.ggml.model"), "[tokenizer] '{}' carries no tokenizer (no key 'tokenizer.ggml.model')",
            printable(r.path()));
  const std::string& model = td::meta_str(r, "tokenizer.ggml.model");
  if (r.has("toy.tokenizer.kind")) {
    const std::string& kind = td::meta_str(r, "toy.tokenizer.kind");
    const char* want = kind == "char" ? "toy-char" : "gpt2";
    TOY_CHECK(kind == "byte" || kind == "char" || kind == "bpe",
              "[tokenizer] '{}': unknown toy.tokenizer.kind '{}' (expected byte, char or bpe)", printable(r.path()), printable(kind));
    TOY_CHECK(model == want, "[tokenizer] '{}': toy.tokenizer.kind '{}' needs tokenizer.ggml.model '{}', found '{}'",
              printable(r.path()), printable(kind), want, printable(model));
    if (kind == "byte") return td::load_byte_tokenizer(r);
    if (kind == "char") return td::load_char_tokenizer(r);
    return td::load_bpe_tokenizer(r);
  }
  if (model == "gpt2") return td::load_bpe_tokenizer(r);
  if (model == "llama") return td::load_spm_tokenizer(r);
  if (model == "toy-char") return td::load_char_tokenizer(r);
  fail("[tokenizer] '{}': tokenizer model '{}' is not supported (toy reads 'gpt2' byte-level BPE and 'llama' SentencePiece)", printable(r.path()),
       printable(model));
}

// ---- Utf8StreamDecoder ---------------------------------------------------------------------

const std::string& Utf8StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_bytes(id);
  // Only the tail can be an unfinished character: find the last byte that is not a
  // continuation byte (at most 3 back) and hold it back if it starts a valid but cut-short
  // sequence. Anything invalid is passed through as is; waiting would not make it valid.
  size_t cut = pending_.size();
  for (size_t k = 1; k <= 3 && k <= pending_.size(); ++k) {
    const size_t j = pending_.size() - k;
    if ((uint8_t(pending_[j]) & 0xC0) == 0x80) continue;
    if (td::utf8_step(pending_, j).status == td::Utf8Status::incomplete) cut = j;
    break;
  }
  out_.assign(pending_, 0, cut);
  pending_.erase(0, cut);
  return out_;
}

std::string Utf8StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace toy
